#!/usr/bin/env bash
# The device entry point (bench/device-check-all.sh) as a dry run on this CPU, as the H200 would
# run it: the carry prepared as on a fresh machine (bench/prepare-device-carry.sh), the one build
# against its prefix alone (no header or library of kvprd's dependencies from the system's), the
# parts in their order with their skips (measured, budget, not carried), $OUT at most 8 files at
# every moment and a JSON per finished part, a second run that skips what the first measured,
# measured seconds as the next estimates, a part stopped mid-way that leaves its partial JSON,
# and the results tables made from what came back. Everything under a temporary folder.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
# On any exit: the background jobs, and the entry point the kill step runs in a session of its own
# (each step may find nothing to end; the test's own status stands).
cleanup() {
  local rc=$?
  kill $(jobs -p) 2>/dev/null || true
  if [ -s "$tmp/kill/pid" ]; then kill -KILL -- -"$(cat "$tmp/kill/pid")" 2>/dev/null || true; fi
  pkill -KILL -f "^[^ ]*kvpr-bench decode .*--json $tmp/" 2>/dev/null || true
  rm -rf "$tmp"
  exit $rc
}
trap cleanup EXIT
cd "$root"
fail() { echo "FAIL: $*"; exit 1; }

echo "== the carry, as on a fresh machine"
KVPR_CARRY_DIR=$tmp/carry KVPR_NPM_DIR=$tmp/no-npm bash bench/prepare-device-carry.sh > "$tmp/prepare.log" 2>&1 || { cat "$tmp/prepare.log"; fail "prepare-device-carry"; }
grep -q "MiB of the 64 MiB that travel" "$tmp/prepare.log" || fail "no tree + carry total: $(cat "$tmp/prepare.log")"
# FlexLLMGen's stand-in (tests/bench/flexgen_peer_test.py's, the same names and arguments as its API).
python3 - "$tmp/flexgen" <<'PY'
import os, sys
sys.path.insert(0, os.path.join('tests', 'bench'))
from flexgen_peer_test import make_stub
make_stub(sys.argv[1])
open(os.path.join(sys.argv[1], 'COMMIT'), 'w').write('004ffef\n')
PY

export KVPR_DEVICE_DRY_RUN=1 KVPR_CARRY_DIR=$tmp/carry KVPR_DEVICE_RESULTS=$tmp/results KVPR_CHECK_COMMIT=0123456789ab
export KVPR_DEVICE_FLEXGEN=$tmp/flexgen KVPR_DEVICE_FLEXGEN_ANYWAY=1 STUB_LOG=$tmp/stub.log
mkdir -p "$tmp/results"

# The most files $OUT held at any moment, sampled every 5 ms while the entry point runs.
watch_out() {  # watch_out OUT RECORD
  python3 - "$1" "$2" <<'PY' &
import os, sys, time
out, rec = sys.argv[1], sys.argv[2]
most = 0
while not os.path.exists(rec + '.stop'):
    try:
        most = max(most, sum(1 for f in os.listdir(out) if os.path.isfile(os.path.join(out, f))))
    except OSError:
        pass
    open(rec, 'w').write(str(most))
    time.sleep(0.005)
PY
}
entry() {  # entry NAME [VAR=VALUE...]: the entry point with $OUT at $tmp/NAME
  local name=$1
  shift
  mkdir -p "$tmp/$name/out"
  watch_out "$tmp/$name/out" "$tmp/$name/most"
  local w=$!
  env OUT="$tmp/$name/out" "$@" bash bench/device-check-all.sh > "$tmp/$name/stdout" 2>&1 || { cat "$tmp/$name/stdout"; fail "$name: exit $?"; }
  touch "$tmp/$name/most.stop"; wait $w
  [ "$(cat "$tmp/$name/most")" -le 8 ] || fail "$name: \$OUT held $(cat "$tmp/$name/most") files at once"
  # Every kvprd it started has stopped, and every worker with it.
  ! pgrep -f "$tmp/.*(kvprd|kvpr-worker) " > /dev/null || fail "$name left running: $(pgrep -fa "$tmp/.*(kvprd|kvpr-worker) ")"
}
# The parts whose JSON a run left (loose or in parts.tar), each with its status.
statuses() {
  python3 - "$1" <<'PY'
import json, os, sys, tarfile
out = sys.argv[1]
docs = [json.load(open(os.path.join(out, f))) for f in os.listdir(out) if f.endswith('.json')]
if os.path.exists(os.path.join(out, 'parts.tar')):
    with tarfile.open(os.path.join(out, 'parts.tar')) as t:
        docs += [json.load(t.extractfile(m)) for m in t.getmembers()]
print(' '.join(sorted(f"{d['part']}={d['status']}" for d in docs)))
PY
}

