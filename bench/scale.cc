// kvpr-bench scale: how decode throughput scales with the number of GPUs sharing one host.
//
//   kvpr-bench scale [--preset P] [--workers 1,2,4,8] [--modes kvpr,offload,cpu-attn] [--batch B]
//                    [--prompt P] [--gen N] [--kv-dtype D] [--backend B] [--real-workers R]
//                    [--emulate-link-gbps G] [--max-positions N] [--probe-mib M]
//                    [--json F] [--svg F]
//   kvpr-bench scale --topology XML [--workers 1,2,4,8]
//     (the plan for each N on the machine an `lstopo --of xml` file describes, as JSON; nothing runs)
//
// For each mode and each N, N worker processes placed by kvprd's planner (numa/placement.h:
// disjoint cpusets, host memory on the worker's node) decode the same workload in lockstep:
// each step starts on every worker at once, the next when all have finished. Workers are
// started once per mode with the largest N's placement for their memory and moved to each
// N's cpuset between phases (the KV they prefilled stays where it is).
//
// A worker is real (its own GPU, or on the CPU backend its own emulated one) or a neighbour
// standing in for a GPU the host lacks. A neighbour puts on the host what its worker would:
//   cpu-attn          host attention (the engine's kernel) over its own host KV, batch x the
//                     real worker's context, on its own cpuset's threads, once per step;
//   offload, kvpr     reads of its own host memory, as many bytes per step as worker 0's link
//                     moved in its last step, paced at worker 0's measured link rate (a CPU
//                     read stands in for the DMA engine's, from the neighbour's own cores).
// With neighbours the aggregate is N x worker 0 (projected from a worker measured under the
// host contention of N); with real workers only it is their sum.
//
// Also measured, before the workers start: host DRAM read bandwidth with 1..all cores
// reading, and pinned H2D with k readers loading host memory.
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

constexpr double kSetupTimeoutS = 1800;        // model, profile, prefill (cpu-attn prefills on the host)
constexpr double kStepTimeoutS = 300;          // one step or one command

// ------------------------------------------------------------------ the orchestrator side

