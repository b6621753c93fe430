// The Generator's settings as plain values: a front end sets them (engine_options.h) before
// any engine exists; the Generator (generator.h) takes them.
#pragma once

#include <cstdint>
#include <optional>

#include "engine/base/dtype.h"
#include "engine/kv/kv_options.h"

namespace kvpr {

struct GeneratorOptions {
  // Sequences running at once, at most; 0: 8 on a backend whose device is the host, 256 on a GPU
  // (where the KV blocks, not this cap, decide how many fit).
  int max_batch = 0;
  // Paged KV (engine/kv/block_pool.h): the store in blocks of block_tokens tokens, lent to
  // sequences as they grow. kv_cache_bytes sizes the store (the KV mode's store: host memory for
  // the host modes, device memory for resident); 0: room for max_batch sequences (8 when
  // max_batch is 0) of max_seq_len tokens, at most what host memory allows for a store there
  // (host_memory, below), as vLLM sizes its cache by memory and treats max-num-seqs as a cap.
  // Sequences are admitted while their prompt fits with a block to spare
  // for each running one; when blocks run out mid-decode the newest is preempted (its blocks
  // go back, it waits at the head of the queue and is prefilled again, from whatever of its
  // blocks are still cached).
  int64_t block_tokens = 16;
  double kv_cache_bytes = 0;
  // Or a fraction in (0, 1] of the memory the store lives in: the host memory available (host
  // KV modes, and a backend whose device is the host), or the device memory free after the
  // weights (resident on a GPU).
  double kv_cache_fraction = 0;
  // The host memory this engine may hold, its weights kept in host memory and a default-sized
  // store in host memory together (kvprd: 90% of the host's available memory when it starts,
  // shared evenly among its workers); 0: 90% of what is available when the store is sized.
  double host_memory = 0;
  // Tokens per forward (bounds activation memory and the time decoding sequences wait for a
  // prefill): every decoding sequence's token, then prompts in chunks (chunked prefill) until
  // the budget is used; the rest of a prompt goes on in the next steps.
  int64_t max_step_tokens = 8192;
  int64_t max_seq_len = 0;    // 0 = the model's max_position_embeddings
  std::optional<DType> kv_dtype;  // default: the model's weight dtype
  KvRuntimeOptions kv;        // KV mode and its settings (kv.kv_dtype is set from kv_dtype)
  // Decode steps as CUDA graphs (Backend::begin_graph_step): resident mode, steps that only
  // decode. Other modes move KV on the copy streams with events every layer, which a graph
  // step does not hold; prefill steps change shape every time.
  bool cuda_graphs = false;
  // Automatic prefix caching by block: a full block is known by its tokens and those before it;
  // a new prompt takes the blocks running or finished sequences filled with the same prefix
  // (finished ones' blocks stay cached until the pool needs them, least recently freed first),
  // and only the rest is prefilled (at least its last token, whose logits choose the first new
  // one). Nothing is copied. Off for prompts whose tokens are scored (prompt_logprobs).
  bool prefix_caching = true;
  // Speculative decoding by prompt lookup (vLLM's "ngram" method): a greedy sequence whose last
  // prompt_lookup_max..prompt_lookup_min tokens occurred earlier in its prompt or output proposes
  // the up to speculative_tokens tokens that followed them there; one forward checks them all
  // (their K/V computed as a chunk), and the tokens agreeing with the model's greedy choices are
  // taken, plus the model's own choice after them. The tokens are exactly those of decoding one
  // at a time; a step moves the same KV whatever it checks, so where KV transfer bounds a step
  // (offload, kvpr) every accepted token is one step saved. 0: off. Sampled sequences take a draft
  // with its probability (speculative_sample), so their tokens follow the same distribution (not
  // the same draws); JSON-constrained ones mask each row as the drafts before it left the text.
  // Sequences whose logits an observer watches decode one token a step.
  int speculative_tokens = 0;
  int prompt_lookup_max = 4, prompt_lookup_min = 2;
  // JSON-constrained answers (json_object, json_schema): whitespace between tokens is compact
  // (nothing, a space, or a newline and indentation: json_lex::Whitespace) unless permissive.
  bool permissive_json_whitespace = false;
};

}  // namespace kvpr
