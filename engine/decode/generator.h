// Continuous batching over one model: requests join at step boundaries, each step runs one
// forward over the prompts being admitted and the last token of every running sequence,
// then samples, detokenizes incrementally and applies stop conditions. Single-threaded:
// call every method from the thread that owns the Generator.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/base/json.h"
#include "engine/constrain/token_constraint.h"
#include "engine/contract/contract.h"
#include "engine/decode/generator_options.h"
#include "engine/kv/block_pool.h"
#include "engine/model/model.h"
#include "engine/decode/sampling.h"
#include "engine/text/tokenizer.h"

namespace kvpr {

// The per-sequence stages of a step, where one sequence's fault must end only that sequence.
enum class SequenceStage { Constraint, Sampling, Detokenize, StopMatch };

// Speculative decoding since the Generator started.
struct SpeculationStats {
  int64_t proposed = 0;  // draft tokens checked
  int64_t accepted = 0;  // of those, taken
};

// What one step produced for one sequence.
struct StepOutput {
  uint64_t id = 0;
  int32_t token = -1;
  float logprob = 0.f;
  std::vector<TokenLogprob> top;  // the params.top_logprobs most likely ids at this position
  // On a sequence's first output when params.prompt_logprobs >= 0: for prompt tokens 1..P-1,
  // their log-probabilities and the prompt_logprobs most likely ids at each position.
  std::vector<float> prompt_logprobs;
  std::vector<std::vector<TokenLogprob>> prompt_top;
  std::string text;  // new text safe to show (never splits a character or a stop string)
  FinishReason finish = FinishReason::None;
  std::string error;  // with FinishReason::Error: what failed
};

struct SequenceResult {
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;    // generated ids (EOS included when it ended the sequence)
  std::vector<float> logprobs;
  std::vector<std::vector<TokenLogprob>> top;  // per generated token, when asked for
  std::vector<float> prompt_logprobs;          // see StepOutput
  std::vector<std::vector<TokenLogprob>> prompt_top;
  std::string text;               // generated text, stop string excluded
  FinishReason finish = FinishReason::None;
  int64_t cached_tokens = 0;      // prompt tokens whose K/V came from the prefix cache
};

// Prompt tokens looked up in the prefix cache and found there, since the Generator started.
struct PrefixCacheStats {
  int64_t queries = 0;  // prompt tokens of sequences admitted with prefix caching on
  int64_t hits = 0;     // of those, tokens whose K/V were found in cached blocks
};

// The paged KV store's blocks now, and the preemptions since the Generator started.
struct KvBlockStats {
  int64_t block_tokens = 0;
  int64_t total = 0, used = 0, free = 0, cached = 0;  // cached: of free, blocks whose content is kept
  int64_t preemptions = 0;
  // Sequences whose K/V were computed again as they passed longrope's original context (Phi).
  int64_t rope_recomputes = 0;
  // The sliding-window layers' ring (KvLayout::ring; 0 without one): its blocks, and those held.
  int64_t ring_total = 0, ring_used = 0;
};

class Generator {
 public:
  Generator(Model& model, const Tokenizer& tokenizer, const GeneratorOptions& opts = {});
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;
  // The KV cache a Generator with these options makes for a model of this spec and weight
  // dtype: max_batch sequences of max_seq_len tokens (capped by the model's positions). Given to
  // ModelLoadOptions::kv_plan, loading refuses what will not fit the host before allocating.
  // With kv_cache_fraction, `backend` gives the device's free memory (resident on a GPU); without
  // one such a plan's size is not yet known (blocks 0: nothing in host memory). Without a size
  // given, a store in host memory is at most what host_memory (or 90% of the host's available
  // memory) leaves after `host_weight_bytes` of weights in host memory (`weights_allocated`: they
  // are allocated already, so no longer in what is available), and at least one block per token
  // of two; `why` says which bound it is.
  static KvPlan kv_plan(const GeneratorOptions& opts, const ModelSpec& spec, DType weight_dtype,
                        const Backend* backend = nullptr, double host_weight_bytes = 0, bool weights_allocated = false);
  // The plan this Generator's store was made from.
  const KvPlan& plan() const { return plan_; }

