#!/usr/bin/env bash
# kvpr-bench decode on a tiny model on the CPU backend (or KVPR_BENCH_BACKEND): every mode runs, gives the same greedy
# tokens (fp32 KV), and the JSON, chart and traces are written.
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# KVPR_BENCH_BACKEND=cuda runs the same checks on a CUDA backend (the emulated device in CI).
backend=${KVPR_BENCH_BACKEND:-cpu}
if [ "$backend" = cpu ]; then extra=(--emulate-link-gbps 1); else extra=(--probe-mib 8); fi
"$KVPR_BENCH" decode --preset tiny --backend "$backend" --batch 3 --prompt 40 --gen 4 --kv-dtype f32 \
  "${extra[@]}" --json "$tmp/d.json" --svg "$tmp/d.svg" --trace-dir "$tmp" >"$tmp/out" 2>&1 || { cat "$tmp/out"; exit 1; }
# kvpr-bench ops: every op of a decode layer timed, with bytes and rates.
if [ "$backend" = cpu ]; then extra=(); fi
"$KVPR_BENCH" ops --preset tiny --backend "$backend" --batch 3 --ctx 40 --reps 2 "${extra[@]}" --json "$tmp/ops.json" \
  >"$tmp/ops.out" 2>&1 || { cat "$tmp/ops.out"; exit 1; }
# --weights host: the layers' weights streamed from pinned host memory in every mode.
"$KVPR_BENCH" decode --preset tiny --backend "$backend" --batch 3 --prompt 40 --gen 4 --kv-dtype f32 --weights host \
  --modes resident,offload,kvpr "${extra[@]}" --json "$tmp/w.json" >"$tmp/w.out" 2>&1 || { cat "$tmp/w.out"; exit 1; }
# A Llama with grouped-query attention, weights streamed: KVPR never recomputes (X is not
# smaller than K+V) and every mode gives the same tokens.
"$KVPR_BENCH" decode --preset llama-tiny --backend "$backend" --batch 2 --prompt 24 --gen 3 --kv-dtype f32 --weights host \
  --modes resident,kvpr,cpu-attn "${extra[@]}" --json "$tmp/l.json" >"$tmp/l.out" 2>&1 || { cat "$tmp/l.out"; exit 1; }
# kv mode auto across GPU KV budgets (none, half, all of the batch's KV, 4-token blocks) beside
# the fixed modes: the same tokens, fewer bytes over the link as the budget grows, the
# ms/step-vs-budget chart.
"$KVPR_BENCH" decode --preset tiny --backend "$backend" --batch 3 --prompt 40 --gen 4 --kv-dtype f32 \
  --modes resident@4,offload@4,kvpr@4,auto:0@4,auto:0.5@4,auto:1@4 "${extra[@]}" --json "$tmp/a.json" \
  --budget-svg "$tmp/a.svg" >"$tmp/a.out" 2>&1 || { cat "$tmp/a.out"; exit 1; }
# Qwen3's shape: per-head Q/K norms, heads of 64 on a hidden size of 128 (Q 256 wide), K+V
# twice as wide as X: recomputing K from X (through k_norm) gives the tokens of resident decoding.
# (CPU backend only: on the emulated device the profile's recompute sweep alone takes 40 s; the
# emulated-GPU suite runs every KV mode on the Qwen3 fixtures instead.)
if [ "$backend" = cpu ]; then
  "$KVPR_BENCH" decode --preset qwen3-tiny --backend "$backend" --batch 2 --prompt 16 --gen 2 --kv-dtype f32 \
    --modes resident,recompute "${extra[@]}" --json "$tmp/q.json" >"$tmp/q.out" 2>&1 || { cat "$tmp/q.out"; exit 1; }
fi
# kvpr-bench json: the JSON-mask cost on GPT-2's vocabulary (CPU work; once is enough).
if [ "$backend" = cpu ]; then
  "$KVPR_BENCH" json --reps 1 --json "$tmp/j.json" >"$tmp/j.out" 2>&1 || { cat "$tmp/j.out"; exit 1; }
  python3 - "$tmp/j.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r['vocab'] == 50257 and len(r['cases']) == 9, r
