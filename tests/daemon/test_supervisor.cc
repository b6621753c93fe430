// daemon/supervisor.h against a model of a worker process driven through random event orders:
// processes that close their channel and hang, ignore SIGKILL (stuck in the kernel), fail to
// spawn, go silent, crash, or exit cleanly; stop at any moment. Whatever happens, supervision
// has no dead end, kills only unreaped processes, fails each incarnation's requests exactly once,
// never runs two processes at once, and stops within its bound.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "daemon/supervisor.h"

namespace kvpr {
namespace {

using Clock = Supervisor::Clock;
using ms = std::chrono::milliseconds;

// One simulated worker process as the pool would see it.
struct Proc {
  bool live = false;          // spawned, not reaped
  bool closed = false;        // its channel ended
  bool killed = false;
  bool unkillable = false;    // SIGKILL does not end it (uninterruptible sleep)
  bool hangs_on_exit = false; // closes its channel, never exits on its own
  Clock::time_point exit_at = Clock::time_point::max();
  int incarnation = 0;
};

struct World {
  SupervisorTiming timing;
  Supervisor sup;
  std::mt19937 rng;
  Clock::time_point now{};
  Proc proc;
  int incarnations = 0;
  std::vector<int> failed;        // fail_pending count per incarnation
  int live_processes = 0;         // ours, not abandoned and not reaped
  int abandoned = 0;
  std::vector<Proc> orphans;      // abandoned processes still to exit
  double p_spawn_fail = 0.3;

  explicit World(uint32_t seed) : timing(make_timing()), sup(timing), rng(seed) {}

