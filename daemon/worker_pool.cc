#include "daemon/worker_pool.h"

#include <boost/asio/post.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <mutex>

#include <spdlog/spdlog.h>

#include "engine/base/error.h"
#include "engine/base/host_memory.h"
#ifdef KVPR_HAVE_HWLOC
#include "numa/placement.h"
#endif

extern char** environ;

namespace kvpr {

namespace {

// Where a worker's weights came from, as its ready message's placement says.
std::string weights_from(const json::Value& placement) {
  const json::Value* v = placement.is_object() ? placement.find("weights_from") : nullptr;
  return v && v->is_string() ? v->as_string() : "?";
}

using Clock = std::chrono::steady_clock;

// Frames on their way to one worker process. The io thread only queues (never blocks on a
// worker's socket: a stopped or hung worker cannot stall /health); a sender thread writes them.
class Outbox {
 public:
  static constexpr size_t kMaxBytes = 64u << 20;   // past it a message is refused
  static constexpr size_t kBusyBytes = 8u << 20;   // past it the worker is given no new requests

  bool push(std::string frame) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || bytes_ + frame.size() > kMaxBytes) return false;
    bytes_ += frame.size();
    frames_.push_back(std::move(frame));
    cv_.notify_one();
    return true;
  }
  size_t queued_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
  }
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    cv_.notify_all();
  }
  // The sender thread: until closed or the channel fails.
  void drain_into(FrameChannel& ch) {
    while (true) {
      std::string f;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return closed_ || !frames_.empty(); });
        if (frames_.empty()) return;
        f = std::move(frames_.front());
        frames_.pop_front();
        bytes_ -= f.size();
      }
      try {
        ch.send_frame(f);
      } catch (const std::exception&) {
        return;  // the worker is gone: its reader sees the end and fails what it held
      }
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> frames_;
  size_t bytes_ = 0;
  bool closed_ = false;
};

}  // namespace

// One process of a worker, from its spawn until it is reaped (or given up on: see
// Supervisor). Shared with its reader thread, which outlives it when the process never exits.
struct WorkerPool::Process {
  pid_t pid = 0;
  std::mutex mu;
  bool reaped = false;          // under mu: from here on the pid may be another process's
  std::string exit_why;         // how it ended, once reaped
  std::atomic<bool> done{false};       // reaped (exit_why is set)
  std::atomic<bool> abandoned{false};  // the pool stopped waiting for it
  // SIGKILL to its process group (the worker and anything it started), only while unreaped.
  void kill() {
    std::lock_guard<std::mutex> lock(mu);
    if (reaped || pid <= 0) return;
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);  // if it had not yet made its own group
  }
};

struct WorkerPool::Worker {
  int index = 0;
  bool cuda = false;
  int device = 0;
  std::shared_ptr<Process> proc;  // the current process, if any
  std::shared_ptr<FrameChannel> ch;
  std::shared_ptr<Outbox> out;  // this incarnation's, drained by `sender`
  std::thread sender;
  uint64_t gen = 0;  // incarnation: messages of an earlier process are ignored
  Supervisor sup;
  int unresponsive = 0;             // times it went silent past --worker-timeout and was killed
  Clock::time_point last_heard{};   // its last message (heartbeats come every second)
  int64_t step_ms = 0;              // from its last heartbeat: how long its current step has run
  int64_t longest_step_ms = 0;      // this process's longest finished step (its stats): the auto step limit
  std::thread reader;
  struct Pending {
    EventSink sink;
    int64_t cost;
    std::shared_ptr<std::vector<int32_t>> tokens;  // its entry of `recent`, which grows with the answer
  };
  std::map<uint64_t, Pending> pending;
  int64_t outstanding = 0;
  // The prompts last sent to it with their answers so far, newest last: what its prefix cache
  // most likely holds.
  std::deque<std::shared_ptr<std::vector<int32_t>>> recent;
  std::string last_error, fatal;
  WorkerStats stats;
  ReadyMessage info;
  std::unique_ptr<boost::asio::steady_timer> timer;  // the supervisor's next deadline
  bool first_start = true;  // the NCCL weight broadcast happens only at the first start
  bool broadcast_start = false;  // this process was started into the weight broadcast
  bool in_broadcast = false;     // ... and has not yet said its weights are loaded
  bool ever_ready = false;
  bool failed_at_start = false;  // reported an error and exited before it was ever ready
  int numa_node = -1;     // from the placement plan
  std::vector<int> cpus;  // disjoint from the other workers'
  pid_t pid() const { return proc ? proc->pid : 0; }
};

