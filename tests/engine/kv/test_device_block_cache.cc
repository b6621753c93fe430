// kv mode auto's device tier against a model of what the host and device blocks hold: random
// schedules (prefills in chunks, decoding, sequences sharing a prefix's blocks, sequences ending
// and their blocks reused, blocks below which nothing may be promoted) at several device
// budgets. After every step each sequence's reads (the staged head from the host, the tail from
// the device through the placement's table) give its own tokens, and every mirror's valid rows
// equal the host block's.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "engine/kv/device_block_cache.h"

using namespace kvpr;

namespace {

struct Live {
  std::vector<int32_t> table;  // host blocks
  std::vector<int32_t> tokens;  // every token it will have; the first `past` are in the KV
  int64_t past = 0;
};

struct World {
  int64_t B, host_blocks;
  DeviceBlockCache cache;
  std::vector<std::vector<int32_t>> host, dev;  // rows of each block (-1: never written)
  std::vector<int32_t> host_refs;
  std::vector<int32_t> free_host;
  std::map<int, Live> live;
  int next_id = 0;
  int32_t next_token = 1;
  std::mt19937 rng;

  World(int64_t device_blocks, int64_t host_blocks_, int64_t bt, unsigned seed)
      : B(bt),
        host_blocks(host_blocks_),
        cache(device_blocks, host_blocks_, bt),
        host(static_cast<size_t>(host_blocks_), std::vector<int32_t>(static_cast<size_t>(bt), -1)),
        dev(static_cast<size_t>(device_blocks), std::vector<int32_t>(static_cast<size_t>(bt), -1)),
        host_refs(static_cast<size_t>(host_blocks_), 0),
        rng(seed) {
    for (int32_t h = static_cast<int32_t>(host_blocks_) - 1; h >= 0; --h) free_host.push_back(h);
  }
  int64_t rnd(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }
  int64_t blocks_for(int64_t n) const { return (n + B - 1) / B; }

  bool grow(Live& s, int64_t tokens) {
    while (static_cast<int64_t>(s.table.size()) < blocks_for(tokens)) {
      if (free_host.empty()) return false;
      s.table.push_back(free_host.back());
      free_host.pop_back();
      ++host_refs[static_cast<size_t>(s.table.back())];
    }
    return true;
  }
  void end(int id) {
    for (int32_t h : live[id].table)
      if (--host_refs[static_cast<size_t>(h)] == 0) free_host.push_back(h);
    live.erase(id);
  }
  void admit() {
    Live s;
    const int64_t len = rnd(1, 6 * B);
    // Half the time, share the full blocks of a live sequence's first tokens (a prefix hit).
    if (!live.empty() && rnd(0, 1)) {
      auto it = live.begin();
      std::advance(it, rnd(0, static_cast<int64_t>(live.size()) - 1));
      const int64_t full = std::min<int64_t>(it->second.past / B, rnd(0, 3));
      for (int64_t j = 0; j < full; ++j) {
        s.table.push_back(it->second.table[static_cast<size_t>(j)]);
        ++host_refs[static_cast<size_t>(s.table.back())];
      }
      s.tokens.assign(it->second.tokens.begin(), it->second.tokens.begin() + full * B);
      s.past = full * B;
    }
    while (static_cast<int64_t>(s.tokens.size()) < s.past + len + 40) s.tokens.push_back(next_token++);
    live[next_id++] = std::move(s);
  }

