// What the parts of the emulated runtime share: the handle types the CUDA headers leave opaque,
// the devices and the State every API call locks (cuda_runtime_emu.cc, with device queries and the
// schedule), and the helpers that memory (cuda_memory_emu.cc), streams, events and graphs
// (cuda_streams_emu.cc) and the cuBLAS GEMMs (cublas_emu.cc) are written with.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/emulated/cuda_runtime_emu.h"

// The handle types the CUDA headers leave opaque.
struct CUgraph_st {
  std::vector<std::function<void()>> nodes;  // in stream order (one captured stream)
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> nodes;
};
struct CUstream_st {
  int device = 0;  // the device current when it was created, whose work it queues
  std::deque<std::function<void()>> queue;
  uint64_t submitted = 0, done = 0;  // ops queued so far; ops run so far
  std::shared_ptr<CUgraph_st> capture;  // while capturing: where its work goes instead
  bool capture_invalid = false;          // a prohibited call was made during the capture
};
struct CUevent_st {
  bool timing = true;
  bool recorded = false;
  bool captured = false;  // its last record was made inside a stream capture
  std::shared_ptr<CUstream_st> stream;  // where it was last recorded
  uint64_t seq = 0;                     // complete once stream->done >= seq
  uint64_t generation = 0;
  double time_ms = 0;  // when the device reached the latest record
};
// A cuBLAS handle.
struct cublasContext {
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;  // cublasSetWorkspace (the emulated GEMMs need none)
};

namespace kvpr_emu::internal {

constexpr size_t kAlign = 256;      // cudaMalloc's alignment
constexpr size_t kRedZone = 256;    // poisoned bytes after every allocation
constexpr size_t kArena = size_t{8} << 30;  // address space reserved per device (its memory at most)
constexpr int kMaxDevices = 16;
constexpr unsigned char kGarbage = 0xff;  // fresh memory reads as NaN

inline size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }
// Under AddressSanitizer: the bytes no kernel or copy may touch (red zones, freed memory).
void poison(const void* p, size_t n);
void unpoison(const void* p, size_t n);

struct Allocation {
  size_t bytes;  // requested
  size_t chunk;  // reserved, red zone included
};

// One emulated GPU: its memory (an arena of the process's address space), its legacy stream, its
// PCI bus id (what placement matches against the machine's topology) and its link to the host.
struct Device {
  int index = 0;
  char* arena = nullptr;
  size_t capacity = kArena;  // its memory: KVPR_EMULATED_GPU_MEMORY, at most kArena
  size_t extent = 0;  // the arena's used prefix (page aligned), mprotect'ed as a whole
  std::map<size_t, size_t> free_;  // offset -> size, coalesced
  std::map<size_t, Allocation> live;
  size_t allocated = 0;
  std::shared_ptr<CUstream_st> legacy = std::make_shared<CUstream_st>();
  std::string bus_id;
  // Its PCIe link (KVPR_EMULATED_LINK_GBPS; 0: copies take no time).
  double link_bytes_per_ms = 0;
  bool holds(const void* p) const {
    const char* c = static_cast<const char*>(p);
    return c >= arena && c < arena + kArena;
  }
};

// Which device the calling thread's runtime calls go to (cudaSetDevice), as in CUDA.
extern thread_local int t_device;

struct State {
  std::recursive_mutex mu;
  std::vector<std::unique_ptr<Device>> devices;
  int device_depth = 0;
  struct Pinned {
    size_t bytes;
    bool owned;  // cudaHostAlloc (else cudaHostRegister)
  };
  std::map<uintptr_t, Pinned> pinned;
  std::map<CUstream_st*, std::shared_ptr<CUstream_st>> streams;
  std::map<CUevent_st*, std::shared_ptr<CUevent_st>> events;
  std::map<cublasContext*, std::unique_ptr<cublasContext>> handles;
  std::map<CUgraph_st*, std::shared_ptr<CUgraph_st>> graphs;
  std::map<CUgraphExec_st*, std::shared_ptr<CUgraphExec_st>> execs;
  std::shared_ptr<CUstream_st> capturing;  // the stream being captured (one at a time)
  cudaError_t last_error = cudaSuccess;
  Schedule schedule = Schedule::Lazy;
  std::mt19937_64 rng{1};
  uint64_t kernels = 0, gemms = 0;
  uint64_t host_waits = 0;  // calls that blocked the host on queued work
  uint64_t submissions = 0;  // kernels, GEMMs, copies, memsets and graph launches the host issued
  std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();

