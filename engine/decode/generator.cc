#include "engine/decode/generator.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <limits>
#include <mutex>
#include <random>
#include <thread>

#include "engine/base/error.h"
#include "engine/base/thread_pool.h"

namespace kvpr {

struct Generator::Sequence {
  uint64_t id;
  GenerationParams params;
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<TokenLogprob>> top;
  std::vector<float> prompt_logprobs;
  std::vector<std::vector<TokenLogprob>> prompt_top;
  std::vector<int32_t> all;  // the prompt, then the generated tokens: what its KV blocks hold
  bool done = false;
  bool admitted = false;  // given KV blocks once (a preempted sequence is admitted again)
  bool long_rope = false;  // its K/V turned by longrope's long factors (ForwardChunk::long_rope)
  int64_t past_len = 0;  // tokens whose K/V are in the cache
  int64_t cached = 0;    // of the prompt's, those found in the prefix cache
  Rng rng;
  StreamDecoder decoder;
  std::string text;     // decoded so far (truncated at a stop string when one matched)
  size_t emitted = 0;   // bytes of `text` already handed out
  bool cancelled = false;
  std::unique_ptr<JsonTokenConstraint> json;  // params.json_object
  bool constraining = true;                   // json applies now (params.constrain_after seen, or none)
  std::vector<int32_t> end_ids;               // ids that end it (EOS unless ignore_eos, stop ids)
  std::vector<int32_t> checked;               // a speculative step's chunk: the last token, then drafts
  Sequence(uint64_t i, const GenerationParams& p, std::vector<int32_t> pr, uint64_t seed, const Tokenizer& t)
      : id(i), params(p), prompt(std::move(pr)), all(prompt), rng(seed), decoder(t) {}
  BlockPool::SeqId key() const { return static_cast<BlockPool::SeqId>(id); }
  // Tokens it prefills before it decodes: its prompt, or after a preemption everything but its
  // last token, which the next decode step feeds.
  int64_t prefill_end() const { return tokens.empty() ? static_cast<int64_t>(prompt.size()) : static_cast<int64_t>(all.size()) - 1; }
  bool decoding() const { return !tokens.empty() && past_len == static_cast<int64_t>(all.size()) - 1; }
  // Its next token may not end it yet (min_new_tokens): the end ids are masked out of the choice.
  // (Nor before its constrained text has begun.)
  bool holds_end() const { return static_cast<int64_t>(tokens.size()) < params.min_new_tokens || (json && !constraining); }
  JsonTokenConstraint* constraint() const { return constraining ? json.get() : nullptr; }
};

// One host thread that computes a step's masks (JsonTokenConstraint::prepare) while the device
// computes the step's logits: a mask depends only on the tokens already chosen, so the host's
// choice after the step finds it made. Once the logits are back it stops after the row it is on
// and the rest are made where the rows are chosen (on every core of the thread pool), so a step
// never waits for more than one mask. Where the device is the host, the step's kernels have the
// cores and the masks are made when the rows are chosen.
class Generator::MaskAhead {
 public:
  MaskAhead() : thread_([this] { run(); }) {}
  ~MaskAhead() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  // Begins the masks of `work` over `valid` ids; wait() before any of them advances.
  void start(std::vector<JsonTokenConstraint*> work, int32_t valid) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      work_ = std::move(work);
      valid_ = valid;
      busy_ = true;
      enough_.store(false, std::memory_order_relaxed);
    }
    wake_.notify_all();
  }
  // Stops it after the row it is on and waits for that.
  void wait() {
    enough_.store(true, std::memory_order_relaxed);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return !busy_; });
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || busy_; });
      if (stop_) return;
      std::vector<JsonTokenConstraint*> work = std::move(work_);
      const int32_t valid = valid_;
      lock.unlock();
      for (JsonTokenConstraint* c : work) {
        if (enough_.load(std::memory_order_relaxed)) break;
        try {
          c->prepare(valid);
        } catch (const std::exception&) {  // made again, and its error raised, where the row is chosen
        }
      }
      lock.lock();
      busy_ = false;
      done_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<JsonTokenConstraint*> work_;
  int32_t valid_ = 0;
  bool busy_ = false, stop_ = false;
  std::atomic<bool> enough_{false};
  std::thread thread_;  // last: started once the rest is made
};

Generator::~Generator() = default;

namespace {

// A constrained text that no token of the vocabulary continues: the sequence fails (its pick is
// kDeadEnd) rather than end `stop` on an unfinished text. The masks allow only tokens after which
// the text can be finished, so this takes a vocabulary without the bytes the text needs.
constexpr int32_t kDeadEnd = -2;
constexpr const char* kConstraintDeadEnd =
    "the constrained output cannot be finished: no token of the model's vocabulary continues it";

// The sequences that may run at once: max-batch, else 8 where the device is the host, 256 on a GPU.
int64_t running_cap(const GeneratorOptions& opts, bool device_is_host) {
  return opts.max_batch > 0 ? opts.max_batch : device_is_host ? 8 : 256;
}

constexpr double kHostShare = 0.9;  // of the host's available memory, the rest the system's
// The prefix cache's salt of blocks computed with longrope's long factors: they are found only
// by sequences that turn by them too.
constexpr uint64_t kLongRopeSalt = 0x6c6f6e67726f7065ull;

std::string gib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 1073741824.0);
  return buf;
}

}  // namespace

// The sliding-window layers' store as a ring (KvLayout::ring), in the host modes that keep one:
// room for the window of every sequence that may run (max-batch) and a step's new tokens,
// whatever the context; kept where that is fewer blocks than `plan`'s. The blocks stay as many
// (the sequences the store holds, and the step's staging buffers, which hold whole contexts, with
// them): the ring saves host memory.
void Generator::plan_ring(KvPlan& plan, const GeneratorOptions& opts, const ModelSpec& spec, const Backend* backend) {
  KvLayout& L = plan.layout;
  int64_t widest = 0;
  for (int64_t w : spec.windows) widest = std::max(widest, w);
  // (A window as long as the context never lets a block go: Phi-3.5's 262144 of 131072.)
  if (!kv_mode_uses_host(plan.kv.mode) || widest == 0 || widest >= L.max_tokens) return;
  const int64_t running = running_cap(opts, !backend || backend->device_is_host());
  const int64_t ring = running * (L.blocks_for(widest) + 3) + L.blocks_for(opts.max_step_tokens + running);
  if (ring >= L.blocks) return;
  L.window_blocks = ring;
  L.window_tokens = widest;
  const double ring_block = KvRuntime::window_block_bytes(kv_shape(spec), L, plan.kv);
  plan.why += "; sliding-window layers in a ring of " + std::to_string(ring) + " blocks (" +
              gib(static_cast<double>(ring) * ring_block) + " instead of " +
              gib(static_cast<double>(L.blocks) * ring_block) + ")";
}

