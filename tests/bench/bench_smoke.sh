#!/usr/bin/env bash
# ivcuda-bench --quick against the GPU test double, "natively" (the double as
# the program's libcuda.so.1) and through ivcudad: every figure must be there.
set -eu
build=$(cd "$1" && pwd)
double=$2
work=$(mktemp -d /tmp/ivcuda-bench.XXXXXX)
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -rf "$work"' EXIT
mkdir "$work/native" && ln -s "$(readlink -f "$double")" "$work/native/libcuda.so.1"
"$build/host-daemon/ivcudad" --socket "$work/s" --shm-size 256M --channels 8 --staging-size 4M \
  --driver "$double" >"$work/log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$work/s" ] && break; sleep 0.05; done
LD_LIBRARY_PATH=$work/native "$build/bench/ivcuda-bench" --quick --ptx "$build/tests/gpu_double/test_kernels.ptx" \
  --native-lib "$work/native" --ivcuda-lib "$build/lib" --socket "$work/s" --json "$work/bench.json" | tee "$work/out"
for fig in null.ctx_synchronize.median launch.empty.rate sleep.100us.task htod.pinned.1024KiB \
           dtoh.pageable.16384KiB dtod.1024KiB 8procs.crowd.launch.rate; do
  grep -q "^$fig " "$work/out" || { echo "FAIL: $fig missing"; exit 1; }
done
python3 -c "import json,sys; d=json.load(open('$work/bench.json')); assert len(d['figures']) > 20, d" 
echo "PASS: ivcuda-bench smoke"
