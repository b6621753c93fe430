// What kvpr-bench's subcommands share: option parsing, timing, the model presets with random
// weights, and the bandwidth and GEMM-rate probes the bounds divide by.
#pragma once

#include <algorithm>
#include <chrono>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/kv/block_pool.h"
#include "engine/backend/backend.h"
#include "engine/base/error.h"
#include "engine/base/json.h"
#include "engine/decode/engine_options.h"
#include "engine/kv/kv_runtime.h"
#include "engine/model/model.h"
#include "engine/model/opt_config.h"

namespace kvpr::bench {

// The bench's device: the engine's backends and GPUs (bench/device.cc), or, in kvpr-bench-emu,
// the emulated CUDA device's beside a real build (tests/simt/bench_emulated.cc), so CI runs the device checks' code
// paths the way the H200 will, from the same objects.
std::unique_ptr<Backend> bench_backend(const std::string& name, int device = 0);
std::vector<std::string> bench_gpu_bus_ids();

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median of `reps` timings of fn().
template <typename Fn>
double time_median(int reps, Fn&& fn) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    fn();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A subcommand's "--name value" options; a name not in `known` is an error.
class Options {
 public:
  Options(const std::vector<std::string>& args, std::initializer_list<const char*> known) {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      KVPR_CHECK(std::find_if(known.begin(), known.end(), [&](const char* k) { return a == k; }) != known.end(),
                 "unknown option '", a, "'");
      KVPR_CHECK(i + 1 < args.size(), a, " needs a value");
      values_[a] = args[++i];
    }
  }
  std::string get(const std::string& name, const std::string& def) const {
    auto it = values_.find(name);
    return it == values_.end() ? def : it->second;
  }
  int get_int(const std::string& name, int def) const {
    auto it = values_.find(name);
    return it == values_.end() ? def : std::stoi(it->second);
  }
  double get_double(const std::string& name, double def) const {
    auto it = values_.find(name);
    return it == values_.end() ? def : std::stod(it->second);
  }

 private:
  std::map<std::string, std::string> values_;
};

// The engine options a benchmark takes (`names`, e.g. "--kv-dtype", "--weights"), as
// engine/decode/engine_options.h has them, over `o` (the benchmark's defaults), checked.
EngineOptions engine_options_of(const Options& opt, std::initializer_list<const char*> names, EngineOptions o);

// Writes `v` to `path` unless the path is empty, whole or not at all (a reader of a benchmark
// that rewrites its JSON as it goes never sees half a file).
void write_json(const std::string& path, const json::Value& v);

// OPT shapes by name (opt-6.7b, opt-13b, opt-1.3b, opt-125m, tiny).
OptConfig preset(const std::string& name);

// What a benchmark may change of a preset; 0 keeps the preset's.
struct PresetSize {
  // The position range (--max-positions: OPT-6.7B's shapes at a context past its 2048-entry
  // position table, a long-context model of the same widths).
  int64_t max_positions = 0;
  // At most this many layers (--layers: a big preset's real widths at a size a CPU runs).
  int64_t layers = 0;
  // The random weights' dtype.
  DType dtype = DType::F16;
};

// OPT, Llama-2/3.1 and Qwen shapes (and tiny ones for tests) with random weights generated on
// the device; of `lo`, stream_weights and kv_plan apply (model.h).
std::unique_ptr<Model> preset_model(Backend& be, const std::string& name, const ModelLoadOptions& lo,
                                    const PresetSize& size = {});

// Milliseconds of one copy on stream `s`, timed with events: the median of 3 after a warm-up.
double copy_ms(Backend& be, const Tensor& dst, const Tensor& src, Stream s, const char* what);

// Device copy bandwidth (read + write bytes per second) of a same-device copy.
double device_copy_gbps(Backend& be, int64_t bytes);

// The GEMM rate at KVPR's recompute shape: K and V of `rows` tokens from their X in one
// batched GEMM (X fp32 as the runtime feeds it, weights in `wt`), median of 3 after a warm-up.
// The physical bounds' flops go over it.
double recompute_gemm_tflops(Backend& be, int64_t hidden, int64_t kv_hidden, int64_t rows, DType wt);

// A batch of random prompts decoded greedily, a step as the generator runs greedy requests:
// the logits stay on the device, argmax and log-sum-exp there, 12 bytes per sequence come back
// (pinned) and the host waits for the compute stream once.
class GreedyDecode {
 public:
  // With a paged runtime (blocks smaller than a sequence), the sequences take their blocks from
  // a BlockPool as the Generator's do: the prompts' at prefill, one sequence after another, then
  // a block each as decoding fills theirs, so later blocks interleave across the batch.
  GreedyDecode(Backend& be, Model& model, KvRuntime& kv, int batch, int prompt, uint64_t seed = 7);
  // The prompts' prefill (in groups of at most 8192 tokens) and the first token; seconds.
  double prefill();
  struct Step {
    double issue_ms = 0;  // host time to issue the step's work (everything before the wait)
    GraphStep graph;
  };
  // One decode step; `graphs`: recorded, then replayed as a CUDA graph (GraphStepScope).
  Step step(bool graphs = false);
  const std::vector<std::vector<int32_t>>& tokens() const { return seqs_; }
  int64_t context() const { return static_cast<int64_t>(seqs_.front().size()); }  // tokens per sequence
  int batch() const { return batch_; }

 private:
  Backend& be_;
  Model& model_;
  KvRuntime& kv_;
  int batch_, prompt_;
  int32_t valid_;  // ids a tokenizer produces: GPT-2's 50257 for OPT (whose embedding is padded to 50272)
  std::vector<std::vector<int32_t>> seqs_;
  std::unique_ptr<BlockPool> pool_;  // paged runtimes
  // Sequence b's chunk of `count` tokens at `past`, its blocks taken first when paged.
  ForwardChunk chunk(int b, const int32_t* tokens, int64_t count, int64_t past);
  Tensor ids_dev_, stats_dev_, ids_host_, stats_host_;
};

// The host memory's read rate (bytes per second) with the global pool's threads: a sum over
// `bytes`, the median of 3 after a warm-up. Decode at small batch on the CPU reads its weights
// at this rate at best.
double host_read_gbps(int64_t bytes);

// The host's memcpy traffic rate (bytes read + written per second) with the global pool's threads.
double host_copy_gbps(int64_t bytes);

}  // namespace kvpr::bench
