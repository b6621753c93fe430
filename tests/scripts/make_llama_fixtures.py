#!/usr/bin/env python3
"""Reference fixtures for the Llama forward pass, made offline with Debian's python3-torch.

For each tiny configuration this writes a Hugging Face style model directory under
tests/data/llama/<name>/ (config.json and weights in the format under test), the input ids,
and float64 logits for every position computed by a Llama forward written here in plain
torch (independent of kvpr's C++ code, following transformers' modeling_llama.py: RMSNorm,
rotary embeddings with rotate_half and fp32 frequencies, SwiGLU), plus the greedy
continuation of the reference.

    /usr/bin/python3 tests/scripts/make_llama_fixtures.py     # rewrites tests/data/llama

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
from make_opt_fixtures import ST_DTYPE, write_checkpoint  # noqa: E402  (the checkpoint writers)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "llama")

BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
            hidden_act="silu", tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
            bos_token_id=1, eos_token_id=2, model_type="llama", architectures=["LlamaForCausalLM"])

CASES = [
    # name, config overrides, storage dtype, format, shards
    ("f32_safetensors", {}, torch.float32, "safetensors", 1),
    # bf16, tied head (no lm_head.weight), biases on the attention projections, a large theta
    # with linear rope scaling, head_dim 16, three layers, two shards.
    ("bf16_tied_scaled_sharded",
     dict(torch_dtype="bfloat16", hidden_size=64, intermediate_size=96, num_hidden_layers=3, tie_word_embeddings=True,
          attention_bias=True, rope_theta=500000.0, rope_scaling={"type": "linear", "factor": 2.0}),
     torch.bfloat16, "safetensors", 2),
    # fp16 PyTorch .bin, MLP biases, transformers 5's rope_parameters, eos as a list.
    ("f16_bin_rope_parameters",
     dict(torch_dtype="float16", mlp_bias=True, eos_token_id=[2, 5],
          rope_parameters={"rope_theta": 20000.0, "rope_type": "default"}),
     torch.float16, "bin", 1),
    # Grouped-query attention: 4 query heads sharing 2 KV heads (as Llama-2-70B shares 8 among 64).
    ("gqa_f32_safetensors", dict(num_key_value_heads=2), torch.float32, "safetensors", 1),
    # Multi-query attention, fp16 .bin in two shards, attention biases (K/V biases of one head).
    ("mqa_f16_bin_sharded",
     dict(torch_dtype="float16", hidden_size=64, num_attention_heads=8, num_key_value_heads=1, attention_bias=True),
     torch.float16, "bin", 2),
    # Llama-3.1/3.2 style: llama3 rope scaling, grouped-query attention, bf16, tied head. The
    # original context (256, with head_dim 8) puts the first positions' rotations in all
    # three of its bands (kept, blended, divided by the factor) and the logits show it.
    ("llama3_rope_gqa_bf16",
     dict(torch_dtype="bfloat16", num_key_value_heads=2, tie_word_embeddings=True, rope_theta=500000.0,
          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 256}),
     torch.bfloat16, "safetensors", 1),
    # Mistral: Llama's architecture under model_type mistral, grouped-query attention, and a
    # sliding window of 5 keys on every layer, shorter than the 13 tokens.
    ("mistral_sliding_window",
     dict(model_type="mistral", architectures=["MistralForCausalLM"], num_key_value_heads=2, sliding_window=5),
     torch.float32, "safetensors", 1),
    # Qwen2 (Qwen2.5): biases on q/k/v and none on o_proj (no config field says so), a tied
    # head, theta 1e6, grouped-query attention, bf16; and a sliding_window of 4 with
    # use_sliding_window false, as Qwen2.5's configs ship it: full attention, which 13 tokens show.
    ("qwen2_qkv_bias_tied_bf16",
     dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], torch_dtype="bfloat16", num_key_value_heads=2,
          tie_word_embeddings=True, rope_theta=1000000.0, sliding_window=4, use_sliding_window=False,
          max_window_layers=2, attention_bias=None),
     torch.bfloat16, "safetensors", 1),
    # Qwen3: a head width set by head_dim (4 heads of 16 on a hidden size of 32: Q and the
    # attention output 64 wide), an RMSNorm over each head of Q and K before the rotation,
    # grouped-query attention, no biases, a tied head, bf16.
    ("qwen3_head_dim_qk_norm_bf16",
     dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], torch_dtype="bfloat16", head_dim=16,
          num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1000000.0, sliding_window=None,
          use_sliding_window=False, max_window_layers=2),
     torch.bfloat16, "safetensors", 1),
    # The same with as many KV heads as query heads (Q, K and V stacked for one GEMM), heads of
    # 12 (Q 48 wide on a hidden size of 32), f32.
    ("qwen3_mha_head_dim_f32",
     dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=12, rope_theta=1000000.0,
          use_sliding_window=False),
     torch.float32, "safetensors", 1),
    # Qwen2.5's long-context recipe: YaRN rope scaling (factor 4 over an original context of
    # 256, as Qwen's model cards add {"type": "yarn", "factor": 4.0,
    # "original_max_position_embeddings": 32768}), heads of 16 at theta 1e4 so that the ramp
    # between kept and divided frequencies spans four element pairs, and the attention factor
    # (0.1 ln 4 + 1) on cos and sin; grouped-query attention, f32.
    ("qwen2_yarn_gqa_f32",
     dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=64, num_key_value_heads=2,
          max_position_embeddings=256, rope_theta=10000.0, use_sliding_window=False, attention_bias=None,
          rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}),
     torch.float32, "safetensors", 1),
    # Mixtures of experts. Qwen3-MoE: 8 experts of width 24, 2 per token renormalised
    # (norm_topk_prob), Qwen3's per-head norms and head width; layer 1 in mlp_only_layers keeps a
    # dense MLP.
    ("qwen3_moe_dense_layer_f32",
     dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], head_dim=16, num_key_value_heads=2,
          tie_word_embeddings=True, rope_theta=1000000.0, use_sliding_window=False, num_experts=8,
          num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True, decoder_sparse_step=1,
          mlp_only_layers=[1]),
     torch.float32, "safetensors", 1),
    # Qwen2-MoE: 6 experts, 3 per token with the softmax's own weights (norm_topk_prob false), a
    # shared expert of width 40 on every token scaled by sigmoid(shared_expert_gate · x); Q/K/V
    # biases; bf16 in two shards.
    ("qwen2_moe_shared_expert_bf16",
     dict(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], torch_dtype="bfloat16", num_experts=6,
          num_experts_per_tok=3, moe_intermediate_size=16, shared_expert_intermediate_size=40, norm_topk_prob=False,
          decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False, attention_bias=None,
          rope_theta=1000000.0),
     torch.bfloat16, "safetensors", 2),
    # Mixtral: block_sparse_moe with 4 experts (w1 gate, w3 up, w2 down) as wide as
    # intermediate_size, 2 per token renormalised; grouped-query attention; fp16 .bin.
    ("mixtral_gqa_f16_bin",
     dict(model_type="mixtral", architectures=["MixtralForCausalLM"], torch_dtype="float16", num_key_value_heads=2,
          num_local_experts=4, num_experts_per_tok=2, intermediate_size=48, router_jitter_noise=0.0,
          sliding_window=None, rope_theta=1000000.0),
     torch.float16, "bin", 1),
    # Phi-3 / Phi-4: Q, K, V in one qkv_proj and gate, up in one gate_up_proj (written fused
    # below), partial rotary (Phi-4-mini's 0.75: 6 of each head's 8 elements turn, pairs (i, i+3)
    # over frequencies of 6), grouped-query attention, a sliding window of 6 on every layer
    # (Phi-3-mini-4k slides 2047), tied head.
    ("phi3_partial_rotary_fused_f32",
     dict(model_type="phi3", architectures=["Phi3ForCausalLM"], num_key_value_heads=2,
          partial_rotary_factor=0.75, sliding_window=6, rms_norm_eps=1e-5, tie_word_embeddings=True,
          original_max_position_embeddings=64, rope_scaling=None),
     torch.float32, "safetensors", 2),
    # Phi-3.5 / Phi-4-mini: longrope over the partial rotary (3 pairs, a short and a long factor
    # each, far apart), the original context 8 of 64 (transformers' attention factor
    # sqrt(1 + ln 8 / ln 8)). The 13 ids run long; the greedy continuation of 5 crosses 8 tokens:
    # short factors until the sequence passes 8, then every token turns by the long ones.
    ("phi3_longrope_f32",
     dict(model_type="phi3", architectures=["Phi3ForCausalLM"], num_key_value_heads=2,
          partial_rotary_factor=0.75, sliding_window=None, rms_norm_eps=1e-5, tie_word_embeddings=True,
          original_max_position_embeddings=8,
          rope_scaling={"type": "longrope", "short_factor": [1.0, 1.5, 2.5], "long_factor": [4.0, 11.0, 30.0]}),
     torch.float32, "safetensors", 1),
]

# rope_scaling of type yarn as checkpoints ship it (head_dim, theta, max_position_embeddings,
# rope_scaling): the inverse frequencies, attention factor and served context go to yarn_rope.json.
YARN_CASES = [
    ("qwen2.5-7b", 128, 1000000.0, 32768,
     {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    ("qwen3-8b", 128, 1000000.0, 40960,
     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    ("deepseek-style-mscale", 64, 10000.0, 163840,
     {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
      "mscale": 1.0, "mscale_all_dim": 1.0}),
    ("mscale-ratio", 64, 10000.0, 16384,
     {"type": "yarn", "factor": 8, "original_max_position_embeddings": 2048, "mscale": 0.707, "mscale_all_dim": 1.0}),
    ("no-truncate", 64, 150000.0, 131072,
     {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
      "beta_slow": 1.0, "truncate": False}),
    ("explicit-attention-factor-betas", 96, 500000.0, 8192,
     {"type": "yarn", "factor": 2.0, "attention_factor": 1.0, "beta_fast": 8, "beta_slow": 2}),
]


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def has_bias(cfg, proj):
    """Which attention projections carry a bias: Qwen2Attention's q/k/v always; Llama's all four
    with attention_bias."""
    if cfg["model_type"] in ("qwen2", "qwen2_moe"):
        return proj != "o_proj"
    return cfg.get("attention_bias", False)


def window(cfg):
    """The sliding window the reference applies: Mistral's whenever set; Qwen2's only with
    use_sliding_window (on layers from max_window_layers on; this script's cases have none)."""
    if cfg["model_type"].startswith("qwen"):
        assert not cfg.get("use_sliding_window")
        return None
    return cfg.get("sliding_window")


def make_weights(cfg, dtype, gen):
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kvh = cfg["num_key_value_heads"] * head_dim(cfg)  # K/V projection width
    qw = cfg["num_attention_heads"] * head_dim(cfg)  # Q projection and attention output width

    def rnd(*shape, std=1.0, mean=0.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * std + mean).to(dtype)

    w = {"model.embed_tokens.weight": rnd(v, h, std=0.5), "model.norm.weight": rnd(h, std=0.1, mean=1.0)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = rnd(h, std=0.1, mean=1.0)
        w[p + "post_attention_layernorm.weight"] = rnd(h, std=0.1, mean=1.0)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            rows, cols = {"q_proj": (qw, h), "k_proj": (kvh, h), "v_proj": (kvh, h), "o_proj": (h, qw)}[proj]
            w[p + "self_attn." + proj + ".weight"] = rnd(rows, cols, std=cols ** -0.5)
            if has_bias(cfg, proj):
                w[p + "self_attn." + proj + ".bias"] = rnd(rows, std=0.1)
        if cfg["model_type"] in ("qwen3", "qwen3_moe"):  # Qwen3RMSNorm over each head of Q and of K
            w[p + "self_attn.q_norm.weight"] = rnd(head_dim(cfg), std=0.1, mean=1.0)
            w[p + "self_attn.k_norm.weight"] = rnd(head_dim(cfg), std=0.1, mean=1.0)
        if moe_layer(cfg, i):
            for name, t in moe_weights(cfg, rnd).items():
                w[p + name] = t
            continue
        w[p + "mlp.gate_proj.weight"] = rnd(f, h, std=h ** -0.5)
        w[p + "mlp.up_proj.weight"] = rnd(f, h, std=h ** -0.5)
        w[p + "mlp.down_proj.weight"] = rnd(h, f, std=f ** -0.5)
        if cfg["mlp_bias"]:
            for proj, n in (("gate_proj", f), ("up_proj", f), ("down_proj", h)):
                w[p + "mlp." + proj + ".bias"] = rnd(n, std=0.1)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = rnd(v, h, std=0.5)
    return w


def num_experts(cfg):
    return cfg.get("num_local_experts") or cfg.get("num_experts") or 0


def moe_layer(cfg, i):
    """Qwen2MoeDecoderLayer's rule (Mixtral: every layer): sparse unless in mlp_only_layers or off
    the decoder_sparse_step."""
    if not num_experts(cfg):
        return False
    return i not in cfg.get("mlp_only_layers", []) and (i + 1) % cfg.get("decoder_sparse_step", 1) == 0


def moe_names(cfg):
    """(router, expert prefix, gate, up, down) names as the checkpoints have them."""
    if cfg["model_type"] == "mixtral":
        return "block_sparse_moe.gate", "block_sparse_moe.experts.", "w1", "w3", "w2"
    return "mlp.gate", "mlp.experts.", "gate_proj", "up_proj", "down_proj"


def moe_weights(cfg, rnd):
    h, E = cfg["hidden_size"], num_experts(cfg)
    fe = cfg["intermediate_size"] if cfg["model_type"] == "mixtral" else cfg["moe_intermediate_size"]
    router, experts, g, u, d = moe_names(cfg)
    # Router logits of std ~2: distinct experts per token, no near-ties.
    w = {router + ".weight": rnd(E, h, std=2 * h ** -0.5)}
    for e in range(E):
        x = f"{experts}{e}."
        w[x + g + ".weight"] = rnd(fe, h, std=h ** -0.5)
        w[x + u + ".weight"] = rnd(fe, h, std=h ** -0.5)
        w[x + d + ".weight"] = rnd(h, fe, std=fe ** -0.5)
    fs = cfg.get("shared_expert_intermediate_size", 0)
    if fs:
        w["mlp.shared_expert.gate_proj.weight"] = rnd(fs, h, std=h ** -0.5)
        w["mlp.shared_expert.up_proj.weight"] = rnd(fs, h, std=h ** -0.5)
        w["mlp.shared_expert.down_proj.weight"] = rnd(h, fs, std=fs ** -0.5)
        w["mlp.shared_expert_gate.weight"] = rnd(1, h, std=h ** -0.5)
    return w


def moe_mlp(cfg, W, p, a):
    """Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock on rows a [T, h]:
    softmax over every expert, the top k, renormalised when norm_topk_prob (always for Mixtral),
    the chosen experts' SwiGLU outputs summed with those weights; plus Qwen2-MoE's shared expert
    times sigmoid of its gate."""
    router, experts, g, u, d = moe_names(cfg)
    k = cfg["num_experts_per_tok"]
    norm = cfg["model_type"] == "mixtral" or cfg.get("norm_topk_prob", cfg["model_type"] == "qwen3_moe")
    probs = torch.softmax(a @ W[p + router + ".weight"].T, dim=-1)
    weights, chosen = torch.topk(probs, k, dim=-1)
    if norm:
        weights = weights / weights.sum(-1, keepdim=True)
    out = torch.zeros_like(a)

    def swiglu(rows, x):
        return (torch.nn.functional.silu(rows @ W[x + g + ".weight"].T) * (rows @ W[x + u + ".weight"].T)) \
            @ W[x + d + ".weight"].T
    for t in range(a.shape[0]):
        for j in range(k):
            out[t] += weights[t, j] * swiglu(a[t:t + 1], f"{p}{experts}{int(chosen[t, j])}.")[0]
    if p + "mlp.shared_expert_gate.weight" in W:
        gate = torch.sigmoid(a @ W[p + "mlp.shared_expert_gate.weight"].T)
        x = p + "mlp.shared_expert."
        shared = (torch.nn.functional.silu(a @ W[x + "gate_proj.weight"].T) * (a @ W[x + "up_proj.weight"].T)) \
            @ W[x + "down_proj.weight"].T
        out = out + gate * shared
    return out


def rms_norm(x, g, eps):
    return g * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps))


