#!/usr/bin/env python3
"""kvprd under load and faults, as a new user would try it: concurrent streams, a soak with every
process's memory sampled, clients dropping mid-stream, kill -9 of a worker (time until /health is
ok again and what its streams got), SIGSTOP of a worker (time until its requests fail, and
/health's worst latency meanwhile) and a drain under load. Prints and writes one JSON of figures.

    KVPRD=build/daemon/kvprd KVPR_CLI=build/cli/kvpr python3 bench/daemon_load.py \\
        --out bench/results/<date>-daemon-load-<commit>.json --commit <commit> [--soak-s 180]

Runs 2 CPU workers on the demo model (any --model works: pass a checkpoint directory)."""
import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import daemon_test as base  # noqa: E402  (the Daemon harness)


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def stream(d, prompt, max_tokens, stop_after=None):
    """(events, the time it ended); events end with '[DONE]' when the stream ended whole."""
    try:
        ev, conn = d.stream("/v1/completions", {"model": d.model_name, "prompt": prompt, "max_tokens": max_tokens,
                                                "ignore_eos": True, "stream": True}, stop_after=stop_after)
        if stop_after is not None:
            conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()
        return ev, time.time()
    except Exception as e:  # noqa: BLE001
        return [repr(e)], time.time()


def run_threads(fns):
    out = [None] * len(fns)
    ts = [threading.Thread(target=lambda i=i, f=f: out.__setitem__(i, f())) for i, f in enumerate(fns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(600)
    return out


def whole(ev):
    return isinstance(ev, list) and len(ev) >= 2 and ev[-1] == "[DONE]" and isinstance(ev[-2], dict) and \
        ev[-2].get("choices") and ev[-2]["choices"][0].get("finish_reason") == "length"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="model directory [the demo model]")
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--soak-s", type=float, default=180)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    model = a.model
    if not model:
        model = base.MODEL
        subprocess.check_call([base.KVPR, "make-demo-model", "--out", model], stdout=subprocess.DEVNULL)
    res = {"date": time.strftime("%Y-%m-%d"), "commit": a.commit, "host": platform.node(),
           "cpu": next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?"),
           "cores": os.cpu_count(), "model": os.path.basename(model.rstrip("/")), "workers": a.workers}

    def start(*extra):
        port = base.free_port()
        d = base.Daemon(args=["--model", model, "--port", str(port), "--workers", str(a.workers), "--max-batch", "16",
                              "--config", "/dev/null", *extra], port=port)
        d.model_name = os.path.basename(model.rstrip("/"))
        return d

    d = start("--max-queue", "512", "--worker-timeout", "5")
    try:
        pids = lambda: [d.proc.pid] + [w["pid"] for w in d.get("/health")[1]["workers"]]  # noqa: E731
        # 1. 200 concurrent streams.
        t0 = time.time()
        out = run_threads([lambda i=i: stream(d, f"Concurrent {i}", 24) for i in range(200)])
        res["concurrent_streams"] = {"streams": 200, "tokens_each": 24, "whole": sum(whole(e) for e, _ in out),
                                     "wall_s": round(time.time() - t0, 2)}
        print("concurrent:", res["concurrent_streams"], flush=True)
        # 2. Soak: 16 streams at a time for soak_s, memory of every process sampled.
        samples, stop = [], threading.Event()
        done = {"streams": 0, "whole": 0}
        lock = threading.Lock()

        def soaker(i):
            n = 0
            while not stop.is_set():
                ev, _ = stream(d, f"Soak {i} {n}", 64)
                with lock:
                    done["streams"] += 1
                    done["whole"] += whole(ev)
                n += 1
        ts = [threading.Thread(target=soaker, args=(i,)) for i in range(16)]
        for t in ts:
            t.start()
        t0 = time.time()
        while time.time() - t0 < a.soak_s:
            samples.append([round(time.time() - t0, 1)] + [rss_kib(p) for p in pids()])
            time.sleep(max(1.0, a.soak_s / 60))
        stop.set()
        for t in ts:
            t.join(120)
        first, last = samples[len(samples) // 10], samples[-1]  # after the first tenth's warm-up
        res["soak"] = {"seconds": a.soak_s, "concurrent": 16, **done,
                       "rss_kib_after_warmup": first[1:], "rss_kib_end": last[1:],
                       "rss_growth_pct": [round(100 * (b - f) / f, 1) if f and b else None for f, b in zip(first[1:], last[1:])],
                       "processes": "kvprd, then each worker"}
        print("soak:", res["soak"], flush=True)
        # 3. 60 clients dropping mid-stream: every one cancelled, nothing left running.
        before = base.metrics(d).get('kvpr_request_success_total{finish_reason="cancelled"}', 0)
        run_threads([lambda i=i: stream(d, f"Drop {i}", 1500, stop_after=3) for i in range(60)])
        deadline = time.time() + 30
        while time.time() < deadline:
            m = base.metrics(d)
            if m.get('kvpr_request_success_total{finish_reason="cancelled"}', 0) - before >= 60 and m["kvpr_requests_running"] == 0:
                break
            time.sleep(0.1)
        m = base.metrics(d)
        res["dropped_clients"] = {"clients": 60, "cancelled": int(m.get('kvpr_request_success_total{finish_reason="cancelled"}', 0) - before),
                                  "running_after": int(m["kvpr_requests_running"])}
        print("dropped:", res["dropped_clients"], flush=True)
        # 4. kill -9 of a worker under 8 streams: what the streams got, time until /health is ok.
        victim = d.get("/health")[1]["workers"][0]["pid"]
        got = {}

        def kill_later():  # then the time until /health is ok with the worker restarted
            time.sleep(1.0)
            got["t_kill"] = time.time()
            os.kill(victim, signal.SIGKILL)
            while True:
                st, h = d.get("/health")
                if st == 200 and h["status"] == "ok" and all(w["pid"] != victim for w in h["workers"]):
                    got["t_ok"] = time.time()
                    return
                time.sleep(0.05)
        k = threading.Thread(target=kill_later)
        k.start()
        out = run_threads([lambda i=i: stream(d, f"Killed {i}", 600) for i in range(8)])
        k.join()
        errored = [e for e, _ in out if not whole(e)]
        res["kill9_worker"] = {"streams": 8, "whole": 8 - len(errored),
                               "ended_with_error_event_and_done": sum(1 for e in errored if e and e[-1] == "[DONE]" and
                                                                      any(isinstance(x, dict) and "error" in x for x in e)),
                               "lost_without_an_end": sum(1 for e in errored if not e or e[-1] != "[DONE]"),
                               "recovered_s": round(got["t_ok"] - got["t_kill"], 2)}
        print("kill -9:", res["kill9_worker"], flush=True)
        # 5. SIGSTOP of a worker under 8 requests: time until they fail, /health's worst latency.
        victim = d.get("/health")[1]["workers"][1]["pid"]
        worst = [0.0]
        halt = threading.Event()

        def probe():
            while not halt.is_set():
                t1 = time.time()
                d.get("/health")
                worst[0] = max(worst[0], time.time() - t1)
                time.sleep(0.1)
        pr = threading.Thread(target=probe)
        pr.start()

        def stop_later():
            time.sleep(1.0)
            got["t_stop"] = time.time()
            os.kill(victim, signal.SIGSTOP)
        s = threading.Thread(target=stop_later)
        s.start()
        out = run_threads([lambda i=i: stream(d, f"Stopped {i}", 600) for i in range(8)])
        s.join()
        failed_at = max((end for e, end in out if not whole(e)), default=time.time())
        halt.set()
        pr.join()
        errored = [e for e, _ in out if not whole(e)]
        res["sigstop_worker"] = {"streams": 8, "whole": 8 - len(errored), "worker_timeout_s": 5,
                                 "ended_with_error_event_and_done": sum(1 for e in errored if e and e[-1] == "[DONE]"),
                                 "lost_without_an_end": sum(1 for e in errored if not e or e[-1] != "[DONE]"),
                                 "failed_after_s": round(failed_at - got["t_stop"], 2),
                                 "health_worst_latency_s": round(worst[0], 3)}
        print("SIGSTOP:", res["sigstop_worker"], flush=True)
        deadline = time.time() + 60
        while time.time() < deadline and not (d.get("/health")[0] == 200 and d.get("/health")[1]["status"] == "ok"):
            time.sleep(0.2)
    finally:
        try:
            for w in d.get("/health")[1]["workers"]:
                os.kill(w["pid"], signal.SIGCONT)
        except (OSError, KeyError):
            pass
        d.stop()
    # 6. SIGTERM under 104 streams: each ends whole.
    d = start("--max-queue", "512", "--drain-timeout", "60")
    try:
        def term_later():
            time.sleep(1.5)
            d.proc.send_signal(signal.SIGTERM)
        t = threading.Thread(target=term_later)
        t.start()
        out = run_threads([lambda i=i: stream(d, f"Drain {i}", 32) for i in range(104)])
        t.join()
        started = [e for e, _ in out if isinstance(e, list) and e and isinstance(e[0], dict)]
        res["sigterm_drain"] = {"streams": 104, "started": len(started), "whole": sum(whole(e) for e in started),
                                "refused_before_starting": 104 - len(started), "exit_code": d.proc.wait(timeout=120)}
        print("SIGTERM:", res["sigterm_drain"], flush=True)
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
