#!/usr/bin/env python3
"""kvprd's GPU path end to end without a GPU: the emulated build (-DKVPR_EMULATED_CUDA=ON) of
kvprd and kvpr-worker on two emulated GPUs (KVPR_EMULATED_GPUS=2, each with 256 MiB, its own
8 GB/s link and the bus id of tests/data/hwloc/two-socket-two-gpu.xml, which hwloc reads as the
machine: HWLOC_XMLFILE). kvprd started with no --backend finds the two GPUs and runs one GPU worker
per device through the code a real multi-GPU host runs: device selection, placement on each GPU's
NUMA node, the weights read once and broadcast over NCCL (the emulated build's stand-in,
engine/backend/emulated/nccl_emu.h), pinned host KV, kv mode auto by default, paged KV.

- greedy texts equal the CPU backend's on the same prompts in every KV mode (auto by default,
  auto with a device tier small enough to spill, kvpr, offload, resident, resident with decode
  steps as CUDA graphs), both workers serving;
- /health and /metrics show each worker's device, NUMA node, KV mode and tier bytes;
- the broadcast: both GPUs' weights bit-equal to a direct load (--verify-weights digests), the
  receiving worker reading none of the checkpoint's tensors; a worker killed (or stopped)
  mid-broadcast ends the other's within --worker-timeout, both restart from the checkpoint and
  kvprd serves again;
- chat, streaming, structured output, tool calls (daemon_test.py's own checks, on these GPUs),
  a client that leaves mid-stream, and one that closes its connection before a non-streamed
  answer (both cancelled);
- kill -9 of one worker under load: its streams end with an error event, the other worker's end
  whole, the pool restarts it and kvprd serves again;
- SIGTERM drains: the request in flight finishes, kvprd exits 0;
- the placement of 8 GPU workers on the 8-GPU two-socket fixture (kvprd --print-topology).
Run by ctest (daemon_emulated_gpus) in the emulated build only (CI's second build, under ASan)."""
import json
import os
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import daemon_test as base  # noqa: E402  (the Daemon harness, check(), the demo model, the tools checks)
from daemon_test import Daemon, check  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
GPUS = {
    "KVPR_EMULATED_GPUS": "2",
    "KVPR_EMULATED_GPU_MEMORY": "256MiB",
    "KVPR_EMULATED_LINK_GBPS": "8",
    "KVPR_EMULATED_PCI_BUS_IDS": "0000:17:00.0,0000:65:00.0",
    "HWLOC_XMLFILE": os.path.join(HERE, "..", "data", "hwloc", "two-socket-two-gpu.xml"),
    # hwloc reads HWLOC_XMLFILE only with its xml component among HWLOC_COMPONENTS, when that is set
    # (CI sets it to leave PCI discovery out).
    "HWLOC_COMPONENTS": "xml",
}
PROMPTS = ["Hello, my name is", "The KV cache lives in pinned host memory and the GPU recomputes",
           "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z", "Once upon a time"]
NEW = 24
DIRECT = None  # the weights' digest after a direct load (direct_load_digest), set by main


def gpu_daemon(*extra, env=None, wait_ready=True):
    """kvprd on the two emulated GPUs (no --backend: it finds them), with `extra` flags."""
    port = base.free_port()
    return Daemon(args=["--model", base.MODEL, "--port", str(port), "--config", "/dev/null", "--max-batch", "8", *extra],
                  port=port, env=env, wait_ready=wait_ready)


def direct_load_digest():
    """The digest of the demo model's weights loaded straight from the checkpoint onto an emulated
    GPU by `kvpr generate` (no broadcast), read back from the device."""
    import subprocess
    out = subprocess.check_output([base.KVPR, "generate", "--model", base.MODEL, "--prompt", "x", "-n", "1", "--backend",
                                   "cuda", "--verify-weights", "--json"], env={**os.environ, **GPUS})
    return json.loads(out.decode().splitlines()[-1])["weights_digest"]


def checkpoint_sizes():
    """The demo checkpoint's bytes up to its first tensor (the safetensors length and header), and
    its tensors' bytes."""
    path = os.path.join(base.MODEL, "model.safetensors")
    with open(path, "rb") as f:
        header_end = 8 + int.from_bytes(f.read(8), "little")
    return header_end, os.path.getsize(path) - header_end


