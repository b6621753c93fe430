// The KV store in pinned host memory (KvShape: the widths a model's KV has), which the host KV
// modes copy from and store back to every layer and step; KvLayout: how it is cut into blocks.
#pragma once

#include <cstdint>
#include <span>
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
  // Per layer, its sliding window (ModelSpec::windows): the query at position i reads keys from
  // i + 1 - window on, so the staged modes move no key below the step's first query's window.
  std::vector<int64_t> windows;
  int64_t window(int64_t layer) const {
    return layer >= 0 && layer < static_cast<int64_t>(windows.size()) ? windows[static_cast<size_t>(layer)] : 0;
  }
  int64_t kv_hidden() const { return (kv_heads > 0 ? kv_heads : heads) * head_dim; }  // width of K and V
  int64_t q_width() const { return heads * head_dim; }  // width of Q and of the attention output
};

// A KV store of `blocks` blocks of `block_tokens` tokens each (paged KV, docs/kv-modes.md): a
// sequence's tokens live in the blocks its block table lists, token t in block table[t / B] at
// row t % B; a sequence holds at most max_tokens. slots(S, T) is the contiguous layout: one block
// of T tokens per sequence, the block's index its slot.
// With window_blocks > 0 the sliding-window layers' store is a ring of its own: window_blocks
// blocks lent through a second table per sequence (ForwardChunk::window_blocks), from which the
// blocks below what the sequence's next query reads (window_tokens, the widest window of them)
// go back as it grows (BlockPool::trim). Their table entries there are then negative.
struct KvLayout {
  int64_t blocks = 0, block_tokens = 0, max_tokens = 0;
  int64_t window_blocks = 0, window_tokens = 0;
  static KvLayout slots(int64_t slots, int64_t capacity) { return {slots, capacity, capacity}; }
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_tokens - 1) / block_tokens; }
  bool ring() const { return window_blocks > 0; }
  // The blocks of `layer`'s store.
  int64_t layer_blocks(const KvShape& shape, int64_t layer) const {
    return ring() && shape.window(layer) > 0 ? window_blocks : blocks;
  }
};

// Of a layer's store rows (one tensor [blocks * rows per block, width]), the runs that tokens
// [first, first + count) of a sequence occupy, adjacent blocks merged: f(row, token offset, n)
// for each run, in token order. A block holds rows_per_block rows (< block_tokens for X kept
// only for a sequence's first tokens).
template <typename F>
void for_each_run(std::span<const int32_t> table, int64_t block_tokens, int64_t rows_per_block, int64_t first,
                  int64_t count, F&& f) {
  int64_t run_row = -1, run_off = 0, run_n = 0;
  for (int64_t t = first; t < first + count;) {
    const int64_t in_block = t % block_tokens, n = std::min(block_tokens - in_block, first + count - t);
    const int64_t row = int64_t{table[static_cast<size_t>(t / block_tokens)]} * rows_per_block + in_block;
    if (run_n > 0 && run_row + run_n == row) {
      run_n += n;
    } else {
      if (run_n > 0) f(run_row, run_off, run_n);
      run_row = row;
      run_off = t - first;
      run_n = n;
    }
    t += n;
  }
  if (run_n > 0) f(run_row, run_off, run_n);
}

// K and V of every token and X of a sequence's first tokens, per layer, in pinned host memory,
// in blocks. Layout per layer: K, V [blocks * block_tokens, kv width]; X [blocks * x rows per
// block, hidden], where x rows per block = min(block_tokens, x_capacity) (0 without X); blocks:
// KvLayout::layer_blocks (a sliding layer's ring, or the layout's blocks).
class HostKvStore {
 public:
  HostKvStore(Backend& backend, const KvShape& shape, const KvLayout& layout, DType dtype, int64_t x_capacity);
  // A layer's rows as one tensor: the token rows of every sequence (through its block table,
  // for_each_run), so one copy_spans moves a batch.
  Tensor k_rows(int64_t layer) const { return k_.at(layer); }
  Tensor v_rows(int64_t layer) const { return v_.at(layer); }
  Tensor x_rows(int64_t layer) const { return x_.at(layer); }
  // One block's rows: [block_tokens, kv width] (X: [x_block_rows, hidden]). In the contiguous
  // layout (KvLayout::slots) block b is slot b's whole sequence.
  Tensor k(int64_t layer, int64_t block) const { return k_rows(layer).rows(block * layout_.block_tokens, layout_.block_tokens); }
  Tensor v(int64_t layer, int64_t block) const { return v_rows(layer).rows(block * layout_.block_tokens, layout_.block_tokens); }
  Tensor x(int64_t layer, int64_t block) const { return x_rows(layer).rows(block * x_block_rows_, x_block_rows_); }
  const KvLayout& layout() const { return layout_; }
  int64_t x_capacity() const { return x_capacity_; }  // tokens of X a sequence keeps
  int64_t x_block_rows() const { return x_block_rows_; }
  size_t bytes() const;

 private:
  std::vector<Tensor> k_, v_, x_;
  KvLayout layout_;
  int64_t x_capacity_, x_block_rows_;
};

}  // namespace kvpr
