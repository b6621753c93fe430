// UTF-8 encoding and decoding of one code point (JSON \u escapes, the tokenizer), and replace_all.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvpr {

inline void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// Whether s is valid UTF-8 throughout.
inline bool valid_utf8(std::string_view s);

// s with every occurrence of `from` (not empty) replaced by `to`, left to right.
inline std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, from.size(), from) == 0) {
      out.append(to);
      i += from.size();
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

// Decodes one UTF-8 character at s[i]; invalid bytes decode as U+FFFD of length 1.
// Returns the length in bytes of a valid sequence (1..4), or 0 if s[i..] is an incomplete
// but so far valid sequence (only when allow_incomplete), or -1 for an invalid byte.
inline int utf8_next(std::string_view s, size_t i, char32_t* cp) {
  unsigned char b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  int len;
  char32_t c;
  unsigned char lo = 0x80, hi = 0xbf;  // allowed range of the second byte
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    len = 2;
    c = b0 & 0x1f;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    len = 3;
    c = b0 & 0x0f;
    if (b0 == 0xe0) lo = 0xa0;
    if (b0 == 0xed) hi = 0x9f;  // no surrogates
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    len = 4;
    c = b0 & 0x07;
    if (b0 == 0xf0) lo = 0x90;
    if (b0 == 0xf4) hi = 0x8f;
  } else {
    *cp = 0xfffd;
    return -1;
  }
  for (int k = 1; k < len; ++k) {
    if (i + k >= s.size()) {
      *cp = 0xfffd;
      return 0;  // incomplete
    }
    unsigned char b = static_cast<unsigned char>(s[i + k]);
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xbf;
    if (b < l || b > h) {
      *cp = 0xfffd;
      return -k;  // invalid after k bytes (maximal subpart of length k)
    }
    c = (c << 6) | (b & 0x3f);
  }
  *cp = c;
  return len;
}

inline bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    char32_t cp;
    const int n = utf8_next(s, i, &cp);
    if (n <= 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace kvpr