  // One step: every live sequence takes a chunk; then the runtime's reads and writes.
  void step() {
    std::vector<int> ids;
    std::vector<DeviceBlockCache::Seq> seqs;
    for (auto& [id, s] : live) {
      int64_t q = s.past == 0 || rnd(0, 3) == 0 ? rnd(1, 3 * B) : 1;
      q = std::min<int64_t>(q, static_cast<int64_t>(s.tokens.size()) - s.past);
      if (q <= 0 || !grow(s, s.past + q)) continue;
      ids.push_back(id);
      // A third of the time some of its blocks are not staged for every layer (a ring's sliding
      // layers below their window): nothing there may be promoted.
      const int64_t first_promotable = rnd(0, 2) == 0 ? rnd(0, blocks_for(s.past)) : 0;
      seqs.push_back({s.table, s.past, q, first_promotable});
    }
    std::vector<DeviceBlockCache::Placement> place;
    std::vector<DeviceBlockCache::Promotion> promos;
    cache.plan(seqs, &place, &promos);
    ASSERT_EQ(place.size(), seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      const Live& s = live[ids[i]];
      const auto& p = place[i];
      const int64_t n = seqs[i].past + seqs[i].q_len;
      ASSERT_GE(p.head, 0);
      ASSERT_LE(p.head, n);
      ASSERT_TRUE(p.head == n || p.head % B == 0) << "the head is whole blocks";
      // Reads: the head staged from the host, the rest from the device.
      for (int64_t t = 0; t < seqs[i].past; ++t) {
        const size_t j = static_cast<size_t>(t / B), r = static_cast<size_t>(t % B);
        const int32_t got = t < p.head ? host[static_cast<size_t>(s.table[j])][r] : dev[static_cast<size_t>(p.table[j])][r];
        ASSERT_EQ(got, s.tokens[static_cast<size_t>(t)]) << "token " << t << " of " << n << ", head " << p.head;
      }
      if (p.head < n) {  // then whole blocks: the rest are all on the device
        for (int64_t j = p.head / B; j < blocks_for(n); ++j) ASSERT_GE(p.table[static_cast<size_t>(j)], 0);
      }
    }
    // Writes: the new tokens to the host, and where resident to the device too.
    for (size_t i = 0; i < seqs.size(); ++i) {
      Live& s = live[ids[i]];
      for (int64_t t = seqs[i].past; t < seqs[i].past + seqs[i].q_len; ++t) {
        const size_t j = static_cast<size_t>(t / B), r = static_cast<size_t>(t % B);
        host[static_cast<size_t>(s.table[j])][r] = s.tokens[static_cast<size_t>(t)];
        if (t >= place[i].head) dev[static_cast<size_t>(place[i].table[j])][r] = s.tokens[static_cast<size_t>(t)];
      }
    }
    // Promotions: from the staged rows (the sequence's own tokens).
    for (const auto& pr : promos) {
      const Live& s = live[ids[pr.seq]];
      ASSERT_LT(pr.index * B, place[pr.seq].head) << "promoted from a staged block";
      ASSERT_GE(pr.index, seqs[pr.seq].first_promotable) << "promoted from a block some layers do not stage";
      for (int64_t r = 0; r < pr.rows; ++r)
        dev[static_cast<size_t>(pr.device)][static_cast<size_t>(r)] = s.tokens[static_cast<size_t>(pr.index * B + r)];
    }
    for (size_t i = 0; i < seqs.size(); ++i) live[ids[i]].past += seqs[i].q_len;
    check_mirrors();
  }

  void check_mirrors() {
    int64_t mirrored = 0;
    std::vector<int> seen(dev.size(), 0);
    for (int32_t h = 0; h < host_blocks; ++h) {
      const int32_t d = cache.mirror(h);
      if (d < 0) continue;
      ++mirrored;
      ASSERT_EQ(seen[static_cast<size_t>(d)]++, 0) << "device block " << d << " mirrors two host blocks";
      const int64_t v = cache.valid_rows(d);
      ASSERT_LE(v, B);
      for (int64_t r = 0; r < v; ++r)
        ASSERT_EQ(dev[static_cast<size_t>(d)][static_cast<size_t>(r)], host[static_cast<size_t>(h)][static_cast<size_t>(r)])
            << "host block " << h << " row " << r << " of " << v << " valid";
    }
    ASSERT_EQ(mirrored, cache.mirrored());
  }
};

}  // namespace

TEST(DeviceBlockCache, RandomSchedulesReadTheirOwnTokens) {
  for (int64_t bt : {1, 4, 16})
    for (int64_t device_blocks : {0, 3, 20, 200}) {
      World w(device_blocks, 120, bt, static_cast<unsigned>(bt * 1000 + device_blocks));
      int64_t resident = 0;
      for (int it = 0; it < 300; ++it) {
        if (w.live.size() < 6 && w.rnd(0, 2) == 0) w.admit();
        if (!w.live.empty() && w.rnd(0, 9) == 0) {
          auto victim = w.live.begin();
          std::advance(victim, w.rnd(0, static_cast<int64_t>(w.live.size()) - 1));
          w.end(victim->first);
        }
        ASSERT_NO_FATAL_FAILURE(w.step()) << "B " << bt << ", " << device_blocks << " device blocks, step " << it;
        for (auto& [id, s] : w.live)
          if (s.past + 1 >= static_cast<int64_t>(s.tokens.size())) {
            w.end(id);
            break;
          }
        resident += w.cache.mirrored();
      }
      if (device_blocks == 0) EXPECT_EQ(resident, 0);
      else EXPECT_GT(resident, 0) << "the device tier is used";
    }
}