// A worker process: commands to its stdin, replies from fd 3.
class Child {
 public:
  Child(const std::string& exe, const std::vector<std::string>& args, int threads) {
    int in[2], out[2];
    KVPR_CHECK(pipe2(in, O_CLOEXEC) == 0 && pipe2(out, O_CLOEXEC) == 0, "pipe: ", std::strerror(errno));
    std::vector<std::string> argv_s = {exe};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    const std::string env_threads = "KVPR_THREADS=" + std::to_string(threads);
    pid_ = fork();
    KVPR_CHECK(pid_ >= 0, "fork: ", std::strerror(errno));
    if (pid_ == 0) {
      // dup2 onto the same descriptor keeps O_CLOEXEC (a parent started with fd 0 or 3 closed)
      if (in[0] == 0) fcntl(0, F_SETFD, 0);
      else dup2(in[0], 0);
      if (out[1] == kReplyFd) fcntl(kReplyFd, F_SETFD, 0);
      else dup2(out[1], kReplyFd);
      putenv(const_cast<char*>(env_threads.c_str()));
      execv(exe.c_str(), argv.data());
      std::fprintf(stderr, "kvpr-bench scale: cannot run %s: %s\n", exe.c_str(), std::strerror(errno));
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = in[1];
    from_ = out[0];
  }
  ~Child() {
    if (to_ >= 0) close(to_);
    if (from_ >= 0) close(from_);
    if (pid_ > 0) {
      // Closing stdin ends a worker waiting for commands; one that does not end is killed.
      for (int i = 0; i < 100 && waitpid(pid_, nullptr, WNOHANG) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (waitpid(pid_, nullptr, WNOHANG) == 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
      }
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  void send(const json::Value& v) {
    const std::string s = v.dump() + "\n";
    for (size_t off = 0; off < s.size();) {
      ssize_t n = ::write(to_, s.data() + off, s.size() - off);
      if (n < 0 && errno == EINTR) continue;
      KVPR_CHECK(n > 0, "worker ", pid_, " is gone (", std::strerror(errno), ")");
      off += static_cast<size_t>(n);
    }
  }
  // The next reply; an error when the worker exits or says nothing for `timeout_s`.
  json::Value receive(double timeout_s, const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    for (;;) {
      if (size_t nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return json::parse(line);
      }
      const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
      KVPR_CHECK(left > 0, "worker ", pid_, ": no reply to ", what, " in ", timeout_s, " s");
      pollfd p{from_, POLLIN, 0};
      int r = poll(&p, 1, static_cast<int>(std::min(left, 1.0) * 1000) + 1);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) continue;
      char tmp[4096];
      ssize_t n = ::read(from_, tmp, sizeof tmp);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        int status = 0;
        waitpid(pid_, &status, 0);
        const int pid = pid_;
        pid_ = -1;
        KVPR_THROW("worker ", pid, " ended during ", what, " (",
                   WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                     : "signal " + std::to_string(WTERMSIG(status)),
                   "; its error is above)");
      }
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }
  json::Value expect(const char* name, double timeout_s) {
    json::Value v = receive(timeout_s, name);
    KVPR_CHECK(v.find("event") && v.find("event")->as_string() == name, "worker ", pid_, ": expected ", name,
               ", got ", v.dump());
    return v;
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  std::string buf_;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ','))
    if (!part.empty()) out.push_back(part);
  return out;
}

std::string svg_chart(const json::Value& result) {
  // Left: aggregate tokens/s against N per mode; right: worker 0's ms per step. Hollow markers
  // and dashed lines: projected from worker 0 under measured contention (neighbours).
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
  const auto& modes = result.find("modes")->as_array();
  std::vector<int64_t> ns;
  for (const auto& m : modes)
    for (const auto& p : m.find("points")->as_array()) ns.push_back(p.find("workers")->as_int());
  std::sort(ns.begin(), ns.end());
  ns.erase(std::unique(ns.begin(), ns.end()), ns.end());
  std::ostringstream o;
  const int W = 360, H = 260, L = 60, T = 30, PW = 270, PH = 180;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << 2 * W << "\" height=\"" << H + 40
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o << "<text x=\"10\" y=\"16\" font-size=\"13\">" << result.find("title")->as_string() << "</text>\n";
  auto panel = [&](int x0, const char* key, const char* label) {
    double ymax = 0;
    for (const auto& m : modes)
      for (const auto& p : m.find("points")->as_array()) ymax = std::max(ymax, p.find(key)->as_double());
    ymax = ymax > 0 ? ymax * 1.1 : 1;
    auto X = [&](int64_t n) {
      const size_t i = static_cast<size_t>(std::find(ns.begin(), ns.end(), n) - ns.begin());
      return x0 + L + (ns.size() > 1 ? static_cast<double>(i) * PW / static_cast<double>(ns.size() - 1) : PW / 2.0);
    };
    auto Y = [&](double v) { return T + PH - v / ymax * PH; };
    o << "<rect x=\"" << x0 + L << "\" y=\"" << T << "\" width=\"" << PW << "\" height=\"" << PH
      << "\" fill=\"none\" stroke=\"#999\"/>\n";
    o << "<text x=\"" << x0 + L << "\" y=\"" << T - 6 << "\">" << label << "</text>\n";
    for (int g = 0; g <= 4; ++g) {
      const double v = ymax * g / 4;
      char s[32];
      std::snprintf(s, sizeof s, "%.3g", v);
      o << "<text x=\"" << x0 + L - 4 << "\" y=\"" << Y(v) + 4 << "\" text-anchor=\"end\">" << s << "</text>\n";
    }
    for (int64_t n : ns)
      o << "<text x=\"" << X(n) << "\" y=\"" << T + PH + 14 << "\" text-anchor=\"middle\">" << n << "</text>\n";
    o << "<text x=\"" << x0 + L + PW / 2 << "\" y=\"" << T + PH + 28 << "\" text-anchor=\"middle\">workers (GPUs)</text>\n";
    int ci = 0;
    for (const auto& m : modes) {
      const char* col = colors[ci++ % 5];
      const auto& pts = m.find("points")->as_array();
      for (size_t i = 0; i + 1 < pts.size(); ++i) {
        const bool dashed = pts[i + 1].find("projected")->as_bool();
        o << "<line x1=\"" << X(pts[i].find("workers")->as_int()) << "\" y1=\"" << Y(pts[i].find(key)->as_double())
          << "\" x2=\"" << X(pts[i + 1].find("workers")->as_int()) << "\" y2=\"" << Y(pts[i + 1].find(key)->as_double())
          << "\" stroke=\"" << col << "\" stroke-width=\"2\"" << (dashed ? " stroke-dasharray=\"5,3\"" : "") << "/>\n";
      }
      for (const auto& p : pts) {
        const bool proj = p.find("projected")->as_bool();
        o << "<circle cx=\"" << X(p.find("workers")->as_int()) << "\" cy=\"" << Y(p.find(key)->as_double())
          << "\" r=\"4\" stroke=\"" << col << "\" stroke-width=\"2\" fill=\"" << (proj ? "white" : col) << "\"/>\n";
      }
    }
  };
  panel(0, "aggregate_tokens_per_s", "aggregate decode tokens/s");
  panel(W, "worker0_ms_per_step", "worker 0: ms per step");
  int ci = 0;
  for (const auto& m : modes) {
    o << "<rect x=\"" << L + 110 * ci << "\" y=\"" << H + 14 << "\" width=\"10\" height=\"10\" fill=\"" << colors[ci % 5]
      << "\"/><text x=\"" << L + 14 + 110 * ci << "\" y=\"" << H + 23 << "\">" << m.find("mode")->as_string() << "</text>\n";
    ++ci;
  }
  o << "<text x=\"" << L + 110 * ci << "\" y=\"" << H + 23
    << "\">hollow, dashed: projected (N x worker 0 under N workers' host load)</text>\n";
  o << "</svg>\n";
  return o.str();
}

}  // namespace

#ifdef KVPR_HAVE_HWLOC
namespace {

struct ScaleConfig {
  std::string preset, backend, kv_dtype, topology, json_out, svg_out;
  int batch = 8, prompt = 1024, gen = 6, max_positions = 0, real_workers = 1, probe_mib = 0;
  double link_gbps = 0;
  std::vector<int> ns;             // worker counts, ascending
  std::vector<std::string> modes;  // with host KV
};

ScaleConfig parse_scale_args(const Args& args) {
  const Options opt(args, {"--preset", "--workers", "--modes", "--batch", "--prompt", "--gen", "--kv-dtype",
                           "--backend", "--real-workers", "--emulate-link-gbps", "--max-positions", "--probe-mib",
                           "--json", "--svg", "--topology"});
  ScaleConfig c;
  c.preset = opt.get("--preset", "opt-6.7b");
  c.backend = opt.get("--backend", "auto");
  c.kv_dtype = opt.get("--kv-dtype", "f16");
  c.topology = opt.get("--topology", "");
  c.json_out = opt.get("--json", "");
  c.svg_out = opt.get("--svg", "");
  c.batch = opt.get_int("--batch", 8);
  c.prompt = opt.get_int("--prompt", 1024);
  c.gen = opt.get_int("--gen", 6);
  c.max_positions = opt.get_int("--max-positions", 0);
  c.real_workers = opt.get_int("--real-workers", 1);
  c.probe_mib = opt.get_int("--probe-mib", 0);
  c.link_gbps = opt.get_double("--emulate-link-gbps", 0);
  KVPR_CHECK(c.batch > 0 && c.prompt > 0 && c.gen > 0, "--batch, --prompt and --gen must be positive");
  KVPR_CHECK(c.probe_mib >= 0 && c.real_workers >= 1, "--probe-mib and --real-workers must be positive");
  engine_options_of(opt, {"--kv-dtype"}, EngineOptions{});  // checks it as the engine's table does
  for (const auto& w : split_list(opt.get("--workers", "1,2,4,8"))) {
    int n = 0;
    try {
      n = std::stoi(w);
    } catch (const std::exception&) {
      KVPR_THROW("--workers: '", w, "' is not a number");
    }
    KVPR_CHECK(n >= 1 && n <= 256, "--workers: ", n, " is outside 1..256");
    c.ns.push_back(n);
  }
  KVPR_CHECK(!c.ns.empty(), "--workers: empty list");
  std::sort(c.ns.begin(), c.ns.end());
  c.ns.erase(std::unique(c.ns.begin(), c.ns.end()), c.ns.end());
  c.modes = split_list(opt.get("--modes", "kvpr,offload,cpu-attn"));
  for (const auto& m : c.modes) {
    KvMode km;
    KVPR_CHECK(parse_kv_mode(m, &km) && kv_mode_uses_host(km), "--modes: '", m,
               "' is not a mode with host KV (kvpr, offload, recompute, cpu-attn)");
  }
  return c;
}

// One worker's figures over a phase's counted steps.
json::Value worker_figures(const std::vector<json::Value>& steps, bool real) {
  std::vector<double> ms, gbps;
  double cpu = 0, dram = 0;
  for (const auto& r : steps) {
    ms.push_back(r.find("ms")->as_double());
    cpu += r.find("cpu_s")->as_double();
    dram += r.find("dram_bytes")->as_double();
    const json::Value* lb = r.find("link_bytes");
    gbps.push_back((lb ? lb->as_double() : r.find("dram_bytes")->as_double()) / (ms.back() / 1e3) / 1e9);
  }
  const double n = static_cast<double>(std::max<size_t>(1, steps.size()));
  json::Value w(json::Object{});
  w.set("real", real);
  w.set("ms_per_step", median(ms));
  w.set(real ? "link_gbps" : "read_gbps", median(gbps));
  w.set("host_cpu_s_per_step", cpu / n);
  w.set("host_dram_bytes_per_step", dram / n);
  return w;
}

// The table on stdout, one row per mode and N.
void print_table(const json::Value& result) {
  std::printf("\n%-10s %8s %6s %12s %14s %11s %12s %14s\n", "mode", "workers", "real", "ms/step w0", "tokens/s",
              "efficiency", "cpu s/step", "DRAM GB/step");
  for (const auto& m : result.find("modes")->as_array())
    for (const auto& p : m.find("points")->as_array()) {
      double cpu = 0, dram = 0;
      for (const auto& w : p.find("per_worker")->as_array()) {
        cpu += w.find("host_cpu_s_per_step")->as_double();
        dram += w.find("host_dram_bytes_per_step")->as_double();
      }
      std::printf("%-10s %8lld %6lld %12.2f %14.1f%s %10.2f %12.3f %14.3f\n", m.find("mode")->as_string().c_str(),
                  static_cast<long long>(p.find("workers")->as_int()),
                  static_cast<long long>(p.find("real_workers")->as_int()), p.find("worker0_ms_per_step")->as_double(),
                  p.find("aggregate_tokens_per_s")->as_double(), p.find("projected")->as_bool() ? "*" : " ",
                  p.find("efficiency")->as_double(), cpu, dram / 1e9);
    }
  std::printf("* projected: N x worker 0, measured with N-1 neighbours loading the host\n");
}

using Workers = std::vector<std::unique_ptr<Child>>;

// One run of `kvpr-bench scale`: the host, its plans, the probes, then each mode's workers.
class ScaleRun {
 public:
  explicit ScaleRun(ScaleConfig c)
      : c_(std::move(c)),
        topo_(c_.topology.empty() ? Topology::from_system() : Topology::from_xml(c_.topology)) {
    if (!c_.topology.empty()) {
      for (const auto& g : topo_.gpus()) gpus_.push_back(g.bus_id);
      return;
    }
    be_ = bench_backend(c_.backend);
    cpu_backend_ = be_->device_is_host();
    if (!cpu_backend_) gpus_ = bench_gpu_bus_ids();
    // Real workers: one per GPU; on the CPU backend --real-workers (each its own emulated device).
    real_available_ = cpu_backend_ ? c_.real_workers : static_cast<int>(gpus_.size());
    KVPR_CHECK(real_available_ >= 1, "no GPU found and not the cpu backend");
    KVPR_CHECK(c_.link_gbps <= 0 || dynamic_cast<CpuBackend*>(be_.get()), "--emulate-link-gbps is for the cpu backend");
    char exe[4096];
    const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    KVPR_CHECK(len > 0, "cannot find this program (/proc/self/exe)");
    exe_.assign(exe, static_cast<size_t>(len));
  }

