// kvpr-bench decode [--preset opt-6.7b|opt-13b|opt-1.3b|tiny|llama-2-7b|llama-2-13b|llama-2-70b|llama-3.1-8b|
//                      llama-tiny|qwen2.5-7b|qwen3-8b|qwen3-0.6b|qwen3-tiny]
//                     [--batch B] [--prompt P] [--gen N]
//                     [--modes resident,resident+graphs,offload,kvpr,recompute,cpu-attn,auto:F] [--backend auto|cpu|cuda]
//                     (a mode as MODE@B: its KV store paged in blocks of B tokens, taken from a block pool as
//                     the server's are; without @: one block per sequence, the contiguous layout;
//                     auto:F: kv mode auto with a GPU KV budget of F (0..1) of the batch's K and V)
//                     [--kv-dtype f16] [--weights device|host] [--gpu-batches N] [--emulate-link-gbps G]
//                     [--host-attention-threads N]
//                     [--peer HF.json] [--json FILE] [--svg FILE] [--trace-dir DIR] [--max-positions N]
//                     [--layers N] [--repeat R] [--budget-svg FILE] [--weight-format dense|int4|int8|fp8|fp4 [--group G]]
//     (--max-positions: the preset's position range, for contexts past OPT's 2048 positions;
//     --layers: the preset's first N layers, its real widths at a size a CPU runs;
//     --repeat: the list of modes run R times over, interleaved, each mode's step time the
//     median of its R runs: ratios that hold on a machine whose speed drifts;
//     --budget-svg: ms/step against the GPU KV budget, auto:F's curve beside kvpr, offload and
//     resident; --weight-format: the layers' matrices quantized round to nearest, a scale a row
//     and group of --group inputs (0: a row), kept quantized: with --weights host the link moves
//     their bytes.)
//     Every KV mode side by side in one run on one model with random weights generated on the
//     device: decode ms per step, tokens/s, split per step, bytes over the link per step, busy
//     fraction of the compute stream, and each mode's bound from the measured profile.
//     resident+graphs is resident with its decode steps replayed as CUDA graphs (GPU default).
//     --weights host streams the layers' weights from pinned host memory in every mode (no graphs).
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
#include "engine/decode/engine_options.h"
#include "engine/decode/generator.h"
#include "engine/base/json.h"
#include "engine/constrain/json_object.h"
#include "engine/constrain/json_schema.h"
#include "engine/model/llama_model.h"
#include "engine/model/opt_model.h"
#include "engine/kv/profiler.h"
#include "engine/kv/split_scheduler.h"
#include "engine/decode/sampling.h"
#include "engine/base/thread_pool.h"
#include "engine/text/tokenizer.h"

