#include "engine/kv/host_kv_store.h"

namespace kvpr {

HostKvStore::HostKvStore(Backend& backend, const KvShape& shape, int64_t slots, int64_t capacity, DType dtype,
                         int64_t x_capacity)
    : capacity_(capacity), x_capacity_(x_capacity), kv_width_(shape.kv_hidden()), x_width_(shape.hidden) {
  for (int64_t l = 0; l < shape.layers; ++l) {
    k_.push_back(backend.alloc_pinned(dtype, {slots, capacity, kv_width_}));
    v_.push_back(backend.alloc_pinned(dtype, {slots, capacity, kv_width_}));
    if (x_capacity > 0) x_.push_back(backend.alloc_pinned(dtype, {slots, x_capacity, x_width_}));
  }
}

Tensor HostKvStore::k(int64_t layer, int64_t slot) const {
  return k_.at(layer).rows(slot, 1).reshape({capacity_, kv_width_});
}
Tensor HostKvStore::v(int64_t layer, int64_t slot) const {
  return v_.at(layer).rows(slot, 1).reshape({capacity_, kv_width_});
}
Tensor HostKvStore::x(int64_t layer, int64_t slot) const {
  return x_.at(layer).rows(slot, 1).reshape({x_capacity_, x_width_});
}
Tensor HostKvStore::k_rows(int64_t layer) const {
  const Tensor& t = k_.at(layer);
  return t.reshape({t.dim(0) * capacity_, kv_width_});
}
Tensor HostKvStore::v_rows(int64_t layer) const {
  const Tensor& t = v_.at(layer);
  return t.reshape({t.dim(0) * capacity_, kv_width_});
}
Tensor HostKvStore::x_rows(int64_t layer) const {
  const Tensor& t = x_.at(layer);
  return t.reshape({t.dim(0) * x_capacity_, x_width_});
}
size_t HostKvStore::bytes() const {
  size_t b = 0;
  for (const auto* v : {&k_, &v_, &x_})
    for (const auto& t : *v) b += t.nbytes();
  return b;
}

}  // namespace kvpr
