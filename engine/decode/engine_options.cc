#include "engine/decode/engine_options.h"

#include <cctype>
#include <cmath>
#include <limits>

#include "engine/base/error.h"
#include "engine/base/json.h"
#include "engine/base/option_value.h"

namespace kvpr {

namespace {

constexpr int64_t kInt = std::numeric_limits<int>::max();
constexpr int64_t kBig = std::numeric_limits<int64_t>::max();

std::string word(bool second, const char* first_word, const char* second_word) { return second ? second_word : first_word; }

using Set = std::function<void(EngineOptions&, const std::string&)>;
using Get = std::function<std::string(const EngineOptions&)>;

}  // namespace

const std::vector<EngineOption>& engine_options() {
  static const std::vector<EngineOption> table = {
      {"max-batch", "sequences running at once per worker, at most (their KV blocks permitting) [8 on a CPU, 256 on a GPU]", false,
       [](EngineOptions& o, const std::string& v) { o.generator.max_batch = static_cast<int>(parse_option_integer("max-batch", v, 1, kInt)); },
       [](const EngineOptions& o) { return o.generator.max_batch > 0 ? std::to_string(o.generator.max_batch) : std::string(); }},
      {"block-tokens", "tokens per block of the paged KV store [16]", false,
       [](EngineOptions& o, const std::string& v) { o.generator.block_tokens = parse_option_integer("block-tokens", v, 1, 1 << 20); },
       [](const EngineOptions& o) { return std::to_string(o.generator.block_tokens); }},
      {"kv-cache",
       "the KV store per worker: bytes (40GiB, 512MiB), or a fraction of the memory it lives in (0.5: half of the "
       "host memory available for the host KV modes, of the device memory left after the weights for resident) "
       "[room for max-batch sequences of max-seq-len, at most what host-memory leaves for a store in host memory]",
       false,
       [](EngineOptions& o, const std::string& v) {
         const double x = parse_option_size("kv-cache", v);
         o.generator.kv_cache_bytes = x > 1 ? x : 0;
         o.generator.kv_cache_fraction = x > 1 ? 0 : x;
       },
       [](const EngineOptions& o) {
         const GeneratorOptions& g = o.generator;
         if (g.kv_cache_fraction > 0) return json::Value(g.kv_cache_fraction).dump();
         return g.kv_cache_bytes > 0 ? std::to_string(static_cast<int64_t>(g.kv_cache_bytes)) : std::string();
       }},
      {"host-memory",
       "host memory a worker may hold, its weights in host memory and a default-sized KV store there together "
       "(bytes: 100GiB) [kvprd: 90% of the host's available memory at start, shared evenly among its workers]",
       false,
       [](EngineOptions& o, const std::string& v) {
         o.generator.host_memory = parse_option_size("host-memory", v);
         KVPR_CHECK(o.generator.host_memory > 1, "host-memory: '", v, "' is not a size in bytes (e.g. 64GiB)");
       },
       [](const EngineOptions& o) {
         return o.generator.host_memory > 0 ? std::to_string(static_cast<int64_t>(o.generator.host_memory))
                                            : std::string();
       }},
      {"max-step-tokens", "tokens per step; a longer prompt is prefilled in chunks over several steps [8192]", false,
       [](EngineOptions& o, const std::string& v) { o.generator.max_step_tokens = parse_option_integer("max-step-tokens", v, 1, kBig); },
       [](const EngineOptions& o) { return std::to_string(o.generator.max_step_tokens); }},
      {"max-seq-len", "context length [the model's]", false,
       [](EngineOptions& o, const std::string& v) { o.generator.max_seq_len = parse_option_integer("max-seq-len", v, 0, kBig); },
       [](const EngineOptions& o) { return std::to_string(o.generator.max_seq_len); }},
      {"kv-mode",
       "resident, offload, kvpr, recompute, cpu-attn, or auto (a GPU tier within gpu-kv-budget, the rest as kvpr) "
       "[kvprd: auto on a GPU unless cuda-graphs is on, else resident; kvpr: resident]",
       false,
       [](EngineOptions& o, const std::string& v) {
         KVPR_CHECK(parse_kv_mode(v, &o.generator.kv.mode),
                    "kv-mode: expected resident, offload, kvpr, recompute, cpu-attn or auto, got '", v, "'");
         o.kv_mode_given = true;
       },
       // Unset by default, so that a worker tells "not given" (its backend's default) from resident.
       [](const EngineOptions& o) { return o.kv_mode_given ? std::string(kv_mode_name(o.generator.kv.mode)) : std::string(); }},
      {"gpu-kv-budget",
       "auto: device memory for KV: bytes (24GiB), or a fraction of the device memory free after the weights and the "
       "step's buffers (0.5); 0: none, as kvpr [0.9]",
       false,
       [](EngineOptions& o, const std::string& v) {
         KvRuntimeOptions& kv = o.generator.kv;
         const double x = v == "0" ? 0 : parse_option_size("gpu-kv-budget", v);
         kv.gpu_kv_bytes = x > 1 || x == 0 ? x : 0;
         kv.gpu_kv_fraction = x > 1 || x == 0 ? -1 : x;
       },
       [](const EngineOptions& o) {
         const KvRuntimeOptions& kv = o.generator.kv;
         if (kv.gpu_kv_fraction >= 0) return json::Value(kv.gpu_kv_fraction).dump();
         return std::to_string(static_cast<int64_t>(kv.gpu_kv_bytes));
       }},
      {"split", "kvpr, auto: the split l for every sequence [chosen by the scheduler]", false,
       [](EngineOptions& o, const std::string& v) { o.generator.kv.forced_split = parse_option_integer("split", v, 0, kBig); },
       [](const EngineOptions& o) {
         return o.generator.kv.forced_split ? std::to_string(*o.generator.kv.forced_split) : std::string();
       }},
      {"split-model", "kvpr, auto: the scheduler's model of a step, pipeline or paper [pipeline]", false,
       [](EngineOptions& o, const std::string& v) {
         o.generator.kv.split_model = parse_option_either("split-model", v, "pipeline", "paper") ? SplitModel::Paper : SplitModel::Pipeline;
       },
       [](const EngineOptions& o) { return word(o.generator.kv.split_model == SplitModel::Paper, "pipeline", "paper"); }},
      {"kv-dtype", "f32, f16, bf16, or fp8 (E4M3: half of f16's host memory and link bytes) [the weights']", false,
       [](EngineOptions& o, const std::string& v) {
         DType dt;
         KVPR_CHECK(parse_dtype(v, &dt), "kv-dtype: expected f32, f16, bf16 or fp8, got '", v, "'");
         o.generator.kv_dtype = dt;
       },
       [](const EngineOptions& o) { return o.generator.kv_dtype ? std::string(dtype_name(*o.generator.kv_dtype)) : std::string(); }},
      {"activation-cap", "tokens per sequence whose X is kept [all]", false,
       [](EngineOptions& o, const std::string& v) { o.generator.kv.activation_cap = parse_option_integer("activation-cap", v, -1, kBig); },
       [](const EngineOptions& o) { return std::to_string(o.generator.kv.activation_cap); }},
      {"profile", "a saved link profile (kvpr profile --save) [measured at start]", false,
       [](EngineOptions& o, const std::string& v) { o.profile = v; }, [](const EngineOptions& o) { return o.profile; }},
      {"host-attention-threads", "cpu-attn: host attention threads [all]", false,
       [](EngineOptions& o, const std::string& v) {
         o.generator.kv.host_attention_threads = static_cast<int>(parse_option_integer("host-attention-threads", v, 0, kInt));
       },
       [](const EngineOptions& o) { return std::to_string(o.generator.kv.host_attention_threads); }},
      {"cuda-graphs", "on or off: resident decode steps replayed as CUDA graphs [off]", true,
       [](EngineOptions& o, const std::string& v) { o.generator.cuda_graphs = !parse_option_either("cuda-graphs", v, "on", "off"); },
       [](const EngineOptions& o) { return word(!o.generator.cuda_graphs, "on", "off"); }},
      {"verify-weights",
       "on or off: after loading, read every weight back and hash it (the digest is logged and in /health); with "
       "several GPUs each worker checks the weights it received over NCCL against the first worker's [off]",
       true,
       [](EngineOptions& o, const std::string& v) { o.verify_weights = !parse_option_either("verify-weights", v, "on", "off"); },
       [](const EngineOptions& o) { return word(!o.verify_weights, "on", "off"); }},
      {"prefix-caching", "on or off: a new prompt reuses the KV blocks of running or finished sequences it starts with [on]", true,
       [](EngineOptions& o, const std::string& v) { o.generator.prefix_caching = !parse_option_either("prefix-caching", v, "on", "off"); },
       [](const EngineOptions& o) { return word(!o.generator.prefix_caching, "on", "off"); }},
      {"json-whitespace",
       "compact: structured (JSON) answers put nothing, a space, or a newline and up to 20 bytes of indentation "
       "between tokens, as llama.cpp's JSON grammars; permissive: any whitespace, up to 48 bytes in a row [compact]",
       false,
       [](EngineOptions& o, const std::string& v) {
         o.generator.permissive_json_whitespace = parse_option_either("json-whitespace", v, "compact", "permissive");
       },
       [](const EngineOptions& o) { return word(o.generator.permissive_json_whitespace, "compact", "permissive"); }},
      {"speculative-tokens", "greedy requests check up to this many tokens a step, looked up in their prompt and output [0: off]",
       false,
       [](EngineOptions& o, const std::string& v) {
         o.generator.speculative_tokens = static_cast<int>(parse_option_integer("speculative-tokens", v, 0, 64));
       },
       [](const EngineOptions& o) { return std::to_string(o.generator.speculative_tokens); }},
      {"prompt-lookup-max", "speculative decoding: longest n-gram looked up [4]", false,
       [](EngineOptions& o, const std::string& v) {
         o.generator.prompt_lookup_max = static_cast<int>(parse_option_integer("prompt-lookup-max", v, 1, kInt));
       },
       [](const EngineOptions& o) { return std::to_string(o.generator.prompt_lookup_max); }},
      {"prompt-lookup-min", "speculative decoding: shortest n-gram looked up [2]", false,
       [](EngineOptions& o, const std::string& v) {
         o.generator.prompt_lookup_min = static_cast<int>(parse_option_integer("prompt-lookup-min", v, 1, kInt));
       },
       [](const EngineOptions& o) { return std::to_string(o.generator.prompt_lookup_min); }},
      {"weights", "device, or host: layer weights in pinned host memory, streamed a layer ahead [device]", false,
       [](EngineOptions& o, const std::string& v) { o.weights_on_host = parse_option_either("weights", v, "device", "host"); },
       [](const EngineOptions& o) { return word(o.weights_on_host, "device", "host"); }},
      {"gpu-batches", "a step's sequences in this many GPU batches, each through a layer before the next [1]", false,
       [](EngineOptions& o, const std::string& v) { o.generator.kv.gpu_batches = parse_option_integer("gpu-batches", v, 1, kBig); },
       [](const EngineOptions& o) { return std::to_string(o.generator.kv.gpu_batches); }},
  };
  return table;
}

const EngineOption* find_engine_option(std::string_view name) {
  for (const auto& o : engine_options())
    if (name == o.name) return &o;
  return nullptr;
}

std::vector<std::string> engine_option_args(const EngineOptions& o) {
  static const EngineOptions defaults;
  std::vector<std::string> args;
  for (const auto& opt : engine_options()) {
    const std::string v = opt.get(o);
    if (v != opt.get(defaults)) args.insert(args.end(), {std::string("--") + opt.name, v});
  }
  return args;
}

void validate(const EngineOptions& o) {
  const GeneratorOptions& g = o.generator;
  KVPR_CHECK(g.max_batch == 0 || g.kv.gpu_batches <= g.max_batch, "gpu-batches must be in 1..max-batch (", g.max_batch,
             "), not ", g.kv.gpu_batches);
  KVPR_CHECK(g.prompt_lookup_min <= g.prompt_lookup_max, "prompt-lookup-min and prompt-lookup-max need 1 <= min <= max");
  KVPR_CHECK(!g.kv.forced_split || kv_mode_splits(g.kv.mode), "split applies to kv-mode kvpr or auto, not ", kv_mode_name(g.kv.mode));
  KVPR_CHECK(!g.cuda_graphs || g.kv.mode == KvMode::Resident,
             "cuda-graphs applies to kv-mode resident (the other modes move KV every layer), not ", kv_mode_name(g.kv.mode));
  KVPR_CHECK(!g.cuda_graphs || !o.weights_on_host, "cuda-graphs does not apply to weights host (every layer waits for its copies)");
}

}  // namespace kvpr
