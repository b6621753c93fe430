#!/usr/bin/env python3
"""The parts of the device entry point (bench/device-check-all.sh), and what it does with their
results: which parts are already measured, which fit the time left, each part's JSON as it goes,
$OUT kept at 8 files, and, back here, the results filed under bench/results.

A part counts as measured for a tree when bench/results holds a complete result of the same
kind (h200, or dryrun for KVPR_DEVICE_DRY_RUN) whose fingerprint equals the tree's: the sha256 of
every file the part measures (its `inputs` below, documentation and results left out) and of the
part's own code in device-check-all.sh (its part_<name> function and the helpers section). The
same commit, or a later one that changed nothing the part measures, has the same fingerprint; a
commit that touched the engine measures the engine's parts again. No git is needed (the device's
copy of the tree may carry stale git metadata): the files are read as they are.

    device_parts.py plan --kind h200 [--results bench/results]      # name estimate fingerprint status
    device_parts.py assemble PART --raw DIR --out FILE --status S ...
    device_parts.py make-room --out DIR --raw DIR --need N [--running PART]
    device_parts.py collect FILES_AT [--results bench/results]      # here, after a device run
"""
import argparse
import datetime
import glob
import hashlib
import io
import json
import os
import re
import shutil
import sys
import tarfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
SCRIPT = 'bench/device-check-all.sh'
MAX_FILES = 8  # what comes back from the device's $OUT
TAR = 'parts.tar'  # earlier parts' JSONs, once $OUT would hold more than MAX_FILES

# What each kind of part measures (paths from the repository's root).
BUILD = ['CMakeLists.txt', 'engine']
BENCH = BUILD + ['bench/CMakeLists.txt', 'bench/*.cc', 'bench/*.h']
SERVE = BENCH + ['daemon', 'worker', 'openai', 'numa', 'cli', 'share', 'bench/http_load.py',
                 'bench/write_hf_checkpoint.py', 'bench/hf_offload_peer.py']


class Part:
    def __init__(self, name, h200_s, dryrun_s, inputs, what):
        self.name, self.inputs, self.what = name, inputs, what
        self.estimate = {'h200': h200_s, 'dryrun': dryrun_s}


# In order of value. Estimates in seconds: the H200's from its measured runs where one exists
# (2026-11-30: build 56 s without the daemon, GPU tests 6 s, every decode mode 260 s of which
# cpu-attn's host prefill 151 s), else from the dry runs' proportions; a newer measured result of
# the part replaces its estimate (estimate() below), so these are only the first guesses.
PARTS = [
    Part('tests', 40, 25, BUILD + ['tests/CMakeLists.txt', 'tests/*.h', 'tests/engine', 'tests/openai', 'tests/worker',
                                   'tests/numa', 'tests/daemon/*.cc', 'tests/data', 'openai', 'worker', 'numa', 'daemon/*.cc',
                                   'daemon/*.h'],
         'the GPU tests (CUDA ops against the CPU, paged and two-segment attention, copy_spans, every KV '
         'mode and auto against the CPU greedy tokens, graphs), compute-sanitizer on any failure'),
    Part('decode', 170, 25, BENCH,
         'kvpr-bench decode at the main point (OPT-6.7B, fp16, batch 32, prompt 1024): resident, '
         'resident+graphs, offload, kvpr, recompute, their paged forms, auto at 0/25/50/75/100% of the KV'),
    Part('kvprd', 150, 30, SERVE,
         'kvprd on the GPU in its default kv mode under bench/http_load.py, against kvpr-bench decode '
         'at the same batch and context; the official openai client once'),
    Part('auto', 90, 25, SERVE,
         'kvprd with kv mode auto at the default budget and at a small one (KV spilled to the host) '
         'against resident: the same greedy texts, /health tiers'),
    Part('syscalls', 90, 15, SERVE + ['systemd/kvprd.service', 'bench/syscall_filter.py'],
         "kvprd and its GPU workers under strace -f (start, greedy requests, drain): every system call, the CUDA "
         "driver's included, inside the unit's SystemCallFilter=@system-service"),
    Part('sliding', 90, 20, BENCH,
         "kvpr-bench decode of Gemma 3's shape (gemma-3-4b: 5 local layers of window 1024 to 1 global) at 32768 "
         "tokens: each mode's link bytes per step against every layer full (19.3% expected), resident beside"),
    Part('quantized', 110, 20, BENCH,
         "kvpr-bench weights: batch-1 decode of Llama-3.2-1B's shape, resident, its layers' matrices in bf16, int4, "
         "int8, fp8 and fp4 (MXFP4; kvpr's layout, read by quantized_gemv): each at >= 80% of the device's memory rate on its bytes"),
    Part('sweep', 240, 30, BENCH,
         'kvpr-bench decode off the main point: fp8 KV, batch 1..64, prompt 128..8192, weights streamed'),
    Part('scale', 240, 30, BENCH + ['numa', 'worker'],
         'kvpr-bench scale, N = 1, 2, 4, 8 workers (kvpr, offload, cpu-attn)'),
    Part('paged', 240, 30, SERVE,
         'the block size 8..128 (kvpr, resident), and kvprd in kvpr mode with max-batch 256 serving 256 '
         'mixed requests at concurrency 160 (>= 128 sequences at once)'),
    Part('flexgen-opt-6.7b', 240, 20, BENCH + ['bench/flexgen_peer.py', 'bench/weight_pipeline.py'],
         'FlexLLMGen (its own code, unmodified) beside kvpr-bench --weights host, OPT-6.7B'),
    Part('flexgen-opt-13b', 280, 20, BENCH + ['bench/flexgen_peer.py', 'bench/weight_pipeline.py'],
         'FlexLLMGen beside kvpr-bench --weights host, OPT-13B'),
    Part('flexgen-opt-30b', 320, 20, BENCH + ['bench/flexgen_peer.py', 'bench/weight_pipeline.py'],
         'FlexLLMGen beside kvpr-bench --weights host, OPT-30B'),
]
BUILD_ESTIMATE = {'h200': 150, 'dryrun': 0}  # one configure and build for every part
BY_NAME = {p.name: p for p in PARTS}