def answers(d, concurrent=True):
    """The greedy answers to PROMPTS as token strings with, per token, the gap between the chosen
    token's log-probability and the next best one's; asked at once (so both workers serve)."""
    out = [None] * len(PROMPTS)

    def one(i):
        st, body = base.completion(d, PROMPTS[i], NEW, ignore_eos=True, logprobs=2)
        if st != 200:
            out[i] = (st, body)
            return
        lp = body["choices"][0]["logprobs"]
        gaps = [sorted(top.values())[-1] - sorted(top.values())[-2] if len(top) > 1 else 1e9 for top in lp["top_logprobs"]]
        out[i] = (lp["tokens"], gaps)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
        if not concurrent:
            t.join()
    for t in threads:
        t.join()
    return out


# A random model's logits have near ties (the demo model's text is gibberish by design): where the
# CPU's best two tokens are within this many nats, the GPU's different summation order may pick
# the other, and the texts part there. Each answer is compared up to its first such tie.
TIE = 0.02


def same_greedy(got, reference):
    """Whether each answer's tokens are the reference's up to the reference's first near tie (and
    that comparison covers at least a third of the tokens)."""
    ok, compared = True, 0
    for g, (tokens, gaps) in zip(got, reference):
        if not isinstance(g, tuple) or not isinstance(g[0], list):
            return False, g
        cut = next((k for k, gap in enumerate(gaps) if gap < TIE), len(tokens))
        ok = ok and g[0][:cut] == tokens[:cut]
        compared += cut
    return ok and compared >= len(PROMPTS) * NEW // 3, compared


def served_by_both(d):
    st, h = d.get("/health")
    return st == 200 and all(w.get("kv_cache", {}).get("blocks_used", 0) + w.get("kv_cache", {}).get("blocks_cached", 0) > 0
                             for w in h["workers"])


def every_kv_mode(reference):
    for name, flags in (("auto (the default)", []), ("auto spilling past a 2-block device tier",
                                                     ["--kv-mode", "auto", "--gpu-kv-budget", "64KiB"]),
                        ("kvpr", ["--kv-mode", "kvpr"]), ("offload", ["--kv-mode", "offload"]),
                        ("resident", ["--kv-mode", "resident"]),
                        ("resident, decode steps as CUDA graphs", ["--kv-mode", "resident", "--cuda-graphs", "on"])):
        d = gpu_daemon(*flags)
        try:
            got = answers(d)
            if "--cuda-graphs" in flags:
                check("CUDA graphs replayed on the emulated GPUs",
                      sum(v for k, v in base.metrics(d).items() if k.startswith("kvpr_worker_graph_replays")) > 0)
            ok, compared = same_greedy(got, reference)
            check(f"2 emulated GPUs, {name}: the CPU backend's greedy tokens", ok, (compared, got, reference))
            check(f"2 emulated GPUs, {name}: both workers served", served_by_both(d), d.get("/health"))
        finally:
            d.stop()


