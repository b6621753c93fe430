// kvpr-bench scale's host memory probes (scale.h): DRAM read bandwidth with 1..all cores, and
// pinned H2D while readers load host memory.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>

#include "bench/bench_common.h"
#include "bench/scale.h"
#include "engine/base/error.h"

namespace kvpr::bench {

std::atomic<uint64_t> g_sink{0};

// Reads n words (the compiler's vector loads: four independent sums).
uint64_t read_words(const uint64_t* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  for (; i < n; ++i) a += p[i];
  return a + b + c + d;
}

// `bytes` of host memory, written (pages placed by the caller's memory policy, first touch).
HostBuffer touched_buffer(size_t bytes) {
  bytes = std::max<size_t>(bytes, 4096);
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  KVPR_CHECK(p, "cannot allocate ", bytes, " bytes of host memory");
  std::memset(p, 0x11, bytes);
  return HostBuffer(static_cast<uint64_t*>(p));
}

void pin_this_thread(int pu) {
  if (pu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(pu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);  // best effort: a probe, not placement
}

// The processing units this process may run on.
std::vector<int> allowed_pus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int i = 0; i < CPU_SETSIZE; ++i)
      if (CPU_ISSET(i, &set)) out.push_back(i);
  if (out.empty()) out.push_back(0);
  return out;
}

// Read bandwidth of host memory with `threads` threads, one per PU of `pus`, each reading its
// own `bytes` twice (buffers placed by first touch from their thread).
double host_read_gbps(const std::vector<int>& pus, int threads, size_t bytes) {
  std::barrier sync(threads);
  std::vector<double> begin(threads), end(threads);
  std::vector<std::exception_ptr> failed(threads);
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      pin_this_thread(pus[static_cast<size_t>(t) % pus.size()]);
      HostBuffer b;
      try {
        b = touched_buffer(bytes);
        g_sink += read_words(b.get(), bytes / 8);  // warm: TLB, page tables
      } catch (...) {
        failed[t] = std::current_exception();
      }
      sync.arrive_and_wait();  // every thread arrives, failed or not
      begin[t] = seconds_since(t0);
      if (b)
        for (int r = 0; r < 2; ++r) g_sink += read_words(b.get(), bytes / 8);
      end[t] = seconds_since(t0);
    });
  for (auto& t : ts) t.join();
  for (auto& e : failed)
    if (e) std::rethrow_exception(e);
  const double s = *std::max_element(end.begin(), end.end()) - *std::min_element(begin.begin(), begin.end());
  return 2.0 * static_cast<double>(bytes) * threads / s / 1e9;
}

// 1, 2, 4, ... and every PU.
std::vector<int> thread_counts(int all) {
  std::vector<int> out;
  for (int k = 1; k < all; k *= 2) out.push_back(k);
  out.push_back(all);
  return out;
}

// Pinned H2D of `bytes` (median of 3, device events) with `readers` threads reading host memory
// meanwhile, on PUs other than the issuing thread's.
double h2d_gbps_with_readers(Backend& be, const std::vector<int>& pus, int readers, size_t reader_bytes,
                             int64_t bytes) {
  Tensor src = be.alloc_pinned(DType::U8, {bytes}), dst = be.alloc(DType::U8, {bytes});
  std::memset(src.data(), 0x22, static_cast<size_t>(bytes));
  std::atomic<bool> stop{false};
  std::atomic<int> running{0};
  std::vector<std::exception_ptr> failed(static_cast<size_t>(readers));
  std::vector<std::thread> ts;
  for (int r = 0; r < readers; ++r)
    ts.emplace_back([&, r] {
      pin_this_thread(pus[static_cast<size_t>(r + 1) % pus.size()]);
      HostBuffer b;
      try {
        b = touched_buffer(reader_bytes);
        g_sink += read_words(b.get(), reader_bytes / 8);
      } catch (...) {
        failed[r] = std::current_exception();
      }
      ++running;
      while (b && !stop.load(std::memory_order_relaxed)) g_sink += read_words(b.get(), reader_bytes / 8);
    });
  while (running.load() < readers) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  double ms = 0;
  std::exception_ptr copy_failed;
  try {
    ms = copy_ms(be, dst, src, Stream::H2D, "H2D probe");
  } catch (...) {
    copy_failed = std::current_exception();
  }
  stop = true;
  for (auto& t : ts) t.join();
  for (auto& e : failed)
    if (e) std::rethrow_exception(e);
  if (copy_failed) std::rethrow_exception(copy_failed);
  return static_cast<double>(bytes) / (ms / 1e3) / 1e9;
}

}  // namespace kvpr::bench
