// The emulated CUDA device of cuda_runtime_emu.h: the devices (from the environment), the lock and
// the schedule every API call goes through, device queries, kernel launches (run by the SIMT
// emulator). Memory is cuda_memory_emu.cc, streams and graphs cuda_streams_emu.cc, GEMMs cublas_emu.cc.
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

namespace kvpr_emu {

using namespace internal;

namespace {

#ifndef KVPR_EMU_DEFAULT_GPUS
#define KVPR_EMU_DEFAULT_GPUS 0  // devices without KVPR_EMULATED_GPUS (the test suites' build: 1)
#endif
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

}  // namespace

namespace internal {

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

thread_local int t_device = 0;

// The devices from the environment: KVPR_EMULATED_GPUS (how many), KVPR_EMULATED_GPU_MEMORY
// (each one's memory), KVPR_EMULATED_LINK_GBPS (each one's link, GB/s, one rate or a list),
// KVPR_EMULATED_PCI_BUS_IDS (a comma list; else 0000:<index as 2 hex digits>:00.0).
State::State() {
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

State& state() {
  static State* s = new State;  // never destroyed: backends may release memory during exit
  return *s;
}

DeviceWindow::DeviceWindow(State& st) : s(st) {
  if (s.device_depth++ == 0)
    for (auto& d : s.devices)
      if (d->extent) mprotect(d->arena, d->extent, PROT_READ | PROT_WRITE);
}
DeviceWindow::~DeviceWindow() {
  if (--s.device_depth == 0)
    for (auto& d : s.devices)
      if (d->extent) mprotect(d->arena, d->extent, PROT_NONE);
}

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
const Allocation* find_allocation(State& s, const void* p, size_t n, size_t* offset) {
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

// The link a copy from src to dst crosses: to a device from host memory, or from one to the host.
void pace_copy(State& s, void* dst, const void* src, size_t bytes) {
  Device *dd = device_of(s, dst), *sd = device_of(s, src);
  if (dd && !sd) cross_link(dd, bytes);
  else if (sd && !dd) cross_link(sd, bytes);
}

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

void cross_device_link(const void* device_ptr, size_t bytes) {
  Api a;
  cross_link(device_of(a.s, device_ptr), bytes);
}

namespace {
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

}  // namespace kvpr_emu
