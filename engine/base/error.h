// Errors of the kvpr library: one exception type carrying a user-facing message and the
// source location that raised it. Process and HTTP boundaries catch it and report once.
#pragma once

#if __cplusplus >= 202002L
#include <source_location>
#define KVPR_HAVE_SOURCE_LOCATION 1
#endif
#include <sstream>
#include <stdexcept>
#include <string>

namespace kvpr {

class Error : public std::runtime_error {
 public:
#ifdef KVPR_HAVE_SOURCE_LOCATION
  explicit Error(const std::string& message,
                 std::source_location where = std::source_location::current())
      : std::runtime_error(message),
        where_(std::string(where.file_name()) + ":" + std::to_string(where.line())) {}
#else
  // CUDA translation units are compiled as C++17 (CMake 3.25 cannot ask nvcc for C++20).
  explicit Error(const std::string& message) : std::runtime_error(message) {}
#endif
  // "file.cc:123" of the throw site, for logs.
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace kvpr

// Throws kvpr::Error whose message is the concatenation of the arguments.
#define KVPR_THROW(...) throw ::kvpr::Error(::kvpr::detail::concat(__VA_ARGS__))
#define KVPR_CHECK(cond, ...)          \
  do {                                 \
    if (!(cond)) KVPR_THROW(__VA_ARGS__); \
  } while (0)
