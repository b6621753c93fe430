// Helpers shared by the test suites: fixture paths, .npy reading, tensor comparison that
// checks NaN/inf first and prints the first mismatch and the maximum error.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fstream>

#include "engine/base/json.h"
#include "engine/base/npy.h"
#include "engine/text/tokenizer.h"

namespace kvpr::test {

inline std::string data_path(const std::string& rel) { return std::string(KVPR_TEST_DATA) + "/" + rel; }

// A fresh empty directory under the system temp dir, removed at destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kvpr-test-XXXXXX").string();
    path_ = mkdtemp(tmpl.data()) ? tmpl : "";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Expects |got - ref| <= rel_tol * max|ref| elementwise (a relative error on the scale of
// the reference). Reports NaN/inf, the first mismatch and the maximum error.
inline ::testing::AssertionResult close_rel(const std::vector<double>& ref, const float* got, size_t n,
                                            double rel_tol) {
  if (ref.size() != n) return ::testing::AssertionFailure() << "size " << n << " vs reference " << ref.size();
  double scale = 0;
  for (double r : ref) scale = std::max(scale, std::fabs(r));
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(got[i])) return ::testing::AssertionFailure() << "non-finite value at " << i << ": " << got[i];
  double max_err = 0;
  size_t worst = 0, first_bad = n;
  for (size_t i = 0; i < n; ++i) {
    double e = std::fabs(got[i] - ref[i]);
    if (e > max_err) max_err = e, worst = i;
    if (e > rel_tol * scale && first_bad == n) first_bad = i;
  }
  if (first_bad == n) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "first mismatch at " << first_bad << ": got " << got[first_bad]
                                       << " want " << ref[first_bad] << "; max error " << max_err << " at "
                                       << worst << " (relative " << max_err / scale << ", tolerance "
                                       << rel_tol << ")";
}

// A tokenizer whose ids 0..n-1 are the single characters '!' + id (no merges); `eos`
// names the end-of-sequence token, if any. Files are written under tmp/tok.
inline Tokenizer char_tokenizer(const TempDir& tmp, int n, const std::string& eos = "") {
  json::Value vocab(json::Object{});
  for (int i = 0; i < n; ++i) vocab.set(std::string(1, static_cast<char>('!' + i)), i);
  std::string dir = tmp.file("tok");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/vocab.json") << vocab.dump();
  std::ofstream(dir + "/merges.txt") << "#version: 0.2\n";
  if (!eos.empty()) std::ofstream(dir + "/special_tokens_map.json") << "{\"eos_token\": \"" << eos << "\"}";
  return Tokenizer::load(dir);
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The float32 inputs of tests/data/fp8/e4m3.json (tests/scripts/make_fp8_fixtures.py) and the
// E4M3 byte each must become; NaNs left out unless asked for.
struct Fp8Case {
  float x;
  uint8_t byte;
};
inline std::vector<Fp8Case> fp8_cases(bool with_nan) {
  const json::Value ref = json::parse(read_file(data_path("fp8/e4m3.json")));
  std::vector<Fp8Case> out;
  for (const json::Value& c : ref.find("encode")->as_array()) {
    const uint32_t bits = static_cast<uint32_t>(c.as_array()[0].as_int());
    float x;
    std::memcpy(&x, &bits, 4);
    if (with_nan || !std::isnan(x)) out.push_back({x, static_cast<uint8_t>(c.as_array()[1].as_int())});
  }
  return out;
}

}  // namespace kvpr::test

// The message contains `needle`; prints the message when it does not.
#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)
