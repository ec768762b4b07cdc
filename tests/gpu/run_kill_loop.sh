#!/usr/bin/env bash
# SIGKILLs process-mode guests mid-run, N times, P at a time: each holds
# device memory (drv_isolation --hold) or is still starting when it dies. At
# the end the GPU's memory must be back at its baseline and ivcudad must still
# serve (a program run through it afterwards passes). Of the guests it waited
# for, most must have got their memory (at least 3 in 4, and it must have waited
# for a quarter of them): a loop whose guests never held any proves nothing.
#   run_kill_loop.sh BUILD_DIR DRIVER_LIB [N [P]]
# Memory is read with nvidia-smi when there is one (the GPU machine), else
# through cuMemGetInfo of a probe process (the GPU test double with
# IVCUDA_DOUBLE_LEDGER, in CI). Prints the figures and one verdict.
set -u
build=$(cd "$1" && pwd)
driver=$2
n=${3:-1000}
par=${4:-8}
bin=$build/tests/bin
work=$(mktemp -d /tmp/ivcuda-kill.XXXXXX)
sock=$work/ivcudad.sock
log=$work/ivcudad.log
# shellcheck source=../lib/verdicts.sh
. "$(dirname "$0")/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"
expect_cases 1
cleanup() {
  stop_ivcudad
  cp "$log" "${OUT:-$work}/kill-loop-ivcudad.log" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
export IVCUDA_DOUBLE_LEDGER=$work/ledger  # read only by the test double

IVCUDA_LOG_LEVEL= start_ivcudad "$log" --socket "$sock" --shm-size 64M --staging-size 2M --channels 8 \
  --max-guests 256 --max-guests-per-uid 256 --driver "$driver" || { echo "FAIL kill loop: ivcudad did not start"; exit 1; }

through() { IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib "$@"; }
used_mib() {  # device memory in use on GPU 0, MiB
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | tr -d ' '
  else
    through "$bin/drv_isolation" --used
  fi
}

# The baseline with the daemon's warm worker made (it holds a context, about 500 MiB on an H200,
# and one is waiting again at the end).
for _ in $(seq 200); do grep -q "started ahead for" "$log" && break; sleep 0.05; done
base=$(used_mib)
peak=$base
start=$SECONDS
killed=0 held=0 waited=0
while [ $killed -lt "$n" ]; do
  pids=() outs=()
  for _ in $(seq "$par"); do
    [ $((killed + ${#pids[@]})) -ge "$n" ] && break
    o=$work/out.${#pids[@]}
    # env execs the program: $! is the guest process itself.
    env IVCUDA_SOCKET="$sock" LD_LIBRARY_PATH="$build/lib" "$bin/drv_isolation" --hold --mib 64 >"$o" 2>&1 &
    pids+=($!) outs+=("$o")
  done
  # Half die as soon as they hold memory, half at a random moment of their
  # start (connecting, starting the worker, allocating).
  for i in "${!pids[@]}"; do
    if [ $((RANDOM % 2)) -eq 0 ]; then
      waited=$((waited + 1))
      for _ in $(seq 400); do grep -q holding "${outs[$i]}" && break; sleep 0.01; done
      grep -q holding "${outs[$i]}" && held=$((held + 1))
    else
      sleep "0.0$((RANDOM % 10))"
    fi
    kill -9 "${pids[$i]}" 2>/dev/null
  done
  { wait "${pids[@]}"; } 2>/dev/null
  killed=$((killed + ${#pids[@]}))
  if [ $((killed % (par * 16))) -eq 0 ]; then
    u=$(used_mib); [ "$u" -gt "$peak" ] && peak=$u
    kill -0 "$ivcudad_pid" 2>/dev/null || { tail -20 "$log"; echo "FAIL kill loop: ivcudad died after $killed kills"; exit 1; }
  fi
done
loop_s=$((SECONDS - start))
# The last workers may still be tearing down: give the memory 20 s to return.
final=$(used_mib)
for _ in $(seq 200); do
  final=$(used_mib)
  [ "$final" -le $((base + 64)) ] && break
  sleep 0.1
done
alive=1; kill -0 "$ivcudad_pid" 2>/dev/null || alive=0
mark=$(log_mark "$log")
after=$(through timeout 120 "${tagged[@]}" "$work/after.pid" "$bin/drv_core" 2>&1 | tail -1)
served_by "$log" "$(cat "$work/after.pid" 2>/dev/null || echo 0)" "$mark" || after="$after (NOT served by ivcudad)"
echo "kill loop: $killed processes SIGKILLed ($held while holding 64 MiB, of $waited waited for; the rest while starting), $par at a time, in ${loop_s} s"
echo "kill loop: GPU memory used: baseline $base MiB, highest seen $peak MiB, after $final MiB"
echo "kill loop: ivcudad alive: $alive; a program through it afterwards: $after"
echo "kill loop: daemon log: $(grep -c "ended\|went away" "$log") worker ends, $(grep -ci "died of signal" "$log") workers killed by a signal"
[ "$alive" -eq 1 ] && [ "$final" -le $((base + 64)) ] && [[ $after == *" 0 failed" ]] &&
  [ $((waited * 4)) -ge "$n" ] && [ $((held * 4)) -ge $((waited * 3)) ]
ok=$?
[ $ok -eq 0 ] || tail -20 "$log"
verdict "kill loop" $ok
finish