echo "== run 1: the build against the carried prefix, then tests, decode, kvprd"
entry run1 KVPR_DEVICE_BUILD_DIR="$tmp/build" KVPR_DEVICE_PARTS=tests,decode,kvprd \
    KVPR_DEVICE_BUILD_ARGS="-DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0"
[ "$(statuses "$tmp/run1/out")" = "decode=complete kvprd=complete tests=complete" ] || fail "run 1: $(statuses "$tmp/run1/out")"
grep -q "configure and build" "$tmp/run1/stdout" || fail "run 1 did not build"
# kvprd and its dependencies: every header from the prefix, every library linked from it.
pfx=$(dirname "$tmp/run1/out")/.kvpr-device-raw/prefix
sys_headers=$(ninja -C "$tmp/build" -t deps | grep -E '^\s+/usr/include/(boost|spdlog|fmt|hwloc|systemd|x86_64-linux-gnu/hwloc)' | sort -u | head -5 || true)
[ -z "$sys_headers" ] || fail "headers from the system, not the carry: $sys_headers"
ninja -C "$tmp/build" -t deps | grep -q "$pfx/include/boost/beast" || fail "no Beast header from the prefix"
for d in Boost_DIR spdlog_DIR fmt_DIR; do
  grep -q "^$d:PATH=$pfx/" "$tmp/build/CMakeCache.txt" || fail "$d is not the prefix's: $(grep "^$d:" "$tmp/build/CMakeCache.txt")"
done
grep -q "^HWLOC_LIBRARY_DIRS:INTERNAL=$pfx/" "$tmp/build/CMakeCache.txt" || fail "hwloc is not the prefix's"
grep -q "^SYSTEMD_LIBRARY_DIRS:INTERNAL=$pfx/" "$tmp/build/CMakeCache.txt" || fail "libsystemd is not the prefix's"
! grep -Eo '/usr/lib/x86_64-linux-gnu/lib(spdlog|fmt|hwloc|systemd)[^ ]*' "$tmp/build/build.ninja" | head -1 | grep -q . ||
  fail "a library linked from the system: $(grep -Eo '/usr/lib/x86_64-linux-gnu/lib(spdlog|fmt|hwloc|systemd)[^ ]*' "$tmp/build/build.ninja" | head -1)"
libs=$(LD_LIBRARY_PATH=$pfx/lib/x86_64-linux-gnu ldd "$tmp/build/daemon/kvprd" | grep -E 'spdlog|fmt|hwloc|systemd')
[ "$(echo "$libs" | grep -c "$pfx/lib")" = 4 ] || fail "kvprd loads: $libs"
python3 bench/device_parts.py collect "$tmp/run1/out" --results "$tmp/results" > "$tmp/collect1"
[ "$(grep -c 'dryrun-\(tests\|decode\|kvprd\)-0123456789ab.json' "$tmp/collect1")" = 3 ] || fail "collect: $(cat "$tmp/collect1")"
grep -q "dryrun-log-0123456789ab.log" "$tmp/collect1" || fail "collect: no log"
# The next estimate of a measured part is its measured time.
python3 - "$tmp/results" <<'PY'
import glob, json, subprocess, sys
res = sys.argv[1]
plan = {r.split()[0]: r.split() for r in subprocess.run(['python3', 'bench/device_parts.py', 'plan', '--kind', 'dryrun',
                                                         '--results', res], capture_output=True, text=True, check=True).stdout.splitlines()}
for part in ('tests', 'decode', 'kvprd'):
    doc = json.load(open(glob.glob(f'{res}/*-dryrun-{part}-*.json')[0]))
    assert plan[part][3] == 'measured', plan[part]
    assert int(plan[part][1]) == int(doc['seconds'] + 0.5), (plan[part], doc['seconds'])
    assert doc['hardware']['cpus'] and doc['commit'] == '0123456789ab' and doc['fingerprint'] == plan[part][2], doc.keys()
