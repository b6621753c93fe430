// The CUDA kernels (engine/backend/cuda/*.cu), run by the SIMT emulator (simt_emu.h) on the CPU,
// against the CPU backend's ops. CI has no GPU: this is where kernel indexing, bounds,
// reductions and split merges are checked on every change (and under ASan in CI's second
// phase). tests/engine/backend/test_cuda.cc runs the same comparisons on a real device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cuda/kernels.h"
#include "engine/base/json.h"
#include "engine/backend/argmax_lse.h"
#include "tests/test_util.h"

using namespace kvpr;

namespace {

double tol(DType t) { return t == DType::F32 ? 1e-4 : t == DType::F16 ? 1e-2 : 4e-2; }

std::vector<double> as_double(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = load_as_f32(t.data(), t.dtype(), i);
  return v;
}
std::vector<float> as_float(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = load_as_f32(t.data(), t.dtype(), i);
  return v;
}

Tensor random(CpuBackend& cpu, DType dt, Shape shape, uint64_t seed, float stddev = 1.f) {
  Tensor t = cpu.alloc(dt, std::move(shape));
  cpu.fill_random(t, seed, 0.f, stddev);
  return t;
}

class SimtKernels : public ::testing::TestWithParam<DType> {};

}  // namespace

TEST_P(SimtKernels, GatherLayerNormAddConvert) {
  CpuBackend cpu;
  const DType dt = GetParam();
  const int V = 97, T = 13;
  for (int D : {45, 300, 769}) {
    Tensor table = random(cpu, dt, {V, D}, 4);
    Tensor ids = cpu.alloc(DType::I32, {T});
    for (int i = 0; i < T; ++i) ids.data_as<int32_t>()[i] = (i * 31) % V;
    Tensor ref = cpu.alloc(DType::F32, {T, D}), got = cpu.alloc(DType::F32, {T, D});
    cpu.gather_rows(ref, table, ids);
    cpu.add_gathered_rows(ref, table, ids);
    cuda::gather_rows(got.data_as<float>(), table.data(), dt, ids.data_as<int32_t>(), V, T, D, false, nullptr);
    cuda::gather_rows(got.data_as<float>(), table.data(), dt, ids.data_as<int32_t>(), V, T, D, true, nullptr);
    EXPECT_TRUE(test::close_rel(as_double(ref), got.data_as<float>(), T * D, 1e-6)) << "gather D=" << D;

    Tensor g = random(cpu, dt, {D}, 5), b = random(cpu, dt, {D}, 6);
    Tensor ln_ref = cpu.alloc(DType::F32, {T, D}), ln = cpu.alloc(DType::F32, {T, D});
    cpu.layer_norm(ln_ref, ref, g, b, 1e-5f);
    cuda::layer_norm(ln.data_as<float>(), got.data_as<float>(), g.data(), b.data(), dt, T, D, 1e-5f, nullptr);
    EXPECT_TRUE(test::close_rel(as_double(ln_ref), ln.data_as<float>(), T * D, 1e-5)) << "layer_norm D=" << D;
    cuda::layer_norm(got.data_as<float>(), got.data_as<float>(), g.data(), b.data(), dt, T, D, 1e-5f, nullptr);
    EXPECT_TRUE(test::close_rel(as_double(ln_ref), got.data_as<float>(), T * D, 1e-5)) << "in place D=" << D;

    Tensor sum_ref = cpu.alloc(DType::F32, {T, D}), sum = cpu.alloc(DType::F32, {T, D});
    cpu.add(sum_ref, ln_ref, ref);
    cuda::add(sum.data_as<float>(), ln.data_as<float>(), ref.data_as<float>(), T * D, nullptr);
    EXPECT_TRUE(test::close_rel(as_double(sum_ref), sum.data_as<float>(), T * D, 1e-6));

    for (DType to : {DType::F32, DType::F16, DType::BF16}) {
      Tensor c_ref = cpu.alloc(to, {T, D}), c = cpu.alloc(to, {T, D});
      cpu.convert(c_ref, sum_ref);
      cuda::convert(c.data(), to, sum_ref.data(), DType::F32, T * D, nullptr);  // same input: same rounding
      std::vector<float> cv = as_float(c);
      EXPECT_TRUE(test::close_rel(as_double(c_ref), cv.data(), cv.size(), 0)) << "convert to " << dtype_name(to);
    }
  }
}