  // kvprd's plan for n workers: its GPU plan for the first GPUs, "" (a neighbour) past them.
  std::vector<WorkerPlacement> plan(int n) const {
    if (gpus_.empty()) return plan_placement(topo_, {}, n);  // kvprd --backend cpu --workers n
    std::vector<std::string> bus(static_cast<size_t>(n));
    for (int i = 0; i < n && i < static_cast<int>(gpus_.size()); ++i) bus[i] = gpus_[i];
    return plan_placement(topo_, bus, 0);
  }

  json::Value plans() const {
    json::Value r(json::Object{});
    json::Array plans;
    for (int n : c_.ns) {
      json::Value p(json::Object{});
      p.set("workers", n);
      p.set("placement", placement_json(topo_, plan(n)));
      plans.push_back(std::move(p));
    }
    r.set("plans", std::move(plans));
    return r;
  }

  // `progress` gets the result so far after every point ("complete": false), so a run cut short
  // keeps what it measured.
  json::Value run(const std::function<void(const json::Value&)>& progress) {
    json::Value result = header();
    result.set("efficiency_base", "each mode's first N, per worker: efficiency = aggregate(N) / (N x that)");
    probe_host(result);
    be_.reset();  // the workers own the devices from here
    json::Array modes;
    for (const std::string& m : c_.modes) {
      modes.push_back(run_mode(m, [&](const json::Value& partial) {
        json::Value r = result;
        json::Array so_far = modes;
        so_far.push_back(partial);
        r.set("modes", std::move(so_far));
        r.set("complete", false);
        progress(r);
      }));
    }
    result.set("modes", std::move(modes));
    result.set("complete", true);
    return result;
  }

