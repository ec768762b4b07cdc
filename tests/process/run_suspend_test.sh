#!/usr/bin/env bash
# ivcudactl suspend, resume, drain and undrain (host-daemon/daemon/suspend.h),
# process mode against the GPU test double, which models the driver's process
# checkpointing (tests/gpu_double/api_checkpoint.cc: a locked process's calls
# fail, a checkpointed one's memory is free for others, a restore needs it
# back, and the driver's own part inside the process - the system calls
# driver 580 makes there - must pass the process's sandbox). So: under the
# default sandbox a guest is suspended and resumed; the rest runs with
# --sandbox off, which the checkpointer-killing cases need (a sandboxed
# worker's calls are the same either way). The guest is tests/programs/drv_checkpoint.cc's target: it holds
# memory with a pattern and calls from a thread every 10 ms all along; told
# "check", it reads its pattern back at the same address and says how long
# its longest call took and how many failed.
#   run_suspend_test.sh BUILD_DIR DRIVER_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
bin=$build/tests/bin
ctl=$build/host-daemon/ivcudactl
work=$(mktemp -d /tmp/ivcuda-suspend.XXXXXX)
sock=$work/g.sock
csock=$work/control.sock
log=$work/ivcudad.log
# shellcheck source=../lib/verdicts.sh
. "$(dirname "$0")/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"
expect_cases 14
guests=()
cleanup() {
  for g in "${guests[@]}"; do kill "$g" 2>/dev/null; done
  stop_ivcudad
  rm -rf "$work"
}
trap cleanup EXIT
py=$(command -v python3)
# One "GPU" for the daemon's workers, the checkpointer and this script's other tenant.
export IVCUDA_TEST_DOUBLE_IPC=1 IVCUDA_DOUBLE_LEDGER=$work/ledger
: >"$IVCUDA_DOUBLE_LEDGER"

daemon() {  # ivcudad with this script's settings and ARGS (a first --log-pipe is start_ivcudad's)
  local pipe=()
  [ "${1:-}" = --log-pipe ] && { pipe=(--log-pipe); shift; }
  start_ivcudad "${pipe[@]}" --wait "$csock" "$log" --socket "$sock" --shm-size 128M --staging-size 4M --channels 8 \
    --control-socket "$csock" --context-reserve 0 --driver "$driver" "$@" || exit 1
}

# start_guest NAME MIB [ARGS]: the target through ivcuda; its commands on fd 3 of ours (a fifo),
# its words in $work/NAME.out; waits for its "ready"; sets $gpid (our child, timeout), $prog
# (the program) and $gid (its guest number, from ivcudad's log: its hello).
start_guest() {
  local name=$1 mib=$2
  shift 2
  mkfifo "$work/$name.in"
  IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 120 "$bin/drv_checkpoint" --child --mib "$mib" "$@" \
    <"$work/$name.in" >"$work/$name.out" 2>&1 &
  gpid=$!
  guests+=("$gpid")
  eval "exec {${name}_fd}>\"$work/$name.in\""
  for _ in $(seq 400); do grep -q '^ready' "$work/$name.out" && break; sleep 0.05; done
  prog=$(awk '$1 == "ready" {print $2}' "$work/$name.out")
  gid=$(sed -n "s/.*guest \([0-9]*\): process ${prog:-none} says hello.*/\1/p" "$log" | tail -1)
  [ -n "$gid" ] && return 0
  echo "guest $name did not start:"; cat "$work/$name.out"; return 1
}
status_json() { "$ctl" --socket "$csock" status --json; }
field() {  # GUEST KEY: a field of its entry in the status
  status_json | "$py" -c 'import json,sys; g=[x for x in json.load(sys.stdin)["guests"] if x["id"]==int(sys.argv[1])]; print(g[0][sys.argv[2]] if g else "gone")' "$1" "$2"
}
# The double's free memory as another process of the ledger sees it; with
# MIB, that process also allocates and frees MIB MiB. Python is built
# without sanitizers: in a sanitizer build the double's runtimes load first.
preload=${IVCUDA_SANITIZER_PRELOAD:-}  # the build's compiler's (tests/process/CMakeLists.txt)
other_tenant() {
  env LD_PRELOAD="$preload" ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
    "$py" - "$driver" "${1:-0}" <<'PY'
import ctypes, sys
cu = ctypes.CDLL(sys.argv[1])
ctx, dev, free, total, p = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_uint64()
assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
assert cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
took = "-"
mib = int(sys.argv[2])
if mib:
    took = "took" if cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(mib << 20)) == 0 and cu.cuMemFree_v2(p) == 0 else "failed"
