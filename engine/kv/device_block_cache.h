// The device tier of kv mode auto (docs/kv-modes.md "Auto"): a fixed number of device blocks
// that mirror host KV blocks, so the tail of each sequence is read in place on the device while
// its head is recomputed from X or streamed over the link, as kvpr does.
//
// The host store keeps every token (new K/V are always stored to the host), so a mirror can be
// dropped at any time without a copy; a mirror of host block h holds h's first valid(h) rows
// exactly as the host does (every write to h goes to its mirror too, or cuts valid(h) back to
// where the write starts). Each step, per sequence:
//   - its resident tail is the longest run of its last blocks that are mirrored and valid for
//     the rows it has (a block only this step writes needs no rows: it gets a mirror if one can
//     be had), read in place and written there; its head, blocks [0, head / B), is staged;
//   - a block that starts this step takes a free device block, else the least recently used
//     mirror no sequence of the step reads (mirrors of staged blocks first), else the oldest
//     block of its tail no other sequence lists (the tail slides, keeping its size), else none
//     (the sequence then stages everything this step);
//   - the staged blocks just before each tail, one sequence at a time, join it: as they are
//     where a valid mirror exists, else promoted (their own stale mirror refreshed, or a free
//     device block, then an unread mirror, taken) from the rows the step stages anyway: a copy
//     on the device after attention, nothing more over the link; none below the sequence's
//     first promotable block (a ring's window).
// Sequences keep what they hold until they end: one that joins when the device is full streams
// until others leave. Bookkeeping only: the runtime moves the rows. Not thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <vector>

namespace kvpr {

class DeviceBlockCache {
 public:
  // `device_blocks` mirrors of blocks of `block_tokens` tokens, for host block ids < host_blocks.
  DeviceBlockCache(int64_t device_blocks, int64_t host_blocks, int64_t block_tokens);

  struct Seq {
    std::span<const int32_t> table;  // host blocks, at least blocks_for(past + q_len)
    int64_t past = 0, q_len = 0;
    // The first block the step may promote: below it the host store may lack rows of some
    // layers (a sliding-window ring's, KvLayout::ring), so the step stages none of them there.
    int64_t first_promotable = 0;
  };
  struct Placement {
    // Tokens [0, head) are staged (recomputed or copied into the step's buffers); tokens
    // [head, past + q_len) are in the device blocks `table` lists (entries below head / B: -1).
    int64_t head = 0;
    std::vector<int32_t> table;
  };
  // After the step's attention: rows [0, rows) of block `index` of sequence `seq`, staged at
  // tokens index * B .., copied to device block `device`.
  struct Promotion {
    size_t seq = 0;
    int64_t index = 0;
    int32_t device = 0;
    int64_t rows = 0;
  };
  // Plans one step and records it as done (mirrors valid for what the step writes). On a step
  // that fails part way, call clear().
  void plan(std::span<const Seq> seqs, std::vector<Placement>* out, std::vector<Promotion>* promotions);
  // Drops every mirror.
  void clear();

  int64_t device_blocks() const { return static_cast<int64_t>(host_of_.size()); }
  int64_t block_tokens() const { return block_tokens_; }
  int64_t mirrored() const { return device_blocks() - static_cast<int64_t>(free_.size()); }
  // The device block mirroring host block h and its valid rows (-1 and 0 without one).
  int32_t mirror(int32_t host) const { return dev_of_.at(static_cast<size_t>(host)); }
  int64_t valid_rows(int32_t device) const { return valid_.at(static_cast<size_t>(device)); }

 private:
  // plan()'s parts, in order.
  void count_refs(std::span<const Seq> seqs);
  int64_t place(const Seq& s, Placement* p);
  void promote_heads(std::span<const Seq> seqs, std::vector<int64_t>& tail, std::vector<Promotion>* promotions);
  int64_t blocks_for(int64_t tokens) const;
  int32_t take(int32_t host);  // a free or evictable device block for host, or -1
  void drop(int32_t device);
  void touch(int32_t device);   // most recently used
  void demote(int32_t device);  // least recently used

  int64_t block_tokens_;
  std::vector<int32_t> dev_of_;   // per host block
  std::vector<int32_t> host_of_;  // per device block (-1: free)
  std::vector<int64_t> valid_;    // per device block
  std::vector<int32_t> free_;
  std::list<int32_t> lru_;        // mirrored device blocks, least recently used first
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  // Per host block, during plan(): sequences of the step that list it and, once placed, read it
  // on the device; a block joining a tail holds one. The mirrors of blocks with none are the
  // LRU list's front.
  std::vector<int64_t> refs_;
};

}  // namespace kvpr
