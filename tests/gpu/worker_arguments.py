#!/usr/bin/env python3
"""Reads the `strace -f -e raw=ioctl,fcntl,sched_setaffinity,prlimit64` output
of trace_worker_syscalls.sh (ivcudad --sandbox off, IVCUDA_SANDBOX_TRACE_MARK=1)
and prints each call a worker made after its sandbox point that the seccomp
filter would refuse by its arguments although the call itself is allowed
(host-daemon/sandbox/sandbox.cc; worker_syscalls.py checks the names):

  REFUSED call(args)   an ioctl of a socket, network or terminal type (0x89,
                       0x8b, 0x54), an fcntl command outside kFcntlAllowed,
                       sched_setaffinity of another task than the process
                       itself, a prlimit64 of another process or one that sets
  ARGS n calls checked, m refused

  worker_arguments.py TRACE        exit status 1 when anything is refused
"""
import re
import sys

LINE = re.compile(r'^(\d+)\s+(.*)$')
CHILD = re.compile(r'^(?:<\.\.\. )?(clone3?|fork|vfork)\b.*= (\d+)$')
MARK = re.compile(r'"/ivcuda-sandbox-point/([a-z-]+)"')
CALL = re.compile(r'^(ioctl|fcntl|sched_setaffinity|prlimit64)\(([^)]*)\)')
IOCTL_TYPES_REFUSED = {0x54, 0x89, 0x8b}
# F_DUPFD..F_SETLKW, F_GETOWN, F_GETSIG, F_GETOWN_EX, F_OFD_*, F_GETLEASE,
# F_DUPFD_CLOEXEC, F_SETPIPE_SZ, F_GETPIPE_SZ, F_ADD_SEALS, F_GET_SEALS: kFcntlAllowed.
FCNTL_ALLOWED = {0, 1, 2, 3, 4, 5, 6, 7, 9, 11, 16, 36, 37, 38, 1025, 1030, 1031, 1032, 1033, 1034}


def number(text):
    text = text.strip()
    return 0 if text in ('NULL', '') else int(text, 0)


def refused(call, args, worker):
    if call == 'ioctl':
        return ((number(args[1]) >> 8) & 0xff) in IOCTL_TYPES_REFUSED
    if call == 'fcntl':
        return number(args[1]) not in FCNTL_ALLOWED
    if call == 'sched_setaffinity':
        return number(args[0]) not in (0, worker)
    return number(args[0]) not in (0, worker) or number(args[2]) != 0  # prlimit64


def main():
    parent, phase_of = {}, {}
    checked, bad = 0, []
    for raw in open(sys.argv[1], errors='replace'):
        m = LINE.match(raw.rstrip('\n'))
        if not m:
            continue
        tid, rest = int(m.group(1)), m.group(2)
        c = CHILD.match(rest)
        if c:
            parent[int(c.group(2))] = tid
        mark = MARK.search(rest)
        if mark and (rest.startswith('faccessat') or rest.startswith('access')):
            phase_of[tid] = 'init' if mark.group(1) == 'worker-start' else 'serve'
            continue
        w, t = None, tid
        while t is not None and w is None:
            w = t if t in phase_of else None
            t = parent.get(t)
        call = CALL.match(rest)
        if w is None or phase_of[w] != 'serve' or not call:
            continue
        checked += 1
        try:
            if refused(call.group(1), call.group(2).split(','), w):
                bad.append(rest)
        except (ValueError, IndexError):
            bad.append(rest + '  (arguments not understood)')
    for b in bad:
        print(f'REFUSED {b}')
    print(f'ARGS {checked} calls checked, {len(bad)} refused by their arguments')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