KvPlan Generator::kv_plan(const GeneratorOptions& opts, const ModelSpec& spec, DType weight_dtype, const Backend* backend,
                          double host_weight_bytes, bool weights_allocated) {
  KVPR_CHECK(opts.max_batch >= 0, "max_batch must not be negative");
  KVPR_CHECK(opts.block_tokens > 0, "KV blocks need at least one token, not ", opts.block_tokens);
  KVPR_CHECK(opts.kv_cache_bytes >= 0 && opts.kv_cache_fraction >= 0 && opts.kv_cache_fraction <= 1,
             "the KV cache size must be positive bytes or a fraction in (0, 1]");
  KvPlan plan;
  const int64_t max_tokens = opts.max_seq_len > 0 ? std::min(opts.max_seq_len, spec.max_position_embeddings)
                                                  : spec.max_position_embeddings;
  plan.layout.max_tokens = max_tokens;
  plan.layout.block_tokens = std::min(opts.block_tokens, max_tokens);
  plan.kv = opts.kv;
  plan.kv.kv_dtype = opts.kv_dtype.value_or(weight_dtype);
  double bytes = opts.kv_cache_bytes;
  if (opts.kv_cache_fraction > 0) {
    const bool device = !kv_mode_uses_host(plan.kv.mode) && !(backend && backend->device_is_host());
    if (device && !backend) return plan;  // sized once the device is known (the Generator's)
    const size_t avail = device ? backend->device_bytes_free() : host_bytes_available();
    KVPR_CHECK(avail != SIZE_MAX, "kv-cache as a fraction needs to know the memory available, which this system does not say");
    // On a GPU the store is sized before the step's activations, logits and scratch exist: a
    // twentieth of the free memory stays theirs, whatever the fraction.
    bytes = std::min(opts.kv_cache_fraction, device ? 0.95 : 1.0) * static_cast<double>(avail);
  }
  const KvShape shape = kv_shape(spec);
  const double block = KvRuntime::block_bytes(shape, plan.layout, plan.kv);
  if (bytes > 0) {
    plan.layout.blocks = static_cast<int64_t>(std::min(bytes / block, 2147483647.0));
    KVPR_CHECK(plan.layout.blocks >= plan.layout.blocks_for(2), "a KV cache of ", bytes,
               " bytes holds less than one block of ", plan.layout.block_tokens, " tokens (", block, " bytes)");
    plan.why = opts.kv_cache_fraction > 0 ? "kv-cache " + json::Value(opts.kv_cache_fraction).dump() + " of the memory available"
                                          : "kv-cache " + gib(bytes);
    plan_ring(plan, opts, spec, backend);
    return plan;
  }
  const int64_t batch = opts.max_batch > 0 ? opts.max_batch : 8;
  plan.layout.blocks = batch * plan.layout.blocks_for(max_tokens);
  plan.why = "room for max-batch " + std::to_string(batch) + " sequences of max-seq-len " + std::to_string(max_tokens) +
             " tokens";
  // In host memory the store takes at most what the host has for it: sequences take blocks as
  // they grow, so max-batch is a cap on running sequences, not a reservation.
  const bool host_store = kv_mode_uses_host(plan.kv.mode) || (backend && backend->device_is_host());
  if (!host_store) return plan;
  const size_t avail = host_bytes_available();
  double room = opts.host_memory > 0 ? opts.host_memory - host_weight_bytes : 1e300;
  std::string bound = opts.host_memory > 0 ? "host-memory " + gib(opts.host_memory) : "";
  if (avail != SIZE_MAX) {
    const double left = kHostShare * static_cast<double>(avail) - (weights_allocated ? 0 : host_weight_bytes);
    if (left < room) {
      room = left;
      bound = "90% of the " + gib(static_cast<double>(avail)) + " of host memory available";
    }
  }
  const auto fits = static_cast<int64_t>(std::clamp(room / block, 0.0, 2147483647.0));
  if (fits >= plan.layout.blocks) {
    plan_ring(plan, opts, spec, backend);
    return plan;
  }
  plan.layout.blocks = std::max(fits, plan.layout.blocks_for(2));
  plan.why = "what " + bound + " leaves after " + gib(host_weight_bytes) + " of weights in host memory (max-batch " +
             std::to_string(batch) + " x max-seq-len " + std::to_string(max_tokens) + " would take " +
             gib(static_cast<double>(batch * plan.layout.blocks_for(max_tokens)) * block) + ")";
  plan_ring(plan, opts, spec, backend);
  return plan;
}

Generator::Generator(Model& model, const Tokenizer& tokenizer, const GeneratorOptions& opts)
    : model_(model), tok_(tokenizer) {
  plan_ = kv_plan(opts, model.spec(), model.weight_dtype(), &model.backend(), model.host_weight_bytes(), true);
  const KvPlan& plan = plan_;
  max_seq_len_ = plan.layout.max_tokens;
  KVPR_CHECK(opts.max_step_tokens > 0, "max_step_tokens must be positive");
  max_step_tokens_ = opts.max_step_tokens;
  // A graph step cannot hold the per-layer copies and event waits of KV or weights that move.
  cuda_graphs_ = opts.cuda_graphs && opts.kv.mode == KvMode::Resident && !model.weight_stream() &&
                 model.graph_capturable();
  // Ids the tokenizer cannot produce (OPT pads its embedding to 50272) are never sampled.
  valid_vocab_ = static_cast<int32_t>(std::min<int64_t>(model.spec().vocab_size, tokenizer.size()));
  runtime_ = model.make_kv_runtime(plan.layout, plan.kv);
  pool_ = std::make_unique<BlockPool>(plan.layout.blocks, plan.layout.block_tokens);
  if (plan.layout.ring())
    window_pool_ = std::make_unique<BlockPool>(plan.layout.window_blocks, plan.layout.block_tokens, plan.layout.window_tokens);
  long_rope_after_ = model.spec().long_rope_after;
  max_batch_ = static_cast<size_t>(running_cap(opts, model.backend().device_is_host()));
  prefix_caching_ = opts.prefix_caching;
  KVPR_CHECK(opts.speculative_tokens >= 0 && opts.speculative_tokens <= 64, "speculative_tokens must be in 0..64");
  KVPR_CHECK(opts.prompt_lookup_min >= 1 && opts.prompt_lookup_max >= opts.prompt_lookup_min,
             "prompt lookup needs 1 <= prompt_lookup_min <= prompt_lookup_max");
  speculative_tokens_ = opts.speculative_tokens;
  lookup_max_ = opts.prompt_lookup_max;
  lookup_min_ = opts.prompt_lookup_min;
  json_options_.permissive_whitespace = opts.permissive_json_whitespace;
}

