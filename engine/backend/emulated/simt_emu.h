// A SIMT emulator for the CUDA kernels, so that CI (which has nvcc but no GPU) runs every
// kernel of engine/backend/cuda/ against the CPU backend, under AddressSanitizer too.
//
// The kernel sources are compiled unchanged by the host compiler with this header included
// first (engine/backend/emulated/*_emu.cc). A launch runs the grid's blocks one after another; each GPU
// thread of a block is a fiber on the calling OS thread, run until it finishes or
// reaches a barrier: __syncthreads waits for every live thread of the block, warp shuffles
// and __syncwarp for every live thread of the warp, and __shared__ variables are statics
// (one block runs at a time, so they are per block). A thread that returns drops out of its
// barriers, like an exited thread on the GPU; threads left waiting at different barriers are
// reported as a deadlock. Deterministic, single-threaded, and AddressSanitizer-aware (fiber
// switches are annotated), so out-of-bounds reads of a kernel fail CI's ASan run.
//
// What it does not model: timing, the memory model beyond barrier ordering, occupancy, and
// divergent warps calling a shuffle with different masks (every shuffle here is full-warp,
// which the kernels guarantee). It checks kernel logic: indexing, bounds, reductions,
// merges, synchronisation; the GPU tests (tests/engine/backend/test_cuda.cc) check the real thing.
#pragma once

#if defined(__CUDACC__)
#error "simt_emu.h is for the host compiler only"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#define KVPR_SIMT_EMULATION 1

#if defined(__SANITIZE_ADDRESS__)
#define KVPR_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVPR_EMU_ASAN 1
#endif
#endif
#if defined(KVPR_EMU_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

// Fiber switches: on x86-64 a few instructions (simt_switch.cc) that save the callee-saved
// registers and swap stacks; swapcontext would also make a signal-mask system call per switch,
// which was most of the emulator's time. Elsewhere, ucontext.
#if defined(__x86_64__) && defined(__linux__)
#define KVPR_EMU_FAST_SWITCH 1
extern "C" void kvpr_emu_switch(void** save_sp, void* new_sp);
#endif

