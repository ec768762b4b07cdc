#!/usr/bin/env bash
# staged_copy_test through ivcudad with staging areas cut into many small
# slots (and once natively on the same driver, to check the test itself).
#
#   run_staged_copy.sh BUILD_DIR DRIVER_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
prog=$build/tests/bench/staged_copy_test
work=$(mktemp -d /tmp/ivcuda-staged.XXXXXX)
daemon=
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
failed=0

mkdir "$work/native" && ln -s "$(readlink -f "$driver")" "$work/native/libcuda.so.1"
if LD_LIBRARY_PATH=$work/native timeout 120 "$prog" >"$work/out" 2>&1; then
  echo "PASS native: $(tail -1 "$work/out")"
else
  cat "$work/out"; echo "FAIL native"; failed=1
fi

# 64K: four 16 KiB slots. 12K: two 4 KiB slots (the rest unused). 4K: one
# slot, every chunk waits for the one before. 8M: 2 MiB slots, big enough
# for the parallel memcpy (three threads: parts of uneven size).
for staging in 64K 12K 4K 8M; do
  threads=
  [ $staging = 8M ] && threads=3
  rm -f "$work/s"
  "$build/host-daemon/ivcudad" --socket "$work/s" --shm-size 256M --channels 4 --staging-size $staging \
    --driver "$driver" >"$work/log" 2>&1 &
  daemon=$!
  for _ in $(seq 100); do [ -S "$work/s" ] && break; sleep 0.05; done
  if IVCUDA_COPY_THREADS=$threads IVCUDA_SOCKET=$work/s LD_LIBRARY_PATH=$build/lib timeout 120 "$prog" --errors \
      >"$work/out" 2>&1; then
    echo "PASS ivcuda, staging $staging${threads:+, $threads copy threads}: $(tail -1 "$work/out")"
  else
    cat "$work/out"; echo "--- ivcudad log"; tail -20 "$work/log"; echo "FAIL ivcuda, staging $staging"; failed=1
  fi
  kill "$daemon"; wait "$daemon" 2>/dev/null; daemon=
done
exit $failed
