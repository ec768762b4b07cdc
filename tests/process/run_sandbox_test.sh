#!/usr/bin/env bash
# Sandboxed workers (docs/security.md, "Sandbox"): a running worker shows
# "Seccomp: 2", "NoNewPrivs: 1" and no capability (CapEff, CapPrm, CapBnd) on
# every thread, refuses what the sandbox forbids (the self-test hook,
# IVCUDA_SANDBOX_SELFTEST=1 in the daemon's environment, which no guest
# reaches) and keeps serving; Landlock, applied to the GPU test double as to
# any driver, refuses files outside its rules while module loads and DOT text
# still work; the explicit test switch IVCUDA_TEST_DOUBLE_IPC=1 is said at
# start and in each worker's line; --sandbox degraded is said at start;
# --sandbox off applies nothing and says so; --user drops the worker; a
# descriptor the daemon was started with above stderr (a parent's leak) is in
# none of its processes.
#
#   run_sandbox_test.sh BUILD_DIR DRIVER_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
bin=$build/tests/bin
ptx=$build/tests/gpu_double/test_kernels.ptx
fatbin=$build/tests/gpu_double/test_kernels.fatbin
work=$(mktemp -d /tmp/ivcuda-sandbox.XXXXXX)
sock=$work/ivcudad.sock
log=$work/ivcudad.log
# shellcheck source=../lib/verdicts.sh
. "$(dirname "$0")/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"
expect_cases 14

cleanup() { stop_ivcudad; rm -rf "$work"; }
trap cleanup EXIT

start_daemon() {  # extra ivcudad options; the environment passes through
  stop_ivcudad
  start_ivcudad "$log" --socket "$sock" --shm-size 256M --staging-size 4M --channels 8 --driver "$driver" "$@" || exit 1
}
run_guest() {  # PROGRAM ARGS...: through ivcuda, output in $work/out
  IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 120 "$@" >"$work/out" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && cat "$work/out"
  return $rc
}
# Starts a guest that spins until killed; sets $guest (its shell job) and
# $worker (its worker's pid, from the daemon's log) once it said "ready".
start_spinner() {
  IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 120 "$bin/drv_errors" --spin-forever \
    >"$work/spin" 2>&1 &
  guest=$!
  worker=
  # Up to 60 s: a sanitizer build's worker and guest start slowly on a loaded machine.
  for _ in $(seq 1200); do grep -q '^ready' "$work/spin" && break; sleep 0.05; done
  worker=$(grep -o "worker pid [0-9]*" "$log" | tail -1 | awk '{print $3}')
  grep -q '^ready' "$work/spin" && [ -n "$worker" ] && [ -d "/proc/$worker" ]
}
stop_spinner() { kill "$guest" 2>/dev/null; wait "$guest" 2>/dev/null; }
field() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status" 2>/dev/null; }
# ThreadSanitizer builds apply no seccomp (sandbox.cc says why); AddressSanitizer
# builds do, with their runtime's few calls on top (sanitizer_calls()).
tsan=
case "${IVCUDA_SANITIZE:-}" in *thread*) tsan=1 ;; esac
# This script decides where the test switch is on.
unset IVCUDA_TEST_DOUBLE_IPC

