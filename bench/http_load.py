#!/usr/bin/env python3
"""Load on any OpenAI-compatible server, as vLLM's benchmark_serving measures it (stdlib only).

    python3 bench/http_load.py --base-url http://127.0.0.1:8000 [--model NAME] [--endpoint completions|chat]
        [--num-requests 200] [--concurrency 32 | --request-rate 8 [--concurrency 64]] [--burstiness 1]
        [--input-len 1024 | 512:2048] [--output-len 128 | 64:256] [--seed 0] [--api-key KEY]
        [--slo-ttft-ms 500] [--slo-tpot-ms 50] [--timeout-s 600] [--json OUT] [--label TEXT]

Requests stream (`stream_options.include_usage`) with `ignore_eos`, so each one generates exactly
its output length. Arrivals: all at once under a fixed concurrency, or Poisson at --request-rate
(gamma with --burstiness, as vLLM), capped by --concurrency when both are given. Prompts: on
/v1/completions lists of random token ids of the drawn length (exact lengths, as vLLM's random
dataset); on /v1/chat/completions random words (about that many tokens; the server's usage
counts are what is reported).

Reports request throughput, output and total tokens/s, TTFT, TPOT, ITL and end-to-end latency
(mean, p50, p90, p99, ms), errors by kind, and goodput (requests/s that met every SLO given).
Every response is checked whole: it ended with [DONE], its last choice has a finish_reason, no
error event came, and with finish_reason "length" its usage counts exactly the tokens asked for.
A response that is not whole counts as an error, never as a completed request. Exit status: 0
when every request completed, 1 when some failed, 2 when the server could not be reached."""
import argparse
import http.client
import json
import math
import os
import random
import sys
import threading
import time
import urllib.parse

WORDS = ("the of and to in is was for on that with as by at from his her an were are which this be or have had not "
         "but one their all been has more they also time first new two may after other some only would into years "
         "its over such most later many where part these then under well while city when both used between during "
         "state world made known through work long school since three each early before around until name").split()


def parse_len(s, what):
    """'N' or 'A:B' (uniform in [A, B])."""
    try:
        a, _, b = s.partition(":")
        lo, hi = int(a), int(b or a)
    except ValueError:
        raise SystemExit(f"http_load: error: {what} must be N or A:B, not {s!r}")
    if lo < 1 or hi < lo:
        raise SystemExit(f"http_load: error: {what} must be positive with A <= B, not {s!r}")
    return lo, hi


