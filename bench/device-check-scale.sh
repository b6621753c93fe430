#!/usr/bin/env bash
# Issue 21's device check: scaling across GPU counts on one host, and kvprd serving on the GPU
# under HTTP load. One prepared command for the lent H200 (see bench/README.md):
#
#   here, once per session:   bench/prepare-device-carry.sh
#   device tool run:          command "set -o pipefail; KVPR_CHECK_COMMIT=<commit> bash bench/device-check-scale.sh 2>&1 | tee $OUT/log"
#                             carry [".carry"], timeout_s 540
#
# build (kvprd too, against .carry/daemon-prefix.tar.xz) -> kvpr-bench scale, N = 1, 2, 4, 8,
# kvpr, offload, cpu-attn -> a random-weights OPT checkpoint written by transformers -> kvprd on
# it in resident, offload and kvpr mode under bench/http_load.py at two concurrencies, next to
# kvpr-bench decode at the same batch and context (the daemon's overhead) -> the official openai
# client once, when the machine has Node.js and the carried package. Everything lands in $OUT:
# result-scale.json (all figures + hardware), scale.svg, log.
# Commit result-scale.json as bench/results/<date>-h200-scale-<commit>.json.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kvpr-device-check-scale}
mkdir -p "$OUT"
# Overridable for a dry run on a machine without a GPU (CPU backend, tiny model, a built tree).
PRESET=${KVPR_CHECK_PRESET:-opt-6.7b}
BACKEND=${KVPR_CHECK_BACKEND:-cuda}
SCALE_ARGS=${KVPR_CHECK_SCALE:---workers 1,2,4,8 --batch 8 --prompt 1024 --gen 3}
MODEL=${KVPR_CHECK_MODEL:-}              # a checkpoint to serve; empty: written here by transformers
BIN=${KVPR_CHECK_BIN:-}                  # a built tree (bench/, daemon/, worker/, cli/); empty: build
CONCURRENCY=${KVPR_CHECK_CONCURRENCY:-8 32}
HTTP_IN=${KVPR_CHECK_HTTP_IN:-512}
HTTP_OUT=${KVPR_CHECK_HTTP_OUT:-64}
SERVE_MODES=${KVPR_CHECK_SERVE_MODES:-resident offload kvpr}
JOBS=${KVPR_CHECK_JOBS:-16}
. bench/device-check-common.sh
record_hardware_and_commit

build_daemon_tree

say "kvpr-bench scale: $PRESET, $SCALE_ARGS, kvpr, offload, cpu-attn"
# shellcheck disable=SC2086
run timeout 300 "$BIN/bench/kvpr-bench" scale --preset "$PRESET" --backend "$BACKEND" $SCALE_ARGS \
    --json "$OUT/scale.json" --svg "$OUT/scale.svg" 2>&1 | tail -24

if [ -z "$MODEL" ]; then
  say "a random-weights $PRESET checkpoint, written by transformers"
  MODEL=/tmp/kvpr-$PRESET-random
  [ -s "$MODEL/config.json" ] || PYTHONUNBUFFERED=1 timeout 150 python3 bench/write_hf_checkpoint.py --preset "$PRESET" \
      --out "$MODEL" 2>&1 | tail -3
fi

# kvprd in each mode under load; then kvpr-bench decode at the same batch and context.
port=18400
maxc=0; for c in $CONCURRENCY; do [ "$c" -gt "$maxc" ] && maxc=$c; done
for mode in $SERVE_MODES; do
  if [ "$(elapsed)" -gt 430 ]; then say "kvprd $mode skipped: time is short"; continue; fi
  say "kvprd, $mode, under load (concurrency $CONCURRENCY, prompt $HTTP_IN, $HTTP_OUT tokens)"
  port=$((port + 1))
  ok=0
  start_kvprd "$port" "$OUT/kvprd-$mode.log" 470 --model "$MODEL" --backend "$BACKEND" --kv-mode "$mode" --max-batch "$maxc" \
    && ok=1
  if [ "$ok" = 1 ]; then
    for c in $CONCURRENCY; do
      left=$(( 480 - $(elapsed) )); [ "$left" -gt 150 ] && left=150
      if [ "$left" -lt 20 ]; then say "http load at $c skipped: time is short"; continue; fi
      timeout "$left" python3 bench/http_load.py --base-url "http://127.0.0.1:$port" --num-requests "$c" --concurrency "$c" \
          --input-len "$HTTP_IN" --output-len "$HTTP_OUT" --label "kvprd $mode c=$c" --json "$OUT/http-$mode-$c.json"
    done
    if [ "$mode" = kvpr ] && command -v node >/dev/null && [ -s .carry/npm-openai.tar.xz ]; then
      say "the official openai client against kvprd"
      mkdir -p /tmp/kvpr-npm && tar -xJf .carry/npm-openai.tar.xz -C /tmp/kvpr-npm
      NODE_PATH=/tmp/kvpr-npm timeout 60 node tests/daemon/openai_client_test.mjs "$port" "$(basename "$MODEL")" 2>&1 | tail -5
    elif [ "$mode" = kvpr ]; then
      say "the official openai client: skipped (no Node.js here, or no .carry/npm-openai.tar.xz)"
    fi
  else
    say "kvprd $mode did not become ready"; tail -20 "$OUT/kvprd-$mode.log"
  fi
  stop_kvprd
