#!/usr/bin/env python3
"""Structured output's cost through kvprd, as a new user would see it: one CPU worker serving a
tiny Qwen2-shaped model with Qwen2.5's real tokenizer (151,665 tokens, so each constrained step
masks the whole vocabulary, as on a real model), the same concurrent sampled chat requests
unconstrained and then under a six-field JSON schema; output tokens/s of each, their ratio
measured in one run, and every finished constrained answer parsed and checked against the schema.

    KVPRD=build/daemon/kvprd KVPR_CLI=build/cli/kvpr python3 bench/json_serve.py \\
        --out bench/results/<date>-json-serve-<commit>.json --commit <commit> [--requests 48] [--concurrency 16]

The model's layers are tiny, so a step costs little besides the masks: the ratio is the worst
case of what a schema costs the step (a real model's forward pass takes longer and the masks,
computed per row, the same)."""
import argparse
import json
import os
import platform
import shutil
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "daemon"))
import daemon_test as base  # noqa: E402  (the Daemon harness and the tiny Qwen2 writer)

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["name", "age", "email", "tags", "role", "active"],
          "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0},
                         "email": {"anyOf": [{"type": "string", "maxLength": 32}, {"type": "null"}]},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
                         "role": {"enum": ["admin", "user", "guest"]}, "active": {"type": "boolean"}}}


def valid(doc):
    """The schema's rules, checked here by hand (no validator package needed)."""
    if not isinstance(doc, dict) or set(doc) != set(SCHEMA["required"]):
        return False
    return (isinstance(doc["name"], str) and len(doc["name"]) <= 24 and isinstance(doc["age"], int) and
            not isinstance(doc["age"], bool) and doc["age"] >= 0 and
            (doc["email"] is None or (isinstance(doc["email"], str) and len(doc["email"]) <= 32)) and
            isinstance(doc["tags"], list) and len(doc["tags"]) <= 3 and
            all(isinstance(t, str) and len(t) <= 12 for t in doc["tags"]) and
            doc["role"] in ("admin", "user", "guest") and isinstance(doc["active"], bool))


def run(d, n, concurrency, max_tokens, constrained):
    """(seconds, output tokens, answers with their finish reasons)"""
    out, lock, todo = [], threading.Lock(), list(range(n))

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            body = {"model": "qwen", "max_tokens": max_tokens, "temperature": 1.0, "seed": i,
                    "messages": [{"role": "user", "content": f"Describe user number {i} as JSON."}]}
            if constrained:
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA}}
            else:
                body["ignore_eos"] = True  # as many tokens as asked
            st, r = d.post("/v1/chat/completions", body)
            with lock:
                out.append((st, r))

    t0 = time.time()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.time() - t0
    bad = [r for st, r in out if st != 200]
    if bad:
        raise SystemExit(f"{len(bad)} requests failed: {bad[0]}")
    tokens = sum(r["usage"]["completion_tokens"] for _, r in out)
    return seconds, tokens, [(r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"]) for _, r in out]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--commit", default="")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=48)
    a = ap.parse_args()
    model = base.llama_model("qwen", "qwen2-tokenizer", None, model_type="qwen2", vocab=152064, hidden=16, heads=2,
                             kv_heads=1, ffn=24, bos_token_id=151643, eos_token_id=151645,
                             max_position_embeddings=1024)
    port = base.free_port()
    d = base.Daemon(args=["--model", model, "--port", str(port), "--workers", "1", "--backend", "cpu",
                          "--max-batch", str(a.concurrency), "--config", "/dev/null"], port=port)
    try:
        run(d, 4, 4, 8, False)  # warm: the worker's first steps
        run(d, 4, 4, 8, True)   # and the schema compiled once (the worker keeps it, as for any client)
        free_s, free_tokens, _ = run(d, a.requests, a.concurrency, a.max_tokens, False)
        json_s, json_tokens, answers = run(d, a.requests, a.concurrency, a.max_tokens, True)
    finally:
        d.stop()
        shutil.rmtree(base.TMP, ignore_errors=True)  # (the harness's folder: the model, kvprd's log)
    finished = [text for text, reason in answers if reason == "stop"]
    parsed = []
    for text in finished:
        try:
            parsed.append(json.loads(text))
        except ValueError:
            parsed.append(None)
    res = {
        "benchmark": "json-serve", "date": time.strftime("%Y-%m-%d"), "commit": a.commit, "host": platform.node(),
        "cpu": next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                    "?"),
        "cores": os.cpu_count(), "model": "tiny qwen2 (hidden 16, 2 layers), Qwen2.5's tokenizer (151,665 tokens)",
        "workers": 1, "backend": "cpu", "requests": a.requests, "concurrency": a.concurrency,
        "max_tokens": a.max_tokens, "schema": SCHEMA,
        "unconstrained": {"seconds": round(free_s, 3), "output_tokens": free_tokens,
                          "output_tokens_per_s": round(free_tokens / free_s, 1)},
        "constrained": {"seconds": round(json_s, 3), "output_tokens": json_tokens,
                        "output_tokens_per_s": round(json_tokens / json_s, 1), "finished": len(finished),
                        "cut_by_max_tokens": sum(1 for _, r in answers if r == "length"),
                        "finished_valid": sum(1 for p in parsed if p is not None and valid(p))},
    }
    res["constrained_over_unconstrained"] = round(res["constrained"]["output_tokens_per_s"] /
                                                  res["unconstrained"]["output_tokens_per_s"], 3)
    print(json.dumps({k: res[k] for k in ("unconstrained", "constrained", "constrained_over_unconstrained")}, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
    if res["constrained"]["finished_valid"] != len(finished):
        raise SystemExit("a finished constrained answer is not valid under the schema")


if __name__ == "__main__":
    main()
