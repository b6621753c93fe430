// kvpr-bench serve [--preset P] [--backend B] [--kv-mode M] [--conversations C] [--prompt P] [--answer A]
//                    [--new N] [--decoders D] [--long-prompt L] [--chunk K] [--json FILE]
//     Scheduling as a server sees it, on and off in one run: second turns of C conversations with
//     and without the prefix cache (time to first tokens, tokens prefilled), and D decoding
//     sequences when an L-token prompt arrives, prefilled whole or in chunks of K (their longest
//     gap between tokens, the prompt's time to first token).
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
#include "engine/constrain/json_object.h"
#include "engine/constrain/json_schema.h"
#include "engine/model/llama_model.h"
#include "engine/model/opt_model.h"
#include "engine/kv/profiler.h"
#include "engine/kv/split_scheduler.h"
#include "engine/base/rng.h"
#include "engine/base/thread_pool.h"
#include "engine/text/tokenizer.h"

namespace kvpr::bench {

namespace {

// What the three measurements share: the model, its tokenizer, the generator's options, and sizes.
struct ServeRun {
  Model* model;
  const Tokenizer& tok;
  GeneratorOptions base;
  GenerationParams gp;
  int C, P, A, N, D, L, K, S;
  std::function<std::vector<int32_t>(int)> random_prompt;

