// Greedy selection on the device: per row of logits, the first id of the largest logit and
// the row's log-sum-exp (engine/backend/argmax_lse.h RowStats), so a greedy step moves 12 bytes per
// row to the host instead of the vocabulary's logits, and the host does no exp over them.
#include <cfloat>
#include <climits>
#include <cmath>

#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/device_util.cuh"
#include "engine/backend/cuda/kernels.h"

KVPR_CUDA_NAMESPACE_BEGIN

namespace {

constexpr int kThreads = 512;

// (value, id) with ties to the lower id: the first maximum, as a sequential scan finds it.
__device__ __forceinline__ void better(float& v, int32_t& id, float ov, int32_t oid) {
  if (ov > v || (ov == v && oid < id)) {
    v = ov;
    id = oid;
  }
}

__global__ void argmax_lse_kernel(int32_t* ids, float* stats, const float* logits, int64_t V, int32_t valid) {
  __shared__ float wv[32];
  __shared__ int32_t wid[32];
  __shared__ double wsum[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * V;
  float best = -INFINITY;
  int32_t arg = INT_MAX;  // no id seen yet: loses every tie
  for (int32_t i = threadIdx.x; i < valid; i += blockDim.x) {
    const float v = row[i];
    if (v > best || arg == INT_MAX) best = v, arg = i;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t oid = __shfl_xor_sync(0xffffffffu, arg, o);
    better(best, arg, ov, oid);
  }
  if (lane == 0) wv[warp] = best, wid[warp] = arg;
  __syncthreads();
  best = wv[0];
  arg = wid[0];
  for (int w = 1; w < warps; ++w) better(best, arg, wv[w], wid[w]);
  // Every thread now holds the row's maximum; sum exp(x - max) in double as the host does.
  double s = 0.0;
  for (int32_t i = threadIdx.x; i < valid; i += blockDim.x) s += exp(static_cast<double>(row[i]) - best);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) wsum[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < warps; ++w) total += wsum[w];
    ids[blockIdx.x] = arg;
    stats[2 * static_cast<int64_t>(blockIdx.x)] = best;
    stats[2 * static_cast<int64_t>(blockIdx.x) + 1] = static_cast<float>(static_cast<double>(best) + log(total));
  }
}

}  // namespace

void argmax_lse(int32_t* ids, float* stats, const float* logits, int64_t rows, int64_t vocab, int32_t valid,
                cudaStream_t stream) {
  if (rows == 0) return;
  KVPR_CHECK(rows <= 0x7fffffff && valid > 0 && valid <= vocab, "argmax_lse: ", rows, " rows, valid ", valid,
             " of ", vocab);
  KVPR_LAUNCH(static_cast<unsigned>(rows), kThreads, 0, stream, argmax_lse_kernel)(ids, stats, logits, vocab, valid);
  CUDA_CHECK_LAUNCH();
}

KVPR_CUDA_NAMESPACE_END
