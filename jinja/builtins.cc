// The tests, the str and dict methods and the globals of the Jinja interpreter, each a function
// found by name in one table (the filters are filters.cc's); the parser checks test names
// against the same table (known_test).
#include "jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>

#include "engine/base/error.h"
#include "engine/base/utf8.h"
#include "jinja/text.h"

namespace kvpr::jinja {

namespace {

constexpr size_t kMaxText = 64u << 20;  // bytes of one string a method makes

using Test = bool (*)(RenderContext& ctx, const std::string& name, const Value& v, const Value* x, int line);
using StringMethod = Value (*)(const std::string& s, const std::string& name);  // the bound method
using DictMethod = Value (*)(const Value& d, const std::string& name);

// A test's argument, which the comparisons need.
const Value& need(const Value* x, const std::string& name, int line) {
  if (!x) fail(line, "the test '" + name + "' takes an argument");
  return *x;
}

// A string method's optional string argument (None: absent).
const std::string* str_arg(const Args& a, size_t i, const char* n) {
  const Value* v = a.get(i, n);
  if (!v || v->is_none()) return nullptr;
  KVPR_CHECK(v->is_string(), "expected a string argument");
  return &v->as_string();
}

Value method(const std::string& name, Function f) { return Value::callable(std::move(f), "str." + name); }

// --------------------------------------------------------------------------------------- tests

bool test_defined(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  return !v.is_undefined();
}

bool test_undefined(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  return v.is_undefined();
}

bool test_none(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  return v.is_none();
}

bool test_boolean(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  return v.kind() == Value::Kind::Bool;
}

bool test_true(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  return v.kind() == Value::Kind::Bool && v.as_bool();
}

bool test_false(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  return v.kind() == Value::Kind::Bool && !v.as_bool();
}

bool test_integer(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  return v.kind() == Value::Kind::Int;
}

bool test_float(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  return v.kind() == Value::Kind::Float;
}

bool test_number(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  return v.is_number();
}

bool test_string(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  return v.is_string();
}

bool test_mapping(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  return v.kind() == Value::Kind::Map;
}

bool test_iterable(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  return v.is_list() || v.is_string() || v.kind() == Value::Kind::Map || v.is_undefined();
}

bool test_sequence(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  return v.is_list() || v.is_string() || v.kind() == Value::Kind::Map;
}

bool test_callable(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  return v.is_callable();
}

bool test_escaped(RenderContext&, const std::string&, const Value&, const Value*, int) {
  return false;
}

bool test_filter(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  return known_filter(v.str());
}

bool test_test(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  return known_test(v.str());
}

bool test_sameas(RenderContext&, const std::string& name, const Value& v, const Value* x, int line) {
  const Value& o = need(x, name, line);
  if (v.kind() != o.kind()) return false;
  if (v.is_none() || v.is_undefined()) return true;
  if (v.kind() == Value::Kind::Bool) return v.as_bool() == o.as_bool();
  return v == o && (v.is_number() || v.is_string());
}

bool test_eq(RenderContext&, const std::string& name, const Value& v, const Value* x, int line) {
  return v == need(x, name, line);
}

bool test_ne(RenderContext&, const std::string& name, const Value& v, const Value* x, int line) {
  return !(v == need(x, name, line));
}

bool test_lt(RenderContext& ctx, const std::string& name, const Value& v, const Value* x, int line) {
  return ctx.compare("<", v, need(x, name, line), line);
}

bool test_le(RenderContext& ctx, const std::string& name, const Value& v, const Value* x, int line) {
  return ctx.compare("<=", v, need(x, name, line), line);
}

bool test_gt(RenderContext& ctx, const std::string& name, const Value& v, const Value* x, int line) {
  return ctx.compare(">", v, need(x, name, line), line);
}

bool test_ge(RenderContext& ctx, const std::string& name, const Value& v, const Value* x, int line) {
  return ctx.compare(">=", v, need(x, name, line), line);
}

bool test_in(RenderContext& ctx, const std::string& name, const Value& v, const Value* x, int line) {
  return ctx.compare("in", v, need(x, name, line), line);
}

bool test_divisible(RenderContext&, const std::string& name, const Value& v, const Value* x, int line) {
  if (!v.is_number()) fail(line, "the test '" + name + "' needs a number");
  const int64_t n = v.as_int();
  if (name == "odd") return floor_mod(n, 2) == 1;
  if (name == "even") return floor_mod(n, 2) == 0;
  const int64_t d = need(x, name, line).as_int();
  if (d == 0) fail(line, "divisibleby 0");
  return d == -1 || floor_mod(n, d) == 0;
}

bool test_lower(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  // Python's islower()/isupper(): some cased character, and none of the other case.
  return v.is_string() && to_lower(v.as_string()) == v.as_string() && to_upper(v.as_string()) != v.as_string();
}

bool test_upper(RenderContext&, const std::string&, const Value& v, const Value*, int) {
  return v.is_string() && to_upper(v.as_string()) == v.as_string() && to_lower(v.as_string()) != v.as_string();
}

const std::map<std::string, Test>& tests() {
  static const std::map<std::string, Test> table = {
      {"defined", test_defined},
      {"undefined", test_undefined},
      {"none", test_none},
      {"boolean", test_boolean},
      {"true", test_true},
      {"false", test_false},
      {"integer", test_integer},
      {"float", test_float},
      {"number", test_number},
      {"string", test_string},
      {"mapping", test_mapping},
      {"iterable", test_iterable},
      {"sequence", test_sequence},
      {"callable", test_callable},
      {"escaped", test_escaped},
      {"filter", test_filter},
      {"test", test_test},
      {"sameas", test_sameas},
      {"eq", test_eq},
      {"equalto", test_eq},
      {"==", test_eq},
      {"ne", test_ne},
      {"!=", test_ne},
      {"lt", test_lt},
      {"lessthan", test_lt},
      {"<", test_lt},
      {"le", test_le},
      {"<=", test_le},
      {"gt", test_gt},
      {"greaterthan", test_gt},
      {">", test_gt},
      {"ge", test_ge},
      {">=", test_ge},
      {"in", test_in},
      {"odd", test_divisible},
      {"even", test_divisible},
      {"divisibleby", test_divisible},
      {"lower", test_lower},
      {"upper", test_upper}};
  return table;
}

// ------------------------------------------------------------------------ str and dict methods

Value str_strip(const std::string& s, const std::string& name) {
  const bool l = name != "rstrip", r = name != "lstrip";
  return method(name, [s, l, r](const Args& a) { return Value(strip(s, l, r, str_arg(a, 0, "chars"))); });
}

Value str_split(const std::string& s, const std::string& name) {
  const bool right = name == "rsplit";
  return method(name, [s, right](const Args& a) {
    const std::string* sep = str_arg(a, 0, "sep");
    const Value* m = a.get(1, "maxsplit");
    const int64_t maxsplit = m ? m->as_int() : -1;
    if (!right || maxsplit < 0) return Value(split(s, sep, maxsplit));
    // rsplit with a limit: split all, then join the leading parts back.
    List all = split(s, sep, -1);
    if (static_cast<int64_t>(all.size()) <= maxsplit + 1) return Value(std::move(all));
    KVPR_CHECK(sep, "rsplit with maxsplit needs a separator here");
    const size_t keep = all.size() - static_cast<size_t>(maxsplit);
    std::string head;
    for (size_t i = 0; i < keep; ++i) head += (i ? *sep : "") + all[i].as_string();
    List out{Value(head)};
    for (size_t i = keep; i < all.size(); ++i) out.push_back(all[i]);
    return Value(std::move(out));
  });
}

Value str_starts_or_ends(const std::string& s, const std::string& name) {
  const bool start = name == "startswith";
  return method(name, [s, start](const Args& a) {
    KVPR_CHECK(!a.positional.empty(), "startswith/endswith take an argument");
    return Value(starts_or_ends(s, a.positional[0], start));
  });
}

Value str_lower(const std::string& s, const std::string& name) {
  return method(name, [s](const Args&) { return Value(to_lower(s)); });
}

Value str_upper(const std::string& s, const std::string& name) {
  return method(name, [s](const Args&) { return Value(to_upper(s)); });
}

Value str_title(const std::string& s, const std::string& name) {
  return method(name, [s](const Args&) { return Value(title(s)); });
}

Value str_capitalize(const std::string& s, const std::string& name) {
  return method(name, [s](const Args&) { return Value(capitalize(s)); });
}

Value str_replace(const std::string& s, const std::string& name) {
  return method(name, [s](const Args& a) {
    KVPR_CHECK(a.positional.size() >= 2 && a.positional[0].is_string() && a.positional[1].is_string(),
               "replace takes two strings");
    const std::string &from = a.positional[0].as_string(), &to = a.positional[1].as_string();
    int64_t count = a.positional.size() > 2 ? a.positional[2].as_int() : -1;
    std::string out;
    if (from.empty()) {
      for (auto& c : code_points(s)) {
        if (count-- != 0) out += to;
        out += c;
      }
      if (count != 0) out += to;
      return Value(std::move(out));
    }
    size_t at = 0;
    while (count != 0) {
      const size_t f = s.find(from, at);
      if (f == std::string::npos) break;
      out.append(s, at, f - at);
      out += to;
      KVPR_CHECK(out.size() <= kMaxText, "replace past ", kMaxText, " bytes");
      at = f + from.size();
      --count;
    }
    out.append(s, at);
    return Value(std::move(out));
  });
}

Value str_find(const std::string& s, const std::string& name) {
  return method(name, [s, name](const Args& a) {
    KVPR_CHECK(!a.positional.empty() && a.positional[0].is_string(), name, " takes a string");
    const std::string& sub = a.positional[0].as_string();
    if (name == "count") {
      if (sub.empty()) return Value(static_cast<int64_t>(code_points(s).size()) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      return Value(n);
    }
    const size_t f = name == "rfind" ? s.rfind(sub) : s.find(sub);
    if (f == std::string::npos) {
      KVPR_CHECK(name != "index", "substring not found");
      return Value(int64_t{-1});
    }
    return Value(cp_index(s, f));
  });
}

Value str_join(const std::string& s, const std::string& name) {
  return method(name, [s](const Args& a) {
    KVPR_CHECK(!a.positional.empty(), "join takes an iterable");
    std::string out;
    bool first = true;
    const Value& it = a.positional[0];
    List items;
    if (it.is_list()) items = it.as_list();
    else if (it.is_string())
      for (auto& c : code_points(it.as_string())) items.emplace_back(c);
    for (const auto& x : items) {
      KVPR_CHECK(x.is_string(), "sequence item: expected str instance, ", x.type_name(), " found");
      if (!first) out += s;
      first = false;
      out += x.as_string();
      KVPR_CHECK(out.size() <= kMaxText, "join past ", kMaxText, " bytes");
    }
    return Value(std::move(out));
  });
}

Value str_splitlines(const std::string& s, const std::string& name) {
  return method(name, [s](const Args& a) {
    const Value* k = a.get(0, "keepends");
    return Value(splitlines(s, k && k->truthy()));
  });
}

Value str_is_class(const std::string& s, const std::string& name) {
  return method(name, [s, name](const Args&) {
    if (s.empty()) return Value(false);
    bool cased = false;
    for (unsigned char c : s) {
      if (name == "isdigit" && !std::isdigit(c)) return Value(false);
      if (name == "isalpha" && !std::isalpha(c)) return Value(false);
      if (name == "isalnum" && !std::isalnum(c)) return Value(false);
      if (name == "isspace" && !std::isspace(c)) return Value(false);
      if (name == "isupper" && std::islower(c)) return Value(false);
      if (name == "islower" && std::isupper(c)) return Value(false);
      if (std::isalpha(c)) cased = true;
    }
    return Value(name == "isupper" || name == "islower" ? cased : true);
  });
}

const std::map<std::string, StringMethod>& string_methods() {
  static const std::map<std::string, StringMethod> table = {
      {"strip", str_strip},
      {"lstrip", str_strip},
      {"rstrip", str_strip},
      {"split", str_split},
      {"rsplit", str_split},
      {"startswith", str_starts_or_ends},
      {"endswith", str_starts_or_ends},
      {"lower", str_lower},
      {"upper", str_upper},
      {"title", str_title},
      {"capitalize", str_capitalize},
      {"replace", str_replace},
      {"find", str_find},
      {"rfind", str_find},
      {"index", str_find},
      {"count", str_find},
      {"join", str_join},
      {"splitlines", str_splitlines},
      {"isdigit", str_is_class},
      {"isalpha", str_is_class},
      {"isalnum", str_is_class},
      {"isspace", str_is_class},
      {"isupper", str_is_class},
      {"islower", str_is_class}};
  return table;
}

Value dict_items(const Value& d, const std::string&) {
  return Value::callable(
      [d](const Args&) {
        List out;
        for (size_t i = 0; i < d.as_dict().size(); ++i) out.push_back(Value::tuple({d.key_at(i), d.as_dict()[i].second}));
        return Value(std::move(out));
      },
      "items");
}

Value dict_keys(const Value& d, const std::string&) {
  return Value::callable(
      [d](const Args&) {
        List out;
        for (size_t i = 0; i < d.as_dict().size(); ++i) out.push_back(d.key_at(i));
        return Value(std::move(out));
      },
      "keys");
}

Value dict_values(const Value& d, const std::string&) {
  return Value::callable(
      [d](const Args&) {
        List out;
        for (const auto& [k, e] : d.as_dict()) out.push_back(e);
        return Value(std::move(out));
      },
      "values");
}

Value dict_get(const Value& d, const std::string&) {
  return Value::callable(
      [d](const Args& a) {
        const Value* key = a.get(0, "key");
        KVPR_CHECK(key, "dict.get takes a key");
        if (const Value* f = d.find(Value::key_text(*key))) return *f;
        const Value* def = a.get(1, "default");
        return def ? *def : Value::none();
      },
      "get");
}

Value dict_unsafe(const Value&, const std::string& name) {
  return Value::callable(
      [name](const Args&) -> Value { KVPR_THROW("access to attribute '", name, "' of 'dict' object is unsafe"); },
      name);
}

const std::map<std::string, DictMethod>& dict_methods() {
  static const std::map<std::string, DictMethod> table = {
      {"items", dict_items},
      {"keys", dict_keys},
      {"values", dict_values},
      {"get", dict_get},
      {"copy", dict_unsafe},
      {"pop", dict_unsafe},
      {"update", dict_unsafe},
      {"setdefault", dict_unsafe},
      {"clear", dict_unsafe},
      {"popitem", dict_unsafe}};
  return table;
}

}  // namespace

void fail(int line, const std::string& what) { KVPR_THROW("line ", line, ": ", what); }

bool known_test(const std::string& name) { return tests().count(name) > 0; }

bool apply_test(RenderContext& ctx, const std::string& name, const Value& v, const Args& a, int line) {
  const auto it = tests().find(name);
  if (it == tests().end()) fail(line, "no test named '" + name + "'");
  return it->second(ctx, name, v, a.get(0, "value"), line);
}

Value string_method(const std::string& s, const std::string& name) {
  const auto it = string_methods().find(name);
  return it == string_methods().end() ? Value() : it->second(s, name);
}

Value dict_method(const Value& d, const std::string& name) {
  const auto it = dict_methods().find(name);
  return it == dict_methods().end() ? Value() : it->second(d, name);
}

Scope globals(RenderContext& ctx) {
  Scope g;
  g["range"] = Value::callable(
      [&ctx](const Args& a) {
        int64_t start = 0, stop = 0, stepv = 1;
        if (a.positional.size() == 1) stop = a.positional[0].as_int();
        else if (a.positional.size() >= 2) {
          start = a.positional[0].as_int();
          stop = a.positional[1].as_int();
          if (a.positional.size() > 2) stepv = a.positional[2].as_int();
        }
        KVPR_CHECK(stepv != 0, "range() arg 3 must not be zero");
        // jinja2's sandbox refuses ranges of more than MAX_RANGE (100000) items.
        const long double n = stepv > 0 ? (static_cast<long double>(stop) - start) / stepv
                                         : (static_cast<long double>(start) - stop) / -static_cast<long double>(stepv);
        KVPR_CHECK(n <= 100000, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        List out;
        for (int64_t k = 0; n > 0 && k < static_cast<int64_t>(std::ceil(n)); ++k) out.emplace_back(start + k * stepv);
        ctx.add_steps(static_cast<int64_t>(out.size()));
        return Value(std::move(out));
      },
      "range");
  g["namespace"] = Value::callable(
      [&ctx](const Args& a) {
        Dict d;
        if (!a.positional.empty() && a.positional[0].is_dict()) d = a.positional[0].as_dict();
        for (const auto& [k, v] : a.keyword) d.emplace_back(k, v);
        Value ns = Value::namespace_of(std::move(d));
        return ctx.keep_namespace(std::move(ns));
      },
      "namespace");
  g["dict"] = Value::callable(
      [](const Args& a) {
        Dict d;
        if (!a.positional.empty() && a.positional[0].is_dict()) d = a.positional[0].as_dict();
        for (const auto& [k, v] : a.keyword) d.emplace_back(k, v);
        return Value(std::move(d));
      },
      "dict");
  g["raise_exception"] = Value::callable(
      [](const Args& a) -> Value { KVPR_THROW(a.positional.empty() ? std::string("raise_exception") : a.positional[0].str()); },
      "raise_exception");
  g["strftime_now"] = Value::callable(
      [](const Args& a) {
        const std::string fmt = a.positional.empty() ? "" : a.positional[0].str();
        const std::time_t t = std::time(nullptr);
        std::tm tm{};
        localtime_r(&t, &tm);
        char buf[256];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"  // the template's format, as Python's strftime takes it
        const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
#pragma GCC diagnostic pop
        return Value(std::string(buf, n));
      },
      "strftime_now");
  return g;
}

}  // namespace kvpr::jinja
