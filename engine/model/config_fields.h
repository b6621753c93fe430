// Reads the fields of a Hugging Face config.json with errors that name the file and the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "engine/base/error.h"
#include "engine/base/json.h"

namespace kvpr {

// <model_dir>/config.json, parsed; throws naming what is missing.
inline json::Value read_config_json(const std::string& model_dir) {
  KVPR_CHECK(std::filesystem::is_directory(model_dir), model_dir, ": not a directory");
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  KVPR_CHECK(std::filesystem::exists(path), model_dir, ": no config.json");
  return json::parse_file(path);
}

class ConfigFields {
 public:
  ConfigFields(const json::Value& v, std::string source) : v_(v), source_(std::move(source)) {
    KVPR_CHECK(v.is_object(), source_, ": not a JSON object");
  }
  const std::string& source() const { return source_; }
  // The field, or nullptr when it is absent or null.
  const json::Value* find(const char* name) const {
    const json::Value* f = v_.find(name);
    return f && !f->is_null() ? f : nullptr;
  }
  // Whether the field is there and null (a default switched off).
  bool is_null(const char* name) const {
    const json::Value* f = v_.find(name);
    return f && f->is_null();
  }
  // Each get_* leaves *out alone when the field is absent or null (an error when required).
  void get_int(const char* name, int64_t* out, bool required = false) const {
    read(name, required, [&](const json::Value& f) { *out = f.as_int(); });
  }
  void get_bool(const char* name, bool* out) const {
    read(name, false, [&](const json::Value& f) { *out = f.as_bool(); });
  }
  void get_double(const char* name, double* out, bool required = false) const {
    read(name, required, [&](const json::Value& f) { *out = f.as_double(); });
  }
  void get_string(const char* name, std::string* out, bool required = false) const {
    read(name, required, [&](const json::Value& f) { *out = f.as_string(); });
  }
  // model_type, which must be `expected`.
  void expect_model_type(const char* expected) const {
    std::string mt;
    get_string("model_type", &mt, true);
    KVPR_CHECK(mt == expected, source_, ": model_type \"", mt, "\" is not ", expected);
  }

 private:
  template <typename F>
  void read(const char* name, bool required, F&& f) const {
    const json::Value* v = find(name);
    if (!v) {
      KVPR_CHECK(!required, source_, ": missing \"", name, "\"");
      return;
    }
    try {
      f(*v);
    } catch (const Error& e) {
      KVPR_THROW(source_, ": \"", name, "\": ", e.what());
    }
  }
  const json::Value& v_;
  std::string source_;
};

}  // namespace kvpr
