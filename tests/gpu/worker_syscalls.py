#!/usr/bin/env python3
"""Reads `strace -f` output of ivcudad run with IVCUDA_SANDBOX_TRACE_MARK=1 and
--sandbox off, and prints what its workers did after the sandbox point:

  SYSCALL name count [allowed|MISSING]   every call a worker thread made after
                                          its "/ivcuda-sandbox-point/sandbox" mark
  MISSING name                            one line per call the allowlist lacks
  PATH phase result flags path            files the workers opened (init: between
                                          the worker's start and the sandbox point)
  LANDLOCK? path                          opened paths no Landlock rule of the
                                          worker's debug log covers (a guess:
                                          symlinks are not resolved)

  worker_syscalls.py TRACE ALLOWLIST [DAEMON_LOG]
ALLOWLIST is `ivcudad --print-syscall-allowlist`; DAEMON_LOG, written with
--log-level debug, gives the Landlock rules (the trace runs with the sandbox
off, so its rules are those of a worker started with it on; see the script).
"""
import collections
import re
import sys

LINE = re.compile(r'^(\d+)\s+(.*)$')
CALL = re.compile(r'^(?:<\.\.\. )?([a-z_0-9]+)(?:\(| resumed>)')
CHILD = re.compile(r'^(?:<\.\.\. )?(clone3?|fork|vfork)\b.*= (\d+)$')
MARK = re.compile(r'"/ivcuda-sandbox-point/([a-z-]+)"')
OPEN = re.compile(r'^(open|openat|execve|access|faccessat2?|readlink|readlinkat|newfstatat|statx)\('
                  r'(?:AT_FDCWD, |\d+, )?"([^"]+)"(.*)$')


def main():
    trace, allow_file = sys.argv[1], sys.argv[2]
    allowed = {l.split('\t')[0]: l.split('\t')[1] for l in open(allow_file) if '\t' in l}
    parent, phase_of, worker_of = {}, {}, {}
    after = collections.Counter()
    paths = collections.Counter()
    for raw in open(trace, errors='replace'):
        m = LINE.match(raw.rstrip('\n'))
        if not m:
            continue
        tid, rest = int(m.group(1)), m.group(2)
        c = CHILD.match(rest)
        if c:
            parent[int(c.group(2))] = tid
        mark = MARK.search(rest)
        if mark and (rest.startswith('faccessat') or rest.startswith('access')):
            worker_of[tid] = tid
            phase_of[tid] = 'init' if mark.group(1) == 'worker-start' else 'serve'
            continue
        # The worker a thread belongs to: the nearest marked ancestor.
        w, t = None, tid
        while t is not None:
            if t in phase_of:
                w = t
                break
            t = parent.get(t)
        if w is None:
            continue
        name = CALL.match(rest)
        if not name:
            continue
        phase = phase_of[w]
        if phase == 'serve':
            after[name.group(1)] += 1
        o = OPEN.match(rest)
        if o and not rest.endswith('<unfinished ...>'):
            ret = rest.rsplit('= ', 1)[-1].split()
            result = ' '.join(ret[:2]) if ret and ret[0] == '-1' else 'ok'
            flags = o.group(3).strip(', ').split(')')[0][:40]
            path = re.sub(r'^/proc/(self|thread-self|%d)(/|$)' % w, r'/proc/self\2', o.group(2))
            path = re.sub(r'^/proc/self/task/\d+', '/proc/self/task/N', path)
            path = re.sub(r'/fd/\d+$', '/fd/N', path)
            paths[(phase, o.group(1), result, flags, path)] += 1
    missing = []
    for name, n in sorted(after.items()):
        ok = name in allowed and allowed[name] != 'ENOSYS'
        print(f'SYSCALL {name} {n} {"allowed (" + allowed[name] + ")" if ok else "MISSING"}')
        if not ok and name != 'clone3':
            missing.append(name)
    for name in missing:
        print(f'MISSING {name}')
    for (phase, call, result, flags, path), n in sorted(paths.items()):
        print(f'PATH {phase} {call} {result} {flags} {path} x{n}')
    if len(sys.argv) > 3:
        rules = []
        for l in open(sys.argv[3], errors='replace'):
            r = re.search(r'landlock rule (\S+) access', l)
            if r:
                rules.append(r.group(1))
        for path, result in sorted({(k[4], k[2]) for k in paths}):
            if not any(path == r or path.startswith(r.rstrip('/') + '/') for r in rules):
                print(f'LANDLOCK? {path} ({result})')
    print(f'{len(after)} distinct system calls after the sandbox point, {len(missing)} missing from the allowlist')
    return 1 if missing else 0


if __name__ == '__main__':
    sys.exit(main())
