#!/usr/bin/env bash
# Issue 23's device check: decode throughput with weights and KV in host memory, kvpr against
# FlexLLMGen (FlexGen) on the same GPU, OPT-6.7B, then 13B, then 30B. One prepared command for the
# lent H200 (see bench/README.md):
#
#   here, once per session:   FLEXLLMGEN_GIT=<FlexLLMGen snapshot's git dir> bench/prepare-device-carry.sh
#   device tool run:          command "set -o pipefail; KVPR_CHECK_COMMIT=<commit> bash bench/device-check-flexgen.sh 2>&1 | tee $OUT/log"
#                             carry [".carry"], timeout_s 540
#
# hardware -> kvpr-bench built for sm_90 -> per model: kvpr-bench decode --weights host with
# --gpu-batches (offload, kvpr, recompute) and bench/flexgen_peer.py with FlexLLMGen's policies
# (all on the CPU; the same with its CPU attention; then a GPU share of the weights where it
# fits), each run under its own time limit, the next model only while time is left. Everything
# lands in $OUT: result-flexgen.json (both engines' figures, FlexLLMGen's commit and policies,
# the hardware), traces.tar.gz (ours), log.
# Commit result-flexgen.json as bench/results/<date>-h200-flexgen-<commit>.json.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kvpr-device-check-flexgen}
mkdir -p "$OUT"
# Overridable for a dry run on a machine without a GPU (CPU backend, tiny model, a built tree).
MODELS=${KVPR_CHECK_MODELS:-opt-6.7b:32x4 opt-13b:32x4 opt-30b:16x2}  # model:gpu_batch_size x num_gpu_batches
PROMPT=${KVPR_CHECK_PROMPT:-512}
GEN=${KVPR_CHECK_GEN:-32}
BACKEND=${KVPR_CHECK_BACKEND:-cuda}
BIN=${KVPR_CHECK_BIN:-}          # a built tree holding bench/kvpr-bench; empty: build here
FLEXGEN=${KVPR_CHECK_FLEXGEN:-.carry/flexllmgen}
BUDGET=${KVPR_CHECK_BUDGET:-520}  # seconds for the whole check
JOBS=${KVPR_CHECK_JOBS:-16}
. bench/device-check-common.sh
left() { echo $(( BUDGET - $(elapsed) )); }
record_hardware_and_commit

if [ -z "$BIN" ]; then
  say "build kvpr-bench (sm_90)"
  cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DKVPR_WERROR=OFF -DKVPR_TEXT_LIBS=OFF > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
  ninja -C build-device -j "$JOBS" kvpr-bench > "$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
  BIN=build-device
fi
BENCH=$BIN/bench/kvpr-bench
have_flexgen=0
# KVPR_CHECK_FLEXGEN_ANYWAY=1: run the FlexLLMGen steps without a CUDA torch (a dry run against
# the stand-in of tests/bench/flexgen_peer_test.py).
if [ -f "$FLEXGEN/flexllmgen/flex_opt.py" ] && { [ "${KVPR_CHECK_FLEXGEN_ANYWAY:-0}" = 1 ] ||
     python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }; then
  have_flexgen=1
else
  say "FlexLLMGen skipped: no $FLEXGEN (bench/prepare-device-carry.sh with FLEXLLMGEN_GIT) or no CUDA torch"
fi

# FlexLLMGen's policies for a model, best first for what this check is about (weights and KV in
# host memory): all on the CPU, the same with its CPU attention, then weights partly on the GPU.
policies() {
  echo "0 100 0 100 0 100|"
  echo "0 100 0 100 0 100|--cpu-cache-compute"
  echo "50 50 0 100 0 100|"
}