assert plan['auto'][3] == 'run' and plan['auto'][1] == '25', plan['auto']
d = json.load(open(glob.glob(f'{res}/*-dryrun-decode-*.json')[0]))
modes = d['results']['decode']['modes']
assert [m['mode'] for m in modes][:3] == ['resident', 'offload', 'kvpr'] and d['results']['decode']['complete'], modes
assert all(m['tokens_equal_to_first_mode'] == 1.0 for m in modes), [(m['mode'], m['tokens_equal_to_first_mode']) for m in modes]
assert any(t['what'] == 'kvpr speedup over offload' for t in d['targets']) and 'decode.svg' in d['texts'], d['targets']
k = json.load(open(glob.glob(f'{res}/*-dryrun-kvprd-*.json')[0]))
assert k['summary']['served_tpot_over_bench_step'] > 0 and k['results']['http-4']['completed'] == 4, k['summary']
PY

echo "== run 2: what run 1 measured is skipped; a budget of 38 s leaves the 30 s parts out"
entry run2 KVPR_DEVICE_BIN="$tmp/build" KVPR_DEVICE_PREFIX="$pfx" KVPR_DEVICE_BUDGET_S=38
for p in tests decode kvprd; do grep -q "== \[[0-9]*s\] $p: measured for this tree" "$tmp/run2/stdout" || fail "run 2 did not skip $p"; done
grep -q "auto: start" "$tmp/run2/stdout" || fail "run 2 did not run auto: $(cat "$tmp/run2/stdout")"
for p in sweep scale paged; do grep -q "$p: skipped, its estimate of 30 s does not fit" "$tmp/run2/stdout" || fail "run 2 ran $p"; done
grep -q "configure and build" "$tmp/run2/stdout" && fail "run 2 built again"
python3 bench/device_parts.py collect "$tmp/run2/out" --results "$tmp/results" > /dev/null

