// The emulated CUDA device of cuda_runtime_emu.h: device memory arena, lazy streams, events,
// copies, kernel launches (run by the SIMT emulator); its cuBLAS GEMMs are cublas_emu.cc.
#define KVPR_EMU_RUNTIME_IMPL 1
#include "engine/backend/emulated/simt_emu.h"
// clang-format off
#include "engine/backend/emulated/cuda_runtime_emu.h"
// clang-format on
#include "engine/backend/emulated/cuda_runtime_emu_internal.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <random>
#include <tuple>
#include <vector>

#include "engine/base/error.h"
#include "engine/base/option_value.h"

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

namespace kvpr_emu {
namespace {

constexpr size_t kAlign = 256;      // cudaMalloc's alignment
constexpr size_t kRedZone = 256;    // poisoned bytes after every allocation
constexpr size_t kArena = size_t{8} << 30;  // address space reserved per device (its memory at most)
constexpr int kMaxDevices = 16;
#ifndef KVPR_EMU_DEFAULT_GPUS
#define KVPR_EMU_DEFAULT_GPUS 0  // devices without KVPR_EMULATED_GPUS (the test suites' build: 1)
#endif
constexpr unsigned char kGarbage = 0xff;  // fresh memory reads as NaN

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

void poison(const void* p, size_t n) {
#if defined(KVPR_EMU_ASAN)
  ASAN_POISON_MEMORY_REGION(p, n);
#else
  (void)p, (void)n;
#endif
}
void unpoison(const void* p, size_t n) {
#if defined(KVPR_EMU_ASAN)
  ASAN_UNPOISON_MEMORY_REGION(p, n);
#else
  (void)p, (void)n;
#endif
}

char* g_arenas[kMaxDevices] = {};  // read by the SIGSEGV handler

void on_segv(int, siginfo_t* info, void*) {
  const char* a = static_cast<const char*>(info->si_addr);
  for (int d = 0; d < kMaxDevices; ++d)
    if (g_arenas[d] && a >= g_arenas[d] && a < g_arenas[d] + kArena) {
      char msg[160];
      int n = snprintf(msg, sizeof msg,
                       "kvpr emulated device %d: the host touched device memory at %p (arena offset %zu)\n", d,
                       info->si_addr, static_cast<size_t>(a - g_arenas[d]));
      if (n > 0) (void)!write(2, msg, static_cast<size_t>(n));
    }
  // SA_RESETHAND restored the default action: the access faults again and the process dies.
}

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
thread_local int t_device = 0;

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
  State() {
    auto env = [](const char* k) { const char* v = std::getenv(k); return std::string(v ? v : ""); };
    auto list = [](const std::string& v) {
      std::vector<std::string> out;
      for (size_t p = 0; p <= v.size() && !v.empty();) {
        size_t q = v.find(',', p);
        if (q == std::string::npos) q = v.size();
        if (q > p) out.push_back(v.substr(p, q - p));  // (a trailing comma adds nothing)
        p = q + 1;
      }
      return out;
    };
    // (Parsed as kvprd's options are: a bad value is one line naming the variable.)
    int count = KVPR_EMU_DEFAULT_GPUS;
    if (const std::string n = env("KVPR_EMULATED_GPUS"); !n.empty())
      count = static_cast<int>(kvpr::parse_option_integer("KVPR_EMULATED_GPUS", n, 0, kMaxDevices));
    size_t capacity = kArena;
    if (const std::string m = env("KVPR_EMULATED_GPU_MEMORY"); !m.empty()) {
      const double bytes = kvpr::parse_option_size("KVPR_EMULATED_GPU_MEMORY", m);
      KVPR_CHECK(bytes > 1, "KVPR_EMULATED_GPU_MEMORY: '", m, "' is not a size in bytes (e.g. 512MiB)");
      capacity = std::min(static_cast<size_t>(bytes), kArena);
    }
    const std::vector<std::string> rates = list(env("KVPR_EMULATED_LINK_GBPS")), buses = list(env("KVPR_EMULATED_PCI_BUS_IDS"));
    for (int d = 0; d < count; ++d) {
      auto dev = std::make_unique<Device>();
      dev->index = d;
      void* p = mmap(nullptr, kArena, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) throw std::runtime_error("kvpr emulated device: cannot reserve the device arena");
      dev->arena = static_cast<char*>(p);
      g_arenas[d] = dev->arena;
      dev->capacity = capacity;
      dev->free_[0] = capacity;
      dev->legacy->device = d;
      if (!rates.empty()) {
        const std::string& r = rates[std::min<size_t>(static_cast<size_t>(d), rates.size() - 1)];
        const double gbps = kvpr::parse_option_number("KVPR_EMULATED_LINK_GBPS", r);
        KVPR_CHECK(gbps >= 0, "KVPR_EMULATED_LINK_GBPS: '", r, "' is not a rate in GB/s");
        dev->link_bytes_per_ms = gbps * 1e6;
      }
      if (static_cast<size_t>(d) < buses.size()) {
        dev->bus_id = buses[static_cast<size_t>(d)];
      } else {
        char b[16];
        snprintf(b, sizeof b, "0000:%02x:00.0", d);
        dev->bus_id = b;
      }
      devices.push_back(std::move(dev));
    }
#if !defined(KVPR_EMU_ASAN)
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigaction(SIGSEGV, &sa, nullptr);
#endif
    if (const char* s = std::getenv("KVPR_EMU_SCHEDULE")) {
      const std::string v = s;
      if (v == "eager") schedule = Schedule::Eager;
      else if (v.rfind("random", 0) == 0) {
        schedule = Schedule::Random;
        rng.seed(v.size() > 7 ? std::stoull(v.substr(7)) : 1);
      }
    }
  }
};

State& state() {
  static State* s = new State;  // never destroyed: backends may release memory during exit
  return *s;
}

// The devices may touch their arenas while at least one of these lives.
struct DeviceWindow {
  State& s;
  explicit DeviceWindow(State& st) : s(st) {
    if (s.device_depth++ == 0)
      for (auto& d : s.devices)
        if (d->extent) mprotect(d->arena, d->extent, PROT_READ | PROT_WRITE);
  }
  ~DeviceWindow() {
    if (--s.device_depth == 0)
      for (auto& d : s.devices)
        if (d->extent) mprotect(d->arena, d->extent, PROT_NONE);
  }
};

// The device whose memory p is in, or null.
Device* device_of(State& s, const void* p) {
  for (auto& d : s.devices)
    if (d->holds(p)) return d.get();
  return nullptr;
}

// The calling thread's device (cudaSetDevice), or null when there is none.
Device* current(State& s) {
  return t_device >= 0 && static_cast<size_t>(t_device) < s.devices.size() ? s.devices[static_cast<size_t>(t_device)].get()
                                                                              : nullptr;
}

// The live allocation holding [p, p + n), or null.
const Allocation* find_allocation(State& s, const void* p, size_t n, size_t* offset = nullptr) {
  Device* d = device_of(s, p);
  if (!d) return nullptr;
  const size_t off = static_cast<size_t>(static_cast<const char*>(p) - d->arena);
  auto it = d->live.upper_bound(off);
  if (it == d->live.begin()) return nullptr;
  --it;
  if (off + n > it->first + it->second.bytes || off < it->first) return nullptr;
  if (offset) *offset = it->first;
  return &it->second;
}

const State::Pinned* find_pinned(State& s, const void* p, size_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = s.pinned.upper_bound(a);
  if (it == s.pinned.begin()) return nullptr;
  --it;
  if (a + n > it->first + it->second.bytes) return nullptr;
  return &it->second;
}

Memory classify_locked(State& s, const void* p) {
  if (device_of(s, p)) return Memory::Device;
  if (find_pinned(s, p, 1)) return Memory::Pinned;
  return Memory::Pageable;
}

std::string where(const void* p, size_t n) {
  char b[96];
  snprintf(b, sizeof b, "[%p, +%zu)", p, n);
  return b;
}

// Throws the fault a GPU would raise when work touches [p, p + n) outside its memory.
void check_range(State& s, const void* p, size_t n, const char* what) {
  if (n == 0) return;
  switch (classify_locked(s, p)) {
    case Memory::Device:
      if (!find_allocation(s, p, n))
        throw DeviceFault(std::string(what) + ": device range " + where(p, n) + " is not inside one live allocation");
      return;
    case Memory::Pinned:
      if (!find_pinned(s, p, n))
        throw DeviceFault(std::string(what) + ": pinned range " + where(p, n) + " runs past its registration");
      return;
    case Memory::Pageable: return;
  }
}

cudaError_t fail(State& s, cudaError_t e) {
  s.last_error = e;
  return e;
}

// A call that may make the host wait, or allocates, while a stream is being captured: CUDA
// refuses it (cudaStreamCaptureModeGlobal and ThreadLocal, the modes the backend uses) and the
// capture is invalidated, so cudaStreamEndCapture fails too.
bool capture_violation(State& s) {
  if (!s.capturing) return false;
  s.capturing->capture_invalid = true;
  s.last_error = cudaErrorStreamCaptureUnsupported;
  return true;
}

std::shared_ptr<CUstream_st> stream_of(State& s, cudaStream_t h) {
  if (h == nullptr || h == cudaStreamLegacy) {
    Device* d = current(s);
    return d ? d->legacy : nullptr;
  }
  auto it = s.streams.find(h);
  return it == s.streams.end() ? nullptr : it->second;
}

// Runs queued ops of `st` until `seq` of them have run. An op that waits on an event runs
// the other stream up to it first (so no schedule can break an event's order).
void run_until(State& s, const std::shared_ptr<CUstream_st>& st, uint64_t seq) {
  if (st->done >= seq) return;
  DeviceWindow w(s);
  while (st->done < seq && !st->queue.empty()) {
    std::function<void()> op = std::move(st->queue.front());
    st->queue.pop_front();
    ++st->done;
    op();
  }
}
// The host blocks until `st` has run `seq` ops.
void note_wait() {
  static const bool on = std::getenv("KVPR_EMU_TRACE_WAITS") != nullptr;
  if (!on) return;
  void* frames[24];
  int n = backtrace(frames, 24);
  fprintf(stderr, "-- host wait\n");
  backtrace_symbols_fd(frames, n, 2);
}
void host_wait(State& s, const std::shared_ptr<CUstream_st>& st, uint64_t seq) {
  if (st->done < seq) ++s.host_waits, note_wait();
  run_until(s, st, seq);
}

// Every stream of every device.
std::vector<std::shared_ptr<CUstream_st>> all_streams(State& s) {
  std::vector<std::shared_ptr<CUstream_st>> all;
  for (auto& d : s.devices) all.push_back(d->legacy);
  for (auto& [h, st] : s.streams) all.push_back(st);
  return all;
}

void run_all(State& s) {
  std::vector<std::shared_ptr<CUstream_st>> all = all_streams(s);
  for (auto& st : all)
    if (st->done < st->submitted) {
      ++s.host_waits;
      note_wait();
      break;
    }
  // Under the random schedule the streams catch up in a random order too.
  if (s.schedule == Schedule::Random) std::shuffle(all.begin(), all.end(), s.rng);
  for (auto& st : all) run_until(s, st, st->submitted);
}

// Random schedule: some queued work runs now, as on a device that is partly caught up.
void maybe_run_some(State& s) {
  if (s.schedule != Schedule::Random || s.device_depth > 0) return;
  std::vector<std::shared_ptr<CUstream_st>> busy;
  for (auto& st : all_streams(s))
    if (!st->queue.empty()) busy.push_back(st);
  if (busy.empty() || s.rng() % 3 != 0) return;
  auto& st = busy[s.rng() % busy.size()];
  run_until(s, st, st->done + 1 + s.rng() % 3);
}

void enqueue(State& s, const std::shared_ptr<CUstream_st>& st, std::function<void()> op) {
  if (st->capture) {  // captured: becomes a node of the graph, runs only when that is launched
    st->capture->nodes.push_back(std::move(op));
    return;
  }
  st->queue.push_back(std::move(op));
  ++st->submitted;
  if (s.schedule == Schedule::Eager) run_until(s, st, st->submitted);
}

// Every API call holds the lock; under the random schedule it may let the device run first.
struct Api {
  State& s;
  std::lock_guard<std::recursive_mutex> lock;
  Api() : s(state()), lock(s.mu) { maybe_run_some(s); }
};

double now_ms(State& s) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s.epoch).count();
}

