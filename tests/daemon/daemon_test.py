#!/usr/bin/env python3
"""Integration tests of kvprd on loopback: the real daemon with 2 CPU workers on the demo
model, driven over HTTP with the standard library only. Run by ctest (daemon_integration)."""
import fcntl
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

KVPRD = os.environ["KVPRD"]
KVPR = os.environ["KVPR_CLI"]
TMP = tempfile.mkdtemp(prefix="kvprd-test-")
MODEL = os.path.join(TMP, "demo")
WORKER = os.path.join(os.path.dirname(os.path.abspath(KVPRD)), "..", "worker", "kvpr-worker")
passed = failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {name} {detail}", flush=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Daemon:
    def __init__(self, *extra, args=None, env=None, wait_ready=True, port=None):
        self.port = port or free_port()
        self.log = open(os.path.join(TMP, f"kvprd-{self.port}.log"), "w")
        # Two GPU batches per layer (column by column) whenever a worker runs two or more
        # sequences: every check below also holds for it.
        argv = args if args is not None else ["--model", MODEL, "--port", str(self.port), "--workers", "2",
                                              "--max-batch", "8", "--gpu-batches", "2", "--config", "/dev/null", *extra]
        self.proc = subprocess.Popen([KVPRD, *argv], stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        if not wait_ready:
            self.wait_listening()
            return
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                st, body = self.get("/health")
                if st == 200 and body["status"] == "ok":
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("kvprd did not become ready")

    def wait_listening(self):
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("kvprd did not listen")

    def conn(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, raw=None, headers=None):
        c = self.conn()
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers=headers or {"Content-Type": "application/json"})
        r = c.getresponse()
        text = r.read().decode()
        c.close()
        try:
            return r.status, json.loads(text), dict(r.getheaders())
        except ValueError:
            return r.status, text, dict(r.getheaders())

    def get(self, path):
        st, body, _ = self.request("GET", path)
        return st, body

    def post(self, path, body):
        st, body, _ = self.request("POST", path, body)
        return st, body

    def stream(self, path, body, stop_after=None):
        """Returns the list of SSE data payloads (parsed JSON or '[DONE]')."""
        c = self.conn()
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200, (r.status, r.read())
        assert r.getheader("Content-Type") == "text/event-stream"
        events, buf = [], b""
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                lines = ev.decode("utf-8").split("\n")  # raises if a character was split
                name = lines.pop(0)[7:] if lines[0].startswith("event: ") else None  # (the Responses API's)
                assert len(lines) == 1 and lines[0].startswith("data: "), ev
                d = lines[0][6:]
                events.append(d if d == "[DONE]" else json.loads(d))
                assert name is None or events[-1]["type"] == name, (name, events[-1])
                if stop_after is not None and len(events) >= stop_after:
                    return events, c
            if events and events[-1] == "[DONE]":
                break
        c.close()
        return events, None

    def stop(self, sig=signal.SIGTERM, timeout=30):
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.log.close()


def generate_cli(prompt, n):
    out = subprocess.check_output([KVPR, "generate", "--model", MODEL, "--prompt", prompt, "-n", str(n), "--json"])
    return json.loads(out)


def completion(d, prompt, max_tokens=8, **kw):
    body = {"model": "demo", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **kw}
    return d.post("/v1/completions", body)


def metrics(d):
    st, text, _ = d.request("GET", "/metrics")
    assert st == 200
    values = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) \w+ .+$", line) or not line, line
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.eE+-]+|\+Inf|NaN)$', line)
        assert m, f"not Prometheus text: {line!r}"
        values[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return values


def operations():
    """Config file, systemd notifications, 503 without workers, 429 when full."""
    # A config file with every key the example documents, pointed at the demo model.
    port = free_port()
    example = open(os.path.join(os.path.dirname(__file__), "..", "..", "systemd", "kvprd.conf")).read()
    conf = os.path.join(TMP, "kvprd.conf")
    with open(conf, "w") as f:
        f.write(example.replace("/var/lib/kvprd/models/opt-6.7b", MODEL).replace("port = 8000", f"port = {port}")
                .replace("served-model-name = opt-6.7b", "served-model-name = demo").replace("# kv-mode = auto", "kv-mode = offload")
                .replace("# weights = host", "weights = host").replace("# gpu-batches = 4", "gpu-batches = 2"))
    # sd_notify: a datagram socket standing in for systemd.
    sock_path = os.path.join(TMP, "notify.sock")
    ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ns.bind(sock_path)
    ns.settimeout(60)
    d = Daemon(args=["--config", conf], env={"NOTIFY_SOCKET": sock_path}, port=port)
    msg = ns.recv(4096).decode()
    check("sd_notify READY=1 once workers loaded", "READY=1" in msg, msg)
    st, body = completion(d, "Hello", 3)
    check("config file: served name and kv mode", st == 200 and body["model"] == "demo", body)
    ref = generate_cli("Hello", 3)
    check("weights = host: the tokens of kvpr generate", body["choices"][0]["text"] == ref["text"], (body, ref))
    st, h = d.get("/health")
    check("weights = host in /health", all(w["placement"].get("weights") == "host" for w in h["workers"]), h)
    code = d.stop()
    msg = ns.recv(4096).decode()
    check("sd_notify STOPPING=1 on SIGTERM", "STOPPING=1" in msg, msg)
    check("config daemon exits 0", code == 0, code)
    ns.close()
    # Bad configuration: exit 2 and one line.
    bad = os.path.join(TMP, "bad.conf")
    with open(bad, "w") as f:
        f.write("model = /x\nportt = 5\n")
    r = subprocess.run([KVPRD, "--config", bad], capture_output=True, text=True)
    check("bad config line: exit 2, one line", r.returncode == 2 and r.stderr.count("\n") == 1 and "portt" in r.stderr,
          (r.returncode, r.stderr))
    r = subprocess.run([KVPRD, "--model", MODEL, "--cuda-graphs", "maybe"], capture_output=True, text=True)
    check("bad cuda-graphs value: exit 2, one line", r.returncode == 2 and r.stderr.count("\n") == 1 and
          "cuda-graphs: expected on or off" in r.stderr, (r.returncode, r.stderr))
    r = subprocess.run([KVPRD, "--model", MODEL, "--max-batch", "4", "--gpu-batches", "5"], capture_output=True, text=True)
    check("gpu-batches above max-batch: exit 2, one line", r.returncode == 2 and r.stderr.count("\n") == 1 and
          "gpu-batches must be in 1..max-batch (4), not 5" in r.stderr, (r.returncode, r.stderr))
    r = subprocess.run([KVPRD, "--model", MODEL, "--kv-dtype", "fp4"], capture_output=True, text=True)
    check("bad kv-dtype: exit 2, one line", r.returncode == 2 and r.stderr.count("\n") == 1 and
          "kv-dtype: expected f32, f16, bf16 or fp8, got 'fp4'" in r.stderr, (r.returncode, r.stderr))
    r = subprocess.run([KVPRD, "--model", MODEL, "--weights", "gpu"], capture_output=True, text=True)
    check("bad weights value: exit 2, one line", r.returncode == 2 and r.stderr.count("\n") == 1 and
          "weights: expected device or host" in r.stderr, (r.returncode, r.stderr))
    r = subprocess.run([KVPRD, "--model", MODEL, "--drain-timeout", "nan"], capture_output=True, text=True)
    check("a timeout of nan: exit 2, one line", r.returncode == 2 and r.stderr.count("\n") == 1 and
          "drain-timeout: 'nan' is not a number" in r.stderr, (r.returncode, r.stderr))
    r = subprocess.run([KVPRD, "--model", MODEL, "--port", "4294975296"], capture_output=True, text=True)
    check("a port past int (not wrapped to 8000): exit 2, one line", r.returncode == 2 and
          r.stderr.count("\n") == 1 and "port must be in 1..65535, not 4294975296" in r.stderr, (r.returncode, r.stderr))
    r = subprocess.run([KVPRD, "--help"], capture_output=True, text=True)
    check("--help lists the options", r.returncode == 0 and all(f"--{k}" in r.stdout for k in
          ["model", "port", "workers", "kv-mode", "cuda-graphs", "weights", "max-queue", "drain-timeout", "config"]),
          r.stdout[:200])
    # Every worker reports an error before it is ever ready (a KV cache of 100000 GiB cannot
    # fit): kvprd exits 1 with the error instead of restarting them forever.
    r = subprocess.run([KVPRD, "--model", MODEL, "--workers", "2", "--kv-cache", "100000GiB", "--port", str(free_port()),
                        "--config", "/dev/null"], capture_output=True, text=True, timeout=120)
    check("a configuration no worker can start with: exit 1 naming the error", r.returncode == 1 and
          "kvprd: error: worker" in r.stderr and "blocks x 16 tokens (room for " in r.stderr and
          "kv mode resident)" in r.stderr and "lower kv-cache, max-batch or max-seq-len" in r.stderr,
          (r.returncode, r.stderr[-600:]))
    # A worker binary that cannot even say what it serves (kvpr-worker --describe): kvprd exits 1
    # at once naming it, before it listens.
    r = subprocess.run([KVPRD, "--model", MODEL, "--port", str(free_port()), "--config", "/dev/null",
                        "--worker-binary", "/bin/false"], capture_output=True, text=True, timeout=60)
    check("a worker binary that does not describe the engine: exit 1 naming it", r.returncode == 1 and
          "kvprd: /bin/false --describe failed (exit status 1): is it this kvprd's worker?" in r.stderr,
          (r.returncode, r.stderr[-400:]))
    garbled = os.path.join(TMP, "garbled-worker.sh")
    with open(garbled, "w") as f:
        f.write("#!/bin/bash\necho 'not a description'\n")
    os.chmod(garbled, 0o755)
    r = subprocess.run([KVPRD, "--model", MODEL, "--port", str(free_port()), "--config", "/dev/null",
                        "--worker-binary", garbled], capture_output=True, text=True, timeout=60)
    check("a worker binary whose description kvprd cannot read: exit 1 naming it", r.returncode == 1 and
          "--describe answered what kvprd cannot read" in r.stderr, (r.returncode, r.stderr[-400:]))
    r = subprocess.run([KVPRD, "--model", os.path.join(TMP, "no-such-model"), "--port", str(free_port()),
                        "--config", "/dev/null"], capture_output=True, text=True, timeout=60)
    check("a model the engine cannot read: exit 1 with the engine's one line", r.returncode == 1 and
          "kvprd: " + os.path.join(TMP, "no-such-model") in r.stderr and "kvpr-worker" not in r.stderr,
          (r.returncode, r.stderr[-400:]))
    # No worker can start (each fails as it starts, not at once): 503 with a JSON error, /health 503.
    failing = os.path.join(TMP, "failing-worker.sh")
    with open(failing, "w") as f:
        f.write(f"""#!/bin/bash
# Describes the engine, then fails every start.
if [[ " $* " == *" --describe "* ]]; then exec {os.path.abspath(WORKER)} "$@"; fi
exit 1
""")
    os.chmod(failing, 0o755)
    port = free_port()
    d = Daemon(args=["--model", MODEL, "--port", str(port), "--config", "/dev/null",
                     "--worker-binary", failing], wait_ready=False, port=port)
    st, body = completion(d, "Hello", 3)
    check("503 while no worker is ready", st == 503 and body["error"]["type"] == "service_unavailable", (st, body))
    st, h = d.get("/health")
    check("/health 503 without workers", st == 503 and h["ready_workers"] == 0, h)
    d.stop()
    # Queue full: 429 with Retry-After. (Its workers also take cuda-graphs = on, a no-op on the CPU.)
    d = Daemon("--max-queue", "1", "--cuda-graphs", "on")
    holder = threading.Thread(target=lambda: completion(d, "Hold", 1500, ignore_eos=True))
    holder.start()
    deadline = time.time() + 10
    while time.time() < deadline and not any(w["in_flight"] for w in d.get("/health")[1]["workers"]):
        time.sleep(0.01)
    st, body, headers = d.request("POST", "/v1/completions", {"model": "demo", "prompt": "x", "max_tokens": 2})
    check("429 when the queue is full", st == 429 and headers.get("Retry-After") == "1" and
          body["error"]["type"] == "rate_limit_exceeded", (st, body, headers))
    holder.join()
    d.stop()


def write_tiny_llama(model, vocab=32000, hidden=32, heads=4, kv_heads=2, ffn=48, **config):
    """A one-layer Llama with Llama-2's vocabulary and random weights, as config.json and an F32
    model.safetensors written here (8-byte header length, JSON header, raw data). Qwen2
    (model_type qwen2) gets the biases of its q/k/v projections."""
    import random
    import struct
    from array import array
    json.dump(dict(dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=1,
                        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=128,
                        rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=True,
                        model_type="llama", torch_dtype="float32", bos_token_id=1, eos_token_id=2), **config),
              open(os.path.join(model, "config.json"), "w"))
    kvw, p = kv_heads * hidden // heads, "model.layers.0."
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden],
              p + "input_layernorm.weight": [hidden], p + "post_attention_layernorm.weight": [hidden],
              p + "self_attn.q_proj.weight": [hidden, hidden], p + "self_attn.k_proj.weight": [kvw, hidden],
              p + "self_attn.v_proj.weight": [kvw, hidden], p + "self_attn.o_proj.weight": [hidden, hidden],
              p + "mlp.gate_proj.weight": [ffn, hidden], p + "mlp.up_proj.weight": [ffn, hidden],
              p + "mlp.down_proj.weight": [hidden, ffn]}
    if config.get("model_type") == "qwen2":
        shapes.update({p + "self_attn.q_proj.bias": [hidden], p + "self_attn.k_proj.bias": [kvw],
                       p + "self_attn.v_proj.bias": [kvw]})
    rng, header, data = random.Random(7), {}, array("f")
    for name, shape in shapes.items():
        n = shape[0] * (shape[1] if len(shape) > 1 else 1)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [4 * len(data), 4 * (len(data) + n)]}
        data.extend([1.0] * n if name.endswith("norm.weight") else [rng.uniform(-0.2, 0.2) for _ in range(n)])
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(model, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data.tobytes())


def llama_model(name, tokenizer, chat_template, **config):
    """A tiny Llama (write_tiny_llama) under TMP/name with the tokenizer files of
    tests/data/<tokenizer> and `chat_template` in its tokenizer_config.json."""
    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", tokenizer)
    model = os.path.join(TMP, name)
    os.makedirs(model)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(data, f), os.path.join(model, f))
    write_tiny_llama(model, **config)
    if chat_template is not None:  # None: the tokenizer's own
        cfg = json.load(open(os.path.join(model, "tokenizer_config.json")))
        cfg["chat_template"] = chat_template
        json.dump(cfg, open(os.path.join(model, "tokenizer_config.json"), "w"))
    return model


def single_worker(model, *extra, generation_config=None):
    """kvprd with one CPU worker on `model` (generation_config.json written first when given);
    returns the daemon and its log so far."""
    if generation_config is not None:
        json.dump(generation_config, open(os.path.join(model, "generation_config.json"), "w"))
    port = free_port()
    d = Daemon(args=["--model", model, "--port", str(port), "--workers", "1", "--config", "/dev/null", *extra],
               port=port)
    return d, open(os.path.join(TMP, f"kvprd-{port}.log")).read()


