#!/usr/bin/env bash
# staged_copy_test through ivcudad with staging areas cut into many small
# slots (and once natively on the same driver, to check the test itself).
#
#   run_staged_copy.sh BUILD_DIR DRIVER_LIB CONFIG...
# CONFIG: "native" (the test itself on the driver), or a staging size with an
# optional event delay in microseconds ("64K", "64K,300"; see below).
set -u
build=$(cd "$1" && pwd)
driver=$2
shift 2
if [ $# -eq 0 ]; then echo "FAIL: no configuration given"; exit 1; fi
prog=$build/tests/bench/staged_copy_test
ptx=$build/tests/gpu_double/test_kernels.ptx
work=$(mktemp -d /tmp/ivcuda-staged.XXXXXX)
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"
cleanup() {
  stop_ivcudad
  rm -rf "$work"
}
trap cleanup EXIT
failed=0
if [ ! -f "$ptx" ]; then
  echo "FAIL: no test kernels at $ptx (build the ivcuda_gpu_double_kernels target)"
  exit 1
fi

ran=0
for config in "$@"; do
  [ "$config" = native ] || continue
  mkdir "$work/native" && ln -s "$(readlink -f "$driver")" "$work/native/libcuda.so.1"
  if LD_LIBRARY_PATH=$work/native timeout 120 "$prog" --ptx "$ptx" >"$work/out" 2>&1; then
    echo "PASS native: $(tail -1 "$work/out")"
  else
    cat "$work/out"; echo "FAIL native"; failed=1
  fi
  ran=$((ran + 1))
done

# 64K: four 16 KiB slots. 12K: two 4 KiB slots (the rest unused). 4K: one
# slot, every chunk waits for the one before. 8M: 2 MiB slots, big enough
# for the parallel memcpy (three threads: parts of uneven size). With a
# delay the double holds every event in flight that long after its record,
# as a GPU holds a DMA, so the worker's chunks complete later than they are
# issued: 300 us with four small slots keeps them queued; 3 ms with big ones
# makes the guest's waits for a slot fall back to Flush (after 2 ms).
for config in "$@"; do
  [ "$config" != native ] || continue
  ran=$((ran + 1))
  staging=${config%%,*}
  delay=
  [ "$config" != "$staging" ] && delay=${config#*,}
  threads=
  [ $staging = 8M ] && threads=3
  # The long copy: 4096 chunks of 4 KiB slots (16 MiB) as of 16 KiB ones
  # (64 MiB); 64 MiB through 4 KiB slots took a TSan run three times as long
  # and reused each slot no differently.
  long_mib=64
  case $staging in 4K|12K) long_mib=16 ;; esac
  what="staging $staging, a long copy of $long_mib MiB${threads:+, $threads copy threads}${delay:+, events done ${delay} us after their record}"
  if ! IVCUDA_GPU_DOUBLE_EVENT_DELAY_US=$delay start_ivcudad "$work/log" --socket "$work/s" --shm-size 256M \
      --channels 4 --staging-size $staging --driver "$driver"; then
    echo "FAIL ivcuda, $what"; failed=1
    continue
  fi
  if IVCUDA_COPY_THREADS=$threads IVCUDA_SOCKET=$work/s LD_LIBRARY_PATH=$build/lib timeout 280 "$prog" \
      --ptx "$ptx" --errors --ordering --long-mib $long_mib >"$work/out" 2>&1; then
    echo "PASS ivcuda, $what: $(tail -1 "$work/out")"
  else
    cat "$work/out"; echo "--- ivcudad log"; tail -20 "$work/log"; echo "FAIL ivcuda, $what"; failed=1
  fi
  stop_ivcudad
done
# Every configuration named ran (a typo is not a pass).
[ "$ran" -eq $# ] || { echo "FAIL: $ran of $# configurations ran"; failed=1; }
exit $failed