std::vector<int32_t> Generator::propose(const Sequence& s, int64_t most) const {
  const int64_t P = static_cast<int64_t>(s.prompt.size()), L = P + static_cast<int64_t>(s.tokens.size());
  auto at = [&](int64_t i) { return i < P ? s.prompt[static_cast<size_t>(i)] : s.tokens[static_cast<size_t>(i - P)]; };
  for (int64_t n = std::min<int64_t>(lookup_max_, L - 1); n >= lookup_min_; --n) {
    // The latest i < L - n with at(i .. i + n) equal to the last n tokens.
    for (int64_t i = L - n - 1; i >= 0; --i) {
      int64_t j = 0;
      while (j < n && at(i + j) == at(L - n + j)) ++j;
      if (j < n) continue;
      std::vector<int32_t> drafts;
      for (int64_t d = i + n; d < L && static_cast<int64_t>(drafts.size()) < most; ++d) drafts.push_back(at(d));
      return drafts;
    }
  }
  return {};
}

uint64_t Generator::add(std::vector<int32_t> prompt, const GenerationParams& params) {
  KVPR_CHECK(!prompt.empty(), "the prompt is empty");
  KVPR_CHECK(params.max_new_tokens >= 0, "max_tokens must be >= 0, got ", params.max_new_tokens);
  KVPR_CHECK(params.min_new_tokens >= 0 && params.min_new_tokens <= params.max_new_tokens, "min_tokens must be in 0..",
             params.max_new_tokens, " (max_tokens), got ", params.min_new_tokens);
  validate(params.sampling);
  const int64_t vocab = model_.spec().vocab_size;
  for (int32_t t : prompt)
    KVPR_CHECK(t >= 0 && t < vocab, "token id ", t, " is out of range [0, ", vocab, ")");
  KVPR_CHECK(static_cast<int64_t>(prompt.size()) < max_seq_len_, "the prompt has ", prompt.size(),
             " tokens but the context holds ", max_seq_len_);
  // A prompt and its first new token must fit the whole KV cache, or it could never run.
  KVPR_CHECK(pool_->blocks_for(static_cast<int64_t>(prompt.size()) + 1) <= pool_->total_blocks(), "the prompt has ",
             prompt.size(), " tokens but the KV cache holds ", pool_->total_blocks() * pool_->block_tokens());
  for (const auto& s : params.stop) KVPR_CHECK(!s.empty(), "stop strings must not be empty");
  KVPR_CHECK(params.top_logprobs >= 0 && params.top_logprobs <= 20, "top_logprobs must be in 0..20, got ",
             params.top_logprobs);
  KVPR_CHECK(params.prompt_logprobs >= -1 && params.prompt_logprobs <= 20, "prompt_logprobs must be in -1..20, got ",
             params.prompt_logprobs);
  KVPR_CHECK(params.constrain_after.size() <= 16, "constrain_after holds at most 16 ids, not ", params.constrain_after.size());
  for (int32_t t : params.constrain_after)
    KVPR_CHECK(t >= 0 && t < valid_vocab_, "constrain_after id ", t, " is not in the vocabulary");
  uint64_t seed = params.sampling.seed ? *params.sampling.seed : std::random_device{}();
  uint64_t id = next_id_++;
  auto seq = std::make_unique<Sequence>(id, params, std::move(prompt), seed, tok_);
  if (params.json_object || !params.json_schema.is_null()) {
    if (!json_object_table_) {  // each id's text as the output shows it (special tokens: none)
      auto v = std::make_shared<JsonTokenConstraint::Vocabulary>(static_cast<size_t>(valid_vocab_));
      for (int32_t t = 0; t < valid_vocab_; ++t) (*v)[static_cast<size_t>(t)] = tok_.token_bytes(t, true);
      json_object_table_ = std::make_shared<JsonMaskTable>(std::move(v), json_options_);
    }
    seq->json = std::make_unique<JsonTokenConstraint>(!params.json_schema.is_null() ? schema_table(params.json_schema)
                                                                                    : json_object_table_);
    seq->constraining = params.constrain_after.empty();
  }
  if (!params.ignore_eos) {
    if (tok_.eos_id()) seq->end_ids.push_back(*tok_.eos_id());
    for (int32_t e : tok_.extra_eos_ids()) seq->end_ids.push_back(e);
  }
  for (int32_t e : params.stop_token_ids) seq->end_ids.push_back(e);
  for (int32_t t : params.constrain_after)  // held back until it is written: it never would be
    KVPR_CHECK(!seq->json || std::find(seq->end_ids.begin(), seq->end_ids.end(), t) == seq->end_ids.end(),
               "constrain_after id ", t, " also ends the sequence");
  waiting_.push_back(std::move(seq));
  return id;
}

std::shared_ptr<JsonMaskTable> Generator::schema_table(const json::Value& schema) {
  std::string key = schema.dump();
  for (auto it = schema_tables_.begin(); it != schema_tables_.end(); ++it)
    if (it->first == key) {
      if (it->second->schema()->saturated()) {  // compiled afresh: its caps are this request's again
        schema_tables_.erase(it);
        break;
      }
      schema_tables_.splice(schema_tables_.begin(), schema_tables_, it);  // most recently used first
      return it->second;
    }
  for (auto it = refused_schemas_.begin(); it != refused_schemas_.end(); ++it)
    if (it->first == key) {
      refused_schemas_.splice(refused_schemas_.begin(), refused_schemas_, it);  // most recently refused first
      throw RequestRefused("json_schema", it->second);
    }
  try {
    auto compiled = std::make_shared<const JsonSchema>(JsonSchema::compile(schema));
    schema_tables_.emplace_front(std::move(key), json_object_table_->sibling(std::move(compiled), json_options_));
    if (schema_tables_.size() > kSchemaTables) schema_tables_.pop_back();
    return schema_tables_.front().second;
  } catch (const Error& e) {
    refused_schemas_.emplace_front(std::move(key), e.what());
    if (refused_schemas_.size() > kRefusedSchemas) refused_schemas_.pop_back();
    throw RequestRefused("json_schema", e.what());
  }
}

void Generator::cancel(uint64_t id) {
  for (auto& s : waiting_)
    if (s->id == id) s->cancelled = true;
  for (auto& s : running_)
    if (s->id == id) s->cancelled = true;
}

int64_t Generator::cached_tokens() const {
  int64_t n = 0;
  for (const auto& s : running_) n += s->past_len;
  return n;
}

SequenceResult Generator::take_result(uint64_t id) {
  auto it = done_.find(id);
  KVPR_CHECK(it != done_.end(), "sequence ", id, " has not finished");
  SequenceResult r = std::move(it->second);
  done_.erase(it);
  return r;
}

// Text that can be shown now: everything when final, else all but a suffix that could still
// grow into a stop string.
std::string Generator::take_visible_text(Sequence& s, bool final) {
  size_t limit = s.text.size();
  if (!final) {
    for (const auto& stop : s.params.stop) {
      for (size_t k = std::min(stop.size() - 1, s.text.size()); k > 0; --k) {
        if (s.text.compare(s.text.size() - k, k, stop, 0, k) == 0) {
          limit = std::min(limit, s.text.size() - k);
          break;
        }
      }
    }
  }
  if (limit <= s.emitted) return "";
  std::string out = s.text.substr(s.emitted, limit - s.emitted);
  s.emitted = limit;
  return out;
}

