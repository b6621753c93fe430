// The byte-level pieces of JSON text both constrained-decoding recognizers share
// (json_object.h's, json_schema.h's): a string's body (escapes, strict UTF-8) and a number
// (RFC 8259: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?), a byte at a time.
#pragma once

#include <cstdint>

namespace kvpr::json_lex {

// Number states.
enum Num : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kE, kESign, kExp };
// String: a UTF-8 lead byte whose next byte has a narrower range (sub, while aux > 0): no
// overlong forms, no surrogates, nothing past U+10FFFF.
enum Utf8Lead : uint8_t { kAfterE0 = 10, kAfterED, kAfterF0, kAfterF4 };

inline bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Whitespace between tokens of generated JSON: whether the run so far (`ws` bytes of state, 0
// before its first byte) takes whitespace byte c.
//   compact, the default: nothing, one space, or one newline followed by up to 20 spaces or
//     tabs (its indentation), as llama.cpp's JSON-schema grammars write `space`, so a model
//     cannot spend its tokens on runs of blank lines between tokens;
//   permissive: any JSON whitespace, up to max_run bytes in a row.
struct Whitespace {
  bool permissive = false;
  uint8_t max_run = 48;  // permissive only
  static constexpr uint8_t kMaxIndent = 20;
  bool take(uint8_t& ws, uint8_t c) const {
    if (permissive) {
      if (ws >= max_run) return false;
      ++ws;
      return true;
    }
    // ws: 0 nothing yet, 1 after one space, 2 + k after a newline and k indentation bytes.
    if (ws == 0) {
      if (c == ' ') ws = 1;
      else if (c == '\n') ws = 2;
      else return false;
      return true;
    }
    if (ws == 1 || (c != ' ' && c != '\t') || ws - 2 >= kMaxIndent) return false;
    ++ws;
    return true;
  }
};
inline bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
inline bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
inline bool number_may_end(uint8_t n) { return n == kZero || n == kInt || n == kFrac || n == kExp; }

// The number state after its first byte ('-' or a digit).
inline uint8_t number_start(uint8_t c) { return c == '-' ? kMinus : c == '0' ? kZero : kInt; }

// One byte of a string's body (after the opening quote); `sub` is the escape state (1: after a
// backslash, 2..5: \u and the hex digits read + 2) or a Utf8Lead, `aux` the UTF-8 continuation
// bytes due. Returns 0: refused, 1: taken, 2: the closing quote. `chars` counts the characters
// completed.
inline int string_byte(uint8_t& sub, uint8_t& aux, int64_t& chars, uint8_t c) {
  if (aux > 0) {
    const uint8_t lo = sub == kAfterE0 ? 0xA0 : sub == kAfterF0 ? 0x90 : 0x80;
    const uint8_t hi = sub == kAfterED ? 0x9F : sub == kAfterF4 ? 0x8F : 0xBF;
    if (c < lo || c > hi) return 0;
    sub = 0;
    if (--aux == 0) ++chars;
    return 1;
  }
  if (sub == 1) {
    if (c == 'u') {
      sub = 2;
      return 1;
    }
    if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' && c != 't') return 0;
    sub = 0;
    ++chars;
    return 1;
  }
  if (sub >= 2) {
    if (!is_hex(c)) return 0;
    sub = sub == 5 ? 0 : static_cast<uint8_t>(sub + 1);
    if (sub == 0) ++chars;
    return 1;
  }
  if (c == '"') return 2;
  if (c == '\\') {
    sub = 1;
    return 1;
  }
  if (c < 0x20) return 0;  // control characters must be escaped
  if (c < 0x80) {
    ++chars;
    return 1;
  }
  if (c >= 0xC2 && c <= 0xDF) aux = 1;
  else if (c >= 0xE0 && c <= 0xEF) aux = 2;
  else if (c >= 0xF0 && c <= 0xF4) aux = 3;
  else return 0;
  sub = 0;
  if (c == 0xE0) sub = kAfterE0;
  if (c == 0xED) sub = kAfterED;
  if (c == 0xF0) sub = kAfterF0;
  if (c == 0xF4) sub = kAfterF4;
  return 1;
}

// One byte of a number in state `sub` (an integer takes no fraction or exponent). Returns 0:
// refused, 1: taken, 2: the number ended before this byte, which belongs to what follows.
inline int number_byte(uint8_t& sub, uint8_t c, bool integer) {
  const uint8_t n = sub;
  if (is_digit(c)) {
    if (n == kZero) return 0;  // no leading zeros
    if (n == kMinus) sub = c == '0' ? kZero : kInt;
    else if (n == kDot) sub = kFrac;
    else if (n == kE || n == kESign) sub = kExp;
    return 1;
  }
  if (!integer && c == '.' && (n == kZero || n == kInt)) {
    sub = kDot;
    return 1;
  }
  if (!integer && (c == 'e' || c == 'E') && (n == kZero || n == kInt || n == kFrac)) {
    sub = kE;
    return 1;
  }
  if ((c == '+' || c == '-') && n == kE) {
    sub = kESign;
    return 1;
  }
  return number_may_end(n) ? 2 : 0;
}

// A code point read a UTF-8 byte at a time: `cp` so far, then byte c (a lead or an ASCII byte
// begins the next one, with its own bits).
inline uint32_t utf8_step(uint32_t cp, uint8_t c) {
  if ((c & 0xC0) == 0x80) return cp << 6 | (c & 0x3Fu);
  return c < 0x80 ? c : c >= 0xF0 ? c & 0x07u : c >= 0xE0 ? c & 0x0Fu : c & 0x1Fu;
}

}  // namespace kvpr::json_lex
