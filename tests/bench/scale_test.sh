#!/usr/bin/env bash
# kvpr-bench scale: its plan for N workers is kvprd's (`kvpr topology`) on every XML fixture,
# it runs N = 1, 2 on the CPU backend with the emulated link (one real worker and a neighbour,
# then two real workers), writes its JSON and chart, and refuses what does not fit the host
# before allocating. Structure and arithmetic only, never timings.
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
data=$KVPR_TEST_DATA/hwloc

# 1. Plans: for each fixture and N up to its GPUs, the same nodes and cpusets as kvprd's plan for
# its first N GPUs; past its GPUs, the real ones keep kvprd's nodes.
for xml in "$data"/*.xml; do
  "$KVPR_BENCH" scale --topology "$xml" --workers 1,2,3,4,8 >"$tmp/plan.json"
  ids=$("$KVPR_CLI" topology --xml "$xml" --json | python3 -c 'import json,sys; print(",".join(g["bus_id"] for g in json.load(sys.stdin)["gpus"]))')
  for n in 1 2 3 4 8; do
    first=$(echo "$ids" | cut -d, -f1-"$n")
    "$KVPR_CLI" topology --xml "$xml" --gpus "$first" --json >"$tmp/kvprd-$n.json"
  done
  python3 - "$tmp" "$ids" "$xml" <<'PY'
import json, os, sys
tmp, ids, xml = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
plans = {p["workers"]: p["placement"]["workers"] for p in json.load(open(os.path.join(tmp, "plan.json")))["plans"]}
assert sorted(plans) == [1, 2, 3, 4, 8], plans.keys()
for n, ws in plans.items():
    assert len(ws) == n, (xml, n, ws)
    ref = json.load(open(os.path.join(tmp, f"kvprd-{n}.json")))["workers"]
    if n <= len(ids):  # a GPU per worker: exactly kvprd's plan
        got = [(w["cuda_device"], w["gpu_bus_id"], w["numa_node"], w["cpus"]) for w in ws]
        want = [(w["cuda_device"], w["gpu_bus_id"], w["numa_node"], w["cpus"]) for w in ref]
        assert got == want, (xml, n, got, want)
    else:  # neighbours beyond the GPUs: the GPUs' workers keep their nodes, none without one
        for w, r in zip(ws, ref):
            assert (w["cuda_device"], w["numa_node"]) == (r["cuda_device"], r["numa_node"]), (xml, n, w, r)
        assert all(w["cuda_device"] == -1 and w["numa_node"] >= 0 for w in ws[len(ids):]), (xml, n, ws)
    # cpusets disjoint when the machine has a core per worker
    cpus = [c for w in ws for c in w["cpus"].split(",")]
    pus = sum(len(range(int(a), int(b) + 1)) if b else 1 for part in
              ",".join(nd["cpus"] for nd in json.load(open(os.path.join(tmp, f"kvprd-{n}.json")))["nodes"]).split(",")
              for a, _, b in [part.partition("-")])
    if pus >= n:
        assert len(cpus) == len(set(cpus)), (xml, n, ws)
PY
done

# 2. A run: tiny model, N = 1, 2, every mode with host KV that the default list names.
run() {
  "$KVPR_BENCH" scale --preset tiny --backend cpu --workers 1,2 --batch 2 --prompt 24 --gen 2 --kv-dtype f32 \
    --emulate-link-gbps 2 --probe-mib 8 "$@" >"$tmp/out" 2>&1 || { cat "$tmp/out"; exit 1; }
}
run --real-workers 1 --json "$tmp/n.json" --svg "$tmp/n.svg"
run --real-workers 2 --modes kvpr,cpu-attn --json "$tmp/r.json"
"$KVPR_CLI" topology --workers 2 --json >"$tmp/here-2.json"
python3 - "$tmp" <<'PY'
import json, os, sys, xml.dom.minidom
tmp = sys.argv[1]
here = [w["cpus"] for w in json.load(open(os.path.join(tmp, "here-2.json")))["workers"]]
for name, reals, modes in (("n", 1, ["kvpr", "offload", "cpu-attn"]), ("r", 2, ["kvpr", "cpu-attn"])):
    r = json.load(open(os.path.join(tmp, name + ".json")))
    assert r["benchmark"] == "scale" and r["batch"] == 2 and r["real_workers_available"] == reals, r
    assert [x["threads"] for x in r["host_read_gbps"]][0] == 1 and all(x["gbps"] > 0 for x in r["host_read_gbps"]), r
    assert r["h2d_gbps_with_readers"][0]["readers"] == 0 and all(x["gbps"] > 0 for x in r["h2d_gbps_with_readers"]), r
    assert [m["mode"] for m in r["modes"]] == modes, r["modes"]
    for m in r["modes"]:
        assert m["prefill_s"] > 0 and m["link_gbps"] > 0, m
        p1, p2 = m["points"]
        assert (p1["workers"], p2["workers"]) == (1, 2), m
        assert p1["real_workers"] == 1 and not p1["projected"] and p1["efficiency"] == 1, p1
        assert p2["real_workers"] == min(2, reals) and p2["projected"] == (reals < 2), p2
        for p in (p1, p2):
            ws = p["per_worker"]
            assert [w["worker"] for w in ws] == list(range(p["workers"])), ws
            assert [w["real"] for w in ws] == [i < p["real_workers"] for i in range(p["workers"])], ws
            assert all(w["ms_per_step"] > 0 and w["host_cpu_s_per_step"] >= 0 and w["host_dram_bytes_per_step"] > 0
                       for w in ws), ws
            assert all(("link_gbps" if w["real"] else "read_gbps") in w for w in ws), ws
            tps = [2 / (w["ms_per_step"] / 1e3) for w in ws if w["real"]]
            want = p["workers"] * 2 / (p["worker0_ms_per_step"] / 1e3) if p["projected"] else sum(tps)
            assert abs(p["aggregate_tokens_per_s"] - want) <= 1e-6 * want, p
            assert abs(p["efficiency"] - p["aggregate_tokens_per_s"] / (p["workers"] * p1["aggregate_tokens_per_s"])) < 1e-9, p
        assert [w["cpus"] for w in p2["per_worker"]] == here, (p2, here)  # kvprd's plan for 2 workers here
        if m["mode"] == "cpu-attn":  # the host attention's reads are accounted: K and V of the context
            ws = p2["per_worker"]
            assert all(w["host_dram_bytes_per_step"] >= 2 * 25 * 4 * 2 * 128 * 4 for w in ws), ws
xml.dom.minidom.parse(os.path.join(tmp, "n.svg"))
PY

# 2b. The emulated build (KVPR_SCALE_EMULATED_GPUS=1): N = 1, 2 real GPU workers, one per emulated
# device, each placed on its GPU's node of the two-socket fixture (the paths, not the numbers).
if [ "${KVPR_SCALE_EMULATED_GPUS:-0}" = 1 ]; then
  KVPR_EMULATED_GPUS=2 KVPR_EMULATED_GPU_MEMORY=256MiB KVPR_EMULATED_LINK_GBPS=2 \
  KVPR_EMULATED_PCI_BUS_IDS=0000:17:00.0,0000:65:00.0 HWLOC_XMLFILE=$data/two-socket-two-gpu.xml HWLOC_COMPONENTS=xml \
    "$KVPR_BENCH" scale --preset tiny --backend cuda --workers 1,2 --batch 2 --prompt 24 --gen 2 --kv-dtype f32 \
    --probe-mib 8 --modes kvpr,offload --json "$tmp/gpus.json" >"$tmp/out" 2>&1 || { cat "$tmp/out"; exit 1; }
  python3 - "$tmp/gpus.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["real_workers_available"] == 2 and r["complete"], r
for m in r["modes"]:
    p2 = m["points"][1]
    assert p2["real_workers"] == 2 and not p2["projected"], p2
    assert [(w["numa_node"], w["cpus"]) for w in p2["per_worker"]] == [(0, "0-1"), (1, "2-3")], p2["per_worker"]
    assert all(w["ms_per_step"] > 0 for w in p2["per_worker"]), p2
PY
  echo "scale: 2 emulated GPUs ok"
fi

# 3. What does not fit the host is refused before anything is allocated, in one line.
set +e
"$KVPR_BENCH" scale --preset tiny --backend cpu --workers 1,8 --batch 100000 --prompt 4000 --gen 2 --modes offload \
  --probe-mib 8 >"$tmp/big" 2>&1
rc=$?
set -e
[ "$rc" = 1 ] || { echo "a KV past the host memory: exit $rc"; cat "$tmp/big"; exit 1; }
grep -q "^kvpr-bench: error: 8 workers of batch 100000 .* GB of host memory for their KV" "$tmp/big" || { cat "$tmp/big"; exit 1; }
for bad in "--workers 0" "--workers 1,x" "--modes resident" "--batch 0"; do
  set +e
  # shellcheck disable=SC2086
  "$KVPR_BENCH" scale --preset tiny --backend cpu $bad >"$tmp/bad" 2>&1
  rc=$?
  set -e
  [ "$rc" = 1 ] && [ "$(grep -c 'kvpr-bench: error:' "$tmp/bad")" = 1 ] || { echo "$bad: exit $rc"; cat "$tmp/bad"; exit 1; }
done
echo "scale: ok"
