#include "jinja/value.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "engine/base/error.h"
#include "engine/base/utf8.h"

namespace kvpr::jinja {

const Value* Args::get(size_t i, const std::string& name) const {
  if (i < positional.size()) return &positional[i];
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}

Value::Value(bool b) : kind_(Kind::Bool), b_(b), i_(b ? 1 : 0) {}
Value::Value(int64_t v) : kind_(Kind::Int), i_(v) {}
Value::Value(double v) : kind_(Kind::Float), f_num_(v) {}
Value::Value(std::string s) : kind_(Kind::String), s_(std::make_shared<const std::string>(std::move(s))) {}
Value::Value(List l) : kind_(Kind::Array) {
  for (const auto& e : l) nesting_ = std::max(nesting_, e.nesting_ + 1);
  if (l.empty()) nesting_ = 1;
  l_ = std::make_shared<const List>(std::move(l));
}
Value Value::tuple(List l) {
  Value v(std::move(l));
  v.tuple_ = true;
  return v;
}

Value::Value(Dict d) : kind_(Kind::Map) {
  nesting_ = 1;
  for (const auto& [k, e] : d) nesting_ = std::max(nesting_, e.nesting_ + 1);
  d_ = std::make_shared<Dict>(std::move(d));
}

const std::string& Value::hint() const {
  static const std::string none;
  return s_ ? *s_ : none;
}

Value Value::dict_with_keys(Dict d, List keys) {
  Value v(std::move(d));
  v.keys_ = std::make_shared<const List>(std::move(keys));
  return v;
}

Value Value::key_at(size_t i) const {
  if (keys_ && i < keys_->size()) return (*keys_)[i];
  return Value((*d_)[i].first);
}

std::string Value::key_text(const Value& key) { return key.is_string() ? key.as_string() : key.repr(); }

Value Value::namespace_of(Dict d) {
  Value v(std::move(d));
  v.kind_ = Kind::Namespace;
  return v;
}

Value Value::callable(Function f, std::string name) {
  Value v;
  v.kind_ = Kind::Callable;
  v.f_ = std::make_shared<const Function>(std::move(f));
  v.s_ = std::make_shared<const std::string>(std::move(name));
  return v;
}

Value Value::undefined(std::string hint) {
  Value v;
  v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::from_json(const json::Value& v) {
  switch (v.kind()) {
    case json::Value::Kind::Null: return none();
    case json::Value::Kind::Bool: return Value(v.as_bool());
    case json::Value::Kind::Int: return Value(v.as_int());
    case json::Value::Kind::Double: return Value(v.as_double());
    case json::Value::Kind::Str: return Value(v.as_string());
    case json::Value::Kind::Arr: {
      List l;
      for (const auto& e : v.as_array()) l.push_back(from_json(e));
      return Value(std::move(l));
    }
    case json::Value::Kind::Obj: {
      Dict d;
      for (const auto& [k, e] : v.as_object()) {
        auto it = std::find_if(d.begin(), d.end(), [&](const auto& p) { return p.first == k; });
        if (it != d.end()) it->second = from_json(e);  // json.loads: the last value, the first place
        else d.emplace_back(k, from_json(e));
      }
      return Value(std::move(d));
    }
  }
  return Value();
}

int64_t Value::as_int() const {
  if (kind_ == Kind::Float) return static_cast<int64_t>(f_num_);
  return i_;
}

double Value::as_double() const { return kind_ == Kind::Float ? f_num_ : static_cast<double>(i_); }

const Value* Value::find(const std::string& key) const {
  if (!is_dict()) return nullptr;
  for (const auto& [k, v] : *d_)
    if (k == key) return &v;
  return nullptr;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b_;
    case Kind::Int: return i_ != 0;
    case Kind::Float: return f_num_ != 0;
    case Kind::String: return !s_->empty();
    case Kind::Array: return !l_->empty();
    case Kind::Map: return !d_->empty();
    case Kind::Namespace:
    case Kind::Callable: return true;
  }
  return false;
}

std::string python_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  std::string out;
  json::append_python_float(out, v);
  return out;
}

