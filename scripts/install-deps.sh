#!/usr/bin/env bash
# Installs every Debian 12 package kvpr needs to build, test and run. Idempotent: packages
# already present are skipped, and apt-get runs only when something is missing.
# The CUDA toolkit is not a Debian package: it is expected at /usr/local/cuda (nvcc 13);
# without it the build has the CPU backend only.
set -euo pipefail

PACKAGES=(
  build-essential      # g++ 12 (C++20)
  cmake                # >= 3.25
  ninja-build
  pkg-config
  git
  xz-utils             # tar -J: the device carry (bench/prepare-device-carry.sh)
  curl                 # the demo script talks to the daemon
  python3              # the CLI test uses it to check JSON and .npy output
  libopenblas-dev      # CPU GEMMs
  libgtest-dev         # GoogleTest
  libhwloc-dev         # NUMA placement (daemon)
  libboost1.81-dev     # Asio, Beast (daemon)
  libspdlog-dev        # daemon logging
  libsystemd-dev       # sd_notify
  libonig-dev          # Oniguruma: tokenizer.json's Split and Replace patterns
  libutf8proc-dev      # utf8proc: Unicode normalization forms and categories (tokenizer normalizers)
  haproxy              # the scale-out test: two kvprd behind it (deploy/haproxy.cfg)
  systemd              # systemd-analyze verify of the unit in the tests
  strace               # the tests check what kvprd calls against the unit's system call filter
)

# Node.js and npm run the official `openai` npm client in the daemon's tests. Debian's
# packages are used unless a Node.js is already installed (it may come from elsewhere).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "install-deps: CUDA toolkit: $(/usr/local/cuda/bin/nvcc --version | tail -n 2 | head -n 1)"
else
  echo "install-deps: no CUDA toolkit at /usr/local/cuda; building the CPU backend only"
fi
