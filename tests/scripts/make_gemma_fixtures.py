#!/usr/bin/env python3
"""Reference fixtures for Gemma 2, Gemma 3 and the ForConditionalGeneration wrappers (gemma3,
mistral3), made offline with Debian's python3-torch.

For each tiny configuration this writes a Hugging Face style model directory under
tests/data/gemma/<name>/ (config.json and safetensors weights, with the names the hub's
checkpoints use), the input ids, and float64 logits for every position computed by a forward
written here in plain torch, independent of kvpr's C++ code and following transformers'
modeling_gemma2.py and modeling_gemma3.py:
- RMSNorm as x * rsqrt(mean(x^2) + eps) * (1 + w) for every norm (the four per layer, the final
  one, Gemma 3's per-head q_norm and k_norm);
- embeddings times sqrt(hidden_size) rounded to the weights' dtype; the tied head unscaled;
- a norm on the attention's and on the MLP's output before each residual add;
- GeGLU with gelu(approximate="tanh");
- scores scaled by query_pre_attn_scalar^-1/2, Gemma 2's tanh soft-cap of the scores and of
  the final logits;
- sliding layers (masking_utils: key j seen from query i iff i - W < j <= i) by layer_types,
  Gemma 2's even layers or Gemma 3's pattern; Gemma 3's local layers turning by
  rope_local_base_freq unscaled, its global ones by rope_theta with rope_scaling.
The mistral3 wrapper's text model is Mistral (the Llama reference of make_llama_fixtures.py);
its weights sit under the names transformers >= 4.52 saves. The greedy continuation of the
reference is stored too.

    /usr/bin/python3 tests/scripts/make_gemma_fixtures.py     # rewrites tests/data/gemma

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
from make_opt_fixtures import ST_DTYPE, write_checkpoint  # noqa: E402
import make_llama_fixtures as llama  # noqa: E402  (rope tables, the Mistral reference)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "gemma")

GEMMA2 = dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"], vocab_size=96, hidden_size=32,
              intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="gelu_pytorch_tanh",
              hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24, sliding_window=4,
              attn_logit_softcapping=2.0, final_logit_softcapping=3.0, tie_word_embeddings=True,
              attention_bias=False, bos_token_id=2, eos_token_id=1, pad_token_id=0)

GEMMA3 = dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], vocab_size=96, hidden_size=48,
              intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
              max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
              rope_scaling={"rope_type": "linear", "factor": 8.0}, hidden_activation="gelu_pytorch_tanh",
              query_pre_attn_scalar=20, sliding_window=4, sliding_window_pattern=3, final_logit_softcapping=None,
              attn_logit_softcapping=None, tie_word_embeddings=True, attention_bias=False, bos_token_id=2,
              eos_token_id=1, pad_token_id=0)

# name, config, storage dtype, shards
CASES = [
    # Gemma 2: explicit head_dim (4 x 16 on a hidden size of 32), query_pre_attn_scalar 24 (not
    # head_dim), windows of 4 on layers 0 and 2, soft-caps of 2 (scores) and 3 (logits) where
    # the values reach several times the cap.
    ("gemma2_f32", GEMMA2, torch.float32, 1),
    # bf16 weights: the embedding scale sqrt(48) = 6.93 is 6.9375 in bf16; multi-head attention;
    # transformers 5's layer_types instead of the default pattern.
    ("gemma2_bf16_layer_types",
     dict(GEMMA2, hidden_size=48, num_key_value_heads=4, num_hidden_layers=2, torch_dtype="bfloat16",
          layer_types=["full_attention", "sliding_attention"]), torch.bfloat16, 2),
    # Gemma 3: per-head q/k norms, layers 0, 1 and 3 local (pattern 3) with base 1e4 unscaled,
    # layer 2 global with base 1e6 and linear scaling 8, multi-query attention, no soft-caps.
    ("gemma3_text_f32", GEMMA3, torch.float32, 1),
    # transformers 5's spelling: rope_parameters keyed by layer type, _sliding_window_pattern.
    ("gemma3_text_rope_parameters_f32",
     dict({k: v for k, v in GEMMA3.items() if k not in ("rope_theta", "rope_local_base_freq", "rope_scaling",
                                                       "sliding_window_pattern")},
          _sliding_window_pattern=2, rope_scaling=None,
          rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 500000.0},
                           "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}}),
     torch.float32, 1),
]

# The wrappers: (name, top-level config, text model's config, storage dtype, decoder prefix, head name)
WRAPPERS = [
    # Gemma3ForConditionalGeneration as google/gemma-3-4b-it ships it: a sparse text_config (no
    # rope_theta, rope_local_base_freq, rms_norm_eps, hidden_activation: the class defaults),
    # the dtype and token ids at the top, the text model under language_model.model., vision
    # weights beside it.
    ("gemma3_wrapper_bf16",
     dict(model_type="gemma3", architectures=["Gemma3ForConditionalGeneration"], torch_dtype="bfloat16",
          eos_token_id=[1, 106], bos_token_id=2, pad_token_id=0, mm_tokens_per_image=256,
          vision_config={"model_type": "siglip_vision_model", "hidden_size": 8}),
     dict(model_type="gemma3_text", vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
          num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
          query_pre_attn_scalar=16, sliding_window=5, rope_scaling={"rope_type": "linear", "factor": 2.0},
          sliding_window_pattern=3),
     torch.bfloat16, "language_model.model.", None),
    # Mistral3ForConditionalGeneration (Mistral-Small-3.1) as transformers >= 4.52 saves it: the
    # text model under model.language_model., its head as lm_head; head_dim 16 on a hidden size of
    # 48 with 4 heads; no window.
    ("mistral3_wrapper_f32",
     dict(model_type="mistral3", architectures=["Mistral3ForConditionalGeneration"], torch_dtype="float32",
          image_token_index=10, vision_config={"model_type": "pixtral", "hidden_size": 8}),
     dict(model_type="mistral", vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
          num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-5,
          rope_theta=1000000000.0, sliding_window=None, hidden_act="silu", tie_word_embeddings=False,
          bos_token_id=1, eos_token_id=2),
     torch.float32, "model.language_model.", "lm_head.weight"),
]


def is_sliding(cfg, i):
    """transformers' layer_types, as given or as Gemma2Config / Gemma3TextConfig default them."""
    if cfg.get("layer_types"):
        return cfg["layer_types"][i] == "sliding_attention"
    if cfg["model_type"] == "gemma2":
        return (i + 1) % 2 != 0
    pattern = cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6
    return (i + 1) % pattern != 0


