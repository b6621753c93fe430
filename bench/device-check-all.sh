#!/usr/bin/env bash
# The device entry point: every waiting GPU measurement from one command, the most valuable
# first, each part skipped once bench/results holds its result for this tree. Run it first
# whenever the H200 is lent (bench/README.md, "The device entry point"):
#
#   here, once a session:  bench/prepare-device-carry.sh
#   device tool run:       command "KVPR_CHECK_COMMIT=<commit> bash bench/device-check-all.sh"
#                          carry [".carry"], timeout_s 600
#   here, after it:        python3 bench/device_parts.py collect <files_at> && python3 bench/results_tables.py
#
# One configure and one build (GPU tests, kvprd, kvpr-worker, kvpr, kvpr-bench against the
# carried prefix), then the parts of bench/device_parts.py's table in its order: a part runs
# when it is not measured yet and its estimate fits the time left of KVPR_DEVICE_BUDGET_S. Each
# part's JSON is $OUT/<part>.json (date, commit, hardware, fingerprint, status, its figures and
# targets), rewritten every 3 s while it runs and whole when it ends; its benchmarks write per mode
# or point as they go, so a part cut short keeps what it measured. $OUT never holds more than 8
# files (log, traces.tar.gz, parts.tar with earlier parts once needed, the parts' JSONs); raw
# files live outside it.
#
# Environment:
#   KVPR_CHECK_COMMIT      the commit measured (the device's git metadata may be stale)
#   KVPR_DEVICE_BUDGET_S   seconds for everything [570: one 600 s command, less a margin]
#   KVPR_DEVICE_PARTS      only these parts (comma-separated names) [all]
#   KVPR_DEVICE_DRY_RUN=1  on this CPU: the CPU backend, tiny shapes, results of kind dryrun
#   KVPR_DEVICE_BIN        a built tree to use instead of building (KVPR_DEVICE_PREFIX: the
#                          unpacked prefix it was built against)
#   KVPR_DEVICE_BUILD_DIR  where to build [build-device]; KVPR_DEVICE_BUILD_ARGS: more CMake arguments
#   KVPR_CARRY_DIR         what bench/prepare-device-carry.sh prepared [.carry]
#   KVPR_DEVICE_RESULTS    where measured results are looked up [bench/results]
#   KVPR_DEVICE_FLEXGEN    FlexLLMGen's folder [$KVPR_CARRY_DIR/flexllmgen]
#   OUT                    where results go [/tmp/kvpr-device-out]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kvpr-device-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1
start=$(date +%s)
DRY=${KVPR_DEVICE_DRY_RUN:-0}
KIND=h200
[ "$DRY" = 1 ] && KIND=dryrun
BUDGET=${KVPR_DEVICE_BUDGET_S:-570}
RESULTS=${KVPR_DEVICE_RESULTS:-bench/results}
ONLY=${KVPR_DEVICE_PARTS:-}
CARRY=${KVPR_CARRY_DIR:-.carry}
FLEXGEN=${KVPR_DEVICE_FLEXGEN:-$CARRY/flexllmgen}
# The commit, passed in (the device's copy of the tree may carry stale git metadata): results are
# filed and found by it.
COMMIT=${KVPR_CHECK_COMMIT:-}
if [ -z "$COMMIT" ] && [ "$DRY" = 1 ]; then COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo 000000000000); fi
if ! [[ $COMMIT =~ ^[0-9a-f]{7,40}$ ]]; then
  echo "device-check-all: KVPR_CHECK_COMMIT must be the measured commit's hex id (here: git rev-parse --short=12 HEAD), not '$COMMIT'" >&2
  exit 2
fi
RESERVE=8  # seconds left for the last part's JSON and the listing
# Raw files beside $OUT when that is one filesystem (parts.tar is then replaced by a rename).
RAW=$(dirname "$OUT")/.kvpr-device-raw
if ! { rm -rf "$RAW" && mkdir -p "$RAW" && [ "$(stat -c %d "$RAW")" = "$(stat -c %d "$OUT")" ]; }; then
  rm -rf "$RAW" 2>/dev/null; RAW=$(mktemp -d)
fi
PARTS_PY="python3 bench/device_parts.py"

# ---- what the parts measure with: settings and helpers (this text is in every part's fingerprint)
if [ "$DRY" = 1 ]; then
  # The same parts and order on this CPU at sizes it runs in seconds.
  BACKEND=cpu THREADS=2 PRESET=tiny SERVE_PRESET=tiny
  DECODE_MAIN="--batch 4 --prompt 48 --gen 4 --kv-dtype f32 --probe-mib 8" OPS="--batch 3 --ctx 40 --reps 2"
  TEST_FILTER='KvRuntime.BytesMovedFollowTheSplit:KvRuntime.AutoRecoversFromAStepThatFailedPartWay'
  HTTP="--input-len 32 --output-len 8" CONCURRENCY="2 4" SERVE_ARGS="--backend cpu --workers 1"
  SWEEP="2:32 1:16:fp8 2:16:host"
  SCALE="--workers 1,2 --batch 2 --prompt 24 --gen 2 --kv-dtype f32 --probe-mib 8"
  PAGED_SERVE="--num-requests 64 --concurrency 8 --input-len 16:48 --output-len 32:64" PAGED_KV=2MiB PAGED_BATCH=8
  SMALL_BUDGET=8KiB BLOCKS="--batch 4 --prompt 48 --gen 4 --kv-dtype f32 --probe-mib 8"
  FLEX_PROMPT=16 FLEX_GEN=4 FLEX_SPLIT=2x2