def llama_chat():
    """A Llama checkpoint (grouped-query attention) whose tokenizer_config.json carries Llama-2
    chat's template: --chat-template auto picks llama-2, and the prompt starts with one BOS."""
    # Llama-2-chat's Jinja template (meta-llama/Llama-2-7b-chat-hf's tokenizer_config.json): kvprd
    # renders it, and auto detection gives llama-2 for its stops.
    model = llama_model("llama", "llama-tokenizer",
                        "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
                        "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
                        "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
                        "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
                        "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
                        "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
                        "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
                        "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
                        "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
    port = free_port()
    d = Daemon(args=["--model", model, "--port", str(port), "--workers", "1", "--max-batch", "4",
                     "--config", "/dev/null"], port=port)
    try:
        log = open(os.path.join(TMP, f"kvprd-{port}.log")).read()
        check("chat template auto: llama-2 from tokenizer_config.json", "chat template llama-2 (auto" in log, log[-500:])
        for msgs, text in (
                ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                 "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]"),
                ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                  {"role": "user", "content": "More"}],
                 "[INST] Hi [/INST] Hello </s><s>[INST] More [/INST]")):
            st, body = d.post("/v1/chat/completions", {"model": "llama", "messages": msgs, "max_tokens": 2,
                                                       "temperature": 0, "ignore_eos": True})
            st2, ids = d.post("/tokenize", {"prompt": text})
            check("llama-2 chat prompt: one BOS, the template's tokens (grouped-query attention model)",
                  st == 200 and st2 == 200 and ids["tokens"][0] == 1 and ids["tokens"][1] != 1 and
                  body["usage"]["prompt_tokens"] == len(ids["tokens"]) and
                  ids["tokens"].count(1) == 1 + text.count("<s>"), (body, ids))
        st, body = d.post("/v1/chat/completions", {"model": "llama", "max_tokens": 1, "messages": [
            {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})
        check("the template's raise_exception: a 400 with its message",
              st == 400 and "Conversation roles must alternate" in body["error"]["message"], (st, body))
    finally:
        d.stop()
    # A fine-tune's own template, which no built-in one matches: rendered as written (its own
    # variables from chat_template_kwargs too), by default and from --chat-template FILE.jinja.
    own = ("{{ bos_token }}{% for m in messages %}### {{ m.role | upper }}{{ suffix | default('') }}: "
           "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}### ASSISTANT:{% endif %}")
    tuned = llama_model("llama-tuned", "llama-tokenizer", own)
    with open(os.path.join(TMP, "own.jinja"), "w") as f:
        f.write(own.replace("### ", "## "))
    for args, text in (([], "### USER: Hi\n### ASSISTANT:"),
                       (["--chat-template", os.path.join(TMP, "own.jinja")], "## USER: Hi\n## ASSISTANT:")):
        port = free_port()
        d = Daemon(args=["--model", tuned, "--port", str(port), "--workers", "1", "--config", "/dev/null", *args],
                   port=port)
        try:
            st, body = d.post("/v1/chat/completions", {"model": "llama-tuned", "max_tokens": 1,
                                                       "messages": [{"role": "user", "content": "Hi"}]})
            st2, ids = d.post("/tokenize", {"prompt": text})
            check(f"the model's own template {args or '(auto)'}: its prompt, one BOS",
                  st == 200 and st2 == 200 and body["usage"]["prompt_tokens"] == len(ids["tokens"]), (body, ids))
            st, body = d.post("/v1/chat/completions", {"model": "llama-tuned", "max_tokens": 1,
                                                       "chat_template_kwargs": {"suffix": " (x)"},
                                                       "messages": [{"role": "user", "content": "Hi"}]})
            st2, ids = d.post("/tokenize", {"prompt": text.replace("USER:", "USER (x):")})
            check("chat_template_kwargs reach the model's own template",
                  st == 200 and body["usage"]["prompt_tokens"] == len(ids["tokens"]), (body, ids))
        finally:
            d.stop()
    # Mistral's, Zephyr's and ChatML by name on the same model (Mistral's has no system role: the
    # system message opens the first user turn).
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "More"}]
    for name, text, bos in (
            ("mistral", "[INST] Be brief.\n\nHi [/INST]Hello</s>[INST] More [/INST]", 1),
            ("zephyr", "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello</s>\n<|user|>\nMore</s>\n"
                       "<|assistant|>\n", 1),
            ("chatml", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
                       "Hello<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n", 1)):
        port = free_port()
        d = Daemon(args=["--model", model, "--port", str(port), "--workers", "1", "--config", "/dev/null",
                         "--chat-template", name], port=port)
        try:
            st, body = d.post("/v1/chat/completions", {"model": "llama", "messages": msgs, "max_tokens": 1})
            st2, ids = d.post("/tokenize", {"prompt": text})
            check(f"{name} chat prompt", st == 200 and st2 == 200 and
                  body["usage"]["prompt_tokens"] == len(ids["tokens"]) and ids["tokens"].count(1) == bos, (body, ids))
        finally:
            d.stop()
    # A prompt id the model cannot embed (a tokenizer larger than the model's vocabulary) is a
    # 400 naming it, not a worker failure.
    small = os.path.join(TMP, "llama-small-vocab")
    os.makedirs(small)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(model, name), os.path.join(small, name))
    write_tiny_llama(small, vocab=96)
    port = free_port()
    d = Daemon(args=["--model", small, "--port", str(port), "--workers", "1", "--config", "/dev/null"], port=port)
    try:
        st, body = d.post("/v1/completions", {"model": "llama-small-vocab", "prompt": "Hello world", "max_tokens": 2})
        check("prompt ids beyond the model's vocabulary: 400 naming them",
              st == 400 and "beyond the model's vocabulary of 96 tokens (the tokenizer has 32000)" in
              body["error"]["message"], (st, body))
        st, body = d.post("/v1/completions", {"model": "llama-small-vocab", "prompt": [1, 5, 9], "max_tokens": 2, "temperature": 0})
        check("ids within it still run", st == 200 and body["usage"]["completion_tokens"] == 2, (st, body))
        log = open(os.path.join(TMP, f"kvprd-{port}.log")).read()
        check("the mismatch is logged at start", "the tokenizer has 32000 tokens, the model's vocabulary 96" in log,
              log[-400:])
    finally:
        d.stop()