void Generator::finish(Sequence& s, FinishReason r, bool flush_decoder, std::vector<StepOutput>& out,
                       StepOutput& ev) {
  if (flush_decoder) s.text += s.decoder.finish();  // bytes held back for an unfinished character
  ev.finish = r;
  ev.text += take_visible_text(s, true);
  out.push_back(ev);
  release_blocks(s);
  SequenceResult res;
  res.cached_tokens = s.cached;
  res.prompt = std::move(s.prompt);
  res.tokens = std::move(s.tokens);
  res.logprobs = std::move(s.logprobs);
  res.top = std::move(s.top);
  res.prompt_logprobs = std::move(s.prompt_logprobs);
  res.prompt_top = std::move(s.prompt_top);
  res.text = std::move(s.text);
  res.finish = r;
  done_[s.id] = std::move(res);
  s.done = true;
}

void Generator::release_blocks(Sequence& s) {
  if (!pool_->holds(s.key())) return;
  // The blocks of every token that went through the model stay cached for later prompts.
  commit_blocks(s);
  pool_->release(s.key());
  if (window_pool_) window_pool_->release(s.key());
}

void Generator::commit_blocks(Sequence& s) {
  const auto done = std::span<const int32_t>(s.all).first(static_cast<size_t>(s.past_len));
  pool_->commit(s.key(), done);
  if (window_pool_) window_pool_->commit(s.key(), done);
}

bool Generator::extend_blocks(Sequence& s, int64_t tokens) {
  std::vector<BlockPool::Copy> copies;
  const bool ok = pool_->extend(s.key(), tokens, &copies) && (!window_pool_ || window_pool_->extend(s.key(), tokens, &copies));
  KVPR_CHECK(copies.empty(), "KV blocks: a running sequence shares a partial block");  // forks only
  return ok;
}

KvBlockStats Generator::kv_block_stats() const {
  return KvBlockStats{pool_->block_tokens(), pool_->total_blocks(), pool_->used_blocks(), pool_->free_blocks(),
                      pool_->cached_blocks(), preemptions_, rope_recomputes_,
                      window_pool_ ? window_pool_->total_blocks() : 0, window_pool_ ? window_pool_->used_blocks() : 0};
}

bool Generator::past_original_context(const Sequence& s) const {
  return long_rope_after_ > 0 && static_cast<int64_t>(s.all.size()) > long_rope_after_;
}

bool Generator::admit(Sequence& s) {
  const bool fresh = s.tokens.empty();
  const bool share = prefix_caching_ && s.params.prompt_logprobs < 0;
  const auto need = std::span<const int32_t>(s.all).first(static_cast<size_t>(s.prefill_end()));
  // A prompt past longrope's original context turns by the long factors from its first token, as
  // transformers runs a prompt that long; its blocks are cached apart from the short ones'.
  const bool long_rope = past_original_context(s);
  const uint64_t salt = long_rope ? kLongRopeSalt : 0;
  // The cached prefix: blocks of every layer's, and of the ring's those the window of the first
  // token after it reads.
  int64_t hits = share ? pool_->match_blocks(need, salt) : 0;
  if (window_pool_) hits = window_pool_->match_blocks(need, salt, hits);
  const auto cached = need.first(static_cast<size_t>(hits * pool_->block_tokens()));
  // Room for the prompt, and a block for each running sequence's next token; the ring takes the
  // cached blocks now and the rest chunk by chunk (add_prefill), room for its window kept.
  const int64_t running = static_cast<int64_t>(running_.size());
  if (!pool_->can_admit(need, running, hits, salt)) return false;
  if (window_pool_) {
    // Blocks for its window beside those it finds (all it takes alone: a lone sequence always
    // fits, plan_ring's ring holding a window and a step).
    const int64_t found = hits - window_pool_->first_block_read(hits * pool_->block_tokens());
    const int64_t window = std::max<int64_t>(
        1, window_pool_->blocks_for(std::min(static_cast<int64_t>(need.size()), window_pool_->window())) + 1 - found);
    if (!window_pool_->can_admit(cached, running_.empty() ? 0 : running + window, hits, salt)) return false;
  }
  std::vector<BlockPool::Copy> copies;
  KVPR_CHECK(pool_->allocate(s.key(), need, &copies, hits, salt) && copies.empty(), "KV blocks: admission failed");
  if (window_pool_)
    KVPR_CHECK(window_pool_->allocate(s.key(), cached, &copies, hits, salt) && copies.empty(),
               "KV blocks: admission to the sliding-window ring failed");
  s.long_rope = long_rope;
  s.past_len = pool_->tokens(s.key());  // the cached prefix
  if (fresh && !s.admitted) {  // not a preempted prompt's second admission
    s.admitted = true;
    s.cached = s.past_len;
    if (share) {
      prefix_stats_.queries += static_cast<int64_t>(s.prompt.size());
      prefix_stats_.hits += s.past_len;
    }
  }
  return true;
}

void Generator::preempt(Sequence& s) {
  release_blocks(s);
  s.past_len = 0;
  ++preemptions_;
  if (s.tokens.empty()) {  // its prompt is prefilled (and scored) again from the start
    s.prompt_logprobs.clear();
    s.prompt_top.clear();
  }
}

bool Generator::reserve_blocks(Sequence& s, int64_t tokens, std::vector<StepOutput>& out) {
  while (!extend_blocks(s, tokens)) {
    // The newest running sequence gives its blocks back and waits at the head of the queue.
    auto newest = std::find_if(running_.rbegin(), running_.rend(), [](const auto& r) { return !r->done; });
    Sequence& victim = **newest;
    if (&victim == &s && std::count_if(running_.begin(), running_.end(), [](const auto& r) { return !r->done; }) == 1) {
      // Alone, it still cannot grow: the KV cache holds no more of it.
      StepOutput ev;
      ev.id = s.id;
      finish(s, FinishReason::Length, true, out, ev);
      return false;
    }
    preempt(victim);
    auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& r) { return r.get() == &victim; });
    waiting_.insert(waiting_.begin(), std::move(*it));
    running_.erase(it);
    if (&victim == &s) return false;
  }
  return true;
}