TEST(DeviceBlockCache, EnoughBlocksMakeEverySequenceResidentNoneMakeItStaged) {
  const int64_t B = 4;
  std::vector<int32_t> a{0, 1, 2}, b{3, 4};
  for (int64_t device_blocks : {0, 5}) {
    DeviceBlockCache cache(device_blocks, 8, B);
    std::vector<DeviceBlockCache::Placement> place;
    std::vector<DeviceBlockCache::Promotion> promos;
    // Prefill 9 and 5 tokens, then decode.
    std::vector<DeviceBlockCache::Seq> seqs{{a, 0, 9}, {b, 0, 5}};
    for (int step = 0; step < 3; ++step) {
      cache.plan(seqs, &place, &promos);
      EXPECT_TRUE(promos.empty());
      for (size_t i = 0; i < seqs.size(); ++i)
        EXPECT_EQ(place[i].head, device_blocks ? 0 : seqs[i].past + seqs[i].q_len) << "step " << step;
      for (auto& s : seqs) {
        s.past += s.q_len;
        s.q_len = 1;
      }
    }
  }
}

TEST(DeviceBlockCache, ATailSlidesWhenFullAndFreedBlocksArePromotedFromTheHead) {
  const int64_t B = 2;
  std::vector<int32_t> a{0, 1, 2, 3, 4}, b{5, 6, 7};
  DeviceBlockCache cache(3, 8, B);
  std::vector<DeviceBlockCache::Placement> place;
  std::vector<DeviceBlockCache::Promotion> promos;
  // a prefills 6 tokens (blocks 0-2, all three device blocks), b 3 tokens (none left: staged).
  std::vector<DeviceBlockCache::Seq> seqs{{a, 0, 6}, {b, 0, 3}};
  cache.plan(seqs, &place, &promos);
  EXPECT_EQ(place[0].head, 0);
  EXPECT_EQ(place[1].head, 3);
  // a's token 6 starts block 3: its oldest resident block (0) slides to it.
  seqs = {{a, 6, 1}, {b, 3, 1}};
  cache.plan(seqs, &place, &promos);
  EXPECT_EQ(place[0].head, 2);
  EXPECT_EQ(cache.mirror(0), -1);
  EXPECT_GE(cache.mirror(3), 0);
  EXPECT_EQ(place[1].head, 4);
  EXPECT_TRUE(promos.empty());
  // a ends: its blocks' mirrors are unread, least recently used first; b's new block takes one,
  // its two staged blocks the others (promoted from the rows the step stages).
  seqs = {{b, 4, 1}};
  cache.plan(seqs, &place, &promos);
  EXPECT_EQ(place[0].head, 4) << "b's new block takes an unread mirror of a's; its staged blocks are promoted";
  ASSERT_EQ(promos.size(), 2u);
  EXPECT_EQ(promos[0].index, 1);
  EXPECT_EQ(promos[0].rows, 2);
  EXPECT_EQ(promos[1].index, 0);
  seqs = {{b, 5, 1}};
  cache.plan(seqs, &place, &promos);
  EXPECT_EQ(place[0].head, 0) << "promoted blocks are read in place the next step";
}

// A block shared with another sequence (a prefix hit) never pins a tail: the sequence holding
// it slides past it; once no sequence reads the shared mirror, it is the first to go.
TEST(DeviceBlockCache, ASharedPrefixBlockDoesNotPinATail) {
  const int64_t B = 4;
  std::vector<int32_t> a{0, 1, 2, 3, 4}, c{0, 5, 6};
  DeviceBlockCache cache(3, 8, B);
  std::vector<DeviceBlockCache::Placement> place;
  std::vector<DeviceBlockCache::Promotion> promos;
  std::vector<DeviceBlockCache::Seq> seqs{{a, 0, 8}};
  cache.plan(seqs, &place, &promos);
  EXPECT_EQ(place[0].head, 0);
  // a starts block 2 (the last free device block); c, on a prefix hit, shares a's block 0 and
  // starts block 5: the tier is full and c's only older block is shared, so c stages everything.
  seqs = {{a, 8, 1}, {c, 4, 2}};
  cache.plan(seqs, &place, &promos);
  EXPECT_EQ(place[0].head, 0);
  EXPECT_EQ(place[1].head, 6);
  // a starts block 3: its oldest block (0) is c's too, so the next one (1) goes instead. Then
  // block 0's mirror is read by neither (c stages it, a's tail starts at 2): it goes to a's block
  // 1, promoted from the rows a stages.
  seqs = {{a, 9, 4}, {c, 6, 1}};
  cache.plan(seqs, &place, &promos);
  EXPECT_EQ(place[0].head, 8) << "a's tail slides past the shared block";
  EXPECT_EQ(place[1].head, 7);
  EXPECT_GE(cache.mirror(3), 0);
  EXPECT_EQ(cache.mirror(0), -1) << "the unread shared mirror was the first to go";
  ASSERT_EQ(promos.size(), 1u);
  EXPECT_EQ(promos[0].seq, 0u);
  EXPECT_EQ(promos[0].index, 1);
  EXPECT_EQ(promos[0].rows, 4);
  seqs = {{a, 13, 1}};
  cache.plan(seqs, &place, &promos);
  EXPECT_EQ(place[0].head, 4) << "the promoted block is read in place";
}