# --- the default: sandbox on
IVCUDA_SANDBOX_SELFTEST=1 start_daemon
ok=0
start_spinner || { ok=1; echo "the spinning guest did not start:"; cat "$work/spin" "$log"; }
nnp=$(field "$worker" NoNewPrivs) sc=$(field "$worker" Seccomp)
want_sc=2; [ -n "$tsan" ] && want_sc=0
[ "$nnp" = 1 ] && [ "$sc" = "$want_sc" ] || { ok=1; echo "worker $worker: NoNewPrivs '$nnp', Seccomp '$sc'"; }
threads=0 bad=0
for t in /proc/"$worker"/task/*; do
  threads=$((threads + 1))
  [ "$(awk '$1 == "Seccomp:" {print $2}' "$t/status")" = "$want_sc" ] || bad=$((bad + 1))
done
[ $bad -eq 0 ] || { ok=1; echo "$bad of $threads threads lack the filter"; }
if [ -n "$tsan" ]; then
  grep -q "seccomp no (a ThreadSanitizer build" "$log" || { ok=1; echo "no log line saying seccomp is off here"; }
  verdict "a running worker shows NoNewPrivs: 1 ($IVCUDA_SANITIZE build: Seccomp: 0 by design, logged)" $ok
else
  verdict "a running worker shows Seccomp: 2 and NoNewPrivs: 1 on all its $threads threads" $ok
fi

# Root without --user, as the tests run: uid 0, and not one capability.
ok=0 caps=
for t in /proc/"$worker"/task/*; do
  for k in CapInh CapPrm CapEff CapBnd CapAmb; do
    v=$(awk -v k="$k:" '$1 == k {print $2}' "$t/status")
    [ "$v" = 0000000000000000 ] || { ok=1; caps="$caps ${t##*/}:$k=$v"; }
  done
done
[ "$(field "$worker" Uid | cut -c1)" = 0 ] || { ok=1; echo "worker $worker is not root here"; }
[ $ok -eq 0 ] || echo "capabilities held:$caps"
verdict "a running root worker holds no capability on any thread (CapInh/Prm/Eff/Bnd/Amb all 0)" $ok

grep -Eq "sandbox on: no_new_privs yes, landlock yes \(ABI [0-9]+\), seccomp (yes|no) .*, capabilities none \(bounding set empty\), uid" "$log"
rc=$?; [ $rc -ne 0 ] && grep sandbox "$log"
# Every name of the table is a system call here (a misspelt one would be skipped): all but
# clone3, which answers ENOSYS, are allowed.
listed=$("$build/host-daemon/ivcudad" --print-syscall-allowlist | grep -vc "	ENOSYS	")
if [ -z "$tsan" ] && ! grep -q "seccomp yes ($listed system calls allowed" "$log"; then
  rc=1; echo "the table lists $listed allowed calls, the worker installed: $(grep -o 'seccomp yes ([0-9]*' "$log")"
fi
verdict "the worker logs one line of what its sandbox applied (Landlock, all $listed listed calls, no capabilities)" $rc

if [ -n "$tsan" ]; then
  grep -q "sandbox self-test: .*kill(daemon)" "$log"
  verdict "the self-test hook ran ($IVCUDA_SANITIZE build: no seccomp, so nothing to refuse)" $?
else
  grep -q "sandbox self-test: socket(AF_INET) -> EPERM, execve -> EPERM, fork -> EPERM, kill(daemon) -> EPERM, open /etc/hostname -> EACCES, fcntl F_SETOWN(daemon) -> EPERM, ioctl SIOCGIFFLAGS -> EPERM" "$log"
  rc=$?; [ $rc -ne 0 ] && grep "self-test" "$log"
  verdict "forbidden calls from the test-only hook (socket, execve, fork, kill, files, F_SETOWN, SIOC*) are refused" $rc
fi

ok=0
kill -0 "$guest" 2>/dev/null || { ok=1; echo "the spinning guest died"; }
run_guest "$bin/drv_kernels" --ptx "$ptx" --fatbin "$fatbin" || ok=1
run_guest "$bin/drv_graph_build" --ptx "$ptx" || ok=1
stop_spinner
verdict "sandboxed workers keep serving: PTX JIT, fatbins, launches, graphs and DOT text" $ok

