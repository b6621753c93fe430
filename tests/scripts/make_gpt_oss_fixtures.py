#!/usr/bin/env python3
"""Reference fixtures for gpt-oss (model_type gpt_oss), made offline with Debian's python3-torch.

For each tiny configuration this writes a Hugging Face style model directory under
tests/data/gpt_oss/<name>/ (config.json and safetensors weights named as the hub's checkpoints
name them), the input ids, float64 logits for every position and the greedy continuation,
computed by a forward written here in plain torch, independent of kvpr's C++ code and following
transformers' modeling_gpt_oss.py and OpenAI's reference (gpt_oss/torch/model.py):
- RMSNorm as w * (x * rsqrt(mean(x^2) + eps)); no embedding scale; an untied head;
- attention with biases on q, k, v and o, YaRN rope (truncate false: the correction range not
  rounded) with cos and sin times its attention factor, every other layer sliding (even layers,
  key j seen from query i iff i - W < j <= i), and each head's sink logit joining the softmax as
  one more column that is then dropped;
- a router with a bias: the top k logits, softmax over those k;
- experts with biases whose gate and up are interleaved (gate = even output columns, up = odd),
  gate = min(gate, 7), up = clamp(up, -7, 7), out = ((up + 1) * gate * sigmoid(1.702 gate)) @ down
  + down's bias, summed with the router's weights.
The experts are stored as OpenAI ships them, MXFP4 (`*_blocks` U8 [E, out, in/32, 16], the low
nibble first, `*_scales` U8 E8M0 [E, out, in/32], biases BF16), quantized here with a scale per
32 values chosen so the block's largest magnitude fits E2M1's 6, each value rounded to the nearest
E2M1 value; the reference uses the dequantized values (exact). A second fixture stores them
dequantized as transformers saves GptOssExperts ([E, in, out], BF16).

    /usr/bin/python3 tests/scripts/make_gpt_oss_fixtures.py     # rewrites tests/data/gpt_oss

CI never runs this; it only reads the committed outputs.
"""
import json
import math
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_opt_fixtures import write_checkpoint  # noqa: E402
import make_llama_fixtures as llama  # noqa: E402  (rope tables, YaRN)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "gpt_oss")

BASE = dict(model_type="gpt_oss", architectures=["GptOssForCausalLM"], vocab_size=96, hidden_size=32,
            intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            num_local_experts=4, num_experts_per_tok=2, sliding_window=4, max_position_embeddings=64,
            rms_norm_eps=1e-5, rope_theta=150000.0, hidden_act="silu", attention_bias=True, swiglu_limit=7.0,
            tie_word_embeddings=False, torch_dtype="bfloat16", bos_token_id=1, eos_token_id=[2, 3], pad_token_id=0,
            rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                          "original_max_position_embeddings": 16},
            quantization_config={"quant_method": "mxfp4",
                                 "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                            "model.embed_tokens", "lm_head"]})

CASES = [
    # name, config overrides, experts stored as MXFP4 (else dequantized, transformers' layout)
    ("mxfp4_bf16", {}, True),
    ("dequantized_bf16", dict(quantization_config=None, layer_types=["sliding_attention", "full_attention",
                                                                     "full_attention"]), False),
]

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def quantize_mxfp4(w):
    """w [R, C] (C a multiple of 32) -> blocks U8 [R, C/32, 16], scales U8 [R, C/32], and the
    dequantized values: per 32 values the smallest power of two 2^e with max|w| / 2^e <= 6, each
    value the nearest E2M1 value times 2^e (code: bit 3 the sign)."""
    R, C = w.shape
    G = C // 32
    blocks = np.zeros((R, G, 16), np.uint8)
    scales = np.zeros((R, G), np.uint8)
    deq = np.zeros((R, C))
    for r in range(R):
        for g in range(G):
            v = w[r, 32 * g: 32 * g + 32]
            amax = float(np.abs(v).max())
            e = math.ceil(math.log2(amax / 6.0)) if amax > 0 else -126
            unit = 2.0 ** e
            codes = []
            for x in v:
                mag = min(range(8), key=lambda i: abs(abs(x) / unit - E2M1[i]))
                code = mag | (8 if x < 0 and mag else 0)
                codes.append(code)
            for j, code in enumerate(codes):
                deq[r, 32 * g + j] = (-1 if code & 8 else 1) * E2M1[code & 7] * unit
            for b in range(16):
                blocks[r, g, b] = codes[2 * b] | (codes[2 * b + 1] << 4)  # low nibble: the even index
            scales[r, g] = e + 127
    return blocks, scales, deq


def make_weights(cfg, gen, mxfp4):
    """(checkpoint tensors, float64 weights for the reference: experts in transformers' [E, in, out])."""
    h, f, v, hd, E = (cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"],
                      cfg["num_local_experts"])
    qw, kvw = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def rnd(*shape, std=1.0, mean=0.0):  # bf16 values, kept in float64 for the reference
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * std + mean).to(torch.bfloat16)

    ck, ref = {}, {}

    def put(name, t):
        ck[name] = t
        ref[name] = t.to(torch.float64)

    put("model.embed_tokens.weight", rnd(v, h, std=0.5))
    put("model.norm.weight", rnd(h, std=0.1, mean=1.0))
    put("lm_head.weight", rnd(v, h, std=0.5))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        put(p + "input_layernorm.weight", rnd(h, std=0.1, mean=1.0))
        put(p + "post_attention_layernorm.weight", rnd(h, std=0.1, mean=1.0))
        for proj, rows, cols in (("q_proj", qw, h), ("k_proj", kvw, h), ("v_proj", kvw, h), ("o_proj", h, qw)):
            put(p + f"self_attn.{proj}.weight", rnd(rows, cols, std=1.5 * cols ** -0.5))
            put(p + f"self_attn.{proj}.bias", rnd(rows, std=0.2))
        put(p + "self_attn.sinks", rnd(cfg["num_attention_heads"], std=1.0))  # comparable to the scores
        put(p + "mlp.router.weight", rnd(E, h, std=2 * h ** -0.5))
        put(p + "mlp.router.bias", rnd(E, std=0.5))
        # Experts as [E, out, in] (a Linear's layout, MXFP4's), gate and up interleaved by output row.
        # Large enough that the clamps at +-7 bind for some values.
        gate_up = torch.randn(E, 2 * f, h, generator=gen, dtype=torch.float64) * 3 * h ** -0.5 * 4
        down = torch.randn(E, h, f, generator=gen, dtype=torch.float64) * f ** -0.5
        put(p + "mlp.experts.gate_up_proj_bias", rnd(E, 2 * f, std=0.5))
        put(p + "mlp.experts.down_proj_bias", rnd(E, h, std=0.2))
        x = p + "mlp.experts."
        if mxfp4:
            for name, w in (("gate_up_proj", gate_up), ("down_proj", down)):
                parts = [quantize_mxfp4(w[e].numpy()) for e in range(E)]
                ck[x + name + "_blocks"] = torch.from_numpy(np.stack([b for b, _, _ in parts]))
                ck[x + name + "_scales"] = torch.from_numpy(np.stack([s for _, s, _ in parts]))
                ref[x + name] = torch.from_numpy(np.stack([d for _, _, d in parts])).transpose(1, 2).contiguous()
        else:  # transformers' GptOssExperts parameters: [E, in, out], BF16
            for name, w in (("gate_up_proj", gate_up), ("down_proj", down)):
                t = w.transpose(1, 2).contiguous().to(torch.bfloat16)
                ck[x + name] = t
                ref[x + name] = t.to(torch.float64)
    return ck, ref


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps))