bool Generator::emit_token(Sequence& s, const Sampled& pick, std::vector<TokenLogprob> top, StepOutput ev,
                           std::vector<StepOutput>& out) {
  if (s.params.top_logprobs > 0) s.top.push_back(top);
  s.tokens.push_back(pick.token);
  s.all.push_back(pick.token);
  s.logprobs.push_back(pick.logprob);
  ev.token = pick.token;
  ev.logprob = pick.logprob;
  ev.top = std::move(top);
  const bool is_eos = tok_.is_eos(pick.token) && !s.params.ignore_eos;
  const auto& stop_ids = s.params.stop_token_ids;
  if (is_eos || std::find(stop_ids.begin(), stop_ids.end(), pick.token) != stop_ids.end()) {
    finish(s, FinishReason::Stop, true, out, ev);
    return true;
  }
  size_t before = s.text.size();
  at_stage(SequenceStage::Detokenize, s);
  s.text += s.decoder.push(pick.token);
  // Stop strings: search only where a new match could start (and, as vLLM does, not before
  // min_new_tokens tokens).
  at_stage(SequenceStage::StopMatch, s);
  size_t cut = std::string::npos;
  const bool match = static_cast<int64_t>(s.tokens.size()) >= s.params.min_new_tokens;
  for (const auto& stop : match ? s.params.stop : std::vector<std::string>{}) {
    size_t from = before >= stop.size() ? before - stop.size() + 1 : 0;
    size_t f = s.text.find(stop, from);
    if (f != std::string::npos) cut = std::min(cut, f);
  }
  if (cut != std::string::npos) {
    s.text.resize(std::max(cut, s.emitted));
    finish(s, FinishReason::Stop, false, out, ev);
    return true;
  }
  bool at_limit = static_cast<int>(s.tokens.size()) >= s.params.max_new_tokens || s.past_len + 1 >= max_seq_len_;
  if (at_limit) {
    finish(s, FinishReason::Length, true, out, ev);
    return true;
  }
  ev.text = take_visible_text(s, false);
  out.push_back(ev);
  return false;
}

void Generator::accept_drafts(Sequence& s, const ForwardChunk& c, int64_t first_row, bool host_rows,
                              std::vector<StepOutput>& out) {
  // Row j holds the logits after chunk token j (the last token, then draft j). The token chosen
  // there is the next one; while it is draft j + 1 (for sampled sequences: while speculative
  // sampling accepts it), that draft's K/V, computed in this chunk, stand and row j + 1 chooses
  // the token after it.
  const int32_t* ids = host_ids_.data_as<int32_t>();
  const float* stats = host_stats_.data_as<float>();
  const int64_t V = model_.spec().vocab_size;
  const SamplingParams& sp = s.params.sampling;
  const bool greedy = sp.temperature == 0.f || sp.top_k == 1;
  const int64_t past = c.past_len;
  for (int64_t j = 0; j < c.count; ++j) {
    const int64_t r = first_row + j;
    const int32_t draft = j + 1 < c.count ? c.tokens[j + 1] : -1;
    Sampled pick{ids[r], stats[2 * r] - stats[2 * r + 1]};
    bool accepted = pick.token == draft;
    std::vector<TokenLogprob> top;
    if (host_rows) {  // sampled, adjusted, constrained or with alternatives: from the logits on the host
      const float* row = logits_.data_as<float>() + r * V;
      if (s.params.top_logprobs > 0) top = top_logprobs(row, valid_vocab_, s.params.top_logprobs, stats[2 * r + 1], scratch_);
      std::vector<float> adjusted;
      if (sp.adjusts_logits() || s.constraint()) adjusted.assign(row, row + V);
      // Penalties count the drafts taken so far as generated; the JSON mask follows them too (the
      // constraint advances by each token handed out, drafts included, and by nothing else).
      if (sp.adjusts_logits()) adjust_logits(adjusted.data(), valid_vocab_, sp, s.prompt, s.tokens);
      if (s.constraint()) at_stage(SequenceStage::Constraint, s);
      if (s.constraint() && s.constraint()->mask(adjusted.data(), valid_vocab_, s.end_ids) == 0) {
        s.past_len = past + 1 + j;
        if (!s.constraint()->complete()) {  // no token of the vocabulary continues the text
          fail_sequence(s, kConstraintDeadEnd, out);
          return;
        }
        StepOutput ev;  // a complete text with nothing allowed after it, and no end id to say so
        ev.id = s.id;
        finish(s, FinishReason::Stop, true, out, ev);
        return;
      }
      const float* choose = adjusted.empty() ? row : adjusted.data();
      at_stage(SequenceStage::Sampling, s);
      int32_t t;
      if (greedy) {
        t = row_argmax_lse(choose, valid_vocab_).token;
        accepted = t == draft;
      } else if (draft >= 0) {
        const Speculated sd = speculative_sample(choose, valid_vocab_, sp, s.rng, scratch_, draft);
        t = sd.pick.token;
        accepted = sd.accepted;
      } else {
        t = sample_token(choose, valid_vocab_, sp, s.rng, scratch_).token;
      }
      pick = Sampled{t, static_cast<float>(static_cast<double>(row[t]) - stats[2 * r + 1])};
      advance_constraint(s, t);
    }
    s.past_len = past + 1 + j;  // K/V of the last token and of the drafts taken so far
    StepOutput ev;
    ev.id = s.id;
    if (emit_token(s, pick, std::move(top), ev, out)) return;
    if (!accepted) return;  // the rest of the drafts are off
    ++spec_stats_.accepted;
  }
}

// ---- one step: plan (decodes, then prompt chunks) -> forward -> choose -> emit

// A step's work: the sequences, their chunks of tokens, and the logits rows each reads.
struct Generator::StepPlan {
  std::vector<Sequence*> batch;
  std::vector<ForwardChunk> chunks;
  std::vector<char> speculates;      // per chunk: the last token and drafts, one logits row each
  std::vector<char> chooses;         // per chunk: its sequence chooses a token this step
  std::vector<int64_t> first, last;  // per chunk: its logits rows; last[i] gives the next token
  int64_t rows = 0;
  bool need_logits = false;  // some row is read on the host
  bool scores_prompt(size_t i) const { return chunks[i].all_rows && !speculates[i]; }
  void add(Sequence* s, const ForwardChunk& c, bool speculative, bool choose) {
    batch.push_back(s);
    chunks.push_back(c);
    speculates.push_back(speculative);
    chooses.push_back(choose);
  }
};

// The host's choices per chunk: its token, and the alternatives reported with it.
struct Generator::StepChoices {
  std::vector<Sampled> picks;
  std::vector<std::vector<TokenLogprob>> tops;
  std::vector<std::string> errors;  // a sequence whose host choice threw: it ends with the error
};

void Generator::at_stage(SequenceStage stage, const Sequence& s) const {
  if (fault_hook_) fault_hook_(stage, s.id);
}

// The constraint follows the text; an end id ends the sequence and is no text (a model whose end
// id is an ordinary token, such as Qwen2.5's "#" under an eos_token_id of 2, must not feed it to
// the JSON recognizer).
void Generator::advance_constraint(Sequence& s, int32_t t) {
  if (!s.json || std::find(s.end_ids.begin(), s.end_ids.end(), t) != s.end_ids.end()) return;
  if (!s.constraining) {  // free text until it ends with constrain_after (t its last id)
    const std::vector<int32_t>& after = s.params.constrain_after;
    const size_t k = after.size() - 1;
    s.constraining = t == after.back() && s.tokens.size() >= k &&
                     std::equal(after.begin(), after.begin() + static_cast<std::ptrdiff_t>(k), s.tokens.end() - static_cast<std::ptrdiff_t>(k));
    return;
  }
  at_stage(SequenceStage::Constraint, s);
  s.json->advance(t);
}

