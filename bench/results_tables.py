#!/usr/bin/env python3
"""README.md's and docs/results.md's tables of the device entry point's results, from
bench/results: after a device run, `python3 bench/device_parts.py collect <files_at>` then this,
and the tables name each part's date, commit, hardware and status, with its targets met or not.
The charts a benchmark drew (kept inside its part's JSON) are written beside it as
<result>-<chart>.svg and linked.

Each document holds its tables between `<!-- results:device -->` and `<!-- /results:device -->`
(README.md: one line a part) and `<!-- results:device-parts -->` ... (docs/results.md: every
figure); the rest of the text is left as it is.

    python3 bench/results_tables.py [--results bench/results] [--kind h200] [--readme README.md]
                                    [--results-md docs/results.md] [--charts DIR]
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_parts  # noqa: E402

ROOT = device_parts.ROOT


def newest(results_dir, kind, part):
    found = device_parts.results_of(results_dir, kind, part)
    return found[0] if found else (None, None)


def hardware(doc):
    h = doc.get('hardware', {})
    gpus = h.get('gpus') or []
    gpu = gpus[0] if gpus else {}
    pcie = f", PCIe {gpu['pcie.link.gen.current']}.0 x{gpu['pcie.link.width.current']}" if gpu.get('pcie.link.gen.current') else ''
    name = f"{len(gpus)} x {gpu['name']}" if len(gpus) > 1 else gpu.get('name', 'no GPU')
    drv = f", driver {gpu['driver_version']}" if gpu.get('driver_version') else ''
    cuda = f", CUDA {h['cuda']}" if h.get('cuda') else ''
    return f"{name}{pcie}{drv}{cuda}, {h.get('cpus')} CPUs, {round((h.get('memory_bytes') or 0) / 2**30)} GiB"


def f(x, digits=2):
    return '' if x is None else (f'{x:.{digits}f}' if isinstance(x, (int, float)) else str(x))


def targets_line(doc):
    t = doc.get('targets') or []
    if not t:
        return ''
    met = sum(1 for x in t if x['met'])
    missed = [x for x in t if x['met'] is False]
    s = f'targets met: {met} of {len(t)}'
    if missed:
        s += '; missed: ' + '; '.join(f"{x['what']} {f(x['value'])} (target {x['target']})" for x in missed[:4])
        if len(missed) > 4:
            s += f'; {len(missed) - 4} more'
    return s


def charts(path, doc, charts_dir, rel_from):
    """Writes the part's SVGs beside its JSON; returns markdown links to them."""
    links = []
    stem = os.path.basename(path)[:-5]
    for name, text in sorted((doc.get('texts') or {}).items()):
        if not name.endswith('.svg') or not text.strip().startswith('<svg'):
            continue
        out = os.path.join(charts_dir, f'{stem}-{name}')
        with open(out, 'w') as o:
            o.write(text)
        links.append(f'[{name[:-4]}]({os.path.relpath(out, rel_from)})')
    return links


def headline(part, doc):
    """The one figure a reader looks for first."""
    s = doc.get('summary') or {}
    name = part.split('-')[0]
    if name == 'tests':
        return f"{s.get('tests')} GPU tests, {s.get('failures')} failing" + (': ' + ', '.join(s['failed'][:3]) if s.get('failed') else '')
    if name == 'decode':
        d = s.get('decode') or {}
        r, m = d.get('ratios', {}), d.get('modes', {})
        bits = [f"kvpr {f(r.get('kvpr_speedup_over_offload'))}x offload" if 'kvpr_speedup_over_offload' in r else '']
        bits += [f"{k} {f(v['ms_per_step'])} ms/step ({f(v['over_bound'])}x bound)" for k, v in m.items() if k in ('resident', 'kvpr')]
        return '; '.join(b for b in bits if b)
    if name == 'kvprd':
        return f"TPOT p50 over kvpr-bench's step: {f(s.get('served_tpot_over_bench_step'))} (mode {s.get('bench_mode')})"
    if name == 'auto':
        return 'texts equal resident: ' + ', '.join(f'{k} {v}' for k, v in (s.get('texts_equal_resident') or {}).items())
    if name == 'syscalls':
        out = s.get('outside')
        return f"{s.get('calls')} system calls" + ('' if out is None else f", {len(out)} outside @system-service" +
                                                  (': ' + ' '.join(out) if out else ''))
    if name == 'sweep':
        return f'{len(s)} points: ' + '; '.join(f"{k[6:]} kvpr/offload {f(v['ratios'].get('kvpr_speedup_over_offload'))}"
                                                  for k, v in s.items())
    if name == 'scale':
        return '; '.join(f"{m}: N={p[-1]['workers']} eff {f(p[-1]['efficiency'])}" for m, p in s.items() if p)
    if name == 'paged':
        return f"most sequences at once through kvprd: {f(s.get('most_running'), 0)}"
    if name == 'flexgen':
        return f"kvpr {f(s.get('kvpr_over_flexgen_best'))}x FlexLLMGen's best policy"
    return ''


def readme_block(results_dir, kind, readme_dir):
    rows = ['| part | result | date, commit, hardware |', '|---|---|---|']
    for p in device_parts.PARTS:
        path, doc = newest(results_dir, kind, p.name)
        if not doc:
            rows.append(f'| {p.name} | not yet measured | |')
            continue
        status = '' if doc.get('status') == 'complete' else f" (**{doc.get('status')}**)"
        rel = os.path.relpath(path, readme_dir)
        res = '; '.join(x for x in (headline(p.name, doc), targets_line(doc)) if x)
        rows.append(f"| {p.name} | {res}{status} | [{doc['date'][:10]}, {doc['commit'][:12]}]({rel}), {hardware(doc)} |")
    return '\n'.join(rows)


