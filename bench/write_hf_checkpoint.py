#!/usr/bin/env python3
"""A Hugging Face checkpoint with random weights, written by transformers itself: OPT of a
preset's shapes (bench/hf_offload_peer.py's), fp16, save_pretrained as sharded safetensors, with
GPT-2's tokenizer files from share/gpt2-tokenizer. What kvprd serves in the device check (an
independent writer: our loader reads what transformers writes, as users' checkpoints).

    python3 bench/write_hf_checkpoint.py --preset opt-6.7b --out /tmp/opt-6.7b-random

Device machine only (torch; CUDA used when present, for the random init)."""
import argparse
import json
import os
import shutil
import time

from hf_offload_peer import PRESETS


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="opt-6.7b", choices=sorted(PRESETS))
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import torch
    from transformers import OPTConfig, OPTForCausalLM

    shape = PRESETS[a.preset]
    cfg = OPTConfig(vocab_size=50272, max_position_embeddings=2048, word_embed_proj_dim=shape["hidden_size"],
                    do_layer_norm_before=True, enable_bias=True, pad_token_id=1, bos_token_id=2, eos_token_id=2,
                    **shape)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    torch.set_default_dtype(torch.float16)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = OPTForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model.save_pretrained(a.out, safe_serialization=True, max_shard_size="4GB")
    tok = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "share", "gpt2-tokenizer")
    for f in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(tok, f), os.path.join(a.out, f))
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                   "unk_token": "<|endoftext|>", "add_bos_token": False, "model_max_length": 2048}, f)
    size = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
    print(f"wrote {a.out}: {a.preset}, {size / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
