// Decoding constrained to JSON: over a tokenizer's vocabulary, the mask of the tokens that can
// continue what has been generated so far, by the json_object recognizer (json_object.h) or a
// schema's (json_schema.h), with a cache of the masks of recent states.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "engine/constrain/json_object.h"
#include "engine/constrain/json_schema.h"

namespace kvpr {

// The tokens that may come next while generating JSON. The vocabulary is every id's bytes as
// the text shows them ("" for special tokens, which never belong to the JSON).
class JsonTokenConstraint {
 public:
  using Vocabulary = std::vector<std::string>;
  // Any JSON value (an object with o.object_only).
  JsonTokenConstraint(std::shared_ptr<const Vocabulary> vocab, const JsonConstraintOptions& o = {});
  // A JSON text valid against `schema` (json_schema.h); o's whitespace and depth apply.
  JsonTokenConstraint(std::shared_ptr<const Vocabulary> vocab, std::shared_ptr<const JsonSchema> schema,
                      const JsonConstraintOptions& o = {});

  // Sets the logits of ids in [0, valid) that cannot come next to -infinity. `end_ids` (EOS and
  // stop ids) stay only once the JSON is complete. Returns how many ids are left (0 when the
  // JSON is complete and nothing may follow but an end id the sequence does not have).
  int64_t mask(float* logits, int32_t valid, const std::vector<int32_t>& end_ids);
  // The chosen id: its bytes continue the JSON (an end id adds none).
  void advance(int32_t id);
  bool complete() const {
    return std::visit([](const auto& r) { return r.complete(); }, r_);
  }

 private:
  const std::vector<uint8_t>& allowed(int32_t valid);

  std::shared_ptr<const Vocabulary> vocab_;
  std::vector<int32_t> plain_chars_;  // per id: its characters when it is plain string text, else -1
  std::shared_ptr<const JsonSchema> schema_;
  std::variant<JsonRecognizer, SchemaRecognizer> r_;
  // Masks of recent states (JSON revisits the same states: inside strings, between members).
  std::vector<std::pair<std::string, std::vector<uint8_t>>> cache_;
  size_t next_victim_ = 0;
};

}  // namespace kvpr
