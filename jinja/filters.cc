// The filters templates apply (`x | name(args)`), as jinja2 has them: one function each, found
// by name in one table (filters()), which the parser also checks names against.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "engine/base/error.h"
#include "engine/base/utf8.h"
#include "jinja/builtins.h"
#include "jinja/text.h"

namespace kvpr::jinja {

namespace {

using Filter = Value (*)(RenderContext& ctx, const std::string& name, const Value& v, const Args& a, int line);

const Value* arg(const Args& a, size_t i, const char* name) { return a.get(i, name); }

// The value at a dotted path ("user.name", "0.id") in `item`, as jinja2's attribute= arguments.
Value attribute_of(RenderContext& ctx, const Value& item, const std::string& path, int line) {
  Value cur = item;
  size_t at = 0;
  while (true) {
    const size_t dot = path.find('.', at);
    const std::string part = path.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
    if (!part.empty() && part.size() < 18 && std::all_of(part.begin(), part.end(), ::isdigit))
      cur = ctx.get_item(cur, Value(static_cast<int64_t>(std::stoll(part))), line);
    else
      cur = ctx.get_item(cur, Value(part), line);
    if (dot == std::string::npos) return cur;
    at = dot + 1;
  }
}

std::string sort_key_text(const Value& v, bool case_sensitive) {
  return case_sensitive ? v.as_string() : to_lower(v.as_string());
}
bool sort_less(const Value& x, const Value& y, bool case_sensitive) {
  if (x.is_string() && y.is_string()) return sort_key_text(x, case_sensitive) < sort_key_text(y, case_sensitive);
  return less_than(x, y);
}

Value filter_safe(RenderContext&, const std::string&, const Value& v, const Args&, int) {
  return v;
}

Value filter_string(RenderContext&, const std::string&, const Value& v, const Args&, int) {
  return v.is_string() ? v : Value(v.str());
}

Value filter_escape(RenderContext&, const std::string&, const Value& v, const Args&, int) {
  return Value(html_escape(v.str()));
}

Value filter_default(RenderContext&, const std::string&, const Value& v, const Args& a, int) {
  const Value* def = arg(a, 0, "default_value");
  const Value* boolean = arg(a, 1, "boolean");
  const bool use = boolean && boolean->truthy() ? !v.truthy() : v.is_undefined();
  return use ? (def ? *def : Value(std::string())) : v;
}

Value filter_length(RenderContext&, const std::string&, const Value& v, const Args&, int line) {
  switch (v.kind()) {
    case Value::Kind::String: return Value(static_cast<int64_t>(code_points(v.as_string()).size()));
    case Value::Kind::Array: return Value(static_cast<int64_t>(v.as_list().size()));
    case Value::Kind::Map:
    case Value::Kind::Namespace: return Value(static_cast<int64_t>(v.as_dict().size()));
    case Value::Kind::Undefined: return Value(int64_t{0});
    default: fail(line, std::string("object of type '") + v.type_name() + "' has no len()");
  }
}

Value filter_tojson(RenderContext& ctx, const std::string&, const Value& v, const Args& a, int line) {
  const Value* ind = arg(a, 1, "indent");
  const Value* ascii = arg(a, 0, "ensure_ascii");
  const Value* seps = arg(a, 2, "separators");
  const Value* sort = arg(a, 3, "sort_keys");
  if (ind && ind->is_number() && (ind->as_int() < 0 || ind->as_int() > 64)) fail(line, "tojson: indent must be 0..64");
  const int indent = ind && ind->is_number() ? static_cast<int>(ind->as_int()) : -1;
  std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
  if (seps && seps->is_list() && seps->as_list().size() == 2) {
    item_sep = seps->as_list()[0].str();
    key_sep = seps->as_list()[1].str();
  }
  std::string out = v.to_json(indent, item_sep, key_sep, sort && sort->truthy());
  if (out.size() > ctx.limits().max_output) fail(line, "tojson past the output budget");
  return Value(ascii && ascii->truthy() ? ensure_ascii(out) : out);
}

Value filter_trim(RenderContext&, const std::string&, const Value& v, const Args& a, int) {
  const Value* chars = arg(a, 0, "chars");
  return Value(strip(v.str(), true, true, chars && chars->is_string() ? &chars->as_string() : nullptr));
}

Value filter_lower(RenderContext&, const std::string&, const Value& v, const Args&, int) {
  return Value(to_lower(v.str()));
}

Value filter_upper(RenderContext&, const std::string&, const Value& v, const Args&, int) {
  return Value(to_upper(v.str()));
}

Value filter_title(RenderContext&, const std::string&, const Value& v, const Args&, int) {
  return Value(title(v.str()));
}

Value filter_capitalize(RenderContext&, const std::string&, const Value& v, const Args&, int) {
  return Value(capitalize(v.str()));
}

Value filter_replace(RenderContext&, const std::string&, const Value& v, const Args& a, int) {
  Value m = string_method(v.str(), "replace");
  return m.call(a);
}

Value filter_items(RenderContext&, const std::string&, const Value& v, const Args&, int line) {
  if (v.is_undefined()) return Value(List{});
  if (!v.is_dict()) fail(line, "can only get item pairs from a mapping");
  return dict_method(v, "items").call(Args{});
}

Value filter_list(RenderContext& ctx, const std::string&, const Value& v, const Args&, int line) {
  return Value(ctx.iterate(v, line));
}

Value filter_first_or_last(RenderContext& ctx, const std::string& name, const Value& v, const Args&, int line) {
  const List l = ctx.iterate(v, line);
  if (l.empty()) return Value::undefined("no " + name + " item, sequence was empty");
  return name == "first" ? l.front() : l.back();
}

Value filter_reverse(RenderContext& ctx, const std::string&, const Value& v, const Args&, int line) {
  if (v.is_string()) {
    std::vector<std::string> cps = code_points(v.as_string());
    std::string out;
    for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
    return Value(std::move(out));
  }
  List l = ctx.iterate(v, line);
  std::reverse(l.begin(), l.end());
  return Value(std::move(l));
}

Value filter_join(RenderContext& ctx, const std::string&, const Value& v, const Args& a, int line) {
  const Value* sep = arg(a, 0, "d");
  const Value* attr = arg(a, 1, "attribute");
  std::string out;
  bool first = true;
  for (const auto& x : ctx.iterate(v, line)) {
    if (!first) out += sep ? sep->str() : "";
    first = false;
    out += (attr ? attribute_of(ctx, x, attr->str(), line) : x).str();
    if (out.size() > ctx.limits().max_output) fail(line, "join past the output budget");
  }
  return Value(std::move(out));
}

Value filter_int(RenderContext&, const std::string&, const Value& v, const Args& a, int) {
  const Value* def = arg(a, 0, "default");
  const Value fallback = def ? *def : Value(int64_t{0});
  if (v.is_number()) return Value(v.kind() == Value::Kind::Float ? static_cast<int64_t>(v.as_double()) : v.as_int());
  if (v.is_string()) {
    const std::string t = strip(v.as_string(), true, true);
    try {
      size_t used = 0;
      const long long i = std::stoll(t, &used, 10);
      if (used == t.size()) return Value(static_cast<int64_t>(i));
      const double d = std::stod(t, &used);
      if (used == t.size()) return Value(static_cast<int64_t>(d));
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value filter_float(RenderContext&, const std::string&, const Value& v, const Args& a, int) {
  const Value* def = arg(a, 0, "default");
  const Value fallback = def ? *def : Value(0.0);
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    try {
      size_t used = 0;
      const std::string t = strip(v.as_string(), true, true);
      const double d = std::stod(t, &used);
      if (used == t.size()) return Value(d);
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value filter_abs(RenderContext&, const std::string&, const Value& v, const Args&, int line) {
  if (!v.is_number()) fail(line, std::string("bad operand type for abs(): '") + v.type_name() + "'");
  if (v.kind() == Value::Kind::Float) return Value(std::fabs(v.as_double()));
  if (v.as_int() == INT64_MIN) fail(line, "integer overflow in abs");
  return Value(static_cast<int64_t>(std::llabs(v.as_int())));
}

Value filter_round(RenderContext&, const std::string&, const Value& v, const Args& a, int line) {
  const Value* p = arg(a, 0, "precision");
  const Value* m = arg(a, 1, "method");
  const int64_t prec = p ? p->as_int() : 0;
  const std::string method = m ? m->str() : "common";
  if (!v.is_number()) fail(line, "round needs a number");
  const double scale = std::pow(10.0, static_cast<double>(prec));
  if (method == "floor") return Value(std::floor(v.as_double() * scale) / scale);
  if (method == "ceil") return Value(std::ceil(v.as_double() * scale) / scale);
  if (v.kind() != Value::Kind::Float) {
    if (prec >= 0) return Value(v.as_int());
    const double r = std::nearbyint(static_cast<double>(v.as_int()) / std::pow(10.0, static_cast<double>(-prec)));
    return Value(static_cast<int64_t>(r * std::pow(10.0, static_cast<double>(-prec))));
  }
  if (prec < 0 || prec > 300) return Value(std::nearbyint(v.as_double() * scale) / scale);
  // Python's round is correctly rounded (halves to even on the exact binary value), as printf's is.
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(prec), v.as_double());
  return Value(std::strtod(buf, nullptr));
}

Value filter_indent(RenderContext& ctx, const std::string&, const Value& v, const Args& a, int line) {
  const Value* w = arg(a, 0, "width");
  const Value* first = arg(a, 1, "first");
  const Value* blank = arg(a, 2, "blank");
  const int64_t width = w && !w->is_string() ? w->as_int() : 4;
  if (width < 0 || width > 1024) fail(line, "indent: width must be 0..1024");
  const std::string ind = w && w->is_string() ? w->as_string() : std::string(static_cast<size_t>(width), ' ');
  if (ind.size() * (v.str().size() + 1) > ctx.limits().max_output) fail(line, "indent past the output budget");
  const List lines = splitlines(v.str() + "\n", false);
  std::string out;
  if (blank && blank->truthy()) {
    for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" + ind : "") + lines[i].as_string();
  } else {
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::string& l = lines[i].as_string();
      if (i == 0) out += l;
      else out += "\n" + (l.empty() ? l : ind + l);
    }
  }
  if (first && first->truthy()) out = ind + out;
  return Value(std::move(out));
}

Value filter_format(RenderContext&, const std::string&, const Value& v, const Args& a, int line) {
  List args = a.positional;
  try {
    return Value(percent_format(v.str(), Value::tuple(std::move(args))));
  } catch (const Error& e) {
    fail(line, e.what());
  }
}

Value filter_wordcount(RenderContext&, const std::string&, const Value& v, const Args&, int) {
  int64_t n = 0;
  bool in = false;
  for (unsigned char c : v.str()) {
    const bool w = std::isalnum(c) || c == '_' || c >= 0x80;
    if (w && !in) ++n;
    in = w;
  }
  return Value(n);
}

Value filter_attr(RenderContext& ctx, const std::string&, const Value& v, const Args& a, int line) {
  return ctx.get_attr(v, a.positional.empty() ? "" : a.positional[0].str(), line);
}

Value filter_map(RenderContext& ctx, const std::string&, const Value& v, const Args& a, int line) {
  List out;
  const Value* attr = arg(a, 99, "attribute");
  const Value* def = arg(a, 99, "default");
  if (attr) {
    for (const auto& x : ctx.iterate(v, line)) {
      Value r = attribute_of(ctx, x, attr->str(), line);
      out.push_back(r.is_undefined() && def ? *def : r);
    }
    return Value(std::move(out));
  }
  if (a.positional.empty()) fail(line, "map needs a filter name or attribute=");
  const std::string f = a.positional[0].str();
  if (!known_filter(f)) fail(line, "no filter named '" + f + "'");
  Args rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  for (const auto& x : ctx.iterate(v, line)) out.push_back(apply_filter(ctx, f, x, rest, line));
  return Value(std::move(out));
}

Value filter_select(RenderContext& ctx, const std::string& name, const Value& v, const Args& a, int line) {
  const bool by_attr = name == "selectattr" || name == "rejectattr";
  const bool keep_if = name == "select" || name == "selectattr";
  size_t k = 0;
  std::string attr;
  if (by_attr) {
    if (a.positional.empty()) fail(line, name + " needs an attribute");
    attr = a.positional[k++].str();
  }
  std::string test;
  if (k < a.positional.size()) test = a.positional[k++].str();
  if (!test.empty() && !known_test(test)) fail(line, "no test named '" + test + "'");
  Args rest;
  rest.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(std::min(k, a.positional.size())),
                         a.positional.end());
  List out;
  for (const auto& x : ctx.iterate(v, line)) {
    const Value subject = by_attr ? attribute_of(ctx, x, attr, line) : x;
    const bool ok = test.empty() ? subject.truthy() : apply_test(ctx, test, subject, rest, line);
    if (ok == keep_if) out.push_back(x);
  }
  return Value(std::move(out));
}

Value filter_sorted(RenderContext& ctx, const std::string& name, const Value& v, const Args& a, int line) {
  const Value* rev = name == "sort" ? arg(a, 0, "reverse") : nullptr;
  const Value* cs = arg(a, name == "sort" ? 1 : 0, "case_sensitive");
  const Value* attr = arg(a, name == "sort" ? 2 : 1, "attribute");
  const bool case_sensitive = cs && cs->truthy();
  List l = ctx.iterate(v, line);
  auto key = [&](const Value& x) { return attr ? attribute_of(ctx, x, attr->str(), line) : x; };
  try {
    if (name == "unique") {
      List out;
      std::vector<Value> seen;
      for (const auto& x : l) {
        Value k2 = key(x);
        if (k2.is_string() && !case_sensitive) k2 = Value(to_lower(k2.as_string()));
        if (std::find(seen.begin(), seen.end(), k2) != seen.end()) continue;
        seen.push_back(k2);
        out.push_back(x);
      }
      return Value(std::move(out));
    }
    if (name == "max" || name == "min") {  // the first of the largest (smallest), as Python's
      if (l.empty()) return Value::undefined("no " + name + " item, sequence was empty");
      size_t best = 0;
      for (size_t i = 1; i < l.size(); ++i)
        if (name == "max" ? sort_less(key(l[best]), key(l[i]), case_sensitive)
                          : sort_less(key(l[i]), key(l[best]), case_sensitive))
          best = i;
      return l[best];
    }
    const bool reverse = rev && rev->truthy();
    std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
      return reverse ? sort_less(key(y), key(x), case_sensitive) : sort_less(key(x), key(y), case_sensitive);
    });
  } catch (const Error& e) {
    fail(line, e.what());
  }
  return Value(std::move(l));
}

Value filter_dictsort(RenderContext&, const std::string&, const Value& v, const Args& a, int line) {
  if (!v.is_dict()) fail(line, "dictsort needs a mapping");
  const Value* cs = arg(a, 0, "case_sensitive");
  const Value* by = arg(a, 1, "by");
  const Value* rev = arg(a, 2, "reverse");
  List pairs = dict_method(v, "items").call(Args{}).as_list();
  const size_t idx = by && by->str() == "value" ? 1 : 0;
  try {
    std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
      return sort_less(x.as_list()[idx], y.as_list()[idx], cs && cs->truthy());
    });
  } catch (const Error& e) {
    fail(line, e.what());
  }
  if (rev && rev->truthy()) std::reverse(pairs.begin(), pairs.end());
  return Value(std::move(pairs));
}

