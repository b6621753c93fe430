// Paged KV's blocks (issue 25's allocator): the KV store as `blocks` blocks of `block_tokens`
// tokens, lent to sequences through block tables, as vLLM's PagedAttention made standard.
//
// - A sequence's table lists its blocks in order: token t lives in block table[t / B] at row
//   t % B. Blocks are taken from the pool as the sequence grows (allocate), never up front;
//   once a step has written their K/V, commit says which tokens they hold, and only then can
//   other sequences find them (a block whose K/V are still being computed is never shared).
// - A full block is known by the hash of its tokens and of the block before it (its prefix):
//   a new sequence whose prompt starts with blocks the pool holds takes them as they are
//   (match_prefix, then allocate with them) and computes only the rest. A block several
//   sequences hold is read by all and written by none.
// - Forking a sequence (n > 1 choices of one prompt) shares all its blocks, the partial last one
//   too; the first append to a shared partial block copies it (copy-on-write): allocate says which
//   block to copy where, and the runtime copies it before writing.
// - A block no sequence holds stays cached with its hash until an allocation needs a block:
//   the least recently freed goes first (a finished sequence's last blocks before its first, so
//   a common prefix outlives its tails).
// - With a window (the store of sliding-window layers, kept as a ring: docs/kv-modes.md), a
//   sequence's blocks whose tokens all lie below what its next query reads go back to the pool
//   (trim; their table entries become kNone), cached like a finished sequence's; a new sequence
//   takes from the cache only the blocks the window of its first computed token reads.
// Not thread-safe: the scheduler that admits sequences owns it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <list>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

namespace kvpr {

class BlockPool {
 public:
  using Block = int32_t;
  using SeqId = int64_t;

  // A table entry whose block went back to the pool (below the window).
  static constexpr Block kNone = -1;

  // window > 0: the pool of sliding-window layers whose queries read the last `window` tokens.
  BlockPool(int64_t blocks, int64_t block_tokens, int64_t window = 0);

