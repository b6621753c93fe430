// Generation: greedy tokens equal the reference's, decoding with the cache equals
// recomputing the whole sequence, batched equals one by one, sampling is reproducible,
// and stop strings, EOS and length limits end sequences as documented.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/model/demo_model.h"
#include "engine/base/error.h"
#include "engine/decode/generator.h"
#include "engine/base/json.h"
#include "engine/constrain/json_object.h"
#include "engine/model/opt_model.h"
#include "tests/engine/kv/kv_mode_check.h"
#include "tests/test_util.h"

using namespace kvpr;
namespace fs = std::filesystem;

namespace {

using test::char_tokenizer;

struct Fixture {
  CpuBackend be;
  OptModel model;
  explicit Fixture(const char* name) : model(be, test::data_path(std::string("opt/") + name)) {}
};

GeneratorOptions f32_kv(int batch) {
  GeneratorOptions o;
  o.max_batch = batch;
  o.kv_dtype = DType::F32;
  return o;
}

}  // namespace

TEST(Generation, GreedyTokensMatchReference) {
  test::TempDir tmp;
  for (const char* name : {"pre_ln_safetensors", "post_ln_proj_sharded", "decoder_prefix_bin", "fp16_bin_sharded",
                           "bf16_safetensors"}) {
    Fixture f(name);
    Tokenizer tok = char_tokenizer(tmp, 96);
    std::string dir = test::data_path(std::string("opt/") + name);
    NpyArray ids = read_npy(dir + "/input_ids.npy");
    NpyArray greedy = read_npy(dir + "/greedy.npy");
    std::vector<int32_t> prompt(ids.values.begin(), ids.values.begin() + 5);
    Generator gen(f.model, tok, f32_kv(1));
    GenerationParams p;
    p.max_new_tokens = 8;
    auto r = gen.generate_all({prompt}, p);
    std::vector<int32_t> want(greedy.values.begin(), greedy.values.end());
    EXPECT_EQ(r[0].tokens, want) << name;
    EXPECT_EQ(r[0].finish, FinishReason::Length);
  }
}

TEST(Generation, DecodeWithCacheEqualsFullRecompute) {
  test::TempDir tmp;
  Fixture f("post_ln_proj_sharded");
  Tokenizer tok = char_tokenizer(tmp, 96);
  const int64_t V = f.model.config().vocab_size;
  std::vector<int32_t> prompt = {5, 17, 33, 2, 80, 41};
  Generator gen(f.model, tok, f32_kv(1));
  GenerationParams p;
  p.max_new_tokens = 12;
  std::vector<std::vector<float>> rows;
  auto r = gen.generate_all({prompt}, p, [&](uint64_t, const float* row, int64_t) { rows.emplace_back(row, row + V); });
  ASSERT_EQ(rows.size(), 12u);
  std::vector<int32_t> seq = prompt;
  for (size_t i = 0; i < rows.size(); ++i) {
    KvRuntimeOptions f32;
    f32.kv_dtype = DType::F32;
    auto cache = f.model.make_kv_runtime(1, 64, f32);
    Tensor logits = Tensor::host(DType::F32, {1, V});
    f.model.forward({ForwardChunk{seq.data(), static_cast<int64_t>(seq.size()), 0, 0}}, *cache, logits);
    std::vector<double> full(logits.data_as<float>(), logits.data_as<float>() + V);
    EXPECT_TRUE(test::close_rel(full, rows[i].data(), V, 1e-5)) << "step " << i;
    seq.push_back(r[0].tokens[i]);
  }
}

TEST(Generation, BatchedEqualsOneByOne) {
  test::TempDir tmp;
  Fixture f("fp16_bin_sharded");
  Tokenizer tok = char_tokenizer(tmp, 96);
  const int64_t V = f.model.config().vocab_size;
  std::vector<std::vector<int32_t>> prompts = {{4, 9, 12}, {50, 51, 52, 53, 54, 55, 56, 57, 58}, {77}, {3, 3, 3, 3, 3}};
  GenerationParams p;
  p.max_new_tokens = 10;
  Generator batched(f.model, tok, f32_kv(4));
  std::map<uint64_t, std::vector<std::vector<float>>> brows;
  auto rb = batched.generate_all(prompts, p, [&](uint64_t id, const float* row, int64_t) {
    brows[id].emplace_back(row, row + V);
  });
  for (size_t i = 0; i < prompts.size(); ++i) {
    Generator single(f.model, tok, f32_kv(1));
    std::vector<std::vector<float>> srows;
    auto rs = single.generate_all({prompts[i]}, p, [&](uint64_t, const float* row, int64_t) { srows.emplace_back(row, row + V); });
    EXPECT_EQ(rb[i].tokens, rs[0].tokens) << "prompt " << i;
    const auto& mine = brows[i + 1];
    ASSERT_EQ(mine.size(), srows.size());
    for (size_t s = 0; s < srows.size(); ++s) {
      std::vector<double> ref(srows[s].begin(), srows[s].end());
      EXPECT_TRUE(test::close_rel(ref, mine[s].data(), V, 1e-5)) << "prompt " << i << " step " << s;
    }
  }
}

TEST(Generation, ContinuousBatchingAdmitsNewRequestsMidFlight) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  Tokenizer tok = char_tokenizer(tmp, 96);
  GenerationParams p;
  p.max_new_tokens = 6;
  Generator gen(f.model, tok, f32_kv(2));
  uint64_t a = gen.add({10, 11, 12}, p);
  gen.step();
  gen.step();
  uint64_t b = gen.add({20, 21}, p);  // joins while a is decoding
  uint64_t c = gen.add({30}, p);      // waits for a free slot
  EXPECT_EQ(gen.waiting(), 2u);
  while (!gen.idle()) gen.step();
  Generator ref(f.model, tok, f32_kv(1));
  EXPECT_EQ(gen.take_result(a).tokens, ref.generate_all({{10, 11, 12}}, p)[0].tokens);
  EXPECT_EQ(gen.take_result(b).tokens, ref.generate_all({{20, 21}}, p)[0].tokens);
  EXPECT_EQ(gen.take_result(c).tokens, ref.generate_all({{30}}, p)[0].tokens);
}

TEST(Generation, StepTokenBudgetChunksPrefills) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  Tokenizer tok = char_tokenizer(tmp, 96);
  GeneratorOptions o = f32_kv(4);
  o.max_step_tokens = 10;
  Generator gen(f.model, tok, o);
  GenerationParams p;
  p.max_new_tokens = 3;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(gen.add(std::vector<int32_t>(6, 10 + i), p));
  auto first = gen.step();  // prompt 0 whole and 4 tokens of prompt 1
  EXPECT_EQ(gen.running(), 2u);
  EXPECT_EQ(gen.waiting(), 1u);
  ASSERT_EQ(first.size(), 1u);  // only prompt 0 chose a token
  EXPECT_EQ(first[0].id, ids[0]);
  EXPECT_EQ(gen.cached_tokens(), 10);
  auto second = gen.step();  // 1 decode, the last 2 of prompt 1, all 6 of prompt 2
  EXPECT_EQ(gen.running(), 3u);
  EXPECT_EQ(gen.waiting(), 0u);
  EXPECT_EQ(second.size(), 3u);
  while (!gen.idle()) gen.step();
  Generator ref(f.model, tok, f32_kv(1));
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(gen.take_result(ids[i]).tokens, ref.generate_all({std::vector<int32_t>(6, 10 + i)}, p)[0].tokens);
}

// A prompt longer than the step budget is prefilled over several steps while another sequence
// decodes; the logits it chooses from and its prompt scores are those of one whole prefill.
TEST(Generation, ChunkedPrefillEqualsOneWholePrefill) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  const int64_t V = f.model.config().vocab_size;
  Tokenizer tok = char_tokenizer(tmp, 96);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 29; ++i) prompt.push_back(static_cast<int32_t>((i * 37 + 11) % 90));
  GenerationParams p;
  p.max_new_tokens = 6;
  p.prompt_logprobs = 2;
  auto rows_of = [&](Generator& g, const std::vector<std::vector<int32_t>>& prompts, uint64_t want_id,
                     std::vector<SequenceResult>* res) {
    std::vector<std::vector<float>> rows;
    *res = g.generate_all(prompts, p, [&](uint64_t id, const float* row, int64_t) {
      if (id == want_id) rows.emplace_back(row, row + V);
    });
    return rows;
  };
  Generator whole(f.model, tok, f32_kv(2));
  std::vector<SequenceResult> rw;
  auto want = rows_of(whole, {prompt}, 1, &rw);
  GeneratorOptions o = f32_kv(2);
  o.max_step_tokens = 4;  // 1 decode + 3 prompt tokens a step once the first prompt decodes
  Generator chunked(f.model, tok, o);
  std::vector<SequenceResult> rc;
  auto got = rows_of(chunked, {{70, 71}, prompt}, 2, &rc);
  EXPECT_EQ(rc[1].tokens, rw[0].tokens);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) {
    std::vector<double> ref(want[s].begin(), want[s].end());
    EXPECT_TRUE(test::close_rel(ref, got[s].data(), V, 1e-5)) << "step " << s;
  }
  ASSERT_EQ(rc[1].prompt_logprobs.size(), prompt.size() - 1);
  ASSERT_EQ(rc[1].prompt_top.size(), prompt.size() - 1);
  for (size_t j = 0; j + 1 < prompt.size(); ++j) {
    EXPECT_NEAR(rc[1].prompt_logprobs[j], rw[0].prompt_logprobs[j], 1e-4) << "position " << j;
    EXPECT_EQ(rc[1].prompt_top[j][0].first, rw[0].prompt_top[j][0].first) << "position " << j;
  }
  EXPECT_EQ(rc[1].cached_tokens, 0);  // scored prompts skip the prefix cache
}

