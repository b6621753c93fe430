// The SIMT emulator itself: shuffles, barriers, exited threads and the deadlock report, on
// small kernels whose answers are known, so the kernel tests rest on a checked harness.
#include "engine/backend/emulated/simt_emu.h"
// clang-format off
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace {

// The kernel tests run kernels at once on host memory, with no stream. In the emulated build the
// engine links the emulated runtime, which would queue their launches on its streams and check
// their pointers as device memory: launches here bypass it.
struct DirectLaunches : ::testing::Environment {
  void SetUp() override { kvpr_emu::submit_launch = nullptr; }
};
[[maybe_unused]] ::testing::Environment* const direct_launches = ::testing::AddGlobalTestEnvironment(new DirectLaunches);

__global__ void lane_exchange(int* out) {
  const int t = threadIdx.x, lane = t & 31;
  out[4 * t + 0] = __shfl_xor_sync(0xffffffffu, t, 1);      // neighbour within a pair
  out[4 * t + 1] = __shfl_sync(0xffffffffu, t, 5);          // lane 5 of this warp
  out[4 * t + 2] = __shfl_down_sync(0xffffffffu, t, 16);    // 16 lanes up, or itself past the end
  int sum = lane;
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  out[4 * t + 3] = sum;                                     // 0 + 1 + ... + 31
}

__global__ void block_reverse(int* data, int n) {
  __shared__ int tile[256];
  const int t = threadIdx.x;
  tile[t] = data[blockIdx.x * n + t];
  __syncthreads();  // every write lands before any read
  data[blockIdx.x * n + t] = tile[n - 1 - t];
}

__global__ void early_exit_then_barrier(int* out) {
  __shared__ int count;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  if (threadIdx.x >= 64) return;  // two warps leave; the barrier below waits for the rest only
  __syncthreads();
  if (threadIdx.x % 32 == 0) count += 1;
  __syncthreads();
  if (threadIdx.x == 0) *out = count;
}

__global__ void divergent_barrier(int* out) {
  // Half the warp waits for the block, the other half for the warp: neither barrier can
  // open (a hang on a GPU).
  if (threadIdx.x < 16) __syncthreads();
  else __syncwarp();
  out[threadIdx.x] = 1;
}

__global__ void grid_ids(int* out) {
  out[(blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x] =
      static_cast<int>(blockDim.x * 1000 + blockIdx.x * 100 + blockIdx.y * 10 + blockIdx.z);
}

}  // namespace

TEST(SimtEmulator, WarpShufflesExchangeLanes) {
  std::vector<int> out(4 * 64);
  ::kvpr_emu::launch(dim3(1), dim3(64), 0, nullptr, lane_exchange)(out.data());
  for (int t = 0; t < 64; ++t) {
    const int warp = t / 32 * 32, lane = t % 32;
    EXPECT_EQ(out[4 * t + 0], t ^ 1);
    EXPECT_EQ(out[4 * t + 1], warp + 5);
    EXPECT_EQ(out[4 * t + 2], lane + 16 < 32 ? t + 16 : t);
    EXPECT_EQ(out[4 * t + 3], 31 * 32 / 2);
  }
}

TEST(SimtEmulator, SyncthreadsOrdersSharedMemoryPerBlock) {
  const int n = 256, blocks = 3;
  std::vector<int> data(n * blocks);
  for (int i = 0; i < n * blocks; ++i) data[i] = i;
  ::kvpr_emu::launch(dim3(blocks), dim3(n), 0, nullptr, block_reverse)(data.data(), n);
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < n; ++t) ASSERT_EQ(data[b * n + t], b * n + n - 1 - t);
}

TEST(SimtEmulator, ExitedThreadsLeaveTheBarrier) {
  int count = -1;
  ::kvpr_emu::launch(dim3(1), dim3(128), 0, nullptr, early_exit_then_barrier)(&count);
  EXPECT_EQ(count, 2);  // one per remaining warp
}

TEST(SimtEmulator, DivergentBarriersAreReportedAsADeadlock) {
  std::vector<int> out(32);
  EXPECT_THROW(::kvpr_emu::launch(dim3(1), dim3(32), 0, nullptr, divergent_barrier)(out.data()), std::runtime_error);
}

TEST(SimtEmulator, GridAndBlockIndicesCoverTheLaunch) {
  std::vector<int> out(4 * 3 * 2, -1);
  ::kvpr_emu::launch(dim3(4, 3, 2), dim3(1), 0, nullptr, grid_ids)(out.data());
  for (int z = 0; z < 2; ++z)
    for (int y = 0; y < 3; ++y)
      for (int x = 0; x < 4; ++x) EXPECT_EQ(out[(z * 3 + y) * 4 + x], 1000 + x * 100 + y * 10 + z);
  EXPECT_THROW(::kvpr_emu::launch(dim3(1), dim3(2048), 0, nullptr, grid_ids)(out.data()), std::runtime_error);
}