# ---- fingerprints ---------------------------------------------------------------------------

def _measured_files(root, patterns):
    out = set()
    for pat in patterns:
        for hit in glob.glob(os.path.join(root, pat)):
            if os.path.isdir(hit):
                for d, dirs, files in os.walk(hit):
                    dirs[:] = sorted(x for x in dirs if x not in ('__pycache__', 'results'))
                    out.update(os.path.join(d, f) for f in files)
            else:
                out.add(hit)
    return sorted(f for f in out if not f.endswith(('.md', '.pyc', '.part')) and os.path.isfile(f))


def script_sections(root):
    """The helpers section and each part_<name> function of the entry point, as text."""
    text = open(os.path.join(root, SCRIPT)).read()
    m = re.search(r'^# ---- what the parts measure with.*?^# ---- end of helpers', text, re.S | re.M)
    helpers = m.group(0) if m else ''
    funcs = {g.group(1): g.group(0) for g in re.finditer(r'^(part_[a-z0-9_]+)\(\) \{\n.*?^\}\n', text, re.S | re.M)}
    return helpers, funcs


def function_of(name):
    return 'part_' + name.split('-')[0]  # flexgen-opt-13b runs part_flexgen


def fingerprint(root, part):
    helpers, funcs = script_sections(root)
    h = hashlib.sha256()
    h.update(helpers.encode())
    h.update(funcs.get(function_of(part.name), '').encode())
    for f in _measured_files(root, part.inputs):
        h.update(os.path.relpath(f, root).encode() + b'\0')
        h.update(hashlib.sha256(open(f, 'rb').read()).digest())
    return h.hexdigest()[:16]


# ---- results ----------------------------------------------------------------------------

def results_of(results_dir, kind, part):
    """This kind's results of the part, newest first (by date, then name)."""
    out = []
    for p in glob.glob(os.path.join(results_dir, f'*-{kind}-{part}-*.json')):
        # flexgen-opt-6.7b's glob must not take flexgen-opt-6.7b-x: the commit is the last field
        if not re.fullmatch(rf'\d{{4}}-\d\d-\d\d-{re.escape(kind)}-{re.escape(part)}-[0-9a-f]+\.json', os.path.basename(p)):
            continue
        try:
            doc = json.load(open(p))
        except (OSError, ValueError):
            continue
        out.append((doc.get('date', ''), p, doc))
    return [(p, d) for _, p, d in sorted(out, key=lambda t: (t[0], t[1]), reverse=True)]


