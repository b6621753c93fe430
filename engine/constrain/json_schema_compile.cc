// JSON Schema -> the recognizer's nodes (json_schema.h): every keyword kvpr supports checked
// and compiled once, with a budget of nodes and time.
#include "engine/constrain/json_schema.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <climits>
#include <cmath>
#include <deque>
#include <optional>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "engine/base/error.h"
#include "engine/constrain/decimal.h"
#include "engine/constrain/json_lex.h"

namespace kvpr {

using namespace decimal;

// allOf joining schemas no value satisfies together (types or enums with nothing in common,
// different consts): what an alternative of a cross product of anyOf lists may be, and is then
// left out.
struct NoValue : Error {
  using Error::Error;
};

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const json::Value& root) : root_(root) {}

  JsonSchema run() {
    out_.any_ = add(SchemaNode{});
    out_.root_ = compile(root_, "$", 0);
    flatten_alternatives();
    out_.ambiguity_ = ambiguity();
    return std::move(out_);
  }

 private:
  using Limits = SchemaLimits;
  using Clock = std::chrono::steady_clock;

  void check_budget() const {
    KVPR_CHECK(std::chrono::duration<double>(Clock::now() - t0_).count() < Limits::kMaxCompileSeconds,
               "the schema took longer than ", Limits::kMaxCompileSeconds, " s to compile");
  }

  int add(SchemaNode n) {
    KVPR_CHECK(out_.nodes_.size() < Limits::kMaxNodes, "the schema is too large: more than ", Limits::kMaxNodes,
               " nodes once compiled");
    if (out_.nodes_.size() % 256 == 255)
      check_budget();
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
        int64_t others = below_of(other);  // (a key a pattern matches takes the pattern's)
        if (y.kind == K::Object)
          for (const auto& pp : y.pattern_props) others = std::max(others, below_of(pp.second));
        if (open) open_total = add(open_total, others);
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
  int64_t ambiguity() const {
    const auto& nodes = out_.nodes_;
    const size_t n = nodes.size();
    using K = SchemaNode::Kind;
    std::vector<int64_t> below(n, 1), here(n, 1);  // W at depth d-1, and at d
    for (int d = 0; d <= 64; ++d) {
      for (size_t i = 0; i < n; ++i) {  // containers first: they look one level down
        const SchemaNode& x = nodes[i];
        int64_t w = 1;
        if (d > 0 && x.kind == K::Object) {
          for (int p : x.props)
            if (p >= 0) w = std::max(w, below[static_cast<size_t>(p)]);
          if (x.additional >= 0) w = std::max(w, below[static_cast<size_t>(x.additional)]);
          for (const auto& pp : x.pattern_props) w = std::max(w, below[static_cast<size_t>(pp.second)]);
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
    return below[static_cast<size_t>(out_.root_)];
  }

  // Keywords of JSON Schema (drafts 3 to 2020-12) that constrain a value and that the compiler
  // does not enforce: refused by name, never ignored, so that a schema is never loosened.
  static bool unenforced(std::string_view k) {
    for (const char* a : {"not", "if", "then", "else",
                          "propertyNames", "contains", "minContains", "maxContains",
                          "divisibleBy", "unevaluatedProperties",
                          "unevaluatedItems", "$dynamicRef", "$recursiveRef", "extends",
                          "disallow", "contentSchema"})
      if (k == a) return true;
    return false;
  }
  // The keywords that say nothing of the value: JSON Schema's annotations and every keyword it does
  // not define (x-kubernetes-*, draft 4's id, example, readonly, links...), which validators ignore.
  static bool annotation(std::string_view k) {
    static const std::set<std::string_view> validation = {
        "type",        "properties", "required", "additionalProperties", "items",     "minItems",  "maxItems",
        "prefixItems", "uniqueItems", "enum",    "const",                "anyOf",     "oneOf",     "minLength",
        "maxLength",   "$ref",        "minimum", "maximum",              "exclusiveMinimum", "exclusiveMaximum",
        "pattern",     "format",     "allOf",   "additionalItems",      "patternProperties", "dependencies",
        "dependentRequired", "dependentSchemas", "minProperties", "maxProperties", "multipleOf"};
    return !validation.count(k) && !unenforced(k);
  }

  // allOf, and $ref, anyOf or oneOf beside keywords that constrain values (which JSON Schema
  // reads as allOf too): the schemas they join merged into one (merge), which compiles as any
  // other; null when `s` joins nothing.
  const json::Value* joined(const json::Value& s, const std::string& path, int depth) {
    auto beside = [&](std::string_view key) {
      if (!s.find(key)) return false;
      for (const auto& [k, v] : s.as_object())
        if (k != key && !annotation(k)) return true;
      return false;
    };
    if (!s.find("allOf") && !beside("$ref") && !beside("anyOf") && !beside("oneOf") && !schema_dependencies(s) &&
        !s.find("not"))
      return nullptr;
    owned_.push_back(merge(json::Value(json::Object{}), flat(s, path, depth), path, depth));  // (distributes an anyOf)
    return &owned_.back();
  }

  // `s` with its allOf and $ref merged in: no allOf or $ref at its top; draft 4's boolean
  // exclusive bounds written as numbers (so that bounds from several schemas compare).
  json::Value flat(const json::Value& s, const std::string& path, int depth) {
    KVPR_CHECK(depth <= Limits::kMaxNesting, path, ": the schema nests deeper than ", Limits::kMaxNesting,
               " levels (each $ref followed and each allOf counts one)");
    check_budget();
    if (s.is_bool()) {
      KVPR_CHECK(s.as_bool(), path, ": allOf joins the schema false, which admits no value");
      return json::Value(json::Object{});
    }
    KVPR_CHECK(s.is_object(), path, ": a schema must be an object or a boolean");
    json::Object base;
    const json::Value* all = s.find("allOf");
    const json::Value* ref = s.find("$ref");
    for (const auto& [k, v] : s.as_object()) {
      if (k == "allOf" || k == "$ref" || k == "not" || annotation(k)) continue;
      if ((k == "exclusiveMinimum" || k == "exclusiveMaximum") && v.is_bool()) {
        const json::Value* bound = s.find(k == "exclusiveMinimum" ? "minimum" : "maximum");
        KVPR_CHECK(!v.as_bool() || bound, path, ": ", k, " true needs a ", k == "exclusiveMinimum" ? "minimum" : "maximum");
        if (v.as_bool()) base.emplace_back(k, *bound);
        continue;
      }
      if ((k == "minimum" || k == "maximum")) {
        const json::Value* ex = s.find(k == "minimum" ? "exclusiveMinimum" : "exclusiveMaximum");
        if (ex && ex->is_bool() && ex->as_bool()) continue;  // it became the exclusive bound
      }
      base.emplace_back(k, v);
    }
    json::Value out(std::move(base));
    if (ref) {
      KVPR_CHECK(ref->is_string(), path, ": $ref must be a string");
      out = merge(out, flat(resolve(ref->as_string(), path), path + "->" + ref->as_string(), depth + 1), path, depth + 1);
    }
    if (all) {
      KVPR_CHECK(all->is_array() && !all->as_array().empty(), path, ": allOf must be a non-empty list");
      for (size_t i = 0; i < all->as_array().size(); ++i) {
        const std::string at = path + ".allOf[" + std::to_string(i) + "]";
        out = merge(out, flat(all->as_array()[i], at, depth + 1), at, depth + 1);
      }
    }
    if (const json::Value* no = s.find("not")) {
      KVPR_CHECK(negatable(*no), path, ": the keyword 'not' is not supported (beside nothing but a list of required keys)");
      if (empty_schema(*no)) throw NoValue(path + ": not {} admits no value");
      // not {"required": [a, b]}: a or b absent
      json::Array absent;
      for (const auto& k : no->find("required")->as_array())
        absent.push_back(without(k.as_string()));
      out = merge(out, json::Value(json::Object{{"anyOf", json::Value(std::move(absent))}}), path + ".not", depth + 1);
    }
    return dependent(std::move(out), path, depth);
  }

  // A schema that says nothing of the value: true, or annotations alone.
  static bool empty_schema(const json::Value& v) {
    if (v.is_bool()) return v.as_bool();
    return v.is_object() && std::all_of(v.as_object().begin(), v.as_object().end(), [](const auto& e) { return annotation(e.first); });
  }
  // false, or a schema beside not {} (which JSON Schema's authors write for false).
  static bool admits_nothing(const json::Value& v) {
    if (v.is_bool()) return !v.as_bool();
    const json::Value* no = v.is_object() ? v.find("not") : nullptr;
    return no && empty_schema(*no);
  }
  // What `not` the compiler writes out: not {} (nothing), not {"required": [keys]} (one absent).
  static bool negatable(const json::Value& v) {
    if (empty_schema(v)) return true;
    if (!v.is_object()) return false;
    const json::Value* r = v.find("required");
    if (!r || !r->is_array() || r->as_array().empty()) return false;
    for (const auto& k : r->as_array())
      if (!k.is_string()) return false;
    return std::all_of(v.as_object().begin(), v.as_object().end(),
                       [](const auto& e) { return e.first == "required" || annotation(e.first); });
  }

  // The schema of objects without `key`: {"properties": {key: false}}.
  static json::Value without(const std::string& key) {
    return json::Value(json::Object{{"properties", json::Value(json::Object{{key, json::Value(false)}})}});
  }

  // Whether `s` has schema dependencies (dependencies' schema form, dependentSchemas).
  static bool schema_dependencies(const json::Value& s) {
    if (s.find("dependentSchemas")) return true;
    const json::Value* d = s.find("dependencies");
    if (!d || !d->is_object()) return false;
    return std::any_of(d->as_object().begin(), d->as_object().end(), [](const auto& e) { return !e.second.is_array(); });
  }

  // A flat schema's schema dependencies written out: an object either without the key, or with
  // it and valid against the key's schema too (an anyOf of the two, those no value meets left
  // out).
  json::Value dependent(json::Value s, const std::string& path, int depth) {
    if (!s.is_object() || !schema_dependencies(s)) return s;
    std::vector<std::pair<std::string, json::Value>> deps;
    json::Object rest, lists;
    for (const auto& [k, v] : s.as_object()) {
      if (k != "dependencies" && k != "dependentSchemas") {
        rest.emplace_back(k, v);
        continue;
      }
      KVPR_CHECK(v.is_object(), path, ": ", k, " must be an object");
      for (const auto& [name, d] : v.as_object()) {
        if (k == "dependencies" && d.is_array()) lists.emplace_back(name, d);
        else deps.emplace_back(name, d);
      }
    }
    if (!lists.empty()) rest.emplace_back("dependencies", json::Value(std::move(lists)));
    json::Value out(std::move(rest));
    for (const auto& [name, d] : deps) {
      const std::string at = path + ".dependencies." + name;
      if (d.is_bool() && d.as_bool()) continue;
      json::Array either;
      try {
        either.push_back(merge(out, without(name), at, depth + 1));
      } catch (const NoValue&) {
      }
      if (!d.is_bool()) {
        try {
          const json::Value with = merge(out, flat(d, at, depth + 1), at, depth + 1);
          either.push_back(merge(with, json::Value(json::Object{{"required", json::Value(json::Array{json::Value(name)})}}),
                                 at, depth + 1));
        } catch (const NoValue&) {
        }
      }
      if (either.empty()) throw NoValue(at + ": no object meets the dependency");
      out = either.size() == 1 ? std::move(either[0]) : json::Value(json::Object{{"anyOf", json::Value(std::move(either))}});
    }
    return out;
  }

  // The schema of the values both flat schemas `a` and `b` admit. An anyOf (oneOf) on one side
  // is distributed over the other; keywords on one side carry over; keywords on both combine
  // (types and enums intersected, required joined, the tighter bound, properties and items merged
  // in turn); anything else on both sides that differs is refused by name: a merge never admits
  // what one of them refuses.
  json::Value merge(const json::Value& a, const json::Value& b, const std::string& path, int depth) {
    KVPR_CHECK(depth <= Limits::kMaxNesting, path, ": the schema nests deeper than ", Limits::kMaxNesting,
               " levels (each $ref followed and each allOf counts one)");
    check_budget();
    auto alts_of = [](const json::Value& v) -> const char* {
      return v.find("anyOf") ? "anyOf" : v.find("oneOf") ? "oneOf" : nullptr;
    };
    const char* ka = alts_of(a);
    const char* kb = alts_of(b);
    KVPR_CHECK(!(ka && a.find("oneOf") && a.find("anyOf")) && !(kb && b.find("oneOf") && b.find("anyOf")),
               path, ": anyOf beside oneOf in one schema is not supported");
    if (ka && kb) {  // every pair of alternatives, those no value satisfies left out
      const json::Value* xs = a.find(ka);
      const json::Value* ys = b.find(kb);
      KVPR_CHECK(xs->is_array() && !xs->as_array().empty() && ys->is_array() && !ys->as_array().empty(), path, ": ",
                 ka, " must be a non-empty list");
      KVPR_CHECK(xs->as_array().size() * ys->as_array().size() <= Limits::kMaxAlternatives, path,
                 ": the schema is too large: allOf joins anyOf lists of more than ", Limits::kMaxAlternatives,
                 " pairs of alternatives");
      json::Object rest_a, rest_b;
      for (const auto& [k, v] : a.as_object())
        if (k != ka) rest_a.emplace_back(k, v);
      for (const auto& [k, v] : b.as_object())
        if (k != kb) rest_b.emplace_back(k, v);
      const json::Value common = merge(json::Value(std::move(rest_a)), json::Value(std::move(rest_b)), path, depth + 1);
      json::Array out;
      for (size_t i = 0; i < xs->as_array().size(); ++i)
        for (size_t j = 0; j < ys->as_array().size(); ++j) {
          const std::string at = path + "." + ka + "[" + std::to_string(i) + "]";
          try {
            const json::Value x = merge(common, flat(xs->as_array()[i], at, depth + 1), at, depth + 1);
            const std::string bt = path + "." + kb + "[" + std::to_string(j) + "]";
            out.push_back(merge(x, flat(ys->as_array()[j], bt, depth + 1), bt, depth + 1));
          } catch (const NoValue&) {
          }
        }
      if (out.empty()) throw NoValue(path + ": no pair of the anyOf (oneOf) alternatives allOf joins admits a value");
      return json::Value(json::Object{{"anyOf", json::Value(std::move(out))}});
    }
    if (ka || kb) {
      const json::Value& with = ka ? a : b;
      const char* key = ka ? ka : kb;
      const json::Value* alts = with.find(key);
      KVPR_CHECK(alts->is_array() && !alts->as_array().empty(), path, ": ", key, " must be a non-empty list");
      json::Object rest;
      for (const auto& [k, v] : with.as_object())
        if (k != key) rest.emplace_back(k, v);
      const json::Value common = merge(json::Value(std::move(rest)), ka ? b : a, path, depth + 1);
      json::Array out;
      for (size_t i = 0; i < alts->as_array().size(); ++i) {
        const std::string at = path + "." + key + "[" + std::to_string(i) + "]";
        try {
          out.push_back(merge(common, flat(alts->as_array()[i], at, depth + 1), at, depth + 1));
        } catch (const NoValue& e) {  // an alternative no value satisfies beside the rest: left out
          if (alts->as_array().size() == 1) throw;
        }
      }
      if (out.empty()) throw NoValue(path + ": no " + key + " alternative admits a value beside the schemas allOf joins");
      return json::Value(json::Object{{"anyOf", json::Value(std::move(out))}});
    }
    auto text = [](const json::Value& v) { return v.is_int() ? std::to_string(v.as_int()) : v.dump_python(); };
    auto number = [&](const json::Value* v, const char* k) {
      KVPR_CHECK(v->is_number(), path, ": ", k, " must be a number");
      return parse_dec(text(*v));
    };
    json::Object out;
    auto put = [&](const std::string& k, json::Value v) { out.emplace_back(k, std::move(v)); };
    std::vector<std::string> keys;
    for (const auto& [k, v] : a.as_object()) keys.push_back(k);
    for (const auto& [k, v] : b.as_object())
      if (!a.find(k)) keys.push_back(k);
    // A tuple on one side (prefixItems, or items as a list) and items on the other would apply the
    // other's items past the tuple alone; a pattern's keys on one side would skip the other's
    // additionalProperties. Refused unless both sides say the same.
    auto tuple = [](const json::Value& v) {
      const json::Value* items = v.find("items");
      return v.find("prefixItems") || (items && items->is_array());
    };
    auto same = [&](std::initializer_list<const char*> ks) {
      for (const char* k : ks) {
        const json::Value* x = a.find(k);
        const json::Value* y = b.find(k);
        if (!x != !y || (x && x->dump() != y->dump())) return false;
      }
      return true;
    };
    if ((tuple(a) || tuple(b)) && !same({"prefixItems", "items", "additionalItems"})) {
      const json::Value& other = tuple(a) ? b : a;
      KVPR_CHECK(!(tuple(a) && tuple(b)) && !other.find("items") && !other.find("additionalItems") &&
                     !other.find("prefixItems"),
                 path, ": allOf joining a tuple (prefixItems, items as a list) with other items is not supported");
    }
    if ((a.find("patternProperties") || b.find("patternProperties")) &&
        !same({"patternProperties", "properties", "additionalProperties"})) {
      const json::Value& other = a.find("patternProperties") ? b : a;
      KVPR_CHECK(!(a.find("patternProperties") && b.find("patternProperties")) && !other.find("properties") &&
                     !other.find("additionalProperties"),
                 path, ": allOf joining patternProperties with another schema's properties is not supported");
    }
    for (const std::string& k : keys) {
      if (k == "properties" || k == "additionalProperties") continue;  // below, together
      const json::Value* va = a.find(k);
      const json::Value* vb = b.find(k);
      if (!va || !vb || va->dump() == vb->dump()) {
        put(k, va ? *va : *vb);
        continue;
      }
      if (k == "type") {
        auto list = [](const json::Value* t) {
          std::vector<std::string> l;
          if (t->is_string()) l.push_back(t->as_string());
          else if (t->is_array())
            for (const auto& e : t->as_array())
              if (e.is_string()) l.push_back(e.as_string());
          return l;
        };
        const auto la = list(va), lb = list(vb);
        auto has = [](const std::vector<std::string>& l, const std::string& t) {
          return std::find(l.begin(), l.end(), t) != l.end();
        };
        json::Array both;
        for (const auto& t : la)
          if (has(lb, t) || (t == "integer" && has(lb, "number"))) both.push_back(json::Value(t));
        for (const auto& t : lb)
          if (t == "integer" && has(la, "number") && !has(la, "integer")) both.push_back(json::Value(t));
        if (both.empty()) throw NoValue(path + ": no type satisfies every schema allOf joins");
        put(k, both.size() == 1 ? both[0] : json::Value(std::move(both)));
      } else if (k == "required") {
        KVPR_CHECK(va->is_array() && vb->is_array(), path, ": required must be a list");
        json::Array names = va->as_array();
        for (const auto& n : vb->as_array())
          if (std::none_of(names.begin(), names.end(), [&](const json::Value& m) { return m.dump() == n.dump(); }))
            names.push_back(n);
        put(k, json::Value(std::move(names)));
      } else if (k == "enum") {
        KVPR_CHECK(va->is_array() && vb->is_array(), path, ": enum must be a list");
        json::Array common;
        for (const auto& x : va->as_array())
          if (std::any_of(vb->as_array().begin(), vb->as_array().end(), [&](const json::Value& y) { return x.dump() == y.dump(); }))
            common.push_back(x);
        if (common.empty()) throw NoValue(path + ": no enum value satisfies every schema allOf joins");
        put(k, json::Value(std::move(common)));
      } else if (k == "minimum" || k == "exclusiveMinimum" || k == "minLength" || k == "minItems" ||
                 k == "minProperties") {
        put(k, cmp(number(va, k.c_str()), number(vb, k.c_str())) >= 0 ? *va : *vb);
      } else if (k == "maximum" || k == "exclusiveMaximum" || k == "maxLength" || k == "maxItems" ||
                 k == "maxProperties") {
        put(k, cmp(number(va, k.c_str()), number(vb, k.c_str())) <= 0 ? *va : *vb);
      } else if (k == "uniqueItems") {
        put(k, json::Value(va->is_bool() && vb->is_bool() && (va->as_bool() || vb->as_bool())));
      } else if ((k == "items" || k == "additionalItems") && !va->is_array() && !vb->is_array()) {
        put(k, merge_or_false(*va, *vb, path + "." + k, depth + 1));
      } else {
        KVPR_THROW(path, ": allOf joins schemas whose '", k, "' differ, which is not supported");
      }
    }
    // Properties: a key one side lists takes, on the other, that side's schema for it, else its
    // additionalProperties' (false there: the key may not appear, so a required one fails).
    const json::Value* pa = a.find("properties");
    const json::Value* pb = b.find("properties");
    const json::Value* aa = a.find("additionalProperties");
    const json::Value* ab = b.find("additionalProperties");
    if ((pa || aa) && !pb && !ab) {  // one side alone says anything of keys: its word stands
      if (pa) put("properties", *pa);
    } else if ((pb || ab) && !pa && !aa) {
      if (pb) put("properties", *pb);
    } else if (pa || pb) {
      KVPR_CHECK((!pa || pa->is_object()) && (!pb || pb->is_object()), path, ": properties must be an object");
      std::vector<std::string> names;
      for (const json::Value* p : {pa, pb})
        if (p)
          for (const auto& [k, v] : p->as_object())
            if (std::find(names.begin(), names.end(), k) == names.end()) names.push_back(k);
      json::Object props;
      const json::Value* required = nullptr;
      for (const auto& [k, v] : out)
        if (k == "required") required = &v;
      for (const std::string& name : names) {
        const json::Value* sa = pa ? pa->find(name) : nullptr;
        const json::Value* sb = pb ? pb->find(name) : nullptr;
        if (!sa) sa = aa;
        if (!sb) sb = ab;
        const bool forbidden = (sa && admits_nothing(*sa)) || (sb && admits_nothing(*sb));
        if (forbidden) {
          const bool needed = required && required->is_array() &&
                              std::any_of(required->as_array().begin(), required->as_array().end(),
                                          [&](const json::Value& r) { return r.is_string() && r.as_string() == name; });
          if (needed) throw NoValue(path + ": required names '" + name + "', which a schema allOf joins forbids");
          // Dropped where the other keys' schema is false too; else kept, false.
          const bool closed = (aa && aa->is_bool() && !aa->as_bool()) || (ab && ab->is_bool() && !ab->as_bool());
          if (!closed) props.emplace_back(name, json::Value(false));
          continue;
        }
        const std::string at = path + ".properties." + name;
        props.emplace_back(name, !sa ? *sb : !sb ? *sa : sa->dump() == sb->dump() ? *sa : merge_or_false(*sa, *sb, at, depth + 1));
      }
      put("properties", json::Value(std::move(props)));
    }
    if (aa || ab) put("additionalProperties", !aa ? *ab : !ab ? *aa : merge_or_false(*aa, *ab, path + ".additionalProperties", depth + 1));
    return json::Value(std::move(out));
  }

  // merge of two schemas that may be booleans: false when either is.
  json::Value merge_or_false(const json::Value& a, const json::Value& b, const std::string& path, int depth) {
    if (admits_nothing(a) || admits_nothing(b)) return json::Value(false);
    if (a.is_bool()) return b;
    if (b.is_bool()) return a;
    return merge(flat(a, path, depth), flat(b, path, depth), path, depth);
  }

  // "#" and "#/..." (a JSON pointer into the schema, ~0 and ~1 unescaped, list items by index:
  // "#/$defs/Name", "#/definitions/a/definitions/b", "#/properties/x/items").
  // A URI fragment's %XX escapes decoded (RFC 3986), as a pointer in a $ref is written
  // ("#/patternProperties/%5Ba-z%5D%2B").
  static std::string percent_decoded(const std::string& ref) {
    auto hex = [](char c) {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    };
    std::string out;
    for (size_t i = 0; i < ref.size(); ++i) {
      if (ref[i] == '%' && i + 2 < ref.size() && hex(ref[i + 1]) >= 0 && hex(ref[i + 2]) >= 0) {
        out += static_cast<char>(hex(ref[i + 1]) * 16 + hex(ref[i + 2]));
        i += 2;
      } else {
        out += ref[i];
      }
    }
    return out;
  }

  const json::Value& resolve(const std::string& written, const std::string& path) const {
    if (written == "#") return root_;
    KVPR_CHECK(written.starts_with("#/"), path, ": $ref '", written, "' is not supported (\"#\" and pointers \"#/...\" "
               "into the schema are)");
    const std::string ref = percent_decoded(written);
    const json::Value* at = &root_;
    size_t i = 2;
    while (true) {
      std::string name;
      for (; i < ref.size() && ref[i] != '/'; ++i) {
        if (ref[i] == '~' && i + 1 < ref.size() && (ref[i + 1] == '0' || ref[i + 1] == '1')) {
          name += ref[i + 1] == '1' ? '/' : '~';
          ++i;
        } else {
          name += ref[i];
        }
      }
      const json::Value* next = nullptr;
      if (at->is_object()) {
        next = at->find(name);
      } else if (at->is_array() && !name.empty() && name.size() < 10 &&
                 name.find_first_not_of("0123456789") == std::string::npos && (name == "0" || name[0] != '0')) {
        const size_t k = std::stoul(name);
        if (k < at->as_array().size()) next = &at->as_array()[k];
      }
      KVPR_CHECK(next, path, ": $ref '", written, "' names no definition");
      at = next;
      if (i >= ref.size()) return *at;
      ++i;  // the '/'
    }
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
    check_budget();  // (an alternative left out is compiled again where another reaches it)
    if (s.is_bool()) {
      if (!s.as_bool()) throw NoValue(path + ": the schema false admits no value");
      return out_.any_;
    }
    KVPR_CHECK(s.is_object(), path, ": a schema must be an object or a boolean");
    for (const auto& [k, v] : s.as_object())
      KVPR_CHECK(!unenforced(k) || (k == "not" && negatable(v)), path, ": the keyword '", k, "' is not supported");
    if (admits_nothing(s)) throw NoValue(path + ": not {} admits no value");
    if (const json::Value* j = joined(s, path, depth)) return compile(*j, path, depth + 1);
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
      for (size_t i = 0; i < alts->as_array().size(); ++i) {
        const size_t nodes = out_.nodes_.size();
        try {
          n.options.push_back(compile(alts->as_array()[i], path + "." + key + "[" + std::to_string(i) + "]", depth + 1));
        } catch (const NoValue&) {  // an alternative no value satisfies: left out, and what it compiled
          if (alts->as_array().size() == 1) throw;
          out_.nodes_.resize(nodes);
          std::erase_if(refs_, [&](const auto& r) { return r.second >= static_cast<int>(nodes); });
          std::erase_if(where_, [&](const auto& w) { return w.first >= static_cast<int>(nodes); });
        }
      }
      if (n.options.empty()) throw NoValue(path + ": no " + key + " alternative admits a value");
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
      const json::Value* ap = s.find("additionalProperties");  // (true says nothing)
      if (s.find("properties") || s.find("required") || (ap && !(ap->is_bool() && ap->as_bool())) ||
          s.find("patternProperties") || s.find("dependencies") || s.find("dependentRequired") || s.find("dependentSchemas") ||
          s.find("minProperties") || s.find("maxProperties"))
        types = {"object"};
      else if (s.find("items") || s.find("prefixItems") || s.find("minItems") || s.find("maxItems") ||
               s.find("additionalItems") || s.find("uniqueItems"))
        types = {"array"};
      // A string's or a number's keywords alone apply to strings or numbers, and leave the other
      // types free (JSON Schema's reading: {"format": "positiveInteger"} admits 1).
      else if (s.find("minLength") || s.find("maxLength") || s.find("pattern") || s.find("format") ||
               s.find("minimum") || s.find("maximum") || s.find("exclusiveMinimum") || s.find("exclusiveMaximum") ||
               s.find("multipleOf"))
        types = {"string", "number", "object", "array", "boolean", "null"};
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
    const json::Value* c = s.find("const");
    if (const json::Value* e = s.find("enum")) {
      KVPR_CHECK(e->is_array() && !e->as_array().empty(), path, ": enum must be a non-empty list");
      for (const auto& v : e->as_array())
        if (!c || v.dump() == c->dump()) values.push_back(v);  // with const: const alone, if listed
      if (values.empty()) throw NoValue(path + ": const is not one of enum's values: no value is valid");
    } else if (c) {
      values.push_back(*c);
    }
    // The keywords of strings and of numbers beside them (a length, a pattern, bounds, as allOf's
    // merges and hand-written schemas put them) keep only the values that meet them.
    auto check_of = [&](const char* type, std::initializer_list<const char*> keys) {
      json::Object keep{{"type", json::Value(type)}};
      for (const char* k : keys)
        if (const json::Value* v = s.find(k)) keep.emplace_back(k, *v);
      std::optional<JsonSchema> out;
      if (keep.size() == 1) return out;
      try {
        out = JsonSchema::compile(json::Value(std::move(keep)));
      } catch (const Error& e) {
        KVPR_THROW(path, ": ", e.what());
      }
      return out;
    };
    const std::optional<JsonSchema> strings = check_of("string", {"minLength", "maxLength", "pattern", "format"});
    const std::optional<JsonSchema> numbers =
        check_of("number", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"});
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
      if (const std::optional<JsonSchema>& check = v.is_string() ? strings : numbers; fits && check && (v.is_string() || v.is_number())) {
        SchemaRecognizer r(&*check);
        if (!r.feed(text) || !r.complete()) continue;
      }
      if (fits && std::find(n.literals.begin(), n.literals.end(), text) == n.literals.end()) n.literals.push_back(text);
    }
    if (n.literals.empty())
      throw NoValue(path + ": no enum or const value has the schema's type" + (strings || numbers ? " and bounds" : ""));
    return add(std::move(n));
  }

  // minimum / exclusiveMinimum and maximum / exclusiveMaximum (the tighter of a pair); an
  // integer's become inclusive integer bounds (minimum 1.5: 2; exclusiveMaximum 10: 9).
  static void number_bounds(const json::Value& s, bool integer, SchemaNode& n, const std::string& path) {
    // Draft 4 writes an exclusive bound as minimum (maximum) with exclusiveMinimum (exclusiveMaximum)
    // true; false leaves it inclusive.
    auto draft4 = [&](const char* k) {
      const json::Value* v = s.find(k);
      return v && v->is_bool() && v->as_bool();
    };
    auto read = [&](const char* k, bool exclusive, bool lower, SchemaNode::Bound& b) {
      const json::Value* v = s.find(k);
      if (!v || (exclusive && v->is_bool())) return;
      KVPR_CHECK(v->is_number(), path, ": ", k, " must be a number");
      KVPR_CHECK(std::isfinite(v->as_double()), path, ": ", k, " must be finite");
      const std::string text = v->is_int() ? std::to_string(v->as_int()) : v->dump_python();
      if (b.set) {  // keep the tighter
        const int c = cmp(parse_dec(text), parse_dec(b.value));
        if (lower ? c < 0 || (c == 0 && b.exclusive) : c > 0 || (c == 0 && b.exclusive)) return;
      }
      b = SchemaNode::Bound{true, exclusive, text};
    };
    if (const json::Value* v = s.find("exclusiveMinimum"); v && v->is_bool() && v->as_bool())
      KVPR_CHECK(s.find("minimum"), path, ": exclusiveMinimum true needs a minimum");
    if (const json::Value* v = s.find("exclusiveMaximum"); v && v->is_bool() && v->as_bool())
      KVPR_CHECK(s.find("maximum"), path, ": exclusiveMaximum true needs a maximum");
    read("minimum", draft4("exclusiveMinimum"), true, n.lo);
    read("exclusiveMinimum", true, true, n.lo);
    read("maximum", draft4("exclusiveMaximum"), false, n.hi);
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
      if (!overlap(L, H)) throw NoValue(path + ": no " + (integer ? "integer" : "number") + " lies within its bounds");
    }
  }

  // multipleOf m as m = multiple / 10^multiple_scale, on numbers without an upper bound (where a
  // continuation that is a multiple always exists above a lower bound).
  static void multiple_of(const json::Value& s, SchemaNode& n, const std::string& path) {
    const json::Value* m = s.find("multipleOf");
    if (!m) return;
    KVPR_CHECK(m->is_number(), path, ": multipleOf must be a number");
    const Dec d = parse_dec(m->is_int() ? std::to_string(m->as_int()) : m->dump_python());
    const std::string digits = d.i + d.f;
    const size_t lead = digits.find_first_not_of('0');
    KVPR_CHECK(!d.neg && lead != std::string::npos, path, ": multipleOf must be above 0");
    KVPR_CHECK(digits.size() - lead <= 12 && d.f.size() <= 12, path, ": multipleOf ", m->dump_python(),
               " is not supported (a decimal of at most 12 digits is)");
    KVPR_CHECK(!n.hi.set, path, ": multipleOf beside maximum or exclusiveMaximum is not supported");
    KVPR_CHECK(!n.lo.set || !parse_dec(n.lo.value).neg, path, ": multipleOf beside a minimum below 0 is not supported");
    n.multiple = std::stoll(digits.substr(lead));
    n.multiple_scale = static_cast<int>(d.f.size());
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
      multiple_of(s, n, path);
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
    if (items && items->is_array()) {  // drafts 4 to 7's tuples: prefixItems and items since 2020-12
      KVPR_CHECK(!prefix, path, ": items as a list beside prefixItems");
      prefix = items->as_array().empty() ? nullptr : items;
      items = s.find("additionalItems");
    }
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
    if (!(np == 0 && lit >= 0 && out_.nodes_[static_cast<size_t>(lit)].kind == SchemaNode::Kind::Literals &&
          out_.nodes_[static_cast<size_t>(lit)].literals.size() <= 64)) {
      // Items that are scalars: each value given is kept and compared with the next ones.
      KVPR_CHECK(arr.items >= 0 && scalar(arr.items), path, ": uniqueItems true is supported for items that are "
                 "strings, numbers or literals (enum, const, boolean), not these");
      for (int p : arr.prefix)
        KVPR_CHECK(scalar(p), path, ": uniqueItems true is supported for items that are strings, numbers or "
                   "literals (enum, const, boolean), not these");
      arr.unique_values = true;
      return;
    }
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

  // Whether every value of node `at` is a string, a number or a literal (through anyOf and $ref).
  bool scalar(int at) const {
    std::vector<int> todo{at};
    std::set<int> seen;
    while (!todo.empty()) {
      const int i = todo.back();
      todo.pop_back();
      if (!seen.insert(i).second) continue;
      const SchemaNode& x = out_.nodes_[static_cast<size_t>(i)];
      using K = SchemaNode::Kind;
      if (x.kind == K::AnyOf && x.options.empty()) return false;  // a $ref still being compiled: it recurses
      if (x.kind == K::AnyOf) todo.insert(todo.end(), x.options.begin(), x.options.end());
      else if (x.kind != K::String && x.kind != K::Number && x.kind != K::Integer && x.kind != K::Literals) return false;
    }
    return true;
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
      KVPR_CHECK(props->as_object().size() <= Limits::kMaxProperties, path, ": more than ", Limits::kMaxProperties,
                 " properties are not supported");
      for (const auto& [k, v] : props->as_object()) {
        KVPR_CHECK(std::find(n.names.begin(), n.names.end(), k) == n.names.end(), path, ": property '", k, "' twice");
        n.names.push_back(k);
      }
    }
    const size_t listed = n.names.size();  // those after them: required, not in properties
    const json::Value* add_props = s.find("additionalProperties");
    const bool closed = add_props && add_props->is_bool() && !add_props->as_bool();
    std::tie(n.min_props, n.max_props) = bounds(s, "minProperties", "maxProperties", path);
    const json::Value* pattern_props = s.find("patternProperties");
    KVPR_CHECK(!pattern_props || pattern_props->is_object(), path, ": patternProperties must be an object");
    if (pattern_props && pattern_props->as_object().empty()) pattern_props = nullptr;
    std::vector<std::pair<std::shared_ptr<const Regex>, const json::Value*>> patterns;
    if (pattern_props)
      for (const auto& [k, v] : pattern_props->as_object()) {
        try {
          patterns.emplace_back(regex(k, path), &v);
        } catch (const Error& e) {
          KVPR_THROW(path, ".patternProperties: ", e.what());
        }
      }
    // A key two patterns match takes both schemas; with different schemas that is not supported
    // (refused here: a key refused only at its closing quote could leave nothing to write).
    for (size_t i = 0; i < patterns.size(); ++i)
      for (size_t j = 0; j < i; ++j) {
        const auto& [ri, vi] = patterns[i];
        const auto& [rj, vj] = patterns[j];
        check_budget();
        KVPR_CHECK(vi->dump() == vj->dump() || Regex::disjoint(*ri, *rj), path, ": patternProperties '", rj->pattern(),
                   "' and '", ri->pattern(), "' may match one key and give it different schemas, which is not supported");
      }
    // Whether a key properties does not list may appear: of additionalProperties' schema, or of a
    // pattern's that matches it.
    auto may_appear = [&](const std::string& name) {
      if (!closed) return true;
      const std::u32string text = Regex::code_points(name);
      return std::any_of(patterns.begin(), patterns.end(), [&](const auto& p) { return p.first->matches(text); });
    };
    if (const json::Value* req = s.find("required")) {
      KVPR_CHECK(req->is_array(), path, ": required must be a list");
      for (const auto& r : req->as_array()) {
        KVPR_CHECK(r.is_string(), path, ": required must list property names");
        auto it = std::find(n.names.begin(), n.names.end(), r.as_string());
        if (it == n.names.end()) {  // a key of the other keys' schema, which must be given
          if (!may_appear(r.as_string()))
            throw NoValue(path + ": required names '" + r.as_string() +
                          "', which is not in properties and additionalProperties false forbids");
          KVPR_CHECK(n.names.size() < Limits::kMaxProperties, path, ": more than ", Limits::kMaxProperties,
                     " properties are not supported");
          n.names.push_back(r.as_string());
          it = n.names.end() - 1;
        }
        n.required.set(static_cast<size_t>(it - n.names.begin()));
      }
    }
    // Keys that require others once given (the list form; a schema there is refused by name).
    for (const char* key : {"dependencies", "dependentRequired"}) {
      const json::Value* deps = s.find(key);
      if (!deps) continue;
      KVPR_CHECK(deps->is_object(), path, ": ", key, " must be an object");
      // A key's bit, the key added (of the other keys' schema) where properties does not list
      // it; -1 where it may not appear at all.
      auto bit = [&](const std::string& name) -> int {
        auto it = std::find(n.names.begin(), n.names.end(), name);
        if (it != n.names.end()) return static_cast<int>(it - n.names.begin());
        if (!may_appear(name)) return -1;
        KVPR_CHECK(n.names.size() < Limits::kMaxProperties, path, ": more than ", Limits::kMaxProperties,
                   " properties are not supported");
        n.names.push_back(name);
        return static_cast<int>(n.names.size()) - 1;
      };
      for (const auto& [k, v] : deps->as_object()) {
        KVPR_CHECK(v.is_array(), path, ".", key, ".", k, ": a schema there is not supported (a list of keys is)");
        const int a = bit(k);
        if (a < 0) continue;  // the key never appears
        KeySet needs;
        for (const auto& b : v.as_array()) {
          KVPR_CHECK(b.is_string(), path, ".", key, ".", k, ": must list property names");
          const int i = bit(b.as_string());
          KVPR_CHECK(i >= 0, path, ".", key, ".", k, ": names '", b.as_string(), "', which additionalProperties false forbids");
          needs.set(static_cast<size_t>(i));
        }
        n.depends.emplace_back(KeySet{}.with(static_cast<size_t>(a)), needs);
      }
    }
    const int at = add(std::move(n));
    if (props)
      for (const auto& [k, v] : props->as_object()) {
        // A listed key that a pattern matches must meet both schemas: merged.
        const json::Value* schema = &v;
        const std::u32string name = Regex::code_points(k);
        for (const auto& [rx, ps] : patterns)
          if (rx->matches(name)) {
            owned_.push_back(merge_or_false(*schema, *ps, path + ".properties." + k, depth + 1));
            schema = &owned_.back();
          }
        // false: the key may not appear (-1)
        const int p = admits_nothing(*schema) ? -1 : compile(*schema, path + ".properties." + k, depth + 1);
        out_.nodes_[static_cast<size_t>(at)].props.push_back(p);
      }
    for (const auto& [rx, ps] : patterns) {
      const int p = compile(*ps, path + ".patternProperties." + rx->pattern(), depth + 1);
      out_.nodes_[static_cast<size_t>(at)].pattern_props.emplace_back(rx, p);
    }
    int additional = out_.any_;  // JSON Schema's default: other keys with any values
    if (add_props && add_props->is_bool()) additional = add_props->as_bool() ? out_.any_ : -1;
    else if (add_props) additional = compile(*add_props, path + ".additionalProperties", depth + 1);
    SchemaNode& o = out_.nodes_[static_cast<size_t>(at)];
    o.additional = additional;
    // Keys that properties does not list (required, dependencies): a pattern's schema where one
    // matches, else the other keys'.
    for (size_t i = listed; i < o.names.size(); ++i) {
      int node = -1;
      for (const auto& [rx, p] : o.pattern_props)
        if (rx->matches(Regex::code_points(o.names[i]))) {
          KVPR_CHECK(node < 0 || node == p, path, ": the key '", o.names[i], "' matches two patternProperties");
          node = p;
        }
      o.props.push_back(node >= 0 ? node : additional);
    }
    for (size_t i = 0; i < o.names.size(); ++i)
      if (o.props[i] < 0 && o.keys_due({}).test(i))
        throw NoValue(path + ": required names '" + o.names[i] + "', whose schema is false");
    KVPR_CHECK(o.max_props < 0 || o.keys_due({}).count() <= o.max_props, path, ": maxProperties ", o.max_props,
               " is below the keys required");
    const int64_t allowed = std::count_if(o.props.begin(), o.props.end(), [](int p) { return p >= 0; });
    KVPR_CHECK(additional >= 0 || !o.pattern_props.empty() || allowed >= o.min_props, path, ": minProperties ",
               o.min_props, " exceeds the ", allowed, " keys additionalProperties false allows");
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
  std::deque<json::Value> owned_;  // merged schemas (joined), alive while they compile
  JsonSchema out_;
  std::map<std::string, int> refs_;
  std::map<int, std::string> where_;  // AnyOf nodes: the path that made them (for errors)
  std::map<std::string, std::shared_ptr<const Regex>> regexes_;
  size_t regex_states_ = 0;
  Clock::time_point t0_ = Clock::now();
};

JsonSchema JsonSchema::compile(const json::Value& schema) { return SchemaCompiler(schema).run(); }

}  // namespace kvpr