// Spans of rows from a source into a destination of another dtype, as copy_rows launches
// them: uneven spans, an empty one, destinations out of order; rows outside the spans untouched.
namespace {

// Row copies into and out of `dt` (every float dtype, and fp8 for the KV cache) equal the CPU's.
void check_copy_rows(DType dt) {
  CpuBackend cpu;
  const int64_t W = 131;
  Tensor src = random(cpu, DType::F32, {40, W}, 21);
  for (DType dst_dt : {DType::F32, DType::F16, DType::BF16}) {
    for (DType src_dt : {DType::F32, dt}) {
      Tensor s = cpu.alloc(src_dt, {40, W});
      cpu.convert(s, src);
      std::vector<RowSpan> spans = {{0, 50, 3}, {3, 0, 1}, {4, 10, 0}, {4, 20, 17}, {21, 70, 19}};
      Tensor ref = random(cpu, dst_dt, {90, W}, 22), got = cpu.alloc(dst_dt, {90, W});
      cpu.copy(got, ref, Stream::Compute);
      cpu.copy_rows(ref, s, spans);
      int64_t rows = 0;
      const std::vector<cuda::SpanDesc> descs = cuda::span_descs(spans, &rows);
      cuda::copy_rows(got.data(), dst_dt, s.data(), src_dt, descs.data(), static_cast<int64_t>(descs.size()), rows, W,
                      nullptr);
      std::vector<float> g = as_float(got);
      EXPECT_TRUE(test::close_rel(as_double(ref), g.data(), g.size(), 0))
          << dtype_name(src_dt) << " -> " << dtype_name(dst_dt);
    }
  }
}

}  // namespace

TEST_P(SimtKernels, CopyRowsConvertsEverySpan) { check_copy_rows(GetParam()); }

