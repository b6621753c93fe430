#include "worker/worker.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "engine/backend/weight_broadcast.h"
#include "engine/base/error.h"
#include "engine/decode/generator.h"
#include "engine/model/model.h"
#include "engine/kv/profiler.h"
#include "engine/text/tokenizer.h"
#include "worker/protocol.h"
#ifdef KVPR_HAVE_HWLOC
#include "numa/numa_memory.h"
#include "numa/placement.h"
#endif

namespace kvpr {

namespace {



// A heartbeat every second from a thread of its own, from the first moment (loading a model
// takes minutes) to the end: the controller takes a worker silent past --worker-timeout as
// unresponsive. A long step does not silence it; each beat says how long the current step has
// run, so a step that never ends (a hung CUDA call) is seen too.
class Heartbeat {
 public:
  explicit Heartbeat(FrameChannel& ch) : ch_(ch), thread_([this] { run(); }) {}
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void step_begins() { step_started_ms_ = now_ms(); }
  void step_ends() { step_started_ms_ = 0; }

 private:
  static int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::seconds(1), [&] { return stop_; })) {
      const int64_t started = step_started_ms_;
      try {
        ch_.send(encode_heartbeat(started > 0 ? now_ms() - started : int64_t{0}));
      } catch (const std::exception&) {
        return;  // the controller is gone
      }
    }
  }

  FrameChannel& ch_;
  std::atomic<int64_t> step_started_ms_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// One worker's engine (bound, loaded, its generator made) and the loop serving the
// controller's messages between engine steps.
// The controller said shutdown before the worker was ready: it exits (0) without serving.
struct ShutdownWhileLoading {};

class WorkerLoop {
 public:
  WorkerLoop(const WorkerOptions& opts, FrameChannel& ch, Heartbeat& heartbeat)
      : opts_(opts), engine_(opts.engine), ch_(ch), heartbeat_(heartbeat) {}

  // Everything before serving; throws what stops the worker from starting.
  void load() {
    bind();  // before anything is allocated: CPUs, memory policy, the pinned KV store's node
    backend_ = create_backend(opts_.backend, opts_.device);
    if (host_alloc_) backend_->set_host_allocator(host_alloc_);
    // Without --kv-mode: auto on a GPU (the KV spills to host memory instead of refusing a
    // batch), resident where the device is the host or CUDA graphs were asked for.
    if (!engine_.kv_mode_given && !backend_->device_is_host() && !engine_.generator.cuda_graphs)
      engine_.generator.kv.mode = KvMode::Auto;
    load_weights();
    ch_.send(encode_loaded());
    tok_ = std::make_unique<Tokenizer>(Tokenizer::load(opts_.model_dir));
    gen_ = std::make_unique<Generator>(*model_, *tok_, generator_options());
    report_kv_store();
    report_kv_store_nodes();
  }

  // The store's tokens and bytes and why that size; a store that holds less than one sequence
  // of the context still serves, refusing only the prompts it cannot hold.
  void report_kv_store() {
    const KvPlan& plan = gen_->plan();
    const int64_t tokens = plan.layout.blocks * plan.layout.block_tokens;
    const double bytes = KvRuntime::store_bytes(model_->kv_shape(), plan.layout, plan.kv);  // (the ring's included)
    std::fprintf(stderr, "kvpr-worker %d: KV store %lld tokens, %.2f GiB, kv mode %s: %s\n", opts_.index,
                 static_cast<long long>(tokens), bytes / 1073741824.0, kv_mode_name(plan.kv.mode), plan.why.c_str());
    if (tokens < plan.layout.max_tokens)
      std::fprintf(stderr,
                   "kvpr-worker %d: warning: the KV store holds less than one sequence of the context (%lld tokens): "
                   "prompts it cannot hold are refused; raise host-memory or kv-cache, or lower max-seq-len\n",
                   opts_.index, static_cast<long long>(plan.layout.max_tokens));
  }

  json::Value ready_message() {
    placement_.set("numa_node", opts_.numa_node);
    placement_.set("cpus", json::Array(opts_.cpus.begin(), opts_.cpus.end()));
    ReadyMessage m;
    m.worker = opts_.index;
    m.backend = backend_->name();
    m.kv_mode = kv_mode_name(engine_.generator.kv.mode);
    m.max_seq_len = gen_->max_seq_len();
    m.max_batch = static_cast<int64_t>(gen_->max_batch());
    m.host_bytes_per_token = gen_->kv_runtime().host_bytes_per_token();
    m.placement = placement_;
    return encode_ready(m);
  }

