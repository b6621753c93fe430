#include "engine/model/quantized_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "engine/base/error.h"
#include "engine/base/thread_pool.h"
#include "engine/model/config_fields.h"

namespace kvpr {

namespace {

// Element i of an integer tensor (I32, I64, U8) as int64.
int64_t int_at(const TensorRecord& r, int64_t i) {
  switch (r.dtype) {
    case DType::I32: return static_cast<const int32_t*>(r.data)[i];
    case DType::I64: return static_cast<const int64_t*>(r.data)[i];
    case DType::U8: return static_cast<const uint8_t*>(r.data)[i];
    case DType::I8: return static_cast<const int8_t*>(r.data)[i];
    default: KVPR_THROW(r.file, ": tensor '", r.name, "' has dtype ", dtype_name(r.dtype), ", expected an integer one");
  }
}

// Value j of words holding 32/bits values each, value j at bits [bits·(j % per), ...) of word
// j / per; the words `stride` apart (a column of a matrix of words packed along its rows).
uint32_t unpack(const int32_t* words, int64_t j, int bits, int64_t stride = 1) {
  const int per = 32 / bits;
  return (static_cast<uint32_t>(words[(j / per) * stride]) >> (bits * (j % per))) & ((1u << bits) - 1u);
}

const TensorRecord& need(const CheckpointDir& ckpt, const std::string& name) {
  const TensorRecord* r = ckpt.find(name);
  KVPR_CHECK(r, ckpt.dir(), ": missing tensor '", name, "' beside the module's other quantized tensors");
  return *r;
}

void expect_shape(const TensorRecord& r, const Shape& want) {
  KVPR_CHECK(r.shape == want, r.file, ": tensor '", r.name, "' has shape ", shape_str(r.shape), ", expected ",
             shape_str(want));
}

void expect_dtype(const TensorRecord& r, bool ok, const char* want) {
  KVPR_CHECK(ok, r.file, ": tensor '", r.name, "' has dtype ", dtype_name(r.dtype), ", expected ", want);
}

// The module prefix of a ".weight" key, or "" when `key` is not one.
std::string module_of(const std::string& key) {
  constexpr std::string_view kWeight = ".weight";
  if (key.size() <= kWeight.size() || key.compare(key.size() - kWeight.size(), kWeight.size(), kWeight) != 0) return "";
  return key.substr(0, key.size() - kWeight.size());
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The group of each of a module's K inputs: g_idx's entry (with `negative_in_order`, compressed-
// tensors' -1 means in order), else k / group; each checked to lie in [0, groups).
std::vector<int64_t> groups_of_inputs(const TensorRecord* g_idx, int64_t K, int64_t group, int64_t groups,
                                      bool negative_in_order, const std::string& file, const std::string& module) {
  std::vector<int64_t> out(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) {
    int64_t g = g_idx ? int_at(*g_idx, k) : k / group;
    if (g < 0 && negative_in_order) g = k / group;
    KVPR_CHECK(g >= 0 && g < groups, file, ": input ", k, " of '", module, "' is in group ", g, " of ", groups);
    out[static_cast<size_t>(k)] = g;
  }
  return out;
}

// f(n) for every output row n, on the CPU kernels' threads (rows are written apart; f throws nothing).
template <typename F>
void rows_in_parallel(int64_t N, F&& f) {
  ThreadPool::global().parallel_for(N, 16, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) f(n);
  });
}

std::string group_name(int64_t group) { return group > 0 ? "g" + std::to_string(group) : "per channel"; }

}  // namespace

QuantizedCheckpoint QuantizedCheckpoint::from_config(const json::Value& config, const std::string& source) {
  QuantizedCheckpoint q;
  const json::Value* qc = config.is_object() ? config.find("quantization_config") : nullptr;
  if (!qc || qc->is_null()) return q;
  const std::string where = source + ": quantization_config";
  // The model's dtype, which the unquantized tensors have: the dequantized ones take it too.
  for (const char* key : {"torch_dtype", "dtype"})
    if (DType d; config.find(key) && config.find(key)->is_string() && parse_dtype(config.find(key)->as_string(), &d) &&
                 is_float(d))
      q.model_dtype_ = d;
  ConfigFields f(*qc, where);
  f.get_string("quant_method", &q.method_, true);
  const std::string& m = q.method_;
  if (m == "fp8") {
    std::string fmt = "e4m3";
    f.get_string("fmt", &fmt);
    KVPR_CHECK(fmt == "e4m3", where, ": fmt \"", fmt, "\" is not supported (e4m3)");
    std::string blocks = "per tensor";
    if (const json::Value* b = f.find("weight_block_size")) {
      KVPR_CHECK(b->is_array() && b->as_array().size() == 2 && b->as_array()[0].is_number() &&
                     b->as_array()[1].is_number() && b->as_array()[0].as_int() > 0 && b->as_array()[1].as_int() > 0,
                 where, ": weight_block_size must be two positive integers");
      q.block_n_ = b->as_array()[0].as_int(), q.block_k_ = b->as_array()[1].as_int();
      blocks = std::to_string(q.block_n_) + "x" + std::to_string(q.block_k_) + " blocks";
      q.bits_per_weight_ = 8 + 32.0 / static_cast<double>(q.block_n_ * q.block_k_);
    } else {
      q.bits_per_weight_ = 8;
    }
    std::string acts = "dynamic";
    f.get_string("activation_scheme", &acts);
    KVPR_CHECK(acts == "dynamic" || acts == "static", where, ": activation_scheme \"", acts,
               "\" is not supported (dynamic, static)");
    q.describe_ = "fp8 e4m3, " + blocks;
  } else if (m == "gptq") {
    int64_t bits = 4, group = 128;
    f.get_int("bits", &bits);
    KVPR_CHECK(bits == 4 || bits == 8, where, ": bits ", bits, " is not supported (4, 8)");
    f.get_int("group_size", &group);
    KVPR_CHECK(group == -1 || group > 0, where, ": group_size ", group, " must be positive or -1");
    bool desc_act = false, marlin = false;
    f.get_bool("desc_act", &desc_act);
    q.desc_act_ = desc_act;
    f.get_bool("sym", &q.symmetric_);
    f.get_bool("is_marlin_format", &marlin);
    KVPR_CHECK(!marlin, where, ": is_marlin_format (Marlin's repacked layout) is not supported (AutoGPTQ's)");
    std::string fmt = "gptq";
    f.get_string("checkpoint_format", &fmt);
    KVPR_CHECK(fmt == "gptq" || fmt == "gptq_v2", where, ": checkpoint_format \"", fmt,
               "\" is not supported (gptq, gptq_v2)");
    q.bits_ = static_cast<int>(bits);
    q.group_ = group > 0 ? group : 0;
    q.gptq_v1_zeros_ = fmt == "gptq";
    q.bits_per_weight_ = static_cast<double>(bits) + (group > 0 ? (16.0 + static_cast<double>(bits)) / static_cast<double>(group) : 0);
    // GPTQModel's lm_head (the head quantized too: its tensors say so, as any module's).
    bool lm_head = false;
    f.get_bool("lm_head", &lm_head);
    q.describe_ = "gptq int" + std::to_string(bits) + " " + group_name(q.group_) + (q.symmetric_ ? " sym" : " asym") +
                  (desc_act ? " desc_act" : "") + (fmt == "gptq_v2" ? " (v2 zeros)" : "") + (lm_head ? ", lm_head too" : "");
  } else if (m == "awq") {
    int64_t bits = 4, group = 128;
    f.get_int("bits", &bits);
    f.get_int("w_bit", &bits);
    KVPR_CHECK(bits == 4, where, ": bits ", bits, " is not supported (4)");
    f.get_int("group_size", &group);
    f.get_int("q_group_size", &group);
    KVPR_CHECK(group > 0, where, ": group_size ", group, " must be positive");
    bool zero_point = true;
    f.get_bool("zero_point", &zero_point);
    KVPR_CHECK(zero_point, where, ": zero_point false is not supported (AutoAWQ's GEMM stores zeros)");
    std::string version = "gemm";
    f.get_string("version", &version);
    std::transform(version.begin(), version.end(), version.begin(), [](unsigned char c) { return std::tolower(c); });
    KVPR_CHECK(version == "gemm", where, ": version \"", version, "\" is not supported (gemm: AutoAWQ's GEMM layout)");
    q.bits_ = 4;
    q.group_ = group;
    q.symmetric_ = false;
    q.bits_per_weight_ = 4 + 20.0 / static_cast<double>(group);
    q.describe_ = "awq int4 g" + std::to_string(group);
  } else if (m == "compressed-tensors") {
    std::string format;
    f.get_string("format", &format);
    const json::Value* groups = f.find("config_groups");
    KVPR_CHECK(groups && groups->is_object() && !groups->as_object().empty(), where,
               ": config_groups must be a non-empty object");
    // Every group's weights scheme; the modules' tensors say which one each has.
    std::string schemes;
    for (const auto& [name, g] : groups->as_object()) {
      const std::string at = where + ".config_groups." + name;
      ConfigFields gf(g, at);
      std::string gformat = format == "mixed-precision" ? "" : format;  // (then each group's own, or its tensors')
      gf.get_string("format", &gformat);
      const json::Value* w = gf.find("weights");
      KVPR_CHECK(w && w->is_object(), at, ": weights must be an object");
      ConfigFields wf(*w, at + ".weights");
      int64_t bits = 0, group = 0;
      std::string type = "int", strategy;
      bool symmetric = true;
      wf.get_int("num_bits", &bits, true);
      wf.get_string("type", &type);
      wf.get_int("group_size", &group);
      wf.get_string("strategy", &strategy);
      if (strategy.empty()) strategy = group > 0 ? "group" : group == -1 ? "channel" : "tensor";  // (its default)
      wf.get_bool("symmetric", &symmetric);
      if (type == "float") {
        KVPR_CHECK(bits == 8, at, ".weights: float num_bits ", bits, " is not supported (8: fp8 e4m3)");
        KVPR_CHECK(gformat.empty() || gformat == "float-quantized", at, ": format \"", gformat,
                   "\" is not supported for float weights (float-quantized)");
        KVPR_CHECK(strategy == "tensor" || strategy == "channel" || strategy == "block", at, ".weights: strategy \"",
                   strategy, "\" is not supported for fp8 (tensor, channel, block)");
        if (strategy == "block") {
          const json::Value* b = wf.find("block_structure");
          KVPR_CHECK(b && b->is_array() && b->as_array().size() == 2 && b->as_array()[0].is_number() &&
                         b->as_array()[1].is_number() && b->as_array()[0].as_int() > 0 && b->as_array()[1].as_int() > 0,
                     at, ".weights: strategy block needs block_structure, two positive integers");
          q.block_n_ = b->as_array()[0].as_int(), q.block_k_ = b->as_array()[1].as_int();
        }
        q.bits_per_weight_ = std::max(q.bits_per_weight_, 8.0);
        schemes += std::string(schemes.empty() ? "" : ", ") + "fp8 e4m3 per " + strategy;
      } else if (type == "int") {
        KVPR_CHECK(bits == 4 || bits == 8, at, ".weights: num_bits ", bits, " is not supported (4, 8)");
        // pack-quantized: codes in I32 words; int-quantized (W8A8) and naive-quantized: I8 codes.
        const bool unpacked = gformat == "int-quantized" || gformat == "naive-quantized";
        KVPR_CHECK(gformat.empty() || gformat == "pack-quantized" || unpacked, at, ": format \"", gformat,
                   "\" is not supported for integer weights (pack-quantized, int-quantized, naive-quantized)");
        KVPR_CHECK(!unpacked || bits == 8, at, ": format \"", gformat, "\" with num_bits ", bits,
                   " is not supported (8: int8 codes)");
        KVPR_CHECK(strategy == "group" || strategy == "channel" || strategy == "tensor", at, ".weights: strategy \"",
                   strategy, "\" is not supported for integer weights (group, channel, tensor)");
        KVPR_CHECK(strategy != "group" || group > 0, at, ".weights: strategy group needs a positive group_size");
        q.int_schemes_.push_back({static_cast<int>(bits), strategy == "group" ? group : 0, symmetric});
        const double per_group = strategy == "group" ? static_cast<double>(group) : 4096.0;
        q.bits_per_weight_ = std::max(q.bits_per_weight_, static_cast<double>(bits) + (16.0 + (symmetric ? 0 : bits)) / per_group);
        const json::Value* acts = gf.find("input_activations");
        schemes += std::string(schemes.empty() ? "" : ", ") + "int" + std::to_string(bits) + " " +
                   (strategy == "group" ? "g" + std::to_string(group) : "per " + strategy) + (symmetric ? " sym" : " asym") +
                   (acts && acts->is_object() ? " (w8a8 run as weight-only)" : "");
      } else {
        KVPR_THROW(at, ".weights: type \"", type, "\" is not supported (int, float)");
      }
    }
    q.describe_ = "compressed-tensors " + schemes;
  } else if (m == "mxfp4") {
    q.describe_ = "mxfp4 experts";
    q.bits_per_weight_ = 4.25;
  } else {
    KVPR_THROW(where, ": quant_method \"", m, "\" is not supported (fp8, compressed-tensors, gptq, awq, mxfp4)");
  }
  return q;
}

json::Value QuantizedCheckpoint::to_json(bool kept, DType dequantized_to) const {
  if (method_.empty()) return json::Value();
  return json::Object{{"method", method_},
                      {"scheme", describe_},
                      {"stored_bits_per_weight", std::round(bits_per_weight_ * 1000) / 1000},
                      {"computed_in", dtype_name(kept ? DType::F32 : dequantized_to)},
                      {"kept_quantized", kept}};
}

std::string QuantizedCheckpoint::how_computed(bool kept, DType dequantized_to) const {
  if (kept) return "kept quantized, the GEMMs reading it as stored (in fp32)";
  return std::string("dequantized to ") + dtype_name(dequantized_to) + " at load";
}

void QuantizedCheckpoint::settle_dtype(const CheckpointDir& ckpt) {
  if (model_dtype_) return;
  model_dtype_ = DType::BF16;
  for (const TensorRecord& r : ckpt.tensors())
    if (r.name.ends_with("embed_tokens.weight") && is_float(r.dtype)) {
      model_dtype_ = r.dtype;
      return;
    }
}

std::optional<DType> QuantizedCheckpoint::dtype(const CheckpointDir& ckpt, const std::string& key) const {
  if (!quantized()) return std::nullopt;
  const std::string p = module_of(key);
  if (p.empty()) return std::nullopt;
  const TensorRecord* w = ckpt.find(key);
  const bool stored_quantized = method_ == "gptq" || method_ == "awq" ? ckpt.find(p + ".qweight") != nullptr
                                : ckpt.find(p + ".weight_packed") ? true
                                                                  : w && (w->dtype == DType::F8E4M3 || w->dtype == DType::I8);
  return stored_quantized ? std::optional<DType>(model_dtype_.value_or(DType::BF16)) : std::nullopt;
}

namespace {

// A weight in kvpr's layout (weight.h) being filled from a checkpoint's: N x K codes and a scale
// grid of `srows` x `scols` blocks of bn x bk.
struct Repack {
  Weight w;
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  int64_t row_bytes = 0;