TEST_P(SimtKernels, BiasActivationAndRandomFill) {
  CpuBackend cpu;
  const DType dt = GetParam();
  const int M = 7, K = 33, N = 131;
  Tensor x = random(cpu, DType::F32, {M, K}, 1);
  Tensor w = random(cpu, dt, {N, K}, 2, 0.2f);
  Tensor b = random(cpu, dt, {N}, 3);
  for (Activation act : {Activation::None, Activation::ReLU, Activation::GELU, Activation::GELUTanh, Activation::SiLU}) {
    Tensor ref = cpu.alloc(DType::F32, {M, N}), plain = cpu.alloc(DType::F32, {M, N});
    cpu.linear(ref, x, w, b, act);
    cpu.linear(plain, x, w, Tensor(), Activation::None);  // the GEMM part (cuBLAS on a GPU)
    const int a = cuda::activation_code(act);
    cuda::bias_act(plain.data(), DType::F32, b.data(), dt, 1, M, N, a, nullptr);
    EXPECT_TRUE(test::close_rel(as_double(ref), plain.data_as<float>(), M * N, 1e-5)) << "act " << a;
  }
  // The bias of a batched linear: bias[b] for out[b] (the stacked Q, K, V projections).
  Tensor w3 = random(cpu, dt, {3, N, K}, 12, 0.2f), b3 = random(cpu, dt, {3, N}, 13);
  for (Activation act : {Activation::None, Activation::GELU}) {
    Tensor ref = cpu.alloc(DType::F32, {3, M, N}), plain = cpu.alloc(DType::F32, {3, M, N});
    cpu.linear_batched(ref, x, w3, b3, act);
    cpu.linear_batched(plain, x, w3, Tensor(), Activation::None);
    cuda::bias_act(plain.data(), DType::F32, b3.data(), dt, 3, M, N, act == Activation::GELU ? 2 : 0, nullptr);
    EXPECT_TRUE(test::close_rel(as_double(ref), plain.data_as<float>(), 3 * M * N, 1e-5)) << "batched bias";
  }
  // An output in the weights' dtype: bias_act rounds the sum once; fill_bias broadcasts the bias
  // rows (the C a GEMM then accumulates into).
  if (dt != DType::F32) {
    Tensor ref = cpu.alloc(DType::F32, {3, M, N}), plain = cpu.alloc(DType::F32, {3, M, N});
    cpu.linear_batched(ref, x, w3, b3, Activation::ReLU);
    cpu.linear_batched(plain, x, w3, Tensor(), Activation::None);
    Tensor low = cpu.alloc(dt, {3, M, N}), want = cpu.alloc(dt, {3, M, N});
    cpu.convert(low, plain);
    cpu.convert(want, ref);
    cuda::bias_act(low.data(), dt, b3.data(), dt, 3, M, N, 1, nullptr);
    // low held the product rounded to dt: one more rounding than want, at most an ulp of dt apart.
    EXPECT_TRUE(test::close_rel(as_double(want), as_float(low).data(), 3 * M * N, dt == DType::F16 ? 2e-3 : 1.6e-2));
    Tensor filled = cpu.alloc(dt, {3, M, N});
    cuda::fill_bias(filled.data(), dt, b3.data(), dt, 3, M, N, nullptr);
    for (int64_t i = 0; i < 3 * M * N; ++i)
      ASSERT_EQ(load_as_f32(filled.data(), dt, i), load_as_f32(b3.data(), dt, (i / (M * N)) * N + i % N)) << i;
  }
  // fill_random: the same counter-based values as the CPU backend.
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{70001}}) {
    Tensor ref = cpu.alloc(dt, {n}), got = cpu.alloc(dt, {n});
    cpu.fill_random(ref, 42, 0.5f, 0.02f);
    cuda::fill_random(got.data(), dt, n, 42, 0.5f, 0.02f, nullptr);
    std::vector<float> g = as_float(got);
    EXPECT_TRUE(test::close_rel(as_double(ref), g.data(), g.size(), tol(dt) * 0.1)) << "fill_random n=" << n;
  }
}