  // The devices from the environment: KVPR_EMULATED_GPUS (how many), KVPR_EMULATED_GPU_MEMORY
  // (each one's memory), KVPR_EMULATED_LINK_GBPS (each one's link, GB/s, one rate or a list),
  // KVPR_EMULATED_PCI_BUS_IDS (a comma list; else 0000:<index as 2 hex digits>:00.0).
  State();
};

// The one State (never destroyed: backends may release memory during exit).
State& state();

// The devices may touch their arenas while at least one of these lives.
struct DeviceWindow {
  State& s;
  explicit DeviceWindow(State& st);
  ~DeviceWindow();
};

// The device whose memory p is in, or null.
Device* device_of(State& s, const void* p);
// The calling thread's device (cudaSetDevice), or null when there is none.
Device* current(State& s);
// The live allocation holding [p, p + n), or null.
const Allocation* find_allocation(State& s, const void* p, size_t n, size_t* offset = nullptr);
const State::Pinned* find_pinned(State& s, const void* p, size_t n);
Memory classify_locked(State& s, const void* p);
std::string where(const void* p, size_t n);  // "[p, +n)"
// Throws the fault a GPU would raise when work touches [p, p + n) outside its memory.
void check_range(State& s, const void* p, size_t n, const char* what);
cudaError_t fail(State& s, cudaError_t e);  // records e as the last error and returns it
// A call that may make the host wait, or allocates, while a stream is being captured: CUDA
// refuses it (cudaStreamCaptureModeGlobal and ThreadLocal, the modes the backend uses) and the
// capture is invalidated, so cudaStreamEndCapture fails too.
bool capture_violation(State& s);
std::shared_ptr<CUstream_st> stream_of(State& s, cudaStream_t h);  // null: not a live stream
// Runs queued ops of `st` until `seq` of them have run. An op that waits on an event runs
// the other stream up to it first (so no schedule can break an event's order).
void run_until(State& s, const std::shared_ptr<CUstream_st>& st, uint64_t seq);
// The host blocks until `st` has run `seq` ops.
void host_wait(State& s, const std::shared_ptr<CUstream_st>& st, uint64_t seq);
void run_all(State& s);  // the host waits for every stream of every device
// Random schedule: some queued work runs now, as on a device that is partly caught up.
void maybe_run_some(State& s);
// Queues op on st (or, while st is captured, adds it to the capture's graph).
void enqueue(State& s, const std::shared_ptr<CUstream_st>& st, std::function<void()> op);
double now_ms(State& s);  // since the runtime started
// Sleeps as long as `bytes` take over device d's link (no time without a rate).
void cross_link(Device* d, size_t bytes);
// Paces a copy from src to dst by the link it crosses: to a device from host memory, or from
// one to the host.
void pace_copy(State& s, void* dst, const void* src, size_t bytes);

// Every API call holds the lock; under the random schedule it may let the device run first.
struct Api {
  State& s;
  std::lock_guard<std::recursive_mutex> lock;
  Api() : s(state()), lock(s.mu) { maybe_run_some(s); }
};

// What the emulated cuBLAS uses (each takes the lock).
void add_handle(std::unique_ptr<cublasContext> h);
bool remove_handle(cublasHandle_t h);  // false: not a live handle
bool handle_known(cublasHandle_t h);
bool stream_known(cudaStream_t stream);
bool in_one_allocation(const void* p, size_t bytes);  // [p, p + bytes) inside one live device allocation
// Throws DeviceFault ("<what> [p, +bytes) is not device memory", or outside one allocation).
void check_device_operand(const void* p, size_t bytes, const std::string& what);
// Queues a GEMM's work on `stream` (counted in gemms_run once it ran).
void enqueue_gemm(cudaStream_t stream, std::function<void()> op);

}  // namespace kvpr_emu::internal
