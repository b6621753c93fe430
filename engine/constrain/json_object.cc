#include "engine/constrain/json_object.h"

#include <algorithm>
#include <climits>
#include <limits>
#include <type_traits>

#include "engine/base/error.h"
#include "engine/constrain/json_lex.h"

namespace kvpr {

namespace {

enum Mode : uint8_t {
  kValue,      // a value is due (top level, after ':' or after ',' in an array)
  kArrFirst,   // after '[': a value or ']'
  kObjFirst,   // after '{': a key or '}'
  kObjKey,     // after ',' in an object: a key
  kColon,      // after a key
  kAfterValue, // after a value in a container: ',' or its closer
  kString,
  kNumber,
  kLiteral,
  kDone,       // the value is complete
};

constexpr std::string_view kLiterals[] = {"true", "false", "null"};

using namespace json_lex;

}  // namespace

JsonRecognizer::JsonRecognizer(const Options& o)
    : ws_(o.whitespace()),
      max_depth_(static_cast<uint8_t>(std::clamp(o.max_depth, 1, 64))),
      object_only_(o.object_only) {
  s_.mode = kValue;
}

bool JsonRecognizer::value_start(uint8_t c) {
  if (object_only_ && s_.depth == 0 && c != '{') return false;
  switch (c) {
    case '{':
    case '[':
      if (s_.depth >= max_depth_) return false;
      if (c == '{') s_.stack |= uint64_t{1} << s_.depth;
      else s_.stack &= ~(uint64_t{1} << s_.depth);
      ++s_.depth;
      s_.mode = c == '{' ? kObjFirst : kArrFirst;
      return true;
    case '"':
      s_.mode = kString;
      s_.key = 0;
      s_.sub = 0;
      s_.aux = 0;
      return true;
    case 't':
    case 'f':
    case 'n':
      s_.mode = kLiteral;
      s_.aux = c == 't' ? 0 : c == 'f' ? 1 : 2;
      s_.sub = 1;
      return true;
    default:
      if (c == '-' || is_digit(c)) {
        s_.mode = kNumber;
        s_.sub = number_start(c);
        return true;
      }
      return false;
  }
}

void JsonRecognizer::end_value() { s_.mode = s_.depth == 0 ? kDone : kAfterValue; }

bool JsonRecognizer::close(bool object) {
  const bool top_is_object = (s_.stack >> (s_.depth - 1)) & 1;
  if (s_.depth == 0 || top_is_object != object) return false;
  --s_.depth;
  s_.stack &= ~(uint64_t{1} << s_.depth);
  end_value();
  return true;
}

bool JsonRecognizer::feed(uint8_t c) {
  switch (s_.mode) {
    case kString: {
      int64_t chars = 0;
      const int r = json_lex::string_byte(s_.sub, s_.aux, chars, c);
      if (r != 2) return r == 1;
      if (s_.key) s_.mode = kColon;
      else end_value();
      s_.ws = 0;
      return true;
    }
    case kNumber: {
      const int r = json_lex::number_byte(s_.sub, c, false);
      if (r != 2) return r == 1;
      end_value();  // the number ends here; the byte belongs to what follows
      s_.ws = 0;
      return feed(c);
    }
    case kLiteral: {
      const std::string_view lit = kLiterals[s_.aux];
      if (c != static_cast<uint8_t>(lit[s_.sub])) return false;
      if (++s_.sub == lit.size()) {
        end_value();
        s_.ws = 0;
      }
      return true;
    }
    default: break;
  }
  // Between tokens of the JSON: whitespace, then what the mode allows.
  if (is_ws(c)) return ws_.take(s_.ws, c);
  s_.ws = 0;
  switch (s_.mode) {
    case kValue: return value_start(c);
    case kArrFirst: return c == ']' ? close(false) : value_start(c);
    case kObjFirst:
    case kObjKey:
      if (c == '}' && s_.mode == kObjFirst) return close(true);
      if (c != '"') return false;
      s_.mode = kString;
      s_.key = 1;
      s_.sub = 0;
      s_.aux = 0;
      return true;
    case kColon:
      if (c != ':') return false;
      s_.mode = kValue;
      return true;
    case kAfterValue: {
      const bool in_object = (s_.stack >> (s_.depth - 1)) & 1;
      if (c == ',') {
        s_.mode = in_object ? kObjKey : kValue;
        return true;
      }
      if (c == '}' || c == ']') return close(c == '}');
      return false;
    }
    default: return false;  // kDone: only whitespace
  }
}

bool JsonRecognizer::feed(std::string_view bytes) {
  for (char c : bytes)
    if (!feed(static_cast<uint8_t>(c))) return false;
  return true;
}

int64_t JsonRecognizer::plain_string_room() const {
  return s_.mode == kString && s_.sub == 0 && s_.aux == 0 ? INT64_MAX : -1;
}

bool JsonRecognizer::complete() const {
  return s_.mode == kDone || (s_.mode == kNumber && s_.depth == 0 && number_may_end(s_.sub));
}

}  // namespace kvpr