namespace {

// Attention over K/V stored as `dt` equals the CPU backend's over the same values.
void check_attention(DType dt) {
  CpuBackend cpu;
  for (int hd : {8, 64, 80, 128, 256}) {
    // MHA; one KV head for 3 query heads; groups of 4 and of 2 query heads per KV head (the
    // grouped decode kernel's GC = 1, 4, 2).
    for (auto [heads, kv_heads] : {std::pair{3, 3}, {3, 1}, {8, 2}, {4, 2}})
    for (bool decode_only : {false, true})
    for (int layout : {0, 1, 2}) {
      // 0: contiguous K/V; 1: paged; 2: paged with a head segment (keys [0, head) from their own
      // contiguous rows, the rest through the table: KV partly resident).
      const bool paged = layout > 0, two = layout == 2;
      const int hidden = heads * hd;
      const int kvw = kv_heads * hd;
      struct S {
        int q_len, past;
      };
      // Decode contexts over several 256-key splits, shorter ones with empty splits, and a
      // context of one key; mixed batches of prefill chunks with and without a past.
      std::vector<S> spec = decode_only ? std::vector<S>{{1, 0}, {1, 1100}, {1, 37}, {1, 300}}
                                        : std::vector<S>{{20, 9}, {4, 7}, {1, 70}, {33, 0}};
      int T = 0;
      for (auto s : spec) T += s.q_len;
      Tensor q = random(cpu, DType::F32, {T, hidden}, 7);
      std::vector<AttentionSeq> seqs, paged_seqs;
      std::vector<cuda::AttnDesc> descs;
      int off = 0, max_ctx = 0;
      uint64_t seed = 100;
      // Paged: the sequences' keys in one store of blocks handed out in a shuffled order, so
      // consecutive keys cross into scattered blocks: of 7 tokens (a size dividing no context,
      // found by division) for head_dim 8, of 16 (a power of two, found by shifts) for the others.
      const int block = hd == 8 ? 7 : 16;
      std::vector<int32_t> tables, order;
      int64_t total_blocks = 0;
      for (auto s : spec) total_blocks += (s.past + s.q_len + block - 1) / block;
      for (int32_t b = 0; b < total_blocks; ++b) order.push_back(b);
      std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(hd + heads)));
      Tensor kpool = random(cpu, dt, {total_blocks * block, kvw}, 90), vpool = random(cpu, dt, {total_blocks * block, kvw}, 91);
      const size_t es = dtype_size(dt);
      for (auto s : spec) {
        const int n = s.past + s.q_len;
        Tensor k = random(cpu, dt, {n, kvw}, seed++);
        Tensor v = random(cpu, dt, {n, kvw}, seed++);
        if (paged) {  // the same keys, in the pool's blocks
          const size_t first = tables.size();
          for (int i = 0; i * block < n; ++i) tables.push_back(order[tables.size()]);
          AttentionSeq a{off, s.q_len, s.past, kpool, vpool, nullptr, 0, block};
          // Half the blocks (rounded down) in the head segment: the sequence's own rows.
          const int head = two ? (n / block / 2) * block : 0;
          if (head > 0) a = a.with_head(k, v, head);
          for (int t = 0; t < n; ++t) {
            const int64_t row = int64_t{tables[first + static_cast<size_t>(t / block)]} * block + t % block;
            std::memcpy(static_cast<char*>(kpool.data()) + row * kvw * es, static_cast<char*>(k.data()) + t * kvw * es, kvw * es);
            std::memcpy(static_cast<char*>(vpool.data()) + row * kvw * es, static_cast<char*>(v.data()) + t * kvw * es, kvw * es);
          }
          paged_seqs.push_back(a);
          descs.push_back(cuda::AttnDesc{kpool.data(), vpool.data(), head > 0 ? k.data() : nullptr,
                                         head > 0 ? v.data() : nullptr, off, s.q_len, s.past,
                                         static_cast<int32_t>(first), block, head});
          if (head > 0)  // what the head covers is never read from the pool: poison it there
            for (int t = 0; t < head; ++t) {
              const int64_t row = int64_t{tables[first + static_cast<size_t>(t / block)]} * block + t % block;
              std::memset(static_cast<char*>(kpool.data()) + row * kvw * es, 0x7f, kvw * es);
              std::memset(static_cast<char*>(vpool.data()) + row * kvw * es, 0x7f, kvw * es);
            }
        } else {
          descs.push_back(cuda::AttnDesc{k.data(), v.data(), nullptr, nullptr, off, s.q_len, s.past, -1, 0, 0});
        }
        seqs.push_back(AttentionSeq{off, s.q_len, s.past, k, v});
        off += s.q_len;
        max_ctx = std::max(max_ctx, s.past + s.q_len);
      }
      // The tables after the descriptors, as the backend uploads them (cuda::attn_tables).
      std::vector<char> upload(descs.size() * sizeof(cuda::AttnDesc) + tables.size() * sizeof(int32_t));
      std::memcpy(upload.data(), descs.data(), descs.size() * sizeof(cuda::AttnDesc));
      if (!tables.empty())
        std::memcpy(upload.data() + descs.size() * sizeof(cuda::AttnDesc), tables.data(), tables.size() * sizeof(int32_t));
      const auto* desc_ptr = reinterpret_cast<const cuda::AttnDesc*>(upload.data());
      Tensor ref = cpu.alloc(DType::F32, {T, hidden}), got = cpu.alloc(DType::F32, {T, hidden});
      const float scale = 1.f / std::sqrt(static_cast<float>(hd));
      // Full causal; a window of 7 keys with a soft-cap (Gemma 2's layers, scaled small); sink
      // logits (gpt-oss's) on a full layer.
      AttentionParams sunk(scale);
      sunk.sinks = random(cpu, DType::F32, {heads}, 99, 2.f);
      for (const AttentionParams& params : {AttentionParams(scale), AttentionParams(2 * scale, 7, 1.5f), sunk}) {
      cpu.attention(ref, q, seqs, heads, params);
      if (paged) {  // the CPU backend through the tables gives what it gives over contiguous keys
        size_t first = 0;
        for (auto& a : paged_seqs) {
          const size_t nb = static_cast<size_t>((a.past_len + a.q_len + block - 1) / block);
          a.blocks = tables.data() + first;
          a.n_blocks = static_cast<int64_t>(nb);
          first += nb;
        }
        cpu.attention(got, q, paged_seqs, heads, params);
        EXPECT_TRUE(test::close_rel(as_double(ref), got.data_as<float>(), static_cast<size_t>(T) * hidden, 1e-6))
            << "CPU backend, paged" << (two ? " two segments" : "") << ", head_dim " << hd;
      }
      std::vector<float> work(static_cast<size_t>(
          cuda::attention_work_floats(static_cast<int64_t>(descs.size()), max_ctx, heads, hd)));
      // Keys read element by element, and with 16-byte loads (the tensors are aligned); mixed
      // batches by the tiled kernel (head_dim <= 128) and by the one-warp-per-row kernel.
      const std::vector<cuda::AttnTile> tiles = cuda::attention_tiles(descs.data(), static_cast<int64_t>(descs.size()));
      // Decode on 1 SM (one split per sequence) and on 132 (an H200: the long contexts split).
      for (bool aligned : {false, true})
        for (bool tiled : {false, true})
          for (int sms : {1, 132}) {
            if ((tiled && decode_only) || (sms > 1 && !decode_only)) continue;
            std::fill_n(got.data_as<float>(), got.numel(), 0.f);
            cuda::attention(got.data_as<float>(), q.data_as<float>(), desc_ptr, static_cast<int64_t>(descs.size()),
                            T, max_ctx, 33, decode_only, heads, kv_heads, hd, dt, params.scale, params.softcap,
                            params.window, params.sinks.defined() ? params.sinks.data_as<float>() : nullptr,
                            work.data(), aligned,
                            tiled ? tiles.data() : nullptr, tiled ? static_cast<int64_t>(tiles.size()) : 0, sms,
                            nullptr);
            EXPECT_TRUE(test::close_rel(as_double(ref), got.data_as<float>(), static_cast<size_t>(T) * hidden, 1e-4))
                << "head_dim " << hd << ", " << heads << " heads, " << kv_heads << " KV heads"
                << (decode_only ? " decode" : " mixed") << (paged ? " paged" : "") << (two ? " two segments" : "") << (aligned ? " 16-byte loads" : "")
                << (tiled ? " tiled" : "")
                << ", " << sms << " SMs, K/V " << dtype_name(dt) << ", window " << params.window;
          }
      }
    }
  }
}

}  // namespace

