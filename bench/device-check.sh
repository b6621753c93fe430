#!/usr/bin/env bash
# The device check: one prepared command for the lent H200 (see ../shared/device-notes.md).
#
#   here, once per session:   bench/prepare-device-carry.sh
#   device tool run:          command "set -o pipefail; KVPR_CHECK_COMMIT=<commit> bash bench/device-check.sh 2>&1 | tee $OUT/log"
#                             carry [".carry"], timeout_s 540
#
# nvidia-smi (GPU, driver, PCIe) -> build for sm_90 there -> GPU tests -> HF offloaded-cache
# peer -> kvpr-bench decode (every mode) -> a smaller sweep and kvpr-bench serve if time allows. Everything lands
# in $OUT: result.json (all numbers + hardware), decode.svg, traces.tar.gz, ops.json, log, and
# sanitizer.txt when a GPU test failed.
# Commit result.json as bench/results/<date>-h200-<commit>.json.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kvpr-device-check}
mkdir -p "$OUT"
# Overridable for a dry run on a machine without a GPU (CPU backend, tiny model).
PRESET=${KVPR_CHECK_PRESET:-opt-6.7b}
BATCH=${KVPR_CHECK_BATCH:-32}
PROMPT=${KVPR_CHECK_PROMPT:-1024}
GEN=${KVPR_CHECK_GEN:-32}
SWEEP=${KVPR_CHECK_SWEEP:-1}
SERVE_SIZES=${KVPR_CHECK_SERVE:---conversations 8 --prompt 1024 --answer 32 --new 128 --decoders 8 --long-prompt 1536 --chunk 256}
JOBS=${KVPR_CHECK_JOBS:-16}
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
say() { echo "== [$(elapsed)s] $*"; }

say "hardware"
nvidia-smi -q > "$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,clocks.max.sm --format=csv | tee "$OUT/gpu.csv"
nproc; free -g | head -2

say "build (sm_90)"
GTEST=""
[ -d .carry/googletest ] && GTEST="-DKVPR_GTEST_SOURCE=$PWD/.carry/googletest"
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DKVPR_WERROR=OFF -DKVPR_TEXT_LIBS=OFF $GTEST > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
ninja -C build-device -j "$JOBS" kvpr kvpr-bench $( [ -n "$GTEST" ] && echo kvpr_tests ) > "$OUT/build.log" 2>&1 \
  || { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
# The commit as the caller passes it (the device's copy of the tree may carry stale git metadata).
if [ -n "${KVPR_CHECK_COMMIT:-}" ]; then echo "$KVPR_CHECK_COMMIT" > "$OUT/commit"
else git rev-parse --short=12 HEAD 2>/dev/null > "$OUT/commit" || echo unknown > "$OUT/commit"; fi

if [ -n "$GTEST" ]; then
  say "GPU tests"
  KVPR_THREADS=16 timeout 240 build-device/tests/kvpr_tests --gtest_filter='*Cuda*:*KvModes*:*OptForward*' \
      --gtest_output=json:"$OUT/gtest.json" 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|mismatch|OK \]" | tail -60
  # Failing (or crashed) GPU tests run again under compute-sanitizer, which names the kernel
  # and the bad access: the next session fixes from that, without another device run.
  failed=$(python3 - "$OUT/gtest.json" <<'PY'
import json, sys
try:
    g = json.load(open(sys.argv[1]))
except Exception:
    print('CRASH'); sys.exit()
print(':'.join(s['name'] + '.' + t['name'] for s in g.get('testsuites', []) for t in s.get('testsuite', [])
               if t.get('failures')))
PY
)
  if [ -n "$failed" ]; then
    [ "$failed" = CRASH ] && failed='*CudaOps*F16*:Cuda.ArgmaxLse*'
    say "compute-sanitizer memcheck on: $failed"
    SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    KVPR_THREADS=16 timeout 120 "$SAN" --tool memcheck --print-limit 10 build-device/tests/kvpr_tests \
        --gtest_filter="$failed" > "$OUT/sanitizer.txt" 2>&1
    grep -E "=========|FAILED|Failure" "$OUT/sanitizer.txt" | head -40
  fi