done
if [ "$(elapsed)" -lt 470 ]; then
  say "kvpr-bench decode at the served batch and context ($maxc, $HTTP_IN + $HTTP_OUT / 2)"
  modes=$(echo "$SERVE_MODES" | tr ' ' ,)
  run timeout 70 "$BIN/bench/kvpr-bench" decode --preset "$PRESET" --backend "$BACKEND" --batch "$maxc" \
      --prompt $(( HTTP_IN + HTTP_OUT / 4 )) --gen $(( HTTP_OUT / 2 )) --modes "$modes" --probe-mib 256 \
      --json "$OUT/decode.json" 2>&1 | tail -6
fi

say "collect"
PYTHONPATH=bench python3 - "$OUT" "$PRESET" "$maxc" $SERVE_MODES <<'PY'
import glob, json, os, sys
from device_check_result import header, load
out, preset, maxc, modes = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
res = dict(header(out), preset=preset, scale=load(os.path.join(out, 'scale.json')), http={},
           decode=load(os.path.join(out, 'decode.json')))
for p in sorted(glob.glob(os.path.join(out, 'http-*.json'))):
    res['http'][os.path.basename(p)[5:-5]] = load(p)
# The daemon's overhead at the largest concurrency: its decode time per token (TPOT p50, every
# sequence of the batch decoding) against kvpr-bench decode's step at that batch.
over = {}
d = res['decode']
for m in modes:
    h = res['http'].get(f'{m}-{maxc}')
    dm = next((x for x in (d or {}).get('modes', []) if x['mode'] == m), None)
    if h and dm and h.get('tpot_ms', {}).get('p50'):
        over[m] = {'served_tpot_ms_p50': h['tpot_ms']['p50'], 'bench_ms_per_step': dm['decode_ms_per_step_median'],
                   'served_decode_tokens_per_s': maxc / (h['tpot_ms']['p50'] / 1e3),
                   'bench_decode_tokens_per_s': dm['decode_tokens_per_s'],
                   'overhead': h['tpot_ms']['p50'] / dm['decode_ms_per_step_median'] - 1,
                   'served_output_tokens_per_s': h['output_tokens_per_s'], 'failed': h['failed']}
res['daemon_overhead'] = over
json.dump(res, open(os.path.join(out, 'result-scale.json'), 'w'), indent=1)
s = res['scale']
if s:
    for m in s['modes']:
        print(m['mode'], ' '.join('N=%d %.1f tok/s%s (w0 %.1f ms, eff %.2f)' % (p['workers'], p['aggregate_tokens_per_s'],
              '*' if p['projected'] else '', p['worker0_ms_per_step'], p['efficiency']) for p in m['points']))
for m, o in over.items():
    print('kvprd %s at %d: TPOT p50 %.2f ms vs kvpr-bench %.2f ms/step: overhead %+.1f%%, %d failed' % (
        m, maxc, o['served_tpot_ms_p50'], o['bench_ms_per_step'], 100 * o['overhead'], o['failed']))
PY
if [ -s "$OUT/result-scale.json" ]; then
  rm -f "$OUT"/{cmake.log,build.log,commit,gpu.csv,scale.json,decode.json} "$OUT"/http-*.json
  tar -czf "$OUT/kvprd-logs.tar.gz" -C "$OUT" $(cd "$OUT" && ls kvprd-*.log 2>/dev/null) 2>/dev/null && rm -f "$OUT"/kvprd-*.log
fi
ls "$OUT"
say "done"
