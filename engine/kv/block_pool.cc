#include "engine/kv/block_pool.h"

#include <algorithm>

#include "engine/base/error.h"

namespace kvpr {

BlockPool::BlockPool(int64_t blocks, int64_t block_tokens, int64_t window)
    : block_tokens_(block_tokens),
      window_(window),
      ref_(static_cast<size_t>(blocks), 0),
      hash_of_(static_cast<size_t>(blocks)),
      content_(static_cast<size_t>(blocks * block_tokens)),
      cached_at_(static_cast<size_t>(blocks)) {
  KVPR_CHECK(blocks > 0 && blocks < (int64_t{1} << 31), "a KV block pool needs 1 to 2^31 - 1 blocks, not ", blocks);
  KVPR_CHECK(block_tokens > 0, "KV blocks need at least one token, not ", block_tokens);
  KVPR_CHECK(window >= 0, "a KV block pool's window must not be negative, not ", window);
  for (Block b = 0; b < static_cast<Block>(blocks); ++b) empty_.insert(empty_.end(), b);
}

uint64_t BlockPool::block_hash(uint64_t parent, std::span<const int32_t> tokens) const {
  // splitmix64 steps over the parent's hash and each token: a full block's identity is its
  // tokens and everything before them.
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  uint64_t h = mix(parent);
  for (int32_t t : tokens) h = mix(h ^ static_cast<uint32_t>(t));
  return h;
}

BlockPool::Block BlockPool::cached(uint64_t hash, std::span<const int32_t> part) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return kNone;
  // The hash names the block; its kept tokens confirm it (a collision never shares KV).
  const auto kept = std::span<const int32_t>(content_).subspan(static_cast<size_t>(it->second) * part.size(), part.size());
  return std::equal(part.begin(), part.end(), kept.begin()) ? it->second : kNone;
}

int64_t BlockPool::match_blocks(std::span<const int32_t> tokens, uint64_t salt, int64_t limit) const {
  if (tokens.empty()) return 0;
  const size_t bt = static_cast<size_t>(block_tokens_);
  const int64_t full = std::min<int64_t>(limit, static_cast<int64_t>((tokens.size() - 1) / bt));
  // Each full block's cached block (kNone where the cache lacks it), along the hash chain.
  std::vector<Block> at;
  uint64_t parent = salt;
  for (int64_t i = 0; i < full; ++i) {
    const auto part = tokens.subspan(static_cast<size_t>(i) * bt, bt);
    parent = block_hash(parent, part);
    at.push_back(cached(parent, part));
    if (window_ == 0 && at.back() == kNone) return i;  // every block up to the match is read
  }
  if (window_ == 0) return full;
  // The most blocks whose last ones, those the window of the token after them reads, are all
  // cached.
  for (int64_t k = full; k > 0; --k) {
    bool all = true;
    for (int64_t j = first_block_read(k * block_tokens_); j < k && all; ++j) all = at[static_cast<size_t>(j)] != kNone;
    if (all) return k;
  }
  return 0;
}

std::vector<BlockPool::Block> BlockPool::cached_prefix(std::span<const int32_t> tokens, uint64_t salt,
                                                       int64_t hits) const {
  const size_t bt = static_cast<size_t>(block_tokens_);
  std::vector<Block> out;
  uint64_t parent = salt;
  const int64_t first = first_block_read(hits * block_tokens_);
  KVPR_CHECK(hits * block_tokens_ <= static_cast<int64_t>(tokens.size()), "KV blocks: ", hits, " cached blocks of ",
             tokens.size(), " tokens");
  for (int64_t i = 0; i < hits; ++i) {
    const auto part = tokens.subspan(static_cast<size_t>(i) * bt, bt);
    parent = block_hash(parent, part);
    out.push_back(i < first ? kNone : cached(parent, part));
    KVPR_CHECK(i < first || out.back() != kNone, "KV blocks: ", hits, " cached blocks asked for, block ", i, " is not");
  }
  return out;
}