  // Until the controller says shutdown (returns 0); throws ChannelClosed when it goes away. A
  // step that fails as a whole (one sequence's fault ends only that sequence, in the Generator)
  // is fatal: the worker says why and exits (1), and kvprd fails its requests and restarts it.
  int serve() {
    last_stats_ = Clock::now() - std::chrono::seconds(10);
    stats_since_ = Clock::now();
    while (true) {
      if (!take_messages()) return 0;
      if (!gen_->idle()) {
        try {
          step();
        } catch (const ChannelClosed&) {
          throw;
        } catch (const std::exception& e) {
          ch_.send(encode_fatal(std::string("a decode step failed: ") + e.what()));
          return 1;
        }
      }
      if (Clock::now() - last_stats_ > std::chrono::milliseconds(500)) send_stats();
    }
  }

 private:
  using Clock = std::chrono::steady_clock;

  void bind() {
#ifdef KVPR_HAVE_HWLOC
    if (opts_.numa_node < 0 && opts_.cpus.empty()) return;
    auto topo = std::make_shared<Topology>(Topology::from_system());
    WorkerPlacement wp;
    wp.worker = opts_.index;
    wp.numa_node = opts_.numa_node;
    wp.cpus = opts_.cpus;
    const std::string bound = bind_this_process(*topo, wp);
    std::fprintf(stderr, "kvpr-worker %d: bound to %s\n", opts_.index, bound.c_str());
    placement_.set("bound", bound);
    if (opts_.numa_node >= 0) host_alloc_ = std::make_shared<NumaHostAllocator>(topo, opts_.numa_node);
#else
    if (opts_.numa_node >= 0 || !opts_.cpus.empty())
      std::fprintf(stderr, "kvpr-worker %d: built without hwloc: placement not applied\n", opts_.index);
#endif
  }

  // From disk, or over NCCL from the first worker; loading progress on stderr (the journal
  // under systemd), every 10%.
  void load_weights() {
    ModelLoadOptions lo;
    lo.stream_weights = engine_.weights_on_host;
    lo.verify_weights = engine_.verify_weights;
    lo.kv_plan = [go = engine_.generator](const ModelSpec& spec, DType weight_dtype, const Backend& b, double host_weights) {
      return Generator::kv_plan(go, spec, weight_dtype, &b, host_weights);
    };
    int last_decile = -1;
    const auto t0 = Clock::now();
    lo.progress = [&](size_t done, size_t total) {
      const int decile = total ? static_cast<int>(10 * done / total) : 10;
      if (decile == last_decile) return;
      last_decile = decile;
      std::fprintf(stderr, "kvpr-worker %d: loading %s on %s: %d%% of %.2f GB (%.1f s)\n", opts_.index,
                   opts_.model_dir.c_str(), backend_->name().c_str(), decile * 10, static_cast<double>(total) / 1e9,
                   std::chrono::duration<double>(Clock::now() - t0).count());
    };
    std::unique_ptr<WeightBroadcaster> bc;
    if (opts_.nccl_ranks > 1) {
      std::string id = opts_.nccl_id;
      if (id.empty()) id = opts_.nccl_rank == 0 ? announce_nccl_id() : await_nccl_id();
      bc = make_nccl_broadcaster(id, opts_.nccl_rank, opts_.nccl_ranks, opts_.device);
      lo.broadcast = bc.get();
    }
    model_ = load_model(*backend_, opts_.model_dir, lo);
    const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
    const char* from = !bc ? "disk" : bc->rank() == 0 ? "disk, broadcast with NCCL" : "NCCL broadcast";
    placement_.set("load_s", load_s);
    placement_.set("weights_from", from);
    placement_.set("checkpoint_bytes_read", static_cast<int64_t>(model_->checkpoint_bytes_read()));
    if (!model_->weights_digest().empty()) placement_.set("weights_digest", model_->weights_digest());
    if (const QuantizedCheckpoint& q = model_->quantization(); !q.method().empty()) {
      placement_.set("quantization", q.to_json(model_->kept_quantized(), model_->dequantized_dtype()));
      std::fprintf(stderr, "kvpr-worker %d: quantized checkpoint: %s, %.2f bits a weight as stored; %s "
                   "(%.2f GB of weights)\n", opts_.index, q.describe().c_str(), q.bits_per_weight(),
                   q.how_computed(model_->kept_quantized(), model_->dequantized_dtype()).c_str(),
                   static_cast<double>(model_->weight_bytes()) / 1e9);
    }
    if (const LayerWeightStream* ws = model_->weight_stream()) {
      placement_.set("weights", "host");
      std::fprintf(stderr,
                   "kvpr-worker %d: layer weights %.2f GB in pinned host memory, streamed through 2 device slots "
                   "of %.2f GB (%.2f GB of weights on the device)\n",
                   opts_.index, static_cast<double>(ws->host_bytes()) / 1e9,
                   static_cast<double>(ws->max_layer_bytes()) / 1e9,
                   static_cast<double>(model_->device_weight_bytes()) / 1e9);
    }
    std::fprintf(stderr, "kvpr-worker %d: model loaded in %.2f s (%s; %.1f MB of the checkpoint read%s%s)\n",
                 opts_.index, load_s, from, static_cast<double>(model_->checkpoint_bytes_read()) / 1e6,
                 model_->weights_digest().empty() ? "" : "; weights digest ", model_->weights_digest().c_str());
  }

