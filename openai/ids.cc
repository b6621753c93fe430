#include "openai/ids.h"

namespace kvpr {

std::string IdMaker::id(const char* prefix) {
  static const char* hex = "0123456789abcdef";
  std::string s = prefix;
  const uint64_t a = rng_(), b = rng_();
  for (int i = 0; i < 16; ++i) s += hex[(a >> (4 * i)) & 15];
  for (int i = 0; i < 8; ++i) s += hex[(b >> (4 * i)) & 15];
  return s;
}

std::string IdMaker::tool_call_id(bool nine_alnum) {
  if (!nine_alnum) return id("chatcmpl-tool-");
  static const char* an = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string s;
  for (int i = 0; i < 9; ++i) s += an[rng_() % 62];
  return s;
}

}  // namespace kvpr
