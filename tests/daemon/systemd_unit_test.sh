#!/usr/bin/env bash
# The installed kvprd.service passes `systemd-analyze verify` (no warning either), reloads with
# SIGHUP, reaches the GPUs by driver group (any number of them), filters system calls, allows no
# core dump, and keeps the exposure that `systemd-analyze security` reports below 3.3; installing
# to a prefix writes nothing outside it. Usage: systemd_unit_test.sh BUILD_DIR
set -euo pipefail
build=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
unit="$tmp/prefix/lib/systemd/system/kvprd.service"
test -f "$unit"
# The unit names the default prefix's binary; verify checks that it is executable.
sed "s|/usr/local/bin/kvprd|$tmp/prefix/bin/kvprd|" "$unit" >"$tmp/kvprd.service"
out=$(systemd-analyze verify --man=no "$tmp/kvprd.service" 2>&1) || { echo "FAIL: verify: $out"; exit 1; }
[ -z "$out" ] || { echo "FAIL: verify warns: $out"; exit 1; }
grep -q '^ExecReload=/bin/kill -HUP \$MAINPID$' "$unit" || { echo "FAIL: ExecReload does not send SIGHUP"; exit 1; }
if grep -qE '^DeviceAllow=/dev/nvidia[0-9]' "$unit"; then echo "FAIL: GPUs listed by name"; exit 1; fi
grep -q '^DeviceAllow=char-nvidia rw$' "$unit" || { echo "FAIL: no DeviceAllow=char-nvidia"; exit 1; }
level=$(systemd-analyze security --offline=yes "$tmp/kvprd.service" 2>&1 | sed -n 's/.*Overall exposure level for kvprd.service: \([0-9.]*\).*/\1/p')
[ -n "$level" ] || { echo "FAIL: systemd-analyze security gave no level"; exit 1; }
awk -v l="$level" 'BEGIN { exit !(l < 3.3) }' || { echo "FAIL: exposure $level not below 3.3"; exit 1; }
grep -q '^SystemCallFilter=@system-service$' "$unit" || { echo "FAIL: no system call filter"; exit 1; }
grep -q '^LimitCORE=0$' "$unit" || { echo "FAIL: core dumps allowed"; exit 1; }
# The example config went under the prefix, not the machine's /etc.
test -f "$tmp/prefix/etc/kvprd/kvprd.conf" || { echo "FAIL: no example config under the prefix"; exit 1; }
echo "systemd unit: verify clean, exposure $level"