# --- descriptors the daemon is started with above stderr, not close-on-exec (as a parent leaks
# them: a tool shell's pipe, a file): closed at its start, so that neither the daemon nor what it
# forks (workers are forked, never executed) has them. The pipe's other end stays in a sleeper.
exec {stray_pipe}< <(exec sleep 600)
sleeper=$!
echo "not the daemon's" >"$work/stray"
exec {stray_file}<"$work/stray"
pipe_t=$(readlink "/proc/$$/fd/$stray_pipe") file_t=$work/stray
start_daemon
ok=0
start_spinner || { ok=1; echo "the spinning guest did not start:"; cat "$work/spin" "$log"; }
# The spinner took the first warm entry; the next one's worker is looked at too, once started.
for _ in $(seq 400); do [ "$(grep -c "started ahead for guest" "$log")" -ge 2 ] && break; sleep 0.05; done
family() { local p; for p in $(pgrep -P "$1"); do echo "$p"; family "$p"; done; }
procs=$(echo "$ivcudad_pid"; family "$ivcudad_pid")
looked=0 with_worker=0
for p in $procs; do
  looked=$((looked + 1))
  [ "$p" = "$worker" ] && with_worker=1
  for f in /proc/"$p"/fd/*; do
    t=$(readlink "$f" 2>/dev/null) || continue
    [ "$t" = "$pipe_t" ] || [ "$t" = "$file_t" ] &&
      { ok=1; echo "pid $p ($(cat "/proc/$p/comm" 2>/dev/null)): fd ${f##*/} is this script's $t"; }
  done
done
[ "$with_worker" = 1 ] && [ "$looked" -ge 3 ] ||
  { ok=1; echo "looked at $looked processes (${procs//$'\n'/ }), the serving worker ${worker:-none} among them: $with_worker"; }
stop_spinner
exec {stray_pipe}<&- {stray_file}<&-
kill "$sleeper" 2>/dev/null
verdict "a pipe and a file the daemon was started with reach none of its $looked processes (daemon, connections, warm entries, workers)" $ok

# --- Landlock: the GPU test double gets it like any driver
IVCUDA_SANDBOX_SELFTEST=1 start_daemon
run_guest "$bin/drv_core" >/dev/null
ok=0
grep -q "landlock yes (ABI [0-9]*)" "$log" && grep -q "open /etc/hostname -> EACCES" "$log" || { ok=1; grep sandbox "$log"; }
run_guest "$bin/drv_kernels" --ptx "$ptx" --fatbin "$fatbin" || ok=1
run_guest "$bin/drv_graph_build" --ptx "$ptx" || ok=1
run_guest "$bin/drv_pools" --ptx "$ptx" --hostile --unsupported || ok=1
verdict "Landlock (on the GPU test double too) refuses /etc/hostname; module loads, graphs and DOT text, pools work" $ok

# --- the test switch: said at start and in every worker's line, and what it is for works
IVCUDA_TEST_DOUBLE_IPC=1 start_daemon
ok=0
run_guest "$bin/drv_ipc" --ptx "$ptx" --forged CUDA_ERROR_INVALID_HANDLE || ok=1
grep -q "TEST SWITCH IVCUDA_TEST_DOUBLE_IPC=1: workers run without Landlock and may pwrite64" "$log" &&
  grep -q "landlock no (test switch IVCUDA_TEST_DOUBLE_IPC=1" "$log" &&
  grep -q "seccomp yes ($listed system calls allowed, others EPERM; [0-9]* more for the test switch" "$log" ||
  { ok=1; grep -i "sandbox\|switch" "$log"; }
verdict "IVCUDA_TEST_DOUBLE_IPC=1 is said at start and by each worker; the double's IPC between workers works under it" $ok

# --- --sandbox degraded: said at start; what the kernel has still applies
start_daemon --sandbox degraded
ok=0
run_guest "$bin/drv_core" || ok=1
grep -q "SANDBOX DEGRADED (--sandbox degraded)" "$log" && grep -q "sandbox degraded: no_new_privs yes, landlock yes" "$log" ||
  { ok=1; grep -i sandbox "$log"; }
verdict "--sandbox degraded is said at start and by each worker, which keeps the Landlock the kernel has" $ok