def rope_cos_sin(cfg, T, hd):
    """LlamaRotaryEmbedding: fp32 inverse frequencies and angles, as transformers computes them."""
    theta = cfg.get("rope_parameters", {}).get("rope_theta", cfg["rope_theta"])
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    scaling = cfg.get("rope_scaling")
    kind = scaling.get("type", scaling.get("rope_type")) if scaling else None
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        # transformers' _compute_llama3_parameters: long wavelengths slowed by the factor,
        # short ones kept, the band between interpolated.
        factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / lo, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - lo) / (hi - lo)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / hi) * ~(wavelen > old / lo)
        inv_freq = torch.where(medium, blended, scaled)
    attention_factor = 1.0
    if kind in ("longrope", "su"):
        # transformers' _compute_longrope_parameters with its dynamic update: the long factors for
        # a sequence longer than the original context (all of it), else the short ones; the
        # attention factor from max_position_embeddings / original.
        original = cfg.get("original_max_position_embeddings", cfg["max_position_embeddings"])
        factor = cfg["max_position_embeddings"] / original
        attention_factor = scaling.get("attention_factor") or (
            1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original)))
        ext = torch.tensor(scaling["long_factor"] if T > original else scaling["short_factor"], dtype=torch.float32)
        inv_freq = 1.0 / (ext * theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    if kind == "yarn":
        inv_freq, attention_factor = yarn_inv_freq(hd, theta, cfg["max_position_embeddings"], scaling)
    freqs = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return ((emb.cos() * attention_factor).to(torch.float64), (emb.sin() * attention_factor).to(torch.float64))


def yarn_inv_freq(dim, base, max_position_embeddings, scaling):
    """YaRN (Peng et al. 2023) as transformers' _compute_yarn_parameters computes it, in fp32:
    the factor as given, the correction range from beta_fast/beta_slow rotations over the original
    context, a linear ramp between kept and interpolated frequencies, and the attention factor
    (given, else mscale / mscale_all_dim, else 0.1 ln(factor) + 1) by which cos and sin are scaled."""
    factor = scaling["factor"]
    original = scaling.get("original_max_position_embeddings") or max_position_embeddings

    def get_mscale(scale, mscale=1.0):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        if scaling.get("mscale") and scaling.get("mscale_all_dim"):
            attention_factor = get_mscale(factor, scaling["mscale"]) / get_mscale(factor, scaling["mscale_all_dim"])
        else:
            attention_factor = get_mscale(factor)
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations):
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # transformers' inv_freq_extrapolation_factor
    return interpolation * (1 - keep) + extrapolation * keep, attention_factor