else
  BACKEND=cuda THREADS=16 PRESET=opt-6.7b SERVE_PRESET=opt-1.3b
  DECODE_MAIN="--batch 32 --prompt 1024 --gen 16" OPS="--batch 32 --ctx 1024"
  TEST_FILTER='*Cuda*:*KvModes*:*KvRuntime*:*OptForward*'
  HTTP="--input-len 512 --output-len 64" CONCURRENCY="8 32" SERVE_ARGS=""
  # batch:prompt[:fp8|host], in order of value: fp8 at the main point; launch-bound decode
  # (batch 1, prompt 128, where graphs pay most); the long context KV offloading is for
  # (8 x 8192: 16 sequences would pin 103 GB of the 128 GiB host); weights streamed; the rest.
  SWEEP="32:1024:fp8 1:128 8:512 64:1024 8:8192 32:1024:host 32:128 32:512"
  SCALE="--workers 1,2,4,8 --batch 8 --prompt 1024 --gen 3"
  PAGED_SERVE="--num-requests 256 --concurrency 160 --input-len 128:1024 --output-len 32:256"
  PAGED_KV=64GiB PAGED_BATCH=256  # OPT-1.3B in kvpr mode: 0.29 MB a token, ~55 GB for the load
  SMALL_BUDGET=64MiB BLOCKS="--batch 32 --prompt 1024 --gen 16"
  FLEX_PROMPT=512 FLEX_GEN=32 FLEX_SPLIT=
