#include "jinja/text.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "engine/base/error.h"
#include "engine/base/utf8.h"
#include "engine/text/unicode.h"

namespace kvpr::jinja {

namespace {

// Case by code point with Unicode's simple mappings (Python's str methods also apply
// SpecialCasing: "ß".upper() is "SS" there, "ß" here); bytes that are not UTF-8 stay as they are.
enum class Case { Lower, Upper, Keep };
template <typename CaseOf>
std::string map_case(std::string_view s, CaseOf&& case_of) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    const int n = utf8_next(s, i, &c);
    if (n <= 0) {
      out.push_back(s[i++]);
      continue;
    }
    const Case k = case_of(c);
    append_utf8(out, k == Case::Lower ? unicode::to_lower(c) : k == Case::Upper ? unicode::to_upper(c) : c);
    i += static_cast<size_t>(n);
  }
  return out;
}

}  // namespace

// Python's floor division and modulo on integers (b != 0; INT64_MIN // -1 is refused by the caller).
int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t floor_mod(int64_t a, int64_t b) {
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

// str.lower(), and what sort and dictsort compare by: also Python's İ -> i + U+0307 and a Σ that
// ends a word -> ς (a cased letter before it, none after).
std::string to_lower(const std::string& s) {
  auto cased = [](char32_t c) { return unicode::to_lower(c) != c || unicode::to_upper(c) != c; };
  std::string out = map_case(s, [](char32_t) { return Case::Lower; });
  if (s.find("\xc4\xb0") == std::string::npos && s.find("\xce\xa3") == std::string::npos) return out;
  std::vector<char32_t> cps;
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    const int n = utf8_next(s, i, &c);
    if (n <= 0) return out;  // not UTF-8: the simple mapping stands
    cps.push_back(c);
    i += static_cast<size_t>(n);
  }
  out.clear();
  for (size_t i = 0; i < cps.size(); ++i) {
    if (cps[i] == 0x130) {
      append_utf8(out, 'i');
      append_utf8(out, 0x307);
    } else if (cps[i] == 0x3a3) {
      const bool final = i > 0 && cased(cps[i - 1]) && !(i + 1 < cps.size() && cased(cps[i + 1]));
      append_utf8(out, final ? 0x3c2 : 0x3c3);
    } else {
      append_utf8(out, unicode::to_lower(cps[i]));
    }
  }
  return out;
}
std::string to_upper(const std::string& s) {
  return map_case(s, [](char32_t) { return Case::Upper; });
}
std::string capitalize(const std::string& s) {
  bool first = true;
  return map_case(s, [&](char32_t) { return std::exchange(first, false) ? Case::Upper : Case::Lower; });
}

// jinja2's title: each part after a run of "-", whitespace, "(", "{", "[" or "<" capitalised.
std::string title(const std::string& s) {
  bool at_start = true;
  return map_case(s, [&](char32_t c) {
    const bool is_sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || unicode::is_whitespace(c);
    if (is_sep) {
      at_start = true;
      return Case::Keep;
    }
    return std::exchange(at_start, false) ? Case::Upper : Case::Lower;
  });
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

// Non-ASCII as \uXXXX (surrogate pairs past the BMP): json.dumps with ensure_ascii.
std::string ensure_ascii(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    int n = utf8_next(s, i, &c);
    if (n <= 0) n = 1;
    if (c < 0x80) {
      out.push_back(s[i]);
    } else {
      char buf[16];
      if (c >= 0x10000) {
        const uint32_t v = static_cast<uint32_t>(c) - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      }
      out += buf;
    }
    i += static_cast<size_t>(n);
  }
  return out;
}

// Python's split(sep, maxsplit) (sep null: runs of whitespace).
List split(const std::string& s, const std::string* sep, int64_t maxsplit) {
  List out;
  if (sep) {
    KVPR_CHECK(!sep->empty(), "empty separator");
    size_t at = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t f = s.find(*sep, at);
      if (f == std::string::npos) break;
      out.emplace_back(s.substr(at, f - at));
      at = f + sep->size();
    }
    out.emplace_back(s.substr(at));
    return out;
  }
  const std::vector<std::string> cps = code_points(s);
  auto space = [&](size_t i) {
    char32_t c;
    return utf8_next(cps[i], 0, &c) > 0 && python_space(c);
  };
  size_t i = 0;
  while (i < cps.size()) {
    while (i < cps.size() && space(i)) ++i;
    if (i == cps.size()) break;
    std::string word;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      for (; i < cps.size(); ++i) word += cps[i];
      out.emplace_back(strip(word, false, true));
      break;
    }
    for (; i < cps.size() && !space(i); ++i) word += cps[i];
    out.emplace_back(std::move(word));
  }
  return out;
}

List splitlines(const std::string& s, bool keepends) {
  List out;
  std::string line;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == '\x1c' || c == '\x1d' || c == '\x1e') {
      std::string end(1, c);
      if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') end += s[++i];
      out.emplace_back(keepends ? line + end : line);
      line.clear();
    } else {
      line.push_back(c);
    }
  }
  if (!line.empty()) out.emplace_back(line);
  return out;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"  // the formats are built from the template's own