echo "== run 3: the rest, in the table's order, past 8 files (parts.tar)"
entry run3 KVPR_DEVICE_BIN="$tmp/build" KVPR_DEVICE_PREFIX="$pfx"
order=$(sed -n 's/^== \[[0-9]*s\] \([a-z0-9.-]*\): start.*/\1/p' "$tmp/run3/stdout" | tr '\n' ' ')
want=$(python3 -c "
import sys; sys.path.insert(0, 'bench'); import device_parts
print(' '.join(p.name for p in device_parts.PARTS if p.name not in '$(sed -n 's/^== \[[0-9]*s\] \([a-z0-9.-]*\): measured.*/\1/p' "$tmp/run3/stdout" | tr '\n' ' ')'.split()) + ' ')")
[ "$order" = "$want" ] || fail "run 3 ran '$order', not '$want'"
for p in sweep scale paged; do [[ " $order" == *" $p "* ]] || fail "run 3 did not run $p: $order"; done
st=$(statuses "$tmp/run3/out")
[ "$st" = "$(for p in $order; do echo "$p=complete"; done | sort | tr '\n' ' ' | sed 's/ $//')" ] || fail "run 3 left: $st"
python3 bench/device_parts.py collect "$tmp/run3/out" --results "$tmp/results" > /dev/null
left=$(python3 bench/device_parts.py plan --kind dryrun --results "$tmp/results" | awk '$4 != "measured"')
[ -z "$left" ] || fail "not measured after three runs: $left"
python3 - "$tmp/results" <<'PY'
import glob, json, sys
res = sys.argv[1]
f = json.load(open(glob.glob(f'{res}/*-dryrun-flexgen-opt-13b-*.json')[0]))
assert len([k for k in f['results'] if k.startswith('flexgen-')]) == 3 and f['summary']['kvpr_over_flexgen_best'] > 0, f['summary']
p = json.load(open(glob.glob(f'{res}/*-dryrun-paged-*.json')[0]))
assert p['summary']['most_running'] >= 1 and p['summary']['serve']['completed'] == 64, p['summary']
a = json.load(open(glob.glob(f'{res}/*-dryrun-auto-*.json')[0]))
assert a['summary']['texts_equal_resident'] == {'default': True, 'small-budget': True}, a['summary']
PY

echo "== run 4: everything measured, nothing runs (no build either)"
entry run4 KVPR_DEVICE_BIN="$tmp/build" KVPR_DEVICE_PREFIX="$pfx"
grep -q "nothing to run: every part is measured" "$tmp/run4/stdout" || fail "run 4: $(cat "$tmp/run4/stdout")"

echo "== a part stopped mid-way keeps what it measured"
mkdir -p "$tmp/kill/out" "$tmp/kill/results"
raw=$tmp/kill/.kvpr-device-raw/parts/decode
# Started from a subshell (not a job of this shell) in a session of its own, to be killed whole.
( OUT=$tmp/kill/out KVPR_DEVICE_RESULTS=$tmp/kill/results KVPR_DEVICE_BIN="$tmp/build" KVPR_DEVICE_PREFIX="$pfx" \
  KVPR_DEVICE_PARTS=decode setsid bash bench/device-check-all.sh > "$tmp/kill/stdout" 2>&1 & echo $! > "$tmp/kill/pid" )
entry_pid=$(cat "$tmp/kill/pid")
# Once kvpr-bench has written its first modes, it is stopped; once the part's JSON holds them,
# the whole entry point is killed (SIGKILL: nothing of it runs after).
python3 - "$raw/decode.json" "$tmp/kill/out/decode.json" <<'PY' || { cat "$tmp/kill/stdout"; fail "the kill step"; }
import json, subprocess, sys, time
raw, out = sys.argv[1], sys.argv[2]
deadline = time.time() + 120
def modes(p):
    try:
        return json.load(open(p))
    except (OSError, ValueError):
        return None
while time.time() < deadline:
    d = modes(raw)
    if d and not d.get('complete') and len(d.get('modes', [])) >= 1:
        subprocess.run(['pkill', '-STOP', '-f', f'^[^ ]*kvpr-bench decode .*--json {raw}'])  # this run's alone
        break
    time.sleep(0.002)
else:
    sys.exit('kvpr-bench never wrote a partial result')
while time.time() < deadline:
    o = modes(out)
    if o and (o.get('results', {}).get('decode') or {}).get('modes'):
        break
    time.sleep(0.05)
else:
    sys.exit('the part JSON never showed the partial result')
PY
kill -KILL -- -"$entry_pid" 2>/dev/null || true
pkill -KILL -f "^[^ ]*kvpr-bench decode .*--json $raw/decode.json" 2>/dev/null || true
for _ in $(seq 1 100); do kill -0 "$entry_pid" 2>/dev/null || break; sleep 0.1; done
python3 - "$tmp/kill/out" <<'PY'
import json, os, sys
out = sys.argv[1]
files = os.listdir(out)
assert len(files) <= 8 and not [f for f in files if f.endswith('.part')], files
d = json.load(open(os.path.join(out, 'decode.json')))
assert d['status'] == 'running' and d['part'] == 'decode', d['status']
dec = d['results']['decode']
assert dec['complete'] is False and 1 <= len(dec['modes']) < 13, (dec['complete'], len(dec['modes']))
print('killed mid-way: decode.json kept', len(dec['modes']), 'modes, status', d['status'])
PY

echo "== the tables from the results"
cp README.md docs/results.md "$tmp/"
python3 bench/results_tables.py --results "$tmp/results" --kind dryrun --readme "$tmp/README.md" --results-md "$tmp/results.md" \
    --charts "$tmp/results" > "$tmp/tables.out" || { cat "$tmp/tables.out"; fail "results_tables"; }
python3 - "$tmp" <<'PY'
import glob, os, sys
tmp = sys.argv[1]
readme, results = open(os.path.join(tmp, 'README.md')).read(), open(os.path.join(tmp, 'results.md')).read()
for text in (readme, results):
    assert '0123456789ab' in text and 'dryrun' in text, text[:400]
assert '| kvpr |' in results and 'kvprd' in results and 'flexgen-opt-13b' in results, results
assert glob.glob(os.path.join(tmp, 'results', '*-dryrun-decode-0123456789ab-decode.svg')), os.listdir(os.path.join(tmp, 'results'))
PY
echo "device entry point: dry run passed"