# --- --sandbox audit: the filter is there, and what it lacks is made (and logged by the kernel)
IVCUDA_SANDBOX_SELFTEST=1 start_daemon --sandbox audit
ok=0
start_spinner || { ok=1; echo "the spinning guest did not start:"; cat "$work/spin" "$log"; }
if [ -z "$tsan" ]; then
  [ "$(field "$worker" Seccomp)" = 2 ] && [ "$(field "$worker" NoNewPrivs)" = 1 ] ||
    { ok=1; echo "worker $worker: $(grep -E 'Seccomp|NoNewPrivs' "/proc/$worker/status")"; }
  # socket(AF_INET) is outside the allowlist: made, not refused; Landlock still refuses the file
  grep -q "sandbox self-test: socket(AF_INET) -> allowed, .*open /etc/hostname -> EACCES" "$log" || { ok=1; grep "self-test" "$log"; }
  grep -q "sandbox audit: no_new_privs yes, .*system calls allowed, others logged" "$log" || { ok=1; grep -i sandbox "$log"; }
fi
stop_spinner
grep -q "SANDBOX AUDIT (--sandbox audit)" "$log" || { ok=1; grep -i sandbox "$log"; }
verdict "--sandbox audit: the filter is installed, a call outside it is made (for the kernel's log), and it is said" $ok

# --- --sandbox off: nothing applied, said loudly
start_daemon --sandbox off
ok=0
start_spinner || { ok=1; echo "the spinning guest did not start:"; cat "$work/spin" "$log"; }
[ "$(field "$worker" Seccomp)" = 0 ] && [ "$(field "$worker" NoNewPrivs)" = 0 ] ||
  { ok=1; echo "worker $worker: $(grep -E 'Seccomp|NoNewPrivs' "/proc/$worker/status")"; }
stop_spinner
grep -q "SANDBOX OFF" "$log" && grep -q "sandbox OFF: no seccomp" "$log" || { ok=1; grep -i sandbox "$log"; }
verdict "--sandbox off: the worker has no filter and no no_new_privs, and the log says so" $ok

# --- --user: the worker drops to an unprivileged user once its driver is open
if [ "$(id -u)" -ne 0 ]; then
  not_run "--user nobody: the worker runs as nobody and serves" "the daemon must be root to drop workers"
else
  start_daemon --user nobody
  ok=0
  start_spinner || { ok=1; echo "the spinning guest did not start:"; cat "$work/spin" "$log"; }
  uid=$(awk '$1 == "Uid:" {print $2 $3 $4 $5}' "/proc/$worker/status")
  want=$(id -u nobody)
  [ "$uid" = "$want$want$want$want" ] || { ok=1; echo "worker $worker: Uid $uid, wanted $want (real, effective, saved, fs)"; }
  [ "$(field "$worker" CapBnd)" = 0000000000000000 ] && [ "$(field "$worker" CapPrm)" = 0000000000000000 ] ||
    { ok=1; grep Cap "/proc/$worker/status"; }
  stop_spinner
  run_guest "$bin/drv_core" || ok=1
  verdict "--user nobody: the worker runs as nobody (uid $want), no capability, bounding set empty, and serves" $ok
fi
stop_ivcudad
timeout 10 "$build/host-daemon/ivcudad" --socket "$sock" --driver "$driver" --user no-such-user-here >"$log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q -- "--user no-such-user-here: no such user" "$log" && [ ! -S "$sock" ]
verdict "--user with an unknown name stops the daemon before it listens" $?

# --- the allowlist is printed and keeps out what it must
"$build/host-daemon/ivcudad" --print-syscall-allowlist >"$work/allow"
ok=0
for forbidden in execve execveat fork vfork socket socketpair connect bind listen accept accept4 ptrace \
    process_vm_readv process_vm_writev kill mount umount2 setuid setgid setgroups bpf perf_event_open \
    kexec_load io_uring_setup io_uring_register unshare setns chroot pivot_root; do
  grep -q "^$forbidden	" "$work/allow" && { ok=1; echo "$forbidden is allowed"; }
done
n=$(wc -l <"$work/allow")
[ "$n" -gt 50 ] || ok=1
verdict "--print-syscall-allowlist lists $n calls, none that makes processes, sockets, mounts or ids" $ok

finish