// Python's "fmt % args" for %s %r %d %i %f %x %%, with optional width, zero pad and precision.
std::string percent_format(const std::string& fmt, const Value& args) {
  // A tuple gives the arguments; any other value (a list too) is the one argument.
  List items = args.is_tuple() ? args.as_list() : List{args};
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    size_t j = i + 1;
    std::string spec = "%";
    while (j < fmt.size() && std::strchr("-+ 0#", fmt[j])) spec.push_back(fmt[j++]);
    while (j < fmt.size() && (std::isdigit(static_cast<unsigned char>(fmt[j])) || fmt[j] == '.')) spec.push_back(fmt[j++]);
    KVPR_CHECK(j < fmt.size(), "incomplete format");
    KVPR_CHECK(spec.size() < 8, "a format's width or precision past 5 digits");
    const char conv = fmt[j];
    i = j;
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    KVPR_CHECK(next < items.size(), "not enough arguments for format string");
    const Value& v = items[next++];
    char buf[512];
    if (conv == 's' || conv == 'r') {  // padded by hand: the text may be longer than any buffer
      std::string t = conv == 's' ? v.str() : v.repr();
      size_t width = 0, precision = std::string::npos;
      const bool left = spec.find('-') != std::string::npos;
      const size_t dot = spec.find('.');
      for (size_t k = 1; k < (dot == std::string::npos ? spec.size() : dot); ++k)
        if (std::isdigit(static_cast<unsigned char>(spec[k]))) width = width * 10 + static_cast<size_t>(spec[k] - '0');
      if (dot != std::string::npos) {
        precision = 0;
        for (size_t k = dot + 1; k < spec.size(); ++k) precision = precision * 10 + static_cast<size_t>(spec[k] - '0');
      }
      if (precision != std::string::npos) {
        std::string cut;
        const std::vector<std::string> cps = code_points(t);
        for (size_t k = 0; k < cps.size() && k < precision; ++k) cut += cps[k];
        t = cut;
      }
      const size_t n = code_points(t).size();
      const std::string pad = n < width ? std::string(width - n, ' ') : "";
      out += left ? t + pad : pad + t;
      continue;
    } else if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o') {
      KVPR_CHECK(v.is_number(), "%", conv, " format: a number is required, not ", v.type_name());
      std::snprintf(buf, sizeof buf, (spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(),
                    static_cast<long long>(v.kind() == Value::Kind::Float ? std::trunc(v.as_double()) : v.as_int()));
    } else if (conv == 'f' || conv == 'F' || conv == 'e' || conv == 'E' || conv == 'g' || conv == 'G') {
      KVPR_CHECK(v.is_number(), "%", conv, " format: a number is required, not ", v.type_name());
      std::snprintf(buf, sizeof buf, (spec + conv).c_str(), v.as_double());
    } else {
      KVPR_THROW("unsupported format character '", std::string(1, conv), "'");
    }
    out += buf;
  }
  KVPR_CHECK(next == items.size() || !args.is_list(), "not all arguments converted during string formatting");
  return out;
}

#pragma GCC diagnostic pop

// The code point index of byte offset `at` in s.
int64_t cp_index(const std::string& s, size_t at) {
  int64_t n = 0;
  for (size_t i = 0; i < at && i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xc0) != 0x80) ++n;
  return n;
}

bool starts_or_ends(const std::string& s, const Value& what, bool start) {
  auto one = [&](const std::string& p) {
    if (p.size() > s.size()) return false;
    return start ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0;
  };
  if (what.is_list()) {
    for (const auto& p : what.as_list())
      if (p.is_string() && one(p.as_string())) return true;
    return false;
  }
  KVPR_CHECK(what.is_string(), (start ? "startswith" : "endswith"), " takes a string or a tuple of strings");
  return one(what.as_string());
}

// Python's slice of n items: the indices it selects.
std::vector<int64_t> slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step_v) {
  const int64_t step = step_v.is_undefined() || step_v.is_none() ? 1 : step_v.as_int();
  KVPR_CHECK(step != 0, "slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t def) {
    if (v.is_undefined() || v.is_none()) return def;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = clamp(start, step > 0 ? 0 : n - 1), e = clamp(stop, step > 0 ? n : -1);
  // Counted, not stepped past the end: a huge step must not wrap.
  std::vector<int64_t> out;
  const uint64_t span = step > 0 ? (e > b ? static_cast<uint64_t>(e - b) : 0) : (b > e ? static_cast<uint64_t>(b - e) : 0);
  const uint64_t stride = step > 0 ? static_cast<uint64_t>(step) : static_cast<uint64_t>(-(step + 1)) + 1;
  const uint64_t count = span == 0 ? 0 : (span - 1) / stride + 1;
  for (uint64_t k = 0; k < count; ++k)
    out.push_back(step > 0 ? b + static_cast<int64_t>(k * stride) : b - static_cast<int64_t>(k * stride));
  return out;
}

}  // namespace kvpr::jinja
