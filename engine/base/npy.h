// NumPy .npy files (format 1.0/2.0): write float32 arrays (--dump-logits) and read
// little-endian float32/float64/int32/int64 arrays (test fixtures).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvpr {

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<double> values;  // converted to double, C order
};
NpyArray read_npy(const std::string& path);

}  // namespace kvpr
