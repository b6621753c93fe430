#include "engine/json_schema.h"

#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <tuple>

#include "engine/error.h"
#include "engine/json_lex.h"

namespace kvpr {

// ------------------------------------------------------------------ compiling

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const json::Value& root) : root_(root) {}

  JsonSchema run() {
    out_.any_ = add(SchemaNode{});
    out_.root_ = compile(root_, "$");
    return std::move(out_);
  }

 private:
  int add(SchemaNode n) {
    out_.nodes_.push_back(std::move(n));
    return static_cast<int>(out_.nodes_.size()) - 1;
  }

  static bool annotation(std::string_view k) {
    for (const char* a : {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                          "readOnly", "writeOnly", "$defs", "definitions", "strict"})
      if (k == a) return true;
    return false;
  }

  // "#", "#/$defs/Name", "#/definitions/Name" (JSON pointer, ~0 and ~1 unescaped).
  const json::Value& resolve(const std::string& ref, const std::string& path) const {
    if (ref == "#") return root_;
    for (const char* base : {"#/$defs/", "#/definitions/"}) {
      if (!ref.starts_with(base)) continue;
      std::string name;
      for (size_t i = std::string_view(base).size(); i < ref.size(); ++i) {
        if (ref[i] == '~' && i + 1 < ref.size()) {
          name += ref[i + 1] == '1' ? '/' : '~';
          ++i;
        } else {
          name += ref[i];
        }
      }
      const json::Value* defs = root_.find(std::string_view(base).substr(2, std::string_view(base).size() - 3));
      const json::Value* target = defs ? defs->find(name) : nullptr;
      KVPR_CHECK(target, path, ": $ref '", ref, "' names no definition");
      return *target;
    }
    KVPR_THROW(path, ": $ref '", ref, "' is not supported (\"#\", \"#/$defs/...\" and \"#/definitions/...\" are)");
  }

  static int64_t count_of(const json::Value& s, const char* k, const std::string& path) {
    const json::Value* v = s.find(k);
    if (!v) return -1;
    KVPR_CHECK(v->is_int() && v->as_int() >= 0, path, ": ", k, " must be a non-negative integer");
    return v->as_int();
  }

  // (min, max) from a pair of bound keywords; max -1 when absent.
  static std::pair<int64_t, int64_t> bounds(const json::Value& s, const char* min, const char* max,
                                            const std::string& path) {
    const int64_t lo = std::max<int64_t>(0, count_of(s, min, path)), hi = count_of(s, max, path);
    KVPR_CHECK(hi < 0 || hi >= lo, path, ": ", max, " is below ", min);
    return {lo, hi};
  }

  int compile(const json::Value& s, const std::string& path) {
    if (s.is_bool()) {
      KVPR_CHECK(s.as_bool(), path, ": the schema false admits no value");
      return out_.any_;
    }
    KVPR_CHECK(s.is_object(), path, ": a schema must be an object or a boolean");
    for (const auto& [k, v] : s.as_object()) {
      static const std::set<std::string_view> known = {
          "type",     "properties", "required", "additionalProperties", "items",     "minItems", "maxItems",
          "enum",     "const",      "anyOf",    "oneOf",                "minLength", "maxLength", "$ref"};
      KVPR_CHECK(known.count(k) || annotation(k), path, ": the keyword '", k, "' is not supported");
    }
    if (const json::Value* ref = s.find("$ref")) {
      KVPR_CHECK(ref->is_string(), path, ": $ref must be a string");
      for (const auto& [k, v] : s.as_object())
        KVPR_CHECK(k == "$ref" || annotation(k), path, ": $ref with '", k, "' beside it is not supported");
      const std::string r = ref->as_string();
      if (auto it = refs_.find(r); it != refs_.end()) return it->second;
      SchemaNode n;
      n.kind = SchemaNode::Kind::AnyOf;
      const int at = add(n);
      refs_[r] = at;
      const int target = compile(resolve(r, path), path + "->" + r);
      out_.nodes_[static_cast<size_t>(at)].options = {target};
      return at;
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      const json::Value* alts = s.find(key);
      if (!alts) continue;
      KVPR_CHECK(alts->is_array() && !alts->as_array().empty(), path, ": ", key, " must be a non-empty list");
      for (const auto& [k, v] : s.as_object())
        KVPR_CHECK(k == key || annotation(k), path, ": ", key, " with '", k, "' beside it is not supported");
      SchemaNode n;
      n.kind = SchemaNode::Kind::AnyOf;
      for (size_t i = 0; i < alts->as_array().size(); ++i)
        n.options.push_back(compile(alts->as_array()[i], path + "." + key + "[" + std::to_string(i) + "]"));
      return add(std::move(n));
    }
    std::vector<std::string> types;
    if (const json::Value* t = s.find("type")) {
      if (t->is_string()) {
        types.push_back(t->as_string());
      } else {
        KVPR_CHECK(t->is_array() && !t->as_array().empty(), path, ": type must be a string or a non-empty list");
        for (const auto& e : t->as_array()) {
          KVPR_CHECK(e.is_string(), path, ": type must be a string or a list of strings");
          types.push_back(e.as_string());
        }
      }
      for (const auto& ty : types)
        KVPR_CHECK(ty == "object" || ty == "array" || ty == "string" || ty == "number" || ty == "integer" ||
                       ty == "boolean" || ty == "null",
                   path, ": unknown type '", ty, "'");
    }
    if (s.find("enum") || s.find("const")) return literals(s, types, path);
    if (types.empty()) {
      if (s.find("properties") || s.find("required") || s.find("additionalProperties")) types = {"object"};
      else if (s.find("items") || s.find("minItems") || s.find("maxItems")) types = {"array"};
      else if (s.find("minLength") || s.find("maxLength")) types = {"string"};
      else return out_.any_;
    }
    if (types.size() == 1) return typed(s, types[0], path);
    SchemaNode n;
    n.kind = SchemaNode::Kind::AnyOf;
    for (const auto& ty : types) n.options.push_back(typed(s, ty, path));
    return add(std::move(n));
  }

  int literals(const json::Value& s, const std::vector<std::string>& types, const std::string& path) {
    std::vector<json::Value> values;
    if (const json::Value* c = s.find("const")) values.push_back(*c);
    if (const json::Value* e = s.find("enum")) {
      KVPR_CHECK(e->is_array() && !e->as_array().empty(), path, ": enum must be a non-empty list");
      for (const auto& v : e->as_array()) values.push_back(v);
    }
    auto type_of = [](const json::Value& v) -> std::vector<std::string> {
      if (v.is_string()) return {"string"};
      if (v.is_int()) return {"integer", "number"};
      if (v.is_number()) return {"number"};
      if (v.is_bool()) return {"boolean"};
      if (v.is_null()) return {"null"};
      return {};
    };
    SchemaNode n;
    n.kind = SchemaNode::Kind::Literals;
    for (const auto& v : values) {
      KVPR_CHECK(!v.is_array() && !v.is_object(), path, ": enum and const values that are lists or objects are not supported");
      const auto ts = type_of(v);
      const bool fits = types.empty() || std::any_of(ts.begin(), ts.end(), [&](const std::string& t) {
                          return std::find(types.begin(), types.end(), t) != types.end();
                        });
      const std::string text = v.dump_python();
      if (fits && std::find(n.literals.begin(), n.literals.end(), text) == n.literals.end()) n.literals.push_back(text);
    }
    KVPR_CHECK(!n.literals.empty(), path, ": no enum or const value has the schema's type");
    return add(std::move(n));
  }

  int typed(const json::Value& s, const std::string& type, const std::string& path) {
    SchemaNode n;
    if (type == "boolean" || type == "null") {
      n.kind = SchemaNode::Kind::Literals;
      n.literals = type == "null" ? std::vector<std::string>{"null"} : std::vector<std::string>{"true", "false"};
      return add(std::move(n));
    }
    if (type == "string") {
      n.kind = SchemaNode::Kind::String;
      std::tie(n.min_length, n.max_length) = bounds(s, "minLength", "maxLength", path);
      return add(std::move(n));
    }
    if (type == "number" || type == "integer") {
      n.kind = type == "number" ? SchemaNode::Kind::Number : SchemaNode::Kind::Integer;
      return add(std::move(n));
    }
    if (type == "array") {
      n.kind = SchemaNode::Kind::Array;
      std::tie(n.min_items, n.max_items) = bounds(s, "minItems", "maxItems", path);
      if (const json::Value* items = s.find("items")) {
        KVPR_CHECK(!items->is_array(), path, ": items as a list (tuples) is not supported");
        const int at = add(std::move(n));
        const int item = compile(*items, path + ".items");
        out_.nodes_[static_cast<size_t>(at)].items = item;
        return at;
      }
      return add(std::move(n));
    }
    // object
    n.kind = SchemaNode::Kind::Object;
    const json::Value* props = s.find("properties");
    if (props) {
      KVPR_CHECK(props->is_object(), path, ": properties must be an object");
      KVPR_CHECK(props->as_object().size() <= 64, path, ": more than 64 properties are not supported");
      for (const auto& [k, v] : props->as_object()) {
        KVPR_CHECK(std::find(n.names.begin(), n.names.end(), k) == n.names.end(), path, ": property '", k, "' twice");
        n.names.push_back(k);
      }
    }
    if (const json::Value* req = s.find("required")) {
      KVPR_CHECK(req->is_array(), path, ": required must be a list");
      for (const auto& r : req->as_array()) {
        KVPR_CHECK(r.is_string(), path, ": required must list property names");
        const auto it = std::find(n.names.begin(), n.names.end(), r.as_string());
        KVPR_CHECK(it != n.names.end(), path, ": required names '", r.as_string(), "', which is not in properties");
        n.required |= uint64_t{1} << (it - n.names.begin());
      }
    }
    const json::Value* add_props = s.find("additionalProperties");
    const int at = add(std::move(n));
    if (props)
      for (const auto& [k, v] : props->as_object()) {
        const int p = compile(v, path + ".properties." + k);
        out_.nodes_[static_cast<size_t>(at)].props.push_back(p);
      }
    int additional = out_.any_;  // JSON Schema's default: other keys with any values
    if (add_props && add_props->is_bool()) additional = add_props->as_bool() ? out_.any_ : -1;
    else if (add_props) additional = compile(*add_props, path + ".additionalProperties");
    out_.nodes_[static_cast<size_t>(at)].additional = additional;
    return at;
  }

  const json::Value& root_;
  JsonSchema out_;
  std::map<std::string, int> refs_;
};

