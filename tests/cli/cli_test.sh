#!/usr/bin/env bash
# End-to-end checks of the kvpr CLI: outputs, exit codes and one-line errors.
set -u
KVPR=${KVPR_CLI:?}
DATA=${KVPR_TEST_DATA:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
check() {  # check NAME CONDITION-COMMAND...
  local name=$1; shift
  if "$@"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $name"; fi
}
expect_error() {  # expect_error NAME EXPECTED-CODE PATTERN -- ARGS...
  local name=$1 code=$2 pattern=$3; shift 4
  "$KVPR" "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
  local lines; lines=$(wc -l <"$tmp/err")
  if [ "$rc" = "$code" ] && [ "$lines" = 1 ] && grep -q -- "$pattern" "$tmp/err"; then pass=$((pass+1))
  else fail=$((fail+1)); echo "FAIL: $name (rc=$rc, stderr: $(cat "$tmp/err"))"; fi
}

"$KVPR" make-demo-model --out "$tmp/demo" >/dev/null
check "demo model written" test -f "$tmp/demo/model.safetensors"

out=$("$KVPR" generate --model "$tmp/demo" --prompt "Hello, my name is" -n 7 --json)
check "generate --json has 7 tokens" python3 -c "import json,sys; o=json.loads(sys.argv[1]); assert len(o['tokens'])==7 and o['prompt_tokens']==5 and isinstance(o['text'],str)" "$out"
outg=$("$KVPR" generate --model "$tmp/demo" --prompt "Hello, my name is" -n 7 --json --cuda-graphs)
check "--cuda-graphs gives the same tokens (each step's graph outcome listed; none on the CPU)" python3 -c "
import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2])
assert a['tokens']==b['tokens'] and [s['graph'] for s in b['steps']]==['none']*7 and 'graph' not in a['steps'][0], b['steps']" "$out" "$outg"

# --weights host: the layers' weights streamed from host memory, the same tokens in every mode.
for mode in resident offload "kvpr --split 4" cpu-attn; do
  outw=$("$KVPR" generate --model "$tmp/demo" --prompt "Hello, my name is" -n 7 --json --weights host --kv-mode $mode)
  check "--weights host --kv-mode $mode gives the same tokens, weights copied every decode step" python3 -c "
import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2])
assert a['tokens']==b['tokens'] and a['weights']=='device' and b['weights']=='host', (a, b)
w=[s['weight_h2d_bytes'] for s in b['steps']]
assert w[0] > 0 and len(set(w[1:])) == 1 and w[1] > w[0] and all(s['h2d_bytes'] >= s['weight_h2d_bytes'] for s in b['steps']), w" "$out" "$outw"
done

# --prompt-ids uses the ids as given; the same ids as --prompt give the same tokens.
ids=$("$KVPR" tokenize --model "$tmp/demo" --text "Hello, my name is")
check "tokenize" test "$ids" = "15496 11 616 1438 318"
out2=$("$KVPR" generate --model "$tmp/demo" --prompt-ids "15496,11,616,1438,318" -n 7 --json)
check "prompt-ids equals prompt" python3 -c "import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); assert a['tokens']==b['tokens']" "$out" "$out2"

# --dump-logits: row i holds the logits token i was chosen from (greedy: its argmax).
"$KVPR" generate --model "$tmp/demo" --prompt-ids 1,2,3 -n 4 --json --dump-logits "$tmp/l.npy" >"$tmp/g.json"
check "dump-logits shape and argmax" python3 - "$tmp/l.npy" "$tmp/g.json" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], 'rb').read()
assert raw[:6] == b'\x93NUMPY'
hl = struct.unpack('<H', raw[8:10])[0]
header = raw[10:10 + hl].decode()
assert "'<f4'" in header and '(4, 50272)' in header, header
data = raw[10 + hl:]
assert len(data) == 4 * 50272 * 4
toks = json.load(open(sys.argv[2]))['tokens']
for i, t in enumerate(toks):
    row = struct.unpack('<50272f', data[i * 50272 * 4:(i + 1) * 50272 * 4])
    assert max(range(50257), key=lambda v: row[v]) == t
