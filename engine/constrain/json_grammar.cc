#include "engine/constrain/json_grammar.h"

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

namespace {
// The characters of `b` when it is plain string text: no quote, backslash or control character,
// whole UTF-8 sequences only (the ranges the recognizers take); else -1.
int32_t plain_chars(const std::string& b) {
  uint8_t sub = 0, aux = 0;
  int64_t chars = 0;
  for (char ch : b) {
    const uint8_t c = static_cast<uint8_t>(ch);
    if (c == '"' || c == '\\' || string_byte(sub, aux, chars, c) != 1) return -1;
  }
  return aux == 0 ? static_cast<int32_t>(chars) : -1;
}

std::vector<int32_t> plain_chars_of(const JsonTokenConstraint::Vocabulary& v) {
  std::vector<int32_t> out;
  out.reserve(v.size());
  for (const auto& b : v) out.push_back(b.empty() ? -1 : plain_chars(b));
  return out;
}
}  // namespace

JsonTokenConstraint::JsonTokenConstraint(std::shared_ptr<const Vocabulary> vocab, const JsonGrammarOptions& o)
    : vocab_(std::move(vocab)), plain_chars_(plain_chars_of(*vocab_)), r_(JsonRecognizer(o)) {}

JsonTokenConstraint::JsonTokenConstraint(std::shared_ptr<const Vocabulary> vocab, std::shared_ptr<const JsonSchema> schema,
                                         const JsonGrammarOptions& o)
    : vocab_(std::move(vocab)),
      plain_chars_(plain_chars_of(*vocab_)),
      schema_(std::move(schema)),
      r_(SchemaRecognizer(schema_.get(), o.whitespace(), o.max_depth)) {}

const std::vector<uint8_t>& JsonTokenConstraint::allowed(int32_t valid) {
  const std::string key = std::visit([](const auto& r) { return std::string(r.key()); }, r_);
  for (const auto& [k, m] : cache_)
    if (k == key) return m;
  std::vector<uint8_t> m(static_cast<size_t>(valid), 0);
  const Vocabulary& v = *vocab_;
  const int32_t n = std::min<int32_t>(valid, static_cast<int32_t>(v.size()));
  // The ids whose bytes `rec` takes, among those not allowed yet.
  auto add_allowed = [&](const auto& rec) {
    // A token whose first byte is refused is refused: try the 256 bytes once.
    bool first_ok[256];
    for (int b = 0; b < 256; ++b) {
      auto r = rec;
      first_ok[b] = r.feed(static_cast<uint8_t>(b));
    }
    // Inside a string, a token of plain characters is decided by its length alone.
    const int64_t room = rec.plain_string_room();
    for (int32_t id = 0; id < n; ++id) {
      const std::string& b = v[static_cast<size_t>(id)];
      if (m[static_cast<size_t>(id)] || b.empty() || !first_ok[static_cast<uint8_t>(b[0])]) continue;
      if (room >= 0 && plain_chars_[static_cast<size_t>(id)] >= 0) {
        m[static_cast<size_t>(id)] = plain_chars_[static_cast<size_t>(id)] <= room;
        continue;
      }
      auto r = rec;
      m[static_cast<size_t>(id)] = r.feed(std::string_view(b));
    }
  };
  // Under a schema with several alternatives side by side, one at a time: a token is allowed
  // when one of them takes it (SchemaRecognizer::feed's rule), and each later alternative only
  // looks at the tokens the earlier ones refused, with its own first bytes and string room.
  // The mask then costs about one pass over the vocabulary per alternative that refuses most of
  // it, instead of every token copied and fed through every alternative at once.
  std::visit(
      [&](const auto& rec) {
        if constexpr (std::is_same_v<std::decay_t<decltype(rec)>, SchemaRecognizer>) {
          if (rec.alternatives() > 1) {
            for (size_t i = 0; i < rec.alternatives(); ++i) add_allowed(rec.alternative(i));
            return;
          }
        }
        add_allowed(rec);
      },
      r_);
  constexpr size_t kCacheSize = 16;
  if (cache_.size() < kCacheSize) {
    cache_.emplace_back(key, std::move(m));
    return cache_.back().second;
  }
  auto& slot = cache_[next_victim_];
  next_victim_ = (next_victim_ + 1) % kCacheSize;
  slot = {key, std::move(m)};
  return slot.second;
}

int64_t JsonTokenConstraint::mask(float* logits, int32_t valid, const std::vector<int32_t>& end_ids) {
  const std::vector<uint8_t>& m = allowed(valid);
  std::vector<std::pair<int32_t, float>> ends;  // end ids in range, with their logits
  for (int32_t e : end_ids)
    if (e >= 0 && e < valid) ends.emplace_back(e, logits[e]);
  constexpr float kOff = -std::numeric_limits<float>::infinity();
  int64_t left = 0;
  for (int32_t id = 0; id < valid; ++id) {
    if (m[static_cast<size_t>(id)]) ++left;
    else logits[id] = kOff;
  }
  // An end id ends the sequence, whatever its bytes: allowed exactly when the JSON is complete.
  const bool done = complete();
  std::sort(ends.begin(), ends.end());
  ends.erase(std::unique(ends.begin(), ends.end(), [](auto& a, auto& b) { return a.first == b.first; }), ends.end());
  for (const auto& [e, logit] : ends) {
    left += (done ? 1 : 0) - (m[static_cast<size_t>(e)] ? 1 : 0);
    logits[e] = done ? logit : kOff;
  }
  return left;
}

void JsonTokenConstraint::advance(int32_t id) {
  if (id < 0 || static_cast<size_t>(id) >= vocab_->size()) return;
  const std::string& b = (*vocab_)[static_cast<size_t>(id)];
  if (b.empty()) return;  // an end id
  const bool ok = std::visit([&](auto& r) { return r.feed(b); }, r_);
  KVPR_CHECK(ok, "token ", id, " does not continue the JSON");
}

}  // namespace kvpr