TEST_P(SimtKernels, AttentionPrefillMixedAndDecodeSplits) { check_attention(GetParam()); }

// The KV cache's fp8 E4M3: conversions give the CPU's bytes and values exactly (the fixture's
// float32 inputs: every value, neighbours, midpoints, subnormals, saturation, NaN), random
// fill and row copies match, and attention over fp8 K/V matches the CPU's.
TEST(SimtKernelsFp8, ConvertCopyFillAndAttention) {
  CpuBackend cpu;
  std::vector<float> xs;
  for (const test::Fp8Case& c : test::fp8_cases(true)) xs.push_back(c.x);
  const int64_t n = static_cast<int64_t>(xs.size());
  std::vector<uint8_t> bytes(xs.size());
  cuda::convert(bytes.data(), DType::F8E4M3, xs.data(), DType::F32, n, nullptr);
  for (size_t i = 0; i < xs.size(); ++i)
    if (!std::isnan(xs[i])) EXPECT_EQ(bytes[i], f32_to_e4m3(xs[i])) << "float " << xs[i];
    else EXPECT_EQ(bytes[i] & 0x7f, 0x7f) << "NaN stays NaN";
  std::vector<uint8_t> all(256);
  for (int b = 0; b < 256; ++b) all[static_cast<size_t>(b)] = static_cast<uint8_t>(b);
  std::vector<float> widened(256);
  cuda::convert(widened.data(), DType::F32, all.data(), DType::F8E4M3, 256, nullptr);
  for (int b = 0; b < 256; ++b) {
    const float want = e4m3_to_f32(static_cast<uint8_t>(b));
    if (std::isnan(want)) EXPECT_TRUE(std::isnan(widened[static_cast<size_t>(b)])) << "byte " << b;
    else EXPECT_EQ(widened[static_cast<size_t>(b)], want) << "byte " << b;
  }
  for (int64_t count : {int64_t{1}, int64_t{5000}}) {
    Tensor want = cpu.alloc(DType::F8E4M3, {count}), got = cpu.alloc(DType::F8E4M3, {count});
    cpu.fill_random(want, 42, 0.f, 3.f);
    cuda::fill_random(got.data(), DType::F8E4M3, count, 42, 0.f, 3.f, nullptr);
    EXPECT_EQ(std::memcmp(want.data(), got.data(), static_cast<size_t>(count)), 0) << "fill_random n=" << count;
  }
  check_copy_rows(DType::F8E4M3);
  check_attention(DType::F8E4M3);
}