def health_and_metrics(d):
    deadline = time.time() + 10
    while time.time() < deadline:  # each worker's first stats message
        st, h = d.get("/health")
        if st == 200 and all("kv_cache" in w for w in h["workers"]):
            break
        time.sleep(0.2)
    ws = h.get("workers", []) if st == 200 else []
    check("/health: two GPU workers, one per device, kv mode auto",
          [w.get("device") for w in ws] == ["cuda:0 (kvpr emulated device)", "cuda:1 (kvpr emulated device)"] and
          all(w.get("kv_mode") == "auto" for w in ws), h)
    check("/health: each worker on its GPU's NUMA node (the topology's), on that node's cpus",
          [w["placement"].get("numa_node") for w in ws] == [0, 1] and
          [w["placement"].get("cpus") for w in ws] == [[0, 1], [2, 3]], h)
    check("the weights once from disk: worker 0 read them and broadcast them over NCCL (the emulated build's "
          "stand-in), worker 1 received them",
          [w["placement"].get("weights_from") for w in ws] == ["disk, broadcast with NCCL", "NCCL broadcast"], h)
    # What each read of the checkpoint, counted by the kernel (the Rss of its mapping): worker 0
    # every tensor; worker 1 the header only, with what the kernel maps around a fault of pages
    # already cached (64 KiB, or one 2 MiB folio on file systems with large folios).
    header_end, tensor_bytes = checkpoint_sizes()
    read = [w["placement"].get("checkpoint_bytes_read", -1) for w in ws]
    check("worker 0 read every tensor of the checkpoint; worker 1, which received them, read none (its header only)",
          read[0] >= tensor_bytes and 0 < read[1] <= header_end + (2 << 20) and read[1] < tensor_bytes // 4,
          (read, header_end, tensor_bytes))
    check("--verify-weights: both GPUs' weights bit-equal to a direct load of the checkpoint (digests read back from "
          "the devices)", [w["placement"].get("weights_digest") for w in ws] == [DIRECT] * 2, (DIRECT, h))
    check("/health: each worker's KV tiers (host store and device tier bytes)",
          all(w["kv_cache"]["tier"] == "host+device" and w["kv_cache"]["tiers"]["device_bytes"] > 0 and
              w["kv_cache"]["tiers"]["host_bytes"] > 0 for w in ws), h)
    m = base.metrics(d)
    for i in range(2):
        check(f"/metrics: worker {i}'s device, kv mode and NUMA node",
              m.get(f'kvpr_worker_info{{worker="{i}",device="cuda:{i} (kvpr emulated device)",kv_mode="auto",'
                    f'numa_node="{i}"}}') == 1.0, sorted(k for k in m if k.startswith("kvpr_worker_info")))
        check(f"/metrics: worker {i}'s device tier bytes", m.get(f'kvpr_worker_device_kv_bytes{{worker="{i}"}}', 0) > 0, m)


def in_flight_becomes(d, want, timeout=30):
    """Waits until the workers' requests in flight (summed) satisfy `want`: (whether they did, the
    last /health)."""
    deadline, h = time.time() + timeout, None
    while time.time() < deadline:
        st, h = d.get("/health")
        if st == 200 and want(sum(w["in_flight"] for w in h["workers"])):
            return True, h
        time.sleep(0.05)
    return False, h


def api(d, reference):
    st, body = d.post("/v1/chat/completions", {"model": "demo", "messages": [{"role": "user", "content": "Hi"}],
                                               "max_tokens": 6, "temperature": 0})
    check("chat on the GPUs", st == 200 and body["choices"][0]["message"]["role"] == "assistant" and
          body["usage"]["completion_tokens"] == 6, body)
    events, _ = d.stream("/v1/completions", {"model": "demo", "prompt": PROMPTS[0], "max_tokens": NEW, "temperature": 0,
                                             "ignore_eos": True, "stream": True})
    streamed = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
    st, whole = base.completion(d, PROMPTS[0], NEW, ignore_eos=True)
    check("streaming on the GPUs: the chunks add up to the whole answer",
          st == 200 and streamed == whole["choices"][0]["text"] and events[-1] == "[DONE]", (streamed, whole))
    st, body = d.post("/v1/completions", {"model": "demo", "prompt": "x", "max_tokens": 24, "temperature": 0,
                                          "response_format": {"type": "json_object"}})
    text = body["choices"][0]["text"] if st == 200 else ""
    ok = st == 200
    if ok and body["choices"][0]["finish_reason"] == "stop":
        try:
            ok = isinstance(json.loads(text), dict)
        except ValueError:
            ok = False
    check("structured output on the GPUs: a JSON object (or its prefix when cut at max_tokens)",
          ok and text.lstrip().startswith("{"), body)
    # A stream whose client reads two events and leaves: its generation is cancelled.
    _, conn = d.stream("/v1/completions", {"model": "demo", "prompt": PROMPTS[1], "max_tokens": 1500, "temperature": 0,
                                           "ignore_eos": True, "stream": True}, stop_after=2)
    conn.close()
    idle, h = in_flight_becomes(d, lambda n: n == 0)
    check("a client that leaves mid-stream: its generation is cancelled", idle, h)
    # A non-streamed request whose client closes its connection while the answer is generated: kvprd
    # notices the closed socket and cancels it (no 1500 tokens computed for nobody).
    s = socket.create_connection(("127.0.0.1", d.port))
    body = json.dumps({"model": "demo", "prompt": PROMPTS[2], "max_tokens": 1500, "temperature": 0, "ignore_eos": True})
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    busy, _ = in_flight_becomes(d, lambda n: n > 0)
    log_path = os.path.join(base.TMP, f"kvprd-{d.port}.log")
    cancels = open(log_path).read().count("client disconnected, generation cancelled")
    s.close()
    idle, h = in_flight_becomes(d, lambda n: n == 0)
    check("a client that closes its connection before a non-streamed answer: the generation is cancelled",
          busy and idle and open(log_path).read().count("client disconnected, generation cancelled") > cancels,
          (busy, h))