def llama3_chat():
    """A Llama-3.1-style checkpoint: Llama-3's tokenizer (BOS from its post-processor), llama3
    rope scaling, Llama-3.1's chat template and generation_config.json's three EOS ids."""
    # A Llama-3.1-Instruct template with JSON tools (vLLM's, tests/data/chat-templates/jinja), its
    # date fixed at 26 Jul 2024 as Llama-3.1-Instruct's own template has it (no strftime_now).
    template = open(os.path.join(os.path.dirname(__file__), "..", "data", "chat-templates", "jinja",
                                 "vllm-llama3.1-json-tool.jinja")).read()
    model = llama_model("llama3", "llama3-tokenizer", template.replace("strftime_now is defined", "false")
                        .replace('strftime_now("%d %b %Y")', '"26 Jul 2024"'),
                        vocab=128256, hidden=16, heads=2, kv_heads=1, ffn=24, bos_token_id=128000,
                        eos_token_id=128001, rope_theta=500000.0,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    d, log = single_worker(model, "--kv-mode", "kvpr",
                           generation_config={"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]})
    try:
        check("chat template auto: llama-3.1 from tokenizer_config.json", "chat template llama-3.1 (auto" in log,
              log[-500:])
        text = ("<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                "Today Date: 26 Jul 2024\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi"
                "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
        st, body = d.post("/v1/chat/completions", {"model": "llama3", "max_tokens": 2, "temperature": 0,
                                                   "messages": [{"role": "system", "content": " Be brief. "},
                                                                {"role": "user", "content": "Hi\n"}]})
        st2, ids = d.post("/tokenize", {"prompt": text})
        check("llama-3.1 chat prompt: BOS from the post-processor, headers as special tokens",
              st == 200 and st2 == 200 and ids["tokens"][0] == 128000 and ids["tokens"].count(128000) == 1 and
              ids["tokens"].count(128009) == 2 and body["usage"]["prompt_tokens"] == len(ids["tokens"]), (body, ids))
        # <|eot_id|> ends a chat turn; generation_config.json's <|eom_id|> ends any generation
        # unless ignore_eos; stop_token_ids end it whatever ignore_eos says.
        msgs = [{"role": "user", "content": "Hi"}]
        for what, path, req, reason, n in (
                ("chat stops at <|eot_id|>", "/v1/chat/completions",
                 {"messages": msgs, "logit_bias": {"128009": 100}}, "stop", 1),
                ("generation_config's <|eom_id|> is an EOS", "/v1/completions",
                 {"prompt": "Hi", "logit_bias": {"128008": 100}}, "stop", 1),
                ("ignore_eos runs past it", "/v1/completions",
                 {"prompt": "Hi", "logit_bias": {"128008": 100}, "ignore_eos": True}, "length", 4),
                ("stop_token_ids end it anyway", "/v1/completions",
                 {"prompt": "Hi", "logit_bias": {"1734": 100}, "ignore_eos": True, "stop_token_ids": [1734]},
                 "stop", 1),
                # min_tokens (vLLM's): the end of turn and the stop ids are held back until then.
                ("min_tokens holds <|eot_id|> back", "/v1/chat/completions",
                 {"messages": msgs, "logit_bias": {"128009": 100}, "min_tokens": 2}, "stop", 3),
                ("min_tokens holds a stop id back", "/v1/completions",
                 {"prompt": "Hi", "logit_bias": {"1734": 100}, "stop_token_ids": [1734], "min_tokens": 3}, "stop", 4)):
            st, body = d.post(path, dict(req, model="llama3", max_tokens=4, temperature=0))
            c = body.get("choices", [{}])[0] if st == 200 else {}
            check(what, st == 200 and c.get("finish_reason") == reason and body["usage"]["completion_tokens"] == n,
                  (st, body))
        st, body = d.post("/v1/completions", {"model": "llama3", "prompt": "Hi", "stop_token_ids": [128256]})
        check("stop_token_ids beyond the vocabulary: 400", st == 400 and body["error"]["param"] == "stop_token_ids",
              (st, body))
    finally:
        d.stop()
    # The other two by name: Llama-3 (no system header unless asked) and Llama-3.2 (today's date).
    today = time.strftime("%d %b %Y", time.gmtime())
    for name, text in (
            ("llama-3", "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n"),
            ("llama-3.2", "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                          f"Today Date: {today}\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\n")):
        port = free_port()
        d = Daemon(args=["--model", model, "--port", str(port), "--workers", "1", "--config", "/dev/null",
                         "--chat-template", name], port=port)
        try:
            st, body = d.post("/v1/chat/completions", {"model": "llama3", "max_tokens": 1,
                                                       "messages": [{"role": "user", "content": "Hi"}]})
            st2, ids = d.post("/tokenize", {"prompt": text})
            check(f"{name} chat prompt", st == 200 and st2 == 200 and
                  body["usage"]["prompt_tokens"] == len(ids["tokens"]), (body, ids))
        finally:
            d.stop()


def qwen_chat():
    """A Qwen2.5-Instruct-style checkpoint: model_type qwen2 (q/k/v biases), Qwen2.5's real
    tokenizer files (NFC normalizer, its chat template with the default system message), a
    config vocabulary larger than the tokenizer's (152064 rows for 151665 tokens, as Qwen2.5-7B
    ships), and generation_config.json's two EOS ids."""
    model = llama_model("qwen", "qwen2-tokenizer", None, model_type="qwen2", vocab=152064, hidden=16, heads=2,
                        kv_heads=1, ffn=24, bos_token_id=151643, eos_token_id=151645, rope_theta=1000000.0,
                        sliding_window=32768, use_sliding_window=False, max_window_layers=28)
    d, log = single_worker(model, "--kv-mode", "offload",
                           generation_config={"bos_token_id": 151643, "eos_token_id": [151645, 151643]})
    try:
        check("chat template auto: qwen2.5 from Qwen2.5's tokenizer_config.json", "chat template qwen2.5 (auto" in log,
              log[-500:])
        text = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
                "<|im_start|>user\nCaf\u00e9?<|im_end|>\n<|im_start|>assistant\n")
        st, body = d.post("/v1/chat/completions", {"model": "qwen", "max_tokens": 2, "temperature": 0,
                                                   "messages": [{"role": "user", "content": "Cafe\u0301?"}]})
        st2, ids = d.post("/tokenize", {"prompt": text})
        check("qwen2.5 chat prompt: default system turn, NFC-composed text, no BOS",
              st == 200 and st2 == 200 and ids["tokens"][0] == 151644 and ids["tokens"].count(151645) == 2 and
              body["usage"]["prompt_tokens"] == len(ids["tokens"]), (body, ids))
        msgs = [{"role": "user", "content": "Hi"}]
        for what, path, req, reason, n in (
                ("qwen chat stops at <|im_end|>", "/v1/chat/completions",
                 {"messages": msgs, "logit_bias": {"151645": 100}}, "stop", 1),
                ("generation_config's <|endoftext|> is an EOS", "/v1/completions",
                 {"prompt": "Hi", "logit_bias": {"151643": 100}}, "stop", 1)):
            st, body = d.post(path, dict(req, model="qwen", max_tokens=3, temperature=0))
            c = body.get("choices", [{}])[0] if st == 200 else {}
            check(what, st == 200 and c.get("finish_reason") == reason and body["usage"]["completion_tokens"] == n,
                  (st, body))
        # The checkpoint's rows past the tokenizer's 151665 tokens are no tokens: a bias or a
        # stop id naming one is refused.
        st, body = d.post("/v1/completions", {"model": "qwen", "prompt": "Hi", "logit_bias": {"151665": 5}})
        check("logit_bias past the tokenizer: 400", st == 400 and body["error"]["param"] == "logit_bias", (st, body))
        st, body = d.post("/v1/completions", {"model": "qwen", "prompt": "Hi", "stop_token_ids": [151700]})
        check("stop_token_ids past the tokenizer: 400", st == 400 and body["error"]["param"] == "stop_token_ids",
              (st, body))
    finally:
        d.stop()
    # Qwen3's template by name: chat_template_kwargs.enable_thinking (vLLM's) opens the answer
    # with an empty think block; other kwargs are refused by name. Qwen3's tokenizer has
    # <think> and </think> as added tokens: given to this one, so that --reasoning-parser qwen3
    # can be shown splitting them off.
    tj = json.load(open(os.path.join(model, "tokenizer.json")))
    for i, tag in ((151665, "<think>"), (151666, "</think>")):
        tj["added_tokens"].append({"id": i, "content": tag, "single_word": False, "lstrip": False, "rstrip": False,
                                   "normalized": False, "special": False})
    json.dump(tj, open(os.path.join(model, "tokenizer.json"), "w"))
    d, log = single_worker(model, "--chat-template", "qwen3", "--reasoning-parser", "qwen3")
    try:
        msgs = [{"role": "user", "content": "Hi"}]
        for kwargs, text in (({}, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"),
                             ({"enable_thinking": False},
                              "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")):
            st, body = d.post("/v1/chat/completions", {"model": "qwen", "messages": msgs, "max_tokens": 1,
                                                       "chat_template_kwargs": kwargs})
            st2, ids = d.post("/tokenize", {"prompt": text})
            check(f"qwen3 chat prompt with {kwargs}", st == 200 and st2 == 200 and
                  body["usage"]["prompt_tokens"] == len(ids["tokens"]), (body, ids))
        st, body = d.post("/v1/chat/completions", {"model": "qwen", "messages": msgs,
                                                   "chat_template_kwargs": {"add_vision_id": True}})
        check("unknown chat_template_kwargs: 400", st == 400 and "add_vision_id" in body["error"]["message"], body)
        # An answer that opens with <think> is reasoning (here it never closes: content null);
        # one that does not is all content. Streamed, the same split arrives as delta fields.
        st, hi = d.post("/tokenize", {"prompt": "Hi"})
        for bias, reasoning, content in (({"151665": 100}, "<think><think>", None),
                                         ({str(hi["tokens"][0]): 100}, None, "HiHiHi")):
            req = {"model": "qwen", "messages": msgs, "max_tokens": 3, "temperature": 0, "logit_bias": bias}
            st, body = d.post("/v1/chat/completions", req)
            m = body["choices"][0]["message"] if st == 200 else {}
            check(f"reasoning parser: reasoning_content {reasoning!r}, content {content!r}",
                  m.get("reasoning_content") == reasoning and m.get("content") == content, body)
            events, _ = d.stream("/v1/chat/completions", dict(req, stream=True))
            deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
            check("reasoning parser, streamed", "".join(x.get("reasoning_content", "") for x in deltas) == (reasoning or "")
                  and "".join(x.get("content", "") for x in deltas) == (content or ""), deltas)
    finally:
        d.stop()


# The npm clients the tests drive kvprd with, pinned to versions that run on Debian 12's Node.js
# 18: the official openai client (v4), the Vercel AI SDK (v4, with its OpenAI-compatible
# provider) and LangChain's ChatOpenAI. Installed once per build tree, all in one command (npm
# removes what a later install does not name).
NPM_PACKAGES = ["openai@4.104.0", "ai@4.3.19", "@ai-sdk/openai-compatible@0.2.16", "zod@3.25.76",
                "@langchain/openai@0.5.18", "@langchain/core@0.3.80",
                # Agent frameworks (agent_clients_test.mjs): the OpenAI Agents SDK (its last line on
                # openai v6 and zod 3; later ones need Node.js 22), instructor-js, LlamaIndex.TS.
                "@openai/agents@0.3.7", "@instructor-ai/instructor@1.7.0", "@llamaindex/openai@0.4.23",
                "@llamaindex/core@0.6.23", "@llamaindex/env@0.1.31"]


def node_client(script, port, model, *args, env=None):
    """tests/<script> (a node program using the npm clients above) against kvprd on `port`."""
    npm_dir = os.environ.get("KVPR_NPM_DIR", os.path.join(TMP, "npm"))
    stamp = os.path.join(npm_dir, "installed.txt")
    # The daemon tests of a build tree share one folder: the first to get here installs, under a
    # lock, while the others wait for it.
    os.makedirs(npm_dir, exist_ok=True)
    with open(os.path.join(npm_dir, "install.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(stamp) or open(stamp).read() != " ".join(NPM_PACKAGES):
            subprocess.run(["npm", "install", "--prefix", npm_dir, "--no-audit", "--no-fund", "--no-save",
                            "--no-package-lock", "--loglevel=error", *NPM_PACKAGES], check=True)
            with open(stamp, "w") as f:
                f.write(" ".join(NPM_PACKAGES))
    r = subprocess.run(["node", os.path.join(os.path.dirname(__file__), script), str(port), model, *args],
                       capture_output=True, text=True, timeout=180,
                       env={**os.environ, "NODE_PATH": os.path.join(npm_dir, "node_modules"), **(env or {})})
    print(r.stdout.strip())
    return r


def openai_client(port, model, *args, env=None):
    """tests/daemon/openai_client_test.mjs: the official openai npm client."""
    return node_client("openai_client_test.mjs", port, model, *args, env=env)


def agent_clients(port, model, *args, env=None):
    """tests/daemon/agent_clients_test.mjs: the OpenAI Agents SDK, instructor-js and LlamaIndex.TS."""
    return node_client("agent_clients_test.mjs", port, model, *args, env=env)


def npm_clients(port, model, *args, env=None):
    """tests/daemon/npm_clients_test.mjs: the Vercel AI SDK and LangChain, through their own helpers."""
    return node_client("npm_clients_test.mjs", port, model, *args, env=env)


def write_chain_model(model, chain, vocab=151936, hidden=32, model_type="qwen2", bos=151643, eos=151645, detour=None,
                      wrapper=None, gptq=False):
    """A one-layer Qwen2 (or Llama, Gemma 2, Gemma 3, gpt-oss, Phi-3) whose greedy answer is a given token sequence:
    token chain[i] embeds as the unit vector e_i and the untied LM head maps e_i to chain[i + 1];
    every attention and MLP weight and bias is zero, so each position's hidden state is its own
    embedding (Gemma's scaled, its norms' zero offsets a gain of 1, its soft-caps keeping the
    order). A real model run through the real engine, built so that its output (a tool call) is
    known. `detour`: an id that chain[0] prefers to chain[1] (logit 20 against 10). `wrapper`: the
    text model inside a multimodal checkpoint, as the hub stores them: "gemma3" (Gemma-3-4B's
    Gemma3ForConditionalGeneration, the names transformers wrote before 4.52:
    language_model.model.*, language_model.lm_head) or "mistral3" (Mistral-Small-3.1's, the names
    it writes since: model.language_model.*, lm_head), its config's text_config, a vision tower
    and projector beside it. `gptq`: its layer's matrices (zero) stored as GPTQ int4 (v2 zeros,
    groups of 16), as AutoGPTQ packs them."""
    import struct
    assert len(chain) <= hidden and len(set(chain[:-1])) == len(chain) - 1
    config = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=16, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024, rms_norm_eps=1e-6,
                  rope_theta=1000000.0, hidden_act="silu", tie_word_embeddings=False, model_type=model_type,
                  torch_dtype="float32", bos_token_id=bos, eos_token_id=eos)
    if model_type in ("gemma2", "gemma3_text"):
        config.update(head_dim=hidden // 2, query_pre_attn_scalar=hidden // 2, sliding_window=4,
                      hidden_activation="gelu_pytorch_tanh")
    if model_type == "gemma2":
        config.update(attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    if model_type == "gemma3_text":  # its one layer slides (5 local : 1 global)
        config.update(sliding_window_pattern=6, rope_local_base_freq=10000.0)
    if model_type == "gpt_oss":
        config.update(head_dim=hidden // 2, num_local_experts=2, num_experts_per_tok=1, sliding_window=128,
                      attention_bias=True, rope_theta=150000.0)
    if model_type == "phi3":  # Phi-3.5's longrope, its original context 16 tokens
        config.update(original_max_position_embeddings=16,
                      rope_scaling={"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [4.0] * 8})
    if wrapper:  # the fields the wrappers keep at the top level
        top = {k: config.pop(k) for k in ("torch_dtype", "bos_token_id", "eos_token_id", "tie_word_embeddings")}
        config = dict(top, model_type=wrapper, text_config=config, vision_config={"hidden_size": 8},
                      architectures=["Gemma3ForConditionalGeneration" if wrapper == "gemma3" else
                                     "Mistral3ForConditionalGeneration"])
    if gptq:
        config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 16, "desc_act": False,
                                         "sym": False, "checkpoint_format": "gptq_v2"}
    json.dump(config, open(os.path.join(model, "config.json"), "w"))
    kvw, p = hidden // 2, "model.layers.0."
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "lm_head.weight": [vocab, hidden],
              "model.norm.weight": [hidden], p + "input_layernorm.weight": [hidden],
              p + "post_attention_layernorm.weight": [hidden], p + "self_attn.q_proj.weight": [hidden, hidden],
              p + "self_attn.q_proj.bias": [hidden], p + "self_attn.k_proj.weight": [kvw, hidden],
              p + "self_attn.k_proj.bias": [kvw], p + "self_attn.v_proj.weight": [kvw, hidden],
              p + "self_attn.v_proj.bias": [kvw], p + "self_attn.o_proj.weight": [hidden, hidden],
              p + "mlp.gate_proj.weight": [16, hidden], p + "mlp.up_proj.weight": [16, hidden],
              p + "mlp.down_proj.weight": [hidden, 16]}
    if model_type != "qwen2":
        shapes = {k: v for k, v in shapes.items() if not k.endswith("proj.bias")}
    gemma = model_type in ("gemma2", "gemma3_text")
    if gemma:  # the MLP's input norm, and the norms of the attention's and the MLP's outputs
        shapes.update({p + n + ".weight": [hidden] for n in ("pre_feedforward_layernorm", "post_feedforward_layernorm")})
    if model_type == "gemma3_text":  # per-head query and key norms
        shapes.update({p + "self_attn.q_norm.weight": [hidden // 2], p + "self_attn.k_norm.weight": [hidden // 2]})
    if model_type == "gpt_oss":  # biases everywhere, sinks, a router and two experts in transformers' layout
        shapes = {k: v for k, v in shapes.items() if ".mlp." not in k}
        shapes.update({p + "self_attn.q_proj.bias": [hidden], p + "self_attn.k_proj.bias": [kvw],
                       p + "self_attn.v_proj.bias": [kvw], p + "self_attn.o_proj.bias": [hidden],
                       p + "self_attn.sinks": [2], p + "mlp.router.weight": [2, hidden], p + "mlp.router.bias": [2],
                       p + "mlp.experts.gate_up_proj": [2, hidden, 32], p + "mlp.experts.gate_up_proj_bias": [2, 32],
                       p + "mlp.experts.down_proj": [2, 16, hidden], p + "mlp.experts.down_proj_bias": [2, hidden]})
    if model_type == "phi3":  # fused: qkv_proj (Q, K, V rows), gate_up_proj (gate, up rows)
        shapes = {k: v for k, v in shapes.items() if not any(n in k for n in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))}
        shapes.update({p + "self_attn.qkv_proj.weight": [hidden + 2 * kvw, hidden], p + "mlp.gate_up_proj.weight": [32, hidden]})
    if gptq:  # each [N, K] matrix: qweight I32 [K/8, N], qzeros I32 [K/16, N/8], scales F16 [K/16, N]
        for name in [n for n in shapes if n.endswith("proj.weight") and ".layers." in n]:
            n_out, k_in = shapes.pop(name)
            m = name[: -len(".weight")]
            shapes.update({m + ".qweight": [k_in // 8, n_out], m + ".qzeros": [k_in // 16, n_out // 8],
                           m + ".scales": [k_in // 16, n_out]})
    header, offset, blobs = {}, 0, []
    for name, shape in shapes.items():
        n = 1
        for dim in shape:
            n *= dim
        data = bytearray(4 * n)
        if name.endswith("norm.weight") and not gemma:  # (Gemma's gains are 1 + w: w = 0)
            data = bytearray(struct.pack(f"<{n}f", *([1.0] * n)))
        elif name == "model.embed_tokens.weight":
            for i, t in enumerate(chain):
                struct.pack_into("<f", data, 4 * (t * hidden + i), 1.0)
        elif name.endswith(".scales"):  # F16 ones; codes and zeros 0: every weight (0 - 0) * 1
            data = bytearray(struct.pack(f"<{n}e", *([1.0] * n)))
        elif name == "lm_head.weight":
            for i in range(len(chain) - 1):
                struct.pack_into("<f", data, 4 * (chain[i + 1] * hidden + i), 10.0)
            if detour is not None:
                struct.pack_into("<f", data, 4 * (detour * hidden + 0), 20.0)
        dtype = "F16" if name.endswith(".scales") else "I32" if name.endswith((".qweight", ".qzeros")) else "F32"
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    if wrapper == "gemma3":
        header = {"language_model." + k: v for k, v in header.items()}
        tower = ("vision_tower.vision_model.embeddings.patch_embedding.weight", "multi_modal_projector.mm_input_projection_weight")
    if wrapper == "mistral3":
        header = {(k if k == "lm_head.weight" else "model.language_model." + k[len("model."):]): v for k, v in header.items()}
        tower = ("model.vision_tower.transformer.layers.0.attention.q_proj.weight", "model.multi_modal_projector.linear_1.weight")
    for name in tower if wrapper else ():  # the vision side, which the text model does not read
        header[name] = {"dtype": "F32", "shape": [8, 8], "data_offsets": [offset, offset + 256]}
        offset += 256
        blobs.append(bytearray(256))
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(model, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def chain_model(name, tokenizer, answer, after, end, detour_text=None, added=(), special=False, **kw):
    """TMP/name: the tokenizer files of tests/data/<tokenizer> (with `added` tokens, (id, text), as
    Qwen3's tokenizer adds <think> and </think> to Qwen2.5's) and a write_chain_model whose greedy
    answer to a prompt ending in token `after` is `answer`'s tokens (without a BOS), then `end`
    (or, with `detour_text`, that text's first token first: the answer is then the model's second
    choice at the start)."""
    model = os.path.join(TMP, name)
    os.makedirs(model)
    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", tokenizer)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(data, f), os.path.join(model, f))
    if added:
        tj = json.load(open(os.path.join(model, "tokenizer.json")))
        for i, tag in added:
            tj["added_tokens"].append({"id": i, "content": tag, "single_word": False, "lstrip": False,
                                       "rstrip": False, "normalized": False, "special": special})
        json.dump(tj, open(os.path.join(model, "tokenizer.json"), "w"))
    ids = json.loads(subprocess.check_output([KVPR, "tokenize", "--model", model, "--text", answer, "--json"]))["ids"]
    ids = [i for i in ids if i != kw.get("bos")]
    if detour_text is not None:
        kw["detour"] = json.loads(subprocess.check_output([KVPR, "tokenize", "--model", model, "--text", detour_text,
                                                           "--json"]))["ids"][0]
    write_chain_model(model, [after] + ids + [end], **kw)
    return model, ids


def qwen_tools():
    """Tool calls end to end with Qwen2.5's real tokenizer and chat template: the request's tools
    are written into the prompt as the template writes them, and a model whose answer is
    'Checking.<tool_call>{...}</tool_call><|im_end|>' gets it back as tool_calls (finish_reason
    tool_calls), whole and streamed; the call and its result go back in the next request; the
    official openai client does the same; what this server cannot do is refused by name."""
    answer = 'Checking.<tool_call>{"name":"get_weather","arguments":{"city": "Paris"}}</tool_call>'
    model, ids = chain_model("qwen-tools", "qwen2-tokenizer", answer, 198, 151645)  # after "\n", then <|im_end|>
    d, log = single_worker(model, "--served-model-name", "qwen", "--kv-mode", "kvpr")
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    try:
        check("tool calls on by default with Qwen2.5's template", "tool calls: hermes" in log, log[-500:])
        st, body = d.post("/v1/chat/completions", {"model": "qwen", "messages": msgs, "tools": tools, "temperature": 0,
                                                   "max_tokens": 40})
        prompt = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n"
                  "You may call one or more functions to assist with the user query.\n\nYou are provided with function "
                  "signatures within <tools></tools> XML tags:\n<tools>\n"
                  '{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", '
                  '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}\n'
                  "</tools>\n\nFor each function call, return a json object with function name and arguments within "
                  "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                  "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
                  "<|im_start|>assistant\n")
        st2, want = d.post("/tokenize", {"prompt": prompt})
        check("tools written into the prompt as Qwen2.5's template writes them",
              st == 200 and st2 == 200 and body["usage"]["prompt_tokens"] == len(want["tokens"]), (body, want))
        c = body["choices"][0] if st == 200 else {}
        calls = c.get("message", {}).get("tool_calls", [])
        check("the answer's <tool_call> block comes back as a tool call",
              c.get("finish_reason") == "tool_calls" and c["message"]["content"] == "Checking." and len(calls) == 1 and
              calls[0]["type"] == "function" and calls[0]["id"].startswith("chatcmpl-tool-") and
              calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'} and
              body["usage"]["completion_tokens"] == len(ids) + 1, body)
        events, _ = d.stream("/v1/chat/completions", {"model": "qwen", "messages": msgs, "tools": tools, "temperature": 0,
                                                      "max_tokens": 40, "stream": True})
        deltas = [e["choices"][0] for e in events[:-1] if e["choices"]]
        streamed_calls = [t for x in deltas for t in x["delta"].get("tool_calls", [])]
        check("streamed: the content as it comes, then the call, then finish_reason tool_calls",
              "".join(x["delta"].get("content") or "" for x in deltas) == "Checking." and len(streamed_calls) == 1 and
              streamed_calls[0]["index"] == 0 and streamed_calls[0]["function"] == calls[0]["function"] and
              deltas[-1]["finish_reason"] == "tool_calls", deltas)
        # The call and its result go back: the assistant turn with the call and the tool's turn.
        follow = msgs + [{"role": "assistant", "content": None, "tool_calls": calls},
                         {"role": "tool", "tool_call_id": calls[0]["id"] if calls else "x", "content": "21 C, sunny"}]
        st, body = d.post("/v1/chat/completions", {"model": "qwen", "messages": follow, "tools": tools, "max_tokens": 1})
        tail = ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n21 C, sunny\n</tool_response><|im_end|>\n"
                "<|im_start|>assistant\n")
        st2, want2 = d.post("/tokenize", {"prompt": prompt[:prompt.rfind("<|im_start|>assistant")] + tail})
        check("a tool call and its result in the conversation", st == 200 and
              body["usage"]["prompt_tokens"] == len(want2["tokens"]), (body, want2))
        # tool_choice none: the tools stay out of the prompt and the answer is text.
        st, body = d.post("/v1/chat/completions", {"model": "qwen", "messages": msgs, "tools": tools, "temperature": 0,
                                                   "tool_choice": "none", "max_tokens": 40})
        check("tool_choice none: no tools in the prompt, the answer as text", st == 200 and
              body["usage"]["prompt_tokens"] < len(want["tokens"]) and body["choices"][0]["finish_reason"] == "stop" and
              body["choices"][0]["message"]["content"] == answer and "tool_calls" not in body["choices"][0]["message"], body)
        for what, extra, param in (
                ("a tool_choice that is no choice", {"tool_choice": "sometimes"}, "tool_choice"),
                ("a tool without a function", {"tools": [{"type": "function"}]}, "tools"),
                ("a tool name with spaces", {"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools"),
                ("tools not a list", {"tools": {"type": "function"}}, "tools"),
                ("legacy functions", {"functions": [{"name": "f"}]}, "functions"),
                ("arguments that are not JSON", {"messages": msgs + [{"role": "assistant", "tool_calls": [
                    {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}, "messages")):
            st, body = d.post("/v1/chat/completions", dict({"model": "qwen", "messages": msgs, "tools": tools}, **extra))
            check(f"{what}: 400", st == 400 and body["error"]["param"] == param, (st, body))

        r = openai_client(d.port, "qwen", "tools")
        check("openai npm client: tool calls", r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:])
        r = npm_clients(d.port, "qwen", "tools")
        check("AI SDK and LangChain: tool calls", r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:])
    finally:
        d.stop()
    # A template without tools: they take the generic format (generic_tools()); a parser of
    # another template's format is refused at start.
    r = subprocess.run([KVPRD, "--model", model, "--port", str(free_port()), "--workers", "1", "--config", "/dev/null",
                        "--chat-template", "llama-3", "--tool-call-parser", "hermes"], capture_output=True, text=True,
                       timeout=60)
    check("--tool-call-parser hermes with a template without tools stops kvprd",
          r.returncode == 1 and "needs a chat template that writes tools" in r.stderr, r.stderr[-500:])


def generic_tools():
    """Tools on a template that writes none (ChatML here; the generic format, openai/generic_tools.h):
    the tools go into a system message, and a model whose answer is the JSON list of calls asked
    for gets it back as tool_calls, whole, streamed and forced; the call and its result go back
    as text the template renders; the official openai client does the same;
    --tool-call-parser none still refuses tools."""
    answer = '[{"name":"get_weather","parameters":{"city": "Paris"}}]'
    model, ids = chain_model("generic-tools", "qwen2-tokenizer", answer, 198, 151645)  # after "\n", then <|im_end|>
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    req = {"model": "m", "messages": msgs, "tools": tools, "temperature": 0, "max_tokens": 40}
    d, log = single_worker(model, "--served-model-name", "m", "--chat-template", "chatml")
    try:
        check("chatml: tool calls in the generic format", "tool calls: generic" in log, log[-500:])
        st, body = d.post("/v1/chat/completions", req)
        st2, plain = d.post("/v1/chat/completions", dict(req, tool_choice="none", max_tokens=1))
        c = body["choices"][0] if st == 200 else {}
        calls = c.get("message", {}).get("tool_calls", [])
        check("generic: the tools in the prompt, the answer's JSON list back as a tool call",
              st2 == 200 and body["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 60 and
              c.get("finish_reason") == "tool_calls" and c["message"]["content"] is None and len(calls) == 1 and
              calls[0]["id"].startswith("chatcmpl-tool-") and
              calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'} and
              body["usage"]["completion_tokens"] == len(ids) + 1, body)
        check("tool_choice none: the answer as text", plain["choices"][0]["message"].get("tool_calls") is None, plain)
        events, _ = d.stream("/v1/chat/completions", dict(req, stream=True))
        deltas = [e["choices"][0] for e in events[:-1] if e["choices"]]
        check("generic streamed: no content, the call, finish_reason tool_calls",
              not any(x["delta"].get("content") for x in deltas) and
              [t["function"] for x in deltas for t in x["delta"].get("tool_calls", [])] == [calls[0]["function"]] and
              deltas[-1]["finish_reason"] == "tool_calls", deltas)
        st, forced = d.post("/v1/chat/completions", dict(req, tool_choice="required"))
        check("generic, tool_choice required: the same call, constrained",
              st == 200 and [t["function"] for t in forced["choices"][0]["message"]["tool_calls"]] ==
              [calls[0]["function"]], forced)
        follow = msgs + [{"role": "assistant", "content": None, "tool_calls": calls},
                         {"role": "tool", "tool_call_id": calls[0]["id"], "content": "21 C, sunny"}]
        st, body2 = d.post("/v1/chat/completions", dict(req, messages=follow, max_tokens=1))
        check("generic: the call and its result in the conversation",
              st == 200 and body2["usage"]["prompt_tokens"] > body["usage"]["prompt_tokens"] + 20, body2)
        st, body2 = d.post("/v1/chat/completions", {"model": "m", "messages": follow, "max_tokens": 1})
        check("generic: a conversation with calls and results but no tools now", st == 200, body2)
        r = openai_client(d.port, "m", "tools", "no-content")
        check("openai npm client: generic tool calls", r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:])
        # The same through the Responses API: the call as a function_call item, its output sent back.
        st, resp = d.post("/v1/responses", {"model": "m", "input": "Weather in Paris?", "temperature": 0,
                                            "max_output_tokens": 40, "tools": [dict(tools[0]["function"], type="function")]})
        items = resp.get("output", []) if st == 200 else []
        check("responses: the call as a function_call item", len(items) == 1 and items[0]["type"] == "function_call" and
              items[0]["name"] == "get_weather" and items[0]["arguments"] == '{"city": "Paris"}' and
              items[0]["call_id"] == items[0]["call_id"].strip() != "", resp)
        st, nxt = d.post("/v1/responses", {"model": "m", "previous_response_id": resp.get("id"), "max_output_tokens": 1,
                                           "tools": [dict(tools[0]["function"], type="function")],
                                           "input": [{"type": "function_call_output", "call_id": items[0]["call_id"]
                                                      if items else "x", "output": "21 C, sunny"}]})
        check("responses: the call's output sent back", st == 200 and
              nxt["usage"]["input_tokens"] > resp["usage"]["input_tokens"] + 10, nxt)
        r = openai_client(d.port, "m", "responses-tools")
        check("openai npm client: Responses function tools", r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:])
        r = agent_clients(d.port, "m", "tools")
        check("Agents SDK (chat completions, responses) and LlamaIndex.TS: function tools", r.returncode == 0,
              r.stdout[-2000:] + r.stderr[-2000:])
    finally:
        d.stop()
    d, log = single_worker(model, "--served-model-name", "m", "--chat-template", "chatml", "--tool-call-parser", "none")
    try:
        check("--tool-call-parser none: tool calls off", "tool calls: off" in log, log[-500:])
        st, body = d.post("/v1/chat/completions", req)
        check("--tool-call-parser none: tools are a 400 naming it", st == 400 and body["error"]["param"] == "tools" and
              "--tool-call-parser none" in body["error"]["message"], body)
    finally:
        d.stop()


def responses_api():
    """POST /v1/responses on the chat path (on the model whose best JSON is {"a":1}, and which opens
    with "Sure" without a format): the Response object, text.format, the event stream adding up
    to the Response it ends with, previous_response_id, GET and DELETE of stored responses and
    their input items, store false, what is refused and how, --responses-store 0; the official
    openai client's responses.create, stream, parse (zod), retrieve and del."""
    model, _ = chain_model("qwen-json-responses", "qwen2-tokenizer", '{"a":1}', 198, 151645, detour_text="Sure")
    d, log = single_worker(model, "--served-model-name", "qwen")
    base = {"model": "qwen", "input": "Give me JSON", "max_output_tokens": 12, "temperature": 0}
    fmt = {"format": {"type": "json_object"}}
    try:
        st, r = d.post("/v1/responses", dict(base, text=fmt, metadata={"run": "1"}, instructions="Answer in JSON."))
        out = r.get("output", []) if st == 200 else []
        check("responses: a Response with one message item", st == 200 and r["object"] == "response" and
              r["id"].startswith("resp_") and r["status"] == "completed" and len(out) == 1 and
              out[0]["type"] == "message" and out[0]["role"] == "assistant" and
              out[0]["content"][0] == {"type": "output_text", "text": '{"a":1}', "annotations": []} and
              r["text"] == fmt and r["metadata"] == {"run": "1"} and r["instructions"] == "Answer in JSON." and
              r["usage"]["output_tokens"] == 6 and
              r["usage"]["total_tokens"] == r["usage"]["input_tokens"] + 6, r)
        st, plain = d.post("/v1/responses", dict(base, max_output_tokens=1))
        check("responses: without a format the model's own text; cut by max_output_tokens, incomplete",
              st == 200 and plain["status"] == "incomplete" and
              plain["incomplete_details"] == {"reason": "max_output_tokens"} and
              plain["output"][0]["content"][0]["text"].startswith("Sure"), plain)
        schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 7}},
                  "required": ["a"], "additionalProperties": False}
        st, js = d.post("/v1/responses", dict(base, max_output_tokens=40, text={"format": {
            "type": "json_schema", "name": "t", "schema": schema, "strict": True}}))
        check("responses: text.format json_schema", st == 200 and
              json.loads(js["output"][0]["content"][0]["text"])["a"] in (5, 6, 7), js)
        events, _ = d.stream("/v1/responses", dict(base, text=fmt, stream=True))
        types = [e["type"] for e in events]
        deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        check("responses streamed: created, in_progress, the item and its part, deltas, done events, completed",
              types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                            "response.content_part.added"] and
              types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                             "response.completed"] and
              [e["sequence_number"] for e in events] == list(range(len(events))) and deltas == '{"a":1}' and
              events[-1]["response"]["output"][0]["content"][0]["text"] == deltas, events)
        # previous_response_id: the stored conversation (without its instructions) goes first.
        st, nxt = d.post("/v1/responses", dict(base, text=fmt, previous_response_id=r["id"], input="Again"))
        check("previous_response_id continues the conversation", st == 200 and
              nxt["previous_response_id"] == r["id"] and nxt["instructions"] is None and
              nxt["usage"]["input_tokens"] > r["usage"]["input_tokens"] - 6 + r["usage"]["output_tokens"], nxt)
        st, got = d.get("/v1/responses/" + r["id"])
        check("GET /v1/responses/{id}: the Response as returned", st == 200 and got == r, got)
        st, items = d.get("/v1/responses/" + r["id"] + "/input_items")
        check("GET .../input_items: its input with ids", st == 200 and items["object"] == "list" and
              [i["content"] for i in items["data"]] == ["Give me JSON"] and items["data"][0]["id"].startswith("msg_"),
              items)
        st, gone, _ = d.request("DELETE", "/v1/responses/" + r["id"])
        st2, after = d.get("/v1/responses/" + r["id"])
        check("DELETE /v1/responses/{id}, then GET is a 404", st == 200 and gone["deleted"] is True and
              st2 == 404, (gone, after))
        st, unstored = d.post("/v1/responses", dict(base, text=fmt, store=False))
        st2, _ = d.get("/v1/responses/" + unstored.get("id", "x"))
        check("store false: not kept", st == 200 and unstored["store"] is False and st2 == 404, unstored)
        for what, extra, status, param in (
                ("a built-in tool", {"tools": [{"type": "web_search_preview"}]}, 400, "tools"),
                ("an unknown previous_response_id", {"previous_response_id": "resp_none"}, 404, "previous_response_id"),
                ("background", {"background": True}, 400, "background"),
                ("an image input", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
                 400, "input"),
                ("max_output_tokens past the context", {"max_output_tokens": 10 ** 6}, 400, "input"),
                ("a bad text.format", {"text": {"format": {"type": "xml"}}}, 400, "text.format")):
            st, body = d.post("/v1/responses", dict(base, **extra))
            check(f"responses, {what}: {status} naming {param}", st == status and body["error"]["param"] == param,
                  (st, body))
        st, body, _ = d.request("PUT", "/v1/responses/" + nxt.get("id", "x"))
        check("PUT on a stored response: 405", st == 405, body)
        r2 = openai_client(d.port, "qwen", "responses-json")
        check("openai npm client: the Responses API", r2.returncode == 0, r2.stdout[-2000:] + r2.stderr[-2000:])
        r2 = agent_clients(d.port, "qwen", "json")
        check("Agents SDK output types, instructor-js TOOLS and JSON_SCHEMA, LlamaIndex.TS chat", r2.returncode == 0,
              r2.stdout[-2000:] + r2.stderr[-2000:])
    finally:
        d.stop()
    d, log = single_worker(model, "--served-model-name", "qwen", "--responses-store", "0")
    try:
        st, r = d.post("/v1/responses", dict(base, text=fmt))
        st2, body = d.post("/v1/responses", dict(base, text=fmt, previous_response_id=r.get("id", "x")))
        check("--responses-store 0: served, nothing kept", st == 200 and st2 == 404 and
              "--responses-store 0" in body["error"]["message"], body)
    finally:
        d.stop()


def kv_sized_by_memory():
    """Without --kv-cache a store in host memory is what the worker's share of host memory leaves
    after its weights, --max-batch only a cap: kvprd starts with --max-batch 100000 (390 GiB of KV
    for the demo model as max-batch x max-seq-len), says the store's size and why, and serves; a
    store smaller than one sequence of the context starts with a warning and refuses only the
    prompts it cannot hold."""
    d, log = single_worker(MODEL, "--kv-mode", "offload", "--max-batch", "100000", "--host-memory", "64MiB")
    try:
        check("a default store sized by host-memory, said at start", "KV store" in log and
              "what host-memory 0.06 GiB leaves after" in log and "max-batch 100000 x max-seq-len 2048" in log, log[-1500:])
        m = re.search(r"KV store (\d+) tokens", log)
        tokens = int(m.group(1)) if m else 0
        check("its tokens: what 64 MiB holds, not 100000 sequences", 2048 < tokens < 100000 * 2048, log[-1500:])
        st, body = completion(d, "Hello, my name is", 4)
        check("served", st == 200 and body["usage"]["completion_tokens"] == 4, body)
        st, h = d.get("/health")  # (the store as the worker's stats report it, once it has run a step)
        kv = h["workers"][0].get("kv_cache", {}) if st == 200 else {}
        check("/health: the same store", kv.get("blocks_total", 0) * kv.get("block_tokens", 0) == tokens, h)
    finally:
        d.stop()
    d, log = single_worker(MODEL, "--kv-mode", "offload", "--host-memory", "12MiB")
    try:
        check("a store under one sequence of the context: a warning at start",
              "holds less than one sequence of the context" in log, log[-1500:])
        st, body = completion(d, "hello " * 1500, 4)
        check("a prompt it cannot hold: a 400 saying so", st == 400 and "KV cache holds" in body["error"]["message"], body)
        st, body = completion(d, "Hi", 2)
        check("a prompt it can hold: served", st == 200, body)
    finally:
        d.stop()


def new_families():
    """kvprd serving Gemma 2, Gemma 3's and Mistral 3's multimodal wrappers, a GPTQ checkpoint, gpt-oss and Phi-3.5 end to end (one-layer chain models of their real
    architectures, write_chain_model, with Qwen2.5's tokenizer and the families' special tokens
    added). Gemma: the model's own template in Gemma's turn format, the answer ending at
    generation_config's <end_of_turn>. gpt-oss: the harmony format built in, its analysis channel
    as reasoning_content, a commentary message to=functions.get_weather as a tool call, whole and
    streamed; a JSON response_format constraining the final channel; forced calls (named, required). Phi: an
    answer that takes the sequence past longrope's original context, the sequence computed again
    once there, counted."""
    words = " one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen"
    model, ids = chain_model("phi3-longrope", "qwen2-tokenizer", words, 198, 151645, model_type="phi3")
    d, log = single_worker(model, "--served-model-name", "p")
    try:
        st, body = d.post("/v1/completions", {"model": "p", "prompt": [198], "temperature": 0, "max_tokens": 40})
        c = body["choices"][0] if st == 200 else {}
        check("phi3 longrope: the answer runs past the original context of 16 tokens",
              c.get("text") == words and c.get("finish_reason") == "stop" and len(ids) + 1 > 16, (body, log[-800:]))
        time.sleep(1.2)  # the next stats message
        st, h = d.get("/health")
        kv = h["workers"][0].get("kv_cache", {})
        check("phi3 longrope: the crossing computed the sequence again once, in /health and /metrics",
              kv.get("rope_recomputes") == 1 and metrics(d).get('kvpr_worker_rope_recomputes{worker="0"}') == 1, h)
    finally:
        d.stop()
    gemma_template = ("{{ bos_token }}{% for m in messages %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' "
                      "else m['role']) + '\\n' + m['content'] + '<end_of_turn>\\n' }}{% endfor %}"
                      "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}")
    model, ids = chain_model("gemma2", "qwen2-tokenizer", "Hi there!", 198, 151666, model_type="gemma2",
                             added=((151665, "<start_of_turn>"), (151666, "<end_of_turn>")), special=True)
    cfg = json.load(open(os.path.join(model, "tokenizer_config.json")))
    cfg["chat_template"] = gemma_template
    json.dump(cfg, open(os.path.join(model, "tokenizer_config.json"), "w"))
    # In host memory (offload): its one layer slides, so its store is a ring (of 8 windows and a
    # step: fewer blocks than the 16 MiB store's).
    d, log = single_worker(model, "--served-model-name", "g", "--kv-mode", "offload", "--kv-cache", "16MiB",
                           generation_config={"eos_token_id": [151645, 151666]})
    try:
        check("gemma2: its own template recognised as Gemma's", "chat template gemma" in log, log[-800:])
        check("gemma2 offload: the sliding layer's store is a ring", "sliding-window layers in a ring" in log, log[-800:])
        st, body = d.post("/v1/chat/completions", {"model": "g", "messages": [{"role": "user", "content": "Hello"}],
                                                   "temperature": 0, "max_tokens": 20})
        c = body["choices"][0] if st == 200 else {}
        check("gemma2: served, its template rendered, the answer ends at <end_of_turn>",
              c.get("message", {}).get("content") == "Hi there!" and c.get("finish_reason") == "stop" and
              body["usage"]["completion_tokens"] == len(ids) + 1, (body, log[-800:]))
    finally:
        d.stop()
    # The multimodal checkpoints' text models: Gemma-3-4B's wrapper (its text weights under
    # language_model.model.) and Mistral-Small-3.1's (under model.language_model., as transformers
    # writes them since 4.52), each with a vision tower that is not read; text parts served, an
    # image part refused by name.
    model, ids = chain_model("gemma3-wrapper", "qwen2-tokenizer", "Hi there!", 198, 151666, model_type="gemma3_text",
                             wrapper="gemma3", added=((151665, "<start_of_turn>"), (151666, "<end_of_turn>")),
                             special=True)
    cfg = json.load(open(os.path.join(model, "tokenizer_config.json")))
    cfg["chat_template"] = gemma_template
    json.dump(cfg, open(os.path.join(model, "tokenizer_config.json"), "w"))
    d, log = single_worker(model, "--served-model-name", "g3", "--kv-mode", "kvpr",
                           generation_config={"eos_token_id": [151645, 151666]})
    try:
        parts = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
        st, body = d.post("/v1/chat/completions", {"model": "g3", "messages": [{"role": "user", "content": parts}],
                                                   "temperature": 0, "max_tokens": 20})
        c = body["choices"][0] if st == 200 else {}
        check("gemma3 wrapper: its text model served from language_model.model., text parts joined",
              c.get("message", {}).get("content") == "Hi there!" and c.get("finish_reason") == "stop" and
              body["usage"]["completion_tokens"] == len(ids) + 1, (body, log[-800:]))
        image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
        st, body = d.post("/v1/chat/completions", {"model": "g3", "messages": [{"role": "user", "content": [image]}]})
        check("gemma3 wrapper: an image part refused by name (400, messages)",
              st == 400 and body["error"]["param"] == "messages" and "image_url" in body["error"]["message"], body)
    finally:
        d.stop()
    model, ids = chain_model("mistral3-wrapper", "qwen2-tokenizer", "Bonjour!", 198, 151645, model_type="mistral",
                             wrapper="mistral3")  # the tokenizer's ChatML template: after "assistant\n"
    d, log = single_worker(model, "--served-model-name", "m3")
    try:
        st, body = d.post("/v1/chat/completions", {"model": "m3", "messages": [{"role": "user", "content": "Salut"}],
                                                   "temperature": 0, "max_tokens": 20})
        c = body["choices"][0] if st == 200 else {}
        check("mistral3 wrapper: its text model served from model.language_model., the head from lm_head",
              c.get("message", {}).get("content") == "Bonjour!" and c.get("finish_reason") == "stop", (body, log[-800:]))
    finally:
        d.stop()
    # A GPTQ checkpoint, with no flag: served, its scheme in the load log and /health.
    model, ids = chain_model("qwen-gptq", "qwen2-tokenizer", "Quantized!", 198, 151645, gptq=True)
    d, log = single_worker(model, "--served-model-name", "q")
    try:
        st, body = d.post("/v1/chat/completions", {"model": "q", "messages": [{"role": "user", "content": "Hi"}],
                                                   "temperature": 0, "max_tokens": 20})
        c = body["choices"][0] if st == 200 else {}
        st2, h = d.get("/health")
        q = h["workers"][0].get("placement", {}).get("quantization", {}) if st2 == 200 else {}
        check("gptq: served with no flag, its scheme in the load log and /health",
              c.get("message", {}).get("content") == "Quantized!" and "quantized checkpoint: gptq int4 g16 asym" in log
              and q.get("method") == "gptq" and q.get("scheme") == "gptq int4 g16 asym (v2 zeros)" and
              q.get("stored_bits_per_weight") == 5.25, (body, q, log[-800:]))
    finally:
        d.stop()

    harmony = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>")
    added = tuple((151665 + i, t) for i, t in enumerate(harmony))
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    req = {"model": "o", "messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": tools,
           "temperature": 0, "max_tokens": 40}
    calls_answer = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}'
    model, ids = chain_model("gpt-oss-call", "qwen2-tokenizer", calls_answer, 77091, 151669, model_type="gpt_oss",
                             added=added, special=True)  # after "assistant", then <|call|>
    d, log = single_worker(model, "--served-model-name", "o", "--chat-template", "harmony")
    try:
        check("gpt-oss: harmony template and its tool calls", "tool calls: harmony" in log, log[-800:])
        st, body = d.post("/v1/chat/completions", req)
        c = body["choices"][0] if st == 200 else {}
        calls = c.get("message", {}).get("tool_calls", [])
        check("gpt-oss: a commentary message to=functions.get_weather is the call",
              c.get("finish_reason") == "tool_calls" and c["message"]["content"] is None and len(calls) == 1 and
              calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}, body)
        events, _ = d.stream("/v1/chat/completions", dict(req, stream=True))
        deltas = [e["choices"][0] for e in events[:-1] if e["choices"]]
        check("gpt-oss streamed: the call, no content, finish tool_calls",
              [t["function"] for x in deltas for t in x["delta"].get("tool_calls", [])] == [calls[0]["function"]] and
              not any(x["delta"].get("content") for x in deltas) and deltas[-1]["finish_reason"] == "tool_calls", deltas)
    finally:
        d.stop()
    # A JSON response format constrains the final channel's message, the content; a forced tool
    # call is refused by name (its calls go to the commentary channel).
    model, ids = chain_model("gpt-oss-final", "qwen2-tokenizer", '<|channel|>final<|message|>{"city":"Oslo"}', 77091,
                             151670, model_type="gpt_oss", added=added, special=True)  # then <|return|>
    d, log = single_worker(model, "--served-model-name", "o", "--chat-template", "harmony")
    try:
        schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        st, body = d.post("/v1/chat/completions", dict(req, tools=None, response_format={
            "type": "json_schema", "json_schema": {"name": "place", "schema": schema}}))
        c = body["choices"][0] if st == 200 else {}
        check("gpt-oss: response_format json_schema constrains the final channel, the content",
              c.get("message", {}).get("content") == '{"city":"Oslo"}' and c.get("finish_reason") == "stop", body)
        st2, plain = d.post("/v1/chat/completions", dict(req, tools=None, max_tokens=1))
        section = json.loads(subprocess.check_output([KVPR, "tokenize", "--model", model, "--text", "# Response Formats\n\n"
                                                      "## place\n\n" + json.dumps(schema, separators=(",", ":")),
                                                      "--json"]))["ids"]
        check("gpt-oss: the schema told to the model in the developer message's # Response Formats",
              st2 == 200 and body["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"] + 4 + len(section),
              (body["usage"], plain))  # (+ <|start|>developer<|message|> ... <|end|>: "developer" is one token)
        events, _ = d.stream("/v1/chat/completions", dict(req, tools=None, stream=True, response_format={
            "type": "json_schema", "json_schema": {"name": "place", "schema": schema}}))
        check("gpt-oss streamed, response_format json_schema: the same content",
              "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"]) ==
              '{"city":"Oslo"}', events)
        st, body = d.post("/v1/chat/completions", dict(req, response_format={"type": "json_object"}))
        check("gpt-oss: a JSON format beside tools refused by name",
              st == 400 and body["error"]["param"] == "response_format", body)
    finally:
        d.stop()
    # A forced call: the prompt opens the call's message (named) or a final message holding the
    # list of calls (required); the answer, its body, is constrained from its first token.
    for choice, answer, end in (({"type": "function", "function": {"name": "get_weather"}}, '{"city": "Oslo"}', 151669),
                                ("required", '[{"name": "get_weather","parameters":{"city":"Oslo"}}]', 151670)):
        named = choice != "required"
        model, ids = chain_model("gpt-oss-forced-" + ("named" if named else "required"), "qwen2-tokenizer", answer,
                                 151667, end, model_type="gpt_oss", added=added, special=True)  # after <|message|>
        d, log = single_worker(model, "--served-model-name", "o", "--chat-template", "harmony")
        try:
            st, body = d.post("/v1/chat/completions", dict(req, tool_choice=choice))
            c = body["choices"][0] if st == 200 else {}
            calls = c.get("message", {}).get("tool_calls", [])
            opening = ("<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>" if named else
                       "<|channel|>final<|message|>")
            st2, want = d.post("/v1/chat/completions", dict(req, max_tokens=1))  # the same prompt, unopened
            check(f"gpt-oss: tool_choice {'named' if named else 'required'}: the prompt opens the message, its body "
                  "the call", st2 == 200 and body["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"] + len(
                      json.loads(subprocess.check_output([KVPR, "tokenize", "--model", model, "--text", opening,
                                                          "--json"]))["ids"]) and
                  c.get("finish_reason") == ("stop" if named else "tool_calls") and len(calls) == 1 and
                  calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}, (body, want))
            events, _ = d.stream("/v1/chat/completions", dict(req, tool_choice=choice, stream=True))
            deltas = [e["choices"][0] for e in events[:-1] if e["choices"]]
            check(f"gpt-oss streamed, tool_choice {'named' if named else 'required'}: the same call",
                  "".join(t["function"].get("arguments", "") for x in deltas for t in x["delta"].get("tool_calls", []))
                  == '{"city": "Oslo"}' and not any(x["delta"].get("content") for x in deltas), deltas)
        finally:
            d.stop()
    model, ids = chain_model("gpt-oss-think", "qwen2-tokenizer", "<|channel|>analysis<|message|>Check the weather.<|end|>",
                             77091, 151670, model_type="gpt_oss", added=added, special=True)  # then <|return|>
    d, log = single_worker(model, "--served-model-name", "o", "--chat-template", "harmony")
    try:
        st, body = d.post("/v1/chat/completions", dict(req, tools=None))
        m = body["choices"][0]["message"] if st == 200 else {}
        check("gpt-oss: the analysis channel is reasoning_content",
              m.get("reasoning_content") == "Check the weather." and m.get("content") is None and
              body["choices"][0]["finish_reason"] == "stop", body)
        events, _ = d.stream("/v1/chat/completions", dict(req, tools=None, stream=True))
        reasoning = "".join(e["choices"][0]["delta"].get("reasoning_content") or "" for e in events[:-1] if e["choices"])
        check("gpt-oss streamed: reasoning_content deltas", reasoning == "Check the weather.", events)
    finally:
        d.stop()


def qwen3_reasoning_tools():
    """A thinking model that reasons, then calls a tool (Qwen3's template and tokenizer, kvprd
    --reasoning-parser qwen3): the reasoning goes to reasoning_content, the call to tool_calls,
    content is null, whole and streamed."""
    answer = '<think>hmm</think><tool_call>{"name":"get_weather","arguments":{"city": "Paris"}}</tool_call>'
    model, _ = chain_model("qwen3-tools", "qwen2-tokenizer", answer, 198, 151645,
                           added=((151665, "<think>"), (151666, "</think>")))
    d, log = single_worker(model, "--served-model-name", "qwen", "--chat-template", "qwen3", "--reasoning-parser", "qwen3")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    req = {"model": "qwen", "messages": [{"role": "user", "content": "Weather?"}], "tools": tools, "temperature": 0,
           "max_tokens": 40}
    try:
        check("qwen3: tool calls as hermes", "tool calls: hermes" in log, log[-500:])
        st, body = d.post("/v1/chat/completions", req)
        c = body["choices"][0] if st == 200 else {}
        m = c.get("message", {})
        check("reasoning, then a call: reasoning_content, tool_calls, no content",
              m.get("reasoning_content") == "hmm" and m.get("content") is None and c.get("finish_reason") == "tool_calls"
              and [t["function"] for t in m.get("tool_calls", [])] ==
              [{"name": "get_weather", "arguments": '{"city": "Paris"}'}], body)
        events, _ = d.stream("/v1/chat/completions", dict(req, stream=True))
        deltas = [e["choices"][0] for e in events[:-1] if e["choices"]]
        check("streamed: the reasoning, then the call",
              "".join(x["delta"].get("reasoning_content") or "" for x in deltas) == "hmm" and
              not any(x["delta"].get("content") for x in deltas) and
              [t["function"] for x in deltas for t in x["delta"].get("tool_calls", [])] ==
              [t["function"] for t in m.get("tool_calls", [])] and deltas[-1]["finish_reason"] == "tool_calls", deltas)
    finally:
        d.stop()


def mistral_tools():
    """Mistral-Nemo's template and its [TOOL_CALLS] special token (which the answer's text does
    not show): the tools in [AVAILABLE_TOOLS] before the last user turn, the marker's position
    taken from the token, the calls (ids of 9 characters, as the template takes them) whole and
    streamed, and the call with its result back in the next request. The tokenizer is Qwen2.5's
    with [TOOL_CALLS] added as a special token."""
    answer = '[TOOL_CALLS][{"name":"get_weather","arguments":{"city": "Paris"}} ]'
    model, _ = chain_model("mistral-tools", "qwen2-tokenizer", answer, 60, 151645,  # after "]" of [/INST]
                           added=((151665, "[TOOL_CALLS]"),), special=True)
    d, log = single_worker(model, "--served-model-name", "m", "--chat-template", "mistral-nemo")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    msgs = [{"role": "user", "content": "Weather?"}]
    req = {"model": "m", "messages": msgs, "tools": tools, "temperature": 0, "max_tokens": 40}
    try:
        check("mistral-nemo: tool calls as mistral", "tool calls: mistral" in log, log[-500:])
        st, body = d.post("/v1/chat/completions", req)
        st2, want = d.post("/tokenize", {"prompt": '[AVAILABLE_TOOLS][{"type": "function", "function": {"name": '
                                                   '"get_weather", "parameters": {"type": "object"}}}][/AVAILABLE_TOOLS]'
                                                   "[INST]Weather?[/INST]"})
        c = body["choices"][0] if st == 200 else {}
        calls = c.get("message", {}).get("tool_calls", [])
        check("mistral-nemo: tools before the last user turn, the call after the marker token",
              st2 == 200 and body["usage"]["prompt_tokens"] == len(want["tokens"]) and
              c.get("finish_reason") == "tool_calls" and c["message"]["content"] is None and len(calls) == 1 and
              len(calls[0]["id"]) == 9 and calls[0]["id"].isalnum() and
              calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}, (body, want))
        events, _ = d.stream("/v1/chat/completions", dict(req, stream=True))
        deltas = [e["choices"][0] for e in events[:-1] if e["choices"]]
        check("mistral-nemo streamed: no content, the call",
              not any(x["delta"].get("content") for x in deltas) and
              [t["function"] for x in deltas for t in x["delta"].get("tool_calls", [])] == [calls[0]["function"]], deltas)
        follow = msgs + [{"role": "assistant", "content": None, "tool_calls": calls},
                         {"role": "tool", "tool_call_id": calls[0]["id"], "content": "21 C"}]
        st, body = d.post("/v1/chat/completions", dict(req, messages=follow, max_tokens=1))
        check("mistral-nemo: the call and its result in the conversation", st == 200, body)
        follow[1]["tool_calls"] = [dict(calls[0], id="x")]
        st, body = d.post("/v1/chat/completions", dict(req, messages=follow, max_tokens=1))
        check("mistral-nemo: a call id that is not 9 characters: 400", st == 400 and "9 characters" in
              body["error"]["message"], body)
    finally:
        d.stop()


def llama_tools():
    """Tool calls with Llama-3.1's template and Meta's JSON format ({"name", "parameters"}, parsed
    as vLLM's llama3_json): the tools go into the first user message as json.dumps(indent=4)
    writes them, a model whose answer is that JSON gets it back as a tool call, and the call and
    its result (an ipython turn) go back in the next request."""
    answer = '{"name":"get_weather","parameters":{"city": "Paris"}}'
    model, ids = chain_model("llama-tools", "llama3-tokenizer", answer, 271, 128009,  # after "\n\n", then <|eot_id|>
                             vocab=128256, model_type="llama", bos=128000, eos=128009)
    d, log = single_worker(model, "--served-model-name", "llama", "--chat-template", "llama-3.1", "--kv-mode", "offload")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    try:
        check("llama-3.1: tool calls as llama3_json", "tool calls: llama3_json" in log, log[-500:])
        st, body = d.post("/v1/chat/completions", {"model": "llama", "messages": msgs, "tools": tools, "temperature": 0,
                                                   "max_tokens": 40})
        tool_text = ('{\n    "type": "function",\n    "function": {\n        "name": "get_weather",\n        "parameters": {\n'
                     '            "type": "object",\n            "properties": {\n                "city": {\n'
                     '                    "type": "string"\n                }\n            },\n            "required": [\n'
                     '                "city"\n            ]\n        }\n    }\n}')
        prompt = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge "
                  "Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
                  "Given the following functions, please respond with a JSON for a function call with its proper "
                  "arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, "
                  "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n" + tool_text +
                  "\n\nWeather in Paris?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
        st2, want = d.post("/tokenize", {"prompt": prompt})
        check("llama-3.1: tools in the first user message, indented as json.dumps(indent=4)",
              st == 200 and st2 == 200 and body["usage"]["prompt_tokens"] == len(want["tokens"]) - 1, (body, want))
        c = body["choices"][0] if st == 200 else {}
        calls = c.get("message", {}).get("tool_calls", [])
        check("llama-3.1: the answer's JSON comes back as a tool call",
              c.get("finish_reason") == "tool_calls" and c["message"]["content"] is None and len(calls) == 1 and
              calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}, body)
        events, _ = d.stream("/v1/chat/completions", {"model": "llama", "messages": msgs, "tools": tools, "temperature": 0,
                                                      "max_tokens": 40, "stream": True})
        deltas = [e["choices"][0] for e in events[:-1] if e["choices"]]
        streamed = [t for x in deltas for t in x["delta"].get("tool_calls", [])]
        check("llama-3.1 streamed: no content, the call, finish_reason tool_calls",
              not any(x["delta"].get("content") for x in deltas) and len(streamed) == 1 and
              streamed[0]["function"] == calls[0]["function"] and deltas[-1]["finish_reason"] == "tool_calls", deltas)
        follow = msgs + [{"role": "assistant", "content": None, "tool_calls": calls},
                         {"role": "tool", "tool_call_id": "x", "content": "21 C"}]
        st, body = d.post("/v1/chat/completions", {"model": "llama", "messages": follow, "tools": tools, "max_tokens": 1})
        st2, want2 = d.post("/tokenize", {"prompt": prompt + '{"name": "get_weather", "parameters": {"city": "Paris"}}'
                                          '<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"21 C"<|eot_id|>'
                                          "<|start_header_id|>assistant<|end_header_id|>\n\n"})
        check("llama-3.1: the call and its result as an ipython turn", st == 200 and
              body["usage"]["prompt_tokens"] == len(want2["tokens"]) - 1, (body, want2))
        st, body = d.post("/v1/chat/completions", {"model": "llama", "messages": msgs + [
            {"role": "assistant", "tool_calls": calls + calls}], "tools": tools})
        check("llama-3.1: two calls in one message: 400", st == 400 and "one tool call" in body["error"]["message"], body)
    finally:
        d.stop()


def json_mode():
    """Constrained decoding through kvprd. response_format json_object: a model whose first choice
    is to open with "Sure" and second is '{"' answers '{"a":1}' in JSON mode (the mask leaves only
    tokens that continue a JSON object, and the end of turn only once it is complete), and
    "Sure..." without it; json_schema, and tool_choice naming a function or "required", give
    text valid against their schema whatever the model prefers."""
    model, _ = chain_model("qwen-json", "qwen2-tokenizer", '{"a":1}', 198, 151645, detour_text="Sure")
    d, log = single_worker(model, "--served-model-name", "qwen")
    msgs = [{"role": "user", "content": "Give me JSON"}]
    try:
        req = {"model": "qwen", "messages": msgs, "temperature": 0, "max_tokens": 12}
        st, body = d.post("/v1/chat/completions", dict(req, response_format={"type": "json_object"}))
        c = body["choices"][0] if st == 200 else {}
        check("json_object: the model's best JSON, ended when complete",
              c.get("message", {}).get("content") == '{"a":1}' and c.get("finish_reason") == "stop", body)
        events, _ = d.stream("/v1/chat/completions", dict(req, response_format={"type": "json_object"}, stream=True))
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"])
        check("json_object streamed", text == '{"a":1}', events)
        st, body = d.post("/v1/chat/completions", req)
        check("without it the model opens with Sure", st == 200 and
              body["choices"][0]["message"]["content"].startswith("Sure"), body)
        # json_schema: the model's own JSON where the schema admits it; where it does not (a
        # required boolean "b", no other keys), the schema's JSON however unlikely.
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                  "additionalProperties": False}
        rf = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}}
        st, body = d.post("/v1/chat/completions", dict(req, response_format=rf))
        check("json_schema admitting the model's JSON", st == 200 and
              body["choices"][0]["message"]["content"] == '{"a":1}', body)
        # Numeric bounds (Pydantic's ge/le): the model's 1 is below them; what it writes is within.
        rf["json_schema"]["schema"] = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 5,
                                                                              "maximum": 7}},
                                       "required": ["a"], "additionalProperties": False}
        st, body = d.post("/v1/chat/completions", dict(req, response_format=rf, max_tokens=40))
        content = body["choices"][0]["message"]["content"] if st == 200 else ""
        check("json_schema with minimum/maximum: a value within them", st == 200 and
              body["choices"][0]["finish_reason"] == "stop" and json.loads(content)["a"] in (5, 6, 7), body)
        schema = {"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"],
                  "additionalProperties": False}
        rf["json_schema"]["schema"] = schema
        st, body = d.post("/v1/chat/completions", dict(req, response_format=rf, max_tokens=80))
        content = body["choices"][0]["message"]["content"] if st == 200 else ""
        check("json_schema against the model's preference: the schema's JSON",
              st == 200 and body["choices"][0]["finish_reason"] == "stop" and isinstance(json.loads(content)["b"], bool)
              and list(json.loads(content)) == ["b"], body)
        for bad, part in (({"type": "string", "pattern": "(a+"}, "pattern '(a+': an unclosed '('"),
                          ({"type": "integer", "if": {"minimum": 3}, "then": {"maximum": 5}}, "'if' is not supported"),
                          ({"$ref": "#/$defs/X"}, "names no definition")):
            rf["json_schema"]["schema"] = bad
            st, body = d.post("/v1/chat/completions", dict(req, response_format=rf))
            check(f"json_schema {bad}: 400 naming it", st == 400 and part in body["error"]["message"] and
                  body["error"]["param"] == "response_format", body)
        st, body = d.post("/v1/chat/completions", dict(req, response_format={"type": "json_schema"}))
        check("json_schema without a schema: 400", st == 400 and body["error"]["param"] == "response_format", body)
        # Completions take it too (as vLLM does), rather than ignoring it (the prompt: the "\n" the
        # model's answer starts after).
        st, body = d.post("/v1/completions", {"model": "qwen", "prompt": [198], "temperature": 0, "max_tokens": 12,
                                              "response_format": {"type": "json_object"}})
        check("completions with json_object: the model's best JSON", st == 200 and
              body["choices"][0]["text"] == '{"a":1}' and body["choices"][0]["finish_reason"] == "stop", body)

        # tool_choice naming a function: the answer is its arguments, valid against its
        # parameters; "required": a list of calls (one, with parallel_tool_calls false).
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
            "additionalProperties": False}}}, {"type": "function", "function": {"name": "now"}}]
        named = {"type": "function", "function": {"name": "get_weather"}}
        st, body = d.post("/v1/chat/completions", dict(req, tools=tools, tool_choice=named, max_tokens=100))
        m = body["choices"][0]["message"] if st == 200 else {}
        calls = m.get("tool_calls", [])
        check("tool_choice named: its arguments, valid against its parameters",
              len(calls) == 1 and calls[0]["function"]["name"] == "get_weather" and m["content"] is None and
              list(json.loads(calls[0]["function"]["arguments"])) == ["city"] and
              len(json.loads(calls[0]["function"]["arguments"])["city"]) <= 8 and
              body["choices"][0]["finish_reason"] == "stop", body)
        events, _ = d.stream("/v1/chat/completions", dict(req, tools=tools, tool_choice=named, max_tokens=100, stream=True))
        parts = [t for e in events[:-1] if e["choices"] for t in e["choices"][0]["delta"].get("tool_calls", [])]
        check("tool_choice named, streamed: the name first, then the arguments in pieces that add up",
              parts and parts[0]["function"]["name"] == "get_weather" and parts[0]["id"].startswith("chatcmpl-tool-") and
              "".join(p["function"]["arguments"] for p in parts) == calls[0]["function"]["arguments"], parts)
        st, body = d.post("/v1/chat/completions", dict(req, tools=tools, tool_choice="required",
                                                       parallel_tool_calls=False, max_tokens=160))
        c = body["choices"][0] if st == 200 else {}
        calls = c.get("message", {}).get("tool_calls", [])
        check("tool_choice required: one call of one of the tools",
              c.get("finish_reason") == "tool_calls" and len(calls) == 1 and
              calls[0]["function"]["name"] in ("get_weather", "now") and
              isinstance(json.loads(calls[0]["function"]["arguments"]), dict), body)
        for what, extra in (("a named function not among the tools", {"tool_choice": {"type": "function", "function": {
                                 "name": "nope"}}}),
                            ("required without tools", {"tools": [], "tool_choice": "required"}),
                            ("tool parameters the server cannot enforce", {"tool_choice": "required", "tools": [
                                {"type": "function", "function": {"name": "f", "parameters": {
                                    "type": "object", "properties": {"x": {"type": "integer", "not": {"const": 2}}}}}}]})):
            st, body = d.post("/v1/chat/completions", dict(req, **dict({"tools": tools}, **extra)))
            check(f"{what}: 400", st == 400, body)
        r = openai_client(d.port, "qwen", "json")
        check("openai npm client: structured output", r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:])
        r = npm_clients(d.port, "qwen", "json")
        check("AI SDK and LangChain: structured output through their helpers", r.returncode == 0,
              r.stdout[-2000:] + r.stderr[-2000:])
    finally:
        d.stop()


