#include "daemon/supervisor.h"

#include <algorithm>

namespace kvpr {

namespace {

std::string seconds(std::chrono::milliseconds d) {
  const long long ms = d.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

}  // namespace

std::chrono::milliseconds step_limit(double configured_s, int64_t longest_step_ms) {
  if (configured_s > 0) return std::chrono::milliseconds(static_cast<int64_t>(configured_s * 1000));
  if (longest_step_ms <= 0) return std::chrono::milliseconds(600000);  // nothing measured yet: a first step's room
  return std::chrono::milliseconds(std::max<int64_t>(30000, 20 * longest_step_ms));
}

const char* Supervisor::state() const {
  switch (phase_) {
    case Phase::Starting: return "starting";
    case Phase::Ready: return "ready";
    case Phase::Exiting: return "exiting";
    case Phase::Killed: return unresponsive_ ? "unresponsive" : "exiting";
    case Phase::Dead: return "dead";
    case Phase::Stopping: return "stopping";
    case Phase::Stopped: return "stopped";
    case Phase::Failed: return "failed";
  }
  return "dead";
}

Supervisor::Actions Supervisor::wake_at(Actions a, Clock::time_point t) {
  deadline_ = t;
  a.wake = t;
  return a;
}

Supervisor::Actions Supervisor::leave_ready(Actions a) {
  if (holds_requests_) {
    a.fail_pending = true;
    holds_requests_ = false;
  }
  return a;
}

// Dead: the next spawn after the backoff, which doubles up to its cap for the one after.
Supervisor::Actions Supervisor::schedule_restart(Clock::time_point now, Actions a) {
  phase_ = Phase::Dead;
  killed_ = false;
  const auto delay = backoff_;
  backoff_ = std::min(std::max(backoff_ * 2, t_.backoff_first), t_.backoff_max);
  return wake_at(a, now + delay);
}

Supervisor::Actions Supervisor::start(Clock::time_point) {
  backoff_ = t_.backoff_first;
  Actions a;
  a.spawn = true;
  return a;
}

Supervisor::Actions Supervisor::spawned(Clock::time_point) {
  phase_ = Phase::Starting;
  process_ = true;
  killed_ = false;
  unresponsive_ = false;
  holds_requests_ = true;
  deadline_.reset();
  return {};
}

Supervisor::Actions Supervisor::spawn_failed(Clock::time_point now, const std::string& why) {
  why_ = "restart failed: " + why;
  if (stopping_) {
    phase_ = Phase::Stopped;
    return {};
  }
  return schedule_restart(now, {});
}

Supervisor::Actions Supervisor::ready(Clock::time_point) {
  if (phase_ == Phase::Starting) {
    phase_ = Phase::Ready;
    backoff_ = t_.backoff_first;
  }
  return {};
}

Supervisor::Actions Supervisor::channel_closed(Clock::time_point now, const std::string& why, bool bad) {
  if (!process_ || (phase_ != Phase::Starting && phase_ != Phase::Ready)) return {};
  if (bad) {
    why_ = why;
    return kill_now(now, {});
  }
  phase_ = Phase::Exiting;
  return wake_at({}, now + t_.exit_grace);
}

Supervisor::Actions Supervisor::kill_now(Clock::time_point now, Actions a) {
  a = leave_ready(a);
  if (!killed_ && process_) a.kill = true;
  killed_ = true;
  if (phase_ != Phase::Stopping) phase_ = Phase::Killed;
  return wake_at(a, now + t_.kill_wait);
}

bool Supervisor::killable() const {
  return process_ && !killed_ && (phase_ == Phase::Starting || phase_ == Phase::Ready || phase_ == Phase::Exiting);
}

Supervisor::Actions Supervisor::unresponsive(Clock::time_point now, const std::string& why) {
  if (!killable()) return {};
  unresponsive_ = true;
  return abort(now, "was unresponsive: " + why);
}

Supervisor::Actions Supervisor::abort(Clock::time_point now, const std::string& why) {
  if (!killable()) return {};
  why_ = why;
  return kill_now(now, {});
}

Supervisor::Actions Supervisor::exited(Clock::time_point now, const std::string& why, bool restart) {
  if (!process_) return {};  // an abandoned process reaped at last: its successor is already supervised
  process_ = false;
  why_ = why_.empty() || phase_ == Phase::Starting || phase_ == Phase::Ready || phase_ == Phase::Exiting
             ? why
             : why_ + " (" + why + ")";
  Actions a = leave_ready({});
  if (phase_ == Phase::Stopping) {
    phase_ = Phase::Stopped;
    deadline_.reset();
    return a;
  }
  if (!restart) {
    phase_ = Phase::Failed;
    deadline_.reset();
    return a;
  }
  return schedule_restart(now, a);
}

Supervisor::Actions Supervisor::tick(Clock::time_point now) {
  if (!deadline_) return {};
  if (now < *deadline_) {
    Actions a;
    a.wake = deadline_;
    return a;
  }
  switch (phase_) {
    case Phase::Exiting:
      why_ = "closed its channel but did not exit within " + seconds(t_.exit_grace) + ": killed";
      return kill_now(now, {});
    case Phase::Killed:
    case Phase::Stopping: {
      if (!killed_ && process_) {  // stopping: the shutdown message was not enough
        why_ = "did not stop within " + seconds(t_.stop_grace) + " of the shutdown message: killed";
        return kill_now(now, {});
      }
      // SIGKILL sent and still not reaped (uninterruptible in the kernel: a driver, a dying
      // disk): it is reaped in the background whenever it exits, and supervision goes on.
      Actions a = leave_ready({});
      a.abandon = process_;
      process_ = false;
      why_ += (why_.empty() ? "" : "; ") + std::string("not reaped ") + seconds(t_.kill_wait) +
              " after SIGKILL (left to be reaped when it exits)";
      if (phase_ == Phase::Stopping || stopping_) {
        phase_ = Phase::Stopped;
        deadline_.reset();
        return a;
      }
      return schedule_restart(now, a);
    }
    case Phase::Dead: {
      deadline_.reset();
      ++restarts_;
      Actions a;
      a.spawn = true;
      return a;
    }
    default:
      deadline_.reset();
      return {};
  }
}

Supervisor::Actions Supervisor::stop(Clock::time_point now) {
  stopping_ = true;
  if (!process_) {
    phase_ = Phase::Stopped;
    deadline_.reset();
    return {};
  }
  const bool killed = killed_;
  phase_ = Phase::Stopping;
  if (killed) return wake_at({}, std::min(deadline_.value_or(now + t_.kill_wait), now + t_.kill_wait));
  Actions a;
  a.send_shutdown = true;
  return wake_at(a, now + t_.stop_grace);
}

}  // namespace kvpr