void Generator::fail_sequence(Sequence& s, const std::string& why, std::vector<StepOutput>& out) {
  StepOutput ev;
  ev.id = s.id;
  ev.error = why;
  // The text so far stays as the result's; the decoder's held bytes may be what failed.
  finish(s, FinishReason::Error, false, out, ev);
}

namespace {
bool is_greedy(const GenerationParams& p) { return p.sampling.temperature == 0.f || p.sampling.top_k == 1; }
}  // namespace

std::vector<StepOutput> Generator::step(const LogitsObserver& observer) {
  std::vector<StepOutput> out;
  retire_cancelled(out);
  StepPlan p;
  plan_decodes(p, !observer, out);
  plan_prefills(p, out);
  if (p.batch.empty()) {
    running_.erase(std::remove_if(running_.begin(), running_.end(), [&](const auto& s) { return s->done; }), running_.end());
    // Prompts that wait for the ring's blocks and nothing that decodes to give them back: the
    // newest gives its blocks back and waits at the head of the queue (alone, the plan's ring
    // always holds its window and its next token).
    if (window_pool_ && running_.size() > 1) {
      preempt(*running_.back());
      waiting_.insert(waiting_.begin(), std::move(running_.back()));
      running_.pop_back();
    }
    return out;
  }
  // Every chunk reads its sequence's block table (final now: no more admissions this step).
  for (size_t i = 0; i < p.batch.size(); ++i) {
    p.chunks[i].blocks = pool_->table(p.batch[i]->key());
    if (window_pool_) p.chunks[i].window_blocks = window_pool_->table(p.batch[i]->key());
  }
  plan_rows(p, observer);
  // The masks of the constrained rows, on a host thread while the device runs the step.
  std::vector<JsonTokenConstraint*> masks;
  if (!model_.backend().device_is_host() && p.need_logits && !observer)
    for (size_t i = 0; i < p.batch.size(); ++i)
      if ((p.chooses[i] || p.speculates[i]) && p.batch[i]->constraint()) masks.push_back(p.batch[i]->constraint());
  const bool ahead = !masks.empty();
  if (ahead) {
    if (!mask_ahead_) mask_ahead_ = std::make_unique<MaskAhead>();
    mask_ahead_->start(std::move(masks), valid_vocab_);
  }
  {
    struct Join {  // the thread reads the sequences: it is done before anything else touches them
      MaskAhead* m;
      ~Join() {
        if (m) m->wait();
      }
    } join{ahead ? mask_ahead_.get() : nullptr};
    forward(p);
  }
  StepChoices choices;
  choices.picks.resize(p.batch.size());
  choices.tops.resize(p.batch.size());
  choices.errors.resize(p.batch.size());
  take_device_choices(p, choices);
  if (p.need_logits && !observer) {
    ThreadPool::global().parallel_for(static_cast<int64_t>(p.batch.size()), 1, [&](int64_t b, int64_t e) {
      std::vector<std::pair<float, int32_t>> scratch;
      for (int64_t i = b; i < e; ++i) choose_on_host(p, static_cast<size_t>(i), choices, scratch);
    });
  }
  emit(p, choices, observer, out);
  running_.erase(std::remove_if(running_.begin(), running_.end(), [&](const auto& s) { return s->done; }), running_.end());
  return out;
}

void Generator::retire_cancelled(std::vector<StepOutput>& out) {
  for (auto* v : {&waiting_, &running_})
    for (auto it = v->begin(); it != v->end();) {
      if (!(*it)->cancelled) {
        ++it;
        continue;
      }
      StepOutput ev;
      ev.id = (*it)->id;
      finish(**it, FinishReason::Cancelled, true, out, ev);
      it = v->erase(it);
    }
}

// One token of every decoding sequence, with the drafts it may check (prompt lookup) when
// `speculate`: they take what the step's token budget leaves after one token per sequence.
// Each gets the KV blocks its chunk writes; when the pool is short, the newest sequences are
// preempted (reserve_blocks).
void Generator::plan_decodes(StepPlan& p, bool speculate, std::vector<StepOutput>& out) {
  int64_t spare = max_step_tokens_;
  for (auto& s : running_) spare -= s->decoding();
  for (size_t i = 0; i < running_.size();) {
    Sequence* s = running_[i].get();
    if (s->done || !s->decoding()) {
      ++i;
      continue;
    }
    if (past_original_context(*s) && !s->long_rope) {
      // Its next token takes it past longrope's original context: as transformers does there
      // (it drops its cache), every token is computed again with the long factors. It gives its
      // blocks back and prefills again, first in the queue.
      ++rope_recomputes_;
      release_blocks(*s);
      s->past_len = 0;
      waiting_.insert(waiting_.begin(), std::move(running_[i]));
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    ForwardChunk c;
    c.past_len = s->past_len;
    c.tokens = &s->tokens.back();
    c.count = 1;
    c.long_rope = s->long_rope;
    // Drafts to check: never more than the tokens still allowed after the model's own next one,
    // nor past the context, nor past the step's budget, nor (turning by longrope's short factors)
    // past the original context, where the tokens after them would turn by the long ones.
    const int64_t room = std::min<int64_t>({speculative_tokens_, spare,
                                            s->params.max_new_tokens - static_cast<int64_t>(s->tokens.size()) - 1,
                                            max_seq_len_ - s->past_len - 2,
                                            long_rope_after_ > 0 && !s->long_rope ? long_rope_after_ - s->past_len - 1
                                                                                  : int64_t{1} << 40});
    // (None while its end is held back: each of those tokens is chosen from masked logits.)
    const std::vector<int32_t> drafts = room > 0 && speculate && !s->holds_end() ? propose(*s, room) : std::vector<int32_t>();
    if (!drafts.empty()) {
      s->checked.assign(1, s->tokens.back());
      s->checked.insert(s->checked.end(), drafts.begin(), drafts.end());
      c.tokens = s->checked.data();
      c.count = static_cast<int64_t>(s->checked.size());
      c.all_rows = true;
    }
    // Drafts only where their blocks are free: they never preempt a sequence or end this one.
    if (c.count > 1 && !extend_blocks(*s, c.past_len + c.count)) {
      c.tokens = &s->tokens.back();
      c.count = 1;
      c.all_rows = false;
    }
    if (!reserve_blocks(*s, c.past_len + c.count, out)) {
      if (s->done) ++i;  // ended where it stands; else it left running_ and i is the next one
      continue;
    }
    const int64_t checked = c.count - 1;  // drafts kept
    spec_stats_.proposed += checked;
    spare -= checked;
    p.add(s, c, checked > 0, true);
    ++i;
  }
}

// Prompt chunks while the token budget lasts (at least one prompt token a step, however many
// sequences decode): those of prompts already being prefilled, then of waiting sequences
// admitted (FIFO) while the batch has room and the KV pool their prompt (admit). A prompt longer
// than what is left goes on in the next steps (chunked prefill).
void Generator::plan_prefills(StepPlan& p, std::vector<StepOutput>& out) {
  int64_t decodes = 0;
  for (const ForwardChunk& c : p.chunks) decodes += c.count;
  int64_t budget = std::max<int64_t>(max_step_tokens_ - decodes, 1);
  auto add_prefill = [&](Sequence* s) {
    ForwardChunk c;
    c.past_len = s->past_len;
    c.long_rope = s->long_rope;
    c.tokens = s->all.data() + s->past_len;
    c.count = std::min(s->prefill_end() - s->past_len, budget);
    if (window_pool_) {  // the ring's blocks for the chunk: as many tokens as its free blocks take
      const int64_t B = window_pool_->block_tokens();
      const int64_t held = static_cast<int64_t>(window_pool_->table(s->key()).size());
      c.count = std::min(c.count, (held + window_pool_->free_blocks()) * B - c.past_len);
      if (c.count <= 0 || !extend_blocks(*s, c.past_len + c.count)) return;  // it waits for blocks to come back
    }
    const bool fresh = s->tokens.empty();  // not a preempted sequence's second prefill
    c.all_rows = fresh && s->params.prompt_logprobs >= 0;
    budget -= c.count;
    p.add(s, c, false, fresh && c.past_len + c.count == s->prefill_end());
  };
  for (auto& s : running_)
    if (budget > 0 && !s->done && s->past_len < s->prefill_end()) add_prefill(s.get());
  size_t live = static_cast<size_t>(std::count_if(running_.begin(), running_.end(), [](const auto& r) { return !r->done; }));
  while (budget > 0 && !waiting_.empty() && live < max_batch_) {
    Sequence& s = *waiting_.front();
    if (s.params.max_new_tokens == 0 && s.params.prompt_logprobs < 0) {
      auto done = std::move(waiting_.front());
      waiting_.erase(waiting_.begin());
      StepOutput ev;
      ev.id = done->id;
      finish(*done, FinishReason::Length, true, out, ev);
      continue;
    }
    if (!admit(s)) break;  // the pool is short: it waits for blocks to come back
    auto seq = std::move(waiting_.front());
    waiting_.erase(waiting_.begin());
    if (seq->past_len < seq->prefill_end()) add_prefill(seq.get());
    running_.push_back(std::move(seq));
    ++live;
  }
}

// Which chunks choose a token (their prompt completes, or they decode), their logits rows (one
// per chunk, its last token's, or one per token of a chunk whose prompt is scored), and whether
// any row must come to the host: a row that samples (temperature), alternatives or prompt
// scores asked for, logits adjusted or masked, or an observer.
void Generator::plan_rows(StepPlan& p, const LogitsObserver& observer) {
  const size_t n = p.batch.size();
  p.first.resize(n);
  p.last.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Sequence& s = *p.batch[i];
    p.first[i] = p.rows;
    p.rows += p.chunks[i].all_rows ? p.chunks[i].count : 1;
    p.last[i] = p.rows - 1;
    p.need_logits = p.need_logits || p.scores_prompt(i) ||
                    (p.chooses[i] && (observer || !is_greedy(s.params) || s.params.top_logprobs > 0 ||
                                      s.params.sampling.adjusts_logits() || s.json || s.holds_end()));
  }
}