else
  say "GPU tests skipped: no .carry/googletest (run bench/prepare-device-carry.sh here first)"
fi

say "kvpr-bench ops: each op of a decode layer against the device copy bandwidth"
KVPR_THREADS=16 timeout 60 build-device/bench/kvpr-bench ops --preset "$PRESET" --batch "$BATCH" --ctx "$PROMPT" \
    --json "$OUT/ops.json" 2>&1 | tail -32

say "HF transformers offloaded-cache peer"
[ "$(elapsed)" -lt 330 ] || say "HF peer skipped: time is short"
[ "$(elapsed)" -lt 330 ] && PYTHONUNBUFFERED=1 timeout 200 python3 bench/hf_offload_peer.py --preset "$PRESET" --batch "$BATCH" --prompt "$PROMPT" --gen "$GEN" \
    --out "$OUT/hf.json" 2>&1 | tail -5
PEER=""
[ -s "$OUT/hf.json" ] && PEER="--peer $OUT/hf.json"

say "kvpr-bench decode, $PRESET shapes, batch $BATCH, prompt $PROMPT, $GEN tokens, every mode"
mkdir -p "$OUT/traces"
left=$(( 530 - $(elapsed) )); [ "$left" -gt 300 ] && left=300; [ "$left" -lt 60 ] && left=60
KVPR_THREADS=16 timeout "$left" build-device/bench/kvpr-bench decode --preset "$PRESET" --batch "$BATCH" --prompt "$PROMPT" --gen "$GEN" \
    $PEER --json "$OUT/decode.json" --svg "$OUT/decode.svg" --trace-dir "$OUT/traces"

sweep=()
# "host": the layers' weights streamed from pinned host memory (--weights host) in every mode.
# In priority order: fp8 at the main point, then issue 20's sweep (batch 1 / prompt 128 is
# launch-bound decode, where graphs pay most; 8 / 8192 the long context KV offloading is for:
# the issue's 16 sequences would pin 103 GB of the device host's 128 GiB for kvpr's K, V and X),
# then the rest.
for cfg in "32 1024 fp8" "1 128" "8 512" "64 1024" "8 8192" "32 1024 host" "32 128" "32 512"; do
  [ "$SWEEP" = 1 ] || break
  if [ "$(elapsed)" -gt 360 ]; then say "sweep: stopping, time is short"; break; fi
  set -- $cfg
  name="sweep-$1-$2${3:+-$3}"
  if [ "${3:-}" = host ]; then
    say "sweep: batch $1, prompt $2, weights streamed from host memory (resident, offload, kvpr)"
    args=(--weights host --modes resident,offload,kvpr)
  elif [ "$2" -gt 2000 ]; then
    say "sweep: batch $1, prompt $2, OPT's widths past its 2048 positions (resident with and without graphs, offload, kvpr)"
    args=(--max-positions $(( $2 + 64 )) --modes resident,resident+graphs,offload,kvpr)
  elif [ "${3:-}" = fp8 ]; then
    say "sweep: batch $1, prompt $2, fp8 KV cache: half the link bytes (resident, offload, kvpr)"
    args=(--kv-dtype fp8 --modes resident,offload,kvpr)
  else
    say "sweep: batch $1, prompt $2 (resident with and without graphs, offload, kvpr)"
    args=(--modes resident,resident+graphs,offload,kvpr)
  fi
  KVPR_THREADS=16 timeout 90 build-device/bench/kvpr-bench decode --preset "$PRESET" --batch "$1" --prompt "$2" \
      --gen 12 "${args[@]}" --json "$OUT/$name.json" > "$OUT/$name.txt" 2>&1 \
    && sweep+=("$OUT/$name.json")
  tail -6 "$OUT/$name.txt"
done

# Serving: the prefix cache, chunked prefill and speculative decoding, each off and on, in the
# product's mode.
if [ "$(elapsed)" -lt 420 ]; then
  say "kvpr-bench serve: prefix cache, chunked prefill, speculative decoding, $PRESET, kvpr"
  KVPR_THREADS=16 timeout 100 build-device/bench/kvpr-bench serve --preset "$PRESET" --kv-mode kvpr $SERVE_SIZES \
      --json "$OUT/serve.json" > "$OUT/serve.txt" 2>&1
  tail -10 "$OUT/serve.txt"