fi
# The main point: the token reference first, then what matters most if the part is cut short.
DECODE_MODES="resident,offload,kvpr,auto:0@16,auto:0.25@16,auto:0.5@16,auto:0.75@16,auto:1@16,resident@16,offload@16,kvpr@16,resident+graphs,recompute,resident+graphs@16,recompute@16"
[ "$DRY" = 1 ] && DECODE_MODES=${DECODE_MODES//,resident+graphs@16/} && DECODE_MODES=${DECODE_MODES//,resident+graphs/}

elapsed() { echo $(( $(date +%s) - start )); }
say() { echo "== [$(elapsed)s] $*"; }
# Our binaries see the carried libraries; python and torch keep the machine's.
run() { LD_LIBRARY_PATH=$LIBS "$@"; }

# within SECONDS CMD...: CMD under the lesser of SECONDS and what is left of the part's time.
# A command cut by it marks the part partial; one that fails marks it failed.
within() {
  local cap=$1 left rc
  shift
  left=$(( PART_DEADLINE - $(date +%s) ))
  [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -le 0 ]; then
    say "no time left for: $1"; PART_STATUS=partial; return 124
  fi
  timeout -k 5 "$cap" "$@"
  rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    say "cut at $cap s: $1"; PART_STATUS=partial
  elif [ $rc -ne 0 ] && [ "$PART_STATUS" = complete ]; then
    PART_STATUS=failed
  fi
  return $rc
}

# The checkpoint kvprd serves, in $MODEL (0 when there is one): transformers writes a
# random-weights OPT on the device (an independent writer), whole or not at all (moved into place
# once written); the dry run serves the demo model.
model_dir() {
  MODEL=$RAW/model-$SERVE_PRESET
  [ -s "$MODEL/config.json" ] && return 0
  rm -rf "$MODEL.part"
  local rc
  if [ "$DRY" = 1 ]; then
    run "$BIN/cli/kvpr" make-demo-model --out "$MODEL.part" > /dev/null
    rc=$?
  else
    PYTHONUNBUFFERED=1 within 150 python3 bench/write_hf_checkpoint.py --preset "$SERVE_PRESET" --out "$MODEL.part" \
        > "$RAW/checkpoint.txt" 2>&1
    rc=$?
    tail -2 "$RAW/checkpoint.txt"
  fi
  [ $rc -eq 0 ] && [ -s "$MODEL.part/config.json" ] && mv "$MODEL.part" "$MODEL"
}

# kvprd in the background (pid in $pid) until /health says ok: 0 when it did. start_kvprd PORT LOG ARGS...
start_kvprd() {
  local port=$1 log=$2
  shift 2
  LD_LIBRARY_PATH=$LIBS "$BIN/daemon/kvprd" --port "$port" --config /dev/null --worker-binary "$BIN/worker/kvpr-worker" \
      "$@" > "$log" 2>&1 &
  pid=$!  # kvprd itself (a plain command, not a function, in the background), so SIGTERM reaches it
  for _ in $(seq 1 600); do
    [ $(( PART_DEADLINE - $(date +%s) )) -gt 10 ] || return 1
    python3 -c "import json,urllib.request,sys; sys.exit(json.load(urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2))['status'] != 'ok')" 2>/dev/null && return 0
    kill -0 $pid 2>/dev/null || return 1
    sleep 0.5
  done
  return 1
}

# SIGTERM drains; past 20 s kvprd and its workers are killed (the next part needs the GPU).
stop_kvprd() {
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then pkill -KILL -P "$pid" 2>/dev/null; kill -KILL "$pid" 2>/dev/null; fi
  wait "$pid" 2>/dev/null
}

# The kv mode a kvprd log's workers said they run.
served_kv_mode() { sed -n 's/.*ready ([^,]*, kv mode \([a-z-]*\).*/\1/p' "$1" | head -1; }

# Six greedy requests (prompts of 200-900 tokens, 64 new each; the dry run's are shorter) and
# /health after them: serve_texts PORT OUT.json
serve_texts() {
  within 90 python3 - "$1" "$2" "$DRY" <<'PY'
import json, sys, time, urllib.request
port, out, dry = sys.argv[1], sys.argv[2], sys.argv[3] == '1'
def call(path, body=None):
    req = urllib.request.Request(f'http://127.0.0.1:{port}{path}', data=json.dumps(body).encode() if body else None,
                                 headers={'Content-Type': 'application/json'})
    return json.load(urllib.request.urlopen(req, timeout=60))
model = call('/v1/models')['data'][0]['id']
texts, t0 = [], time.time()
for i in range(6):
    n = (8 + 6 * i) if dry else (200 + 140 * i)
    ids = [(i * 7919 + j * 104729) % 50000 + 10 for j in range(n)]
    r = call('/v1/completions', {'model': model, 'prompt': ids, 'max_tokens': 8 if dry else 64, 'temperature': 0,
                                 'ignore_eos': True})
    texts.append(r['choices'][0]['text'])
seconds = time.time() - t0
time.sleep(1.2)  # the worker's next stats message
json.dump({'texts': texts, 'seconds': seconds, 'health': call('/health')}, open(out, 'w'), indent=1)
print(out.rsplit('/', 1)[-1], f'{seconds:.1f} s')
PY
}
# ---- end of helpers -------------------------------------------------------------------------

# ---- the parts (bench/device_parts.py has their order, estimates and inputs) ----------------

part_tests() {
  say "GPU tests: $TEST_FILTER"
  within 240 env KVPR_THREADS=$THREADS LD_LIBRARY_PATH="$LIBS" "$BIN/tests/kvpr_gpu_tests" --gtest_filter="$TEST_FILTER" \
      --gtest_output=json:"$PART_RAW/gtest.json" > "$PART_RAW/tests.txt" 2>&1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" "$PART_RAW/tests.txt" | tail -30
  # Failing tests run again under compute-sanitizer, which names the kernel and the bad access:
  # the next session fixes from that without another device run.
  local failed
  failed=$(python3 -c "
import json, sys
try: g = json.load(open('$PART_RAW/gtest.json'))
except Exception: print('*Cuda*'); sys.exit()
print(':'.join(s['name'] + '.' + t['name'] for s in g['testsuites'] for t in s['testsuite'] if t.get('failures')))")
  if [ -n "$failed" ] && [ "$DRY" != 1 ] && [ "$PART_STATUS" != partial ]; then
    say "compute-sanitizer memcheck on: $failed"
    within 120 env KVPR_THREADS=$THREADS LD_LIBRARY_PATH="$LIBS" "$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)" \
        --tool memcheck --print-limit 10 "$BIN/tests/kvpr_gpu_tests" --gtest_filter="$failed" > "$PART_RAW/sanitizer.txt" 2>&1
    grep -E "=========|FAILED" "$PART_RAW/sanitizer.txt" | head -30
  fi
  [ -z "$failed" ] || PART_STATUS=failed
}

part_decode() {
  say "kvpr-bench decode, $PRESET, $DECODE_MAIN: $DECODE_MODES"
  mkdir -p "$RAW/traces/decode"
  local traces=()
  [ "$DRY" = 1 ] || traces=(--trace-dir "$RAW/traces/decode")
  # shellcheck disable=SC2086
  within 420 env KVPR_THREADS=$THREADS LD_LIBRARY_PATH="$LIBS" "$BIN/bench/kvpr-bench" decode --preset "$PRESET" \
      --backend "$BACKEND" $DECODE_MAIN --modes "$DECODE_MODES" "${traces[@]}" --json "$PART_RAW/decode.json" \
      --svg "$PART_RAW/decode.svg" --budget-svg "$PART_RAW/decode-auto-budget.svg" > "$PART_RAW/decode.txt" 2>&1
  tail -22 "$PART_RAW/decode.txt"
  say "kvpr-bench ops: each op of a decode layer against the device's copy bandwidth"
  # shellcheck disable=SC2086
  within 60 env KVPR_THREADS=$THREADS LD_LIBRARY_PATH="$LIBS" "$BIN/bench/kvpr-bench" ops --preset "$PRESET" \
      --backend "$BACKEND" $OPS --json "$PART_RAW/ops.json" > "$PART_RAW/ops.txt" 2>&1
  tail -12 "$PART_RAW/ops.txt"
}

part_kvprd() {
  local model port=18601 c mode
  model_dir || { say "no checkpoint to serve"; PART_STATUS=failed; return; }
  model=$MODEL
  say "kvprd on $model in its default kv mode, max-batch 32: http_load at concurrency $CONCURRENCY ($HTTP)"
  # shellcheck disable=SC2086
  if ! start_kvprd $port "$PART_RAW/kvprd.log" --model "$model" --max-batch 32 $SERVE_ARGS; then
    say "kvprd did not become ready"; tail -20 "$PART_RAW/kvprd.log"; PART_STATUS=failed; stop_kvprd; return
  fi
  mode=$(served_kv_mode "$PART_RAW/kvprd.log")
  say "kvprd serves in kv mode ${mode:-?}"
  for c in $CONCURRENCY; do
    # shellcheck disable=SC2086
    within 150 python3 bench/http_load.py --base-url "http://127.0.0.1:$port" --num-requests "$c" --concurrency "$c" \
        $HTTP --label "kvprd $mode c=$c" --json "$PART_RAW/http-$c.json"
  done
  if command -v node > /dev/null && [ -s "$CARRY/npm-openai.tar.xz" ]; then
    say "the official openai client against kvprd"
    mkdir -p "$RAW/npm" && tar -xJf "$CARRY/npm-openai.tar.xz" -C "$RAW/npm"
    NODE_PATH=$RAW/npm within 60 node tests/daemon/openai_client_test.mjs "$port" "$(basename "$model")" > "$PART_RAW/openai-client.txt" 2>&1
    tail -3 "$PART_RAW/openai-client.txt"
  else
    say "the official openai client: skipped (no Node.js here, or no .carry/npm-openai.tar.xz)"
  fi
  within 10 python3 -c "import json,urllib.request; json.dump(json.load(urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=5)), open('$PART_RAW/health.json','w'))"
  stop_kvprd
  set -- $CONCURRENCY
  c=${!#}
  say "kvpr-bench decode at kvprd's largest batch and mean context: $SERVE_PRESET, batch $c, mode ${mode:-auto}"
  # shellcheck disable=SC2086
  within 120 env KVPR_THREADS=$THREADS LD_LIBRARY_PATH="$LIBS" "$BIN/bench/kvpr-bench" decode --preset "$SERVE_PRESET" \
      --backend "$BACKEND" --batch "$c" --prompt "$(echo $HTTP | awk '{print $2 + int($4 / 4)}')" \
      --gen "$(echo $HTTP | awk '{print int($4 / 2)}')" --modes "${mode:-auto}" --json "$PART_RAW/bench.json" \
      $( [ "$DRY" = 1 ] && echo --kv-dtype f32 --probe-mib 8 ) > "$PART_RAW/bench.txt" 2>&1
  tail -4 "$PART_RAW/bench.txt"
}

part_auto() {
  local model port=18611 name
  model_dir || { say "no checkpoint to serve"; PART_STATUS=failed; return; }
  model=$MODEL
  for name in default small-budget resident; do
    local args=()
    case $name in
      small-budget) args=(--kv-mode auto --gpu-kv-budget "$SMALL_BUDGET" --block-tokens 16) ;;
      resident) args=(--kv-mode resident) ;;
    esac
    port=$(( port + 1 ))
    say "kvprd $name: ${args[*]:-its defaults}"
    # shellcheck disable=SC2086
    if start_kvprd $port "$PART_RAW/kvprd-$name.log" --model "$model" --max-batch 8 $SERVE_ARGS "${args[@]}"; then
      serve_texts $port "$PART_RAW/serve-$name.json"
    else
      say "kvprd $name did not become ready"; tail -20 "$PART_RAW/kvprd-$name.log"; PART_STATUS=failed
    fi
    stop_kvprd
  done
}

# kvprd and its workers on the GPU under strace -f, against the unit's SystemCallFilter: every
# system call they make (the CUDA driver's included) must be in @system-service, or under systemd
# it would fail with EPERM.
part_syscalls() {
  local port=18631 strace=${PFX:+$PFX/bin/strace} allowed=${PFX:+$PFX/share/kvpr/system-service.syscalls} tracer kvprd_pid
  [ -n "$strace" ] && [ -x "$strace" ] || strace=$(command -v strace)
  if [ -z "$allowed" ] || [ ! -s "$allowed" ]; then
    allowed=$PART_RAW/system-service.syscalls
    python3 bench/syscall_filter.py expand @system-service > "$allowed" 2>/dev/null || rm -f "$allowed"
  fi
  if [ -z "$strace" ] || [ ! -s "$allowed" ]; then
    say "strace or the filter's list is not carried (bench/prepare-device-carry.sh)"; PART_STATUS=failed; return
  fi
  model_dir || { say "no checkpoint to serve"; PART_STATUS=failed; return; }
  if [ $(( PART_DEADLINE - $(date +%s) )) -le 20 ]; then
    say "kvprd under strace: no time left to start it"; PART_STATUS=failed; return
  fi
  say "kvprd under strace -f, its defaults"
  LD_LIBRARY_PATH=$LIBS "$strace" -f -qq -c -U name,calls,errors -o "$PART_RAW/strace.txt" "$BIN/daemon/kvprd" \
      --port $port --config /dev/null --worker-binary "$BIN/worker/kvpr-worker" --model "$MODEL" --max-batch 8 \
      $SERVE_ARGS > "$PART_RAW/kvprd.log" 2>&1 &
  tracer=$!
  local ok=0
  for _ in $(seq 1 600); do
    [ $(( PART_DEADLINE - $(date +%s) )) -gt 20 ] || break
    python3 -c "import json,urllib.request,sys; sys.exit(json.load(urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2))['status'] != 'ok')" 2>/dev/null && { ok=1; break; }
    kill -0 $tracer 2>/dev/null || break
    sleep 0.5
  done
  [ $ok = 1 ] && serve_texts $port "$PART_RAW/serve.json"
  [ $ok = 1 ] || { say "kvprd under strace did not become ready"; tail -20 "$PART_RAW/kvprd.log"; PART_STATUS=failed; }
  # Signals to kvprd, strace's child (strace would only detach); strace ends with it. (strace
  # forks it a moment after it starts: on a loaded machine the child may not be there at once.)
  for _ in $(seq 1 20); do
    kvprd_pid=$(cut -d' ' -f1 "/proc/$tracer/task/$tracer/children" 2>/dev/null)
    [ -n "$kvprd_pid" ] || ! kill -0 $tracer 2>/dev/null && break
    sleep 0.1
  done
  if [ -n "$kvprd_pid" ]; then pid=$kvprd_pid; stop_kvprd; fi
  for _ in $(seq 1 40); do kill -0 $tracer 2>/dev/null || break; sleep 0.5; done
  kill -KILL $tracer 2>/dev/null; wait $tracer 2>/dev/null
  # A kvprd strace let go of when it was killed keeps running: whatever still serves this port
  # goes too (its workers die with it).
  pkill -KILL -f "$BIN/daemon/kvprd --port $port " 2>/dev/null
  for _ in $(seq 1 20); do pgrep -f "$BIN/(daemon/kvprd --port $port |worker/kvpr-worker)" > /dev/null || break; sleep 0.25; done
  python3 bench/syscall_filter.py check --allowed "$allowed" "$PART_RAW/strace.txt" --json "$PART_RAW/syscalls.json" ||
      PART_STATUS=failed
}

# Sliding layers: Gemma 3's shape at 32k, what each mode moves against every layer full.
part_sliding() {
  local preset=gemma-3-4b prompt=32768 args=(--modes resident,offload,kvpr)
  if [ "$DRY" = 1 ]; then preset=gemma-3-tiny prompt=4096 args=(--modes offload,kvpr --kv-dtype f32 --probe-mib 8); fi
  say "kvpr-bench decode: sliding layers, $preset, batch 1, prompt $prompt"
  within 200 env KVPR_THREADS=$THREADS LD_LIBRARY_PATH="$LIBS" "$BIN/bench/kvpr-bench" decode --preset "$preset" \
      --backend "$BACKEND" --batch 1 --prompt "$prompt" --gen 8 "${args[@]}" --json "$PART_RAW/sliding.json" \
      > "$PART_RAW/sliding.txt" 2>&1
  tail -5 "$PART_RAW/sliding.txt"
}

# Quantized weights: batch-1 decode of Llama-3.2-1B's shape in each format, resident.
part_quantized() {
  local args=(--gen 32 --formats bf16,int4,int8,fp8,fp4,int4+head)
  if [ "$DRY" = 1 ]; then args=(--layers 1 --prompt 2 --gen 2 --formats bf16,int4); fi
  say "kvpr-bench weights: llama-3.2-1b, batch 1, each weight format"
  within 180 env KVPR_THREADS=$THREADS LD_LIBRARY_PATH="$LIBS" "$BIN/bench/kvpr-bench" weights --preset llama-3.2-1b \
      --backend "$BACKEND" "${args[@]}" --json "$PART_RAW/weights.json" > "$PART_RAW/weights.txt" 2>&1
  cat "$PART_RAW/weights.txt"
}

part_sweep() {
  local cfg b p k args name
  for cfg in $SWEEP; do
    IFS=: read -r b p k <<< "$cfg"
    name=sweep-$b-$p${k:+-$k}
    case $k in
      fp8) args=(--kv-dtype fp8 --modes resident,offload,kvpr) ;;
      host) args=(--weights host --modes resident,offload,kvpr) ;;
      *) if [ "$p" -gt 2000 ]; then args=(--max-positions $(( p + 64 )) --modes resident,resident+graphs,offload,kvpr)
         elif [ "$DRY" = 1 ]; then args=(--modes resident,offload,kvpr)
         else args=(--modes resident,resident+graphs,offload,kvpr); fi ;;
    esac
    [ "$DRY" = 1 ] && [ "$k" != fp8 ] && args+=(--kv-dtype f32 --probe-mib 8)
    [ "$DRY" = 1 ] && [ "$k" = fp8 ] && args+=(--probe-mib 8)
    say "sweep: batch $b, prompt $p ${k:+($k)}"
    within 90 env KVPR_THREADS=$THREADS LD_LIBRARY_PATH="$LIBS" "$BIN/bench/kvpr-bench" decode --preset "$PRESET" \
        --backend "$BACKEND" --batch "$b" --prompt "$p" --gen "$( [ "$DRY" = 1 ] && echo 3 || echo 12 )" "${args[@]}" \
        --json "$PART_RAW/$name.json" > "$PART_RAW/$name.txt" 2>&1
    tail -4 "$PART_RAW/$name.txt"
  done
}

