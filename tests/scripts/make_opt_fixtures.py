#!/usr/bin/env python3
"""Reference fixtures for the OPT forward pass, made offline with Debian's python3-torch.

For each tiny configuration this writes a Hugging Face style model directory under
tests/data/opt/<name>/ (config.json and weights in the format under test), the input ids,
and float64 logits for every position computed by an OPT forward written here in plain
torch (independent of kvpr's C++ code, following transformers' modeling_opt.py), plus the
greedy continuation of the reference.

    python3 tests/scripts/make_opt_fixtures.py            # rewrites tests/data/opt

CI never runs this; it only reads the committed outputs.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "opt")

BASE = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
            max_position_embeddings=64, word_embed_proj_dim=32, do_layer_norm_before=True,
            _remove_final_layer_norm=False, activation_function="relu", enable_bias=True,
            layer_norm_elementwise_affine=True, bos_token_id=2, eos_token_id=2, pad_token_id=1,
            model_type="opt", architectures=["OPTForCausalLM"])

CASES = [
    # name, config overrides, storage dtype, key prefix, lm_head stored?, format, shards
    ("pre_ln_safetensors", {}, torch.float32, "model.decoder.", "separate", "safetensors", 1),
    ("post_ln_proj_sharded", dict(do_layer_norm_before=False, word_embed_proj_dim=16),
     torch.float32, "model.decoder.", "separate", "safetensors", 2),
    ("decoder_prefix_bin", {}, torch.float32, "decoder.", "absent", "bin", 1),
    ("fp16_bin_sharded", dict(torch_dtype="float16"), torch.float16, "model.decoder.", "shared", "bin", 3),
    ("bf16_safetensors", dict(torch_dtype="bfloat16", num_hidden_layers=3), torch.bfloat16,
     "model.decoder.", "absent", "safetensors", 1),
]

ST_DTYPE = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.uint8: "U8"}


def make_weights(cfg, dtype, gen):
    h, d, f, v = cfg["hidden_size"], cfg["word_embed_proj_dim"], cfg["ffn_dim"], cfg["vocab_size"]
    w = {}

    def rnd(*shape, std=1.0, mean=0.0):
        t = torch.randn(*shape, generator=gen, dtype=torch.float64) * std + mean
        return t.to(dtype)

    w["embed_tokens.weight"] = rnd(v, d, std=0.5)
    w["embed_positions.weight"] = rnd(cfg["max_position_embeddings"] + 2, h, std=0.3)
    if d != h:
        w["project_in.weight"] = rnd(h, d, std=d ** -0.5)
        w["project_out.weight"] = rnd(d, h, std=h ** -0.5)
    if cfg["do_layer_norm_before"] and not cfg["_remove_final_layer_norm"]:
        w["final_layer_norm.weight"] = rnd(h, std=0.1, mean=1.0)
        w["final_layer_norm.bias"] = rnd(h, std=0.1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        for ln in ("self_attn_layer_norm", "final_layer_norm"):
            w[p + ln + ".weight"] = rnd(h, std=0.1, mean=1.0)
            w[p + ln + ".bias"] = rnd(h, std=0.1)
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            w[p + "self_attn." + proj + ".weight"] = rnd(h, h, std=h ** -0.5)
            w[p + "self_attn." + proj + ".bias"] = rnd(h, std=0.1)
        w[p + "fc1.weight"] = rnd(f, h, std=h ** -0.5)
        w[p + "fc1.bias"] = rnd(f, std=0.1)
        w[p + "fc2.weight"] = rnd(h, f, std=f ** -0.5)
        w[p + "fc2.bias"] = rnd(h, std=0.1)
    return w


def layer_norm(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * g + b


def reference_logits(cfg, w, lm_head, ids):
    """OPT forward in float64 for one sequence; returns logits [T, vocab]."""
    W = {k: t.to(torch.float64) for k, t in w.items()}
    lm = lm_head.to(torch.float64)
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    hd = h // nh
    pre = cfg["do_layer_norm_before"]
    T = len(ids)
    ids_t = torch.tensor(ids)
    x = W["embed_tokens.weight"][ids_t]
    if "project_in.weight" in W:
        x = x @ W["project_in.weight"].T
    x = x + W["embed_positions.weight"][torch.arange(T) + 2]
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        lin = lambda t, name: t @ W[p + name + ".weight"].T + W[p + name + ".bias"]
        res = x
        a = layer_norm(x, W[p + "self_attn_layer_norm.weight"], W[p + "self_attn_layer_norm.bias"]) if pre else x
        q = lin(a, "self_attn.q_proj") * hd ** -0.5
        k = lin(a, "self_attn.k_proj")
        v = lin(a, "self_attn.v_proj")
        q, k, v = (t.view(T, nh, hd).transpose(0, 1) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(1, 2) + mask, dim=-1) @ v
        att = att.transpose(0, 1).reshape(T, h)
        x = res + lin(att, "self_attn.out_proj")
        if not pre:
            x = layer_norm(x, W[p + "self_attn_layer_norm.weight"], W[p + "self_attn_layer_norm.bias"])
        res = x
        a = layer_norm(x, W[p + "final_layer_norm.weight"], W[p + "final_layer_norm.bias"]) if pre else x
        f = torch.relu(lin(a, "fc1"))
        x = res + lin(f, "fc2")
        if not pre:
            x = layer_norm(x, W[p + "final_layer_norm.weight"], W[p + "final_layer_norm.bias"])
    if "final_layer_norm.weight" in W:
        x = layer_norm(x, W["final_layer_norm.weight"], W["final_layer_norm.bias"])
    if "project_out.weight" in W:
        x = x @ W["project_out.weight"].T
    return x @ lm.T


def raw_bytes(t):
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().tobytes()
    return t.contiguous().numpy().tobytes()


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = raw_bytes(t)
        header[name] = {"dtype": ST_DTYPE[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def write_checkpoint(d, state, fmt, shards):
    names = list(state.keys())
    if shards == 1:
        if fmt == "safetensors":
            write_safetensors(os.path.join(d, "model.safetensors"), state)
        else:
            torch.save(state, os.path.join(d, "pytorch_model.bin"))
        return
    ext = "safetensors" if fmt == "safetensors" else "bin"
    stem = "model" if fmt == "safetensors" else "pytorch_model"
    weight_map = {}
    for s in range(shards):
        part = {n: state[n] for j, n in enumerate(names) if j % shards == s}
        fname = f"{stem}-{s + 1:05d}-of-{shards:05d}.{ext}"
        if fmt == "safetensors":
            write_safetensors(os.path.join(d, fname), part)
        else:
            torch.save(part, os.path.join(d, fname))
        weight_map.update({n: fname for n in part})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
             "weight_map": weight_map}
    with open(os.path.join(d, f"{stem}.{ext}.index.json"), "w") as f:
        json.dump(index, f, indent=1)


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    for n, (name, over, dtype, prefix, lm_mode, fmt, shards) in enumerate(CASES):
        cfg = dict(BASE, **over)
        cfg.setdefault("torch_dtype", "float32")
        gen = torch.Generator().manual_seed(1000 + n)
        w = make_weights(cfg, dtype, gen)
        if lm_mode == "separate":
            lm_head = (torch.randn(cfg["vocab_size"], cfg["word_embed_proj_dim"], generator=gen,
                                   dtype=torch.float64) * 0.5).to(dtype)
        else:
            lm_head = w["embed_tokens.weight"]
        state = {prefix + k: t for k, t in w.items()}
        if lm_mode == "separate":
            state["lm_head.weight"] = lm_head
        elif lm_mode == "shared":
            state["lm_head.weight"] = state[prefix + "embed_tokens.weight"]  # same storage
        d = os.path.join(OUT, name)
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        write_checkpoint(d, state, fmt, shards)
        ids = torch.randint(3, cfg["vocab_size"], (13,), generator=gen).tolist()
        logits = reference_logits(cfg, w, lm_head, ids)
        np.save(os.path.join(d, "input_ids.npy"), np.array(ids, dtype=np.int64))
        np.save(os.path.join(d, "logits.npy"), logits.numpy())
        # Greedy continuation by the reference: 8 tokens after the first 5 ids.
        seq = ids[:5]
        for _ in range(8):
            seq.append(int(reference_logits(cfg, w, lm_head, seq)[-1].argmax()))
        np.save(os.path.join(d, "greedy.npy"), np.array(seq[5:], dtype=np.int64))
        print(f"{name}: {fmt} x{shards}, {ST_DTYPE[dtype]}, prefix {prefix!r}, lm_head {lm_mode}")
    print("torch", torch.__version__, file=sys.stderr)


if __name__ == "__main__":
    main()