WorkerPool::WorkerPool(boost::asio::io_context& io, const DaemonConfig& cfg, std::string worker_binary,
                       const EngineDescription& engine)
    : io_(io), cfg_(cfg), binary_(std::move(worker_binary)), liveness_timer_(io) {
  bool cuda = cfg.backend == "cuda" || (cfg.backend == "auto" && !engine.gpu_bus_ids.empty());
  std::vector<int> devices;
  if (cuda) {
    const int n = static_cast<int>(engine.gpu_bus_ids.size());
    if (cfg.gpus == "all") {
      for (int i = 0; i < n; ++i) devices.push_back(i);
    } else {
      size_t p = 0;
      while (p <= cfg.gpus.size()) {
        size_t q = cfg.gpus.find(',', p);
        if (q == std::string::npos) q = cfg.gpus.size();
        int d = std::stoi(cfg.gpus.substr(p, q - p));
        KVPR_CHECK(d >= 0 && d < n, "--gpus names device ", d, " but ", n, " are visible");
        devices.push_back(d);
        p = q + 1;
      }
    }
    KVPR_CHECK(!devices.empty(), "backend cuda: no GPU visible");
  }
  int count = cuda ? static_cast<int>(devices.size()) : cfg.workers;
  for (int i = 0; i < count; ++i) {
    auto w = std::make_shared<Worker>();
    w->index = i;
    w->cuda = cuda;
    w->device = cuda ? devices[i] : 0;
    w->timer = std::make_unique<boost::asio::steady_timer>(io_);
    SupervisorTiming t;
    t.exit_grace = std::chrono::milliseconds(static_cast<int64_t>(cfg.worker_timeout_s * 1000));  // silent this long
    w->sup = Supervisor(t);
    workers_.push_back(w);
  }
  share_host_memory(count);
  // Several GPUs: read the weights once, broadcast them with NCCL (worker 0 makes the group).
  broadcast_ = cuda && count > 1 && engine.nccl;
#ifdef KVPR_HAVE_HWLOC
  // Each worker on its GPU's NUMA node with its own cores (numa/placement.h).
  try {
    Topology topo = Topology::from_system();
    std::vector<std::string> bus;
    for (int d : devices) bus.push_back(engine.gpu_bus_ids.at(static_cast<size_t>(d)));
    auto plan = plan_placement(topo, bus, cuda ? 0 : count);
    // The plan counts GPUs in the order given; each worker's is the CUDA device --gpus named (the
    // table showed 0, 1 for --gpus 1,6 while those workers ran on devices 1 and 6).
    for (size_t i = 0; cuda && i < plan.size() && i < devices.size(); ++i) plan[i].cuda_device = devices[i];
    for (size_t i = 0; i < plan.size() && i < workers_.size(); ++i) {
      workers_[i]->numa_node = plan[i].numa_node;
      workers_[i]->cpus = plan[i].cpus;
    }
    placement_ = placement_table(topo, plan);
  } catch (const std::exception& e) {
    placement_ = std::string("no placement: ") + e.what() + "\n";
  }
#else
  placement_ = "no placement: built without hwloc\n";
#endif
}