 private:
  int nmax() const { return c_.ns.back(); }
  int capacity() const { return c_.prompt + static_cast<int>(c_.ns.size()) * (c_.gen + 1) + 4; }

  json::Value header() const {
    json::Value r(json::Object{});
    char title[200];
    std::snprintf(title, sizeof title, "%s, batch %d per worker, prompt %d, %s, %s", c_.preset.c_str(), c_.batch,
                  c_.prompt, c_.kv_dtype.c_str(), be_->name().c_str());
    r.set("title", title);
    r.set("benchmark", "scale");
    r.set("preset", c_.preset);
    r.set("batch", c_.batch);
    r.set("prompt", c_.prompt);
    r.set("gen", c_.gen);
    r.set("kv_dtype", c_.kv_dtype);
    r.set("device", be_->name());
    r.set("gpus", static_cast<int64_t>(gpus_.size()));
    r.set("real_workers_available", real_available_);
    if (c_.link_gbps > 0) r.set("emulated_link_gbps", c_.link_gbps);
    r.set("topology", placement_json(topo_, plan(nmax())));
    return r;
  }

  // Host DRAM read bandwidth with 1..all cores, and pinned H2D with k readers, before any worker.
  void probe_host(json::Value& result) {
    std::vector<int> pus;
    for (const auto& n : topo_.nodes()) pus.insert(pus.end(), n.pus.begin(), n.pus.end());
    if (pus.empty()) pus = allowed_pus();
    const size_t probe = static_cast<size_t>(c_.probe_mib > 0 ? c_.probe_mib : cpu_backend_ ? 64 : 256) << 20;
    std::fprintf(stderr, "kvpr-bench scale: host read bandwidth, 1..%zu threads\n", pus.size());
    json::Array reads, h2d;
    for (int k : thread_counts(static_cast<int>(pus.size()))) {
      json::Value r(json::Object{});
      r.set("threads", k);
      r.set("gbps", host_read_gbps(pus, k, probe));
      std::fprintf(stderr, "  %3d threads: %.1f GB/s\n", k, r.find("gbps")->as_double());
      reads.push_back(std::move(r));
    }
    cpu_set_t before;
    pthread_getaffinity_np(pthread_self(), sizeof before, &before);
    pin_this_thread(pus.front());
    for (int k : thread_counts(static_cast<int>(pus.size()))) {
      const int readers = k == 1 ? 0 : k - 1;
      json::Value r(json::Object{});
      r.set("readers", readers);
      r.set("gbps", h2d_gbps_with_readers(*be_, pus, readers, probe, static_cast<int64_t>(probe)));
      std::fprintf(stderr, "  H2D with %2d readers: %.1f GB/s\n", readers, r.find("gbps")->as_double());
      h2d.push_back(std::move(r));
    }
    pthread_setaffinity_np(pthread_self(), sizeof before, &before);
    result.set("host_read_gbps", std::move(reads));
    result.set("h2d_gbps_with_readers", std::move(h2d));
  }

