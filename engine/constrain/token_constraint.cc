#include "engine/constrain/token_constraint.h"

#include <algorithm>
#include <bit>
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

std::shared_ptr<const std::vector<int32_t>> plain_chars_of(const JsonMaskTable::Vocabulary& v) {
  auto out = std::make_shared<std::vector<int32_t>>();
  out->reserve(v.size());
  for (const auto& b : v) out->push_back(b.empty() ? -1 : plain_chars(b));
  return out;
}

constexpr size_t kFewestMasks = 8;  // kept whatever the budget

bool allows(const JsonMaskTable::Mask& m, int32_t id) { return (m[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1; }
}  // namespace

JsonMaskTable::JsonMaskTable(std::shared_ptr<const Vocabulary> vocab, const JsonConstraintOptions& o, size_t budget_bytes)
    : JsonMaskTable(vocab, plain_chars_of(*vocab), nullptr, o, budget_bytes) {}

JsonMaskTable::JsonMaskTable(std::shared_ptr<const Vocabulary> vocab, std::shared_ptr<const JsonSchema> schema,
                             const JsonConstraintOptions& o, size_t budget_bytes)
    : JsonMaskTable(vocab, plain_chars_of(*vocab), std::move(schema), o, budget_bytes) {
  KVPR_CHECK(schema_ != nullptr, "a schema's mask table needs the schema");
}

std::shared_ptr<JsonMaskTable> JsonMaskTable::sibling(std::shared_ptr<const JsonSchema> schema,
                                                      const JsonConstraintOptions& o) const {
  return std::shared_ptr<JsonMaskTable>(new JsonMaskTable(vocab_, plain_chars_, std::move(schema), o, budget_bytes_));
}

JsonMaskTable::JsonMaskTable(std::shared_ptr<const Vocabulary> vocab, std::shared_ptr<const std::vector<int32_t>> plain_chars,
                             std::shared_ptr<const JsonSchema> schema, const JsonConstraintOptions& o, size_t budget_bytes)
    : vocab_(std::move(vocab)), schema_(std::move(schema)), options_(o), plain_chars_(std::move(plain_chars)),
      budget_bytes_(budget_bytes) {}

std::shared_ptr<const JsonMaskTable::Mask> JsonMaskTable::find(const std::string& key, int32_t valid) {
  const std::string k = key + '/' + std::to_string(valid);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(k);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  ++found_;
  return it->second->mask;
}

std::shared_ptr<const JsonMaskTable::Mask> JsonMaskTable::insert(const std::string& key, int32_t valid, Mask m) {
  std::string k = key + '/' + std::to_string(valid);
  auto mask = std::make_shared<const Mask>(std::move(m));
  std::lock_guard<std::mutex> lock(mu_);
  ++computed_;
  if (auto it = index_.find(k); it != index_.end()) return it->second->mask;  // another row's, the same
  auto cost = [](const Entry& e) { return e.mask->size() * sizeof(uint64_t) + 2 * e.key.size(); };
  lru_.push_front(Entry{k, mask});
  bytes_ += cost(lru_.front());
  index_.emplace(std::move(k), lru_.begin());
  while (bytes_ > budget_bytes_ && lru_.size() > kFewestMasks) {
    bytes_ -= cost(lru_.back());
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
  return mask;
}

int64_t JsonMaskTable::computed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return computed_;
}
int64_t JsonMaskTable::found() const {
  std::lock_guard<std::mutex> lock(mu_);
  return found_;
}
size_t JsonMaskTable::kept() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

namespace {
std::variant<JsonRecognizer, SchemaRecognizer> recognizer_of(const JsonMaskTable& t) {
  if (t.schema()) return SchemaRecognizer(t.schema(), t.options().whitespace(), t.options().max_depth);
  return JsonRecognizer(t.options());
}
}  // namespace

JsonTokenConstraint::JsonTokenConstraint(std::shared_ptr<JsonMaskTable> table)
    : table_(std::move(table)), r_(recognizer_of(*table_)) {}

JsonTokenConstraint::JsonTokenConstraint(std::shared_ptr<const Vocabulary> vocab, const JsonConstraintOptions& o)
    : JsonTokenConstraint(std::make_shared<JsonMaskTable>(std::move(vocab), o)) {}

JsonTokenConstraint::JsonTokenConstraint(std::shared_ptr<const Vocabulary> vocab, std::shared_ptr<const JsonSchema> schema,
                                         const JsonConstraintOptions& o)
    : JsonTokenConstraint(std::make_shared<JsonMaskTable>(std::move(vocab), std::move(schema), o)) {}

std::shared_ptr<const JsonMaskTable::Mask> JsonTokenConstraint::allowed(int32_t valid) {
  const std::string key = std::visit([](const auto& r) { return std::string(r.key()); }, r_);
  if (auto m = table_->find(key, valid)) return m;
  JsonMaskTable::Mask m((static_cast<size_t>(valid) + 63) / 64, 0);
  auto set = [&](int32_t id) { m[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63); };
  const Vocabulary& v = table_->vocab();
  const std::vector<int32_t>& plain = table_->plain_chars();
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
      if (b.empty() || !first_ok[static_cast<uint8_t>(b[0])] || allows(m, id)) continue;
      if (room >= 0 && plain[static_cast<size_t>(id)] >= 0) {
        if (plain[static_cast<size_t>(id)] <= room) set(id);
        continue;
      }
      auto r = rec;
      if (r.feed(std::string_view(b))) set(id);
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
  return table_->insert(key, valid, std::move(m));
}

int64_t JsonTokenConstraint::mask(float* logits, int32_t valid, const std::vector<int32_t>& end_ids) {
  const std::shared_ptr<const JsonMaskTable::Mask> held = allowed(valid);
  const JsonMaskTable::Mask& m = *held;
  std::vector<std::pair<int32_t, float>> ends;  // end ids in range, with their logits
  for (int32_t e : end_ids)
    if (e >= 0 && e < valid) ends.emplace_back(e, logits[e]);
  constexpr float kOff = -std::numeric_limits<float>::infinity();
  int64_t left = 0;
  for (size_t w = 0; w < m.size(); ++w) {
    const uint64_t word = m[w];
    left += std::popcount(word);
    if (word == ~uint64_t{0}) continue;
    const int32_t base = static_cast<int32_t>(w * 64), end = std::min<int32_t>(valid, base + 64);
    if (word == 0) {  // (most words of a narrow mask: a plain fill)
      std::fill(logits + base, logits + end, kOff);
      continue;
    }
    for (int32_t id = base; id < end; ++id)
      if (!((word >> (id - base)) & 1)) logits[id] = kOff;
  }
  // An end id ends the sequence, whatever its bytes: allowed exactly when the JSON is complete.
  const bool done = complete();
  std::sort(ends.begin(), ends.end());
  ends.erase(std::unique(ends.begin(), ends.end(), [](auto& a, auto& b) { return a.first == b.first; }), ends.end());
  for (const auto& [e, logit] : ends) {
    left += (done ? 1 : 0) - (allows(m, e) ? 1 : 0);
    logits[e] = done ? logit : kOff;
  }
  return left;
}

void JsonTokenConstraint::advance(int32_t id) {
  if (id < 0 || static_cast<size_t>(id) >= table_->vocab().size()) return;
  const std::string& b = table_->vocab()[static_cast<size_t>(id)];
  if (b.empty()) return;  // an end id
  const bool ok = std::visit([&](auto& r) { return r.feed(b); }, r_);
  KVPR_CHECK(ok, "token ", id, " does not continue the JSON");
}

}  // namespace kvpr
