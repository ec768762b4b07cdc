#!/usr/bin/env python3
"""Reads `strace -f` output of ivcudad run with IVCUDA_SANDBOX_TRACE_MARK=1 and
--sandbox off, and prints what its workers did after the sandbox point:

  SYSCALL name count [allowed|MISSING]   every call a worker thread made after
                                          its "/ivcuda-sandbox-point/sandbox" mark
  MISSING name                            one line per call the allowlist lacks
  PATH phase result flags path            files the workers opened (init: between
                                          the worker's start and the sandbox point)
  REFUSED name errno xN: example          calls after the sandbox point that failed
                                          with EPERM, EACCES or ENOSYS (a trace of a
                                          sandboxed daemon: what its filter and
                                          Landlock refused; clone3's ENOSYS is the
                                          filter's rule and not listed)
  LANDLOCK? path                          paths a worker opened after the sandbox
                                          point that no Landlock rule of the
                                          worker's debug log covers (a guess:
                                          symlinks are not resolved); opens before
                                          it are not bound by Landlock
  FAIL why                                what makes the trace no proof

  worker_syscalls.py TRACE ALLOWLIST DAEMON_LOG [--min-workers N] [--check syscalls|landlock]
ALLOWLIST is `ivcudad --print-syscall-allowlist`; DAEMON_LOG, written with
--log-level debug, gives the Landlock rules (the trace runs with the sandbox
off, so its rules are those of a worker started with it on; see the script).
Exit status 0 only when at least N workers (default 1) reached the sandbox
point and made calls after it (an empty trace, or one that followed no worker,
proves nothing), and then, as --check says (default both): every one of those
calls is allowed; the log has Landlock rules and every path opened after the
point is covered by one.
"""
import collections
import re
import sys

LINE = re.compile(r'^(\d+)\s+(.*)$')
CALL = re.compile(r'^(?:<\.\.\. )?([a-z_0-9]+)(?:\(| resumed>)')
CHILD = re.compile(r'^(?:<\.\.\. )?(clone3?|fork|vfork)\b.*= (\d+)$')
MARK = re.compile(r'"/ivcuda-sandbox-point/([a-z-]+)"')
REFUSAL = re.compile(r'= -1 (EPERM|EACCES|ENOSYS) ')
OPEN = re.compile(r'^(open|openat|execve|access|faccessat2?|readlink|readlinkat|newfstatat|statx)\('
                  r'(?:AT_FDCWD, |\d+, )?"([^"]+)"(.*)$')


def main():
    args = sys.argv[1:]
    min_workers, checks = 1, {'syscalls', 'landlock'}
    if '--min-workers' in args:
        i = args.index('--min-workers')
        min_workers = int(args[i + 1])
        del args[i:i + 2]
    if '--check' in args:
        i = args.index('--check')
        checks = {args[i + 1]}
        del args[i:i + 2]
    if len(args) != 3 or not checks <= {'syscalls', 'landlock'}:
        sys.exit('usage: worker_syscalls.py TRACE ALLOWLIST DAEMON_LOG [--min-workers N] [--check syscalls|landlock]')
    trace, allow_file, daemon_log = args
    allowed = {l.split('\t')[0]: l.split('\t')[1] for l in open(allow_file) if '\t' in l}
    parent, phase_of, worker_of = {}, {}, {}
    after = collections.Counter()
    paths = collections.Counter()
    refused, refused_example = collections.Counter(), {}
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
            err = REFUSAL.search(rest)
            if err and name.group(1) != 'clone3':
                key = (name.group(1), err.group(1))
                refused[key] += 1
                refused_example.setdefault(key, rest[:160])
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
    for (call, err), n in sorted(refused.items()):
        print(f'REFUSED {call} {err} x{n}: {refused_example[(call, err)]}')
    for (phase, call, result, flags, path), n in sorted(paths.items()):
        print(f'PATH {phase} {call} {result} {flags} {path} x{n}')
    rules = []
    for l in open(daemon_log, errors='replace'):
        r = re.search(r'landlock rule (\S+) access', l)
        if r:
            rules.append(r.group(1))
    uncovered = sorted({(k[4], k[2]) for k in paths if k[0] == 'serve'
                        and not any(k[4] == r or k[4].startswith(r.rstrip('/') + '/') for r in rules)})
    for path, result in uncovered:
        print(f'LANDLOCK? {path} ({result})')
    served = sum(1 for phase in phase_of.values() if phase == 'serve')
    failures = []
    if served < min_workers:
        failures.append(f'{served} workers reached the sandbox point, {min_workers} expected')
    if not after:
        failures.append('no system call after the sandbox point was traced')
    if 'syscalls' in checks and missing:
        failures.append(f'{len(missing)} system calls after the sandbox point are not in the allowlist')
    if 'landlock' in checks and not rules:
        failures.append(f'{daemon_log} names no Landlock rule (--log-level debug, a sandboxed worker)')
    if 'landlock' in checks and uncovered:
        failures.append(f'{len(uncovered)} paths opened after the sandbox point are covered by no Landlock rule')
    for why in failures:
        print(f'FAIL {why}')
    print(f'{served} workers past the sandbox point; {len(after)} distinct system calls after it, '
          f'{len(missing)} missing from the allowlist; {len(uncovered)} paths no Landlock rule covers')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