  Repack(WeightFormat f, int64_t N, int64_t K, int64_t bn, int64_t bk) {
    w.format = f;
    w.shape = {N, K};
    w.block_n = bn, w.block_k = bk;
    row_bytes = weight_format_is_nibbles(f) ? ceil_div(K, 2) : K;
    w.codes = Tensor::host(DType::U8, {N, row_bytes});
    w.scales = Tensor::host(DType::F32, {ceil_div(N, bn), ceil_div(K, bk)});
    codes = w.codes.data_as<uint8_t>();
    scales = w.scales.data_as<float>();
  }
  // Code `q` (unsigned) of input k of row n (rows are written by one thread each).
  void set(int64_t n, int64_t k, uint32_t q) {
    uint8_t* row = codes + n * row_bytes;
    if (w.format == WeightFormat::Int4)
      row[k / 2] = static_cast<uint8_t>(row[k / 2] | ((q & 15u) << (4 * (k & 1))));
    else
      row[k] = static_cast<uint8_t>(q);
  }
  // The zero points, one per scale (`zero(cell)`), kept unless each is the format's middle code;
  // U8 for int4, I32 for int8 (GPTQ v1's 8-bit zeros reach 256).
  template <typename Z>
  void set_zeros(Z&& zero) {
    const int64_t cells = w.scales.numel(), middle = weight_middle_code(w.format);
    Tensor z = Tensor::host(w.format == WeightFormat::Int4 ? DType::U8 : DType::I32, w.scales.shape());
    bool all_middle = true;
    for (int64_t c = 0; c < cells; ++c) {
      const int64_t v = zero(c);
      KVPR_CHECK(v >= 0 && v <= (w.format == WeightFormat::Int4 ? 16 : 256), "zero point ", v, " out of range for ",
                 weight_format_name(w.format));
      all_middle = all_middle && v == middle;
      if (z.dtype() == DType::U8) z.data_as<uint8_t>()[c] = static_cast<uint8_t>(v);
      else z.data_as<int32_t>()[c] = static_cast<int32_t>(v);
    }
    if (!all_middle) w.zeros = z;
  }
};

// The input order that makes a module's groups (`g_of`, each input's) contiguous, each `group`
// inputs (the last fewer): empty when they already are in order; nullopt when no order does
// (groups of other sizes).
std::optional<std::vector<int32_t>> contiguous_order(const std::vector<int64_t>& g_of, int64_t group) {
  const auto K = static_cast<int64_t>(g_of.size());
  bool in_order = true;
  for (int64_t k = 0; k < K; ++k) in_order = in_order && g_of[static_cast<size_t>(k)] == k / group;
  if (in_order) return std::vector<int32_t>();
  std::vector<int32_t> order(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) order[static_cast<size_t>(k)] = static_cast<int32_t>(k);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return g_of[static_cast<size_t>(a)] < g_of[static_cast<size_t>(b)];
  });
  for (int64_t k = 0; k < K; ++k)
    if (g_of[static_cast<size_t>(order[static_cast<size_t>(k)])] != k / group) return std::nullopt;
  return order;
}

