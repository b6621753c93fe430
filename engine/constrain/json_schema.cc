#include "engine/constrain/json_schema.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "engine/base/error.h"
#include "engine/constrain/decimal.h"
#include "engine/constrain/json_lex.h"

namespace kvpr {

using namespace decimal;

// ------------------------------------------------------------------ compiling

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const json::Value& root) : root_(root) {}

  JsonSchema run() {
    out_.any_ = add(SchemaNode{});
    out_.root_ = compile(root_, "$", 0);
    flatten_alternatives();
    check_ambiguity();
    return std::move(out_);
  }

 private:
  using Limits = SchemaLimits;
  using Clock = std::chrono::steady_clock;

  int add(SchemaNode n) {
    KVPR_CHECK(out_.nodes_.size() < Limits::kMaxNodes, "the schema is too large: more than ", Limits::kMaxNodes,
               " nodes once compiled");
    if (out_.nodes_.size() % 256 == 255)
      KVPR_CHECK(std::chrono::duration<double>(Clock::now() - t0_).count() < Limits::kMaxCompileSeconds,
                 "the schema took longer than ", Limits::kMaxCompileSeconds, " s to compile");
    out_.nodes_.push_back(std::move(n));
    return static_cast<int>(out_.nodes_.size()) - 1;
  }

  // Every AnyOf's options become the non-AnyOf nodes reachable through AnyOf options alone, each
  // once (a chain of $refs, anyOf inside anyOf), so a value starts in one step, however its
  // alternatives were written. An AnyOf reached again on the way is a cycle that consumes
  // nothing: no text could ever start it.
  void flatten_alternatives() {
    std::vector<SchemaNode>& nodes = out_.nodes_;
    const size_t n = nodes.size();
    std::vector<uint8_t> state(n, 0);  // 0 new, 1 on the path, 2 flattened
    std::vector<std::vector<int>> flat(n);
    size_t total = 0;
    for (size_t root = 0; root < n; ++root) {
      if (nodes[root].kind != SchemaNode::Kind::AnyOf || state[root] == 2) continue;
      // Depth-first, without recursion: (node, next option to visit).
      std::vector<std::pair<int, size_t>> stack{{static_cast<int>(root), 0}};
      state[root] = 1;
      while (!stack.empty()) {
        auto& [at, next] = stack.back();
        const auto& opts = nodes[static_cast<size_t>(at)].options;
        if (next == opts.size()) {
          state[static_cast<size_t>(at)] = 2;
          const int done = at;
          stack.pop_back();
          if (!stack.empty()) {  // merge into the parent's flattened options
            auto& mine = flat[static_cast<size_t>(stack.back().first)];
            for (int o : flat[static_cast<size_t>(done)])
              if (std::find(mine.begin(), mine.end(), o) == mine.end()) mine.push_back(o);
            total += flat[static_cast<size_t>(done)].size();
          }
          continue;
        }
        const int o = opts[next++];
        auto& mine = flat[static_cast<size_t>(at)];
        if (nodes[static_cast<size_t>(o)].kind != SchemaNode::Kind::AnyOf) {
          if (std::find(mine.begin(), mine.end(), o) == mine.end()) mine.push_back(o);
          ++total;
        } else if (state[static_cast<size_t>(o)] == 1) {
          std::string cycle;  // the $refs on the way round
          bool on = false;
          for (const auto& frame : stack) {
            on = on || frame.first == o;
            if (const std::string r = on ? ref_name(frame.first) : ""; !r.empty()) cycle += (cycle.empty() ? "" : " -> ") + r;
          }
          KVPR_THROW(where_[o], ": the $ref cycle ", cycle, " comes back to where it began without consuming any "
                     "text (through $ref and anyOf alone it names no value)");
        } else if (state[static_cast<size_t>(o)] == 2) {
          for (int x : flat[static_cast<size_t>(o)])
            if (std::find(mine.begin(), mine.end(), x) == mine.end()) mine.push_back(x);
          total += flat[static_cast<size_t>(o)].size();
        } else {
          state[static_cast<size_t>(o)] = 1;
          stack.emplace_back(o, 0);
        }
        KVPR_CHECK(total <= Limits::kMaxAlternatives, "the schema is too large: more than ", Limits::kMaxAlternatives,
                   " anyOf alternatives once its $refs are followed");
      }
    }
    for (size_t i = 0; i < n; ++i)
      if (nodes[i].kind == SchemaNode::Kind::AnyOf) nodes[i].options = std::move(flat[i]);
  }

  std::string ref_name(int node) const {
    for (const auto& [r, at] : refs_)
      if (at == node) return "'" + r + "'";
    return "";
  }

  // First bytes a node's values may start with, as classes: { [ " number t f n, other.
  static uint16_t first_bytes(const SchemaNode& x) {
    using K = SchemaNode::Kind;
    switch (x.kind) {
      case K::Any: return 0x7F;
      case K::Object: return 1;
      case K::Array: return 2;
      case K::String: return 4;
      case K::Number:
      case K::Integer: return 8;
      case K::Literals: {
        uint16_t m = 0;
        for (const auto& l : x.literals) {
          const char c = l.empty() ? 0 : l[0];
          m |= c == '"' ? 4 : c == '-' || (c >= '0' && c <= '9') ? 8 : c == 't' ? 16 : c == 'f' ? 32 : c == 'n' ? 64 : 128;
        }
        return m;
      }
      case K::AnyOf: return 0;
    }
    return 0;
  }

  // The width of anyOf node x at depth d, from the widths `below` at depth d-1 (1 at depth 0).
  int64_t anyof_width(const SchemaNode& x, const std::vector<int64_t>& below, int d) const {
    const auto& nodes = out_.nodes_;
    using K = SchemaNode::Kind;
    const int64_t cap = Limits::kMaxAmbiguity + 1;
    auto below_of = [&](int node) { return d > 0 && node >= 0 ? below[static_cast<size_t>(node)] : int64_t{1}; };
    auto add = [&](int64_t a, int64_t b) { return std::min(cap, a + b); };
    // Scalars: the options that begin with the same byte, one each.
    int64_t by_class[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    // Objects: all of them go on after '{'; while a member's value is read, those that take
    // its key, each with its value's alternatives (closed objects with distinct keys, a
    // discriminated union, do not add up). Arrays likewise by position.
    int64_t objects = 0, arrays = 0, open_total = 0;
    std::unordered_map<std::string, int64_t> listed;       // key -> options listing it, by their member's W
    std::unordered_map<std::string, int64_t> open_listed;  // key -> open options listing it, by their other keys' W
    std::vector<int64_t> by_position;                       // position -> summed W of the items there
    std::vector<const SchemaNode*> array_options;
    for (int o : x.options) {
      const SchemaNode& y = nodes[static_cast<size_t>(o)];
      const uint16_t m = first_bytes(y);
      for (int b = 2; b < 8; ++b)
        if (m >> b & 1) by_class[b] = add(by_class[b], 1);
      if (y.kind == K::Object || y.kind == K::Any) {
        ++objects;
        const int other = y.kind == K::Any ? -1 : y.additional;
        const bool open = y.kind == K::Any || other >= 0;
        if (open) open_total = add(open_total, below_of(other));
        for (size_t k = 0; k < y.names.size(); ++k) {
          listed[y.names[k]] = add(listed[y.names[k]], below_of(y.props[k]));
          if (open) open_listed[y.names[k]] = add(open_listed[y.names[k]], below_of(other));
        }
      }
      if (y.kind == K::Array || y.kind == K::Any) {
        ++arrays;
        array_options.push_back(&y);
        if (y.kind == K::Array && by_position.size() < y.prefix.size() + 1) by_position.resize(y.prefix.size() + 1, 0);
      }
    }
    int64_t w = std::max<int64_t>(1, *std::max_element(by_class, by_class + 8));
    w = std::max({w, std::min(cap, objects), open_total});
    for (const auto& [key, sum] : listed) {
      const auto adj = open_listed.find(key);
      w = std::max(w, add(sum, std::max<int64_t>(0, open_total - (adj == open_listed.end() ? 0 : adj->second))));
    }
    if (arrays > 0) {
      if (by_position.empty()) by_position.resize(1, 0);
      for (size_t pos = 0; pos < by_position.size(); ++pos) {
        int64_t sum = 0;
        for (const SchemaNode* a : array_options)
          sum = add(sum, a->kind == K::Any ? 1 : below_of(a->item(static_cast<int64_t>(pos), -1)));
        by_position[pos] = sum;
      }
      w = std::max({w, std::min(cap, arrays), *std::max_element(by_position.begin(), by_position.end())});
    }
    return std::min(cap, w);
  }

  // The most alternatives a text could have to follow side by side (SchemaRecognizer's threads),
  // an upper bound: at a value, the options that may start with the same byte all go on, each with
  // the alternatives inside it; a container follows one member at a time, over at most 64 levels.
  void check_ambiguity() const {
    const auto& nodes = out_.nodes_;
    const size_t n = nodes.size();
    using K = SchemaNode::Kind;
    std::vector<int64_t> below(n, 1), here(n, 1);  // W at depth d-1, and at d
    for (int d = 0; d <= 64; ++d) {
      for (size_t i = 0; i < n; ++i) {  // containers first: they look one level down
        const SchemaNode& x = nodes[i];
        int64_t w = 1;
        if (d > 0 && x.kind == K::Object) {
          for (int p : x.props) w = std::max(w, below[static_cast<size_t>(p)]);
          if (x.additional >= 0) w = std::max(w, below[static_cast<size_t>(x.additional)]);
        } else if (d > 0 && x.kind == K::Array) {
          for (int p : x.prefix) w = std::max(w, below[static_cast<size_t>(p)]);
          if (x.items >= 0) w = std::max(w, below[static_cast<size_t>(x.items)]);
        }
        here[i] = w;
      }
      for (size_t i = 0; i < n; ++i) {  // then the alternatives, over the containers' values
        if (nodes[i].kind == K::AnyOf) here[i] = anyof_width(nodes[i], below, d);
      }
      std::swap(below, here);
    }
    const int64_t worst = below[static_cast<size_t>(out_.root_)];
    KVPR_CHECK(worst <= Limits::kMaxAmbiguity, "the schema's anyOf alternatives overlap too much: a text could have to "
               "be followed as ", worst > Limits::kMaxAmbiguity ? "more than " : "", Limits::kMaxAmbiguity,
               " alternatives at once (alternatives that begin alike, nested in each other)");
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

  int compile(const json::Value& s, const std::string& path, int depth) {
    KVPR_CHECK(depth <= Limits::kMaxNesting, path, ": the schema nests deeper than ", Limits::kMaxNesting,
               " levels (each $ref followed counts one)");
    if (s.is_bool()) {
      KVPR_CHECK(s.as_bool(), path, ": the schema false admits no value");
      return out_.any_;
    }
    KVPR_CHECK(s.is_object(), path, ": a schema must be an object or a boolean");
    for (const auto& [k, v] : s.as_object()) {
      static const std::set<std::string_view> known = {
          "type",     "properties", "required", "additionalProperties", "items",     "minItems", "maxItems",
          "prefixItems", "uniqueItems",
          "enum",     "const",      "anyOf",    "oneOf",                "minLength", "maxLength", "$ref",
          "minimum",  "maximum",    "exclusiveMinimum",               "exclusiveMaximum", "pattern", "format"};
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
      where_[at] = path;
      const int target = compile(resolve(r, path), path + "->" + r, depth + 1);
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
        n.options.push_back(compile(alts->as_array()[i], path + "." + key + "[" + std::to_string(i) + "]", depth + 1));
      const int at = add(std::move(n));
      where_[at] = path;
      return at;
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
      else if (s.find("items") || s.find("prefixItems") || s.find("minItems") || s.find("maxItems")) types = {"array"};
      else if (s.find("minLength") || s.find("maxLength")) types = {"string"};
      else return out_.any_;
    }
    if (types.size() == 1) return typed(s, types[0], path, depth);
    SchemaNode n;
    n.kind = SchemaNode::Kind::AnyOf;
    for (const auto& ty : types) n.options.push_back(typed(s, ty, path, depth));
    const int at = add(std::move(n));
    where_[at] = path;
    return at;
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

  // minimum / exclusiveMinimum and maximum / exclusiveMaximum (the tighter of a pair); an
  // integer's become inclusive integer bounds (minimum 1.5: 2; exclusiveMaximum 10: 9).
  static void number_bounds(const json::Value& s, bool integer, SchemaNode& n, const std::string& path) {
    auto read = [&](const char* k, bool exclusive, bool lower, SchemaNode::Bound& b) {
      const json::Value* v = s.find(k);
      if (!v) return;
      KVPR_CHECK(v->is_number(), path, ": ", k, " must be a number (draft 4's boolean form is not supported)");
      KVPR_CHECK(std::isfinite(v->as_double()), path, ": ", k, " must be finite");
      const std::string text = v->is_int() ? std::to_string(v->as_int()) : v->dump_python();
      if (b.set) {  // keep the tighter
        const int c = cmp(parse_dec(text), parse_dec(b.value));
        if (lower ? c < 0 || (c == 0 && b.exclusive) : c > 0 || (c == 0 && b.exclusive)) return;
      }
      b = SchemaNode::Bound{true, exclusive, text};
    };
    read("minimum", false, true, n.lo);
    read("exclusiveMinimum", true, true, n.lo);
    read("maximum", false, false, n.hi);
    read("exclusiveMaximum", true, false, n.hi);
    if (integer) {  // the integers within: inclusive integer bounds
      if (n.lo.set) {
        const Dec v = parse_dec(n.lo.value);
        n.lo = SchemaNode::Bound{true, false, dec_text(n.lo.exclusive ? plus_one(floor_dec(v)) : ceil_dec(v))};
      }
      if (n.hi.set) {
        const Dec v = parse_dec(n.hi.value);
        n.hi = SchemaNode::Bound{true, false, dec_text(n.hi.exclusive ? negated(plus_one(negated(ceil_dec(v)))) : floor_dec(v))};
      }
    }
    if (n.lo.set && n.hi.set) {
      const End L{true, !n.lo.exclusive, parse_dec(n.lo.value)}, H{true, !n.hi.exclusive, parse_dec(n.hi.value)};
      KVPR_CHECK(overlap(L, H), path, ": no ", integer ? "integer" : "number", " lies within its bounds");
    }
  }

  int typed(const json::Value& s, const std::string& type, const std::string& path, int depth) {
    if (type == "boolean" || type == "null") {
      SchemaNode n;
      n.kind = SchemaNode::Kind::Literals;
      n.literals = type == "null" ? std::vector<std::string>{"null"} : std::vector<std::string>{"true", "false"};
      return add(std::move(n));
    }
    if (type == "string") return typed_string(s, path);
    if (type == "number" || type == "integer") {
      SchemaNode n;
      n.kind = type == "number" ? SchemaNode::Kind::Number : SchemaNode::Kind::Integer;
      number_bounds(s, type == "integer", n, path);
      return add(std::move(n));
    }
    if (type == "array") return typed_array(s, path, depth);
    return typed_object(s, path, depth);
  }

  int typed_string(const json::Value& s, const std::string& path) {
    SchemaNode n;
    n.kind = SchemaNode::Kind::String;
    std::tie(n.min_length, n.max_length) = bounds(s, "minLength", "maxLength", path);
    if (const json::Value* p = s.find("pattern")) {
      KVPR_CHECK(p->is_string(), path, ": pattern must be a string");
      try {
        n.regexes.push_back(regex(p->as_string(), path));
      } catch (const Error& e) {
        KVPR_THROW(path, ": ", e.what());
      }
    }
    if (const json::Value* f = s.find("format")) {
      KVPR_CHECK(f->is_string(), path, ": format must be a string");
      const std::string rx = format_pattern(f->as_string());
      if (!rx.empty()) n.regexes.push_back(regex(rx, path));
    }
    return add(std::move(n));
  }

  int typed_array(const json::Value& s, const std::string& path, int depth) {
    SchemaNode n;
    n.kind = SchemaNode::Kind::Array;
    std::tie(n.min_items, n.max_items) = bounds(s, "minItems", "maxItems", path);
    const json::Value* u = s.find("uniqueItems");
    KVPR_CHECK(!u || u->is_bool(), path, ": uniqueItems must be a boolean");
    const bool unique = u && u->as_bool();
    const json::Value* prefix = s.find("prefixItems");
    KVPR_CHECK(!prefix || (prefix->is_array() && !prefix->as_array().empty()), path,
               ": prefixItems must be a non-empty list");
    const json::Value* items = s.find("items");
    KVPR_CHECK(!items || !items->is_array(), path,
               ": items as a list (draft 7 tuples) is not supported; prefixItems says the same");
    const size_t np = prefix ? prefix->as_array().size() : 0;
    if (items && items->is_bool() && !items->as_bool()) {  // no items past the prefix
      cap_items(n, static_cast<int64_t>(np), " items prefixItems and items false allow", path);
      items = nullptr;
    }
    const int at = add(std::move(n));
    for (size_t i = 0; i < np; ++i) {
      const int item = compile(prefix->as_array()[i], path + ".prefixItems[" + std::to_string(i) + "]", depth + 1);
      out_.nodes_[static_cast<size_t>(at)].prefix.push_back(item);
    }
    if (items) {
      const int item = compile(*items, path + ".items", depth + 1);
      out_.nodes_[static_cast<size_t>(at)].items = item;
    }
    if (unique) unique_items(at, np, path);
    return at;
  }

  // uniqueItems true on the array node `at` (no prefixItems): items drawn from a set of literals.
  void unique_items(int at, size_t np, const std::string& path) {
    // Each item compared with every other would be a different machine; items drawn from a
    // set of literals are told apart by which literal they are.
    SchemaNode& arr = out_.nodes_[static_cast<size_t>(at)];
    int lit = arr.items;
    while (lit >= 0 && out_.nodes_[static_cast<size_t>(lit)].kind == SchemaNode::Kind::AnyOf &&
           out_.nodes_[static_cast<size_t>(lit)].options.size() == 1)
      lit = out_.nodes_[static_cast<size_t>(lit)].options[0];  // a $ref to an enum
    KVPR_CHECK(np == 0 && lit >= 0 && out_.nodes_[static_cast<size_t>(lit)].kind == SchemaNode::Kind::Literals &&
                   out_.nodes_[static_cast<size_t>(lit)].literals.size() <= 64,
               path, ": uniqueItems true is supported for items that are one of at most 64 literals (enum, const, "
                     "boolean), not these");
    const auto& lits = out_.nodes_[static_cast<size_t>(lit)].literals;
    for (size_t i = 0; i < lits.size(); ++i)  // items are compared by which literal they are
      for (size_t j = 0; j < i; ++j) {
        const json::Value a = json::parse(lits[i]), b = json::parse(lits[j]);
        KVPR_CHECK(lits[i] != lits[j] && !(a.is_number() && b.is_number() && a.as_double() == b.as_double()), path,
                   ": uniqueItems over an enum that lists one value twice (", lits[j], ", ", lits[i], ")");
      }
    arr.items = lit;
    arr.unique = true;
    cap_items(arr, static_cast<int64_t>(lits.size()), " distinct items uniqueItems allows", path);
  }

  // At most `most` items (`why` names the keywords that say so).
  static void cap_items(SchemaNode& a, int64_t most, const char* why, const std::string& path) {
    KVPR_CHECK(a.min_items <= most, path, ": minItems ", a.min_items, " exceeds the ", most, why);
    a.max_items = a.max_items < 0 ? most : std::min(a.max_items, most);
  }

  int typed_object(const json::Value& s, const std::string& path, int depth) {
    SchemaNode n;
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
        const int p = compile(v, path + ".properties." + k, depth + 1);
        out_.nodes_[static_cast<size_t>(at)].props.push_back(p);
      }
    int additional = out_.any_;  // JSON Schema's default: other keys with any values
    if (add_props && add_props->is_bool()) additional = add_props->as_bool() ? out_.any_ : -1;
    else if (add_props) additional = compile(*add_props, path + ".additionalProperties", depth + 1);
    out_.nodes_[static_cast<size_t>(at)].additional = additional;
    return at;
  }

  // One Regex per distinct pattern, shared by the strings that use it.
  std::shared_ptr<const Regex> regex(const std::string& pattern, const std::string& path) {
    if (auto it = regexes_.find(pattern); it != regexes_.end()) return it->second;
    KVPR_CHECK(regexes_.size() < Limits::kMaxPatterns, path, ": more than ", Limits::kMaxPatterns,
               " distinct patterns and formats in one schema");
    auto rx = std::make_shared<const Regex>(pattern);
    regex_states_ += rx->nfa_states();
    KVPR_CHECK(regex_states_ <= Limits::kMaxRegexStates, path, ": the schema's patterns are too large together (more "
               "than ", Limits::kMaxRegexStates, " NFA states)");
    regexes_.emplace(pattern, rx);
    return rx;
  }

  const json::Value& root_;
  JsonSchema out_;
  std::map<std::string, int> refs_;
  std::map<int, std::string> where_;  // AnyOf nodes: the path that made them (for errors)
  std::map<std::string, std::shared_ptr<const Regex>> regexes_;
  size_t regex_states_ = 0;
  Clock::time_point t0_ = Clock::now();
};

JsonSchema JsonSchema::compile(const json::Value& schema) { return SchemaCompiler(schema).run(); }

// ------------------------------------------------------------------ recognizing

namespace {

using namespace json_lex;

const std::vector<std::string> kAnyLiterals = {"true", "false", "null"};

}  // namespace

SchemaRecognizer::SchemaRecognizer(const JsonSchema* schema, json_lex::Whitespace whitespace, int max_depth)
    : schema_(schema),
      ws_(whitespace),
      max_depth_(static_cast<uint8_t>(std::clamp(max_depth, 1, 255))) {
  Thread t;
  t.node = schema->root();
  threads_.push_back(std::move(t));
}

namespace {

// The allowed interval of a bounded node, for values of one sign: negative texts are checked
// as their magnitudes against the mirrored interval.
void allowed(const SchemaNode& n, bool neg, End* L, End* H) {
  End lo, hi;
  if (n.lo.set) lo = End{true, !n.lo.exclusive, parse_dec(n.lo.value)};
  if (n.hi.set) hi = End{true, !n.hi.exclusive, parse_dec(n.hi.value)};
  if (!neg) {
    *L = lo, *H = hi;
    return;
  }
  *L = hi, *H = lo;
  if (L->finite) L->v = negated(L->v);
  if (H->finite) H->v = negated(H->v);
}

}  // namespace

bool SchemaRecognizer::number_in_bounds(const Thread& t) const {
  const SchemaNode& n = schema_->node(t.node);
  if (!n.bounded()) return true;
  const Dec v = parse_dec(t.key);
  if (n.lo.set) {
    const int c = cmp(v, parse_dec(n.lo.value));
    if (c < 0 || (c == 0 && n.lo.exclusive)) return false;
  }
  if (n.hi.set) {
    const int c = cmp(v, parse_dec(n.hi.value));
    if (c > 0 || (c == 0 && n.hi.exclusive)) return false;
  }
  return true;
}

// The values a prefix of -?(0|[1-9][0-9]*)(\.[0-9]*)? can still become, by magnitude m:
//   "" (or "-")     every m >= 0
//   "0"             m in [0, 1) (an integer: m = 0)
//   D (no point)    m in [D*10^k, (D+1)*10^k) for some k >= 0 (an integer: up to (D+1)*10^k - 1)
//   I.F             m in [I.F, I.F + 10^-|F|)
bool SchemaRecognizer::number_viable(const Thread& t) const {
  const SchemaNode& n = schema_->node(t.node);
  if (!n.bounded()) return true;
  const bool integer = n.kind == SchemaNode::Kind::Integer;
  const std::string_view text = t.key;
  const bool neg = !text.empty() && text[0] == '-';
  const std::string_view body = text.substr(neg ? 1 : 0);
  const size_t dot = body.find('.');
  const std::string I(body.substr(0, dot)), F(dot == std::string_view::npos ? "" : body.substr(dot + 1));
  End L, H;
  allowed(n, neg, &L, &H);
  const Dec zero;
  if (I.empty()) return meets(zero, End{}, L, H);
  auto span = [&](const Dec& a, const Dec& b_excl) {  // [a, b): for an integer, [a, b - 1]
    End b{true, !integer ? false : true, integer ? negated(plus_one(negated(b_excl))) : b_excl};
    return meets(a, b, L, H);
  };
  if (dot != std::string_view::npos) {
    const std::string digits = I + F;  // I.F + one unit of its last place
    const std::string up = inc_digits(digits);
    const size_t int_len = up.size() - F.size();
    return span(normalized(false, I, F), normalized(false, up.substr(0, int_len), up.substr(int_len)));
  }
  if (I == "0") return span(zero, normalized(false, "1", ""));
  const std::string next = inc_digits(I);
  for (size_t k = 0;; ++k) {
    const Dec a = normalized(false, I + std::string(k, '0'), "");
    if (H.finite && cmp(a, H.v) > 0) return false;  // every later interval lies beyond
    if (!H.finite) return true;                      // unbounded above: some interval lies within
    if (span(a, normalized(false, next + std::string(k, '0'), ""))) return true;
  }
}

// A byte of a string under regexes, string_byte having taken it (r: its result; sub0, aux0: the
// states before it): each completed code point moves every regex, none of which may die, and the
// closing quote needs all of them to accept. \u escapes are not written here.
bool SchemaRecognizer::string_regex_byte(Thread& t, const SchemaNode& n, uint8_t c, uint8_t sub0, uint8_t aux0,
                                         int r) const {
  auto feed_cp = [&](uint32_t cp) {
    for (size_t k = 0; k < n.regexes.size(); ++k) {
      t.rx[k] = n.regexes[k]->step(t.rx[k], cp);
      if (t.rx[k] < 0) return false;
    }
    return true;
  };
  if (r == 2) {
    for (size_t k = 0; k < n.regexes.size(); ++k)
      if (!n.regexes[k]->accepts(t.rx[k])) return false;
    return true;
  }
  // A character begun: some code point it may still become must move every regex on (else a
  // token ending inside a character could be taken and leave nothing valid to follow).
  auto may_become = [&]() {
    const int rest = 6 * t.aux;
    const uint32_t lo = t.cp << rest, hi = lo | ((1u << rest) - 1);
    for (size_t k = 0; k < n.regexes.size(); ++k)
      if (!n.regexes[k]->may_step(t.rx[k], lo, hi)) return false;
    return true;
  };
  if (aux0 > 0) {  // a continuation byte
    t.cp = (t.cp << 6) | (c & 0x3Fu);
    return t.aux > 0 ? may_become() : feed_cp(t.cp);
  }
  if (sub0 == 1) {  // the character after a backslash
    switch (c) {
      case '"': return feed_cp('"');
      case '\\': return feed_cp('\\');
      case '/': return feed_cp('/');
      case 'b': return feed_cp('\b');
      case 'f': return feed_cp('\f');
      case 'n': return feed_cp('\n');
      case 'r': return feed_cp('\r');
      case 't': return feed_cp('\t');
      default: return false;  // \u: not written under a pattern
    }
  }
  if (c == '\\') {  // an escape begun: one of the characters it may stand for must continue
    for (size_t k = 0; k < n.regexes.size(); ++k) {
      bool any = false;
      for (uint32_t e : {0x22u, 0x5Cu, 0x2Fu, 0x08u, 0x0Cu, 0x0Au, 0x0Du, 0x09u})
        any = any || n.regexes[k]->may_step(t.rx[k], e, e);
      if (!any) return false;
    }
    return true;
  }
  if (c < 0x80) return feed_cp(c);
  t.cp = c & (t.aux == 1 ? 0x1Fu : t.aux == 2 ? 0x0Fu : 0x07u);  // a lead byte
  return may_become();
}

const uint64_t* SchemaRecognizer::used_literals(const Thread& t) const {
  if (t.stack.empty() || t.stack.back().object) return nullptr;
  const SchemaNode& a = schema_->node(t.stack.back().node);
  return a.kind == SchemaNode::Kind::Array && a.unique && a.items == t.node ? &t.stack.back().used : nullptr;
}

bool SchemaRecognizer::scalar_may_end(const Thread& t) const {
  if (t.mode == Mode::Number) return number_may_end(t.sub) && number_in_bounds(t);
  if (t.mode == Mode::Literal) {
    const SchemaNode& n = schema_->node(t.node);
    const auto& lits = n.kind == SchemaNode::Kind::Any ? kAnyLiterals : n.literals;
    const auto it = std::find(lits.begin(), lits.end(), t.key);
    if (it == lits.end()) return false;
    const uint64_t* used = used_literals(t);
    return !used || !(*used >> (it - lits.begin()) & 1);
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
  if (t.mode == Mode::Literal)
    if (const uint64_t* used = used_literals(t)) {  // a unique array's item: its literal is taken
      const auto& lits = schema_->node(t.node).literals;
      const size_t i = static_cast<size_t>(std::find(lits.begin(), lits.end(), t.key) - lits.begin());
      t.stack.back().used = *used | uint64_t{1} << i;
    }
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
    t.stack.push_back(Frame{t.node, true, 0, 0, 0});
    t.mode = Mode::ObjFirst;
    return true;
  }
  if (c == '[' && (any || n.kind == K::Array)) {
    if (t.stack.size() >= max_depth_) return false;
    t.stack.push_back(Frame{t.node, false, 0, 0, 0});
    t.mode = Mode::ArrFirst;
    return true;
  }
  if (c == '"' && (any || n.kind == K::String)) {
    t.mode = Mode::String;
    t.sub = t.aux = 0;
    t.length = 0;
    t.cp = 0;
    t.rx[0] = t.rx[1] = 0;  // equal states keep equal keys (mask cache, merged alternatives)
    for (size_t k = 0; k < n.regexes.size() && k < 2; ++k) t.rx[k] = n.regexes[k]->start();
    return true;
  }
  if ((c == '-' || is_digit(c)) && (any || n.kind == K::Number || n.kind == K::Integer)) {
    t.mode = Mode::Number;
    t.sub = number_start(c);
    if (!n.bounded()) return true;
    t.key.assign(1, static_cast<char>(c));
    return number_viable(t);
  }
  if (any || n.kind == K::Literals) {
    const auto& lits = any ? kAnyLiterals : n.literals;
    const uint64_t* used = any ? nullptr : used_literals(t);
    for (size_t i = 0; i < lits.size(); ++i)
      if (static_cast<uint8_t>(lits[i][0]) == c && !(used && (*used >> i & 1))) {
        t.mode = Mode::Literal;
        t.key.assign(1, static_cast<char>(c));
        return true;
      }
  }
  return false;
}

// In a string value: one byte, with its length bounds and patterns.
bool SchemaRecognizer::string_step(Thread& t, uint8_t c) const {
  using K = SchemaNode::Kind;
  int64_t chars = t.length;
  const uint8_t sub0 = t.sub, aux0 = t.aux;
  const int r = string_byte(t.sub, t.aux, chars, c);
  if (r == 0) return false;
  const SchemaNode& n = schema_->node(t.node);
  if (n.kind == K::String && !n.regexes.empty() && !string_regex_byte(t, n, c, sub0, aux0, r)) return false;
  if (r == 2) {
    if (n.kind == K::String && chars < n.min_length) return false;
    return end_value(t);
  }
  if (n.kind == K::String && n.max_length >= 0 && chars > n.max_length) return false;
  // A character begun (an escape, a UTF-8 lead) at maxLength could never be finished.
  if (n.kind == K::String && n.max_length >= 0 && chars == n.max_length && (t.sub != 0 || t.aux != 0)) return false;
  // Counted only where a length is bounded: otherwise equal states stay equal (mask cache).
  if (n.kind == K::String && (n.min_length > 0 || n.max_length >= 0)) t.length = chars;
  return true;
}

// In an object's key: one byte; a closed object takes only the start of a property not yet given.
bool SchemaRecognizer::key_step(Thread& t, uint8_t c) const {
  using K = SchemaNode::Kind;
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

// Between tokens: whitespace, a value's start, ',' ':' and the brackets.
bool SchemaRecognizer::structure_step(Thread& t, uint8_t c, std::vector<Thread>& spawned) const {
  using K = SchemaNode::Kind;
  if (is_ws(c)) return ws_.take(t.ws, c);
  t.ws = 0;
  switch (t.mode) {
    case Mode::Value: return start_value(t, c, spawned);
    case Mode::ArrFirst: {
      if (c == ']') return close(t, false);
      const SchemaNode& n = schema_->node(t.stack.back().node);
      t.node = n.kind == K::Array ? n.item(0, schema_->any()) : schema_->any();
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
      t.node = n.kind == K::Array ? n.item(f.count, schema_->any()) : schema_->any();
      return true;
    }
    default: return false;  // Done: only whitespace
  }
}

bool SchemaRecognizer::step(Thread& t, uint8_t c, std::vector<Thread>& spawned) const {
  using K = SchemaNode::Kind;
  switch (t.mode) {
    case Mode::String: return string_step(t, c);
    case Mode::Key: return key_step(t, c);
    case Mode::Number: {
      const SchemaNode& n = schema_->node(t.node);
      if (n.bounded() && (c == 'e' || c == 'E')) return false;  // bounded: no exponent
      const int r = number_byte(t.sub, c, n.kind == K::Integer);
      if (r == 1 && n.bounded()) {
        t.key.push_back(static_cast<char>(c));
        return number_viable(t);
      }
      if (r != 2) return r == 1;
      if (!number_in_bounds(t) || !end_value(t)) return false;
      return step(t, c, spawned);
    }
    case Mode::Literal: {
      const SchemaNode& n = schema_->node(t.node);
      const auto& lits = n.kind == K::Any ? kAnyLiterals : n.literals;
      const uint64_t* used = n.kind == K::Any ? nullptr : used_literals(t);
      t.key.push_back(static_cast<char>(c));
      for (size_t i = 0; i < lits.size(); ++i)
        if (lits[i].starts_with(t.key) && !(used && (*used >> i & 1))) return true;
      t.key.pop_back();
      if (!scalar_may_end(t) || !end_value(t)) return false;
      return step(t, c, spawned);
    }
    default: break;
  }
  return structure_step(t, c, spawned);
}

// Alternatives that have become the same state are one; past kMaxThreads the first are kept.
void SchemaRecognizer::merge(std::vector<Thread>& threads) {
  if (threads.size() <= 1) return;
  std::set<std::string> keys;
  std::vector<Thread> unique;
  for (auto& t : threads)
    if (unique.size() < static_cast<size_t>(SchemaLimits::kMaxThreads) && keys.insert(thread_key(t)).second)
      unique.push_back(std::move(t));
  threads = std::move(unique);
}

bool SchemaRecognizer::feed(uint8_t c) {
  std::vector<Thread> next;
  for (auto& t : threads_) {
    std::vector<Thread> spawned;
    if (step(t, c, spawned)) next.push_back(std::move(t));
    for (auto& s : spawned) next.push_back(std::move(s));
  }
  threads_ = std::move(next);
  merge(threads_);
  return !threads_.empty();
}

// Several bytes (a token): each alternative on its own, as alternatives never interact, and
// their survivors merged in order. So the bytes continue the text exactly when they continue
// one alternative alone, which is what lets a mask be computed one alternative at a time
// (JsonTokenConstraint) and agree with this, the kMaxThreads cap included.
bool SchemaRecognizer::feed(std::string_view bytes) {
  if (threads_.size() <= 1) {
    for (char c : bytes)
      if (!feed(static_cast<uint8_t>(c))) return false;
    return true;
  }
  std::vector<Thread> survivors;
  for (size_t i = 0; i < threads_.size(); ++i) {
    SchemaRecognizer one = alternative(i);
    if (one.feed(bytes))
      for (auto& t : one.threads_) survivors.push_back(std::move(t));
  }
  threads_ = std::move(survivors);
  merge(threads_);
  return !threads_.empty();
}

SchemaRecognizer SchemaRecognizer::alternative(size_t i) const {
  SchemaRecognizer one(*this, threads_[i]);
  return one;
}

int64_t SchemaRecognizer::plain_string_room() const {
  if (threads_.size() != 1) return -1;
  const Thread& t = threads_[0];
  if (t.mode != Mode::String || t.sub != 0 || t.aux != 0) return -1;
  const SchemaNode& n = schema_->node(t.node);
  if (!n.regexes.empty()) return -1;  // every character goes through the regexes
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
  put(&t.rx, sizeof t.rx);
  put(&t.cp, sizeof t.cp);
  put(&t.key_node, sizeof t.key_node);
  const uint32_t kl = static_cast<uint32_t>(t.key.size());
  put(&kl, sizeof kl);
  k += t.key;
  for (const auto& f : t.stack) {
    put(&f.node, sizeof f.node);
    put(&f.object, 1);
    put(&f.seen, sizeof f.seen);
    put(&f.count, sizeof f.count);
    put(&f.used, sizeof f.used);
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
