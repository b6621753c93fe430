#!/usr/bin/env python3
"""bench/flexgen_peer.py against a stand-in for FlexLLMGen's API (the real FlexLLMGen needs CUDA
and never runs in CI): the Policy, OptLM, ExecutionEnv, timers and get_opt_config it calls, with
the same names and arguments as FlexLLMGen 004ffef, recording what the driver asks of them. It
checks the driver's argument handling, what it passes to FlexLLMGen (the policy, dummy weights,
the warm-up and measured generate calls), that the environment is closed once, the metrics it
derives from FlexLLMGen's per-token costs, and its errors: a configuration past the host's memory
(exit 3, before any allocation), a FlexLLMGen failure (exit 1), a run that hangs (exit 124)."""
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "..", "..", "bench", "flexgen_peer.py")

STUB = {
    "__init__.py": "",
    "timer.py": '''
class _Timer:
    def __init__(self):
        self.costs = []
    def reset(self):
        self.costs = []
class _Timers:
    def __init__(self):
        self.t = {}
    def __call__(self, name):
        return self.t.setdefault(name, _Timer())
timers = _Timers()
''',
    "compression.py": '''
import dataclasses
@dataclasses.dataclass
class CompressionConfig:
    num_bits: int
    group_size: int
    group_dim: int
    symmetric: bool
    enabled: bool = True
''',
    "opt_config.py": '''
import os
class OptConfig:
    name = "opt-6.7b"
    vocab_size = 50272
    def model_bytes(self):
        return float(os.environ.get("STUB_MODEL_BYTES", 13 * 2**30))
    def cache_bytes(self, batch, seq_len):
        return 2 * batch * seq_len * 32 * 4096 * 2
def get_opt_config(name):
    assert name.startswith("facebook/opt-"), name
    c = OptConfig()
    c.name = name.split("/")[1]
    return c
''',
    "utils.py": '''
import json, os, threading
def record(**kw):
    with open(os.environ["STUB_LOG"], "a") as f:
        f.write(json.dumps(kw) + "\\n")
class ExecutionEnv:
    @classmethod
    def create(cls, offload_dir):
        e = cls()
        e.closed = threading.Event()
        # As FlexLLMGen's copy threads: not daemons, so an environment left open keeps the process.
        e.thread = threading.Thread(target=e.closed.wait)
        e.thread.start()
        record(call="env", offload_dir=offload_dir)
        return e
    def close_copy_threads(self):
        if self.closed.is_set():
            raise AttributeError("'NoneType' object has no attribute 'put_nowait'")  # as FlexLLMGen's second close
        self.closed.set()
        record(call="close")
''',
    "flex_opt.py": '''
import dataclasses, os, time
from flexllmgen.timer import timers
from flexllmgen.utils import record
DUMMY_WEIGHT = "_DUMMY_"
@dataclasses.dataclass(frozen=True)
class Policy:
    gpu_batch_size: int
    num_gpu_batches: int
    w_gpu_percent: float
    w_cpu_percent: float
    cache_gpu_percent: float
    cache_cpu_percent: float
    act_gpu_percent: float
    act_cpu_percent: float
    overlap: bool
    sep_layer: bool
    pin_weight: bool
    cpu_cache_compute: bool
    attn_sparsity: float
    compress_weight: bool
    comp_weight_config: object
    compress_cache: bool
    comp_cache_config: object
class OptLM:
    def __init__(self, config, env, path, policy):
        self.policy = policy
        record(call="init", model=config.name, path=path,
               policy={k: v for k, v in dataclasses.asdict(policy).items() if not k.startswith("comp_")})
    def generate(self, inputs, max_new_tokens=32, do_sample=False, temperature=1.0, stop=None, debug_mode=None,
                 cut_gen_len=None, verbose=0):
        assert len(inputs) == self.policy.gpu_batch_size * self.policy.num_gpu_batches
        assert len({len(x) for x in inputs}) == 1
        record(call="generate", batch=len(inputs), prompt=len(inputs[0]), tokens=max_new_tokens,
               distinct=len({tuple(x) for x in inputs}), ids_ok=all(3 <= t < 50272 for x in inputs for t in x))
        mode = os.environ.get("STUB_MODE", "")
        if mode == "hang" and max_new_tokens > 1:
            time.sleep(3600)
        if mode == "oom":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\\nmore lines")
        # Per-token costs: the prefill, then decode steps of 10, 20, 30, ... ms.
        for i in range(max_new_tokens):
            timers("generate").costs.append(0.5 if i == 0 else 0.01 * i)
''',
}

checks = []


def check(name, ok, detail=""):
    checks.append(ok)
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else f": {detail}"))


def make_stub(root):
    pkg = os.path.join(root, "flexllmgen")
    os.makedirs(pkg)
    for name, text in STUB.items():
        with open(os.path.join(pkg, name), "w") as f:
            f.write(text)


def drive(stub, tmp, *args, mode="", env_extra=None, timeout=60):
    log = os.path.join(tmp, "calls.jsonl")
    if os.path.exists(log):
        os.remove(log)
    out = os.path.join(tmp, "out.json")
    if os.path.exists(out):
        os.remove(out)
    env = dict(os.environ, STUB_LOG=log, STUB_MODE=mode, **(env_extra or {}))
    t0 = time.time()
    r = subprocess.run([sys.executable, DRIVER, "--flexgen", stub, "--json", out, *args], capture_output=True,
                       text=True, env=env, timeout=timeout)
    calls = [json.loads(l) for l in open(log)] if os.path.exists(log) else []
    result = json.load(open(out)) if os.path.exists(out) else None
    return r, calls, result, time.time() - t0