// Repacks an integer module whose inputs' groups are `g_of`: `code(n, k)` and `scale(n, g)`,
// `zero(n, g)` (unsigned, as the codes) of the checkpoint's input k, group g. Groups that no order
// of the inputs makes contiguous come back dequantized (F32, dense).
template <typename Code, typename Scale, typename Zero>
Weight repack_int(int bits, int64_t N, int64_t K, int64_t group, const std::vector<int64_t>& g_of, Code&& code,
                  Scale&& scale, Zero&& zero) {
  const int64_t groups = ceil_div(K, group);
  const std::optional<std::vector<int32_t>> order = contiguous_order(g_of, group);
  if (!order) {
    Tensor out = Tensor::host(DType::F32, {N, K});
    float* o = out.data_as<float>();
    rows_in_parallel(N, [&](int64_t n) {
      for (int64_t k = 0; k < K; ++k) {
        const int64_t g = g_of[static_cast<size_t>(k)];
        o[n * K + k] = scale(n, g) * static_cast<float>(static_cast<int64_t>(code(n, k)) - zero(n, g));
      }
    });
    return Weight(out);
  }
  Repack r(bits == 4 ? WeightFormat::Int4 : WeightFormat::Int8, N, K, 1, group);
  rows_in_parallel(N, [&](int64_t n) {
    for (int64_t k = 0; k < K; ++k) r.set(n, k, code(n, order->empty() ? k : (*order)[static_cast<size_t>(k)]));
    for (int64_t g = 0; g < groups; ++g) r.scales[n * groups + g] = scale(n, g);
  });
  r.set_zeros([&](int64_t c) { return zero(c / groups, c % groups); });
  if (!order->empty()) {
    r.w.order = Tensor::host(DType::I32, {K});
    std::copy(order->begin(), order->end(), r.w.order.data_as<int32_t>());
  }
  return r.w;
}

}  // namespace