print(free.value >> 20, took)
PY
}

# --- the default sandbox: the worker's filter lets the driver's part of a checkpoint and a restore
# through (the double makes driver 580's calls inside the worker), so the guest goes and comes back
tsan=
case "${IVCUDA_SANITIZE:-}" in *thread*) tsan=1 ;; esac  # no seccomp in ThreadSanitizer builds
daemon
ok=0
start_guest z 64 || exit 1
z_pid=$gpid id_z=$gid
if [ -n "$tsan" ]; then
  not_run "under the default sandbox a guest is suspended and resumed" "$IVCUDA_SANITIZE build: its workers have no seccomp filter"
else
  grep -q "sandbox on: .*seccomp yes" "$log" || { ok=1; echo "the worker is not under its seccomp filter"; }
  "$ctl" --socket "$csock" suspend "$id_z" >"$work/z.txt" 2>&1 || ok=1
  grep -q "guest $id_z: suspended: 64 MiB in host memory" "$work/z.txt" || { ok=1; cat "$work/z.txt"; }
  "$ctl" --socket "$csock" resume "$id_z" >>"$work/z.txt" 2>&1 || ok=1
  grep -q "guest $id_z: serving again: 64 MiB back on the GPU" "$work/z.txt" || { ok=1; cat "$work/z.txt"; }
  echo check >&"$z_fd"
  for _ in $(seq 200); do grep -q '^checked' "$work/z.out" && break; sleep 0.05; done
  grep -q "^checked intact=1 alloc=1 .* failed_calls=0" "$work/z.out" || { ok=1; cat "$work/z.out"; }
  verdict "under the default sandbox (the worker's seccomp filter) a guest is suspended and resumed intact, the driver's calls inside the worker allowed" $ok
fi
kill "$z_pid" 2>/dev/null
wait "$z_pid" 2>/dev/null
stop_ivcudad

# --- the default sandbox with --user nobody: the worker dropped its user, which leaves it not
# dumpable, and the checkpointer runs as that user; the double's checkpoint reaches into the
# worker through /proc as driver 580's does, so the worker must be dumpable while held
if [ -n "$tsan" ]; then
  not_run "under --user a guest is suspended and resumed" "$IVCUDA_SANITIZE build: its workers have no seccomp filter"
elif [ "$(id -u)" -ne 0 ]; then
  not_run "under --user a guest is suspended and resumed" "the daemon must be root to drop workers"