namespace kvpr::bench {

namespace {

struct ModeResult {
  json::Value json;
  std::vector<std::vector<int32_t>> tokens;
  double ms_per_step = 0;
};

// Two more steps with the tracer on: the trace file (when `trace_path` is given) and the compute
// stream's busy fraction and ops per step.
struct TracedSteps {
  double compute_busy_fraction = 0, compute_ops_per_step = 0;
};
template <typename StepFn>
TracedSteps trace_two_steps(Backend& be, StepFn&& step, const std::string& trace_path) {
  Tracer tracer;
  be.synchronize();
  be.set_tracer(&tracer);
  const double t_start = tracer.now_us();
  step();
  step();
  be.synchronize();
  const double t_end = tracer.now_us();
  be.set_tracer(nullptr);
  double busy_us = 0;
  int64_t compute_ops = 0;
  json::Value doc = tracer.to_json();
  std::string compute_tid;
  for (const auto& e : doc.find("traceEvents")->as_array())
    if (e.find("name")->as_string() == "thread_name" && e.find("args")->find("name")->as_string() == "compute")
      compute_tid = std::to_string(e.find("tid")->as_int());
  for (const auto& e : doc.find("traceEvents")->as_array())
    if (e.find("ph")->as_string() == "X" && std::to_string(e.find("tid")->as_int()) == compute_tid) {
      busy_us += e.find("dur")->as_double();
      ++compute_ops;
    }
  if (!trace_path.empty()) tracer.write(trace_path);
  return {std::min(1.0, busy_us / std::max(1.0, t_end - t_start)), static_cast<double>(compute_ops) / 2.0};
}

// Tokens of KV each sequence of a mode's run holds: the prompt, the new tokens and two spare.
int64_t kv_capacity(int prompt, int gen) { return static_cast<int64_t>(prompt) + gen + 2; }

// The KV store of a run: batch sequences of kv_capacity tokens, in one block each (block_tokens 0)
// or in blocks of block_tokens.
KvLayout run_layout(int batch, int prompt, int gen, int64_t block_tokens) {
  const int64_t cap = kv_capacity(prompt, gen);
  if (block_tokens <= 0 || block_tokens >= cap) return KvLayout::slots(batch, cap);
  KvLayout l{0, block_tokens, cap};
  l.blocks = batch * l.blocks_for(cap);
  return l;
}

// One decode step's figures in the JSON (`graph`: the step's graph outcome, with CUDA graphs).
json::Value step_record(const StepStats& st, double ms, double issue_ms, const char* graph, bool tiers) {
  json::Value o(json::Object{});
  o.set("ms", ms);
  o.set("host_issue_ms", issue_ms);
  if (graph) o.set("graph", graph);
  o.set("split", st.split_total);
  o.set("split_source", st.split_source);
  o.set("h2d_bytes", st.h2d_bytes);
  o.set("d2h_bytes", st.d2h_bytes);
  if (tiers) {
    o.set("resident_tokens", st.resident_tokens);
    o.set("staged_tokens", st.staged_tokens);
  }
  return o;
}

// device_share: auto's GPU KV budget as a share of the run's K and V (every block's); < 0: the
// options' own budget.
ModeResult run_mode(Backend& be, Model& model, KvMode mode, bool graphs, const KvRuntimeOptions& base, int batch,
                    int prompt, int gen, int64_t block_tokens, double device_share, const std::string& trace_path) {
  KvRuntimeOptions o = base;
  o.mode = mode;
  const KvLayout layout = run_layout(batch, prompt, gen, block_tokens);
  if (device_share >= 0) {
    o.gpu_kv_fraction = -1;
    o.gpu_kv_bytes = device_share * static_cast<double>(layout.blocks) *
                     KvRuntime::device_block_bytes(model.kv_shape(), layout, o);
  }
  auto kv = model.make_kv_runtime(layout, o);
  GreedyDecode dec(be, model, *kv, batch, prompt);
  const double prefill_s = dec.prefill();
  // Host time to issue a step's work: when it approaches the step time, the step is bound by
  // launches on the host, not by the device (the case for graphs).
  std::vector<double> issue_ms;
  std::vector<GraphOutcome> outcomes;
  std::string capture_error;  // why CUDA refused to capture a step, if it did
  auto step = [&] {
    const GreedyDecode::Step st = dec.step(graphs);
    outcomes.push_back(st.graph.outcome);
    if (capture_error.empty()) capture_error = st.graph.capture_error;
    issue_ms.push_back(st.issue_ms);
  };
  json::Array steps;
  std::vector<double> ms;
  double h2d = 0, d2h = 0, resident = 0, staged = 0;
  for (int s = 0; s < gen; ++s) {
    auto t0 = Clock::now();
    step();
    ms.push_back(seconds_since(t0) * 1e3);
    const StepStats& st = kv->last_step();
    steps.push_back(step_record(st, ms.back(), issue_ms.back(), graphs ? graph_outcome_name(outcomes.back()) : nullptr,
                                kv->device_tier() != nullptr));
    if (kv->device_tier()) {
      resident += static_cast<double>(st.resident_tokens);
      staged += static_cast<double>(st.staged_tokens);
    }
    h2d += static_cast<double>(st.h2d_bytes);
    d2h += static_cast<double>(st.d2h_bytes);
  }
  const TracedSteps traced = trace_two_steps(be, step, trace_path);

  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  for (double v : ms) mean += v;
  mean /= std::max<size_t>(1, ms.size());
  ModeResult r;
  r.ms_per_step = sorted[sorted.size() / 2];
  r.tokens = dec.tokens();
  json::Value j(json::Object{});
  j.set("mode", std::string(kv_mode_name(mode)) + (graphs ? "+graphs" : ""));
  j.set("cuda_graphs", graphs);
  if (graphs) {
    j.set("graph_replayed_steps",
          static_cast<int64_t>(std::count(outcomes.begin(), outcomes.begin() + gen, GraphOutcome::Replayed)));
    if (!capture_error.empty()) j.set("graph_capture_error", capture_error);
  }
  j.set("prefill_s", prefill_s);
  j.set("decode_ms_per_step_median", r.ms_per_step);
  j.set("decode_ms_per_step_mean", mean);
  j.set("decode_tokens_per_s", batch / (r.ms_per_step / 1e3));
  j.set("h2d_bytes_per_step", h2d / gen);
  j.set("d2h_bytes_per_step", d2h / gen);
  j.set("compute_busy_fraction", traced.compute_busy_fraction);
  std::vector<double> issue_sorted(issue_ms.begin(), issue_ms.begin() + gen);  // the untraced steps
  std::sort(issue_sorted.begin(), issue_sorted.end());
  j.set("host_issue_ms_per_step_median", issue_sorted[issue_sorted.size() / 2]);
  j.set("compute_ops_per_step", traced.compute_ops_per_step);  // ops and copies on the compute stream
  j.set("host_bytes_per_token", kv->host_bytes_per_token());
  if (kv->device_tier()) {
    j.set("device_tier_bytes", kv->device_tier_bytes());
    j.set("resident_tokens_per_step", resident / gen);  // cached tokens read in place, summed over the batch
    j.set("staged_tokens_per_step", staged / gen);
  }
  j.set("steps", std::move(steps));
  if (!trace_path.empty()) j.set("trace", trace_path);
  r.json = std::move(j);
  return r;
}

std::string svg_chart(const json::Value& result) {
  // Horizontal bars: decode ms/step per mode (and the peer), with the bound as a tick.
  struct Bar {
    std::string label;
    double ms, bound;
  };
  std::vector<Bar> bars;
  for (const auto& m : result.find("modes")->as_array())
    bars.push_back({m.find("mode")->as_string(), m.find("decode_ms_per_step_median")->as_double(),
                    m.find("bound_ms") ? m.find("bound_ms")->as_double() : 0});
  if (const json::Value* p = result.find("peer"); p && p->find("decode_ms_per_step"))
    bars.push_back({"HF offloaded", p->find("decode_ms_per_step")->as_double(), 0});
  double mx = 1e-9;
  for (const auto& b : bars) mx = std::max({mx, b.ms, b.bound});
  const int W = 760, left = 130, bar_h = 26, top = 50;
  const int H = top + static_cast<int>(bars.size()) * (bar_h + 12) + 40;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"13\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::string title = "decode ms/step (lower is better): " + result.find("title")->as_string();
  std::string esc;
  for (char ch : title) esc += ch == '&' ? std::string("&amp;") : ch == '<' ? std::string("&lt;") : std::string(1, ch);
  o << "<text x=\"10\" y=\"24\" font-size=\"15\">" << esc << "</text>\n";
  const double scale = (W - left - 90) / mx;
  for (size_t i = 0; i < bars.size(); ++i) {
    int y = top + static_cast<int>(i) * (bar_h + 12);
    int w = std::max(1, static_cast<int>(bars[i].ms * scale));
    o << "<text x=\"10\" y=\"" << y + 18 << "\">" << bars[i].label << "</text>\n";
    o << "<rect x=\"" << left << "\" y=\"" << y << "\" width=\"" << w << "\" height=\"" << bar_h
      << "\" fill=\"" << (bars[i].label == "kvpr" ? "#d9534f" : "#5b8def") << "\"/>\n";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f ms", bars[i].ms);
    o << "<text x=\"" << left + w + 6 << "\" y=\"" << y + 18 << "\">" << buf << "</text>\n";
    if (bars[i].bound > 0) {
      int bx = left + static_cast<int>(bars[i].bound * scale);
      o << "<line x1=\"" << bx << "\" y1=\"" << y - 3 << "\" x2=\"" << bx << "\" y2=\"" << y + bar_h + 3
        << "\" stroke=\"black\" stroke-width=\"2\"/>\n";
    }
  }
  o << "<text x=\"10\" y=\"" << H - 12 << "\" font-size=\"11\">black tick: physical bound (bytes over the measured "
       "bandwidths, flops over the measured GEMM rate; bench/decode_bounds.h)</text>\n</svg>\n";
  return o.str();
}

// One decode benchmark: its settings, the machine's measured rates, and every mode's run.
class DecodeRun {
 public:
  explicit DecodeRun(const std::vector<std::string>& args)
      : opt_(args, {"--preset", "--backend", "--batch", "--prompt", "--gen", "--modes", "--kv-dtype", "--emulate-link-gbps",
                    "--weights", "--gpu-batches", "--host-attention-threads", "--peer", "--probe-mib", "--json", "--svg",
                    "--trace-dir", "--max-positions", "--layers", "--repeat", "--budget-svg", "--weight-format", "--group"}) {
    preset_ = opt_.get("--preset", "opt-6.7b");
    batch_ = opt_.get_int("--batch", 32);
    prompt_ = opt_.get_int("--prompt", 1024);
    gen_ = opt_.get_int("--gen", 32);
    KVPR_CHECK(batch_ > 0 && prompt_ > 0 && gen_ > 1, "batch and prompt must be positive and gen at least 2");
    EngineOptions defaults;  // the engine's table, with this bench's defaults
    defaults.generator.kv_dtype = DType::F16;
    defaults.generator.max_batch = batch_;
    engine_ = engine_options_of(opt_, {"--kv-dtype", "--weights", "--gpu-batches", "--host-attention-threads"}, defaults);
    be_ = bench_backend(opt_.get("--backend", "auto"));
    parse_modes();
    if (const double link = opt_.get_double("--emulate-link-gbps", 0); link > 0) {
      auto* cpu = dynamic_cast<CpuBackend*>(be_.get());
      KVPR_CHECK(cpu, "--emulate-link-gbps is for the cpu backend");
      cpu->set_emulated_link_gbps(link);
    }
  }