  // Queues a request; throws kvpr::Error (one line) for an empty prompt, a prompt that does
  // not fit the context, bad ids or bad sampling values, and RequestRefused for a JSON Schema it
  // cannot compile.
  uint64_t add(std::vector<int32_t> prompt, const GenerationParams& params);
  void cancel(uint64_t id);

  // Called with the raw logits row from which each token is chosen.
  using LogitsObserver = std::function<void(uint64_t id, const float* logits, int64_t vocab)>;
  std::vector<StepOutput> step(const LogitsObserver& observer = nullptr);

  bool idle() const { return waiting_.empty() && running_.empty(); }
  size_t running() const { return running_.size(); }
  // Tokens whose K/V the running sequences hold (host KV in use = this x bytes per token).
  int64_t cached_tokens() const;
  const PrefixCacheStats& prefix_cache_stats() const { return prefix_stats_; }
  KvBlockStats kv_block_stats() const;
  const SpeculationStats& speculation_stats() const { return spec_stats_; }
  size_t waiting() const { return waiting_.size(); }
  size_t max_batch() const { return max_batch_; }
  int64_t max_seq_len() const { return max_seq_len_; }
  KvRuntime& kv_runtime() { return *runtime_; }
  // What the last step did as a CUDA graph (GraphOutcome::None when it was no graph step).
  const GraphStep& last_graph_step() const { return last_graph_; }
  // For fault tests: called at each per-sequence stage of a step with the sequence's id; what it
  // throws ends that sequence with FinishReason::Error, as a real fault there would.
  using FaultHook = std::function<void(SequenceStage, uint64_t id)>;
  void set_fault_hook(FaultHook hook) { fault_hook_ = std::move(hook); }

  // Results of finished sequences (removed by take_result).
  bool finished(uint64_t id) const { return done_.count(id) > 0; }
  SequenceResult take_result(uint64_t id);

  // Runs every queued request to completion.
  std::vector<SequenceResult> generate_all(const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerationParams& params,
                                           const LogitsObserver& observer = nullptr);

 private:
  struct Sequence;
  void finish(Sequence& s, FinishReason r, bool flush_decoder, std::vector<StepOutput>& out, StepOutput& ev);
  // Takes `s`'s blocks for its prompt (sharing cached ones) if the pool has room for it and a
  // block to spare for each running sequence; false if not.
  bool admit(Sequence& s);
  static void plan_ring(KvPlan& plan, const GeneratorOptions& opts, const ModelSpec& spec, const Backend* backend);
  // Grows s's tables (and its ring's) to `tokens` tokens; false, when a pool is short.
  bool extend_blocks(Sequence& s, int64_t tokens);
  // Whether s is longer than longrope's original context (ModelSpec::long_rope_after).
  bool past_original_context(const Sequence& s) const;
  // Makes room for `s`'s next `tokens` tokens, preempting the newest running sequences while the
  // pool is short; false when `s` itself was preempted or ended (it cannot grow even alone).
  bool reserve_blocks(Sequence& s, int64_t tokens, std::vector<StepOutput>& out);
  void preempt(Sequence& s);
  void release_blocks(Sequence& s);  // its blocks back to the pool, their K/V kept cached
  void commit_blocks(Sequence& s);   // its tables (and its ring's) hold its first past_len tokens
  // The mask table of `schema` (compiled at its first request); RequestRefused("json_schema")
  // when it cannot be compiled (or was refused lately).
  std::shared_ptr<JsonMaskTable> schema_table(const json::Value& schema);
  std::string take_visible_text(Sequence& s, bool final);
  // Prompt lookup: the tokens that followed the latest earlier occurrence of s's last n tokens
  // (n from prompt_lookup_max down), at most `most`; empty when none occurred.
  std::vector<int32_t> propose(const Sequence& s, int64_t most) const;
  // Hands out one chosen token: records it, then ends the sequence at an end id, a stop string or
  // its length (returns true), else adds an event with the text now safe to show.
  bool emit_token(Sequence& s, const Sampled& pick, std::vector<TokenLogprob> top, StepOutput ev,
                  std::vector<StepOutput>& out);
  // A speculative chunk's outcome: the tokens chosen row by row (the device's greedy choices, or
  // from the host's copy of the rows when `host_rows`), as long as they take the drafts.
  void accept_drafts(Sequence& s, const ForwardChunk& c, int64_t first_row, bool host_rows,
                     std::vector<StepOutput>& out);
  // One step, in stages (generator.cc): cancelled sequences retired; the plan (a token and its
  // drafts of every decoding sequence, then prompt chunks, admitting waiting sequences);
  // the forward pass with the device's greedy choices; the host's choices; the outputs.
  struct StepPlan;
  struct StepChoices;
  class MaskAhead;
  // Ends `s` alone with FinishReason::Error and `why` (its blocks back, its result recorded).
  void fail_sequence(Sequence& s, const std::string& why, std::vector<StepOutput>& out);
  void at_stage(SequenceStage stage, const Sequence& s) const;
  void advance_constraint(Sequence& s, int32_t token);
  void choose_on_host_unguarded(const StepPlan& p, size_t i, StepChoices& ch, std::vector<std::pair<float, int32_t>>& scratch);
  void retire_cancelled(std::vector<StepOutput>& out);
  void plan_decodes(StepPlan& p, bool speculate, std::vector<StepOutput>& out);
  void plan_prefills(StepPlan& p, std::vector<StepOutput>& out);
  void plan_rows(StepPlan& p, const LogitsObserver& observer);
  void forward(const StepPlan& p);
  void take_device_choices(const StepPlan& p, StepChoices& ch) const;
  const float* logits_row(int64_t r) const;
  void score_prompt(const StepPlan& p, size_t i, std::vector<std::pair<float, int32_t>>& scratch);
  void choose_on_host(const StepPlan& p, size_t i, StepChoices& ch, std::vector<std::pair<float, int32_t>>& scratch);
  void emit(StepPlan& p, StepChoices& ch, const LogitsObserver& observer, std::vector<StepOutput>& out);
  void emit_chunk(StepPlan& p, size_t i, StepChoices& ch, const LogitsObserver& observer, std::vector<StepOutput>& out);

