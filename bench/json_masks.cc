// kvpr-bench json [--tokenizer DIR] [--reps N] [--json FILE]
#include "bench/commands.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include "bench/bench_common.h"
#include "bench/decode_bounds.h"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/model/demo_model.h"
#include "engine/base/error.h"
#include "engine/decode/generator.h"
#include "engine/base/json.h"
#include "engine/constrain/token_constraint.h"
#include "engine/constrain/json_schema.h"
#include "engine/model/llama_model.h"
#include "engine/model/opt_model.h"
#include "engine/kv/split_scheduler.h"
#include "engine/base/thread_pool.h"
#include "engine/text/tokenizer.h"

namespace kvpr::bench {

namespace {

struct MaskCase {
  const char* name;
  std::shared_ptr<const JsonSchema> schema;  // null: json_object
  std::string prefix;                        // text generated before the masked row
};

std::vector<MaskCase> mask_cases() {
  auto schema = [](const char* s) { return std::make_shared<const JsonSchema>(JsonSchema::compile(json::parse(s))); };
  auto person = schema(R"({
    "type": "object", "additionalProperties": false, "required": ["name", "age", "email", "tags", "role"],
    "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 200},
                   "age": {"type": "integer"}, "email": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                   "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                   "role": {"enum": ["admin", "user", "guest"]}}})");
  auto when = schema(R"({"type": "string", "format": "date-time"})");
  auto words = schema(R"({"type": "string", "pattern": "^[a-z ]+$"})");
  return {
      {"json_object: first token", nullptr, ""},
      {"json_object: inside a string", nullptr, "{\"note\": \"the quick brown"},
      {"json_object: after a value", nullptr, "{\"a\": [1, 2"},
      {"schema: first token", person, ""},
      {"schema: a closed object's key", person, "{\"name\": \"Ann\", \""},
      {"schema: inside a bounded string", person, "{\"name\": \"Ann Lee"},
      {"schema: inside an anyOf string", person, "{\"name\": \"A\", \"age\": 3, \"email\": \"a@b"},
      {"schema: inside a date-time", when, "\"2024-07-0"},
      {"schema: inside a pattern's free text", words, "\"hello wor"},
  };
}

// One case: the median time to mask a row in a fresh constraint (no state cached) and in one
// whose state is cached; its row in the result.
json::Value time_mask_case(const MaskCase& c, const Tokenizer& tok, const JsonMaskTable& vocab_facts, int reps,
                           double floor_s) {
  const int32_t V = tok.size();
  const std::vector<int32_t> ids = tok.encode(c.prefix);
  auto make = [&] {  // a new request's: an empty table, the vocabulary's facts as the worker keeps them
    auto k = std::make_unique<JsonTokenConstraint>(vocab_facts.sibling(c.schema, JsonConstraintOptions{}));
    for (int32_t id : ids) k->advance(id);
    return k;
  };
  std::vector<float> row(static_cast<size_t>(V), 0.f);
  int64_t allowed = 0;
  std::vector<double> fresh;
  for (int r = 0; r < reps; ++r) {
    auto k = make();
    std::fill(row.begin(), row.end(), 0.f);
    const auto t0 = Clock::now();
    allowed = k->mask(row.data(), V, {});
    fresh.push_back(seconds_since(t0));
  }
  std::sort(fresh.begin(), fresh.end());
  auto k = make();
  k->mask(row.data(), V, {});
  const double cached = time_median(reps, [&] { k->mask(row.data(), V, {}); });
  const double f = fresh[fresh.size() / 2];
  std::printf("%-36s %10.3f %10.3f %8lld %10.1f\n", c.name, f * 1e3, cached * 1e3, static_cast<long long>(allowed),
              f / floor_s);
  json::Value r(json::Object{});
  r.set("state", c.name);
  r.set("prefix", c.prefix);
  r.set("fresh_ms", f * 1e3);
  r.set("cached_ms", cached * 1e3);
  r.set("allowed", allowed);
  r.set("fresh_over_floor", f / floor_s);
  return r;
}

}  // namespace

// Constrained decoding's host cost: the time to mask one logits row (every id of a tokenizer's
// vocabulary checked against the JSON recognizer or a schema's) in the states a generation
// passes through, computed afresh (a state not seen before) and from the shared mask table; next
// to a floor, one pass reading every token's bytes (no check can cost less per row).
int cmd_json(const std::vector<std::string>& args) {
  Options o(args, {"--tokenizer", "--json", "--reps"});
  const std::string dir = o.get("--tokenizer", default_tokenizer_dir());
  const int reps = o.get_int("--reps", 5);
  const Tokenizer tok = Tokenizer::load(dir);
  auto vocab = std::make_shared<JsonTokenConstraint::Vocabulary>();
  for (int32_t t = 0; t < tok.size(); ++t) vocab->push_back(tok.token_bytes(t, true));
  const int32_t V = tok.size();
  size_t total_bytes = 0;
  for (const auto& b : *vocab) total_bytes += b.size();
  volatile uint64_t sink = 0;
  const double floor_s = time_median(reps, [&] {
    uint64_t h = 0;
    for (const auto& b : *vocab)
      for (char c : b) h = h * 31 + static_cast<uint8_t>(c);
    sink = h;
  });
  json::Array rows;
  std::printf("%-36s %10s %10s %8s %10s\n", "state", "fresh ms", "cached ms", "allowed", "x floor");
  const JsonMaskTable vocab_facts(vocab);
  for (const MaskCase& c : mask_cases()) rows.push_back(time_mask_case(c, tok, vocab_facts, reps, floor_s));
  std::printf("floor: one pass over %d tokens (%zu bytes): %.3f ms\n", V, total_bytes, floor_s * 1e3);
  json::Value result(json::Object{});
  result.set("benchmark", "json-mask");
  result.set("tokenizer", dir);
  result.set("vocab", V);
  result.set("vocab_bytes", static_cast<int64_t>(total_bytes));
  result.set("floor_ms", floor_s * 1e3);
  result.set("cases", std::move(rows));
  write_json(o.get("--json", ""), result);
  return 0;
}

}  // namespace kvpr::bench
