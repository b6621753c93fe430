// The interpreter of openai/jinja.h: runs what jinja.cc parsed, with jinja2's scoping (a for
// loop's iterations and a macro's body each have their own variables; a macro sees the
// template's top-level ones, not its caller's), Python's operators, and the filters, tests,
// methods and globals chat templates call.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include "engine/base/error.h"
#include "engine/base/utf8.h"
#include "engine/text/unicode.h"
#include "openai/jinja.h"
#include "openai/jinja_ast.h"

namespace kvpr::jinja {

namespace {

const std::set<std::string>& filter_names() {
  static const std::set<std::string> names = {
      "abs",   "attr",  "capitalize", "count",    "d",          "default", "dictsort", "e",      "escape",
      "first", "float", "format",     "indent",   "int",        "items",   "join",     "last",   "length",
      "list",  "lower", "map",        "max",      "min",        "reject",  "rejectattr", "replace", "reverse",
      "round", "safe",  "select",     "selectattr", "sort",     "string",  "sum",      "title",  "tojson",
      "trim",  "unique", "upper",     "wordcount"};
  return names;
}

const std::set<std::string>& test_names() {
  static const std::set<std::string> names = {
      "defined", "undefined", "none",     "boolean", "true", "false", "integer", "float", "number", "string",
      "mapping", "iterable",  "sequence", "callable", "sameas", "eq", "equalto", "==",    "ne",     "!=",
      "lt",      "lessthan",  "<",        "le",      "<=",   "gt",    "greaterthan", ">", "ge",     ">=",
      "in",      "odd",       "even",     "divisibleby", "lower", "upper", "escaped", "filter", "test"};
  return names;
}

enum class Flow { Normal, Break, Continue };

// Items one list may hold, and how deeply lists and dicts may nest (what the printers and
// comparisons recurse over).
constexpr size_t kMaxItems = 1u << 20;
constexpr int kMaxNesting = 256;
constexpr size_t kMaxText = 64u << 20;  // bytes of one string a method makes

using Scope = std::unordered_map<std::string, Value>;

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

class Renderer {
 public:
  Renderer(const Limits& limits, const Value& context) : limits_(limits) {
    globals_ = builtins();
    if (context.is_dict())
      for (const auto& [k, v] : context.as_dict()) globals_[k] = v;
    scopes_ = {&globals_, &top_};
  }
  // A namespace may hold itself (ns.s = ns) or a caller: emptied here, so no cycle outlives the render.
  ~Renderer() {
    for (auto& ns : namespaces_) ns.namespace_dict().clear();
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  std::string run(const Node& root) {
    std::string out;
    exec_body(root.body, out);
    return out;
  }

 private:
  [[noreturn]] static void fail(int line, const std::string& what) { KVPR_THROW("line ", line, ": ", what); }

  void step(int line) {
    if (++steps_ > limits_.max_steps)
      fail(line, "the template ran past its budget of " + std::to_string(limits_.max_steps) + " steps");
  }
  void emit(std::string& out, const std::string& s, int line) {
    out += s;
    if (out.size() > limits_.max_output)
      fail(line, "the template wrote more than " + std::to_string(limits_.max_output) + " bytes");
  }

  // ------------------------------------------------------------------ variables

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = (*it)->find(name);
      if (f != (*it)->end()) return f->second;
    }
    return Value::undefined("'" + name + "' is undefined");
  }
  void assign(const std::string& name, Value v) { (*scopes_.back())[name] = std::move(v); }

  // ------------------------------------------------------------------ statements