namespace kvpr_emu {

// One GPU thread: a fiber with its own stack, resumed by the block's scheduler.
enum class Wait { None, Warp, Block };

struct Fiber {
#if defined(KVPR_EMU_FAST_SWITCH)
  void* sp = nullptr;  // saved stack pointer while switched out
#else
  ucontext_t uc{};
#endif
  char* stack = nullptr;  // usable part, above a guard page
  size_t stack_size = 0;
  dim3 thread_idx;
  int lane = 0, warp = 0;
  bool done = false;
  Wait wait = Wait::None;
  void* fake_stack = nullptr;
};

struct BlockState {
  std::vector<Fiber>* fibers = nullptr;
#if defined(KVPR_EMU_FAST_SWITCH)
  void* scheduler_sp = nullptr;
#else
  ucontext_t scheduler{};
#endif
  void* scheduler_fake_stack = nullptr;
  const void* scheduler_stack_bottom = nullptr;
  size_t scheduler_stack_size = 0;
  int current = -1;
  uint64_t slots[32][32] = {};  // per warp: one exchange slot per lane
  void (*entry)(void*) = nullptr;
  void* entry_arg = nullptr;
};

struct ThreadCtx {
  dim3 thread_idx, block_idx, block_dim, grid_dim;
  int lane = 0, warp = 0;
  BlockState* block = nullptr;
};
inline ThreadCtx ctx;  // the fiber being run (one OS thread runs every fiber)

// From the running fiber back to the scheduler, until the scheduler resumes it.
inline void yield_to_scheduler(bool finished) {
  BlockState& b = *ctx.block;
  Fiber& f = (*b.fibers)[static_cast<size_t>(b.current)];
#if defined(KVPR_EMU_ASAN)
  __sanitizer_start_switch_fiber(finished ? nullptr : &f.fake_stack, b.scheduler_stack_bottom,
                                 b.scheduler_stack_size);
#endif
#if defined(KVPR_EMU_FAST_SWITCH)
  kvpr_emu_switch(&f.sp, b.scheduler_sp);
#else
  swapcontext(&f.uc, &b.scheduler);
#endif
#if defined(KVPR_EMU_ASAN)
  __sanitizer_finish_switch_fiber(f.fake_stack, &b.scheduler_stack_bottom, &b.scheduler_stack_size);
#endif
  (void)finished;
}

inline void barrier(Wait kind) {
  BlockState& b = *ctx.block;
  (*b.fibers)[static_cast<size_t>(b.current)].wait = kind;
  yield_to_scheduler(false);
}

inline void fiber_main() {
  BlockState& b = *ctx.block;
#if defined(KVPR_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &b.scheduler_stack_bottom, &b.scheduler_stack_size);
#endif
  b.entry(b.entry_arg);
  (*b.fibers)[static_cast<size_t>(b.current)].done = true;
  yield_to_scheduler(true);
  std::abort();  // a finished fiber is never resumed
}

// Value of lane `src` of this warp (every live lane of the warp calls this together).
template <typename T>
T exchange(T v, int src) {
  static_assert(sizeof(T) <= sizeof(uint64_t));
  BlockState& b = *ctx.block;
  uint64_t* slots = b.slots[ctx.warp];
  std::memcpy(&slots[ctx.lane], &v, sizeof(T));
  barrier(Wait::Warp);
  T r = v;
  const int live = static_cast<int>(std::min<size_t>(32, b.fibers->size() - static_cast<size_t>(ctx.warp) * 32));
  if (src >= 0 && src < live) std::memcpy(&r, &slots[src], sizeof(T));
  barrier(Wait::Warp);  // nobody overwrites a slot before every lane has read
  return r;
}

#if defined(KVPR_EMU_FAST_SWITCH)
// A new fiber's stack, as kvpr_emu_switch leaves a switched-out one: the control words, six
// callee-saved registers, then the address it "returns" to (fiber_main, entered as if called:
// a null return address above it, the stack 16-byte aligned at the call).
inline void init_fiber(Fiber& f) {
  auto* top = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(f.stack) + f.stack_size) & ~uintptr_t{15});
  top[-1] = 0;                                          // fiber_main's return address: none
  top[-2] = reinterpret_cast<uint64_t>(&fiber_main);   // popped by ret
  for (int r = 3; r <= 8; ++r) top[-r] = 0;            // rbp rbx r12 r13 r14 r15
  top[-9] = 0x1F80ull | (0x037Full << 32);              // MXCSR and x87 control word defaults
  f.sp = &top[-9];
}
#else
// getcontext returns twice: kept out of functions with locals it could clobber.
[[gnu::noinline]] inline void init_fiber(Fiber& f) {
  getcontext(&f.uc);
  f.uc.uc_stack.ss_sp = f.stack;
  f.uc.uc_stack.ss_size = f.stack_size;
  f.uc.uc_link = nullptr;
  makecontext(&f.uc, fiber_main, 0);
}
#endif