// Each worker's share of the host's memory, for its weights in host memory and a KV store there
// sized by memory: 90% of what the host has available now, before any worker, evenly (measured
// once, so a restarted worker gets the same share; a worker's own host-memory or kv-cache wins).
void WorkerPool::share_host_memory(int count) {
  GeneratorOptions& g = cfg_.engine.generator;
  if (g.host_memory > 0 || g.kv_cache_bytes > 0 || g.kv_cache_fraction > 0) return;
  const size_t avail = host_bytes_available();
  if (avail == SIZE_MAX) return;
  g.host_memory = 0.9 * static_cast<double>(avail) / count;
  spdlog::info("host memory: {:.2f} GiB available, {:.2f} GiB for each of {} worker(s) (its weights in host memory "
               "and its KV store there; --host-memory)",
               static_cast<double>(avail) / 1073741824.0, g.host_memory / 1073741824.0, count);
}

WorkerPool::~WorkerPool() { stop(); }

std::vector<std::string> WorkerPool::worker_args(const Worker& w, int fd) const {
  std::vector<std::string> a = {binary_, "--fd", std::to_string(fd), "--model", cfg_.model, "--index",
                                std::to_string(w.index), "--backend", w.cuda ? "cuda" : "cpu", "--device",
                                std::to_string(w.device)};
  for (std::string& arg : engine_option_args(cfg_.engine)) a.push_back(std::move(arg));
  if (w.numa_node >= 0) a.insert(a.end(), {"--numa-node", std::to_string(w.numa_node)});
  if (broadcast_ && w.first_start)  // worker 0 makes the group; the others get its id over the channel
    a.insert(a.end(), {"--nccl-rank", std::to_string(w.index), "--nccl-ranks", std::to_string(workers_.size())});
  if (!w.cpus.empty()) {
    std::string list;
    for (int c : w.cpus) list += (list.empty() ? "" : ",") + std::to_string(c);
    a.insert(a.end(), {"--cpus", list});
  }
  return a;
}

void WorkerPool::start() {
  for (auto& w : workers_) apply(*w, w->sup.start(Clock::now()));
  check_liveness();
}

// Does what the supervisor answered, then arms its timer for the next deadline.
void WorkerPool::apply(Worker& w, const Supervisor::Actions& a) {
  if (a.fail_pending) {
    const std::string& why = w.sup.why();
    fail_pending(w, why.rfind("was unresponsive", 0) == 0
                        ? why
                        : "stopped while generating (" + (w.fatal.empty() ? why : w.fatal + ": " + why) + ")");
  }
  if (a.kill && w.proc) w.proc->kill();
  if ((a.kill || a.abandon) && w.in_broadcast) leave_broadcast(w);  // it will not finish its part
  if (a.abandon) release(w, true);
  if (a.send_shutdown && w.out) w.out->push(FrameChannel::frame(encode_shutdown()));
  if (a.spawn) {
    Supervisor::Actions next;
    try {
      spawn(w);
      next = w.sup.spawned(Clock::now());
    } catch (const std::exception& e) {
      spdlog::error("worker {}: restart failed: {}; retrying in {} ms", w.index, e.what(), w.sup.next_backoff().count());
      // A process of the broadcast that never came (or came and went): the others would wait for it.
      if (w.in_broadcast || (broadcast_ && w.first_start)) leave_broadcast(w);
      next = w.sup.spawn_failed(Clock::now(), e.what());
    }
    w.last_error = w.sup.why();
    apply(w, next);
    return;
  }
  if (!w.sup.why().empty()) w.last_error = w.fatal.empty() ? w.sup.why() : w.fatal + " (" + w.sup.why() + ")";
  if (stopping_) return;  // stop() drives the supervisors itself
  if (const auto due = w.sup.deadline()) {
    w.timer->expires_at(*due);
    w.timer->async_wait([this, &w](const boost::system::error_code& ec) {
      if (!ec && !stopping_) apply(w, w.sup.tick(Clock::now()));
    });
  }
}

// The end of a process's channel and threads: its outbox closed, its socket shut (a sender
// blocked on a stopped peer returns), its threads joined, or left to finish on their own when
// the process was given up on (`abandon`: its reader still waits to reap it).
void WorkerPool::release(Worker& w, bool abandon) {
  if (abandon && w.proc) w.proc->abandoned = true;  // before its reader can wake: it posts nothing more
  if (w.out) w.out->close();
  if (w.ch) w.ch->shutdown();
  if (w.sender.joinable()) w.sender.join();
  if (w.reader.joinable()) {
    if (abandon) {
      w.reader.detach();
    } else {
      w.reader.join();
    }
  }
}

