// BPE tokenizers of two kinds, with special and added tokens from tokenizer_config.json,
// special_tokens_map.json, added_tokens.json and tokenizer.json:
//  - byte-level (GPT-2, OPT, RoBERTa family) from vocab.json + merges.txt; encoding matches
//    GPT-2's reference encoder exactly; or from tokenizer.json's BPE model with a ByteLevel
//    pre-tokenizer, after GPT-2's pattern or a Split by Llama-3's (Qwen2's) pattern, with
//    ignore_merges (a pre-token in the vocabulary is one token) and BOS from a
//    TemplateProcessing post-processor (Llama-3);
//  - SentencePiece-style (Llama, Llama-2) from tokenizer.json's BPE model: spaces become "▁",
//    "▁" is prepended (the Prepend normalizer or the Metaspace pre-tokenizer), characters
//    missing from the vocabulary fall back to <0xNN> byte tokens, and merges apply by rank
//    over the whole segment, as Hugging Face tokenizers does.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvpr {

namespace json {
class Value;
}

class Tokenizer {
 public:
  // Reads the tokenizer files of a model directory. Throws naming the file on bad input.
  static Tokenizer load(const std::string& model_dir);
  // From explicit vocab.json and merges.txt paths (no special tokens).
  static Tokenizer from_files(const std::string& vocab_json, const std::string& merges_txt);
  // The BPE model of a tokenizer.json, byte-level or SentencePiece-style (its added tokens and
  // post-processor are read by load).
  static Tokenizer from_tokenizer_json(const std::string& path);
  static Tokenizer from_tokenizer_json(const json::Value& tokenizer_json, const std::string& path);
  bool is_byte_level() const { return kind_ == Kind::ByteLevel; }

  // Ids of `text`. Special/added tokens written in the text are recognised. BOS is
  // prepended when add_bos is set and the tokenizer asks for it (add_bos_token).
  std::vector<int32_t> encode(std::string_view text, bool add_special = true) const;
  // Plain BPE of text without special-token splitting or BOS (the GPT-2 reference encode).
  std::vector<int32_t> encode_ordinary(std::string_view text) const;

  // Text of ids; invalid UTF-8 (from a partial byte sequence) becomes U+FFFD. SentencePiece
  // tokenizers drop the space their "▁" prefix put before the first word, as Hugging Face's
  // decode does; token_bytes (and so streamed text) keeps it, so a completion reads on from
  // its prompt.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = true) const;
  // Raw bytes of one token (may be part of a UTF-8 sequence); empty for unknown ids.
  std::string token_bytes(int32_t id, bool skip_special = true) const;
  // The vocabulary string of an id ("Ġthe"), for display.
  std::string id_to_token(int32_t id) const;
  std::optional<int32_t> token_to_id(const std::string& token) const;

  // Number of ids the tokenizer can produce: ids >= size() are never sampled.
  int32_t size() const { return size_; }
  std::optional<int32_t> bos_id() const { return bos_; }
  std::optional<int32_t> eos_id() const { return eos_; }
  // Whether generation ends at `id`: the EOS token, or one of the eos_token_id of the model's
  // generation_config.json (else config.json), as Hugging Face's generate stops at any of them
  // (Llama-3 Instruct: <|end_of_text|>, <|eom_id|>, <|eot_id|>).
  bool is_eos(int32_t id) const;
  const std::vector<int32_t>& extra_eos_ids() const { return extra_eos_; }
  std::optional<int32_t> pad_id() const { return pad_; }
  bool add_bos_token() const { return add_bos_; }
  bool is_special(int32_t id) const;

 private:
  struct Added {
    std::string content;
    int32_t id;
    bool special;
  };
  enum class Kind { ByteLevel, Metaspace };
  enum class Pattern { Gpt2, Llama3, Qwen2 };  // how byte-level text splits into pre-tokens
  enum class Prepend { Always, First, Never };  // where Metaspace puts "▁" before a segment
  // Tokenizer::load and from_tokenizer_json, by file and section.
  void read_pretokenizers(const json::Value& tj, const json::Value& model, const std::string& path);
  void read_bpe_model(const json::Value& model, const std::string& path);
  void add_token(const std::string& content, std::optional<int32_t> id, bool special);
  void read_added_tokens(const json::Value& tj, const json::Value& cfg, const std::string& dir);
  void read_special_tokens(const json::Value& cfg, const std::string& dir, const std::string& template_bos);
  void read_extra_eos(const std::string& dir);
  void finish_setup();
  void bpe(std::string_view piece, std::vector<int32_t>* out) const;
  // Encodes one segment of plain text (no added tokens in it); `first`: it starts the text.
  void encode_plain(std::string_view text, bool first, std::vector<int32_t>* out) const;
  // BPE merges over the characters of `word` (SentencePiece-style with "▁" for spaces, or
  // byte-level characters), by rank.
  void bpe_merge(std::string_view word, std::vector<int32_t>* out) const;
  std::optional<int32_t> lookup_special(const std::string& content) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;       // vocabulary string by id ("" for holes)
  std::unordered_map<std::string, int> merge_rank_;  // "a b" -> rank
  std::vector<Added> added_;                   // longest first
  std::vector<bool> special_;                  // by id
  std::optional<int32_t> bos_, eos_, pad_;
  std::vector<int32_t> extra_eos_;
  bool add_bos_ = false;
  bool add_prefix_space_ = false;
  Kind kind_ = Kind::ByteLevel;
  Pattern pattern_ = Pattern::Gpt2;
  bool nfc_ = false;                      // the NFC normalizer (Qwen2): text between added tokens composed first
  bool ignore_merges_ = false;            // a pre-token found in the vocabulary is one token
  Prepend prepend_ = Prepend::Always;
  bool split_words_ = false;              // Metaspace(split=true): BPE per "▁"-led word
  std::vector<int32_t> byte_token_;       // id of <0xNN> by byte (-1: absent)
  std::optional<int32_t> unk_;
  int32_t size_ = 0;
  // Cache of BPE results per pre-token; guarded because encode() may be called from
  // several threads.
  mutable std::shared_ptr<std::mutex> cache_mu_ = std::make_shared<std::mutex>();
  mutable std::shared_ptr<std::unordered_map<std::string, std::vector<int32_t>>> cache_ =
      std::make_shared<std::unordered_map<std::string, std::vector<int32_t>>>();
};

// Splits text into the pre-tokens of GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Exposed for tests. Invalid UTF-8 bytes count as single "other" characters.
std::vector<std::string_view> pretokenize(std::string_view text);
// Llama-3's pattern (max_digits 3; Qwen2's with 1)
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
std::vector<std::string_view> pretokenize_llama3(std::string_view text, int max_digits = 3);

// UTF-8 helpers.
// Replaces invalid sequences by U+FFFD (maximal subpart rule, like Python's "replace").
std::string sanitize_utf8(std::string_view bytes);
// Length of the longest prefix of `bytes` that ends on a character boundary, treating an
// incomplete sequence at the end as not yet complete (the rest is held back).
size_t utf8_complete_prefix(std::string_view bytes);

// Incremental detokenizer for streaming: push ids, get text pieces that never split a
// UTF-8 character. finish() flushes what is held back (as U+FFFD if incomplete).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = true)
      : tok_(tok), skip_special_(skip_special) {}
  std::string push(int32_t id);
  std::string finish();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace kvpr