def kill_one_worker_under_load(d):
    """kill -9 of worker 0 while both serve streams: its streams end with an error event (or, not
    yet begun, a stream's 200 waiting for its first event, are a 500 naming the worker's end),
    worker 1's end whole, worker 0 comes back and kvprd serves again."""
    results = []
    lock = threading.Lock()

    def one(i):
        try:
            events, _ = d.stream("/v1/completions", {"model": "demo", "prompt": PROMPTS[i % len(PROMPTS)] + f" {i}",
                                                     "max_tokens": 60, "temperature": 0, "ignore_eos": True,
                                                     "stream": True})
        except (OSError, AssertionError) as e:
            events = [str(e)]
        with lock:
            results.append(events)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    deadline = time.time() + 60
    while time.time() < deadline:  # both workers busy
        st, h = d.get("/health")
        if st == 200 and all(w["in_flight"] > 0 for w in h["workers"]):
            break
        time.sleep(0.1)
    victim = h["workers"][0]["pid"]
    os.kill(victim, signal.SIGKILL)
    for t in threads:
        t.join(timeout=180)
    whole = [r for r in results if r and r[-1] == "[DONE]" and any(isinstance(e, dict) and e.get("choices") and
                                                                    e["choices"][0].get("finish_reason") == "length"
                                                                    for e in r)]
    failed = [r for r in results if r and r[-1] == "[DONE]" and any(isinstance(e, dict) and "error" in e for e in r)]
    failed += [r for r in results if len(r) == 1 and isinstance(r[0], str) and r[0].startswith("(500,")
               and "worker 0 stopped while generating" in r[0]]
    check("kill -9 of one GPU worker: its streams end with an error event (a 500 before they began), "
          "the other's end whole",
          len(results) == 6 and whole and failed and len(whole) + len(failed) == 6,
          [(r[-2] if len(r) > 1 else r) for r in results])
    deadline, back = time.time() + 60, False
    while time.time() < deadline and not back:
        st, h = d.get("/health")
        back = st == 200 and h["status"] == "ok" and h["workers"][0]["restarts"] >= 1 and h["workers"][0]["pid"] != victim
        time.sleep(0.3)
    check("the killed GPU worker is restarted on its device, reading its weights itself (no new broadcast), "
          "the same bits", back and h["workers"][0].get("device") == "cuda:0 (kvpr emulated device)" and
          h["workers"][0]["placement"].get("weights_from") == "disk" and
          h["workers"][0]["placement"].get("weights_digest") == DIRECT, h)
    st, body = base.completion(d, PROMPTS[0], 4)
    check("kvprd serves again after the restart", st == 200 and body["usage"]["completion_tokens"] == 4, body)


def pid_gone(pid):
    try:
        os.kill(pid, 0)
        return False
    except ProcessLookupError:
        return True