std::optional<BlockPool::Block> BlockPool::take_idle() {
  Block b;
  if (!empty_.empty()) {
    b = *empty_.begin();
    empty_.erase(empty_.begin());
  } else if (!cached_.empty()) {
    b = cached_.front();
    cached_.pop_front();
    auto& h = hash_of_[static_cast<size_t>(b)];  // its content is given up: no longer found by its hash
    by_hash_.erase(*h);
    h.reset();
  } else {
    return std::nullopt;
  }
  ref_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockPool::hold(Block b) {
  auto& r = ref_[static_cast<size_t>(b)];
  if (r == 0) {
    if (hash_of_[static_cast<size_t>(b)]) cached_.erase(cached_at_[static_cast<size_t>(b)]);
    else empty_.erase(b);
  }
  ++r;
}

void BlockPool::drop(Block b) {
  auto& r = ref_[static_cast<size_t>(b)];
  KVPR_CHECK(r > 0, "KV block ", b, " released more often than held");
  if (--r > 0) return;
  // A block with content worth keeping waits at the back of the cached ones; one without
  // (partial, or a duplicate of a cached block) is empty again.
  if (hash_of_[static_cast<size_t>(b)]) cached_at_[static_cast<size_t>(b)] = cached_.insert(cached_.end(), b);
  else empty_.insert(b);
}

void BlockPool::seal(Seq& s, std::span<const int32_t> tokens) {
  const size_t bt = static_cast<size_t>(block_tokens_);
  while ((s.hashes.size() + 1) * bt <= static_cast<size_t>(s.tokens)) {
    const size_t i = s.hashes.size();
    const auto part = tokens.subspan(i * bt, bt);
    const uint64_t h = block_hash(i == 0 ? s.salt : s.hashes.back(), part);
    s.hashes.push_back(h);
    const Block b = s.table[i];
    auto& bh = hash_of_[static_cast<size_t>(b)];
    if (bh || by_hash_.count(h)) continue;  // already known (shared), or the same content cached elsewhere
    bh = h;
    by_hash_[h] = b;
    std::copy(part.begin(), part.end(), content_.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(b) * bt));
  }
}

bool BlockPool::can_admit(std::span<const int32_t> tokens, int64_t reserve, int64_t hits, uint64_t salt) const {
  if (hits < 0) hits = match_blocks(tokens, salt);
  const std::vector<Block> hit = cached_prefix(tokens, salt, hits);
  const int64_t idle_hit =
      std::count_if(hit.begin(), hit.end(), [&](Block b) { return b != kNone && ref_[static_cast<size_t>(b)] == 0; });
  const int64_t fresh = blocks_for(static_cast<int64_t>(tokens.size())) - static_cast<int64_t>(hit.size());
  return free_blocks() - idle_hit - fresh >= reserve;
}

bool BlockPool::allocate(SeqId seq, std::span<const int32_t> tokens, std::vector<Copy>* copies, int64_t hits,
                         uint64_t salt) {
  if (holds(seq)) return extend(seq, static_cast<int64_t>(tokens.size()), copies);
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (hits < 0) hits = match_blocks(tokens, salt);
  const std::vector<Block> hit = cached_prefix(tokens, salt, hits);
  const int64_t idle_hit =
      std::count_if(hit.begin(), hit.end(), [&](Block b) { return b != kNone && ref_[static_cast<size_t>(b)] == 0; });
  const int64_t fresh = std::max<int64_t>(0, blocks_for(n) - static_cast<int64_t>(hit.size()));
  if (free_blocks() - idle_hit < fresh) return false;
  Seq& q = seqs_[seq];
  q.salt = salt;
  uint64_t parent = salt;
  for (size_t i = 0; i < hit.size(); ++i) {  // (the chain of hashes through blocks below the window too)
    parent = block_hash(parent, tokens.subspan(i * static_cast<size_t>(block_tokens_), static_cast<size_t>(block_tokens_)));
    if (hit[i] != kNone) hold(hit[i]);
    q.table.push_back(hit[i]);
    q.hashes.push_back(parent);
  }
  q.tokens = static_cast<int64_t>(hit.size()) * block_tokens_;  // committed as they are
  prefix_queries_ += n;
  prefix_hits_ += q.tokens;
  while (static_cast<int64_t>(q.table.size()) < blocks_for(n)) q.table.push_back(*take_idle());
  return true;
}

