#include "engine/base/option_value.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <utility>

#include "engine/base/error.h"

namespace kvpr {

int64_t parse_option_integer(const char* name, const std::string& v, int64_t lo, int64_t hi) {
  int64_t x = 0;
  size_t used = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KVPR_CHECK(used == v.size() && !v.empty(), name, ": '", v, "' is not an integer");
  KVPR_CHECK(x >= lo && x <= hi, name, " must be in ", lo, "..", hi, ", not ", x);
  return x;
}

double parse_option_number(const char* name, const std::string& v) {
  double x = 0;
  size_t used = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KVPR_CHECK(used == v.size() && !v.empty() && std::isfinite(x), name, ": '", v, "' is not a number");
  return x;
}

double parse_option_size(const char* name, const std::string& v) {
  size_t num = 0;
  while (num < v.size() && (std::isdigit(static_cast<unsigned char>(v[num])) || v[num] == '.' || v[num] == 'e' ||
                            v[num] == 'E' || v[num] == '+' || v[num] == '-'))
    ++num;
  std::string unit = v.substr(num);
  double x = 0;
  try {
    x = parse_option_number(name, v.substr(0, num));
  } catch (const Error&) {
    KVPR_THROW(name, ": '", v, "' is not a number");
  }
  double scale = 1;
  if (!unit.empty()) {
    if (unit.size() >= 2 && (unit.substr(unit.size() - 2) == "iB")) unit.resize(unit.size() - 2);
    else if (unit.back() == 'B') unit.pop_back();
    static const std::pair<const char*, double> units[] = {{"", 1}, {"K", 1024.0}, {"M", 1048576.0}, {"G", 1073741824.0},
                                                           {"T", 1099511627776.0}};
    scale = 0;
    for (const auto& [u, s] : units)
      if (unit == u) scale = s;
    KVPR_CHECK(scale > 0, name, ": '", v, "' is not a size (bytes, KiB, MiB, GiB, TiB) or a fraction in (0, 1]");
  }
  KVPR_CHECK(x > 0, name, " must be positive, not '", v, "'");
  // With a unit it is bytes; without one, a number past 1 is bytes and one up to 1 a fraction.
  const bool has_unit = num < v.size();
  const double value = x * scale;
  KVPR_CHECK(!has_unit || value >= 1, name, ": '", v, "' is less than a byte");
  if (has_unit || value > 1) return std::max(2.0, std::ceil(value));  // whole bytes, never read back as a fraction
  return value;
}

bool parse_option_either(const char* name, const std::string& v, const char* first, const char* second) {
  KVPR_CHECK(v == first || v == second, name, ": expected ", first, " or ", second, ", got '", v, "'");
  return v == second;
}

}  // namespace kvpr
