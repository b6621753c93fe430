// A pattern of tokenizer.json (a Split pre-tokenizer's or a Replace normalizer's: {"String": s}
// or {"Regex": r}), compiled by Oniguruma with the syntax and options Hugging Face's tokenizers
// give it, so that any pattern a model ships matches as it does there: Unicode properties,
// lookaround, possessive and atomic groups, inline flags.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvpr {

namespace json {
class Value;
}

// A part of a text: [begin, end) in bytes, and whether the pattern matched it.
struct PatternSpan {
  size_t begin, end;
  bool match;
};

class Pattern {
 public:
  // A regular expression in Oniguruma's syntax (ONIG_SYNTAX_ONIGURUMA, UTF-8). Throws naming
  // the pattern and Oniguruma's message when it does not compile.
  static Pattern regex(std::string_view re);
  // A string matched literally (without Oniguruma when it is not empty).
  static Pattern literal(std::string_view s);
  // tokenizer.json's {"String": s} or {"Regex": r}; `where` names it in errors.
  static Pattern from_json(const json::Value& v, const std::string& where);

  // The text cut into the pattern's successive non-overlapping matches and the text between
  // them, covering all of it in order (Hugging Face's find_matches: an empty text is one
  // unmatched empty span; an empty match right after a match is skipped). A search has a
  // budget of backtracking steps: a pattern that exceeds it on a text throws rather than hangs.
  std::vector<PatternSpan> find_matches(std::string_view text) const;
  // The same spans, passed to `span` one by one as they are found.
  void for_each_span(std::string_view text, const std::function<void(const PatternSpan&)>& span) const;
  const std::string& source() const { return source_; }

 private:
  struct Compiled;
  void literal_spans(std::string_view text, const std::function<void(const PatternSpan&)>& span) const;
  std::shared_ptr<const Compiled> re_;  // null for a literal
  std::string source_;
  bool literal_ = false;
};

}  // namespace kvpr