def main():
    with tempfile.TemporaryDirectory() as tmp:
        stub = os.path.join(tmp, "flexgen")
        make_stub(stub)
        base = ["--model", "opt-13b", "--prompt", "64", "--gen", "5", "--gpu-batch-size", "4",
                "--num-gpu-batches", "3", "--commit", "004ffef", "--offload-dir", os.path.join(tmp, "off")]

        r, calls, res, _ = drive(stub, tmp, *base, "--percent", "0", "100", "0", "100", "0", "100",
                                 "--cpu-cache-compute", "--pin-weight", "0")
        check("a run: exit 0", r.returncode == 0, (r.returncode, r.stderr))
        kinds = [c["call"] for c in calls]
        check("env, init, warm-up generate, measured generate, close: in that order",
              kinds == ["env", "init", "generate", "generate", "close"], kinds)
        init = calls[1] if len(calls) > 1 else {}
        check("dummy weights of the model asked for", init.get("path") == "_DUMMY_" and init.get("model") == "opt-13b",
              init)
        p = init.get("policy", {})
        check("the policy as given", p.get("gpu_batch_size") == 4 and p.get("num_gpu_batches") == 3 and
              p.get("w_gpu_percent") == 0 and p.get("w_cpu_percent") == 100 and p.get("cache_cpu_percent") == 100 and
              p.get("act_cpu_percent") == 100 and p.get("cpu_cache_compute") is True and p.get("pin_weight") is False
              and p.get("overlap") is True and p.get("sep_layer") is True and p.get("attn_sparsity") == 1.0 and
              p.get("compress_weight") is False and p.get("compress_cache") is False, p)
        gens = [c for c in calls if c["call"] == "generate"]
        check("warm-up as run_flexllmgen: 1 token at prompt 32, the whole batch",
              len(gens) == 2 and gens[0]["batch"] == 12 and gens[0]["prompt"] == 32 and gens[0]["tokens"] == 1, gens)
        check("measured run: the batch's distinct synthetic prompts of --prompt ids, --gen tokens",
              len(gens) == 2 and gens[1]["batch"] == 12 and gens[1]["prompt"] == 64 and gens[1]["tokens"] == 5 and
              gens[1]["distinct"] == 12 and gens[1]["ids_ok"], gens)
        # Stub costs: prefill 0.5 s, decode steps 10, 20, 30, 40 ms -> decode 0.1 s for 12 x 4 tokens.
        ok = res is not None and abs(res["decode_s"] - 0.1) < 1e-9 and abs(res["decode_tokens_per_s"] - 480) < 1e-6 \
            and abs(res["decode_ms_per_step"] - 25) < 1e-9 and abs(res["prefill_s"] - 0.5) < 1e-9 \
            and abs(res["prefill_tokens_per_s"] - 12 * 64 / 0.5) < 1e-6 and res["step_ms"] == [10, 20, 30, 40]
        check("FlexLLMGen's formulas from its costs: decode = sum(costs[1:]), batch x (gen-1) / decode", ok, res)
        check("the result names the engine, its commit and the policy",
              res is not None and res["engine"] == "flexllmgen" and res["commit"] == "004ffef" and res["batch"] == 12
              and res["policy"]["cpu_cache_compute"] is True and "error" not in res, res)
        check("one line on stdout", r.stdout.count("\n") == 1 and "decode 480.0 tokens/s" in r.stdout, r.stdout)

        r, calls, res, _ = drive(stub, tmp, *base, mode="oom")
        check("FlexLLMGen failing: exit 1, its error's first line, one line on stderr",
              r.returncode == 1 and res is not None and
              res.get("error") == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB" and
              r.stderr.count("\n") == 1, (r.returncode, r.stderr, res))
        check("the environment closed once after a failure", [c["call"] for c in calls].count("close") == 1, calls)

        r, calls, res, _ = drive(stub, tmp, *base, env_extra={"STUB_MODEL_BYTES": str(2 ** 60)})
        check("past the host's memory: exit 3 before FlexLLMGen allocates",
              r.returncode == 3 and "GiB of host memory" in r.stderr and r.stderr.count("\n") == 1 and
              not any(c["call"] in ("env", "init") for c in calls), (r.returncode, r.stderr, calls))
        check("... and the JSON says so", res is not None and "host memory" in res.get("error", ""), res)

        r, calls, res, took = drive(stub, tmp, *base, "--time-limit", "3", mode="hang", timeout=30)
        check("a run that hangs: exit 124 at the time limit, one line", r.returncode == 124 and took < 20 and
              "timed out after 3 s" in r.stderr and r.stderr.count("\n") == 1, (r.returncode, took, r.stderr))
        check("... with the JSON written", res is not None and res.get("error") == "timed out after 3 s", res)

        for args, what in (
            (["--percent", "60", "50", "0", "100", "0", "100"], "the weights' GPU and CPU shares must be"),
            (["--gen", "1"], "--gen at least 2"),
            (["--prompt", "2000", "--gen", "64"], "past OPT's 2048 positions"),
            (["--model", "opt-66b"], "invalid choice"),
            (["--percent", "0", "100"], "expected 6 arguments"),
        ):
            r, calls, res, _ = drive(stub, tmp, *base, *args)
            check(f"bad arguments {' '.join(args)}: exit 2 naming the problem",
                  r.returncode == 2 and what in r.stderr and not calls, (r.returncode, r.stderr[-300:]))
        r = subprocess.run([sys.executable, DRIVER, "--flexgen", tmp, "--json", os.path.join(tmp, "x.json")],
                           capture_output=True, text=True, timeout=60)
        check("a folder that is not FlexLLMGen: exit 2", r.returncode == 2 and "not a FlexLLMGen checkout" in r.stderr,
              (r.returncode, r.stderr))

    print(f"flexgen peer driver: {sum(checks)} passed, {len(checks) - sum(checks)} failed")
    return 0 if all(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