// The forward pass, then the greedy choice and log-sum-exp of every row on the device; the
// logits themselves come to the host only when p.need_logits.
void Generator::forward(const StepPlan& p) {
  Backend& be = model_.backend();
  // A step that only decodes is the same work every step (until the number of sequences changes
  // or the longest context passes 256, 512, 1024, ... tokens): recorded, it is replayed as one
  // CUDA graph.
  bool graph_step = cuda_graphs_;
  for (const ForwardChunk& c : p.chunks) graph_step = graph_step && c.count == 1 && !c.all_rows;
  GraphStepScope graph(be, graph_step);
  Tensor dev_logits = model_.forward_device(p.chunks, *runtime_);
  const int64_t rows = p.rows;
  if (!dev_ids_.defined() || dev_ids_.numel() < rows) {
    const int64_t cap = std::max<int64_t>(rows, 64);
    dev_ids_ = be.alloc(DType::I32, {cap});
    dev_stats_ = be.alloc(DType::F32, {cap, 2});
    // Pinned: the copies below stay asynchronous (into pageable memory each would make the host
    // wait), so the step costs the host one wait, for the compute stream only.
    host_ids_ = be.alloc_pinned(DType::I32, {cap});
    host_stats_ = be.alloc_pinned(DType::F32, {cap, 2});
  }
  be.argmax_lse(dev_ids_.rows(0, rows), dev_stats_.rows(0, rows), dev_logits, valid_vocab_);
  be.copy(host_ids_.rows(0, rows), dev_ids_.rows(0, rows), Stream::Compute);
  be.copy(host_stats_.rows(0, rows), dev_stats_.rows(0, rows), Stream::Compute);
  if (p.need_logits) {
    if (!logits_.defined() || logits_.dim(0) < rows) logits_ = be.alloc_pinned(DType::F32, {rows, model_.spec().vocab_size});
    be.copy(logits_.rows(0, rows), dev_logits, Stream::Compute);
  }
  last_graph_ = graph.end();
  // Only the compute stream: the KV runtime's last write-backs may still run on the copy
  // streams while the host samples (its own events order them before their buffers' reuse).
  be.synchronize(be.record(Stream::Compute));
}

// Greedy rows take the device's choice.
void Generator::take_device_choices(const StepPlan& p, StepChoices& ch) const {
  const float* stats = host_stats_.data_as<float>();
  for (size_t i = 0; i < p.batch.size(); ++i) {
    if (!p.chooses[i] || !is_greedy(p.batch[i]->params)) continue;
    const float* st = stats + 2 * p.last[i];
    ch.picks[i] = Sampled{host_ids_.data_as<int32_t>()[p.last[i]], st[0] - st[1]};
  }
}

const float* Generator::logits_row(int64_t r) const { return logits_.data_as<float>() + r * model_.spec().vocab_size; }

// The log-probabilities of the prompt tokens chunk i's rows predict (and their alternatives).
void Generator::score_prompt(const StepPlan& p, size_t i, std::vector<std::pair<float, int32_t>>& scratch) {
  Sequence& s = *p.batch[i];
  const float* stats = host_stats_.data_as<float>();
  const int64_t P = static_cast<int64_t>(s.prompt.size());
  const ForwardChunk& c = p.chunks[i];
  for (int64_t j = 0; j < c.count && c.past_len + j + 1 < P; ++j) {
    const int64_t r = p.first[i] + j;  // row j predicts the prompt token after position past + j
    const int32_t next = s.prompt[static_cast<size_t>(c.past_len + j + 1)];
    s.prompt_logprobs.push_back(static_cast<float>(static_cast<double>(logits_row(r)[next]) - stats[2 * r + 1]));
    if (s.params.prompt_logprobs > 0)
      s.prompt_top.push_back(top_logprobs(logits_row(r), valid_vocab_, s.params.prompt_logprobs, stats[2 * r + 1], scratch));
  }
}

