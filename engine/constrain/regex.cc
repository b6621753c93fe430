#include "engine/constrain/regex.h"

#include <algorithm>
#include <functional>
#include <set>

#include "engine/base/error.h"

namespace kvpr {

namespace {

constexpr uint32_t kMaxCp = 0x10FFFF;
constexpr int kInfinite = -1;
constexpr size_t kMaxStates = 20000;      // NFA states of one pattern
constexpr size_t kMaxDfaStates = 50000;   // determinized states kept; past them a new one is dead
constexpr size_t kMaxDfaEntries = 1u << 20;  // NFA states in all determinized states together (memory)
constexpr int kMaxGroupDepth = 100;       // groups inside groups (the parser recurses into each)
constexpr int kMaxRepeat = 1000;          // {n,m} counts
constexpr size_t kMaxMoves = 1u << 20;    // memoized transitions (a memo: dropped when full)

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& x : r) {
    if (!out.empty() && x.first <= out.back().second + 1) out.back().second = std::max(out.back().second, x.second);
    else out.push_back(x);
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges n = normalize(r), out;
  uint32_t next = 0;
  for (const auto& x : n) {
    if (x.first > next) out.push_back({next, x.first - 1});
    next = x.second + 1;
  }
  if (next <= kMaxCp) out.push_back({next, kMaxCp});
  return out;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMAScript's WhiteSpace and LineTerminator.
const Ranges kSpace = {{0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                       {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const Ranges kDot = complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}});
const Ranges kAny = {{0, kMaxCp}};

// A pattern as an error message shows it: its first 60 bytes (whole UTF-8 characters), then "...".
std::string shown(const std::string& pattern) {
  if (pattern.size() <= 64) return pattern;
  size_t cut = 60;
  while (cut > 0 && (static_cast<uint8_t>(pattern[cut]) & 0xC0) == 0x80) --cut;
  return pattern.substr(0, cut) + "...";
}

std::u32string decode_utf8(const std::string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    int n = c < 0x80 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : -1;
    KVPR_CHECK(n >= 0 && i + static_cast<size_t>(n) < s.size(), "pattern '", shown(s), "': not UTF-8");
    uint32_t cp = n == 0 ? c : c & (0x3F >> n);
    for (int k = 1; k <= n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + static_cast<size_t>(k)]) & 0x3F);
    out.push_back(cp);
    i += static_cast<size_t>(n) + 1;
  }
  return out;
}

}  // namespace

// The syntax tree.
struct Regex::Node {
  enum Kind { Set, Concat, Alt, Repeat } kind = Concat;
  Ranges set;
  std::vector<Node> kids;
  int min = 1, max = 1;
};

class Regex::Parser {
 public:
  Parser(const std::string& pattern) : src_(pattern), p_(decode_utf8(pattern)) {}

