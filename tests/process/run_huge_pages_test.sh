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
daemon_pid=
# shellcheck source=../lib/verdicts.sh
. "$(dirname "$0")/../lib/verdicts.sh"
expect_cases 5
cleanup() { [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

# 128 MiB per guest: the guest and the warm worker's next guest, 128 pages in all.
free=$(awk '/^HugePages_Free:/ {print $2}' /proc/meminfo)
size_kb=$(awk '/^Hugepagesize:/ {print $2}' /proc/meminfo)
want=128
expect=fallback
if [ "${size_kb:-0}" = 2048 ] && [ "${free:-0}" -ge "$want" ]; then expect=huge; fi
echo "huge pages free: ${free:-none} of ${size_kb:-?} kB; expecting: $expect"

"$build/host-daemon/ivcudad" --socket "$sock" --shm-size 128M --staging-size 2M --channels 4 \
  --driver "$driver" --nvml none --control-socket none --huge-pages on >"$log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
guest() { IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 120 "$@"; }

guest "$bin/drv_kernels" --ptx "$ptx" >"$work/kernels" 2>&1
verdict "drv_kernels runs ($expect): $(tail -1 "$work/kernels")" $?
guest "$bin/rt_basic_static" >"$work/rt" 2>&1
verdict "rt_basic (static cudart: pageable and page-locked copies) runs ($expect): $(tail -1 "$work/rt")" $?
guest "$bin/drv_quota" --hold-mib 4 >"$work/pageable" 2>&1
verdict "a third guest runs ($expect): $(tail -1 "$work/pageable")" $?
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
