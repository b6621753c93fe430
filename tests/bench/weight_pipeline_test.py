#!/usr/bin/env python3
"""bench/weight_pipeline.py: its verdicts on traces written here event by event (overlapped,
hidden, late, no recompute, a trace it cannot read), then on a real trace of kvpr-bench decode
--weights host on the CPU backend (KVPR_BENCH), where it finds every layer after the first in both
traced steps, each with its recompute (recompute mode: kvpr's split is the scheduler's, which a
loaded machine may set to 0; timings there are the machine's: only what is read is checked, not
the verdicts)."""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, '..', '..', 'bench'))
import weight_pipeline as wp  # noqa: E402

failures = []
passed = 0


def check(name, cond, detail=''):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(name)
        print('FAIL: %s %s' % (name, detail))


def trace(spans):
    """A trace in the Tracer's format from (track, name, start_us, end_us)."""
    tids = {'compute': 1, 'h2d': 2, 'd2h': 3}
    ev = [{'name': 'thread_name', 'ph': 'M', 'pid': 1, 'tid': t, 'args': {'name': n}} for n, t in tids.items()]
    for track, name, a, b in spans:
        ev.append({'name': name, 'ph': 'X', 'pid': 1, 'tid': tids[track], 'ts': a, 'dur': b - a})
    return {'traceEvents': ev}


def layer1(front_end, x_end, back_end, compute_busy_until, recompute_start):
    return [('h2d', 'L0 W front', 0, 5), ('h2d', 'L0 W back', 5, 9),
            ('h2d', 'L1 W front', 10, front_end), ('h2d', 'L1 X[0:l]', front_end, x_end),
            ('h2d', "L1 K[l:s']", x_end, x_end + 5), ('h2d', 'L1 W back', x_end + 5, back_end),
            ('compute', 'L0 linear', 1, compute_busy_until),
            ('compute', 'L1 recompute linear', recompute_start, recompute_start + 3),
            ('compute', 'L1 attention', recompute_start + 4, recompute_start + 6)]


def verdict_of(spans, tolerance=1.0):
    with tempfile.NamedTemporaryFile('w', suffix='.json', delete=False) as f:
        json.dump(trace(spans), f)
    try:
        rows = wp.pipeline(wp.load_events(f.name), tolerance)
    finally:
        os.unlink(f.name)
    return rows


# The link is the limit: the recompute starts when X lands, W back still copying.
rows = verdict_of(layer1(front_end=20, x_end=25, back_end=60, compute_busy_until=15, recompute_start=25.5))
check('overlapped', len(rows) == 1 and rows[0]['verdict'] == 'overlapped' and rows[0]['overlap_us'] == 34.5, rows)
check('start delay', abs(rows[0]['start_delay_us'] - 0.5) < 1e-9, rows)
# The compute is the limit: everything landed while layer 0 still ran.
rows = verdict_of(layer1(front_end=20, x_end=25, back_end=40, compute_busy_until=50, recompute_start=50.2))
check('hidden', rows[0]['verdict'] == 'hidden' and rows[0]['overlap_us'] == 0, rows)
# Held back for W back: it could start at 25 and started after 60.
rows = verdict_of(layer1(front_end=20, x_end=25, back_end=60, compute_busy_until=15, recompute_start=61))
check('late', rows[0]['verdict'] == 'late', rows)
s = wp.summary(rows)
check('late summary', s['late'] == 1 and not s['order_kept'] and s['late_layers'][0]['layer'] == 1, s)
# Split 0: no recompute.
spans = [sp for sp in layer1(20, 25, 60, 15, 26) if 'recompute' not in sp[1]]
rows = verdict_of(spans)
check('no recompute', rows == [dict(rows[0], recompute=False)] and not rows[0]['recompute'], rows)
check('no recompute summary', wp.summary(rows)['order_kept'] is False and wp.summary(rows)['with_recompute'] == 0)
# Two GPU batches: names with .<batch>; the first batch's recompute is the one checked.
spans = [(t, n.replace('L1 X', 'L1.0 X').replace('L1 recompute', 'L1.0 recompute'), a, b)
         for t, n, a, b in layer1(20, 25, 60, 15, 26)] + [('compute', 'L1.1 recompute linear', 40, 41)]
rows = verdict_of(spans)
check('gpu batches', len(rows) == 1 and rows[0]['recompute_start_us'] == 26 and rows[0]['verdict'] == 'overlapped', rows)

with tempfile.TemporaryDirectory() as d:
    bad = os.path.join(d, 'bad.json')
    open(bad, 'w').write('{"traceEvents": 3}')
    r = subprocess.run([sys.executable, os.path.join(HERE, '..', '..', 'bench', 'weight_pipeline.py'), bad],
                       capture_output=True, text=True)
    check('unreadable trace: exit 2, one line', r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r)

    bench = os.environ.get('KVPR_BENCH')
    if bench:
        r = subprocess.run([bench, 'decode', '--preset', 'tiny', '--backend', 'cpu', '--batch', '3', '--prompt', '40',
                            '--gen', '4', '--weights', 'host', '--modes', 'recompute', '--kv-dtype', 'f32',
                            '--emulate-link-gbps', '0.5', '--trace-dir', d], capture_output=True, text=True)
        check('kvpr-bench decode ran', r.returncode == 0, r.stderr[-2000:])
        out = os.path.join(d, 'pipeline.json')
        r = subprocess.run([sys.executable, os.path.join(HERE, '..', '..', 'bench', 'weight_pipeline.py'),
                            os.path.join(d, 'trace-recompute.json'), '--json', out], capture_output=True, text=True)
        check('real trace read', r.returncode == 0, r.stderr)
        if r.returncode == 0:
            got = json.load(open(out))
            layers = sorted((row['layer'], row['step']) for row in got['rows'])
            check('every later layer in both steps', layers == [(l, k) for l in (1, 2, 3) for k in (0, 1)], layers)
            check('each with its recompute', all(row['recompute'] for row in got['rows']), got['rows'])
            check('verdicts', all(row.get('verdict') in ('overlapped', 'hidden', 'late') for row in got['rows']), got['rows'])
            check('after the Q/K/V weights', all(row.get('recompute_start_us', -1) >= row['front_end_us'] for row in got['rows']),
                  got['rows'])

print('weight pipeline: %d passed, %d failed' % (passed, len(failures)))
sys.exit(1 if failures else 0)
