// The schema recognizer (json_schema.h): JSON text fed a byte at a time against a compiled
// schema (json_schema_compile.cc), as threads of alternatives.
#include "engine/constrain/json_schema.h"

#include <algorithm>
#include <bit>
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

namespace {

// A number's text split: sign, integer digits, whether a '.' was written, fraction digits.
struct NumberText {
  bool neg = false, dot = false;
  std::string_view i, f;
  explicit NumberText(std::string_view text) {
    neg = !text.empty() && text[0] == '-';
    const std::string_view body = text.substr(neg ? 1 : 0);
    const size_t at = body.find('.');
    dot = at != std::string_view::npos;
    i = body.substr(0, at);
    f = dot ? body.substr(at + 1) : std::string_view{};
  }
};

// The value times 10^scale modulo m, of digits `i`.`f` (f at most `scale` digits).
int64_t scaled_remainder(const NumberText& x, int scale, int64_t m) {
  int64_t r = 0;
  for (char c : x.i) r = (r * 10 + (c - '0')) % m;
  for (char c : x.f) r = (r * 10 + (c - '0')) % m;
  for (size_t k = x.f.size(); k < static_cast<size_t>(scale); ++k) r = r * 10 % m;
  return r;
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

bool SchemaRecognizer::number_is_multiple(const Thread& t) const {
  const SchemaNode& n = schema_->node(t.node);
  if (n.multiple == 0) return true;
  const NumberText x(t.key);
  return x.f.size() <= static_cast<size_t>(n.multiple_scale) && scaled_remainder(x, n.multiple_scale, n.multiple) == 0;
}

bool SchemaRecognizer::multiple_viable(const Thread& t) const {
  const SchemaNode& n = schema_->node(t.node);
  if (n.multiple == 0) return true;
  const NumberText x(t.key);
  // Before the point, integer digits may go on: every remainder is still reachable, and no upper
  // bound stands in the way (nor a lower one below 0). A leading 0 goes on only to a fraction:
  // 0 itself, or 0. and digits.
  if (!x.dot && x.i != "0") return true;
  if (!x.dot && number_in_bounds(t)) return true;
  if (n.multiple_scale == 0 && x.f.empty()) return false;  // no fraction digit may follow
  if (x.f.size() > static_cast<size_t>(n.multiple_scale)) return false;
  // The fraction digits still free add some d < 10^free (times the last place) to the value.
  int64_t room = 1;
  for (size_t k = x.f.size(); k < static_cast<size_t>(n.multiple_scale); ++k) room *= 10;
  const int64_t r = scaled_remainder(x, n.multiple_scale, n.multiple);
  const int64_t d0 = (n.multiple - r) % n.multiple;  // the least d making a multiple
  if (d0 >= room) return false;
  if (!n.lo.set) return true;
  // Beside a lower bound: the largest such value (the least d when negative) must meet it.
  const int64_t d = x.neg ? d0 : d0 + (room - 1 - d0) / n.multiple * n.multiple;
  std::string digits = std::to_string(d);
  const size_t free = static_cast<size_t>(n.multiple_scale) - x.f.size();
  if (digits.size() < free) digits.insert(0, free - digits.size(), '0');
  if (free == 0) digits.clear();
  Thread end = t;
  end.key = t.key + (x.dot ? "" : ".") + digits;
  return number_in_bounds(end);
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
  const NumberText x(t.key);
  const std::string I(x.i), F(x.f);
  End L, H;
  allowed(n, x.neg, &L, &H);
  const Dec zero;
  if (I.empty()) return meets(zero, End{}, L, H);
  auto span = [&](const Dec& a, const Dec& b_excl) {  // [a, b): for an integer, [a, b - 1]
    End b{true, !integer ? false : true, integer ? negated(plus_one(negated(b_excl))) : b_excl};
    return meets(a, b, L, H);
  };
  if (x.dot) {
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
  auto may_become = [&](uint32_t floor = 0, uint32_t ceiling = 0x10FFFF) {
    const int rest = 6 * t.aux;
    const uint32_t lo = std::max(t.cp << rest, floor), hi = std::min(t.cp << rest | ((1u << rest) - 1), ceiling);
    if (lo > hi) return false;
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
  // Its bits followed by any continuation bits, less what string_byte refuses at the next byte:
  // the overlong forms (E0 and F0 carry no bits: they begin U+0800 and U+10000 onwards, never
  // ASCII), the surrogates after ED.
  return may_become(t.aux == 1 ? 0x80u : t.aux == 2 ? 0x800u : 0x10000u, c == 0xED ? 0xD7FFu : 0x10FFFFu);
}

const uint64_t* SchemaRecognizer::used_literals(const Thread& t) const {
  if (t.stack.empty() || t.stack.back().object) return nullptr;
  const SchemaNode& a = schema_->node(t.stack.back().node);
  return a.kind == SchemaNode::Kind::Array && a.unique && a.items == t.node ? &t.stack.back().used : nullptr;
}

bool SchemaRecognizer::unique_value_item(const Thread& t) const {
  if (t.stack.empty() || t.stack.back().object) return false;
  const SchemaNode& a = schema_->node(t.stack.back().node);
  return a.kind == SchemaNode::Kind::Array && a.unique_values;
}

bool SchemaRecognizer::literal_given(const Thread& t, const std::string& literal) const {
  if (!unique_value_item(t)) return false;
  const std::vector<std::string>& given = t.stack.back().extra;
  return !given.empty() && std::find(given.begin(), given.end(), value_of(Mode::Literal, literal)) != given.end();
}

std::string SchemaRecognizer::value_of(Mode mode, const std::string& text) {
  if (mode == Mode::Number) return "n" + decimal::dec_text(decimal::parse_dec(text));
  try {
    const json::Value v = json::parse(text);
    if (v.is_string()) return "s" + v.as_string();
    if (v.is_number()) return "n" + decimal::dec_text(decimal::parse_dec(text));
  } catch (const Error&) {  // a string the parser refuses (a lone surrogate escape): as written
    return "s" + text;
  }
  return "l" + text;  // true, false, null
}

bool SchemaRecognizer::scalar_may_end(const Thread& t) const {
  if (t.mode == Mode::Number) return number_may_end(t.sub) && number_in_bounds(t) && number_is_multiple(t);
  if (t.mode == Mode::Literal) {
    const SchemaNode& n = schema_->node(t.node);
    const auto& lits = n.kind == SchemaNode::Kind::Any ? kAnyLiterals : n.literals;
    const auto it = std::find(lits.begin(), lits.end(), t.key);
    if (it == lits.end()) return false;
    const uint64_t* used = used_literals(t);
    return (!used || !(*used >> (it - lits.begin()) & 1)) && !literal_given(t, *it);
  }
  return false;
}

bool SchemaRecognizer::object_may_close(const Thread& t) const {
  const SchemaNode& n = schema_->node(t.stack.back().node);
  if (n.kind == SchemaNode::Kind::Any) return true;
  const KeySet& seen = t.stack.back().seen;
  if ((n.required & ~seen).any()) return false;
  for (const auto& [key, needs] : n.depends)
    if ((seen & key).any() && (needs & ~seen).any()) return false;
  return t.stack.back().count >= n.min_props;
}

// Whether another key may begin: one not given yet that fits maxProperties.
bool SchemaRecognizer::object_may_continue(const Thread& t) const {
  const SchemaNode& n = schema_->node(t.stack.back().node);
  const Frame& f = t.stack.back();
  if (n.kind == SchemaNode::Kind::Any) return true;
  if (n.max_props >= 0 && f.count >= n.max_props) return false;
  if (n.additional >= 0 && keys_fit(n, f, f.seen, 1)) return true;
  for (size_t i = 0; i < n.names.size(); ++i)
    if (n.props[i] >= 0 && !f.seen.test(i) && keys_fit(n, f, f.seen.with(i), 1)) return true;
  return pattern_key_alive(n, f, "");
}

bool SchemaRecognizer::keys_fit(const SchemaNode& n, const Frame& f, const KeySet& seen, int64_t added) const {
  if (n.max_props < 0) return true;
  return f.count + added + (n.keys_due(seen) & ~seen).count() <= n.max_props;
}

bool SchemaRecognizer::pattern_key_alive(const SchemaNode& n, const Frame& f, std::string_view prefix,
                                         const int* states) const {
  if (n.pattern_props.empty() || !keys_fit(n, f, f.seen, 1)) return false;
  // The prefix's whole characters, and the one it ends inside (lead byte and continuations).
  size_t whole = prefix.size();
  while (whole > 0 && (static_cast<uint8_t>(prefix[whole - 1]) & 0xC0) == 0x80) --whole;
  uint32_t lo = 0, hi = 0;  // the code points the character begun may become
  int due = 0;               // its continuation bytes still to come
  if (whole > 0 && static_cast<uint8_t>(prefix[whole - 1]) >= 0xC0) {
    const uint8_t lead = static_cast<uint8_t>(prefix[whole - 1]);
    const int len = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
    const int have = static_cast<int>(prefix.size() - (whole - 1));
    if (have < len) {
      due = len - have;
      const uint32_t cp = Regex::code_points(prefix.substr(whole - 1))[0];
      lo = std::max(cp << (6 * due), len == 4 ? 0x10000u : len == 3 ? 0x800u : 0x80u);
      hi = std::min(cp << (6 * due) | ((1u << (6 * due)) - 1), lead == 0xED ? 0xD7FFu : 0x10FFFFu);  // (no surrogates)
      --whole;
    }
  }
  if (due == 0) whole = prefix.size();
  const std::string_view text = prefix.substr(0, whole);  // whole UTF-8 characters
  for (size_t p = 0; p < n.pattern_props.size(); ++p) {
    const std::shared_ptr<const Regex>& rx = n.pattern_props[p].first;
    int state = states ? states[p] : rx->start();
    uint32_t cp = 0;
    for (size_t i = 0; !states && i < text.size() && state >= 0; ++i) {  // (decoded in place)
      const uint8_t c = static_cast<uint8_t>(text[i]);
      cp = utf8_step(cp, c);
      if (i + 1 == text.size() || (static_cast<uint8_t>(text[i + 1]) & 0xC0) != 0x80) state = rx->step(state, cp);
    }
    if (state < 0) continue;
    if (due > 0) {
      if (lo <= hi && rx->may_step(state, lo, hi)) return true;
      continue;
    }
    // Texts it may still take, against the keys beginning with the prefix that it matches and
    // that are given already (counted only when the keys it could take are few).
    if (n.names.empty() && f.extra.empty()) return true;  // none given: it may take this one
    const int64_t left = rx->completions(state);
    if (left > static_cast<int64_t>(n.names.size() + f.extra.size())) return true;
    int64_t given = 0;
    for (size_t i = 0; i < n.names.size(); ++i)
      if ((f.seen.test(i) || n.props[i] < 0) && n.names[i].starts_with(prefix) && rx->matches(Regex::code_points(n.names[i]))) ++given;
    for (const std::string& k : f.extra)
      if (k.starts_with(prefix) && rx->matches(Regex::code_points(k))) ++given;
    if (given == 0 || left > given) return true;
  }
  return false;
}

bool SchemaRecognizer::end_value(Thread& t) const {
  if (t.mode == Mode::Literal)
    if (const uint64_t* used = used_literals(t)) {  // a unique array's item: its literal is taken
      const auto& lits = schema_->node(t.node).literals;
      const size_t i = static_cast<size_t>(std::find(lits.begin(), lits.end(), t.key) - lits.begin());
      t.stack.back().used = *used | uint64_t{1} << i;
    }
  if ((t.mode == Mode::String || t.mode == Mode::Number || t.mode == Mode::Literal) && unique_value_item(t)) {
    std::vector<std::string>& given = t.stack.back().extra;
    std::string v = value_of(t.mode, t.key);
    if (std::find(given.begin(), given.end(), v) != given.end()) return false;  // an item given twice
    given.push_back(std::move(v));
  }
  t.key.clear();
  t.ws = 0;
  t.rx[0] = t.rx[1] = 0;  // (a pattern's string or key read: equal states keep equal keys)
  t.cp = 0;
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
    t.stack.push_back(Frame{t.node, true, {}, 0, 0, {}});
    t.mode = Mode::ObjFirst;
    return true;
  }
  if (c == '[' && (any || n.kind == K::Array)) {
    if (t.stack.size() >= max_depth_) return false;
    t.stack.push_back(Frame{t.node, false, {}, 0, 0, {}});
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
    if (unique_value_item(t)) t.key.assign(1, '"');
    return true;
  }
  if ((c == '-' || is_digit(c)) && (any || n.kind == K::Number || n.kind == K::Integer)) {
    t.mode = Mode::Number;
    t.sub = number_start(c);
    if (n.exact() || unique_value_item(t)) t.key.assign(1, static_cast<char>(c));
    return number_viable(t) && multiple_viable(t);
  }
  if (any || n.kind == K::Literals) {
    const auto& lits = any ? kAnyLiterals : n.literals;
    const uint64_t* used = any ? nullptr : used_literals(t);
    for (size_t i = 0; i < lits.size(); ++i)
      if (static_cast<uint8_t>(lits[i][0]) == c && !(used && (*used >> i & 1)) && !literal_given(t, lits[i])) {
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
  if (unique_value_item(t)) t.key.push_back(static_cast<char>(c));
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
    if (keys_stepped(n)) {  // the patterns' states move a whole character at a time
      t.cp = utf8_step(t.cp, c);
      if (t.aux == 0)
        for (size_t k = 0; k < n.pattern_props.size(); ++k) t.rx[k] = n.pattern_props[k].first->step(t.rx[k], t.cp);
    }
    const Frame& f = t.stack.back();
    // Any key, unless the object is closed or maxProperties leaves room for listed keys alone.
    if (!closed && keys_fit(n, f, f.seen, 1)) return true;
    for (size_t i = 0; i < n.names.size(); ++i)  // still the start of a property not yet given
      if (n.props[i] >= 0 && !f.seen.test(i) && n.names[i].starts_with(t.key) && keys_fit(n, f, f.seen.with(i), 1))
        return true;
    return pattern_key_alive(n, f, t.key, keys_stepped(n) ? t.rx : nullptr);
  }
  t.key_node = -1;
  t.rx[0] = t.rx[1] = 0;
  t.cp = 0;
  // The key as read: escapes (only open objects take them) decoded; one the parser refuses (a
  // lone surrogate) stays as written.
  std::string name = t.key;
  if (name.find('\\') != std::string::npos) {
    try {
      name = json::parse("\"" + t.key + "\"").as_string();
    } catch (const Error&) {
    }
  }
  if (n.kind == K::Any) {
    t.key_node = schema_->any();
  } else {
    Frame& f = t.stack.back();
    bool listed = false;
    for (size_t i = 0; i < n.names.size(); ++i)
      if (n.names[i] == name) {
        if (f.seen.test(i) || n.props[i] < 0) return false;  // a key given twice, or one its schema false forbids
        if (!keys_fit(n, f, f.seen.with(i), 1)) return false;
        f.seen.set(i);
        t.key_node = n.props[i];
        listed = true;
      }
    if (t.key_node < 0 && !n.pattern_props.empty()) {  // the patterns its text matches
      const std::u32string text = Regex::code_points(name);
      for (const auto& [rx, node] : n.pattern_props)
        if (rx->matches(text)) {
          if (t.key_node >= 0 && t.key_node != node) return false;  // two patterns' schemas: refused
          t.key_node = node;
        }
    }
    if (t.key_node < 0) t.key_node = n.additional;
    if (t.key_node < 0) return false;
    if (n.tracks_extra()) {
      if (!listed) {
        if (std::find(f.extra.begin(), f.extra.end(), name) != f.extra.end()) return false;  // given twice
        if (!keys_fit(n, f, f.seen, 1)) return false;
        f.extra.push_back(name);
      }
      ++f.count;
    }
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
      // A key may begin only where one may be given: {"properties": {}, "additionalProperties":
      // false} takes `{}` alone, never `{"` (after which nothing is valid).
      if (c != '"' || !object_may_continue(t)) return false;
      t.mode = Mode::Key;
      t.key.clear();
      t.sub = t.aux = 0;
      if (const SchemaNode& o = schema_->node(t.stack.back().node); keys_stepped(o)) {
        for (size_t k = 0; k < o.pattern_props.size(); ++k) t.rx[k] = o.pattern_props[k].first->start();
        t.cp = 0;
      }
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
      // Bounded, a multiple, a unique item (compared by its digits): no exponent.
      if ((n.exact() || unique_value_item(t)) && (c == 'e' || c == 'E')) return false;
      const int r = number_byte(t.sub, c, n.kind == K::Integer);
      if (r == 1 && (n.exact() || unique_value_item(t))) {
        t.key.push_back(static_cast<char>(c));
        return number_viable(t) && multiple_viable(t);
      }
      if (r != 2) return r == 1;
      if (!number_in_bounds(t) || !number_is_multiple(t) || !end_value(t)) return false;
      return step(t, c, spawned);
    }
    case Mode::Literal: {
      const SchemaNode& n = schema_->node(t.node);
      const auto& lits = n.kind == K::Any ? kAnyLiterals : n.literals;
      const uint64_t* used = n.kind == K::Any ? nullptr : used_literals(t);
      t.key.push_back(static_cast<char>(c));
      for (size_t i = 0; i < lits.size(); ++i)
        if (lits[i].starts_with(t.key) && !(used && (*used >> i & 1)) && !literal_given(t, lits[i])) return true;
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
  if (threads_.size() == 1) {  // (the usual case, and a mask's walk: no allocation unless it spawns)
    static thread_local std::vector<Thread> spawned;
    spawned.clear();
    const bool kept = step(threads_[0], c, spawned);
    if (spawned.empty()) {
      if (!kept) threads_.clear();
      return kept;
    }
    if (!kept) threads_.clear();
    for (auto& s : spawned) threads_.push_back(std::move(s));
    spawned.clear();
    merge(threads_);
    return !threads_.empty();
  }
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
  if (t.sub != 0 || t.aux != 0) return -1;
  if (t.mode == Mode::Key) {  // an open object's key, while any key fits: key_step takes any text
    const SchemaNode& o = schema_->node(t.stack.back().node);
    const bool closed = o.kind != SchemaNode::Kind::Any && o.additional < 0;
    return !closed && keys_fit(o, t.stack.back(), t.stack.back().seen, 1) ? INT64_MAX : -1;
  }
  if (t.mode != Mode::String) return -1;
  const SchemaNode& n = schema_->node(t.node);
  if (!n.regexes.empty()) return -1;  // every character goes through the regexes
  if (n.kind == SchemaNode::Kind::String && n.max_length >= 0) return n.max_length - t.length;
  return INT64_MAX;
}

std::optional<SchemaRecognizer> SchemaRecognizer::string_alone() const {
  if (threads_.size() != 1) return std::nullopt;
  const Thread& t = threads_[0];
  if (t.mode != Mode::String || t.sub != 0 || t.aux != 0 || schema_->node(t.node).regexes.empty()) return std::nullopt;
  // (string_step reads no frame for such bytes: the closing quote alone ends the value)
  Thread alone;
  alone.mode = Mode::String;
  alone.node = t.node;
  alone.length = t.length;
  alone.rx[0] = t.rx[0];
  alone.rx[1] = t.rx[1];
  return SchemaRecognizer(*this, alone);
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
    const uint32_t extras = static_cast<uint32_t>(f.extra.size());
    put(&extras, sizeof extras);
    for (const std::string& e : f.extra) {
      const uint32_t el = static_cast<uint32_t>(e.size());
      put(&el, sizeof el);
      k += e;
    }
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

bool JsonSchema::saturated() const {
  for (const SchemaNode& n : nodes_) {
    for (const auto& r : n.regexes)
      if (r->saturated()) return true;
    for (const auto& [r, node] : n.pattern_props)
      if (r->saturated()) return true;
  }
  return false;
}

}  // namespace kvpr