def estimate(results_dir, kind, part):
    """The newest complete result's measured seconds, else the table's guess; a part cut short
    since then (partial) needs more than it had: at least 1.5 times those seconds."""
    raised = 0  # by partial results newer than the complete one
    for _, doc in results_of(results_dir, kind, part.name):
        if doc.get('status') == 'complete' and doc.get('seconds'):
            return max(raised, int(doc['seconds'] + 0.5))
        if doc.get('status') == 'partial' and doc.get('seconds'):
            raised = max(raised, int(doc['seconds'] * 1.5 + 0.5))
    return max(raised, part.estimate[kind])


def plan(root, results_dir, kind):
    rows = []
    for part in PARTS:
        fp = fingerprint(root, part)
        done = next((p for p, d in results_of(results_dir, kind, part.name)
                     if d.get('fingerprint') == fp and d.get('status') == 'complete'), None)
        rows.append((part.name, estimate(results_dir, kind, part), fp,
                     'measured' if done else 'run', os.path.basename(done) if done else '-'))
    return rows


# ---- a part's JSON ------------------------------------------------------------------------

def _load(path):
    try:
        return json.load(open(path)) if os.path.getsize(path) else None
    except (OSError, ValueError):
        return None


def _strip_steps(doc):
    """kvpr-bench's per-step arrays: the medians and totals stay, the steps go (they are most of
    the bytes)."""
    if isinstance(doc, dict):
        for m in doc.get('modes', []) if isinstance(doc.get('modes'), list) else []:
            if isinstance(m, dict):
                m.pop('steps', None)
    return doc


def _target(what, value, op, bound):
    met = None if value is None else (value <= bound if op == '<=' else value >= bound)
    return {'what': what, 'value': value, 'target': f'{op} {bound}', 'met': met}


def _modes(doc):
    return {m['mode']: m for m in (doc or {}).get('modes', []) if isinstance(m, dict) and 'mode' in m}


