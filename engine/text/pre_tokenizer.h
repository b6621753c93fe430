// tokenizer.json's "pre_tokenizer": how the normalized text between added tokens is cut into
// the pieces the BPE model merges within, as Hugging Face's tokenizers does it. Split (any
// pattern, any behaviour, inverted or not), ByteLevel, Metaspace, Whitespace, WhitespaceSplit,
// Punctuation, Digits, CharDelimiterSplit, BertPreTokenizer, FixedLength and Sequences of them.
//
// Fast paths: a Split by GPT-2's, Llama-3's or Qwen2's pattern (and ByteLevel's own regex, which
// is GPT-2's) runs hand-written splitters instead of Oniguruma; they give the same pieces
// (tests/engine/text/test_tokenizer_pipelines.cc checks them against the general path on every
// corpus string) about three times faster (kvpr-bench tokenize).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "engine/text/pattern.h"

namespace kvpr {

namespace json {
class Value;
}

// GPT-2's byte-level alphabet: each byte stands for a visible character (printable bytes for
// themselves, the others shifted to U+0100 and up).
const std::string& byte_level_char(unsigned char b);
// The byte a byte-level character stands for, or -1.
int byte_level_byte(char32_t c);

// How a Split's matches become pieces (Hugging Face's SplitDelimiterBehavior).
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

class PreTokenizer {
 public:
  // `v` may be null or JSON null (no pre-tokenizer: the text is one piece).
  static PreTokenizer from_json(const json::Value* v, const std::string& path);
  // GPT-2's: ByteLevel with its own regex (vocab.json + merges.txt tokenizers).
  static PreTokenizer gpt2_byte_level(bool add_prefix_space);

  // Calls `piece` with each piece of `text` in order; `at_start`: the text begins the input
  // (Metaspace's "first" scheme). Each step passes a piece's parts on to the next as they are
  // cut, so no step holds more than the parts of one piece.
  void split(std::string_view text, bool at_start, const std::function<void(std::string_view)>& piece) const;
  // The pieces, collected (for tests).
  std::vector<std::string> split(std::string_view text, bool at_start) const;

  // Whether a ByteLevel step maps the pieces into GPT-2's byte alphabet.
  bool byte_level() const;
  // Whether a Metaspace step puts "▁" before the text (prepend scheme "always" or "first").
  bool prepends_metaspace() const;
  // tokenizer_config.json's add_prefix_space, which transformers writes into every ByteLevel step.
  void set_add_prefix_space(bool on);
  // Off: every Split runs its pattern through Oniguruma (tests compare the two paths).
  void set_fast_paths(bool on) { fast_paths_ = on; }

 private:
  enum class Kind { Split, ByteLevel, Metaspace, CharSplit, FixedLength };
  enum class Fast { None, Gpt2, Llama3, Qwen2 };
  enum class CharSet { Whitespace, Punctuation, Numeric, Delimiter };
  struct Step {
    explicit Step(Kind k) : kind(k) {}
    Kind kind;
    Pattern pattern;                 // Split; ByteLevel's regex
    Fast fast = Fast::None;          // a hand-written splitter for the pattern
    SplitBehavior behavior = SplitBehavior::Isolated;
    bool invert = false;
    bool add_prefix_space = false;   // ByteLevel
    bool use_regex = true;           // ByteLevel
    std::string replacement;         // Metaspace
    int prepend = 0;                 // Metaspace: 0 always, 1 first, 2 never
    bool split = true;               // Metaspace
    CharSet chars = CharSet::Whitespace;  // CharSplit
    char32_t delimiter = 0;          // CharSplit
    size_t length = 0;               // FixedLength
  };
  void add(const json::Value& v, const std::string& path, int depth);
  // Adds the steps of one pre-tokenizer of a type (`where` names it in errors).
  using AddFn = void (*)(PreTokenizer& p, const json::Value& v, const std::string& where, const std::string& path,
                         int depth);
  static const std::map<std::string, AddFn>& kinds();  // by tokenizer.json's "type"
  void add_split(Pattern pattern, SplitBehavior behavior, bool invert);
  void run(size_t step, std::string_view text, bool at_start, const std::function<void(std::string_view)>& piece) const;
  void run_byte_level(size_t step, std::string_view text, bool at_start,
                      const std::function<void(std::string_view)>& piece) const;
  std::vector<PatternSpan> matches(const Step& s, std::string_view text) const;
  bool fast(const Step& s) const;  // whether s runs a hand-written splitter
  void split_fast(const Step& s, std::string_view text, const std::function<void(std::string_view)>& piece) const;

  std::vector<Step> steps_;
  bool fast_paths_ = true;
};

// The fast splitters, exposed for tests. Invalid UTF-8 bytes count as single "other" characters.
// GPT-2's pattern  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
std::vector<std::string_view> pretokenize(std::string_view text);
// Llama-3's pattern (max_digits 3; Qwen2's with 1)
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
std::vector<std::string_view> pretokenize_llama3(std::string_view text, int max_digits = 3);

}  // namespace kvpr
