#!/usr/bin/env python3
"""kvpr-bench schemas over the JSONSchemaBench sample kept beside the repository
(../shared/jsonschemabench/sample.jsonl, never copied into it): every schema is compiled or
refused with a message that names where (a path from "$") or the limit it passed, within the
compile budget; every compiled schema's instances are judged; the JSON holds one row a schema and
counts that add up. Then, with a real tokenizer (KVPR_TEST_TOKENIZER), a few schemas' valid
instances written token by token: every token's mask is timed and counted, and where an instance
is taken byte by byte every one of its tokens is allowed by its mask. It asserts what the tool
reports, never a share or a time (the benchmark's numbers are in bench/results). Skipped (77)
where the sample is not there."""
import json
import os
import subprocess
import sys
import tempfile

sample = os.environ.get("KVPR_SCHEMA_SAMPLE", "")
if not sample or not os.path.exists(sample):
    print(f"skipped: no JSONSchemaBench sample at {sample!r}")
    sys.exit(77)
bench = os.environ["KVPR_BENCH"]
lines = [json.loads(line) for line in open(sample) if line.strip()]
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "schemas.json")
    r = subprocess.run([bench, "schemas", "--file", sample, "--json", out], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    doc = json.load(open(out))
rows = doc["rows"]
assert doc["schemas"] == len(lines) == len(rows), (doc["schemas"], len(lines), len(rows))
assert [row["id"] for row in rows] == [line["id"] for line in lines]
compiled = [row for row in rows if "refused" not in row]
refused = [row for row in rows if "refused" in row]
assert doc["compiled"] == len(compiled) and len(compiled) + len(refused) == len(rows)
for row in refused:
    e = row["error"]
    assert e.startswith("$") or e.startswith("the schema"), f"{row['id']}: a refusal that names no path: {e}"
    assert "took longer than" not in e, f"{row['id']}: past the compile budget: {e}"
for row in compiled:
    assert row["compile_ms"] < 2000, row
tests = {line["id"]: len(line.get("tests") or []) for line in lines}
judged = sum(row.get("instances", 0) for row in compiled)
assert judged == sum(tests[row["id"]] for row in compiled), "an instance of a compiled schema was not judged"
assert doc["valid"] + doc["invalid"] == judged
assert sum(c["schemas"] for c in doc["subsets"].values()) == len(rows)
print(f"schemas: {len(compiled)} of {len(rows)} compiled, {doc['all_right']} of {doc['with_tests']} with every "
      f"instance judged right; refused: {', '.join(f'{k} ({n})' for k, n in list(doc['refused'].items())[:6])}")

tokenizer = os.environ.get("KVPR_TEST_TOKENIZER", "")
if tokenizer:
    # The first schema of each subset with a valid instance that compiles and is judged all right.
    right = {row["id"] for row in compiled if row.get("instances") and row["instances_right"] == row["instances"]}
    picked, seen = [], set()
    for line in lines:
        subset = line.get("subset", "all")
        if subset not in seen and line["id"] in right and any(t["valid"] for t in line.get("tests") or []):
            seen.add(subset)
            picked.append(line)
    with tempfile.TemporaryDirectory() as tmp:
        few, out = os.path.join(tmp, "few.jsonl"), os.path.join(tmp, "masks.json")
        with open(few, "w") as f:
            for line in picked:
                f.write(json.dumps(line) + "\n")
        r = subprocess.run([bench, "schemas", "--file", few, "--tokenizer", tokenizer, "--json", out],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        masked = json.load(open(out))
    assert masked["compiled"] == len(picked) > 0, (masked["compiled"], len(picked))
    assert masked["token_masks"] == sum(row["masks"] for row in masked["rows"]) > 0
    for row in masked["rows"]:
        assert row["masks"] > 0 and "tokens_refused" not in row, row
        assert row["mask_us_p50"] <= row["mask_us_max"] and row["first_mask_allowed"] > 0, row
    assert masked["valid_tokens_refused"] == 0
    print(f"token by token: {masked['token_masks']} masks over {len(picked)} schemas' valid instances, every token allowed")