  int run() {
    std::fprintf(stderr, "kvpr-bench decode: %s on %s, batch %d, prompt %d, %d new tokens, weights on the %s\n",
                 preset_.c_str(), be_->name().c_str(), batch_, prompt_, gen_, engine_.weights_on_host ? "host" : "device");
    const auto t_init = Clock::now();
    PresetSize size;
    size.max_positions = opt_.get_int("--max-positions", 0);
    size.layers = opt_.get_int("--layers", 0);
    KVPR_CHECK(size.max_positions >= 0 && size.layers >= 0, "--max-positions and --layers must not be negative");
    ModelLoadOptions lo;
    lo.stream_weights = engine_.weights_on_host;
    KVPR_CHECK(parse_weight_format(opt_.get("--weight-format", "dense"), &lo.random_format),
               "--weight-format must be dense, int4, int8, fp8 or fp4");
    lo.random_group = opt_.get_int("--group", 128);
    lo.kv_plan = [this](const ModelSpec& spec, DType, const Backend&, double) { return largest_kv_plan(spec); };
    model_ = preset_model(*be_, preset_, lo, size);
    const double init_s = seconds_since(t_init);
    measure_machine();
    json::Value header = header_json(init_s);
    // The JSON is rewritten after every mode ("complete": false until the last), so a run cut
    // short keeps what it measured.
    json::Array modes = run_modes([&](const json::Array& done) { write_json(opt_.get("--json", ""), result_of(header, done, false)); });
    const json::Value result = result_of(header, modes, true);
    print_table(result);
    write_json(opt_.get("--json", ""), result);
    if (const std::string svg = opt_.get("--svg", ""); !svg.empty()) std::ofstream(svg) << svg_chart(result);
    if (const std::string svg = opt_.get("--budget-svg", ""); !svg.empty()) std::ofstream(svg) << budget_chart(result);
    return 0;
  }

