// Host attention kernel (see attention.cc).
#pragma once

#include <vector>

#include "engine/backend/backend.h"
#include "engine/base/thread_pool.h"

namespace kvpr {

// out, q: [T, heads*head_dim] F32 in host memory; K/V of each sequence in host memory (any
// float dtype). Decode rows are split over the context and merged (flash-decoding style).
void cpu_attention(const Tensor& out, const Tensor& q, const std::vector<AttentionSeq>& seqs, int heads,
                   const AttentionParams& params, ThreadPool& pool);

}  // namespace kvpr