Value filter_sum(RenderContext& ctx, const std::string&, const Value& v, const Args& a, int line) {
  const Value* attr = arg(a, 0, "attribute");
  const Value* start = arg(a, 1, "start");
  Value total = start ? *start : Value(int64_t{0});
  for (const auto& x : ctx.iterate(v, line)) total = ctx.binary("+", total, attr ? attribute_of(ctx, x, attr->str(), line) : x, line);
  return total;
}

const std::map<std::string, Filter>& filters() {
  static const std::map<std::string, Filter> table = {
      {"safe", filter_safe},
      {"string", filter_string},
      {"e", filter_escape},
      {"escape", filter_escape},
      {"d", filter_default},
      {"default", filter_default},
      {"length", filter_length},
      {"count", filter_length},
      {"tojson", filter_tojson},
      {"trim", filter_trim},
      {"lower", filter_lower},
      {"upper", filter_upper},
      {"title", filter_title},
      {"capitalize", filter_capitalize},
      {"replace", filter_replace},
      {"items", filter_items},
      {"list", filter_list},
      {"first", filter_first_or_last},
      {"last", filter_first_or_last},
      {"reverse", filter_reverse},
      {"join", filter_join},
      {"int", filter_int},
      {"float", filter_float},
      {"abs", filter_abs},
      {"round", filter_round},
      {"indent", filter_indent},
      {"format", filter_format},
      {"wordcount", filter_wordcount},
      {"attr", filter_attr},
      {"map", filter_map},
      {"select", filter_select},
      {"reject", filter_select},
      {"selectattr", filter_select},
      {"rejectattr", filter_select},
      {"sort", filter_sorted},
      {"unique", filter_sorted},
      {"max", filter_sorted},
      {"min", filter_sorted},
      {"dictsort", filter_dictsort},
      {"sum", filter_sum}};
  return table;
}

}  // namespace

bool known_filter(const std::string& name) { return filters().count(name) > 0; }

Value apply_filter(RenderContext& ctx, const std::string& name, const Value& v, const Args& a, int line) {
  const auto it = filters().find(name);
  if (it == filters().end()) fail(line, "no filter named '" + name + "'");
  return it->second(ctx, name, v, a, line);
}

}  // namespace kvpr::jinja