  Model& model_;
  const Tokenizer& tok_;
  int64_t max_seq_len_;
  KvPlan plan_;
  int64_t max_step_tokens_ = 8192;
  int32_t valid_vocab_;
  bool cuda_graphs_ = false;
  GraphStep last_graph_;
  FaultHook fault_hook_;
  std::unique_ptr<KvRuntime> runtime_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<BlockPool> window_pool_;  // the sliding-window layers' ring (KvLayout::ring), or none
  size_t max_batch_ = 8;
  int64_t preemptions_ = 0;
  int64_t long_rope_after_ = 0;  // ModelSpec::long_rope_after
  int64_t rope_recomputes_ = 0;
  bool prefix_caching_ = true;
  PrefixCacheStats prefix_stats_;
  int speculative_tokens_ = 0, lookup_max_ = 4, lookup_min_ = 2;
  JsonConstraintOptions json_options_;  // whitespace of JSON-constrained answers
  SpeculationStats spec_stats_;
  std::vector<std::unique_ptr<Sequence>> waiting_, running_;
  std::map<uint64_t, SequenceResult> done_;
  uint64_t next_id_ = 1;
  // The constraints' mask tables (token_constraint.h), shared by every sequence under the same
  // constraint and kept for later requests: json_object's (made at its first need, with the
  // vocabulary's facts every table shares), and the accepted schemas' by their JSON text, the
  // least recently used dropped past kSchemaTables (a table in use lives on with its sequences).
  // A kept schema is compiled once; its patterns' lazily built states are shared with it, and
  // one whose pattern ran into its state caps is compiled afresh for the next request.
  static constexpr size_t kSchemaTables = 16;
  std::shared_ptr<JsonMaskTable> json_object_table_;
  std::list<std::pair<std::string, std::shared_ptr<JsonMaskTable>>> schema_tables_;
  // The schemas refused lately (keyed by their JSON text) and why, most recent first: a schema
  // that runs into the compile's budget costs the step loop that budget once, not at every retry.
  static constexpr size_t kRefusedSchemas = 32;
  std::list<std::pair<std::string, std::string>> refused_schemas_;
  std::unique_ptr<MaskAhead> mask_ahead_;  // made at the first constrained step on a device
  Tensor logits_;                 // host [rows, vocab], for rows sampled on the host
  Tensor dev_ids_, dev_stats_;    // device: greedy id and (max, log-sum-exp) per row
  Tensor host_ids_, host_stats_;  // their host copies
  std::vector<std::pair<float, int32_t>> scratch_;
};

}  // namespace kvpr
