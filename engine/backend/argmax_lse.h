// The greedy choice of a logits row with its log-sum-exp, on the host: the definition the
// backends' argmax_lse op computes per row on the device, and what sampling uses on the host.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "engine/base/error.h"

namespace kvpr {

// The greedy choice of a logits row and the row's log-sum-exp: `token` is the first id of
// the largest logit among ids [0, valid); `lse` = log sum_i exp(logits[i]) over the same ids
// (accumulated in double). The backends' argmax_lse op computes the same per row on device.
struct RowStats {
  int32_t token;
  float max;
  double lse;
};
inline RowStats row_argmax_lse(const float* logits, int32_t valid) {
  KVPR_CHECK(valid > 0, "no valid token ids to sample from");
  float mx = -std::numeric_limits<float>::infinity();
  int32_t arg = 0;
  for (int32_t i = 0; i < valid; ++i)
    if (logits[i] > mx) mx = logits[i], arg = i;
  double sum = 0;
  for (int32_t i = 0; i < valid; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  return {arg, mx, mx + std::log(sum)};
}

}  // namespace kvpr
