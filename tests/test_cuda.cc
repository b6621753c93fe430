// The CUDA backend against the CPU backend: every op on random data of awkward sizes, and
// every KV mode's greedy tokens on the tiny fixtures. Skipped at run time without a device;
// always compiled when the build has CUDA.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <cmath>
#include <map>

#include "engine/backend.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/error.h"
#include "engine/generator.h"
#include "engine/json.h"
#include "kv_mode_check.h"
#include "test_util.h"

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

class CudaOps : public ::testing::TestWithParam<DType> {};

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

TEST_P(CudaOps, AttentionPrefillMixedAndLongDecode) {
  SKIP_WITHOUT_GPU();
  CpuBackend cpu;
  auto gpu = create_backend("cuda");
  for (int hd : {8, 64, 80, 128}) {
    const int heads = 3, hidden = heads * hd;
    for (bool decode_only : {false, true}) {
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
        Pair k = random_pair(cpu, *gpu, GetParam(), {s.past + s.q_len, hidden}, seed++);
        Pair v = random_pair(cpu, *gpu, GetParam(), {s.past + s.q_len, hidden}, seed++);
        sc.push_back(AttentionSeq{off, s.q_len, s.past, k.cpu, v.cpu});
        sg.push_back(AttentionSeq{off, s.q_len, s.past, k.gpu, v.gpu});
        off += s.q_len;
      }
      Tensor oc = cpu.alloc(DType::F32, {T, hidden}), og = gpu->alloc(DType::F32, {T, hidden});
      const float scale = 1.f / std::sqrt(static_cast<float>(hd));
      cpu.attention(oc, q.cpu, sc, heads, scale);
      gpu->attention(og, q.gpu, sg, heads, scale);
      EXPECT_TRUE(test::close_rel(as_double(oc), download(*gpu, og).data(), T * hidden, 1e-4))
          << "head_dim " << hd << (decode_only ? " decode" : " mixed");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps, ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

TEST_P(CudaOps, CopyRowsMatchesCpu) {
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

TEST(Cuda, EveryKvModeGivesTheCpuGreedyTokens) {
  SKIP_WITHOUT_GPU();
  test::TempDir tmp;
  Tokenizer tok = test::char_tokenizer(tmp, 96);
  auto gpu = create_backend("cuda");
  for (const char* name : {"pre_ln_safetensors", "post_ln_proj_sharded", "decoder_prefix_bin"})
    test::expect_every_kv_mode_gives_cpu_tokens(*gpu, test::data_path(std::string("opt/") + name), tok,
                                                {{5, 17, 33, 2, 80, 41, 9}, {60, 61}, {7, 7, 8, 9, 10}}, 10, 4, name);
}
