#include "engine/constrain/token_constraint.h"

#include <algorithm>
#include <limits>

#include "engine/base/error.h"
#include "engine/constrain/json_lex.h"

namespace kvpr {

namespace {

using namespace json_lex;
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

JsonTokenConstraint::JsonTokenConstraint(std::shared_ptr<const Vocabulary> vocab, const JsonConstraintOptions& o)
    : vocab_(std::move(vocab)), plain_chars_(plain_chars_of(*vocab_)), r_(JsonRecognizer(o)) {}

JsonTokenConstraint::JsonTokenConstraint(std::shared_ptr<const Vocabulary> vocab, std::shared_ptr<const JsonSchema> schema,
                                         const JsonConstraintOptions& o)
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