 private:
  struct Variant {
    KvMode mode;
    bool graphs;  // resident+graphs: resident with decode steps as CUDA graphs; by default on a GPU only
    int64_t block_tokens = 0;  // MODE@B: paged in blocks of B tokens
    std::string name;          // as given
    double device_share = -1;  // auto:F
  };

  DType kv_dtype() const { return *engine_.generator.kv_dtype; }

  // The modes run one after another, each with its own KV cache of batch x (prompt + gen + 2)
  // tokens: the largest of them is what the host must hold next to the weights.
  KvPlan largest_kv_plan(const ModelSpec& spec) const {
    const KvShape shape = kv_shape(spec);
    KvPlan best;
    double best_bytes = -1;
    for (const auto& v : modes_) {
      KvPlan p;
      p.layout = run_layout(batch_, prompt_, gen_, v.block_tokens);
      p.kv = engine_.generator.kv;
      p.kv.mode = v.mode;
      p.kv.kv_dtype = kv_dtype();
      const double bytes = KvRuntime::host_store_bytes(*be_, shape, p);
      if (bytes > best_bytes) best = p, best_bytes = bytes;
    }
    return best;
  }

  void parse_modes() {
    const bool host = be_->device_is_host() || engine_.weights_on_host;
    const std::string arg = opt_.get("--modes", host ? "resident,offload,kvpr,recompute,cpu-attn"
                                                     : "resident,resident+graphs,offload,kvpr,recompute,cpu-attn");
    for (size_t p = 0; p <= arg.size();) {
      size_t q = arg.find(',', p);
      if (q == std::string::npos) q = arg.size();
      const std::string given = arg.substr(p, q - p);
      std::string name = given;
      int64_t block_tokens = 0;
      if (const size_t at = name.find('@'); at != std::string::npos) {
        block_tokens = parse_option_integer("--modes block tokens", name.substr(at + 1), 1, 1 << 20);
        name.resize(at);
      }
      const bool graphs = name == "resident+graphs";
      if (graphs) name = "resident";
      double share = -1;
      if (name.rfind("auto:", 0) == 0) {
        share = parse_option_number("--modes auto budget", name.substr(5));
        KVPR_CHECK(share >= 0 && share <= 1, "--modes: auto:F takes a share of the batch's KV in [0, 1], not ", share);
        name = "auto";
      }
      KVPR_CHECK(!(graphs && engine_.weights_on_host), "resident+graphs does not apply to --weights host");
      KvMode m;
      KVPR_CHECK(parse_kv_mode(name, &m), "unknown mode '", arg.substr(p, q - p), "'");
      modes_.push_back({m, graphs, block_tokens, given, share});
      p = q + 1;
    }
  }

