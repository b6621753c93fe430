// Regular expressions for JSON Schema's `pattern` and `format` in constrained decoding: an
// ECMAScript subset compiled to an NFA over Unicode code points, recognized one code point at a
// time so a string can be checked as it is written (a prefix is alive while some continuation
// may still match). Its determinized states are built as they are reached and shared by every
// recognizer of the pattern (under a lock: sequences of one request run on several threads); at
// most 50000 of them holding 2^20 NFA states in all, past which a continuation needing a new one
// is refused, so a pattern whose determinization explodes narrows the text instead of exhausting
// memory. A pattern is refused when it is too large to compile: groups nested more than 100
// deep, a repeat count above 1000, more than 20000 NFA states.
//
// The subset: literals; `.` (any code point but line terminators); classes `[...]`, `[^...]`
// with ranges; `\d \D \w \W \s \S`, `\t \n \r \f \v \0`, `\xHH`, `\uHHHH`, `\u{H...}` and escaped
// punctuation; groups `(...)`, `(?:...)`, `(?<name>...)`; `|`; `* + ? {n} {n,} {n,m}` (lazy
// forms too: recognition is the same); `^` first and `$` last in the pattern or in one of its
// top-level alternatives (`^dev|rc$`: ^ binds dev alone, $ rc). As JSON Schema says, a pattern is
// not anchored: without `^` anything may come before a match, without `$` anything after.
// Backreferences, lookaround, `\b` and anchors elsewhere are refused by name (kvpr::Error).
#pragma once

#include <cstdint>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvpr {

class Regex {
 public:
  // Throws kvpr::Error ("pattern '...': ...") for what is malformed or not supported.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  const std::string& pattern() const { return pattern_; }
  size_t nfa_states() const { return nfa_.size(); }

  // Recognizer states (determinized): start(), then step() per code point; -1 is dead.
  int start() const { return start_; }
  int step(int state, uint32_t cp) const;
  // Whether some code point in [lo, hi] moves `state` on (a UTF-8 character begun, not finished).
  // Past ASCII, for a pattern of at most kWideClasses classes, each class's first code point in
  // the range is stepped (making its state: a move past the caps then counts as none, as step()
  // refuses it); otherwise the NFA's ranges are read.
  bool may_step(int state, uint32_t lo, uint32_t hi) const;
  bool accepts(int state) const;
  // Whether a continuation needed a determinized state past the caps (and was refused for it):
  // from then on what this pattern admits depends on which continuations were tried first.
  bool saturated() const { return saturated_.load(std::memory_order_relaxed); }
  // Whether the whole text matches (JSON Schema's pattern semantics: a search unless anchored).
  bool matches(const std::u32string& text) const;
  // Whether no text matches both (false also where telling would take more than a budget of
  // steps: a caller then treats them as overlapping).
  static bool disjoint(const Regex& a, const Regex& b);
  // How many texts take `state` to acceptance, counting those of printable ASCII but '"' and '\\'
  // (an object key written without escapes) up to kCompletionsCap, and those longer than 256
  // characters as one at most; never more than there are. Computed once per state.
  static constexpr int64_t kCompletionsCap = 1 << 16;
  int64_t completions(int state) const;
  // The code points of valid UTF-8 `text` (what matches takes).
  static std::u32string code_points(std::string_view text);

 private:
  struct Range {
    uint32_t lo, hi;
  };
  struct NfaState {
    std::vector<Range> cls;  // a code point in one of these moves to `next`; empty: epsilon only
    int next = -1;
    std::vector<int> eps;    // epsilon moves
  };
  struct Frag {
    int start, end;  // end: a state whose epsilon moves are still to be connected
  };
  class Parser;
  struct Node;  // the syntax tree
  int add_state();
  Frag emit(const Node& n);  // n's states, added to nfa_
  Frag emit_repeat(const Node& n);
  std::vector<int> closure(std::vector<int> states) const;
  int intern(std::vector<int> set) const;

  std::string pattern_;
  std::vector<NfaState> nfa_;
  int nfa_start_ = 0, nfa_accept_ = 0;
  int start_ = 0;
  // Determinized states: their NFA state sets, acceptance, and transitions found so far.
  mutable std::mutex mu_;
  mutable std::map<std::vector<int>, int> ids_;
  mutable std::vector<std::vector<int>> sets_;
  mutable size_t set_entries_ = 0;  // NFA states in sets_, all together
  mutable std::vector<char> accepting_;
  mutable std::unordered_map<uint64_t, int> moves_;
  // Moves on ASCII code points and acceptance, read without the lock (a mask steps the bytes of
  // most tokens of a vocabulary through the pattern, from the rows of a batch at once): per
  // state, the next state + 2 on each of the 128 (0: not found yet, 1: dead) and acceptance + 1,
  // in blocks of kFastStates states allocated as states are made, for the first 4096 states
  // (2.3 MiB at most; a pattern past them steps under the lock). What is 0 here is read under the
  // lock.
  // Code points past ASCII step by their class: the intervals between the points where one of
  // the pattern's ranges begins or ends (wide_cuts_, from 128), inside which every code point
  // moves every state alike. A pattern with at most kWideClasses of them steps those without the
  // lock too (`wide`, per state and class, as `next`); most have one to three (`.`, a negated
  // class, a few scripts).
  static constexpr size_t kFastStates = 32;
  static constexpr size_t kWideClasses = 16;
  struct FastBlock {
    std::atomic<int32_t> next[kFastStates][128];
    std::atomic<int32_t> wide[kFastStates][kWideClasses];
    std::atomic<int8_t> accepting[kFastStates];
  };
  std::vector<uint32_t> wide_cuts_;
  size_t wide_class(uint32_t cp) const;  // cp >= 128
  std::unique_ptr<std::atomic<FastBlock*>[]> fast_;
  mutable std::atomic<bool> saturated_{false};
  mutable std::mutex completions_mu_;
  mutable std::unordered_map<int, int64_t> completions_;
};

// The regex a JSON Schema `format` stands for (RFC 3339 date-time, date, time; uuid; email;
// ipv4), or "" for a format kvpr does not enforce.
std::string format_pattern(const std::string& format);

}  // namespace kvpr
