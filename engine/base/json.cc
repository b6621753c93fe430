#include "engine/base/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "engine/base/error.h"
#include "engine/base/utf8.h"

namespace kvpr::json {

namespace {
const char* kind_name(Value::Kind k) {
  switch (k) {
    case Value::Kind::Null: return "null";
    case Value::Kind::Bool: return "a boolean";
    case Value::Kind::Int: return "an integer";
    case Value::Kind::Double: return "a number";
    case Value::Kind::Str: return "a string";
    case Value::Kind::Arr: return "an array";
    case Value::Kind::Obj: return "an object";
  }
  return "?";
}
}  // namespace

bool Value::as_bool() const {
  KVPR_CHECK(is_bool(), "expected a boolean, found ", kind_name(kind()));
  return std::get<bool>(v_);
}

int64_t Value::as_int() const {
  if (is_int()) return std::get<int64_t>(v_);
  if (kind() == Kind::Double) {
    double d = std::get<double>(v_);
    KVPR_CHECK(std::floor(d) == d && std::fabs(d) < 9.2e18, "expected an integer, found ", d);
    return static_cast<int64_t>(d);
  }
  KVPR_THROW("expected an integer, found ", kind_name(kind()));
}

double Value::as_double() const {
  if (is_int()) return static_cast<double>(std::get<int64_t>(v_));
  KVPR_CHECK(kind() == Kind::Double, "expected a number, found ", kind_name(kind()));
  return std::get<double>(v_);
}

const std::string& Value::as_string() const {
  KVPR_CHECK(is_string(), "expected a string, found ", kind_name(kind()));
  return std::get<std::string>(v_);
}

const Array& Value::as_array() const {
  KVPR_CHECK(is_array(), "expected an array, found ", kind_name(kind()));
  return *std::get<std::shared_ptr<Array>>(v_);
}
Array& Value::as_array() {
  KVPR_CHECK(is_array(), "expected an array, found ", kind_name(kind()));
  return *std::get<std::shared_ptr<Array>>(v_);
}
const Object& Value::as_object() const {
  KVPR_CHECK(is_object(), "expected an object, found ", kind_name(kind()));
  return *std::get<std::shared_ptr<Object>>(v_);
}
Object& Value::as_object() {
  KVPR_CHECK(is_object(), "expected an object, found ", kind_name(kind()));
  return *std::get<std::shared_ptr<Object>>(v_);
}

const Value* Value::find(std::string_view key) const {
  if (!is_object()) return nullptr;
  for (const auto& [k, v] : as_object())
    if (k == key) return &v;
  return nullptr;
}

void Value::set(std::string key, Value v) {
  if (is_null()) *this = Value(Object{});
  Object& o = as_object();
  for (auto& [k, old] : o)
    if (k == key) {
      old = std::move(v);
      return;
    }
  o.emplace_back(std::move(key), std::move(v));
}

void append_quoted(std::string& out, std::string_view s) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
}

namespace {
void dump_to(const Value& v, std::string& out) {
  switch (v.kind()) {
    case Value::Kind::Null: out += "null"; break;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; break;
    case Value::Kind::Int: out += std::to_string(v.as_int()); break;
    case Value::Kind::Double: {
      double d = v.as_double();
      if (!std::isfinite(d)) {
        out += "null";  // JSON has no inf/nan
        break;
      }
      char buf[32];
      auto r = std::to_chars(buf, buf + sizeof buf, d);
      out.append(buf, r.ptr);
      break;
    }
    case Value::Kind::Str: append_quoted(out, v.as_string()); break;
    case Value::Kind::Arr: {
      out.push_back('[');
      bool first = true;
      for (const auto& e : v.as_array()) {
        if (!first) out.push_back(',');
        first = false;
        dump_to(e, out);
      }
      out.push_back(']');
      break;
    }
    case Value::Kind::Obj: {
      out.push_back('{');
      bool first = true;
      for (const auto& [k, e] : v.as_object()) {
        if (!first) out.push_back(',');
        first = false;
        append_quoted(out, k);
        out.push_back(':');
        dump_to(e, out);
      }
      out.push_back('}');
      break;
    }
  }
}

class Parser {
 public:
  explicit Parser(std::string_view t, bool strict = false) : t_(t), strict_(strict) {}

  Value parse_document() {
    skip_ws();
    Value v = parse_value(0);
    skip_ws();
    if (i_ != t_.size()) fail("unexpected trailing characters");
    return v;
  }

