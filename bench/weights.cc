// kvpr-bench weights [--preset llama-3.2-1b] [--formats bf16,int4,int8,fp8,fp4] [--group 128] [--prompt 16]
//                    [--gen 16] [--layers N] [--backend cpu|cuda|auto] [--json FILE]
//     Batch-1 decode, resident, with the layers' matrices in each weight format, in one run:
//     random weights, quantized round to nearest in groups of --group inputs (fp8: one scale a
//     row and group too; fp4: MXFP4's power-of-two scales a 32); the embedding and the tied head stay BF16, as quantized checkpoints
//     leave them. Per format: tokens/s, the weight bytes read per token (on the CPU the backend
//     counts each GEMM's weight as stored; on a GPU, the model's weight bytes, which a batch-1 step
//     of a tied model reads once) and the physical bound: those bytes over the memory's rate
//     measured in the same run (the host's read rate; the device's copy rate). Ratios against
//     bf16, measured and bound.
#include "bench/commands.h"

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
};

Format parse_format(const std::string& s) {
  WeightFormat f = WeightFormat::Dense;
  KVPR_CHECK(s == "bf16" || (s != "dense" && parse_weight_format(s, &f)), "--formats: unknown format '", s,
             "' (bf16, int4, int8, fp8, fp4)");
  return {s, f};
}

}  // namespace

int cmd_weights(const Args& args) {
  const Options opt(args, {"--preset", "--formats", "--group", "--prompt", "--gen", "--layers", "--backend", "--json"});
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
  double read_gbps = 0;
  {
    std::unique_ptr<Backend> be = bench_backend(backend);
    device = be->name();
    read_gbps = be->device_is_host() ? host_read_gbps(int64_t{1} << 30) : device_copy_gbps(*be, int64_t{2} << 30);
  }
  std::fprintf(stderr, "kvpr-bench weights: %s on %s, batch 1, prompt %d, %d tokens; memory %.1f GB/s\n",
               preset.c_str(), device.c_str(), prompt, gen, read_gbps);
  json::Array runs;
  std::map<std::string, double> tps, bytes_of;
  for (const Format& f : formats) {
    std::unique_ptr<Backend> owned = bench_backend(backend);
    Backend& be = *owned;
    auto* cpu = dynamic_cast<CpuBackend*>(&be);
    ModelLoadOptions lo;
    lo.random_format = f.format;
    lo.random_group = f.format == WeightFormat::Fp4 ? 32 : group;  // MXFP4's blocks are 32 wide
    PresetSize size;
    size.layers = opt.get_int("--layers", 0);
    size.dtype = DType::BF16;
    const auto t_init = Clock::now();
    std::unique_ptr<Model> model = preset_model(be, preset, lo, size);
    const double init_s = seconds_since(t_init);
    KvRuntimeOptions kvo;
    kvo.kv_dtype = DType::BF16;
    auto kv = model->make_kv_runtime(1, prompt + gen + 2, kvo);
    GreedyDecode decode(be, *model, *kv, 1, prompt);
    decode.prefill();
    const bool graphs = !be.device_is_host();  // a GPU's steps as CUDA graphs: no launch gaps
    decode.step(graphs);  // warm: recorded,
    decode.step(graphs);  // then captured (a GPU's replays come next)
    const double before = cpu ? cpu->weight_bytes_read() : 0;
    const auto t0 = Clock::now();
    for (int s = 0; s < gen; ++s) decode.step(graphs);
    const double t = seconds_since(t0);
    const double bytes = cpu ? (cpu->weight_bytes_read() - before) / gen : static_cast<double>(model->weight_bytes());
    const double ms = t / gen * 1e3, bound_ms = bytes / (read_gbps * 1e9) * 1e3;
    tps[f.name] = gen / t;
    bytes_of[f.name] = bytes;
    std::fprintf(stderr, "  %-5s %8.1f ms/token %7.2f tokens/s, %7.1f MB read a token (weights %7.1f MB), bound %7.1f ms\n",
                 f.name.c_str(), ms, gen / t, bytes / 1e6, static_cast<double>(model->weight_bytes()) / 1e6, bound_ms);
    runs.push_back(json::Object{{"format", f.name},
                                {"group", f.format == WeightFormat::Fp4 ? int64_t{32} : group},
                                {"weight_bytes", static_cast<double>(model->weight_bytes())},
                                {"weight_bytes_read_per_token", bytes},
                                {"read_over_weight_bytes", bytes / static_cast<double>(model->weight_bytes())},
                                {"ms_per_token", ms},
                                {"tokens_per_s", gen / t},
                                {"bound_ms", bound_ms},
                                {"over_bound", ms / bound_ms},
                                {"weights_gbps", bytes / (t / gen) / 1e9},
                                {"model_init_s", init_s}});
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
                                                  {"memory_gbps", read_gbps},
                                                  {"runs", runs},
                                                  {"ratios", ratios}});
  return 0;
}

}  // namespace kvpr::bench