else
  chmod 711 "$work" && chmod 666 "$IVCUDA_DOUBLE_LEDGER"  # the checkpointer, as nobody, loads the double
  # The daemon's stderr a pipe (as a shell's `2>&1 | tee` gives it), which its workers inherit:
  # open before their driver, it must stay root's. (A pipe on a descriptor above stderr would not
  # do: the daemon closes those at its start, daemon-closes-inherited-fds.)
  daemon --log-pipe --user nobody
  ok=0
  start_guest u 64 || exit 1
  u_pid=$gpid id_u=$gid
  "$ctl" --socket "$csock" suspend "$id_u" >"$work/u.txt" 2>&1 || ok=1
  grep -q "guest $id_u: suspended: 64 MiB in host memory" "$work/u.txt" || { ok=1; cat "$work/u.txt"; }
  grep -q "checkpointer: .*uid $(id -u nobody) " "$log" || { ok=1; grep checkpointer "$log"; }
  "$ctl" --socket "$csock" resume "$id_u" >>"$work/u.txt" 2>&1 || ok=1
  grep -q "guest $id_u: serving again: 64 MiB back on the GPU" "$work/u.txt" || { ok=1; cat "$work/u.txt"; }
  echo check >&"$u_fd"
  for _ in $(seq 200); do grep -q '^checked' "$work/u.out" && break; sleep 0.05; done
  grep -q "^checked intact=1 alloc=1 .* failed_calls=0" "$work/u.out" || { ok=1; cat "$work/u.out"; }
  # Dumpable only while held: its calls go on, and it is not any more (the kernel gives a
  # process that is not dumpable's /proc/PID/fd to root).
  # This daemon's processes only (the mutation runs start several daemons of one build at once).
  family() { local p; for p in $(pgrep -P "$1"); do echo "$p"; family "$p"; done; }
  uid_of() { awk '$1 == "Uid:" {print $2}' "/proc/$1/status" 2>/dev/null; }  # (/proc/PID's owner is root's for a process not dumpable)
  mine=$(family "$ivcudad_pid")
  workers=$(for p in $mine; do [ "$(uid_of "$p")" = "$(id -u nobody)" ] && echo "$p"; done)
  seen=0
  for w in $workers; do
    seen=$((seen + 1))
    owner=$(stat -c %U "/proc/$w/fd" 2>/dev/null)
    [ "$owner" = root ] || { ok=1; echo "worker $w: /proc/$w/fd owned by $owner: dumpable after the resume"; }
  done
  [ "$seen" -gt 0 ] || { ok=1; echo "no worker runs as nobody"; }
  # Only the driver's pipes became nobody's: a pipe a worker shares with a root process of the
  # daemon's (its stderr, open before the driver) is still root's.
  shared=0
  roots=$(for p in "$ivcudad_pid" $mine; do [ "$(uid_of "$p")" = 0 ] && echo "$p"; done)
  for w in $workers; do
    for f in /proc/"$w"/fd/*; do
      t=$(readlink "$f" 2>/dev/null) || continue
      [[ $t == pipe:* ]] || continue
      for r in $roots; do
        if ls -l /proc/"$r"/fd 2>/dev/null | grep -qF -- "$t"; then
          shared=$((shared + 1))
          owner=$(stat -L -c %U "$f")
          [ "$owner" = root ] || { ok=1; echo "worker $w: ${f##*/} ($t, shared with pid $r) was given to $owner"; }
          break
        fi
      done
    done
  done
  [ "$shared" -gt 0 ] || { ok=1; echo "no pipe shared between a worker and the daemon's root processes was found"; }
  verdict "under --user nobody a guest is suspended and resumed intact (the worker dumpable while held only, the daemon's pipes still root's)" $ok
  kill "$u_pid" 2>/dev/null
  wait "$u_pid" 2>/dev/null
  stop_ivcudad
fi
daemon --sandbox off

start_guest a 256 || exit 1
a_pid=$gpid id_a=$gid
free_before=$(other_tenant | cut -d' ' -f1)
calls_before=$(field "$id_a" calls)

# --- suspend: its memory leaves the GPU, it is reported in host memory, its calls are held
ok=0
"$ctl" --socket "$csock" suspend "$id_a" >"$work/suspend.txt" 2>&1 || { ok=1; cat "$work/suspend.txt"; }
grep -q "guest $id_a: suspended: 256 MiB in host memory, none on the GPU" "$work/suspend.txt" || { ok=1; cat "$work/suspend.txt"; }
status_json >"$work/st.json"
"$py" - "$work/st.json" "$id_a" <<'PY' || ok=1
import json, sys
g = [x for x in json.load(open(sys.argv[1]))["guests"] if x["id"] == int(sys.argv[2])][0]
MiB = 1 << 20
assert g["state"] == "suspended", g
assert g["mem_used_bytes"] == 256 * MiB and g["mem_host_bytes"] == 256 * MiB and g["mem_device_bytes"] == 0, g
assert g["suspend"]["last"] == "suspended", g
PY
verdict "ivcudactl suspend: the guest's 256 MiB are reported in host memory, none on the GPU, its quota's charge unchanged" $ok

