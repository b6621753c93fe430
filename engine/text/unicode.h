// Unicode for tokenizer.json's normalizers and pre-tokenizers, on utf8proc (Debian's
// libutf8proc, Unicode 15): normalization forms, general categories, the White_Space property
// and lowercasing as Hugging Face's tokenizers (Rust's char) define them. Text is valid UTF-8.
#pragma once

#include <string>
#include <string_view>

namespace kvpr::unicode {

// Whether this build has utf8proc and Oniguruma (KVPR_TEXT_LIBS): without them only the
// tokenizers kvpr knows by heart (GPT-2's, Llama-3's, Qwen2's patterns, SentencePiece's "▁") load.
bool available();

enum class Form { NFC, NFD, NFKC, NFKD };
std::string normalize(std::string_view utf8, Form form);
// Rust's char::to_lowercase for each character (full mappings without context: U+0130 becomes
// "i̇", a final sigma stays σ), as the Lowercase normalizer does.
std::string lowercase(std::string_view utf8);

// One code point's simple case mapping (UnicodeData's; ASCII only in a build without utf8proc).
char32_t to_lower(char32_t c);
char32_t to_upper(char32_t c);

bool is_whitespace(char32_t c);   // White_Space (Rust's char::is_whitespace)
bool is_numeric(char32_t c);      // Nd, Nl, No (char::is_numeric)
bool is_punctuation(char32_t c);  // ASCII punctuation or Pc, Pd, Ps, Pe, Pi, Pf, Po
bool is_mark(char32_t c);         // Mn, Mc, Me (a combining mark: StripAccents removes them)
bool is_nonspacing_mark(char32_t c);  // Mn (what BertNormalizer's strip_accents removes)
bool is_other(char32_t c);        // Cc, Cf, Cs, Co (BertNormalizer's control characters)
bool is_word(char32_t c);         // a word character (\w): letters, marks, digits, Pc

}  // namespace kvpr::unicode
