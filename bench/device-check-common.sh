# Sourced by bench/device-check-scale.sh and bench/device-check-flexgen.sh: the clock of a check
# and the hardware and commit every result records ($OUT/gpu.csv, $OUT/commit).
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
say() { echo "== [$(elapsed)s] $*"; }

record_hardware_and_commit() {
  say "hardware"
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv \
    > "$OUT/gpu.csv" 2>&1 || echo "no nvidia-smi" > "$OUT/gpu.csv"
  cat "$OUT/gpu.csv"; nproc; free -g | head -2
  # The commit as the caller passes it (the device's copy of the tree may carry stale git metadata).
  if [ -n "${KVPR_CHECK_COMMIT:-}" ]; then echo "$KVPR_CHECK_COMMIT" > "$OUT/commit"
  else git rev-parse --short=12 HEAD 2>/dev/null > "$OUT/commit" || echo unknown > "$OUT/commit"; fi
}
