// The CUDA backend against the CPU backend: every op on random data of awkward sizes, and
// every KV mode's greedy tokens on the tiny fixtures. Skipped at run time without a device;
// always compiled when the build has CUDA.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <cmath>
#include <cstring>
#include <map>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/base/error.h"
#include "engine/decode/generator.h"
#include "engine/constrain/json_object.h"
#include "engine/base/json.h"
#include "engine/model/opt_model.h"
#include "tests/engine/kv/kv_mode_check.h"
#include "tests/engine/model/reference_check.h"
#include "tests/test_util.h"

using namespace kvpr;

namespace {

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

double tol(DType t) { return t == DType::F32 ? 1e-4 : t == DType::F16 ? 1e-2 : 4e-2; }

// The same random tensor on both backends (fill_random is counter-based), read back as F32.
struct Pair {
  Tensor cpu, gpu;
};
Pair random_pair(Backend& cpu, Backend& gpu, DType dt, Shape shape, uint64_t seed, float stddev = 1.f) {
  Pair p{cpu.alloc(dt, shape), gpu.alloc(dt, shape)};
  cpu.fill_random(p.cpu, seed, 0.f, stddev);
  // Upload the CPU values so both sides hold identical bits (device libm may round differently).
  gpu.copy(p.gpu, p.cpu, Stream::H2D);
  gpu.synchronize();
  return p;
}

std::vector<float> download(Backend& gpu, const Tensor& t) {
  Tensor h = Tensor::host(t.dtype(), t.shape());
  gpu.synchronize();
  gpu.copy(h, t, Stream::D2H);
  gpu.synchronize();
  std::vector<float> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = load_as_f32(h.data(), h.dtype(), i);
  return v;
}

std::vector<double> as_double(const Tensor& t) {
  std::vector<double> v(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = load_as_f32(t.data(), t.dtype(), i);
  return v;
}

class CudaOps : public ::testing::TestWithParam<DType> {};      // weights and activations' dtypes
class CudaKvOps : public ::testing::TestWithParam<DType> {};    // K/V storage: those and fp8 E4M3

}  // namespace

TEST_P(CudaOps, LinearMatchesCpu) {
  SKIP_WITHOUT_GPU();
  CpuBackend cpu;
  auto gpu = create_backend("cuda");
  for (auto [M, K, N] : {std::tuple{1, 37, 19}, {3, 64, 130}, {17, 100, 45}, {67, 31, 129}, {129, 768, 3072}}) {
    Pair x = random_pair(cpu, *gpu, DType::F32, {M, K}, 1);
    Pair w = random_pair(cpu, *gpu, GetParam(), {N, K}, 2, 0.1f);
    Pair b = random_pair(cpu, *gpu, GetParam(), {N}, 3);
    for (Activation act : {Activation::None, Activation::ReLU, Activation::GELU}) {
      Tensor oc = cpu.alloc(DType::F32, {M, N}), og = gpu->alloc(DType::F32, {M, N});
      cpu.linear(oc, x.cpu, w.cpu, b.cpu, act);
      gpu->linear(og, x.gpu, w.gpu, b.gpu, act);
      std::vector<float> got = download(*gpu, og);
      EXPECT_TRUE(test::close_rel(as_double(oc), got.data(), got.size(), tol(GetParam())))
          << "M=" << M << " K=" << K << " N=" << N;
    }
    // Accumulated into a residual (GEMM with beta = 1, then the bias).
    Pair r = random_pair(cpu, *gpu, DType::F32, {M, N}, 4);
    cpu.linear_accumulate(r.cpu, x.cpu, w.cpu, b.cpu);
    gpu->linear_accumulate(r.gpu, x.gpu, w.gpu, b.gpu);
    std::vector<float> got = download(*gpu, r.gpu);
    EXPECT_TRUE(test::close_rel(as_double(r.cpu), got.data(), got.size(), tol(GetParam())))
        << "accumulate M=" << M << " K=" << K << " N=" << N;
  }
}

TEST_P(CudaOps, BatchedLinearMatchesCpu) {
  SKIP_WITHOUT_GPU();
  CpuBackend cpu;
  auto gpu = create_backend("cuda");
  for (auto [B, M, K, N] : {std::tuple{3, 1, 64, 64}, {2, 17, 100, 45}, {3, 32, 768, 768}}) {
    Pair x = random_pair(cpu, *gpu, DType::F32, {M, K}, 41);
    Pair w = random_pair(cpu, *gpu, GetParam(), {B, N, K}, 42, 0.1f);
    Pair b = random_pair(cpu, *gpu, GetParam(), {B, N}, 43);
    for (bool with_bias : {true, false}) {
      Tensor oc = cpu.alloc(DType::F32, {B, M, N}), og = gpu->alloc(DType::F32, {B, M, N});
      cpu.linear_batched(oc, x.cpu, w.cpu, with_bias ? b.cpu : Tensor(), Activation::None);
      gpu->linear_batched(og, x.gpu, w.gpu, with_bias ? b.gpu : Tensor(), Activation::None);
      EXPECT_TRUE(test::close_rel(as_double(oc), download(*gpu, og).data(), B * M * N, tol(GetParam())))
          << "B=" << B << " M=" << M << " K=" << K << " N=" << N << (with_bias ? " bias" : "");
    }
  }
}

// KVPR's recompute GEMM: X as the KV store holds it (the weights' dtype, or fp8) straight into
// the GEMM, K/V out in the weights' dtype with the bias inside the GEMM, against the path through
// fp32 (X widened, fp32 product and bias, rounded when stored) on both backends.
TEST_P(CudaOps, BatchedLinearFromStoredXIntoStoredOutput) {
  SKIP_WITHOUT_GPU();
  CpuBackend cpu;
  auto gpu = create_backend("cuda");
  const DType dt = GetParam();
  for (DType xdt : {dt, DType::F8E4M3}) {
    for (auto [B, M, K, N] : {std::tuple{2, 1, 64, 64}, {2, 17, 100, 45}, {2, 33, 768, 768}}) {
      Pair x = random_pair(cpu, *gpu, xdt, {M, K}, 51);
      Pair w = random_pair(cpu, *gpu, dt, {B, N, K}, 52, 0.1f);
      Pair b = random_pair(cpu, *gpu, dt, {B, N}, 53);
      for (bool with_bias : {true, false}) {
        const Tensor bc = with_bias ? b.cpu : Tensor(), bg = with_bias ? b.gpu : Tensor();
        // Unfused, on the device: X to fp32, fp32 product and bias, then stored in dt.
        Tensor x32 = gpu->alloc(DType::F32, {M, K}), o32 = gpu->alloc(DType::F32, {B, M, N});
        Tensor want = gpu->alloc(dt, {B, M, N});
        gpu->convert(x32, x.gpu);
        gpu->linear_batched(o32, x32, w.gpu, bg, Activation::None);
        gpu->convert(want, o32);
        Tensor og = gpu->alloc(dt, {B, M, N}), oc = cpu.alloc(dt, {B, M, N});
        gpu->linear_batched(og, x.gpu, w.gpu, bg, Activation::None);
        cpu.linear_batched(oc, x.cpu, w.cpu, bc, Activation::None);
        const std::vector<float> got = download(*gpu, og), unfused = download(*gpu, want);
        std::vector<double> ref(unfused.begin(), unfused.end());
        const std::string what = std::string(dtype_name(xdt)) + " X, B=" + std::to_string(B) + " M=" +
                                 std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                                 (with_bias ? " bias" : "");
        EXPECT_TRUE(test::close_rel(ref, got.data(), got.size(), tol(dt))) << "fused vs unfused, " << what;
        EXPECT_TRUE(test::close_rel(as_double(oc), got.data(), got.size(), tol(dt))) << "device vs CPU, " << what;
      }
    }
  }
  if (dt == DType::F32) return;
  // fp8 weights are not a GEMM dtype; an output in another reduced dtype than the weights' is refused.
  Tensor x = gpu->alloc(dt, {4, 64}), w = gpu->alloc(dt, {2, 8, 64});
  const DType other = dt == DType::F16 ? DType::BF16 : DType::F16;
  EXPECT_THROW(gpu->linear_batched(gpu->alloc(other, {2, 4, 8}), x, w, Tensor(), Activation::None), Error);
  EXPECT_THROW(cpu.linear_batched(cpu.alloc(other, {2, 4, 8}), cpu.alloc(dt, {4, 64}), cpu.alloc(dt, {2, 8, 64}),
                                  Tensor(), Activation::None),
               Error);
}

TEST_P(CudaOps, RowOpsMatchCpu) {
  SKIP_WITHOUT_GPU();
  CpuBackend cpu;
  auto gpu = create_backend("cuda");
  const int V = 97, D = 45, T = 13;
  Pair table = random_pair(cpu, *gpu, GetParam(), {V, D}, 4);
  Tensor ids_c = cpu.alloc(DType::I32, {T}), ids_g = gpu->alloc(DType::I32, {T});
  for (int i = 0; i < T; ++i) ids_c.data_as<int32_t>()[i] = (i * 31) % V;
  gpu->copy(ids_g, ids_c, Stream::H2D);
  gpu->wait(Stream::Compute, gpu->record(Stream::H2D));  // the gather reads what the copy stream wrote
  Tensor oc = cpu.alloc(DType::F32, {T, D}), og = gpu->alloc(DType::F32, {T, D});
  cpu.gather_rows(oc, table.cpu, ids_c);
  gpu->gather_rows(og, table.gpu, ids_g);
  cpu.add_gathered_rows(oc, table.cpu, ids_c);
  gpu->add_gathered_rows(og, table.gpu, ids_g);
  EXPECT_TRUE(test::close_rel(as_double(oc), download(*gpu, og).data(), T * D, 1e-6));
  // An expert's 7 rows added back, weighted, into distinct rows (ids and weights in device memory).
  Pair src = random_pair(cpu, *gpu, DType::F32, {7, D}, 7);
  Tensor to_c = cpu.alloc(DType::I32, {7}), to_g = gpu->alloc(DType::I32, {7});
  Tensor w_c = cpu.alloc(DType::F32, {7}), w_g = gpu->alloc(DType::F32, {7});
  for (int i = 0; i < 7; ++i) to_c.data_as<int32_t>()[i] = (12 - 2 * i + T) % T, w_c.data_as<float>()[i] = 0.1f * i - 0.2f;
  gpu->copy(to_g, to_c, Stream::H2D);
  gpu->copy(w_g, w_c, Stream::H2D);
  gpu->wait(Stream::Compute, gpu->record(Stream::H2D));
  cpu.scatter_add_rows(oc, src.cpu, to_c, w_c);
  gpu->scatter_add_rows(og, src.gpu, to_g, w_g);
  EXPECT_TRUE(test::close_rel(as_double(oc), download(*gpu, og).data(), T * D, 1e-6));
  Pair g = random_pair(cpu, *gpu, GetParam(), {D}, 5), bt = random_pair(cpu, *gpu, GetParam(), {D}, 6);
  Tensor lc = cpu.alloc(DType::F32, {T, D}), lg = gpu->alloc(DType::F32, {T, D});
  cpu.layer_norm(lc, oc, g.cpu, bt.cpu, 1e-5f);
  gpu->layer_norm(lg, og, g.gpu, bt.gpu, 1e-5f);
  EXPECT_TRUE(test::close_rel(as_double(lc), download(*gpu, lg).data(), T * D, 1e-5));
  cpu.layer_norm(oc, oc, g.cpu, bt.cpu, 1e-5f);  // in place, on both sides
  gpu->layer_norm(og, og, g.gpu, bt.gpu, 1e-5f);
  EXPECT_TRUE(test::close_rel(as_double(lc), download(*gpu, og).data(), T * D, 1e-5));
  Tensor sc = cpu.alloc(DType::F32, {T, D}), sg = gpu->alloc(DType::F32, {T, D});
  cpu.add(sc, lc, oc);
  gpu->add(sg, lg, og);
  EXPECT_TRUE(test::close_rel(as_double(sc), download(*gpu, sg).data(), T * D, 1e-6));
  Tensor cc = cpu.alloc(GetParam(), {T, D}), cg = gpu->alloc(GetParam(), {T, D});
  cpu.convert(cc, sc);
  gpu->convert(cg, sg);
  EXPECT_TRUE(test::close_rel(as_double(cc), download(*gpu, cg).data(), T * D, tol(GetParam())));
}

TEST_P(CudaKvOps, AttentionPrefillMixedAndLongDecode) {
  SKIP_WITHOUT_GPU();
  CpuBackend cpu;
  auto gpu = create_backend("cuda");
  for (int hd : {8, 64, 80, 128}) {
    const int heads = 3, hidden = heads * hd;
    for (int kv_heads : {3, 1})  // MHA, and one KV head for every query head (GQA)
    for (bool decode_only : {false, true}) {
      const int kvw = kv_heads * hd;
      struct S { int q_len, past; };
      std::vector<S> spec = decode_only ? std::vector<S>{{1, 0}, {1, 5000}, {1, 37}, {1, 700}}
                                        : std::vector<S>{{5, 0}, {4, 7}, {1, 300}, {33, 0}};
      int T = 0;
      for (auto s : spec) T += s.q_len;
      Pair q = random_pair(cpu, *gpu, DType::F32, {T, hidden}, 7);
      std::vector<AttentionSeq> sc, sg;
      int off = 0;
      uint64_t seed = 100;
      for (auto s : spec) {
        Pair k = random_pair(cpu, *gpu, GetParam(), {s.past + s.q_len, kvw}, seed++);
        Pair v = random_pair(cpu, *gpu, GetParam(), {s.past + s.q_len, kvw}, seed++);
        sc.push_back(AttentionSeq{off, s.q_len, s.past, k.cpu, v.cpu});
        sg.push_back(AttentionSeq{off, s.q_len, s.past, k.gpu, v.gpu});
        off += s.q_len;
      }
      Tensor oc = cpu.alloc(DType::F32, {T, hidden}), og = gpu->alloc(DType::F32, {T, hidden});
      const float scale = 1.f / std::sqrt(static_cast<float>(hd));
      // Full causal; windows of 3 keys (inside a tile and a 32-key chunk), 40 (across tiles) and
      // 600 (across decode splits); a soft-cap far from linear; sink logits (gpt-oss) with a window
      // and without (the sink among every decode split's partials).
      Pair sinks = random_pair(cpu, *gpu, DType::F32, {heads}, 77, 2.f);
      AttentionParams sunk(scale, 40, 0.f), sunk_full(scale);
      sunk.sinks = sunk_full.sinks = sinks.cpu;
      for (AttentionParams params : {AttentionParams(scale), AttentionParams(scale, 3, 0.f), AttentionParams(scale, 40, 0.f),
                                     AttentionParams(4 * scale, 600, 1.5f), sunk, sunk_full}) {
        cpu.attention(oc, q.cpu, sc, heads, params);
        if (params.sinks.defined()) params.sinks = sinks.gpu;
        gpu->attention(og, q.gpu, sg, heads, params);
        EXPECT_TRUE(test::close_rel(as_double(oc), download(*gpu, og).data(), T * hidden, 1e-4))
            << "head_dim " << hd << ", " << kv_heads << " KV heads" << (decode_only ? " decode" : " mixed")
            << ", window " << params.window << ", softcap " << params.softcap << (params.sinks.defined() ? ", sinks" : "");
      }
    }
  }
}

// The GEMMs on quantized weights (engine/base/weight.h), read as stored on both backends: decode
// rows (one warp an output, dequantized in registers, 8 rows at a time; 16 bytes of codes at a time
// where rows are whole chunks, a byte at a time where not) and prefill tiles through
// cuBLAS (TF32 on a GPU), int4 with
// zero points and an input order, int8 with I32 zeros, fp8 in partial blocks, fp4 (MXFP4) in
// blocks of 32; accumulated, and
// batched on a stack into a BF16 output with a bias.
TEST(CudaQuantized, LinearMatchesCpu) {
  SKIP_WITHOUT_GPU();
  CpuBackend cpu;
  auto gpu = create_backend("cuda");
  auto upload = [&](const Weight& h) {
    Weight g = h;
    for (Tensor* t : g.parts())
      if (t->defined()) {
        Tensor d = gpu->alloc(t->dtype(), t->shape());
        gpu->copy(d, *t, Stream::H2D);
        *t = d;
      }
    gpu->synchronize();
    return g;
  };
  struct Case {
    WeightFormat format;
    int64_t N, K, group;
    bool zeros, ordered, blocks;
  };
  for (const Case& c : {Case{WeightFormat::Int4, 40, 96, 32, true, true, false},
                        Case{WeightFormat::Int8, 33, 75, 0, true, false, false},
                        Case{WeightFormat::Fp8, 50, 80, 16, false, false, true},
                        Case{WeightFormat::Fp4, 24, 100, 32, false, false, false},  // MXFP4's blocks, a tail
                        // Rows of whole 16-byte chunks (the decode kernel's vector loads): int8 per
                        // channel with I32 zeros, fp4 in MXFP4's blocks, int4 in the middle code.
                        Case{WeightFormat::Int8, 36, 128, 0, true, false, false},
                        Case{WeightFormat::Fp4, 20, 128, 32, false, false, false},
                        Case{WeightFormat::Int4, 12, 256, 64, false, false, false},
                        // Groups that split 16-byte chunks: the byte-at-a-time kernel (int4, fp8).
                        Case{WeightFormat::Int4, 16, 100, 20, true, false, false},
                        Case{WeightFormat::Fp8, 20, 72, 24, false, false, false}}) {
    Pair dense = random_pair(cpu, *gpu, DType::F32, {c.N, c.K}, 61, 0.1f);
    Tensor dh = Tensor::host(DType::F32, {c.N, c.K});
    std::memcpy(dh.data(), dense.cpu.data(), dh.nbytes());
    Weight w = quantize_rtn(dh, c.format, c.group);
    if (c.blocks) {  // fp8 blocks of 16 x 16, the last ones partial: one scale of each block's first row
      Weight b = w;
      b.block_n = 16;
      b.scales = Tensor::host(DType::F32, {b.scale_rows(), b.scale_cols()});
      for (int64_t i = 0; i < b.scales.numel(); ++i)
        b.scales.data_as<float>()[i] = w.scales.data_as<float>()[(i / b.scale_cols()) * 16 * w.scale_cols() + i % b.scale_cols()];
      w = b;
    }
    if (c.zeros) {
      w.zeros = Tensor::host(c.format == WeightFormat::Int4 ? DType::U8 : DType::I32, w.scales.shape());
      for (int64_t i = 0; i < w.zeros.numel(); ++i) {
        if (w.zeros.dtype() == DType::U8) w.zeros.data_as<uint8_t>()[i] = static_cast<uint8_t>(5 + i % 7);
        else w.zeros.data_as<int32_t>()[i] = static_cast<int32_t>(100 + i % 57);
      }
    }
    if (c.ordered) {
      w.order = Tensor::host(DType::I32, {c.K});
      for (int64_t k = 0; k < c.K; ++k) w.order.data_as<int32_t>()[k] = static_cast<int32_t>((k * 37 + 11) % c.K);
    }
    const Weight wg = upload(w);
    for (int64_t M : {1, 5, 8, 12, 70}) {  // one gemv, groups of 8 rows, then TF32 tiles
      Pair x = random_pair(cpu, *gpu, DType::F32, {M, c.K}, 62 + M);
      Tensor oc = cpu.alloc(DType::F32, {M, c.N}), og = gpu->alloc(DType::F32, {M, c.N});
      cpu.linear(oc, x.cpu, w, Tensor(), Activation::None);
      gpu->linear(og, x.gpu, wg, Tensor(), Activation::None);
      const double tol_m = M > 64 ? 1e-2 : 1e-4;  // TF32 tiles on a GPU
      EXPECT_TRUE(test::close_rel(as_double(oc), download(*gpu, og).data(), M * c.N, tol_m))
          << weight_format_name(c.format) << " M=" << M;
      Pair r = random_pair(cpu, *gpu, DType::F32, {M, c.N}, 70 + M);
      cpu.linear_accumulate(r.cpu, x.cpu, w, Tensor());
      gpu->linear_accumulate(r.gpu, x.gpu, wg, Tensor());
      EXPECT_TRUE(test::close_rel(as_double(r.cpu), download(*gpu, r.gpu).data(), M * c.N, tol_m))
          << "accumulate " << weight_format_name(c.format) << " M=" << M;
    }
    // A stack of two (the matrix twice) into BF16 with a bias, from BF16 X (KVPR's recompute).
    Weight sc = w, sg = wg;
    for (auto [host, dst] : {std::pair<const Weight*, Weight*>{&w, &sc}, std::pair<const Weight*, Weight*>{&wg, &sg}}) {
      Backend& be = host == &w ? static_cast<Backend&>(cpu) : *gpu;
      for (auto part : {&Weight::codes, &Weight::scales, &Weight::zeros}) {
        const Tensor& t = host->*part;
        if (!t.defined()) continue;
        Shape sh = t.shape();
        sh.insert(sh.begin(), 2);
        Tensor st = be.alloc(t.dtype(), sh);
        be.copy(st.rows(0, 1).reshape(t.shape()), t, Stream::Compute);
        be.copy(st.rows(1, 1).reshape(t.shape()), t, Stream::Compute);
        dst->*part = st;
      }
      dst->shape = {2, c.N, c.K};
      be.synchronize();
    }
    Pair xb = random_pair(cpu, *gpu, DType::BF16, {12, c.K}, 80), bias = random_pair(cpu, *gpu, DType::BF16, {2, c.N}, 81);
    Tensor oc = cpu.alloc(DType::BF16, {2, 12, c.N}), og = gpu->alloc(DType::BF16, {2, 12, c.N});
    cpu.linear_batched(oc, xb.cpu, sc, bias.cpu, Activation::None);
    gpu->linear_batched(og, xb.gpu, sg, bias.gpu, Activation::None);
    EXPECT_TRUE(test::close_rel(as_double(oc), download(*gpu, og).data(), 2 * 12 * c.N, 1e-2))
        << "batched " << weight_format_name(c.format);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps, ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });
INSTANTIATE_TEST_SUITE_P(Dtypes, CudaKvOps, ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::F8E4M3),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

// fp8 E4M3 on the device: every fixture input (tests/data/fp8/e4m3.json) converts to the CPU's
// byte (the hardware's cvt with saturation on sm_89+), and every byte widens to its value.
TEST(Cuda, Fp8ConversionsMatchTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  CpuBackend cpu;
  auto gpu = create_backend("cuda");
  std::vector<float> xs;
  for (const test::Fp8Case& c : test::fp8_cases(false)) xs.push_back(c.x);
  const int64_t n = static_cast<int64_t>(xs.size());
  Tensor hx = Tensor::host(DType::F32, {n});
  std::memcpy(hx.data(), xs.data(), xs.size() * sizeof(float));
  Tensor dx = gpu->alloc(DType::F32, {n}), d8 = gpu->alloc(DType::F8E4M3, {n}), back = gpu->alloc(DType::F32, {n});
  gpu->copy(dx, hx, Stream::H2D);
  gpu->synchronize();
  gpu->convert(d8, dx);
  gpu->convert(back, d8);
  Tensor h8 = Tensor::host(DType::F8E4M3, {n});
  gpu->synchronize();
  gpu->copy(h8, d8, Stream::D2H);
  gpu->synchronize();
  const std::vector<float> widened = download(*gpu, back);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t want = f32_to_e4m3(xs[static_cast<size_t>(i)]);
    ASSERT_EQ(h8.data_as<uint8_t>()[i], want) << "float " << xs[static_cast<size_t>(i)];
    ASSERT_EQ(widened[static_cast<size_t>(i)], e4m3_to_f32(want)) << "byte " << static_cast<int>(want);
  }
}

