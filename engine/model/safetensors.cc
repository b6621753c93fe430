// The safetensors format: u64 little-endian header length N, N bytes of JSON
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the data; offsets are relative to the end of the header.
#include <algorithm>
#include <cstring>
#include <fstream>

#include "engine/model/checkpoint.h"
#include "engine/base/error.h"
#include "engine/base/json.h"

namespace kvpr {

namespace {

bool safetensors_dtype(const std::string& s, DType* out) {
  if (s == "F32") *out = DType::F32;
  else if (s == "F16") *out = DType::F16;
  else if (s == "BF16") *out = DType::BF16;
  else if (s == "I32") *out = DType::I32;
  else if (s == "I64") *out = DType::I64;
  else if (s == "U8") *out = DType::U8;
  else if (s == "I8") *out = DType::I8;
  else if (s == "F8_E4M3") *out = DType::F8E4M3;  // (quantized checkpoints' fp8 weights)
  else return false;
  return true;
}

std::string file_name(const std::string& path) {
  size_t p = path.find_last_of('/');
  return p == std::string::npos ? path : path.substr(p + 1);
}

}  // namespace

std::vector<TensorRecord> read_safetensors(const MappedFile& file) {
  const std::string name = file_name(file.path());
  KVPR_CHECK(file.size() >= 8, name, ": truncated safetensors file (", file.size(),
             " bytes, no header length)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);
  KVPR_CHECK(header_len <= file.size() - 8, name, ": safetensors header length ", header_len,
             " overruns the file (", file.size(), " bytes)");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file.size() - data_start;
  json::Value header;
  try {
    header = json::parse(std::string_view(reinterpret_cast<const char*>(file.data() + 8), header_len));
  } catch (const Error& e) {
    KVPR_THROW(name, ": bad safetensors header: ", e.what());
  }
  KVPR_CHECK(header.is_object(), name, ": safetensors header is not a JSON object");
  std::vector<TensorRecord> out;
  for (const auto& [key, info] : header.as_object()) {
    if (key == "__metadata__") continue;
    try {
      KVPR_CHECK(info.is_object(), "entry is not an object");
      const json::Value* dt = info.find("dtype");
      const json::Value* shape = info.find("shape");
      const json::Value* offs = info.find("data_offsets");
      KVPR_CHECK(dt && shape && offs, "entry lacks dtype, shape or data_offsets");
      TensorRecord r;
      r.name = key;
      r.file = name;
      KVPR_CHECK(safetensors_dtype(dt->as_string(), &r.dtype), "unsupported dtype ", dt->as_string(),
                 " (supported: F32, F16, BF16, F8_E4M3, I32, I64, U8, I8)");
      int64_t numel = 1;
      for (const auto& d : shape->as_array()) {
        int64_t v = d.as_int();
        KVPR_CHECK(v >= 0, "negative dimension");
        KVPR_CHECK(!__builtin_mul_overflow(numel, v, &numel) && numel <= (int64_t{1} << 48),
                   "shape is too large");
        r.shape.push_back(v);
      }
      const auto& o = offs->as_array();
      KVPR_CHECK(o.size() == 2, "data_offsets must have two entries");
      int64_t b = o[0].as_int(), e = o[1].as_int();
      KVPR_CHECK(b >= 0 && e >= b, "bad data_offsets [", b, ", ", e, "]");
      KVPR_CHECK(static_cast<uint64_t>(e) <= data_size, "data_offsets [", b, ", ", e,
                 "] overrun the file's ", data_size, " data bytes (truncated file?)");
      KVPR_CHECK(static_cast<uint64_t>(e - b) == r.nbytes(), "data_offsets span ", e - b,
                 " bytes but ", dtype_name(r.dtype), shape_str(r.shape), " needs ", r.nbytes());
      r.data = file.data() + data_start + b;
      out.push_back(std::move(r));
    } catch (const Error& e) {
      KVPR_THROW(name, ": tensor '", key, "': ", e.what());
    }
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  json::Value header(json::Object{});
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    json::Value entry(json::Object{});
    entry.set("dtype", dtype_name(t.dtype));
    json::Array shape;
    for (int64_t d : t.shape) shape.emplace_back(d);
    entry.set("shape", std::move(shape));
    uint64_t n = static_cast<uint64_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
    entry.set("data_offsets", json::Array{json::Value(static_cast<int64_t>(offset)),
                                          json::Value(static_cast<int64_t>(offset + n))});
    header.set(t.name, std::move(entry));
    offset += n;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // keep data 8-byte aligned
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  KVPR_CHECK(f, path, ": cannot create");
  uint64_t len = h.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& t : tensors)
    f.write(static_cast<const char*>(t.data),
            static_cast<std::streamsize>(shape_numel(t.shape) * dtype_size(t.dtype)));
  KVPR_CHECK(f.good(), path, ": write failed");
}

}  // namespace kvpr