void WorkerPool::spawn(Worker& w) {
  if (w.reader.joinable() || w.sender.joinable()) release(w, !(w.proc && w.proc->done));
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    KVPR_THROW("socketpair failed: ", std::strerror(errno));
  // Everything the child needs is built before fork: after it only async-signal-safe calls.
  std::vector<std::string> args = worker_args(w, 3);
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "KVPR_THREADS=", 13) != 0) env_store.emplace_back(*e);
  if (!w.cpus.empty()) {
    env_store.push_back("KVPR_THREADS=" + std::to_string(w.cpus.size()));  // its own cores
  } else if (!w.cuda) {
    // No placement: CPU workers share the cores.
    int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    env_store.push_back("KVPR_THREADS=" + std::to_string(std::max(1, cores / static_cast<int>(workers_.size()))));
  }
  std::vector<char*> envp;
  for (auto& s : env_store) envp.push_back(s.data());
  envp.push_back(nullptr);
  const long max_fd = std::min<long>(::sysconf(_SC_OPEN_MAX), 1 << 20);
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(sv[0]);
    ::close(sv[1]);
    KVPR_THROW("fork failed: ", std::strerror(errno));
  }
  if (pid == 0) {
    ::setpgid(0, 0);                     // its own process group: SIGKILL reaches all it started
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a worker never outlives its controller
    if (sv[1] == 3) ::fcntl(3, F_SETFD, 0);
    else ::dup2(sv[1], 3);                // dup2 clears close-on-exec on the new descriptor
    // Nothing else of the controller's reaches the worker (listening socket, clients'
    // connections, other workers' channels), close-on-exec or not.
    if (::syscall(SYS_close_range, 4u, ~0u, 0u) != 0)
      for (long fd = 4; fd < max_fd; ++fd) ::close(static_cast<int>(fd));
    ::execve(argv[0], argv.data(), envp.data());
    const char msg[] = "kvpr-worker: exec failed\n";
    ssize_t ignored = ::write(2, msg, sizeof msg - 1);
    (void)ignored;
    ::_exit(127);
  }
  ::close(sv[1]);
  ::setpgid(pid, pid);  // as the child does: whichever runs first, the group exists before a kill
  w.broadcast_start = w.in_broadcast = broadcast_ && w.first_start;
  const bool send_nccl_id = w.in_broadcast && w.index != 0 && !nccl_id_.empty();
  w.first_start = false;  // a restart reads the checkpoint itself
  w.proc = std::make_shared<Process>();
  w.proc->pid = pid;
  w.ch = std::make_shared<FrameChannel>(sv[0]);
  w.out = std::make_shared<Outbox>();
  try {
    w.sender = std::thread([out = w.out, ch = w.ch] { out->drain_into(*ch); });
  } catch (const std::exception&) {  // no thread (out of tasks): the child goes, reaped, and the spawn failed
    undo_spawn(w);
    throw;
  }
  if (send_nccl_id) w.out->push(FrameChannel::frame(encode_nccl_id(nccl_id_)));
  w.last_heard = Clock::now();
  w.step_ms = 0;
  w.longest_step_ms = 0;
  w.fatal.clear();
  ++w.gen;
  spdlog::info("worker {}: started pid {} ({})", w.index, pid,
               w.cuda ? "cuda device " + std::to_string(w.device) : std::string("cpu"));
  auto self = workers_[w.index];
  try {
    w.reader = std::thread([this, self, ch = w.ch, proc = w.proc, gen = w.gen] { reader_loop(self, ch, proc, gen); });
  } catch (const std::exception&) {
    undo_spawn(w);
    throw;
  }
}

