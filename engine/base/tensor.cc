#include "engine/base/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "engine/base/error.h"

namespace kvpr {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t offset_bytes, DType dtype, Shape shape)
    : storage_(std::move(storage)), offset_(offset_bytes), dtype_(dtype), shape_(std::move(shape)) {
  for (int64_t d : shape_) KVPR_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape_));
  KVPR_CHECK(storage_ && offset_ + nbytes() <= storage_->bytes, "tensor ", describe(),
             " does not fit its storage");
}

std::shared_ptr<Storage> zeroed_host_storage(size_t bytes, MemoryKind kind, const char* what) {
  constexpr size_t kHuge = size_t{2} << 20;
  const bool huge = bytes >= 2 * kHuge;
  const size_t align = huge ? kHuge : 64;
  const size_t rounded = std::max<size_t>(64, (bytes + align - 1) / align * align);
  auto st = std::make_shared<Storage>();
  st->data = std::aligned_alloc(align, rounded);
  KVPR_CHECK(st->data, "out of host memory allocating ", bytes, " bytes for ", what);
#ifdef MADV_HUGEPAGE
  if (huge) madvise(st->data, rounded, MADV_HUGEPAGE);  // (advice: nothing to check)
#endif
  std::memset(st->data, 0, rounded);
  st->bytes = bytes;
  st->kind = kind;
  st->release = [](void* p) { std::free(p); };
  return st;
}

Tensor Tensor::host(DType dtype, Shape shape) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  return Tensor(zeroed_host_storage(bytes, MemoryKind::Host, "a host tensor"), 0, dtype, std::move(shape));
}

Tensor Tensor::borrow(void* data, DType dtype, Shape shape, MemoryKind kind) {
  auto st = std::make_shared<Storage>();
  st->data = data;
  st->bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  st->kind = kind;
  return Tensor(std::move(st), 0, dtype, std::move(shape));
}

Tensor Tensor::rows(int64_t begin, int64_t count) const {
  KVPR_CHECK(rank() >= 1 && begin >= 0 && count >= 0 && begin + count <= shape_[0],
             "rows [", begin, ", ", begin + count, ") out of range for ", describe());
  Shape s = shape_;
  s[0] = count;
  size_t row_bytes = dtype_size(dtype_);
  for (size_t i = 1; i < shape_.size(); ++i) row_bytes *= static_cast<size_t>(shape_[i]);
  return Tensor(storage_, offset_ + static_cast<size_t>(begin) * row_bytes, dtype_, std::move(s));
}

Tensor Tensor::reshape(Shape shape) const {
  KVPR_CHECK(shape_numel(shape) == numel(), "cannot reshape ", describe(), " to ", shape_str(shape));
  return Tensor(storage_, offset_, dtype_, std::move(shape));
}

Tensor Tensor::view_as(DType dtype, Shape shape) const {
  return Tensor(storage_, offset_, dtype, std::move(shape));
}

std::string Tensor::describe() const { return std::string(dtype_name(dtype_)) + shape_str(shape_); }

}  // namespace kvpr