JsonSchema JsonSchema::compile(const json::Value& schema) { return SchemaCompiler(schema).run(); }

// ------------------------------------------------------------------ recognizing

namespace {

using namespace json_lex;

const std::vector<std::string> kAnyLiterals = {"true", "false", "null"};

}  // namespace

SchemaRecognizer::SchemaRecognizer(const JsonSchema* schema, int max_whitespace, int max_depth)
    : schema_(schema),
      max_ws_(static_cast<uint8_t>(std::clamp(max_whitespace, 0, 255))),
      max_depth_(static_cast<uint8_t>(std::clamp(max_depth, 1, 255))) {
  Thread t;
  t.node = schema->root();
  threads_.push_back(std::move(t));
}

bool SchemaRecognizer::scalar_may_end(const Thread& t) const {
  if (t.mode == Mode::Number) return number_may_end(t.sub);
  if (t.mode == Mode::Literal) {
    const SchemaNode& n = schema_->node(t.node);
    const auto& lits = n.kind == SchemaNode::Kind::Any ? kAnyLiterals : n.literals;
    return std::find(lits.begin(), lits.end(), t.key) != lits.end();
  }
  return false;
}

bool SchemaRecognizer::object_may_close(const Thread& t) const {
  const SchemaNode& n = schema_->node(t.stack.back().node);
  return n.kind == SchemaNode::Kind::Any || (n.required & ~t.stack.back().seen) == 0;
}

