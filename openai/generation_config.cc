#include "openai/generation_config.h"

#include <cmath>
#include <filesystem>
#include <sstream>

#include "engine/base/error.h"
#include "engine/base/json.h"
#include "engine/contract/contract.h"

namespace kvpr {

std::string SamplingDefaults::describe() const {
  std::ostringstream o;
  const char* sep = "";
  auto put = [&](const char* name, const auto& v) {
    if (!v) return;
    o << sep << name << " " << *v;
    sep = ", ";
  };
  put("temperature", temperature);
  put("top_p", top_p);
  put("top_k", top_k);
  put("min_p", min_p);
  put("repetition_penalty", repetition_penalty);
  return empty() ? "none" : o.str();
}

SamplingDefaults read_sampling_defaults(const std::string& model_dir) {
  SamplingDefaults d;
  const std::string path = model_dir + "/generation_config.json";
  if (!std::filesystem::exists(path)) return d;
  const json::Value cfg = json::parse_file(path);
  KVPR_CHECK(cfg.is_object(), path, ": expected a JSON object");
  auto number = [&](const char* name, std::optional<double>* dst, auto&& ok, const char* range) {
    const json::Value* v = cfg.find(name);
    if (!v || v->is_null()) return;
    KVPR_CHECK(v->is_number(), path, ": \"", name, "\" must be a number");
    const double x = v->as_double();
    KVPR_CHECK(std::isfinite(x) && ok(x), path, ": \"", name, "\" is ", x, ", outside ", range,
               " (kvprd --generation-config none ignores the file)");
    *dst = x;
  };
  number("temperature", &d.temperature, [](double x) { return x >= 0 && x <= 2; }, "[0, 2]");
  number("top_p", &d.top_p, [](double x) { return x > 0 && x <= 1; }, "(0, 1]");
  number("min_p", &d.min_p, [](double x) { return x >= 0 && x <= 1; }, "[0, 1]");
  number("repetition_penalty", &d.repetition_penalty,
         [](double x) { return x >= kMinRepetitionPenalty && x <= kMaxRepetitionPenalty; }, "[0.01, 100]");
  std::optional<double> top_k;
  number("top_k", &top_k, [](double x) { return x >= -1 && x == std::floor(x); }, "the integers from -1");
  if (top_k) d.top_k = static_cast<int64_t>(*top_k);
  return d;
}

}  // namespace kvpr
