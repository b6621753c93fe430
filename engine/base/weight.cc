#include "engine/base/weight.h"

#include <algorithm>
#include <cmath>

#include "engine/base/error.h"
#include "engine/base/thread_pool.h"

namespace kvpr {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Every part's shape with the leading dims of the codes' new shape `lead` (all but the matrix's
// last two), the matrix's N rows given.
Shape with_lead(const Shape& lead, int64_t rows, int64_t cols) {
  Shape s = lead;
  s.push_back(rows);
  s.push_back(cols);
  return s;
}

}  // namespace

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Dense: return "dense";
    case WeightFormat::Int4: return "int4";
    case WeightFormat::Int8: return "int8";
    case WeightFormat::Fp8: return "fp8";
    case WeightFormat::Fp4: return "fp4";
  }
  return "?";
}

bool parse_weight_format(const std::string& name, WeightFormat* out) {
  for (WeightFormat f : {WeightFormat::Dense, WeightFormat::Int4, WeightFormat::Int8, WeightFormat::Fp8, WeightFormat::Fp4})
    if (name == weight_format_name(f)) {
      *out = f;
      return true;
    }
  return false;
}

size_t Weight::nbytes() const {
  size_t n = 0;
  for (const Tensor* t : parts())
    if (t->defined()) n += t->nbytes();
  return n;
}

const Tensor& Weight::dense(const char* what) const {
  KVPR_CHECK(!quantized(), what, ": the weight ", describe(), " is quantized, and this takes a dense one");
  return codes;
}

std::string Weight::describe() const {
  if (!quantized()) return codes.describe();
  return std::string(weight_format_name(format)) + " " + std::to_string(block_n) + "x" + std::to_string(block_k) +
         (order.defined() ? " ordered" : "") + shape_str(shape);
}

int64_t Weight::scale_cols() const { return ceil_div(dim(-1), block_k); }
int64_t Weight::scale_rows() const { return ceil_div(dim(-2), block_n); }

Weight Weight::rows(int64_t begin, int64_t count) const {
  if (!quantized()) return Weight(codes.rows(begin, count));
  Weight w = *this;
  w.shape[0] = count;
  w.codes = codes.rows(begin, count);
  if (rank() == 2) {
    const int64_t N = dim(0);
    KVPR_CHECK(begin % block_n == 0 && (count % block_n == 0 || begin + count == N), "rows [", begin, ", ",
               begin + count, ") of ", describe(), " cut its blocks of ", block_n, " outputs");
    const int64_t first = begin / block_n, n = ceil_div(count, block_n);
    w.scales = scales.rows(first, n);
    if (zeros.defined()) w.zeros = zeros.rows(first, n);
  } else {
    w.scales = scales.rows(begin, count);
    if (zeros.defined()) w.zeros = zeros.rows(begin, count);
  }
  return w;
}

Weight Weight::item(int64_t b) const {
  KVPR_CHECK(rank() == 3, "item ", b, " of ", describe(), ", which is not a stack");
  return rows(b, 1).reshape({dim(1), dim(2)});
}

Weight Weight::reshape(const Shape& to) const {
  if (!quantized()) return Weight(codes.reshape(to));
  KVPR_CHECK(to.size() >= 2 && to.back() == dim(-1) && shape_numel(to) == numel(), "cannot reshape ", describe(),
             " to ", shape_str(to));
  // The scales' rows follow the outputs' blocks: the matrices keep their rows, or each one,
  // before and after, holds whole blocks.
  const int64_t n_to = to[to.size() - 2];
  KVPR_CHECK(n_to == dim(-2) || block_n == 1 || (n_to % block_n == 0 && dim(-2) % block_n == 0), "cannot reshape ",
             describe(), " to ", shape_str(to), ": its blocks of ", block_n, " outputs would be cut");
  const int64_t s_rows = n_to == dim(-2) ? scale_rows() : n_to / block_n;
  const Shape lead(to.begin(), to.end() - 2);
  Weight w = *this;
  w.shape = to;
  w.codes = codes.reshape(with_lead(lead, n_to, codes.dim(-1)));
  w.scales = scales.reshape(with_lead(lead, s_rows, scale_cols()));
  if (zeros.defined()) w.zeros = zeros.reshape(with_lead(lead, s_rows, scale_cols()));
  return w;
}

