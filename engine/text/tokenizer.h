// BPE tokenizers as Hugging Face's tokenizers runs them, from a model directory's files:
//  - tokenizer.json: its added tokens (with lstrip, rstrip, single_word and normalized), its
//    normalizer (engine/text/normalizer.h), its pre-tokenizer (engine/text/pre_tokenizer.h), its
//    BPE model (byte-level as GPT-2, Llama-3, Qwen2, Mistral-Nemo's Tekken; or SentencePiece-
//    style with "▁" for spaces and <0xNN> byte fallback, as Llama-2, Yi, Gemma), the special
//    tokens its post-processor adds and what its decoder undoes;
//  - or GPT-2's vocab.json + merges.txt (OPT), encoding as GPT-2's reference encoder does;
// with the special tokens of tokenizer_config.json, special_tokens_map.json and
// added_tokens.json. Text that is not valid UTF-8 is read with U+FFFD for its invalid bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/text/normalizer.h"
#include "engine/text/pre_tokenizer.h"

namespace kvpr {

namespace json {
class Value;
}

// Maps from strings that string_views look up without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

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
  // Off: patterns kvpr has splitters for run through Oniguruma as any other (for tests).
  void set_fast_paths(bool on) { pre_tokenizer_.set_fast_paths(on); }

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
    std::string matched;  // what is looked for: the content, normalized when `normalized`
    int32_t id;
    bool special;
    bool lstrip = false, rstrip = false, single_word = false, normalized = false;
  };
  // An added token found in a text: [begin, end) with the whitespace its lstrip/rstrip take.
  struct AddedMatch {
    size_t begin, end;
    const Added* token;  // null: plain text
  };
  enum class Kind { ByteLevel, Metaspace };  // the vocabulary's alphabet: GPT-2's bytes, or "▁"
  // Tokenizer::load and from_tokenizer_json, by file and section.
  void read_pipeline(const json::Value& tj, const std::string& path);
  void read_bpe_model(const json::Value& model, const std::string& path);
  void read_decoder(const json::Value* decoder, const std::string& path);
  void add_token(const std::string& content, std::optional<int32_t> id, bool special, const json::Value* flags = nullptr);
  void read_added_tokens(const json::Value& tj, const json::Value& cfg, const std::string& dir);
  void read_special_tokens(const json::Value& cfg, const std::string& dir, const std::string& template_bos);
  void read_extra_eos(const std::string& dir);
  void finish_setup();
  // The added tokens (normalized or not) in `text`, leftmost-longest, and the plain text between.
  std::vector<AddedMatch> split_added(std::string_view text, bool normalized) const;
  // BPE of one pre-token, in the vocabulary's alphabet.
  void bpe(std::string_view piece, std::vector<int32_t>* out) const;
  // Encodes text between added tokens: normalized, pre-tokenized, merged. `first`: it starts
  // the input.
  void encode_plain(std::string_view text, bool first, std::vector<int32_t>* out) const;
  // BPE merges over the characters of `word` by rank; characters the vocabulary lacks become
  // <0xNN> byte tokens (byte_fallback) or the unknown token.
  void bpe_merge(std::string_view word, std::vector<int32_t>* out) const;
  std::optional<int32_t> lookup_special(const std::string& content) const;

  StringMap<int32_t> vocab_;
  std::vector<std::string> id_to_token_;       // vocabulary string by id ("" for holes)
  StringMap<int> merge_rank_;  // "a b" -> rank
  std::vector<Added> added_;                   // longest first
  std::vector<bool> special_;                  // by id
  std::optional<int32_t> bos_, eos_, pad_;
  std::vector<int32_t> extra_eos_;
  bool add_bos_ = false;
  Kind kind_ = Kind::ByteLevel;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  bool gpt2_merges_ = false;              // vocab.json + merges.txt: GPT-2's reference merging
  bool ignore_merges_ = false;            // a pre-token found in the vocabulary is one token
  bool fuse_unk_ = false;                 // consecutive unknown characters are one unknown token
  bool strip_leading_space_ = false;      // the decoder drops the space "▁" put before the text
  std::vector<int32_t> byte_token_;       // id of <0xNN> by byte (-1: absent)
  std::optional<int32_t> unk_;
  int32_t size_ = 0;
  // Cache of BPE results per pre-token; guarded because encode() may be called from
  // several threads.
  mutable std::shared_ptr<std::mutex> cache_mu_ = std::make_shared<std::mutex>();
  mutable std::shared_ptr<StringMap<std::vector<int32_t>>> cache_ = std::make_shared<StringMap<std::vector<int32_t>>>();
};

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