part_scale() {
  say "kvpr-bench scale, $PRESET, $SCALE"
  # shellcheck disable=SC2086
  within 400 env KVPR_THREADS=$THREADS LD_LIBRARY_PATH="$LIBS" "$BIN/bench/kvpr-bench" scale --preset "$PRESET" \
      --backend "$BACKEND" $SCALE --json "$PART_RAW/scale.json" --svg "$PART_RAW/scale.svg" > "$PART_RAW/scale.txt" 2>&1
  tail -12 "$PART_RAW/scale.txt"
}

part_paged() {
  local model port=18621 sampler
  say "kvpr-bench decode: the block size 8 .. 128 (kvpr, resident)"
  # shellcheck disable=SC2086
  within 200 env KVPR_THREADS=$THREADS LD_LIBRARY_PATH="$LIBS" "$BIN/bench/kvpr-bench" decode --preset "$PRESET" \
      --backend "$BACKEND" $BLOCKS --json "$PART_RAW/blocks.json" \
      --modes kvpr,kvpr@8,kvpr@16,kvpr@32,kvpr@64,kvpr@128,resident,resident@8,resident@16,resident@32,resident@64,resident@128 \
      > "$PART_RAW/blocks.txt" 2>&1
  tail -14 "$PART_RAW/blocks.txt"
  model_dir || { say "no checkpoint to serve"; PART_STATUS=failed; return; }
  model=$MODEL
  say "kvprd, kvpr, max-batch $PAGED_BATCH, kv-cache $PAGED_KV: $PAGED_SERVE"
  # shellcheck disable=SC2086
  if ! start_kvprd $port "$PART_RAW/kvprd.log" --model "$model" --kv-mode kvpr --max-batch $PAGED_BATCH \
       --kv-cache "$PAGED_KV" $SERVE_ARGS; then
    say "kvprd did not become ready"; tail -20 "$PART_RAW/kvprd.log"; PART_STATUS=failed; stop_kvprd; return
  fi
  # The most sequences a worker ran at once, sampled every 0.1 s under the load (workers send
  # their stats every 0.5 s).
  python3 - "$port" "$PART_RAW/batch-samples.json" <<'PY' &
import json, os, re, sys, time, urllib.request
port, out = sys.argv[1], sys.argv[2]
most, samples, health = 0, [], None
while True:
    try:
        text = urllib.request.urlopen(f'http://127.0.0.1:{port}/metrics', timeout=2).read().decode()
        health = json.load(urllib.request.urlopen(f'http://127.0.0.1:{port}/health', timeout=2))
    except Exception:
        break
    b = sum(float(m.group(1)) for m in re.finditer(r'^kvpr_worker_batch_size\{[^}]*\} (\S+)$', text, re.M))
    most = max(most, b)
    samples.append(b)
    json.dump({'most_running': most, 'samples': samples[-2000:], 'health': health}, open(out + '.part', 'w'))
    os.replace(out + '.part', out)
    time.sleep(0.1)
PY
  sampler=$!
  # shellcheck disable=SC2086
  within 240 python3 bench/http_load.py --base-url "http://127.0.0.1:$port" $PAGED_SERVE --label "kvprd kvpr paged" \
      --json "$PART_RAW/http-paged.json"
  sleep 1
  kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
  stop_kvprd
}