  // Returns the tree of the whole search: each top-level alternative anchored where it begins
  // with ^ or ends with $ (ECMAScript's reading of ^a|b$), else with anything before or after it.
  Node parse() {
    end_ = p_.size();
    Node alt;
    alt.kind = Node::Alt;
    while (true) {
      Node whole;
      whole.kind = Node::Concat;
      const bool anchored_start = more() && peek() == '^';
      if (anchored_start) ++i_;
      else whole.kids.push_back(anything());
      whole.kids.push_back(sequence());
      if (more() && peek() == '$') ++i_;  // (sequence stops at a $ only where it ends the alternative)
      else whole.kids.push_back(anything());
      alt.kids.push_back(std::move(whole));
      if (!more()) break;
      if (peek() != '|') fail(peek() == ')' ? "an unmatched ')'" : "unexpected text");
      ++i_;
    }
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const { KVPR_THROW("pattern '", shown(src_), "': ", why); }
  bool more() const { return i_ < end_; }
  // A $ that ends a top-level alternative (the pattern's end or a | follows).
  bool ends_alternative() const { return peek() == '$' && (i_ + 1 == end_ || p_[i_ + 1] == '|'); }
  static Node anything() {  // .* over every code point
    Node any;
    any.kind = Node::Set;
    any.set = kAny;
    Node r;
    r.kind = Node::Repeat;
    r.min = 0;
    r.max = kInfinite;
    r.kids.push_back(std::move(any));
    return r;
  }
  char32_t peek() const { return p_[i_]; }

  Node alternation() {
    Node first = sequence();
    if (!more() || peek() != '|') return first;
    Node alt;
    alt.kind = Node::Alt;
    alt.kids.push_back(std::move(first));
    while (more() && peek() == '|') {
      ++i_;
      alt.kids.push_back(sequence());
    }
    return alt;
  }

  Node sequence() {
    Node seq;
    seq.kind = Node::Concat;
    while (more() && peek() != '|' && peek() != ')' && !(depth_ == 0 && ends_alternative())) {
      Node atom_node = atom();
      quantifier(atom_node);
      seq.kids.push_back(std::move(atom_node));
    }
    return seq;
  }

  void quantifier(Node& a) {
    if (!more()) return;
    int lo = -2, hi = -2;
    const char32_t c = peek();
    if (c == '*') lo = 0, hi = kInfinite;
    else if (c == '+') lo = 1, hi = kInfinite;
    else if (c == '?') lo = 0, hi = 1;
    else if (c == '{') {
      size_t k = i_ + 1;
      auto number = [&](int* out) {  // saturates: a count past kMaxRepeat is refused below
        const size_t from = k;
        long v = 0;
        while (k < end_ && p_[k] >= '0' && p_[k] <= '9') v = std::min<long>(v * 10 + static_cast<long>(p_[k++] - '0'), 1L << 30);
        *out = static_cast<int>(v);
        return k > from;
      };
      int a1 = 0, b1 = 0;
      if (!number(&a1)) return;  // a literal '{'
      if (k < end_ && p_[k] == '}') {
        lo = hi = a1;
      } else if (k < end_ && p_[k] == ',') {
        ++k;
        if (k < end_ && p_[k] == '}') lo = a1, hi = kInfinite;
        else if (number(&b1) && k < end_ && p_[k] == '}') lo = a1, hi = b1;
        else return;
      } else {
        return;
      }
      if (hi != kInfinite && hi < lo) fail("a {n,m} with m below n");
      if (lo > kMaxRepeat || hi > kMaxRepeat) fail("a repeat count above " + std::to_string(kMaxRepeat));
      i_ = k;
    }
    if (lo == -2) return;
    ++i_;
    if (more() && peek() == '?') ++i_;  // lazy: recognizes the same strings
    Node r;
    r.kind = Node::Repeat;
    r.min = lo;
    r.max = hi;
    r.kids.push_back(std::move(a));
    a = std::move(r);
    if (more() && (peek() == '*' || peek() == '+' || peek() == '?')) fail("a quantifier after a quantifier");
  }

  static Node set_node(Ranges r) {
    Node n;
    n.kind = Node::Set;
    n.set = normalize(std::move(r));
    return n;
  }

  Node atom() {
    const char32_t c = p_[i_++];
    switch (c) {
      case '(': {
        if (++depth_ > kMaxGroupDepth) fail("groups nested more than " + std::to_string(kMaxGroupDepth) + " deep");
        if (more() && peek() == '?') {
          ++i_;
          if (more() && peek() == ':') {
            ++i_;
          } else if (more() && peek() == '<' && i_ + 1 < end_ && p_[i_ + 1] != '=' && p_[i_ + 1] != '!') {
            while (more() && peek() != '>') ++i_;  // a named group: the name does not matter
            if (!more()) fail("an unterminated group name");
            ++i_;
          } else {
            fail("lookahead and lookbehind are not supported");
          }
        }
        Node inner = alternation();
        if (!more() || peek() != ')') fail("an unclosed '('");
        ++i_;
        --depth_;
        return inner;
      }
      case '[': return set_node(char_class());
      case '.': return set_node(kDot);
      case '\\': return set_node(escape(false));
      case '^':
      case '$': fail("^ and $ are supported only at the start and the end of the pattern or of a top-level alternative");
      case '*':
      case '+':
      case '?': fail("a quantifier with nothing before it");
      case ')': fail("an unmatched ')'");
      default: return set_node({{static_cast<uint32_t>(c), static_cast<uint32_t>(c)}});
    }
  }

  uint32_t hex(size_t digits) {
    uint32_t v = 0;
    for (size_t k = 0; k < digits; ++k) {
      if (!more()) fail("a short \\x or \\u escape");
      const char32_t h = p_[i_++];
      int d = h >= '0' && h <= '9' ? static_cast<int>(h - '0') : h >= 'a' && h <= 'f' ? static_cast<int>(h - 'a' + 10)
              : h >= 'A' && h <= 'F' ? static_cast<int>(h - 'A' + 10) : -1;
      if (d < 0) fail("a bad hex digit in an escape");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return v;
  }

  Ranges escape(bool in_class) {
    if (!more()) fail("a trailing backslash");
    const char32_t c = p_[i_++];
    auto one = [](uint32_t x) { return Ranges{{x, x}}; };
    switch (c) {
      case 'd': return kDigit;
      case 'D': return complement(kDigit);
      case 'w': return kWord;
      case 'W': return complement(kWord);
      case 's': return kSpace;
      case 'S': return complement(kSpace);
      case 't': return one('\t');
      case 'n': return one('\n');
      case 'r': return one('\r');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case '0': return one(0);
      case 'x': return one(hex(2));
      case 'u': {
        if (more() && peek() == '{') {
          ++i_;
          uint32_t v = 0;
          size_t n = 0;
          while (more() && peek() != '}') {
            v = v * 16 + hex(1);
            ++n;
          }
          if (!more() || n == 0 || v > kMaxCp) fail("a bad \\u{...} escape");
          ++i_;
          return one(v);
        }
        return one(hex(4));
      }
      case 'b':
        if (in_class) return one('\b');
        fail("\\b (word boundaries) is not supported");
      case 'B': fail("\\B (word boundaries) is not supported");
      default:
        if (c >= '1' && c <= '9') fail("backreferences are not supported");
        if (c == 'k') fail("named backreferences are not supported");
        if (c == 'p' || c == 'P') fail("Unicode property escapes are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) fail(std::string("the escape \\") + static_cast<char>(c) + " is not supported");
        return one(static_cast<uint32_t>(c));  // escaped punctuation
    }
  }

  Ranges char_class() {
    bool negate = false;
    if (more() && peek() == '^') {
      negate = true;
      ++i_;
    }
    Ranges r;
    while (true) {
      if (!more()) fail("an unclosed '['");
      if (peek() == ']') break;  // "[]" matches nothing (ECMAScript)
      Ranges lo_set = item();
      if (lo_set.size() == 1 && lo_set[0].first == lo_set[0].second && i_ + 1 < end_ && peek() == '-' &&
          p_[i_ + 1] != ']') {
        ++i_;
        Ranges hi_set = item();
        if (hi_set.size() != 1 || hi_set[0].first != hi_set[0].second) fail("a class range with a class at its end");
        if (hi_set[0].first < lo_set[0].first) fail("a class range out of order");
        r.push_back({lo_set[0].first, hi_set[0].first});
      } else {
        r.insert(r.end(), lo_set.begin(), lo_set.end());
      }
    }
    ++i_;  // ']'
    r = normalize(std::move(r));
    return negate ? complement(r) : r;
  }

  Ranges item() {
    const char32_t c = p_[i_++];
    if (c == '\\') return escape(true);
    return {{static_cast<uint32_t>(c), static_cast<uint32_t>(c)}};
  }

  std::string src_;
  std::u32string p_;
  size_t i_ = 0, end_ = 0;
  int depth_ = 0;  // groups open
};

int Regex::add_state() {
  KVPR_CHECK(nfa_.size() < kMaxStates, "pattern '", shown(pattern_), "' is too large (more than ", kMaxStates, " states)");
  nfa_.emplace_back();
  return static_cast<int>(nfa_.size()) - 1;
}

// Thompson's construction: each fragment has one start and one end state.
Regex::Frag Regex::emit(const Node& n) {
  switch (n.kind) {
    case Node::Set: {
      const int s = add_state(), e = add_state();
      for (const auto& [lo, hi] : n.set) nfa_[static_cast<size_t>(s)].cls.push_back(Range{lo, hi});
      nfa_[static_cast<size_t>(s)].next = e;
      if (n.set.empty()) nfa_[static_cast<size_t>(s)].next = -1;  // matches nothing
      return {s, e};
    }
    case Node::Concat: {
      const int s = add_state();
      int end = s;
      for (const Node& k : n.kids) {
        const Frag f = emit(k);
        nfa_[static_cast<size_t>(end)].eps.push_back(f.start);
        end = f.end;
      }
      return {s, end};
    }
    case Node::Alt: {
      const int s = add_state(), e = add_state();
      for (const Node& k : n.kids) {
        const Frag f = emit(k);
        nfa_[static_cast<size_t>(s)].eps.push_back(f.start);
        nfa_[static_cast<size_t>(f.end)].eps.push_back(e);
      }
      return {s, e};
    }
    case Node::Repeat: return emit_repeat(n);
  }
  return {0, 0};
}

// n.min copies in a row, then a loop (no upper bound) or n.max - n.min optional copies.
Regex::Frag Regex::emit_repeat(const Node& n) {
  const int s = add_state();
  int end = s;
  for (int k = 0; k < n.min; ++k) {
    const Frag f = emit(n.kids[0]);
    nfa_[static_cast<size_t>(end)].eps.push_back(f.start);
    end = f.end;
  }
  if (n.max == kInfinite) {
    const int loop = add_state(), e = add_state();
    nfa_[static_cast<size_t>(end)].eps.push_back(loop);
    const Frag f = emit(n.kids[0]);
    nfa_[static_cast<size_t>(loop)].eps.push_back(f.start);
    nfa_[static_cast<size_t>(loop)].eps.push_back(e);
    nfa_[static_cast<size_t>(f.end)].eps.push_back(loop);
    return {s, e};
  }
  const int e = add_state();
  for (int k = n.min; k < n.max; ++k) {  // each optional copy may be the last
    nfa_[static_cast<size_t>(end)].eps.push_back(e);
    const Frag f = emit(n.kids[0]);
    nfa_[static_cast<size_t>(end)].eps.push_back(f.start);
    end = f.end;
  }
  nfa_[static_cast<size_t>(end)].eps.push_back(e);
  return {s, e};
}

constexpr size_t kFastBlocks = 4096 / 32;  // the first 4096 states step without the lock

Regex::~Regex() {
  for (size_t i = 0; i < kFastBlocks; ++i) delete fast_[i].load(std::memory_order_relaxed);
}

Regex::Regex(const std::string& pattern) : pattern_(pattern), fast_(new std::atomic<FastBlock*>[kFastBlocks]()) {
  static_assert(kFastStates == 32, "kFastBlocks counts blocks of 32 states");
  const Node whole = Parser(pattern).parse();

  const Frag f = emit(whole);
  nfa_start_ = f.start;
  nfa_accept_ = f.end;
  wide_cuts_.push_back(128);
  for (const NfaState& n : nfa_)
    for (const Range& r : n.cls) {
      if (r.lo > 128) wide_cuts_.push_back(r.lo);
      if (r.hi >= 128 && r.hi < kMaxCp) wide_cuts_.push_back(r.hi + 1);
    }
  std::sort(wide_cuts_.begin(), wide_cuts_.end());
  wide_cuts_.erase(std::unique(wide_cuts_.begin(), wide_cuts_.end()), wide_cuts_.end());
  start_ = intern(closure({nfa_start_}));
}

size_t Regex::wide_class(uint32_t cp) const {
  return static_cast<size_t>(std::upper_bound(wide_cuts_.begin(), wide_cuts_.end(), cp) - wide_cuts_.begin()) - 1;
}

std::vector<int> Regex::closure(std::vector<int> states) const {
  std::vector<char> seen(nfa_.size(), 0);
  std::vector<int> out, stack = std::move(states);
  while (!stack.empty()) {
    const int s = stack.back();
    stack.pop_back();
    if (seen[static_cast<size_t>(s)]) continue;
    seen[static_cast<size_t>(s)] = 1;
    out.push_back(s);
    for (int e : nfa_[static_cast<size_t>(s)].eps) stack.push_back(e);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Call with mu_ held, or from the constructor.
int Regex::intern(std::vector<int> set) const {
  auto it = ids_.find(set);
  if (it != ids_.end()) return it->second;
  const int id = static_cast<int>(sets_.size());
  accepting_.push_back(std::binary_search(set.begin(), set.end(), nfa_accept_) ? 1 : 0);
  if (static_cast<size_t>(id) / kFastStates < kFastBlocks) {
    std::atomic<FastBlock*>& slot = fast_[static_cast<size_t>(id) / kFastStates];
    FastBlock* block = slot.load(std::memory_order_relaxed);
    if (!block) {
      block = new FastBlock();  // (all zero: nothing found yet)
      slot.store(block, std::memory_order_release);
    }
    block->accepting[static_cast<size_t>(id) % kFastStates].store(static_cast<int8_t>(accepting_.back() + 1),
                                                                  std::memory_order_release);
  }
  set_entries_ += set.size();
  ids_.emplace(set, id);
  sets_.push_back(std::move(set));
  return id;
}

int Regex::step(int state, uint32_t cp) const {
  if (state < 0) return -1;
  std::atomic<int32_t>* fast = nullptr;
  if (static_cast<size_t>(state) / kFastStates < kFastBlocks && (cp < 128 || wide_cuts_.size() <= kWideClasses)) {
    if (FastBlock* b = fast_[static_cast<size_t>(state) / kFastStates].load(std::memory_order_acquire)) {
      fast = cp < 128 ? &b->next[static_cast<size_t>(state) % kFastStates][cp]
                      : &b->wide[static_cast<size_t>(state) % kFastStates][wide_class(cp)];
      if (const int32_t v = fast->load(std::memory_order_acquire); v != 0) return v - 2;
    }
  }
  const uint64_t key = (static_cast<uint64_t>(state) << 21) | cp;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = moves_.find(key); it != moves_.end()) {
    if (fast) fast->store(it->second + 2, std::memory_order_release);
    return it->second;
  }
  std::vector<int> next;
  for (int s : sets_[static_cast<size_t>(state)]) {
    const NfaState& n = nfa_[static_cast<size_t>(s)];
    if (n.next < 0) continue;
    for (const Range& r : n.cls)
      if (cp >= r.lo && cp <= r.hi) {
        next.push_back(n.next);
        break;
      }
  }
  int id = -1;
  if (!next.empty()) {
    std::vector<int> set = closure(std::move(next));
    // A pattern whose determinized states explode (a(a|b){30}-like) stops here rather than
    // taking the host's memory: continuations that need a new state are refused.
    if (auto it = ids_.find(set); it != ids_.end()) id = it->second;
    else if (sets_.size() < kMaxDfaStates && set_entries_ + set.size() <= kMaxDfaEntries) id = intern(std::move(set));
    else saturated_.store(true, std::memory_order_relaxed);
  }
  if (moves_.size() >= kMaxMoves) moves_.clear();
  moves_.emplace(key, id);
  if (fast) fast->store(id + 2, std::memory_order_release);
  return id;
}

bool Regex::may_step(int state, uint32_t lo, uint32_t hi) const {
  if (state < 0) return false;
  if (lo >= 128 && lo <= hi && wide_cuts_.size() <= kWideClasses) {  // a class at a time (its first code point)
    for (size_t k = wide_class(lo), last = wide_class(hi); k <= last; ++k)
      if (step(state, std::max(lo, wide_cuts_[k])) >= 0) return true;
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (int s : sets_[static_cast<size_t>(state)]) {
    const NfaState& n = nfa_[static_cast<size_t>(s)];
    if (n.next < 0) continue;
    for (const Range& r : n.cls)
      if (r.lo <= hi && lo <= r.hi) return true;
  }
  return false;
}

bool Regex::accepts(int state) const {
  if (state < 0) return false;
  if (static_cast<size_t>(state) / kFastStates < kFastBlocks)
    if (FastBlock* b = fast_[static_cast<size_t>(state) / kFastStates].load(std::memory_order_acquire))
      if (const int8_t a = b->accepting[static_cast<size_t>(state) % kFastStates].load(std::memory_order_acquire); a != 0)
        return a == 2;
  std::lock_guard<std::mutex> lock(mu_);
  return accepting_[static_cast<size_t>(state)] != 0;
}

bool Regex::matches(const std::u32string& text) const {
  int s = start_;
  for (char32_t c : text) {
    s = step(s, static_cast<uint32_t>(c));
    if (s < 0) return false;
  }
  return accepts(s);
}

bool Regex::disjoint(const Regex& a, const Regex& b) {
  // The code points where some class of either begins or ends: between two of them every code
  // point moves both alike, so the first of each interval stands for it.
  std::vector<uint32_t> cuts{0};
  for (const Regex* r : {&a, &b})
    for (const NfaState& n : r->nfa_)
      for (const Range& c : n.cls) {
        cuts.push_back(c.lo);
        if (c.hi < kMaxCp) cuts.push_back(c.hi + 1);
      }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  constexpr int64_t kMaxSteps = 1 << 16;
  int64_t steps = 0;
  std::set<std::pair<int, int>> seen{{a.start_, b.start_}};
  std::vector<std::pair<int, int>> todo{{a.start_, b.start_}};
  while (!todo.empty()) {
    const auto [x, y] = todo.back();
    todo.pop_back();
    if (a.accepts(x) && b.accepts(y)) return false;
    for (uint32_t cp : cuts) {
      if (++steps > kMaxSteps || a.saturated() || b.saturated()) return false;  // (a refused move is not a dead one)
      const int nx = a.step(x, cp);
      if (nx < 0) continue;
      const int ny = b.step(y, cp);
      if (ny >= 0 && seen.insert({nx, ny}).second) todo.emplace_back(nx, ny);
    }
  }
  return true;
}

int64_t Regex::completions(int state) const {
  if (state < 0) return 0;
  {
    std::lock_guard<std::mutex> lock(completions_mu_);
    if (auto it = completions_.find(state); it != completions_.end()) return it->second;
  }
  // Texts by length, as the DFA's states with the number of texts reaching each (a DFA: distinct
  // paths spell distinct texts), capped; a budget of moves, past which what was counted stands.
  auto remember = [&](int64_t total) {
    std::lock_guard<std::mutex> lock(completions_mu_);
    completions_[state] = total;
    return total;
  };
  constexpr int kMaxLength = 256;
  constexpr int64_t kMaxMoves = 1 << 18;
  auto add = [](int64_t a, int64_t b) { return std::min(kCompletionsCap, a + b); };
  std::map<int, int64_t> layer{{state, 1}};
  int64_t total = 0, moves = 0;
  for (int length = 0; length <= kMaxLength && !layer.empty() && total < kCompletionsCap; ++length) {
    for (const auto& [s, n] : layer)
      if (accepts(s)) total = add(total, n);
    if (length == kMaxLength) {  // a text going on past them: at least one more
      for (const auto& [s, n] : layer)
        for (uint32_t c = 0x20; c < 0x7F; ++c)
          if (c != '"' && c != '\\' && step(s, c) >= 0) return remember(add(total, 1));
      break;
    }
    std::map<int, int64_t> next;
    for (const auto& [s, n] : layer) {
      for (uint32_t c = 0x20; c < 0x7F && moves < kMaxMoves; ++c, ++moves) {
        if (c == '"' || c == '\\') continue;
        const int t = step(s, c);
        if (t >= 0) next[t] = add(next[t], n);
      }
    }
    if (moves >= kMaxMoves) break;
    layer = std::move(next);
  }
  return remember(total);
}

std::string format_pattern(const std::string& format) {
  static const std::string date = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
  static const std::string time =
      "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
  static const std::string octet = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
  if (format == "date") return "^" + date + "$";
  if (format == "time") return "^" + time + "$";
  if (format == "date-time") return "^" + date + "[Tt]" + time + "$";
  if (format == "uuid") return "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
  if (format == "email") return "^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)+$";
  if (format == "ipv4") return "^(" + octet + "\\.){3}" + octet + "$";
  return "";
}

std::u32string Regex::code_points(std::string_view text) {
  std::u32string out;
  for (uint8_t c : text) {
    if ((c & 0xC0) == 0x80 && !out.empty()) out.back() = out.back() << 6 | (c & 0x3Fu);
    else out.push_back(c < 0x80 ? c : c >= 0xF0 ? c & 0x07u : c >= 0xE0 ? c & 0x0Fu : c & 0x1Fu);
  }
  return out;
}

}  // namespace kvpr