bool SchemaRecognizer::object_may_continue(const Thread& t) const {
  const SchemaNode& n = schema_->node(t.stack.back().node);
  if (n.kind == SchemaNode::Kind::Any || n.additional >= 0) return true;
  const uint64_t all = n.names.size() == 64 ? ~uint64_t{0} : (uint64_t{1} << n.names.size()) - 1;
  return (t.stack.back().seen & all) != all;
}

bool SchemaRecognizer::end_value(Thread& t) const {
  t.key.clear();
  t.ws = 0;
  if (t.stack.empty()) {
    t.mode = Mode::Done;
    return true;
  }
  if (!t.stack.back().object) ++t.stack.back().count;
  t.mode = Mode::AfterValue;
  return true;
}

bool SchemaRecognizer::close(Thread& t, bool object) const {
  if (t.stack.empty() || t.stack.back().object != object) return false;
  if (object && !object_may_close(t)) return false;
  if (!object) {
    const SchemaNode& n = schema_->node(t.stack.back().node);
    if (n.kind == SchemaNode::Kind::Array && t.stack.back().count < n.min_items) return false;
  }
  t.stack.pop_back();
  return end_value(t);
}

// A value of schema t.node starting with byte c. AnyOf nodes fork: each alternative that takes
// c becomes a thread of its own in `spawned` (and t is then dropped).
bool SchemaRecognizer::start_value(Thread& t, uint8_t c, std::vector<Thread>& spawned) const {
  const SchemaNode& n = schema_->node(t.node);
  using K = SchemaNode::Kind;
  if (n.kind == K::AnyOf) {
    for (int o : n.options) {
      Thread alt = t;
      alt.node = o;
      std::vector<Thread> more;
      if (start_value(alt, c, more)) spawned.push_back(std::move(alt));
      for (auto& m : more) spawned.push_back(std::move(m));
    }
    return false;
  }
  const bool any = n.kind == K::Any;
  if (c == '{' && (any || n.kind == K::Object)) {
    if (t.stack.size() >= max_depth_) return false;
    t.stack.push_back(Frame{t.node, true, 0, 0});
    t.mode = Mode::ObjFirst;
    return true;
  }
  if (c == '[' && (any || n.kind == K::Array)) {
    if (t.stack.size() >= max_depth_) return false;
    t.stack.push_back(Frame{t.node, false, 0, 0});
    t.mode = Mode::ArrFirst;
    return true;
  }
  if (c == '"' && (any || n.kind == K::String)) {
    t.mode = Mode::String;
    t.sub = t.aux = 0;
    t.length = 0;
    return true;
  }
  if ((c == '-' || is_digit(c)) && (any || n.kind == K::Number || n.kind == K::Integer)) {
    t.mode = Mode::Number;
    t.sub = number_start(c);
    return true;
  }
  if (any || n.kind == K::Literals) {
    const auto& lits = any ? kAnyLiterals : n.literals;
    for (const auto& l : lits)
      if (static_cast<uint8_t>(l[0]) == c) {
        t.mode = Mode::Literal;
        t.key.assign(1, static_cast<char>(c));
        return true;
      }
  }
  return false;
}