// A finished sequence's full KV blocks stay cached: the next prompt that starts with their
// tokens takes them and prefills only the rest, with the tokens and logits of a full prefill.
TEST(Generation, PrefixCacheReusesAFinishedSequencesBlocks) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  const int64_t V = f.model.config().vocab_size;
  Tokenizer tok = char_tokenizer(tmp, 96);
  GenerationParams p;
  p.max_new_tokens = 5;
  p.ignore_eos = true;
  const std::vector<int32_t> a = {5, 17, 33, 2, 80, 41, 9, 12};
  const std::vector<int32_t> b = {60, 61, 62};
  constexpr int64_t B = 4;  // tokens per block: reuse is by whole blocks
  auto blocks_of = [&](int64_t tokens) { return tokens / B * B; };
  GeneratorOptions off = f32_kv(3);
  off.prefix_caching = false;
  off.block_tokens = B;
  auto reference = [&](const std::vector<int32_t>& prompt, std::vector<std::vector<float>>* rows) {
    Generator g(f.model, tok, off);
    return g.generate_all({prompt}, p, [&](uint64_t, const float* row, int64_t) { rows->emplace_back(row, row + V); })[0];
  };
  GeneratorOptions on = f32_kv(3);
  on.block_tokens = B;
  Generator gen(f.model, tok, on);
  auto first = gen.generate_all({a, b}, p);
  EXPECT_EQ(first[0].cached_tokens, 0);
  EXPECT_EQ(gen.prefix_cache_stats().queries, 11);
  EXPECT_EQ(gen.prefix_cache_stats().hits, 0);

  // The second turn: a's prompt, its answer, more. Everything fed through the model is reused
  // (the last answer token was sampled but never fed).
  std::vector<int32_t> turn2 = a;
  turn2.insert(turn2.end(), first[0].tokens.begin(), first[0].tokens.end());
  turn2.insert(turn2.end(), {3, 4, 5});
  std::vector<std::vector<float>> want_rows, got_rows;
  SequenceResult want = reference(turn2, &want_rows);
  SequenceResult got = gen.generate_all({turn2}, p, [&](uint64_t, const float* row, int64_t) {
    got_rows.emplace_back(row, row + V);
  })[0];
  EXPECT_EQ(got.cached_tokens, blocks_of(static_cast<int64_t>(a.size()) + p.max_new_tokens - 1));
  EXPECT_GT(got.cached_tokens, 0);
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got_rows.size(), want_rows.size());
  for (size_t s = 0; s < want_rows.size(); ++s) {
    std::vector<double> ref(want_rows[s].begin(), want_rows[s].end());
    EXPECT_TRUE(test::close_rel(ref, got_rows[s].data(), V, 1e-5)) << "step " << s;
  }
  EXPECT_EQ(gen.prefix_cache_stats().hits, got.cached_tokens);

  // The same prompt again: the full blocks of all but its last token come from the cache.
  auto again = gen.generate_all({turn2}, p)[0];
  EXPECT_EQ(again.cached_tokens, blocks_of(static_cast<int64_t>(turn2.size()) - 1));
  EXPECT_EQ(again.tokens, want.tokens);
  // A prompt sharing b's first block (its prompt and first answer token) reuses that block only.
  std::vector<int32_t> fork = {60, 61, 62, first[1].tokens[0], 70, 71};
  std::vector<std::vector<float>> unused;
  auto forked = gen.generate_all({fork}, p)[0];
  EXPECT_EQ(forked.cached_tokens, B);
  EXPECT_EQ(forked.tokens, reference(fork, &unused).tokens);
  // Nothing in common: it reuses nothing.
  auto fresh = gen.generate_all({{90, 91}}, p)[0];
  EXPECT_EQ(fresh.cached_tokens, 0);
  // Scored prompts and a generator with the cache off never reuse.
  GenerationParams scored = p;
  scored.prompt_logprobs = 0;
  EXPECT_EQ(gen.generate_all({turn2}, scored)[0].cached_tokens, 0);
  Generator cold(f.model, tok, off);
  cold.generate_all({a}, p);
  EXPECT_EQ(cold.generate_all({a}, p)[0].cached_tokens, 0);
  EXPECT_EQ(cold.prefix_cache_stats().queries, 0);
}

// Paged KV with too few blocks for every request at once: admission waits for blocks, and when
// they run out mid-decode the newest sequence is preempted, requeued and prefilled again. Every
// request still gets the tokens it gets with room to spare, in every KV mode; all blocks come
// back; a prompt the whole cache cannot hold is refused when it is added.
TEST(Generation, PagedKvPreemptsTheNewestAndLosesNothing) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  Tokenizer tok = char_tokenizer(tmp, 96);
  GenerationParams p;
  p.max_new_tokens = 12;
  p.ignore_eos = true;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    prompts.emplace_back();
    for (int t = 0; t < 5 + 3 * i; ++t) prompts.back().push_back(static_cast<int32_t>((i * 31 + t * 7) % 90));
  }
  const auto want = test::greedy_tokens(f.model, tok, f32_kv(6), prompts, p);
  for (KvMode mode : {KvMode::Resident, KvMode::Offload, KvMode::Kvpr, KvMode::Auto}) {
    SCOPED_TRACE(kv_mode_name(mode));
    GeneratorOptions o = test::in_mode(f32_kv(6), mode, 6, f.model);
    o.block_tokens = 4;
    // 14 blocks of 4 tokens; the six requests need 8 at most each, 38 together.
    const KvPlan one = Generator::kv_plan(o, f.model.spec(), f.model.weight_dtype());
    o.kv_cache_bytes = 14 * KvRuntime::block_bytes(f.model.kv_shape(), one.layout, one.kv);
    Generator gen(f.model, tok, o);
    EXPECT_EQ(gen.kv_block_stats().total, 14);
    std::vector<uint64_t> ids;
    for (const auto& pr : prompts) ids.push_back(gen.add(pr, p));
    int64_t most_used = 0;
    while (!gen.idle()) {
      gen.step();
      most_used = std::max(most_used, gen.kv_block_stats().used);
    }
    for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(gen.take_result(ids[i]).tokens, want[i]) << "request " << i;
    const KvBlockStats st = gen.kv_block_stats();
    EXPECT_GT(st.preemptions, 0);
    EXPECT_LE(most_used, 14);
    EXPECT_EQ(st.used, 0);
    EXPECT_EQ(st.free, 14);
    // 14 blocks hold 56 tokens: a prompt of 56 (and its first new token) never fits.
    EXPECT_THROW(gen.add(std::vector<int32_t>(56, 3), p), Error);
    EXPECT_NO_THROW(gen.add(std::vector<int32_t>(55, 3), p));
  }
}

// Without a size given, a store in host memory is what host memory allows (host-memory, which
// kvprd sets to each worker's share, or 90% of what is available), less the weights kept there,
// and max-batch x max-seq-len only its cap; a size given is taken as given; a store smaller than
// one sequence of the context is still made.
TEST(Generation, ADefaultKvStoreInHostMemoryIsSizedByMemory) {
  Fixture f("pre_ln_safetensors");
  const ModelSpec& spec = f.model.spec();
  GeneratorOptions o;
  o.kv.mode = KvMode::Offload;
  o.max_batch = 4;
  const KvPlan cap = Generator::kv_plan(o, spec, DType::F32);
  EXPECT_EQ(cap.layout.blocks, 4 * cap.layout.blocks_for(cap.layout.max_tokens));
  EXPECT_NE(cap.why.find("room for max-batch 4 sequences"), std::string::npos) << cap.why;
  const double block = KvRuntime::block_bytes(f.model.kv_shape(), cap.layout, cap.kv);

  o.max_batch = 1 << 20;
  o.host_memory = 100.5 * block;
  const KvPlan shared = Generator::kv_plan(o, spec, DType::F32, nullptr, 30 * block);
  EXPECT_EQ(shared.layout.blocks, 70);
  EXPECT_NE(shared.why.find("host-memory"), std::string::npos) << shared.why;
  EXPECT_NE(shared.why.find("weights in host memory"), std::string::npos) << shared.why;
  // The same once the weights are allocated (they count against the share either way).
  EXPECT_EQ(Generator::kv_plan(o, spec, DType::F32, nullptr, 30 * block, true).layout.blocks, 70);
  // Smaller than one sequence of the context: still made, of at least one block.
  o.host_memory = 3.5 * block;
  EXPECT_EQ(Generator::kv_plan(o, spec, DType::F32).layout.blocks, 3);

  // Without host-memory, 90% of what the host has.
  o.host_memory = 0;
  const KvPlan host = Generator::kv_plan(o, spec, DType::F32);
  const double avail = static_cast<double>(host_bytes_available());
  EXPECT_LT(static_cast<double>(host.layout.blocks) * block, 0.91 * avail);
  EXPECT_GT(static_cast<double>(host.layout.blocks) * block, 0.5 * avail);
  EXPECT_NE(host.why.find("of host memory available"), std::string::npos) << host.why;
  // Resident on a backend whose device is the host: the same; on a device, max-batch x max-seq-len.
  o.kv.mode = KvMode::Resident;
  EXPECT_EQ(Generator::kv_plan(o, spec, DType::F32, &f.be).layout.blocks, host.layout.blocks);
  EXPECT_EQ(Generator::kv_plan(o, spec, DType::F32).layout.blocks,
            (int64_t{1} << 20) * cap.layout.blocks_for(cap.layout.max_tokens));
  // A size given is the size.
  o.kv.mode = KvMode::Offload;
  o.kv_cache_bytes = 1000.5 * block;
  EXPECT_EQ(Generator::kv_plan(o, spec, DType::F32).layout.blocks, 1000);
}