ok=0
read -r free_during took < <(other_tenant 256)
[ "$free_during" -ge $((free_before + 256)) ] && [ "$took" = took ] ||
  { ok=1; echo "free before $free_before MiB, while suspended $free_during MiB; another tenant's 256 MiB: $took"; }
sleep 1
calls_held=$(field "$id_a" calls)
[ "$calls_held" -le $((calls_before + 400)) ] || ok=1
sleep 0.5
[ "$(field "$id_a" calls)" = "$calls_held" ] || { ok=1; echo "the suspended guest's calls went on"; }
verdict "while suspended its memory is free for another tenant (who takes and frees it) and none of its calls is served" $ok

# --- resume: back on the GPU, the guest saw nothing but time - after the checkpointer that
# suspended it was killed (the daemon notices; resume starts another)
ok=0
ckpt=$(pgrep -x -P "$ivcudad_pid" ivcuda-ckpt | head -1)  # this daemon's (tests run side by side)
[ -n "$ckpt" ] && kill -9 "$ckpt" || { ok=1; echo "no checkpointer process while suspended"; }
for _ in $(seq 100); do grep -q "checkpointer (pid ${ckpt:-none}) ended" "$log" && break; sleep 0.05; done
grep -q "checkpointer (pid ${ckpt:-none}) ended" "$log" || { ok=1; echo "the daemon did not notice its checkpointer's end"; }
[ "$(field "$id_a" state)" = suspended ] || { ok=1; echo "guest $id_a: $(field "$id_a" state)"; }
"$ctl" --socket "$csock" resume "$id_a" >"$work/resume.txt" 2>&1 || { ok=1; cat "$work/resume.txt"; }
grep -q "guest $id_a: serving again: 256 MiB back on the GPU" "$work/resume.txt" || { ok=1; cat "$work/resume.txt"; }
free_after=$(other_tenant | cut -d' ' -f1)
[ "$free_after" -eq "$free_before" ] || { ok=1; echo "free before $free_before MiB, after resume $free_after MiB"; }
sleep 0.3
echo check >&"$a_fd"
for _ in $(seq 200); do grep -q '^checked' "$work/a.out" && break; sleep 0.05; done
line=$(grep '^checked' "$work/a.out")
longest=$(echo "$line" | sed -n 's/.*longest_call_ms=\([0-9]*\).*/\1/p')
echo "$line" | grep -q "intact=1 alloc=1 .* failed_calls=0" && [ "${longest:-0}" -ge 1000 ] ||
  { ok=1; echo "the guest: ${line:-nothing}"; cat "$work/a.out"; }
wait "$a_pid" || ok=1
verdict "ivcudactl resume (its checkpointer killed meanwhile, another started): its memory back, its pattern intact at the same address, no call failed, one waited ${longest:-?} ms" $ok

# --- asked wrongly: clear answers, nothing changes
ok=0
start_guest b 64 || exit 1
b_pid=$gpid id_b=$gid b_prog=$prog
# b is the tenant's second guest, on a's recycled worker: its count starts from nothing
[ "$(field "$id_b" mem_used_bytes)" = $((64 << 20)) ] || { ok=1; echo "guest b's memory: $(field "$id_b" mem_used_bytes)"; }
"$ctl" --socket "$csock" suspend 9999 >"$work/bad.txt" 2>&1 && ok=1
grep -q "no guest 9999" "$work/bad.txt" || ok=1
"$ctl" --socket "$csock" resume "$id_b" >"$work/bad.txt" 2>&1 || ok=1  # serving already: nothing to do
grep -q "guest $id_b: serving again" "$work/bad.txt" || ok=1
"$ctl" --socket "$csock" undrain 0 >"$work/bad.txt" 2>&1 && ok=1
grep -q "GPU 0 is not drained" "$work/bad.txt" || ok=1
"$ctl" --socket "$csock" drain 7 >"$work/bad.txt" 2>&1 && ok=1
grep -q "GPU 7 is not one ivcudad serves" "$work/bad.txt" || ok=1
[ $ok -eq 0 ] || cat "$work/bad.txt"
verdict "a recycled worker's next guest is charged from nothing; an unknown guest or GPU, a resume of a serving guest and an undrain of a GPU in service are answered clearly" $ok