def paged_admission():
    """A worker whose KV store holds a fraction of what its requests need at once: they wait for
    blocks, the newest is preempted and prefilled again when blocks run out, and every one still
    gets the text it gets alone; a prompt the whole store cannot hold is a 400."""
    d, _ = single_worker(MODEL, "--kv-cache", "1MiB", "--max-batch", "64", "--block-tokens", "16")
    try:
        st, h = d.get("/health")
        kv = h["workers"][0].get("kv_cache", {}) if st == 200 else {}
        deadline = time.time() + 10
        while not kv and time.time() < deadline:  # the worker's first stats message
            time.sleep(0.2)
            st, h = d.get("/health")
            kv = h["workers"][0].get("kv_cache", {})
        total = kv.get("blocks_total", 0)
        check("paged KV: --kv-cache 1MiB sizes the store in 16-token blocks", kv.get("block_tokens") == 16 and
              16 <= total <= 64, h)
        prompts = [f"Request number {i} asks for a long answer about blocks" for i in range(8)]
        results = [None] * len(prompts)

        def ask(i):
            results[i] = completion(d, prompts[i], 60, ignore_eos=True)
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        alone = [completion(d, p, 60, ignore_eos=True) for p in prompts]
        check("paged KV: requests needing more blocks than the store holds all complete",
              all(r and r[0] == 200 and r[1]["usage"]["completion_tokens"] == 60 for r in results), results)
        check("paged KV: a preempted request's text is the text it gets alone",
              all(r and a[0] == 200 and r[1]["choices"][0]["text"] == a[1]["choices"][0]["text"]
                  for r, a in zip(results, alone)), (results, alone))
        time.sleep(1.2)  # the next stats message
        st, h = d.get("/health")
        kv = h["workers"][0].get("kv_cache", {})
        m = metrics(d)
        check("paged KV: preemptions in /health and /metrics, every block back",
              kv.get("preemptions", 0) > 0 and m.get('kvpr_worker_preemptions{worker="0"}', 0) == kv["preemptions"] and
              kv.get("blocks_used") == 0 and m.get('kvpr_worker_kv_blocks_total{worker="0"}') == total, (h, m))
        st, body = completion(d, [5] * (16 * total), 4)
        check("paged KV: a prompt larger than the whole store is a 400 naming the KV cache",
              st == 400 and body["error"]["type"] == "invalid_request_error" and
              "KV cache holds" in body["error"]["message"], (st, body))
        st, body = completion(d, "Still serving", 4)
        check("paged KV: and the worker goes on serving", st == 200, body)
    finally:
        d.stop()


