#!/usr/bin/env bash
# A process-mode guest SIGKILLed with work still queued (issue 30): its worker
# must end at once, not after serving out what the dead guest had posted
# (docs/security.md, rule `death-stops-work`). Against the GPU test double,
# whose launches run inside the worker's call (a 1 ms kernel keeps the worker
# 1 ms): each case starts tests/programs/drv_isolation --hold with its work
# under way, kills it, and times how long its worker lives on; the memory it
# held must then be free (cuMemGetInfo of a probe guest). Then ivcudad must
# still serve. The bound here is 1 s (a sanitizer build on a busy CI machine);
# the GPU machine's figure, SIGKILL to memory back in nvidia-smi, is
# ivcuda-bench --only death (docs/performance.md).
#   run_death_test.sh BUILD_DIR DRIVER_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
bin=$build/tests/bin
ptx=$build/tests/gpu_double/test_kernels.ptx
work=$(mktemp -d /tmp/ivcuda-death.XXXXXX)
sock=$work/ivcudad.sock
log=$work/ivcudad.log
guest=
# shellcheck source=../lib/verdicts.sh
. "$(dirname "$0")/../lib/verdicts.sh"
# shellcheck source=../lib/processes.sh
. "$(dirname "$0")/../lib/processes.sh"
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"
# NAME|drv_isolation --hold options: what the guest leaves queued. Without the
# rule the worker would live on for the queue's length: 10 s, 4 s, 5 s, and
# as long as the copy loop (until the hang-up is seen between two copies).
cases=(
  "an idle holder|"
  "10000 launches of a 1 ms kernel posted|--queue 10000 --spin-us 1000"
  "inside long kernels (20 x 200 ms)|--queue 20 --spin-us 200000"
  "a thread blocked in cuStreamSynchronize on 5000 launches|--queue 5000 --spin-us 1000 --sync"
  "a pageable copy loop in flight|--queue 2000 --spin-us 1000 --copy-loop"
)
expect_cases $((${#cases[@]} + 1))
cleanup() {
  [ -n "$guest" ] && kill -9 "$guest" 2>/dev/null
  stop_ivcudad
  rm -rf "$work"
}
trap cleanup EXIT
export IVCUDA_DOUBLE_LEDGER=$work/ledger  # the double's device memory, across its processes

start_ivcudad "$log" --socket "$sock" --control-socket none --shm-size 64M --staging-size 2M \
  --channels 4 --warm-workers 0 --driver "$driver" || exit 1
through() { IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib "$@"; }
children() { children_of "$ivcudad_pid"; }
# ended PID: all its threads have exited (the driver has let go).
ended() { process_ended "$1"; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }

base=$(through "$bin/drv_isolation" --used)
echo "device memory in use before: ${base:-?} MiB"
for c in "${cases[@]}"; do
  name=${c%%|*} opts=${c#*|}
  before=" $(children | tr '\n' ' ') "
  out=$work/out
  # env execs the program: $! is the guest process itself. shellcheck disable=SC2086 # opts are words
  env IVCUDA_SOCKET="$sock" LD_LIBRARY_PATH="$build/lib" "$bin/drv_isolation" --hold --mib 64 --ptx "$ptx" $opts \
    >"$out" 2>&1 &
  guest=$!
  # Posting 10000 launches takes seconds in a sanitizer build on a loaded machine.
  for _ in $(seq 2400); do grep -q '^holding' "$out" && break; sleep 0.025; done
  worker=
  for p in $(children); do [[ $before == *" $p "* ]] || worker=$p; done
  grep -q '^holding 64 MiB' "$out" && [ -n "$worker" ]
  under_way=$?
  if [ $under_way -ne 0 ]; then
    cat "$out"
    echo "the guest did not get under way (worker: ${worker:-none})"
    kill -9 "$guest" 2>/dev/null  # nor may it hold memory through the cases after it
    wait "$guest" 2>/dev/null
    guest=
    [ -n "$worker" ] && for _ in $(seq 100); do ended "$worker" && break; sleep 0.1; done
    verdict "a guest killed with $name: its worker ends within 1 s and its memory is free" $under_way
    continue
  fi
  held=$(through "$bin/drv_isolation" --used)
  t0=$(now_ms)
  kill -9 "$guest"
  wait "$guest" 2>/dev/null
  guest=
  for _ in $(seq 1000); do ended "$worker" && break; sleep 0.005; done
  t1=$(now_ms)
  lived=$((t1 - t0))
  for _ in $(seq 100); do ended "$worker" && break; sleep 0.1; done  # for the memory figure below
  after=$(through "$bin/drv_isolation" --used)
  echo "$name: the worker lived ${lived} ms after SIGKILL; memory in use: ${base:-?} MiB before, ${held:-?} MiB" \
    "held, ${after:-?} MiB after"
  ended "$worker" && [ "$lived" -le 1000 ] && [ -n "$after" ] && [ "$after" = "$base" ] &&
    [ "${held:-0}" -ge $((base + 64)) ]
  verdict "a guest killed with $name: its worker ends within 1 s and its memory is free" $?
done
through "$bin/drv_isolation" --work 5
verdict "ivcudad serves the next guest" $?
finish