// Runs one block: every fiber until it finishes or waits at a barrier; a barrier opens when
// every live thread of its warp (or block) waits at it. Threads that wait at different
// barriers forever are a deadlock on the GPU too: it throws.
inline void run_block(std::vector<Fiber>& fibers, BlockState& b, dim3 bid, dim3 block, dim3 grid) {
  b.fibers = &fibers;
  const int n = static_cast<int>(fibers.size());
  for (int t = 0; t < n; ++t) {
    Fiber& f = fibers[static_cast<size_t>(t)];
    f.done = false;
    f.wait = Wait::None;
    f.fake_stack = nullptr;
    init_fiber(f);
  }
  const int warps = (n + 31) / 32;
  for (;;) {
    bool ran = false;
    for (int t = 0; t < n; ++t) {
      Fiber& f = fibers[static_cast<size_t>(t)];
      if (f.done || f.wait != Wait::None) continue;
      ctx.thread_idx = f.thread_idx;
      ctx.block_idx = bid;
      ctx.block_dim = block;
      ctx.grid_dim = grid;
      ctx.lane = f.lane;
      ctx.warp = f.warp;
      ctx.block = &b;
      b.current = t;
#if defined(KVPR_EMU_ASAN)
      __sanitizer_start_switch_fiber(&b.scheduler_fake_stack, f.stack, f.stack_size);
#endif
#if defined(KVPR_EMU_FAST_SWITCH)
      kvpr_emu_switch(&b.scheduler_sp, f.sp);
#else
      swapcontext(&b.scheduler, &f.uc);
#endif
#if defined(KVPR_EMU_ASAN)
      __sanitizer_finish_switch_fiber(b.scheduler_fake_stack, nullptr, nullptr);
#endif
      ran = true;
    }
    bool all_done = true, released = false;
    for (int w = 0; w < warps; ++w) {
      bool any = false, all = true;
      for (int t = w * 32; t < std::min(n, w * 32 + 32); ++t) {
        const Fiber& f = fibers[static_cast<size_t>(t)];
        if (f.done) continue;
        any = true;
        all = all && f.wait == Wait::Warp;
      }
      if (any && all) {
        for (int t = w * 32; t < std::min(n, w * 32 + 32); ++t)
          if (!fibers[static_cast<size_t>(t)].done) fibers[static_cast<size_t>(t)].wait = Wait::None;
        released = true;
      }
    }
    bool any = false, all = true;
    for (const Fiber& f : fibers) {
      if (f.done) continue;
      any = true;
      all = all && f.wait == Wait::Block;
    }
    all_done = !any;
    if (any && all) {
      for (Fiber& f : fibers)
        if (!f.done) f.wait = Wait::None;
      released = true;
    }
    if (all_done) return;
    if (!ran && !released) {
#if defined(KVPR_EMU_ASAN)
      // The stuck fibers never unwind: clear their frames' poison before the stacks are reused.
      for (Fiber& f : fibers) ASAN_UNPOISON_MEMORY_REGION(f.stack, f.stack_size);
#endif
      throw std::runtime_error("simt_emu: deadlock in block (" + std::to_string(bid.x) + "," + std::to_string(bid.y) +
                               "," + std::to_string(bid.z) + "): threads wait at different barriers");
    }
  }
}

// Stacks for up to 1024 fibers, each above a PROT_NONE guard page; reused by every launch.
class StackPool {
 public:
  static constexpr size_t kStack = 256 * 1024;
  static constexpr size_t kPage = 4096;
  char* get(size_t i) {
    while (stacks_.size() <= i) {
      void* p = mmap(nullptr, kStack + kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::runtime_error("simt_emu: cannot map a fiber stack");
      mprotect(p, kPage, PROT_NONE);
      stacks_.push_back(static_cast<char*>(p) + kPage);
    }
    return stacks_[i];
  }
  ~StackPool() {
    for (char* s : stacks_) munmap(s - kPage, kStack + kPage);
  }

 private:
  std::vector<char*> stacks_;
};
inline StackPool& stacks() {
  static StackPool pool;
  return pool;
}

// Set by the emulated CUDA runtime (cuda_runtime_emu.cc): queues a launch's work on its
// stream, after checking the pointers it is handed. Without it (the kernel tests) a launch
// runs at once.
inline void (*submit_launch)(cudaStream_t stream, std::function<void()> run,
                             const std::vector<const void*>& pointer_args) = nullptr;

template <typename... P>
struct Launch {
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;
  void (*kernel)(P...);