# flexgen-<model>: kvpr-bench decode with weights and KV in host memory beside FlexLLMGen's
# policies (all on the CPU; the same with its CPU attention; half the weights on the GPU), OPT.
part_flexgen() {
  local model=${1#flexgen-} split gbs ngb i=0 percent flags
  case $model in opt-30b) split=16x2 ;; *) split=32x4 ;; esac
  split=${FLEX_SPLIT:-$split}
  gbs=${split%x*} ngb=${split#*x}
  say "$model: kvpr-bench decode, weights in host memory, batch $(( gbs * ngb )) as $ngb GPU batches, prompt $FLEX_PROMPT"
  mkdir -p "$RAW/traces/$model"
  local preset=$model
  [ "$DRY" = 1 ] && preset=tiny
  within 240 env KVPR_THREADS=$THREADS LD_LIBRARY_PATH="$LIBS" "$BIN/bench/kvpr-bench" decode --backend "$BACKEND" \
      --preset "$preset" --batch $(( gbs * ngb )) --gpu-batches "$ngb" --prompt "$FLEX_PROMPT" --gen "$FLEX_GEN" \
      --weights host --modes offload,kvpr,recompute --trace-dir "$RAW/traces/$model" --json "$PART_RAW/ours.json" \
      $( [ "$DRY" = 1 ] && echo --kv-dtype f32 --probe-mib 8 ) > "$PART_RAW/ours.txt" 2>&1
  tail -6 "$PART_RAW/ours.txt"
  # The Fig. 5b order on kvpr's trace: recompute under W_O / FFN on the link, never held back for them.
  if [ -s "$RAW/traces/$model/trace-kvpr.json" ]; then
    within 60 python3 bench/weight_pipeline.py "$RAW/traces/$model/trace-kvpr.json" --json "$PART_RAW/pipeline.json" \
        > "$PART_RAW/pipeline.txt" 2>&1
    tail -1 "$PART_RAW/pipeline.txt"
  fi
  # A policy FlexLLMGen cannot run here (past the host's or the GPU's memory) is its result, not
  # the part's failure: the part fails only when none ran.
  local status
  while IFS='|' read -r percent flags; do
    i=$(( i + 1 ))
    say "$model: FlexLLMGen $gbs x $ngb, percent $percent $flags"
    status=$PART_STATUS
    # shellcheck disable=SC2086
    PYTHONUNBUFFERED=1 within 215 python3 bench/flexgen_peer.py --flexgen "$FLEXGEN" --model "$model" \
        --prompt "$FLEX_PROMPT" --gen "$FLEX_GEN" --gpu-batch-size "$gbs" --num-gpu-batches "$ngb" --percent $percent $flags \
        --time-limit 200 --offload-dir "$RAW/flexllmgen_offload" --json "$PART_RAW/flexgen-$i.json" > "$PART_RAW/flexgen-$i.txt" 2>&1
    tail -3 "$PART_RAW/flexgen-$i.txt"
    # Its JSON written (a result, a refusal past memory, its own watchdog's time limit): that is
    # FlexLLMGen's outcome for the policy, not this part's failure.
    [ -s "$PART_RAW/flexgen-$i.json" ] && PART_STATUS=$status
  done <<'POLICIES'
0 100 0 100 0 100|
0 100 0 100 0 100|--cpu-cache-compute
50 50 0 100 0 100|
POLICIES
  grep -qs '"decode_tokens_per_s"' "$PART_RAW"/flexgen-*.json || { say "$model: no FlexLLMGen policy ran"; PART_STATUS=failed; }
}