// A spawn that failed after its fork: the child is killed and reaped here (no reader waits for
// it), its channel and sender go, and the worker holds no process.
void WorkerPool::undo_spawn(Worker& w) {
  if (w.out) w.out->close();
  if (w.ch) w.ch->shutdown();
  if (w.sender.joinable()) w.sender.join();
  w.proc->kill();
  {
    std::lock_guard<std::mutex> lock(w.proc->mu);
    w.proc->reaped = true;
    int status = 0;
    ::waitpid(w.proc->pid, &status, 0);
  }
  w.proc.reset();
  w.ch.reset();
  w.out.reset();
}

void WorkerPool::reader_loop(std::shared_ptr<Worker> w, std::shared_ptr<FrameChannel> ch, std::shared_ptr<Process> proc,
                             uint64_t gen) {
  std::string why;
  try {
    while (true) {
      json::Value frame;
      ch->recv(&frame, -1);
      if (proc->abandoned) break;  // the pool stopped listening to this process
      boost::asio::post(io_, [this, w, gen, msg = decode_worker_message(frame)]() mutable { handle(*w, gen, msg); });
    }
  } catch (const ChannelClosed&) {
  } catch (const std::exception& e) {
    why = std::string("sent a bad message: ") + e.what();
  }
  if (!proc->abandoned)
    boost::asio::post(io_, [this, w, gen, why] {
      if (gen == w->gen) apply(*w, w->sup.channel_closed(Clock::now(), why, !why.empty()));
    });
  // Its exit, waited for without reaping it (WNOWAIT): until it is reaped below, its pid and
  // process group are still its own, so the io thread's SIGKILL can never reach another process.
  const pid_t pid = proc->pid;
  siginfo_t info{};
  while (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
  }
  int status = 0;
  std::string how;
  {
    std::lock_guard<std::mutex> lock(proc->mu);
    proc->reaped = true;
    if (::waitpid(pid, &status, 0) == pid) {
      if (WIFEXITED(status)) how = "exited with code " + std::to_string(WEXITSTATUS(status));
      else if (WIFSIGNALED(status))
        how = "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
    }
    proc->exit_why = why.empty() ? how : why + "; " + how;
  }
  proc->done = true;
  if (!proc->abandoned) boost::asio::post(io_, [this, w, gen] { on_exit(*w, gen); });
}

void WorkerPool::handle(Worker& w, uint64_t gen, WorkerMessage& msg) {
  using T = WorkerMessage::Type;
  if (gen != w.gen) return;
  w.last_heard = Clock::now();
  switch (msg.type) {
    case T::Heartbeat: w.step_ms = msg.step_ms; break;
    case T::NcclId: relay_nccl_id(w, msg.nccl_id); break;
    case T::Loaded: w.in_broadcast = false; break;
    case T::Ready:
      if (w.sup.phase() != Supervisor::Phase::Starting) return;  // killed already: its end is on its way
      apply(w, w.sup.ready(Clock::now()));
      w.ever_ready = true;
      w.info = std::move(msg.ready);
      spdlog::info("worker {}: ready ({}, kv mode {}, context {}, weights from {})", w.index, w.info.backend,
                   w.info.kv_mode, w.info.max_seq_len, weights_from(w.info.placement));
      if (!announced_ready_ && all_ready()) {
        announced_ready_ = true;
        if (on_all_ready_) on_all_ready_();
      }
      break;
    case T::Fatal:
      w.fatal = msg.fatal;
      spdlog::error("worker {}: {}", w.index, w.fatal);
      break;
    case T::Stats:
      w.stats = msg.stats;
      w.longest_step_ms = std::max(w.longest_step_ms, msg.stats.step_ms_max);
      break;
    case T::Events:
      for (RequestEvent& re : msg.events) {
        auto it = w.pending.find(re.id);
        if (it == w.pending.end()) continue;
        const EngineEvent& ev = re.event;
        if (ev.token >= 0 && it->second.tokens) it->second.tokens->push_back(ev.token);
        EventSink sink = it->second.sink;
        const bool last = !ev.error.empty() || !ev.finish_reason.empty();
        const int64_t cost = it->second.cost;
        if (last) {
          w.outstanding -= cost;
          w.pending.erase(it);
          route_.erase(re.id);
        }
        if (!deliver(sink, ev, re.id) && !last) {  // ended mid-answer: the worker stops generating it
          cancel(re.id);
          w.outstanding -= cost;
          w.pending.erase(re.id);
          route_.erase(re.id);
        }
      }
      break;
  }
}

