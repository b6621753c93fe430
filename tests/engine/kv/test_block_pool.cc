// Paged KV's block pool against a model of what the blocks hold: random schedules of admission
// (prompts sharing prefixes), decoding, forks, cancellation and preemption, after every step of
// which each sequence reads its own tokens back through its block table, no block is written
// while shared, and the pool's counts equal those recomputed from the tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "engine/base/rng.h"
#include "engine/kv/block_pool.h"

using namespace kvpr;

namespace {

// What the pool's blocks hold: one token per row, as the KV rows would.
class Store {
 public:
  Store(int64_t blocks, int64_t bt) : bt_(bt), rows_(static_cast<size_t>(blocks * bt), -1) {}
  int32_t& at(BlockPool::Block b, int64_t row) { return rows_[static_cast<size_t>(b * bt_ + row)]; }
  void copy(const BlockPool::Copy& c) {
    std::copy_n(rows_.begin() + c.from * bt_, bt_, rows_.begin() + c.to * bt_);
  }

 private:
  int64_t bt_;
  std::vector<int32_t> rows_;
};

struct Model {
  BlockPool pool;
  Store store;
  std::map<BlockPool::SeqId, std::vector<int32_t>> seqs;  // each live sequence's tokens
  BlockPool::SeqId next_id = 0;

  // window > 0: the pool of a sliding-window ring, each sequence trimmed to what its next
  // query's window reads after each commit.
  Model(int64_t blocks, int64_t bt, int64_t window = 0) : pool(blocks, bt, window), store(blocks, bt) {}
  // The first token a sequence of n committed tokens still holds (its next query's window).
  int64_t first_held(int64_t n) const {
    return pool.window() > 0 ? std::max<int64_t>(0, n + 1 - pool.window()) / pool.block_tokens() * pool.block_tokens() : 0;
  }

  // Grows `seq` to `tokens`, writing the rows past what it holds, and commits the first `keep`
  // of them (a speculative step's drafts past them rejected; all by default); false if the pool
  // is short.
  bool grow(BlockPool::SeqId seq, std::vector<int32_t> tokens, size_t keep = SIZE_MAX) {
    const bool is_new = !pool.holds(seq);
    const int64_t hit = is_new ? pool.match_prefix(tokens) : 0;
    const int64_t before = is_new ? hit : pool.tokens(seq);
    std::vector<BlockPool::Copy> copies;
    if (!pool.allocate(seq, tokens, &copies)) {
      EXPECT_FALSE(is_new && pool.holds(seq));  // a refused admission leaves nothing behind
      return false;
    }
    for (const auto& c : copies) store.copy(c);
    const auto& table = pool.table(seq);
    const int64_t bt = pool.block_tokens();
    for (int64_t t = first_held(before); t < before; ++t)  // a new sequence's cached blocks its window reads
      EXPECT_EQ(store.at(table[static_cast<size_t>(t / bt)], t % bt), tokens[static_cast<size_t>(t)]);
    for (int64_t t = before; t < static_cast<int64_t>(tokens.size()); ++t) {
      const BlockPool::Block b = table[static_cast<size_t>(t / bt)];
      EXPECT_EQ(pool.ref_count(b), 1) << "a shared block is written";
      store.at(b, t % bt) = tokens[static_cast<size_t>(t)];
    }
    tokens.resize(std::min(keep, tokens.size()));
    pool.commit(seq, tokens);
    if (pool.window() > 0) pool.trim(seq, static_cast<int64_t>(tokens.size()) + 1 - pool.window());
    seqs[seq] = tokens;
    return true;
  }