  // One value at the very start (no whitespace before it); *end gets where it ends.
  Value parse_leading(size_t* end) {
    Value v = parse_value(0);
    *end = i_;
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < i_ && k < t_.size(); ++k) {
      if (t_[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    KVPR_THROW("invalid JSON: ", what, " at line ", line, " column ", col);
  }

  void skip_ws() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\r' || t_[i_] == '\t'))
      ++i_;
  }

  bool consume(std::string_view lit) {
    if (t_.substr(i_, lit.size()) == lit) {
      i_ += lit.size();
      return true;
    }
    return false;
  }

  Value parse_value(int depth) {
    if (depth > 256) fail("nesting too deep");
    if (i_ >= t_.size()) fail("unexpected end of input");
    char c = t_[i_];
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') return Value(parse_string());
    if (c == 't') {
      if (consume("true")) return Value(true);
      fail("invalid literal");
    }
    if (c == 'f') {
      if (consume("false")) return Value(false);
      fail("invalid literal");
    }
    if (c == 'n') {
      if (consume("null")) return Value();
      fail("invalid literal");
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    // Python's json writes these for non-finite floats; accept them on input.
    if (!strict_ && consume("NaN")) return Value(std::nan(""));
    if (!strict_ && consume("Infinity")) return Value(HUGE_VAL);
    fail(std::string("unexpected character '") + c + "'");
  }

  Value parse_number() {
    size_t start = i_;
    if (t_[i_] == '-') {
      ++i_;
      if (!strict_ && consume("Infinity")) return Value(-HUGE_VAL);
    }
    bool integral = true;
    auto digits = [&] {
      size_t s = i_;
      while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') ++i_;
      return i_ - s;
    };
    const size_t int_start = i_;
    if (digits() == 0) fail("invalid number");
    if (strict_ && i_ - int_start > 1 && t_[int_start] == '0') fail("invalid number (a leading zero)");
    if (i_ < t_.size() && t_[i_] == '.') {
      integral = false;
      ++i_;
      if (digits() == 0) fail("invalid number");
    }
    if (i_ < t_.size() && (t_[i_] == 'e' || t_[i_] == 'E')) {
      integral = false;
      ++i_;
      if (i_ < t_.size() && (t_[i_] == '+' || t_[i_] == '-')) ++i_;
      if (digits() == 0) fail("invalid number");
    }
    std::string_view s = t_.substr(start, i_ - start);
    if (integral) {
      int64_t v = 0;
      auto r = std::from_chars(s.data(), s.data() + s.size(), v);
      if (r.ec == std::errc()) return Value(v);
    }
    double d = 0;
    auto r = std::from_chars(s.data(), s.data() + s.size(), d);
    if (r.ec == std::errc::result_out_of_range)  // as strtod (and Python): +-inf past the range, 0 below it
      d = std::strtod(std::string(s).c_str(), nullptr);
    else if (r.ec != std::errc())
      fail("invalid number");
    return Value(d);
  }

  unsigned parse_hex4() {
    if (i_ + 4 > t_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = t_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
      else fail("invalid \\u escape");
    }
    return v;
  }

  std::string parse_string() {
    ++i_;  // opening quote
    std::string out;
    while (true) {
      if (i_ >= t_.size()) fail("unterminated string");
      char c = t_[i_++];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (strict_ && static_cast<unsigned char>(c) >= 0x80) {
        char32_t cp;
        const int n = utf8_next(t_, i_ - 1, &cp);
        if (n <= 0) fail("invalid UTF-8");
        out.append(t_.substr(i_ - 1, static_cast<size_t>(n)));
        i_ += static_cast<size_t>(n) - 1;
        continue;
      }
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (i_ >= t_.size()) fail("unterminated string");
      char e = t_[i_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          uint32_t cp = parse_hex4();
          if (strict_ && cp >= 0xd800 && cp < 0xe000) {  // a pair, or an error
            if (cp >= 0xdc00 || i_ + 6 > t_.size() || t_[i_] != '\\' || t_[i_ + 1] != 'u') fail("lone surrogate escape");
            i_ += 2;
            const uint32_t lo = parse_hex4();
            if (lo < 0xdc00 || lo >= 0xe000) fail("lone surrogate escape");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          } else if (cp >= 0xd800 && cp < 0xdc00) {  // surrogate pair
            if (i_ + 6 <= t_.size() && t_[i_] == '\\' && t_[i_ + 1] == 'u') {
              size_t save = i_;
              i_ += 2;
              uint32_t lo = parse_hex4();
              if (lo >= 0xdc00 && lo < 0xe000) {
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
              } else {
                i_ = save;
                cp = 0xfffd;
              }
            } else {
              cp = 0xfffd;
            }
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            cp = 0xfffd;  // lone low surrogate
          }
          append_utf8(out, cp);
          break;
        }
        default: fail("invalid escape");
      }
    }
    return out;
  }

  Value parse_array(int depth) {
    ++i_;
    Array a;
    skip_ws();
    if (i_ < t_.size() && t_[i_] == ']') {
      ++i_;
      return Value(std::move(a));
    }
    while (true) {
      skip_ws();
      a.push_back(parse_value(depth + 1));
      skip_ws();
      if (i_ >= t_.size()) fail("unterminated array");
      char c = t_[i_++];
      if (c == ']') break;
      if (c != ',') fail("expected ',' or ']' in array");
    }
    return Value(std::move(a));
  }

  Value parse_object(int depth) {
    ++i_;
    Object o;
    skip_ws();
    if (i_ < t_.size() && t_[i_] == '}') {
      ++i_;
      return Value(std::move(o));
    }
    while (true) {
      skip_ws();
      if (i_ >= t_.size() || t_[i_] != '"') fail("expected a string key");
      std::string key = parse_string();
      skip_ws();
      if (i_ >= t_.size() || t_[i_] != ':') fail("expected ':' after key");
      ++i_;
      skip_ws();
      o.emplace_back(std::move(key), parse_value(depth + 1));
      skip_ws();
      if (i_ >= t_.size()) fail("unterminated object");
      char c = t_[i_++];
      if (c == '}') break;
      if (c != ',') fail("expected ',' or '}' in object");
    }
    if (strict_ && o.size() > 1) keep_last_of_duplicates(o);
    return Value(std::move(o));
  }

  // A key given twice keeps its first place and its last value, as json.loads leaves a dict
  // (and lookups, which take the first, see what the sender meant last).
  static void keep_last_of_duplicates(Object& o) {
    constexpr size_t kRepeat = SIZE_MAX;
    std::unordered_map<std::string_view, size_t> first;
    std::vector<size_t> value_at(o.size());  // a first occurrence: where its last value is
    bool repeated = false;
    for (size_t k = 0; k < o.size(); ++k) {
      auto [it, fresh] = first.try_emplace(o[k].first, k);
      value_at[k] = fresh ? k : kRepeat;
      if (!fresh) value_at[it->second] = k, repeated = true;
    }
    if (!repeated) return;
    Object kept;
    for (size_t k = 0; k < o.size(); ++k)
      if (value_at[k] != kRepeat) kept.emplace_back(std::move(o[k].first), std::move(o[value_at[k]].second));
    o = std::move(kept);
  }

  std::string_view t_;
  bool strict_ = false;
  size_t i_ = 0;
};
}  // namespace

void append_python_float(std::string& out, double d) {
  if (std::isnan(d)) {
    out += "NaN";
    return;
  }
  if (std::isinf(d)) {
    out += d < 0 ? "-Infinity" : "Infinity";
    return;
  }
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  const std::string_view s(buf, static_cast<size_t>(r.ptr - buf));
  const size_t e = s.find('e');
  std::string digits;
  bool negative = false;
  for (char c : s.substr(0, e)) {
    if (c == '-') negative = true;
    else if (c != '.') digits.push_back(c);
  }
  int exp = 0;
  std::from_chars(s.data() + e + (s[e + 1] == '+' ? 2 : 1), s.data() + s.size(), exp);
  if (negative) out.push_back('-');
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else {
      if (digits.size() < static_cast<size_t>(exp) + 1) digits.append(static_cast<size_t>(exp) + 1 - digits.size(), '0');
      const std::string frac = digits.substr(static_cast<size_t>(exp) + 1);
      out += digits.substr(0, static_cast<size_t>(exp) + 1) + "." + (frac.empty() ? "0" : frac);
    }
    return;
  }
  out.push_back(digits[0]);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char eb[16];
  std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  out += eb;
}