def auto_tiers():
    """kv mode auto on the CPU backend with a device tier of two 16-token blocks (the demo
    model's K and V are 32 KiB a block): a long answer spills from the tier to the host store and
    is still the text resident KV gives; /health and /metrics show the bytes of each tier and the
    tier sizes of the last step; without --kv-mode a CPU worker stays resident."""
    prompt = "The device tier holds the tail of every sequence and the host store the rest"
    d, log = single_worker(MODEL, "--kv-mode", "auto", "--gpu-kv-budget", "64KiB", "--split", "0")
    try:
        st, body = completion(d, prompt, 60, ignore_eos=True)
        check("auto: a 60-token answer past a 2-block device tier", st == 200 and
              body["usage"]["completion_tokens"] == 60 and "kv mode auto" in log, body)
        time.sleep(1.2)  # the next stats message
        st, h = d.get("/health")
        tiers = h["workers"][0].get("kv_cache", {}).get("tiers", {}) if st == 200 else {}
        m = metrics(d)
        # The last step fed the 59th answer token: 73 cached tokens, the last two blocks' on the device.
        check("auto: /health shows the tiers' bytes and the last step's tier sizes",
              h["workers"][0]["kv_cache"]["tier"] == "host+device" and tiers.get("device_bytes") == 65536 and
              tiers.get("device_bytes_used") == 65536 and tiers.get("host_bytes", 0) > 0 and
              tiers.get("resident_tokens", 0) >= 16 and tiers.get("staged_tokens", 0) > 0 and
              tiers["resident_tokens"] + tiers["staged_tokens"] == body["usage"]["total_tokens"] - 2, (h, body))
        check("auto: and /metrics the same",
              m.get('kvpr_worker_device_kv_bytes{worker="0"}') == 65536 and
              m.get('kvpr_worker_kv_resident_tokens{worker="0"}') == tiers.get("resident_tokens") and
              m.get('kvpr_worker_kv_staged_tokens{worker="0"}') == tiers.get("staged_tokens"), m)
    finally:
        d.stop()
    d, log = single_worker(MODEL)
    try:
        st, ref = completion(d, prompt, 60, ignore_eos=True)
        check("auto: the text of resident KV", st == 200 and ref["choices"][0]["text"] == body["choices"][0]["text"],
              (ref, body))
        st, h = d.get("/health")
        check("auto: a CPU worker without --kv-mode is resident",
              "kv mode resident" in log and
              h["workers"][0].get("kv_cache", {}).get("tiers", {}).get("device_bytes", 0) == 0, h)
    finally:
        d.stop()