// Llama's ops: RMSNorm (gain in the parameter dtype, in place too), rotary embedding of Q and
// K stacked [2, T, width] at scattered positions (up to 4095, where fp32 angles are large),
// and SwiGLU's silu(gate) · up (in place too).
TEST_P(CudaOps, LlamaOpsMatchCpu) {
  SKIP_WITHOUT_GPU();
  CpuBackend cpu;
  auto gpu = create_backend("cuda");
  const int64_t T = 13, D = 333;
  Pair x = random_pair(cpu, *gpu, DType::F32, {T, D}, 51, 3.f);
  Pair g = random_pair(cpu, *gpu, GetParam(), {D}, 52);
  Tensor oc = cpu.alloc(DType::F32, {T, D}), og = gpu->alloc(DType::F32, {T, D});
  cpu.rms_norm(oc, x.cpu, g.cpu, 1e-6f);
  gpu->rms_norm(og, x.gpu, g.gpu, 1e-6f);
  EXPECT_TRUE(test::close_rel(as_double(oc), download(*gpu, og).data(), T * D, 1e-5));
  cpu.rms_norm(x.cpu, x.cpu, g.cpu, 1e-6f);
  gpu->rms_norm(x.gpu, x.gpu, g.gpu, 1e-6f);
  EXPECT_TRUE(test::close_rel(as_double(oc), download(*gpu, x.gpu).data(), T * D, 1e-5));

  RopeParams linear, l3;
  linear.freq_scale = 0.5f;
  l3.theta = 500000.f;
  l3.llama3_factor = 32.f;  // Llama-3.2's
  // Qwen2.5's YaRN: factor 4, pairs 23-40 ramped at head_dim 128, cos and sin scaled.
  const RopeParams yarn{.theta = 1000000.f, .yarn_factor = 4.f, .yarn_low = 23.f, .yarn_high = 40.f,
                        .attention_scale = 1.1386294f};
  RopeParams partial;  // Phi-4-mini's partial rotary: 3/4 of each head turns
  for (int hd : {8, 64, 128})
  for (RopeParams rp : {linear, l3, yarn, partial}) {
    if (rp.llama3_factor == 0 && rp.yarn_factor == 0 && rp.freq_scale == 1.f) rp.rotary_dim = hd * 3 / 4 / 2 * 2;
    const int64_t W = 3 * hd;
    Pair qk = random_pair(cpu, *gpu, DType::F32, {2, T, W}, 53);
    Tensor pc = cpu.alloc(DType::I32, {T}), pg = gpu->alloc(DType::I32, {T});
    for (int i = 0; i < T; ++i) pc.data_as<int32_t>()[i] = i == 0 ? 0 : i == 1 ? 4095 : (i * 377) % 2048;
    gpu->copy(pg, pc, Stream::H2D);
    gpu->wait(Stream::Compute, gpu->record(Stream::H2D));
    cpu.rope(qk.cpu, pc, hd, rp);
    gpu->rope(qk.gpu, pg, hd, rp);
    EXPECT_TRUE(test::close_rel(as_double(qk.cpu), download(*gpu, qk.gpu).data(), 2 * T * W, 1e-5)) << "head_dim " << hd;
  }
  // Phi's longrope (Phi-3.5: 48 pairs of a 96-wide head; Phi-4-mini: 48 of 128 over its partial
  // rotary), each pair's own short and long factors, rows of both regimes (kRopeLong) in one call.
  for (int hd : {96, 128}) {
    RopeParams lr;
    lr.attention_scale = 1.1902381f;
    if (hd == 128) lr.rotary_dim = 96;
    lr.longrope_pairs = 48;
    for (int i = 0; i < 48; ++i) lr.longrope[0][i] = 1.f + 0.05f * i, lr.longrope[1][i] = 1.f + 1.5f * i;
    const int64_t W = 2 * hd;
    Pair qk = random_pair(cpu, *gpu, DType::F32, {2, T, W}, 56);
    Tensor pc = cpu.alloc(DType::I32, {T}), pg = gpu->alloc(DType::I32, {T});
    for (int i = 0; i < T; ++i) pc.data_as<int32_t>()[i] = (i * 977) % 9000 | (i % 2 ? kRopeLong : 0);
    gpu->copy(pg, pc, Stream::H2D);
    gpu->wait(Stream::Compute, gpu->record(Stream::H2D));
    cpu.rope(qk.cpu, pc, hd, lr);
    gpu->rope(qk.gpu, pg, hd, lr);
    EXPECT_TRUE(test::close_rel(as_double(qk.cpu), download(*gpu, qk.gpu).data(), 2 * T * W, 1e-5)) << "longrope " << hd;
    lr.longrope_pairs = 47;
    EXPECT_THROW(gpu->rope(qk.gpu, pg, hd, lr), Error);
  }

  Pair gate = random_pair(cpu, *gpu, DType::F32, {T, D}, 54, 4.f), up = random_pair(cpu, *gpu, DType::F32, {T, D}, 55);
  cpu.gated_mul(oc, gate.cpu, up.cpu, Activation::GELUTanh);  // Gemma's GeGLU
  gpu->gated_mul(og, gate.gpu, up.gpu, Activation::GELUTanh);
  EXPECT_TRUE(test::close_rel(as_double(oc), download(*gpu, og).data(), T * D, 1e-5));
  cpu.gated_mul(oc, gate.cpu, up.cpu, Activation::SiLU);
  gpu->gated_mul(og, gate.gpu, up.gpu, Activation::SiLU);
  EXPECT_TRUE(test::close_rel(as_double(oc), download(*gpu, og).data(), T * D, 1e-5));
  gpu->gated_mul(gate.gpu, gate.gpu, up.gpu, Activation::SiLU);
  EXPECT_TRUE(test::close_rel(as_double(oc), download(*gpu, gate.gpu).data(), T * D, 1e-5));
  for (float cap : {0.f, 2.f}) {  // Gemma's embedding scale; a soft-cap below most |x|
    cpu.scale(oc, up.cpu, 3.f, cap);  // (gate.gpu was overwritten in place above)
    gpu->scale(og, up.gpu, 3.f, cap);
    EXPECT_TRUE(test::close_rel(as_double(oc), download(*gpu, og).data(), T * D, 1e-5)) << "cap " << cap;
  }
}