namespace {
void append_repr_string(std::string& out, const std::string& s) {
  // Python's repr: single quotes unless the text has a single quote and no double one.
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  out.push_back(q);
  for (unsigned char c : s) {
    switch (c) {
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c == q) {
          out.push_back('\\');
          out.push_back(static_cast<char>(c));
        } else if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back(q);
}

void append_repr(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Value::Kind::String: append_repr_string(out, v.as_string()); break;
    case Value::Kind::Array: {
      out.push_back(v.is_tuple() ? '(' : '[');
      bool first = true;
      for (const auto& e : v.as_list()) {
        if (!first) out += ", ";
        first = false;
        append_repr(out, e);
      }
      if (v.is_tuple() && v.as_list().size() == 1) out.push_back(',');
      out.push_back(v.is_tuple() ? ')' : ']');
      break;
    }
    case Value::Kind::Map: {
      out.push_back('{');
      bool first = true;
      for (const auto& [k, e] : v.as_dict()) {
        if (!first) out += ", ";
        first = false;
        append_repr_string(out, k);
        out += ": ";
        append_repr(out, e);
      }
      out.push_back('}');
      break;
    }
    case Value::Kind::Undefined: out += "Undefined"; break;  // as a list prints jinja2's Undefined
    default: out += v.str();
  }
}

void append_json(std::string& out, const Value& v, int indent, int level, const std::string& item_sep,
                 const std::string& key_sep, bool sort_keys) {
  auto newline = [&](int at) {
    if (indent < 0) return;
    out.push_back('\n');
    out.append(static_cast<size_t>(indent * at), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::Undefined: KVPR_THROW("Object of type Undefined is not JSON serializable");
    case Value::Kind::None: out += "null"; break;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; break;
    case Value::Kind::Int: out += std::to_string(v.as_int()); break;
    case Value::Kind::Float: json::append_python_float(out, v.as_double()); break;
    case Value::Kind::String: json::append_quoted(out, v.as_string()); break;
    case Value::Kind::Array: {
      if (v.as_list().empty()) {
        out += "[]";
        break;
      }
      out.push_back('[');
      bool first = true;
      for (const auto& e : v.as_list()) {
        if (!first) out += item_sep;
        first = false;
        newline(level + 1);
        append_json(out, e, indent, level + 1, item_sep, key_sep, sort_keys);
      }
      newline(level);
      out.push_back(']');
      break;
    }
    case Value::Kind::Namespace: KVPR_THROW("Object of type Namespace is not JSON serializable");
    case Value::Kind::Map: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& p : v.as_dict()) items.push_back(&p);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      if (items.empty()) {
        out += "{}";
        break;
      }
      out.push_back('{');
      bool first = true;
      for (const auto* p : items) {
        if (!first) out += item_sep;
        first = false;
        newline(level + 1);
        json::append_quoted(out, p->first);
        out += key_sep;
        append_json(out, p->second, indent, level + 1, item_sep, key_sep, sort_keys);
      }
      newline(level);
      out.push_back('}');
      break;
    }
    case Value::Kind::Callable: KVPR_THROW("Object of type function is not JSON serializable");
  }
}
}  // namespace

std::string Value::str() const {
  switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return b_ ? "True" : "False";
    case Kind::Int: return std::to_string(i_);
    case Kind::Float: return python_float(f_num_);
    case Kind::String: return *s_;
    case Kind::Array:
    case Kind::Map: return repr();
    case Kind::Namespace: return "<Namespace>";
    case Kind::Callable: return "<function " + *s_ + ">";
  }
  return "";
}

std::string Value::repr() const {
  std::string out;
  append_repr(out, *this);
  return out;
}

std::string Value::to_json(int indent, const std::string& item_sep, const std::string& key_sep, bool sort_keys) const {
  std::string out;
  append_json(out, *this, indent, 0, item_sep, key_sep, sort_keys);
  return out;
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::Array: return "list";
    case Kind::Map: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Callable: return "function";
  }
  return "?";
}

bool operator==(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::Float || b.kind() == Value::Kind::Float) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::String: return a.as_string() == b.as_string();
    case Value::Kind::Array: return a.is_tuple() == b.is_tuple() && a.as_list() == b.as_list();
    case Value::Kind::Map: {
      const Dict &x = a.as_dict(), &y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* w = b.find(k);
        if (!w || !(v == *w)) return false;
      }
      return true;
    }
    case Value::Kind::Namespace: return &a.namespace_dict() == &b.namespace_dict();
    default: return false;
  }
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::Float || b.kind() == Value::Kind::Float) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 order = code point order
  if (a.is_list() && b.is_list()) {
    const List &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (less_than(x[i], y[i])) return true;
      if (less_than(y[i], x[i])) return false;
    }
    return x.size() < y.size();
  }
  KVPR_THROW("'<' not supported between instances of '", a.type_name(), "' and '", b.type_name(), "'");
}

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    int n = utf8_next(s, i, &c);
    if (n <= 0) n = 1;
    out.push_back(s.substr(i, static_cast<size_t>(n)));
    i += static_cast<size_t>(n);
  }
  return out;
}

bool python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

std::string strip(const std::string& s, bool left, bool right, const std::string* chars) {
  const std::vector<std::string> cps = code_points(s);
  std::unordered_set<std::string> set;
  if (chars)
    for (auto& c : code_points(*chars)) set.insert(c);
  auto strippable = [&](const std::string& c) {
    if (chars) return set.count(c) > 0;
    char32_t cp;
    return utf8_next(c, 0, &cp) > 0 && python_space(cp);
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strippable(cps[b])) ++b;
  if (right)
    while (e > b && strippable(cps[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) out += cps[i];
  return out;
}

}  // namespace kvpr::jinja