namespace {

// indent < 0: one line with ", " and ": "; else json.dumps(indent=N): "," at line ends, each
// level N spaces deeper, empty containers as [] and {}.
void dump_python_to(const Value& v, std::string& out, int indent, int level) {
  auto newline = [&](int at) {
    if (indent < 0) return;
    out.push_back('\n');
    out.append(static_cast<size_t>(indent * at), ' ');
  };
  const char* sep = indent < 0 ? ", " : ",";
  switch (v.kind()) {
    case Value::Kind::Double: append_python_float(out, v.as_double()); break;
    case Value::Kind::Arr: {
      out.push_back('[');
      bool first = true;
      for (const auto& e : v.as_array()) {
        if (!first) out += sep;
        first = false;
        newline(level + 1);
        dump_python_to(e, out, indent, level + 1);
      }
      if (!first) newline(level);
      out.push_back(']');
      break;
    }
    case Value::Kind::Obj: {
      const Object& o = v.as_object();
      std::unordered_map<std::string_view, size_t> last;
      for (size_t i = 0; i < o.size(); ++i) last[o[i].first] = i;
      std::unordered_set<std::string_view> written;
      out.push_back('{');
      for (const auto& [k, e] : o) {
        if (!written.insert(k).second) continue;
        if (written.size() > 1) out += sep;
        newline(level + 1);
        append_quoted(out, k);
        out += ": ";
        dump_python_to(o[last[k]].second, out, indent, level + 1);
      }
      if (!written.empty()) newline(level);
      out.push_back('}');
      break;
    }
    default: dump_to(v, out);
  }
}
}  // namespace

std::string Value::dump() const {
  std::string out;
  dump_to(*this, out);
  return out;
}

std::string Value::dump_python(int indent) const {
  std::string out;
  dump_python_to(*this, out, indent, 0);
  return out;
}

Value parse_leading(std::string_view text, size_t* end) { return Parser(text).parse_leading(end); }

Value parse_strict(std::string_view text) { return Parser(text, true).parse_document(); }

Value parse(std::string_view text) { return Parser(text).parse_document(); }

Value parse_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVPR_CHECK(f, path, ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return parse(ss.str());
  } catch (const Error& e) {
    KVPR_THROW(path, ": ", e.what());
  }
}

}  // namespace kvpr::json
