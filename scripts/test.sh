#!/usr/bin/env bash
# Quick start, command 2: installs what is missing, builds everything (CUDA sources too when
# nvcc is present) and runs every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
cd build
ctest --output-on-failure -j "${KVPR_JOBS:-2}"