// Chunk i's work on the host: its prompt scores, its alternatives, and its token where the
// device's greedy choice does not decide it (sampling; penalties, bias and the JSON mask, after
// which the reported log-probability is still the model's). Each sequence has its own random
// generator, so the draws do not depend on the threads this runs on.
void Generator::choose_on_host(const StepPlan& p, size_t i, StepChoices& ch, std::vector<std::pair<float, int32_t>>& scratch) {
  try {
    choose_on_host_unguarded(p, i, ch, scratch);
  } catch (const std::exception& e) {  // this sequence's fault alone: emit_chunk ends it
    ch.errors[i] = e.what();
  }
}

void Generator::choose_on_host_unguarded(const StepPlan& p, size_t i, StepChoices& ch,
                                         std::vector<std::pair<float, int32_t>>& scratch) {
  Sequence& s = *p.batch[i];
  if (p.speculates[i]) return;  // its rows are taken in order (accept_drafts)
  if (p.scores_prompt(i)) score_prompt(p, i, scratch);
  if (!p.chooses[i] || s.params.max_new_tokens == 0) return;  // prefill goes on, or scored only
  const float* row = logits_row(p.last[i]);
  const float lse = host_stats_.data_as<float>()[2 * p.last[i] + 1];
  if (s.params.top_logprobs > 0) ch.tops[i] = top_logprobs(row, valid_vocab_, s.params.top_logprobs, lse, scratch);
  if (s.params.sampling.adjusts_logits() || s.json || s.holds_end()) {
    std::vector<float> adjusted(row, row + model_.spec().vocab_size);
    if (s.params.sampling.adjusts_logits()) adjust_logits(adjusted.data(), valid_vocab_, s.params.sampling, s.prompt, s.tokens);
    if (s.constraint()) at_stage(SequenceStage::Constraint, s);
    // While its end is held back, the JSON mask allows no end id either.
    const std::vector<int32_t> none;
    if (s.constraint() && s.constraint()->mask(adjusted.data(), valid_vocab_, s.holds_end() ? none : s.end_ids) == 0) {
      // A complete text, and no end id to say so: it ends here. An incomplete one that no token
      // continues (a vocabulary without the bytes it needs) fails rather than end `stop` unfinished.
      ch.picks[i] = Sampled{s.constraint()->complete() ? -1 : kDeadEnd, 0.f};
      return;
    }
    if (s.holds_end()) {
      for (int32_t e : s.end_ids)
        if (e >= 0 && e < valid_vocab_) adjusted[static_cast<size_t>(e)] = -std::numeric_limits<float>::infinity();
      // Only an end id was left (a JSON text whose one continuation is an end id that is also
      // text): nothing may be chosen, so it ends here, as a complete constrained text does.
      if (std::none_of(adjusted.begin(), adjusted.begin() + valid_vocab_, [](float x) { return x > -std::numeric_limits<float>::infinity(); })) {
        ch.picks[i] = Sampled{!s.constraint() || s.constraint()->complete() ? -1 : kDeadEnd, 0.f};
        return;
      }
    }
    at_stage(SequenceStage::Sampling, s);
    const int32_t t = is_greedy(s.params) ? row_argmax_lse(adjusted.data(), valid_vocab_).token
                                          : sample_token(adjusted.data(), valid_vocab_, s.params.sampling, s.rng, scratch).token;
    advance_constraint(s, t);
    ch.picks[i] = Sampled{t, static_cast<float>(static_cast<double>(row[t]) - lse)};
  } else if (!is_greedy(s.params)) {
    at_stage(SequenceStage::Sampling, s);
    ch.picks[i] = sample_token(row, valid_vocab_, s.params.sampling, s.rng, scratch);
  }
}

// Each chunk's outcome, in batch order: drafts accepted, a prompt that goes on, a prompt only
// scored, or a token handed out (which may end its sequence).
void Generator::emit(StepPlan& p, StepChoices& ch, const LogitsObserver& observer, std::vector<StepOutput>& out) {
  for (size_t i = 0; i < p.batch.size(); ++i) {
    Sequence& s = *p.batch[i];
    if (!ch.errors[i].empty()) {
      s.past_len += p.chunks[i].count;  // what went through the model (a speculative chunk never errs here)
      fail_sequence(s, ch.errors[i], out);
      continue;
    }
    try {
      emit_chunk(p, i, ch, observer, out);
    } catch (const std::exception& e) {  // this sequence's fault alone
      if (!s.done) fail_sequence(s, e.what(), out);
      continue;
    }
    // Its blocks now hold what went through the model (rejected drafts' blocks go back); full
    // ones can be shared from here on.
    if (s.done) continue;
    commit_blocks(s);
    // The ring keeps what its next query's window reads.
    if (window_pool_) window_pool_->trim(s.key(), s.past_len + 1 - window_pool_->window());
  }
}

void Generator::emit_chunk(StepPlan& p, size_t i, StepChoices& ch, const LogitsObserver& observer,
                           std::vector<StepOutput>& out) {
  Sequence& s = *p.batch[i];
  if (p.speculates[i]) {
    accept_drafts(s, p.chunks[i], p.first[i], p.need_logits, out);
    return;
  }
  s.past_len += p.chunks[i].count;
  if (!p.chooses[i]) {  // the prompt goes on next step
    if (observer && p.scores_prompt(i)) choose_on_host(p, i, ch, scratch_);
    if (!ch.errors[i].empty()) throw Error(ch.errors[i]);  // emit ends this sequence alone
    return;
  }
  if (observer) {
    observer(s.id, logits_row(p.last[i]), model_.spec().vocab_size);
    choose_on_host(p, i, ch, scratch_);
    if (!ch.errors[i].empty()) throw Error(ch.errors[i]);
  }
  StepOutput ev;
  ev.id = s.id;
  if (s.params.max_new_tokens == 0) {  // the prompt was scored; nothing is generated
    ev.prompt_logprobs = s.prompt_logprobs;
    ev.prompt_top = s.prompt_top;
    finish(s, FinishReason::Length, true, out, ev);
    return;
  }
  if (ch.picks[i].token == kDeadEnd) {
    fail_sequence(s, kConstraintDeadEnd, out);
    return;
  }
  if (ch.picks[i].token < 0) {  // JSON complete with nothing allowed after it
    finish(s, FinishReason::Stop, true, out, ev);
    return;
  }
  if (p.scores_prompt(i)) {
    ev.prompt_logprobs = s.prompt_logprobs;
    ev.prompt_top = s.prompt_top;
  }
  emit_token(s, ch.picks[i], std::move(ch.tops[i]), ev, out);
}

std::vector<SequenceResult> Generator::generate_all(const std::vector<std::vector<int32_t>>& prompts,
                                                    const GenerationParams& params,
                                                    const LogitsObserver& observer) {
  std::vector<uint64_t> ids;
  for (const auto& p : prompts) ids.push_back(add(p, params));
  while (!idle()) step(observer);
  std::vector<SequenceResult> out;
  for (uint64_t id : ids) out.push_back(take_result(id));
  return out;
}

}  // namespace kvpr