// Speculative drafts take KV blocks only where they are free: a lone sequence whose store holds
// 16 tokens decodes until the store is full, as it does without drafts, the drafts it checks near
// the end never ending it early (alone and out of blocks, a sequence ends with "length").
TEST(Generation, DraftsNeverCostASequenceItsTokens) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  Tokenizer tok = char_tokenizer(tmp, 96);
  GenerationParams p;
  p.max_new_tokens = 40;
  p.ignore_eos = true;
  const std::vector<int32_t> prompt = {7, 8, 9, 7, 8};
  const auto want = test::greedy_tokens(f.model, tok, f32_kv(1), {prompt}, p);
  for (int drafts : {0, 8}) {
    GeneratorOptions o = f32_kv(1);
    o.block_tokens = 4;
    o.speculative_tokens = drafts;
    o.prompt_lookup_min = 1;
    const KvPlan one = Generator::kv_plan(o, f.model.spec(), f.model.weight_dtype());
    o.kv_cache_bytes = 4 * KvRuntime::block_bytes(f.model.kv_shape(), one.layout, one.kv);  // 16 tokens
    Generator gen(f.model, tok, o);
    const SequenceResult r = gen.generate_all({prompt}, p)[0];
    // 16 rows: the prompt's 5 and the K/V of 11 generated tokens, and the 12th chosen from them.
    EXPECT_EQ(r.tokens, std::vector<int32_t>(want[0].begin(), want[0].begin() + 12)) << drafts << " drafts";
    EXPECT_EQ(r.finish, FinishReason::Length);
    EXPECT_EQ(gen.speculation_stats().proposed > 0, drafts > 0);
  }
}

// Requests that share a system prompt share its full KV blocks while they run: the later one
// takes the earlier one's blocks (once their K/V are written) and prefills only its own tokens.
TEST(Generation, ConcurrentRequestsShareASystemPromptsBlocks) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  Tokenizer tok = char_tokenizer(tmp, 96);
  GenerationParams p;
  p.max_new_tokens = 6;
  p.ignore_eos = true;
  std::vector<int32_t> system;
  for (int t = 0; t < 12; ++t) system.push_back(static_cast<int32_t>(40 + t));
  std::vector<int32_t> a = system, b = system;
  a.insert(a.end(), {1, 2});
  b.insert(b.end(), {3, 4, 5});
  GeneratorOptions o = f32_kv(4);
  o.block_tokens = 4;
  Generator gen(f.model, tok, o);
  const uint64_t ia = gen.add(a, p);
  gen.step();  // a's prompt is prefilled: its three system blocks are written
  const uint64_t ib = gen.add(b, p);
  gen.step();
  // a: 15 tokens in 4 blocks, b: 15 in 4, three of them the same.
  EXPECT_EQ(gen.kv_block_stats().used, 5);
  while (!gen.idle()) gen.step();
  SequenceResult ra = gen.take_result(ia), rb = gen.take_result(ib);
  EXPECT_EQ(ra.cached_tokens, 0);
  EXPECT_EQ(rb.cached_tokens, 12);
  GeneratorOptions off = o;
  off.prefix_caching = false;
  const auto want = test::greedy_tokens(f.model, tok, off, {a, b}, p);
  EXPECT_EQ(ra.tokens, want[0]);
  EXPECT_EQ(rb.tokens, want[1]);
}

// A cancelled sequence leaves the K/V of the tokens it got through, and a prompt that was being
// prefilled in chunks leaves those of its finished chunks.
TEST(Generation, PrefixCacheKeepsWhatACancelledSequenceComputed) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  Tokenizer tok = char_tokenizer(tmp, 96);
  GenerationParams p;
  p.max_new_tokens = 4;
  p.ignore_eos = true;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 20; ++i) prompt.push_back(static_cast<int32_t>(20 + i));
  GeneratorOptions o = f32_kv(1);
  o.max_step_tokens = 8;
  Generator gen(f.model, tok, o);
  uint64_t id = gen.add(prompt, p);
  gen.step();  // tokens 0..7
  gen.step();  // 8..15
  gen.cancel(id);
  gen.step();
  ASSERT_TRUE(gen.finished(id));
  EXPECT_EQ(gen.take_result(id).finish, FinishReason::Cancelled);
  auto r = gen.generate_all({prompt}, p)[0];
  EXPECT_EQ(r.cached_tokens, 16);
  GeneratorOptions off = f32_kv(1);
  off.prefix_caching = false;
  EXPECT_EQ(r.tokens, Generator(f.model, tok, off).generate_all({prompt}, p)[0].tokens);
}

TEST(Generation, SamplingIsReproducibleWithASeed) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  Tokenizer tok = char_tokenizer(tmp, 96);
  GenerationParams p;
  p.max_new_tokens = 16;
  p.sampling.temperature = 1.5f;
  p.sampling.top_p = 0.95f;
  p.sampling.top_k = 40;
  p.sampling.seed = 1234;
  Generator gen(f.model, tok, f32_kv(2));
  auto r1 = gen.generate_all({{7, 8, 9}}, p);
  auto r2 = gen.generate_all({{7, 8, 9}}, p);
  EXPECT_EQ(r1[0].tokens, r2[0].tokens);
  // Different seeds give different samples (16 tokens at T=1.5 from 96 ids).
  std::set<std::vector<int32_t>> distinct;
  for (uint64_t s = 0; s < 5; ++s) {
    p.sampling.seed = s;
    distinct.insert(gen.generate_all({{7, 8, 9}}, p)[0].tokens);
  }
  EXPECT_GT(distinct.size(), 1u);
  // top_k = 1 and a tiny top_p are greedy.
  GenerationParams greedy;
  greedy.max_new_tokens = 16;
  auto g = gen.generate_all({{7, 8, 9}}, greedy)[0].tokens;
  p.sampling.top_k = 1;
  EXPECT_EQ(gen.generate_all({{7, 8, 9}}, p)[0].tokens, g);
  p.sampling.top_k = 0;
  p.sampling.top_p = 1e-6f;
  EXPECT_EQ(gen.generate_all({{7, 8, 9}}, p)[0].tokens, g);
}

TEST(Generation, LogprobsAreLogSoftmaxOfTheChosenToken) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  Tokenizer tok = char_tokenizer(tmp, 90);  // ids 90..95 exist in the model but not the tokenizer
  const int64_t V = f.model.config().vocab_size;
  // Sampled on the host (temperature 1) and greedy, chosen on the device (argmax_lse).
  for (float temperature : {1.f, 0.f}) {
    Generator gen(f.model, tok, f32_kv(1));
    GenerationParams p;
    p.max_new_tokens = 5;
    p.sampling.temperature = temperature;
    p.sampling.seed = 3;
    p.top_logprobs = 5;
    std::vector<std::vector<float>> rows;
    auto r =
        gen.generate_all({{1, 2, 3}}, p, [&](uint64_t, const float* row, int64_t) { rows.emplace_back(row, row + V); });
    ASSERT_EQ(rows.size(), r[0].tokens.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_LT(r[0].tokens[i], 90);  // never an id the tokenizer cannot produce
      double mx = -1e300, z = 0;
      int arg = 0;
      for (int v = 0; v < 90; ++v)
        if (rows[i][v] > mx) mx = rows[i][v], arg = v;
      for (int v = 0; v < 90; ++v) z += std::exp(rows[i][v] - mx);
      EXPECT_NEAR(r[0].logprobs[i], rows[i][r[0].tokens[i]] - mx - std::log(z), 1e-4) << "T=" << temperature;
      // The alternatives: the five likeliest valid ids in order, with their log-probabilities.
      std::vector<int> order(90);
      for (int v = 0; v < 90; ++v) order[v] = v;
      std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return rows[i][x] > rows[i][y]; });
      ASSERT_EQ(r[0].top.at(i).size(), 5u);
      for (int k = 0; k < 5; ++k) {
        EXPECT_EQ(r[0].top[i][k].first, order[k]) << "step " << i << " rank " << k;
        EXPECT_NEAR(r[0].top[i][k].second, rows[i][order[k]] - mx - std::log(z), 1e-4);
      }
      if (temperature == 0.f) {
        EXPECT_EQ(r[0].tokens[i], arg);
      }
    }
    // Without an observer the greedy path moves no logits; the result is the same.
    if (temperature == 0.f) {
      Generator g2(f.model, tok, f32_kv(1));
      auto r2 = g2.generate_all({{1, 2, 3}}, p);
      EXPECT_EQ(r2[0].tokens, r[0].tokens);
      EXPECT_EQ(r2[0].logprobs, r[0].logprobs);
    }
  }
}

TEST(Generation, TopLogprobsWithoutAnObserverAndLimits) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  Tokenizer tok = char_tokenizer(tmp, 90);
  // Without an observer (the daemon's path) the same alternatives come out.
  Generator g1(f.model, tok, f32_kv(1)), g2(f.model, tok, f32_kv(1));
  GenerationParams p;
  p.max_new_tokens = 3;
  p.top_logprobs = 3;
  auto a = g1.generate_all({{4, 5}}, p);
  auto b = g2.generate_all({{4, 5}}, p, [](uint64_t, const float*, int64_t) {});
  ASSERT_EQ(a[0].top.size(), 3u);
  EXPECT_EQ(a[0].top[0].size(), 3u);
  EXPECT_EQ(a[0].top, b[0].top);
  p.top_logprobs = 21;
  EXPECT_THROW(g1.add({1}, p), Error);
}

