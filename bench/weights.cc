// kvpr-bench weights [--preset llama-3.2-1b] [--formats bf16,int4,int8,fp8,fp4,int4+head] [--group 128] [--prompt 16]
//                    [--gen 16] [--layers N] [--backend cpu|cuda|auto] [--repeat 3] [--json FILE]
//     Batch-1 decode, resident, with the layers' matrices in each weight format, in one run (every
//     format's model held at once, measured round-robin --repeat times after a round not
//     counted, each format's median):
//     random weights, quantized round to nearest in groups of --group inputs (fp8: one scale a
//     row and group too; fp4: MXFP4's power-of-two scales a 32); the embedding and the tied head
//     stay BF16, as quantized checkpoints leave them, unless the format is named with "+head"
//     (int4+head: the head quantized too, a matrix of its own, as GPTQModel's lm_head=True stores
//     it). Per format: tokens/s, the weight bytes read per token (on the CPU the backend counts
//     each GEMM's weight as stored; on a GPU, the model's weight bytes, which a batch-1 step of a
//     tied model reads once; with +head less the embedding's, of which it reads a row) and the
//     physical bound: those bytes over the memory's rate measured in the same run, before the runs
//     and after them, the faster (the host's read rate; the device's copy rate). Ratios against
//     bf16, measured and bound.
#include "bench/commands.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/base/error.h"
#include "engine/base/json.h"
#include "engine/base/thread_pool.h"
#include "engine/model/model.h"