c = {x['state']: x for x in r['cases']}
assert c['json_object: first token']['allowed'] > 0 and c['json_object: inside a string']['allowed'] > 40000, c
assert c["schema: a closed object's key"]['allowed'] < 100, c  # only the properties' starts
assert 0 < c['schema: inside a date-time']['allowed'] < 1000, c  # tokens that go on with the day's digit
assert c["schema: inside a pattern's free text"]['allowed'] > 1000, c  # lowercase words
PY
fi
# kvpr-bench serve: prefix caching, chunked prefill and speculative decoding on and off give the
# same tokens, and the cache spares every second turn its first turn's prompt and answer (but the
# last answer token).
if [ "$backend" = cpu ]; then
  "$KVPR_BENCH" serve --preset tiny --backend cpu --kv-dtype f32 --conversations 2 --prompt 24 --answer 4 --new 5 \
    --decoders 2 --long-prompt 40 --chunk 8 --json "$tmp/s.json" >"$tmp/s.out" 2>&1 || { cat "$tmp/s.out"; exit 1; }
  python3 - "$tmp/s.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
p, c = r['prefix_caching'], r['chunked_prefill']
off, on = p['runs']
assert p['same_tokens'] and c['same_tokens'], r
assert off['cached_tokens'] == 0 and on['cached_tokens'] == 2 * ((24 + 4 - 1) // 16 * 16), p  # whole 16-token blocks
assert on['prefilled_tokens'] == off['prefilled_tokens'] - on['cached_tokens'] and on['ttft_all_ms'] > 0, p
whole, chunked = c['runs']
assert whole['steps_to_first_token'] == 1 and chunked['steps_to_first_token'] == 7, c  # 40 tokens, 8 - 2 decoding = 6 a step
assert chunked['decoder_max_gap_ms'] > 0 and chunked['long_prompt_ttft_ms'] > 0, c
sp = r['speculative_decoding']
one, spec = sp['runs']
assert sp['same_tokens'] and one['drafts'] == 0 and one['tokens'] == spec['tokens'] == 2 * (4 * 4 - 1), sp
assert 0 <= spec['accepted'] <= spec['drafts'] and spec['decode_steps'] <= one['decode_steps'], sp
assert sp['step_cost_ratio'] > 0 and set(sp['implied_speedup_at_acceptance']) == {'0.3', '0.5', '0.7', '0.9'}, sp
PY
fi
python3 - "$tmp" <<'PY'
import json, sys, os, xml.dom.minidom
d = sys.argv[1]
r = json.load(open(os.path.join(d, 'd.json')))
modes = {m['mode']: m for m in r['modes']}
want = {'resident', 'offload', 'kvpr', 'recompute', 'cpu-attn'}
if not r['device'].startswith('cpu'):  # a GPU also runs resident decode steps as CUDA graphs
    want.add('resident+graphs')
    g = modes['resident+graphs']
    assert [s['graph'] for s in g['steps']] == ['eager', 'captured', 'replayed', 'replayed'], g['steps']
    assert g['graph_replayed_steps'] == 2 and 'resident_graphs_speedup' in r['ratios']
assert set(modes) == want, modes.keys()
for name, m in modes.items():
    assert m['tokens_equal_to_first_mode'] == 1.0, (name, m['tokens_equal_to_first_mode'])
    assert len(m['steps']) == 4 and m['bound_ms'] > 0 and 0 <= m['compute_busy_fraction'] <= 1, name
    assert m['model_bound_ms'] > 0 and m['over_model_bound'] > 0, name
    assert 0 < m['host_issue_ms_per_step_median'] and m['compute_ops_per_step'] > 0, name
    assert all(0 < s['host_issue_ms'] <= s['ms'] for s in m['steps']), name
    json.load(open(os.path.join(d, 'trace-%s.json' % name)))
assert modes['resident']['h2d_bytes_per_step'] == 0
assert modes['offload']['h2d_bytes_per_step'] > modes['recompute']['h2d_bytes_per_step'] > 0
assert r['profile']['h2d_gbps'] > 0 and 'kvpr_speedup_over_offload' in r['ratios']
assert r['recompute_gemm_tflops'] > 0 and 0 <= r['kvpr_best_split_physical']
xml.dom.minidom.parse(os.path.join(d, 'd.svg'))
ops = json.load(open(os.path.join(d, 'ops.json')))
names = [o['op'] for o in ops['ops']]
for want in ('qkv: one batched GEMM', 'qkv: three GEMMs', 'fc2 + residual: linear_accumulate', 'decode attention (ctx 40)', 'new K rows: copy_rows',
             'argmax_lse (greedy)', 'decode layer: op by op', 'decode layer: CUDA graph'):
    assert want in names, (want, names)
assert ops['device_copy_gbps'] > 0
for o in ops['ops']:
    assert o['ms'] > 0 and o['bytes'] > 0 and o['gbps'] > 0, o
w = json.load(open(os.path.join(d, 'w.json')))
assert w['weights'] == 'host' and 0 < w['device_weight_bytes'] < w['weight_bytes'], w
wm = {m['mode']: m for m in w['modes']}
assert set(wm) == {'resident', 'offload', 'kvpr'}, wm.keys()
for name, m in wm.items():
    assert m['tokens_equal_to_first_mode'] == 1.0 and m['bound_ms'] > 0, name
    # Four layers, two slots: every layer crosses the link once per decode step.
    assert all(s['h2d_bytes'] >= w['streamed_weight_bytes'] for s in m['steps']), (name, m['steps'])
assert all(s['h2d_bytes'] == w['streamed_weight_bytes'] for s in wm['resident']['steps']), wm['resident']['steps']
assert wm['offload']['h2d_bytes_per_step'] - w['streamed_weight_bytes'] == modes['offload']['h2d_bytes_per_step']
l = json.load(open(os.path.join(d, 'l.json')))
assert l['preset'] == 'llama-tiny' and l['weights'] == 'host', l['preset']
for m in l['modes']:
    assert m['tokens_equal_to_first_mode'] == 1.0 and m['bound_ms'] > 0, m['mode']
    if m['mode'] == 'kvpr':
        assert all(s['split'] == 0 for s in m['steps']), m['steps']
a = json.load(open(os.path.join(d, 'a.json')))
am = {m['mode']: m for m in a['modes']}
for m in a['modes']:
    assert m['tokens_equal_to_first_mode'] == 1.0 and m['bound_ms'] > 0, m['mode']
none, half, full = am['auto:0@4'], am['auto:0.5@4'], am['auto:1@4']
# (Bytes against kvpr's would depend on the splits each run's timings choose: the tiers do not.)
assert none['resident_tokens_per_step'] == 0 < half['resident_tokens_per_step'] < full['resident_tokens_per_step'], a['modes']
assert none['staged_tokens_per_step'] > half['staged_tokens_per_step'] > full['staged_tokens_per_step'] == 0, a['modes']
assert none['h2d_bytes_per_step'] > 0 and half['h2d_bytes_per_step'] > 0 and full['h2d_bytes_per_step'] == 0, a['modes']
assert none['device_tier_bytes'] == 0 < half['device_tier_bytes'] < full['device_tier_bytes'], a['modes']
assert full['bound_ms'] == am['resident@4']['bound_ms'] and none['bound_ms'] == am['kvpr@4']['bound_ms'], a['modes']
assert all(f'auto:{f}@4_over_best_fixed_mode' in a['ratios'] for f in ('0', '0.5', '1')), a['ratios']
xml.dom.minidom.parse(os.path.join(d, 'a.svg'))
if r['device'].startswith('cpu'):
    q = json.load(open(os.path.join(d, 'q.json')))
    assert q['preset'] == 'qwen3-tiny' and [m['mode'] for m in q['modes']] == ['resident', 'recompute'], q['preset']
    for m in q['modes']:
        assert m['tokens_equal_to_first_mode'] == 1.0 and m['bound_ms'] > 0, m['mode']
print('bench smoke: 1 passed, 0 failed')
PY
