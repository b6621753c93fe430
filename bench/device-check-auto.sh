#!/usr/bin/env bash
# Issue 26's device check: kv mode auto on the H200. One prepared command for the lent device (see
# bench/README.md):
#
#   here, once per session:   bench/prepare-device-carry.sh
#   device tool run:          command "set -o pipefail; KVPR_CHECK_COMMIT=<commit> bash bench/device-check-auto.sh 2>&1 | tee $OUT/log"
#                             carry [".carry"], timeout_s 540
#
# build (kvprd too) -> kvpr-bench decode at the main point (OPT-6.7B shapes, fp16, batch 32, prompt
# 1024, 16-token blocks): resident, resident+graphs, offload, kvpr, and auto at GPU KV budgets of
# 0, 25, 50, 75 and 100% of the batch's KV, with the ms/step-vs-budget chart (the targets: auto
# within 1.05x of the physical bound of the best allocation at each budget, and within 3% of the
# best fixed mode) -> a random-weights OPT-1.3B checkpoint -> kvprd on the GPU without --kv-mode
# (auto, its budget the default 0.9 of free memory) and with --gpu-kv-budget 64MiB (the rest
# spilled to the host store): each serves the same greedy requests, /health shows the tiers, and
# the texts equal kvprd --kv-mode resident's. Everything lands in $OUT: result-auto.json (all
# figures + hardware), decode-auto-budget.svg, log. Commit them as
# bench/results/<date>-h200-auto-<commit>.{json,svg}.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kvpr-device-check-auto}
mkdir -p "$OUT"
# Overridable for a dry run on a machine without a GPU (CPU backend, tiny model, a built tree).
PRESET=${KVPR_CHECK_PRESET:-opt-6.7b}
BACKEND=${KVPR_CHECK_BACKEND:-cuda}
DECODE=${KVPR_CHECK_DECODE:---batch 32 --prompt 1024 --gen 16}
MODES=${KVPR_CHECK_MODES:-resident@16,resident+graphs@16,offload@16,kvpr@16,auto:0@16,auto:0.25@16,auto:0.5@16,auto:0.75@16,auto:1@16}
SERVE_PRESET=${KVPR_CHECK_SERVE_PRESET:-opt-1.3b}
MODEL=${KVPR_CHECK_MODEL:-}              # a checkpoint to serve; empty: written here by transformers
BIN=${KVPR_CHECK_BIN:-}                  # a built tree (bench/, daemon/, worker/, cli/); empty: build
SMALL_BUDGET=${KVPR_CHECK_SMALL_BUDGET:-64MiB}
JOBS=${KVPR_CHECK_JOBS:-16}
. bench/device-check-common.sh
record_hardware_and_commit
build_daemon_tree

say "kvpr-bench decode: auto at 0..100% of the batch's KV beside the fixed modes, $PRESET, $DECODE"
# shellcheck disable=SC2086
run timeout 300 "$BIN/bench/kvpr-bench" decode --preset "$PRESET" --backend "$BACKEND" $DECODE --modes "$MODES" \
    --json "$OUT/decode-auto.json" --budget-svg "$OUT/decode-auto-budget.svg" 2>&1 | tail -16

if [ -z "$MODEL" ] && [ "$(elapsed)" -lt 390 ]; then
  say "a random-weights $SERVE_PRESET checkpoint, written by transformers"
  MODEL=/tmp/kvpr-$SERVE_PRESET-random
  [ -s "$MODEL/config.json" ] || PYTHONUNBUFFERED=1 timeout 90 python3 bench/write_hf_checkpoint.py --preset "$SERVE_PRESET" \
      --out "$MODEL" 2>&1 | tail -3
fi

# kvprd with the given options: 6 greedy requests (prompts of 200-900 tokens, 64 new each) and
# its /health after them, into $OUT/serve-<name>.json.
serve() {
  local name=$1 port=$2
  shift 2
  [ "$(elapsed)" -lt 470 ] || { say "no time left for kvprd $name"; return; }
  say "kvprd $name: $*"
  if start_kvprd "$port" "$OUT/kvprd-$name.log" 490 --model "$MODEL" --backend "$BACKEND" "$@"; then
    timeout 60 python3 - "$port" "$OUT/serve-$name.json" "$OUT/kvprd-$name.log" <<'PY'
import json, sys, time, urllib.request
port, out, log = sys.argv[1], sys.argv[2], sys.argv[3]
def call(path, body=None):
    req = urllib.request.Request(f'http://127.0.0.1:{port}{path}', data=json.dumps(body).encode() if body else None,
                                 headers={'Content-Type': 'application/json'})
    return json.load(urllib.request.urlopen(req, timeout=50))
texts, t0 = [], time.time()
for i in range(6):
    ids = [(i * 7919 + j * 104729) % 50000 + 10 for j in range(200 + 140 * i)]
    r = call('/v1/completions', {'model': call('/v1/models')['data'][0]['id'], 'prompt': ids, 'max_tokens': 64,
                                 'temperature': 0, 'ignore_eos': True})
    texts.append(r['choices'][0]['text'])
seconds = time.time() - t0
time.sleep(1.2)  # the worker's next stats message
health = call('/health')
ready = [l for l in open(log) if 'ready (' in l]
json.dump({'texts': texts, 'seconds': seconds, 'health': health, 'ready': ready}, open(out, 'w'), indent=1)
print(out.rsplit('/', 1)[-1], f'{seconds:.1f} s;', ready[-1].strip() if ready else 'no ready line')
print(json.dumps(health['workers'][0].get('kv_cache', {}).get('tiers', {})))
PY
  else
    say "kvprd $name did not become ready"; tail -20 "$OUT/kvprd-$name.log"
  fi
  stop_kvprd
}

if [ -n "$MODEL" ] && [ -s "$MODEL/config.json" ]; then
  serve default 18600 --max-batch 8
  serve small-budget 18601 --max-batch 8 --kv-mode auto --gpu-kv-budget "$SMALL_BUDGET" --block-tokens 16
  serve resident 18602 --max-batch 8 --kv-mode resident
fi

say "collect"
PYTHONPATH=bench python3 - "$OUT" <<'PY'
import json, os, sys
from device_check_result import header, load
out = sys.argv[1]
serve = {n: load(os.path.join(out, f'serve-{n}.json')) for n in ('default', 'small-budget', 'resident')}
res = dict(header(out), decode_auto=load(os.path.join(out, 'decode-auto.json')), serve=serve)
ref = (serve['resident'] or {}).get('texts')
res['serve_texts_equal_resident'] = {n: (s or {}).get('texts') == ref for n, s in serve.items() if n != 'resident' and ref}
for m in (res['decode_auto'] or {}).get('modes', []):
    m.pop('steps', None)
json.dump(res, open(os.path.join(out, 'result-auto.json'), 'w'), indent=1)
d = res['decode_auto'] or {}
for m in d.get('modes', []):
    print(f"{m['mode']:22s} {m['decode_ms_per_step_median']:9.2f} ms/step  bound {m['bound_ms']:8.2f}  x{m['over_bound']:.2f}")
print(json.dumps(d.get('ratios', {}), indent=1))
print('texts equal resident:', res['serve_texts_equal_resident'])
PY
rm -f "$OUT"/{cmake.log,build.log,gpu.csv,commit,decode-auto.json,serve-default.json,serve-small-budget.json,serve-resident.json}
ls "$OUT"
say "done"