def gemma3_defaults(cfg):
    """Gemma3TextConfig's defaults for the fields a sparse text_config leaves out."""
    out = dict(rope_theta=1000000.0, rope_local_base_freq=10000.0, rms_norm_eps=1e-6,
               hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, final_logit_softcapping=None,
               attn_logit_softcapping=None)
    out.update(cfg)
    return out


def layer_rope(cfg, i, T, hd):
    """cos, sin of layer i: Gemma 3's local layers a copy of the config with rope_theta =
    rope_local_base_freq and default rope; its global ones (and every Gemma 2 layer) the config's."""
    rp = cfg.get("rope_parameters")
    if rp:  # transformers 5, keyed by layer type
        p = rp["sliding_attention" if is_sliding(cfg, i) else "full_attention"]
        scaling = p if p.get("rope_type", "default") != "default" else None
        c = dict(rope_theta=p["rope_theta"], rope_scaling=scaling, max_position_embeddings=cfg["max_position_embeddings"])
    elif cfg["model_type"] == "gemma3_text" and is_sliding(cfg, i):
        c = dict(rope_theta=cfg["rope_local_base_freq"], rope_scaling=None,
                 max_position_embeddings=cfg["max_position_embeddings"])
    else:
        c = dict(rope_theta=cfg["rope_theta"], rope_scaling=cfg.get("rope_scaling"),
                 max_position_embeddings=cfg["max_position_embeddings"])
    return llama.rope_cos_sin(c, T, hd)