TEST_P(CudaKvOps, CopyRowsMatchesCpu) {
  SKIP_WITHOUT_GPU();
  CpuBackend cpu;
  auto gpu = create_backend("cuda");
  const int64_t W = 4096 + 3;
  Pair src = random_pair(cpu, *gpu, DType::F32, {64, W}, 31);
  Pair dst = random_pair(cpu, *gpu, GetParam(), {300, W}, 32);
  std::vector<RowSpan> spans;
  for (int i = 0; i < 32; ++i) spans.push_back(RowSpan{2 * i, 299 - 9 * i, i % 3 == 0 ? 0 : 2});
  cpu.copy_rows(dst.cpu, src.cpu, spans);
  gpu->copy_rows(dst.gpu, src.gpu, spans);
  EXPECT_TRUE(test::close_rel(as_double(dst.cpu), download(*gpu, dst.gpu).data(), 300 * W, 0));
  EXPECT_THROW(gpu->copy_rows(dst.gpu, src.gpu, {RowSpan{63, 0, 2}}), Error);  // past the source
}

// copy_spans (a GPU batch's KV copies in one call: 2-D copies for runs at one pitch, one
// batched copy for the rest) against one copy per span, host to device, device to host and on
// the device: uniform, ragged, mixed, single and empty spans, rows at the store's last row.
TEST_P(CudaKvOps, CopySpansMatchesPerSpanCopies) {
  SKIP_WITHOUT_GPU();
  CpuBackend cpu;
  auto gpu = create_backend("cuda");
  const DType dt = GetParam();
  const int64_t W = 40 + 3, slots = 7, cap = 37, rows = slots * cap;
  std::vector<std::vector<RowSpan>> cases;
  std::vector<RowSpan> uniform, ragged, mixed;
  for (int64_t s = 0; s < slots; ++s) uniform.push_back(RowSpan{s * cap + 5, s * 30, 20});  // consecutive slots
  for (int64_t s = 0; s < slots; ++s)
    ragged.push_back(RowSpan{s * cap + s, s * 30 + 2, s == 3 ? 0 : (s * 7) % 30 + 1});  // a 0 among them
  mixed = {RowSpan{0, 0, 4}, RowSpan{cap, 4, 4}, RowSpan{2 * cap, 8, 4},  // a run of 3 ...
           RowSpan{5 * cap, 100, 9}, RowSpan{rows - 3, 150, 3},            // ... then ragged, up to the last row
           RowSpan{3 * cap, 160, 4}, RowSpan{6 * cap, 170, 4}};            // equal, but not one pitch from before
  cases = {uniform, ragged, mixed, {RowSpan{rows - 1, 209, 1}}, {}};
  auto pinned = [&](uint64_t seed, int64_t n) {
    Tensor t = gpu->alloc_pinned(dt, {n, W});
    cpu.fill_random(t, seed, 0.f, 1.f);
    return t;
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const std::vector<RowSpan>& spans = cases[c];
    // Host store -> device buffer (the prefetch), then device buffer -> host store (the store).
    Tensor host = pinned(61 + c, rows), dev = gpu->alloc(dt, {210, W}), want = gpu->alloc(dt, {210, W});
    gpu->copy_spans(dev, host, spans, Stream::H2D, "test");
    for (const RowSpan& r : spans)
      if (r.count) gpu->copy(want.rows(r.dst_row, r.count), host.rows(r.src_row, r.count), Stream::H2D);
    gpu->synchronize();
    EXPECT_EQ(download(*gpu, dev), download(*gpu, want)) << "host to device, case " << c;
    std::vector<RowSpan> back;
    for (const RowSpan& r : spans) back.push_back(RowSpan{r.dst_row, r.src_row, r.count});
    Tensor host2 = pinned(71 + c, rows), host_want = Tensor::host(dt, {rows, W});
    std::memcpy(host_want.data(), host2.data(), host2.nbytes());
    gpu->copy_spans(host2, dev, back, Stream::D2H, "test");
    gpu->synchronize();
    const size_t rb = static_cast<size_t>(W) * dtype_size(dt);
    const std::vector<float> on_device = download(*gpu, dev);
    for (const RowSpan& r : back)
      for (int64_t j = 0; j < r.count; ++j)
        for (int64_t e = 0; e < W; ++e)
          store_from_f32(host_want.data(), dt, (r.dst_row + j) * W + e, on_device[(r.src_row + j) * W + e]);
    EXPECT_EQ(std::memcmp(host2.data(), host_want.data(), static_cast<size_t>(rows) * rb), 0) << "device to host, case " << c;
    // Device to device.
    Tensor dev2 = gpu->alloc(dt, {rows, W});
    gpu->copy_spans(dev2, dev, back, Stream::Compute, "test");
    Tensor dev2_want = gpu->alloc(dt, {rows, W});
    for (const RowSpan& r : back)
      if (r.count) gpu->copy(dev2_want.rows(r.dst_row, r.count), dev.rows(r.src_row, r.count), Stream::Compute);
    EXPECT_EQ(download(*gpu, dev2), download(*gpu, dev2_want)) << "on the device, case " << c;
  }
  Tensor a = gpu->alloc(dt, {8, W}), b = gpu->alloc(dt == DType::F32 ? DType::F16 : DType::F32, {8, W});
  EXPECT_THROW(gpu->copy_spans(a, b, {RowSpan{0, 0, 1}}, Stream::Compute), Error);  // dtypes differ
  EXPECT_THROW(gpu->copy_spans(a, a.rows(0, 4), {RowSpan{3, 0, 2}}, Stream::Compute), Error);  // past the source
}

