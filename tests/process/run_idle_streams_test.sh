#!/usr/bin/env bash
# Streams known to be idle are answered in the guest (guest/idle_streams.cc), and every answer
# is still the driver's. drv_idle_streams reads kernel results back behind busy streams, asks
# idle streams, makes them busy again, synchronises the context and begins a capture; the call
# table (IVCUDA_CALL_STATS) then shows that its synchronisations after each read back did not
# cross, and with IVCUDA_IDLE_ANSWERS=off that they all did. With the GPU test double the
# daemon runs with IVCUDA_GPU_DOUBLE_KERNEL_US=20000: a launch keeps its stream busy for 20 ms,
# so the workers meet streams with work in flight (the landing place of a small read back, its
# parked reply), and a wrong local answer would show as SUCCESS where NOT_READY is due.
#
#   run_idle_streams_test.sh BUILD_DIR DRIVER_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
bin=$build/tests/bin
ptx=$build/tests/gpu_double/test_kernels.ptx
work=$(mktemp -d /tmp/ivcuda-idle.XXXXXX)
sock=$work/ivcudad.sock
log=$work/ivcudad.log
# shellcheck source=../lib/verdicts.sh
. "$(dirname "$0")/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"
expect_cases 4
cleanup() { stop_ivcudad; rm -rf "$work"; }
trap cleanup EXIT

rounds=200
double_flag=
if [[ $driver == *gpu-double* ]]; then
  double_flag=--double
  rounds=40  # 20 ms a kernel
fi
IVCUDA_GPU_DOUBLE_KERNEL_US=20000 start_ivcudad "$log" --socket "$sock" --shm-size 128M \
  --staging-size 2M --channels 4 --driver "$driver" --nvml none --control-socket none || exit 1

# guest NAME OUTFILE ENV... -- PROGRAM ARGS...: one case, judged by the program's own exit status
# and by ivcudad's log showing that very process served.
guest() {
  local name=$1 out=$2 mark rc pid envs=()
  shift 2
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  mark=$(log_mark "$log")
  rm -f "$work/pid"
  env "${envs[@]}" IVCUDA_SOCKET="$sock" LD_LIBRARY_PATH="$build/lib" timeout 120 "${tagged[@]}" "$work/pid" "$@" \
    >"$out" 2>&1
  rc=$?
  pid=$(cat "$work/pid" 2>/dev/null)
  if [ $rc -eq 0 ] && ! served_by "$log" "${pid:-0}" "$mark"; then
    echo "not served by ivcudad: no hello from process ${pid:-?} in its log"
    rc=99
  fi
  [ $rc -ne 0 ] && cat "$out"
  verdict "$name: $(tail -1 "$out")" $rc
}
# sent FILE OP: how many requests of OP the call table in FILE lists as sent (0 when none).
sent() { awk -v op="$2" '$2 == op { n = $3 } END { print n + 0 }' "$1" 2>/dev/null; }

guest "drv_idle_streams: idle streams answered in the guest" "$work/on" \
  IVCUDA_CALL_STATS="$work/on-calls.txt" -- "$bin/drv_idle_streams" --ptx "$ptx" --rounds $rounds $double_flag
n=$(sent "$work/on-calls.txt" StreamSynchronize)
[ "$n" -lt 10 ]
rc=$?
[ $rc -ne 0 ] && cat "$work/on-calls.txt"
verdict "  ... and of its $rounds synchronisations after a read back, none crossed ($n StreamSynchronize sent in all)" $rc

guest "drv_idle_streams with IVCUDA_IDLE_ANSWERS=off: every query crosses" "$work/off" \
  IVCUDA_IDLE_ANSWERS=off IVCUDA_CALL_STATS="$work/off-calls.txt" -- \
  "$bin/drv_idle_streams" --ptx "$ptx" --rounds $rounds $double_flag
n=$(sent "$work/off-calls.txt" StreamSynchronize)
[ "$n" -ge "$rounds" ]
rc=$?
[ $rc -ne 0 ] && cat "$work/off-calls.txt"
verdict "  ... and all $rounds synchronisations crossed ($n StreamSynchronize sent)" $rc
finish
