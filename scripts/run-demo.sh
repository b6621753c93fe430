#!/usr/bin/env bash
# Quick start, command 1: installs what is missing, builds, makes the bundled demo model and
# runs it (on the GPU when one is present, else on the CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
[ -f demo-model/model.safetensors ] || build/cli/kvpr make-demo-model --out demo-model
build/cli/kvpr info --model demo-model
echo
echo "$ kvpr generate --model demo-model --prompt \"The KV cache lives in host memory because\" -n 24"
build/cli/kvpr generate --model demo-model --prompt "The KV cache lives in host memory because" -n 24 --json