// One request's event to its sink. What the sink throws (its response could not be built: a tool
// call that does not parse, text it cannot encode) ends that request alone with an error event;
// it never unwinds into the pool or the event loop. False when the sink threw.
bool WorkerPool::deliver(const EventSink& sink, const EngineEvent& ev, uint64_t id) {
  try {
    sink(ev);
    return true;
  } catch (const std::exception& e) {
    spdlog::error("request {}: {}", id, e.what());
    EngineEvent err;
    err.error = std::string("internal error: ") + e.what();
    try {
      sink(err);
    } catch (const std::exception&) {  // nothing more can be said to it
    }
    return false;
  }
}

// Every request a worker holds fails now, with `why`.
void WorkerPool::fail_pending(Worker& w, const std::string& why) {
  auto pending = std::move(w.pending);
  w.pending.clear();
  w.outstanding = 0;
  w.recent.clear();  // its prefix cache dies with it
  for (auto& [id, p] : pending) {
    route_.erase(id);
    EngineEvent ev;
    ev.error = "worker " + std::to_string(w.index) + " " + why + "; the request was not completed";
    deliver(p.sink, ev, id);
  }
}

// Every 500 ms: a worker silent past --worker-timeout (stopped, swapping, deadlocked: its
// heartbeat thread is quiet too), or one whose current step has run past --worker-step-timeout
// (a CUDA call that never returns; its heartbeats say so), is unresponsive: it gets no new
// requests, the ones it holds fail now, and it is killed (restarted as any dead worker is).
void WorkerPool::check_liveness() {
  if (stopping_) return;
  const auto now = Clock::now();
  for (auto& wp : workers_) {
    Worker& w = *wp;
    const auto ph = w.sup.phase();
    if (!w.sup.process_live() || (ph != Supervisor::Phase::Starting && ph != Supervisor::Phase::Ready)) continue;
    const double silent = std::chrono::duration<double>(now - w.last_heard).count();
    std::string why;
    if (silent > cfg_.worker_timeout_s)
      why = "sent no heartbeat for " + std::to_string(static_cast<int>(silent)) + " s (--worker-timeout " +
            std::to_string(static_cast<int>(cfg_.worker_timeout_s)) + ")";
    else if (const auto limit = step_limit(cfg_.worker_step_timeout_s, w.longest_step_ms); w.step_ms > limit.count())
      why = "has been in one step for " + std::to_string(w.step_ms / 1000) + " s (--worker-step-timeout " +
            (cfg_.worker_step_timeout_s > 0 ? std::to_string(static_cast<int>(cfg_.worker_step_timeout_s))
                                            : "auto: " + std::to_string(limit.count() / 1000) + " s, 20 x its longest step of " +
                                                  std::to_string(w.longest_step_ms) + " ms, at least 30 s") +
            ")";
    if (why.empty()) continue;
    ++w.unresponsive;
    spdlog::error("worker {}: pid {} {}; killing it", w.index, w.pid(), why);
    apply(w, w.sup.unresponsive(now, why));  // its requests fail now; it is killed, then restarted
  }
  liveness_timer_.expires_after(std::chrono::milliseconds(500));
  liveness_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) check_liveness();
  });
}

void WorkerPool::apply_config(const DaemonConfig& live) {
  cfg_.worker_timeout_s = live.worker_timeout_s;
  cfg_.worker_step_timeout_s = live.worker_step_timeout_s;
  cfg_.max_queue = live.max_queue;
}