def summarize(part, raw):
    """The figures and targets of a part from the files it left in its raw folder."""
    s, targets = {}, []
    name = part.split('-')[0]
    if name == 'tests':
        g = raw.get('gtest') or {}
        failed = [f"{su['name']}.{t['name']}" for su in g.get('testsuites', []) for t in su.get('testsuite', [])
                  if t.get('failures')]
        s = {'tests': g.get('tests'), 'failures': g.get('failures'), 'disabled': g.get('disabled'), 'failed': failed}
        targets.append(_target('GPU tests failing', g.get('failures') if g else None, '<=', 0))
    elif name in ('decode', 'sweep', 'sliding'):
        for key, doc in sorted(raw.items()):
            if not isinstance(doc, dict) or doc.get('benchmark') != 'decode':
                continue
            ms = _modes(doc)
            s[key] = {'title': doc.get('title'), 'complete': doc.get('complete'), 'ratios': doc.get('ratios', {}),
                      'modes': {k: {'ms_per_step': m.get('decode_ms_per_step_median'), 'bound_ms': m.get('bound_ms'),
                                    'over_bound': m.get('over_bound'), 'tokens_per_s': m.get('decode_tokens_per_s'),
                                    'h2d_mb_per_step': (m.get('h2d_bytes_per_step') or 0) / 1e6,
                                    'busy': m.get('compute_busy_fraction'),
                                    'h2d_share_of_every_layer_full': m.get('h2d_share_of_every_layer_full')}
                                for k, m in ms.items()}}
            if name == 'sliding' and 'offload' in ms:
                targets.append(_target('offload link bytes against every layer full',
                                       ms['offload'].get('h2d_share_of_every_layer_full'), '<=', 0.2))
                targets.append(_target('offload over its physical bound', ms['offload'].get('over_bound'), '<=', 1.1))
            if name != 'decode':
                continue
            r = doc.get('ratios', {})
            if 'resident' in ms:
                targets.append(_target('resident over its physical bound', ms['resident'].get('over_bound'), '<=', 1.15))
            if 'kvpr' in ms:
                targets.append(_target('kvpr speedup over offload', r.get('kvpr_speedup_over_offload'), '>=', 1.95))
                targets.append(_target('kvpr over its physical bound', ms['kvpr'].get('over_bound'), '<=', 1.05))
            for k, m in ms.items():
                if k.startswith('auto:'):
                    targets.append(_target(f'{k} over the bound of the best allocation', m.get('over_bound'), '<=', 1.05))
                    targets.append(_target(f'{k} over the best fixed mode', r.get(f'{k}_over_best_fixed_mode'), '<=', 1.03))
            for k, v in r.items():
                if k.endswith('_speed_over_contiguous'):
                    targets.append(_target(k.replace('_speed_over_contiguous', '') + ' speed over contiguous', v, '>=', 0.98))
    elif name == 'quantized':
        doc = raw.get('weights') or {}
        runs = {r['format']: r for r in doc.get('runs', []) if isinstance(r, dict) and 'format' in r}
        rate = doc.get('memory_gbps')
        s = {'memory_gbps': rate, 'ratios': doc.get('ratios', {}),
             'runs': {f: {k: r.get(k) for k in ('ms_per_token', 'tokens_per_s', 'weight_bytes_read_per_token', 'bound_ms',
                                                'over_bound', 'weights_gbps')} for f, r in runs.items()}}
        for f, r in runs.items():
            if rate and r.get('weights_gbps') is not None:
                targets.append(_target(f'{f}: share of the memory rate on its bytes', r['weights_gbps'] / rate, '>=', 0.8))
    elif name == 'kvprd':
        bench = _modes(raw.get('bench'))
        for key, h in sorted(raw.items()):
            if not key.startswith('http-') or not isinstance(h, dict):
                continue
            s[key] = {k: h.get(k) for k in ('concurrency', 'completed', 'failed', 'output_tokens_per_s', 'ttft_ms',
                                            'tpot_ms', 'complete')}
        top = max((h for k, h in raw.items() if k.startswith('http-') and isinstance(h, dict)),
                  key=lambda h: h.get('concurrency') or 0, default=None)
        b = next(iter(bench.values()), None)
        if top and b and (top.get('tpot_ms') or {}).get('p50'):
            over = top['tpot_ms']['p50'] / b['decode_ms_per_step_median']
            s['served_tpot_over_bench_step'] = over
            s['bench_mode'] = b['mode']
            targets.append(_target(f"kvprd TPOT p50 at concurrency {top['concurrency']} over kvpr-bench's step",
                                   over, '<=', 1.10))
        targets.append(_target('requests failed', sum((h or {}).get('failed', 0) for k, h in raw.items()
                                                      if k.startswith('http-') and isinstance(h, dict)), '<=', 0))
    elif name == 'auto':
        serve = {k[6:]: v for k, v in raw.items() if k.startswith('serve-') and isinstance(v, dict)}
        ref = (serve.get('resident') or {}).get('texts')
        s['texts_equal_resident'] = {n: v.get('texts') == ref for n, v in serve.items() if n != 'resident' and ref}
        s['tiers'] = {n: (((v.get('health') or {}).get('workers') or [{}])[0].get('kv_cache') or {}).get('tiers')
                      for n, v in serve.items()}
        for n, eq in s['texts_equal_resident'].items():
            targets.append(_target(f'kvprd {n}: texts equal resident', 1 if eq else 0, '>=', 1))
    elif name == 'syscalls':
        sc = raw.get('syscalls') or {}
        s = {'calls': len(sc.get('calls', [])), 'outside': sc.get('outside'), 'served': bool((raw.get('serve') or {}).get('texts'))}
        targets.append(_target('system calls outside SystemCallFilter=@system-service',
                               len(sc['outside']) if 'outside' in sc else None, '<=', 0))
    elif name == 'scale':
        sc = raw.get('scale') or {}
        s = {m.get('mode'): [{'workers': p.get('workers'), 'tokens_per_s': p.get('aggregate_tokens_per_s'),
                              'efficiency': p.get('efficiency'), 'projected': p.get('projected')}
                             for p in m.get('points', [])] for m in sc.get('modes', [])}
    elif name == 'paged':
        blocks = raw.get('blocks') or {}
        s['blocks_ratios'] = blocks.get('ratios', {})
        batch = raw.get('batch-samples') or {}
        s['most_running'] = batch.get('most_running')
        h = raw.get('http-paged') or {}
        s['serve'] = {k: h.get(k) for k in ('completed', 'failed', 'output_tokens_per_s', 'ttft_ms', 'tpot_ms')}
        targets.append(_target('most sequences running at once through kvprd', batch.get('most_running'), '>=', 128))
    elif name == 'flexgen':
        ours = _modes(raw.get('ours'))
        flex = [v for k, v in raw.items() if k.startswith('flexgen-') and isinstance(v, dict) and v.get('decode_tokens_per_s')]
        best = max(flex, key=lambda f: f['decode_tokens_per_s'], default=None)
        s = {'ours_tokens_per_s': {k: m.get('decode_tokens_per_s') for k, m in ours.items()},
             'ours_over_bound': {k: m.get('over_bound') for k, m in ours.items()},
             'flexgen_best_tokens_per_s': best and best['decode_tokens_per_s'],
             'flexgen_best_policy': best and {'percent': best.get('percent'), 'cpu_cache_compute': best.get('cpu_cache_compute')},
             'flexgen_errors': [v.get('error') for k, v in raw.items() if k.startswith('flexgen-') and isinstance(v, dict)
                                and v.get('error')],
             'weight_pipeline': (raw.get('pipeline') or {}).get('summary')}
        if best and (ours.get('kvpr') or {}).get('decode_tokens_per_s'):
            s['kvpr_over_flexgen_best'] = ours['kvpr']['decode_tokens_per_s'] / best['decode_tokens_per_s']
            if part == 'flexgen-opt-13b':
                targets.append(_target("kvpr over FlexLLMGen's best policy, OPT-13B", s['kvpr_over_flexgen_best'], '>=', 1.46))
    return s, targets