  // The profile the scheduler uses, measured on this machine now, and the rates the bounds take:
  // device and host memory copies, the recompute GEMM.
  void measure_machine() {
    ProfileOptions po;
    // Bandwidth probes: big enough to reach the link's and the memory's plateau.
    const int64_t probe_mib = opt_.get_int("--probe-mib", be_->device_is_host() ? 128 : 2048);
    KVPR_CHECK(probe_mib > 0, "--probe-mib must be positive");
    po.transfer_bytes = std::max<int64_t>(1, probe_mib / (be_->device_is_host() ? 2 : 8)) << 20;
    // Recompute timed up to the rows this run can recompute in a step (all its tokens), and
    // one size past them: two sizes at least, for the fit.
    const int64_t most_rows = static_cast<int64_t>(batch_) * kv_capacity(prompt_, gen_);
    while (po.rows.size() > 2 && po.rows[po.rows.size() - 2] >= most_rows) po.rows.pop_back();
    prof_ = profile_backend(*be_, *model_, model_->kv_shape(), kv_dtype(), po);
    hbm_ = device_copy_gbps(*be_, probe_mib << 20);
    host_bw_ = host_copy_gbps(256ll << 20);
    gemm_rows_ = std::min<int64_t>(4096, static_cast<int64_t>(batch_) * prompt_);
    gemm_tflops_ = recompute_gemm_tflops(*be_, model_->spec().hidden_size, model_->spec().kv_hidden(), gemm_rows_,
                                         model_->weight_dtype());
    std::fprintf(stderr, "profile: H2D %.2f GB/s (alone %.2f), D2H %.2f GB/s, recompute %.2f us + %.4f us/token; "
                 "device copy %.1f GB/s, host copy %.1f GB/s, recompute GEMM %.1f TFLOP/s at %lld rows\n", prof_.h2d_gbps,
                 prof_.h2d_alone_gbps, prof_.d2h_gbps, prof_.recompute_fixed_s * 1e6, prof_.recompute_per_row_s * 1e6, hbm_,
                 host_bw_, gemm_tflops_, static_cast<long long>(gemm_rows_));
  }

  double streamed_bytes() const {
    return engine_.weights_on_host ? static_cast<double>(model_->weight_stream()->host_bytes()) : 0;
  }

  json::Value header_json(double init_s) const {
    char title[160];
    const std::string layers = opt_.get_int("--layers", 0) > 0 ? " (" + std::to_string(model_->spec().num_layers) + " layers)" : "";
    const std::string format = opt_.get("--weight-format", "dense");
    std::snprintf(title, sizeof title, "%s%s, batch %d, prompt %d, %d tokens, %s%s%s", preset_.c_str(), layers.c_str(),
                  batch_, prompt_, gen_, be_->name().c_str(), engine_.weights_on_host ? ", weights streamed from host" : "",
                  format == "dense" ? "" : (", " + format + " weights").c_str());
    return json::Object{{"title", title},
                        {"benchmark", "decode"},
                        {"device", be_->name()},
                        {"preset", preset_},
                        {"layers", model_->spec().num_layers},
                        {"batch", batch_},
                        {"prompt", prompt_},
                        {"gen", gen_},
                        {"kv_dtype", dtype_name(kv_dtype())},
                        {"weight_bytes", static_cast<int64_t>(model_->weight_bytes())},
                        {"weights", engine_.weights_on_host ? "host" : "device"},
                        {"weight_format", opt_.get("--weight-format", "dense")},
                        {"weight_group", opt_.get_int("--group", 128)},
                        {"gpu_batches", engine_.generator.kv.gpu_batches},
                        {"streamed_weight_bytes", streamed_bytes()},
                        {"device_weight_bytes", static_cast<int64_t>(model_->device_weight_bytes())},
                        {"model_init_s", init_s},
                        {"profile", prof_.to_json()},
                        {"device_copy_gbps", hbm_},
                        {"host_copy_gbps", host_bw_},
                        {"recompute_gemm_tflops", gemm_tflops_}};
  }

  // The result of the modes run so far: the header, their bounds and the ratios between them.
  json::Value result_of(const json::Value& header, json::Array modes, bool complete) {
    json::Value result = header;
    add_bounds(modes, result);
    result.set("modes", std::move(modes));
    result.set("ratios", ratios_json(result));
    result.set("complete", complete);
    return result;
  }

  // Every mode on the same model and prompts; each one's tokens compared with the first mode's;
  // `progress` gets the modes done after each one.
  json::Array run_modes(const std::function<void(const json::Array&)>& progress) {
    KvRuntimeOptions base = engine_.generator.kv;
    base.kv_dtype = kv_dtype();
    base.profile = prof_;
    base.adapt = true;
    const std::string trace_dir = opt_.get("--trace-dir", "");
    json::Array out;
    std::vector<std::vector<int32_t>> ref_tokens;
    const int repeat = opt_.get_int("--repeat", 1);
    KVPR_CHECK(repeat >= 1 && repeat <= 100, "--repeat must be in 1..100");
    std::map<std::string, std::vector<double>> runs;
    for (int round = 0; round < repeat; ++round)
    for (const auto& [m, graphs, block_tokens, given, share] : modes_) {
      const std::string name = given;
      const std::string trace = trace_dir.empty() ? "" : trace_dir + "/trace-" + name + ".json";
      std::fprintf(stderr, "  %-15s ...", name.c_str());
      ModeResult r = run_mode(*be_, *model_, m, graphs, base, batch_, prompt_, gen_, block_tokens, share, trace);
      if (share >= 0) r.json.set("gpu_kv_budget_share", share);
      r.json.set("mode", name);
      r.json.set("block_tokens", block_tokens > 0 ? block_tokens : kv_capacity(prompt_, gen_));
      std::fprintf(stderr, " %8.2f ms/step\n", r.ms_per_step);
      if (m == KvMode::Resident && (resident_ms_ < 0 || r.ms_per_step < resident_ms_)) {
        resident_ms_ = r.ms_per_step;
        resident_busy_ms_ = r.ms_per_step * r.json.find("compute_busy_fraction")->as_double();
      }
      if (ref_tokens.empty()) ref_tokens = r.tokens;
      int64_t same = 0, total = 0;
      for (size_t b = 0; b < r.tokens.size(); ++b)
        for (size_t t = prompt_; t < r.tokens[b].size() && t < ref_tokens[b].size(); ++t, ++total)
          same += r.tokens[b][t] == ref_tokens[b][t];
      r.json.set("tokens_equal_to_first_mode", total ? static_cast<double>(same) / total : 1.0);
      std::vector<double>& v = runs[name];
      v.push_back(r.ms_per_step);
      std::sort(v.begin(), v.end());
      ms_of_[name] = v[v.size() / 2];  // the median of its rounds so far
      if (repeat > 1) r.json.set("round", round);
      out.push_back(std::move(r.json));
      progress(out);
    }
    return out;
  }

