#!/usr/bin/env python3
"""What a process tree calls, against a systemd system call filter (kvprd.service's
SystemCallFilter=@system-service): under that filter a call outside the set fails with EPERM
(SystemCallErrorNumber), so every call kvprd and its workers make must be inside it.

    syscall_filter.py expand @system-service > allowed.txt    # the set, nested groups expanded (systemd-analyze)
    syscall_filter.py check --allowed allowed.txt STRACE_SUMMARY [--json OUT]
        # STRACE_SUMMARY: what `strace -f -c -U name,calls,errors -o FILE` wrote; prints the calls
        # outside the set, exits 1 when there are any (2 when the summary holds no call at all)

Used by tests/daemon/daemon_faults_test.py (kvprd and CPU workers) and by the device entry
point's syscalls part (kvprd and GPU workers, the CUDA driver's calls among them)."""
import argparse
import json
import re
import subprocess
import sys


def expand(group, seen=None):
    seen = seen if seen is not None else {group}
    out = subprocess.run(['systemd-analyze', 'syscall-filter', group], capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines()[1:]:
        w = line.strip()
        if not w or w.startswith('#'):
            continue
        if w.startswith('@'):
            if w not in seen:
                seen.add(w)
                names |= expand(w, seen)
        else:
            names.add(w)
    return names


def called(summary_path):
    """The system call names in an strace -c -U name,calls,errors summary: the rows of a name and
    one or two counts (headers, rules, "System call usage summary for ..." and the total left out)."""
    names = set()
    for line in open(summary_path):
        parts = line.split()
        if 2 <= len(parts) <= 3 and parts[0] != 'total' and re.fullmatch(r'[a-z_][a-z0-9_]*', parts[0]) and \
                all(p.isdigit() for p in parts[1:]):
            names.add(parts[0])
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest='cmd', required=True)
    e = sub.add_parser('expand')
    e.add_argument('group')
    c = sub.add_parser('check')
    c.add_argument('--allowed', required=True)
    c.add_argument('summary')
    c.add_argument('--json')
    a = ap.parse_args()
    if a.cmd == 'expand':
        print('\n'.join(sorted(expand(a.group))))
        return 0
    allowed = {w.strip() for w in open(a.allowed) if w.strip()}
    calls = called(a.summary)
    # Calls newer than this systemd (not in its @known set) get ENOSYS under any filter, which
    # glibc takes as "not on this kernel" and falls back from: listed, not failed.
    try:
        known = expand('@known')
    except (OSError, subprocess.CalledProcessError):
        known = None
    outside = sorted(c for c in calls - allowed if known is None or c in known)
    unknown = sorted(c for c in calls - allowed if known is not None and c not in known)
    if a.json:
        json.dump({'calls': sorted(calls), 'allowed': len(allowed), 'outside': outside, 'unknown_to_systemd': unknown},
                  open(a.json, 'w'), indent=1)
    if not calls:
        print('syscall_filter: the strace summary holds no system call', file=sys.stderr)
        return 2
    print(f'{len(calls)} system calls, {len(outside)} outside the filter' + (': ' + ' '.join(outside) if outside else '') +
          (f'; unknown to this systemd (ENOSYS under the filter): {" ".join(unknown)}' if unknown else ''))
    return 1 if outside else 0


if __name__ == '__main__':
    sys.exit(main())