  Workers start_workers(const std::string& mode) const {
    const std::vector<WorkerPlacement> pm = plan(nmax());
    Workers workers;
    for (int i = 0; i < nmax(); ++i) {
      const WorkerPlacement& p = pm[static_cast<size_t>(i)];
      std::vector<std::string> a = {"scale-worker", "--role", i < real_available_ ? "real" : "neighbour", "--index",
                                    std::to_string(i), "--mode", mode, "--preset", c_.preset, "--backend", c_.backend,
                                    "--device", std::to_string(cpu_backend_ ? 0 : i), "--batch", std::to_string(c_.batch),
                                    "--prompt", std::to_string(c_.prompt), "--capacity", std::to_string(capacity()),
                                    "--kv-dtype", c_.kv_dtype, "--max-positions", std::to_string(c_.max_positions),
                                    "--cpus", cpu_list(p.cpus), "--node", std::to_string(p.numa_node)};
      if (c_.link_gbps > 0) a.insert(a.end(), {"--emulate-link-gbps", std::to_string(c_.link_gbps)});
      // The CPU backend's own pool (its emulated device) is sized once, for the most cores the
      // worker gets: those of the smallest N it runs in.
      const int first_n = *std::find_if(c_.ns.begin(), c_.ns.end(), [&](int n) { return n > i; });
      const size_t cores = plan(first_n)[static_cast<size_t>(i)].cpus.size();
      workers.push_back(std::make_unique<Child>(exe_, a, static_cast<int>(std::max<size_t>(1, cores))));
    }
    return workers;
  }

