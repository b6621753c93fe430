#include "engine/kv/device_block_cache.h"

#include <algorithm>

#include "engine/base/error.h"

namespace kvpr {

DeviceBlockCache::DeviceBlockCache(int64_t device_blocks, int64_t host_blocks, int64_t block_tokens)
    : block_tokens_(block_tokens) {
  KVPR_CHECK(device_blocks >= 0 && device_blocks < (int64_t{1} << 31) && host_blocks > 0 &&
                 host_blocks < (int64_t{1} << 31) && block_tokens > 0,
             "device KV blocks: ", device_blocks, " device and ", host_blocks, " host blocks of ", block_tokens,
             " tokens");
  dev_of_.assign(static_cast<size_t>(host_blocks), -1);
  refs_.assign(static_cast<size_t>(host_blocks), 0);
  host_of_.resize(static_cast<size_t>(device_blocks));
  valid_.resize(host_of_.size());
  lru_pos_.resize(host_of_.size());
  clear();
}

void DeviceBlockCache::clear() {
  std::fill(dev_of_.begin(), dev_of_.end(), -1);
  std::fill(host_of_.begin(), host_of_.end(), -1);
  std::fill(valid_.begin(), valid_.end(), 0);
  std::fill(refs_.begin(), refs_.end(), 0);
  lru_.clear();
  free_.clear();
  // Handed out lowest id first.
  for (int64_t d = device_blocks() - 1; d >= 0; --d) free_.push_back(static_cast<int32_t>(d));
}

void DeviceBlockCache::touch(int32_t d) {
  lru_.splice(lru_.end(), lru_, lru_pos_[static_cast<size_t>(d)]);
}

void DeviceBlockCache::demote(int32_t d) {
  lru_.splice(lru_.begin(), lru_, lru_pos_[static_cast<size_t>(d)]);
}

void DeviceBlockCache::drop(int32_t d) {
  const size_t i = static_cast<size_t>(d);
  dev_of_[static_cast<size_t>(host_of_[i])] = -1;
  host_of_[i] = -1;
  valid_[i] = 0;
  lru_.erase(lru_pos_[i]);
}

int32_t DeviceBlockCache::take(int32_t host) {
  int32_t d = -1;
  if (!free_.empty()) {
    d = free_.back();
    free_.pop_back();
  } else if (!lru_.empty() && refs_[static_cast<size_t>(host_of_[static_cast<size_t>(lru_.front())])] == 0) {
    // Every mirror the step reads is behind every other (touched first, or taken, or protected
    // since), so the front is the least recently used of the rest.
    d = lru_.front();
    drop(d);
  } else {
    return -1;
  }
  const size_t i = static_cast<size_t>(d);
  host_of_[i] = host;
  dev_of_[static_cast<size_t>(host)] = d;
  valid_[i] = 0;
  lru_pos_[i] = lru_.insert(lru_.end(), d);
  return d;
}

namespace {
int32_t host_block(const DeviceBlockCache::Seq& s, int64_t j) { return s.table[static_cast<size_t>(j)]; }
}  // namespace

int64_t DeviceBlockCache::blocks_for(int64_t tokens) const { return (tokens + block_tokens_ - 1) / block_tokens_; }

void DeviceBlockCache::plan(std::span<const Seq> seqs, std::vector<Placement>* out, std::vector<Promotion>* promotions) {
  out->assign(seqs.size(), Placement{});
  promotions->clear();
  count_refs(seqs);
  std::vector<int64_t> tail(seqs.size());  // each sequence's first resident block
  for (size_t i = 0; i < seqs.size(); ++i) tail[i] = place(seqs[i], &(*out)[i]);
  promote_heads(seqs, tail, promotions);
  for (const Seq& s : seqs)
    for (int64_t j = 0; j < blocks_for(s.past + s.q_len); ++j) refs_[static_cast<size_t>(host_block(s, j))] = 0;
}

// Every host block the step's sequences list, counted in refs_; their mirrors are used now.
void DeviceBlockCache::count_refs(std::span<const Seq> seqs) {
  for (const Seq& s : seqs) {
    const int64_t n = s.past + s.q_len;
    KVPR_CHECK(s.past >= 0 && s.q_len >= 0 && static_cast<int64_t>(s.table.size()) >= blocks_for(n),
               "device KV blocks: a sequence of ", n, " tokens has ", s.table.size(), " blocks");
    for (int64_t j = 0; j < blocks_for(n); ++j) {
      const int32_t h = host_block(s, j);
      KVPR_CHECK(h >= 0 && static_cast<size_t>(h) < dev_of_.size(), "device KV blocks: host block ", h, " out of range");
      ++refs_[static_cast<size_t>(h)];
      if (dev_of_[static_cast<size_t>(h)] >= 0) touch(dev_of_[static_cast<size_t>(h)]);
    }
  }
}

// One sequence's resident tail: the run of mirrored blocks holding its past rows, and a mirror
// for every block the step starts (the tail slides when none is free). Fills `p`; returns the
// tail's first block.
int64_t DeviceBlockCache::place(const Seq& s, Placement* p) {
  const int64_t B = block_tokens_;
  const int64_t n = s.past + s.q_len, nb = blocks_for(n), first_new = blocks_for(s.past);
  // The resident run of blocks holding past rows.
  int64_t s0 = first_new;
  while (s0 > 0) {
    const int32_t d = dev_of_[static_cast<size_t>(host_block(s, s0 - 1))];
    if (d < 0 || valid_[static_cast<size_t>(d)] < std::min(B, s.past - (s0 - 1) * B)) break;
    --s0;
  }
  // Blocks this step starts, from the last: each needs a mirror.
  int64_t start = nb;
  bool all = true;
  for (int64_t j = nb - 1; j >= first_new; --j) {
    const int32_t h = host_block(s, j);
    if (dev_of_[static_cast<size_t>(h)] < 0 && take(h) < 0) {
      // The tail slides: its oldest block no other sequence of the step lists goes back to the
      // host store's copy (shared blocks before it stay mirrored for the others).
      int64_t k = s0;
      while (k < first_new && refs_[static_cast<size_t>(host_block(s, k))] != 1) ++k;
      if (k == first_new) {
        all = false;
        break;
      }
      const int32_t d = dev_of_[static_cast<size_t>(host_block(s, k))];
      drop(d);
      free_.push_back(d);
      s0 = k + 1;
      take(h);
    }
    start = j;
  }
  if (all) start = std::min(start, s0);
  p->head = std::min(n, start * B);
  p->table.assign(static_cast<size_t>(nb), -1);
  for (int64_t j = 0; j < nb; ++j) {
    const int32_t h = host_block(s, j), d = dev_of_[static_cast<size_t>(h)];
    const int64_t rows_after = std::min(B, n - j * B);  // rows block j holds after the step
    if (j >= start) {
      p->table[static_cast<size_t>(j)] = d;
      valid_[static_cast<size_t>(d)] = std::max(valid_[static_cast<size_t>(d)], rows_after);
    } else if (d >= 0 && (j + 1) * B > s.past) {
      // Written on the host alone: the mirror keeps the rows before the write.
      valid_[static_cast<size_t>(d)] = std::min(valid_[static_cast<size_t>(d)], std::max<int64_t>(0, s.past - j * B));
    }
  }
  // Its blocks before the tail are not read on the device this step: where no other sequence
  // lists them, their mirrors go first to whoever needs a block.
  for (int64_t j = 0; j < start; ++j) {
    const int32_t h = host_block(s, j);
    if (--refs_[static_cast<size_t>(h)] == 0 && dev_of_[static_cast<size_t>(h)] >= 0) demote(dev_of_[static_cast<size_t>(h)]);
  }
  return start;
}

// Device blocks to the staged blocks just before each tail, a block per sequence in turn: a
// mirror valid for the rows the block will hold joins as it is; a stale one of its own is
// refreshed in place; else a free block (then an unread mirror) is taken. Both are promoted
// from the rows the step stages, and protected from the rest of the step's takes.
void DeviceBlockCache::promote_heads(std::span<const Seq> seqs, std::vector<int64_t>& tail,
                                     std::vector<Promotion>* promotions) {
  const int64_t B = block_tokens_;
  bool full = false;
  for (bool more = true; more && !full;) {
    more = false;
    for (size_t i = 0; i < seqs.size() && !full; ++i) {
      const Seq& s = seqs[i];
      if (tail[i] == 0) continue;
      const int64_t j = tail[i] - 1, rows = std::min(B, s.past + s.q_len - j * B);
      const int32_t h = host_block(s, j);
      int32_t d = dev_of_[static_cast<size_t>(h)];
      if (d >= 0 && valid_[static_cast<size_t>(d)] >= rows) {
        refs_[static_cast<size_t>(h)] = std::max<int64_t>(refs_[static_cast<size_t>(h)], 1);  // already there
        touch(d);
        tail[i] = j;
        more = true;
        continue;
      }
      if ((d >= 0 && refs_[static_cast<size_t>(h)] != 0) || j < s.first_promotable) {
        tail[i] = 0;  // another sequence reads it this step, or some layers' rows are not staged: leave it
        continue;
      }
      if (d < 0) d = take(h);
      if (d < 0) {
        full = true;
        break;
      }
      valid_[static_cast<size_t>(d)] = rows;
      refs_[static_cast<size_t>(h)] = 1;
      touch(d);
      promotions->push_back(Promotion{i, j, d, rows});
      tail[i] = j;
      more = true;
    }
  }
}

}  // namespace kvpr
