// The controller's side of the workers: spawning kvpr-worker processes (one per GPU, or N
// CPU workers), the framed channel to each (sends queued, written by a thread per worker, so a
// stuck worker never blocks the io thread), routing requests by least outstanding work,
// supervision (daemon/supervisor.h: a dead, hung or unresponsive worker's requests fail with a
// clear error, it is killed and restarts with backoff, retried until it starts) and the workers'
// stats. All callbacks run on the io_context's thread.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "daemon/config.h"
#include "daemon/supervisor.h"
#include "engine/base/json.h"
#include "worker/frame_channel.h"
#include "worker/protocol.h"

namespace kvpr {

using EventSink = std::function<void(const EngineEvent&)>;

struct WorkerStatus {
  int index = 0;
  std::string state;  // starting, ready, exiting, unresponsive, dead, stopping, stopped, failed (Supervisor)
  pid_t pid = 0;
  int restarts = 0;
  int unresponsive = 0;  // times killed for going silent (or stuck in a step)
  int64_t in_flight = 0;
  std::string last_error;
  WorkerStats stats;  // the worker's last stats message
  ReadyMessage info;  // its ready message
};

class WorkerPool {
 public:
  // One worker per GPU of `engine`'s (those --gpus names) with backend cuda, or auto when it
  // has any; else --workers CPU workers.
  WorkerPool(boost::asio::io_context& io, const DaemonConfig& cfg, std::string worker_binary,
             const EngineDescription& engine);
  ~WorkerPool();

  void start();
  // Stops the workers (shutdown message, then SIGKILL after a grace period) and joins.
  void stop();

  // Sends a request to the worker with the least outstanding work (or one whose prefix cache
  // likely holds its prompt). `cost` is the tokens it may occupy (prompt + max tokens). Returns
  // false (with *why) when no worker is ready.
  bool submit(const EngineRequest& request, int64_t cost, EventSink sink, std::string* why);
  void cancel(uint64_t id);
  // SIGHUP: the live settings (timeouts, queue) for what comes next.
  void apply_config(const DaemonConfig& live);

  std::vector<WorkerStatus> status() const;
  bool all_ready() const;
  int ready_count() const;
  int64_t in_flight() const;
  // The placement plan as a table (logged at start; kvprd --print-topology).
  const std::string& placement() const { return placement_; }
  // Called once every worker has reported ready for the first time (sd_notify READY=1).
  void on_all_ready(std::function<void()> f) { on_all_ready_ = std::move(f); }
  // Called, instead of restarting, once every worker has exited with an error before any was
  // ever ready (the error of the last one); without it workers restart with backoff.
  void on_start_failed(std::function<void(const std::string&)> f) { on_start_failed_ = std::move(f); }

 private:
  void share_host_memory(int count);
  struct Process;
  struct Worker;
  void apply(Worker& w, const Supervisor::Actions& a);
  void release(Worker& w, bool abandon);
  void undo_spawn(Worker& w);
  void spawn(Worker& w);
  void reader_loop(std::shared_ptr<Worker> w, std::shared_ptr<FrameChannel> ch, std::shared_ptr<Process> proc,
                   uint64_t gen);
  void handle(Worker& w, uint64_t gen, WorkerMessage& msg);
  void on_exit(Worker& w, uint64_t gen);
  // `gone` left the weight broadcast before it was ready: the others still in it are stopped.
  void leave_broadcast(Worker& gone);
  void relay_nccl_id(Worker& from, const std::string& id);
  void fail_pending(Worker& w, const std::string& why);
  bool deliver(const EventSink& sink, const EngineEvent& ev, uint64_t id);
  void check_liveness();
  std::vector<std::string> worker_args(const Worker& w, int fd) const;

  boost::asio::io_context& io_;
  DaemonConfig cfg_;
  std::string binary_;
  std::vector<std::shared_ptr<Worker>> workers_;
  std::map<uint64_t, int> route_;  // request id -> worker index
  bool stopping_ = false;
  bool announced_ready_ = false;
  std::function<void()> on_all_ready_;
  std::function<void(const std::string&)> on_start_failed_;
  std::string placement_;
  bool broadcast_ = false;  // several GPUs: the first start of every worker joins the weight broadcast
  std::string nccl_id_;    // its NCCL group, once worker 0 has made it
  boost::asio::steady_timer liveness_timer_;
};

}  // namespace kvpr