  // Sizes first (every worker's host KV and X must fit the host together), then the allocation;
  // worker 0's "ready" (its prefill, warm-up step and link rate).
  json::Value setup(Workers& workers, const std::string& mode) const {
    const int reals = std::min(nmax(), real_available_);
    json::Value shape;
    double need = 0;
    for (int i = 0; i < reals; ++i) {
      json::Value s = workers[i]->expect("shape", kSetupTimeoutS);
      need += s.find("host_kv_bytes")->as_double() + s.find("host_device_bytes")->as_double();
      if (i == 0) shape = s;
    }
    need += shape.find("host_kv_bytes")->as_double() * (nmax() - reals);
    const double avail = static_cast<double>(host_bytes_available());
    KVPR_CHECK(need <= 0.9 * avail, nmax(), " workers of batch ", c_.batch, " and ", capacity(), " tokens need ",
               need / 1e9, " GB of host memory for their KV in mode ", mode, "; ", avail / 1e9,
               " GB are available: lower --batch, --prompt or the largest --workers");
    json::Value alloc = shape;
    alloc.set("cmd", "allocate");
    for (auto& w : workers) w->send(alloc);
    json::Value ready0;
    for (int i = 0; i < nmax(); ++i) {
      json::Value r = workers[i]->expect("ready", kSetupTimeoutS);
      if (i == 0) ready0 = r;
    }
    return ready0;
  }

  json::Value run_mode(const std::string& mode, const std::function<void(const json::Value&)>& progress) const {
    std::fprintf(stderr, "kvpr-bench scale: %s, %d workers at most (%d real)\n", mode.c_str(), nmax(),
                 std::min(nmax(), real_available_));
    Workers workers = start_workers(mode);
    const json::Value ready0 = setup(workers, mode);
    double link_bytes = ready0.find("link_bytes")->as_double();
    const double link_gbps = ready0.find("link_gbps")->as_double();
    json::Value m(json::Object{});
    m.set("mode", mode);
    m.set("prefill_s", ready0.find("prefill_s")->as_double());
    m.set("link_gbps", link_gbps);
    json::Array points;
    double tps1 = 0;  // per worker at the first N
    for (size_t phase = 0; phase < c_.ns.size(); ++phase) {
      const int n = c_.ns[phase];
      json::Value pt = run_phase(workers, n, phase, link_bytes, link_gbps);
      const double agg = pt.find("aggregate_tokens_per_s")->as_double();
      if (phase == 0) tps1 = agg / n;
      pt.set("efficiency", tps1 > 0 ? agg / (n * tps1) : 0.0);
      std::fprintf(stderr, "  %-9s N=%-3d worker 0 %8.2f ms/step, %10.1f tokens/s%s, efficiency %.2f\n", mode.c_str(),
                   n, pt.find("worker0_ms_per_step")->as_double(), agg, pt.find("projected")->as_bool() ? " (projected)" : "",
                   pt.find("efficiency")->as_double());
      points.push_back(std::move(pt));
      json::Value partial = m;
      partial.set("points", points);
      progress(partial);
    }
    json::Value ex(json::Object{});
    ex.set("cmd", "exit");
    for (auto& w : workers) w->send(ex);
    m.set("points", std::move(points));
    return m;
  }