  void check() {
    const int64_t bt = pool.block_tokens();
    std::map<BlockPool::Block, int32_t> refs;
    for (const auto& [id, tokens] : seqs) {
      const auto& table = pool.table(id);
      ASSERT_EQ(pool.tokens(id), static_cast<int64_t>(tokens.size()));
      ASSERT_GE(static_cast<int64_t>(table.size()), pool.blocks_for(static_cast<int64_t>(tokens.size())));
      const auto held = static_cast<size_t>(first_held(static_cast<int64_t>(tokens.size())));
      for (size_t t = held; t < tokens.size(); ++t)
        ASSERT_EQ(store.at(table[t / static_cast<size_t>(bt)], static_cast<int64_t>(t) % bt), tokens[t])
            << "sequence " << id << " reads a wrong token at " << t;
      for (size_t j = 0; j < table.size(); ++j) {
        // Blocks go back only below the window.
        if (table[j] == BlockPool::kNone) ASSERT_LT(j, held / static_cast<size_t>(bt)) << "sequence " << id;
        else ++refs[table[j]];
      }
    }
    for (const auto& [b, n] : refs) ASSERT_EQ(pool.ref_count(b), n) << "block " << b;
    ASSERT_EQ(pool.used_blocks(), static_cast<int64_t>(refs.size()));
    ASSERT_LE(pool.cached_blocks(), pool.free_blocks());
  }
};

}  // namespace

// Also as a sliding-window ring (windows of 1 to 9 tokens), whose sequences give back what their
// window has left: every sequence still reads what its next query's window reads, a new one
// takes from the cache only blocks in the window of its first computed token, and nothing below
// the window is held.
TEST(BlockPool, RandomSchedulesNeverLoseOrShareABlockWrongly) {
  for (int64_t window : {0, 1, 3, 9}) {
  int64_t hits = 0;  // prefix tokens found, over the window's runs
  for (int64_t bt : {1, 4, 16}) {
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      SCOPED_TRACE("window " + std::to_string(window) + ", block_tokens " + std::to_string(bt) + ", seed " +
                   std::to_string(seed));
      Rng rng(seed * 7919 + static_cast<uint64_t>(bt) + static_cast<uint64_t>(window) * 31);
      const int64_t blocks = 24 + static_cast<int64_t>(rng.next() % 40);
      Model m(blocks, bt, window);
      // Prompts start with one of three system prompts, so that prefixes are shared.
      std::vector<std::vector<int32_t>> systems(3);
      for (auto& s : systems)
        for (int k = 0, n = 1 + static_cast<int>(rng.next() % (3 * bt + 2)); k < n; ++k) s.push_back(static_cast<int32_t>(rng.next() % 50));
      int64_t admitted = 0, refused = 0, preempted = 0, forks = 0;
      for (int step = 0; step < 400; ++step) {
        const uint64_t op = rng.next() % 10;
        if (op < 3 || m.seqs.empty()) {  // admit
          std::vector<int32_t> prompt = systems[rng.next() % systems.size()];
          for (int k = 0, n = static_cast<int>(rng.next() % (2 * bt + 3)); k < n; ++k) prompt.push_back(static_cast<int32_t>(rng.next() % 50));
          const BlockPool::SeqId id = m.next_id++;
          const bool can = m.pool.can_admit(prompt, 0);
          const bool ok = m.grow(id, prompt);
          EXPECT_EQ(can, ok) << "can_admit and allocate disagree";
          admitted += ok;
          refused += !ok;
        } else if (op < 7) {  // decode a token; when the pool is short, preempt the newest
          auto it = std::next(m.seqs.begin(), static_cast<long>(rng.next() % m.seqs.size()));
          const BlockPool::SeqId id = it->first;
          std::vector<int32_t> tokens = it->second;
          // The token, and up to 3 drafts of which a random number is taken.
          const size_t drafts = rng.next() % 4, keep = tokens.size() + 1 + rng.next() % (drafts + 1);
          for (size_t k = 0; k <= drafts; ++k) tokens.push_back(static_cast<int32_t>(rng.next() % 50));
          while (!m.grow(id, tokens, keep)) {
            const BlockPool::SeqId newest = m.seqs.rbegin()->first;
            m.pool.release(newest);
            m.seqs.erase(newest);
            ++preempted;
            if (newest == id) break;
          }
        } else if (op < 8) {  // fork: another choice of the same prompt
          auto it = std::next(m.seqs.begin(), static_cast<long>(rng.next() % m.seqs.size()));
          const BlockPool::SeqId child = m.next_id++;
          m.pool.fork(it->first, child);
          m.seqs[child] = it->second;
          ++forks;
        } else {  // finish or cancel
          auto it = std::next(m.seqs.begin(), static_cast<long>(rng.next() % m.seqs.size()));
          m.pool.release(it->first);
          m.seqs.erase(it);
        }
        m.check();
        if (HasFatalFailure()) return;
      }
      EXPECT_GT(admitted, 20);
      EXPECT_GT(forks, 10);
      hits += m.pool.prefix_hits();
      if (window == 0) {
        EXPECT_GT(m.pool.prefix_hits(), 0);
      }
      (void)refused;
      (void)preempted;
      for (const auto& [id, tokens] : m.seqs) m.pool.release(id);
      EXPECT_EQ(m.pool.free_blocks(), blocks);  // everything comes back
    }
  }
  EXPECT_GT(hits, 0) << "window " << window;
  }
}