  static SupervisorTiming make_timing() {
    SupervisorTiming t;
    t.exit_grace = ms(500);
    t.kill_wait = ms(700);
    t.stop_grace = ms(400);
    t.backoff_first = ms(100);
    t.backoff_max = ms(1600);
    return t;
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

  void apply(const Supervisor::Actions& a) {
    if (a.fail_pending) {
      ASSERT_GT(incarnations, 0);
      ++failed[static_cast<size_t>(proc.incarnation)];
    }
    if (a.kill) {
      ASSERT_TRUE(proc.live) << "SIGKILL to a reaped process (its pid may be another's)";
      ASSERT_FALSE(proc.killed) << "SIGKILL twice";
      proc.killed = true;
      if (!proc.unkillable) proc.exit_at = std::min(proc.exit_at, now + ms(std::uniform_int_distribution<int>(1, 300)(rng)));
    }
    if (a.abandon) {
      ASSERT_TRUE(proc.live);
      orphans.push_back(proc);
      proc.live = false;
      --live_processes;
      ++abandoned;
    }
    if (a.send_shutdown && proc.live && !proc.hangs_on_exit) proc.exit_at = std::min(proc.exit_at, now + ms(50));
    if (a.spawn) {
      ASSERT_FALSE(sup.process_live()) << "a spawn while a process is supervised";
      ASSERT_EQ(live_processes, 0) << "two processes at once";
      if (chance(p_spawn_fail)) {
        apply(sup.spawn_failed(now, "socketpair failed: Too many open files"));
      } else {
        proc = Proc{};
        proc.live = true;
        proc.incarnation = incarnations++;
        failed.push_back(0);
        proc.unkillable = chance(0.1);
        proc.hangs_on_exit = chance(0.3);
        ++live_processes;
        apply(sup.spawned(now));
      }
    }
  }

  // Reaps the process when its exit time came (the reader's waitid saw it).
  void environment() {
    if (proc.live && now >= proc.exit_at) {
      proc.live = false;
      --live_processes;
      if (!proc.closed) apply(sup.channel_closed(now, "", false));
      apply(sup.exited(now, proc.killed ? "killed by signal 9" : "exited with code 0", true));
    }
  }

  // One random thing the world does to the worker.
  void fault() {
    if (!proc.live) return;
    switch (std::uniform_int_distribution<int>(0, 7)(rng)) {
      case 0: apply(sup.ready(now)); break;
      case 1:  // it crashes: the channel ends, the process is gone a moment later
        if (!proc.closed) {
          proc.closed = true;
          apply(sup.channel_closed(now, "", false));
          proc.exit_at = std::min(proc.exit_at, now + ms(5));
        }
        break;
      case 2:  // it closes its channel; it exits, or hangs in exit()
        if (!proc.closed) {
          proc.closed = true;
          apply(sup.channel_closed(now, "", false));
          if (!proc.hangs_on_exit) proc.exit_at = std::min(proc.exit_at, now + ms(20));
        }
        break;
      case 3: apply(sup.unresponsive(now, "sent no heartbeat for 10 s")); break;
      case 5: apply(sup.abort(now, "worker 1 left the NCCL weight broadcast")); break;
      case 4:
        if (!proc.closed) {
          proc.closed = true;
          apply(sup.channel_closed(now, "bad message: not JSON", true));
        }
        break;
      default: break;  // nothing: it keeps working
    }
  }

  void advance(ms step) {
    now += step;
    environment();
    if (sup.deadline() && now >= *sup.deadline()) apply(sup.tick(now));
  }

  // No dead end: either it runs a process or something is due.
  void expect_no_dead_end() {
    const auto ph = sup.phase();
    if (ph == Supervisor::Phase::Stopped || ph == Supervisor::Phase::Failed) return;
    if (ph == Supervisor::Phase::Ready || ph == Supervisor::Phase::Starting) {
      ASSERT_TRUE(sup.process_live());
      return;
    }
    ASSERT_TRUE(sup.deadline().has_value()) << "phase " << sup.state() << " with nothing due";
  }
};

TEST(Supervisor, RandomEventOrdersHaveNoDeadEnds) {
  for (uint32_t seed = 1; seed <= 400; ++seed) {
    SCOPED_TRACE(seed);
    World r(seed);
    r.apply(r.sup.start(r.now));
    const int steps = std::uniform_int_distribution<int>(50, 1500)(r.rng);
    for (int i = 0; i < steps; ++i) {
      if (r.chance(0.05)) r.fault();
      r.advance(ms(10));
      ASSERT_NO_FATAL_FAILURE(r.expect_no_dead_end());
      ASSERT_LE(r.sup.next_backoff(), r.timing.backoff_max);
    }
    // Stop at a random moment: stopped within stop_grace + kill_wait, whatever the process does.
    const auto t_stop = r.now;
    r.apply(r.sup.stop(r.now));
    while (r.sup.phase() != Supervisor::Phase::Stopped) {
      r.advance(ms(10));
      ASSERT_LE(r.now - t_stop, r.timing.stop_grace + r.timing.kill_wait + ms(20)) << "stop did not finish";
    }
    ASSERT_FALSE(r.sup.process_live());
    ASSERT_EQ(r.live_processes, 0);
    // Nothing restarts after stop.
    for (int i = 0; i < 300; ++i) {
      r.advance(ms(10));
      ASSERT_EQ(r.sup.phase(), Supervisor::Phase::Stopped);
    }
    // Every incarnation's requests failed exactly once (its end, whichever way it came).
    for (size_t k = 0; k < r.failed.size(); ++k) ASSERT_EQ(r.failed[k], 1) << "incarnation " << k;
  }
}

TEST(Supervisor, ComesBackOnceTheWorldIsKindAgain) {
  // After any history, spawns that succeed and processes that get ready: ready again within the
  // longest backoff plus the kill bounds.
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    SCOPED_TRACE(seed);
    World r(seed);
    r.apply(r.sup.start(r.now));
    for (int i = 0; i < 400; ++i) {
      if (r.chance(0.08)) r.fault();
      r.advance(ms(10));
    }
    r.p_spawn_fail = 0;
    const auto t0 = r.now;
    while (r.sup.phase() != Supervisor::Phase::Ready) {
      if (r.proc.live) r.apply(r.sup.ready(r.now));
      r.advance(ms(10));
      ASSERT_LE(r.now - t0, r.timing.backoff_max + r.timing.exit_grace + 2 * r.timing.kill_wait + ms(100))
          << "still " << r.sup.state();
    }
    ASSERT_EQ(r.sup.next_backoff(), r.timing.backoff_first) << "a ready worker's backoff starts over";
  }
}

TEST(Supervisor, AChannelClosedWithoutExitIsKilledAfterTheGrace) {
  SupervisorTiming t;
  Supervisor s(t);
  Clock::time_point now{};
  s.start(now);
  s.spawned(now);
  s.ready(now);
  auto a = s.channel_closed(now, "", false);
  EXPECT_FALSE(a.kill);
  EXPECT_EQ(s.state(), std::string("exiting"));
  a = s.tick(now + t.exit_grace - ms(1));
  EXPECT_FALSE(a.kill);
  a = s.tick(now + t.exit_grace);
  EXPECT_TRUE(a.kill);
  EXPECT_TRUE(a.fail_pending);
  EXPECT_NE(s.why().find("did not exit within 5 s"), std::string::npos) << s.why();
  // Still not reaped after SIGKILL: given up on, and a new worker comes after the backoff.
  a = s.tick(now + t.exit_grace + t.kill_wait);
  EXPECT_TRUE(a.abandon);
  EXPECT_FALSE(a.fail_pending);  // failed once already
  EXPECT_EQ(s.state(), std::string("dead"));
  a = s.tick(now + t.exit_grace + t.kill_wait + t.backoff_first);
  EXPECT_TRUE(a.spawn);
  // The old process reaped at last changes nothing.
  s.spawned(now + t.exit_grace + t.kill_wait + t.backoff_first);
  EXPECT_TRUE(s.exited(now + ms(60000), "exited with code 0", true).wake.has_value());
}

TEST(Supervisor, AFailedRestartIsRetriedWithBackoff) {
  SupervisorTiming t;
  Supervisor s(t);
  Clock::time_point now{};
  s.start(now);
  s.spawned(now);
  s.ready(now);
  s.channel_closed(now, "", false);
  auto a = s.exited(now, "killed by signal 9", true);
  ASSERT_TRUE(a.wake.has_value());
  std::vector<ms> delays;
  for (int i = 0; i < 8; ++i) {
    const auto due = *s.deadline();
    delays.push_back(std::chrono::duration_cast<ms>(due - now));
    now = due;
    a = s.tick(now);
    ASSERT_TRUE(a.spawn);
    a = s.spawn_failed(now, "socketpair failed: Too many open files");
    EXPECT_EQ(s.state(), std::string("dead"));
    EXPECT_NE(s.why().find("Too many open files"), std::string::npos);
    ASSERT_TRUE(a.wake.has_value()) << "a failed restart must be retried";
  }
  EXPECT_EQ(delays.front(), t.backoff_first);
  EXPECT_EQ(delays.back(), t.backoff_max);
  now = *s.deadline();
  ASSERT_TRUE(s.tick(now).spawn);
  s.spawned(now);
  s.ready(now);
  EXPECT_EQ(s.state(), std::string("ready"));
  EXPECT_EQ(s.restarts(), 9);
}

}  // namespace
}  // namespace kvpr

namespace kvpr {
namespace {

TEST(Supervisor, TheStepLimitFollowsTheModelsSteps) {
  using std::chrono::milliseconds;
  EXPECT_EQ(step_limit(45, 999999), milliseconds(45000)) << "configured: as given";
  EXPECT_EQ(step_limit(0, 0), milliseconds(600000)) << "before any step finished: a first step's room";
  EXPECT_EQ(step_limit(0, 12), milliseconds(30000)) << "a 12 ms step (an H200's resident decode): 30 s, not 600";
  EXPECT_EQ(step_limit(0, 4000), milliseconds(80000)) << "a CPU worker's 4 s step: 20 x";
}

}  // namespace
}  // namespace kvpr
