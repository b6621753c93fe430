// One worker's supervision as a state machine with no dead ends. The pool (worker_pool.cc) feeds
// it what happens to the worker process and does what it answers; it holds no process, thread or
// timer itself, so a property test drives it through random event orders (tests/daemon/).
//
//   starting --ready--> ready
//   starting, ready --channel closed--> exiting --(exit_grace)--> killed
//   starting, ready --unresponsive / bad message / abort--> killed (SIGKILL now)
//   killed --(kill_wait)--> dead: the process never died (stuck in the kernel); it is reaped
//                            whenever it exits, in the background, and a new one is started
//   any live state --exited (reaped)--> dead
//   dead --(backoff)--> spawn: started -> starting; failed -> dead, the next try after a longer backoff
//   any --stop--> stopping: shutdown sent --(stop_grace)--> SIGKILL --(kill_wait)--> stopped
//
// Every path out of ready fails the requests the worker holds, once; every process is SIGKILLed
// while it is still unreaped (its pid and process group cannot belong to another process) and
// never after; a restart is retried until it succeeds or the pool stops; stop reaches stopped
// within stop_grace + kill_wait whatever the process does.
#pragma once

#include <chrono>
#include <optional>
#include <string>

namespace kvpr {

struct SupervisorTiming {
  using ms = std::chrono::milliseconds;
  ms exit_grace{5000};      // a worker that closed its channel has this long to exit
  ms kill_wait{5000};       // after SIGKILL, this long to be reaped before it is given up on
  ms stop_grace{5000};      // after the shutdown message, this long to exit on its own
  ms backoff_first{1000};   // the first restart's delay, doubled after each failure
  ms backoff_max{30000};
};

// How long one engine step may run before its worker is taken as hung (a CUDA call that never
// returns, out of memory with the allocator retrying, heartbeats still arriving). `configured_s`
// > 0: that. 0 (auto, the default): 20 times the longest step the worker has finished so far,
// never below 30 s, so a stuck step fails its requests in seconds where steps take milliseconds
// and still leaves a long prefill chunk or a CPU worker's slow step its time; before its first
// step has finished (nothing measured), 600 s.
std::chrono::milliseconds step_limit(double configured_s, int64_t longest_step_ms);

class Supervisor {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Phase { Starting, Ready, Exiting, Killed, Dead, Stopping, Stopped, Failed };

  // What the pool does after an event, in this order.
  struct Actions {
    bool fail_pending = false;  // fail the requests the worker holds, with why()
    bool kill = false;          // SIGKILL its process group (it is unreaped: the pid is still its)
    bool abandon = false;       // stop waiting for this process: reap it in the background
    bool spawn = false;         // start a new process now; then spawned() or spawn_failed()
    bool send_shutdown = false;
    std::optional<Clock::time_point> wake;  // call tick() then (or earlier)
  };

  explicit Supervisor(SupervisorTiming t = {}) : t_(t) {}

  Actions start(Clock::time_point now);  // the first spawn
  Actions spawned(Clock::time_point now);
  Actions spawn_failed(Clock::time_point now, const std::string& why);
  Actions ready(Clock::time_point now);
  // The reader saw the channel end. `bad` (a malformed message): it is killed at once.
  Actions channel_closed(Clock::time_point now, const std::string& why, bool bad);
  // Silent past --worker-timeout, or in one step past its step timeout.
  Actions unresponsive(Clock::time_point now, const std::string& why);
  // The pool stops this worker at once for a reason outside it (a peer of its weight broadcast
  // left): killed as an unresponsive one is, without counting as unresponsive.
  Actions abort(Clock::time_point now, const std::string& why);
  // The process was reaped. `restart` false: the pool gives up on the configuration (every
  // worker failed before any was ready), and this worker stays failed.
  Actions exited(Clock::time_point now, const std::string& why, bool restart);
  Actions tick(Clock::time_point now);
  Actions stop(Clock::time_point now);

  Phase phase() const { return phase_; }
  const char* state() const;             // as /health names it
  const std::string& why() const { return why_; }
  bool process_live() const { return process_; }  // spawned and not yet reaped or abandoned
  bool takes_requests() const { return phase_ == Phase::Ready; }
  std::chrono::milliseconds next_backoff() const { return backoff_; }
  int restarts() const { return restarts_; }
  std::optional<Clock::time_point> deadline() const { return deadline_; }  // the next tick that acts

 private:
  Actions leave_ready(Actions a);  // fail_pending, once an incarnation
  Actions kill_now(Clock::time_point now, Actions a);  // SIGKILL once, then kill_wait to be reaped
  bool killable() const;  // a live process not yet killed, starting, ready or exiting
  Actions wake_at(Actions a, Clock::time_point t);
  Actions schedule_restart(Clock::time_point now, Actions a);

  SupervisorTiming t_;
  Phase phase_ = Phase::Dead;
  bool process_ = false;     // a process of ours exists and is not reaped (kill is safe)
  bool holds_requests_ = false;  // spawned and not failed since
  bool killed_ = false;      // SIGKILL sent to the current process
  bool unresponsive_ = false;  // killed for silence or a stuck step (/health: unresponsive)
  bool stopping_ = false;    // stop() was called: nothing restarts
  std::optional<Clock::time_point> deadline_;  // of the current phase
  std::chrono::milliseconds backoff_{0};
  int restarts_ = 0;
  std::string why_;
};

}  // namespace kvpr