def broadcast_failures():
    """A worker gone mid-broadcast: kill -9 of a receiver, and SIGSTOP of the sender (alive, so
    nothing but kvprd's --worker-timeout ends the wait). The other worker's broadcast ends within
    --worker-timeout, both restart reading the checkpoint themselves, and kvprd serves."""
    # The demo's 15 MB over 10 MB/s links: 1.5 s to worker 0's GPU, then 3 s through the
    # broadcast, which worker 1 logs every tenth of.
    slow = {"KVPR_EMULATED_LINK_GBPS": "0.01"}
    for name, victim, sig in (("kill -9 of the receiving worker", 1, signal.SIGKILL),
                              ("SIGSTOP of the sending worker", 0, signal.SIGSTOP)):
        d = gpu_daemon("--kv-mode", "resident", "--worker-timeout", "5", "--verify-weights", "on", env=slow,
                       wait_ready=False)
        pids = []
        try:
            log_path = os.path.join(base.TMP, f"kvprd-{d.port}.log")
            deadline = time.time() + 120
            while time.time() < deadline and not any(ln.startswith("kvpr-worker 1: loading") and ": 20% of" in ln
                                                     for ln in open(log_path).read().splitlines()):
                time.sleep(0.02)
            st, h = d.get("/health")
            pids = [w["pid"] for w in h["workers"]]
            os.kill(pids[victim], sig)
            t0 = time.time()
            mid = "kvpr-worker 1: model loaded" not in open(log_path).read()
            other = pids[1 - victim]
            while time.time() < t0 + 60 and not pid_gone(other):
                time.sleep(0.05)
            took = time.time() - t0
            # (--worker-timeout, plus up to a heartbeat's second and a liveness check's half, plus
            # two processes' teardown on a loaded machine)
            check(f"{name} mid-broadcast: the other worker's broadcast ends within --worker-timeout (5 s), no hang",
                  mid and pid_gone(other) and took <= 5 + 7, (mid, took, open(log_path).read()[-1500:]))
            deadline, back = time.time() + 120, False
            while time.time() < deadline and not back:
                st, h = d.get("/health")
                back = st == 200 and h["status"] == "ok" and all(w["pid"] not in pids for w in h["workers"])
                time.sleep(0.2)
            check(f"{name} mid-broadcast: both workers restart reading the checkpoint themselves, the same bits",
                  back and [w["placement"].get("weights_from") for w in h["workers"]] == ["disk", "disk"] and
                  [w["placement"].get("weights_digest") for w in h["workers"]] == [DIRECT] * 2, h)
            st, body = base.completion(d, PROMPTS[0], 4)
            check(f"{name} mid-broadcast: kvprd serves again", st == 200 and body["usage"]["completion_tokens"] == 4, body)
        finally:
            if sig == signal.SIGSTOP and pids and not pid_gone(pids[victim]):
                os.kill(pids[victim], signal.SIGCONT)
            d.stop()


def worker0_gone_before_the_group():
    """Worker 0 makes the broadcast's NCCL group and kvprd relays its id: a worker 0 that exits
    before it does leaves worker 1 waiting for the id; kvprd stops it at once, and both restart
    reading the checkpoint themselves."""
    real = os.path.join(os.path.dirname(os.path.abspath(base.KVPRD)), "..", "worker", "kvpr-worker")
    wrapper = os.path.join(base.TMP, "no-group-worker.sh")
    marker = os.path.join(base.TMP, "no-group-worker.once")
    with open(wrapper, "w") as f:
        f.write(f"""#!/bin/bash
# The first start of rank 0 of the weight broadcast exits before it makes the NCCL group.
if [[ " $* " == *" --nccl-rank 0 "* ]] && [ ! -e {marker} ]; then touch {marker}; exit 3; fi
exec {os.path.abspath(real)} "$@"
""")
    os.chmod(wrapper, 0o755)
    d = gpu_daemon("--kv-mode", "resident", "--worker-binary", wrapper, wait_ready=False)
    try:
        log_path = os.path.join(base.TMP, f"kvprd-{d.port}.log")
        deadline, back = time.time() + 120, False
        while time.time() < deadline and not back:
            st, h = d.get("/health")
            back = st == 200 and h["status"] == "ok"
            time.sleep(0.2)
        log = open(log_path).read()
        check("worker 0 gone before it made the NCCL group: worker 1, waiting for the id, is stopped and both "
              "restart reading the checkpoint", back and os.path.exists(marker) and
              h["workers"][1]["restarts"] >= 1 and
              "worker 0 left the NCCL weight broadcast" in h["workers"][1]["last_error"] and
              [w["placement"].get("weights_from") for w in h["workers"]] == ["disk", "disk"], (h, log[-1500:]))
    finally:
        d.stop()


def drain():
    d = gpu_daemon("--drain-timeout", "300")  # (a loaded CI machine under ASan is slow)
    result = {}

    def long_one():
        result["r"] = base.completion(d, PROMPTS[2], 48, ignore_eos=True)
    t = threading.Thread(target=long_one)
    t.start()
    in_flight_becomes(d, lambda n: n > 0)
    rc = d.stop(signal.SIGTERM, timeout=330)
    t.join(timeout=120)
    st, body = result.get("r", (None, None))
    check("SIGTERM on GPU workers drains: the request in flight finishes whole, kvprd exits 0",
          rc == 0 and st == 200 and body["usage"]["completion_tokens"] == 48, (rc, st, body))