TEST(Generation, StopStringsEosAndLength) {
  test::TempDir tmp;
  Fixture f("decoder_prefix_bin");
  Tokenizer plain = char_tokenizer(tmp, 96);
  GenerationParams p;
  p.max_new_tokens = 12;
  std::vector<int32_t> prompt = {40, 41, 42};
  Generator gen(f.model, plain, f32_kv(1));
  auto base = gen.generate_all({prompt}, p)[0];
  ASSERT_EQ(base.text.size(), 12u);  // one character per token
  EXPECT_EQ(base.finish, FinishReason::Length);

  // A stop string found in the middle ends the text before it.
  GenerationParams ps = p;
  ps.stop = {base.text.substr(5, 2)};
  size_t first = base.text.find(ps.stop[0]);
  auto stopped = gen.generate_all({prompt}, ps)[0];
  EXPECT_EQ(stopped.finish, FinishReason::Stop);
  EXPECT_EQ(stopped.text, base.text.substr(0, first));
  EXPECT_EQ(stopped.tokens.size(), first + 2);

  // EOS: make the 4th generated token the tokenizer's eos.
  test::TempDir tmp2;
  Tokenizer with_eos = char_tokenizer(tmp2, 96, std::string(1, static_cast<char>('!' + base.tokens[3])));
  size_t eos_at = 0;
  while (base.tokens[eos_at] != base.tokens[3]) ++eos_at;
  Generator g2(f.model, with_eos, f32_kv(1));
  auto e = g2.generate_all({prompt}, p)[0];
  EXPECT_EQ(e.finish, FinishReason::Stop);
  EXPECT_EQ(e.tokens.size(), eos_at + 1);  // EOS is the last token and not in the text
  EXPECT_EQ(e.text, base.text.substr(0, eos_at));
  GenerationParams ignore = p;
  ignore.ignore_eos = true;
  EXPECT_EQ(g2.generate_all({prompt}, ignore)[0].tokens, base.tokens);

  // A stop token id ends the sequence as EOS does, and ignore_eos does not lift it.
  GenerationParams ids = ignore;
  ids.stop_token_ids = {base.tokens[3]};
  auto s = gen.generate_all({prompt}, ids)[0];
  EXPECT_EQ(s.finish, FinishReason::Stop);
  EXPECT_EQ(s.tokens.size(), eos_at + 1);
  EXPECT_EQ(s.text, base.text.substr(0, eos_at));

  // Zero new tokens finishes at once with "length".
  GenerationParams zero = p;
  zero.max_new_tokens = 0;
  auto z = gen.generate_all({prompt}, zero)[0];
  EXPECT_TRUE(z.tokens.empty());
  EXPECT_EQ(z.finish, FinishReason::Length);
}

// min_new_tokens (vLLM's min_tokens): before it, EOS and the stop ids are masked out of the
// choice and stop strings are not matched; the tokens chosen meanwhile are those a -100 bias on
// the end ids gives, and from then on the end is allowed again.
TEST(Generation, MinTokensHoldsBackEosStopIdsAndStopStrings) {
  test::TempDir tmp, tmp2;
  Fixture f("decoder_prefix_bin");
  Tokenizer plain = char_tokenizer(tmp, 96);
  GenerationParams p;
  p.max_new_tokens = 12;
  const std::vector<int32_t> prompt = {40, 41, 42};
  Generator gen(f.model, plain, f32_kv(2));
  const SequenceResult base = gen.generate_all({prompt}, p)[0];
  ASSERT_EQ(base.tokens.size(), 12u);
  const int32_t end = base.tokens[3];
  size_t end_at = 0;
  while (base.tokens[end_at] != end) ++end_at;
  Tokenizer with_eos = char_tokenizer(tmp2, 96, std::string(1, static_cast<char>('!' + end)));
  Generator g2(f.model, with_eos, f32_kv(2));
  for (bool stop_id : {false, true}) {
    Generator& g = stop_id ? gen : g2;
    GenerationParams q = p;
    if (stop_id) q.stop_token_ids = {end};
    ASSERT_EQ(g.generate_all({prompt}, q)[0].tokens.size(), end_at + 1);  // ends at its first end id
    GenerationParams held = q;
    held.min_new_tokens = static_cast<int>(end_at) + 4;
    GenerationParams biased = q;
    biased.sampling.logit_bias = {{end, -100.f}};
    const SequenceResult want = g.generate_all({prompt}, biased)[0];
    const SequenceResult got = g.generate_all({prompt}, held)[0];
    ASSERT_GE(got.tokens.size(), static_cast<size_t>(held.min_new_tokens)) << stop_id;
    for (int i = 0; i < held.min_new_tokens; ++i) {
      EXPECT_NE(got.tokens[static_cast<size_t>(i)], end) << i;
      EXPECT_EQ(got.tokens[static_cast<size_t>(i)], want.tokens[static_cast<size_t>(i)]) << i;
    }
    // Past the minimum the end is allowed again: the first end id after it ends the sequence.
    auto first_end = std::find(got.tokens.begin() + held.min_new_tokens, got.tokens.end(), end);
    if (first_end != got.tokens.end()) {
      EXPECT_EQ(got.finish, FinishReason::Stop);
      EXPECT_EQ(first_end + 1, got.tokens.end());
    } else {
      EXPECT_EQ(got.finish, FinishReason::Length);
      EXPECT_EQ(got.tokens.size(), 12u);
    }
  }
  // An end id made overwhelmingly likely (+100): without a minimum it is the first token; with
  // one of 5 it comes sixth, greedy or sampled, and sampled with a seed it is reproducible.
  for (float temperature : {0.f, 1.f}) {
    GenerationParams q = p;
    q.sampling.temperature = temperature;
    q.sampling.seed = 7;
    q.sampling.logit_bias = {{end, 100.f}};
    EXPECT_EQ(g2.generate_all({prompt}, q)[0].tokens, std::vector<int32_t>{end});
    q.min_new_tokens = 5;
    const SequenceResult got = g2.generate_all({prompt}, q)[0];
    ASSERT_EQ(got.tokens.size(), 6u) << temperature;
    EXPECT_EQ(got.tokens.back(), end);
    EXPECT_EQ(std::count(got.tokens.begin(), got.tokens.end(), end), 1);
    EXPECT_EQ(got.finish, FinishReason::Stop);
    EXPECT_EQ(got.text.size(), 5u);  // the end id adds no text
    EXPECT_EQ(g2.generate_all({prompt}, q)[0].tokens, got.tokens);
  }
  // A stop string is not matched before the minimum: one found in the first tokens is kept.
  size_t at = 1;  // the first character not seen before it
  while (at < base.text.size() && base.text.find(base.text[at]) < at) ++at;
  ASSERT_LT(at, 9u);
  GenerationParams ps = p;
  ps.stop = {base.text.substr(at, 1)};
  ASSERT_EQ(gen.generate_all({prompt}, ps)[0].text, base.text.substr(0, at));
  ps.min_new_tokens = static_cast<int>(at) + 2;
  const SequenceResult kept = gen.generate_all({prompt}, ps)[0];
  EXPECT_EQ(kept.tokens, std::vector<int32_t>(base.tokens.begin(), base.tokens.begin() + static_cast<long>(kept.tokens.size())));
  // Matching starts with the text of the token that reaches the minimum, as for any new token.
  const size_t later = base.text.find(ps.stop[0], at + 1);
  EXPECT_EQ(kept.text, later == std::string::npos ? base.text : base.text.substr(0, later));
  // A minimum above the maximum is refused.
  GenerationParams bad = p;
  bad.min_new_tokens = 13;
  EXPECT_THROW(gen.add(prompt, bad), Error);
  bad.min_new_tokens = -1;
  EXPECT_THROW(gen.add(prompt, bad), Error);
}

TEST(Generation, StreamedTextHoldsBackPossibleStopStrings) {
  test::TempDir tmp;
  Fixture f("decoder_prefix_bin");
  Tokenizer plain = char_tokenizer(tmp, 96);
  GenerationParams p;
  p.max_new_tokens = 12;
  Generator gen(f.model, plain, f32_kv(1));
  auto base = gen.generate_all({{40, 41, 42}}, p)[0];
  p.stop = {base.text.substr(6, 3)};
  uint64_t id = gen.add({40, 41, 42}, p);
  std::string streamed;
  while (!gen.idle())
    for (const auto& ev : gen.step()) {
      ASSERT_EQ(ev.id, id);
      streamed += ev.text;
      // Nothing shown may later turn out to be part of the stop string.
      EXPECT_EQ(streamed.find(p.stop[0]), std::string::npos);
    }
  EXPECT_EQ(streamed, gen.take_result(id).text);
}

TEST(Generation, BadRequestsAreRejectedWithOneLineErrors) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  Tokenizer tok = char_tokenizer(tmp, 96);
  Generator gen(f.model, tok, f32_kv(1));
  GenerationParams p;
  EXPECT_THROW(gen.add({}, p), Error);
  EXPECT_THROW(gen.add({96}, p), Error);
  EXPECT_THROW(gen.add({-1}, p), Error);
  EXPECT_THROW(gen.add(std::vector<int32_t>(64, 5), p), Error);  // context is 64
  GenerationParams bad = p;
  bad.sampling.temperature = -1;
  EXPECT_THROW(gen.add({1}, bad), Error);
  bad = p;
  bad.sampling.top_p = 0;
  EXPECT_THROW(gen.add({1}, bad), Error);
  bad.sampling.top_p = 1;
  bad.sampling.min_p = 1.5f;
  EXPECT_THROW(gen.add({1}, bad), Error);
  try {
    gen.add({200}, p);
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "token id 200 is out of range [0, 96)");
  }
}

TEST(Generation, LengthStopsAtTheContextLimit) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  Tokenizer tok = char_tokenizer(tmp, 96);
  Generator gen(f.model, tok, f32_kv(1));
  GenerationParams p;
  p.max_new_tokens = 1000;
  p.ignore_eos = true;
  auto r = gen.generate_all({std::vector<int32_t>(60, 7)}, p)[0];
  EXPECT_EQ(r.finish, FinishReason::Length);
  EXPECT_EQ(r.prompt.size() + r.tokens.size(), 64u);
}

namespace {
// The demo model (kvpr make-demo-model) written to a temporary directory and loaded.
struct Demo {
  test::TempDir tmp;
  CpuBackend be;
  std::unique_ptr<OptModel> m;
  std::unique_ptr<Tokenizer> tok;
  Demo() {
    write_demo_model(tmp.file("demo"), default_demo_spec(), default_tokenizer_dir());
    m = std::make_unique<OptModel>(be, tmp.file("demo"));
    tok = std::make_unique<Tokenizer>(Tokenizer::load(tmp.file("demo")));
  }
};
}  // namespace

TEST(Generation, DemoModelRunsWithTheRealTokenizer) {
  Demo d;
  test::TempDir& tmp = d.tmp;
  OptModel& m = *d.m;
  Tokenizer& tok = *d.tok;
  EXPECT_EQ(tok.size(), 50257);
  EXPECT_EQ(tok.eos_id(), 50256);
  Generator gen(m, tok);
  GenerationParams p;
  p.max_new_tokens = 8;
  auto r = gen.generate_all({tok.encode("Hello, world")}, p)[0];
  EXPECT_EQ(r.tokens.size() + (r.finish == FinishReason::Stop ? 0 : 0), r.tokens.size());
  for (int32_t t : r.tokens) EXPECT_LT(t, 50257);
  EXPECT_EQ(r.text, sanitize_utf8(r.text));
  // The demo model is deterministic: writing it again gives the same bytes.
  write_demo_model(tmp.file("demo2"), default_demo_spec(), default_tokenizer_dir());
  std::ifstream a(tmp.file("demo/model.safetensors"), std::ios::binary), b(tmp.file("demo2/model.safetensors"), std::ios::binary);
  EXPECT_TRUE(std::equal(std::istreambuf_iterator<char>(a), {}, std::istreambuf_iterator<char>(b)));
}

