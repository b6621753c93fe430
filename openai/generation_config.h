// The sampling defaults a model's generation_config.json recommends (Qwen2.5-Instruct:
// temperature 0.7, top_p 0.8, top_k 20, repetition_penalty 1.05; Llama-3.1-Instruct:
// temperature 0.6, top_p 0.9). kvprd applies them where a request leaves a field out, as vLLM
// does with --generation-config auto; a request's own values win.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace kvpr {

struct SamplingDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k;
  bool empty() const { return !temperature && !top_p && !min_p && !repetition_penalty && !top_k; }
  std::string describe() const;  // "temperature 0.7, top_p 0.8, ..." or "none"
};

// The fields <model_dir>/generation_config.json sets (none when there is no such file; null
// or absent fields stay unset; do_sample is not consulted, as vLLM does not). Throws
// kvpr::Error naming the file and the field for a value the API would refuse in a request
// (temperature outside [0, 2], top_p outside (0, 1], min_p outside [0, 1], top_k below -1,
// repetition_penalty not > 0).
SamplingDefaults read_sampling_defaults(const std::string& model_dir);

}  // namespace kvpr
