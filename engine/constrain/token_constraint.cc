#include "engine/constrain/token_constraint.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "engine/base/error.h"
#include "engine/constrain/json_lex.h"

namespace kvpr {

namespace {

using namespace json_lex;
// The characters `b` begins when it is string-local (VocabularyIndex), else -1.
int32_t local_chars_of(const std::string& b) {
  uint8_t sub = 0, aux = 0;
  int64_t chars = 0, begun = 0;
  for (char ch : b) {
    const uint8_t c = static_cast<uint8_t>(ch);
    if (c == '"' || c == '\\' || string_byte(sub, aux, chars, c) != 1) return -1;
    if (c < 0x80 || c >= 0xC0) ++begun;  // an ASCII character or a UTF-8 lead
  }
  return static_cast<int32_t>(begun);
}

void build_trie(const std::vector<std::string>& vocab, const std::vector<int32_t>& ids_by_bytes,
                VocabularyIndex::Trie& t) {
  t = {};
  t.byte.push_back(0);
  t.depth.push_back(0);
  t.end.push_back(0);
  std::vector<std::vector<int32_t>> at(1);  // ids ending at each node
  std::vector<int32_t> path{0};             // path[d]: the open node at depth d
  const std::string* prev = nullptr;
  for (int32_t id : ids_by_bytes) {
    const std::string& b = vocab[static_cast<size_t>(id)];
    size_t common = 0;
    if (prev)
      while (common < prev->size() && common < b.size() && (*prev)[common] == b[common]) ++common;
    for (size_t d = path.size() - 1; d > common; --d) t.end[static_cast<size_t>(path[d])] = static_cast<int32_t>(t.byte.size());
    path.resize(common + 1);
    for (size_t d = common; d < b.size(); ++d) {
      path.push_back(static_cast<int32_t>(t.byte.size()));
      t.byte.push_back(static_cast<uint8_t>(b[d]));
      t.depth.push_back(static_cast<uint16_t>(d + 1));
      t.end.push_back(0);
      at.emplace_back();
    }
    at[static_cast<size_t>(path.back())].push_back(id);
    t.max_depth = std::max<int>(t.max_depth, static_cast<int>(b.size()));
    prev = &b;
  }
  for (size_t d = path.size() - 1; d > 0; --d) t.end[static_cast<size_t>(path[d])] = static_cast<int32_t>(t.byte.size());
  t.end[0] = static_cast<int32_t>(t.byte.size());
  for (const auto& ids : at) {
    t.first.push_back(static_cast<int32_t>(t.ids.size()));
    t.ids.insert(t.ids.end(), ids.begin(), ids.end());
  }
  t.first.push_back(static_cast<int32_t>(t.ids.size()));
}

constexpr size_t kFewestMasks = 8;  // kept whatever the budget

bool allows(const JsonMaskTable::Mask& m, int32_t id) { return (m[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1; }
void set(JsonMaskTable::Mask& m, int32_t id) { m[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63); }

// Sets in `m` the ids below n whose bytes `root` takes: the trie depth first, one recognizer per
// depth (each a copy of its parent's fed the node's byte), a refused byte's subtree skipped.
template <class Rec>
void walk(const VocabularyIndex::Trie& t, const Rec& root, int32_t n, JsonMaskTable::Mask& m) {
  std::vector<Rec> at;  // at[d]: after the bytes of the current node's ancestors at depth d
  at.reserve(static_cast<size_t>(t.max_depth) + 1);
  at.push_back(root);
  const int32_t nodes = static_cast<int32_t>(t.nodes());
  for (int32_t i = 1; i < nodes;) {
    const size_t d = t.depth[static_cast<size_t>(i)];
    if (d < at.size()) at[d] = at[d - 1];
    else at.push_back(at[d - 1]);
    if (!at[d].feed(t.byte[static_cast<size_t>(i)])) {
      i = t.end[static_cast<size_t>(i)];
      continue;
    }
    for (int32_t k = t.first[static_cast<size_t>(i)]; k < t.first[static_cast<size_t>(i) + 1]; ++k)
      if (const int32_t id = t.ids[static_cast<size_t>(k)]; id < n) set(m, id);
    ++i;
  }
}
}  // namespace

VocabularyIndex::VocabularyIndex(const std::vector<std::string>& vocab) {
  const int32_t n = static_cast<int32_t>(vocab.size());
  local_chars.resize(vocab.size(), -1);
  std::vector<int32_t> with_bytes, local_ids, other;
  for (int32_t id = 0; id < n; ++id) {
    const std::string& b = vocab[static_cast<size_t>(id)];
    if (b.empty()) continue;
    if (b.size() >= 65535) {  // (a trie's depth is 16 bits)
      huge.push_back(id);
      continue;
    }
    with_bytes.push_back(id);
    local_chars[static_cast<size_t>(id)] = local_chars_of(b);
  }
  std::sort(with_bytes.begin(), with_bytes.end(), [&](int32_t a, int32_t b) {
    const std::string &x = vocab[static_cast<size_t>(a)], &y = vocab[static_cast<size_t>(b)];
    return x != y ? x < y : a < b;
  });
  for (int32_t id : with_bytes) (local_chars[static_cast<size_t>(id)] < 0 ? other : local_ids).push_back(id);
  build_trie(vocab, with_bytes, all);
  build_trie(vocab, local_ids, local);
  build_trie(vocab, other, nonlocal);
  const size_t words = (vocab.size() + 63) / 64;
  fits.assign(kFitsMax + 1, Mask(words, 0));
  for (int32_t id = 0; id < n; ++id) {
    const int32_t c = local_chars[static_cast<size_t>(id)];
    if (c < 0) continue;
    if (c > kFitsMax) {
      longer.emplace_back(c, id);
      continue;
    }
    for (int k = c; k <= kFitsMax; ++k) fits[static_cast<size_t>(k)][static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
  }
  std::sort(longer.begin(), longer.end());
}

JsonMaskTable::JsonMaskTable(std::shared_ptr<const Vocabulary> vocab, const JsonConstraintOptions& o, size_t budget_bytes)
    : JsonMaskTable(vocab, std::make_shared<const VocabularyIndex>(*vocab), nullptr, o, budget_bytes) {}

JsonMaskTable::JsonMaskTable(std::shared_ptr<const Vocabulary> vocab, std::shared_ptr<const JsonSchema> schema,
                             const JsonConstraintOptions& o, size_t budget_bytes)
    : JsonMaskTable(vocab, std::make_shared<const VocabularyIndex>(*vocab), std::move(schema), o, budget_bytes) {
  KVPR_CHECK(schema_ != nullptr, "a schema's mask table needs the schema");
}

std::shared_ptr<JsonMaskTable> JsonMaskTable::sibling(std::shared_ptr<const JsonSchema> schema,
                                                      const JsonConstraintOptions& o) const {
  return std::shared_ptr<JsonMaskTable>(new JsonMaskTable(vocab_, vocab_index_, std::move(schema), o, budget_bytes_));
}

JsonMaskTable::JsonMaskTable(std::shared_ptr<const Vocabulary> vocab, std::shared_ptr<const VocabularyIndex> index,
                             std::shared_ptr<const JsonSchema> schema, const JsonConstraintOptions& o, size_t budget_bytes)
    : vocab_(std::move(vocab)), schema_(std::move(schema)), options_(o), vocab_index_(std::move(index)),
      budget_bytes_(budget_bytes) {}

namespace {
std::string table_key(const std::string& key, int32_t valid, bool string_alone) {
  return (string_alone ? "A" : "S") + key + '/' + std::to_string(valid);
}
}  // namespace

std::shared_ptr<const JsonMaskTable::Mask> JsonMaskTable::find(const std::string& key, int32_t valid, bool string_alone) {
  const std::string k = table_key(key, valid, string_alone);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(k);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  ++found_;
  return it->second->mask;
}

std::shared_ptr<const JsonMaskTable::Mask> JsonMaskTable::insert(const std::string& key, int32_t valid, Mask m,
                                                                bool string_alone) {
  std::string k = table_key(key, valid, string_alone);
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
  const VocabularyIndex& index = table_->index();
  const int32_t n = std::min<int32_t>(valid, static_cast<int32_t>(table_->vocab().size()));
  // The ids in [0, n) whose bytes `rec` takes.
  auto add_allowed = [&](const auto& rec) {
    const VocabularyIndex::Trie* trie = &index.all;
    // Inside a string, a string-local token is decided by the characters it begins alone.
    if (const int64_t room = rec.plain_string_room(); room >= 0) {
      const auto& fit = index.fits[static_cast<size_t>(std::min<int64_t>(room, VocabularyIndex::kFitsMax))];
      for (size_t w = 0; w < std::min(m.size(), fit.size()); ++w) m[w] |= fit[w];
      for (const auto& [chars, id] : index.longer) {
        if (chars > room) break;
        if (id < n) set(m, id);
      }
      trie = &index.nonlocal;
    }
    if constexpr (std::is_same_v<std::decay_t<decltype(rec)>, SchemaRecognizer>) {
      // Inside a pattern's string: its string-local tokens' mask is the string's own, kept once
      // for every context the string meets.
      if (trie == &index.all)
        if (const std::optional<SchemaRecognizer> alone = rec.string_alone()) {
          const std::string k = alone->key();
          std::shared_ptr<const JsonMaskTable::Mask> own = table_->find(k, valid, true);
          if (!own) {
            JsonMaskTable::Mask lm(m.size(), 0);
            walk(index.local, *alone, n, lm);
            own = table_->insert(k, valid, std::move(lm), true);
          }
          for (size_t w = 0; w < m.size(); ++w) m[w] |= (*own)[w];
          trie = &index.nonlocal;
        }
    }
    walk(*trie, rec, n, m);
    for (int32_t id : index.huge)
      if (id < n) {
        auto r = rec;
        if (r.feed(std::string_view(table_->vocab()[static_cast<size_t>(id)]))) set(m, id);
      }
  };
  // Under a schema with several alternatives side by side, one at a time: a token is allowed
  // when one of them takes it (SchemaRecognizer::feed's rule).
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
  // (the fits sets cover the whole vocabulary: the ids past `valid` are cleared)
  if (valid % 64 != 0 && !m.empty()) m.back() &= (uint64_t{1} << (valid % 64)) - 1;
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
