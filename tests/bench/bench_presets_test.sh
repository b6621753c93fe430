#!/usr/bin/env bash
# The FlexGen comparison's presets (the flexgen parts of bench/device-check-all.sh) at a size the CPU runs: OPT-13B
# and OPT-30B at their real widths, one layer (it stays in one of the two device slots: the
# streaming itself is bench_smoke_test.sh's, on four layers), weights kept in host memory, two
# GPU batches; every mode gives the same tokens and the host holds exactly the layer's matrices. A batch no
# host holds is refused before anything is allocated, naming the weights and the KV cache.
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for p in opt-13b opt-30b; do
  "$KVPR_BENCH" decode --preset $p --layers 1 --backend cpu --weights host --gpu-batches 2 --batch 2 --prompt 8 --gen 2 \
    --modes offload,kvpr,recompute --emulate-link-gbps 16 --probe-mib 8 --json "$tmp/$p.json" >"$tmp/$p.out" 2>&1 ||
    { cat "$tmp/$p.out"; exit 1; }
done
set +e
"$KVPR_BENCH" decode --preset opt-30b --backend cpu --weights host --gpu-batches 2 --batch 100000 --prompt 512 --gen 32 \
  --modes offload,kvpr,recompute >"$tmp/refused.out" 2>&1
rc=$?
set -e
[ $rc -eq 1 ] || { echo "refusal: exit $rc"; cat "$tmp/refused.out"; exit 1; }
python3 - "$tmp" <<'PY'
import json, os, sys
d = sys.argv[1]
# OPT's published shapes (hidden, FFN, heads): 4 h^2 of attention and 2 h f of FFN per layer, F16.
shapes = {'opt-13b': (5120, 20480, 40), 'opt-30b': (7168, 28672, 56)}
for p, (h, f, heads) in shapes.items():
    r = json.load(open(os.path.join(d, p + '.json')))
    assert r['preset'] == p and r['layers'] == 1 and r['weights'] == 'host' and r['gpu_batches'] == 2, r['title']
    assert r['streamed_weight_bytes'] == (4 * h * h + 2 * h * f) * 2, (p, r['streamed_weight_bytes'])
    modes = {m['mode']: m for m in r['modes']}
    assert set(modes) == {'offload', 'kvpr', 'recompute'}, modes.keys()
    for name, m in modes.items():
        assert m['tokens_equal_to_first_mode'] == 1.0 and m['bound_ms'] > 0, (p, name)
lines = open(os.path.join(d, 'refused.out')).read().strip().splitlines()
err = [l for l in lines if 'error' in l]
assert len(err) == 1, lines
e = err[0]
for want in ('the weights need ', 'the KV cache of 100000 sequences x 546 tokens (kv mode ', 'GiB together', 'GiB are available'):
    assert want in e, (want, e)
assert 'profile:' not in ''.join(lines), lines  # refused before the model, so before the profile
print('bench presets: 3 passed, 0 failed')
PY