# ---- the machinery ----------------------------------------------------------------------

# FlexLLMGen runs only when carried and where torch has CUDA (KVPR_DEVICE_FLEXGEN_ANYWAY=1: the
# dry run's stand-in of its API).
flexgen_available() {
  [ -f "$FLEXGEN/flexllmgen/flex_opt.py" ] || { echo "FlexLLMGen is not carried ($FLEXGEN: bench/prepare-device-carry.sh)"; return 1; }
  [ "${KVPR_DEVICE_FLEXGEN_ANYWAY:-0}" = 1 ] && return 0
  python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null || { echo "torch has no CUDA here"; return 1; }
}

assemble() {
  $PARTS_PY assemble "$PART" --raw "$PART_RAW" --out "$OUT/$PART.json" --status "$1" --header "$RAW/header.json" \
      --fingerprint "$PART_FP" --commit "$COMMIT" --kind "$KIND" --started "$PART_T0" --estimate "$PART_EST" --tmp "$RAW"
}

run_part() {
  local name=$1 est=$2 fp=$3 left pump
  left=$(( BUDGET - $(elapsed) - RESERVE ))
  if [ "$est" -gt "$left" ]; then say "$name: skipped, its estimate of $est s does not fit the $left s left"; return; fi
  $PARTS_PY make-room --out "$OUT" --raw "$RAW" --need 1 --running "$name" || return
  PART=$name PART_FP=$fp PART_EST=$est PART_RAW=$RAW/parts/$name PART_STATUS=complete
  PART_T0=$(date +%s.%N) PART_DEADLINE=$(( start + BUDGET - RESERVE ))
  rm -rf "$PART_RAW" && mkdir -p "$PART_RAW" && touch "$PART_RAW/.start"
  say "$name: start (estimate $est s, $left s left)"
  assemble running
  local self=$$
  ( while [ ! -e "$PART_RAW/.done" ] && kill -0 $self 2>/dev/null; do
      for _ in 1 2 3; do [ -e "$PART_RAW/.done" ] && break; sleep 1; done
      [ -e "$PART_RAW/.done" ] || assemble running
    done ) &
  pump=$!
  "part_${name%%-*}" "$name"
  touch "$PART_RAW/.done"
  wait $pump
  assemble "$PART_STATUS"
  say "$name: $PART_STATUS in $(python3 -c "import time; print(round(time.time() - $PART_T0))") s (estimate $est s)"
  # A part that wrote traces: one archive of every part's, when it fits what comes back.
  if [ -d "$RAW/traces" ] && [ -n "$(find "$RAW/traces" -type f -newer "$PART_RAW/.start" -print -quit)" ]; then
    tar -czf "$RAW/traces.tar.gz" -C "$RAW" traces
    if [ "$(stat -c %s "$RAW/traces.tar.gz")" -lt $(( 15 << 20 )) ]; then
      [ -e "$OUT/traces.tar.gz" ] || $PARTS_PY make-room --out "$OUT" --raw "$RAW" --need 1
      mv -f "$RAW/traces.tar.gz" "$OUT/traces.tar.gz"
    else
      say "traces: $(du -h "$RAW/traces.tar.gz" | cut -f1), over what comes back; left out"
    fi
  fi
}