def eight_gpu_placement():
    """kvprd's plan on the 8-GPU two-socket fixture with 8 emulated GPUs: one worker per GPU, the
    first four on node 0 and the rest on node 1, two cores each; --gpus picks a subset."""
    import subprocess
    xml = os.path.join(HERE, "..", "data", "hwloc", "eight-gpu-two-socket.xml")
    buses = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
    env = {**os.environ, "KVPR_EMULATED_GPUS": "8", "KVPR_EMULATED_PCI_BUS_IDS": ",".join(f"0000:{b}:00.0" for b in buses),
           "HWLOC_XMLFILE": xml, "HWLOC_COMPONENTS": "xml"}
    for gpus, want in (("all", [(i, f"0000:{b}:00.0", i // 4, f"{2 * i}-{2 * i + 1}") for i, b in enumerate(buses)]),
                       ("1,6", [(1, "0000:2a:00.0", 0, "0-7"), (6, "0000:ba:00.0", 1, "8-15")])):
        r = subprocess.run([base.KVPRD, "--model", base.MODEL, "--config", "/dev/null", "--gpus", gpus, "--print-topology"],
                           capture_output=True, text=True, env=env)
        rows = [ln.split() for ln in r.stdout.splitlines() if ln[:1].isdigit()]
        got = [(int(w[1]), w[2], int(w[3]), w[4]) for w in rows]
        check(f"8 emulated GPUs on the 8-GPU fixture, --gpus {gpus}: a worker per GPU on its node",
              r.returncode == 0 and "8 NVIDIA GPU(s)" in r.stdout and got == want, (got, r.stdout, r.stderr[-300:]))


def main():
    import subprocess
    subprocess.check_call([base.KVPR, "make-demo-model", "--out", base.MODEL], stdout=subprocess.DEVNULL)
    # The CPU backend's answers, one request at a time on one worker: the reference.
    port = base.free_port()
    d = Daemon(args=["--model", base.MODEL, "--port", str(port), "--config", "/dev/null", "--backend", "cpu",
                     "--workers", "1"], port=port)
    try:
        reference = answers(d, concurrent=False)
    finally:
        d.stop()
    check("the CPU reference answered", all(isinstance(r, tuple) and isinstance(r[0], list) for r in reference), reference)
    # A bad emulated device setting is one line and exit 1, as a bad option is.
    for var, value in (("KVPR_EMULATED_GPUS", "x"), ("KVPR_EMULATED_GPUS", "17"), ("KVPR_EMULATED_GPU_MEMORY", "0.5"),
                       ("KVPR_EMULATED_LINK_GBPS", "fast")):
        r = subprocess.run([base.KVPR, "generate", "--model", base.MODEL, "--prompt", "x", "-n", "1", "--backend", "cuda"],
                           capture_output=True, text=True, env={**os.environ, **GPUS, var: value})
        check(f"{var}={value}: exit 1 and one line naming it", r.returncode == 1 and
              r.stderr.strip().count("\n") == 0 and var in r.stderr, (r.returncode, r.stderr))
    global DIRECT
    DIRECT = direct_load_digest()
    os.environ.update(GPUS)  # every kvprd from here on, daemon_test.py's too, sees the two GPUs
    eight_gpu_placement()
    t0 = time.time()
    broadcast_failures()
    worker0_gone_before_the_group()
    print(f"broadcast failures: {time.time() - t0:.1f} s", flush=True)
    t0 = time.time()
    every_kv_mode(reference)
    print(f"every kv mode: {time.time() - t0:.1f} s", flush=True)
    d = gpu_daemon("--verify-weights", "on")
    try:
        log = open(os.path.join(base.TMP, f"kvprd-{d.port}.log")).read()
        check("kvprd found the two GPUs and placed a worker on each one's NUMA node",
              "2 NVIDIA GPU(s)" in log and "0000:17:00.0  0" in log and "0000:65:00.0  1" in log, log[-1500:])
        health_and_metrics(d)
        api(d, reference)
        kill_one_worker_under_load(d)
    finally:
        d.stop()
    drain()
    # Tool calls and structured output as daemon_test.py checks them, on these GPUs.
    t0 = time.time()
    base.qwen_tools()
    base.json_mode()
    print(f"tools and JSON: {time.time() - t0:.1f} s", flush=True)
    print(f"daemon on emulated GPUs: {base.passed} passed, {base.failed} failed")
    return 0 if base.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