  template <typename... A>
  void operator()(A&&... args) const {
    static_assert(sizeof...(A) == sizeof...(P), "kernel argument count");
    const int n = static_cast<int>(block.x * block.y * block.z);
    if (n <= 0 || n > 1024) throw std::runtime_error("simt_emu: invalid block size " + std::to_string(n));
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) throw std::runtime_error("simt_emu: empty grid");
    if (grid.y > 65535 || grid.z > 65535) throw std::runtime_error("simt_emu: grid.y/z over 65535");
    if (shared_bytes > 48 * 1024)  // more needs cudaFuncSetAttribute, which no launcher calls
      throw std::runtime_error("simt_emu: " + std::to_string(shared_bytes) + " bytes of dynamic shared memory");
    struct Call {
      void (*kernel)(P...);
      std::tuple<P...> params;
    };
    // Converted as a launch converts them, and copied: the launch owns its arguments.
    auto call = std::make_shared<Call>(Call{kernel, std::tuple<P...>(static_cast<P>(args)...)});
    const dim3 g = grid, bl = block;
    std::function<void()> run = [call, g, bl, n] {
      std::vector<Fiber> fibers(static_cast<size_t>(n));
      for (int t = 0; t < n; ++t) {
        Fiber& f = fibers[static_cast<size_t>(t)];
        f.stack = stacks().get(static_cast<size_t>(t));
        f.stack_size = StackPool::kStack;
        const unsigned u = static_cast<unsigned>(t);
        f.thread_idx = dim3(u % bl.x, (u / bl.x) % bl.y, u / (bl.x * bl.y));
        f.lane = t & 31;
        f.warp = t >> 5;
      }
      BlockState b;
      b.entry = [](void* p) {
        auto* c = static_cast<Call*>(p);
        std::apply(c->kernel, c->params);
      };
      b.entry_arg = call.get();
      for (unsigned bz = 0; bz < g.z; ++bz)
        for (unsigned by = 0; by < g.y; ++by)
          for (unsigned bx = 0; bx < g.x; ++bx) run_block(fibers, b, dim3(bx, by, bz), bl, g);
    };
    if (!submit_launch) return run();
    std::vector<const void*> pointers;
    std::apply(
        [&pointers](const auto&... p) {
          (
              [&pointers](const auto& v) {
                if constexpr (std::is_pointer_v<std::decay_t<decltype(v)>>)
                  pointers.push_back(static_cast<const void*>(v));
              }(p),
              ...);
        },
        call->params);
    submit_launch(stream, std::move(run), pointers);
  }
};

template <typename... P>
Launch<P...> launch(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, void (*kernel)(P...)) {
  return Launch<P...>{grid, block, shared_bytes, stream, kernel};
}

}  // namespace kvpr_emu

// ---- what the kernels see ----
#undef __shared__
#define __shared__ static
#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim
#define threadIdx (::kvpr_emu::ctx.thread_idx)
#define blockIdx (::kvpr_emu::ctx.block_idx)
#define blockDim (::kvpr_emu::ctx.block_dim)
#define gridDim (::kvpr_emu::ctx.grid_dim)

inline void __syncthreads() { ::kvpr_emu::barrier(::kvpr_emu::Wait::Block); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::kvpr_emu::barrier(::kvpr_emu::Wait::Warp); }
template <typename T>
T __shfl_sync(unsigned, T v, int src, int width = 32) {
  const int lane = ::kvpr_emu::ctx.lane;
  return ::kvpr_emu::exchange(v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <typename T>
T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  const int lane = ::kvpr_emu::ctx.lane;
  const int src = lane ^ mask;
  return ::kvpr_emu::exchange(v, (src & ~(width - 1)) == (lane & ~(width - 1)) ? src : lane);
}
template <typename T>
T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  const int lane = ::kvpr_emu::ctx.lane;
  const int src = lane + static_cast<int>(delta);
  return ::kvpr_emu::exchange(v, (src & ~(width - 1)) == (lane & ~(width - 1)) ? src : lane);
}
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
