#!/usr/bin/env bash
# What the driver's process checkpointing (issue 34) does inside a guest's worker, and what the
# worker's sandbox refuses of it. drv_checkpoint --child-lib (root, from outside: what ivcudad's
# checkpointer does) locks, checkpoints, restores and unlocks the worker that serves its child
# (IVCUDA_TRACE_CKPT_MIB, default 1024 MiB), twice, each time with ivcudad under strace -f and
# IVCUDA_SANDBOX_TRACE_MARK=1:
#   1. --sandbox on: the worker's calls after the sandbox point that failed (REFUSED lines of
#      worker_syscalls.py: EPERM from the seccomp filter, EACCES from Landlock)
#   2. --sandbox off: every call the worker made after the sandbox point, against the allowlist
#      (MISSING lines), and its ioctl/fcntl/affinity/limit arguments against the filter's rules
#      (worker_arguments.py); the checkpointing process is traced too (caller-trace.txt: how the
#      driver reaches the target - which calls the checkpointer itself needs)
# Cases: the sandboxed worker was checkpointed and found its memory intact; the unsandboxed one
# too; the calls of run 2 are all allowed by the filter. Writes the traces and logs to $OUT/ckpt-trace.
#   bash tests/gpu/trace_checkpoint_syscalls.sh [BUILD_DIR]    (repository root; default build/gpu)
set -u
root=$(pwd)
build=$(cd "${1:-$root/build/gpu}" && pwd)
out=${OUT:-$root/out}/ckpt-trace
mkdir -p "$out"
mib=${IVCUDA_TRACE_CKPT_MIB:-1024}
. "$root/tests/gpu/sandbox_mode.sh"
. "$root/tests/gpu/strace_env.sh" || exit 1
. "$root/tests/lib/verdicts.sh"
expect_cases 3
sockdir=$(mktemp -d /tmp/ivcuda-ckpt-trace.XXXXXX)
daemon=
stop() { [ -n "$daemon" ] && kill "$(cat "$out/traced.pid" 2>/dev/null || echo "$daemon")" 2>/dev/null; wait "$daemon" 2>/dev/null; daemon=; }
trap 'stop; rm -rf "$sockdir"' EXIT
"$build/host-daemon/ivcudad" --print-syscall-allowlist >"$out/allowlist.txt"

# run MODE [CALLER_TRACE]: ivcudad --sandbox MODE traced into $out/daemon-MODE.txt, one checkpoint
# of a guest's worker; the checkpointing process traced into CALLER_TRACE when given.
run() {
  local mode=$1 sock=$sockdir/$1.sock log=$out/ivcudad-$1.log rc caller=() as=$1
  rm -f "$sock" "$out/traced.pid"
  [ -n "${2:-}" ] && caller=("${strace_cmd[@]}" -f -qq -o "$2")
  [ "$mode" = on ] && [ -n "${IVCUDA_SANDBOX:-}" ] && [ "$IVCUDA_SANDBOX" != off ] && as=$IVCUDA_SANDBOX
  IVCUDA_SANDBOX_TRACE_MARK=1 strace_run -f -qq -e raw=ioctl,fcntl,sched_setaffinity,prlimit64 \
    -o "$out/daemon-$mode.txt" "${tagged[@]}" "$out/traced.pid" \
    "$build/host-daemon/ivcudad" --sandbox "$as" --socket "$sock" --shm-size 2G --driver libcuda.so.1 \
    --log-level debug >"$log" 2>&1 &
  daemon=$!
  for _ in $(seq 400); do [ -S "$sock" ] && break; sleep 0.05; done
  echo "=== --sandbox $as: root checkpoints a guest's worker ($mib MiB), ivcudad traced"
  IVCUDA_SOCKET=$sock timeout 180 "${caller[@]}" stdbuf -oL "$build/tests/bin/drv_checkpoint" --mib "$mib" \
    --hold-ms 1000 --quiet --child-lib "$build/lib" --daemon-log "$log" 2>&1 | tee "$out/checkpoint-$mode.txt"
  rc=${PIPESTATUS[0]}
  stop
  grep -E "sandbox|checkpoint" "$log" | grep -v "landlock rule" | sort -u | head -8 | sed 's/^/  log: /'
  return "$rc"
}

run on
rc=$?
python3 "$root/tests/gpu/worker_syscalls.py" "$out/daemon-on.txt" "$out/allowlist.txt" "$out/ivcudad-on.log" \
  --check syscalls >"$out/syscalls-on.txt"
echo "--- what the sandbox refused the worker (after its sandbox point)"
grep -E "^(REFUSED|FAIL) " "$out/syscalls-on.txt" || echo "(nothing refused)"
grep -E "^[0-9]+ workers past" "$out/syscalls-on.txt"
verdict "--sandbox on: root checkpointed and restored a guest's worker holding $mib MiB, its memory intact" $rc

run off "$out/caller-trace.txt"
rc=$?
verdict "--sandbox off: root checkpointed and restored a guest's worker holding $mib MiB, its memory intact" $rc
python3 "$root/tests/gpu/worker_syscalls.py" "$out/daemon-off.txt" "$out/allowlist.txt" "$out/ivcudad-off.log" \
  --check syscalls >"$out/syscalls-off.txt"
src=$?
echo "--- the worker's calls after its sandbox point, against the allowlist"
grep -E "^(SYSCALL|MISSING|FAIL) |workers past" "$out/syscalls-off.txt"
python3 "$root/tests/gpu/worker_arguments.py" "$out/daemon-off.txt"
arc=$?
verdict "--sandbox off: every call the worker made while checkpointed and restored is one the filter allows (names and arguments)" \
  $((src | arc))
echo "--- the checkpointing process: its calls (count, name), and those naming another process or a socket"
sed -E 's/^[0-9]+ +//; s/^<\.\.\. ([a-z_0-9]+) resumed>.*/\1/; s/\(.*//' "$out/caller-trace.txt" | grep -E '^[a-z_0-9]+$' |
  sort | uniq -c | sort -rn | head -40
grep -E "ptrace|process_vm|pidfd|kill\(|socket\(|connect\(|bind\(|/proc/[0-9]+" "$out/caller-trace.txt" | head -30
# The traces go back in run_all.sh's tarball (16 MiB at most): their last 6 MB each (the
# checkpoint is near the end), the whole of a shorter one.
for f in "$out"/daemon-*.txt "$out/caller-trace.txt"; do
  [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 6000000 ] && { tail -c 6000000 "$f" >"$f.tail" && rm "$f"; }
done
finish
