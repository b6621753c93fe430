#include "engine/text/unicode_nfc.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/base/utf8.h"

namespace kvpr {

namespace {

struct CccRange {
  char32_t lo, hi;
  uint8_t ccc;
};
struct Decomposition {
  char32_t cp, first, second;  // second 0: a singleton
};
struct Composition {
  char32_t first, second, composite;
};
#include "engine/text/unicode_nfc_tables.inc"

// Hangul syllables decompose and compose by arithmetic (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// A byte that is not UTF-8 travels as this private value plus the byte: a starter that
// neither decomposes nor composes, written back as the byte.
constexpr char32_t kRawByte = 0x110000;

uint8_t ccc(char32_t c) {
  if (c < 0x300 || c >= kRawByte) return 0;
  auto it = std::upper_bound(std::begin(kCccRanges), std::end(kCccRanges), c,
                             [](char32_t v, const CccRange& r) { return v < r.lo; });
  if (it == std::begin(kCccRanges)) return 0;
  --it;
  return c <= it->hi ? it->ccc : 0;
}

void decompose(char32_t c, std::vector<char32_t>* out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out->push_back(kTBase + s % kTCount);
    return;
  }
  if (c >= 0xC0 && c < kRawByte) {
    auto it = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), c,
                               [](const Decomposition& d, char32_t v) { return d.cp < v; });
    if (it != std::end(kDecompositions) && it->cp == c) {
      decompose(it->first, out);  // the first part may decompose again; the second never does
      if (it->second) decompose(it->second, out);
      return;
    }
  }
  out->push_back(c);
}

// The primary composite of a starter and what follows it, or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  auto it = std::lower_bound(std::begin(kCompositions), std::end(kCompositions), std::pair{a, b},
                             [](const Composition& c, const std::pair<char32_t, char32_t>& v) {
                               return c.first != v.first ? c.first < v.first : c.second < v.second;
                             });
  return it != std::end(kCompositions) && it->first == a && it->second == b ? it->composite : 0;
}

}  // namespace

bool nfc_quick_yes(std::string_view s) {
  // U+0300 is the first code point NFC can change or compose with; its UTF-8 begins 0xCC and
  // every larger code point's lead byte is above that.
  for (char ch : s)
    if (static_cast<unsigned char>(ch) >= 0xCC) return false;
  return true;
}

std::string to_nfc(std::string_view s) {
  if (nfc_quick_yes(s)) return std::string(s);
  // Full canonical decomposition.
  std::vector<char32_t> d;
  d.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    const int n = utf8_next(s, i, &cp);
    if (n > 0) {
      decompose(cp, &d);
      i += n;
    } else {
      d.push_back(kRawByte + static_cast<unsigned char>(s[i]));  // one byte at a time
      ++i;
    }
  }
  // Canonical ordering: each run of non-starters sorted by combining class, stably.
  for (size_t i = 0; i < d.size();) {
    if (ccc(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && ccc(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j, [](char32_t a, char32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }
  // Canonical composition: a character joins the last starter unless something between them
  // blocks it (a starter, or a mark of the same or a higher class).
  std::vector<char32_t> c;
  c.reserve(d.size());
  std::ptrdiff_t starter = -1;
  int last_class = -1;  // class of the last character kept; -1: none yet
  for (char32_t ch : d) {
    const int cls = ccc(ch);
    if (starter >= 0 && (last_class < cls || last_class == 0)) {
      if (char32_t comp = compose(c[starter], ch)) {
        c[starter] = comp;
        continue;
      }
    }
    if (cls == 0) starter = static_cast<std::ptrdiff_t>(c.size());
    last_class = cls;
    c.push_back(ch);
  }
  std::string out;
  out.reserve(s.size());
  for (char32_t ch : c) {
    if (ch >= kRawByte) out.push_back(static_cast<char>(ch - kRawByte));
    else append_utf8(out, ch);
  }
  return out;
}

}  // namespace kvpr
