#!/usr/bin/env bash
# Copies what the device entry point (bench/device-check-all.sh) needs and the device lacks into
# .carry/ (KVPR_CARRY_DIR), which git ignores through .git/info/exclude. Pass carry [".carry"] to
# the run. Works on a fresh Debian 12 machine after scripts/install-deps.sh; says which package
# is missing otherwise.
#   googletest/            GoogleTest's sources (Debian's /usr/src/googletest), built there
#   daemon-prefix.tar.xz   kvprd's build and run dependencies from our Debian packages, as a prefix:
#                          the Boost headers the daemon includes (every top-level Boost library
#                          `g++ -M` finds under its translation units, whole), spdlog and fmt,
#                          hwloc, libsystemd, their shared libraries and what those load (ldd),
#                          CMake and pkg-config files, and pkg-config itself; strace and the
#                          unit's SystemCallFilter=@system-service as a list of calls
#                          (share/kvpr/system-service.syscalls), for the syscalls part
#   npm-openai.tar.xz      the official openai npm client and its dependencies (when the daemon
#                          tests have installed it under build/npm-openai, or KVPR_NPM_DIR)
#   flexllmgen/            FlexLLMGen (FMInference/FlexLLMGen, Apache-2.0), the peer of
#                          bench/flexgen_peer.py, unmodified, from a snapshot at hand: FLEXLLMGEN_GIT
#                          (a clone or a git directory), else the search tool's fetched mirror
#                          (../.mirror/FMInference+FlexLLMGen). Never committed: .carry is ignored.
# Then prints the tree and the carry against the 64 MiB that travel.
set -eu
cd "$(dirname "$0")/.."
CARRY=${KVPR_CARRY_DIR:-.carry}
lib=/usr/lib/x86_64-linux-gnu
die() { echo "prepare-device-carry: $*" >&2; exit 1; }
need() {  # need PATH PACKAGE
  [ -e "$1" ] || die "$1 is missing (Debian package $2: scripts/install-deps.sh installs it)"
}
for t in g++:build-essential python3:python3 xz:xz-utils pkg-config:pkg-config; do
  command -v "${t%%:*}" > /dev/null || die "${t%%:*} is missing (Debian package ${t#*:}: scripts/install-deps.sh)"
done
need /usr/src/googletest/CMakeLists.txt googletest
need /usr/include/boost/asio.hpp libboost1.81-dev
need $lib/cmake/Boost-1.81.0 libboost1.81-dev
need /usr/include/spdlog/spdlog.h libspdlog-dev
need $lib/cmake/spdlog libspdlog-dev
need $lib/cmake/fmt libfmt-dev
need /usr/include/hwloc.h libhwloc-dev
need $lib/pkgconfig/hwloc.pc libhwloc-dev
need /usr/include/systemd/sd-daemon.h libsystemd-dev
need $lib/pkgconfig/libsystemd.pc libsystemd-dev
mkdir -p "$CARRY"
[ "$CARRY" != .carry ] || grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >> .git/info/exclude
[ -d "$CARRY/googletest" ] || cp -r /usr/src/googletest "$CARRY/googletest"