def make_weights(cfg, dtype, gen, prefix="model."):
    h, f, v, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]
    qw, kvw = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def rnd(*shape, std=1.0, mean=0.0):
        return (torch.randn(*shape, generator=gen, dtype=torch.float64) * std + mean).to(dtype)

    # Norm gains are offsets from 1 (GemmaRMSNorm initialises them to 0). Small embeddings (the
    # layers' outputs, not the token's own row, decide the next token) and a final gain of ~5
    # (logits of several units, where Gemma 2's cap of 3 bends them).
    w = {prefix + "embed_tokens.weight": rnd(v, h, std=0.15), prefix + "norm.weight": rnd(h, std=0.5, mean=4.0)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"{prefix}layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            w[p + n + ".weight"] = rnd(h, std=0.2)
        # Q and K large enough that scores reach several times Gemma 2's soft-cap.
        w[p + "self_attn.q_proj.weight"] = rnd(qw, h, std=2 * h ** -0.5)
        w[p + "self_attn.k_proj.weight"] = rnd(kvw, h, std=2 * h ** -0.5)
        w[p + "self_attn.v_proj.weight"] = rnd(kvw, h, std=h ** -0.5)
        w[p + "self_attn.o_proj.weight"] = rnd(h, qw, std=qw ** -0.5)
        if cfg["model_type"] == "gemma3_text":
            w[p + "self_attn.q_norm.weight"] = rnd(hd, std=0.2)
            w[p + "self_attn.k_norm.weight"] = rnd(hd, std=0.2)
        w[p + "mlp.gate_proj.weight"] = rnd(f, h, std=h ** -0.5)
        w[p + "mlp.up_proj.weight"] = rnd(f, h, std=h ** -0.5)
        w[p + "mlp.down_proj.weight"] = rnd(h, f, std=f ** -0.5)
    return w


def gemma_norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * (1.0 + w)


def reference_logits(cfg, w, ids, prefix="model."):
    """Gemma 2 / Gemma 3 forward in float64 for one sequence; returns logits [T, vocab]."""
    W = {k: t.to(torch.float64) for k, t in w.items()}
    dtype = next(iter(w.values())).dtype
    h, nh, nkv, hd, eps = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                           cfg["head_dim"], cfg["rms_norm_eps"])
    T = len(ids)
    # Gemma2Model / Gemma3TextScaledWordEmbedding: sqrt(hidden) as a tensor of the weights' dtype.
    normalizer = float(torch.tensor(math.sqrt(h), dtype=dtype))
    x = W[prefix + "embed_tokens.weight"][torch.tensor(ids)] * normalizer
    causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    i_idx, j_idx = torch.arange(T)[:, None], torch.arange(T)[None, :]
    window = torch.where(i_idx - cfg["sliding_window"] < j_idx, 0.0, float("-inf")).to(torch.float64)
    cap = cfg.get("attn_logit_softcapping")

    def lin(t, name):
        return t @ W[name + ".weight"].T

    for i in range(cfg["num_hidden_layers"]):
        p = f"{prefix}layers.{i}."
        cos, sin = layer_rope(cfg, i, T, hd)
        a = gemma_norm(x, W[p + "input_layernorm.weight"], eps)
        q = lin(a, p + "self_attn.q_proj").view(T, nh, hd).transpose(0, 1)
        k, v = (lin(a, p + "self_attn." + n).view(T, nkv, hd).transpose(0, 1) for n in ("k_proj", "v_proj"))
        if p + "self_attn.q_norm.weight" in W:  # Gemma 3: per-head norms, then the rotation
            q = gemma_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = gemma_norm(k, W[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + llama.rotate_half(q) * sin
        k = k * cos + llama.rotate_half(k) * sin
        k, v = (t.repeat_interleave(nh // nkv, dim=0) for t in (k, v))
        s = q @ k.transpose(1, 2) * cfg["query_pre_attn_scalar"] ** -0.5
        if cap:
            s = cap * torch.tanh(s / cap)
        s = s + causal + (window if is_sliding(cfg, i) else 0.0)
        att = torch.softmax(s, dim=-1) @ v
        o = lin(att.transpose(0, 1).reshape(T, nh * hd), p + "self_attn.o_proj")
        x = x + gemma_norm(o, W[p + "post_attention_layernorm.weight"], eps)
        m = gemma_norm(x, W[p + "pre_feedforward_layernorm.weight"], eps)
        m = torch.nn.functional.gelu(lin(m, p + "mlp.gate_proj"), approximate="tanh") * lin(m, p + "mlp.up_proj")
        x = x + gemma_norm(lin(m, p + "mlp.down_proj"), W[p + "post_feedforward_layernorm.weight"], eps)
    x = gemma_norm(x, W[prefix + "norm.weight"], eps)
    logits = x @ W[prefix + "embed_tokens.weight"].T
    if cfg.get("final_logit_softcapping"):
        c = cfg["final_logit_softcapping"]
        logits = c * torch.tanh(logits / c)
    return logits


def dump(cfg):
    return {k: v for k, v in cfg.items() if v is not None or k in ("final_logit_softcapping", "attn_logit_softcapping",
                                                                   "sliding_window", "rope_scaling")}


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    for n, (name, cfg, dtype, shards) in enumerate(CASES):
        cfg = dict(cfg)
        cfg.setdefault("torch_dtype", "float32")
        gen = torch.Generator().manual_seed(4000 + n)
        w = make_weights(cfg, dtype, gen)
        d = os.path.join(OUT, name)
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(dump(cfg), f, indent=1)
        write_checkpoint(d, w, "safetensors", shards)
        ids = torch.randint(3, cfg["vocab_size"], (13,), generator=gen).tolist()
        llama.save_case(d, ids, lambda seq: reference_logits(cfg, w, seq))
        print(f"{name}: x{shards}, {ST_DTYPE[dtype]}")
    for n, (name, top, text, dtype, prefix, head) in enumerate(WRAPPERS):
        gen = torch.Generator().manual_seed(5000 + n)
        d = os.path.join(OUT, name)
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(dict(top, text_config=dump(text)), f, indent=1)
        if text["model_type"] == "gemma3_text":
            cfg = gemma3_defaults(text)
            w = make_weights(cfg, dtype, gen, prefix)

            def forward(seq, cfg=cfg, w=w, prefix=prefix):
                return reference_logits(cfg, w, seq, prefix)
        else:  # Mistral: the Llama reference on the weights under their plain names
            cfg = dict(text, attention_bias=False, mlp_bias=False)
            plain = llama.make_weights(cfg, dtype, gen)
            w = {(head if k == "lm_head.weight" else prefix + k[len("model."):]): t for k, t in plain.items()}

            def forward(seq, cfg=cfg, plain=plain):
                return llama.reference_logits(cfg, plain, seq)
        # The vision tower and projector, which a text-only load leaves unread.
        w["vision_tower.vision_model.embeddings.patch_embedding.weight"] = torch.zeros(8, 3, 2, 2, dtype=dtype)
        w["multi_modal_projector.mm_input_projection_weight"] = torch.zeros(8, text["hidden_size"], dtype=dtype)
        write_checkpoint(d, w, "safetensors", 2)
        ids = torch.randint(3, text["vocab_size"], (13,), generator=gen).tolist()
        llama.save_case(d, ids, forward)
        print(f"{name}: x2, {ST_DTYPE[dtype]}")
    print("torch", torch.__version__, file=sys.stderr)


if __name__ == "__main__":
    main()
