#!/usr/bin/env bash
# The main job: set up, build, start ivcudad on this machine's GPU and run a
# CUDA program through ivcuda.
#   tools/run.sh                       the bundled driver-API demo programs
#   tools/run.sh PROGRAM [ARGS...]     your own program, unchanged
# Environment: IVCUDA_DRIVER (default libcuda.so.1, the NVIDIA driver) selects
# the driver ivcudad loads; IVCUDA_SHM_SIZE (default 1G) the memory per guest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash tools/install-deps.sh --build
export PATH=/usr/local/cuda/bin:$PATH
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target ivcudad ivcuda_guest drv_core drv_kernels \
  ivcuda_gpu_double_kernels >/dev/null
build=$root/build/default
driver=${IVCUDA_DRIVER:-libcuda.so.1}
if [ "$driver" = libcuda.so.1 ] && ! ldconfig -p | grep -q 'libcuda.so.1 '; then
  echo "run.sh: no NVIDIA driver (libcuda.so.1) on this machine: ivcudad needs a GPU." >&2
  echo "        To try the transport without one: IVCUDA_DRIVER=$build/tests/gpu_double/libivcuda-gpu-double.so $0" >&2
  exit 1
fi
sock=$(mktemp -u /tmp/ivcudad.XXXXXX.sock)
log=${sock%.sock}.log
"$build/host-daemon/ivcudad" --socket "$sock" --shm-size "${IVCUDA_SHM_SIZE:-1G}" --driver "$driver" \
  >"$log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null; rm -f "$sock"' EXIT
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || { cat "$log"; exit 1; }
echo "ivcudad is serving on $sock (log: $log)"
run() { IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"; }
if [ $# -gt 0 ]; then
  run "$@"
else
  run "$build/tests/bin/drv_core"
  run "$build/tests/bin/drv_kernels" --ptx "$build/tests/gpu_double/test_kernels.ptx"
fi