# strace and systemd-analyze (Debian: strace, systemd) make the syscalls part possible; without
# them the rest is carried and that part says what is missing. (A prefix from before strace was
# carried is made again when strace is here.)
syscalls=1
command -v strace > /dev/null && command -v systemd-analyze > /dev/null || syscalls=0
[ $syscalls = 1 ] || echo "prepare-device-carry: no strace or systemd-analyze (Debian: strace, systemd): the syscalls part will fail" >&2
if [ ! -s "$CARRY/daemon-prefix.tar.xz" ] ||
   { [ $syscalls = 1 ] && ! tar -tJf "$CARRY/daemon-prefix.tar.xz" ./bin/strace > /dev/null 2>&1; }; then
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/include/boost" "$stage/lib/x86_64-linux-gnu/cmake" "$stage/lib/x86_64-linux-gnu/pkgconfig" "$stage/bin"
  # The Boost libraries the daemon's, worker's, CLI's and placement's sources include, found by the
  # compiler itself (Release and debug macros both), each copied whole, and Boost's top-level headers.
  deps=$(for f in daemon/*.cc worker/*.cc cli/*.cc numa/*.cc; do
           for d in -DNDEBUG -UNDEBUG; do g++ -std=c++20 -I. -DBOOST_ASIO_NO_DEPRECATED $d -M "$f" 2>/dev/null || true; done
         done | tr ' \\' '\n\n' | sed -n 's|^/usr/include/boost/\([^/]*\)/.*|\1|p' | sort -u)
  [ -n "$deps" ] || die "g++ -M found no Boost header under daemon/ (is libboost1.81-dev installed?)"
  for c in $deps predef; do cp -r "/usr/include/boost/$c" "$stage/include/boost/"; done
  cp /usr/include/boost/*.hpp "$stage/include/boost/"
  cp -r /usr/include/spdlog /usr/include/fmt /usr/include/hwloc /usr/include/hwloc.h /usr/include/systemd "$stage/include/"
  # hwloc's generated config.h sits in Debian's multiarch include directory.
  mkdir -p "$stage/include/hwloc/autogen"
  cp /usr/include/x86_64-linux-gnu/hwloc/autogen/config.h "$stage/include/hwloc/autogen/"
  # The shared libraries and everything they load but the C and C++ runtimes (the device has its own).
  libs=$(for l in libspdlog.so libfmt.so libhwloc.so libsystemd.so; do
           need $lib/$l "the -dev package of ${l%.so}"
           echo "$lib/$l"; ldd "$lib/$l" | awk '$3 ~ /^\// {print $3}'
         done; for b in pkg-config $( [ $syscalls = 1 ] && echo strace ); do
           ldd "$(readlink -f "$(command -v $b)")" | awk '$3 ~ /^\// {print $3}'; done)
  for p in $(echo "$libs" | grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' | sort -u); do
    base=$(basename "$p"); stem=${base%%.so*}
    cp -a "$lib/$stem".so* "$stage/lib/x86_64-linux-gnu/"
  done
  cp -r $lib/cmake/Boost-1.81.0 $lib/cmake/BoostDetectToolset-1.81.0.cmake $lib/cmake/boost_headers-1.81.0 \
        $lib/cmake/spdlog $lib/cmake/fmt "$stage/lib/x86_64-linux-gnu/cmake/"
  for pc in hwloc libsystemd; do
    sed -e 's|^prefix=.*|prefix=@PREFIX@|' -e 's|/usr/lib/x86_64-linux-gnu|${prefix}/lib/x86_64-linux-gnu|g' \
        -e 's|/usr/include|${prefix}/include|g' $lib/pkgconfig/$pc.pc > "$stage/lib/x86_64-linux-gnu/pkgconfig/$pc.pc"
  done
  cp "$(readlink -f "$(command -v pkg-config)")" "$stage/bin/pkg-config"
  if [ $syscalls = 1 ]; then
    cp "$(readlink -f "$(command -v strace)")" "$stage/bin/strace"
    mkdir -p "$stage/share/kvpr"
    python3 bench/syscall_filter.py expand @system-service > "$stage/share/kvpr/system-service.syscalls"
  fi
  tar -cJf "$CARRY/daemon-prefix.tar.xz.part" -C "$stage" .
  mv "$CARRY/daemon-prefix.tar.xz.part" "$CARRY/daemon-prefix.tar.xz"
  echo "prepare-device-carry: daemon prefix: Boost $(echo $deps | wc -w) libraries, $(ls "$stage/lib/x86_64-linux-gnu" | grep -c '\.so') shared objects"
fi

# The official openai npm client and what it requires (for the device's Node.js, if it has one),
# from the npm folder the daemon tests install into.
npm=${KVPR_NPM_DIR:-build/npm-openai}/node_modules
if [ ! -s "$CARRY/npm-openai.tar.xz" ] && [ -d $npm/openai ]; then
  closure=$(python3 - "$npm" <<'PY'
import json, os, sys
root, seen = sys.argv[1], set()
def walk(name):
    p = os.path.join(root, name, 'package.json')
    if name in seen or not os.path.exists(p):
        return
    seen.add(name)
    for d in json.load(open(p)).get('dependencies', {}):
        walk(d)
walk('openai')
print(' '.join(sorted(seen)))
PY
)
  tar -cJf "$CARRY/npm-openai.tar.xz" -C "$npm" $closure
fi

# FlexLLMGen's package at the snapshot's commit (its benchmark/ and third_party trees stay out).
flex=${FLEXLLMGEN_GIT:-}
if [ -z "$flex" ]; then
  for g in ../.mirror/FMInference+FlexLLMGen/repo ../.mirror/FMInference+FlexLLMGen; do
    git --git-dir="$g" rev-parse HEAD > /dev/null 2>&1 && { flex=$g; break; }
  done
fi
[ -z "$flex" ] || [ ! -d "$flex/.git" ] || flex=$flex/.git
if [ ! -f "$CARRY/flexllmgen/COMMIT" ] && [ -n "$flex" ]; then
  rm -rf "$CARRY/flexllmgen" "$CARRY/flexllmgen.part" && mkdir -p "$CARRY/flexllmgen.part"
  git --git-dir="$flex" archive HEAD flexllmgen LICENSE README.md | tar -xf - -C "$CARRY/flexllmgen.part"
  git --git-dir="$flex" rev-parse HEAD > "$CARRY/flexllmgen.part/COMMIT"
  mv "$CARRY/flexllmgen.part" "$CARRY/flexllmgen"  # whole, or not at all
fi
if [ -f "$CARRY/flexllmgen/COMMIT" ]; then
  echo "prepare-device-carry: FlexLLMGen $(cut -c1-12 "$CARRY/flexllmgen/COMMIT") carried"
else
  cat >&2 <<'EOF'
prepare-device-carry: ************************************************************************
prepare-device-carry: FlexLLMGen is NOT carried: the device's flexgen-* parts will be skipped.
prepare-device-carry: Fetch a snapshot (search tool: fetch github:FMInference/FlexLLMGen) or clone
prepare-device-carry: it, then run this again with FLEXLLMGEN_GIT=<its git directory>.
prepare-device-carry: ************************************************************************
EOF
fi

# What travels: the tree (tracked files and untracked ones git does not ignore) and the carry.
tree=$( { git ls-files -z; git ls-files -z -o --exclude-standard; } | xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')
carry=$(du -sb "$CARRY" | cut -f1)
python3 - "$tree" "$carry" <<'PY'
import sys
tree, carry = int(sys.argv[1]), int(sys.argv[2])
mib = lambda b: b / 2**20
total = tree + carry
print(f'prepare-device-carry: tree {mib(tree):.1f} MiB + carry {mib(carry):.1f} MiB = {mib(total):.1f} MiB of the 64 MiB that travel'
      + ('' if total < 64 * 2**20 else ': OVER; the run would be refused'))
sys.exit(0 if total < 64 * 2**20 else 1)
PY
du -sh "$CARRY"/* | sed 's/^/prepare-device-carry:   /'