TEST(Cuda, ArgmaxLseMatchesCpu) {
  SKIP_WITHOUT_GPU();
  CpuBackend cpu;
  auto gpu = create_backend("cuda");
  for (auto [R, V, valid] : {std::tuple{64, 50272, 50265}, {3, 1000, 999}, {1, 31, 31}}) {
    Pair l = random_pair(cpu, *gpu, DType::F32, {R, V}, 11, 4.f);
    Tensor ic = cpu.alloc(DType::I32, {R}), sc = cpu.alloc(DType::F32, {R, 2});
    Tensor ig = gpu->alloc(DType::I32, {R}), sg = gpu->alloc(DType::F32, {R, 2});
    cpu.argmax_lse(ic, sc, l.cpu, valid);
    gpu->argmax_lse(ig, sg, l.gpu, valid);
    Tensor ih = Tensor::host(DType::I32, {R});
    gpu->synchronize();
    gpu->copy(ih, ig, Stream::D2H);
    std::vector<float> s = download(*gpu, sg);
    for (int r = 0; r < R; ++r) {
      EXPECT_EQ(ih.data_as<int32_t>()[r], ic.data_as<int32_t>()[r]) << "row " << r;
      EXPECT_EQ(s[2 * r], sc.data_as<float>()[2 * r]);
      EXPECT_NEAR(s[2 * r + 1], sc.data_as<float>()[2 * r + 1], 1e-5 * std::fabs(sc.data_as<float>()[2 * r + 1]));
    }
  }
}

