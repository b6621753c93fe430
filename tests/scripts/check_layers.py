#!/usr/bin/env python3
"""The engine's folders include only their own headers and those of the folders below them
(docs/design.md §5): base <- contract <- backend, text, constrain <- kv <- model <- decode. Prints every
include that points up or sideways and exits 1 if there is one. Run by ctest (engine_layers)."""
import glob
import os
import re
import sys

LEVEL = {"base": 0, "contract": 1, "backend": 2, "text": 2, "constrain": 2, "kv": 3, "model": 4, "decode": 5}
root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
bad = []
for path in sorted(glob.glob(os.path.join(root, "engine", "**", "*"), recursive=True)):
    if not path.endswith((".h", ".cc", ".cu")):
        continue
    folder = os.path.relpath(path, os.path.join(root, "engine")).split(os.sep)[0]
    if folder not in LEVEL:
        continue
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = re.match(r'\s*#\s*include\s+"engine/(\w+)/', line)
            if m and m.group(1) in LEVEL and m.group(1) != folder and LEVEL[m.group(1)] >= LEVEL[folder]:
                bad.append(f"{os.path.relpath(path, root)}:{n}: {folder}/ includes {m.group(1)}/ ({line.strip()})")
for b in bad:
    print(b)
print(f"engine layers: {len(bad)} include(s) pointing up or sideways")
sys.exit(1 if bad else 0)