def prefix_cache(d):
    """A prompt that starts with one a worker finished gets that worker and its cached K/V blocks."""
    before = metrics(d)
    prompt = ("The prefix cache keeps what a finished sequence computed, in blocks of tokens, so the next turn of a "
              "conversation, which starts with everything the last one said, prefills only its own new words")
    st, first = completion(d, prompt, 8)
    n = first["usage"]["prompt_tokens"]
    check("prefix cache: first request computes its whole prompt",
          st == 200 and first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}, first)
    st, h = d.get("/health")
    kv = h["workers"][0].get("kv_cache", {})
    block = kv.get("block_tokens", 16)
    check("prefix cache: /health shows each worker's KV blocks", st == 200 and bool(kv) and block == 16 and
          kv["blocks_total"] > 0 and 0 <= kv["blocks_used"] <= kv["blocks_total"] and
          kv["blocks_free"] == kv["blocks_total"] - kv["blocks_used"] and kv["tier"] == "host" and
          kv["preemptions"] == 0 and 0 <= kv["prefix_hit_rate"] <= 1 and n > 2 * block, (h, n))
    # Another request keeps a worker busy: least outstanding work would send the next one to
    # the other worker, but the one holding the prompt has a free slot and gets it.
    result = {}

    def busy():
        result["r"] = completion(d, "Something else entirely", 800, ignore_eos=True)
    t = threading.Thread(target=busy)
    t.start()
    time.sleep(0.3)
    st, again = completion(d, prompt, 8)
    # Whole blocks are reused: those of all but the prompt's last token.
    check("prefix cache: the same prompt again reuses the full blocks of all but its last token, same text",
          st == 200 and again["usage"]["prompt_tokens_details"] == {"cached_tokens": (n - 1) // block * block} and
          again["choices"][0]["text"] == first["choices"][0]["text"], (again, first))
    # The next turn: the prompt, the answer, a few more tokens (the answer's text need not
    # tokenize back into the generated tokens; the prompt's part is reused in any case). The
    # controller follows each answer's tokens, so the turn still goes to the busy worker.
    st, ids = d.post("/tokenize", {"prompt": prompt})
    st, ans = d.post("/tokenize", {"prompt": first["choices"][0]["text"], "add_special_tokens": False})
    turn2 = ids["tokens"] + ans["tokens"] + ids["tokens"][1:4]
    events, _ = d.stream("/v1/completions", {"model": "demo", "prompt": turn2, "max_tokens": 4, "temperature": 0,
                                             "stream": True, "stream_options": {"include_usage": True}})
    usage = events[-2]["usage"]
    check("prefix cache: the next turn reuses the prompt and the answer's tokens (streamed usage)",
          usage["prompt_tokens"] == len(turn2) and usage["prompt_tokens_details"]["cached_tokens"] >= n // block * block,
          usage)
    ref = d.post("/v1/completions", {"model": "demo", "prompt": turn2, "max_tokens": 4, "temperature": 0,
                                     "logprobs": 0, "echo": True})[1]
    streamed = "".join(e["choices"][0]["text"] for e in events[:-2] if e["choices"])
    check("prefix cache: the cached turn's text is an uncached one's (scored prompts skip the cache)",
          ref["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and ref["choices"][0]["text"].endswith(streamed),
          (ref, streamed))
    t.join(60)
    after = metrics(d)
    hits = after["kvpr_prefix_cache_hits_total"] - before["kvpr_prefix_cache_hits_total"]
    check("prefix cache: hits counted in /metrics", hits >= (n - 1) // block * block + n // block * block and
          after["kvpr_prefix_cache_queries_total"] > before["kvpr_prefix_cache_queries_total"], (before, after))
    # Several at once sharing that prompt spread over both workers (a prefill saved is worth less
    # than a batch twice as large), each reusing what its worker holds where it can.
    results = [None] * 4

    def ask(i):
        results[i] = completion(d, prompt, 200, ignore_eos=True)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
        time.sleep(0.02)
    busy = [0, 0]  # the most requests each worker held at once while they ran
    while any(th.is_alive() for th in threads):
        st, h = d.get("/health")
        busy = [max(b, w.get("in_flight", 0)) for b, w in zip(busy, h["workers"])]
        time.sleep(0.01)
    check("prefix cache: a flood sharing a prompt spreads over the workers", len(busy) == 2 and min(busy) >= 1 and
          all(r and r[0] == 200 for r in results), (busy, h))
    # --prefix-caching off: the same prompt twice is computed twice, to the same text. That
    # daemon also speculates (--speculative-tokens 4): greedy answers are the same text, streamed
    # or not, and the drafts it took are counted in /metrics.
    off, _ = single_worker(MODEL, "--prefix-caching", "off", "--speculative-tokens", "4")
    try:
        r1, r2 = completion(off, prompt, 8)[1], completion(off, prompt, 8)[1]
        check("--prefix-caching off: nothing cached, same text",
              r2["usage"]["prompt_tokens_details"] == {"cached_tokens": 0} and
              r1["choices"][0]["text"] == r2["choices"][0]["text"] == first["choices"][0]["text"], (r1, r2))
        loop = "The cache lives in host memory and the cache lives"  # the demo model repeats itself
        want = completion(d, loop, 40, ignore_eos=True)[1]["choices"][0]["text"]
        got = completion(off, loop, 40, ignore_eos=True)[1]
        events, _ = off.stream("/v1/completions", {"model": "demo", "prompt": loop, "max_tokens": 40, "temperature": 0,
                                                   "ignore_eos": True, "stream": True})
        streamed = "".join(e["choices"][0]["text"] for e in events if isinstance(e, dict) and e.get("choices"))
        check("--speculative-tokens: greedy text as without it, streamed too",
              got["choices"][0]["text"] == want == streamed and got["usage"]["completion_tokens"] == 40,
              (got, want, streamed))
        for _ in range(50):  # workers report their counts every 0.5 s
            m = metrics(off)
            if m.get('kvpr_worker_spec_accepted_tokens{worker="0"}', 0) > 0:
                break
            time.sleep(0.1)
        check("--speculative-tokens: drafts checked and taken, in /metrics",
              0 < m['kvpr_worker_spec_accepted_tokens{worker="0"}'] <= m['kvpr_worker_spec_draft_tokens{worker="0"}'], m)
    finally:
        off.stop()


def generation_defaults():
    """generation_config.json's sampling fields are the defaults of requests that leave them out
    (--generation-config auto); a request's own values win; values a request could not have
    stop kvprd at start, naming the file."""
    model = os.path.join(TMP, "demo-gc")
    shutil.copytree(MODEL, model)
    d, log = single_worker(model, "--served-model-name", "demo",
                           generation_config={"temperature": 0.0, "repetition_penalty": 1.5, "eos_token_id": 2})
    try:
        check("sampling defaults logged", "sampling defaults from generation_config.json: temperature 0, "
              "repetition_penalty 1.5" in log, log[-500:])
        prompt = "Hello, my name is"
        st, implicit = d.post("/v1/completions", {"model": "demo", "prompt": prompt, "max_tokens": 12})
        st2, explicit = completion(d, prompt, 12, repetition_penalty=1.5)
        st3, plain = completion(d, prompt, 12, repetition_penalty=1.0)
        check("defaults apply to what a request leaves out", st == st2 == st3 == 200 and
              implicit["choices"][0]["text"] == explicit["choices"][0]["text"], (implicit, explicit))
        check("repetition_penalty changes greedy output", plain["choices"][0]["text"] != explicit["choices"][0]["text"],
              (plain, explicit))
        st, body = completion(d, prompt, 2, repetition_penalty=0)
        check("repetition_penalty 0: 400", st == 400 and body["error"]["param"] == "repetition_penalty", (st, body))
        # min_p 1 keeps only the most likely token: sampling at any temperature is greedy.
        st, body = completion(d, prompt, 12, repetition_penalty=1.0, temperature=1.5, min_p=1.0, seed=5)
        check("min_p 1 samples the greedy tokens", st == 200 and body["choices"][0]["text"] == plain["choices"][0]["text"],
              (body, plain))
        st, body = completion(d, prompt, 2, min_p=2)
        check("min_p 2: 400", st == 400 and body["error"]["param"] == "min_p", (st, body))
    finally:
        d.stop()
    json.dump({"temperature": 3.0}, open(os.path.join(model, "generation_config.json"), "w"))
    r = subprocess.run([KVPRD, "--model", model, "--port", str(free_port()), "--workers", "1", "--config", "/dev/null"],
                       capture_output=True, text=True, timeout=60)
    check("an out-of-range generation_config.json stops kvprd with one line",
          r.returncode == 1 and 'generation_config.json: "temperature" is 3, outside [0, 2]' in r.stderr, r.stderr[-500:])
    r = subprocess.run([KVPRD, "--model", model, "--port", str(free_port()), "--workers", "1", "--config", "/dev/null",
                        "--generation-config", "none", "--print-topology"], capture_output=True, text=True, timeout=60)
    check("--generation-config none ignores it", r.returncode == 0, r.stderr[-500:])


def main():
    subprocess.check_call([KVPR, "make-demo-model", "--out", MODEL], stdout=subprocess.DEVNULL)
    generation_defaults()
    operations()
    llama_chat()
    llama3_chat()
    qwen_chat()
    qwen_tools()
    generic_tools()
    responses_api()
    kv_sized_by_memory()
    qwen3_reasoning_tools()
    new_families()
    mistral_tools()
    llama_tools()
    json_mode()
    paged_admission()
    auto_tiers()
    d = Daemon()
    try:
        # --- placement: each worker bound to its own cores (one NUMA node here)
        st, h = d.get("/health")
        cpus = [tuple(w["placement"]["cpus"]) for w in h["workers"]]
        check("workers report disjoint cpusets", all(cpus) and len(set(sum(map(list, cpus), []))) == sum(map(len, cpus)), h)
        r = subprocess.run([KVPRD, "--model", MODEL, "--workers", "2", "--config", "/dev/null", "--print-topology"],
                           capture_output=True, text=True)
        check("kvprd --print-topology", r.returncode == 0 and "worker  gpu  bus id" in r.stdout, r.stdout + r.stderr)

        # --- the same greedy request as kvpr generate
        ref = generate_cli("Hello, my name is", 8)
        st, body = completion(d, "Hello, my name is", 8)
        check("completion 200", st == 200, body)
        check("completion text equals kvpr generate", body["choices"][0]["text"] == ref["text"], (body, ref))
        check("completion shape", body["object"] == "text_completion" and body["usage"] ==
              {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13,
               "prompt_tokens_details": {"cached_tokens": 0}} and
              body["choices"][0]["finish_reason"] == "length", body)
        st, ids = d.post("/tokenize", {"prompt": "Hello, my name is"})
        check("tokenize", st == 200 and ids["tokens"] == ref["prompt_ids"], ids)
        st, body = completion(d, ids["tokens"], 8)
        check("prompt as token ids", st == 200 and body["choices"][0]["text"] == ref["text"], body)
        st, de = d.post("/detokenize", {"tokens": ref["tokens"]})
        check("detokenize", st == 200 and de["prompt"] == ref["text"], de)
        prefix_cache(d)
        st, body = completion(d, ["Hello, my name is", "The sky"], 4, n=2)
        check("list of prompts x n", st == 200 and len(body["choices"]) == 4 and
              [c["index"] for c in body["choices"]] == [0, 1, 2, 3] and
              body["choices"][0]["text"] == body["choices"][1]["text"] == ref["text"][:len(body["choices"][0]["text"])], body)
        st, body = completion(d, "Hello, my name is", 5, echo=True, logprobs=1)
        check("echo and logprobs: the prompt's tokens, then the 5 generated",
              st == 200 and body["choices"][0]["text"].startswith("Hello, my name is") and
              len(body["choices"][0]["logprobs"]["token_logprobs"]) == body["usage"]["prompt_tokens"] + 5, body)
        # logprobs=k: the k most likely tokens at each position (+ the sampled one), sorted,
        # the greedy token first, all of them log-probabilities.
        st, body = completion(d, "Hello, my name is", 4, logprobs=3)
        lp = body["choices"][0]["logprobs"] if st == 200 else {}
        tops = lp.get("top_logprobs", [])
        check("completions logprobs=3 gives 3 alternatives per token",
              st == 200 and len(tops) == 4 and all(3 <= len(t) <= 4 for t in tops) and
              all(v <= 0 for t in tops for v in t.values()) and
              all(abs(max(t.values()) - lp["token_logprobs"][i]) < 1e-4 and
                  lp["tokens"][i] in t for i, t in enumerate(tops)), body)
        # echo + logprobs scores the prompt (how evaluation harnesses compute log-likelihoods):
        # prompt tokens come first with null for the first one, offsets index the echoed text,
        # and max_tokens = 0 only scores.
        st, ids = d.post("/tokenize", {"prompt": "Hello, my name is"})
        st2, body = completion(d, "Hello, my name is", 0, echo=True, logprobs=1)
        lp = body["choices"][0]["logprobs"] if st2 == 200 else {}
        text = body["choices"][0]["text"] if st2 == 200 else ""
        n = len(ids.get("tokens", []))
        check("echo + logprobs scores the prompt",
              st2 == 200 and text == "Hello, my name is" and len(lp["tokens"]) == n and
              lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None and
              all(v is not None and v <= 0 for v in lp["token_logprobs"][1:]) and
              all(text[o:o + len(t)] == t for o, t in zip(lp["text_offset"], lp["tokens"])) and
              all(1 <= len(t) <= 2 for t in lp["top_logprobs"][1:]), (ids, body))
        st3, gen = completion(d, "Hello, my name is", 3, echo=True, logprobs=1)
        lp3 = gen["choices"][0]["logprobs"] if st3 == 200 else {}
        check("echo + logprobs + generation: prompt then generated tokens",
              st3 == 200 and len(lp3["tokens"]) == n + 3 and lp3["token_logprobs"][:n][1:] == lp["token_logprobs"][1:] and
              gen["choices"][0]["text"][lp3["text_offset"][n]:].startswith(lp3["tokens"][n]), gen)
        events, _ = d.stream("/v1/completions", {"model": "demo", "prompt": "Hello, my name is", "max_tokens": 0,
                                                 "echo": True, "logprobs": 1, "temperature": 0, "stream": True})
        first = events[0]["choices"][0] if events and isinstance(events[0], dict) else {}
        check("streamed echo carries the prompt's logprobs",
              first.get("text") == "Hello, my name is" and first.get("logprobs", {}).get("token_logprobs") ==
              lp["token_logprobs"], events)
        # logit_bias and penalties are applied, not ignored.
        st, ids = d.post("/tokenize", {"prompt": " the"})
        the = ids["tokens"][-1]
        st, body = completion(d, "Hello, my name is", 4, logit_bias={str(the): 100})
        check("logit_bias +100 forces its token", st == 200 and body["choices"][0]["text"] == " the" * 4, body)
        st, body = completion(d, "Hello, my name is", 8, frequency_penalty=2.0, presence_penalty=2.0)
        check("penalties change greedy output", st == 200 and body["choices"][0]["text"] != ref["text"], (body, ref))
        st, body = d.post("/v1/chat/completions", {"model": "demo", "messages": [{"role": "user", "content": "x"}],
                                                   "max_tokens": 2, "tools": [], "response_format": {"type": "text"},
                                                   "presence_penalty": 0, "logit_bias": {}})
        check("neutral values of unsupported features are accepted", st == 200, body)
        msgs1 = [{"role": "user", "content": "Hi there"}]
        st, body = d.post("/v1/chat/completions", {"model": "demo", "messages": msgs1, "max_tokens": 3, "temperature": 0,
                                                   "logprobs": True, "top_logprobs": 2})
        content = body["choices"][0]["logprobs"]["content"] if st == 200 else []
        check("chat top_logprobs=2", st == 200 and len(content) == 3 and
              all(len(c["top_logprobs"]) == 2 and c["top_logprobs"][0]["token"] == c["token"] and
                  c["top_logprobs"][0]["logprob"] >= c["top_logprobs"][1]["logprob"] and
                  isinstance(c["top_logprobs"][1]["bytes"], list) for c in content), body)
        stop = ref["text"][10:14]
        st, body = completion(d, "Hello, my name is", 8, stop=[stop])
        check("stop string", st == 200 and body["choices"][0]["finish_reason"] == "stop" and
              body["choices"][0]["text"] == ref["text"][:ref["text"].find(stop)], (body, stop))
        st, a = completion(d, "Once", 12, temperature=1.0, seed=7)
        st2, b = completion(d, "Once", 12, temperature=1.0, seed=7)
        check("seeded sampling repeats", a["choices"][0]["text"] == b["choices"][0]["text"], (a, b))

        # --- chat, non-streaming and streaming
        msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}]
        st, chat = d.post("/v1/chat/completions", {"model": "demo", "messages": msgs, "max_tokens": 6, "temperature": 0})
        check("chat 200", st == 200 and chat["object"] == "chat.completion" and
              chat["choices"][0]["message"]["role"] == "assistant", chat)
        ref_chat = generate_cli("System: You are terse.\n\nUser: Hi there\n\nAssistant:", 6)
        if chat["choices"][0]["finish_reason"] == "length":
            check("chat equals kvpr generate on the documented template",
                  chat["choices"][0]["message"]["content"] == ref_chat["text"], (chat, ref_chat))
        events, _ = d.stream("/v1/chat/completions", {"model": "demo", "messages": msgs, "max_tokens": 6,
                                                      "temperature": 0, "stream": True,
                                                      "stream_options": {"include_usage": True}})
        check("chat stream ends with [DONE]", events[-1] == "[DONE]", events[-3:])
        content = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e["choices"])
        check("chat stream text equals non-streaming", content == chat["choices"][0]["message"]["content"], content)
        check("chat stream first delta has the role", events[0]["choices"][0]["delta"].get("role") == "assistant", events[0])
        check("usage chunk after the finish chunk", events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 6
              and events[-3]["choices"][0]["finish_reason"] is not None, events[-3:])
        events, _ = d.stream("/v1/completions", {"model": "demo", "prompt": "Hello, my name is", "max_tokens": 8,
                                                 "temperature": 0, "stream": True})
        text = "".join(e["choices"][0]["text"] for e in events[:-1])
        check("completion stream text", text == ref["text"] and events[-2]["choices"][0]["finish_reason"] == "length",
              (text, ref["text"]))
        # Streaming with logprobs: every token's logprobs arrive exactly once, in order, equal to
        # the non-streaming answer (text offsets included).
        req = {"model": "demo", "prompt": "Hello, my name is", "max_tokens": 8, "temperature": 0, "logprobs": 2}
        st, whole = d.post("/v1/completions", req)
        events, _ = d.stream("/v1/completions", dict(req, stream=True))
        got = {"tokens": [], "token_logprobs": [], "text_offset": [], "top_logprobs": []}
        for e in events[:-1]:
            lp = e["choices"][0]["logprobs"] if e["choices"] else None
            for key in got:
                got[key] += lp[key] if lp else []
        want = whole["choices"][0]["logprobs"] if st == 200 else None
        check("streamed logprobs equal the non-streaming ones",
              want is not None and got["tokens"] == want["tokens"] and got["text_offset"] == want["text_offset"] and
              got["top_logprobs"] == want["top_logprobs"] and
              all(abs(a - b) < 1e-9 for a, b in zip(got["token_logprobs"], want["token_logprobs"])) and
              len(got["tokens"]) == 8, (got, want))
        events, _ = d.stream("/v1/chat/completions", {"model": "demo", "messages": [{"role": "user", "content": "Hi"}],
                                                      "max_tokens": 4, "temperature": 0, "stream": True,
                                                      "logprobs": True, "top_logprobs": 1})
        content = [c for e in events[:-1] if e["choices"] and e["choices"][0].get("logprobs")
                   for c in e["choices"][0]["logprobs"]["content"]]
        check("chat stream carries logprobs", len(content) == 4 and all(len(c["top_logprobs"]) == 1 for c in content),
              events)
        events, _ = d.stream("/v1/completions", {"model": "demo", "prompt": "日本語の文章と絵文字😀を", "max_tokens": 24,
                                                 "temperature": 1.0, "seed": 3, "stream": True})
        check("stream decodes as UTF-8 event by event", events[-1] == "[DONE]")

        # --- 64 concurrent requests, all correct
        prompts = [f"Request number {i} says" for i in range(64)]
        want = {}
        for p in prompts[:4]:
            want[p] = generate_cli(p, 6)["text"]
        results = {}

        def one(p):
            st, body = completion(d, p, 6)
            results[p] = (st, body)
        threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        check("64 concurrent: all 200", all(results[p][0] == 200 for p in prompts),
              [results[p] for p in prompts if results[p][0] != 200][:2])
        check("64 concurrent: batched equals alone", all(results[p][1]["choices"][0]["text"] == want[p] for p in want),
              [(results[p][1]["choices"][0]["text"], want[p]) for p in want])
        check("64 concurrent: all 6 tokens", all(results[p][1]["usage"]["completion_tokens"] == 6 for p in prompts))

        # --- the official openai npm client (v4: runs on Debian 12's Node.js 18)
        r = openai_client(d.port, "demo")
        check("openai npm client", r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:])
        r = npm_clients(d.port, "demo")
        check("AI SDK and LangChain: text, streaming with usage", r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:])

        # --- cancellation: a client that disconnects frees its slot
        before = metrics(d)
        events, conn = d.stream("/v1/completions", {"model": "demo", "prompt": "Go on and on", "max_tokens": 1500,
                                                    "ignore_eos": True, "stream": True}, stop_after=3)
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        deadline = time.time() + 20
        while time.time() < deadline:
            m = metrics(d)
            if m.get('kvpr_request_success_total{finish_reason="cancelled"}', 0) > \
                    before.get('kvpr_request_success_total{finish_reason="cancelled"}', 0):
                break
            time.sleep(0.05)
        m = metrics(d)
        check("disconnect cancels the generation", m.get('kvpr_request_success_total{finish_reason="cancelled"}', 0) >
              before.get('kvpr_request_success_total{finish_reason="cancelled"}', 0), m)
        check("cancelled run stopped early", m["kvpr_generation_tokens_total"] - before["kvpr_generation_tokens_total"] < 1000)
        time.sleep(0.6)
        m = metrics(d)
        check("no sequence left running", m["kvpr_requests_running"] == 0 and m["kvpr_http_requests_in_flight"] == 0, m)

        # --- malformed requests: the right 4xx JSON, the daemon stays up
        bad = [
            ("POST", "/v1/completions", "not json", 400), ("POST", "/v1/completions", "[1,2]", 400),
            ("POST", "/v1/completions", "{}", 400), ("POST", "/v1/completions", '{"model":"demo"}', 400),
            ("POST", "/v1/completions", '{"model":"other","prompt":"x"}', 404),
            ("POST", "/v1/completions", '{"model":5,"prompt":"x"}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":5}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":[]}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":""}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":[1,-3]}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":[1,99999999]}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":[[1],"x"]}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":["a",3]}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","max_tokens":-1}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","max_tokens":"5"}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","max_tokens":1.5}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","max_tokens":100000}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","temperature":-1}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","temperature":3}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","temperature":"hot"}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","top_p":0}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","top_p":1.5}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","top_k":-5}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","n":0}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","n":100}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","stop":5}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","stop":[""]}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","stop":["a","b","c","d","e"]}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","stream":"yes"}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","stream_options":{"include_usage":true}}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","logprobs":9}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","echo":1}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","presence_penalty":3}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","frequency_penalty":"a"}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","logit_bias":{"x":1}}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","logit_bias":{"5":200}}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","logit_bias":{"99999999":1}}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","logit_bias":[1]}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","suffix":"end"}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","best_of":3}', 400),
            ("POST", "/v1/chat/completions",
             '{"model":"demo","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}', 400),
            ("POST", "/v1/chat/completions",
             '{"model":"demo","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","seed":"s"}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"x","user":5}', 400),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"' + "word " * 2100 + '"}', 400),
            ("POST", "/v1/chat/completions", '{"model":"demo"}', 400),
            ("POST", "/v1/chat/completions", '{"model":"demo","messages":[]}', 400),
            ("POST", "/v1/chat/completions", '{"model":"demo","messages":"hi"}', 400),
            ("POST", "/v1/chat/completions", '{"model":"demo","messages":[5]}', 400),
            ("POST", "/v1/chat/completions", '{"model":"demo","messages":[{"content":"x"}]}', 400),
            ("POST", "/v1/chat/completions", '{"model":"demo","messages":[{"role":"wizard","content":"x"}]}', 400),
            ("POST", "/v1/chat/completions", '{"model":"demo","messages":[{"role":"user"}]}', 400),
            ("POST", "/v1/chat/completions", '{"model":"demo","messages":[{"role":"user","content":[{"type":"image_url"}]}]}', 400),
            ("POST", "/v1/chat/completions", '{"model":"demo","messages":[{"role":"user","content":"x"}],"logprobs":2}', 400),
            ("POST", "/v1/chat/completions", '{"model":"demo","messages":[{"role":"user","content":"x"}],"top_logprobs":2}', 400),
            ("POST", "/v1/chat/completions",
             '{"model":"demo","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}', 400),
            ("POST", "/v1/chat/completions", '{"model":"nope","messages":[{"role":"user","content":"x"}]}', 404),
            ("POST", "/tokenize", '{"prompt":5}', 400), ("POST", "/tokenize", "nope", 400),
            ("POST", "/detokenize", '{"tokens":"x"}', 400), ("POST", "/detokenize", '{"tokens":[-1]}', 400),
            ("GET", "/v1/nothing", None, 404), ("GET", "/", None, 404), ("GET", "/v1/completions", None, 405),
            ("POST", "/v1/models", "{}", 405), ("DELETE", "/health", None, 405),
            ("POST", "/v1/completions", '{"model":"demo","prompt":"' + "x" * (2 << 20) + '"}', 413),
        ]
        ok = 0
        for method, path, raw, want_status in bad:
            try:
                st, body, _ = d.request(method, path, raw=raw)
            except (ConnectionError, http.client.HTTPException) as e:
                check(f"malformed {method} {path}", False, f"connection error {e}")
                continue
            good = st == want_status and isinstance(body, dict) and set(body.get("error", {})) >= {"message", "type", "param", "code"}
            check(f"malformed {method} {path} {str(raw)[:60]}", good, (st, body if not isinstance(body, str) else body[:200]))
            ok += good
        check("at least 50 malformed requests", len(bad) >= 50, len(bad))
        # Raw garbage on the socket.
        s = socket.create_connection(("127.0.0.1", d.port))
        s.sendall(b"\x00\x01garbage\r\n\r\n")
        reply = s.recv(4096)
        s.close()
        check("garbage gets a 400", reply.startswith(b"HTTP/1.1 400"), reply[:80])
        st, _ = d.get("/health")
        check("daemon up after malformed input", st == 200)

        # --- metrics parse as Prometheus text
        m = metrics(d)
        for k in ["kvpr_requests_running", "kvpr_requests_waiting", "kvpr_prompt_tokens_total", "kvpr_generation_tokens_total",
                  'kvpr_request_success_total{finish_reason="length"}', "kvpr_time_to_first_token_seconds_count",
                  "kvpr_inter_token_latency_seconds_count", "kvpr_e2e_request_latency_seconds_count",
                  'kvpr_worker_batch_size{worker="0"}', 'kvpr_worker_split{worker="1"}', 'kvpr_worker_h2d_gbps{worker="0"}',
                  'kvpr_worker_host_kv_bytes{worker="0"}', 'kvpr_worker_busy_fraction{worker="0"}',
                  'kvpr_worker_graph_replays{worker="0"}']:
            check(f"metric {k}", k in m, sorted(m)[:5])
        check("ttft observed", m["kvpr_time_to_first_token_seconds_count"] > 60)

        # --- kill -9 of a worker mid-stream
        st, h = d.get("/health")
        events, conn = d.stream("/v1/completions", {"model": "demo", "prompt": "Keep going", "max_tokens": 1500,
                                                    "ignore_eos": True, "stream": True}, stop_after=2)
        victims = [w["pid"] for w in d.get("/health")[1]["workers"] if w["in_flight"] > 0]
        check("a worker holds the stream", len(victims) == 1, victims)
        if victims:
            os.kill(victims[0], signal.SIGKILL)
            rest, buf = [], b""
            r = conn.getresponse() if False else None
            sock_events = []
            conn.sock.settimeout(20)
            while True:
                data = conn.sock.recv(65536)
                if not data:
                    break
                buf += data
                if b"data: [DONE]" in buf:
                    break
            text = buf.decode("utf-8", "replace")
            check("stream gets an error event, then ends", '"error"' in text and "data: [DONE]" in text, text[-300:])
            conn.close()
            deadline = time.time() + 30
            restarted = False
            while time.time() < deadline:
                st, h = d.get("/health")
                if st == 200 and h["status"] == "ok" and any(w["restarts"] >= 1 for w in h["workers"]):
                    restarted = True
                    break
                time.sleep(0.2)
            check("worker restarted and health recovers", restarted, h)
            st, body = completion(d, "Hello, my name is", 8)
            check("requests fine after the restart", st == 200 and body["choices"][0]["text"] == ref["text"], body)

        # --- SIGTERM drains in-flight requests, then exits 0
        result = {}

        def slow():
            result["r"] = completion(d, "Drain me", 300, ignore_eos=True)
        t = threading.Thread(target=slow)
        t.start()
        time.sleep(0.3)
        d.proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        try:
            st, body = completion(d, "late", 2)
            check("new requests during drain get 503", st == 503, (st, body))
        except OSError:
            check("new requests during drain are refused", True)
        t.join(60)
        st, body = result.get("r", (None, None))
        check("in-flight request finished during drain", st == 200 and body["usage"]["completion_tokens"] == 300, (st, body))
        code = d.proc.wait(timeout=30)
        check("exit code 0 after drain", code == 0, code)
        d.log.close()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    print(f"daemon: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
