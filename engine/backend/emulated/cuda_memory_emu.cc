// The emulated device memory of cuda_runtime_emu.h: cudaMalloc in each device's arena (aligned,
// red-zoned, poisoned when freed), pinned host memory, and the copies and memsets, checked as a
// GPU would fault and paced by the device's link.
#define KVPR_EMU_RUNTIME_IMPL 1
#include "engine/backend/emulated/simt_emu.h"
// clang-format off
#include "engine/backend/emulated/cuda_runtime_emu.h"
// clang-format on
#include "engine/backend/emulated/cuda_runtime_emu_internal.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <tuple>
#include <vector>

namespace kvpr_emu {

using namespace internal;

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

}  // namespace kvpr_emu
