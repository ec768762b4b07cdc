#!/usr/bin/env bash
# A guest that finds no ready worker waits for the first one that becomes
# ready, whichever it is (host-daemon/daemon/guests.cc serve_waiting,
# warm_policy.h kWaitForReady; issue 30's back-to-back starts), against the
# GPU test double with contexts that take IVCUDA_GPU_DOUBLE_CONTEXT_DELAY_MS:
#   1. guest A holds the warm worker, so a fresh one starts (ready ~D later);
#      A is killed idle after H ms, so its worker resets and makes a new
#      context (ready ~H + D after that start); guest B, arriving then, is
#      served by the fresh worker - the first ready - not by A's recycled one
#      that the pool would have given it at once before (it prefers the
#      user's own recycled worker), and waited no longer than the fresh one took;
#   2. a guest killed while it waits is dropped: the next one is served;
#   3. no guest is refused;
#   4. with --wait-for-ready off, B takes A's recycled worker at once (the rule before).
#   run_first_ready_test.sh BUILD_DIR DRIVER_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
bin=$build/tests/bin
work=$(mktemp -d /tmp/ivcuda-first-ready.XXXXXX)
sock=$work/ivcudad.sock
log=$work/ivcudad.log
holder=
# shellcheck source=../lib/verdicts.sh
. "$(dirname "$0")/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"
expect_cases 5
cleanup() {
  [ -n "$holder" ] && kill -9 "$holder" 2>/dev/null
  stop_ivcudad
  [ -n "${IVCUDA_KEEP_WORK:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
export IVCUDA_GPU_DOUBLE_CONTEXT_DELAY_MS=2000  # D: each context, the recycled ones' too

through() { IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 60 "$@"; }
# spawn PROGRAM ARGS... &: the program itself in the background ($! is its pid).
spawn() { IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib exec "$@"; }
# The guest number that served process PID (its "says hello" line).
number_of() { sed -n "s/.* worker g\([0-9]*\) info: guest [0-9]*: process $1 says hello.*/\1/p" "$log" | tail -1; }
served() { for _ in $(seq 200); do [ -n "$(number_of "$1")" ] && return 0; sleep 0.05; done; return 1; }

start_ivcudad "$log" --socket "$sock" --control-socket none --shm-size 64M --staging-size 2M \
  --channels 4 --warm-workers 1 --warm-burst 2 --recycle-workers on --wait-for-ready on --driver "$driver" || exit 1
for _ in $(seq 200); do grep -q "started ahead for guest 1:" "$log" && break; sleep 0.05; done

# 1. A takes the warm worker, so a fresh one starts; A goes after H; B arrives.
spawn "$bin/drv_isolation" --hold --mib 1 >"$work/a.out" 2>&1 &
holder=$!
served $holder
a_number=$(number_of $holder)
sleep 1.2  # H
kill -9 "$holder"
wait "$holder" 2>/dev/null
holder=
for _ in $(seq 100); do grep -q "is kept for the next guest" "$log" && break; sleep 0.02; done
t0=$(date +%s%N)
spawn "$bin/drv_isolation" --used >"$work/b.out" 2>&1 &
b=$!
wait $b
b_rc=$?
b_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
b_number=$(number_of $b)
echo "guest A was guest $a_number; guest B (status $b_rc, ${b_ms} ms) was served as guest $b_number"
grep -E "waits for the first worker|connected on .*waited" "$log" | tail -3
[ $b_rc -eq 0 ] && [ -n "$a_number" ] && [ -n "$b_number" ] && [ "$b_number" != "$a_number" ] &&
  grep -q "waits for the first worker" "$log"
verdict "a waiting guest is served by the first worker ready, not by the recycled one it would have taken" $?
# B waited for the fresh worker (about D - H after A went), not for A's reset and new context (D).
[ "$b_ms" -lt 1500 ]
verdict "it waited for the first ready worker only" $?

# The same with --wait-for-ready off: B takes A's recycled worker at once and waits for its new context.
run_ab() {  # prints "A-number B-number B-ms"
  local h b t0 rc
  for _ in $(seq 200); do grep -q "started ahead for guest 1:" "$log" && break; sleep 0.05; done
  spawn "$bin/drv_isolation" --hold --mib 1 >/dev/null 2>&1 &
  h=$!
  served $h
  sleep 1.2
  kill -9 $h
  wait $h 2>/dev/null
  for _ in $(seq 100); do grep -q "is kept for the next guest" "$log" && break; sleep 0.02; done
  t0=$(date +%s%N)
  spawn "$bin/drv_isolation" --used >/dev/null 2>&1 &
  b=$!
  wait $b
  rc=$?
  echo "$(number_of $h) $(number_of $b) $(( ($(date +%s%N) - t0) / 1000000 )) $rc"
}
stop_ivcudad
start_ivcudad "$log" --socket "$sock" --control-socket none --shm-size 64M --staging-size 2M \
  --channels 4 --warm-workers 1 --warm-burst 2 --recycle-workers on --wait-for-ready off --driver "$driver" || exit 1
read -r a_off b_off ms_off rc_off < <(run_ab)
echo "--wait-for-ready off: guest A was guest $a_off; guest B (status $rc_off, ${ms_off} ms) was served as guest $b_off"
[ "$rc_off" = 0 ] && [ -n "$a_off" ] && [ "$b_off" = "$a_off" ] && ! grep -q "waits for the first worker" "$log"
verdict "with --wait-for-ready off the guest takes the recycled worker at once" $?

# 2. A daemon whose one warm worker is still making its context: C waits, and is killed
#    waiting; D is served once the worker is ready.
stop_ivcudad
start_ivcudad --append "$log" --socket "$sock" --control-socket none --shm-size 64M --staging-size 2M \
  --channels 4 --warm-workers 1 --warm-burst 0 --recycle-workers on --wait-for-ready on --driver "$driver" || exit 1
mark=$(wc -c <"$log")
spawn "$bin/drv_isolation" --used >/dev/null 2>&1 &
c=$!
for _ in $(seq 100); do tail -c +$((mark + 1)) "$log" | grep -q "waits for the first worker" && break; sleep 0.02; done
kill -9 $c
wait $c 2>/dev/null
for _ in $(seq 200); do tail -c +$((mark + 1)) "$log" | grep -q "left before a worker was ready" && break; sleep 0.05; done
tail -c +$((mark + 1)) "$log" | grep -q "left before a worker was ready"
verdict "a guest killed while waiting is dropped" $?
through "$bin/drv_isolation" --used >"$work/d.out" 2>&1
d_rc=$?
[ $d_rc -eq 0 ] && ! grep -q "refusing a guest" "$log"
verdict "the next guest is served, and none was refused" $?
finish