# --- a guest that dies while suspended: its worker ends, its memory goes with it
ok=0
"$ctl" --socket "$csock" suspend "$id_b" >/dev/null 2>&1 || ok=1
kill -9 "$b_prog"
wait "$b_pid" 2>/dev/null
for _ in $(seq 100); do [ "$(field "$id_b" state)" = gone ] && break; sleep 0.05; done
[ "$(field "$id_b" state)" = gone ] || { ok=1; echo "guest $id_b is still listed: $(field "$id_b" state)"; }
grep -q "guest $id_b ended while suspended" "$log" || { ok=1; grep "guest $id_b" "$log" | tail -5; }
for _ in $(seq 100); do grep -q "checkpointer: no guest is suspended; it ends" "$log" && break; sleep 0.05; done
grep -q "checkpointer: no guest is suspended; it ends" "$log" || ok=1
verdict "a guest killed while suspended: its worker ends and the guest is gone within 5 s, the checkpointer ends" $ok

# --- evicted while suspended: its worker is ended (a locked worker can release nothing)
ok=0
start_guest c 64 || exit 1
c_pid=$gpid id_c=$gid
"$ctl" --socket "$csock" suspend "$id_c" >/dev/null 2>&1 || ok=1
"$ctl" --socket "$csock" evict "$id_c" --wait 5 >"$work/evict.txt" 2>&1 || { ok=1; cat "$work/evict.txt"; }
grep -q "guest $id_c: evicted while suspended: its worker (pid [0-9]*) is killed" "$log" || ok=1
# The guest's held calls end with an error, not a hang.
for _ in $(seq 200); do kill -0 "$c_pid" 2>/dev/null || break; echo check >&"$c_fd" 2>/dev/null; sleep 0.05; done
kill -0 "$c_pid" 2>/dev/null && { ok=1; echo "the evicted guest still runs"; }
verdict "a guest evicted while suspended: its worker is killed, and its waiting program ends instead of hanging" $ok

# --- drain: every guest on the GPU suspended, no new one served there; undrain brings them back
ok=0
start_guest d 64 || exit 1
d_pid=$gpid id_d=$gid
start_guest e 64 || exit 1
e_pid=$gpid id_e=$gid
"$ctl" --socket "$csock" drain 0 >"$work/drain.txt" 2>&1 || ok=1
grep -q "guest $id_d: suspended" "$work/drain.txt" && grep -q "guest $id_e: suspended" "$work/drain.txt" || ok=1
"$ctl" --socket "$csock" status >"$work/table.txt" 2>&1
grep -q "GPU 0 drained" "$work/table.txt" || ok=1
IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 30 "$bin/drv_core" >"$work/new.out" 2>&1 && ok=1
grep -q "refusing a guest on $sock: its GPU is drained" "$log" || ok=1
[ $ok -eq 0 ] || cat "$work/drain.txt" "$work/table.txt"
verdict "ivcudactl drain 0: both guests suspended, the status says so, and a new guest is turned away" $ok

ok=0
"$ctl" --socket "$csock" undrain 0 >"$work/undrain.txt" 2>&1 || { ok=1; cat "$work/undrain.txt"; }
grep -q "guest $id_d: serving again" "$work/undrain.txt" && grep -q "guest $id_e: serving again" "$work/undrain.txt" ||
  { ok=1; cat "$work/undrain.txt"; }
for n in d e; do
  eval "fd=\$${n}_fd"
  echo check >&"$fd"
done
for n in d e; do
  for _ in $(seq 200); do grep -q '^checked' "$work/$n.out" && break; sleep 0.05; done
  grep -q "^checked intact=1 alloc=1 .* failed_calls=0" "$work/$n.out" || { ok=1; cat "$work/$n.out"; }
done
wait "$d_pid" "$e_pid" || ok=1
IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 60 "$bin/drv_core" >"$work/new.out" 2>&1 || { ok=1; tail -5 "$work/new.out"; }
verdict "ivcudactl undrain 0: both guests resume intact with no failed call, and new guests are served again" $ok

