// A fixed pool of worker threads for the CPU kernels. parallel_for splits [0, n) into
// contiguous chunks; the calling thread takes a share. One call at a time has the workers: a
// call made while another runs (from another thread, or from inside a task) runs on its caller's
// thread alone. Idle workers, and the caller waiting for them, poll for 50 µs before they sleep:
// a decode step's kernels come microseconds apart, and waking a sleeping thread costs tens of
// microseconds each time (a third of a 1B model's int4 step on two cores). Past the first polls
// they yield the core at each poll, so threads that share cores (several workers on a node, a
// loaded machine) do not hold the core the thread they wait for needs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvpr {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint chunks covering [0, n). Chunks hold at least
  // `grain` items so tiny loops stay on the calling thread.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool for CPU kernels: KVPR_THREADS or the hardware thread count.
  static ThreadPool& global();

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)>* task_ = nullptr;
  int64_t task_n_ = 0;
  int64_t chunks_ = 0;
  int64_t next_chunk_ = 0;
  std::atomic<int64_t> pending_{0};
  std::atomic<uint64_t> generation_{0};
  bool stop_ = false;
  std::atomic<bool> busy_{false};
};

}  // namespace kvpr
