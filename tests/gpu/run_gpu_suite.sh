#!/usr/bin/env bash
# The GPU-machine suite: builds everything there, runs the driver-API test
# programs natively and through ivcuda (process mode, the real driver behind
# ivcudad), compares them, runs the process-mode end-to-end script against
# the real driver, and the ring benchmark. One call of the device tool:
#   bash tests/gpu/run_gpu_suite.sh            (from the repository root)
# Needs the Debian packages in .deps/ (liburing, Catch2, CLI11), which
# `tests/gpu/fetch-deps.sh` downloads on a Debian machine.
set -u
root=$(pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
deps=/tmp/ivcuda-deps
build=$root/build/gpu
jobs=$(nproc)

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
nvcc --version | tail -1
g++ --version | head -1
cmake --version | head -1

echo "== unpacking build dependencies"
rm -rf "$deps" && mkdir -p "$deps"
for f in "$root"/.deps/*.deb; do dpkg -x "$f" "$deps"; done
export PKG_CONFIG_SYSROOT_DIR=$deps
export PKG_CONFIG_PATH=$deps/usr/lib/x86_64-linux-gnu/pkgconfig
export CPLUS_INCLUDE_PATH=$deps/usr/include
export LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu

echo "== build"
set -o pipefail
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$deps/usr" \
  >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
core="ivcudad ivcuda_guest drv_core drv_kernels drv_library drv_errors drv_devices drv_graphs drv_peer drv_hostfunc rt_basic ivcuda_gpu_double_kernels drv_hostreg rt_nvbench_pattern rt_features lib_cublas lib_cublaslt lib_cufft lib_curand lib_nvrtc"
[ -n "${IVCUDA_GPU_QUICK:-}" ] || core="$core ivcuda-ring-bench"
cmake --build "$build" -j "$jobs" --target $core >"$out/build.log" 2>&1 ||
  { grep -E "error|Error" "$out/build.log" | head -30; exit 1; }
echo "built: $core"

bin=$build/tests/bin
ptx=$build/tests/gpu_double/test_kernels.ptx
fatbin=$build/tests/gpu_double/test_kernels.fatbin
sock=/tmp/ivcuda-gpu.sock
rm -f "$sock"
"$build/host-daemon/ivcudad" --socket "$sock" --shm-size 2G --driver libcuda.so.1 >"$out/ivcudad.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done

pass=0 fail=0
compare() {  # name, then the program and its arguments
  local name=$1; shift
  local extra=${extra_libs:-}
  LD_LIBRARY_PATH=$extra timeout 300 "$@" >"$out/$name.native" 2>&1; local rn=$?
  IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib${extra:+:$extra} timeout 300 "$@" >"$out/$name.ivcuda" 2>&1; local ri=$?
  if [ $rn -eq 0 ] && [ $ri -eq 0 ] && diff -q "$out/$name.native" "$out/$name.ivcuda" >/dev/null; then
    echo "PASS $name: native and ivcuda agree ($(tail -1 "$out/$name.ivcuda"))"; pass=$((pass + 1))
  else
    echo "FAIL $name: native rc=$rn, ivcuda rc=$ri"; fail=$((fail + 1))
    diff "$out/$name.native" "$out/$name.ivcuda" | head -20
  fi
}
echo "== driver-API programs, native vs ivcuda (real H200 behind ivcudad)"
compare drv_core "$bin/drv_core"
compare drv_kernels "$bin/drv_kernels" --ptx "$ptx" --fatbin "$fatbin"
compare drv_library "$bin/drv_library" --fatbin "$fatbin" --ptx "$ptx"
compare drv_graphs "$bin/drv_graphs" --ptx "$ptx"
compare drv_hostfunc "$bin/drv_hostfunc" --ptx "$ptx"
compare drv_errors "$bin/drv_errors" --ptx "$ptx"
compare drv_fault "$bin/drv_errors" --ptx "$ptx" --fault
compare drv_peer "$bin/drv_peer"
compare rt_basic_static "$bin/rt_basic_static"
compare drv_hostreg "$bin/drv_hostreg" --ptx "$ptx"
compare rt_nvbench_pattern_static "$bin/rt_nvbench_pattern_static"
extra_libs=/usr/local/cuda/lib64 compare rt_basic_shared "$bin/rt_basic_shared"
# rt_features section by section (a crash or a poisoned context stays in its section), the
# shared-cudart build whole; then the libraries, with their results compared.
for section in $("$bin/rt_features_static" --list); do
  compare "rt_features_static_$section" "$bin/rt_features_static" --only "$section"
done
extra_libs=/usr/local/cuda/lib64 compare rt_features_shared "$bin/rt_features_shared"
for p in lib_cublas lib_cublaslt lib_cufft lib_curand lib_nvrtc; do
  if [ -x "$bin/$p" ]; then extra_libs=/usr/local/cuda/lib64 compare "$p" "$bin/$p"; else echo "SKIP $p: not built"; fi
done
kill $daemon; wait $daemon 2>/dev/null

if [ -n "${IVCUDA_GPU_QUICK:-}" ]; then echo "== summary: $pass passed, $fail failed (quick)"; exit 0; fi
echo "== process-mode end-to-end script against the real driver"
bash "$root/tests/process/run_process_tests.sh" "$build" libcuda.so.1 2>&1 | tee "$out/process.log" | tail -12

if [ -x "$build/bench/ivcuda-ring-bench" ]; then
  echo "== ring benchmark"
  "$build/bench/ivcuda-ring-bench" 2>&1 | tee "$out/ring-bench.txt" | tail -20
fi
echo "== summary: $pass passed, $fail failed"