// response_format json_object on the demo model (GPT-2's 50257 tokens, multi-byte and special
// ones among them): every sampled text is JSON the recognizer takes byte by byte, one that ends
// on its own (stop) is a whole object that parses, and a bias towards "{" and "}" gives "{}" and
// then the end (only limited whitespace may follow a complete object).
TEST(Generation, JsonObjectKeepsTheTextJson) {
  Demo d;
  OptModel& m = *d.m;
  Tokenizer& tok = *d.tok;
  GeneratorOptions o;
  o.max_batch = 4;
  Generator gen(m, tok, o);
  GenerationParams p;
  p.max_new_tokens = 40;
  p.json_object = true;
  p.sampling.temperature = 1.0f;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    p.sampling.seed = seed;
    auto r = gen.generate_all({tok.encode("Answer in JSON:")}, p)[0];
    JsonRecognizer json;
    EXPECT_TRUE(json.feed(r.text)) << r.text;
    if (r.finish == FinishReason::Stop) {
      EXPECT_TRUE(json.complete()) << r.text;
      EXPECT_TRUE(json::parse(r.text).is_object()) << r.text;
    }
  }
  GenerationParams g;
  g.max_new_tokens = 80;
  g.json_object = true;
  const int32_t open = tok.encode("{")[0], close = tok.encode("}")[0];
  g.sampling.logit_bias = {{open, 100.f}, {close, 100.f}};
  auto r = gen.generate_all({tok.encode("Answer in JSON:")}, g)[0];
  EXPECT_EQ(r.finish, FinishReason::Stop) << r.text;
  const size_t end = r.text.find_last_not_of(" \t\r\n");
  EXPECT_EQ(r.text.substr(0, end + 1), "{}") << r.text;
  EXPECT_LE(r.text.size(), 2u + 48u);
}

// A constrained text that no token of the vocabulary continues fails with an error; it never
// ends `stop` unfinished. The demo model cut to GPT-2's first 216 ids has every byte but the space
// (id 220) and those after it: {"const": "a b"} is begun and cannot go on; "ab" ends whole.
TEST(Generation, AConstrainedTextNoTokenContinuesFailsRatherThanStops) {
  test::TempDir tmp;
  CpuBackend be;
  DemoModelSpec spec = default_demo_spec();
  spec.config.vocab_size = 216;
  write_demo_model(tmp.file("demo"), spec, default_tokenizer_dir());
  OptModel m(be, tmp.file("demo"));
  Tokenizer tok = Tokenizer::load(tmp.file("demo"));
  for (bool speculative : {false, true}) {
    GeneratorOptions o;
    if (speculative) o.speculative_tokens = 3;
    Generator gen(m, tok, o);
    GenerationParams p;
    p.max_new_tokens = 40;
    p.json_schema = json::parse(R"({"const": "a b"})");
    // (Speculative: the prompt repeats what the answer begins with, so drafts follow it.)
    const std::vector<int32_t> prompt = tok.encode(speculative ? "x\"a\"a\"a" : "x");
    for (int32_t t : prompt) ASSERT_LT(t, 216);
    const uint64_t id = gen.add(prompt, p);
    std::vector<StepOutput> ends;
    while (!gen.idle())
      for (StepOutput& out : gen.step())
        if (out.finish != FinishReason::None) ends.push_back(out);
    ASSERT_EQ(ends.size(), 1u);
    EXPECT_EQ(ends[0].finish, FinishReason::Error);
    EXPECT_NE(ends[0].error.find("cannot be finished"), std::string::npos) << ends[0].error;
    SequenceResult r = gen.take_result(id);
    EXPECT_EQ(r.finish, FinishReason::Error);
    EXPECT_EQ(r.text.substr(r.text.find_first_not_of(" \t\r\n")), "\"a") << r.text;
    p.json_schema = json::parse(R"({"const": "ab"})");
    r = gen.generate_all({tok.encode("x")}, p)[0];
    EXPECT_EQ(r.finish, FinishReason::Stop) << r.text;
    EXPECT_EQ(json::parse(r.text).as_string(), "ab") << r.text;
  }
}

// constrain_after (gpt-oss's final channel header): the text is free until the generated ids
// contain the header, then JSON. Greedy, the first ids are the unconstrained answer's, through
// the header (taken from that answer); what follows them is JSON that ends on its own as a
// whole object; the end id is held back before the header, so a header that never comes gives
// a text that runs to max_tokens.
TEST(Generation, ConstraintAfterAHeaderKeepsTheRestJson) {
  Demo d;
  Tokenizer& tok = *d.tok;
  Generator gen(*d.m, tok, GeneratorOptions{});
  GenerationParams free;
  free.max_new_tokens = 6;
  free.ignore_eos = true;
  const std::vector<int32_t> prompt = tok.encode("Answer in JSON:");
  const std::vector<int32_t> head = gen.generate_all({prompt}, free)[0].tokens;
  ASSERT_EQ(head.size(), 6u);
  GenerationParams p;
  p.max_new_tokens = 60;
  p.json_object = true;
  p.constrain_after = {head[2], head[3]};
  // Where the answer first ends with them (a repeated id may match early).
  size_t e = 2;
  while (e < head.size() && !(head[e - 1] == head[2] && head[e] == head[3])) ++e;
  ASSERT_LT(e, head.size());
  auto r = gen.generate_all({prompt}, p)[0];
  ASSERT_GT(r.tokens.size(), e + 1);
  EXPECT_EQ(std::vector<int32_t>(r.tokens.begin(), r.tokens.begin() + static_cast<std::ptrdiff_t>(e + 1)),
            std::vector<int32_t>(head.begin(), head.begin() + static_cast<std::ptrdiff_t>(e + 1)));
  std::string rest;
  for (size_t i = e + 1; i < r.tokens.size(); ++i) rest += tok.decode({r.tokens[i]});
  JsonRecognizer json;
  EXPECT_TRUE(json.feed(rest)) << rest;
  if (r.finish == FinishReason::Stop) {
    EXPECT_TRUE(json::parse(rest).is_object()) << rest;
  }
  // A header the model never writes: no JSON, and no end before max_tokens.
  GenerationParams never = free;
  never.ignore_eos = false;
  never.max_new_tokens = 12;
  never.json_object = true;
  const int32_t banned = tok.encode("{")[0];
  never.constrain_after = {banned};
  never.sampling.logit_bias = {{banned, -100.f}};  // (never chosen)
  auto n = gen.generate_all({prompt}, never)[0];
  EXPECT_EQ(n.finish, FinishReason::Length);
  EXPECT_EQ(n.tokens.size(), 12u);
  EXPECT_TRUE(std::find(n.tokens.begin(), n.tokens.end(), *tok.eos_id()) == n.tokens.end());
  // A header with an end id could never be written (held back until it is): refused.
  GenerationParams ends = never;
  ends.constrain_after = {*tok.eos_id()};
  EXPECT_THROW(gen.add(prompt, ends), Error);
}

namespace {
// The textbook distribution: sort every candidate, softmax at the temperature, nucleus prefix
// cut further by min_p. Returns the kept (id, weight) in order, weights relative to the top one.
std::vector<std::pair<int32_t, double>> reference_kept(const std::vector<float>& logits, const SamplingParams& p) {
  std::vector<std::pair<float, int32_t>> c;
  for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i) c.emplace_back(logits[i], i);
  std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < c.size()) c.resize(p.top_k);
  std::vector<double> w(c.size());
  double z = 0;
  for (size_t i = 0; i < c.size(); ++i) z += w[i] = std::exp((c[i].first - c[0].first) / p.temperature);
  size_t keep = c.size();
  double cum = 0;
  for (size_t i = 0; i < c.size() && p.top_p < 1.f; ++i)
    if ((cum += w[i]) / z >= p.top_p) {
      keep = i + 1;
      break;
    }
  for (size_t i = 0; i < keep; ++i)  // w[i] is p(i) / p(top)
    if (w[i] < p.min_p) {
      keep = i;
      break;
    }
  std::vector<std::pair<int32_t, double>> kept;
  for (size_t i = 0; i < keep; ++i) kept.emplace_back(c[i].second, w[i]);
  return kept;
}

// The textbook draw: walk reference_kept with u * mass. sample_token sorts only the prefix it needs.
int32_t reference_draw(const std::vector<float>& logits, const SamplingParams& p, Rng& rng) {
  const auto kept = reference_kept(logits, p);
  double mass = 0;
  for (const auto& [id, w] : kept) mass += w;
  double u = rng.uniform() * mass;
  for (const auto& [id, w] : kept)
    if ((u -= w) < 0) return id;
  return kept.back().first;
}
}  // namespace

TEST(Sampling, DrawsWhatAFullSortDraws) {
  Rng data(7);
  std::vector<float> logits(50272);
  std::vector<std::pair<float, int32_t>> scratch;
  int trials = 0;
  for (float t : {0.3f, 0.7f, 1.f, 1.5f})
    for (int k : {0, 5, 50, 2000})
      for (float top_p : {1.f, 0.9f, 0.5f})
        for (float min_p : {0.f, 0.02f, 0.3f}) {
          for (auto& l : logits) l = static_cast<float>(8.0 * data.uniform() - 4.0);  // flat: a long nucleus
          logits[123] = logits[4567] = 6.f;                                         // a tie at the top
          SamplingParams p;
          p.temperature = t;
          p.top_k = k;
          p.top_p = top_p;
          p.min_p = min_p;
          for (uint64_t seed = 0; seed < 2; ++seed, ++trials) {
            Rng a(seed), b(seed);
            Sampled got = sample_token(logits.data(), static_cast<int32_t>(logits.size()), p, a, scratch);
            EXPECT_EQ(got.token, reference_draw(logits, p, b))
                << "T=" << t << " k=" << k << " p=" << top_p << " min_p=" << min_p;
            EXPECT_EQ(a.next(), b.next());  // one uniform per token, as before
          }
        }
  EXPECT_EQ(trials, 288);
}

