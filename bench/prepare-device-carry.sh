#!/usr/bin/env bash
# Copies what the device checks need and the device lacks into .carry/, which git ignores
# through .git/info/exclude. Pass carry [".carry"] to the run.
#   .carry/googletest            GoogleTest's sources (Debian's /usr/src/googletest), built there
#   .carry/daemon-prefix.tar.xz  kvprd's build and run dependencies from our Debian packages, as a
#                                prefix (headers, shared libraries, CMake and pkg-config files, and
#                                pkg-config itself): Boost's Asio, Beast and JSON (the headers the
#                                daemon, worker and CLI include, whole libraries), spdlog and fmt,
#                                hwloc, libsystemd and the libraries those load. The device check
#                                unpacks it and builds against it (bench/device-check-scale.sh).
#   .carry/npm-openai.tar.xz     the official openai npm client and its dependencies (when the
#                                daemon tests have installed it under build/npm-openai)
#   .carry/flexllmgen            FlexLLMGen (FMInference/FlexLLMGen, Apache-2.0), the peer of
#                                bench/flexgen_peer.py, unmodified, from its public snapshot: set
#                                FLEXLLMGEN_GIT to a clone or the fetched snapshot's git directory
#                                (never committed: .carry is ignored)
set -eu
cd "$(dirname "$0")/.."
mkdir -p .carry
[ -d .carry/googletest ] || cp -r /usr/src/googletest .carry/googletest
grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >> .git/info/exclude
if [ ! -s .carry/daemon-prefix.tar.xz ]; then
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  lib=/usr/lib/x86_64-linux-gnu
  mkdir -p "$stage/include/boost" "$stage/lib/x86_64-linux-gnu/cmake" "$stage/lib/x86_64-linux-gnu/pkgconfig" "$stage/bin"
  # Boost libraries whose headers the daemon's translation units include (found with -M on them).
  for c in asio assert beast bind config container container_hash core date_time describe detail exception \
           intrusive io logic move mp11 mpl numeric optional predef preprocessor regex smart_ptr \
           static_string system type_traits utility variant2; do
    cp -r /usr/include/boost/$c "$stage/include/boost/"
  done
  cp /usr/include/boost/*.hpp /usr/include/boost/*.h "$stage/include/boost/" 2>/dev/null || true
  cp -r /usr/include/spdlog /usr/include/fmt /usr/include/hwloc /usr/include/hwloc.h /usr/include/systemd "$stage/include/"
  # hwloc's generated config.h sits in Debian's multiarch include directory
  mkdir -p "$stage/include/hwloc/autogen"
  cp /usr/include/x86_64-linux-gnu/hwloc/autogen/config.h "$stage/include/hwloc/autogen/"
  for l in libboost_container libspdlog libfmt libhwloc libsystemd libudev libcap libgcrypt liblzma \
           libzstd liblz4 libgpg-error libpkgconf; do
    cp -a $lib/$l.so* "$stage/lib/x86_64-linux-gnu/"
  done
  cp -r $lib/cmake/Boost-1.81.0 $lib/cmake/BoostDetectToolset-1.81.0.cmake \
        $lib/cmake/boost_container-1.81.0 $lib/cmake/boost_headers-1.81.0 $lib/cmake/spdlog $lib/cmake/fmt \
        "$stage/lib/x86_64-linux-gnu/cmake/"
  for pc in hwloc libsystemd; do
    sed -e 's|^prefix=.*|prefix=@PREFIX@|' -e 's|/usr/lib/x86_64-linux-gnu|${prefix}/lib/x86_64-linux-gnu|g' \
        -e 's|/usr/include|${prefix}/include|g' $lib/pkgconfig/$pc.pc > "$stage/lib/x86_64-linux-gnu/pkgconfig/$pc.pc"
  done
  cp "$(readlink -f /usr/bin/pkg-config)" "$stage/bin/pkg-config"
  tar -cJf .carry/daemon-prefix.tar.xz -C "$stage" .
fi
# The official openai npm client and what it requires (for the device's Node.js, if it has one),
# from the npm folder the daemon tests install into.
npm=build/npm-openai/node_modules
if [ ! -s .carry/npm-openai.tar.xz ] && [ -d $npm/openai ]; then
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
  tar -cJf .carry/npm-openai.tar.xz -C "$npm" $closure
fi
# FlexLLMGen's package at the snapshot's commit (its benchmark/ third_party trees stay out).
if [ ! -f .carry/flexllmgen/COMMIT ] && [ -n "${FLEXLLMGEN_GIT:-}" ]; then
  rm -rf .carry/flexllmgen .carry/flexllmgen.part && mkdir -p .carry/flexllmgen.part
  git --git-dir="$FLEXLLMGEN_GIT" archive -o .carry/flexllmgen.tar HEAD flexllmgen LICENSE README.md
  tar -xf .carry/flexllmgen.tar -C .carry/flexllmgen.part && rm .carry/flexllmgen.tar
  git --git-dir="$FLEXLLMGEN_GIT" rev-parse HEAD > .carry/flexllmgen.part/COMMIT
  mv .carry/flexllmgen.part .carry/flexllmgen  # whole, or not at all
fi
du -sh .carry .carry/*.tar.xz