TEST(Cuda, OutOfMemoryIsAClearError) {
  SKIP_WITHOUT_GPU();
  auto gpu = create_backend("cuda");
  try {
    gpu->alloc(DType::F32, {int64_t{1} << 40});  // 4 TiB
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA out of memory"), std::string::npos) << e.what();
  }
  Tensor ok = gpu->alloc(DType::F32, {16});  // the device is still usable
  EXPECT_EQ(ok.numel(), 16);
}

// A resident KV cache larger than the device's free memory: refused before allocating, naming
// its size and the way out.
TEST(Cuda, KvCacheTooLargeForTheDeviceNamesTheWayOut) {
  SKIP_WITHOUT_GPU();
  auto gpu = create_backend("cuda");
  EXPECT_GT(gpu->device_bytes_free(), 0u);
  OptModel model(*gpu, test::data_path("opt/pre_ln_safetensors"));
  KvRuntimeOptions o;
  o.kv_dtype = DType::F16;
  try {
    model.make_kv_runtime(int64_t{1} << 30, 64, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("GiB of device memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("keep it in host memory (kv mode offload or kvpr)"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(gpu->alloc(DType::F32, {16}).numel(), 16);
}

// Weights that do not fit on the device: the error says so and names --weights host.
TEST(Cuda, WeightsTooLargeForTheDeviceNameTheWayOut) {
  SKIP_WITHOUT_GPU();
  auto gpu = create_backend("cuda");
  OptConfig c;
  c.vocab_size = int64_t{1} << 28;  // a 2^28 x 2^12 fp16 embedding: 2 TiB
  c.hidden_size = c.word_embed_proj_dim = 4096;
  c.num_layers = 1;
  c.num_heads = 32;
  c.ffn_dim = 16384;
  c.max_position_embeddings = 2048;
  try {
    OptModel m(*gpu, c, DType::F16, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA out of memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--weights host (kvprd: weights = host)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(gpu->alloc(DType::F32, {16}).numel(), 16);  // the device is still usable
}

// One test per checkpoint fixture (on the emulated device each its own ctest entry, so they run
// side by side).
class CudaModels : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaModels, EveryKvModeGivesTheCpuGreedyTokens) {
  SKIP_WITHOUT_GPU();
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  auto gpu = create_backend("cuda");
  test::expect_every_kv_mode_gives_cpu_tokens(*gpu, test::data_path(GetParam()), tok,
                                              test::kFixturePrompts, 10, 4,
                                              GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaModels,
                         ::testing::Values("opt/pre_ln_safetensors", "opt/post_ln_proj_sharded",
                                           "opt/decoder_prefix_bin", "llama/f32_safetensors",
                                           "llama/bf16_tied_scaled_sharded", "llama/gqa_f32_safetensors",
                                           "llama/mqa_f16_bin_sharded", "llama/llama3_rope_gqa_bf16",
                                           "llama/mistral_sliding_window", "llama/qwen2_qkv_bias_tied_bf16",
                                           "llama/qwen3_head_dim_qk_norm_bf16", "llama/qwen3_mha_head_dim_f32",
                                           "llama/qwen2_yarn_gqa_f32", "llama/qwen3_moe_dense_layer_f32",
                                           "llama/qwen2_moe_shared_expert_bf16", "llama/mixtral_gqa_f16_bin",
                                           "gemma/gemma2_f32", "gemma/gemma3_text_f32", "gemma/gemma3_wrapper_bf16",
                                           "gemma/mistral3_wrapper_f32", "llama/phi3_partial_rotary_fused_f32",
                                           "llama/phi3_longrope_f32",
                                           "gpt_oss/mxfp4_bf16", "gpt_oss/dequantized_bf16",
                                           "quantized/fp8_block_partial", "quantized/gptq_mixtral_int4_g32",
                                           "quantized/opt_gptq_int4_g32_sym"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           std::string n = i.param;
                           std::replace(n.begin(), n.end(), '/', '_');
                           return n;
                         });

// Phi's longrope through its crossing in every KV mode on the device: the float64 reference's
// tokens and log-probabilities (kvpr's and auto's recompute turning X's keys by the long factors).
TEST(Cuda, LongropeCrossingMatchesReference) {
  SKIP_WITHOUT_GPU();
  test::TempDir tmp;
  auto gpu = create_backend("cuda");
  test::expect_longrope_crossing_matches_reference(*gpu, test::data_path("llama/phi3_longrope_f32"),
                                                   test::char_tokenizer(tmp, 96), "cuda");
}

// The sliding layers' ring on the device, every host mode (auto's tier too), under random arrivals,
// chunked prefill and preemption (and, in the emulated suite's second run, random schedules of
// the device's streams: Gemma 2's alternating layers alone there, the two rings having taken 284 s
// of that run's 405).
// (The CPU's test runs more checkpoints.)
void expect_device_ring_gives_resident_tokens(const char* name) {
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  auto gpu = create_backend("cuda");
  test::expect_ring_gives_resident_tokens(*gpu, test::data_path(name), tok, name, 1);
}
TEST(Cuda, RingStoreGivesResidentTokens) {
  SKIP_WITHOUT_GPU();
  expect_device_ring_gives_resident_tokens("gemma/gemma2_f32");
}
TEST(Cuda, RingStoreOfEveryLayerGivesResidentTokens) {  // Mistral's window on every layer
  SKIP_WITHOUT_GPU();
  expect_device_ring_gives_resident_tokens("llama/mistral_sliding_window");
}

TEST(Cuda, FusedRecomputeGivesResidentTokens) {
  SKIP_WITHOUT_GPU();
  test::TempDir tmp;
  auto gpu = create_backend("cuda");
  test::expect_fused_recompute_gives_resident_tokens(*gpu, test::data_path("opt/pre_ln_safetensors"),
                                                     test::char_tokenizer(tmp, 96));
}

// The fp8 (E4M3) KV cache on the device, every mode against the CPU backend's same mode:
// teacher-forced prompt scores (chunks of 4 tokens attend to K/V read back from the cache),
// within what one fp8 step of a stored value (a K/V computed on either side of a rounding
// boundary) moves them, and resident decoding's greedy tokens.
TEST(Cuda, Fp8KvCacheMatchesTheCpuInEveryMode) {
  SKIP_WITHOUT_GPU();
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  auto gpu = create_backend("cuda");
  CpuBackend cpu;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 30; ++i) prompt.push_back(static_cast<int32_t>((i * 53 + 7) % 90));
  for (const char* name : {"opt/post_ln_proj_sharded", "llama/gqa_f32_safetensors", "llama/llama3_rope_gqa_bf16"}) {
    std::unique_ptr<Model> mc = load_model(cpu, test::data_path(name)), mg = load_model(*gpu, test::data_path(name));
    for (KvMode m : {KvMode::Resident, KvMode::Offload, KvMode::Kvpr, KvMode::Recompute, KvMode::CpuAttn}) {
      const std::vector<float> want = test::chunked_prompt_scores(*mc, tok, m, DType::F8E4M3, prompt);
      const std::vector<float> got = test::chunked_prompt_scores(*mg, tok, m, DType::F8E4M3, prompt);
      ASSERT_EQ(got.size(), want.size());
      const test::ScoreGap g = test::score_gap(got, want);
      ASSERT_TRUE(g.finite) << name << " " << kv_mode_name(m);
      // fp8 against f32 moves these scores by 0.02-0.08 on average (Generation.Fp8KvCacheInEveryMode).
      // With f32 weights the backends agree to float rounding; with bf16 weights the device's
      // GEMMs take bf16 activations (0.01-0.02 apart already with an f32 cache), and fp8 turns
      // such differences into a whole fp8 step where a K/V value lies near a rounding boundary.
      EXPECT_LT(g.mean, 0.05) << name << " " << kv_mode_name(m);
      EXPECT_LT(g.worst, 0.3) << name << " " << kv_mode_name(m);
    }
    GeneratorOptions o;
    o.max_batch = 3;
    o.kv_dtype = DType::F8E4M3;
    GenerationParams p;
    p.max_new_tokens = 10;
    p.ignore_eos = true;
    const std::vector<std::vector<int32_t>>& prompts = test::kFixturePrompts;
    EXPECT_EQ(test::greedy_tokens(*mg, tok, o, prompts, p), test::greedy_tokens(*mc, tok, o, prompts, p)) << name;
  }
}

// Chunked prefill and the prefix cache on the device, every mode: chunks that start past cached
// tokens give the CPU backend's tokens (one OPT, a RoPE model with grouped-query attention, and
// Qwen3's per-head K norm, which recomputing K from X must apply too).
TEST(Cuda, ChunksPastCachedTokensGiveTheCpuGreedyTokens) {
  SKIP_WITHOUT_GPU();
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  auto gpu = create_backend("cuda");
  for (const char* name : {"opt/post_ln_proj_sharded", "llama/llama3_rope_gqa_bf16", "llama/qwen3_head_dim_qk_norm_bf16"})
    test::expect_chunks_past_cached_tokens_give_cpu_tokens(*gpu, test::data_path(name), tok,
                                                            test::kFixturePrompts, 10, 4,
                                                            name);
}

// Speculative decoding on the device, every mode: drafts checked as chunks (one logits row and
// greedy choice per token on the device) give the CPU backend's tokens one at a time.
TEST(Cuda, SpeculativeDecodingGivesTheCpuGreedyTokens) {
  SKIP_WITHOUT_GPU();
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  auto gpu = create_backend("cuda");
  int64_t accepted = 0;
  for (const char* name : {"opt/pre_ln_safetensors", "llama/gqa_f32_safetensors"})
    accepted += test::expect_speculation_gives_cpu_tokens(*gpu, test::data_path(name), tok, 16, name);
  EXPECT_GT(accepted, 0);
}

// JSON mode and a schema on the device: the constrained rows' masks are made on a host thread
// while the device computes the step (Generator's MaskAhead), then applied to the logits it
// copies back; the tokens are the CPU backend's, and the text is JSON.
TEST(Cuda, JsonObjectGivesTheCpuTokens) {
  SKIP_WITHOUT_GPU();
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  CpuBackend cpu;
  auto gpu = create_backend("cuda");
  for (const char* name : {"opt/pre_ln_safetensors", "llama/gqa_f32_safetensors", "schema"}) {
    GenerationParams p;
    p.max_new_tokens = 24;
    p.json_object = true;
    if (std::string(name) == "schema") {
      name = "llama/gqa_f32_safetensors";
      p.json_object = false;
      p.json_schema = json::parse(R"({"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string",
          "maxLength": 3}}, "required": ["n", "s"], "additionalProperties": false})");
    }
    GeneratorOptions o;
    o.max_batch = 2;
    o.kv_dtype = DType::F32;
    std::unique_ptr<Model> mc = load_model(cpu, test::data_path(name)), mg = load_model(*gpu, test::data_path(name));
    const std::vector<std::vector<int32_t>> prompts = {{5, 17, 33, 2}, {60, 61}};
    auto a = Generator(*mc, tok, o).generate_all(prompts, p);
    auto b = Generator(*mg, tok, o).generate_all(prompts, p);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(b[i].tokens, a[i].tokens) << name;
      JsonRecognizer r;
      EXPECT_TRUE(!a[i].tokens.empty() && r.feed(a[i].text)) << name << ": " << a[i].text;
    }
  }
}

