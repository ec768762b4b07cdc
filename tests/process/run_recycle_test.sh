#!/usr/bin/env bash
# Recycled workers (--recycle-workers, issue 30; docs/design.md "Recycled
# workers", docs/security.md): a warm worker whose process-mode guest ended
# with nothing under way serves the same user's next guest, and that guest
# sees nothing of the last one. Against the GPU test double and the NVML test
# double (the real driver's side: tests/gpu/run_all.sh lifecycle runs
# drv_recycle on the H200):
#   1. a guest that leaves memory, handles and page-locked memory behind and
#      exits: its worker is kept (daemon log), and the next guest is served
#      by that same worker;
#   2. that guest (drv_recycle --probe --handles): the last one's device
#      pointers and handles are refused, its memory is free, and no memory it
#      allocates (device, small blocks, a pool's, page-locked host memory)
#      holds the last one's pattern;
#   3. NVML through the recycled worker lists the guest alone (ivcuda-smi);
#   4. another user's guest is never served by a worker recycled for this
#      user (rule recycle-same-tenant);
#   5. a guest killed while idle: its worker is recycled and its memory is
#      free (the contexts' reset; rule recycle-reset-contexts);
#   6. a guest killed with 10,000 launches posted: its worker ends within
#      1 s and is not recycled (the work must not run: rule death-stops-work).
# With MODE keep (--recycle-workers keep; ctest kept_contexts), the cases of a
# worker that keeps its context for the next guest (host-daemon/worker/keep.cc):
#   K1. a guest that used only what the worker can scrub (plain allocations,
#       some freed, a module, a stream and an event; its kernels' shared and
#       local memory): its worker keeps the context, and the next guest finds
#       nothing of it (the double hands a context's freed small blocks back
#       unscrubbed, as the driver does: without the zeroing the pattern is
#       there; rule recycle-keep-scrub);
#   K2. a guest that used a pool and page-locked memory: the context is reset,
#       the log says why, and the next guest finds nothing;
#   K3. a guest that raised its stack limit, and one whose kernel called
#       device malloc: the context is reset (rule recycle-keep-only-scrubbable,
#       with K2);
#   K4. a guest killed while idle holding memory: the context is kept and the
#       memory free;
#   K5. the daemon serves the next guest.
#   run_recycle_test.sh BUILD_DIR DRIVER_LIB NVML_DOUBLE_LIB [keep]
set -u
build=$(cd "$1" && pwd)
driver=$2
nvml=$3
mode=${4:-on}
bin=$build/tests/bin
smi=$build/bin/ivcuda-smi
ptx=$build/tests/gpu_double/test_kernels.ptx
work=$(mktemp -d /tmp/ivcuda-recycle.XXXXXX)
chmod 755 "$work"  # another user's guest connects too (case 4)
sock=$work/ivcudad.sock
log=$work/ivcudad.log
guest=
# shellcheck source=../lib/verdicts.sh
. "$(dirname "$0")/../lib/verdicts.sh"
# shellcheck source=../lib/processes.sh
. "$(dirname "$0")/../lib/processes.sh"
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"
if [ "$mode" = keep ]; then expect_cases 6; else expect_cases 8; fi
cleanup() {
  [ -n "$guest" ] && kill -9 "$guest" 2>/dev/null
  stop_ivcudad
  [ -n "${IVCUDA_KEEP_WORK:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
export IVCUDA_DOUBLE_LEDGER=$work/ledger  # the double's device memory, across its processes
export IVCUDA_GPU_DOUBLE_CONTEXT_MIB=16

# --warm-burst 4: room in the pool (5 entries) for both users' recycled workers and the extra fresh
# ones a loaded machine starts; with 3, uid 65534's returning worker could take the place of the
# one recycled longest ago - this user's - and case 4 saw a fresh worker (the pool's rule, not a leak).
start_ivcudad "$log" --socket "$sock" --control-socket none --shm-size 64M --staging-size 2M \
  --channels 4 --warm-workers 1 --warm-burst 4 --recycle-workers "$mode" --driver "$driver" --nvml "$nvml" || exit 1
chmod 777 "$sock"
through() { IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 60 "$@"; }
# the worker that served the last guest handed over after MARK (vm_supervisor.cc logs it).
worker_after() { tail -c +$(($1 + 1)) "$log" | sed -n 's/.*: worker pid \([0-9]*\) (started ahead).*/\1/p' | tail -1; }
kept() { grep -c "is kept for the next guest" "$log"; }
# recycled_for UID PID MARK: PID, which served the guest that arrived after MARK, is a worker the
# daemon kept for UID's next guest before it handed PID to that guest (the kept line precedes the
# handover in the log; a fresh worker that served the guest is kept after it). Which recycled
# worker serves a guest is the pool's choice: a program that connects twice (ivcuda-smi: its NVML
# and its driver library) leaves two, and on a loaded machine either may be ready first.
recycled_for() {
  local at
  at=$(tail -c +$(($3 + 1)) "$log" | grep -b -m1 ": worker pid $2 (started ahead)" | cut -d: -f1)
  [ -n "$at" ] && head -c $(($3 + at)) "$log" | grep -q "its worker (pid $2) is kept for the next guest of uid $1 "
}
# The daemon's word that a recycled worker is offered (the worker's own "recycled for guest"
# line comes a moment before the daemon knows: a guest arriving then gets a fresh warm one).
# wait_ready PID MARK: until the worker PID, which served a guest that arrived after MARK, is offered
# again and has not been handed over since: the log's last word on PID after MARK is that it is
# ready (ivcuda-smi connects twice, one after the other, often to the same recycled worker).
wait_ready() {
  local last
  for _ in $(seq 200); do
    last=$(tail -c +$(($2 + 1)) "$log" | grep -E "worker pid $1 |\(pid $1\)" | tail -1)
    [[ $last == *"worker pid $1 is ready for the next guest of uid"* ]] && return 0
    sleep 0.025
  done
  return 1
}
ended() { process_ended "$1"; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
for _ in $(seq 200); do grep -q "started ahead for guest" "$log" && break; sleep 0.025; done

# The cases of --recycle-workers keep. The first worker that let go of a guest after MARK (one guest
# at a time here): kept_since MARK - it kept its context for the next guest (keep.cc); reset_since
# MARK WHY - it reset the contexts instead, saying WHY.
first_release() { tail -c +$(($1 + 1)) "$log" | grep -m1 "releasing .* for the tenant's next guest"; }
kept_since() {
  local who
  who=$(first_release "$1" | grep -o "worker g[0-9]* ")
  [ -n "$who" ] && tail -c +$(($1 + 1)) "$log" | grep -q "$who.*context kept for the next guest, scrubbed"
}
reset_since() { first_release "$1" | grep -q "resetting the GPUs' contexts.*not kept: $2"; }
# leave_reset WHY LEAVER-ARGS...: a guest (drv_recycle --leave) whose worker resets the contexts
# saying WHY; sets $last to that worker.
leave_reset() {
  local why=$1 rc
  shift
  mark=$(log_mark "$log")
  through "$bin/drv_recycle" --leave "$@" --ptx "$ptx" >"$work/leave" 2>&1
  rc=$?
  last=$(worker_after "$mark")
  wait_ready "$last" "$mark"
  [ $rc -eq 0 ] && [ -n "$last" ] && reset_since "$mark" "$why" ||
    { cat "$work/leave"; grep "releasing" "$log" | tail -3; false; }
}
# kill_idle_holder KEPT: a guest holding 256 MiB, idle, is SIGKILLed; KEPT MARK HOLDER says
# whether its worker was kept for the next guest after MARK. Sets holder, held and after (MiB in
# use while it held and after) and back (0: kept).
kill_idle_holder() {
  mark=$(log_mark "$log")
  env IVCUDA_SOCKET="$sock" LD_LIBRARY_PATH="$build/lib" "$bin/drv_isolation" --hold --mib 256 >"$work/hold" 2>&1 &
  guest=$!
  for _ in $(seq 400); do grep -q '^holding' "$work/hold" && break; sleep 0.025; done
  holder=$(worker_after "$mark")
  held=$(through "$bin/drv_isolation" --used)
  mark=$(log_mark "$log")
  kill -9 "$guest"
  wait "$guest" 2>/dev/null
  guest=
  back=1
  for _ in $(seq 200); do "$1" "$mark" "$holder" && { back=0; break; }; sleep 0.025; done
  after=$(through "$bin/drv_isolation" --used)
}
# 192 of its 256 MiB at least must be free after: other workers' contexts (16 MiB each in the
# double) come and go meanwhile - the warm pool refills on a loaded machine.
holder_freed() { [ -n "$holder" ] && [ $back -eq 0 ] && [ -n "$held" ] && [ -n "$after" ] && [ "$after" -le $((held - 192)) ]; }
if [ "$mode" = keep ]; then
  # K1. A guest of scrubbable calls only.
  mark=$(log_mark "$log")
  through "$bin/drv_recycle" --leave --plain --kernels --mib 64 --ptx "$ptx" >"$work/leave" 2>&1
  rc=$?
  first=$(worker_after "$mark")
  line=$(grep '^left ' "$work/leave")
  wait_ready "$first" "$mark"
  kept_since "$mark"
  kept1=$?
  mark=$(log_mark "$log")
  through "$bin/drv_recycle" --probe "$line" --plain --kernels --ptx "$ptx" --mib 64 --allow-mib 48 --handles \
    >"$work/probe" 2>&1
  prc=$?
  second=$(worker_after "$mark")
  cat "$work/probe"
  echo "the leaver (status $rc) was served by worker ${first:-?} (context kept: status $kept1), the next guest by ${second:-?}"
  [ $rc -eq 0 ] && [ $kept1 -eq 0 ] && [ -n "$first" ] && [ "$first" = "$second" ] && [ $prc -eq 0 ] ||
    { cat "$work/leave"; false; }
  verdict "a kept context: the next guest of its worker finds none of the last one's pointers, handles or bytes" $?

  # K2. Pools and page-locked memory: not kept.
  wait_ready "$second" "$mark"
  mark=$(log_mark "$log")
  through "$bin/drv_recycle" --leave --mib 64 --ptx "$ptx" >"$work/leave" 2>&1
  rc=$?
  third=$(worker_after "$mark")
  line=$(grep '^left ' "$work/leave")
  wait_ready "$third" "$mark"
  reset_since "$mark" "MemAllocAsync"
  reset2=$?
  mark=$(log_mark "$log")
  through "$bin/drv_recycle" --probe "$line" --mib 64 --allow-mib 48 --handles >"$work/probe" 2>&1
  prc=$?
  fourth=$(worker_after "$mark")
  echo "a pool's guest on worker ${third:-?}: contexts reset (status $reset2); the next guest on ${fourth:-?}"
  [ $rc -eq 0 ] && [ $reset2 -eq 0 ] && [ "$third" = "$fourth" ] && [ $prc -eq 0 ] ||
    { cat "$work/leave" "$work/probe"; grep "releasing" "$log" | tail -3; false; }
  verdict "a guest that used a pool: its worker resets the contexts, says why, and the next guest finds nothing" $?

  # K3. A raised stack limit, device malloc: not kept.
  wait_ready "$fourth" "$mark"
  leave_reset "a context limit" --plain --grow-stack --mib 8
  verdict "a guest that raised its stack limit: its worker resets the contexts" $?
  leave_reset "the device heap" --plain --heap --mib 8
  verdict "a guest whose kernel called device malloc: its worker resets the contexts" $?

  # K4. Killed while idle, holding memory: kept, the memory free.
  kept_after() { kept_since "$1"; }
  kill_idle_holder kept_after
  echo "an idle holder killed: worker ${holder:-?} kept its context (status $back); memory in use ${held:-?} MiB" \
    "while it held 256 MiB, ${after:-?} MiB after"
  holder_freed
  verdict "a guest killed while idle: its worker keeps the context, and the guest's memory is free" $?

  through "$bin/drv_isolation" --work 3 >/dev/null
  verdict "ivcudad serves the next guest" $?
  finish
  exit
fi

# 1-2. A guest leaves things behind and exits; the next is served by its worker.
mark=$(log_mark "$log")
through "$bin/drv_recycle" --leave --mib 64 --ptx "$ptx" >"$work/leave" 2>&1
rc=$?
first=$(worker_after "$mark")
line=$(grep '^left ' "$work/leave")
wait_ready "$first" "$mark"
mark=$(log_mark "$log")
through "$bin/drv_recycle" --probe "$line" --mib 64 --allow-mib 48 --handles >"$work/probe" 2>&1
prc=$?
second=$(worker_after "$mark")
echo "the leaver (status $rc) was served by worker ${first:-?}, the next guest by ${second:-?}"
[ $rc -eq 0 ] && [ -n "$line" ] && [ "$(kept)" -ge 1 ] && [ -n "$first" ] && [ "$first" = "$second" ] ||
  { cat "$work/leave"; false; }
verdict "a guest that ends with nothing under way leaves its worker to the same user's next guest" $?
cat "$work/probe"
[ $prc -eq 0 ]
verdict "the next guest sees nothing of the last: its pointers and handles refused, its memory free, no byte of its pattern in new device, pool or page-locked memory" $?

# 3. NVML through the recycled worker: the guest alone.
wait_ready "$second" "$mark"
mark=$(log_mark "$log")
through bash -c 'echo "pid $$"; exec -a ivcuda-smi "$0"' "$smi" >"$work/smi" 2>&1
src=$?
third=$(worker_after "$mark")
smi_pid=$(sed -n 's/^pid //p' "$work/smi")
leaver=$(sed -n 's/.*pid=\([0-9]*\) .*/\1/p' "$work/leave")
rows=$(grep -Ec '^\| [0-9] +[0-9]+  ' "$work/smi")
[ $src -eq 0 ] && [ "$third" = "$first" ] && [ "$rows" -eq 1 ] && grep -Eq "^\| 0 +$smi_pid  ivcuda-smi " "$work/smi" &&
  ! grep -Eq "^\| 0 +$leaver " "$work/smi" || { echo "served by ${third:-?}"; cat "$work/smi"; false; }
verdict "NVML through a recycled worker lists the guest alone, not the last one" $?

# 3b. What a worker set up for its first guest holds for the next: the reserved low gigabyte in
# which a capture may record placeholder memsets (XLA's), drv_errors' capture case.
wait_ready "$third" "$mark"
mark=$(log_mark "$log")
through "$bin/drv_errors" --ptx "$ptx" >"$work/errors" 2>&1
erc=$?
fourth=$(worker_after "$mark")
[ $erc -eq 0 ] && [ -n "$fourth" ] && recycled_for 0 "$fourth" "$mark" && grep -q "placeholder 0x80 -> CUDA_SUCCESS" "$work/errors" ||
  { echo "served by ${fourth:-?}"; cat "$work/errors"; false; }
verdict "a recycled worker records a placeholder memset into a capture, as its first guest's could" $?

# 4. Another user's guest: never the worker recycled for this one (offered again after 3b).
wait_ready "$fourth" "$mark"
if command -v setpriv >/dev/null && [ "$(id -u)" -eq 0 ]; then
  other_mark=$(log_mark "$log")
  IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 60 setpriv --reuid=65534 --regid=65534 --clear-groups \
    "$bin/drv_isolation" --work 3 >"$work/other" 2>&1
  orc=$?
  other=$(worker_after "$other_mark")
  again_mark=$(log_mark "$log")
  through "$bin/drv_isolation" --work 3 >/dev/null 2>&1
  again=$(worker_after "$again_mark")
  echo "uid 65534's guest was served by worker ${other:-a cold one}; uid 0's next by ${again:-?} (recycled for uid 0: $(sed -n 's/.*its worker (pid \([0-9]*\)) is kept for the next guest of uid 0 .*/\1/p' "$log" | sort -u | tr '\n' ' '))"
  [ $orc -eq 0 ] && ! recycled_for 0 "${other:-0}" "$other_mark" && [ -n "$again" ] &&
    recycled_for 0 "$again" "$again_mark" ||
    { cat "$work/other"; false; }
  verdict "another user's guest is never served by a worker recycled for this user" $?
else
  not_run "another user's guest is never served by a worker recycled for this user" "needs root and setpriv"
fi

# 5. A guest killed while it holds memory, idle: recycled, and its memory free.
recycled_after() { tail -c +$(($1 + 1)) "$log" | grep -q "its worker (pid $2) is kept"; }
kill_idle_holder recycled_after
echo "an idle holder killed: worker ${holder:-?} kept (status $back); memory in use ${held:-?} MiB while it held" \
  "256 MiB, ${after:-?} MiB after"
holder_freed
verdict "a guest killed while idle: its worker is recycled and the guest's memory is free" $?

# 6. A guest killed with work posted: its worker ends, and is not recycled.
mark=$(log_mark "$log")
env IVCUDA_SOCKET="$sock" LD_LIBRARY_PATH="$build/lib" "$bin/drv_isolation" --hold --mib 64 --ptx "$ptx" \
  --queue 10000 --spin-us 1000 >"$work/busy" 2>&1 &
guest=$!
for _ in $(seq 400); do grep -q '^holding' "$work/busy" && break; sleep 0.025; done
busy=$(worker_after "$mark")
t0=$(now_ms)
kill -9 "$guest"
wait "$guest" 2>/dev/null
guest=
for _ in $(seq 1000); do [ -n "$busy" ] && ended "$busy" && break; sleep 0.005; done
lived=$(($(now_ms) - t0))
sleep 0.3
# Kept after it served this guest? (A count of kept workers would also count the last case's
# `--used` guest, whose worker may be kept a moment after that guest ended.)
at=$(tail -c +$((mark + 1)) "$log" | grep -b -m1 ": worker pid ${busy:-0} (started ahead)" | cut -d: -f1)
busy_kept=$(tail -c +$((mark + ${at:-0} + 1)) "$log" | grep -c "its worker (pid ${busy:-0}) is kept")
echo "a guest killed with 10,000 launches posted: its worker ${busy:-?} lived ${lived} ms; kept after it: $busy_kept"
[ -n "$busy" ] && [ -n "$at" ] && ended "$busy" && [ "$lived" -le 1000 ] && [ "$busy_kept" -eq 0 ] ||
  { cat "$work/busy"; false; }
verdict "a guest killed with work posted: its worker ends within 1 s and is not recycled" $?

through "$bin/drv_isolation" --work 3 >/dev/null
verdict "ivcudad serves the next guest" $?
finish