// Two requests with one system prompt share its full blocks; the partial block after it is
// each one's own; a finished request's blocks stay cached for the next one, least recently
// freed given up first.
TEST(BlockPool, PrefixSharingAndCaching) {
  BlockPool pool(8, 4);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const std::vector<int32_t> b = {1, 2, 3, 4, 5, 6, 7, 8, 20};
  std::vector<BlockPool::Copy> copies;
  ASSERT_TRUE(pool.allocate(0, a, &copies));
  EXPECT_EQ(pool.match_prefix(b), 0);  // nothing is shared before its K/V are written
  pool.commit(0, a);
  EXPECT_EQ(pool.used_blocks(), 3);
  EXPECT_EQ(pool.match_prefix(b), 8);  // two full blocks
  ASSERT_TRUE(pool.allocate(1, b, &copies));
  pool.commit(1, b);
  EXPECT_EQ(pool.used_blocks(), 4);
  EXPECT_EQ(pool.table(0)[0], pool.table(1)[0]);
  EXPECT_EQ(pool.table(0)[1], pool.table(1)[1]);
  EXPECT_NE(pool.table(0)[2], pool.table(1)[2]);
  EXPECT_EQ(pool.prefix_hits(), 8);
  EXPECT_TRUE(copies.empty());
  pool.release(0);
  pool.release(1);
  EXPECT_EQ(pool.free_blocks(), 8);
  EXPECT_EQ(pool.cached_blocks(), 2);  // the shared full blocks; the partial ones hold nothing reusable
  // The prompt's last token is always computed: a prompt of exactly two cached blocks reuses one.
  EXPECT_EQ(pool.match_prefix(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}), 4);
  // Fork and copy-on-write of the shared partial block.
  ASSERT_TRUE(pool.allocate(2, std::vector<int32_t>{1, 2, 3, 4, 5, 6}, &copies));
  pool.commit(2, std::vector<int32_t>{1, 2, 3, 4, 5, 6});
  pool.fork(2, 3);
  EXPECT_EQ(pool.ref_count(pool.table(2)[1]), 2);
  ASSERT_TRUE(pool.allocate(3, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 30}, &copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].from, pool.table(2)[1]);
  EXPECT_EQ(copies[0].to, pool.table(3)[1]);
  EXPECT_EQ(pool.ref_count(pool.table(2)[1]), 1);
  // A request that can never fit is told so, and nothing changes.
  std::vector<int32_t> huge(100, 7);
  EXPECT_FALSE(pool.can_admit(huge, 0));
  const int64_t used = pool.used_blocks();
  EXPECT_FALSE(pool.allocate(9, huge, &copies));
  EXPECT_EQ(pool.used_blocks(), used);
  EXPECT_FALSE(pool.holds(9));
}