def write_yarn_cases():
    out = []
    for name, dim, theta, max_pos, scaling in YARN_CASES:
        inv_freq, attention_factor = yarn_inv_freq(dim, theta, max_pos, scaling)
        original = scaling.get("original_max_position_embeddings") or max_pos
        out.append(dict(name=name, head_dim=dim, rope_theta=theta, max_position_embeddings=max_pos,
                        rope_scaling=scaling, inv_freq=[float(f) for f in inv_freq],
                        attention_factor=float(attention_factor),
                        # The context served: max_position_embeddings, or factor x original where longer (vLLM).
                        context=max(max_pos, round(scaling["factor"] * original))))
    with open(os.path.join(OUT, "yarn_rope.json"), "w") as f:
        json.dump(out, f, indent=1)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def reference_logits(cfg, w, ids):
    """Llama forward in float64 for one sequence; returns logits [T, vocab]."""
    W = {k: t.to(torch.float64) for k, t in w.items()}
    h, nh, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["rms_norm_eps"]
    hd = head_dim(cfg)
    rd = int(hd * cfg.get("partial_rotary_factor", 1.0))  # Phi's partial rotary: the rest passes
    nkv = cfg["num_key_value_heads"]
    T = len(ids)
    x = W["model.embed_tokens.weight"][torch.tensor(ids)]
    cos, sin = rope_cos_sin(cfg, T, rd)
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    if window(cfg):  # Mistral: token i sees positions i - window + 1 .. i
        mask = mask + torch.full((T, T), float("-inf"), dtype=torch.float64).tril(-window(cfg))

    def lin(t, name):
        y = t @ W[name + ".weight"].T
        return y + W[name + ".bias"] if name + ".bias" in W else y

    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = lin(a, p + "self_attn.q_proj").view(T, nh, hd).transpose(0, 1)
        k, v = (lin(a, p + "self_attn." + n).view(T, nkv, hd).transpose(0, 1) for n in ("k_proj", "v_proj"))
        if p + "self_attn.q_norm.weight" in W:  # Qwen3: per-head norms before the rotation
            q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps)
        q = torch.cat((q[..., :rd] * cos + rotate_half(q[..., :rd]) * sin, q[..., rd:]), dim=-1)
        k = torch.cat((k[..., :rd] * cos + rotate_half(k[..., :rd]) * sin, k[..., rd:]), dim=-1)
        # repeat_kv: KV head j serves query heads j*group .. j*group + group - 1.
        k, v = (t.repeat_interleave(nh // nkv, dim=0) for t in (k, v))
        att = torch.softmax(q @ k.transpose(1, 2) * hd ** -0.5 + mask, dim=-1) @ v
        x = x + lin(att.transpose(0, 1).reshape(T, nh * hd), p + "self_attn.o_proj")
        a = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        if moe_layer(cfg, i):
            x = x + moe_mlp(cfg, W, p, a)
            continue
        x = x + lin(torch.nn.functional.silu(lin(a, p + "mlp.gate_proj")) * lin(a, p + "mlp.up_proj"),
                    p + "mlp.down_proj")
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["lm_head.weight"] if "lm_head.weight" in W else W["model.embed_tokens.weight"]
    return x @ head.T


def save_case(d, ids, forward, logprobs=False):
    """The ids, the reference's logits of every position, and its greedy continuation: 8 tokens
    after the first 5 ids (what tests/engine/model/reference_check.h reads); with `logprobs`, the
    log-probability of each token chosen too."""
    np.save(os.path.join(d, "input_ids.npy"), np.array(ids, dtype=np.int64))
    np.save(os.path.join(d, "logits.npy"), forward(ids).numpy())
    seq, lp = ids[:5], []
    for _ in range(8):
        row = forward(seq)[-1]
        seq.append(int(row.argmax()))
        lp.append(float(torch.log_softmax(row, -1)[seq[-1]]))
    np.save(os.path.join(d, "greedy.npy"), np.array(seq[5:], dtype=np.int64))
    if logprobs:
        np.save(os.path.join(d, "greedy_logprobs.npy"), np.array(lp, dtype=np.float64))


def fused(w):
    """Phi3's checkpoint names: qkv_proj = rows of q_proj, k_proj, v_proj; gate_up_proj = rows
    of gate_proj, then up_proj."""
    out = {}
    for k, t in w.items():
        if k.endswith("self_attn.q_proj.weight"):
            p = k[: -len("q_proj.weight")]
            out[p + "qkv_proj.weight"] = torch.cat([w[p + n + ".weight"] for n in ("q_proj", "k_proj", "v_proj")])
        elif k.endswith("mlp.gate_proj.weight"):
            p = k[: -len("gate_proj.weight")]
            out[p + "gate_up_proj.weight"] = torch.cat([w[p + "gate_proj.weight"], w[p + "up_proj.weight"]])
        elif not any(k.endswith(s) for s in ("k_proj.weight", "v_proj.weight", "up_proj.weight")):
            out[k] = t
    return out


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    for n, (name, over, dtype, fmt, shards) in enumerate(CASES):
        cfg = {k: v for k, v in dict(BASE, **over).items() if v is not None}  # None: a field the model lacks
        cfg.setdefault("torch_dtype", "float32")
        gen = torch.Generator().manual_seed(2000 + n)
        w = make_weights(cfg, dtype, gen)
        d = os.path.join(OUT, name)
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        write_checkpoint(d, fused(w) if cfg["model_type"] == "phi3" else w, fmt, shards)
        ids = torch.randint(3, cfg["vocab_size"], (13,), generator=gen).tolist()
        # Longrope's regimes give the same greedy tokens here: their log-probabilities tell them apart.
        save_case(d, ids, lambda seq: reference_logits(cfg, w, seq), logprobs=(over.get("rope_scaling") or {}).get("type") == "longrope")
        print(f"{name}: {fmt} x{shards}, {ST_DTYPE[dtype]}")
    write_yarn_cases()
    print("torch", torch.__version__, file=sys.stderr)


if __name__ == "__main__":
    main()
