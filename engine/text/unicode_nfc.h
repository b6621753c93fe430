// Unicode Normalization Form C (UAX #15): canonical decomposition, canonical ordering of
// combining marks, canonical composition. What a tokenizer.json "NFC" normalizer does (Qwen2's)
// before the text is split and merged.
#pragma once

#include <string>
#include <string_view>

namespace kvpr {

// The NFC form of UTF-8 text. Bytes that are not valid UTF-8 are kept as they are and block
// composition across them. Text whose code points all lie below U+0300 is already NFC and
// comes back unchanged without decoding.
std::string to_nfc(std::string_view utf8);

// Whether to_nfc(utf8) == utf8 can be told without decoding (no byte of a code point at or
// above U+0300).
bool nfc_quick_yes(std::string_view utf8);

}  // namespace kvpr
