#!/usr/bin/env bash
# ivcuda-bench --quick against the GPU test double, "natively" (the double as
# the program's libcuda.so.1) and through ivcudad: every figure must be there,
# and the bench itself proves its ivcuda children served (--daemon-log). The
# death part reads device memory through the NVML test double, over the GPU
# double's ledger.
#   bench_smoke.sh BUILD_DIR GPU_DOUBLE NVML_DOUBLE
set -euo pipefail
build=$(cd "$1" && pwd)
double=$2
nvml=$3
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"
work=$(mktemp -d /tmp/ivcuda-bench.XXXXXX)
export IVCUDA_DOUBLE_LEDGER=$work/ledger
trap 'stop_ivcudad; rm -rf "$work"' EXIT
mkdir "$work/native" && ln -s "$(readlink -f "$double")" "$work/native/libcuda.so.1"
start_ivcudad "$work/log" --socket "$work/s" --shm-size 256M --channels 8 --staging-size 4M --driver "$double" ||
  { echo "FAIL: ivcudad did not start"; exit 1; }
LD_LIBRARY_PATH=$work/native "$build/bench/ivcuda-bench" --quick --ptx "$build/tests/gpu_double/test_kernels.ptx" \
  --native-lib "$work/native" --ivcuda-lib "$build/lib" --socket "$work/s" --daemon-log "$work/log" --json "$work/bench.json" \
  --png "$work/bench.png" --startup-gap-ms 200 | tee "$work/out"
LD_LIBRARY_PATH=$work/native "$build/bench/ivcuda-bench" --quick --only death --ptx "$build/tests/gpu_double/test_kernels.ptx" \
  --native-lib "$work/native" --ivcuda-lib "$build/lib" --socket "$work/s" --daemon-log "$work/log" --nvml-lib "$nvml" |
  tee -a "$work/out"
for fig in null.ctx_synchronize.median null.stream_query.p99 launch.empty.rate launch.10us.rate \
           sleep.100us.task sleep.1000us.task_p99 htod.pinned.1024KiB htod.pageable.4KiB \
           dtoh.pageable.16384KiB dtoh.pinned.16384KiB dtod.1024KiB htod.memfd_registered.1024KiB \
           dtoh.memfd_registered.16384KiB 8procs.crowd.launch.rate \
           8procs.crowd.htod.pinned 8procs.crowd.dtoh.pageable graph10.rate graph10.kernel_rate \
           vmm.htod.pinned.1024KiB vmm.dtoh.pinned.1024KiB vmm.dtod.1024KiB startup.first_result \
           startup.exit smallop.kernel_then_item.median smallop.chain10_sync.median \
           startup.b2b5.first_result startup.b2b5.first_result_p90 startup.burst4.first_result_p90 \
           startup.spread8.first_result_max death.idle.memory_back death.queued.memory_back \
           death.kernel.memory_back_max managed.turn managed.kernel_untouched managed.first_touch; do
  grep -q "^$fig " "$work/out" || { echo "FAIL: $fig missing"; exit 1; }
done
python3 -c "import json,sys; d=json.load(open('$work/bench.json')); assert len(d['figures']) > 20, d; \
assert [x['name'] for x in d['derived']][-1] == 'sleep.1000us.overhead', d['derived']"
[ "$(head -c 8 "$work/bench.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || { echo "FAIL: no PNG"; exit 1; }
echo "PASS: ivcuda-bench smoke"
