#!/usr/bin/env python3
"""The FlexGen peer for kvpr-bench decode --weights host: FlexLLMGen's OptLM (FMInference/FlexLLMGen,
run unmodified from its own snapshot, which is never committed here) on dummy weights, driven
through its Python API instead of its argparse main, so that no tokenizer is downloaded.

    python3 bench/flexgen_peer.py --flexgen .carry/flexllmgen --model opt-13b --prompt 512 --gen 32 \\
        --gpu-batch-size 32 --num-gpu-batches 4 --percent 0 100 0 100 0 100 --json flexgen.json

One configuration per process: each FlexLLMGen environment pins 8 GiB of copy buffers and starts
non-daemon copy threads, and an error inside it can leave those threads waiting forever. The
driver therefore closes the environment exactly once, and a watchdog (--time-limit) ends the
process with exit code 124 and a one-line error when a run does not finish.

What it measures is what FlexLLMGen's own run_flexllmgen measures (flex_opt.py at 004ffef): a
warm-up generate of 1 token at prompt 32, then timers("generate") over one generate of --gen
tokens; costs[0] is the prefill, decode latency = sum(costs[1:]), decode throughput =
batch x (gen - 1) / decode latency. Prompts are synthetic token ids (no padding), the same
lengths kvpr-bench uses; token values do not change the work of a dense model.

Exit codes: 0 measured; 2 bad arguments; 3 the configuration does not fit the host's memory
(refused before FlexLLMGen allocates); 1 FlexLLMGen failed (its error in the JSON); 124 timed out.
"""
import argparse
import dataclasses
import json
import os
import random
import subprocess
import sys
import threading
import time

MODELS = ("opt-6.7b", "opt-13b", "opt-30b", "opt-1.3b", "opt-125m")


class Refused(Exception):
    """The run cannot start: one line for the user, and an exit code."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flexgen", required=True, help="FlexLLMGen checkout (the folder holding flexllmgen/)")
    ap.add_argument("--model", default="opt-6.7b", choices=MODELS)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--gpu-batch-size", type=int, default=32)
    ap.add_argument("--num-gpu-batches", type=int, default=1)
    ap.add_argument("--percent", type=float, nargs=6, default=[0, 100, 0, 100, 0, 100],
                    metavar=("Wg", "Wc", "Cg", "Cc", "Ag", "Ac"),
                    help="weights, KV cache, activations: GPU %% then CPU %% of each (the rest on disk)")
    ap.add_argument("--cpu-cache-compute", action="store_true", help="decode attention on the CPU (FlexLLMGen's --cpu)")
    ap.add_argument("--pin-weight", type=int, choices=(0, 1), default=1)
    ap.add_argument("--overlap", type=int, choices=(0, 1), default=1)
    ap.add_argument("--sep-layer", type=int, choices=(0, 1), default=1)
    ap.add_argument("--offload-dir", default="/tmp/flexllmgen_offload")
    ap.add_argument("--time-limit", type=float, default=600, help="seconds before the watchdog ends the run")
    ap.add_argument("--commit", default="", help="FlexLLMGen's commit (read from --flexgen's git when not given)")
    ap.add_argument("--json", required=True, help="where the result goes")
    a = ap.parse_args(argv)
    if a.prompt < 1 or a.gen < 2:
        ap.error("--prompt must be positive and --gen at least 2 (decode is gen - 1 steps)")
    if a.gpu_batch_size < 1 or a.num_gpu_batches < 1:
        ap.error("--gpu-batch-size and --num-gpu-batches must be positive")
    if a.prompt + a.gen > 2048:
        ap.error(f"--prompt + --gen is {a.prompt + a.gen}, past OPT's 2048 positions")
    for name, (g, c) in (("weights", a.percent[0:2]), ("cache", a.percent[2:4]), ("activations", a.percent[4:6])):
        if g < 0 or c < 0 or g + c > 100:
            ap.error(f"--percent: the {name}' GPU and CPU shares must be >= 0 and add up to at most 100, not {g} + {c}")
    if a.time_limit <= 0:
        ap.error("--time-limit must be positive")
    if not os.path.isfile(os.path.join(a.flexgen, "flexllmgen", "flex_opt.py")):
        ap.error(f"--flexgen {a.flexgen}: not a FlexLLMGen checkout (no flexllmgen/flex_opt.py)")
    return a


def flexgen_commit(a):
    if a.commit:
        return a.commit
    marker = os.path.join(a.flexgen, "COMMIT")  # what bench/prepare-device-carry.sh writes
    if os.path.isfile(marker):
        return open(marker).read().strip()
    try:
        return subprocess.run(["git", "-C", a.flexgen, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def mem_available_bytes():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def host_bytes_needed(config, a):
    """Host memory FlexLLMGen's placement takes: its share of the weights (the tied embedding
    counted twice, as its InputEmbed and OutputEmbed each hold one), its share of the KV cache, and
    the copy threads' pinned relay buffers (4 x 2 GiB)."""
    batch = a.gpu_batch_size * a.num_gpu_batches
    embedding = 2 * config.vocab_size * getattr(config, "input_dim", 0)  # fp16; input_dim: FlexLLMGen's hidden size
    weights = (config.model_bytes() + embedding) * a.percent[1] / 100
    cache = config.cache_bytes(batch, a.prompt + a.gen) * a.percent[3] / 100
    return int(weights + cache + 8 * 2 ** 30)


