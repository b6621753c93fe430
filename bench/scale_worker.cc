// kvpr-bench scale-worker: one of kvpr-bench scale's worker processes (scale.cc says what they
// do), started by it with commands on stdin and replies on fd 3; never by hand.
#include "bench/commands.h"
#include "bench/scale.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_common.h"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/attention.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/base/error.h"
#include "engine/base/json.h"
#include "engine/kv/kv_runtime.h"
#include "engine/kv/profiler.h"
#include "engine/base/thread_pool.h"
#ifdef KVPR_HAVE_HWLOC
#include "numa/placement.h"
#include "numa/topology.h"
#endif

namespace kvpr::bench {

namespace {

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

void reply(const json::Value& v) {
  const std::string s = v.dump() + "\n";
  for (size_t off = 0; off < s.size();) {
    ssize_t n = ::write(kReplyFd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    KVPR_CHECK(n > 0, "scale worker: cannot reply: ", std::strerror(errno));
    off += static_cast<size_t>(n);
  }
}

// The next command, or false when the orchestrator closed our stdin.
bool next_command(json::Value* cmd) {
  std::string line;
  if (!std::getline(std::cin, line)) return false;
  *cmd = json::parse(line);
  return true;
}

json::Value event(const char* name) {
  json::Value v(json::Object{});
  v.set("event", name);
  return v;
}

#ifdef KVPR_HAVE_HWLOC
// Binds this process (every thread) to `cpus`, memory to `node`; the description.
std::string bind_to(const Topology& topo, int index, const std::vector<int>& cpus, int node) {
  WorkerPlacement wp;
  wp.worker = index;
  wp.numa_node = node;
  wp.cpus = cpus;
  return bind_this_process(topo, wp);
}
#endif

struct WorkerArgs {
  std::string role, mode_name, preset, backend, kv_dtype_name;
  int index = 0, device = 0, batch = 0, prompt = 0, capacity = 0, max_positions = 0;
  double link_gbps = 0;
  std::vector<int> cpus;
  int node = -1;
};

using BindFn = std::function<std::string(const std::vector<int>&)>;

// Host memory a decode step's host attention reads: K and V of `tokens` per sequence, every layer.
double host_attention_bytes(int batch, int64_t tokens, int64_t layers, int64_t kv_hidden, DType dtype) {
  return static_cast<double>(batch) * static_cast<double>(tokens) * static_cast<double>(layers) * 2.0 *
         static_cast<double>(kv_hidden * static_cast<int64_t>(dtype_size(dtype)));
}

// A "bind" command: this process onto the command's cpus, `use_threads` told how many host
// threads they give, then the reply.
void on_bind(const json::Value& cmd, const BindFn& bind, const std::function<void(int)>& use_threads) {
  std::vector<int> cpus;
  for (const auto& x : cmd.find("cpus")->as_array()) cpus.push_back(static_cast<int>(x.as_int()));
  json::Value r = event("bound");
  r.set("how", bind(cpus));
  const int threads = static_cast<int>(std::max<size_t>(1, cpus.size()));
  use_threads(threads);
  r.set("host_threads", threads);
  reply(r);
}

// A real worker: the model, the KV runtime of its mode, a prefilled batch, decode steps.
// The worker's first reply: the model's KV shape and the host memory the run would take.
json::Value shape_event(const Backend& be, const Model& model, int64_t host_kv_bytes) {
  const KvShape shape = model.kv_shape();
  json::Value sh = event("shape");
  sh.set("device", be.name());
  sh.set("layers", shape.layers);
  sh.set("hidden", shape.hidden);
  sh.set("heads", shape.heads);
  sh.set("kv_heads", shape.kv_heads > 0 ? shape.kv_heads : shape.heads);
  sh.set("head_dim", shape.head_dim);
  sh.set("host_kv_bytes", host_kv_bytes);
  // On the CPU backend the "device" memory (weights, the KV the step works on) is host memory.
  sh.set("host_device_bytes", be.device_is_host() ? static_cast<int64_t>(model.weight_bytes()) : 0);
  return sh;
}

// One decode step, timed: its wall and CPU time, split, link bytes and the host memory it
// touched for its KV (what crossed the link and, for cpu-attn, the K and V the host attention
// read, accounted from the shapes, not hardware counters).
json::Value timed_step(GreedyDecode& dec, KvRuntime& kv, KvMode mode, const KvShape& shape, DType kv_dtype,
                       int64_t batch) {
  const int64_t ctx = dec.context();
  const double c0 = cpu_seconds();
  const auto t0 = Clock::now();
  dec.step();
  const double ms = seconds_since(t0) * 1e3;
  const StepStats& st = kv.last_step();
  json::Value r = event("step");
  r.set("ms", ms);
  r.set("cpu_s", cpu_seconds() - c0);
  r.set("ctx", ctx);
  r.set("split", st.split_total);
  r.set("link_bytes", st.h2d_bytes + st.d2h_bytes);
  double dram = static_cast<double>(st.h2d_bytes + st.d2h_bytes);
  if (mode == KvMode::CpuAttn) dram += host_attention_bytes(batch, ctx, shape.layers, shape.kv_hidden(), kv_dtype);
  r.set("dram_bytes", dram);
  return r;
}

void run_real_worker(const WorkerArgs& a, const BindFn& bind) {
  KvMode mode;
  KVPR_CHECK(parse_kv_mode(a.mode_name, &mode), "unknown mode '", a.mode_name, "'");
  DType kv_dtype;
  KVPR_CHECK(parse_dtype(a.kv_dtype_name, &kv_dtype), "bad --kv-dtype");
  auto be = bench_backend(a.backend, a.device);
  if (a.link_gbps > 0) {
    auto* cpu = dynamic_cast<CpuBackend*>(be.get());
    KVPR_CHECK(cpu, "--emulate-link-gbps is for the cpu backend");
    cpu->set_emulated_link_gbps(a.link_gbps);
  }
  std::unique_ptr<Model> model = preset_model(*be, a.preset, {}, {.max_positions = a.max_positions});
  const KvShape shape = model->kv_shape();
  const int64_t per_token = KvRuntime::host_bytes_per_token(mode, shape, kv_dtype);
  reply(shape_event(*be, *model, per_token * a.batch * a.capacity));
  json::Value cmd;
  if (!next_command(&cmd)) return;  // refused: the sizes do not fit the host
  KVPR_CHECK(cmd.find("cmd")->as_string() == "allocate", "scale worker: expected allocate");

  const LinkProfile prof = profile_backend(*be, *model, shape, kv_dtype, ProfileOptions::quick());  // as kvpr-worker
  KvRuntimeOptions o;
  o.mode = mode;
  o.kv_dtype = kv_dtype;
  o.profile = prof;
  o.adapt = true;
  o.host_attention_threads = static_cast<int>(std::max<size_t>(1, a.cpus.size()));
  auto kv = model->make_kv_runtime(a.batch, a.capacity, o);
  GreedyDecode dec(*be, *model, *kv, a.batch, a.prompt);
  const double prefill_s = dec.prefill();
  auto t0 = Clock::now();
  dec.step();
  const double warm_ms = seconds_since(t0) * 1e3;
  const StepStats& st0 = kv->last_step();
  json::Value rd = event("ready");
  rd.set("prefill_s", prefill_s);
  rd.set("ms", warm_ms);
  rd.set("link_bytes", st0.h2d_bytes + st0.d2h_bytes);
  rd.set("link_gbps", prof.h2d_alone_gbps);
  rd.set("host_kv_bytes", static_cast<int64_t>(kv->host_store() ? kv->host_store()->bytes() : 0));
  reply(rd);

  while (next_command(&cmd)) {
    const std::string c = cmd.find("cmd")->as_string();
    if (c == "bind") {
      on_bind(cmd, bind, [&](int threads) { kv->set_host_attention_threads(threads); });
    } else if (c == "step") {
      reply(timed_step(dec, *kv, mode, shape, kv_dtype, a.batch));
    } else if (c == "exit") {
      return;
    } else {
      KVPR_THROW("scale worker: unknown command '", c, "'");
    }
  }
}

// A neighbour's host memory and its work per step: the load of a worker whose GPU this host
// does not have.
class Neighbour {
 public:
  Neighbour(const WorkerArgs& a, KvMode mode, DType kv_dtype, const json::Value& alloc)
      : a_(a), attention_(mode == KvMode::CpuAttn), dtype_(kv_dtype),
        layers_(alloc.find("layers")->as_int()), heads_(alloc.find("heads")->as_int()),
        head_dim_(alloc.find("head_dim")->as_int()), kv_hidden_(alloc.find("kv_heads")->as_int() * head_dim_) {
    const size_t host_bytes = static_cast<size_t>(alloc.find("host_kv_bytes")->as_int());
    flat_bytes_ = std::max<size_t>(host_bytes, 4096) / 64 * 64;
    if (attention_) {  // each layer's K and V, [batch, capacity, kv_hidden], touched (no shared zero pages)
      for (int64_t l = 0; l < layers_; ++l)
        for (auto* kv : {&k_, &v_}) {
          kv->push_back(Tensor::host(dtype_, {a.batch, a.capacity, kv_hidden_}));
          std::memset(kv->back().data(), 0x11, kv->back().nbytes());
        }
      q_ = Tensor::host(DType::F32, {a.batch, heads_ * head_dim_});
      out_ = Tensor::host(DType::F32, {a.batch, heads_ * head_dim_});
      for (int64_t i = 0; i < q_.numel(); ++i) q_.data_as<float>()[i] = 0.01f * static_cast<float>(i % 97);
    } else {  // one flat buffer, and one thread's read rate (how many threads a link's rate needs)
      flat_ = touched_buffer(host_bytes);
      const size_t n = std::min<size_t>(flat_bytes_, 64u << 20);
      const auto t = Clock::now();
      g_sink += read_words(flat_.get(), n / 8);
      one_thread_gbps_ = static_cast<double>(n) / std::max(1e-9, seconds_since(t)) / 1e9;
    }
  }

  void use_threads(int t) {
    threads_ = t;
    pool_ = std::make_unique<ThreadPool>(t);
  }

  json::Value step(const json::Value& cmd) {
    KVPR_CHECK(pool_, "scale neighbour: step before bind");
    const double c0 = cpu_seconds();
    const auto t0 = Clock::now();
    json::Value r = event("step");
    const double dram = attention_ ? attend(std::min<int64_t>(cmd.find("ctx")->as_int(), a_.capacity - 1))
                                   : read(cmd.find("bytes")->as_double(), cmd.find("gbps")->as_double(), &r);
    const double s = seconds_since(t0);
    r.set("ms", s * 1e3);
    r.set("cpu_s", cpu_seconds() - c0);
    r.set("dram_bytes", dram);
    if (!attention_) r.set("read_gbps", dram / std::max(1e-9, s) / 1e9);
    return r;
  }

 private:
  // cpu-attn: the engine's host attention over `past` cached tokens (+ the new one) per sequence.
  double attend(int64_t past) {
    std::vector<AttentionSeq> seqs;
    for (int64_t l = 0; l < layers_; ++l) {
      seqs.clear();
      for (int b = 0; b < a_.batch; ++b)
        seqs.push_back(AttentionSeq{b, 1, past, k_[l].rows(b, 1).reshape({a_.capacity, kv_hidden_}),
                                    v_[l].rows(b, 1).reshape({a_.capacity, kv_hidden_})});
      cpu_attention(out_, q_, seqs, static_cast<int>(heads_), 1.0f / std::sqrt(static_cast<float>(head_dim_)), *pool_);
    }
    return host_attention_bytes(a_.batch, past + 1, layers_, kv_hidden_, dtype_);
  }

  // offload, kvpr: `bytes` (worker 0's link's) read at the link's rate `gbps`, on enough threads.
  double read(double bytes, double gbps, json::Value* r) {
    const int readers =
        std::clamp(static_cast<int>(std::ceil(gbps / std::max(0.1, 0.8 * one_thread_gbps_))), 1, threads_);
    const size_t share = static_cast<size_t>(bytes / readers) / 64 * 64;
    std::vector<std::thread> ts;
    for (int i = 0; i < readers; ++i)
      ts.emplace_back([&, i] {
        const double rate = gbps * 1e9 / readers;  // bytes per second for this thread
        size_t off = (cursor_ + static_cast<size_t>(i) * share) % flat_bytes_, done = 0;
        const auto start = Clock::now();
        while (done < share) {
          const size_t n = std::min({share - done, flat_bytes_ - off, size_t{2} << 20});
          g_sink += read_words(flat_.get() + off / 8, n / 8);
          done += n;
          off = (off + n) % flat_bytes_;
          if (!(rate > 0) || !std::isfinite(rate)) continue;  // no link rate: read unpaced
          const auto due = start + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(static_cast<double>(done) / rate));
          if (due > Clock::now()) std::this_thread::sleep_until(due);
        }
      });
    for (auto& t : ts) t.join();
    cursor_ = (cursor_ + share * static_cast<size_t>(readers)) % flat_bytes_;
    r->set("readers", readers);
    return static_cast<double>(share) * readers;
  }

  const WorkerArgs& a_;
  const bool attention_;
  const DType dtype_;
  const int64_t layers_, heads_, head_dim_, kv_hidden_;
  std::vector<Tensor> k_, v_;
  Tensor q_, out_;
  HostBuffer flat_;
  size_t flat_bytes_ = 0, cursor_ = 0;
  double one_thread_gbps_ = 0;
  std::unique_ptr<ThreadPool> pool_;
  int threads_ = 1;
};

void run_neighbour(const WorkerArgs& a, const BindFn& bind) {
  KvMode mode;
  KVPR_CHECK(parse_kv_mode(a.mode_name, &mode), "unknown mode '", a.mode_name, "'");
  DType kv_dtype;
  KVPR_CHECK(parse_dtype(a.kv_dtype_name, &kv_dtype), "bad --kv-dtype");
  json::Value cmd;
  if (!next_command(&cmd)) return;
  KVPR_CHECK(cmd.find("cmd")->as_string() == "allocate", "scale neighbour: expected allocate");
  Neighbour nb(a, mode, kv_dtype, cmd);
  reply(event("ready"));
  while (next_command(&cmd)) {
    const std::string c = cmd.find("cmd")->as_string();
    if (c == "bind") on_bind(cmd, bind, [&](int t) { nb.use_threads(t); });
    else if (c == "step") reply(nb.step(cmd));
    else if (c == "exit") return;
    else KVPR_THROW("scale neighbour: unknown command '", c, "'");
  }
}

}  // namespace

int cmd_scale_worker(const std::vector<std::string>& args) {
  const Options opt(args, {"--role", "--index", "--mode", "--preset", "--backend", "--device", "--batch",
                                  "--prompt", "--capacity", "--kv-dtype", "--emulate-link-gbps", "--max-positions",
                                  "--cpus", "--node"});
  WorkerArgs a;
  a.role = opt.get("--role", "real");
  a.index = opt.get_int("--index", 0);
  a.mode_name = opt.get("--mode", "kvpr");
  a.preset = opt.get("--preset", "opt-6.7b");
  a.backend = opt.get("--backend", "auto");
  a.device = opt.get_int("--device", 0);
  a.batch = opt.get_int("--batch", 8);
  a.prompt = opt.get_int("--prompt", 1024);
  a.capacity = opt.get_int("--capacity", a.prompt + 64);
  a.kv_dtype_name = opt.get("--kv-dtype", "f16");
  a.link_gbps = opt.get_double("--emulate-link-gbps", 0);
  a.max_positions = opt.get_int("--max-positions", 0);
  a.node = opt.get_int("--node", -1);
  BindFn bind = [](const std::vector<int>&) {
    return std::string("not bound (built without hwloc)");
  };
#ifdef KVPR_HAVE_HWLOC
  a.cpus = parse_cpu_list(opt.get("--cpus", ""));
  std::shared_ptr<Topology> topo = std::make_shared<Topology>(Topology::from_system());
  bind = [topo, &a](const std::vector<int>& cpus) { return bind_to(*topo, a.index, cpus, a.node); };
  // Before anything is allocated: host memory lands on the worker's node.
  if (!a.cpus.empty() || a.node >= 0) bind(a.cpus);
#endif
  KVPR_CHECK(a.role == "real" || a.role == "neighbour", "--role: real or neighbour");
  if (a.role == "real") run_real_worker(a, bind);
  else run_neighbour(a, bind);
  return 0;
}

}  // namespace kvpr::bench
