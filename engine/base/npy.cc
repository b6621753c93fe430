#include "engine/base/npy.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "engine/base/error.h"

namespace kvpr {

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::ostringstream h;
  h << "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    h << shape[i] << (shape.size() == 1 || i + 1 < shape.size() ? ", " : "");
    n *= shape[i];
  }
  h << "), }";
  std::string header = h.str();
  // Magic (6) + version (2) + length (2) + header + '\n', padded to a multiple of 64.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  KVPR_CHECK(f, path, ": cannot create");
  f.write("\x93NUMPY\x01\x00", 8);
  uint16_t len = static_cast<uint16_t>(header.size());
  f.write(reinterpret_cast<const char*>(&len), 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(float)));
  KVPR_CHECK(f.good(), path, ": write failed");
}

NpyArray read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  KVPR_CHECK(f, path, ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  KVPR_CHECK(s.size() >= 10 && s.compare(0, 6, "\x93NUMPY") == 0, path, ": not a .npy file");
  size_t hlen, hstart;
  if (s[6] == 1) {
    uint16_t l;
    std::memcpy(&l, s.data() + 8, 2);
    hlen = l;
    hstart = 10;
  } else {
    uint32_t l;
    KVPR_CHECK(s.size() >= 12, path, ": truncated header");
    std::memcpy(&l, s.data() + 8, 4);
    hlen = l;
    hstart = 12;
  }
  KVPR_CHECK(hstart + hlen <= s.size(), path, ": truncated header");
  std::string header = s.substr(hstart, hlen);
  auto field = [&](const std::string& key) {
    size_t p = header.find("'" + key + "'");
    KVPR_CHECK(p != std::string::npos, path, ": header lacks ", key);
    return header.substr(header.find(':', p) + 1);
  };
  std::string descr = field("descr");
  descr = descr.substr(descr.find('\'') + 1);
  descr = descr.substr(0, descr.find('\''));
  KVPR_CHECK(field("fortran_order").find("False") < 3, path, ": Fortran order is not supported");
  std::string shp = field("shape");
  shp = shp.substr(shp.find('(') + 1, shp.find(')') - shp.find('(') - 1);
  NpyArray a;
  std::istringstream is(shp);
  std::string tok;
  while (std::getline(is, tok, ','))
    if (tok.find_first_not_of(' ') != std::string::npos) a.shape.push_back(std::stoll(tok));
  int64_t n = 1;
  for (int64_t d : a.shape) n *= d;
  const char* p = s.data() + hstart + hlen;
  size_t avail = s.size() - hstart - hlen;
  size_t es = descr == "<f8" || descr == "<i8" ? 8 : descr == "<f4" || descr == "<i4" ? 4 : 0;
  KVPR_CHECK(es, path, ": unsupported dtype ", descr);
  KVPR_CHECK(avail >= static_cast<size_t>(n) * es, path, ": truncated data");
  a.values.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const char* q = p + i * es;
    if (descr == "<f8") { double v; std::memcpy(&v, q, 8); a.values[i] = v; }
    else if (descr == "<f4") { float v; std::memcpy(&v, q, 4); a.values[i] = v; }
    else if (descr == "<i8") { int64_t v; std::memcpy(&v, q, 8); a.values[i] = static_cast<double>(v); }
    else { int32_t v; std::memcpy(&v, q, 4); a.values[i] = v; }
  }
  return a;
}

}  // namespace kvpr
