#!/usr/bin/env python3
"""The fine-grained pipeline of weights streamed from host memory, read from a kvpr trace.

With --weights host, each layer's copies go on the H2D stream in the order its compute needs
them: the stacked Q/K/V weights first ("W front"), the GPU batch's X[0:l], its K/V[l:s'], then
W_O and the FFN weights ("W back"). KVPR's point (the paper's Fig. 5b) is that the recompute of
K/V[0:l] from X starts as soon as the Q/K/V weights and X have arrived, while W_O and the FFN
weights are still on the link. This reads the traces `kvpr-bench decode --trace-dir` writes
(Chrome trace events: one track per stream, ops named "L<layer>[.<GPU batch>] <op>") and checks,
for every layer after the first and every traced step, that the recompute of its first GPU batch
was never held back for W_O and the FFN weights: it could start once its Q/K/V weights and X
had landed and the compute stream was free (start_delay_us says how long after that it did: the
host's issue latency). Each such layer is one of

    overlapped      the recompute ran while W_O / FFN were still on the link (Fig. 5b: the link
                    is the limit, and the recompute hides under it)
    hidden          every weight had landed before the compute stream was free (the compute is
                    the limit: with several GPU batches a layer's weights come during the layer
                    before)
    late            it started after W_O / FFN landed though it could have started before (by
                    more than --tolerance-us): the order is broken

Layer 0 is left out (its weights come at the end of the step before, outside the trace's pairing).

    python3 bench/weight_pipeline.py TRACE.json [--json OUT.json]

Prints a line per layer and step and a summary; exits 0 when the trace has been read (the
verdict is in the summary: order_kept, and how many layers were overlapped, hidden, late), 2 for a trace it
cannot read. Only the standard library."""

import argparse
import json
import re
import sys

OP = re.compile(r'^L(\d+)(?:\.(\d+))? (.+)$')


def load_events(path):
    """(track, layer, group, op, start_us, end_us) of every complete event with a layer name."""
    with open(path) as f:
        trace = json.load(f)
    events = trace['traceEvents'] if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        raise ValueError('no traceEvents list')
    tracks = {}
    for e in events:
        if e.get('ph') == 'M' and e.get('name') == 'thread_name':
            tracks[e.get('tid')] = e.get('args', {}).get('name', '')
    out = []
    for e in events:
        if e.get('ph') != 'X':
            continue
        m = OP.match(e.get('name', ''))
        if not m:
            continue
        start = float(e['ts'])
        out.append((tracks.get(e.get('tid'), str(e.get('tid'))), int(m.group(1)), int(m.group(2) or 0), m.group(3),
                    start, start + float(e.get('dur', 0))))
    out.sort(key=lambda r: r[4])
    return out


def pipeline(events, tolerance_us):
    """One row per layer (>= 1) and traced step where the layer's weights were copied."""
    layers = sorted({r[1] for r in events if r[0] == 'h2d' and r[3] == 'W front'})
    rows = []
    for layer in layers:
        if layer == 0:
            continue
        fronts = [r for r in events if r[0] == 'h2d' and r[1] == layer and r[3] == 'W front']
        backs = [r for r in events if r[0] == 'h2d' and r[1] == layer and r[3] == 'W back']
        recomputes = [r for r in events if r[0] == 'compute' and r[1] == layer and r[2] == 0 and r[3].startswith('recompute')]
        xs = [r for r in events if r[0] == 'h2d' and r[1] == layer and r[2] == 0 and r[3] == 'X[0:l]']
        for k, front in enumerate(fronts):
            if k >= len(backs):
                break
            back = backs[k]
            until = fronts[k + 1][4] if k + 1 < len(fronts) else float('inf')
            rec = next((r for r in recomputes if front[4] <= r[4] < until), None)
            row = {'layer': layer, 'step': k, 'front_end_us': front[5], 'back_start_us': back[4], 'back_end_us': back[5]}
            if rec is None:
                row['recompute'] = False  # split 0 here: nothing recomputed
            else:
                x_end = max((r[5] for r in xs if front[4] <= r[4] <= rec[4]), default=front[5])
                busy_until = max((r[5] for r in events if r[0] == 'compute' and r[4] < rec[4]), default=0.0)
                could_start = max(front[5], x_end, busy_until)
                # Held back for W_O / FFN: it started after they landed though it could have before.
                late = rec[4] >= back[5] and could_start < back[5] - tolerance_us
                row.update({'recompute': True, 'recompute_start_us': rec[4], 'x_end_us': x_end,
                            'compute_free_us': busy_until, 'start_delay_us': max(0.0, rec[4] - could_start),
                            'overlap_us': max(0.0, back[5] - rec[4]),
                            'verdict': 'late' if late else 'overlapped' if rec[4] < back[5] else 'hidden'})
            rows.append(row)
    return rows


def summary(rows):
    rec = [r for r in rows if r['recompute']]
    verdicts = {v: sum(r['verdict'] == v for r in rec) for v in ('overlapped', 'hidden', 'late')}
    overlaps = sorted(r['overlap_us'] for r in rec if r['verdict'] == 'overlapped')
    return {'layer_steps': len(rows), 'with_recompute': len(rec), **verdicts,
            'order_kept': verdicts['late'] == 0 and bool(rec),
            'median_overlap_us': overlaps[len(overlaps) // 2] if overlaps else None,
            'late_layers': [{'layer': r['layer'], 'step': r['step'], 'delay_us': r['start_delay_us']}
                            for r in rec if r['verdict'] == 'late']}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('trace')
    ap.add_argument('--json', help='write the rows and the summary here')
    ap.add_argument('--tolerance-us', type=float, default=50.0,
                    help="how much earlier than W_O / FFN's landing a late recompute could have started")
    a = ap.parse_args(argv)
    try:
        rows = pipeline(load_events(a.trace), a.tolerance_us)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print('weight_pipeline: %s: %s' % (a.trace, e), file=sys.stderr)
        return 2
    s = summary(rows)
    for r in rows:
        if r['recompute']:
            print('L%-3d step %d  Q/K/V weights landed %10.1f us  recompute starts %10.1f us  W_O+FFN landed %10.1f us  %s'
                  % (r['layer'], r['step'], r['front_end_us'], r['recompute_start_us'], r['back_end_us'], r['verdict']))
        else:
            print('L%-3d step %d  no recompute (split 0)' % (r['layer'], r['step']))
    print('summary: %s' % json.dumps(s))
    if a.json:
        with open(a.json, 'w') as f:
            json.dump({'trace': a.trace, 'rows': rows, 'summary': s}, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