void WorkerPool::on_exit(Worker& w, uint64_t gen) {
  if (gen != w.gen || !w.proc) return;
  release(w, false);
  const std::string how = w.proc->exit_why;
  if (!stopping_) spdlog::error("worker {}: pid {} {}", w.index, w.pid(), w.fatal.empty() ? how : w.fatal + " (" + how + ")");
  // A process of the weight broadcast gone before it was ready: the broadcast cannot complete,
  // and the others still in it would wait for it forever (a collective waits for every rank;
  // NCCL may never notice a peer that is stopped or on a wedged link). They are stopped now and
  // restart, as this one does, reading the checkpoint themselves: bounded by its death, or by
  // --worker-timeout when it went silent.
  if (w.in_broadcast) leave_broadcast(w);
  // Every worker reported an error and exited before any was ever ready: the configuration
  // cannot start (a model that does not load, a cache that does not fit), and restarting will
  // not change that. Not so a process of the broadcast: its restart reads the checkpoint instead.
  if (!w.ever_ready && !w.fatal.empty() && !w.broadcast_start) w.failed_at_start = true;
  const bool none_started = std::all_of(workers_.begin(), workers_.end(), [](const auto& x) {
    return !x->ever_ready && x->failed_at_start;
  });
  const bool give_up = none_started && on_start_failed_;
  apply(w, w.sup.exited(Clock::now(), how.empty() ? "exited" : how, !give_up));
  if (give_up) {
    on_start_failed_("worker " + std::to_string(w.index) + ": " + w.fatal);
    return;
  }
  if (w.sup.phase() == Supervisor::Phase::Dead)
    spdlog::warn("worker {}: restarting in {} ms", w.index,
                 std::chrono::duration_cast<std::chrono::milliseconds>(*w.sup.deadline() - Clock::now()).count());
}

// The broadcast is over for good: nobody joins it any more (a later first start, after a spawn
// that failed, reads the checkpoint), and every process still in it is stopped through its
// supervisor (a Ready it had sent is then ignored) and restarts reading the checkpoint.
void WorkerPool::leave_broadcast(Worker& gone) {
  gone.in_broadcast = false;
  broadcast_ = false;
  nccl_id_.clear();
  for (auto& x : workers_) {
    if (!x->in_broadcast) continue;
    x->in_broadcast = false;
    const std::string why = "worker " + std::to_string(gone.index) + " left the NCCL weight broadcast";
    spdlog::warn("worker {}: stopped: {}; it restarts reading the checkpoint itself", x->index, why);
    apply(*x, x->sup.abort(Clock::now(), why));
  }
}

// Worker 0 made the broadcast's NCCL group: the others in the broadcast join it (one that
// starts into it later gets the id as it spawns).
void WorkerPool::relay_nccl_id(Worker& from, const std::string& id) {
  if (!from.in_broadcast || from.index != 0 || !broadcast_) return;  // a broadcast already given up
  nccl_id_ = id;
  for (auto& x : workers_)
    if (x->index != 0 && x->in_broadcast && x->out) x->out->push(FrameChannel::frame(encode_nccl_id(id)));
}