// Where every candidate is kept and the walk goes deep (a flat distribution, a high
// temperature), sample_token selects instead of sorting the rest: the same ids as the full sort,
// ties included (logits on a grid of 16 values over 50,000 ids, ties going to the lower id).
TEST(Sampling, DeepDrawsSelectWhatAFullSortDraws) {
  Rng data(11);
  std::vector<float> logits(50000);
  std::vector<std::pair<float, int32_t>> scratch;
  for (float t : {1.f, 4.f}) {
    for (auto& l : logits) l = static_cast<float>(std::floor(16.0 * data.uniform())) * 0.25f;
    SamplingParams p;
    p.temperature = t;
    std::vector<int32_t> ids;
    for (uint64_t seed = 0; seed < 120; ++seed) {
      Rng a(seed), b(seed);
      const int32_t got = sample_token(logits.data(), static_cast<int32_t>(logits.size()), p, a, scratch).token;
      ASSERT_EQ(got, reference_draw(logits, p, b)) << "T=" << t << " seed " << seed;
      ids.push_back(got);
    }
    std::sort(ids.begin(), ids.end());
    EXPECT_GT(std::unique(ids.begin(), ids.end()) - ids.begin(), 100);  // deep walks, not the head
  }
}

// Speculative sampling against a one-token draft leaves the distribution of the chosen token
// exactly sample_token's (the textbook one: reference_draw's weights over its kept prefix), for
// drafts the distribution favours, ones it disfavours, ones top-k, top-p or min-p cut, and ids out
// of range; the draft is accepted as often as its probability.
TEST(Sampling, SpeculativeSamplingKeepsTheDistribution) {
  const std::vector<float> logits = {2.f, 1.f, 0.5f, 0.f, -1.f, 1.f, -3.f, 0.2f, 1.5f, -0.5f, 0.9f, 0.1f};
  const int32_t V = static_cast<int32_t>(logits.size());
  auto textbook = [&](const SamplingParams& p) {  // q over the ids, as reference_draw weighs them
    std::vector<double> q(V, 0.0);
    double mass = 0;
    const auto kept = reference_kept(logits, p);
    for (const auto& [id, w] : kept) mass += w;
    for (const auto& [id, w] : kept) q[id] = w / mass;
    return q;
  };
  std::vector<std::pair<float, int32_t>> scratch;
  const double lse = row_argmax_lse(logits.data(), V).lse;
  const int n = 60000;
  int cases = 0;
  for (float t : {0.7f, 1.3f})
    for (int k : {0, 5})
      for (float top_p : {1.f, 0.8f})
        for (float min_p : {0.f, 0.2f})
          for (int32_t draft : {0, 3, 6, 8, 40}) {
            SamplingParams p;
            p.temperature = t;
            p.top_k = k;
            p.top_p = top_p;
            p.min_p = min_p;
            const std::vector<double> q = textbook(p);
            Rng rng(1000 + cases++);
            std::vector<int> count(V, 0);
            int accepted = 0;
            for (int i = 0; i < n; ++i) {
              const Speculated r = speculative_sample(logits.data(), V, p, rng, scratch, draft);
              ++count[r.pick.token];
              accepted += r.accepted;
              ASSERT_EQ(r.accepted, r.pick.token == draft && r.accepted);
              EXPECT_FLOAT_EQ(r.pick.logprob, static_cast<float>(logits[r.pick.token] - lse));  // the model's own
            }
            const std::string what = "T=" + std::to_string(t) + " k=" + std::to_string(k) + " p=" +
                                     std::to_string(top_p) + " min_p=" + std::to_string(min_p) + " draft " +
                                     std::to_string(draft);
            const double qd = draft < V ? q[draft] : 0.0;
            EXPECT_NEAR(accepted / static_cast<double>(n), qd, 5 * std::sqrt(qd * (1 - qd) / n) + 1e-9) << what;
            for (int32_t i = 0; i < V; ++i) {
              const double f = count[i] / static_cast<double>(n), sd = std::sqrt(q[i] * (1 - q[i]) / n);
              EXPECT_NEAR(f, q[i], 5 * sd + 1e-9) << what << " id " << i;
            }
          }
  EXPECT_EQ(cases, 80);
}

TEST(Sampling, FrequenciesFollowTheTemperedSoftmax) {
  const std::vector<float> logits = {2.f, 1.f, 0.5f, 0.f, -1.f, 1.f, -3.f, 0.2f};
  SamplingParams p;
  p.temperature = 0.8f;
  Rng rng(99);
  std::vector<std::pair<float, int32_t>> scratch;
  std::vector<int> count(logits.size(), 0);
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++count[sample_token(logits.data(), 8, p, rng, scratch).token];
  double z = 0;
  for (float l : logits) z += std::exp(l / 0.8);
  for (size_t i = 0; i < logits.size(); ++i)
    EXPECT_NEAR(count[i] / static_cast<double>(n), std::exp(logits[i] / 0.8) / z, 0.01) << "token " << i;
}

// Prompt scoring (echo + logprobs in the API): every prompt token after the first gets its
// log-probability under the float64 torch logits of the fixture, with alternatives; scoring
// does not change what is generated, and max_new_tokens = 0 only scores.
TEST(Generation, PromptLogprobsMatchTheReferenceLogits) {
  test::TempDir tmp;
  const std::string dir = test::data_path("opt/pre_ln_safetensors");
  Fixture f("pre_ln_safetensors");
  const int64_t V = f.model.config().vocab_size;
  Tokenizer tok = char_tokenizer(tmp, static_cast<int>(V));
  NpyArray ids = read_npy(dir + "/input_ids.npy");
  NpyArray ref = read_npy(dir + "/logits.npy");  // [T, V], float64, independent implementation
  const std::vector<int32_t> prompt(ids.values.begin(), ids.values.end());
  const size_t T = prompt.size();
  GenerationParams p;
  p.max_new_tokens = 0;
  p.prompt_logprobs = 3;
  Generator gen(f.model, tok, f32_kv(2));
  auto scored = gen.generate_all({prompt}, p);
  EXPECT_TRUE(scored[0].tokens.empty());
  EXPECT_EQ(scored[0].finish, FinishReason::Length);
  ASSERT_EQ(scored[0].prompt_logprobs.size(), T - 1);
  ASSERT_EQ(scored[0].prompt_top.size(), T - 1);
  for (size_t j = 0; j + 1 < T; ++j) {
    const double* row = ref.values.data() + j * V;
    double mx = row[0], z = 0;
    int best = 0;
    for (int64_t v = 0; v < V; ++v)
      if (row[v] > mx) mx = row[v], best = static_cast<int>(v);
    for (int64_t v = 0; v < V; ++v) z += std::exp(row[v] - mx);
    EXPECT_NEAR(scored[0].prompt_logprobs[j], row[prompt[j + 1]] - mx - std::log(z), 1e-3) << "position " << j;
    ASSERT_EQ(scored[0].prompt_top[j].size(), 3u);
    EXPECT_EQ(scored[0].prompt_top[j][0].first, best);
    EXPECT_NEAR(scored[0].prompt_top[j][0].second, -std::log(z), 1e-3);
  }
  // Scoring while generating: the same scores, and the same tokens as without scoring.
  GenerationParams g;
  g.max_new_tokens = 4;
  auto plain = gen.generate_all({prompt}, g);
  g.prompt_logprobs = 0;
  auto both = gen.generate_all({prompt, {4, 5, 6}}, g);
  EXPECT_EQ(both[0].tokens, plain[0].tokens);
  ASSERT_EQ(both[0].prompt_logprobs.size(), T - 1);
  for (size_t j = 0; j + 1 < T; ++j)  // another batch shape: equal up to GEMM rounding
    EXPECT_NEAR(both[0].prompt_logprobs[j], scored[0].prompt_logprobs[j], 1e-4);
  EXPECT_TRUE(both[0].prompt_top.empty());
  EXPECT_EQ(both[1].prompt_logprobs.size(), 2u);
}

// Penalties and logit_bias change the choice as OpenAI defines them, against the raw logits
// the observer sees; reported log-probabilities stay the model's own.
TEST(Generation, PenaltiesAndLogitBiasAdjustTheChoice) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  Tokenizer tok = char_tokenizer(tmp, 90);
  const int64_t V = f.model.config().vocab_size;
  GenerationParams p;
  p.max_new_tokens = 10;
  p.ignore_eos = true;
  p.sampling.frequency_penalty = 1.5f;
  p.sampling.presence_penalty = 0.5f;
  std::vector<std::vector<float>> rows;
  auto observe = [&](uint64_t, const float* row, int64_t) { rows.emplace_back(row, row + V); };
  Generator gen(f.model, tok, f32_kv(1));
  auto r = gen.generate_all({{1, 2, 3}}, p, observe);
  ASSERT_EQ(rows.size(), 10u);
  std::map<int32_t, int> count;
  for (size_t k = 0; k < rows.size(); ++k) {
    int best = -1;
    double best_v = -1e300, mx = -1e300, z = 0;
    for (int v = 0; v < 90; ++v) {
      const double adj = rows[k][v] - 1.5 * count[v] - (count[v] > 0 ? 0.5 : 0.0);
      if (adj > best_v) best_v = adj, best = v;
      mx = std::max(mx, static_cast<double>(rows[k][v]));
    }
    for (int v = 0; v < 90; ++v) z += std::exp(rows[k][v] - mx);
    EXPECT_EQ(r[0].tokens[k], best) << "step " << k;
    EXPECT_NEAR(r[0].logprobs[k], rows[k][best] - mx - std::log(z), 1e-4);  // the model's own
    ++count[r[0].tokens[k]];
  }
  // The penalties change what greedy decoding picks on this model.
  GenerationParams plain;
  plain.max_new_tokens = 10;
  plain.ignore_eos = true;
  auto g = gen.generate_all({{1, 2, 3}}, plain);
  EXPECT_NE(g[0].tokens, r[0].tokens);
  // A +100 bias forces its token; -100 forbids greedy's first choice.
  GenerationParams biased = plain;
  biased.sampling.logit_bias = {{42, 100.f}};
  biased.sampling.temperature = 1.f;
  biased.sampling.seed = 1;
  auto b = gen.generate_all({{1, 2, 3}}, biased);
  EXPECT_EQ(b[0].tokens, std::vector<int32_t>(10, 42));
  biased.sampling = {};
  biased.sampling.logit_bias = {{g[0].tokens[0], -100.f}};
  EXPECT_NE(gen.generate_all({{1, 2, 3}}, biased)[0].tokens[0], g[0].tokens[0]);
  biased.sampling.presence_penalty = 2.5f;
  EXPECT_THROW(gen.add({1}, biased), Error);
}

