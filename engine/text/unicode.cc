#include "engine/text/unicode.h"

#include "engine/base/error.h"
#include "engine/base/utf8.h"

#ifdef KVPR_HAVE_TEXT_LIBS
#include <utf8proc.h>

#include <cstdlib>
#include <memory>
#endif

namespace kvpr::unicode {

#ifdef KVPR_HAVE_TEXT_LIBS

bool available() { return true; }

std::string normalize(std::string_view utf8, Form form) {
  int options = UTF8PROC_STABLE;
  if (form == Form::NFC || form == Form::NFKC) options |= UTF8PROC_COMPOSE;
  else options |= UTF8PROC_DECOMPOSE;
  if (form == Form::NFKC || form == Form::NFKD) options |= UTF8PROC_COMPAT;
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(utf8.data()),
                                          static_cast<utf8proc_ssize_t>(utf8.size()), &out,
                                          static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> hold(out, &std::free);
  KVPR_CHECK(n >= 0, "Unicode normalization failed: ", utf8proc_errmsg(n));
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

std::string lowercase(std::string_view utf8) {
  std::string out;
  out.reserve(utf8.size());
  for (size_t i = 0; i < utf8.size();) {
    char32_t c;
    const int n = utf8_next(utf8, i, &c);
    KVPR_CHECK(n > 0, "lowercase: invalid UTF-8");
    i += static_cast<size_t>(n);
    if (c < 0x80) {
      out.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : static_cast<char>(c));
    } else if (c == 0x130) {  // SpecialCasing's one unconditional lowercase of several characters
      append_utf8(out, 'i');
      append_utf8(out, 0x307);
    } else {
      append_utf8(out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
  }
  return out;
}

namespace {
utf8proc_category_t category(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }
}  // namespace

char32_t to_lower(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }
char32_t to_upper(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }

bool is_numeric(char32_t c) {
  const auto k = category(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

bool is_punctuation(char32_t c) {
  if (c < 0x80) return (c >= 0x21 && c <= 0x2f) || (c >= 0x3a && c <= 0x40) || (c >= 0x5b && c <= 0x60) ||
                       (c >= 0x7b && c <= 0x7e);
  const auto k = category(c);
  return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

bool is_mark(char32_t c) {
  const auto k = category(c);
  return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME;
}

bool is_nonspacing_mark(char32_t c) { return category(c) == UTF8PROC_CATEGORY_MN; }

bool is_other(char32_t c) {  // unicode_categories' is_other, which has no table of unassigned points
  return category(c) >= UTF8PROC_CATEGORY_CC;
}

bool is_word(char32_t c) {
  const auto k = category(c);
  return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || is_mark(c) || k == UTF8PROC_CATEGORY_ND ||
         k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC || c == 0x200c || c == 0x200d;
}

#else

bool available() { return false; }
namespace {
[[noreturn]] void missing() {
  KVPR_THROW("this kvpr was built without utf8proc and Oniguruma (KVPR_TEXT_LIBS=OFF): "
             "rebuild after scripts/install-deps.sh to load this tokenizer");
}
}  // namespace
std::string normalize(std::string_view, Form) { missing(); }
std::string lowercase(std::string_view) { missing(); }
bool is_numeric(char32_t) { missing(); }
bool is_punctuation(char32_t) { missing(); }
bool is_mark(char32_t) { missing(); }
bool is_nonspacing_mark(char32_t) { missing(); }
bool is_other(char32_t) { missing(); }
char32_t to_lower(char32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }
char32_t to_upper(char32_t c) { return c >= 'a' && c <= 'z' ? c - 32 : c; }
bool is_word(char32_t c) {  // ASCII's word characters only (single_word added tokens)
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

#endif

bool is_whitespace(char32_t c) {
  return (c >= 0x9 && c <= 0xd) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
         c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

}  // namespace kvpr::unicode