float fp4_e2m1_value(uint8_t code) {
  static const float kValues[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  const float v = kValues[code & 7];
  return code & 8 ? -v : v;
}

float weight_code(const uint8_t* row, WeightFormat format, int64_t k) {
  switch (format) {
    case WeightFormat::Int4: return static_cast<float>((row[k / 2] >> (4 * (k & 1))) & 15);
    case WeightFormat::Int8: return static_cast<float>(row[k]);
    case WeightFormat::Fp8: return e4m3_to_f32(row[k]);
    case WeightFormat::Fp4: return fp4_e2m1_value(static_cast<uint8_t>((row[k / 2] >> (4 * (k & 1))) & 15));
    case WeightFormat::Dense: break;
  }
  KVPR_THROW("weight_code of a dense weight");
}

int32_t weight_middle_code(WeightFormat f) { return f == WeightFormat::Int4 ? 8 : f == WeightFormat::Int8 ? 128 : 0; }

int32_t weight_zero(const Weight& w, int64_t s) {
  if (!w.zeros.defined()) return static_cast<int32_t>(weight_middle_code(w.format));
  return w.zeros.dtype() == DType::U8 ? w.zeros.data_as<uint8_t>()[s] : w.zeros.data_as<int32_t>()[s];
}

Tensor dequantize(const Weight& w) {
  KVPR_CHECK(w.quantized() && w.rank() >= 2, "dequantize: ", w.describe(), " is not a quantized matrix");
  for (const Tensor* t : w.parts())
    KVPR_CHECK(!t->defined() || t->memory() != MemoryKind::Device, "dequantize: ", w.describe(),
               " is in device memory");
  const int64_t K = w.dim(-1), N = w.dim(-2), mats = w.numel() / std::max<int64_t>(1, N * K);
  const int64_t cols = w.scale_cols(), srows = w.scale_rows(), row_bytes = w.codes.dim(-1);
  Tensor out = Tensor::host(DType::F32, w.shape);
  float* o = out.data_as<float>();
  const auto* codes = w.codes.data_as<uint8_t>();
  const float* sc = w.scales.data_as<float>();
  const int32_t* ord = w.order.defined() ? w.order.data_as<int32_t>() : nullptr;
  ThreadPool::global().parallel_for(mats * N, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t s_row = (r / N) * srows + (r % N) / w.block_n;
      for (int64_t k = 0; k < K; ++k) {
        const int64_t s = s_row * cols + k / w.block_k;
        const auto z = static_cast<float>(weight_zero(w, s));
        const float q = weight_code(codes + r * row_bytes, w.format, k);
        o[r * K + (ord ? ord[k] : k)] = (q - z) * sc[s];
      }
    }
  });
  return out;
}

Weight quantize_rtn(const Tensor& dense, WeightFormat format, int64_t group) {
  KVPR_CHECK(format != WeightFormat::Dense && dense.rank() == 2 && dense.memory() != MemoryKind::Device &&
                 is_float(dense.dtype()),
             "quantize_rtn: ", dense.describe(), " as ", weight_format_name(format));
  const int64_t N = dense.dim(0), K = dense.dim(1), G = group > 0 ? std::min(group, K) : K;
  Weight w;
  w.format = format;
  w.shape = dense.shape();
  w.block_n = 1;
  w.block_k = G;
  const int64_t cols = ceil_div(K, G);
  const int64_t row_bytes = weight_format_is_nibbles(format) ? ceil_div(K, 2) : K;
  w.codes = Tensor::host(DType::U8, {N, row_bytes});
  w.scales = Tensor::host(DType::F32, {N, cols});
  const float top = format == WeightFormat::Int4   ? 7.f
                    : format == WeightFormat::Int8 ? 127.f
                    : format == WeightFormat::Fp8  ? 448.f
                                                   : 6.f;
  const int64_t zero = weight_middle_code(format);
  auto* codes = w.codes.data_as<uint8_t>();
  float* sc = w.scales.data_as<float>();
  ThreadPool::global().parallel_for(N, 16, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n)
      for (int64_t g = 0; g < cols; ++g) {
        const int64_t k0 = g * G, k1 = std::min(K, k0 + G);
        float amax = 0;
        for (int64_t k = k0; k < k1; ++k)
          amax = std::max(amax, std::fabs(load_as_f32(dense.data(), dense.dtype(), static_cast<size_t>(n * K + k))));
        float s = amax > 0 ? amax / top : 1.f;
        // MX: the power of two at or above (E8M0), so the largest value still fits under 6.
        if (format == WeightFormat::Fp4) s = std::exp2(std::ceil(std::log2(s)));
        sc[n * cols + g] = s;
        for (int64_t k = k0; k < k1; ++k) {
          const float v = load_as_f32(dense.data(), dense.dtype(), static_cast<size_t>(n * K + k)) / s;
          uint8_t* row = codes + n * row_bytes;
          if (format == WeightFormat::Fp8) {
            row[k] = f32_to_e4m3(v);
          } else if (format == WeightFormat::Fp4) {
            uint8_t best = 0;  // the nearest of the 16 values
            for (uint8_t c = 1; c < 16; ++c)
              if (std::fabs(fp4_e2m1_value(c) - v) < std::fabs(fp4_e2m1_value(best) - v)) best = c;
            row[k / 2] = static_cast<uint8_t>(row[k / 2] | (best << (4 * (k & 1))));
          } else {
            const auto q = static_cast<uint8_t>(std::clamp<int64_t>(std::lround(v), -zero, zero - 1) + zero);
            if (format == WeightFormat::Int8)
              row[k] = q;
            else
              row[k / 2] = static_cast<uint8_t>(row[k / 2] | (q << (4 * (k & 1))));
          }
        }
      }
  });
  return w;
}

}  // namespace kvpr