  int64_t block_tokens() const { return block_tokens_; }
  int64_t window() const { return window_; }
  // The first block the window of a query at `position` reads (0 without a window).
  int64_t first_block_read(int64_t position) const {
    return window_ > 0 ? std::max<int64_t>(0, position + 1 - window_) / block_tokens_ : 0;
  }
  int64_t total_blocks() const { return static_cast<int64_t>(ref_.size()); }
  // Blocks no sequence holds: free (no content) and cached (a full block's content kept).
  int64_t free_blocks() const { return static_cast<int64_t>(empty_.size() + cached_.size()); }
  int64_t cached_blocks() const { return static_cast<int64_t>(cached_.size()); }
  int64_t used_blocks() const { return total_blocks() - free_blocks(); }
  // Blocks a sequence of `tokens` tokens needs.
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_tokens_ - 1) / block_tokens_; }

  // How many leading full blocks of `tokens` (its last token not counted: a prompt's last token
  // is always computed, for its logits), at most `limit`, a new sequence can take from the cache:
  // all of them cached, or with a window those the window of the first token after them reads.
  // `salt` names how the K/V were computed, where the tokens alone do not say it (longrope's
  // short or long factors): blocks are found only under the salt they were written with.
  int64_t match_blocks(std::span<const int32_t> tokens, uint64_t salt = 0,
                       int64_t limit = std::numeric_limits<int64_t>::max()) const;
  // The tokens of match_blocks.
  int64_t match_prefix(std::span<const int32_t> tokens, uint64_t salt = 0) const {
    return match_blocks(tokens, salt) * block_tokens_;
  }

  // A copy the runtime makes before a sequence writes: block `from`'s rows into block `to`.
  struct Copy {
    Block from, to;
  };
  // Makes `seq`'s table cover `tokens` tokens in all (the tokens committed so far and `tokens`'
  // new ones: `tokens` is the sequence's whole token list, its new ones at the end). A new
  // sequence first takes `hits` blocks from the cache (at most match_blocks'; -1: all of those;
  // 0: none, its prompt scored token by token), committed as they are, its blocks known under
  // `salt`. Returns false, changing nothing, when the pool has too few blocks; else appends to
  // `copies` the copy-on-write a shared partial block needs.
  bool allocate(SeqId seq, std::span<const int32_t> tokens, std::vector<Copy>* copies, int64_t hits = -1,
                uint64_t salt = 0);
  // allocate for a sequence the pool holds already: only the count of its tokens matters.
  bool extend(SeqId seq, int64_t tokens, std::vector<Copy>* copies);
  // The K/V of `tokens` (the sequence's whole list so far) are written: full blocks become
  // findable by their hash. Blocks past them stay the sequence's (the rest of a prompt being
  // prefilled in chunks, or rows of drafts a speculative step rejected, written over next).
  void commit(SeqId seq, std::span<const int32_t> tokens);
  // Whether allocate could give a new sequence of `tokens` tokens its blocks now, taking `hits`
  // from the cache (as allocate), with `reserve` blocks left over (admission keeps room for the
  // sequences that decode).
  bool can_admit(std::span<const int32_t> tokens, int64_t reserve, int64_t hits = -1, uint64_t salt = 0) const;
  // `child` holds what `parent` holds, the same blocks (n > 1 choices of one prompt).
  void fork(SeqId parent, SeqId child);
  // The sequence's blocks go back to the pool (finished, cancelled or preempted); full ones stay
  // cached for its prefix.
  void release(SeqId seq);
  // With a window: the sequence's committed full blocks whose tokens all lie below `first` go
  // back to the pool, cached (its queries from now on read no key below `first`).
  void trim(SeqId seq, int64_t first);

  const std::vector<Block>& table(SeqId seq) const;
  int64_t tokens(SeqId seq) const;  // committed
  bool holds(SeqId seq) const { return seqs_.count(seq) != 0; }
  int32_t ref_count(Block b) const { return ref_[static_cast<size_t>(b)]; }
  // Tokens of prompts admitted and, of them, found in cached blocks (the prefix hit rate).
  int64_t prefix_queries() const { return prefix_queries_; }
  int64_t prefix_hits() const { return prefix_hits_; }

 private:
  struct Seq {
    std::vector<Block> table;
    std::vector<uint64_t> hashes;  // of its full committed blocks, in order
    int64_t tokens = 0;            // committed
    uint64_t salt = 0;             // its first block's parent hash (match_prefix)
  };
  uint64_t block_hash(uint64_t parent, std::span<const int32_t> tokens) const;
  // The cached block of a full block's hash and tokens, or kNone.
  Block cached(uint64_t hash, std::span<const int32_t> part) const;
  // A new sequence's first `hits` blocks from the cache (match_blocks' at most): kNone below the
  // window of the token after them.
  std::vector<Block> cached_prefix(std::span<const int32_t> tokens, uint64_t salt, int64_t hits) const;
  // A block no one holds: the lowest-numbered empty one (so a batch admitted together takes
  // consecutive blocks, whose copies merge), else the least recently freed cached one, its hash
  // forgotten.
  std::optional<Block> take_idle();
  void hold(Block b);                // one more holder (an idle cached block leaves the idle list)
  void drop(Block b);                // one fewer; at none it goes idle
  void seal(Seq& s, std::span<const int32_t> tokens);  // hash the blocks that became full

  int64_t block_tokens_, window_;
  std::vector<int32_t> ref_;                        // holders per block
  std::vector<std::optional<uint64_t>> hash_of_;    // a full block's hash, while its content is kept
  std::vector<int32_t> content_;                    // [blocks, block_tokens]: a hashed block's tokens
  std::unordered_map<uint64_t, Block> by_hash_;     // cached full blocks
  std::set<Block> empty_;                             // blocks no one holds, without content
  std::list<Block> cached_;                           // blocks no one holds with a hash, least recently freed first
  std::vector<std::list<Block>::iterator> cached_at_;  // each cached block's place in cached_
  std::unordered_map<SeqId, Seq> seqs_;
  int64_t prefix_queries_ = 0, prefix_hits_ = 0;
};

}  // namespace kvpr