def is_sliding(cfg, i):
    if cfg.get("layer_types"):
        return cfg["layer_types"][i] == "sliding_attention"
    return (i + 1) % 2 != 0


def experts(cfg, W, p, a):
    """GptOssMLP on rows a [T, h]."""
    k, limit, alpha = cfg["num_experts_per_tok"], 7.0, 1.702
    logits = a @ W[p + "mlp.router.weight"].T + W[p + "mlp.router.bias"]
    vals, idx = torch.topk(logits, k, dim=-1)
    weights = torch.softmax(vals, dim=-1)
    out = torch.zeros_like(a)
    x = p + "mlp.experts."
    for t in range(a.shape[0]):
        for j in range(k):
            e = int(idx[t, j])
            gu = a[t] @ W[x + "gate_up_proj"][e] + W[x + "gate_up_proj_bias"][e]
            gate, up = gu[0::2].clamp(max=limit), gu[1::2].clamp(-limit, limit)
            glu = gate * torch.sigmoid(gate * alpha)
            y = ((up + 1) * glu) @ W[x + "down_proj"][e] + W[x + "down_proj_bias"][e]
            out[t] += weights[t, j] * y
    return out


def reference_logits(cfg, W, ids):
    h, nh, nkv, hd, eps = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                           cfg["head_dim"], cfg["rms_norm_eps"])
    T = len(ids)
    x = W["model.embed_tokens.weight"][torch.tensor(ids)]
    cos, sin = llama.rope_cos_sin(cfg, T, hd)
    causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    i_idx, j_idx = torch.arange(T)[:, None], torch.arange(T)[None, :]
    window = torch.where(i_idx - cfg["sliding_window"] < j_idx, 0.0, float("-inf")).to(torch.float64)

    def lin(t, name):
        return t @ W[name + ".weight"].T + W[name + ".bias"]

    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = lin(a, p + "self_attn.q_proj").view(T, nh, hd).transpose(0, 1)
        k, v = (lin(a, p + "self_attn." + n).view(T, nkv, hd).transpose(0, 1) for n in ("k_proj", "v_proj"))
        q = q * cos + llama.rotate_half(q) * sin
        k = k * cos + llama.rotate_half(k) * sin
        k, v = (t.repeat_interleave(nh // nkv, dim=0) for t in (k, v))
        s = q @ k.transpose(1, 2) * hd ** -0.5 + causal + (window if is_sliding(cfg, i) else 0.0)
        sinks = W[p + "self_attn.sinks"].view(nh, 1, 1).expand(nh, T, 1)
        probs = torch.softmax(torch.cat([s, sinks], dim=-1), dim=-1)[..., :-1]  # the sink's column dropped
        att = probs @ v
        x = x + lin(att.transpose(0, 1).reshape(T, nh * hd), p + "self_attn.o_proj")
        x = x + experts(cfg, W, p, rms_norm(x, W[p + "post_attention_layernorm.weight"], eps))
    x = rms_norm(x, W["model.norm.weight"], eps)
    return x @ W["lm_head.weight"].T


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    for n, (name, over, mxfp4) in enumerate(CASES):
        cfg = {k: v for k, v in dict(BASE, **over).items() if v is not None}
        gen = torch.Generator().manual_seed(6000 + n)
        ck, ref = make_weights(cfg, gen, mxfp4)
        d = os.path.join(OUT, name)
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        write_checkpoint(d, ck, "safetensors", 2)
        ids = torch.randint(3, cfg["vocab_size"], (13,), generator=gen).tolist()
        llama.save_case(d, ids, lambda seq: reference_logits(cfg, ref, seq))
        print(f"{name}: {'MXFP4 experts' if mxfp4 else 'dequantized experts'}")
    print("torch", torch.__version__, file=sys.stderr)


if __name__ == "__main__":
    main()