  // The first n workers on their cpusets for n, then gen + 1 lockstep steps (the first settles
  // the placement and is not counted). link_bytes: worker 0's last step's, what neighbours read.
  json::Value run_phase(Workers& workers, int n, size_t phase, double& link_bytes, double link_gbps) const {
    const std::vector<WorkerPlacement> pl = plan(n), pm = plan(nmax());
    const int real_n = std::min(n, real_available_);
    for (int i = 0; i < n; ++i) {
      json::Value b(json::Object{});
      b.set("cmd", "bind");
      json::Array cpus;
      for (int cpu : pl[static_cast<size_t>(i)].cpus) cpus.emplace_back(cpu);
      b.set("cpus", std::move(cpus));
      workers[i]->send(b);
    }
    std::vector<std::string> bound(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) bound[i] = workers[i]->expect("bound", kStepTimeoutS).find("how")->as_string();
    std::vector<std::vector<json::Value>> steps(static_cast<size_t>(n));
    for (int s = 0; s <= c_.gen; ++s) {
      json::Value real_step(json::Object{});
      real_step.set("cmd", "step");
      for (int i = 0; i < real_n; ++i) workers[i]->send(real_step);
      json::Value nb(json::Object{});
      nb.set("cmd", "step");
      nb.set("ctx", c_.prompt + 1 + static_cast<int64_t>(phase) * (c_.gen + 1) + s);  // worker 0's cached tokens
      nb.set("bytes", link_bytes);
      nb.set("gbps", link_gbps);
      for (int i = real_n; i < n; ++i) workers[i]->send(nb);
      for (int i = 0; i < n; ++i) {
        json::Value r = workers[i]->expect("step", kStepTimeoutS);
        if (i == 0) link_bytes = r.find("link_bytes")->as_double();
        if (s > 0) steps[i].push_back(std::move(r));
      }
    }
    json::Array per;
    double sum_tps = 0;
    for (int i = 0; i < n; ++i) {
      json::Value w = worker_figures(steps[i], i < real_n);
      w.set("worker", i);
      w.set("cpus", cpu_list(pl[static_cast<size_t>(i)].cpus));
      w.set("numa_node", pm[static_cast<size_t>(i)].numa_node);
      w.set("bound", bound[i]);
      if (i < real_n) sum_tps += c_.batch / (w.find("ms_per_step")->as_double() / 1e3);
      per.push_back(std::move(w));
    }
    const double w0_ms = per.front().find("ms_per_step")->as_double();
    json::Value pt(json::Object{});
    pt.set("workers", n);
    pt.set("real_workers", real_n);
    pt.set("projected", real_n < n);
    pt.set("worker0_ms_per_step", w0_ms);
    pt.set("aggregate_tokens_per_s", real_n < n ? n * c_.batch / (w0_ms / 1e3) : sum_tps);
    pt.set("per_worker", std::move(per));
    return pt;
  }

  ScaleConfig c_;
  Topology topo_;
  std::unique_ptr<Backend> be_;
  bool cpu_backend_ = false;
  std::vector<std::string> gpus_;
  int real_available_ = 0;
  std::string exe_;
};

}  // namespace
#endif

int cmd_scale(const std::vector<std::string>& args) {
#ifndef KVPR_HAVE_HWLOC
  (void)args;
  KVPR_THROW("kvpr-bench scale places workers as kvprd does and needs hwloc (install libhwloc-dev and rebuild)");
#else
  ScaleConfig c = parse_scale_args(args);
  const std::string json_out = c.json_out, svg_out = c.svg_out;
  const bool plans_only = !c.topology.empty();  // another machine's: its plans only
  ScaleRun run(std::move(c));
  if (plans_only) {
    std::cout << run.plans().dump() << "\n";
    return 0;
  }
  signal(SIGPIPE, SIG_IGN);  // a worker that died is reported by its pipe's EOF
  const json::Value result = run.run([&](const json::Value& partial) { write_json(json_out, partial); });
  print_table(result);
  write_json(json_out, result);
  if (!svg_out.empty()) {
    std::ofstream o(svg_out);
    o << svg_chart(result);
    KVPR_CHECK(o.good(), svg_out, ": cannot write");
  }
  return 0;
#endif
}

}  // namespace kvpr::bench