  Flow exec_body(const Body& body, std::string& out) {
    for (const auto& n : body) {
      const Flow f = exec(*n, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec(const Node& n, std::string& out) {
    step(n.line);
    switch (n.kind) {
      case Node::Kind::Root: return exec_body(n.body, out);
      case Node::Kind::Text: emit(out, n.text, n.line); return Flow::Normal;
      case Node::Kind::Output: emit(out, eval(*n.expr).str(), n.line); return Flow::Normal;
      case Node::Kind::If:
        for (const auto& [cond, body] : n.branches)
          if (!cond || eval(*cond).truthy()) return exec_body(body, out);
        return Flow::Normal;
      case Node::Kind::For: exec_for(n, out); return Flow::Normal;
      case Node::Kind::Set: exec_set(n); return Flow::Normal;
      case Node::Kind::SetBlock: {  // the body renders in a scope of its own, as jinja2's inner frame
        std::string captured;
        exec_inner(n.body, captured);
        assign(n.text, apply_filters(n.filters, Value(std::move(captured))));
        return Flow::Normal;
      }
      case Node::Kind::FilterBlock: {
        std::string captured;
        const Flow f = exec_inner(n.body, captured);
        emit(out, apply_filters(n.filters, Value(std::move(captured))).str(), n.line);
        return f;
      }
      case Node::Kind::Macro: assign(n.text, make_macro(n)); return Flow::Normal;
      case Node::Kind::CallBlock: {
        // caller() renders the body where the call block is.
        const std::vector<Scope*> here = scopes_;
        const Node* node = &n;
        // The scopes it renders in live as long as this block runs: a caller kept past it fails.
        auto alive = std::make_shared<bool>(true);
        struct Expire {
          std::shared_ptr<bool> a;
          ~Expire() { *a = false; }
        } expire{alive};
        Value caller = Value::callable(
            [this, here, node, alive](const Args& args) {
              if (!*alive) fail(node->line, "caller() called after its call block ended");
              return invoke(*node, args, here);
            },
            "caller");
        const Expr& call = *n.expr;
        Value callee = eval(*call.a);
        Args args = eval_args(call);
        args.keyword.emplace_back("caller", std::move(caller));
        emit(out, call_value(callee, args, call.line).str(), n.line);
        return Flow::Normal;
      }
      case Node::Kind::Break: return Flow::Break;
      case Node::Kind::Continue: return Flow::Continue;
    }
    return Flow::Normal;
  }

  List iterate(const Value& v, int line) const {
    switch (v.kind()) {
      case Value::Kind::Undefined: return {};
      case Value::Kind::Array: return v.as_list();
      case Value::Kind::Map: {
        List keys;
        for (size_t i = 0; i < v.as_dict().size(); ++i) keys.push_back(v.key_at(i));
        return keys;
      }
      case Value::Kind::String: {
        List out;
        for (auto& c : code_points(v.as_string())) out.emplace_back(c);
        return out;
      }
      default: fail(line, std::string("'") + v.type_name() + "' object is not iterable");
    }
  }

  void bind_targets(Scope& scope, const std::vector<std::string>& targets, const Value& item, int line) {
    if (targets.size() == 1) {
      scope[targets[0]] = item;
      return;
    }
    const List parts = iterate(item, line);
    if (parts.size() != targets.size())
      fail(line, "cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(targets.size()));
    for (size_t i = 0; i < targets.size(); ++i) scope[targets[i]] = parts[i];
  }

  void exec_for(const Node& n, std::string& out) {
    const List all = iterate(eval(*n.expr), n.line);
    List items;
    if (n.cond) {
      for (const auto& it : all) {
        Scope probe;
        bind_targets(probe, n.targets, it, n.line);
        scopes_.push_back(&probe);
        const bool keep = eval(*n.cond).truthy();
        scopes_.pop_back();
        if (keep) items.push_back(it);
      }
    } else {
      items = all;
    }
    if (items.empty()) {
      Scope s;
      scopes_.push_back(&s);
      exec_body(n.else_body, out);
      scopes_.pop_back();
      return;
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      Scope s;
      bind_targets(s, n.targets, items[static_cast<size_t>(i)], n.line);
      Dict loop = {{"index", Value(i + 1)},
                   {"index0", Value(i)},
                   {"revindex", Value(len - i)},
                   {"revindex0", Value(len - i - 1)},
                   {"first", Value(i == 0)},
                   {"last", Value(i == len - 1)},
                   {"length", Value(len)},
                   {"depth", Value(int64_t{1})},
                   {"depth0", Value(int64_t{0})},
                   {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item")},
                   {"nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item")},
                   {"cycle", Value::callable(
                                 [i](const Args& a) {
                                   KVPR_CHECK(!a.positional.empty(), "no items for cycling given");
                                   return a.positional[static_cast<size_t>(i) % a.positional.size()];
                                 },
                                 "cycle")}};
      s["loop"] = Value(std::move(loop));
      scopes_.push_back(&s);
      Flow f;
      try {
        f = exec_body(n.body, out);
      } catch (...) {
        scopes_.pop_back();
        throw;
      }
      scopes_.pop_back();
      if (f == Flow::Break) break;
    }
  }

  void exec_set(const Node& n) {
    Value v = eval(*n.expr);
    if (!n.attr.empty()) {
      Value ns = lookup(n.text);
      if (ns.kind() != Value::Kind::Namespace) fail(n.line, "cannot assign attribute on non-namespace object");
      Dict& d = ns.namespace_dict();
      for (auto& [k, e] : d)
        if (k == n.attr) {
          e = std::move(v);
          return;
        }
      d.emplace_back(n.attr, std::move(v));
      return;
    }
    if (n.targets.size() == 1) {
      assign(n.targets[0], std::move(v));
      return;
    }
    Scope tmp;
    bind_targets(tmp, n.targets, v, n.line);
    for (auto& [k, e] : tmp) assign(k, std::move(e));
  }

  Value make_macro(const Node& n) {
    const Node* node = &n;
    return Value::callable([this, node](const Args& args) { return invoke(*node, args, {&globals_, &top_}); }, n.text);
  }

  // Renders `body` in a scope of its own: what it sets stays there.
  Flow exec_inner(const std::vector<NodePtr>& body, std::string& out) {
    Scope inner;
    scopes_.push_back(&inner);
    struct Pop {
      std::vector<Scope*>& scopes;
      ~Pop() { scopes.pop_back(); }
    } pop{scopes_};
    return exec_body(body, out);
  }

  // Renders a macro's or a call block's body as a call: one call deeper, in `frame` (a macro: the
  // template's globals and top level; caller(): where its call block is) and a frame of its own
  // with the parameters bound from `args` (defaults evaluated there) and a given caller.
  Value invoke(const Node& node, const Args& args, std::vector<Scope*> frame) {
    if (call_depth_ + 1 > limits_.max_call_depth)
      fail(node.line, "macros nested deeper than " + std::to_string(limits_.max_call_depth));
    if (args.positional.size() > node.params.size())
      fail(node.line, "'" + node.text + "' takes not more than " + std::to_string(node.params.size()) + " argument(s)");
    struct Restore {
      Renderer& r;
      std::vector<Scope*> saved;
      ~Restore() {
        r.scopes_ = std::move(saved);
        --r.call_depth_;
      }
    } restore{*this, scopes_};
    ++call_depth_;
    Scope local;
    frame.push_back(&local);
    scopes_ = std::move(frame);
    for (size_t i = 0; i < node.params.size(); ++i) {
      const auto& [name, def] = node.params[i];
      const Value* a = args.get(i, name);
      local[name] = a ? *a : def ? eval(*def) : Value::undefined("'" + name + "' is undefined");
    }
    for (const auto& [k, v] : args.keyword)
      if (k == "caller") local["caller"] = v;
    std::string text;
    exec_body(node.body, text);
    return Value(std::move(text));
  }

  // ------------------------------------------------------------------ expressions

  Args eval_args(const Expr& e) {
    Args a;
    for (const auto& x : e.items) a.positional.push_back(eval(*x));
    for (const auto& [k, x] : e.kwargs) a.keyword.emplace_back(k, eval(*x));
    return a;
  }

  Value call_value(const Value& callee, const Args& args, int line) {
    if (callee.is_undefined()) fail(line, callee.hint().empty() ? "calling an undefined value" : callee.hint());
    if (!callee.is_callable()) fail(line, std::string("'") + callee.type_name() + "' object is not callable");
    try {
      return callee.call(args);
    } catch (const Error& e) {
      const std::string m = e.what();
      if (m.rfind("line ", 0) == 0 || callee.callable_name() == "raise_exception") throw;
      fail(line, m);
    }
  }

  Value eval(const Expr& e) {
    step(e.line);
    switch (e.kind) {
      case Expr::Kind::Literal: return e.value;
      case Expr::Kind::Name: return lookup(e.name);
      case Expr::Kind::ListLiteral: {
        List l;
        for (const auto& x : e.items) l.push_back(eval(*x));
        return nested(e.negated ? Value::tuple(std::move(l)) : Value(std::move(l)), e.line);
      }
      case Expr::Kind::DictLiteral: {
        Dict d;
        List keys;
        bool plain = true;
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          Value k = eval(*e.items[i]);
          Value v = eval(*e.items[i + 1]);
          const std::string key = Value::key_text(k);
          plain = plain && k.is_string();
          auto it = std::find_if(d.begin(), d.end(), [&](const auto& p) { return p.first == key; });
          if (it != d.end()) {
            it->second = std::move(v);
          } else {
            d.emplace_back(key, std::move(v));
            keys.push_back(std::move(k));
          }
        }
        return nested(plain ? Value(std::move(d)) : Value::dict_with_keys(std::move(d), std::move(keys)), e.line);
      }
      case Expr::Kind::Attr: return get_attr(eval(*e.a), e.name, e.line);
      case Expr::Kind::Item: return get_item(eval(*e.a), eval(*e.b), e.line);
      case Expr::Kind::Slice: {
        const Value v = eval(*e.a);
        Value parts[3];
        for (size_t i = 0; i < e.items.size() && i < 3; ++i)
          if (e.items[i]) parts[i] = eval(*e.items[i]);
        return slice(v, parts[0], parts[1], parts[2], e.line);
      }
      case Expr::Kind::Call: {
        const Value callee = eval(*e.a);
        return call_value(callee, eval_args(e), e.line);
      }
      case Expr::Kind::Filter: return apply_filter(e, eval(*e.a));
      case Expr::Kind::Test: {
        const bool r = apply_test(e.name, eval(*e.a), eval_args(e), e.line);
        return Value(e.negated ? !r : r);
      }
      case Expr::Kind::Not: return Value(!eval(*e.a).truthy());
      case Expr::Kind::Neg:
      case Expr::Kind::Pos: {
        const Value v = eval(*e.a);
        if (!v.is_number()) fail(e.line, std::string("bad operand type for unary -: '") + v.type_name() + "'");
        if (e.kind == Expr::Kind::Pos) return v;
        if (v.kind() == Value::Kind::Float) return Value(-v.as_double());
        int64_t r = 0;
        if (__builtin_sub_overflow(int64_t{0}, v.as_int(), &r)) fail(e.line, "integer overflow in unary -");
        return Value(r);
      }
      case Expr::Kind::And: {
        Value a = eval(*e.a);
        return a.truthy() ? eval(*e.b) : a;
      }
      case Expr::Kind::Or: {
        Value a = eval(*e.a);
        return a.truthy() ? a : eval(*e.b);
      }
      case Expr::Kind::Binary: return binary(e.name, eval(*e.a), eval(*e.b), e.line);
      case Expr::Kind::Compare: {
        Value left = eval(*e.a);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.items[i]);
          if (!compare(e.ops[i], left, right, e.line)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::Cond:
        if (eval(*e.b).truthy()) return eval(*e.a);
        return e.c ? eval(*e.c) : Value::undefined("the conditional expression's false branch");
    }
    return Value();
  }

  // A list or dict nested past kMaxNesting is refused where it is made (printing, comparing and
  // JSON recurse over it).
  static Value nested(Value v, int line) {
    if (v.nesting() > kMaxNesting) fail(line, "lists and dicts nested deeper than " + std::to_string(kMaxNesting));
    return v;
  }

  static bool contains(const Value& container, const Value& item, int line) {
    switch (container.kind()) {
      case Value::Kind::String:
        if (!item.is_string()) fail(line, std::string("'in <string>' requires string as left operand, not ") + item.type_name());
        return container.as_string().find(item.as_string()) != std::string::npos;
      case Value::Kind::Array:
        for (const auto& x : container.as_list())
          if (x == item) return true;
        return false;
      case Value::Kind::Map:
      case Value::Kind::Namespace: return container.find(Value::key_text(item)) != nullptr;
      case Value::Kind::Undefined: return false;
      default: fail(line, std::string("argument of type '") + container.type_name() + "' is not iterable");
    }
  }

  bool compare(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "==") return a == b;
    if (op == "!=") return !(a == b);
    if (op == "in") return contains(b, a, line);
    if (op == "notin") return !contains(b, a, line);
    try {
      if (op == "<") return less_than(a, b);
      if (op == ">") return less_than(b, a);
      if (op == "<=") return !less_than(b, a);
      if (op == ">=") return !less_than(a, b);
    } catch (const Error& err) {
      fail(line, err.what());
    }
    fail(line, "unknown comparison " + op);
  }

  Value binary(const std::string& op, const Value& a, const Value& b, int line) {
    auto sized = [&](std::string s) {
      if (s.size() > limits_.max_output) fail(line, "a string past the output budget of " + std::to_string(limits_.max_output) + " bytes");
      return Value(std::move(s));
    };
    if (op == "~") return sized(a.str() + b.str());
    auto type_error = [&]() -> Value {
      if (a.is_undefined()) fail(line, a.hint());
      if (b.is_undefined()) fail(line, b.hint());
      fail(line, "unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
    };
    const bool nums = a.is_number() && b.is_number();
    const bool floats = nums && (a.kind() == Value::Kind::Float || b.kind() == Value::Kind::Float);
    // Integers past 64 bits (Python's would grow): an error, not a wrapped value.
    int64_t r = 0;
    auto checked = [&](bool overflow) {  // after the builtin has written r
      if (overflow) fail(line, "integer overflow in " + op);
      return Value(r);
    };
    if (op == "+") {
      if (nums) return floats ? Value(a.as_double() + b.as_double()) : checked(__builtin_add_overflow(a.as_int(), b.as_int(), &r));
      if (a.is_string() && b.is_string()) return sized(a.as_string() + b.as_string());
      if (a.is_list() && b.is_list()) {  // list + list, tuple + tuple (Python has no list + tuple)
        if (a.is_tuple() != b.is_tuple())
          fail(line, std::string("can only concatenate ") + (a.is_tuple() ? "tuple" : "list") + " (not \"" +
                         (b.is_tuple() ? "tuple" : "list") + "\") to " + (a.is_tuple() ? "tuple" : "list"));
        if (a.as_list().size() + b.as_list().size() > kMaxItems) fail(line, "a list past " + std::to_string(kMaxItems) + " items");
        List l = a.as_list();
        l.insert(l.end(), b.as_list().begin(), b.as_list().end());
        return nested(a.is_tuple() ? Value::tuple(std::move(l)) : Value(std::move(l)), line);
      }
      return type_error();
    }
    if (op == "-") {
      if (nums) return floats ? Value(a.as_double() - b.as_double()) : checked(__builtin_sub_overflow(a.as_int(), b.as_int(), &r));
      return type_error();
    }
    if (op == "*") {
      if (nums) return floats ? Value(a.as_double() * b.as_double()) : checked(__builtin_mul_overflow(a.as_int(), b.as_int(), &r));
      const Value* seq = a.is_string() || a.is_list() ? &a : b.is_string() || b.is_list() ? &b : nullptr;
      const Value* times = seq == &a ? &b : &a;
      if (!seq || !times->is_number() || times->kind() == Value::Kind::Float) return type_error();
      const int64_t n = std::max<int64_t>(0, times->as_int());
      const size_t unit = seq->is_string() ? seq->as_string().size() : seq->as_list().size();
      const size_t cap = seq->is_string() ? limits_.max_output : kMaxItems;
      if (unit > 0 && static_cast<uint64_t>(n) > cap / unit) fail(line, "a repetition past the output budget");
      if (seq->is_string()) {
        std::string s;
        for (int64_t i = 0; i < n; ++i) s += seq->as_string();
        return Value(std::move(s));
      }
      List l;
      for (int64_t i = 0; i < n; ++i) l.insert(l.end(), seq->as_list().begin(), seq->as_list().end());
      return Value(std::move(l));
    }
    if (op == "%" && a.is_string()) {
      try {
        return Value(percent_format(a.as_string(), b));
      } catch (const Error& err) {
        fail(line, err.what());
      }
    }
    if (!nums) return type_error();
    if (op == "/") {
      if (b.as_double() == 0) fail(line, "division by zero");
      return Value(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
      if (b.as_double() == 0) fail(line, op == "%" ? "modulo by zero" : "integer division or modulo by zero");
      if (floats) {
        const double q = std::floor(a.as_double() / b.as_double());
        return op == "//" ? Value(q) : Value(a.as_double() - q * b.as_double());
      }
      if (b.as_int() == -1) return op == "//" ? checked(__builtin_sub_overflow(int64_t{0}, a.as_int(), &r)) : Value(int64_t{0});
      return op == "//" ? Value(floor_div(a.as_int(), b.as_int())) : Value(floor_mod(a.as_int(), b.as_int()));
    }
    if (op == "**") {
      if (!floats && b.as_int() >= 0) {
        int64_t p = 1;
        const int64_t base = a.as_int();
        for (int64_t i = 0; i < b.as_int(); ++i) {
          if (__builtin_mul_overflow(p, base, &p)) fail(line, "integer overflow in **");
          if (p == 0 || p == 1) break;  // 0 and 1 stay; -1 alternates below
          if (p == -1) return Value((b.as_int() - i - 1) % 2 == 0 ? int64_t{-1} : int64_t{1});
        }
        return Value(p);
      }
      return Value(std::pow(a.as_double(), b.as_double()));
    }
    fail(line, "unknown operator " + op);
  }

  Value slice(const Value& v, const Value& start, const Value& stop, const Value& step_v, int line) {
    if (v.is_list()) {
      List out;
      for (int64_t i : slice_indices(static_cast<int64_t>(v.as_list().size()), start, stop, step_v))
        out.push_back(v.as_list()[static_cast<size_t>(i)]);
      return v.is_tuple() ? Value::tuple(std::move(out)) : Value(std::move(out));
    }
    if (v.is_string()) {
      const std::vector<std::string> cps = code_points(v.as_string());
      std::string out;
      for (int64_t i : slice_indices(static_cast<int64_t>(cps.size()), start, stop, step_v)) out += cps[static_cast<size_t>(i)];
      return Value(std::move(out));
    }
    if (v.is_undefined()) fail(line, v.hint());
    fail(line, std::string("'") + v.type_name() + "' object is not subscriptable");
  }

  Value get_item(const Value& v, const Value& key, int line) {
    switch (v.kind()) {
      case Value::Kind::Undefined: fail(line, v.hint());
      case Value::Kind::Map:
      case Value::Kind::Namespace: {
        if (const Value* f = v.find(Value::key_text(key))) return *f;
        if (key.is_string()) return get_attr(v, key.as_string(), line);
        return Value::undefined("'dict object' has no attribute " + key.repr());
      }
      case Value::Kind::Array:
      case Value::Kind::String: {
        if (!key.is_number() || key.kind() == Value::Kind::Float) {
          if (key.is_string()) return get_attr(v, key.as_string(), line);
          fail(line, std::string(v.type_name()) + " indices must be integers, not " + key.type_name());
        }
        int64_t i = key.as_int();
        if (v.is_list()) {
          const int64_t n = static_cast<int64_t>(v.as_list().size());
          if (i < 0) i += n;
          if (i < 0 || i >= n) return Value::undefined(std::string(v.type_name()) + " object has no element " + key.str());
          return v.as_list()[static_cast<size_t>(i)];
        }
        const std::vector<std::string> cps = code_points(v.as_string());
        const int64_t n = static_cast<int64_t>(cps.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined("str object has no element " + key.str());
        return Value(cps[static_cast<size_t>(i)]);
      }
      default: return Value::undefined(std::string("'") + v.type_name() + "' object has no element " + key.repr());
    }
  }

  Value get_attr(const Value& v, const std::string& name, int line) {
    switch (v.kind()) {
      case Value::Kind::Undefined: fail(line, v.hint());
      case Value::Kind::Namespace:
        if (const Value* f = v.find(name)) return *f;
        return Value::undefined("'Namespace' object has no attribute '" + name + "'");
      case Value::Kind::Map: {
        if (Value m = dict_method(v, name); m.is_callable()) return m;
        if (const Value* f = v.find(name)) return *f;
        return Value::undefined("'dict object' has no attribute '" + name + "'");
      }
      case Value::Kind::String: {
        if (Value m = string_method(v.as_string(), name); m.is_callable()) return m;
        return Value::undefined("'str object' has no attribute '" + name + "'");
      }
      case Value::Kind::Array: {
        if (name == "index" || name == "count") {
          const List l = v.as_list();
          const bool index = name == "index";
          return Value::callable(
              [l, index](const Args& a) {
                KVPR_CHECK(!a.positional.empty(), "list.", index ? "index" : "count", " takes an argument");
                int64_t n = 0;
                for (size_t i = 0; i < l.size(); ++i)
                  if (l[i] == a.positional[0]) {
                    if (index) return Value(static_cast<int64_t>(i));
                    ++n;
                  }
                KVPR_CHECK(!index, a.positional[0].repr(), " is not in list");
                return Value(n);
              },
              name);
        }
        return Value::undefined("'list object' has no attribute '" + name + "'");
      }
      default: return Value::undefined(std::string("'") + v.type_name() + "' object has no attribute '" + name + "'");
    }
  }

  static Value dict_method(const Value& v, const std::string& name) {
    const Value d = v;
    if (name == "items")
      return Value::callable(
          [d](const Args&) {
            List out;
            for (size_t i = 0; i < d.as_dict().size(); ++i) out.push_back(Value::tuple({d.key_at(i), d.as_dict()[i].second}));
            return Value(std::move(out));
          },
          "items");
    if (name == "keys")
      return Value::callable(
          [d](const Args&) {
            List out;
            for (size_t i = 0; i < d.as_dict().size(); ++i) out.push_back(d.key_at(i));
            return Value(std::move(out));
          },
          "keys");
    if (name == "values")
      return Value::callable(
          [d](const Args&) {
            List out;
            for (const auto& [k, e] : d.as_dict()) out.push_back(e);
            return Value(std::move(out));
          },
          "values");
    if (name == "get")
      return Value::callable(
          [d](const Args& a) {
            const Value* key = a.get(0, "key");
            KVPR_CHECK(key, "dict.get takes a key");
            if (const Value* f = d.find(Value::key_text(*key))) return *f;
            const Value* def = a.get(1, "default");
            return def ? *def : Value::none();
          },
          "get");
    if (name == "copy" || name == "pop" || name == "update" || name == "setdefault" || name == "clear" ||
        name == "popitem")
      return Value::callable(
          [name](const Args&) -> Value { KVPR_THROW("access to attribute '", name, "' of 'dict' object is unsafe"); },
          name);
    return Value();
  }

  static Value string_method(const std::string& s, const std::string& name) {
    auto str_arg = [](const Args& a, size_t i, const char* n) -> const std::string* {
      const Value* v = a.get(i, n);
      if (!v || v->is_none()) return nullptr;
      KVPR_CHECK(v->is_string(), "expected a string argument");
      return &v->as_string();
    };
    auto method = [&](Function f) { return Value::callable(std::move(f), "str." + name); };
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const bool l = name != "rstrip", r = name != "lstrip";
      return method([s, l, r, str_arg](const Args& a) { return Value(strip(s, l, r, str_arg(a, 0, "chars"))); });
    }
    if (name == "split" || name == "rsplit") {
      const bool right = name == "rsplit";
      return method([s, right, str_arg](const Args& a) {
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
    if (name == "startswith" || name == "endswith") {
      const bool start = name == "startswith";
      return method([s, start](const Args& a) {
        KVPR_CHECK(!a.positional.empty(), "startswith/endswith take an argument");
        return Value(starts_or_ends(s, a.positional[0], start));
      });
    }
    if (name == "lower") return method([s](const Args&) { return Value(to_lower(s)); });
    if (name == "upper") return method([s](const Args&) { return Value(to_upper(s)); });
    if (name == "title") return method([s](const Args&) { return Value(title(s)); });
    if (name == "capitalize") return method([s](const Args&) { return Value(capitalize(s)); });
    if (name == "replace")
      return method([s](const Args& a) {
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
    if (name == "find" || name == "rfind" || name == "index" || name == "count")
      return method([s, name](const Args& a) {
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
    if (name == "join")
      return method([s](const Args& a) {
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
    if (name == "splitlines")
      return method([s](const Args& a) {
        const Value* k = a.get(0, "keepends");
        return Value(splitlines(s, k && k->truthy()));
      });
    if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
        name == "islower")
      return method([s, name](const Args&) {
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
    return Value();
  }

  // ------------------------------------------------------------------ filters and tests

  Value apply_filters(const std::vector<ExprPtr>& filters, Value v) {
    for (const auto& f : filters) v = apply_filter(*f, std::move(v));
    return v;
  }

  Value apply_filter(const Expr& f, const Value& v) {
    const Args a = eval_args(f);
    try {
      return filter(f.name, v, a, f.line);
    } catch (const Error& e) {
      const std::string m = e.what();
      if (m.rfind("line ", 0) == 0) throw;
      fail(f.line, "filter " + f.name + ": " + m);
    }
  }

  static const Value* arg(const Args& a, size_t i, const char* name) { return a.get(i, name); }

  // Items of a sequence for the filters that take one (a dict's keys, a string's characters).
  List items_of(const Value& v, int line) const { return iterate(v, line); }

  Value attribute_of(const Value& item, const std::string& path, int line) {
    Value cur = item;
    size_t at = 0;
    while (true) {
      const size_t dot = path.find('.', at);
      const std::string part = path.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
      if (!part.empty() && part.size() < 18 && std::all_of(part.begin(), part.end(), ::isdigit))
        cur = get_item(cur, Value(static_cast<int64_t>(std::stoll(part))), line);
      else
        cur = get_item(cur, Value(part), line);
      if (dot == std::string::npos) return cur;
      at = dot + 1;
    }
  }

  static std::string sort_key_text(const Value& v, bool case_sensitive) {
    return case_sensitive ? v.as_string() : to_lower(v.as_string());
  }
  static bool sort_less(const Value& x, const Value& y, bool case_sensitive) {
    if (x.is_string() && y.is_string()) return sort_key_text(x, case_sensitive) < sort_key_text(y, case_sensitive);
    return less_than(x, y);
  }

  Value filter(const std::string& name, const Value& v, const Args& a, int line) {
    if (name == "safe") return v;
    if (name == "string") return v.is_string() ? v : Value(v.str());
    if (name == "e" || name == "escape") return Value(html_escape(v.str()));
    if (name == "d" || name == "default") {
      const Value* def = arg(a, 0, "default_value");
      const Value* boolean = arg(a, 1, "boolean");
      const bool use = boolean && boolean->truthy() ? !v.truthy() : v.is_undefined();
      return use ? (def ? *def : Value(std::string())) : v;
    }
    if (name == "length" || name == "count") {
      switch (v.kind()) {
        case Value::Kind::String: return Value(static_cast<int64_t>(code_points(v.as_string()).size()));
        case Value::Kind::Array: return Value(static_cast<int64_t>(v.as_list().size()));
        case Value::Kind::Map:
        case Value::Kind::Namespace: return Value(static_cast<int64_t>(v.as_dict().size()));
        case Value::Kind::Undefined: return Value(int64_t{0});
        default: fail(line, std::string("object of type '") + v.type_name() + "' has no len()");
      }
    }
    if (name == "tojson") {
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
      if (out.size() > limits_.max_output) fail(line, "tojson past the output budget");
      return Value(ascii && ascii->truthy() ? ensure_ascii(out) : out);
    }
    if (name == "trim") {
      const Value* chars = arg(a, 0, "chars");
      return Value(strip(v.str(), true, true, chars && chars->is_string() ? &chars->as_string() : nullptr));
    }
    if (name == "lower") return Value(to_lower(v.str()));
    if (name == "upper") return Value(to_upper(v.str()));
    if (name == "title") return Value(title(v.str()));
    if (name == "capitalize") return Value(capitalize(v.str()));
    if (name == "replace") {
      Value m = string_method(v.str(), "replace");
      return m.call(a);
    }
    if (name == "items") {
      if (v.is_undefined()) return Value(List{});
      if (!v.is_dict()) fail(line, "can only get item pairs from a mapping");
      return dict_method(v, "items").call(Args{});
    }
    if (name == "list") return Value(items_of(v, line));
    if (name == "first" || name == "last") {
      const List l = items_of(v, line);
      if (l.empty()) return Value::undefined("no " + name + " item, sequence was empty");
      return name == "first" ? l.front() : l.back();
    }
    if (name == "reverse") {
      if (v.is_string()) {
        std::vector<std::string> cps = code_points(v.as_string());
        std::string out;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
        return Value(std::move(out));
      }
      List l = items_of(v, line);
      std::reverse(l.begin(), l.end());
      return Value(std::move(l));
    }
    if (name == "join") {
      const Value* sep = arg(a, 0, "d");
      const Value* attr = arg(a, 1, "attribute");
      std::string out;
      bool first = true;
      for (const auto& x : items_of(v, line)) {
        if (!first) out += sep ? sep->str() : "";
        first = false;
        out += (attr ? attribute_of(x, attr->str(), line) : x).str();
        if (out.size() > limits_.max_output) fail(line, "join past the output budget");
      }
      return Value(std::move(out));
    }
    if (name == "int") {
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
    if (name == "float") {
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
    if (name == "abs") {
      if (!v.is_number()) fail(line, std::string("bad operand type for abs(): '") + v.type_name() + "'");
      if (v.kind() == Value::Kind::Float) return Value(std::fabs(v.as_double()));
      if (v.as_int() == INT64_MIN) fail(line, "integer overflow in abs");
      return Value(static_cast<int64_t>(std::llabs(v.as_int())));
    }
    if (name == "round") {
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
    if (name == "indent") {
      const Value* w = arg(a, 0, "width");
      const Value* first = arg(a, 1, "first");
      const Value* blank = arg(a, 2, "blank");
      const int64_t width = w && !w->is_string() ? w->as_int() : 4;
      if (width < 0 || width > 1024) fail(line, "indent: width must be 0..1024");
      const std::string ind = w && w->is_string() ? w->as_string() : std::string(static_cast<size_t>(width), ' ');
      if (ind.size() * (v.str().size() + 1) > limits_.max_output) fail(line, "indent past the output budget");
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
    if (name == "format") {
      List args = a.positional;
      try {
        return Value(percent_format(v.str(), Value::tuple(std::move(args))));
      } catch (const Error& e) {
        fail(line, e.what());
      }
    }
    if (name == "wordcount") {
      int64_t n = 0;
      bool in = false;
      for (unsigned char c : v.str()) {
        const bool w = std::isalnum(c) || c == '_' || c >= 0x80;
        if (w && !in) ++n;
        in = w;
      }
      return Value(n);
    }
    if (name == "attr") return get_attr(v, a.positional.empty() ? "" : a.positional[0].str(), line);
    if (name == "map") {
      List out;
      const Value* attr = arg(a, 99, "attribute");
      const Value* def = arg(a, 99, "default");
      if (attr) {
        for (const auto& x : items_of(v, line)) {
          Value r = attribute_of(x, attr->str(), line);
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
      for (const auto& x : items_of(v, line)) out.push_back(filter(f, x, rest, line));
      return Value(std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
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
      for (const auto& x : items_of(v, line)) {
        const Value subject = by_attr ? attribute_of(x, attr, line) : x;
        const bool ok = test.empty() ? subject.truthy() : apply_test(test, subject, rest, line);
        if (ok == keep_if) out.push_back(x);
      }
      return Value(std::move(out));
    }
    if (name == "sort" || name == "unique" || name == "max" || name == "min") {
      const Value* rev = name == "sort" ? arg(a, 0, "reverse") : nullptr;
      const Value* cs = arg(a, name == "sort" ? 1 : 0, "case_sensitive");
      const Value* attr = arg(a, name == "sort" ? 2 : 1, "attribute");
      const bool case_sensitive = cs && cs->truthy();
      List l = items_of(v, line);
      auto key = [&](const Value& x) { return attr ? attribute_of(x, attr->str(), line) : x; };
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
    if (name == "dictsort") {
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
    if (name == "sum") {
      const Value* attr = arg(a, 0, "attribute");
      const Value* start = arg(a, 1, "start");
      Value total = start ? *start : Value(int64_t{0});
      for (const auto& x : items_of(v, line)) total = binary("+", total, attr ? attribute_of(x, attr->str(), line) : x, line);
      return total;
    }
    fail(line, "no filter named '" + name + "'");
  }

  bool apply_test(const std::string& name, const Value& v, const Args& a, int line) {
    const Value* x = a.get(0, "value");
    auto need = [&]() -> const Value& {
      if (!x) fail(line, "the test '" + name + "' takes an argument");
      return *x;
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "boolean") return v.kind() == Value::Kind::Bool;
    if (name == "true") return v.kind() == Value::Kind::Bool && v.as_bool();
    if (name == "false") return v.kind() == Value::Kind::Bool && !v.as_bool();
    if (name == "integer") return v.kind() == Value::Kind::Int;
    if (name == "float") return v.kind() == Value::Kind::Float;
    if (name == "number") return v.is_number();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.kind() == Value::Kind::Map;
    if (name == "iterable") return v.is_list() || v.is_string() || v.kind() == Value::Kind::Map || v.is_undefined();
    if (name == "sequence") return v.is_list() || v.is_string() || v.kind() == Value::Kind::Map;
    if (name == "callable") return v.is_callable();
    if (name == "escaped") return false;
    if (name == "filter") return known_filter(v.str());
    if (name == "test") return known_test(v.str());
    if (name == "sameas") {
      const Value& o = need();
      if (v.kind() != o.kind()) return false;
      if (v.is_none() || v.is_undefined()) return true;
      if (v.kind() == Value::Kind::Bool) return v.as_bool() == o.as_bool();
      return v == o && (v.is_number() || v.is_string());
    }
    if (name == "eq" || name == "equalto" || name == "==") return v == need();
    if (name == "ne" || name == "!=") return !(v == need());
    if (name == "lt" || name == "lessthan" || name == "<") return compare("<", v, need(), line);
    if (name == "le" || name == "<=") return compare("<=", v, need(), line);
    if (name == "gt" || name == "greaterthan" || name == ">") return compare(">", v, need(), line);
    if (name == "ge" || name == ">=") return compare(">=", v, need(), line);
    if (name == "in") return contains(need(), v, line);
    if (name == "odd" || name == "even" || name == "divisibleby") {
      if (!v.is_number()) fail(line, "the test '" + name + "' needs a number");
      const int64_t n = v.as_int();
      if (name == "odd") return floor_mod(n, 2) == 1;
      if (name == "even") return floor_mod(n, 2) == 0;
      const int64_t d = need().as_int();
      if (d == 0) fail(line, "divisibleby 0");
      return d == -1 || floor_mod(n, d) == 0;
    }
    // Python's islower()/isupper(): some cased character, and none of the other case.
    if (name == "lower")
      return v.is_string() && to_lower(v.as_string()) == v.as_string() && to_upper(v.as_string()) != v.as_string();
    if (name == "upper")
      return v.is_string() && to_upper(v.as_string()) == v.as_string() && to_lower(v.as_string()) != v.as_string();
    fail(line, "no test named '" + name + "'");
  }

  // ------------------------------------------------------------------ globals

  Scope builtins() {
    Scope g;
    g["range"] = Value::callable(
        [this](const Args& a) {
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
          steps_ += static_cast<int64_t>(out.size());
          return Value(std::move(out));
        },
        "range");
    g["namespace"] = Value::callable(
        [this](const Args& a) {
          Dict d;
          if (!a.positional.empty() && a.positional[0].is_dict()) d = a.positional[0].as_dict();
          for (const auto& [k, v] : a.keyword) d.emplace_back(k, v);
          Value ns = Value::namespace_of(std::move(d));
          namespaces_.push_back(ns);
          return ns;
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

  const Limits& limits_;
  Scope globals_, top_;
  std::vector<Scope*> scopes_;
  std::vector<Value> namespaces_;  // every namespace() this render made
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace

bool known_filter(const std::string& name) { return filter_names().count(name) > 0; }
bool known_test(const std::string& name) { return test_names().count(name) > 0; }

std::string Template::render(const Value& context) const {
  Renderer r(limits_, context);
  try {
    return r.run(*root_);
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    KVPR_THROW("the template ran out of memory");
  } catch (const std::exception& e) {
    KVPR_THROW("the template failed: ", e.what());
  }
}

}  // namespace kvpr::jinja
