// Tensors: a typed, row-major, contiguous view into a reference-counted storage that
// lives in one kind of memory (pageable host, pinned host, or device).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "engine/base/dtype.h"

namespace kvpr {

enum class MemoryKind : uint8_t { Host, PinnedHost, Device };

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

// Owns one allocation; `release` frees it (or does nothing for borrowed memory).
struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  MemoryKind kind = MemoryKind::Host;
  std::function<void(void*)> release;

  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (release) release(data);
  }
};

// Zeroed host memory of `bytes`, 64-byte aligned, freed with the storage; large buffers (weights,
// a KV cache) in 2 MiB pages where the kernel gives transparent huge pages to those who ask
// (Debian's default, "madvise"): a GEMM streaming a weight then reads across pages that the
// hardware prefetcher does not cross at 4 KiB, and a TLB entry covers 512 times the bytes.
// Throws naming `what` when memory runs out.
std::shared_ptr<Storage> zeroed_host_storage(size_t bytes, MemoryKind kind, const char* what);

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, size_t offset_bytes, DType dtype, Shape shape);

  // A new zero-initialised tensor in pageable host memory (64-byte aligned).
  static Tensor host(DType dtype, Shape shape);
  // A view of memory the caller keeps alive (e.g. a memory-mapped checkpoint).
  static Tensor borrow(void* data, DType dtype, Shape shape, MemoryKind kind = MemoryKind::Host);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  MemoryKind memory() const { return storage_ ? storage_->kind : MemoryKind::Host; }

  void* data() const { return static_cast<char*>(storage_->data) + offset_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data());
  }

  // Rows [begin, begin+count) along dimension 0, sharing storage.
  Tensor rows(int64_t begin, int64_t count) const;
  // Same storage, new shape with the same element count.
  Tensor reshape(Shape shape) const;
  // The same bytes seen as another dtype and shape (must fit in the storage).
  Tensor view_as(DType dtype, Shape shape) const;
  std::string describe() const;  // "F16[4, 8]"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  DType dtype_ = DType::F32;
  Shape shape_;
};

}  // namespace kvpr