bool BlockPool::extend(SeqId seq, int64_t n, std::vector<Copy>* copies) {
  auto it = seqs_.find(seq);
  KVPR_CHECK(it != seqs_.end(), "sequence ", seq, " holds no KV blocks to extend");
  Seq& q = it->second;
  KVPR_CHECK(n >= q.tokens, "sequence ", seq, " holds ", q.tokens, " tokens; it cannot shrink to ", n);
  // A partial block others hold too (a fork's) is copied before this sequence writes into it.
  const size_t partial = static_cast<size_t>(q.tokens / block_tokens_);
  const bool cow = n > q.tokens && q.tokens % block_tokens_ != 0 && ref_[static_cast<size_t>(q.table[partial])] > 1;
  const int64_t fresh = std::max<int64_t>(0, blocks_for(n) - static_cast<int64_t>(q.table.size())) + (cow ? 1 : 0);
  if (free_blocks() < fresh) return false;
  if (cow) {
    const Block from = q.table[partial], to = *take_idle();
    copies->push_back({from, to});
    drop(from);
    q.table[partial] = to;
  }
  while (static_cast<int64_t>(q.table.size()) < blocks_for(n)) q.table.push_back(*take_idle());
  return true;
}

void BlockPool::commit(SeqId seq, std::span<const int32_t> tokens) {
  auto it = seqs_.find(seq);
  KVPR_CHECK(it != seqs_.end(), "sequence ", seq, " holds no KV blocks to commit");
  Seq& q = it->second;
  const int64_t n = static_cast<int64_t>(tokens.size());
  KVPR_CHECK(n >= static_cast<int64_t>(q.hashes.size()) * block_tokens_ && blocks_for(n) <= static_cast<int64_t>(q.table.size()),
             "sequence ", seq, " commits ", n, " tokens in ", q.table.size(), " blocks, ", q.hashes.size(), " of them full");
  q.tokens = n;
  seal(q, tokens);
}

void BlockPool::fork(SeqId parent, SeqId child) {
  auto it = seqs_.find(parent);
  KVPR_CHECK(it != seqs_.end(), "sequence ", parent, " holds no KV blocks to fork");
  KVPR_CHECK(!seqs_.count(child), "sequence ", child, " already holds KV blocks");
  Seq copy = it->second;
  copy.table.resize(static_cast<size_t>(blocks_for(copy.tokens)));  // not the parent's blocks past its tokens
  for (Block b : copy.table)
    if (b != kNone) hold(b);
  seqs_.emplace(child, std::move(copy));
}

void BlockPool::release(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  // Last block first: a sequence's tail is given up before its prefix.
  for (auto b = it->second.table.rbegin(); b != it->second.table.rend(); ++b)
    if (*b != kNone) drop(*b);
  seqs_.erase(it);
}

void BlockPool::trim(SeqId seq, int64_t first) {
  auto it = seqs_.find(seq);
  KVPR_CHECK(it != seqs_.end(), "sequence ", seq, " holds no KV blocks to trim");
  KVPR_CHECK(window_ > 0, "KV blocks: only a pool with a window gives blocks back as a sequence grows");
  Seq& q = it->second;
  // Only committed full blocks (sealed: their content known, found again by their hash).
  const size_t below = std::min(q.hashes.size(), static_cast<size_t>(std::max<int64_t>(0, first) / block_tokens_));
  for (size_t i = 0; i < below; ++i)
    if (q.table[i] != kNone) {
      drop(q.table[i]);
      q.table[i] = kNone;
    }
}

const std::vector<BlockPool::Block>& BlockPool::table(SeqId seq) const {
  auto it = seqs_.find(seq);
  KVPR_CHECK(it != seqs_.end(), "sequence ", seq, " holds no KV blocks");
  return it->second.table;
}

int64_t BlockPool::tokens(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.tokens;
}

}  // namespace kvpr