def assemble(part, raw_dir, out, status, header_file, fp, started, est, commit, kind, tmp_dir=None):
    raw = {}
    texts = {}
    for f in sorted(os.listdir(raw_dir)) if os.path.isdir(raw_dir) else []:
        p = os.path.join(raw_dir, f)
        if f.endswith('.json'):
            doc = _load(p)
            if doc is not None:
                raw[f[:-5]] = _strip_steps(doc)
        elif f.endswith(('.txt', '.log')):  # the tail of what a step printed
            texts[f] = open(p, errors='replace').read()[-6000:]
        elif f.endswith('.svg'):  # a chart the benchmark drew: results_tables.py writes it out
            texts[f] = open(p, errors='replace').read()
    summary, targets = summarize(part, raw)
    now = datetime.datetime.now(datetime.timezone.utc)
    doc = dict(_load(header_file) or {})
    doc.update({'part': part, 'kind': kind, 'commit': commit, 'fingerprint': fp, 'status': status,
                'date': now.strftime('%Y-%m-%dT%H:%M:%SZ'), 'seconds': round(now.timestamp() - started, 1),
                'estimate_s': est, 'what': BY_NAME[part].what if part in BY_NAME else '',
                'summary': summary, 'targets': targets, 'results': raw, 'texts': texts})
    # Written beside the raw files and renamed into $OUT: its file count never grows by the
    # temporary, and a reader (or a kill) never meets half a file.
    folder = tmp_dir if tmp_dir and os.stat(tmp_dir).st_dev == os.stat(os.path.dirname(os.path.abspath(out))).st_dev \
        else os.path.dirname(os.path.abspath(out))
    tmp = os.path.join(folder, os.path.basename(out) + '.part')
    with open(tmp, 'w') as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, out)


def make_room(out, raw, need, running):
    """Packs the oldest finished part JSONs into $OUT/parts.tar until `need` new files fit in
    MAX_FILES. The new tar is written outside $OUT and renamed over the old one; a JSON is deleted
    only once the tar that holds it is in place, so a kill at any moment loses nothing and never
    leaves more than MAX_FILES."""
    tar_path = os.path.join(out, TAR)
    while True:
        files = [f for f in os.listdir(out) if os.path.isfile(os.path.join(out, f))]
        limit = MAX_FILES if os.path.exists(tar_path) else MAX_FILES - 1  # creating the tar adds a file
        if os.stat(raw).st_dev != os.stat(out).st_dev:
            limit -= 1  # a part's JSON is then written as a temporary in $OUT before its rename
        if len(files) + need <= limit:
            return
        parts = sorted((f for f in files if f.endswith('.json') and f != running + '.json' and f != TAR),
                       key=lambda f: os.path.getmtime(os.path.join(out, f)))
        if not parts:
            raise SystemExit(f'device_parts: $OUT holds {len(files)} files and none can be packed')
        victim = parts[0]
        new = os.path.join(raw, TAR + '.new')
        with tarfile.open(new, 'w') as t:
            if os.path.exists(tar_path):
                with tarfile.open(tar_path) as old:
                    for m in old.getmembers():
                        t.addfile(m, old.extractfile(m))
            t.add(os.path.join(out, victim), arcname=victim)
        if os.stat(raw).st_dev == os.stat(out).st_dev:
            os.replace(new, tar_path)  # the entry point keeps its raw folder beside $OUT for this
        else:
            shutil.copyfile(new, tar_path)  # a kill mid-copy leaves the victim, loses earlier members
            os.remove(new)
        os.remove(os.path.join(out, victim))