// Graph steps (Backend::begin_graph_step): a small decode-like step — token ids uploaded from
// pageable memory, gather, layer norm, new rows into a K/V cache at per-step positions,
// attention over contexts that grow every step, a projection, argmax into pinned memory — run
// step after step. With graph steps the results must be bit-for-bit those of the same steps
// issued op by op (which match the CPU backend), while the outcomes go eager, captured,
// replayed; a step interrupted by an event, a step with a temporary released before it is
// issued, and contexts crossing the attention's 256-key launch point must stay correct.
TEST(Cuda, GraphStepsReplayDecodeStepsBitForBit) {
  SKIP_WITHOUT_GPU();
  CpuBackend cpu;
  auto gpu = create_backend("cuda");
  const int64_t R = 5, heads = 4, hd = 12, W = heads * hd, V = 37, cap = 300;
  Pair table = random_pair(cpu, *gpu, DType::F16, {V, W}, 41), w = random_pair(cpu, *gpu, DType::F16, {V, W}, 42);
  Pair bias = random_pair(cpu, *gpu, DType::F32, {V}, 43), gamma = random_pair(cpu, *gpu, DType::F32, {W}, 44);
  Pair beta = random_pair(cpu, *gpu, DType::F32, {W}, 45);
  Pair k0 = random_pair(cpu, *gpu, DType::F32, {R * cap, W}, 46), v0 = random_pair(cpu, *gpu, DType::F32, {R * cap, W}, 47);
  struct Bufs {
    Tensor kc, vc, ids, x, att, logits, out_ids, stats, pin_ids, pin_stats;
  };
  auto make = [&](Backend& be, const Pair& k, const Pair& v, bool on_gpu) {
    Bufs b;
    b.kc = be.alloc(DType::F32, {R * cap, W});
    b.vc = be.alloc(DType::F32, {R * cap, W});
    be.copy(b.kc, on_gpu ? k.gpu : k.cpu, Stream::Compute);
    be.copy(b.vc, on_gpu ? v.gpu : v.cpu, Stream::Compute);
    b.ids = be.alloc(DType::I32, {R});
    b.x = be.alloc(DType::F32, {R, W});
    b.att = be.alloc(DType::F32, {R, W});
    b.logits = be.alloc(DType::F32, {R, V});
    b.out_ids = be.alloc(DType::I32, {R});
    b.stats = be.alloc(DType::F32, {R, 2});
    b.pin_ids = be.alloc_pinned(DType::I32, {R});
    b.pin_stats = be.alloc_pinned(DType::F32, {R, 2});
    be.synchronize();
    return b;
  };
  enum Extra { kPlain, kEvent, kTemporary };
  // One step at context base `past0`; returns the greedy ids and their stats.
  auto step = [&](Backend& be, Bufs& b, bool on_gpu, int s, int64_t past0, Extra extra, GraphStep* outcome) {
    GraphStepScope graph(be, outcome != nullptr);
    Tensor host_ids = Tensor::host(DType::I32, {R});
    std::vector<RowSpan> spans;
    std::vector<AttentionSeq> seqs;
    for (int64_t r = 0; r < R; ++r) {
      host_ids.data_as<int32_t>()[r] = static_cast<int32_t>((7 * s + 3 * r) % V);
      const int64_t past = past0 + s + r;
      spans.push_back(RowSpan{r, r * cap + past, 1});
      seqs.push_back(AttentionSeq{r, 1, past, b.kc.rows(r * cap, cap), b.vc.rows(r * cap, cap)});
    }
    be.copy(b.ids, host_ids, Stream::Compute);
    be.gather_rows(b.x, on_gpu ? table.gpu : table.cpu, b.ids);
    be.layer_norm(b.x, b.x, on_gpu ? gamma.gpu : gamma.cpu, on_gpu ? beta.gpu : beta.cpu, 1e-5f);
    if (extra == kEvent) be.record(Stream::Compute);  // a graph cannot hold it: the step goes op by op
    if (extra == kTemporary) {  // released before the step is issued: freed only after
      Tensor t = be.alloc(DType::F32, {R, W});
      be.add(t, b.x, b.x);
      be.add(b.x, t, b.x);
    }
    be.copy_rows(b.kc, b.x, spans);
    be.copy_rows(b.vc, b.x, spans);
    be.attention(b.att, b.x, seqs, static_cast<int>(heads), 1.f / std::sqrt(static_cast<float>(hd)));
    be.linear(b.logits, b.att, on_gpu ? w.gpu : w.cpu, on_gpu ? bias.gpu : bias.cpu, Activation::None);
    be.argmax_lse(b.out_ids, b.stats, b.logits, static_cast<int32_t>(V));
    be.copy(b.pin_ids, b.out_ids, Stream::Compute);
    be.copy(b.pin_stats, b.stats, Stream::Compute);
    if (outcome) *outcome = graph.end();
    be.synchronize(be.record(Stream::Compute));
    std::vector<float> got;
    for (int64_t r = 0; r < R; ++r) {
      got.push_back(static_cast<float>(b.pin_ids.data_as<int32_t>()[r]));
      got.push_back(b.pin_stats.data_as<float>()[2 * r]);
      got.push_back(b.pin_stats.data_as<float>()[2 * r + 1]);
    }
    return got;
  };
  struct Plan {
    int s;
    int64_t past0;
    Extra extra;
    GraphOutcome want;
  };
  const std::vector<Plan> plan = {
      {0, 10, kPlain, GraphOutcome::Eager},       {1, 10, kPlain, GraphOutcome::Captured},
      {2, 10, kPlain, GraphOutcome::Replayed},    {3, 10, kPlain, GraphOutcome::Replayed},
      {4, 10, kEvent, GraphOutcome::Interrupted}, {5, 10, kPlain, GraphOutcome::Replayed},
      {6, 10, kTemporary, GraphOutcome::Eager},   {7, 250, kPlain, GraphOutcome::Eager},  // contexts past 256
      {8, 250, kPlain, GraphOutcome::Captured},   {9, 250, kPlain, GraphOutcome::Replayed},
      // Back below 256: the attention's scratch grew for the longer contexts, so the first
      // graph (which baked in the old one) no longer matches; the second is still cached.
      {10, 10, kPlain, GraphOutcome::Eager},      {11, 10, kPlain, GraphOutcome::Captured},
      {12, 250, kPlain, GraphOutcome::Replayed},
  };
  Bufs bc = make(cpu, k0, v0, false), bp = make(*gpu, k0, v0, true), bg = make(*gpu, k0, v0, true);
  const GraphCounters before = gpu->graph_counters();
  for (const Plan& p : plan) {
    const std::vector<float> want = step(cpu, bc, false, p.s, p.past0, p.extra, nullptr);
    const std::vector<float> plain = step(*gpu, bp, true, p.s, p.past0, p.extra, nullptr);
    GraphStep outcome;
    const std::vector<float> graphed = step(*gpu, bg, true, p.s, p.past0, p.extra, &outcome);
    EXPECT_EQ(graphed, plain) << "step " << p.s << ": a graph step must compute exactly what op by op does";
    EXPECT_EQ(outcome.outcome, p.want) << "step " << p.s << ": " << graph_outcome_name(outcome.outcome) << " "
                                       << outcome.capture_error;
    for (int64_t r = 0; r < R; ++r) {
      EXPECT_EQ(plain[3 * r], want[3 * r]) << "step " << p.s << " row " << r;
      EXPECT_NEAR(plain[3 * r + 1], want[3 * r + 1], 2e-2 * (1 + std::fabs(want[3 * r + 1])));
    }
  }
  const GraphCounters after = gpu->graph_counters();
  EXPECT_EQ(after.replayed - before.replayed, 5);
  EXPECT_EQ(after.captured - before.captured, 3);
  EXPECT_EQ(after.interrupted - before.interrupted, 1);
  EXPECT_EQ(after.capture_failed, before.capture_failed);
  // The CPU backend has no graphs: a step there is run as it comes.
  cpu.begin_graph_step();
  EXPECT_EQ(cpu.end_graph_step().outcome, GraphOutcome::None);
}

