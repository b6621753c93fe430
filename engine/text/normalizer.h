// tokenizer.json's "normalizer": what is done to the text between added tokens before it is
// split, as Hugging Face's tokenizers does it. NFC, NFD, NFKC, NFKD, Lowercase, Strip,
// StripAccents, Replace (a string or a regex), Prepend, Nmt, BertNormalizer and Sequences of
// them; anything else is refused when the tokenizer loads, naming it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/text/pattern.h"
#include "engine/text/unicode.h"

namespace kvpr {

namespace json {
class Value;
}

class Normalizer {
 public:
  // `v` may be null or JSON null (no normalizer); `path` names the file in errors.
  static Normalizer from_json(const json::Value* v, const std::string& path);

  // The normalized text. `stripped_start` (if given) says whether characters were removed from
  // the start of the text (the Strip normalizer): its first character then no longer starts the
  // input, which Metaspace's prepend_scheme "first" reads.
  std::string apply(std::string_view text, bool* stripped_start = nullptr) const;
  bool empty() const { return steps_.empty(); }

 private:
  enum class Kind { Form, Lowercase, Strip, StripAccents, Replace, Prepend, Nmt, Bert };
  struct Step {
    Kind kind;
    unicode::Form form = unicode::Form::NFC;
    bool left = false, right = false;  // Strip's sides; Bert: clean_text, handle_chinese_chars
    bool strip_accents = false, lowercase = false;  // Bert
    Pattern pattern;  // Replace
    std::string content;  // Replace's replacement, Prepend's prefix
  };
  void add(const json::Value& v, const std::string& path, int depth);
  std::vector<Step> steps_;
};

}  // namespace kvpr