# --- a guest that floods its worker while suspended: eight threads call back to back; none of
# their calls is served or fails, the worker holds them without spinning, the daemon answers as
# ever, and after resume they all go on
ok=0
start_guest h 64 --flood 8 || exit 1
h_pid=$gpid id_h=$gid
conn=$(field "$id_h" pid)
# CPU seconds (user + system) of the guest's connection process and its worker, its child.
cpu_of_worker() {
  local t=0 p
  for p in "$conn" $(pgrep -P "$conn"); do
    t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
  done
  echo "$t"
}
sleep 0.5
"$ctl" --socket "$csock" suspend "$id_h" >"$work/h.susp" 2>&1 || { ok=1; cat "$work/h.susp"; }
calls0=$(field "$id_h" calls) cpu0=$(cpu_of_worker)
sleep 2
calls1=$(field "$id_h" calls) cpu1=$(cpu_of_worker)
ticks=$(getconf CLK_TCK)
[ "$calls1" = "$calls0" ] || { ok=1; echo "calls served while suspended: $calls0 -> $calls1"; }
# The flood kept the worker busy before (so these are its ticks), and at most a tenth of a core
# over the two seconds once held (a 5 ms nap per pass).
[ "$cpu0" -gt 0 ] || { ok=1; echo "no CPU time read for the worker (pid $conn and its children)"; }
[ $((cpu1 - cpu0)) -le $((ticks / 5)) ] || { ok=1; echo "the held worker used $((cpu1 - cpu0)) of $((2 * ticks)) ticks"; }
t0=$(date +%s%N)
status_json >/dev/null || ok=1
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$ms" -lt 2000 ] || { ok=1; echo "ivcudactl status took $ms ms"; }
"$ctl" --socket "$csock" resume "$id_h" >"$work/h.resume" 2>&1 || { ok=1; cat "$work/h.resume"; }
sleep 0.5
[ "$(field "$id_h" calls)" -gt "$calls1" ] || { ok=1; echo "no call served after resume"; }
echo check >&"$h_fd"
for _ in $(seq 200); do grep -q '^checked' "$work/h.out" && break; sleep 0.05; done
grep -q "^checked intact=1 alloc=1 .* failed_calls=0 flood_calls=[1-9]" "$work/h.out" || { ok=1; cat "$work/h.out"; }
wait "$h_pid" || ok=1
verdict "a guest flooding its worker from eight threads while suspended: no call served or failed, the held worker idle ($((cpu1 - cpu0)) of its $cpu1 ticks in those 2 s), ivcudactl status in ${ms} ms, all calls on after resume" $ok

# --- a checkpointer that ends with the worker locked (between the lock and the checkpoint, or in
# an unlock): another brings the worker back to running and the guest serves on; when that one
# ends too, the worker is ended and the guest's calls fail instead of hanging. The double takes
# 3 s for each checkpoint and unlock here, so that there is time to end a checkpointer mid-way.
stop_ivcudad
IVCUDA_GPU_DOUBLE_CHECKPOINT_DELAY_MS=3000 daemon --sandbox off
# locked_mid_way GUEST: asks for its suspension in the background ($susp, its words in
# $work/GUEST.susp), waits until this daemon's checkpointer has had a second to lock its worker
# and kills the checkpointer; sets $ckpt.
locked_mid_way() {
  "$ctl" --socket "$csock" suspend "$1" >"$work/$1.susp" 2>&1 &
  susp=$!
  ckpt=
  for _ in $(seq 200); do
    [ "$(field "$1" state)" = suspending ] && ckpt=$(pgrep -x -P "$ivcudad_pid" ivcuda-ckpt | head -1) &&
      [ -n "$ckpt" ] && break
    sleep 0.05
  done
  sleep 1
  [ -n "$ckpt" ] && kill -9 "$ckpt"
}
ok=0
start_guest f 64 || exit 1
f_pid=$gpid id_f=$gid
locked_mid_way "$id_f"
wait "$susp"  # 3: the guest is serving, not suspended
grep -q "guest $id_f: serving: suspend interrupted: the checkpointer ended; its worker is being brought back: done, it serves on" \
  "$work/$id_f.susp" || { ok=1; cat "$work/$id_f.susp"; }