// Greedy choice and log-sum-exp per row: ties go to the first id, ids past `valid` never
// win, a constant row picks id 0; the same as the host's sequential scan (engine/decode/sampling.cc).
TEST(SimtSampling, ArgmaxLseMatchesHostScan) {
  CpuBackend cpu;
  for (auto [R, V, valid] : {std::tuple{6, 50272, 50265}, {3, 1000, 1000}, {3, 33, 7}}) {
    Tensor logits = random(cpu, DType::F32, {R, V}, 9, 3.f);
    float* l = logits.data_as<float>();
    l[0 * V + valid / 2] = l[0 * V + valid - 1] = 40.f;  // a tie: the first one wins
    if (valid < V) l[1 * V + valid] = 100.f;              // beyond valid: ignored
    for (int i = 0; i < V; ++i) l[2 * V + i] = -1.5f;     // constant row: id 0
    Tensor ids = cpu.alloc(DType::I32, {R}), stats = cpu.alloc(DType::F32, {R, 2});
    cuda::argmax_lse(ids.data_as<int32_t>(), stats.data_as<float>(), l, R, V, valid, nullptr);
    Tensor cids = cpu.alloc(DType::I32, {R}), cstats = cpu.alloc(DType::F32, {R, 2});
    cpu.argmax_lse(cids, cstats, logits, valid);
    for (int r = 0; r < R; ++r) {
      const RowStats want = row_argmax_lse(l + static_cast<int64_t>(r) * V, valid);
      EXPECT_EQ(ids.data_as<int32_t>()[r], want.token) << "row " << r << " V " << V;
      EXPECT_EQ(cids.data_as<int32_t>()[r], want.token) << "row " << r << " V " << V;
      EXPECT_EQ(stats.data_as<float>()[2 * r], want.max);
      EXPECT_NEAR(stats.data_as<float>()[2 * r + 1], want.lse, 1e-6 * std::fabs(want.lse) + 1e-6);
      EXPECT_EQ(cstats.data_as<float>()[2 * r + 1], static_cast<float>(want.lse));
    }
    EXPECT_EQ(ids.data_as<int32_t>()[0], valid / 2);
    EXPECT_EQ(ids.data_as<int32_t>()[2], 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SimtKernels, ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });
