// The greedy choice of a logits row with its log-sum-exp, on the host: the definition the
// backends' argmax_lse op computes per row on the device, and what sampling uses on the host.
// Defined in backend.cc, out of line: the CPU backend's files are compiled for AVX2, and an
// inline copy from them could be the one every caller links.
#pragma once

#include <cstdint>

namespace kvpr {

// The greedy choice of a logits row and the row's log-sum-exp: `token` is the first id of
// the largest logit among ids [0, valid); `lse` = log sum_i exp(logits[i]) over the same ids
// (accumulated in double). The backends' argmax_lse op computes the same per row on device.
struct RowStats {
  int32_t token;
  float max;
  double lse;
};
RowStats row_argmax_lse(const float* logits, int32_t valid);

}  // namespace kvpr