// repetition_penalty as Hugging Face's RepetitionPenaltyLogitsProcessor: every distinct id of the
// prompt and of the output so far, its logit divided by the penalty where positive, multiplied
// where negative; against the raw logits the observer sees.
TEST(Generation, RepetitionPenaltyCoversPromptAndOutput) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  Tokenizer tok = char_tokenizer(tmp, 90);
  const int64_t V = f.model.config().vocab_size;
  const std::vector<int32_t> prompt = {1, 2, 3, 3};
  GenerationParams p;
  p.max_new_tokens = 10;
  p.ignore_eos = true;
  p.sampling.repetition_penalty = 1.8f;
  std::vector<std::vector<float>> rows;
  auto observe = [&](uint64_t, const float* row, int64_t) { rows.emplace_back(row, row + V); };
  Generator gen(f.model, tok, f32_kv(1));
  auto r = gen.generate_all({prompt}, p, observe);
  ASSERT_EQ(rows.size(), 10u);
  std::set<int32_t> seen(prompt.begin(), prompt.end());
  for (size_t k = 0; k < rows.size(); ++k) {
    int best = -1;
    double best_v = -1e300;
    for (int v = 0; v < 90; ++v) {
      double x = rows[k][v];
      if (seen.count(v)) x = x < 0 ? x * 1.8 : x / 1.8;
      if (x > best_v) best_v = x, best = v;
    }
    EXPECT_EQ(r[0].tokens[k], best) << "step " << k;
    seen.insert(r[0].tokens[k]);
  }
  GenerationParams plain = p;
  plain.sampling.repetition_penalty = 1.f;
  EXPECT_NE(gen.generate_all({prompt}, plain)[0].tokens, r[0].tokens);
  p.sampling.repetition_penalty = 0.f;
  EXPECT_THROW(gen.add({1}, p), Error);
}

// The fp8 (E4M3) KV cache. Teacher-forced: a 30-token prompt scored in chunks of 4 tokens, so
// every chunk attends to K/V read back from the cache (from the host store, or recomputed from
// fp8 X for kvpr and recompute). resident, offload and cpu-attn store and read the same bytes and
// give the same scores bit for bit; every mode stays within fp8's rounding of the f32 cache's
// scores (E4M3 keeps 3 mantissa bits: each stored value is within 2^-4 of itself).
TEST(Generation, FusedRecomputeGivesResidentTokens) {
  test::TempDir tmp;
  CpuBackend cpu;
  test::expect_fused_recompute_gives_resident_tokens(cpu, test::data_path("opt/pre_ln_safetensors"),
                                                     test::char_tokenizer(tmp, 96));
}

TEST(Generation, Fp8KvCacheInEveryMode) {
  test::TempDir tmp;
  Tokenizer tok = char_tokenizer(tmp, 96);
  CpuBackend cpu;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 30; ++i) prompt.push_back(static_cast<int32_t>((i * 53 + 7) % 90));
  for (const char* name : {"opt/pre_ln_safetensors", "opt/post_ln_proj_sharded", "llama/llama3_rope_gqa_bf16",
                           "llama/qwen3_mha_head_dim_f32", "llama/mistral_sliding_window"}) {
    std::unique_ptr<Model> model = load_model(cpu, test::data_path(name));
    auto scores = [&](KvMode m, DType dt) { return test::chunked_prompt_scores(*model, tok, m, dt, prompt); };
    const std::vector<float> f32 = scores(KvMode::Resident, DType::F32);
    const std::vector<float> fp8 = scores(KvMode::Resident, DType::F8E4M3);
    ASSERT_EQ(fp8.size(), prompt.size() - 1);
    for (KvMode m : kAllKvModes) {
      const std::vector<float> got = scores(m, DType::F8E4M3);
      ASSERT_EQ(got.size(), f32.size());
      const test::ScoreGap g = test::score_gap(got, f32);
      ASSERT_TRUE(g.finite) << name << " " << kv_mode_name(m);
      const double mean = g.mean, worst = g.worst;
      // Measured on these fixtures: means 0.02-0.10 and worst 0.08-0.9 nats (recomputing K/V
      // from fp8 X adds its own rounding; most with Qwen3's K norm); a cache read wrongly is
      // off by whole nats.
      EXPECT_GT(mean, 0.0) << name << " " << kv_mode_name(m) << ": fp8 rounding left no trace";
      EXPECT_LT(mean, 0.15) << name << " " << kv_mode_name(m);
      EXPECT_LT(worst, 1.0) << name << " " << kv_mode_name(m);
      if (m == KvMode::Offload || m == KvMode::CpuAttn) {
        EXPECT_EQ(got, fp8) << name << " " << kv_mode_name(m);
      }
    }
  }
}

// Speculative decoding by prompt lookup gives the tokens of decoding one at a time, in every KV
// mode, with weights resident and streamed, on OPT, Llama-family and mixture-of-experts fixtures;
// the tiny random models fall into loops their prompts or outputs already show, so drafts are
// taken.
TEST(Generation, SpeculativeDecodingGivesTheSameTokensInEveryMode) {
  test::TempDir tmp;
  Tokenizer tok = char_tokenizer(tmp, 96);
  CpuBackend cpu;
  int64_t accepted = 0;
  for (const char* name : {"opt/pre_ln_safetensors", "opt/post_ln_proj_sharded", "llama/gqa_f32_safetensors",
                           "llama/qwen3_head_dim_qk_norm_bf16", "llama/qwen3_moe_dense_layer_f32"})
    accepted += test::expect_speculation_gives_cpu_tokens(cpu, test::data_path(name), tok, 24, name);
  EXPECT_GT(accepted, 0);
}

// With the real tokenizer: what ends a sequence (a stop string, max_tokens, an end id) inside a
// run of accepted drafts ends it there, with the text and finish reason of decoding one token at
// a time;
// the per-step events carry every token once, in order. A request that cannot speculate (here,
// penalised) decodes beside it as it would alone.
TEST(Generation, SpeculativeDecodingStopsWhereOneTokenAtATimeStops) {
  Demo d;
  Tokenizer& tok = *d.tok;
  const std::vector<int32_t> prompt = tok.encode("The cache lives in host memory and the cache lives");
  GenerationParams greedy;
  greedy.max_new_tokens = 40;
  GeneratorOptions plain;
  plain.max_batch = 4;
  GeneratorOptions spec = plain;
  spec.speculative_tokens = 5;
  // The reference run tells where the drafts will be taken: stop at a string from its middle,
  // and cut max_tokens inside a run of repeated tokens.
  const SequenceResult ref = Generator(*d.m, tok, plain).generate_all({prompt}, greedy)[0];
  ASSERT_GE(ref.tokens.size(), 30u);
  Generator probe(*d.m, tok, spec);
  EXPECT_EQ(probe.generate_all({prompt}, greedy)[0].tokens, ref.tokens);
  ASSERT_GT(probe.speculation_stats().accepted, 5) << "the demo model's greedy loop is no longer predictable";
  std::vector<GenerationParams> cases;
  for (int n : {1, 9, 17, 23}) {
    GenerationParams p = greedy;
    p.max_new_tokens = n;
    cases.push_back(p);
  }
  GenerationParams stop = greedy;
  stop.stop = {tok.decode({ref.tokens[20], ref.tokens[21]})};
  cases.push_back(stop);
  GenerationParams stop_id = greedy;
  stop_id.stop_token_ids = {ref.tokens[15]};
  cases.push_back(stop_id);
  for (const GenerationParams& p : cases) {
    // Beside it, a greedy request with a repetition penalty, which does not speculate (its logits
    // are adjusted on the host); the same two requests without speculation are the reference.
    GenerationParams sampled = greedy;
    sampled.sampling.repetition_penalty = 1.3f;
    Generator ref_gen(*d.m, tok, plain);
    const uint64_t ref_id = ref_gen.add(prompt, p), ref_other = ref_gen.add(prompt, sampled);
    while (!ref_gen.idle()) ref_gen.step();
    const SequenceResult want = ref_gen.take_result(ref_id);
    Generator gen(*d.m, tok, spec);
    const uint64_t id = gen.add(prompt, p);
    const uint64_t other = gen.add(prompt, sampled);
    std::vector<int32_t> streamed;
    std::string text;
    while (!gen.idle())
      for (const StepOutput& o : gen.step())
        if (o.id == id) {
          if (o.token >= 0) streamed.push_back(o.token);
          text += o.text;
        }
    const SequenceResult got = gen.take_result(id);
    EXPECT_EQ(got.tokens, want.tokens) << p.max_new_tokens;
    EXPECT_EQ(got.text, want.text);
    EXPECT_EQ(text, want.text);
    EXPECT_EQ(streamed, want.tokens);
    EXPECT_EQ(got.finish, want.finish);
    EXPECT_EQ(got.logprobs.size(), got.tokens.size());
    for (size_t i = 0; i < got.logprobs.size() && i < want.logprobs.size(); ++i)
      EXPECT_NEAR(got.logprobs[i], want.logprobs[i], 1e-4);
    EXPECT_EQ(gen.take_result(other).tokens, ref_gen.take_result(ref_other).tokens);
  }
}

