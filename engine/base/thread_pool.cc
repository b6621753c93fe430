#include "engine/base/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#include <sched.h>

namespace kvpr {

namespace {

// How long a thread spins on the pool's state before it sleeps on a condition variable: a decode
// step's kernels follow each other a few microseconds apart, and a wake-up costs tens of them.
constexpr auto kSpin = std::chrono::microseconds(50);
// Past this many polls a spinning thread yields its core at each poll: where the threads it waits
// for share its cores (several workers on one node, a loaded machine) a plain spin would hold the
// core they need; where they have cores of their own, sched_yield returns at once.
constexpr int kPollsBeforeYield = 32;

// Until ready() or kSpin has passed.
template <typename Ready>
void spin_until(Ready ready) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0; !ready(); ++i) {
    if (i < kPollsBeforeYield) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();  // (a hint to the core: a spin loop, no memory-order speculation to undo)
#endif
      continue;
    }
    sched_yield();
    if (std::chrono::steady_clock::now() > until) return;
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(1, threads); ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    if (const char* env = std::getenv("KVPR_THREADS")) {
      int n = std::atoi(env);
      if (n > 0) return n;
    }
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }());
  return pool;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t chunks = std::min<int64_t>(size(), (n + grain - 1) / grain);
  // One call at a time shares the workers; a second caller (another thread, or a task calling
  // back into its pool) runs its loop on its own thread rather than wait for the first.
  if (chunks <= 1 || busy_.exchange(true, std::memory_order_acquire)) {
    fn(0, n);
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  task_ = &fn;
  task_n_ = n;
  chunks_ = chunks;
  next_chunk_ = 0;
  pending_ = chunks;
  ++generation_;
  lock.unlock();
  wake_.notify_all();
  // The caller works too.
  while (true) {
    lock.lock();
    if (next_chunk_ >= chunks_) break;
    int64_t c = next_chunk_++;
    lock.unlock();
    fn(c * n / chunks, (c + 1) * n / chunks);
    lock.lock();
    if (--pending_ == 0) done_.notify_all();
    lock.unlock();
  }
  lock.unlock();
  spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; });
  lock.lock();
  done_.wait(lock, [&] { return pending_ == 0; });
  task_ = nullptr;
  busy_.store(false, std::memory_order_release);
}

void ThreadPool::worker_loop(int /*index*/) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    lock.unlock();
    spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; });
    lock.lock();
    // A generation whose chunks the others took already still counts as seen, so the next spin
    // waits for the one after it rather than sleeping through its start.
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    while (task_ && next_chunk_ < chunks_) {
      int64_t c = next_chunk_++;
      const auto* fn = task_;
      int64_t n = task_n_, chunks = chunks_;
      lock.unlock();
      (*fn)(c * n / chunks, (c + 1) * n / chunks);
      lock.lock();
      if (--pending_ == 0) done_.notify_all();
    }
  }
}

}  // namespace kvpr
