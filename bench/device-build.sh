#!/usr/bin/env bash
# The device's one configure and build, against what bench/prepare-device-carry.sh carried:
# kvprd's dependencies from the unpacked prefix, GoogleTest from its sources, no Oniguruma or
# utf8proc (the device has neither). bench/device-check-all.sh builds with it on the H200; CI
# builds kvprd with it on the CPU and checks that nothing came from the system's headers or
# libraries (tests/bench/device_carry_test.sh).
#
#   bench/device-build.sh CARRY PREFIX BUILD JOBS cuda|cpu TARGET... [-- CMAKE-ARG...]
#
# Unpacks CARRY/daemon-prefix.tar.xz into PREFIX (Python's tarfile where tar has no xz), then
# configures BUILD (Release unless a CMake argument says otherwise; cuda: sm_90) and builds the
# targets. Our binaries then run with LD_LIBRARY_PATH=PREFIX/lib/x86_64-linux-gnu.
set -uo pipefail
[ $# -ge 6 ] || { echo "usage: bench/device-build.sh CARRY PREFIX BUILD JOBS cuda|cpu TARGET... [-- CMAKE-ARG...]" >&2; exit 2; }
carry=$1 pfx=$2 build=$3 jobs=$4 device=$5
shift 5
targets=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do targets+=("$1"); shift; done
[ $# -gt 0 ] && shift
cd "$(dirname "$0")/.."
for f in "$carry/daemon-prefix.tar.xz" "$carry/googletest/CMakeLists.txt"; do
  [ -s "$f" ] || { echo "device-build: no $f: run bench/prepare-device-carry.sh first" >&2; exit 1; }
done
carry=$(cd "$carry" && pwd)
rm -rf "$pfx" && mkdir -p "$pfx" && pfx=$(cd "$pfx" && pwd)
tar -xJf "$carry/daemon-prefix.tar.xz" -C "$pfx" 2>/dev/null ||
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$carry/daemon-prefix.tar.xz" "$pfx" ||
  { echo "device-build: cannot unpack $carry/daemon-prefix.tar.xz" >&2; exit 1; }
sed -i "s|@PREFIX@|$pfx|g" "$pfx"/lib/x86_64-linux-gnu/pkgconfig/*.pc
export PKG_CONFIG_PATH=$pfx/lib/x86_64-linux-gnu/pkgconfig PKG_CONFIG_LIBDIR=$pfx/lib/x86_64-linux-gnu/pkgconfig
export LD_LIBRARY_PATH=$pfx/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}  # the carried pkg-config's libpkgconf
opts=(-DKVPR_CUDA=OFF)
[ "$device" = cuda ] && opts=(-DKVPR_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
mkdir -p "$build"
gen=()
command -v ninja > /dev/null && gen=(-G Ninja)
cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "${opts[@]}" -DKVPR_WERROR=OFF -DKVPR_TEXT_LIBS=OFF \
    -DKVPR_TESTS=ON -DKVPR_GTEST_SOURCE="$carry/googletest" -DKVPR_DAEMON=ON -DKVPR_BENCH=ON \
    -DCMAKE_PREFIX_PATH="$pfx" -DPKG_CONFIG_EXECUTABLE="$pfx/bin/pkg-config" "$@" > "$build/device-build.cmake.log" 2>&1 ||
  { tail -30 "$build/device-build.cmake.log"; echo "device-build: configure failed ($build/device-build.cmake.log)" >&2; exit 1; }
grep "kvpr:" "$build/device-build.cmake.log"
cmake --build "$build" -j "$jobs" --target "${targets[@]}" > "$build/device-build.log" 2>&1 ||
  { grep -E "error" -A3 "$build/device-build.log" | head -40; echo "device-build: build failed ($build/device-build.log)" >&2; exit 1; }