// Continuous batching with graph steps: requests of different lengths finish at different
// steps and one joins mid-way, so the decode batch changes (a new key each time, and mixed
// prefill+decode steps that are not graph steps) — the tokens must be those of op-by-op steps.
TEST(Cuda, GraphStepsFollowContinuousBatching) {
  SKIP_WITHOUT_GPU();
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  auto gpu = create_backend("cuda");
  OptModel model(*gpu, test::data_path("opt/post_ln_proj_sharded"));
  std::map<bool, std::map<uint64_t, std::vector<int32_t>>> got;
  for (bool graphs : {false, true}) {
    GeneratorOptions o;
    o.max_batch = 3;
    o.kv_dtype = DType::F32;
    o.cuda_graphs = graphs;
    Generator g(model, tok, o);
    auto params = [](int n) {
      GenerationParams p;
      p.max_new_tokens = n;
      p.ignore_eos = true;
      return p;
    };
    const GraphCounters before = gpu->graph_counters();
    g.add({5, 17, 33, 2}, params(14));
    g.add({60, 61}, params(6));
    for (int i = 0; i < 4; ++i) g.step();
    g.add({7, 7, 8, 9, 10}, params(9));
    while (!g.idle()) g.step();
    for (uint64_t id = 1; id <= 3; ++id) got[graphs][id] = g.take_result(id).tokens;
    const GraphCounters after = gpu->graph_counters();
    if (graphs) {
      EXPECT_GE(after.replayed - before.replayed, 3);
      EXPECT_EQ(after.interrupted, before.interrupted);
      EXPECT_EQ(after.capture_failed, before.capture_failed);
    }
  }
  EXPECT_EQ(got[true], got[false]);
  EXPECT_EQ(got[true][1].size(), 14u);
}