  // Two bounds per mode (bench/decode_bounds.h): physical, from the measured bandwidths and GEMM
  // rate, and the model's, from this code's profile and the measured resident step (with
  // streamed weights the resident step waits for them, so its compute stream's busy time).
  void add_bounds(json::Array& modes, json::Value& result) const {
    const ModelSpec& c = model_->spec();
    const double es = static_cast<double>(dtype_size(kv_dtype()));
    DecodeShape shape;
    shape.layers = static_cast<double>(c.num_layers);
    shape.cached_tokens = static_cast<double>(batch_) * (prompt_ + gen_ / 2.0);  // mean cached tokens per layer
    for (int64_t w : c.windows)  // a sliding layer reads its window of each sequence (its first query's)
      shape.layer_tokens.push_back(static_cast<double>(batch_) *
                                   (w > 0 ? std::min<double>(prompt_ + gen_ / 2.0, static_cast<double>(w - 1)) : prompt_ + gen_ / 2.0));
    shape.kv_bytes = 2.0 * c.kv_hidden() * es;  // K+V: fewer heads with GQA
    shape.x_bytes = c.hidden_size * es;
    shape.recompute_flops = 4.0 * c.hidden_size * c.kv_hidden();
    shape.weight_bytes = static_cast<double>(model_->weight_bytes());
    shape.streamed_weight_bytes = streamed_bytes();
    shape.gpu_batches = engine_.generator.kv.gpu_batches;
    Measured measured;
    measured.device_gbps = hbm_;
    measured.h2d_alone_gbps = prof_.h2d_alone_gbps;
    measured.h2d_gbps = prof_.h2d_gbps;
    measured.host_gbps = host_bw_;
    measured.gemm_tflops = gemm_tflops_;
    measured.recompute_fixed_s = prof_.recompute_fixed_s;
    measured.recompute_per_row_s = prof_.recompute_per_row_s;
    const double dev_ms = engine_.weights_on_host ? resident_busy_ms_ : resident_ms_;
    measured.resident_step_s = dev_ms > 0 ? dev_ms / 1e3 : 0;
    for (auto& mj : modes) {
      std::string mode = mj.find("mode")->as_string();
      mode = mode.substr(0, mode.find('@'));  // a paged run has its contiguous twin's bound
      DecodeShape at = shape;
      if (const json::Value* f = mj.find("gpu_kv_budget_share")) {
        // The best allocation at the budget: the tokens it holds (a share of every sequence's
        // capacity), read in place; the bound of auto with the options' budget is not known.
        mode = "auto";
        at.device_tokens = f->as_double() * static_cast<double>(batch_) * static_cast<double>(kv_capacity(prompt_, gen_));
      }
      const Bound b = decode_bound(mode, at, measured);
      const double ms = mj.find("decode_ms_per_step_median")->as_double();
      mj.set("bound_ms", b.physical_s * 1e3);  // physical
      mj.set("model_bound_ms", b.model_s * 1e3);
      mj.set("over_bound", ms / (b.physical_s * 1e3));
      mj.set("over_model_bound", ms / (b.model_s * 1e3));
    }
    if (!shape.layer_tokens.empty()) {
      // Sliding layers: what the step's K/V would be were every layer full, next to what each
      // mode moved (the link bytes of sliding layers are their windows').
      const double full = shape.layers * shape.cached_tokens * shape.kv_bytes;
      result.set("kv_bytes_per_step_every_layer_full", full);
      result.set("kv_bytes_per_step_sliding", shape.over_layers([&](double t) { return t * shape.kv_bytes; }));
      for (auto& mj : modes)
        mj.set("h2d_share_of_every_layer_full",
               (mj.find("h2d_bytes_per_step")->as_double() - shape.streamed_weight_bytes) / full);
    }
    const Bound kvpr_bound = decode_bound("kvpr", shape, measured);
    result.set("kvpr_best_split_from_profile", kvpr_bound.model_split);
    result.set("kvpr_best_split_physical", kvpr_bound.physical_split);
  }