class Watchdog:
    """Ends the process when the run outlives its limit: FlexLLMGen's copy threads are not
    daemons, so a run stuck inside it would otherwise never exit. `lock` is held by whoever writes
    the result: the watchdog, or the main thread once it has cancelled the watchdog."""

    def __init__(self, seconds, on_expiry):
        self.lock = threading.Lock()
        self._cancelled = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(seconds, on_expiry), daemon=True)
        self._thread.start()

    def _run(self, seconds, on_expiry):
        if self._done.wait(seconds):
            return
        with self.lock:
            if self._cancelled:
                return
            try:
                on_expiry()
            finally:
                os._exit(124)

    def cancel(self):
        """Takes the lock for good: after this the watchdog neither writes nor exits."""
        self.lock.acquire()
        self._cancelled = True
        self._done.set()


def synthetic_prompts(n, length, vocab, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def run(a, result):
    sys.path.insert(0, os.path.abspath(a.flexgen))
    import flexllmgen.flex_opt as flex_opt  # first: it wires its devices up on import
    from flexllmgen.compression import CompressionConfig
    from flexllmgen.opt_config import get_opt_config
    from flexllmgen.timer import timers
    from flexllmgen.utils import ExecutionEnv

    config = get_opt_config("facebook/" + a.model)
    batch = a.gpu_batch_size * a.num_gpu_batches
    need, have = host_bytes_needed(config, a), mem_available_bytes()
    result["host_bytes_needed"] = need
    result["host_bytes_available"] = have
    if have is not None and need > have:
        raise Refused(f"{a.model} with weights {a.percent[1]:g}% and cache {a.percent[3]:g}% on the CPU at batch "
                      f"{batch} needs ~{need / 2**30:.1f} GiB of host memory; {have / 2**30:.1f} GiB are available", 3)
    policy = flex_opt.Policy(
        gpu_batch_size=a.gpu_batch_size, num_gpu_batches=a.num_gpu_batches,
        w_gpu_percent=a.percent[0], w_cpu_percent=a.percent[1],
        cache_gpu_percent=a.percent[2], cache_cpu_percent=a.percent[3],
        act_gpu_percent=a.percent[4], act_cpu_percent=a.percent[5],
        overlap=bool(a.overlap), sep_layer=bool(a.sep_layer), pin_weight=bool(a.pin_weight),
        cpu_cache_compute=a.cpu_cache_compute, attn_sparsity=1.0,
        compress_weight=False, comp_weight_config=CompressionConfig(num_bits=4, group_size=64, group_dim=0, symmetric=False),
        compress_cache=False, comp_cache_config=CompressionConfig(num_bits=4, group_size=64, group_dim=2, symmetric=False))
    result["policy"] = {k: v for k, v in dataclasses.asdict(policy).items() if not k.startswith("comp_")}
    env = ExecutionEnv.create(a.offload_dir)
    try:
        t0 = time.perf_counter()
        model = flex_opt.OptLM(config, env, flex_opt.DUMMY_WEIGHT, policy)
        result["init_s"] = time.perf_counter() - t0
        model.generate(synthetic_prompts(batch, 32, config.vocab_size, seed=1), max_new_tokens=1)  # as run_flexllmgen
        timers("generate").reset()
        model.generate(synthetic_prompts(batch, a.prompt, config.vocab_size), max_new_tokens=a.gen)
        costs = list(timers("generate").costs)
    finally:
        env.close_copy_threads()
    return costs


def metrics(costs, batch, prompt, gen):
    """FlexLLMGen's formulas (run_flexllmgen), from its per-token costs."""
    if len(costs) != gen:
        raise ValueError(f"FlexLLMGen timed {len(costs)} steps for {gen} tokens")
    prefill = costs[0]
    decode = sum(costs[1:])
    return {
        "prefill_s": prefill,
        "prefill_tokens_per_s": batch * prompt / prefill if prefill > 0 else None,
        "decode_s": decode,
        "decode_ms_per_step": decode / (gen - 1) * 1e3,
        "decode_tokens_per_s": batch * (gen - 1) / max(decode, 1e-10),
        "step_ms": [c * 1e3 for c in costs[1:]],
    }


def device_facts():
    try:
        import torch
    except ImportError:
        return {}
    facts = {"torch": torch.__version__}
    if torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name(0)
        facts["gpu_peak_bytes"] = torch.cuda.max_memory_allocated(0)
        facts["cuda"] = torch.version.cuda
    return facts


def write(path, result):
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    batch = a.gpu_batch_size * a.num_gpu_batches
    result = {"engine": "flexllmgen", "commit": flexgen_commit(a), "model": a.model, "batch": batch,
              "gpu_batch_size": a.gpu_batch_size, "num_gpu_batches": a.num_gpu_batches, "prompt": a.prompt,
              "gen": a.gen, "percent": a.percent, "cpu_cache_compute": a.cpu_cache_compute}

    def expired():
        result["error"] = f"timed out after {a.time_limit:g} s"
        try:
            write(a.json, dict(result))
        except Exception:
            pass  # the exit code and the line below still say it
        print(f"flexgen_peer: error: {a.model} batch {batch}: timed out after {a.time_limit:g} s", file=sys.stderr)
        sys.stderr.flush()

    dog = Watchdog(a.time_limit, expired)
    code = 0
    try:
        costs = run(a, result)
        result.update(metrics(costs, batch, a.prompt, a.gen))
        print(f"flexgen_peer: {a.model} batch {batch} ({a.gpu_batch_size}x{a.num_gpu_batches}), percent "
              f"{' '.join(f'{p:g}' for p in a.percent)}{', cpu attention' if a.cpu_cache_compute else ''}: "
              f"decode {result['decode_tokens_per_s']:.1f} tokens/s ({result['decode_ms_per_step']:.1f} ms/step)")
    except Refused as e:
        result["error"] = str(e)
        print(f"flexgen_peer: error: {e}", file=sys.stderr)
        code = e.code
    except Exception as e:  # FlexLLMGen's own failure (out of memory, a CUDA error): reported, not a crash
        result["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
        print(f"flexgen_peer: error: {result['error']}", file=sys.stderr)
        code = 1
    dog.cancel()
    result.update(device_facts())
    write(a.json, result)
    return code


if __name__ == "__main__":
    sys.exit(main())
