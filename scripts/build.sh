#!/usr/bin/env bash
# Configures and builds kvpr into ./build (Release, warnings fatal). Extra arguments go to
# CMake, e.g. scripts/build.sh -DKVPR_CUDA=OFF. Jobs: $KVPR_JOBS or 2.
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
command -v ninja >/dev/null && [ ! -f build/Makefile ] && generator=(-G Ninja)
cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DKVPR_WERROR=ON "$@"
cmake --build build -j "${KVPR_JOBS:-2}"
