// The KV store in pinned host memory (KvShape: the widths a model's KV has), which the host KV
// modes copy from and store back to every layer and step.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/base/error.h"

namespace kvpr {

struct KvShape {
  int64_t layers = 0;
  int64_t hidden = 0;    // width of X
  int64_t heads = 0;     // query heads
  int64_t kv_heads = 0;  // key/value heads (fewer than heads with grouped-query attention; 0: = heads)
  int64_t head_dim = 0;  // ModelSpec's (Qwen3: not hidden / heads)
  int64_t kv_hidden() const { return (kv_heads > 0 ? kv_heads : heads) * head_dim; }  // width of K and V
  int64_t q_width() const { return heads * head_dim; }  // width of Q and of the attention output
};

// K and V of every token and X of the first tokens, per layer and sequence slot, in pinned
// host memory. Layout per layer: [slots, capacity, width].
class HostKvStore {
 public:
  HostKvStore(Backend& backend, const KvShape& shape, int64_t slots, int64_t capacity, DType dtype,
              int64_t x_capacity);
  Tensor k(int64_t layer, int64_t slot) const;  // [capacity, kv_hidden]
  Tensor v(int64_t layer, int64_t slot) const;
  Tensor x(int64_t layer, int64_t slot) const;  // [x_capacity, hidden]
  // A layer's rows of every slot as one tensor, [slots * capacity, width]: token i of the
  // sequence in `slot` is row kv_row(slot, i) (x_row for X), so one copy_spans moves a batch.
  Tensor k_rows(int64_t layer) const;
  Tensor v_rows(int64_t layer) const;
  Tensor x_rows(int64_t layer) const;
  int64_t kv_row(int64_t slot, int64_t token) const {
    KVPR_CHECK(token >= 0 && token <= capacity_, "KV row ", token, " past the capacity ", capacity_);
    return slot * capacity_ + token;
  }
  int64_t x_row(int64_t slot, int64_t token) const {
    KVPR_CHECK(token >= 0 && token <= x_capacity_, "X row ", token, " past the capacity ", x_capacity_);
    return slot * x_capacity_ + token;
  }
  int64_t x_capacity() const { return x_capacity_; }
  size_t bytes() const;

 private:
  std::vector<Tensor> k_, v_, x_;
  int64_t capacity_, x_capacity_, kv_width_, x_width_;
};

}  // namespace kvpr