mkdir -p "$OUT/traces"
runs=()
for spec in $MODELS; do
  model=${spec%%:*}; split=${spec#*:}; gbs=${split%x*}; ngb=${split#*x}; batch=$(( gbs * ngb ))
  if [ "$(left)" -lt 60 ]; then say "$model: skipped, $(left) s left"; continue; fi
  say "$model: kvpr-bench decode, weights in host memory, batch $batch as $ngb GPU batches, prompt $PROMPT, $GEN tokens"
  t=$(( $(left) / 2 )); [ "$t" -gt 240 ] && t=240
  mkdir -p "$OUT/traces/$model"
  KVPR_THREADS=16 timeout "$t" "$BENCH" decode --backend "$BACKEND" --preset "$model" --batch "$batch" \
      --gpu-batches "$ngb" --prompt "$PROMPT" --gen "$GEN" --weights host --modes offload,kvpr,recompute \
      --json "$OUT/ours-$model.json" --trace-dir "$OUT/traces/$model" > "$OUT/ours-$model.txt" 2>&1
  echo "exit $?"; tail -8 "$OUT/ours-$model.txt"
  # The Fig. 5b order on kvpr's trace: recompute under W_O / FFN on the link, never held back for them.
  [ -s "$OUT/traces/$model/trace-kvpr.json" ] &&
    python3 bench/weight_pipeline.py "$OUT/traces/$model/trace-kvpr.json" --json "$OUT/pipeline-$model.json" | tail -1
  [ -s "$OUT/ours-$model.json" ] && runs+=("ours:$model:$OUT/ours-$model.json")
  [ "$have_flexgen" = 1 ] || continue
  i=0
  while IFS='|' read -r percent flags; do
    i=$(( i + 1 ))
    if [ "$(left)" -lt 45 ]; then say "$model: FlexLLMGen policy $i skipped, $(left) s left"; continue; fi
    t=$(( $(left) - 20 )); [ "$t" -gt 200 ] && t=200
    say "$model: FlexLLMGen $gbs x $ngb, percent $percent $flags (limit $t s)"
    PYTHONUNBUFFERED=1 timeout $(( t + 15 )) python3 bench/flexgen_peer.py --flexgen "$FLEXGEN" --model "$model" \
        --prompt "$PROMPT" --gen "$GEN" --gpu-batch-size "$gbs" --num-gpu-batches "$ngb" --percent $percent $flags \
        --time-limit "$t" --offload-dir /tmp/flexllmgen_offload --json "$OUT/flexgen-$model-$i.json" 2>&1 | tail -3
    [ -s "$OUT/flexgen-$model-$i.json" ] && runs+=("flexgen:$model:$OUT/flexgen-$model-$i.json")
  done < <(policies)
done

say "collect"
tar -czf "$OUT/traces.tar.gz" -C "$OUT" traces 2>/dev/null && rm -rf "$OUT/traces"
python3 - "$OUT" "${runs[@]}" <<'PY'
import json, os, sys, datetime
out, runs = sys.argv[1], sys.argv[2:]
def text(name):
    p = os.path.join(out, name)
    return open(p).read() if os.path.exists(p) else ''
rows = [r.strip() for r in text('gpu.csv').splitlines() if r.strip()]
gpu = dict(zip([h.strip() for h in rows[0].split(',')], [v.strip() for v in rows[1].split(',')])) if len(rows) >= 2 else {}
models = {}
for run in runs:
    engine, model, path = run.split(':', 2)
    m = models.setdefault(model, {'ours': None, 'flexgen': []})
    try:
        doc = json.load(open(path))
    except Exception as e:  # cut short by a timeout: say so, keep the rest
        doc = {'error': 'unreadable %s: %s' % (os.path.basename(path), e)}
    if engine == 'ours':
        for mode in doc.get('modes', []):
            mode.pop('steps', None)
        m['ours'] = doc
    else:
        m['flexgen'].append(doc)
summary = {}
for model, m in models.items():
    ours = {x['mode']: x for x in (m['ours'] or {}).get('modes', [])}
    flex = [f for f in m['flexgen'] if f.get('decode_tokens_per_s')]
    best = max(flex, key=lambda f: f['decode_tokens_per_s']) if flex else None
    s = {'ours_tokens_per_s': {k: v.get('decode_tokens_per_s') for k, v in ours.items()},
         'ours_over_bound': {k: v.get('over_bound') for k, v in ours.items()},
         'flexgen_best_tokens_per_s': best['decode_tokens_per_s'] if best else None,
         'flexgen_best_policy': {'percent': best['percent'], 'cpu_cache_compute': best['cpu_cache_compute']} if best else None,
         'flexgen_errors': [f.get('error') for f in m['flexgen'] if f.get('error')]}
    if best and 'kvpr' in ours and ours['kvpr'].get('decode_tokens_per_s'):
        s['kvpr_over_flexgen_best'] = ours['kvpr']['decode_tokens_per_s'] / best['decode_tokens_per_s']
    try:  # bench/weight_pipeline.py's reading of kvpr's trace
        s['weight_pipeline'] = json.load(open(os.path.join(out, 'pipeline-%s.json' % model)))['summary']
    except Exception as e:
        s['weight_pipeline'] = {'error': str(e)}
    summary[model] = s
result = {
    'date': datetime.datetime.utcnow().strftime('%Y-%m-%dT%H:%M:%SZ'),
    'commit': text('commit').strip(),
    'hardware': {'gpu': gpu, 'cpus': os.cpu_count(),
                 'memory_bytes': next((int(l.split()[1]) * 1024 for l in open('/proc/meminfo') if l.startswith('MemTotal')), 0)},
    'summary': summary,
    'models': models,
}
json.dump(result, open(os.path.join(out, 'result-flexgen.json'), 'w'), indent=1)
for model, s in summary.items():
    print(model, json.dumps(s))
PY
if [ -s "$OUT/result-flexgen.json" ]; then
  rm -f "$OUT"/{cmake.log,build.log,commit,gpu.csv} "$OUT"/ours-*.json "$OUT"/flexgen-*.json
fi
ls "$OUT"
say "done"
