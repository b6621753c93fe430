#!/usr/bin/env python3
"""Quantized checkpoints as the hub publishes them, and float64 references, made offline.

Each case is a tiny Llama-family model (make_llama_fixtures.py's random weights) whose Linear
layers this script quantizes the way the quantizers do (round to nearest, per group or block, as
AutoGPTQ, AutoAWQ, llm-compressor and DeepSeek's fp8 conversion compute scales and zeros), then
writes in the method's own layout: config.json's quantization_config and each module's tensors,
packed as those tools pack them (written here, not taken from them). The reference logits are
make_llama_fixtures.py's float64 forward on the weights this script dequantizes from the codes it
wrote (scale times code minus zero, in float64): kvpr's dequantization must give them back.
Embeddings, norms, the LM head and MoE routers stay unquantized, as the methods leave them.

    /usr/bin/python3 tests/scripts/make_quantized_fixtures.py   # rewrites tests/data/quantized

CI never runs this; it only reads the committed outputs.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_llama_fixtures import BASE, make_weights, reference_logits, save_case  # noqa: E402
from make_opt_fixtures import BASE as OPT_BASE  # noqa: E402
from make_opt_fixtures import make_weights as opt_make_weights  # noqa: E402
from make_opt_fixtures import reference_logits as opt_reference_logits  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "quantized")

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
           "out_proj", "fc1", "fc2")  # (the last three: OPT's)

# Hidden 64, intermediate 96: inputs of 64 and 96, groups of 32 (2 and 3 per row). Mixtral's
# experts (w1, w2, w3) are quantized too; its router (block_sparse_moe.gate) is not.
SMALL = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
CASES = [
    # name, config overrides, method, options
    ("gptq_int4_g32_sym", {}, "gptq", dict(bits=4, group=32, sym=True, desc_act=False, fmt="gptq")),
    # desc_act: groups follow a permutation of the inputs (g_idx), and asymmetric zeros.
    ("gptq_int4_g32_asym_desc_act", {}, "gptq", dict(bits=4, group=32, sym=False, desc_act=True, fmt="gptq")),
    # 8 bits, one group per row (group_size -1), zeros as they are (checkpoint_format gptq_v2).
    ("gptq_int8_channel_v2", {}, "gptq", dict(bits=8, group=-1, sym=False, desc_act=False, fmt="gptq_v2")),
    ("awq_int4_g32", {}, "awq", dict(group=32)),
    # DeepSeek-V3 / Qwen3-FP8: blocks of 32 x 32 here (128 x 128 there); 96 rows and inputs leave
    # none partial, 80 would: the MLP's 96 x 64 and 64 x 96 are whole, q/k/v's 32-row ones too.
    ("fp8_block32_bf16", dict(torch_dtype="bfloat16"), "fp8", dict(block=(32, 32))),
    ("fp8_block_partial", dict(intermediate_size=80, torch_dtype="bfloat16"), "fp8", dict(block=(32, 32))),
    # RedHatAI FP8-dynamic: one scale per output channel, BF16.
    ("ct_fp8_channel", dict(torch_dtype="bfloat16"), "ct_fp8", dict()),
    # RedHatAI W4A16: int4, groups of 32, symmetric.
    ("ct_w4a16_g32", dict(torch_dtype="bfloat16"), "ct_int", dict(bits=4, group=32, sym=True)),
    # Asymmetric int4 with actorder "group" (weight_g_idx) and zero points packed along the rows;
    # and int8 per channel.
    ("ct_w4a16_asym_actorder", dict(torch_dtype="bfloat16"), "ct_int", dict(bits=4, group=32, sym=False, actorder=True)),
    ("ct_w8a16_channel", {}, "ct_int", dict(bits=8, group=-1, sym=True)),
    # RedHatAI W8A8 (int-quantized): I8 codes, a scale per channel, dynamic int8 activations
    # (which kvpr does not apply: weight-only); and int4 asymmetric with the int8 zero points
    # compressed-tensors wrote before 0.9.4.
    ("ct_w8a8_int8_channel", dict(torch_dtype="bfloat16"), "ct_int", dict(bits=8, group=-1, sym=True, i8=True)),
    ("ct_w4a16_asym_int8_zp", {}, "ct_int", dict(bits=4, group=32, sym=False, zp_i8=True)),
    # Mixtral (MoE) in GPTQ: every expert quantized, the router kept.
    ("gptq_mixtral_int4_g32",
     dict(model_type="mixtral", architectures=["MixtralForCausalLM"], num_local_experts=4, num_experts_per_tok=2),
     "gptq", dict(bits=4, group=32, sym=True, desc_act=False, fmt="gptq")),
    # GPTQModel's and AutoRound's lm_head=True: the head quantized too (the embedding stays).
    ("gptq_int4_g32_lm_head", {}, "gptq", dict(bits=4, group=32, sym=True, desc_act=False, fmt="gptq", lm_head=True)),
]


def quantized_name(name):
    """Whether a checkpoint weight is one the methods quantize: a decoder layer's Linear."""
    if ".layers." not in name or not name.endswith(".weight"):
        return False
    module = name[: -len(".weight")].split(".")[-1]
    return module in LINEARS or module in ("w1", "w2", "w3")