  json::Value ratios_json(json::Value& result) {
    json::Value ratios(json::Object{});
    auto has = [&](const char* m) { return ms_of_.count(m) > 0; };
    if (has("kvpr") && has("offload")) ratios.set("kvpr_speedup_over_offload", ms_of_["offload"] / ms_of_["kvpr"]);
    if (has("kvpr") && has("cpu-attn")) ratios.set("kvpr_speedup_over_cpu_attn", ms_of_["cpu-attn"] / ms_of_["kvpr"]);
    // auto at each budget against the best fixed mode (resident only where the batch's K and V
    // fit the budget): > 1 is slower.
    for (const auto& v : modes_)
      if (v.device_share >= 0 && has(v.name.c_str())) {
        double best = 1e300;
        for (const auto& w : modes_)
          if (w.device_share < 0 && has(w.name.c_str()) &&
              (w.mode == KvMode::Offload || w.mode == KvMode::Kvpr || (w.mode == KvMode::Resident && v.device_share >= 1)))
            best = std::min(best, ms_of_[w.name]);
        if (best < 1e300) ratios.set(v.name + "_over_best_fixed_mode", ms_of_[v.name] / best);
      }
    if (has("resident") && has("resident+graphs"))
      ratios.set("resident_graphs_speedup", ms_of_["resident"] / ms_of_["resident+graphs"]);
    // Paged against contiguous, mode by mode: the contiguous step time over the paged one (1.0:
    // as fast; 0.97: 3% slower).
    for (const auto& v : modes_)
      if (v.block_tokens > 0) {
        const std::string twin = v.name.substr(0, v.name.find('@'));
        if (has(twin.c_str())) ratios.set(v.name + "_speed_over_contiguous", ms_of_[twin] / ms_of_[v.name]);
      }
    if (const std::string peer_file = opt_.get("--peer", ""); !peer_file.empty()) {
      json::Value peer = json::parse_file(peer_file);
      result.set("peer", peer);
      if (const json::Value* p = peer.find("decode_ms_per_step"); p && has("kvpr"))
        ratios.set("kvpr_speedup_over_hf_offloaded", p->as_double() / ms_of_["kvpr"]);
    }
    return ratios;
  }

