// kvpr-bench scale's two sides (scale.cc, the orchestrator; scale_worker.cc, its workers) share
// the reply channel and the host memory probes (scale_probes.cc).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "engine/backend/backend.h"

namespace kvpr::bench {

constexpr int kReplyFd = 3;  // a worker's replies (stdout stays the engine's)

extern std::atomic<uint64_t> g_sink;  // where probe reads go, so that they are not optimised away

// Reads n words (the compiler's vector loads: four independent sums).
uint64_t read_words(const uint64_t* p, size_t n);

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<uint64_t[], FreeDeleter>;

// `bytes` of host memory, written (pages placed by the caller's memory policy, first touch).
HostBuffer touched_buffer(size_t bytes);
void pin_this_thread(int pu);  // best effort: a probe, not placement
// The processing units this process may run on.
std::vector<int> allowed_pus();
// Read bandwidth of host memory with `threads` threads, one per PU of `pus`, each reading its
// own `bytes` twice (buffers placed by first touch from their thread).
double host_read_gbps(const std::vector<int>& pus, int threads, size_t bytes);
// 1, 2, 4, ... and every PU.
std::vector<int> thread_counts(int all);
// Pinned H2D of `bytes` (median of 3, device events) with `readers` threads reading host memory
// meanwhile, on PUs other than the issuing thread's.
double h2d_gbps_with_readers(Backend& be, const std::vector<int>& pus, int readers, size_t reader_bytes, int64_t bytes);

}  // namespace kvpr::bench