  json::Value prefix_caching();        // C second turns, the prefix cache off and on
  json::Value chunked_prefill();       // an L-token prompt among D decoders, whole or in chunks of K
  json::Value speculative_decoding();  // C greedy sequences, 0 or S prompt-lookup drafts a step
};

// C conversations' second turns after their first, the prefix cache off and on.
json::Value ServeRun::prefix_caching() {
  std::vector<std::vector<int32_t>> turn1;
  for (int c = 0; c < C; ++c) turn1.push_back(random_prompt(P));
  const std::vector<int32_t> extra = random_prompt(N);
  json::Array prefix_runs;
  std::map<bool, double> ttft;
  std::map<bool, std::vector<std::vector<int32_t>>> answers2;
  for (bool caching : {false, true}) {
    GeneratorOptions g = base;
    g.max_batch = C;
    g.max_seq_len = P + 2 * A + N + 8;
    g.prefix_caching = caching;
    Generator gen(*model, tok, g);
    gp.max_new_tokens = A;
    auto first = gen.generate_all(turn1, gp);
    std::vector<uint64_t> ids;
    int64_t turn2_tokens = 0;
    for (int c = 0; c < C; ++c) {
      std::vector<int32_t> t = turn1[static_cast<size_t>(c)];
      t.insert(t.end(), first[static_cast<size_t>(c)].tokens.begin(), first[static_cast<size_t>(c)].tokens.end());
      t.insert(t.end(), extra.begin(), extra.end());
      turn2_tokens += static_cast<int64_t>(t.size());
      ids.push_back(gen.add(std::move(t), gp));
    }
    const auto t0 = Clock::now();
    std::set<uint64_t> started;
    double t_first = 0;
    while (!gen.idle()) {
      for (const StepOutput& o : gen.step())
        if (o.token >= 0) started.insert(o.id);
      if (t_first == 0 && started.size() == ids.size()) t_first = seconds_since(t0);
    }
    const double total = seconds_since(t0);
    int64_t cached = 0;
    for (uint64_t id : ids) {
      SequenceResult r = gen.take_result(id);
      cached += r.cached_tokens;
      answers2[caching].push_back(r.tokens);
    }
    ttft[caching] = t_first;
    json::Value r(json::Object{});
    r.set("prefix_caching", caching);
    r.set("turn2_prompt_tokens", turn2_tokens);
    r.set("cached_tokens", cached);
    r.set("prefilled_tokens", turn2_tokens - cached);
    r.set("ttft_all_ms", t_first * 1e3);
    r.set("turn2_total_ms", total * 1e3);
    std::printf("prefix caching %-3s: %d second turns of %lld tokens, %6lld prefilled, first tokens after %8.1f ms, "
                "done after %8.1f ms\n", caching ? "on" : "off", C, static_cast<long long>(turn2_tokens / C),
                static_cast<long long>(turn2_tokens - cached), t_first * 1e3, total * 1e3);
    prefix_runs.push_back(std::move(r));
  }
  const int64_t pre_off = prefix_runs[0].find("prefilled_tokens")->as_int(),
                pre_on = prefix_runs[1].find("prefilled_tokens")->as_int();
  json::Value prefix(json::Object{});
  prefix.set("conversations", C);
  prefix.set("turn1_prompt", P);
  prefix.set("answer", A);
  prefix.set("new_tokens", N);
  prefix.set("runs", std::move(prefix_runs));
  prefix.set("ttft_speedup", ttft[false] / ttft[true]);
  // Prefill work is about linear in the tokens prefilled at these lengths: the bound on the speedup.
  prefix.set("prefilled_token_ratio", static_cast<double>(pre_off) / static_cast<double>(pre_on));
  prefix.set("same_tokens", answers2[false] == answers2[true]);
  std::printf("  time to first tokens %.2fx faster; %.2fx fewer tokens prefilled; same tokens: %s\n",
              ttft[false] / ttft[true], static_cast<double>(pre_off) / static_cast<double>(pre_on),
              answers2[false] == answers2[true] ? "yes" : "NO");
  return prefix;
}

// D sequences decode when an L-token prompt arrives, prefilled whole or in chunks of K.
json::Value ServeRun::chunked_prefill() {
  json::Array chunk_runs;
  std::map<int, std::vector<int32_t>> long_tokens;
  const std::vector<int32_t> long_prompt = random_prompt(L);
  std::vector<std::vector<int32_t>> short_prompts;
  for (int d = 0; d < D; ++d) short_prompts.push_back(random_prompt(32));
  for (int chunk : {0, K}) {
    GeneratorOptions g = base;
    g.max_batch = D + 1;
    g.max_seq_len = L + 256;
    g.max_step_tokens = chunk > 0 ? chunk : L + D + 256;
    g.prefix_caching = false;
    Generator gen(*model, tok, g);
    gp.max_new_tokens = 200;
    std::vector<uint64_t> dec;
    for (const auto& sp : short_prompts) dec.push_back(gen.add(sp, gp));
    std::map<uint64_t, Clock::time_point> last;
    double worst_gap = 0;
    std::vector<double> gaps;
    auto step = [&] {
      auto outs = gen.step();
      const auto now = Clock::now();
      for (const StepOutput& o : outs) {
        if (o.token < 0) continue;
        if (last.count(o.id)) gaps.push_back(std::chrono::duration<double>(now - last[o.id]).count());
        last[o.id] = now;
      }
      return outs;
    };
    while (last.size() < dec.size()) step();
    for (int i = 0; i < 8; ++i) step();  // steady decoding
    gaps.clear();
    GenerationParams lp = gp;
    lp.max_new_tokens = 8;
    const uint64_t lid = gen.add(long_prompt, lp);
    const auto t0 = Clock::now();
    double long_ttft = 0;
    int steps = 0;
    while (long_ttft == 0) {
      ++steps;
      for (const StepOutput& o : step())
        if (o.id == lid && o.token >= 0) long_ttft = seconds_since(t0);
    }
    for (double x : gaps) worst_gap = std::max(worst_gap, x);
    std::sort(gaps.begin(), gaps.end());
    const double median_gap = gaps.empty() ? 0 : gaps[gaps.size() / 2];
    for (uint64_t id : dec) gen.cancel(id);
    while (!gen.idle()) gen.step();
    long_tokens[chunk] = gen.take_result(lid).tokens;
    json::Value r(json::Object{});
    r.set("max_step_tokens", g.max_step_tokens);
    r.set("steps_to_first_token", steps);
    r.set("long_prompt_ttft_ms", long_ttft * 1e3);
    r.set("decoder_max_gap_ms", worst_gap * 1e3);
    r.set("decoder_median_gap_ms", median_gap * 1e3);
    std::printf("prefill %-12s: %d decoders, a %d-token prompt arrives: its first token after %8.1f ms (%d steps); "
                "decoders' longest gap %8.1f ms, median %6.1f ms\n",
                chunk > 0 ? ("chunks of " + std::to_string(chunk)).c_str() : "whole", D, L, long_ttft * 1e3, steps,
                worst_gap * 1e3, median_gap * 1e3);
    chunk_runs.push_back(std::move(r));
  }
  json::Value chunked(json::Object{});
  chunked.set("decoders", D);
  chunked.set("long_prompt", L);
  chunked.set("chunk", K);
  const double gap_whole = chunk_runs[0].find("decoder_max_gap_ms")->as_double(),
               gap_chunk = chunk_runs[1].find("decoder_max_gap_ms")->as_double();
  const double ttft_whole = chunk_runs[0].find("long_prompt_ttft_ms")->as_double(),
               ttft_chunk = chunk_runs[1].find("long_prompt_ttft_ms")->as_double();
  chunked.set("runs", std::move(chunk_runs));
  chunked.set("max_gap_reduction", gap_whole / gap_chunk);
  chunked.set("long_prompt_ttft_cost", ttft_chunk / ttft_whole);
  chunked.set("same_tokens", long_tokens[0] == long_tokens[K]);
  std::printf("  longest decoder gap %.2fx shorter; the long prompt's first token %.2fx later; same tokens: %s\n",
              gap_whole / gap_chunk, ttft_chunk / ttft_whole, long_tokens[0] == long_tokens[K] ? "yes" : "NO");
  return chunked;
}

json::Value ServeRun::speculative_decoding() {
  // Speculative decoding: C greedy sequences of P-token prompts decode A tokens one at a time,
  // then checking up to S prompt-lookup drafts a step. What a random model's greedy text repeats
  // sets the acceptance here; the step costs are what carries over to real text.
  json::Array spec_runs;
  std::map<int, std::vector<std::vector<int32_t>>> spec_tokens;
  std::map<int, double> spec_ms_per_token, spec_ms_per_step;
  double spec_tokens_per_step = 1;
  std::vector<std::vector<int32_t>> spec_prompts;
  for (int c = 0; c < C; ++c) spec_prompts.push_back(random_prompt(P));
  for (int k : {0, S}) {
    GeneratorOptions g = base;
    g.max_batch = C;
    g.max_seq_len = P + 4 * A + 8;
    g.prefix_caching = false;
    g.speculative_tokens = k;
    Generator gen(*model, tok, g);
    gp.max_new_tokens = 4 * A;
    for (const auto& sp : spec_prompts) gen.add(sp, gp);
    gen.step();  // the prefill
    int64_t steps = 0, tokens = 0;
    const auto t0 = Clock::now();
    while (!gen.idle()) {
      for (const StepOutput& o : gen.step()) tokens += o.token >= 0;
      ++steps;
    }
    const double total = seconds_since(t0);
    std::vector<std::vector<int32_t>> got;
    for (uint64_t id = 1; id <= static_cast<uint64_t>(C); ++id) got.push_back(gen.take_result(id).tokens);
    spec_tokens[k] = got;
    const SpeculationStats& st = gen.speculation_stats();
    spec_ms_per_token[k] = total * 1e3 / static_cast<double>(tokens);
    spec_ms_per_step[k] = total * 1e3 / static_cast<double>(steps);
    if (k > 0) spec_tokens_per_step = static_cast<double>(tokens) / static_cast<double>(steps * C);
    json::Value r(json::Object{});
    r.set("speculative_tokens", k);
    r.set("decode_steps", steps);
    r.set("tokens", tokens);
    r.set("drafts", st.proposed);
    r.set("accepted", st.accepted);
    r.set("ms_per_step", spec_ms_per_step[k]);
    r.set("ms_per_token", spec_ms_per_token[k]);
    std::printf("speculation %-2d: %d sequences, %lld tokens in %lld steps (%.2f per sequence-step), %lld of %lld drafts "
                "taken, %7.2f ms/step, %7.3f ms/token\n", k, C, static_cast<long long>(tokens),
                static_cast<long long>(steps), static_cast<double>(tokens) / static_cast<double>(steps * C),
                static_cast<long long>(st.accepted), static_cast<long long>(st.proposed), spec_ms_per_step[k],
                spec_ms_per_token[k]);
    spec_runs.push_back(std::move(r));
  }
  json::Value spec(json::Object{});
  spec.set("sequences", C);
  spec.set("prompt", P);
  spec.set("runs", std::move(spec_runs));
  spec.set("speedup", spec_ms_per_token[0] / spec_ms_per_token[S]);
  // A step checking drafts costs this many one-token steps; with acceptance a per draft, a step
  // yields (1 - a^(S+1)) / (1 - a) tokens: the speedup at acceptance a is that over the cost.
  const double cost = spec_ms_per_step[S] / spec_ms_per_step[0];
  spec.set("step_cost_ratio", cost);
  spec.set("tokens_per_sequence_step", spec_tokens_per_step);
  json::Value implied(json::Object{});
  for (double a : {0.3, 0.5, 0.7, 0.9})
    implied.set(std::to_string(a).substr(0, 3), (1 - std::pow(a, S + 1)) / (1 - a) / cost);
  spec.set("implied_speedup_at_acceptance", std::move(implied));
  spec.set("same_tokens", spec_tokens[0] == spec_tokens[S]);
  std::printf("  %.2fx the tokens per second; a step checking drafts costs %.2fx one that does not; same tokens: %s\n",
              spec_ms_per_token[0] / spec_ms_per_token[S], cost, spec_tokens[0] == spec_tokens[S] ? "yes" : "NO");
  return spec;
}

}  // namespace

// The Generator's scheduling as a server sees it, each feature on and off in one run:
//   prefix caching: C conversations' second turns (turn 1's prompt and answer, then N new
//     tokens) after their first, time to every first token and tokens prefilled, cache off vs on;
//   chunked prefill: D sequences decode when one L-token prompt arrives; the longest gap between
//     their tokens and the prompt's time to first token, whole prefill vs chunks of K tokens.
int cmd_serve(const std::vector<std::string>& args) {
  const Options opt(args, {"--preset", "--backend", "--kv-mode", "--kv-dtype", "--conversations", "--prompt", "--answer",
                           "--new", "--decoders", "--long-prompt", "--chunk", "--speculative-tokens",
                           "--emulate-link-gbps", "--json"});
  auto be = bench_backend(opt.get("--backend", "auto"));
  const std::string preset_name = opt.get("--preset", be->device_is_host() ? "opt-125m" : "opt-6.7b");
  const int C = opt.get_int("--conversations", 4), P = opt.get_int("--prompt", 512), A = opt.get_int("--answer", 32),
            N = opt.get_int("--new", 64), D = opt.get_int("--decoders", 4), L = opt.get_int("--long-prompt", 1024),
            K = opt.get_int("--chunk", 128);
  const int S = opt.get_int("--speculative-tokens", 4);
  KVPR_CHECK(C > 0 && P > 1 && A > 1 && N > 0 && D > 0 && L > 1 && K > 0 && S > 0, "sizes must be positive");
  EngineOptions defaults;  // the engine's table, with this bench's defaults
  defaults.generator.kv_dtype = DType::F16;
  defaults.generator.kv.mode = KvMode::Resident;
  const EngineOptions engine = engine_options_of(opt, {"--kv-mode", "--kv-dtype"}, defaults);
  const KvMode mode = engine.generator.kv.mode;
  const DType kv_dtype = *engine.generator.kv_dtype;
  std::unique_ptr<Model> model = preset_model(*be, preset_name, {});
  const Tokenizer tok = Tokenizer::load(default_tokenizer_dir());
  const int32_t vocab = static_cast<int32_t>(std::min<int64_t>(model->spec().vocab_size, tok.size()));
  if (const double link = opt.get_double("--emulate-link-gbps", 0); link > 0) {
    auto* cpu = dynamic_cast<CpuBackend*>(be.get());
    KVPR_CHECK(cpu, "--emulate-link-gbps is for the cpu backend");
    cpu->set_emulated_link_gbps(link);
  }
  GeneratorOptions base = engine.generator;
  if (mode == KvMode::Kvpr) {
    base.kv.profile = profile_backend(*be, *model, model->kv_shape(), kv_dtype, ProfileOptions::quick());
  }
  std::fprintf(stderr, "kvpr-bench serve: %s on %s, kv mode %s\n", preset_name.c_str(), be->name().c_str(),
               kv_mode_name(mode));
  Rng rng(7);
  auto random_prompt = [&](int n) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; ++i) v.push_back(static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab)));
    return v;
  };
  GenerationParams gp;
  gp.ignore_eos = true;
  ServeRun run{model.get(), tok, base, gp, C, P, A, N, D, L, K, S, random_prompt};
  json::Value result(json::Object{});
  result.set("benchmark", "serve");
  result.set("preset", preset_name);
  result.set("backend", be->name());
  result.set("kv_mode", kv_mode_name(mode));
  result.set("kv_dtype", dtype_name(kv_dtype));
  result.set("threads", ThreadPool::global().size());
  result.set("prefix_caching", run.prefix_caching());
  result.set("chunked_prefill", run.chunked_prefill());
  result.set("speculative_decoding", run.speculative_decoding());
  result.set("emulated_link_gbps", opt.get_double("--emulate-link-gbps", 0));
  write_json(opt.get("--json", ""), result);
  return 0;
}

}  // namespace kvpr::bench