  // ms/step against the GPU KV budget (a share of the batch's K and V): auto:F's points and the
  // physical bound of the best allocation at each, kvpr and offload as lines (the budget does
  // not apply to them), resident's point at 1 (where the whole KV fits).
  std::string budget_chart(const json::Value& result) const {
    struct Point {
      double share, ms, bound;
    };
    std::vector<Point> curve;
    std::map<std::string, double> bound_of;
    for (const auto& m : result.find("modes")->as_array()) bound_of[m.find("mode")->as_string()] = m.find("bound_ms")->as_double();
    double top = 1e-9;
    std::vector<std::pair<std::string, double>> lines;  // fixed modes
    for (const auto& v : modes_) {
      if (!ms_of_.count(v.name)) continue;
      const double ms = ms_of_.at(v.name);
      top = std::max({top, ms, bound_of[v.name]});
      if (v.device_share >= 0) curve.push_back({v.device_share, ms, bound_of[v.name]});
      else if (v.mode == KvMode::Offload || v.mode == KvMode::Kvpr || v.mode == KvMode::Resident) lines.push_back({v.name, ms});
    }
    std::sort(curve.begin(), curve.end(), [](const Point& a, const Point& b) { return a.share < b.share; });
    const int W = 760, H = 420, left = 70, right = 150, top_px = 50, bottom = 60;
    const double ymax = top * 1.1;
    auto X = [&](double f) { return left + f * (W - left - right); };
    auto Y = [&](double ms) { return top_px + (1 - ms / ymax) * (H - top_px - bottom); };
    std::ostringstream o;
    o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
      << "\" font-family=\"sans-serif\" font-size=\"13\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    std::string title = "decode ms/step vs GPU KV budget (lower is better): " + result.find("title")->as_string();
    std::string esc;
    for (char ch : title) esc += ch == '&' ? std::string("&amp;") : ch == '<' ? std::string("&lt;") : std::string(1, ch);
    o << "<text x=\"10\" y=\"24\" font-size=\"14\">" << esc << "</text>\n";
    o << "<line x1=\"" << left << "\" y1=\"" << Y(0) << "\" x2=\"" << X(1) << "\" y2=\"" << Y(0) << "\" stroke=\"black\"/>\n";
    o << "<line x1=\"" << left << "\" y1=\"" << Y(0) << "\" x2=\"" << left << "\" y2=\"" << top_px << "\" stroke=\"black\"/>\n";
    for (int i = 0; i <= 4; ++i) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%d%%", i * 25);
      o << "<text x=\"" << X(i / 4.0) - 12 << "\" y=\"" << Y(0) + 18 << "\">" << buf << "</text>\n";
      std::snprintf(buf, sizeof buf, "%.0f", ymax * i / 4);
      o << "<text x=\"10\" y=\"" << Y(ymax * i / 4) + 4 << "\">" << buf << "</text>\n";
    }
    o << "<text x=\"" << X(0.5) - 110 << "\" y=\"" << H - 20 << "\">GPU KV budget (share of the batch's KV)</text>\n";
    o << "<text x=\"10\" y=\"" << top_px - 8 << "\">ms/step</text>\n";
    const char* colors[] = {"#5b8def", "#f0ad4e", "#5cb85c", "#777777"};
    struct Label {
      double y;
      std::string text;
      const char* color;
    };
    std::vector<Label> labels;
    size_t ci = 0;
    for (const auto& [name, ms] : lines) {
      const bool resident = name.rfind("resident", 0) == 0;
      const char* c = colors[ci++ % 4];
      if (resident) {  // a point where everything fits
        o << "<circle cx=\"" << X(1) << "\" cy=\"" << Y(ms) << "\" r=\"5\" fill=\"" << c << "\"/>\n";
      } else {
        o << "<line x1=\"" << X(0) << "\" y1=\"" << Y(ms) << "\" x2=\"" << X(1) << "\" y2=\"" << Y(ms) << "\" stroke=\"" << c
          << "\" stroke-dasharray=\"6,4\" stroke-width=\"2\"/>\n";
      }
      char buf[96];
      std::snprintf(buf, sizeof buf, "%s %.1f ms", name.c_str(), ms);
      labels.push_back({Y(ms) + 4, buf, c});
    }
    // The labels at the right edge, top to bottom, at least a line apart.
    std::sort(labels.begin(), labels.end(), [](const Label& a, const Label& b) { return a.y < b.y; });
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i > 0) labels[i].y = std::max(labels[i].y, labels[i - 1].y + 15);
      o << "<text x=\"" << X(1) + 8 << "\" y=\"" << labels[i].y << "\" fill=\"" << labels[i].color << "\">" << labels[i].text
        << "</text>\n";
    }
    std::string path, bound_path;
    for (const Point& p : curve) {
      path += (path.empty() ? "M" : " L") + std::to_string(X(p.share)) + "," + std::to_string(Y(p.ms));
      bound_path += (bound_path.empty() ? "M" : " L") + std::to_string(X(p.share)) + "," + std::to_string(Y(p.bound));
      o << "<circle cx=\"" << X(p.share) << "\" cy=\"" << Y(p.ms) << "\" r=\"4\" fill=\"#d9534f\"/>\n";
    }
    if (!curve.empty()) {
      o << "<path d=\"" << path << "\" fill=\"none\" stroke=\"#d9534f\" stroke-width=\"2.5\"/>\n";
      o << "<path d=\"" << bound_path << "\" fill=\"none\" stroke=\"black\" stroke-dasharray=\"2,3\"/>\n";
      o << "<text x=\"" << X(curve.front().share) + 6 << "\" y=\"" << Y(curve.front().ms) - 8
        << "\" fill=\"#d9534f\">auto</text>\n";
    }
    o << "<text x=\"10\" y=\"" << H - 4 << "\" font-size=\"11\">dotted: auto's physical bound at each budget "
         "(bench/decode_bounds.h); dashed: fixed modes, which no budget changes</text>\n</svg>\n";
    return o.str();
  }

  // The table, printed last.
  static void print_table(const json::Value& result) {
    std::printf("\n%-15s %12s %12s %10s %12s %8s %10s %10s %10s %8s\n", "mode", "ms/step", "tokens/s", "split",
                "H2D MB/step", "busy", "x bound", "x model", "issue ms", "ops");
    for (const auto& mj : result.find("modes")->as_array()) {
      const auto& steps = mj.find("steps")->as_array();
      std::printf("%-15s %12.2f %12.1f %10lld %12.1f %8.2f %10.2f %10.2f %10.2f %8.0f\n", mj.find("mode")->as_string().c_str(),
                  mj.find("decode_ms_per_step_median")->as_double(), mj.find("decode_tokens_per_s")->as_double(),
                  static_cast<long long>(steps.back().find("split")->as_int()),
                  mj.find("h2d_bytes_per_step")->as_double() / 1e6, mj.find("compute_busy_fraction")->as_double(),
                  mj.find("over_bound")->as_double(), mj.find("over_model_bound")->as_double(),
                  mj.find("host_issue_ms_per_step_median")->as_double(), mj.find("compute_ops_per_step")->as_double());
    }
    for (const auto& [k, val] : result.find("ratios")->as_object()) std::printf("%s: %.2f\n", k.c_str(), val.as_double());
  }

  const Options opt_;
  std::string preset_;
  int batch_ = 0, prompt_ = 0, gen_ = 0;
  EngineOptions engine_;
  std::unique_ptr<Backend> be_;
  std::vector<Variant> modes_;
  std::unique_ptr<Model> model_;
  LinkProfile prof_;
  double hbm_ = 0, host_bw_ = 0, gemm_tflops_ = 0;
  int64_t gemm_rows_ = 0;
  double resident_ms_ = -1, resident_busy_ms_ = -1;
  std::map<std::string, double> ms_of_;
};

}  // namespace

int cmd_decode(const std::vector<std::string>& args) { return DecodeRun(args).run(); }

}  // namespace kvpr::bench
