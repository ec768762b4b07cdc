#!/usr/bin/env bash
# The NVBench set of nvbench-configs/ builds against the pip wheel cuda-bench[cu13] on this
# machine, GPU or not: run.sh --build-only into BUILD_DIR, then the executable is checked to link
# the wheel's libnvbench.so and the CUDA runtime statically (so that, run with ivcuda's
# libcuda.so.1 on the library path, it reaches the driver through ivcuda).
# Needs what nvbench-configs/setup.sh fetches (tools/install-deps.sh runs it): without the wheel
# or a new enough CMake it exits 77, saying so - a failure unless IVCUDA_ALLOW_SKIPS made 77
# CTest's "skipped".
#   usage: build_against_wheel.sh BUILD_DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:?usage: build_against_wheel.sh BUILD_DIR}

bash "$root/nvbench-configs/run.sh" --build-only --build-dir "$build" --cuda-arch 90 2>"$build.err"
rc=$?
cat "$build.err" >&2
if ((rc == 3)); then
  echo "cannot build here: $(tail -n 1 "$build.err") (IVCUDA_ALLOW_SKIPS=1 tools/test.sh lets it skip)" >&2
  exit 77
fi
((rc == 0)) || { echo "FAIL: run.sh --build-only exited $rc" >&2; exit 1; }

exe=$build/cmake/bin/ivcuda-nvbench
fail=0
check() { # WHAT STATUS
  if [[ $2 -eq 0 ]]; then echo "PASS $1"; else echo "FAIL $1"; fail=1; fi
}
needed=$(readelf -d "$exe" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
runpath=$(readelf -d "$exe" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
[[ $'\n'$needed$'\n' == *$'\n'libnvbench.so$'\n'* ]]
check "ivcuda-nvbench links libnvbench.so" $?
[[ $runpath == *"$build/wheel/cuda/bench/cu13/nvbench/lib"* ]]
check "its run path is the unpacked wheel's cu13 library folder ($runpath)" $?
! grep -q '^libcudart' <<<"$needed"
check "the CUDA runtime is linked statically (no libcudart.so needed)" $?
! grep -q '^libcuda\.so' <<<"$needed"
check "libcuda.so.1 is not linked: the runtime loads it at run time, where ivcuda's can be" $?
for b in sleep_1ms sleep_sweep launch_empty copy_d2d_kernel copy_h2d copy_d2h; do
  grep -aq "$b" "$exe"
  check "the executable holds benchmark $b" $?
done
# The guest leg with this executable: its libnvbench.so needs libnvidia-ml.so.1, which a guest
# has only from ivcuda's build (guest/nvml): with a build that lacks it, run.sh says so before it
# runs anything. (With stand-ins for nvidia-smi and ivcuda's build, which a GPU machine would have.)
fake=$build.fake
rm -rf "$fake" && mkdir -p "$fake/bin" "$fake/ivcuda/lib" "$fake/ivcuda/host-daemon"
printf '#!/bin/sh\necho "GPU 0: stand-in"\n' >"$fake/bin/nvidia-smi"
cp /bin/true "$fake/ivcuda/host-daemon/ivcudad"
: >"$fake/ivcuda/lib/libcuda.so.1"
chmod +x "$fake/bin/nvidia-smi"
msg=$(PATH=$fake/bin:$PATH bash "$root/nvbench-configs/run.sh" --exe "$exe" --modes native,guest \
  --ivcuda-build "$fake/ivcuda" --out "$fake/out" 2>&1)
rc=$?
[[ $rc -eq 3 && $msg == *"no guest NVML"*"ivcuda_nvml"* && ! -e $fake/out/native.json ]]
check "the guest leg stops before any run when ivcuda's build has no guest NVML library (exit $rc)" $?
rm -rf "$fake"
# A second run finds everything built: "build if needed".
before=$(stat -c %Y "$exe")
bash "$root/nvbench-configs/run.sh" --build-only --build-dir "$build" --cuda-arch 90 >/dev/null 2>&1
[[ $? -eq 0 && $(stat -c %Y "$exe") == "$before" ]]
check "a second --build-only rebuilds nothing" $?
exit $fail