// A copy of `bytes` over device d's link takes bytes / rate. Queued work runs one op at a time
// on the host thread that waits for it, holding the runtime's lock, so copies overlap neither
// each other nor compute (either direction), and other threads' CUDA calls wait meanwhile: a
// serial model of the link, enough for the profile and the split to see its rate.
void cross_link(Device* d, size_t bytes) {
  if (!d || d->link_bytes_per_ms <= 0 || bytes == 0) return;
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(static_cast<double>(bytes) / d->link_bytes_per_ms));
}

}  // namespace

void cross_device_link(const void* device_ptr, size_t bytes) {
  Api a;
  cross_link(device_of(a.s, device_ptr), bytes);
}

namespace {

// The link a copy from src to dst crosses: to a device from host memory, or from one to the host.
void pace_copy(State& s, void* dst, const void* src, size_t bytes) {
  Device *dd = device_of(s, dst), *sd = device_of(s, src);
  if (dd && !sd) cross_link(dd, bytes);
  else if (sd && !dd) cross_link(sd, bytes);
}

void submit_kernel(cudaStream_t stream, std::function<void()> run, const std::vector<const void*>& pointers) {
  Api a;
  auto st = stream_of(a.s, stream);
  if (!st) throw DeviceFault("kernel launch on an invalid stream");
  for (size_t i = 0; i < pointers.size(); ++i) {
    const void* p = pointers[i];
    if (!p) continue;
    const Memory m = classify_locked(a.s, p);
    if (m == Memory::Pageable)
      throw DeviceFault("kernel argument " + std::to_string(i) + " (" + where(p, 0) +
                        ") points to pageable host memory, which a GPU cannot read");
    if (m == Memory::Device && !find_allocation(a.s, p, 1) && !find_allocation(a.s, static_cast<const char*>(p) - 1, 1))
      throw DeviceFault("kernel argument " + std::to_string(i) + " (" + where(p, 0) +
                        ") points to device memory that is not allocated");
    if (m == Memory::Device && device_of(a.s, p)->index != st->device)
      throw DeviceFault("kernel argument " + std::to_string(i) + " (" + where(p, 0) + ") is device " +
                        std::to_string(device_of(a.s, p)->index) + "'s memory, launched on device " +
                        std::to_string(st->device) + " (no peer access)");
  }
  State* s = &a.s;
  ++a.s.submissions;
  enqueue(a.s, st, [run = std::move(run), s] {
    run();
    ++s->kernels;
  });
}

struct Installer {
  Installer() { submit_launch = submit_kernel; }
} installer;

}  // namespace