  // Rank 0 of the weight broadcast makes the NCCL group (NCCL's bootstrap root lives in the
  // process that made the id, so it is a worker's, not the controller's) and says its id.
  std::string announce_nccl_id() {
    std::string id = nccl_unique_id_hex();
    ch_.send(encode_nccl_id(id));
    return id;
  }

  // The other ranks wait for the id, which the controller relays from rank 0 (bounded by the
  // controller: a rank 0 that exits or goes silent ends the broadcast, and this worker with it).
  std::string await_nccl_id() {
    std::fprintf(stderr, "kvpr-worker %d: waiting for the NCCL weight broadcast's id from worker 0\n", opts_.index);
    json::Value msg;
    while (true) {
      ch_.recv(&msg, -1);
      const std::string type = message_type(msg);
      if (type == "nccl_id") {
        const json::Value* id = msg.find("id");
        KVPR_CHECK(id && id->is_string(), "an nccl_id message without its id");
        return id->as_string();
      }
      if (type == "shutdown") throw ShutdownWhileLoading{};
    }
  }

  // The engine's options, with a link profile for kvpr's scheduler (saved, else measured now)
  // and cpu-attn's threads from this worker's cpuset.
  GeneratorOptions generator_options() {
    GeneratorOptions go = engine_.generator;
    if (kv_mode_splits(go.kv.mode) && !go.kv.forced_split) {
      if (!engine_.profile.empty())
        go.kv.profile = LinkProfile::load(engine_.profile);
      else
        go.kv.profile = profile_backend(*backend_, *model_, model_->kv_shape(), go.kv_dtype.value_or(model_->weight_dtype()),
                                        ProfileOptions::quick());
    }
    if (go.kv.host_attention_threads <= 0 && !opts_.cpus.empty())
      go.kv.host_attention_threads = static_cast<int>(opts_.cpus.size());
    return go;
  }

  // Where the host KV store landed.
  void report_kv_store_nodes() {
#ifdef KVPR_HAVE_HWLOC
    const HostKvStore* hs = gen_->kv_runtime().host_store();
    if (!host_alloc_ || !hs) return;
    const Tensor probe = hs->k(0, 0);
    std::string w;
    for (int n : static_cast<NumaHostAllocator*>(host_alloc_.get())->where(probe.data(), probe.nbytes()))
      w += (w.empty() ? "" : ",") + std::to_string(n);
    std::fprintf(stderr, "kvpr-worker %d: host KV store %.2f GB on NUMA node(s) %s (asked for %d)\n", opts_.index,
                 static_cast<double>(hs->bytes()) / 1e9, w.empty() ? "?" : w.c_str(), opts_.numa_node);
    placement_.set("kv_store_nodes", w);
#endif
  }