Tensor QuantizedCheckpoint::dequantize(const CheckpointDir& ckpt, const std::string& key) const {
  Weight w = weight(ckpt, key);
  return w.quantized() ? kvpr::dequantize(w) : w.codes;
}

Weight QuantizedCheckpoint::weight(const CheckpointDir& ckpt, const std::string& key) const {
  const std::string p = module_of(key);
  if (method_ == "gptq" || method_ == "awq") {
    const TensorRecord& qw = need(ckpt, p + ".qweight");
    const TensorRecord& qz = need(ckpt, p + ".qzeros");
    const TensorRecord& sc = need(ckpt, p + ".scales");
    expect_dtype(qw, qw.dtype == DType::I32, "I32");
    expect_dtype(qz, qz.dtype == DType::I32, "I32");
    expect_dtype(sc, is_float(sc.dtype), "F16, BF16 or F32");
    KVPR_CHECK(qw.shape.size() == 2 && sc.shape.size() == 2, qw.file, ": tensors '", qw.name, "' and '", sc.name,
               "' must be matrices");
    const int bits = bits_, per = 32 / bits;
    const bool gptq = method_ == "gptq";
    // gptq: qweight [K/per, N]; awq: qweight [K, N/per]. scales [groups, N] in both.
    const int64_t N = sc.shape[1];
    const int64_t K = gptq ? qw.shape[0] * per : qw.shape[0];
    expect_shape(qw, gptq ? Shape{K / per, N} : Shape{K, ceil_div(N, per)});
    KVPR_CHECK(N % per == 0, sc.file, ": tensor '", sc.name, "' has ", N, " columns, not a multiple of ", per);
    const int64_t groups = sc.shape[0];
    const int64_t group = group_ > 0 ? group_ : K;
    expect_shape(qz, {groups, N / per});
    KVPR_CHECK(N > 0 && K > 0, qw.file, ": tensor '", qw.name, "' holds no weights");
    const TensorRecord* gi = gptq ? ckpt.find(p + ".g_idx") : nullptr;
    if (gi) expect_shape(*gi, {K});
    KVPR_CHECK(gi || !desc_act_, ckpt.dir(), ": '", p, ".g_idx' is missing: desc_act orders the groups by it");
    // The groups are group_size inputs each (in order, or as g_idx orders them): as many as the
    // scales have rows.
    KVPR_CHECK(groups == ceil_div(K, group), sc.file, ": tensor '", sc.name, "' has ", groups, " groups, where ", K,
               " inputs in groups of ", group, " make ", ceil_div(K, group));
    const std::vector<int64_t> g_of = groups_of_inputs(gi, K, group, groups, false, gi ? gi->file : sc.file, p);
    // AWQ's words hold their eight columns in its order: column j of a word is value awq_value[j].
    int awq_value[8];
    for (int i = 0; i < 8; ++i) awq_value[kAwqColumn[i]] = i;
    auto col_value = [&](int64_t n) { return gptq ? n : (n / 8) * 8 + awq_value[n % 8]; };
    const auto* qwp = static_cast<const int32_t*>(qw.data);
    const auto* qzp = static_cast<const int32_t*>(qz.data);
    // gptq's codes are packed along the inputs (a column of words), awq's along the outputs.
    return repack_int(
        bits, N, K, group, g_of,
        [&](int64_t n, int64_t k) {
          return gptq ? unpack(qwp + n, k, bits, N) : unpack(qwp + k * (N / per), col_value(n), bits);
        },
        [&](int64_t n, int64_t g) { return load_as_f32(sc.data, sc.dtype, static_cast<size_t>(g * N + n)); },
        [&](int64_t n, int64_t g) {
          return static_cast<int64_t>(unpack(qzp + g * (N / per), col_value(n), bits)) + (gptq && gptq_v1_zeros_ ? 1 : 0);
        });
  }
  // compressed-tensors' integer codes: packed in I32 words (pack-quantized), or one I8 each
  // (int-quantized, naive-quantized).
  const TensorRecord* packed = ckpt.find(p + ".weight_packed");
  const TensorRecord* codes8 = packed ? nullptr : ckpt.find(key);
  if (codes8 && codes8->dtype != DType::I8) codes8 = nullptr;
  if (packed || codes8) {
    const TensorRecord& sc = need(ckpt, p + ".weight_scale");
    expect_dtype(sc, is_float(sc.dtype), "F16, BF16 or F32");
    int64_t N = 0, K = 0, words = 0;
    if (packed) {
      const TensorRecord& ws = need(ckpt, p + ".weight_shape");
      expect_dtype(*packed, packed->dtype == DType::I32, "I32");
      KVPR_CHECK(ws.shape == Shape{2}, ws.file, ": tensor '", ws.name, "' must hold two sizes");
      N = int_at(ws, 0), K = int_at(ws, 1);
      KVPR_CHECK(N > 0 && K > 0 && packed->shape.size() == 2 && packed->shape[0] == N && packed->shape[1] > 0,
                 packed->file, ": tensor '", packed->name, "' of shape ", shape_str(packed->shape), " does not hold ", N,
                 " x ", K, " weights");
      words = packed->shape[1];
    } else {
      KVPR_CHECK(codes8->shape.size() == 2 && codes8->shape[0] > 0 && codes8->shape[1] > 0, codes8->file, ": tensor '",
                 codes8->name, "' must be a matrix of weights, not ", shape_str(codes8->shape));
      N = codes8->shape[0], K = codes8->shape[1];
    }
    // One scale a row and group ([N, groups]; per channel [N, 1]), or one in all ([1]).
    const bool one_scale = shape_numel(sc.shape) == 1;
    KVPR_CHECK(one_scale || (sc.shape.size() == 2 && sc.shape[0] == N && sc.shape[1] > 0), sc.file, ": tensor '",
               sc.name, "' has shape ", shape_str(sc.shape), ", expected [", N, ", groups] or [1]");
    const int64_t groups = one_scale ? 1 : sc.shape[1];
    const TensorRecord* zp = ckpt.find(p + ".weight_zero_point");
    // The config's scheme these tensors are: its bits fill the words (or are 8, one I8 a code),
    // its groups the scales, its zero points are there exactly when it is asymmetric.
    const IntScheme* scheme = nullptr;
    for (const IntScheme& s : int_schemes_)
      if ((packed ? words == ceil_div(K * s.bits, 32) : s.bits == 8) &&
          groups == (s.group > 0 ? ceil_div(K, s.group) : 1) && s.symmetric == (zp == nullptr))
        scheme = &s;
    KVPR_CHECK(scheme, (packed ? packed : codes8)->file, ": '", p, "' (", packed ? std::to_string(words) + " words" :
               std::string("I8 codes"), " a row, ", groups, " scale", groups > 1 ? "s" : "", " a row, ",
               zp ? "zero points" : "no zero points", " for ", N, " x ", K,
               " weights) is none of the config's integer schemes");
    const int bits = scheme->bits;
    const int64_t group = scheme->group > 0 ? scheme->group : K;
    const TensorRecord* gi = ckpt.find(p + ".weight_g_idx");
    if (gi) expect_shape(*gi, {K});
    // Asymmetric: zero points as signed as the codes, packed along the output rows (I32
    // [ceil(N·bits/32), groups], as compressed-tensors writes them since 0.9.4), or one I8 each
    // (before, and for a tensor's one), shaped as the scales.
    if (zp) {
      expect_dtype(*zp, zp->dtype == DType::I32 || zp->dtype == DType::I8, "I32 (packed) or I8");
      expect_shape(*zp, zp->dtype == DType::I32 ? Shape{ceil_div(N * bits, 32), groups} : sc.shape);
    }
    // Codes and zero points are stored signed (packed ones plus 2^(bits-1)); kvpr's are unsigned.
    const int64_t offset = int64_t{1} << (bits - 1);
    const std::vector<int64_t> g_of = groups_of_inputs(gi, K, group, groups, true, gi ? gi->file : sc.file, p);
    auto scale = [&](int64_t n, int64_t g) {
      return load_as_f32(sc.data, sc.dtype, static_cast<size_t>(one_scale ? 0 : n * groups + g));
    };
    auto zero = [&](int64_t n, int64_t g) -> int64_t {
      if (!zp) return offset;
      if (zp->dtype == DType::I8) return offset + static_cast<const int8_t*>(zp->data)[one_scale ? 0 : n * groups + g];
      return static_cast<int64_t>(unpack(static_cast<const int32_t*>(zp->data) + g, n, bits, groups));
    };
    auto code = [&](int64_t n, int64_t k) -> uint32_t {
      if (packed) return unpack(static_cast<const int32_t*>(packed->data) + n * words, k, bits);
      return static_cast<uint32_t>(static_cast<const int8_t*>(codes8->data)[n * K + k] + offset);
    };
    if (one_scale) {  // one scale (and zero) for the whole tensor, held once a row: rows split freely
      Repack r(bits == 4 ? WeightFormat::Int4 : WeightFormat::Int8, N, K, 1, K);
      rows_in_parallel(N, [&](int64_t n) {
        for (int64_t k = 0; k < K; ++k) r.set(n, k, code(n, k));
        r.scales[n] = scale(0, 0);
      });
      r.set_zeros([&](int64_t) { return zero(0, 0); });
      return r.w;
    }
    return repack_int(bits, N, K, group, g_of, code, scale, zero);
  }
  // fp8: one scale per block (fp8's weight_scale_inv, or compressed-tensors' weight_scale per
  // tensor, channel or block).
  const TensorRecord& w = need(ckpt, key);
  const TensorRecord* sc = ckpt.find(p + ".weight_scale_inv");
  if (!sc) sc = ckpt.find(p + ".weight_scale");
  KVPR_CHECK(sc, ckpt.dir(), ": fp8 tensor '", key, "' has no weight_scale_inv or weight_scale beside it");
  expect_dtype(*sc, is_float(sc->dtype), "F32, BF16 or F16");
  KVPR_CHECK(w.shape.size() == 2 && w.shape[0] > 0 && w.shape[1] > 0, w.file, ": tensor '", w.name,
             "' must be a matrix of weights, not ", shape_str(w.shape));
  const int64_t N = w.shape[0], K = w.shape[1];
  // The scale's grid: one ([1] or []), one per output channel ([N, 1]), or one per block of the
  // config's size ([ceil(N/bn), ceil(K/bk)]: the last ones partial).
  int64_t bn = N, bk = K;
  if (shape_numel(sc->shape) != 1) {
    if (sc->shape == Shape{N, 1}) {
      bn = 1;
    } else {
      KVPR_CHECK(block_n_ > 0 && sc->shape == Shape({ceil_div(N, block_n_), ceil_div(K, block_k_)}), sc->file,
                 ": tensor '", sc->name, "' has shape ", shape_str(sc->shape), ", expected [1], [", N, ", 1]",
                 block_n_ > 0 ? " or [" + std::to_string(ceil_div(N, block_n_)) + ", " +
                                    std::to_string(ceil_div(K, block_k_)) + "] (blocks of the config's size)"
                              : std::string());
      bn = block_n_, bk = block_k_;
    }
  }
  // One scale for the tensor is held once a row, so that the rows split freely (Phi-3's fused q/k/v).
  const bool per_tensor = bn == N && bk == K;
  Repack r(WeightFormat::Fp8, N, K, per_tensor ? 1 : bn, bk);
  std::memcpy(r.codes, w.data, static_cast<size_t>(N * K));
  for (int64_t c = 0; c < r.w.scales.numel(); ++c)
    r.scales[c] = load_as_f32(sc->data, sc->dtype, static_cast<size_t>(per_tensor ? 0 : c));
  return r.w;
}

}  // namespace kvpr