namespace kvpr::bench {

namespace {

struct Format {
  std::string name;
  WeightFormat format;
  bool head = false;  // "+head": the LM head quantized too
};

Format parse_format(const std::string& s) {
  WeightFormat f = WeightFormat::Dense;
  const bool head = s.ends_with("+head");
  const std::string base = head ? s.substr(0, s.size() - 5) : s;
  KVPR_CHECK((base == "bf16" && !head) || (base != "dense" && parse_weight_format(base, &f)), "--formats: unknown format '",
             s, "' (bf16, int4, int8, fp8, fp4; a quantized one with +head: the LM head too)");
  return {s, f, head};
}

}  // namespace

int cmd_weights(const Args& args) {
  const Options opt(args,
                    {"--preset", "--formats", "--group", "--prompt", "--gen", "--layers", "--backend", "--repeat", "--json"});
  const std::string preset = opt.get("--preset", "llama-3.2-1b");
  const int64_t group = opt.get_int("--group", 128);
  const int prompt = opt.get_int("--prompt", 16), gen = opt.get_int("--gen", 16);
  KVPR_CHECK(group > 0 && prompt > 0 && gen > 1, "--group and --prompt must be positive and --gen at least 2");
  std::vector<Format> formats;
  const std::string list = opt.get("--formats", "bf16,int4,fp8");
  for (size_t p = 0; p <= list.size();) {
    size_t q = list.find(',', p);
    if (q == std::string::npos) q = list.size();
    formats.push_back(parse_format(list.substr(p, q - p)));
    p = q + 1;
  }
  const std::string backend = opt.get("--backend", "cpu");
  std::string device;
  // The memory's rate, measured before the runs and after them: the bound takes the faster.
  auto memory_gbps = [&](std::string* name) {
    std::unique_ptr<Backend> be = bench_backend(backend);
    if (name) *name = be->name();
    return be->device_is_host() ? host_read_gbps(int64_t{1} << 30) : device_copy_gbps(*be, int64_t{2} << 30);
  };
  double read_gbps = memory_gbps(&device);
  const double read_gbps_before = read_gbps;
  std::fprintf(stderr, "kvpr-bench weights: %s on %s, batch 1, prompt %d, %d tokens; memory %.1f GB/s\n",
               preset.c_str(), device.c_str(), prompt, gen, read_gbps);
  // Every format's model built first, then measured round-robin --repeat times: each format's
  // median, so that a memory rate that drifts over the run (a shared host's) favours none.
  struct Run {
    Format f;
    std::unique_ptr<Backend> be;
    std::unique_ptr<Model> model;
    std::unique_ptr<KvRuntime> kv;
    std::unique_ptr<GreedyDecode> decode;
    CpuBackend* cpu = nullptr;
    double init_s = 0, bytes = 0;
    std::vector<double> ms;
  };
  const int repeat = opt.get_int("--repeat", 3);
  KVPR_CHECK(repeat > 0, "--repeat must be positive");
  std::vector<Run> all;
  const bool graphs = backend != "cpu";  // a GPU's steps as CUDA graphs: no launch gaps
  for (const Format& f : formats) {
    Run r;
    r.f = f;
    r.be = bench_backend(backend);
    r.cpu = dynamic_cast<CpuBackend*>(r.be.get());
    ModelLoadOptions lo;
    lo.random_format = f.format;
    lo.random_group = f.format == WeightFormat::Fp4 ? 32 : group;  // MXFP4's blocks are 32 wide
    lo.random_quantized_head = f.head;
    PresetSize size;
    size.layers = opt.get_int("--layers", 0);
    size.dtype = DType::BF16;
    const auto t_init = Clock::now();
    r.model = preset_model(*r.be, preset, lo, size);
    r.init_s = seconds_since(t_init);
    KvRuntimeOptions kvo;
    kvo.kv_dtype = DType::BF16;
    r.kv = r.model->make_kv_runtime(1, prompt + gen * (repeat + 1) + 4, kvo);
    r.decode = std::make_unique<GreedyDecode>(*r.be, *r.model, *r.kv, 1, prompt);
    r.decode->prefill();
    const bool g = graphs && !r.be->device_is_host();
    r.decode->step(g);  // warm: recorded,
    r.decode->step(g);  // then captured (a GPU's replays come next)
    all.push_back(std::move(r));
  }
  // Round 0 warms every format once more and is not counted (on this project's shared 2-core
  // host the first pass over freshly built models ran up to 1.8x slower than the next).
  for (int rep = 0; rep <= repeat; ++rep)
    for (Run& r : all) {
      const bool g = graphs && !r.be->device_is_host();
      const double before = r.cpu ? r.cpu->weight_bytes_read() : 0;
      const auto t0 = Clock::now();
      for (int s = 0; s < gen; ++s) r.decode->step(g);
      if (rep == 0) continue;
      r.ms.push_back(seconds_since(t0) / gen * 1e3);
      // (a GPU: the model's weights but for an untied head's embedding, of which a step reads a row)
      const ModelSpec& sp = r.model->spec();
      const double embedding =
          r.f.head ? static_cast<double>(sp.vocab_size * sp.hidden_size * dtype_size(r.model->weight_dtype())) : 0.0;
      r.bytes = r.cpu ? (r.cpu->weight_bytes_read() - before) / gen : static_cast<double>(r.model->weight_bytes()) - embedding;
    }
  const double read_gbps_after = memory_gbps(nullptr);
  read_gbps = std::max(read_gbps, read_gbps_after);
  std::fprintf(stderr, "  memory %.1f GB/s before the runs, %.1f after\n", read_gbps_before, read_gbps_after);
  json::Array runs;
  std::map<std::string, double> tps, bytes_of;
  for (Run& r : all) {
    std::vector<double> sorted = r.ms;
    std::sort(sorted.begin(), sorted.end());
    const double ms = sorted[sorted.size() / 2], bytes = r.bytes, bound_ms = bytes / (read_gbps * 1e9) * 1e3;
    const double weight_bytes = static_cast<double>(r.model->weight_bytes());
    tps[r.f.name] = 1e3 / ms;
    bytes_of[r.f.name] = bytes;
    std::fprintf(stderr, "  %-5s %8.1f ms/token (median of %d) %7.2f tokens/s, %7.1f MB read a token (weights %7.1f MB), bound %7.1f ms\n",
                 r.f.name.c_str(), ms, repeat, 1e3 / ms, bytes / 1e6, weight_bytes / 1e6, bound_ms);
    json::Array each;
    for (double v : r.ms) each.push_back(v);
    runs.push_back(json::Object{{"format", r.f.name},
                                {"head_quantized", r.f.head},
                                {"group", r.f.format == WeightFormat::Fp4 ? int64_t{32} : group},
                                {"weight_bytes", weight_bytes},
                                {"weight_bytes_read_per_token", bytes},
                                {"read_over_weight_bytes", bytes / weight_bytes},
                                {"ms_per_token", ms},
                                {"ms_per_token_each_repeat", each},
                                {"tokens_per_s", 1e3 / ms},
                                {"bound_ms", bound_ms},
                                {"over_bound", ms / bound_ms},
                                {"weights_gbps", bytes / ms / 1e6},
                                {"model_init_s", r.init_s}});
  }
  json::Value ratios(json::Object{});
  if (tps.count("bf16"))
    for (const Format& f : formats)
      if (f.name != "bf16") {
        ratios.set(f.name + "_speedup_over_bf16", tps[f.name] / tps["bf16"]);
        ratios.set(f.name + "_bound_speedup_over_bf16", bytes_of["bf16"] / bytes_of[f.name]);
      }
  for (const auto& [k, v] : ratios.as_object()) std::printf("%s: %.2f\n", k.c_str(), v.as_double());
  write_json(opt.get("--json", ""), json::Object{{"benchmark", "weights"},
                                                  {"preset", preset},
                                                  {"device", device},
                                                  {"threads", ThreadPool::global().size()},
                                                  {"batch", 1},
                                                  {"prompt", prompt},
                                                  {"gen", gen},
                                                  {"group", group},
                                                  {"repeat", repeat},
                                                  {"memory_gbps", read_gbps},
                                                  {"memory_gbps_before", read_gbps_before},
                                                  {"memory_gbps_after", read_gbps_after},
                                                  {"runs", runs},
                                                  {"ratios", ratios}});
  return 0;
}

}  // namespace kvpr::bench
