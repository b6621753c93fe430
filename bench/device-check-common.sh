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

# kvprd's dependencies from our Debian packages, as a prefix (bench/prepare-device-carry.sh), and
# the tree built for sm_90 with the daemon ($BIN, unless a built tree was given): sets LIBS and run.
build_daemon_tree() {
  PFX=/tmp/kvpr-prefix
  if [ -s .carry/daemon-prefix.tar.xz ]; then
    rm -rf "$PFX" && mkdir -p "$PFX" && tar -xJf .carry/daemon-prefix.tar.xz -C "$PFX"
    sed -i "s|@PREFIX@|$PFX|g" "$PFX"/lib/x86_64-linux-gnu/pkgconfig/*.pc
    export PKG_CONFIG_PATH=$PFX/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_LIBDIR=$PFX/lib/x86_64-linux-gnu/pkgconfig
  fi
  # Our binaries (and CMake's pkg-config) find the carried libraries; python and torch keep the machine's.
  LIBS=$PFX/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  run() { LD_LIBRARY_PATH=$LIBS "$@"; }
  if [ -z "$BIN" ]; then
    say "build (sm_90, the daemon against the carried prefix)"
    BIN=build-device
    run cmake -S . -B "$BIN" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVPR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
          -DKVPR_WERROR=OFF -DKVPR_TEXT_LIBS=OFF -DKVPR_TESTS=OFF -DKVPR_DAEMON=ON -DCMAKE_PREFIX_PATH="$PFX" \
          -DPKG_CONFIG_EXECUTABLE="$PFX/bin/pkg-config" > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; exit 1; }
    grep "kvpr:" "$OUT/cmake.log"
    run ninja -C "$BIN" -j "$JOBS" kvpr kvpr-bench kvprd kvpr-worker > "$OUT/build.log" 2>&1 \
      || { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
  fi
}

# kvprd on the built tree in the background (pid in $pid), then up to READY_BY seconds of the check
# for /health to say ok: returns 0 when it did. Usage: start_kvprd PORT LOG READY_BY kvprd-args...
start_kvprd() {
  local port=$1 log=$2 ready_by=$3
  shift 3
  LD_LIBRARY_PATH=$LIBS "$BIN/daemon/kvprd" --port "$port" --config /dev/null --worker-binary "$BIN/worker/kvpr-worker" \
      "$@" > "$log" 2>&1 &
  pid=$!  # kvprd itself (a plain command in the background), so stop_kvprd's TERM reaches it
  for _ in $(seq 1 240); do
    [ "$(elapsed)" -lt "$ready_by" ] || return 1
    python3 -c "import json,urllib.request,sys; sys.exit(json.load(urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2))['status'] != 'ok')" 2>/dev/null && return 0
    kill -0 $pid 2>/dev/null || return 1
    sleep 0.5
  done
  return 1
}

# SIGTERM drains; past 20 s kvprd and its workers are killed (the next run needs the GPU).
stop_kvprd() {
  kill -TERM $pid 2>/dev/null
  for _ in $(seq 1 40); do kill -0 $pid 2>/dev/null || break; sleep 0.5; done
  if kill -0 $pid 2>/dev/null; then pkill -KILL -P $pid 2>/dev/null; kill -KILL $pid 2>/dev/null; fi
  wait $pid 2>/dev/null
}