bool SchemaRecognizer::step(Thread& t, uint8_t c, std::vector<Thread>& spawned) const {
  using K = SchemaNode::Kind;
  switch (t.mode) {
    case Mode::String: {
      int64_t chars = t.length;
      const int r = string_byte(t.sub, t.aux, chars, c);
      if (r == 0) return false;
      const SchemaNode& n = schema_->node(t.node);
      if (r == 2) {
        if (n.kind == K::String && chars < n.min_length) return false;
        return end_value(t);
      }
      if (n.kind == K::String && n.max_length >= 0 && chars > n.max_length) return false;
      // Counted only where a length is bounded: otherwise equal states stay equal (mask cache).
      if (n.kind == K::String && (n.min_length > 0 || n.max_length >= 0)) t.length = chars;
      return true;
    }
    case Mode::Key: {
      const SchemaNode& n = schema_->node(t.stack.back().node);
      const bool closed = n.kind != K::Any && n.additional < 0;
      int64_t chars = 0;
      if (closed && (c == '\\' || c < 0x20)) return false;
      const int r = string_byte(t.sub, t.aux, chars, c);
      if (r == 0) return false;
      if (r == 1) {
        t.key.push_back(static_cast<char>(c));
        if (!closed) return true;
        for (size_t i = 0; i < n.names.size(); ++i)  // still the start of a property not yet given
          if (!((t.stack.back().seen >> i) & 1) && n.names[i].starts_with(t.key)) return true;
        return false;
      }
      t.key_node = -1;
      if (n.kind == K::Any) {
        t.key_node = schema_->any();
      } else {
        for (size_t i = 0; i < n.names.size(); ++i)
          if (n.names[i] == t.key) {
            if ((t.stack.back().seen >> i) & 1) return false;  // a key given twice
            t.stack.back().seen |= uint64_t{1} << i;
            t.key_node = n.props[i];
          }
        if (t.key_node < 0) t.key_node = n.additional;
        if (t.key_node < 0) return false;
      }
      t.key.clear();
      t.mode = Mode::Colon;
      t.ws = 0;
      return true;
    }
    case Mode::Number: {
      const int r = number_byte(t.sub, c, schema_->node(t.node).kind == K::Integer);
      if (r != 2) return r == 1;
      if (!end_value(t)) return false;
      return step(t, c, spawned);
    }
    case Mode::Literal: {
      const SchemaNode& n = schema_->node(t.node);
      const auto& lits = n.kind == K::Any ? kAnyLiterals : n.literals;
      t.key.push_back(static_cast<char>(c));
      for (const auto& l : lits)
        if (l.starts_with(t.key)) return true;
      t.key.pop_back();
      if (!scalar_may_end(t) || !end_value(t)) return false;
      return step(t, c, spawned);
    }
    default: break;
  }
  if (is_ws(c)) {
    if (t.ws >= max_ws_) return false;
    ++t.ws;
    return true;
  }
  t.ws = 0;
  switch (t.mode) {
    case Mode::Value: return start_value(t, c, spawned);
    case Mode::ArrFirst: {
      if (c == ']') return close(t, false);
      const SchemaNode& n = schema_->node(t.stack.back().node);
      t.node = n.kind == K::Array && n.items >= 0 ? n.items : schema_->any();
      if (n.kind == K::Array && n.max_items == 0) return false;
      return start_value(t, c, spawned);
    }
    case Mode::ObjFirst:
    case Mode::ObjKey:
      if (c == '}' && t.mode == Mode::ObjFirst) return close(t, true);
      if (c != '"') return false;
      t.mode = Mode::Key;
      t.key.clear();
      t.sub = t.aux = 0;
      return true;
    case Mode::Colon:
      if (c != ':') return false;
      t.mode = Mode::Value;
      t.node = t.key_node;
      return true;
    case Mode::AfterValue: {
      const Frame& f = t.stack.back();
      if (f.object) {
        if (c == '}') return close(t, true);
        if (c != ',' || !object_may_continue(t)) return false;
        t.mode = Mode::ObjKey;
        return true;
      }
      if (c == ']') return close(t, false);
      if (c != ',') return false;
      const SchemaNode& n = schema_->node(f.node);
      if (n.kind == K::Array && n.max_items >= 0 && f.count >= n.max_items) return false;
      t.mode = Mode::Value;
      t.node = n.kind == K::Array && n.items >= 0 ? n.items : schema_->any();
      return true;
    }
    default: return false;  // Done: only whitespace
  }
}

