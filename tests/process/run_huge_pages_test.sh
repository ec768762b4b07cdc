#!/usr/bin/env bash
# Guests' memory on 2 MiB huge pages (ivcudad --huge-pages on): when the
# host's reserved pool (vm.nr_hugepages) holds enough free pages, the daemon
# says each guest's memory is on huge pages, and programs run on it in
# process mode (copies, kernels, staged pageable copies; cuMemHostRegister
# stages, with a line saying why); when the pool is short, the daemon falls
# back to 4 KiB pages with one warning and the same programs run. Which of
# the two applies is read from /proc/meminfo before the daemon starts; this
# script changes no host setting.
#
#   run_huge_pages_test.sh BUILD_DIR DRIVER_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
bin=$build/tests/bin
ptx=$build/tests/gpu_double/test_kernels.ptx
work=$(mktemp -d /tmp/ivcuda-huge.XXXXXX)
sock=$work/ivcudad.sock
log=$work/ivcudad.log
# shellcheck source=../lib/verdicts.sh
. "$(dirname "$0")/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"
expect_cases 6
cleanup() { stop_ivcudad; rm -rf "$work"; }
trap cleanup EXIT

# 128 MiB per guest: the guest and the warm worker's next guest, 128 pages in all.
free=$(awk '/^HugePages_Free:/ {print $2}' /proc/meminfo)
size_kb=$(awk '/^Hugepagesize:/ {print $2}' /proc/meminfo)
want=128
expect=fallback
if [ "${size_kb:-0}" = 2048 ] && [ "${free:-0}" -ge "$want" ]; then expect=huge; fi
echo "huge pages free: ${free:-none} of ${size_kb:-?} kB; expecting: $expect"

quota_mib=96  # the third guest checks its quota on this memory, and ends
# drv_quota counts what the guest allocates: no context charge (hostile_worker_test has that).
start_ivcudad "$log" --socket "$sock" --shm-size 128M --staging-size 2M --channels 4 \
  --driver "$driver" --nvml none --control-socket none --huge-pages on --mem-limit "${quota_mib}M" \
  --context-reserve 0 || exit 1
# guest NAME OUTFILE PROGRAM ARGS...: one case, judged by the program's own exit status and by
# ivcudad's log showing that very process served (a guest that found another libcuda.so.1 would
# pass without touching the pool).
guest() {
  local name=$1 out=$2 mark rc pid
  shift 2
  mark=$(log_mark "$log")
  rm -f "$work/pid"
  IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 120 "${tagged[@]}" "$work/pid" "$@" >"$out" 2>&1
  rc=$?
  pid=$(cat "$work/pid" 2>/dev/null)
  if [ $rc -eq 0 ] && ! served_by "$log" "${pid:-0}" "$mark"; then
    echo "not served by ivcudad: no hello from process ${pid:-?} in its log"
    rc=99
  fi
  [ $rc -ne 0 ] && cat "$out"
  verdict "$name ($expect): $(tail -1 "$out")" $rc
}

guest "drv_kernels runs" "$work/kernels" "$bin/drv_kernels" --ptx "$ptx"
# nvcc builds the runtime-API program without sanitizers: in a sanitizer build (IVCUDA_SANITIZE),
# the runtimes ivcuda's library needs are loaded first, as run_process_tests.sh does.
preload=${IVCUDA_SANITIZER_PRELOAD:-}  # the build's compiler's (tests/process/CMakeLists.txt)
guest "rt_basic (static cudart: pageable and page-locked copies) runs" "$work/rt" \
  env LD_PRELOAD="$preload" "$bin/rt_basic_static"
guest "a third guest runs, its ${quota_mib} MiB quota kept on every path" "$work/third" \
  env IVCUDA_CALL_STATS="$work/quota-calls.txt" "$bin/drv_quota" --quota-mib "$quota_mib"
# Its 1,000 and more cuMemGetInfo calls are answered in the guest from the worker's memory view
# (shm_abi.h, line 9), but for the first after each 100 ms.
n=$(awk '$2 == "MemGetInfo" { print $3 }' "$work/quota-calls.txt" 2>/dev/null)
[ -n "$n" ] && [ "$n" -lt 100 ]
rc=$?
[ $rc -ne 0 ] && cat "$work/quota-calls.txt"
verdict "the quota's view is answered in the guest: ${n:-no} cuMemGetInfo round trips" $rc
if [ $expect = huge ]; then
  n=$(grep -c "its memory is on 2 MiB huge pages" "$log")
  [ "$n" -ge 3 ]
  verdict "the daemon put each guest's memory on huge pages ($n guests and warm workers said so)" $?
  ! grep -q "no .* of 2 MiB huge pages" "$log"
  verdict "no fallback to 4 KiB pages while the pool had pages" $?
else
  [ "$(grep -c "of 2 MiB huge pages for guest" "$log")" = 1 ]
  verdict "too few huge pages: one warning, 4 KiB pages" $?
  ! grep -q "its memory is on 2 MiB huge pages" "$log"
  verdict "no guest claims huge pages it did not get" $?
fi
finish
