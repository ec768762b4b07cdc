#!/usr/bin/env bash
# Everything the GPU machine is needed for, in one device-tool call:
#   the driver-API/runtime suite native vs ivcuda (run_gpu_suite.sh), the TCG
#   guest next to the real GPU (run_vm_on_gpu.sh) and ivcuda-bench.
# The device tool returns at most 8 files: the summaries go to $OUT as text,
# every log into one tarball.
#   usage (repository root): bash tests/gpu/run_all.sh [suite|vm|multi|bench ...]
set -u
root=$(pwd)
final=${OUT:-$root/out}
mkdir -p "$final"
work=$(mktemp -d /tmp/ivcuda-all.XXXXXX)
parts=${*:-suite vm bench}
start=$SECONDS
stamp() { echo "-- $1 done at +$((SECONDS - start)) s"; }

for part in $parts; do
  case $part in
  suite)
    OUT=$work/suite timeout 420 bash tests/gpu/run_gpu_suite.sh 2>&1 | tee "$final/suite.txt"
    stamp suite ;;
  vm)
    OUT=$work timeout 300 bash tests/gpu/run_vm_on_gpu.sh build/gpu 2>&1 | tee "$final/vm.txt"
    stamp vm ;;
  multi)
    OUT=$work timeout 400 bash tests/gpu/run_multi_gpu.sh build/gpu 2>&1 | tee "$final/multi.txt"
    stamp multi ;;
  bench)
    build=$root/build/gpu
    if [ ! -f "$build/CMakeCache.txt" ]; then  # bench alone: configure as the suite does
      deps=/tmp/ivcuda-deps
      mkdir -p "$deps" && for f in "$root"/.deps/*.deb; do dpkg -x "$f" "$deps"; done
      export PKG_CONFIG_SYSROOT_DIR=$deps PKG_CONFIG_PATH=$deps/usr/lib/x86_64-linux-gnu/pkgconfig
      export CPLUS_INCLUDE_PATH=$deps/usr/include LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu
      cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$deps/usr" \
        >"$work/bench-configure.log" 2>&1 || { tail -20 "$work/bench-configure.log"; continue; }
    fi
    cmake --build "$build" -j "$(nproc)" --target ivcuda-bench ivcudad ivcuda_guest ivcuda_gpu_double_kernels \
      >"$work/bench-build.log" 2>&1 || { tail -20 "$work/bench-build.log"; continue; }
    sock=/tmp/ivcuda-bench.sock
    rm -f "$sock"
    "$build/host-daemon/ivcudad" --socket "$sock" --shm-size 4G --channels 8 --driver libcuda.so.1 \
      >"$work/bench-ivcudad.log" 2>&1 &
    daemon=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
    timeout 300 "$build/bench/ivcuda-bench" --ptx "$build/tests/gpu_double/test_kernels.ptx" \
      --ivcuda-lib "$build/lib" --socket "$sock" --json "$final/bench.json" 2>&1 | tee "$final/bench.txt"
    kill $daemon; wait $daemon 2>/dev/null
    if [ -f "$root/bench/plot.py" ] && [ -s "$final/bench.json" ]; then
      python3 "$root/bench/plot.py" "$final/bench.json" "$final/bench.png" || echo "plot failed"
    fi
    stamp bench ;;
  *) echo "unknown part $part" ;;
  esac
done
tar czf "$final/logs.tgz" -C "$work" . 2>/dev/null
echo "== all parts done in $((SECONDS - start)) s"
