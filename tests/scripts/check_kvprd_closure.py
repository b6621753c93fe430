#!/usr/bin/env python3
"""kvprd, the controller, compiles none of the engine but its plain values and links no CUDA
library (docs/design.md §5): every project header reachable by #include from daemon/ must be
outside engine/ or one of the engine's plain-value headers (base/, contract/, text/, and the
options), and `ldd KVPRD` must name no CUDA library. Prints the closure's size by folder and
exits 1 on a header or library that should not be there. Run by ctest (kvprd_links_no_engine)."""
import glob
import os
import re
import subprocess
import sys

root = sys.argv[1]
kvprd = sys.argv[2] if len(sys.argv) > 2 else None
ALLOWED = ("engine/base/", "engine/contract/", "engine/text/", "engine/decode/engine_options.h",
           "engine/decode/generator_options.h", "engine/kv/kv_options.h", "engine/kv/link_profile.h")
INCLUDE = re.compile(r'\s*#\s*include\s+"([^"]+)"')


def includes(path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        for line in f:
            m = INCLUDE.match(line)
            if m and os.path.exists(os.path.join(root, m.group(1))):
                yield m.group(1)


start = sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "daemon", "*.[hc]*")))
seen, todo, via = set(), list(start), {}
while todo:
    p = todo.pop()
    for q in includes(p):
        if q not in seen:
            seen.add(q)
            via[q] = p
            todo.append(q)
headers = sorted(h for h in seen if h.endswith(".h"))
bad = [h for h in headers if h.startswith("engine/") and not h.startswith(ALLOWED)]
by_folder = {}
for h in headers:
    folder = "/".join(h.split("/")[:2]) if h.startswith("engine/") else h.split("/")[0]
    by_folder[folder] = by_folder.get(folder, 0) + 1
print(f"kvprd's include closure: {len(headers)} project headers:",
      ", ".join(f"{k} {v}" for k, v in sorted(by_folder.items())))
for h in bad:
    print(f"{h}: an engine header kvprd must not compile (included from {via[h]})")
libs = []
if kvprd:
    out = subprocess.run(["ldd", kvprd], capture_output=True, text=True).stdout
    libs = [l.split()[0] for l in out.splitlines() if re.search(r"cuda|cublas|nccl|nvrtc|libnv", l)]
    for l in libs:
        print(f"{kvprd} links {l}, a CUDA library")
sys.exit(1 if bad or libs else 0)
