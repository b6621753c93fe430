#include "worker/worker.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "engine/base/error.h"
#include "engine/model/model.h"
#include "engine/kv/profiler.h"
#include "engine/text/tokenizer.h"
#include "worker/protocol.h"
#ifdef KVPR_HAVE_HWLOC
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
      json::Value m(json::Object{});
      m.set("type", "heartbeat");
      m.set("step_ms", started > 0 ? now_ms() - started : int64_t{0});
      try {
        ch_.send(m);
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

}  // namespace

int run_worker(const WorkerOptions& opts, FrameChannel& ch) {
  Heartbeat heartbeat(ch);
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Generator> gen;
  json::Value placement(json::Object{});
  try {
    // Bind before anything is allocated: CPUs, memory policy, and the pinned KV store's node.
    std::shared_ptr<HostAllocator> host_alloc;
#ifdef KVPR_HAVE_HWLOC
    std::shared_ptr<Topology> topo;
    if (opts.numa_node >= 0 || !opts.cpus.empty()) {
      topo = std::make_shared<Topology>(Topology::from_system());
      WorkerPlacement wp;
      wp.worker = opts.index;
      wp.numa_node = opts.numa_node;
      wp.cpus = opts.cpus;
      std::string bound = bind_this_process(*topo, wp);
      std::fprintf(stderr, "kvpr-worker %d: bound to %s\n", opts.index, bound.c_str());
      placement.set("bound", bound);
      if (opts.numa_node >= 0) host_alloc = std::make_shared<NumaHostAllocator>(topo, opts.numa_node);
    }
#else
    if (opts.numa_node >= 0 || !opts.cpus.empty())
      std::fprintf(stderr, "kvpr-worker %d: built without hwloc: placement not applied\n", opts.index);
#endif
    backend = create_backend(opts.backend, opts.device);
    if (host_alloc) backend->set_host_allocator(host_alloc);
    // Loading progress on stderr (the journal under systemd), every 10%.
    ModelLoadOptions lo;
    lo.stream_weights = opts.engine.weights_on_host;
    int last_decile = -1;
    auto t0 = std::chrono::steady_clock::now();
    lo.progress = [&](size_t done, size_t total) {
      int decile = total ? static_cast<int>(10 * done / total) : 10;
      if (decile == last_decile) return;
      last_decile = decile;
      std::fprintf(stderr, "kvpr-worker %d: loading %s on %s: %d%% of %.2f GB (%.1f s)\n", opts.index,
                   opts.model_dir.c_str(), backend->name().c_str(), decile * 10, static_cast<double>(total) / 1e9,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    };
    std::unique_ptr<WeightBroadcaster> bc;
    if (!opts.nccl_id.empty() && opts.nccl_ranks > 1) {
      bc = make_nccl_broadcaster(opts.nccl_id, opts.nccl_rank, opts.nccl_ranks, opts.device);
      lo.broadcast = bc.get();
    }
    model = load_model(*backend, opts.model_dir, lo);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    placement.set("load_s", load_s);
    placement.set("weights_from", !bc ? "disk" : bc->rank() == 0 ? "disk, broadcast with NCCL" : "NCCL broadcast");
    if (const LayerWeightStream* ws = model->weight_stream()) {
      placement.set("weights", "host");
      std::fprintf(stderr,
                   "kvpr-worker %d: layer weights %.2f GB in pinned host memory, streamed through 2 device slots "
                   "of %.2f GB (%.2f GB of weights on the device)\n",
                   opts.index, static_cast<double>(ws->host_bytes()) / 1e9,
                   static_cast<double>(ws->max_layer_bytes()) / 1e9,
                   static_cast<double>(model->device_weight_bytes()) / 1e9);
    }
    std::fprintf(stderr, "kvpr-worker %d: model loaded in %.2f s (%s)\n", opts.index, load_s,
                 placement.find("weights_from")->as_string().c_str());
    bc.reset();
    tok = std::make_unique<Tokenizer>(Tokenizer::load(opts.model_dir));
    GeneratorOptions go = opts.engine.generator;
    if (go.kv.mode == KvMode::Kvpr && !go.kv.forced_split) {
      if (!opts.engine.profile.empty()) {
        go.kv.profile = LinkProfile::load(opts.engine.profile);
      } else {
        const ProfileOptions po = ProfileOptions::quick();
        go.kv.profile = profile_backend(*backend, *model, model->kv_shape(),
                                        go.kv_dtype.value_or(model->weight_dtype()), po);
      }
    }
    if (go.kv.host_attention_threads <= 0 && !opts.cpus.empty())
      go.kv.host_attention_threads = static_cast<int>(opts.cpus.size());  // cpu-attn threads from our cpuset
    gen = std::make_unique<Generator>(*model, *tok, go);
#ifdef KVPR_HAVE_HWLOC
    // Verify where the host KV store landed.
    if (host_alloc && gen->kv_runtime().host_store()) {
      const HostKvStore* hs = gen->kv_runtime().host_store();
      Tensor probe = hs->k(0, 0);
      auto* na = static_cast<NumaHostAllocator*>(host_alloc.get());
      std::vector<int> where = na->where(probe.data(), probe.nbytes());
      std::string w;
      for (int n : where) w += (w.empty() ? "" : ",") + std::to_string(n);
      std::fprintf(stderr, "kvpr-worker %d: host KV store %.2f GB on NUMA node(s) %s (asked for %d)\n", opts.index,
                   static_cast<double>(hs->bytes()) / 1e9, w.empty() ? "?" : w.c_str(), opts.numa_node);
      placement.set("kv_store_nodes", w);
    }
#endif
  } catch (const std::exception& e) {
    json::Value m(json::Object{});
    m.set("type", "fatal");
    m.set("message", e.what());
    try {
      ch.send(m);
    } catch (const ChannelClosed&) {
    }
    return 1;
  }
  {
    json::Value m(json::Object{});
    m.set("type", "ready");
    m.set("worker", opts.index);
    m.set("backend", backend->name());
    m.set("kv_mode", kv_mode_name(opts.engine.generator.kv.mode));
    m.set("max_seq_len", gen->max_seq_len());
    m.set("max_batch", opts.engine.generator.max_batch);
    m.set("host_bytes_per_token", gen->kv_runtime().host_bytes_per_token());
    placement.set("numa_node", opts.numa_node);
    json::Array cpus;
    for (int c : opts.cpus) cpus.emplace_back(c);
    placement.set("cpus", std::move(cpus));
    m.set("placement", placement);
    ch.send(m);
  }

  std::map<uint64_t, uint64_t> to_ctrl;    // generator id -> controller id
  std::map<uint64_t, uint64_t> to_gen;     // controller id -> generator id
  auto last_stats = std::chrono::steady_clock::now() - std::chrono::seconds(10);
  uint64_t steps = 0;
  double busy_s = 0;
  auto t_start = std::chrono::steady_clock::now();
  try {
    while (true) {
      // Take every message waiting; block only when there is nothing to compute.
      json::Value msg;
      int timeout = gen->idle() ? 500 : 0;
      while (ch.recv(&msg, timeout)) {
        timeout = 0;
        const std::string type = message_type(msg);
        if (type == "shutdown") return 0;
        if (type == "cancel") {
          const uint64_t id = static_cast<uint64_t>(msg.find("id")->as_int());
          if (auto it = to_gen.find(id); it != to_gen.end()) gen->cancel(it->second);
          continue;
        }
        if (type == "generate") {
          const json::Value* id = msg.find("id");
          try {
            GenerateMessage m = decode_generate(msg);
            const uint64_t gid = gen->add(std::move(m.prompt), m.params);
            to_ctrl[gid] = m.id;
            to_gen[m.id] = gid;
          } catch (const std::exception& e) {
            ch.send(encode_error(id && id->is_int() ? static_cast<uint64_t>(id->as_int()) : 0, e.what()));
          }
        }
      }
      if (!gen->idle()) {
        auto t0 = std::chrono::steady_clock::now();
        heartbeat.step_begins();
        std::vector<StepOutput> outs = gen->step();
        heartbeat.step_ends();
        busy_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ++steps;
        std::vector<RequestEvent> events;
        for (const auto& o : outs) {
          auto it = to_ctrl.find(o.id);
          if (it == to_ctrl.end()) continue;
          if (o.finish == FinishReason::None) {
            events.push_back({it->second, engine_event(o, nullptr)});
            continue;
          }
          const SequenceResult r = gen->take_result(o.id);
          events.push_back({it->second, engine_event(o, &r)});
          to_gen.erase(it->second);
          to_ctrl.erase(it);
        }
        ch.send(encode_step(events));
      }
      auto now = std::chrono::steady_clock::now();
      if (now - last_stats > std::chrono::milliseconds(500)) {
        last_stats = now;
        const StepStats& st = gen->kv_runtime().last_step();
        json::Value s(json::Object{});
        s.set("type", "stats");
        s.set("running", static_cast<int64_t>(gen->running()));
        s.set("waiting", static_cast<int64_t>(gen->waiting()));
        s.set("split", st.split_total);
        s.set("h2d_gbps", st.link_gbps_estimate);
        s.set("host_kv_bytes", gen->cached_tokens() * gen->kv_runtime().host_bytes_per_token());
        s.set("host_kv_reserved_bytes",
              static_cast<int64_t>(gen->kv_runtime().host_store() ? gen->kv_runtime().host_store()->bytes() : 0));
        s.set("device_bytes", static_cast<int64_t>(backend->device_bytes_in_use()));
        s.set("steps", static_cast<int64_t>(steps));
        s.set("graph_replays", backend->graph_counters().replayed);  // decode steps run as one CUDA graph
        s.set("spec_draft_tokens", gen->speculation_stats().proposed);    // since the worker started
        s.set("spec_accepted_tokens", gen->speculation_stats().accepted);
        double wall = std::chrono::duration<double>(now - t_start).count();
        s.set("busy_fraction", wall > 0 ? busy_s / wall : 0.0);  // since the last stats message
        ch.send(s);
        busy_s = 0;
        t_start = now;
      }
    }
  } catch (const ChannelClosed&) {
    return 0;  // the controller went away
  }
}

}  // namespace kvpr
