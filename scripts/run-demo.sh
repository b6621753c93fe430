#!/usr/bin/env bash
# Quick start, command 1: installs what is missing, builds, makes the bundled demo model and
# runs the daemon on it (GPU workers when a GPU is present, else 2 CPU workers), sends it one
# request with curl to show it works, and keeps serving on http://127.0.0.1:${PORT:-8000}
# until Ctrl-C (KVPR_DEMO_EXIT=1: stop after the demo request).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
[ -f demo-model/model.safetensors ] || build/cli/kvpr make-demo-model --out demo-model
PORT=${PORT:-8000}
build/daemon/kvprd --model demo-model --served-model-name demo --port "$PORT" --workers 2 --config /dev/null &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid' EXIT INT TERM
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 $pid 2>/dev/null || { echo "kvprd exited" >&2; exit 1; }
  sleep 0.1
done
echo
echo "\$ curl http://127.0.0.1:$PORT/v1/completions -d '{\"model\": \"demo\", \"prompt\": \"The KV cache lives in host memory because\", \"max_tokens\": 16}'"
curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "demo", "prompt": "The KV cache lives in host memory because", "max_tokens": 16, "temperature": 0}'
echo
echo "(the demo model has random weights: its text is gibberish by design)"
if [ "${KVPR_DEMO_EXIT:-0}" = 1 ]; then exit 0; fi
echo "kvprd is serving on http://127.0.0.1:$PORT (OpenAI-compatible). Ctrl-C stops it."
wait $pid