PY

# Seeded sampling is reproducible.
lp=$("$KVPR" generate --model "$tmp/demo" --prompt "Hello, my name is" -n 3 --top-logprobs 2 --prompt-logprobs 1 --json)
check "generate --top-logprobs/--prompt-logprobs" python3 -c "
import json, sys
o = json.loads(sys.argv[1])
assert len(o['top_logprobs']) == 3 and all(len(r) == 2 for r in o['top_logprobs'])
assert all(r[0][1] >= r[1][1] for r in o['top_logprobs']) and o['top_logprobs'][0][0][0] == o['tokens'][0]
assert len(o['prompt_logprobs']) == o['prompt_tokens'] - 1 and all(v <= 0 for v in o['prompt_logprobs'])
assert len(o['prompt_top_logprobs']) == o['prompt_tokens'] - 1" "$lp"
s1=$("$KVPR" generate --model "$tmp/demo" --prompt "x" -n 12 --temperature 1 --top-p 0.9 --seed 5 --json)
s2=$("$KVPR" generate --model "$tmp/demo" --prompt "x" -n 12 --temperature 1 --top-p 0.9 --seed 5 --json)
check "same seed, same tokens" test "$s1" = "$s2"

info=$("$KVPR" info --model "$tmp/demo" --json)
check "info json" python3 -c "import json,sys; o=json.loads(sys.argv[1]); assert o['layers']==4 and o['kv_bytes_per_token']==2*4*128*2 and o['activation_bytes_per_token']==4*128*2 and o['parameters']>7000000" "$info"
check "info on a .bin fixture" "$KVPR" info --model "$DATA/opt/fp16_bin_sharded"
# Llama checkpoints (multi-head; grouped-query with 2 KV heads for 4 query heads; Llama-3.1's
# rope scaling in bf16) with Llama-2's or Llama-3's tokenizer (tokenizer.json): info names them;
# the greedy tokens of the torch reference (greedy.npy) come out of resident, KVPR (recompute
# inside the prompt) and offload with the weights streamed from host memory.
# Qwen3 (heads of 16 on a hidden size of 32, per-head Q/K norms) with Qwen2.5's tokenizer too, and
# Mixtral (a mixture of 4 experts, 2 per token) with Llama-2's.
for fx in "f32_safetensors 4 4 llama-tokenizer llama LlamaForCausalLM 8" \
          "gqa_f32_safetensors 2 4 llama-tokenizer llama LlamaForCausalLM 8" \
          "llama3_rope_gqa_bf16 2 2 llama3-tokenizer llama LlamaForCausalLM 8" \
          "qwen3_head_dim_qk_norm_bf16 2 2 qwen2-tokenizer qwen3 Qwen3ForCausalLM 16" \
          "mixtral_gqa_f16_bin 2 2 llama-tokenizer mixtral MixtralForCausalLM 8"; do
  set -- $fx
  mkdir -p "$tmp/$1" && cp "$DATA"/llama/$1/* "$DATA"/$4/tokenizer*.json "$tmp/$1/"
  check "info on $1" python3 -c "
import json,sys; o=json.loads(sys.argv[1]); kvh,es,mt,arch,hd=int(sys.argv[2]),int(sys.argv[3]),sys.argv[4],sys.argv[5],int(sys.argv[6])
assert o['model_type']==mt and o['architecture']==arch and o['kv_heads']==kvh and o['head_dim']==hd, o
assert o['q_width']==o['heads']*hd and o['kv_bytes_per_token']==2*2*es*hd*kvh, o
assert o['qk_norm']==(mt=='qwen3'), o" "$("$KVPR" info --model "$tmp/$1" --json)" "$2" "$3" "$5" "$6" "$7"
  ids=$(python3 -c "
import struct,sys
b=open(sys.argv[1],'rb').read(); n=struct.unpack('<H',b[8:10])[0]; v=struct.unpack('<13q',b[10+n:10+n+104])
print(','.join(map(str,v[:5])))" "$DATA/llama/$1/input_ids.npy")
  for mode in "resident" "kvpr --split 3" "offload --weights host"; do
    out=$("$KVPR" generate --model "$tmp/$1" --prompt-ids "$ids" -n 8 --ignore-eos --kv-dtype f32 --kv-mode $mode --json)
    check "llama $1 greedy tokens equal the reference ($mode)" python3 -c "
import json,struct,sys
b=open(sys.argv[2],'rb').read(); n=struct.unpack('<H',b[8:10])[0]; want=list(struct.unpack('<8q',b[10+n:10+n+64]))
assert json.loads(sys.argv[1])['tokens']==want, (sys.argv[1], want)" "$out" "$DATA/llama/$1/greedy.npy"
  done
done

# A mixture of experts: info counts the experts and the parameters one token runs through (the
# Qwen3-MoE fixture's layer 0 has 8 experts of width 24 on a hidden size of 32, 2 per token; layer 1
# is dense).
moe_info=$("$KVPR" info --model "$DATA/llama/qwen3_moe_dense_layer_f32" --json)
check "info on a mixture of experts" python3 -c "
import json,sys; o=json.loads(sys.argv[1]); m=o['mixture_of_experts']
assert o['architecture']=='Qwen3MoeForCausalLM' and m['experts']==8 and m['per_token']==2 and m['moe_layers']==1, o
assert o['active_parameters']==o['parameters']-6*3*24*32, o" "$moe_info"

# YaRN (Qwen2.5's long-context recipe): info names the ramp and the attention factor, and the
# context is factor x original_max_position_embeddings (4 x 256).
yarn_info=$("$KVPR" info --model "$DATA/llama/qwen2_yarn_gqa_f32" --json)
check "info on a yarn config" python3 -c "
import json,sys; o=json.loads(sys.argv[1])
assert o['max_position_embeddings']==1024 and o['rope_scaling']=='yarn x4 (pairs 0-4, attention x1.139)', o" "$yarn_info"
check "info text on a yarn config" grep -q "context               1024 (yarn x4; max_position_embeddings 256)" \
  <<<"$("$KVPR" info --model "$DATA/llama/qwen2_yarn_gqa_f32")"

# Every KV mode gives the resident mode's greedy tokens; --json reports per-step split and bytes.
ref=$("$KVPR" generate --model "$tmp/demo" --prompt "The cache lives in host memory" -n 6 --json --kv-dtype f32)
for mode in offload recompute cpu-attn "kvpr --split 3" "auto --split 3 --gpu-kv-budget 0" \
    "auto --split 0 --gpu-kv-budget 16KiB --block-tokens 4" "auto --split 2 --gpu-kv-budget 1"; do
  got=$("$KVPR" generate --model "$tmp/demo" --prompt "The cache lives in host memory" -n 6 --json --kv-dtype f32 --kv-mode $mode)
  check "kv-mode $mode tokens" python3 -c "import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); assert a['tokens']==b['tokens'], (a['tokens'], b['tokens'])" "$ref" "$got"
done
# auto's tiers per step: none on the device with no budget, a 4-token block of f32 K and V (4
# layers x 2 x 128 x 4 x 4 bytes = 16 KiB) holds the tail, and the whole budget everything.
for case in "0 0" "16KiB 4" "1 all"; do
  read -r budget want <<<"$case"
  got=$("$KVPR" generate --model "$tmp/demo" --prompt "The cache lives in host memory" -n 6 --json --kv-dtype f32 --kv-mode auto --split 0 --gpu-kv-budget "$budget" --block-tokens 4)
  check "kv-mode auto --gpu-kv-budget $budget: resident tokens per step" python3 -c "
import json,sys; s=json.loads(sys.argv[1])['steps'][1:]; want=sys.argv[2]
r=[x['resident_tokens'] for x in s]; st=[x['staged_tokens'] for x in s]
assert all('resident_tokens' in x for x in s), s
if want == '0': assert r == [0]*len(s) and all(x > 0 for x in st), (r, st)
elif want == '4': assert all(x <= 4 for x in r) and any(x > 0 for x in r) and all(x > 0 for x in st), (r, st)
else: assert st == [0]*len(s) and all(x > 0 for x in r) and all(x['h2d_bytes'] == 0 for x in s), s" "$got" "$want"
done
# Speculative decoding: the same greedy tokens in fewer steps where the demo model repeats itself.
ref_loop=$("$KVPR" generate --model "$tmp/demo" --prompt "The cache lives in host memory and the cache lives" -n 30 --json --kv-dtype f32 --kv-mode offload)
spec_loop=$("$KVPR" generate --model "$tmp/demo" --prompt "The cache lives in host memory and the cache lives" -n 30 --json --kv-dtype f32 --kv-mode offload --speculative-tokens 4)
check "--speculative-tokens: same tokens, fewer steps" python3 -c "
import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); s=b['speculation']
assert a['tokens']==b['tokens'] and 0 < s['accepted'] <= s['proposed'] and len(b['steps']) < len(a['steps']), (a['steps'], b)
assert sum(x['accepted'] for x in b['steps']) == s['accepted'], b['steps']" "$ref_loop" "$spec_loop"
expect_error "bad --speculative-tokens" 2 "speculative-tokens must be in 0..64" -- generate --model "$tmp/demo" --prompt x --speculative-tokens 65
# fp8 KV cache: resident, offload and cpu-attn store and read the same bytes (the same tokens),
# and every step stores 1 byte per value (4 layers x (K + V) x 128 per token, and X for kvpr).
ref8=$("$KVPR" generate --model "$tmp/demo" --prompt "The cache lives in host memory" -n 6 --json --kv-dtype fp8)
for mode in offload cpu-attn "kvpr --split 3"; do
  got=$("$KVPR" generate --model "$tmp/demo" --prompt "The cache lives in host memory" -n 6 --json --kv-dtype fp8 --kv-mode $mode)
  check "fp8 kv-mode $mode" python3 -c "
import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); m=sys.argv[3]
assert len(b['tokens'])==6 and (m.startswith('kvpr') or a['tokens']==b['tokens']), (a['tokens'], b['tokens'])
if not m.startswith('cpu'): assert all(s['d2h_bytes']==4*(3 if m.startswith('kvpr') else 2)*128 for s in b['steps'][1:]), b['steps']" "$ref8" "$got" "$mode"
done
expect_error "bad --kv-dtype" 2 "expected f32, f16, bf16 or fp8" -- generate --model "$tmp/demo" --prompt x --kv-dtype fp4
got=$("$KVPR" generate --model "$tmp/demo" --prompt "The cache lives in host memory" -n 4 --json --kv-mode kvpr --split 3 --trace "$tmp/trace.json")
check "kvpr steps report split and bytes" python3 -c "
import json,sys; o=json.loads(sys.argv[1]); s=o['steps']
assert o['kv_mode']=='kvpr' and len(s)==4 and s[0]['split']==[0] and all(x['split']==[3] and x['split_source']=='forced' and x['h2d_bytes']>0 for x in s[1:]), s" "$got"
check "trace is Chrome trace JSON" python3 -c "
import json,sys; t=json.load(open(sys.argv[1]))['traceEvents']
tracks={e['args']['name'] for e in t if e.get('name')=='thread_name'}
assert {'compute','h2d','d2h'} <= tracks, tracks
assert any(e.get('name','').endswith('X[0:l]') for e in t)" "$tmp/trace.json"
"$KVPR" profile --model "$tmp/demo" --quick --emulate-link-gbps 1 --save "$tmp/profile.json" >/dev/null
check "profile saved" python3 -c "import json,sys; p=json.load(open(sys.argv[1])); assert 0.5 < p['h2d_gbps'] <= 1.05 and p['recompute_per_row_s'] > 0, p" "$tmp/profile.json"
got=$("$KVPR" generate --model "$tmp/demo" --prompt "The cache lives in host memory" -n 4 --json --kv-mode kvpr --profile "$tmp/profile.json" --emulate-link-gbps 1)
check "kvpr with a profile uses the scheduler" python3 -c "import json,sys; s=json.loads(sys.argv[1])['steps']; assert all(x['split_source'].startswith('scheduler:') for x in s), s" "$got"
check "info reports the device's weight bytes with and without --weights host" python3 -c "
import json,sys; o=json.loads(sys.argv[1]); d=o['device_weight_bytes']
assert d['device']==o['weight_bytes'] and d['host']==d['device']-4*o['streamed_layer_bytes']+2*o['streamed_layer_bytes'], o" "$("$KVPR" info --model "$tmp/demo" --json)"
check "info reports host bytes per mode" python3 -c "
import json,sys; h=json.loads(sys.argv[1])['host_bytes_per_token']
assert h['resident']==0 and h['offload']==2048 and h['kvpr']==3072 and h['recompute']==3072 and h['cpu-attn']==2048, h" "$("$KVPR" info --model "$tmp/demo" --json)"

if "$KVPR" topology --workers 1 >/dev/null 2>&1; then
  topo=$("$KVPR" topology --xml "$DATA/hwloc/four-gpu-two-socket.xml" --json)
  check "topology from XML" python3 -c "
import json,sys; t=json.loads(sys.argv[1]); w=t['workers']
assert [x['numa_node'] for x in w]==[0,0,1,1] and [x['cpus'] for x in w]==['0-1','2-3','4-5','6-7'], w" "$topo"
  expect_error "topology bad xml" 1 "no such file" -- topology --xml "$tmp/nope.xml"
fi
# A KV cache no host holds (a size given; a default one is sized by memory) is refused when the
# model is loaded, before it allocates, naming the weights and the cache.
expect_error "host memory plan" 1 "the weights need .* GiB and the KV cache of 2147483647 blocks x 16 tokens (room for .* sequences x 2048 tokens, kv mode offload) .* GiB together" \
  -- generate --model "$tmp/demo" --prompt a --kv-cache 100000GiB --kv-mode offload --weights host
# Without a size, the store is what host memory allows: a max-batch no host holds still generates.
"$KVPR" generate --model "$tmp/demo" --prompt a -n 2 --max-batch 100000000 --kv-mode offload --host-memory 64MiB \
  >"$tmp/out" 2>&1
check "a default store sized by memory" test $? = 0
# Paged KV's options: a size that is not one, and a store smaller than one block.
expect_error "bad kv-cache" 2 "kv-cache: 'lots' is not a number" -- generate --model "$tmp/demo" --prompt a --kv-cache lots
expect_error "bad kv-cache unit" 2 "kv-cache: '3PB' is not a size (bytes, KiB, MiB, GiB, TiB) or a fraction in (0, 1]" \
  -- generate --model "$tmp/demo" --prompt a --kv-cache 3PB
expect_error "kv-cache below one block" 1 "a KV cache of 1024 bytes holds less than one block of 16 tokens" \
  -- generate --model "$tmp/demo" --prompt a --kv-cache 1KiB
expect_error "block-tokens zero" 2 "block-tokens must be in 1..1048576, not 0" -- generate --model "$tmp/demo" --prompt a --block-tokens 0
out=$("$KVPR" generate --model "$tmp/demo" --prompt "Hello, my name is" -n 7 --json --kv-cache 0.01 --block-tokens 4)
check "generate with a paged store sized as a fraction of memory" python3 -c "import json,sys; assert len(json.loads(sys.argv[1])['tokens'])==7" "$out"
expect_error "split needs kvpr" 2 "split applies to kv-mode kvpr or auto, not resident" -- generate --model "$tmp/demo" --prompt a --split 3
expect_error "graphs need resident" 2 "cuda-graphs applies to kv-mode resident" -- generate --model "$tmp/demo" --prompt a --kv-mode kvpr --cuda-graphs
expect_error "bad weights" 2 "weights: expected device or host, got 'gpu'" -- generate --model "$tmp/demo" --prompt a --weights gpu
expect_error "graphs need device weights" 2 "cuda-graphs does not apply to weights host" -- generate --model "$tmp/demo" --prompt a --weights host --cuda-graphs
expect_error "bad kv-mode" 2 "kv-mode: expected resident, offload, kvpr, recompute, cpu-attn or auto, got 'fast'" -- generate --model "$tmp/demo" --prompt a --kv-mode fast
expect_error "bad gpu-kv-budget" 2 "gpu-kv-budget: 'most' is not a number" -- generate --model "$tmp/demo" --prompt a --kv-mode auto --gpu-kv-budget most
expect_error "gpu-kv-budget past the device" 1 "a GPU KV budget of 102400.00 GiB exceeds the .* GiB of device memory free: lower gpu-kv-budget" \
  -- generate --model "$tmp/demo" --prompt a --kv-mode auto --split 0 --gpu-kv-budget 100TiB
expect_error "bad link rate" 2 "--emulate-link-gbps must be > 0" -- generate --model "$tmp/demo" --prompt a --emulate-link-gbps 0
expect_error "missing profile file" 1 "nope.json: cannot open" -- generate --model "$tmp/demo" --prompt a --kv-mode kvpr --profile "$tmp/nope.json"
expect_error "no model dir" 1 "kvpr: error: /nonexistent: not a directory" -- generate --model /nonexistent --prompt hi
expect_error "missing option" 2 "missing required option --model" -- generate --prompt hi
expect_error "both prompts" 2 "exactly one of --prompt, --prompt-ids and --chat" -- generate --model "$tmp/demo" --prompt a --prompt-ids 1
expect_error "bad number" 2 "is not a valid number" -- generate --model "$tmp/demo" --prompt a -n abc
expect_error "bad ids" 2 "prompt-ids" -- generate --model "$tmp/demo" --prompt-ids 1,,2
expect_error "id out of range" 1 "token id 99999 is out of range" -- generate --model "$tmp/demo" --prompt-ids 99999
expect_error "bad temperature" 1 "temperature must be >= 0" -- generate --model "$tmp/demo" --prompt a --temperature -1
expect_error "bad presence penalty" 1 "presence_penalty must be in" -- generate --model "$tmp/demo" --prompt a --presence-penalty 3
expect_error "bad repetition penalty" 1 "repetition_penalty must be in .0.01, 100." -- generate --model "$tmp/demo" --prompt a --repetition-penalty 0
expect_error "bad min_p" 1 "min_p must be in" -- generate --model "$tmp/demo" --prompt a --min-p 2
# --chat renders one user turn in a chat template (here ChatML by name on the demo model) as kvprd
# would, and the prompt is that text's tokens.
outc=$("$KVPR" generate --model "$tmp/demo" --chat "Hi" --system "Be brief." --chat-template chatml -n 2 --json)
text=$(printf '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n.')
idsc=$("$KVPR" tokenize --model "$tmp/demo" --json --text "${text%.}")  # (the dot keeps the last newline)
check "generate --chat renders the template" python3 -c "
import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2])
assert a['prompt_ids']==b['ids'] and len(a['tokens'])==2, (a['prompt_ids'], b)" "$outc" "$idsc"
expect_error "chat options without --chat" 2 "--system, --chat-template and --no-thinking apply to --chat" -- generate --model "$tmp/demo" --prompt a --system b
# --no-thinking: Qwen3's template opens the answer with an empty think block.
outq=$("$KVPR" generate --model "$tmp/demo" --chat "Hi" --chat-template qwen3 --no-thinking -n 1 --json)
text=$(printf '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n.')
idsq=$("$KVPR" tokenize --model "$tmp/demo" --json --text "${text%.}")
check "generate --chat --no-thinking (qwen3)" python3 -c "
import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2])
assert a['prompt_ids']==b['ids'], (a['prompt_ids'], b)" "$outq" "$idsq"
expect_error "two prompts" 2 "give exactly one of --prompt, --prompt-ids and --chat" -- generate --model "$tmp/demo" --prompt a --chat b
expect_error "unknown chat template" 2 "unknown template 'vicuna'" -- generate --model "$tmp/demo" --chat a --chat-template vicuna
expect_error "bad top logprobs" 1 "top_logprobs must be in 0..20" -- generate --model "$tmp/demo" --prompt a --top-logprobs 21
expect_error "bad top-p" 1 "top_p must be in (0, 1]" -- generate --model "$tmp/demo" --prompt a --top-p 1.5
expect_error "unknown backend" 1 "unknown backend 'tpu'" -- generate --model "$tmp/demo" --prompt a --backend tpu
# Structured output: with a schema, the text is JSON the schema admits, and it ends (EOS) once
# complete (the demo model's random weights favour whitespace, up to 48 bytes in a row, so it
# takes ~100 tokens); a schema keyword the recognizer cannot enforce is a one-line error.
echo '{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false}' \
  >"$tmp/schema.json"
outj=$("$KVPR" generate --model "$tmp/demo" --prompt "JSON:" -n 300 --json-schema "$tmp/schema.json" --json)
check "--json-schema: the schema's JSON, ended once complete" python3 -c "
import json,sys; o=json.loads(sys.argv[1]); v=json.loads(o['text'])
assert o['finish_reason'] == 'stop' and list(v) == ['ok'] and isinstance(v['ok'], bool), o['text']" "$outj"
echo '{"type": "integer", "if": {"minimum": 3}, "then": {"maximum": 5}}' >"$tmp/unenforced.json"
expect_error "--json-schema with if" 1 "the keyword 'if' is not supported" -- generate --model "$tmp/demo" \
  --prompt x --json-schema "$tmp/unenforced.json"
# pattern, format, numeric bounds, a tuple (prefixItems) and a set (uniqueItems): the gibberish
# model writes what they admit.
echo '{"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-z]{3}-[0-9]$"},
  "day": {"type": "string", "format": "date"}, "n": {"type": "integer", "minimum": 10, "maximum": 12},
  "at": {"type": "array", "prefixItems": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "boolean"}],
         "minItems": 2, "maxItems": 2},
  "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": true, "minItems": 2}},
  "required": ["code", "day", "n", "at", "tags"], "additionalProperties": false}' >"$tmp/formats.json"
outf=$("$KVPR" generate --model "$tmp/demo" --prompt "Fill it in" -n 500 --json-schema "$tmp/formats.json" --json)
check "--json-schema with pattern, format, bounds, a tuple and a set" python3 -c "
import json,re,sys; o=json.loads(sys.argv[1]); v=json.loads(o['text'])
assert o['finish_reason'] == 'stop' and re.fullmatch('[a-z]{3}-[0-9]', v['code']), o['text']
assert re.fullmatch('[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])', v['day']) and v['n'] in (10, 11, 12), o['text']
a=v['at']; assert len(a)==2 and type(a[0]) is int and 0<=a[0]<=9 and type(a[1]) is bool, o['text']
t=v['tags']; assert len(t)>=2 and len(set(t))==len(t) and set(t)<={'a','b','c'}, o['text']" "$outf"
expect_error "--response-format yaml" 2 "expected text or json_object" -- generate --model "$tmp/demo" --prompt x \
  --response-format yaml
expect_error "unknown command" 2 "unknown command 'frobnicate'" -- frobnicate
expect_error "unknown option" 2 "unknown option '--bogus'" -- info --model "$tmp/demo" --bogus
cp -r "$tmp/demo" "$tmp/broken"
head -c 1000 "$tmp/demo/model.safetensors" >"$tmp/broken/model.safetensors"
expect_error "truncated weights" 1 "model.safetensors" -- info --model "$tmp/broken"

echo "cli: $pass passed, $fail failed"
[ "$fail" = 0 ]