# ---- back here: a device run's files into bench/results ------------------------------------

def collect(files_at, results_dir):
    """Every part JSON the run returned (loose or in parts.tar) as
    bench/results/<date>-<kind>-<part>-<commit>.json, and its log beside them."""
    docs = []
    for f in sorted(os.listdir(files_at)):
        p = os.path.join(files_at, f)
        if f == TAR:
            with tarfile.open(p) as t:
                for m in t.getmembers():
                    docs.append(json.load(t.extractfile(m)))
        elif f.endswith('.json'):
            docs.append(json.load(open(p)))
    written = []
    for d in docs:
        if 'part' not in d:
            continue
        name = f"{d['date'][:10]}-{d['kind']}-{d['part']}-{d['commit'][:12]}.json"
        old = _load(os.path.join(results_dir, name)) if os.path.exists(os.path.join(results_dir, name)) else None
        if old and old.get('status') == 'complete' and d.get('status') != 'complete':
            print(f'device_parts: kept the complete {name}; this run\'s is {d.get("status")}', file=sys.stderr)
            continue
        with open(os.path.join(results_dir, name), 'w') as o:
            json.dump(d, o, indent=1)
            o.write('\n')
        written.append(name)
    if docs and os.path.exists(os.path.join(files_at, 'log')):
        d = next(x for x in docs if 'part' in x) if any('part' in x for x in docs) else None
        if d:
            name = f"{d['date'][:10]}-{d['kind']}-log-{d['commit'][:12]}.log"
            shutil.copy(os.path.join(files_at, 'log'), os.path.join(results_dir, name))
            written.append(name)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = ap.add_subparsers(dest='cmd', required=True)
    p = sub.add_parser('plan')
    p.add_argument('--kind', required=True, choices=['h200', 'dryrun'])
    p.add_argument('--results', default=os.path.join(ROOT, 'bench', 'results'))
    p = sub.add_parser('build-estimate')
    p.add_argument('--kind', required=True, choices=['h200', 'dryrun'])
    p = sub.add_parser('assemble')
    p.add_argument('part')
    for a in ('--raw', '--out', '--status', '--header', '--fingerprint', '--commit', '--kind'):
        p.add_argument(a, required=True)
    p.add_argument('--started', type=float, required=True)
    p.add_argument('--estimate', type=int, required=True)
    p.add_argument('--tmp', help='a folder for the temporary file (on the same filesystem as --out)')
    p = sub.add_parser('make-room')
    p.add_argument('--out', required=True)
    p.add_argument('--raw', required=True)
    p.add_argument('--need', type=int, default=1)
    p.add_argument('--running', default='')
    p = sub.add_parser('collect')
    p.add_argument('files_at')
    p.add_argument('--results', default=os.path.join(ROOT, 'bench', 'results'))
    a = ap.parse_args()
    if a.cmd == 'plan':
        for row in plan(ROOT, a.results, a.kind):
            print(*row)
    elif a.cmd == 'build-estimate':
        print(BUILD_ESTIMATE[a.kind])
    elif a.cmd == 'assemble':
        assemble(a.part, a.raw, a.out, a.status, a.header, a.fingerprint, a.started, a.estimate, a.commit, a.kind, a.tmp)
    elif a.cmd == 'make-room':
        make_room(a.out, a.raw, a.need, a.running)
    elif a.cmd == 'collect':
        for name in collect(a.files_at, a.results):
            print(os.path.join(os.path.relpath(a.results), name))


if __name__ == '__main__':
    main()