bool WorkerPool::submit(const EngineRequest& request, int64_t cost, EventSink sink, std::string* why) {
  const uint64_t id = request.id;
  const std::vector<int32_t>& prompt = request.prompt;
  // The worker with the least outstanding work, unless one that was recently sent a prompt
  // sharing at least half of this one (a conversation's earlier turn, a shared system prompt)
  // has a free slot and at most one request more than that worker: its prefix cache then likely
  // spares most of the prefill, and a flood of prompts sharing one system prompt still spreads
  // over the workers (a prefill saved is worth less than a batch twice as large).
  Worker* best = nullptr;
  Worker* affine = nullptr;
  size_t affine_len = 0;
  for (auto& w : workers_) {
    if (!w->sup.takes_requests() || w->out->queued_bytes() > Outbox::kBusyBytes) continue;
    if (!best || w->outstanding < best->outstanding ||
        (w->outstanding == best->outstanding && w->pending.size() < best->pending.size()))
      best = w.get();
    if (!cfg_.engine.generator.prefix_caching || prompt.empty() || w->pending.size() >= static_cast<size_t>(w->info.max_batch))
      continue;
    for (const auto& rp : w->recent) {
      const std::vector<int32_t>& r = *rp;
      const size_t n = std::min(r.size(), prompt.size() - 1);
      size_t m = 0;
      while (m < n && r[m] == prompt[m]) ++m;
      if (m > affine_len || (m == affine_len && affine && w->pending.size() < affine->pending.size())) {
        affine_len = m;
        affine = w.get();
      }
    }
  }
  if (!best) {
    *why = "no worker is ready";
    return false;
  }
  if (affine && 2 * affine_len >= prompt.size() && affine->pending.size() <= best->pending.size() + 1) best = affine;
  std::string frame;
  try {
    frame = FrameChannel::frame(encode_generate(request));
  } catch (const Error& e) {  // past the channel's 64 MiB (a --max-body-bytes that large)
    *why = e.what();
    return false;
  }
  if (!best->out->push(std::move(frame))) {
    *why = std::string("worker ") + std::to_string(best->index) + " is not taking messages (its queue is full)";
    return false;
  }
  std::shared_ptr<std::vector<int32_t>> mirror;
  if (cfg_.engine.generator.prefix_caching) {
    mirror = std::make_shared<std::vector<int32_t>>(prompt);
    best->recent.push_back(mirror);
    if (best->recent.size() > 2 * static_cast<size_t>(std::max<int64_t>(1, best->info.max_batch))) best->recent.pop_front();
  }
  best->pending[id] = Worker::Pending{std::move(sink), cost, std::move(mirror)};
  best->outstanding += cost;
  route_[id] = best->index;
  return true;
}

void WorkerPool::cancel(uint64_t id) {
  auto it = route_.find(id);
  if (it == route_.end()) return;
  Worker& w = *workers_[it->second];
  if (w.out) w.out->push(FrameChannel::frame(encode_cancel(id)));  // refused only when the worker is gone or stuck: it is then killed
}

std::vector<WorkerStatus> WorkerPool::status() const {
  std::vector<WorkerStatus> out;
  for (const auto& w : workers_) {
    WorkerStatus s;
    s.index = w->index;
    s.state = w->sup.state();
    s.pid = w->pid();
    s.restarts = w->sup.restarts();
    s.unresponsive = w->unresponsive;
    s.in_flight = static_cast<int64_t>(w->pending.size());
    s.last_error = w->last_error;
    s.stats = w->stats;
    s.info = w->info;
    out.push_back(std::move(s));
  }
  return out;
}

bool WorkerPool::all_ready() const {
  return std::all_of(workers_.begin(), workers_.end(), [](const auto& w) { return w->sup.takes_requests(); });
}

int WorkerPool::ready_count() const {
  return static_cast<int>(std::count_if(workers_.begin(), workers_.end(), [](const auto& w) { return w->sup.takes_requests(); }));
}

int64_t WorkerPool::in_flight() const {
  int64_t n = 0;
  for (const auto& w : workers_) n += static_cast<int64_t>(w->pending.size());
  return n;
}

// The shutdown message to every worker, SIGKILL to those still there after the stop grace, and
// after the kill wait the ones that never died are left to be reaped in the background: stop
// returns within stop_grace + kill_wait (SupervisorTiming) whatever the workers do.
void WorkerPool::stop() {
  if (stopping_ && workers_.empty()) return;
  stopping_ = true;
  liveness_timer_.cancel();
  for (auto& w : workers_) {
    w->timer->cancel();
    apply(*w, w->sup.stop(Clock::now()));
  }
  while (true) {
    bool all = true;
    for (auto& w : workers_) {
      if (w->sup.phase() == Supervisor::Phase::Stopped) continue;
      all = false;
      const auto now = Clock::now();
      if (w->proc && w->proc->done) apply(*w, w->sup.exited(now, w->proc->exit_why, false));
      else if (w->sup.deadline() && now >= *w->sup.deadline()) apply(*w, w->sup.tick(now));
    }
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (auto& w : workers_) release(*w, !(w->proc && w->proc->done));
  workers_.clear();
}

}  // namespace kvpr