  // Every message waiting; blocks (up to 500 ms) only when there is nothing to compute.
  // Returns false on shutdown.
  bool take_messages() {
    json::Value msg;
    int timeout = gen_->idle() ? 500 : 0;
    while (ch_.recv(&msg, timeout)) {
      timeout = 0;
      const std::string type = message_type(msg);
      if (type == "shutdown") return false;
      if (type == "cancel") {
        const uint64_t id = static_cast<uint64_t>(msg.find("id")->as_int());
        if (auto it = to_gen_.find(id); it != to_gen_.end()) gen_->cancel(it->second);
      } else if (type == "generate") {
        add(msg);
      }
    }
    return true;
  }

  void add(const json::Value& msg) {
    try {
      EngineRequest m = decode_generate(msg);
      const uint64_t gid = gen_->add(std::move(m.prompt), m.params);
      to_ctrl_[gid] = m.id;
      to_gen_[m.id] = gid;
    } catch (const std::exception& e) {  // a request the engine refuses (too long, bad values, its schema)
      const json::Value* id = msg.find("id");
      const auto* refused = dynamic_cast<const RequestRefused*>(&e);
      ch_.send(encode_error(id && id->is_int() ? static_cast<uint64_t>(id->as_int()) : 0, e.what(), /*refused=*/true,
                            refused ? refused->part() : ""));
    }
  }

  void step() {
    const auto t0 = Clock::now();
    heartbeat_.step_begins();
    const std::vector<StepOutput> outs = gen_->step();
    heartbeat_.step_ends();
    const double took = std::chrono::duration<double>(Clock::now() - t0).count();
    busy_s_ += took;
    step_ms_max_ = std::max<int64_t>(step_ms_max_, static_cast<int64_t>(took * 1000));
    ++steps_;
    std::vector<RequestEvent> events;
    for (const auto& o : outs) {
      auto it = to_ctrl_.find(o.id);
      if (it == to_ctrl_.end()) continue;
      if (o.finish == FinishReason::None) {
        events.push_back({it->second, engine_event(o, nullptr)});
        continue;
      }
      const SequenceResult r = gen_->take_result(o.id);
      events.push_back({it->second, engine_event(o, &r)});
      to_gen_.erase(it->second);
      to_ctrl_.erase(it);
    }
    ch_.send(encode_step(events));
  }

  // Every ~500 ms, for /metrics.
  void send_stats() {
    const auto now = Clock::now();
    last_stats_ = now;
    const StepStats& st = gen_->kv_runtime().last_step();
    const HostKvStore* hs = gen_->kv_runtime().host_store();
    const double wall = std::chrono::duration<double>(now - stats_since_).count();
    WorkerStats ws;
    ws.running = static_cast<int64_t>(gen_->running());
    ws.waiting = static_cast<int64_t>(gen_->waiting());
    ws.split = st.split_total;
    ws.h2d_gbps = st.link_gbps_estimate;
    const KvBlockStats kb = gen_->kv_block_stats();
    // Host KV in use: the blocks sequences hold, every layer's and the sliding-window ring's.
    if (hs) {
      const KvPlan& plan = gen_->plan();
      const double block = KvRuntime::block_bytes(model_->kv_shape(), plan.layout, plan.kv);
      const double ring = plan.layout.ring() ? KvRuntime::window_block_bytes(model_->kv_shape(), plan.layout, plan.kv) : 0;
      ws.host_kv_bytes = static_cast<int64_t>((block - ring) * static_cast<double>(kb.used) +
                                              ring * static_cast<double>(kb.ring_used));
    }
    ws.ring_blocks_total = kb.ring_total;
    ws.ring_blocks_used = kb.ring_used;
    const KvRuntime& kv = gen_->kv_runtime();
    ws.kv_tier = kv.device_tier() ? "host+device" : kv_mode_uses_host(kv.mode()) || backend_->device_is_host() ? "host" : "device";
    ws.device_kv_bytes = static_cast<int64_t>(kv.device_tier_bytes());
    ws.device_kv_used_bytes = static_cast<int64_t>(kv.device_tier_used_bytes());
    ws.kv_resident_tokens = st.resident_tokens;
    ws.kv_staged_tokens = st.staged_tokens;
    ws.kv_block_tokens = kb.block_tokens;
    ws.kv_blocks_total = kb.total;
    ws.kv_blocks_used = kb.used;
    ws.kv_blocks_cached = kb.cached;
    ws.preemptions = kb.preemptions;
    ws.rope_recomputes = kb.rope_recomputes;
    ws.prefix_query_tokens = gen_->prefix_cache_stats().queries;
    ws.prefix_hit_tokens = gen_->prefix_cache_stats().hits;
    ws.host_kv_reserved_bytes = static_cast<int64_t>(hs ? hs->bytes() : 0);
    ws.device_bytes = static_cast<int64_t>(backend_->device_bytes_in_use());
    ws.steps = static_cast<int64_t>(steps_);
    ws.graph_replays = backend_->graph_counters().replayed;  // decode steps run as one CUDA graph
    ws.spec_draft_tokens = gen_->speculation_stats().proposed;
    ws.spec_accepted_tokens = gen_->speculation_stats().accepted;
    ws.busy_fraction = wall > 0 ? busy_s_ / wall : 0.0;
    ws.step_ms_max = step_ms_max_;
    ch_.send(encode_stats(ws));
    busy_s_ = 0;
    step_ms_max_ = 0;
    stats_since_ = now;
  }

