#!/usr/bin/env bash
# Runs a CPU benchmark and writes bench/results/<date>-<name>-<commit>.json with the hardware it
# ran on. Usage: bench/run-cpu-bench.sh [--quick]           (kvpr-bench cpu: <name> cpu)
#                bench/run-cpu-bench.sh json [--tokenizer D] (kvpr-bench json: <name> json-mask)
#                bench/run-cpu-bench.sh schemas --file F [--tokenizer D] (kvpr-bench schemas: <name> json-schemas)
#                bench/run-cpu-bench.sh serve [options]      (kvpr-bench serve --backend cpu: <name> serve)
#                bench/run-cpu-bench.sh decode [options]     (kvpr-bench decode --backend cpu: <name> decode)
#                bench/run-cpu-bench.sh weights [options]    (kvpr-bench weights: <name> weights)
#                KVPR_BENCH_NAME=N names the result <date>-N-<commit>.json
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
cmd=cpu name=cpu
if [ "${1:-}" = json ]; then cmd=json name=json-mask; shift; fi
if [ "${1:-}" = schemas ]; then cmd=schemas name=json-schemas; shift; fi
if [ "${1:-}" = serve ]; then cmd=serve name=serve; shift; set -- --backend cpu "$@"; fi
if [ "${1:-}" = decode ]; then cmd=decode name=decode; shift; set -- --backend cpu "$@"; fi
if [ "${1:-}" = weights ]; then cmd=weights name=weights; shift; fi
name=${KVPR_BENCH_NAME:-$name}
out=bench/results/$(date -u +%Y-%m-%d)-${name}-${commit}.json
mkdir -p bench/results
tmp=$(mktemp)
build/bench/kvpr-bench "$cmd" --json "$tmp" "$@"
python3 - "$tmp" "$out" "$commit" <<'PY'
import json, os, platform, subprocess, sys, datetime
r = json.load(open(sys.argv[1]))
cpu = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')), platform.processor())
mem = next((int(l.split()[1]) * 1024 for l in open('/proc/meminfo') if l.startswith('MemTotal')), 0)
r['hardware'] = {'cpu': cpu, 'cores': os.cpu_count(), 'memory_bytes': mem, 'kernel': platform.release()}
r['commit'] = sys.argv[3]
r['date'] = datetime.datetime.utcnow().strftime('%Y-%m-%dT%H:%M:%SZ')
json.dump(r, open(sys.argv[2], 'w'), indent=1)
print('wrote', sys.argv[2])
PY
rm -f "$tmp"
