// The decode bounds kvpr-bench reports (bench/decode_bounds.h), on the inputs of the first H200
// run (bench/results/2026-11-30-h200-05941421999a.json: OPT-6.7B shapes, fp16, batch 32, prompt
// 1024, 32 tokens), against the figures worked out by hand from first principles.
#include <gtest/gtest.h>

#include "bench/decode_bounds.h"

using kvpr::bench::decode_bound;

namespace {

kvpr::bench::DecodeShape opt_6_7b() {
  kvpr::bench::DecodeShape s;
  s.layers = 32;
  s.cached_tokens = 32 * (1024 + 32 / 2.0);   // mean over the 32 steps
  s.kv_bytes = 2.0 * 4096 * 2;                 // K and V, fp16
  s.x_bytes = 4096 * 2.0;
  s.recompute_flops = 2.0 * 2 * 4096 * 4096;  // K and V projections of one row
  s.weight_bytes = 13316947968;
  return s;
}

kvpr::bench::Measured h200() {
  kvpr::bench::Measured m;
  m.device_gbps = 4215.513539816225;  // device copy: bytes read + written
  m.h2d_alone_gbps = 55.345509912280086;
  m.h2d_gbps = 51.15223180048165;    // with D2H running
  m.host_gbps = 89.27931805463977;
  m.gemm_tflops = 700;               // what the H200 gives at these shapes (the run did not measure it)
  m.recompute_fixed_s = 3.491663253098201e-05;
  m.recompute_per_row_s = 1.5404853565793667e-07;
  m.resident_step_s = 12.72e-3;
  return m;
}

}  // namespace

// Resident reads 13.3 GB of weights and 17.45 GB of KV once a step: 7.3 ms at 4.22 TB/s (the
// copy rate already counts every byte read and written; the old bound halved it, 14.6 ms, and
// flattered the 12.72 ms measured as 0.87x).
TEST(DecodeBounds, ResidentIsWeightsAndKvOverDeviceBandwidth) {
  const auto b = decode_bound("resident", opt_6_7b(), h200());
  EXPECT_NEAR(b.physical_s * 1e3, (13.317 + 17.448) / 4.2155, 0.01);
  EXPECT_NEAR(b.physical_s * 1e3, 7.30, 0.01);
  EXPECT_GT(12.72e-3 / b.physical_s, 1.7);  // the measurement sits 1.74x above it
  EXPECT_EQ(decode_bound("resident+graphs", opt_6_7b(), h200()).physical_s, b.physical_s);
}

// Offload moves every K/V over the link: 17.45 GB at the 55.35 GB/s of H2D alone (a step stores
// only ~25 MB back) is 315 ms; the model's 51.15 GB/s (D2H saturated) gives 341.
TEST(DecodeBounds, OffloadIsTheKvOverTheLink) {
  const auto b = decode_bound("offload", opt_6_7b(), h200());
  EXPECT_NEAR(b.physical_s * 1e3, 315.3, 0.2);
  EXPECT_NEAR(b.model_s * 1e3, 341.1, 0.2);
  EXPECT_LT(b.physical_s, 323.52e-3);  // measured: 323.52 ms, above it as it must be
}

// KVPR at the hardware's recompute rate (~0.096 us per row and layer at 700 TFLOP/s) recomputes
// every cached token and is bound by moving X alone: 157.6 ms, 2.0x offload's physical bound.
// The model, with this code's 0.154 us per row, splits short of that: ~174 ms.
TEST(DecodeBounds, KvprAtThePhysicalLimitMovesXAlone) {
  const auto s = opt_6_7b();
  const auto b = decode_bound("kvpr", s, h200());
  EXPECT_EQ(b.physical_split, s.cached_tokens);
  EXPECT_NEAR(b.physical_s * 1e3, 157.6, 0.2);
  EXPECT_NEAR(decode_bound("offload", s, h200()).physical_s / b.physical_s, 2.0, 0.01);
  EXPECT_LT(b.model_split, s.cached_tokens);
  EXPECT_GT(b.model_s, b.physical_s);
  EXPECT_NEAR(b.model_s * 1e3, 174.0, 3.0);
  EXPECT_NEAR(decode_bound("recompute", s, h200()).physical_s, b.physical_s, 1e-9);
  EXPECT_LT(b.physical_s, 184.71e-3);  // measured: 184.71 ms
  // Without a GEMM rate recompute costs nothing physically: X alone over the link still bounds it.
  auto m = h200();
  m.gemm_tflops = 0;
  EXPECT_NEAR(decode_bound("kvpr", s, m).physical_s * 1e3, 157.6, 0.2);
}

