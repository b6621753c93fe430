// Decoding constrained to JSON: over a tokenizer's vocabulary, the mask of the tokens that can
// continue what has been generated so far, by the json_object recognizer (json_object.h) or a
// schema's (json_schema.h). The masks of the states met so far are kept, bit-packed, in a table
// that every sequence under the same constraint shares (JsonMaskTable).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "engine/constrain/json_object.h"
#include "engine/constrain/json_schema.h"

namespace kvpr {

// What masks read of a vocabulary, computed once per worker and shared by every table over it.
// A token is string-local when its bytes could sit inside a JSON string on their own: no quote,
// backslash or control byte, and UTF-8 from a character's start (possibly ending inside one). In a
// string between characters, with no pattern to follow (or an open object's key while any key
// may come), such a token is allowed exactly when the string has room for the characters it
// begins, whatever the grammar around the string: so those masks are unions of the precomputed
// `fits` sets, and only the other tokens are walked.
struct VocabularyIndex {
  using Mask = std::vector<uint64_t>;
  // The tokens' bytes as a trie in preorder: node 0 is the root (no byte); node i's descendants
  // are the nodes after it up to end[i]; the ids whose bytes end at node i are
  // ids[first[i], first[i + 1]). A mask walks it depth first, one recognizer per depth, and skips
  // the subtree of a byte refused: a shared prefix is fed once.
  struct Trie {
    std::vector<uint8_t> byte;
    std::vector<uint16_t> depth;
    std::vector<int32_t> end;
    std::vector<int32_t> first;
    std::vector<int32_t> ids;
    int max_depth = 0;
    size_t nodes() const { return byte.size(); }
  };
  static constexpr int kFitsMax = 64;
  explicit VocabularyIndex(const std::vector<std::string>& vocab);

  std::vector<int32_t> local_chars;  // per id: the characters a string-local token begins, else -1
  std::vector<int32_t> huge;  // ids of 65,535 bytes or more: in no trie, each fed whole
  Trie all;       // every token with bytes
  Trie local;     // the string-local ones
  Trie nonlocal;  // the others
  std::vector<Mask> fits;  // fits[k], k <= kFitsMax: the string-local ids beginning at most k characters
  std::vector<std::pair<int32_t, int32_t>> longer;  // (characters, id) of those past kFitsMax, by characters
};

// One constraint over one vocabulary, shared by the sequences under it: the vocabulary's index
// (computed once), and the masks of recent states, bit-packed (bit id % 64 of word
// id / 64), at most `budget_bytes` of them with their keys (but the 8 latest, whatever their
// size), the least recently used dropped first. Thread-safe:
// the rows of a batch take their masks in parallel.
class JsonMaskTable {
 public:
  using Vocabulary = std::vector<std::string>;
  using Mask = std::vector<uint64_t>;
  static constexpr size_t kDefaultBudgetBytes = size_t{4} << 20;

  // Any JSON value (an object with o.object_only).
  JsonMaskTable(std::shared_ptr<const Vocabulary> vocab, const JsonConstraintOptions& o = {},
                size_t budget_bytes = kDefaultBudgetBytes);
  // A JSON text valid against `schema`.
  JsonMaskTable(std::shared_ptr<const Vocabulary> vocab, std::shared_ptr<const JsonSchema> schema,
                const JsonConstraintOptions& o = {}, size_t budget_bytes = kDefaultBudgetBytes);

  // An empty table for another constraint over the same vocabulary, its facts shared with this
  // one's: `schema`'s, or any JSON value's when it is null.
  std::shared_ptr<JsonMaskTable> sibling(std::shared_ptr<const JsonSchema> schema, const JsonConstraintOptions& o) const;

  const Vocabulary& vocab() const { return *vocab_; }
  const JsonSchema* schema() const { return schema_.get(); }
  const JsonConstraintOptions& options() const { return options_; }
  const VocabularyIndex& index() const { return *vocab_index_; }

  // The mask kept for the state `key` over `valid` ids, or null. With `string_alone`, `key` is
  // a string's own state (SchemaRecognizer::string_alone) and the mask its string-local tokens'.
  std::shared_ptr<const Mask> find(const std::string& key, int32_t valid, bool string_alone = false);
  // Keeps `m` for `key` (a mask another row computed meanwhile stays) and returns the one kept.
  std::shared_ptr<const Mask> insert(const std::string& key, int32_t valid, Mask m, bool string_alone = false);
  // Masks computed and masks found, since the start.
  int64_t computed() const;
  int64_t found() const;
  size_t kept() const;

 private:
  JsonMaskTable(std::shared_ptr<const Vocabulary> vocab, std::shared_ptr<const VocabularyIndex> index,
                std::shared_ptr<const JsonSchema> schema, const JsonConstraintOptions& o, size_t budget_bytes);
  struct Entry {
    std::string key;
    std::shared_ptr<const Mask> mask;
  };
  std::shared_ptr<const Vocabulary> vocab_;
  std::shared_ptr<const JsonSchema> schema_;
  JsonConstraintOptions options_;
  std::shared_ptr<const VocabularyIndex> vocab_index_;
  size_t budget_bytes_;
  size_t bytes_ = 0;  // kept: the masks' words and their keys (each held twice)

  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;  // S or A (alone), key, "/", valid
  int64_t computed_ = 0, found_ = 0;
};

// The tokens that may come next while generating JSON, for one sequence. The vocabulary is every
// id's bytes as the text shows them ("" for special tokens, which never belong to the JSON).
class JsonTokenConstraint {
 public:
  using Vocabulary = JsonMaskTable::Vocabulary;
  // A sequence under a table other sequences may share.
  explicit JsonTokenConstraint(std::shared_ptr<JsonMaskTable> table);
  // With a table of its own: any JSON value (an object with o.object_only) ...
  JsonTokenConstraint(std::shared_ptr<const Vocabulary> vocab, const JsonConstraintOptions& o = {});
  // ... or a JSON text valid against `schema` (json_schema.h); o's whitespace and depth apply.
  JsonTokenConstraint(std::shared_ptr<const Vocabulary> vocab, std::shared_ptr<const JsonSchema> schema,
                      const JsonConstraintOptions& o = {});

  // Sets the logits of ids in [0, valid) that cannot come next to -infinity. `end_ids` (EOS and
  // stop ids) stay only once the JSON is complete. Returns how many ids are left (0 when the
  // JSON is complete and nothing may follow but an end id the sequence does not have).
  int64_t mask(float* logits, int32_t valid, const std::vector<int32_t>& end_ids);
  // Computes the mask of the state now into the table, without logits: mask() then finds it. The
  // generator calls it on a host thread while the device computes the step's logits.
  void prepare(int32_t valid) { allowed(valid); }
  // The chosen id: its bytes continue the JSON (an end id adds none).
  void advance(int32_t id);
  bool complete() const {
    return std::visit([](const auto& r) { return r.complete(); }, r_);
  }
  const JsonMaskTable& table() const { return *table_; }

 private:
  std::shared_ptr<const JsonMaskTable::Mask> allowed(int32_t valid);

  std::shared_ptr<JsonMaskTable> table_;
  std::variant<JsonRecognizer, SchemaRecognizer> r_;
};

}  // namespace kvpr