fi

say "collect"
tar -czf "$OUT/traces.tar.gz" -C "$OUT" traces 2>/dev/null && rm -rf "$OUT/traces"
python3 - "$OUT" "${sweep[@]}" <<'PY'
import json, os, sys, datetime
out = sys.argv[1]
def load(name):
    p = os.path.join(out, name)
    return json.load(open(p)) if os.path.exists(p) and os.path.getsize(p) else None
def text(name):
    p = os.path.join(out, name)
    return open(p).read() if os.path.exists(p) else ''
smi = text('nvidia-smi.txt')
def field(key):
    for line in smi.splitlines():
        if line.strip().startswith(key):
            return line.split(':', 1)[1].strip()
    return None
gpu = {}
rows = [r.strip() for r in text('gpu.csv').splitlines() if r.strip()]
if len(rows) >= 2:
    gpu = dict(zip([h.strip() for h in rows[0].split(',')], [v.strip() for v in rows[1].split(',')]))
gtest = load('gtest.json')
result = {
    'date': datetime.datetime.utcnow().strftime('%Y-%m-%dT%H:%M:%SZ'),
    'commit': text('commit').strip(),
    'hardware': {'gpu': gpu, 'driver': field('Driver Version'), 'cuda': field('CUDA Version'),
                 'cpus': os.cpu_count(),
                 'memory_bytes': next((int(l.split()[1]) * 1024 for l in open('/proc/meminfo') if l.startswith('MemTotal')), 0)},
    'gpu_tests': None if not gtest else {
        'tests': gtest.get('tests'), 'failures': gtest.get('failures'),
        'failed': [t['name'] for s in gtest.get('testsuites', []) for t in s.get('testsuite', []) if t.get('failures')]},
    'hf_peer': load('hf.json'),
    'ops': load('ops.json'),
    'decode': load('decode.json'),
    'sweep': [json.load(open(p)) for p in sys.argv[2:] if os.path.exists(p)],
    'serve': load('serve.json'),
}
for s in result['sweep']:
    for m in s.get('modes', []):
        m.pop('steps', None)
json.dump(result, open(os.path.join(out, 'result.json'), 'w'), indent=1)
d = result['decode']
if d:
    # issue ms near ms/step, or busy well below 1: the step is bound by host launches.
    print('%-15s %10s %10s %8s %10s %8s %10s %6s %6s' % ('mode', 'ms/step', 'bound ms', 'x bound', 'model ms', 'x model',
                                                      'issue ms', 'busy', 'ops'))
    for m in d['modes']:
        print('%-15s %10.2f %10.2f %8.2f %10.2f %8.2f %10.2f %6.2f %6.0f' % (
            m['mode'], m['decode_ms_per_step_median'], m['bound_ms'], m['over_bound'], m.get('model_bound_ms', 0),
            m.get('over_model_bound', 0),
            m.get('host_issue_ms_per_step_median', 0), m.get('compute_busy_fraction', 0), m.get('compute_ops_per_step', 0)))
        if m.get('cuda_graphs'):
            print('  graphs: %s of %d steps replayed%s' % (m.get('graph_replayed_steps'), len(m.get('steps', [])),
                  ('; capture refused: ' + m['graph_capture_error']) if m.get('graph_capture_error') else ''))
    print(json.dumps(d.get('ratios', {})))
for s in result['sweep']:
    print('sweep b=%d p=%d%s%s: %s' % (s['batch'], s['prompt'], ', weights host' if s.get('weights') == 'host' else '',
                                      ', kv ' + s['kv_dtype'] if s.get('kv_dtype') not in (None, 'F16') else '',
                                      json.dumps(s.get('ratios', {}))))
PY
# At most 8 files come back from the device: keep log, result.json, decode.svg, traces.tar.gz.
if [ -s "$OUT/result.json" ]; then
  rm -f "$OUT"/{cmake.log,build.log,commit,gpu.csv,gtest.json,hf.json,decode.json,nvidia-smi.txt} "$OUT"/sweep-*
fi
ls "$OUT"
say "done"