def detail(part, path, doc, charts_dir, md_dir):
    s = doc.get('summary') or {}
    name = part.split('-')[0]
    out = [f"### {part}: {doc['date'][:10]}, commit {doc['commit'][:12]}, {hardware(doc)}", '',
           f"[{os.path.basename(path)}]({os.path.relpath(path, md_dir)}), {doc.get('seconds')} s, status "
           f"{doc.get('status')}. {doc.get('what', '')}.", '']
    links = charts(path, doc, charts_dir, md_dir)
    if links:
        out += ['Charts: ' + ', '.join(links) + '.', '']
    if name in ('decode', 'sweep'):
        for key, d in s.items():
            out += [f"**{d.get('title')}**{'' if d.get('complete') else ' (cut short)'}", '',
                    '| mode | ms/step | tokens/s | H2D MB/step | physical bound ms | x physical | busy |', '|---|---|---|---|---|---|---|']
            for m, v in d.get('modes', {}).items():
                out.append(f"| {m} | {f(v['ms_per_step'])} | {f(v['tokens_per_s'], 1)} | {f(v['h2d_mb_per_step'], 1)} | "
                           f"{f(v['bound_ms'])} | {f(v['over_bound'])} | {f(v['busy'])} |")
            if d.get('ratios'):
                out += ['', 'Ratios: ' + ', '.join(f'{k} {f(v)}' for k, v in d['ratios'].items()) + '.']
            out.append('')
    elif name == 'kvprd':
        out += ['| load | completed | failed | output tokens/s | TTFT p50 ms | TPOT p50 ms |', '|---|---|---|---|---|---|']
        for k, h in s.items():
            if k.startswith('http-'):
                out.append(f"| concurrency {h.get('concurrency')} | {h.get('completed')} | {h.get('failed')} | "
                           f"{f(h.get('output_tokens_per_s'), 1)} | {f((h.get('ttft_ms') or {}).get('p50'), 1)} | "
                           f"{f((h.get('tpot_ms') or {}).get('p50'))} |")
        out += ['', f"kvprd's TPOT p50 over kvpr-bench decode's step at the same batch ({s.get('bench_mode')}): "
                    f"{f(s.get('served_tpot_over_bench_step'))}.", '']
    elif name == 'scale':
        out += ['| mode | workers | tokens/s | efficiency |', '|---|---|---|---|']
        for m, pts in s.items():
            for p in pts:
                out.append(f"| {m} | {p['workers']} | {f(p['tokens_per_s'], 1)}{'*' if p.get('projected') else ''} | {f(p['efficiency'])} |")
        out += ['', '\\* projected: N x worker 0, measured with N-1 neighbours loading the host.', '']
    elif name == 'flexgen':
        out += ['| engine | decode tokens/s |', '|---|---|']
        for m, v in (s.get('ours_tokens_per_s') or {}).items():
            out.append(f'| kvpr-bench {m} | {f(v, 1)} |')
        out.append(f"| FlexLLMGen, best policy {s.get('flexgen_best_policy')} | {f(s.get('flexgen_best_tokens_per_s'), 1)} |")
        out += ['', f"kvpr over FlexLLMGen's best: {f(s.get('kvpr_over_flexgen_best'))}.", '']
    else:
        out += ['`' + str(s) + '`' if len(str(s)) < 600 else headline(part, doc), '']
    t = doc.get('targets') or []
    if t:
        out += ['| target | measured | wanted | met |', '|---|---|---|---|']
        out += [f"| {x['what']} | {f(x['value'])} | {x['target']} | {'yes' if x['met'] else 'no' if x['met'] is False else '?'} |" for x in t]
        out.append('')
    return out


def results_block(results_dir, kind, charts_dir, md_dir):
    out, waiting = [], []
    for p in device_parts.PARTS:
        path, doc = newest(results_dir, kind, p.name)
        if doc:
            out += detail(p.name, path, doc, charts_dir, md_dir)
        else:
            waiting.append(f'| {p.name} | {p.what} |')
    if waiting:
        out += [f'Not yet measured, waiting for a lent {kind.upper()}:', '', '| part | what it measures |', '|---|---|'] + waiting
    return '\n'.join(out).rstrip()


def replace(path, marker, body):
    text = open(path).read()
    pat = re.compile(rf'(<!-- results:{marker} -->\n).*?(<!-- /results:{marker} -->)', re.S)
    if not pat.search(text):
        raise SystemExit(f'results_tables: {path} has no <!-- results:{marker} --> ... <!-- /results:{marker} --> block')
    new = pat.sub(lambda m: m.group(1) + body + '\n' + m.group(2), text)
    if new != text:
        open(path, 'w').write(new)
    return new != text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--results', default=os.path.join(ROOT, 'bench', 'results'))
    ap.add_argument('--kind', default='h200', choices=['h200', 'dryrun'])
    ap.add_argument('--readme', default=os.path.join(ROOT, 'README.md'))
    ap.add_argument('--results-md', default=os.path.join(ROOT, 'docs', 'results.md'))
    ap.add_argument('--charts', help='where the charts go [beside the results]')
    a = ap.parse_args()
    charts_dir = a.charts or a.results
    changed = replace(a.readme, 'device', readme_block(a.results, a.kind, os.path.dirname(os.path.abspath(a.readme))))
    changed |= replace(a.results_md, 'device-parts', results_block(a.results, a.kind, charts_dir, os.path.dirname(os.path.abspath(a.results_md))))
    print('results_tables:', 'updated' if changed else 'unchanged', a.readme, a.results_md)


if __name__ == '__main__':
    main()
