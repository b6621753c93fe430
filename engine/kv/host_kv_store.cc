#include "engine/kv/host_kv_store.h"

#include <algorithm>

namespace kvpr {

HostKvStore::HostKvStore(Backend& backend, const KvShape& shape, const KvLayout& layout, DType dtype,
                         int64_t x_capacity)
    : layout_(layout), x_capacity_(x_capacity), x_block_rows_(std::min(layout.block_tokens, x_capacity)) {
  for (int64_t l = 0; l < shape.layers; ++l) {
    const int64_t blocks = layout.layer_blocks(shape, l);
    k_.push_back(backend.alloc_pinned(dtype, {blocks * layout.block_tokens, shape.kv_hidden()}));
    v_.push_back(backend.alloc_pinned(dtype, {blocks * layout.block_tokens, shape.kv_hidden()}));
    if (x_block_rows_ > 0) x_.push_back(backend.alloc_pinned(dtype, {blocks * x_block_rows_, shape.hidden}));
  }
}

size_t HostKvStore::bytes() const {
  size_t b = 0;
  for (const auto* v : {&k_, &v_, &x_})
    for (const auto& t : *v) b += t.nbytes();
  return b;
}

}  // namespace kvpr
