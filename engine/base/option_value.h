// Option values as every front end takes them (kvprd's flags and config file, the engine's
// options, the emulated device's environment): one parser per kind of value, each error one
// line naming the option.
#pragma once

#include <cstdint>
#include <string>

namespace kvpr {

// kvpr::Error naming the option when the value is not one.
int64_t parse_option_integer(const char* name, const std::string& v, int64_t lo, int64_t hi);
double parse_option_number(const char* name, const std::string& v);  // finite
// One of two words: whether it is `second`.
bool parse_option_either(const char* name, const std::string& v, const char* first, const char* second);
// A size in bytes ("40GiB", "512MiB", "1.5TiB", "2e9"; K, M, G, T are binary too), or a fraction
// of some memory: a plain number in (0, 1]. Returns bytes (> 1) or the fraction (<= 1).
double parse_option_size(const char* name, const std::string& v);

}  // namespace kvpr