# --- fp8 e4m3 (e4m3fn), written here: round to the nearest of its 127 finite magnitudes, ties to
# the even code; python3-torch on Debian 12 has no float8.
def e4m3_value(code):
    e, m = (code >> 3) & 15, code & 7
    if e == 0:
        return m / 512.0
    return (1 + m / 8.0) * 2.0 ** (e - 7)


E4M3 = np.array([e4m3_value(c) for c in range(127)])  # codes 0..126 (127 is NaN)


def to_e4m3(x):
    a = np.abs(x)
    hi = np.clip(np.searchsorted(E4M3, a), 1, 126)
    lo = hi - 1
    d_lo, d_hi = a - E4M3[lo], E4M3[hi] - a
    code = np.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo)
    code = np.where(a >= E4M3[126], 126, code)
    return (code | np.where(x < 0, 128, 0)).astype(np.uint8)


def from_e4m3(codes):
    mag = E4M3[np.minimum(codes & 127, 126)]
    return np.where(codes & 128, -mag, mag)


# --- integer quantization per group of inputs (round to nearest, min/max, as GPTQ's and AWQ's
# quantizers set scale and zero), scales kept in the checkpoint's float dtype.
def int_quantize(w, bits, groups, sym, scale_dtype):
    """w [N, K] float64, groups [K] (group of each input). Returns codes [N, K] in [0, 2^bits),
    scales [G, N] and zeros [G, N] (ints), with w ~ scale * (code - zero)."""
    maxq = 2 ** bits - 1
    G = int(groups.max()) + 1
    scales = np.zeros((G, w.shape[0]))
    zeros = np.zeros((G, w.shape[0]), dtype=np.int64)
    codes = np.zeros(w.shape, dtype=np.int64)
    for g in range(G):
        cols = np.nonzero(groups == g)[0]
        x = w[:, cols]
        xmin, xmax = np.minimum(x.min(1), 0), np.maximum(x.max(1), 0)
        if sym:
            xmax = np.maximum(-xmin, xmax)
            xmin = -xmax
        s = (xmax - xmin) / maxq
        s = np.where(s == 0, 1.0, s)
        s = torch.tensor(s).to(scale_dtype).double().numpy()  # as stored
        z = np.full(w.shape[0], (maxq + 1) // 2) if sym else np.round(-xmin / s).astype(np.int64)
        z = np.clip(z, 1, maxq)  # (v1's stored zero - 1 cannot be negative)
        codes[:, cols] = np.clip(np.round(x / s[:, None]) + z[:, None], 0, maxq)
        scales[g], zeros[g] = s, z
    return codes, scales, zeros


def pack(values, bits, axis, order=None):
    """32/bits unsigned values a little-endian int32 word along `axis`, value j at bits [bits*j, ...);
    `order`: value i of a word is element order[i] of its run (AWQ's interleave)."""
    v = np.moveaxis(values.astype(np.uint64), axis, -1)
    per = 32 // bits
    assert v.shape[-1] % per == 0
    v = v.reshape(v.shape[:-1] + (v.shape[-1] // per, per))
    if order is not None:
        v = v[..., order]
    words = np.zeros(v.shape[:-1], dtype=np.uint64)
    for j in range(per):
        words |= (v[..., j] & (2 ** bits - 1)) << np.uint64(bits * j)
    return np.moveaxis(words.astype(np.uint32).view(np.int32), -1, axis)


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def st_bytes(a):
    if isinstance(a, torch.Tensor):
        if a.dtype == torch.bfloat16:
            return "BF16", a.view(torch.int16).numpy().tobytes()
        return {torch.float32: "F32", torch.float16: "F16"}[a.dtype], a.numpy().tobytes()
    return {np.dtype(np.int32): "I32", np.dtype(np.int64): "I64", np.dtype(np.uint8): "F8_E4M3", np.dtype(np.int8): "I8",
            np.dtype(np.float32): "F32"}[a.dtype], np.ascontiguousarray(a).tobytes()


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        dt, b = st_bytes(a)
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def quantize_module(method, opt, w, dtype, gen):
    """One Linear weight w [N, K] (float64): its checkpoint tensors (module-relative names) and its
    dequantized float64 value."""
    N, K = w.shape
    if method == "gptq" or method == "awq":
        bits = opt.get("bits", 4)
        group = opt["group"] if opt["group"] > 0 else K
        if opt.get("desc_act"):  # act order: groups of consecutive inputs in a permuted order
            perm = torch.randperm(K, generator=gen).numpy()
            groups = np.empty(K, dtype=np.int64)
            groups[perm] = np.arange(K) // group
        else:
            groups = np.arange(K) // group
        codes, scales, zeros = int_quantize(w, bits, groups, opt.get("sym", False), torch.float16)
        deq = scales[groups].T * (codes - zeros[groups].T)
        sc = torch.tensor(scales).to(torch.float16)
        if method == "gptq":
            stored_z = zeros - 1 if opt["fmt"] == "gptq" else zeros
            t = {"qweight": pack(codes.T, bits, 0), "qzeros": pack(stored_z & (2 ** bits - 1), bits, 1), "scales": sc,
                 "g_idx": groups.astype(np.int32)}
        else:
            t = {"qweight": pack(codes.T, 4, 1, AWQ_ORDER), "qzeros": pack(zeros, 4, 1, AWQ_ORDER), "scales": sc}
        return t, deq
    if method == "fp8":  # weight_scale_inv: amax / 448 per block, F32
        bn, bk = opt["block"]
        s = np.zeros(((N + bn - 1) // bn, (K + bk - 1) // bk))
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                s[i, j] = np.abs(w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk]).max() / 448.0
        s = s.astype(np.float32).astype(np.float64)
        full = np.repeat(np.repeat(s, bn, 0), bk, 1)[:N, :K]
        codes = to_e4m3(w / full)
        return {"weight": codes, "weight_scale_inv": s.astype(np.float32)}, from_e4m3(codes) * full
    if method == "ct_fp8":  # one scale per output channel, BF16
        s = torch.tensor(np.abs(w).max(1, keepdims=True) / 448.0).to(torch.bfloat16)
        sd = s.double().numpy()
        codes = to_e4m3(w / sd)
        return {"weight": codes, "weight_scale": s}, from_e4m3(codes) * sd
    if method == "ct_int":  # llm-compressor: signed codes and zero points, stored plus 2^(bits-1)
        bits = opt["bits"]
        group = opt["group"] if opt["group"] > 0 else K
        qmin, qmax = -2 ** (bits - 1), 2 ** (bits - 1) - 1
        G = K // group
        if opt.get("actorder"):  # groups of a permutation of the inputs, saved as weight_g_idx
            perm = torch.randperm(K, generator=gen).numpy()
            groups = np.empty(K, dtype=np.int64)
            groups[perm] = np.arange(K) // group
        else:
            groups = np.arange(K) // group
        s, zp = np.zeros((N, G)), np.zeros((N, G), dtype=np.int64)
        for g in range(G):
            x = w[:, groups == g]
            if opt["sym"]:
                s[:, g] = np.abs(x).max(1) / ((qmax - qmin) / 2)
            else:
                lo, hi = np.minimum(x.min(1), 0), np.maximum(x.max(1), 0)
                s[:, g] = (hi - lo) / (qmax - qmin)
        st = torch.tensor(s).to(torch.bfloat16 if dtype == torch.bfloat16 else torch.float32)
        s = st.double().numpy()
        if not opt["sym"]:
            for g in range(G):
                lo = np.minimum(w[:, groups == g].min(1), 0)
                zp[:, g] = np.clip(np.round(qmin - lo / s[:, g]), qmin, qmax)
        q = np.clip(np.round(w / s[:, groups]) + zp[:, groups], qmin, qmax).astype(np.int64)
        if opt.get("i8"):
            t = {"weight": q.astype(np.int8), "weight_scale": st}
        else:
            t = {"weight_packed": pack(q - qmin, bits, 1), "weight_scale": st,
                 "weight_shape": np.array([N, K], dtype=np.int64)}
        if not opt["sym"]:
            t["weight_zero_point"] = zp.astype(np.int8) if opt.get("zp_i8") else pack(zp - qmin, bits, 0)
        if opt.get("actorder"):
            t["weight_g_idx"] = groups.astype(np.int32)
        return t, s[:, groups] * (q - zp[:, groups])
    raise ValueError(method)


def quantization_config(method, opt):
    if method == "gptq":
        c = {"quant_method": "gptq", "bits": opt["bits"], "group_size": opt["group"], "desc_act": opt["desc_act"],
             "sym": opt["sym"], "true_sequential": True, "checkpoint_format": opt["fmt"]}
        if opt.get("lm_head"):
            c["lm_head"] = True
        return c
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": opt["group"], "zero_point": True, "version": "gemm",
                "modules_to_not_convert": None}
    if method == "fp8":
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                "weight_block_size": list(opt["block"])}
    if method == "ct_fp8":
        return {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                    "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
                    "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                          "dynamic": True}}}}
    if method == "ct_int":
        weights = {"num_bits": opt["bits"], "type": "int", "symmetric": opt["sym"], "dynamic": False,
                   "strategy": "group" if opt["group"] > 0 else "channel",
                   "group_size": opt["group"] if opt["group"] > 0 else None,
                   "actorder": "group" if opt.get("actorder") else None}
        acts = {"num_bits": 8, "type": "int", "strategy": "token", "symmetric": True, "dynamic": True} if opt.get("i8") \
            else None
        return {"quant_method": "compressed-tensors", "format": "int-quantized" if opt.get("i8") else "pack-quantized",
                "ignore": ["lm_head"],
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}}}
    raise ValueError(method)


# OPT (make_opt_fixtures.py's random weights and float64 forward): a layer's q/k/v/out_proj, fc1
# and fc2 quantized, as AutoGPTQ's and llm-compressor's OPT recipes do; embeddings, the
# project_in/out projections, layer norms, biases and the tied head stay as stored.
OPT_CASES = [
    # name, config overrides, method, options
    ("opt_gptq_int4_g32_sym", {}, "gptq", dict(bits=4, group=32, sym=True, desc_act=False, fmt="gptq")),
    # act order (q, k and v in orders of their own), asymmetric, post-LN, a 16-wide embedding
    ("opt_gptq_int4_g16_asym_desc_act", dict(do_layer_norm_before=False, word_embed_proj_dim=16), "gptq",
     dict(bits=4, group=16, sym=False, desc_act=True, fmt="gptq")),
    ("opt_ct_fp8_channel_bf16", dict(torch_dtype="bfloat16"), "ct_fp8", dict()),
]


def write_case(name, cfg, method, opt, seed, make, forward, prefix=""):
    """One fixture: `make`'s float64 weights, its Linear layers quantized (and with opt lm_head the
    head), written under `prefix`; the reference `forward(cfg, ref, seq)` on what was stored,
    dequantized (float64)."""
    cfg.setdefault("torch_dtype", "float32")
    cfg["quantization_config"] = quantization_config(method, opt)
    gen = torch.Generator().manual_seed(seed)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg["torch_dtype"]]
    w = make(cfg, torch.float64, gen)
    stored, ref = {}, {}
    for key, t in w.items():
        if quantized_name("." + key) or (opt.get("lm_head") and key == "lm_head.weight"):
            parts, deq = quantize_module(method, opt, t.numpy(), dtype, gen)
            module = prefix + key[: -len(".weight")]
            for part, a in parts.items():
                stored[module + "." + part] = a
            ref[key] = torch.tensor(deq)
        else:
            stored[prefix + key] = t.to(dtype)
            ref[key] = t.to(dtype).double()  # the reference reads what is stored
    d = os.path.join(OUT, name)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    write_safetensors(os.path.join(d, "model.safetensors"), stored)
    ids = torch.randint(3, cfg["vocab_size"], (13,), generator=gen).tolist()
    save_case(d, ids, lambda seq: forward(cfg, ref, seq))
    print(f"{name}: {method} {opt}")


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    for n, (name, over, method, opt) in enumerate(CASES):
        cfg = {k: v for k, v in dict(dict(BASE, **SMALL), **over).items() if v is not None}
        write_case(name, cfg, method, opt, 7000 + n, make_weights, reference_logits)
    for n, (name, over, method, opt) in enumerate(OPT_CASES):
        cfg = dict(dict(OPT_BASE, num_hidden_layers=2), **over)
        write_case(name, cfg, method, opt, 7500 + n, opt_make_weights,
                   lambda c, ref, seq: opt_reference_logits(c, ref, ref["embed_tokens.weight"], seq),  # tied head
                   prefix="model.decoder.")
    print("torch", torch.__version__, file=sys.stderr)


if __name__ == "__main__":
    main()