grep -q "guest $id_f: its worker pid [0-9]* was found locked and is running again" "$log" || { ok=1; grep "guest $id_f" "$log" | tail -5; }
echo check >&"$f_fd"
for _ in $(seq 200); do grep -q '^checked' "$work/f.out" && break; sleep 0.05; done
grep -q "^checked intact=1 alloc=1 .* failed_calls=0" "$work/f.out" || { ok=1; cat "$work/f.out"; }
wait "$f_pid" || ok=1
verdict "a checkpointer killed with the worker locked: another finds it locked and unlocks it, and the guest serves on intact with no failed call" $ok

ok=0
start_guest g 64 || exit 1
g_pid=$gpid id_g=$gid
locked_mid_way "$id_g"
first=$ckpt
second=
for _ in $(seq 200); do
  second=$(pgrep -x -P "$ivcudad_pid" ivcuda-ckpt | grep -vx "${first:-none}" | head -1)
  [ -n "$second" ] && break
  sleep 0.05
done
sleep 1  # in its 3 s unlock
[ -n "$second" ] && kill -9 "$second" || { ok=1; echo "no second checkpointer"; }
wait "$susp"
grep -q "guest $id_g: its worker was ended: the checkpointer that was to bring its worker back ended too" "$log" ||
  { ok=1; grep "guest $id_g" "$log" | tail -5; }
for _ in $(seq 200); do kill -0 "$g_pid" 2>/dev/null || break; echo check >&"$g_fd" 2>/dev/null; sleep 0.05; done
kill -0 "$g_pid" 2>/dev/null && { ok=1; echo "the guest still runs"; }
for _ in $(seq 100); do [ "$(field "$id_g" state)" = gone ] && break; sleep 0.05; done
[ "$(field "$id_g" state)" = gone ] || { ok=1; echo "guest $id_g: $(field "$id_g" state)"; }
verdict "its second checkpointer killed too: the worker is ended, the guest's program ends instead of hanging, and the guest is gone" $ok

# --- a guest that came while its warm entry's worker was still starting (its context takes
# 1.5 s): the entry names that worker once it is ready, and the suspension acts on it, not on
# the entry's own process (which has no driver: a real one answers CUDA_ERROR_NOT_INITIALIZED)
stop_ivcudad
IVCUDA_GPU_DOUBLE_CONTEXT_DELAY_MS=1500 daemon --sandbox off
ok=0
start_guest w 64 || exit 1
w_pid=$gpid id_w=$gid
grep -q "guest $id_w (uid [0-9]*) connected on .*; a warm entry (still starting)" "$log" ||
  { ok=1; echo "guest $id_w did not come while its warm entry was still starting:"; grep "guest $id_w" "$log" | head -3; }
wpid=$(sed -n "s/.*guest $id_w: worker pid \([0-9]*\) is ready.*/\1/p" "$log" | tail -1)
[ -n "$wpid" ] || { ok=1; echo "the daemon never heard guest $id_w's worker's pid"; }
"$ctl" --socket "$csock" suspend "$id_w" >"$work/w.txt" 2>&1 || ok=1
grep -q "guest $id_w: suspended: 64 MiB in host memory" "$work/w.txt" || { ok=1; cat "$work/w.txt"; }
grep -q "guest $id_w: suspending (worker pid ${wpid:-none})" "$log" || { ok=1; grep "guest $id_w: suspending" "$log"; }
"$ctl" --socket "$csock" resume "$id_w" >>"$work/w.txt" 2>&1 || { ok=1; cat "$work/w.txt"; }
echo check >&"$w_fd"
for _ in $(seq 200); do grep -q '^checked' "$work/w.out" && break; sleep 0.05; done
grep -q "^checked intact=1 alloc=1 .* failed_calls=0" "$work/w.out" || { ok=1; cat "$work/w.out"; }
verdict "a guest that came while its warm entry's worker was still starting: that worker (pid ${wpid:-?}) is suspended and resumed, intact" $ok
kill "$w_pid" 2>/dev/null
wait "$w_pid" 2>/dev/null

finish