void set_schedule(Schedule sc, uint64_t seed) {
  Api a;
  run_all(a.s);
  a.s.schedule = sc;
  a.s.rng.seed(seed);
}
Schedule schedule() {
  Api a;
  return a.s.schedule;
}
uint64_t kernels_run() {
  Api a;
  return a.s.kernels;
}
uint64_t gemms_run() {
  Api a;
  return a.s.gemms;
}
uint64_t host_waits() {
  Api a;
  return a.s.host_waits;
}
uint64_t host_submissions() {
  Api a;
  return a.s.submissions;
}
Memory classify(const void* p) {
  Api a;
  return classify_locked(a.s, p);
}

// ---- device ----
cudaError_t cudaGetDeviceCount(int* count) {
  Api a;
  if (!count) return fail(a.s, cudaErrorInvalidValue);
  *count = static_cast<int>(a.s.devices.size());
  return *count > 0 ? cudaSuccess : fail(a.s, cudaErrorNoDevice);  // as CUDA with no GPU
}
namespace {
bool valid_device(State& s, int device) { return device >= 0 && static_cast<size_t>(device) < s.devices.size(); }
}  // namespace
cudaError_t cudaSetDevice(int device) {
  Api a;
  if (!valid_device(a.s, device)) return fail(a.s, cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  Api a;
  if (!device) return fail(a.s, cudaErrorInvalidValue);
  if (a.s.devices.empty()) return fail(a.s, cudaErrorNoDevice);
  *device = t_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  Api a;
  if (!prop) return fail(a.s, cudaErrorInvalidValue);
  if (!valid_device(a.s, device)) return fail(a.s, cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  snprintf(prop->name, sizeof prop->name, "kvpr emulated device");
  prop->totalGlobalMem = a.s.devices[static_cast<size_t>(device)]->capacity;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 1;
  prop->memPitch = 2147483647;  // what CUDA reports: the largest pitch of a 2-D copy
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device) {
  Api a;
  if (!bus_id || len < 13) return fail(a.s, cudaErrorInvalidValue);
  if (!valid_device(a.s, device)) return fail(a.s, cudaErrorInvalidDevice);
  snprintf(bus_id, static_cast<size_t>(len), "%s", a.s.devices[static_cast<size_t>(device)]->bus_id.c_str());
  return cudaSuccess;
}
cudaError_t cudaGetLastError() {
  Api a;
  cudaError_t e = a.s.last_error;
  a.s.last_error = cudaSuccess;
  return e;
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
    case cudaErrorNotSupported: return "operation not supported";
    default: return "unknown error";
  }
}
cudaError_t cudaDeviceSynchronize() {
  Api a;
  if (capture_violation(a.s)) return cudaErrorStreamCaptureUnsupported;
  run_all(a.s);
  return cudaSuccess;
}

// ---- memory ----
cudaError_t cudaMalloc(void** p, size_t bytes) {
  Api a;
  if (capture_violation(a.s)) return cudaErrorStreamCaptureUnsupported;
  State& s = a.s;
  if (!p) return fail(s, cudaErrorInvalidValue);
  *p = nullptr;
  Device* d = current(s);
  if (!d) return fail(s, cudaErrorNoDevice);
  if (bytes == 0) return cudaSuccess;
  if (bytes > d->capacity) return fail(s, cudaErrorMemoryAllocation);
  const size_t chunk = round_up(bytes, kAlign) + kRedZone;
  auto it = d->free_.begin();
  while (it != d->free_.end() && it->second < chunk) ++it;
  if (it == d->free_.end() || d->allocated + chunk > d->capacity) return fail(s, cudaErrorMemoryAllocation);
  const size_t off = it->first, left = it->second - chunk;
  d->free_.erase(it);
  if (left) d->free_[off + chunk] = left;
  d->live[off] = Allocation{bytes, chunk};
  d->allocated += chunk;
  const size_t end = round_up(off + chunk, size_t{2} << 20);
  if (end > d->extent) {
    if (s.device_depth > 0) mprotect(d->arena + d->extent, end - d->extent, PROT_READ | PROT_WRITE);
    d->extent = end;
  }
  char* q = d->arena + off;
  unpoison(q, bytes);
  {
    DeviceWindow w(s);
    std::memset(q, kGarbage, bytes);  // cudaMalloc does not clear: reading it unset gives NaNs
  }
  poison(q + bytes, chunk - bytes);
  *p = q;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  Api a;
  if (capture_violation(a.s)) return cudaErrorStreamCaptureUnsupported;
  State& s = a.s;
  if (!p) return cudaSuccess;
  Device* d = device_of(s, p);
  if (!d) return fail(s, cudaErrorInvalidValue);
  const size_t off = static_cast<size_t>(static_cast<const char*>(p) - d->arena);
  auto it = d->live.find(off);
  if (it == d->live.end()) return fail(s, cudaErrorInvalidValue);
  run_all(s);  // cudaFree waits for the device
  const size_t chunk = it->second.chunk;
  d->live.erase(it);
  d->allocated -= chunk;
  poison(d->arena + off, chunk);
  // Give large chunks' pages back (they read as garbage again once reallocated).
  const size_t lo = round_up(off, 4096), hi = (off + chunk) / 4096 * 4096;
  if (hi > lo + (size_t{1} << 20)) madvise(d->arena + lo, hi - lo, MADV_DONTNEED);
  auto [ins, ok] = d->free_.emplace(off, chunk);
  (void)ok;
  auto next = std::next(ins);
  if (next != d->free_.end() && ins->first + ins->second == next->first) {
    ins->second += next->second;
    d->free_.erase(next);
  }
  if (ins != d->free_.begin()) {
    auto prev = std::prev(ins);
    if (prev->first + prev->second == ins->first) {
      prev->second += ins->second;
      d->free_.erase(ins);
    }
  }
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  Api a;
  if (!free_bytes || !total_bytes) return fail(a.s, cudaErrorInvalidValue);
  Device* d = current(a.s);
  if (!d) return fail(a.s, cudaErrorNoDevice);
  *total_bytes = d->capacity;
  *free_bytes = d->capacity - d->allocated;
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned) {
  Api a;
  if (capture_violation(a.s)) return cudaErrorStreamCaptureUnsupported;
  if (!p) return fail(a.s, cudaErrorInvalidValue);
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  void* q = std::aligned_alloc(4096, round_up(bytes, 4096));
  if (!q) return fail(a.s, cudaErrorMemoryAllocation);
  std::memset(q, kGarbage, bytes);
  a.s.pinned[reinterpret_cast<uintptr_t>(q)] = State::Pinned{bytes, true};
  *p = q;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  Api a;
  if (capture_violation(a.s)) return cudaErrorStreamCaptureUnsupported;
  if (!p) return cudaSuccess;
  auto it = a.s.pinned.find(reinterpret_cast<uintptr_t>(p));
  if (it == a.s.pinned.end() || !it->second.owned) return fail(a.s, cudaErrorInvalidValue);
  run_all(a.s);  // as cudaFreeHost, waits for the device
  a.s.pinned.erase(it);
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned) {
  Api a;
  if (capture_violation(a.s)) return cudaErrorStreamCaptureUnsupported;
  if (!p || bytes == 0 || classify_locked(a.s, p) == Memory::Device) return fail(a.s, cudaErrorInvalidValue);
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p);
  auto it = a.s.pinned.lower_bound(lo);
  if (it != a.s.pinned.end() && it->first < lo + bytes) return fail(a.s, cudaErrorHostMemoryAlreadyRegistered);
  if (it != a.s.pinned.begin() && std::prev(it)->first + std::prev(it)->second.bytes > lo)
    return fail(a.s, cudaErrorHostMemoryAlreadyRegistered);
  a.s.pinned[lo] = State::Pinned{bytes, false};
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* p) {
  Api a;
  if (capture_violation(a.s)) return cudaErrorStreamCaptureUnsupported;
  auto it = a.s.pinned.find(reinterpret_cast<uintptr_t>(p));
  if (it == a.s.pinned.end() || it->second.owned) return fail(a.s, cudaErrorHostMemoryNotRegistered);
  run_all(a.s);
  a.s.pinned.erase(it);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  Api a;
  State& s = a.s;
  auto st = stream_of(s, stream);
  if (!st) return fail(s, cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (!dst || !src) return fail(s, cudaErrorInvalidValue);
  const bool dd = classify_locked(s, dst) == Memory::Device, sd = classify_locked(s, src) == Memory::Device;
  const bool kind_ok = kind == cudaMemcpyDefault || (kind == cudaMemcpyHostToDevice && dd && !sd) ||
                       (kind == cudaMemcpyDeviceToHost && !dd && sd) || (kind == cudaMemcpyDeviceToDevice && dd && sd) ||
                       (kind == cudaMemcpyHostToHost && !dd && !sd);
  if (!kind_ok) return fail(s, cudaErrorInvalidValue);
  check_range(s, dst, bytes, "cudaMemcpyAsync destination");
  check_range(s, src, bytes, "cudaMemcpyAsync source");
  // A graph's copy node reads and writes at replay: pageable memory cannot be in one, and a
  // copy into pageable memory would make the host wait.
  const bool pageable = classify_locked(s, src) == Memory::Pageable || classify_locked(s, dst) == Memory::Pageable;
  if (pageable && (st->capture || classify_locked(s, dst) == Memory::Pageable) && capture_violation(s))
    return cudaErrorStreamCaptureUnsupported;
  ++s.submissions;
  if (classify_locked(s, src) == Memory::Pageable) {
    // From pageable memory the data is taken at the call (staged), as CUDA does.
    auto copy = std::make_shared<std::vector<char>>(static_cast<const char*>(src), static_cast<const char*>(src) + bytes);
    enqueue(s, st, [sp = &s, dst, src, copy] {
      pace_copy(*sp, dst, src, copy->size());
      std::memcpy(dst, copy->data(), copy->size());
    });
  } else {
    enqueue(s, st, [sp = &s, dst, src, bytes] {
      pace_copy(*sp, dst, src, bytes);
      std::memmove(dst, src, bytes);
    });
  }
  // Into pageable memory the call returns once the copy is done.
  if (classify_locked(s, dst) == Memory::Pageable) host_wait(s, st, st->submitted);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  Api a;
  if (capture_violation(a.s)) return cudaErrorStreamCaptureUnsupported;
  cudaError_t e = kvpr_emu::cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
  if (e == cudaSuccess) run_all(a.s);
  return e;
}

// A 2-D copy: `height` rows of `width` bytes, each `spitch` apart in src and `dpitch` in dst.
// Pinned and device memory only (kvpr issues no pageable 2-D copies).
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
  Api a;
  State& s = a.s;
  auto st = stream_of(s, stream);
  if (!st) return fail(s, cudaErrorInvalidResourceHandle);
  if (width == 0 || height == 0) return cudaSuccess;
  if (!dst || !src || kind != cudaMemcpyDefault) return fail(s, cudaErrorInvalidValue);
  if (dpitch < width || spitch < width || dpitch > 2147483647u || spitch > 2147483647u)
    return fail(s, cudaErrorInvalidPitchValue);
  const size_t dbytes = (height - 1) * dpitch + width, sbytes = (height - 1) * spitch + width;
  if (classify_locked(s, src) == Memory::Pageable || classify_locked(s, dst) == Memory::Pageable)
    throw DeviceFault("cudaMemcpy2DAsync with pageable memory (not modelled)");
  check_range(s, dst, dbytes, "cudaMemcpy2DAsync destination");
  check_range(s, src, sbytes, "cudaMemcpy2DAsync source");
  ++s.submissions;
  enqueue(s, st, [=, sp = &s] {
    pace_copy(*sp, dst, src, width * height);
    for (size_t r = 0; r < height; ++r)
      std::memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  });
  return cudaSuccess;
}