// Sampled requests speculate too: a draft is taken with its probability under the request's
// distribution (Sampling.SpeculativeSamplingKeepsTheDistribution), so a seed gives the same
// tokens run after run (other draws than without speculation); greedy requests with
// alternatives and penalties, or in JSON mode, give exactly the tokens, log-probabilities,
// alternatives and text of one token at a time.
TEST(Generation, SpeculativeDecodingWithSamplingPenaltiesAndAlternatives) {
  Demo d;
  Tokenizer& tok = *d.tok;
  const std::vector<int32_t> prompt = tok.encode("The cache lives in host memory and the cache lives");
  GeneratorOptions plain;
  plain.max_batch = 2;
  GeneratorOptions spec = plain;
  spec.speculative_tokens = 4;
  GenerationParams sampled;
  sampled.max_new_tokens = 40;
  sampled.sampling.temperature = 0.1f;  // the demo model's near-flat logits: cooled, its text repeats
  sampled.sampling.top_p = 0.9f;
  sampled.sampling.seed = 11;
  Generator a(*d.m, tok, spec), b(*d.m, tok, spec);
  const SequenceResult ra = a.generate_all({prompt}, sampled)[0], rb = b.generate_all({prompt}, sampled)[0];
  EXPECT_EQ(ra.tokens, rb.tokens);
  EXPECT_EQ(ra.tokens.size(), 40u);
  EXPECT_GT(a.speculation_stats().accepted, 0);
  for (size_t i = 0; i < ra.tokens.size(); ++i) EXPECT_LE(ra.logprobs[i], 0.f);

  GenerationParams greedy;
  greedy.max_new_tokens = 40;
  greedy.top_logprobs = 3;
  greedy.sampling.frequency_penalty = 0.1f;  // small: the demo model's loop still repeats
  const SequenceResult want = Generator(*d.m, tok, plain).generate_all({prompt}, greedy)[0];
  Generator g(*d.m, tok, spec);
  const SequenceResult got = g.generate_all({prompt}, greedy)[0];
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.top.size(), want.top.size());
  for (size_t i = 0; i < got.top.size(); ++i) {
    ASSERT_EQ(got.top[i].size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(got.top[i][k].first, want.top[i][k].first) << i;
      EXPECT_NEAR(got.top[i][k].second, want.top[i][k].second, 1e-4) << i;
    }
  }
  EXPECT_GT(g.speculation_stats().accepted, 0);

  // JSON mode: each row is masked as the drafts taken before it left the text; the same JSON.
  GenerationParams json_mode;
  json_mode.max_new_tokens = 120;
  json_mode.json_object = true;
  const SequenceResult jw = Generator(*d.m, tok, plain).generate_all({prompt}, json_mode)[0];
  Generator jg(*d.m, tok, spec);
  const SequenceResult jr = jg.generate_all({prompt}, json_mode)[0];
  EXPECT_EQ(jr.tokens, jw.tokens);
  EXPECT_EQ(jr.text, jw.text);
  EXPECT_EQ(jr.finish, jw.finish);
  EXPECT_GT(jg.speculation_stats().proposed, 0);

  // A step holds at most max_step_tokens tokens, drafts included: with a budget of 3 and two
  // sequences decoding, one draft a step at most (the same tokens, more steps).
  GeneratorOptions tight = spec;
  tight.max_step_tokens = 3;
  GenerationParams g2;
  g2.max_new_tokens = 30;
  GeneratorOptions tight_plain = plain;
  tight_plain.max_step_tokens = 3;
  const auto want2 = Generator(*d.m, tok, tight_plain).generate_all({prompt, prompt}, g2);
  Generator tg(*d.m, tok, tight);
  for (uint64_t i = 0; i < 2; ++i) tg.add(prompt, g2);
  int64_t before = 0;
  while (!tg.idle()) {
    tg.step();
    EXPECT_LE(tg.speculation_stats().proposed - before, 1);
    before = tg.speculation_stats().proposed;
  }
  EXPECT_EQ(tg.take_result(1).tokens, want2[0].tokens);
  EXPECT_EQ(tg.take_result(2).tokens, want2[1].tokens);
  EXPECT_GT(tg.speculation_stats().accepted, 0);
}

// A model whose end id is an ordinary token (Qwen2.5's "#" is id 2, its eos_token_id in some
// fine-tunes): once a JSON reply is complete the mask allows the end id, and choosing it ends
// the reply; it is never fed to the JSON recognizer as text (that threw and ended every sequence
// on the worker).
TEST(Generation, AnEndIdThatIsAnOrdinaryTokenEndsAJsonReply) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  // The end id from the model's config, not a special token of the tokenizer: "#" is text.
  Tokenizer plain = char_tokenizer(tmp, 96);
  std::ofstream(tmp.file("tok/config.json")) << "{\"eos_token_id\": 2}";
  Tokenizer tok = Tokenizer::load(tmp.file("tok"));
  ASSERT_TRUE(tok.is_eos(2));
  ASSERT_EQ(tok.decode({2}), "#");
  GenerationParams g;
  g.max_new_tokens = 20;
  g.json_object = true;
  const int32_t open = tok.encode("{")[0], close = tok.encode("}")[0];
  g.sampling.logit_bias = {{open, 100.f}, {close, 100.f}};
  for (bool stop_id : {false, true}) {  // the same through stop_token_ids
    Generator gen(f.model, stop_id ? plain : tok, f32_kv(2));
    if (stop_id) g.stop_token_ids = {2};
    for (float temperature : {0.f, 1.f}) {
      g.sampling.temperature = temperature;
      auto r = gen.generate_all({{7, 8, 9}}, g)[0];
      EXPECT_EQ(r.finish, FinishReason::Stop) << r.text;
      EXPECT_EQ(r.text, "{}");
      ASSERT_FALSE(r.tokens.empty());
      EXPECT_EQ(r.tokens.back(), 2);
    }
  }
}

// A JSON Schema travels as the request gave it; the Generator compiles it for the request and
// refuses one it cannot compile as the request's "json_schema" part (also when it comes again,
// from the refusals it remembers), and the text it gives for an accepted one is valid against it.
TEST(Generation, CompilesEachSchemaAndRefusesWhatItCannotCompile) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  Tokenizer tok = char_tokenizer(tmp, 96);
  Generator gen(f.model, tok, f32_kv(2));
  GenerationParams g;
  g.max_new_tokens = 40;
  g.json_schema = json::parse(R"({"$ref": "#"})");  // a cycle that consumes no text
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      gen.add({7, 8, 9}, g);
      ADD_FAILURE() << "a schema that cannot be compiled was accepted";
    } catch (const RequestRefused& e) {
      EXPECT_EQ(e.part(), "json_schema");
      EXPECT_HAS(std::string(e.what()), "$ref");
    }
  }
  EXPECT_TRUE(gen.idle());
  g.json_schema = json::parse(R"({"type": "object", "properties": {"a": {"enum": [1, 2]}}, "required": ["a"],
                                  "additionalProperties": false})");
  for (int i = 0; i < 2; ++i) {  // each request its own recognizer
    const SequenceResult r = gen.generate_all({{7, 8, 9}}, g)[0];
    EXPECT_EQ(r.finish, FinishReason::Stop) << r.text;
    EXPECT_TRUE(r.text == R"({"a": 1})" || r.text == R"({"a": 2})" || r.text == R"({"a":1})" || r.text == R"({"a":2})")
        << r.text;
  }
}

// A fault in one sequence's per-sequence work (its constraint, its sampling, its detokenizing,
// its stop matching) ends that sequence alone with an error; every other sequence of the batch
// gets exactly the tokens it gets when nothing fails.
TEST(Generation, OneSequencesFaultEndsItAloneAtEveryStage) {
  test::TempDir tmp;
  Fixture f("pre_ln_safetensors");
  Tokenizer tok = char_tokenizer(tmp, 96);
  GenerationParams p;
  p.max_new_tokens = 12;
  p.ignore_eos = true;
  p.json_object = true;            // a constraint on every sequence
  p.sampling.temperature = 0.8f;   // chosen on the host
  p.sampling.seed = 7;
  p.stop = {"zz"};
  const std::vector<std::vector<int32_t>> prompts = {{7, 8, 9}, {10, 11}, {12, 13, 14, 15}, {16}};
  std::vector<SequenceResult> ref;
  {
    Generator gen(f.model, tok, f32_kv(4));
    ref = gen.generate_all(prompts, p);
  }
  for (SequenceStage stage : {SequenceStage::Constraint, SequenceStage::Sampling, SequenceStage::Detokenize,
                              SequenceStage::StopMatch}) {
    SCOPED_TRACE(static_cast<int>(stage));
    Generator gen(f.model, tok, f32_kv(4));
    std::vector<uint64_t> ids;
    for (const auto& q : prompts) ids.push_back(gen.add(q, p));
    int calls = 0;
    gen.set_fault_hook([&](SequenceStage s, uint64_t id) {
      if (s == stage && id == ids[1] && ++calls == 3) throw Error("injected fault");
    });
    std::vector<StepOutput> errors;
    while (!gen.idle())
      for (StepOutput& o : gen.step())
        if (o.finish == FinishReason::Error) errors.push_back(o);
    ASSERT_EQ(errors.size(), 1u);
    EXPECT_EQ(errors[0].id, ids[1]);
    EXPECT_EQ(errors[0].error, "injected fault");
    for (size_t k = 0; k < prompts.size(); ++k) {
      SequenceResult r = gen.take_result(ids[k]);
      if (k == 1) {
        EXPECT_EQ(r.finish, FinishReason::Error);
        EXPECT_LT(r.tokens.size(), ref[k].tokens.size());
      } else {
        EXPECT_EQ(r.tokens, ref[k].tokens) << "sequence " << k;
        EXPECT_EQ(r.finish, ref[k].finish);
      }
    }
    EXPECT_EQ(gen.kv_block_stats().used, 0) << "every block back";
  }
}