// auto at its budget: with no device tier it is kvpr; with half the cached tokens' K/V on the
// device the other half's X crosses the link (78.8 ms, half of kvpr's 157.6); with every token's
// it is resident (7.3 ms: the device reads weights and KV, nothing crosses the link).
TEST(DecodeBounds, AutoIsKvprOverTheTokensItsDeviceTierCannotHold) {
  auto s = opt_6_7b();
  const auto kvpr = decode_bound("kvpr", s, h200());
  EXPECT_EQ(decode_bound("auto", s, h200()).physical_s, kvpr.physical_s);
  s.device_tokens = s.cached_tokens / 2;
  const auto half = decode_bound("auto", s, h200());
  EXPECT_NEAR(half.physical_s * 1e3, 78.8, 0.1);
  EXPECT_EQ(half.physical_split, s.cached_tokens / 2);
  EXPECT_LT(half.model_s, kvpr.model_s);
  s.device_tokens = 2 * s.cached_tokens;  // a budget past what the batch needs
  EXPECT_NEAR(decode_bound("auto", s, h200()).physical_s, decode_bound("resident", s, h200()).physical_s, 1e-12);
  EXPECT_NEAR(decode_bound("auto", s, h200()).model_s, h200().resident_step_s, 1e-12);
}

// cpu-attn reads the KV from host memory (17.45 GB at 89.3 GB/s: 195 ms) and, with one GPU batch,
// the device's part comes after it in every layer (a sum); with two they overlap (a max).
TEST(DecodeBounds, CpuAttnSumsHostAndDeviceUnlessTheyOverlap) {
  auto s = opt_6_7b();
  const auto serial = decode_bound("cpu-attn", s, h200());
  EXPECT_NEAR(serial.physical_s * 1e3, 195.4 + 3.16, 0.3);
  EXPECT_LT(serial.physical_s, 295.95e-3);  // measured: 295.95 ms (the old bound, 391 ms, sat above it)
  s.gpu_batches = 2;
  EXPECT_NEAR(decode_bound("cpu-attn", s, h200()).physical_s * 1e3, 195.4, 0.3);
}

// Streamed weights (--weights host) cross the link every step in every mode.
TEST(DecodeBounds, StreamedWeightsAddToTheLink) {
  auto s = opt_6_7b();
  s.streamed_weight_bytes = s.weight_bytes;
  EXPECT_NEAR(decode_bound("resident", s, h200()).physical_s * 1e3, 13.317 / 55.3455 * 1e3, 0.5);
  EXPECT_NEAR(decode_bound("offload", s, h200()).physical_s * 1e3, 315.3 + 240.6, 0.5);
}

// Sliding layers (Gemma 3's 5 local to 1 global at a window of 1024): a step moves and reads a
// local layer's window of each sequence, not its context. At 32768 tokens, 6 layers of one
// sequence move (32768 + 5 x 1023) tokens' K/V where full offload moves 6 x 32768: 19.3%.
TEST(DecodeBounds, SlidingLayersCountTheirWindowOnly) {
  kvpr::bench::DecodeShape s;
  s.layers = 6;
  s.cached_tokens = 32768;
  s.kv_bytes = 2.0 * 256 * 2;
  s.x_bytes = 2560 * 2.0;
  s.recompute_flops = 4.0 * 2560 * 256;
  s.weight_bytes = 1e9;
  kvpr::bench::DecodeShape windowed = s;
  windowed.layer_tokens = {1023, 1023, 1023, 1023, 1023, 32768};
  auto m = h200();
  const double full = decode_bound("offload", s, m).physical_s, slid = decode_bound("offload", windowed, m).physical_s;
  EXPECT_NEAR(full, 6 * 32768 * s.kv_bytes / (m.h2d_alone_gbps * 1e9), 1e-12);
  EXPECT_NEAR(slid / full, (32768 + 5 * 1023) / (6.0 * 32768), 1e-9);
  EXPECT_NEAR(slid / full, 0.193, 0.001);
  // kvpr recomputes at most a layer's own tokens: its bound is never above offload's, and X (larger
  // than K+V here: grouped-query attention) is not worth moving, so it splits at 0 and equals it.
  const auto k = decode_bound("kvpr", windowed, m);
  EXPECT_EQ(k.physical_split, 0);
  EXPECT_NEAR(k.physical_s, slid, 1e-12);
}