build() {
  if [ -n "${KVPR_DEVICE_BIN:-}" ]; then
    BIN=$KVPR_DEVICE_BIN PFX=${KVPR_DEVICE_PREFIX:-}
    LIBS=${PFX:+$PFX/lib/x86_64-linux-gnu}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    say "using the built tree $BIN"; return 0
  fi
  PFX=$RAW/prefix
  LIBS=$PFX/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local device=cuda jobs=16
  [ "$DRY" = 1 ] && device=cpu jobs=2
  BIN=${KVPR_DEVICE_BUILD_DIR:-build-device}
  say "configure and build: GPU tests, kvprd, kvpr-worker, kvpr, kvpr-bench against the carried prefix"
  # shellcheck disable=SC2086
  bash bench/device-build.sh "$CARRY" "$PFX" "$BIN" $jobs $device kvpr kvpr-bench kvprd kvpr-worker kvpr_gpu_tests \
      -- ${KVPR_DEVICE_BUILD_ARGS:-}
}

header() {
  python3 - "$RAW/header.json" "$COMMIT" <<'PY'
import json, os, subprocess, sys
def smi(*q):
    try:
        return subprocess.run(['nvidia-smi', *q], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ''
keys = ['name', 'driver_version', 'memory.total', 'pcie.link.gen.current', 'pcie.link.gen.max', 'pcie.link.width.current',
        'clocks.max.sm']
gpus = [dict(zip(keys, [v.strip() for v in line.split(',')]))
        for line in smi('--query-gpu=' + ','.join(keys), '--format=csv,noheader').splitlines() if line.strip()]
cuda = next((l.split('CUDA Version')[1].strip(' :|').split()[0] for l in smi().splitlines() if 'CUDA Version' in l), None)
mem = next((int(l.split()[1]) * 1024 for l in open('/proc/meminfo') if l.startswith('MemTotal')), 0)
cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), '')
json.dump({'commit': sys.argv[2], 'hardware': {'gpus': gpus, 'cuda': cuda, 'cpus': os.cpu_count(), 'cpu': cpu,
                                               'memory_bytes': mem}}, open(sys.argv[1], 'w'), indent=1)
