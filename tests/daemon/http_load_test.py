#!/usr/bin/env python3
"""bench/http_load.py against kvprd on the demo model: its figures add up, a request the server
refuses and a stream cut short by a worker's death are errors (never completed requests), and an
unreachable server is one line and exit status 2. Structure and arithmetic only, never timings."""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import daemon_test as base  # noqa: E402  (the Daemon harness)

LOAD = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "http_load.py")


def load(port, *args):
    out = os.path.join(base.TMP, f"load-{time.monotonic_ns()}.json")
    p = subprocess.run([sys.executable, LOAD, "--base-url", f"http://127.0.0.1:{port}", "--json", out, *args],
                       capture_output=True, text=True, timeout=300)
    res = json.load(open(out)) if os.path.exists(out) else None
    return p.returncode, p.stdout + p.stderr, res


def main():
    subprocess.check_call([base.KVPR, "make-demo-model", "--out", base.MODEL], stdout=subprocess.DEVNULL)
    d = base.Daemon()
    try:
        # 1. Fixed concurrency: every request whole, the figures consistent with each other.
        rc, out, r = load(d.port, "--num-requests", "12", "--concurrency", "4", "--input-len", "8:24",
                          "--output-len", "4:12", "--slo-ttft-ms", "1e9", "--slo-tpot-ms", "1e9")
        base.check("fixed concurrency: all completed", rc == 0 and r["completed"] == 12 and r["failed"] == 0, out)
        base.check("output tokens: exactly those asked for", r["output_tokens"] == r["requested_output_tokens"], r)
        base.check("prompt tokens: the token-id prompts' lengths", 12 * 8 <= r["prompt_tokens"] <= 12 * 24, r)
        for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            s = r[k]
            base.check(f"{k}: ordered percentiles", 0 <= s["p50"] <= s["p90"] <= s["p99"] and s["mean"] > 0, s)
        base.check("TTFT and E2E: one per request", r["ttft_ms"]["n"] == 12 and r["e2e_ms"]["n"] == 12, r)
        base.check("ITL: at most one gap per later token", 0 < r["itl_ms"]["n"] <= r["output_tokens"] - 12, r)
        base.check("throughput: completed over the duration",
                   abs(r["request_throughput"] - 12 / r["duration_s"]) < 1e-9 and
                   abs(r["output_tokens_per_s"] - r["output_tokens"] / r["duration_s"]) < 1e-6, r)
        base.check("goodput: every request within a loose SLO", r["goodput_requests_per_s"] == r["request_throughput"], r)
        rc, out, r = load(d.port, "--num-requests", "6", "--concurrency", "3", "--input-len", "8",
                          "--output-len", "6", "--slo-tpot-ms", "1e-6")
        base.check("goodput: none within an impossible SLO", rc == 0 and r["goodput_requests_per_s"] == 0, out)
        # 2. Poisson arrivals under a concurrency cap; the chat endpoint.
        rc, out, r = load(d.port, "--num-requests", "20", "--request-rate", "40", "--concurrency", "5",
                          "--input-len", "16", "--output-len", "8")
        base.check("Poisson arrivals: all completed", rc == 0 and r["completed"] == 20 and r["request_rate"] == 40, out)
        rc, out, r = load(d.port, "--endpoint", "chat", "--num-requests", "4", "--input-len", "8", "--output-len", "5")
        base.check("chat: all completed", rc == 0 and r["completed"] == 4 and r["output_tokens"] == 20, out)
        # 3. Refused requests are errors with the server's status.
        rc, out, r = load(d.port, "--num-requests", "3", "--input-len", "4", "--output-len", "100000")
        base.check("refused: counted as errors", rc == 1 and r["completed"] == 0 and r["errors"] == {"HTTP 400": 3}, out)
        # 4. Streams cut short by a worker's death are errors, not completions.
        pids = [w["pid"] for w in d.get("/health")[1]["workers"]]
        res = {}
        t = threading.Thread(target=lambda: res.update(zip(("rc", "out", "r"), load(
            d.port, "--num-requests", "4", "--concurrency", "4", "--input-len", "8", "--output-len", "1900"))))
        t.start()
        time.sleep(1.5)
        os.kill(pids[0], signal.SIGKILL)
        t.join(300)
        r = res.get("r") or {}
        base.check("worker killed: its streams are errors", res.get("rc") == 1 and r.get("failed", 0) >= 1 and
                   r["completed"] + r["failed"] == 4 and set(r["errors"]) <= {"error event", "stream ended before [DONE]"},
                   res.get("out"))
    finally:
        d.stop()
    # 5. Nothing listening: one line, exit 2.
    p = subprocess.run([sys.executable, LOAD, "--base-url", f"http://127.0.0.1:{base.free_port()}", "--num-requests", "1"],
                       capture_output=True, text=True, timeout=60)
    base.check("unreachable: exit 2 and one line", p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and
               p.stderr.startswith("http_load: error: cannot reach"), p.stderr)
    p = subprocess.run([sys.executable, LOAD, "--input-len", "5:2"], capture_output=True, text=True, timeout=60)
    base.check("bad lengths: exit 1 and one line", p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr)
    print(f"http_load: {base.passed} passed, {base.failed} failed")
    shutil.rmtree(base.TMP, ignore_errors=True)
    sys.exit(1 if base.failed else 0)


if __name__ == "__main__":
    main()
