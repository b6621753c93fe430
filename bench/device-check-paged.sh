#!/usr/bin/env bash
# Issue 25's device check: paged KV on the H200. One prepared command for the lent device (see
# bench/README.md):
#
#   here, once per session:   bench/prepare-device-carry.sh
#   device tool run:          command "set -o pipefail; KVPR_CHECK_COMMIT=<commit> bash bench/device-check-paged.sh 2>&1 | tee $OUT/log"
#                             carry [".carry"], timeout_s 540
#
# build (kvprd too) -> kvpr-bench decode at the main point (OPT-6.7B shapes, batch 32, prompt
# 1024), every mode contiguous and in 16-token blocks, interleaved 3 times (the targets: kvpr and
# offload within 2% of the contiguous layout) -> the block size swept (8 .. 128) for kvpr and
# resident -> a random-weights OPT-6.7B checkpoint -> kvprd in kvpr mode, max-batch 256, serving
# 256 requests of mixed lengths at concurrency 160, /metrics' batch size sampled meanwhile (the
# target: >= 128 sequences at once). Everything lands in $OUT: result-paged.json (all figures +
# hardware), log. Commit it as bench/results/<date>-h200-paged-<commit>.json.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kvpr-device-check-paged}
mkdir -p "$OUT"
# Overridable for a dry run on a machine without a GPU (CPU backend, tiny model, a built tree).
PRESET=${KVPR_CHECK_PRESET:-opt-6.7b}
BACKEND=${KVPR_CHECK_BACKEND:-cuda}
DECODE=${KVPR_CHECK_DECODE:---batch 32 --prompt 1024 --gen 16}
MODEL=${KVPR_CHECK_MODEL:-}              # a checkpoint to serve; empty: written here by transformers
BIN=${KVPR_CHECK_BIN:-}                  # a built tree (bench/, daemon/, worker/, cli/); empty: build
SERVE=${KVPR_CHECK_SERVE:---num-requests 256 --concurrency 160 --input-len 128:1024 --output-len 32:256}
KV_CACHE=${KVPR_CHECK_KV_CACHE:-80GiB}   # kvprd's host KV store (OPT-6.7B kvpr: 0.75 MiB a token)
JOBS=${KVPR_CHECK_JOBS:-16}
. bench/device-check-common.sh
record_hardware_and_commit
build_daemon_tree

say "kvpr-bench decode: contiguous and paged (16-token blocks), $PRESET, $DECODE, 3 rounds"
# shellcheck disable=SC2086
run timeout 240 "$BIN/bench/kvpr-bench" decode --preset "$PRESET" --backend "$BACKEND" $DECODE --repeat 3 \
    --modes resident,resident@16,resident+graphs,resident+graphs@16,offload,offload@16,kvpr,kvpr@16 \
    --json "$OUT/decode-paged.json" 2>&1 | tail -30

if [ "$(elapsed)" -lt 300 ]; then
  say "kvpr-bench decode: the block size, 8 .. 128 tokens (kvpr, resident)"
  # shellcheck disable=SC2086
  run timeout 100 "$BIN/bench/kvpr-bench" decode --preset "$PRESET" --backend "$BACKEND" $DECODE \
      --modes kvpr,kvpr@8,kvpr@16,kvpr@32,kvpr@64,kvpr@128,resident,resident@8,resident@16,resident@32,resident@64,resident@128 \
      --json "$OUT/decode-blocks.json" 2>&1 | tail -16
fi

if [ -z "$MODEL" ] && [ "$(elapsed)" -lt 330 ]; then
  say "a random-weights $PRESET checkpoint, written by transformers"
  MODEL=/tmp/kvpr-$PRESET-random
  [ -s "$MODEL/config.json" ] || PYTHONUNBUFFERED=1 timeout 150 python3 bench/write_hf_checkpoint.py --preset "$PRESET" \
      --out "$MODEL" 2>&1 | tail -3
fi

if [ -n "$MODEL" ] && [ -s "$MODEL/config.json" ] && [ "$(elapsed)" -lt 420 ]; then
  say "kvprd, kvpr, max-batch 256, kv-cache $KV_CACHE: $SERVE"
  port=18500
  ok=0
  start_kvprd "$port" "$OUT/kvprd.log" 460 --model "$MODEL" --backend "$BACKEND" --kv-mode kvpr --max-batch 256 \
      --kv-cache "$KV_CACHE" && ok=1
  if [ "$ok" = 1 ]; then
    # The most sequences a worker ran at once, and its KV blocks, sampled every 0.2 s under load.
    python3 - "$port" "$OUT/batch-samples.json" <<'PY' &
import json, re, sys, time, urllib.request
port, out = sys.argv[1], sys.argv[2]
most, samples, health = 0, [], None
deadline = time.time() + 300
while time.time() < deadline:
    try:
        text = urllib.request.urlopen(f'http://127.0.0.1:{port}/metrics', timeout=2).read().decode()
        health = json.load(urllib.request.urlopen(f'http://127.0.0.1:{port}/health', timeout=2))
    except Exception:
        break
    b = sum(float(m.group(1)) for m in re.finditer(r'^kvpr_worker_batch_size\{[^}]*\} (\S+)$', text, re.M))
    most = max(most, b)
    samples.append(b)
    json.dump({'most_running': most, 'samples': samples[-2000:], 'health': health}, open(out, 'w'))
    time.sleep(0.2)
PY
    sampler=$!
    left=$(( 500 - $(elapsed) )); [ "$left" -gt 240 ] && left=240
    # shellcheck disable=SC2086
    timeout "$left" python3 bench/http_load.py --base-url "http://127.0.0.1:$port" $SERVE --label "kvprd kvpr paged" \
        --json "$OUT/http-paged.json" 2>&1 | tail -12
    sleep 1
    kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
  else
    say "kvprd did not become ready"; tail -20 "$OUT/kvprd.log"
  fi
  stop_kvprd
fi

say "collect"
PYTHONPATH=bench python3 - "$OUT" <<'PY'
import json, os, sys
from device_check_result import header, load
out = sys.argv[1]
res = dict(header(out), **{k: load(os.path.join(out, f)) for k, f in (
    ('decode_paged', 'decode-paged.json'), ('decode_blocks', 'decode-blocks.json'), ('serve', 'http-paged.json'),
    ('serve_batch', 'batch-samples.json'))})
for d in (res['decode_paged'], res['decode_blocks']):
    for m in (d or {}).get('modes', []):
        m.pop('steps', None)
json.dump(res, open(os.path.join(out, 'result-paged.json'), 'w'), indent=1)
if res['decode_paged']:
    print(json.dumps(res['decode_paged'].get('ratios', {}), indent=1))
if res['decode_blocks']:
    print(json.dumps(res['decode_blocks'].get('ratios', {}), indent=1))
if res['serve_batch']:
    print('most sequences running at once:', res['serve_batch']['most_running'])
PY
rm -f "$OUT"/{cmake.log,build.log,gpu.csv,commit,decode-paged.json,decode-blocks.json,http-paged.json,batch-samples.json}
ls "$OUT"
say "done"