bool SchemaRecognizer::feed(uint8_t c) {
  std::vector<Thread> next;
  for (auto& t : threads_) {
    std::vector<Thread> spawned;
    if (step(t, c, spawned)) next.push_back(std::move(t));
    for (auto& s : spawned) next.push_back(std::move(s));
  }
  threads_ = std::move(next);
  if (threads_.size() > 1) {  // alternatives that have become the same state are one
    std::set<std::string> keys;
    std::vector<Thread> unique;
    for (auto& t : threads_)
      if (keys.insert(thread_key(t)).second) unique.push_back(std::move(t));
    threads_ = std::move(unique);
  }
  return !threads_.empty();
}

bool SchemaRecognizer::feed(std::string_view bytes) {
  for (char c : bytes)
    if (!feed(static_cast<uint8_t>(c))) return false;
  return true;
}

int64_t SchemaRecognizer::plain_string_room() const {
  if (threads_.size() != 1) return -1;
  const Thread& t = threads_[0];
  if (t.mode != Mode::String || t.sub != 0 || t.aux != 0) return -1;
  const SchemaNode& n = schema_->node(t.node);
  if (n.kind == SchemaNode::Kind::String && n.max_length >= 0) return n.max_length - t.length;
  return INT64_MAX;
}

bool SchemaRecognizer::complete() const {
  for (const auto& t : threads_)
    if (t.mode == Mode::Done || (t.stack.empty() && scalar_may_end(t))) return true;
  return false;
}

std::string SchemaRecognizer::thread_key(const Thread& t) {
  std::string k;
  auto put = [&](const void* p, size_t n) { k.append(static_cast<const char*>(p), n); };
  put(&t.mode, 1);
  put(&t.node, sizeof t.node);
  put(&t.sub, 1);
  put(&t.aux, 1);
  put(&t.ws, 1);
  put(&t.length, sizeof t.length);
  put(&t.key_node, sizeof t.key_node);
  const uint32_t kl = static_cast<uint32_t>(t.key.size());
  put(&kl, sizeof kl);
  k += t.key;
  for (const auto& f : t.stack) {
    put(&f.node, sizeof f.node);
    put(&f.object, 1);
    put(&f.seen, sizeof f.seen);
    put(&f.count, sizeof f.count);
  }
  return k;
}

std::string SchemaRecognizer::key() const {
  std::vector<std::string> parts;
  for (const auto& t : threads_) parts.push_back(thread_key(t));
  std::sort(parts.begin(), parts.end());
  std::string out;
  for (const auto& p : parts) {
    const uint32_t n = static_cast<uint32_t>(p.size());
    out.append(reinterpret_cast<const char*>(&n), sizeof n);
    out += p;
  }
  return out;
}

}  // namespace kvpr