// A batch of copies in stream order as a whole, in no order among themselves (run here in
// reverse, so a batch whose copies depend on each other gives wrong data in the tests).
// CUDA's rules: not on the legacy stream, attrs[0] applies from copy 0, attribute indices
// increasing and below count, every copy's source access order given.
cudaError_t cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t count,
                                 cudaMemcpyAttributes* attrs, size_t* attrs_idxs, size_t num_attrs,
                                 cudaStream_t stream) {
  Api a;
  State& s = a.s;
  if (!stream) return fail(s, cudaErrorInvalidValue);
  auto st = stream_of(s, stream);
  if (!st) return fail(s, cudaErrorInvalidResourceHandle);
  if (count == 0 || !dsts || !srcs || !sizes || !attrs || !attrs_idxs || num_attrs == 0 || num_attrs > count ||
      attrs_idxs[0] != 0)
    return fail(s, cudaErrorInvalidValue);
  for (size_t k = 0; k < num_attrs; ++k) {
    if ((k > 0 && attrs_idxs[k] <= attrs_idxs[k - 1]) || attrs_idxs[k] >= count) return fail(s, cudaErrorInvalidValue);
    const cudaMemcpySrcAccessOrder o = attrs[k].srcAccessOrder;
    if (o != cudaMemcpySrcAccessOrderStream && o != cudaMemcpySrcAccessOrderDuringApiCall &&
        o != cudaMemcpySrcAccessOrderAny)
      return fail(s, cudaErrorInvalidValue);
  }
  std::vector<std::tuple<void*, const void*, size_t>> copies;
  for (size_t i = 0; i < count; ++i) {
    if (sizes[i] == 0) continue;
    if (!dsts[i] || !srcs[i]) return fail(s, cudaErrorInvalidValue);
    if (classify_locked(s, srcs[i]) == Memory::Pageable || classify_locked(s, dsts[i]) == Memory::Pageable)
      throw DeviceFault("cudaMemcpyBatchAsync with pageable memory (not modelled)");
    check_range(s, dsts[i], sizes[i], "cudaMemcpyBatchAsync destination");
    check_range(s, srcs[i], sizes[i], "cudaMemcpyBatchAsync source");
    copies.emplace_back(dsts[i], srcs[i], sizes[i]);
  }
  ++s.submissions;
  enqueue(s, st, [sp = &s, copies = std::move(copies)] {
    for (auto it = copies.rbegin(); it != copies.rend(); ++it) {
      pace_copy(*sp, std::get<0>(*it), std::get<1>(*it), std::get<2>(*it));
      std::memmove(std::get<0>(*it), std::get<1>(*it), std::get<2>(*it));
    }
  });
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  Api a;
  auto st = stream_of(a.s, stream);
  if (!st) return fail(a.s, cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (classify_locked(a.s, p) != Memory::Device) return fail(a.s, cudaErrorInvalidValue);
  check_range(a.s, p, bytes, "cudaMemsetAsync");
  ++a.s.submissions;
  enqueue(a.s, st, [p, value, bytes] { std::memset(p, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  Api a;
  if (capture_violation(a.s)) return cudaErrorStreamCaptureUnsupported;
  cudaError_t e = kvpr_emu::cudaMemsetAsync(p, value, bytes, nullptr);
  if (e == cudaSuccess) {
    auto legacy = stream_of(a.s, nullptr);
    host_wait(a.s, legacy, legacy->submitted);
  }
  return e;
}

// ---- streams and events ----
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* out, unsigned flags) {
  Api a;
  if (!out) return fail(a.s, cudaErrorInvalidValue);
  // A blocking stream would synchronise implicitly with the legacy stream: not modelled.
  if (!(flags & cudaStreamNonBlocking)) return fail(a.s, cudaErrorNotSupported);
  if (!current(a.s)) return fail(a.s, cudaErrorNoDevice);
  auto st = std::make_shared<CUstream_st>();
  st->device = t_device;
  *out = st.get();
  a.s.streams[st.get()] = st;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Api a;
  if (capture_violation(a.s)) return cudaErrorStreamCaptureUnsupported;
  auto it = a.s.streams.find(stream);
  if (it == a.s.streams.end()) return fail(a.s, cudaErrorInvalidResourceHandle);
  auto st = it->second;
  run_until(a.s, st, st->submitted);  // queued work still runs
  a.s.streams.erase(it);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  Api a;
  if (capture_violation(a.s)) return cudaErrorStreamCaptureUnsupported;
  auto st = stream_of(a.s, stream);
  if (!st) return fail(a.s, cudaErrorInvalidResourceHandle);
  host_wait(a.s, st, st->submitted);
  return cudaSuccess;
}

namespace {
std::shared_ptr<CUevent_st> event_of(State& s, cudaEvent_t e) {
  auto it = s.events.find(e);
  return it == s.events.end() ? nullptr : it->second;
}
}  // namespace

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* out, unsigned flags) {
  Api a;
  if (!out) return fail(a.s, cudaErrorInvalidValue);
  auto e = std::make_shared<CUevent_st>();
  e->timing = !(flags & cudaEventDisableTiming);
  *out = e.get();
  a.s.events[e.get()] = e;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* out) { return kvpr_emu::cudaEventCreateWithFlags(out, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  Api a;
  // Queued records and waits hold the event; the handle is gone now.
  return a.s.events.erase(e) ? cudaSuccess : fail(a.s, cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t stream) {
  Api a;
  auto e = event_of(a.s, ev);
  auto st = stream_of(a.s, stream);
  if (!e || !st) return fail(a.s, cudaErrorInvalidResourceHandle);
  const uint64_t gen = ++e->generation;
  e->recorded = true;
  e->captured = st->capture != nullptr;
  e->stream = st;
  State* s = &a.s;
  enqueue(a.s, st, [e, gen, s] {
    if (e->generation == gen) e->time_ms = now_ms(*s);
  });
  e->seq = st->submitted;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  Api a;
  auto e = event_of(a.s, ev);
  if (!e) return fail(a.s, cudaErrorInvalidResourceHandle);
  if (e->captured || capture_violation(a.s)) return fail(a.s, cudaErrorStreamCaptureUnsupported);
  if (e->recorded) host_wait(a.s, e->stream, e->seq);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t ev) {
  Api a;
  auto e = event_of(a.s, ev);
  if (!e) return fail(a.s, cudaErrorInvalidResourceHandle);
  if (e->captured) return fail(a.s, cudaErrorStreamCaptureUnsupported);  // a record inside a capture is no point in time
  return !e->recorded || e->stream->done >= e->seq ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t ev, unsigned) {
  Api a;
  auto e = event_of(a.s, ev);
  auto st = stream_of(a.s, stream);
  if (!e || !st) return fail(a.s, cudaErrorInvalidResourceHandle);
  if (st->capture) {
    // Inside a capture: an event of the same capture orders nothing more in one stream; one
    // recorded outside it would tie the graph to work outside (CUDA: capture isolation).
    if (e->captured && e->stream == st) return cudaSuccess;
    capture_violation(a.s);
    return fail(a.s, cudaErrorStreamCaptureIsolation);
  }
  // Joining another stream into a capture (fork/join across streams) is not modelled.
  if (e->captured) return fail(a.s, cudaErrorNotSupported);
  if (!e->recorded) return cudaSuccess;  // waiting on a never-recorded event waits for nothing
  State* s = &a.s;
  // The wait is for the record made before this call, even if the event is recorded again.
  enqueue(a.s, st, [s, other = e->stream, seq = e->seq] { run_until(*s, other, seq); });
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  Api a;
  auto e0 = event_of(a.s, start), e1 = event_of(a.s, end);
  if (!ms || !e0 || !e1) return fail(a.s, cudaErrorInvalidResourceHandle);
  if (!e0->timing || !e1->timing || !e0->recorded || !e1->recorded)
    return fail(a.s, cudaErrorInvalidResourceHandle);
  if (e0->captured || e1->captured) return fail(a.s, cudaErrorStreamCaptureUnsupported);
  if (e0->stream->done < e0->seq || e1->stream->done < e1->seq) return fail(a.s, cudaErrorNotReady);
  *ms = static_cast<float>(e1->time_ms - e0->time_ms);
  return cudaSuccess;
}

// ---- stream capture and graphs ----
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  Api a;
  auto st = stream_of(a.s, stream);
  if (!st) return fail(a.s, cudaErrorInvalidResourceHandle);
  if (st == a.s.devices[static_cast<size_t>(st->device)]->legacy)
    return fail(a.s, cudaErrorStreamCaptureUnsupported);  // as CUDA: not the legacy stream
  if (st->capture) return fail(a.s, cudaErrorIllegalState);
  // Relaxed mode and several captures at once are not modelled.
  if (mode == cudaStreamCaptureModeRelaxed || a.s.capturing) return fail(a.s, cudaErrorNotSupported);
  st->capture = std::make_shared<CUgraph_st>();
  st->capture_invalid = false;
  a.s.capturing = st;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  Api a;
  auto st = stream_of(a.s, stream);
  if (!st || !graph) return fail(a.s, cudaErrorInvalidValue);
  if (!st->capture) return fail(a.s, cudaErrorIllegalState);
  auto g = std::move(st->capture);
  st->capture = nullptr;
  a.s.capturing = nullptr;
  *graph = nullptr;
  if (st->capture_invalid) return fail(a.s, cudaErrorStreamCaptureInvalidated);
  *graph = g.get();
  a.s.graphs[g.get()] = std::move(g);
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  Api a;
  auto st = stream_of(a.s, stream);
  if (!st || !status) return fail(a.s, cudaErrorInvalidValue);
  *status = !st->capture ? cudaStreamCaptureStatusNone
                         : st->capture_invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  Api a;
  auto it = a.s.graphs.find(graph);
  if (!exec || it == a.s.graphs.end()) return fail(a.s, cudaErrorInvalidValue);
  auto e = std::make_shared<CUgraphExec_st>();
  e->nodes = it->second->nodes;  // the nodes hold their parameters by value, as an executable graph does
  *exec = e.get();
  a.s.execs[e.get()] = std::move(e);
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  Api a;
  auto it = a.s.execs.find(exec);
  auto st = stream_of(a.s, stream);
  if (it == a.s.execs.end() || !st) return fail(a.s, cudaErrorInvalidResourceHandle);
  if (st->capture) return fail(a.s, cudaErrorNotSupported);  // a graph launched into a capture: not modelled
  ++a.s.submissions;
  for (const auto& node : it->second->nodes) enqueue(a.s, st, node);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  Api a;
  // Launches already queued keep their own copies of the nodes.
  return a.s.execs.erase(exec) ? cudaSuccess : fail(a.s, cudaErrorInvalidValue);
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  Api a;
  return a.s.graphs.erase(graph) ? cudaSuccess : fail(a.s, cudaErrorInvalidValue);
}

// ---- what the emulated cuBLAS (cublas_emu.cc) uses ----
namespace internal {

ApiCall::ApiCall() : api_(new Api) {}
ApiCall::~ApiCall() { delete static_cast<Api*>(api_); }

void add_handle(std::unique_ptr<cublasContext> h) {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  cublasContext* key = h.get();
  s.handles[key] = std::move(h);
}
bool remove_handle(cublasHandle_t h) {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  return s.handles.erase(h) > 0;
}
bool handle_known(cublasHandle_t h) {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  return s.handles.count(h) > 0;
}
bool stream_known(cudaStream_t stream) {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  return stream_of(s, stream) != nullptr;
}
bool in_one_allocation(const void* p, size_t bytes) {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  return find_allocation(s, p, bytes) != nullptr;
}
void check_device_operand(const void* p, size_t bytes, const std::string& what) {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  if (bytes && classify_locked(s, p) != Memory::Device)
    throw DeviceFault(what + " " + where(p, bytes) + " is not device memory");
  check_range(s, p, bytes, what.c_str());
}
void enqueue_gemm(cudaStream_t stream, std::function<void()> op) {
  State& s = state();
  std::lock_guard<std::recursive_mutex> lock(s.mu);
  auto st = stream_of(s, stream);
  State* sp = &s;
  ++s.submissions;
  enqueue(s, st, [op = std::move(op), sp] {
    op();
    ++sp->gemms;
  });
}

}  // namespace internal

}  // namespace kvpr_emu
