#!/usr/bin/env python3
"""The peer for kvpr-bench decode: Hugging Face transformers' OPTForCausalLM with the same
config and random fp16 weights, generating greedily with its offloaded KV cache (KV in CPU
memory, the next layer prefetched), same batch, prompt and length, on the same GPU.

    python3 bench/hf_offload_peer.py --preset opt-6.7b --batch 32 --prompt 1024 --gen 32 --out hf.json

Decode time per step = (time of generate(gen) - time of generate(1)) / (gen - 1): both runs
include the same prefill, which cancels. Runs on the device machine only (torch + CUDA).
"""
import argparse
import json
import sys
import time

PRESETS = {
    "opt-6.7b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, ffn_dim=16384),
    "opt-13b": dict(hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, ffn_dim=20480),
    "opt-30b": dict(hidden_size=7168, num_hidden_layers=48, num_attention_heads=56, ffn_dim=28672),
    "opt-1.3b": dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=32, ffn_dim=8192),
    "tiny": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, ffn_dim=512),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="opt-6.7b", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--cache", default="offloaded", help="cache_implementation for generate()")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    import torch
    import transformers
    from transformers import OPTConfig, OPTForCausalLM

    shape = PRESETS[a.preset]
    cfg = OPTConfig(vocab_size=50272, max_position_embeddings=2048, word_embed_proj_dim=shape["hidden_size"],
                    do_layer_norm_before=True, enable_bias=True, pad_token_id=1, bos_token_id=2, eos_token_id=2,
                    **shape)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    torch.set_default_dtype(torch.float16)
    with torch.device("cuda"):
        model = OPTForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model.eval()
    init_s = time.perf_counter() - t0
    ids = torch.randint(3, 50000, (a.batch, a.prompt), device="cuda")
    mask = torch.ones_like(ids)

    used = a.cache

    def run(n):
        nonlocal used
        kwargs = dict(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                      pad_token_id=1)
        torch.cuda.synchronize()
        t = time.perf_counter()
        try:
            with torch.inference_mode():
                out = model.generate(**kwargs, cache_implementation=used)
        except (ValueError, TypeError) as e:
            # Newer transformers spell the offloaded cache as DynamicCache(offloading=True).
            from transformers import DynamicCache
            print(f"cache_implementation={used!r} not accepted ({e}); using DynamicCache(offloading=True)",
                  file=sys.stderr)
            used = "DynamicCache(offloading=True)"
            torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(**kwargs, past_key_values=DynamicCache(config=cfg, offloading=True))
        torch.cuda.synchronize()
        return time.perf_counter() - t, out

    run(2)  # warm-up (kernels, allocator)
    t1, _ = run(1)
    tn, out = run(a.gen)
    assert out.shape[1] == a.prompt + a.gen, out.shape
    decode_ms = (tn - t1) / (a.gen - 1) * 1e3
    result = {
        "peer": "transformers OPTForCausalLM",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "cache": used,
        "preset": a.preset,
        "batch": a.batch,
        "prompt": a.prompt,
        "gen": a.gen,
        "model_init_s": init_s,
        "generate_1_s": t1,
        "generate_n_s": tn,
        "decode_ms_per_step": decode_ms,
        "decode_tokens_per_s": a.batch / (decode_ms / 1e3),
        "gpu": torch.cuda.get_device_name(0),
        "max_gpu_memory_bytes": torch.cuda.max_memory_allocated(),
    }
    json.dump(result, open(a.out, "w"), indent=1)
    print(f"HF {used}: {decode_ms:.1f} ms/step, {result['decode_tokens_per_s']:.1f} tokens/s")


if __name__ == "__main__":
    main()