def percentile(xs, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100.0
    f = math.floor(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def summary(xs):
    xs = [x * 1e3 for x in xs]
    return {"mean": sum(xs) / len(xs) if xs else None, "p50": percentile(xs, 50), "p90": percentile(xs, 90),
            "p99": percentile(xs, 99), "n": len(xs)}


class Client:
    def __init__(self, base_url, api_key, timeout):
        u = urllib.parse.urlparse(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise SystemExit(f"http_load: error: --base-url must be http(s)://host[:port][/prefix], not {base_url!r}")
        self.https = u.scheme == "https"
        self.host, self.port = u.hostname, u.port or (443 if self.https else 80)
        self.prefix = u.path.rstrip("/")
        if self.prefix.endswith("/v1"):
            self.prefix = self.prefix[:-3]
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = "Bearer " + api_key
        self.timeout = timeout

    def conn(self):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def get_json(self, path):
        c = self.conn()
        try:
            c.request("GET", self.prefix + path, headers=self.headers)
            r = c.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError(f"GET {path}: HTTP {r.status}: {body[:200]!r}")
            return json.loads(body)
        finally:
            c.close()


def one_request(client, endpoint, model, prompt, out_len, t_sched):
    """Streams one request; its record (times relative to the run's start are added by the caller)."""
    rec = {"scheduled": t_sched, "output_len": out_len, "ok": False, "error": None, "chunks": []}
    body = {"model": model, "max_tokens": out_len, "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": True, "temperature": 0}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
        path = "/v1/completions"
    c = client.conn()
    t0 = time.perf_counter()
    rec["start"] = t0
    try:
        c.request("POST", client.prefix + path, body=json.dumps(body), headers=client.headers)
        r = c.getresponse()
        if r.status != 200:
            text = r.read()[:300].decode("utf-8", "replace")
            try:
                msg = json.loads(text)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = text
            rec["error"] = f"HTTP {r.status}: {msg}"
            return rec
        done, finish, usage = False, None, None
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            ev = json.loads(data)
            if "error" in ev:
                rec["error"] = "error event: " + str(ev["error"].get("message", ev["error"]))
                return rec
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices") or []:
                piece = ch.get("text") if endpoint != "chat" else (ch.get("delta") or {}).get("content")
                if piece:
                    rec["chunks"].append(time.perf_counter())
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
        rec["end"] = time.perf_counter()
        if not done:
            rec["error"] = "stream ended before [DONE]"
        elif finish is None:
            rec["error"] = "no finish_reason"
        elif usage is None:
            rec["error"] = "no usage chunk (stream_options.include_usage)"
        elif finish == "length" and usage.get("completion_tokens") != out_len:
            rec["error"] = f"finish_reason length with {usage.get('completion_tokens')} of {out_len} tokens"
        elif not rec["chunks"]:
            rec["error"] = "no text"
        else:
            rec["ok"] = True
            rec["finish_reason"] = finish
            rec["prompt_tokens"] = usage.get("prompt_tokens", 0)
            rec["completion_tokens"] = usage.get("completion_tokens", 0)
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        c.close()
        rec.setdefault("end", time.perf_counter())
    return rec


def summarize(a, recs, model, rate, in_len, out_len, duration, complete):
    """The run's figures over `recs` (the requests finished, all of them once `complete`)."""
    ok = [r for r in recs if r["ok"]]
    errors = {}
    for r in recs:
        if not r["ok"]:
            kind = r["error"].split(":")[0]
            errors[kind] = errors.get(kind, 0) + 1
    ttft = [r["chunks"][0] - r["start"] for r in ok]
    e2e = [r["end"] - r["start"] for r in ok]
    tpot = [(r["end"] - r["chunks"][0]) / (r["completion_tokens"] - 1) for r in ok if r["completion_tokens"] > 1]
    itl = [b - a_ for r in ok for a_, b in zip(r["chunks"], r["chunks"][1:])]
    out_tokens = sum(r["completion_tokens"] for r in ok)
    in_tokens = sum(r["prompt_tokens"] for r in ok)

    def meets(r):
        if a.slo_ttft_ms is not None and (r["chunks"][0] - r["start"]) * 1e3 > a.slo_ttft_ms:
            return False
        if a.slo_tpot_ms is not None and r["completion_tokens"] > 1 and \
                (r["end"] - r["chunks"][0]) / (r["completion_tokens"] - 1) * 1e3 > a.slo_tpot_ms:
            return False
        return True

    res = {
        "benchmark": "http_load", "label": a.label, "date": time.strftime("%Y-%m-%d"), "base_url": a.base_url,
        "model": model, "endpoint": a.endpoint, "num_requests": a.num_requests,
        "concurrency": a.concurrency, "request_rate": None if rate == math.inf else rate, "burstiness": a.burstiness,
        "input_len": list(in_len), "output_len": list(out_len), "seed": a.seed,
        "duration_s": duration, "complete": complete, "completed": len(ok), "failed": len(recs) - len(ok), "errors": errors,
        "first_errors": [r["error"] for r in recs if not r["ok"]][:5],
        "request_throughput": len(ok) / duration, "output_tokens": out_tokens, "prompt_tokens": in_tokens,
        "output_tokens_per_s": out_tokens / duration, "total_tokens_per_s": (out_tokens + in_tokens) / duration,
        "ttft_ms": summary(ttft), "tpot_ms": summary(tpot), "itl_ms": summary(itl), "e2e_ms": summary(e2e),
        "slo": {"ttft_ms": a.slo_ttft_ms, "tpot_ms": a.slo_tpot_ms},
        "goodput_requests_per_s": sum(1 for r in ok if meets(r)) / duration,
        "requested_output_tokens": sum(r["output_len"] for r in recs),
    }
    return res


def write_json(path, res):
    """Whole or not at all: a reader never sees half a file."""
    with open(path + ".part", "w") as f:
        json.dump(res, f, indent=1)
    os.replace(path + ".part", path)


def run(a):
    in_lo, in_hi = parse_len(a.input_len, "--input-len")
    out_lo, out_hi = parse_len(a.output_len, "--output-len")
    if a.num_requests < 1:
        raise SystemExit("http_load: error: --num-requests must be positive")
    if a.concurrency is not None and a.concurrency < 1:
        raise SystemExit("http_load: error: --concurrency must be positive")
    if a.request_rate is not None and not a.request_rate > 0:
        raise SystemExit("http_load: error: --request-rate must be positive (or inf)")
    client = Client(a.base_url, a.api_key or os.environ.get("OPENAI_API_KEY"), a.timeout_s)
    try:
        models = client.get_json("/v1/models")
    except (OSError, http.client.HTTPException, RuntimeError, ValueError) as e:
        print(f"http_load: error: cannot reach {a.base_url}: {e}", file=sys.stderr)
        return 2
    model = a.model or models["data"][0]["id"]
    rng = random.Random(a.seed)
    work = []
    for _ in range(a.num_requests):
        n_in, n_out = rng.randint(in_lo, in_hi), rng.randint(out_lo, out_hi)
        if a.endpoint == "chat":
            prompt = " ".join(rng.choice(WORDS) for _ in range(n_in))
        else:
            prompt = [rng.randint(a.token_min, a.token_max) for _ in range(n_in)]
        work.append((prompt, n_in, n_out))
    rate = a.request_rate if a.request_rate is not None else math.inf
    limit = a.concurrency if a.concurrency is not None else a.num_requests
    sem = threading.Semaphore(limit)
    recs = [None] * len(work)
    threads = []

    def go(i, prompt, n_out, t_sched):
        try:
            recs[i] = one_request(client, a.endpoint, model, prompt, n_out, t_sched)
        finally:
            sem.release()

    t_start = time.perf_counter()
    t_next = t_start
    finished = threading.Event()
    if a.json:
        # The summary of the requests finished so far, rewritten every 2 s ("complete": false):
        # a load cut short keeps what it measured.
        def write_partial():
            while not finished.wait(2.0):
                done = [r for r in recs if r is not None]
                if done:
                    write_json(a.json, summarize(a, done, model, rate, (in_lo, in_hi), (out_lo, out_hi),
                                                 time.perf_counter() - t_start, False))
        writer = threading.Thread(target=write_partial, daemon=True)
        writer.start()
    for i, (prompt, n_in, n_out) in enumerate(work):
        if rate != math.inf:
            # Gamma-distributed gaps with mean 1/rate; burstiness 1 is a Poisson process.
            t_next += rng.gammavariate(a.burstiness, 1.0 / (rate * a.burstiness))
            delay = t_next - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        sem.acquire()
        t = threading.Thread(target=go, args=(i, prompt, n_out, t_next), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    finished.set()
    if a.json:
        writer.join()  # its last partial write lands before the whole one
    res = summarize(a, recs, model, rate, (in_lo, in_hi), (out_lo, out_hi), time.perf_counter() - t_start, True)
    errors = res["errors"]
    print(f"{a.label or 'http_load'}: {res['completed']}/{len(recs)} completed in {res['duration_s']:.2f} s: "
          f"{res['request_throughput']:.2f} req/s, {res['output_tokens_per_s']:.1f} output tokens/s; "
          f"TTFT p50 {res['ttft_ms']['p50'] or 0:.1f} p99 {res['ttft_ms']['p99'] or 0:.1f} ms; "
          f"TPOT p50 {res['tpot_ms']['p50'] or 0:.2f} ms; ITL p99 {res['itl_ms']['p99'] or 0:.2f} ms; "
          f"goodput {res['goodput_requests_per_s']:.2f} req/s" + (f"; errors {errors}" if errors else ""))
    if a.json:
        write_json(a.json, res)
    return 0 if not errors else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", help="the served model [the first of /v1/models]")
    ap.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    ap.add_argument("--num-requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, help="requests in flight at most [no limit]")
    ap.add_argument("--request-rate", type=float, help="arrivals per second (Poisson; inf: all at once)")
    ap.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps (1: Poisson)")
    ap.add_argument("--input-len", default="1024")
    ap.add_argument("--output-len", default="128")
    ap.add_argument("--token-min", type=int, default=1000, help="random prompt token ids from here ...")
    ap.add_argument("--token-max", type=int, default=20000, help="... to here (inside the model's vocabulary)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--api-key")
    ap.add_argument("--slo-ttft-ms", type=float)
    ap.add_argument("--slo-tpot-ms", type=float)
    ap.add_argument("--timeout-s", type=float, default=600, help="per request: connect and each read")
    ap.add_argument("--json")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    if a.burstiness <= 0:
        raise SystemExit("http_load: error: --burstiness must be positive")
    sys.exit(run(a))


if __name__ == "__main__":
    main()