print('hardware:', ', '.join(g['name'] for g in gpus) or 'no GPU', f'CUDA {cuda},' if cuda else '',
      os.cpu_count(), 'CPUs,', round(mem / 2**30), 'GiB')
PY
}

say "kvpr device entry point: commit $COMMIT, kind $KIND, budget $BUDGET s, out $OUT"
header
$PARTS_PY plan --kind "$KIND" --results "$RESULTS" > "$RAW/plan.txt" || exit 1
todo=()
while read -r name est fp status measured; do
  if [ -n "$ONLY" ] && [[ ",$ONLY," != *",$name,"* ]]; then continue; fi
  if [ "$status" = measured ]; then say "$name: measured for this tree ($measured)"; continue; fi
  if [[ $name == flexgen-* ]] && ! why=$(flexgen_available); then say "$name: skipped: $why"; continue; fi
  todo+=("$name $est $fp")
  say "$name: to run (estimate $est s)"
done < "$RAW/plan.txt"
if [ ${#todo[@]} -eq 0 ]; then say "nothing to run: every part is measured for this tree"; exit 0; fi
build_est=$($PARTS_PY build-estimate --kind "$KIND")
build || { say "the build failed: no part runs (its errors above; the logs in ${BIN:-build-device}/device-build*.log)"; exit 1; }
say "build: $(elapsed) s (estimate $build_est s)"
for row in "${todo[@]}"; do
  # shellcheck disable=SC2086
  run_part $row
done
ls -l "$OUT"
say "done: $(find "$OUT" -maxdepth 1 -type f | wc -l) files in $OUT"