  const WorkerOptions& opts_;
  EngineOptions engine_;  // opts_.engine with the KV mode resolved for the backend
  FrameChannel& ch_;
  Heartbeat& heartbeat_;
  std::shared_ptr<HostAllocator> host_alloc_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<Generator> gen_;
  json::Value placement_{json::Object{}};
  std::map<uint64_t, uint64_t> to_ctrl_;  // generator id -> controller id
  std::map<uint64_t, uint64_t> to_gen_;   // controller id -> generator id
  Clock::time_point last_stats_, stats_since_;
  uint64_t steps_ = 0;
  double busy_s_ = 0;
  int64_t step_ms_max_ = 0;  // the longest step since the last stats message
};

}  // namespace

EngineEvent engine_event(const StepOutput& o, const SequenceResult* finished) {
  EngineEvent ev;
  if (o.token >= 0) {
    ev.token = o.token;
    ev.logprob = o.logprob;
    ev.top.assign(o.top.begin(), o.top.end());
  }
  ev.prompt_logprobs.assign(o.prompt_logprobs.begin(), o.prompt_logprobs.end());
  for (const auto& t : o.prompt_top) ev.prompt_top.emplace_back(t.begin(), t.end());
  ev.text = o.text;
  if (!o.error.empty()) ev.error = o.error;  // this sequence alone failed
  if (finished) {
    ev.finish_reason = finish_reason_name(o.finish);
    ev.completion_tokens = static_cast<int64_t>(finished->tokens.size());
    ev.prompt_tokens = static_cast<int64_t>(finished->prompt.size());
    ev.cached_tokens = finished->cached_tokens;
  }
  return ev;
}

EngineDescription describe_engine(const std::string& model_dir, const std::string& backend) {
  EngineDescription d;
  if (backend != "cpu" && cuda_available()) d.gpu_bus_ids = cuda_pci_bus_ids();
  d.nccl = nccl_available();
  const ModelSpec spec = load_model_spec(model_dir);
  d.model_type = spec.model_type;
  d.num_layers = spec.num_layers;
  d.max_position_embeddings = spec.max_position_embeddings;
  d.vocab_size = spec.vocab_size;
  return d;
}

int run_worker(const WorkerOptions& opts, FrameChannel& ch) {
  Heartbeat heartbeat(ch);
  WorkerLoop worker(opts, ch, heartbeat);
  try {
    worker.load();
  } catch (const ShutdownWhileLoading&) {
    return 0;
  } catch (const std::exception& e) {
    try {
      ch.send(encode_fatal(e.what()));
    } catch (const ChannelClosed&) {
    }
    return 1;
  }
  try {
    ch.send(worker.ready_message());
    return worker.serve();
  } catch (const ChannelClosed&) {
    return 0;  // the controller went away
  } catch (const Error& e) {
    // A frame from kvprd that does not parse (kvprd never sends one: its requests are held
    // well inside the frames' nesting limit): the worker says so and exits, and kvprd fails its
    // requests with the message and restarts it, rather than std::terminate.
    try {
      ch.send(encode_fatal(std::string("a message from kvprd did not parse: ") + e.what()));
    } catch (const ChannelClosed&) {
    }
    return 1;
  }
}

}  // namespace kvpr
