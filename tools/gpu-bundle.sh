#!/usr/bin/env bash
# Builds here what tests/gpu/run_gpu_suite.sh runs (tests/gpu/suite-targets.txt) and puts it in
# DIR with a build tree's layout - host-daemon/ivcudad, lib/, bin/, tests/bin/, tests/gpu_double/'s
# kernels - stripped, to carry to the GPU machine when its lease is too short to build there:
#   tools/gpu-bundle.sh DIR                 then, there: IVCUDA_GPU_PREBUILT=DIR bash tests/gpu/run_gpu_suite.sh
# Built as the GPU suite builds (RelWithDebInfo, then stripped) without libmicrohttpd (the GPU machine has none); liburing and libseccomp are
# linked statically, as always. Programs built on Debian 12 run on the GPU machine's newer glibc.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: tools/gpu-bundle.sh DIR}
build=build/gpu-bundle
mkdir -p build
mapfile -t targets < <(grep -v '^#' tests/gpu/suite-targets.txt)
# and what run_all.sh's other parts build (lifecycle, speed, mps, nvml, absent, cost), read from it
mapfile -t -O "${#targets[@]}" targets < <(grep -o 'build_gpu [a-z_ -]*' tests/gpu/run_all.sh |
  tr ' ' '\n' | grep -vx 'build_gpu\|' | sort -u)
export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIVCUDA_METRICS=OFF >"$build.configure.log" 2>&1 ||
  { tail -20 "$build.configure.log"; exit 1; }
cmake --build "$build" -j "${IVCUDA_JOBS:-$(nproc)}" --target "${targets[@]}" ivcuda-ring-bench
rm -rf "$out" && mkdir -p "$out/host-daemon" "$out/lib" "$out/bin" "$out/bench" "$out/tests/bin" "$out/tests/gpu_double"
cp "$build/host-daemon/ivcudad" "$build/host-daemon/ivcudactl" "$out/host-daemon/"
cp "$build/bench/ivcuda-bench" "$build/bench/ivcuda-compute-share" "$build/bench/ivcuda-ring-bench" "$out/bench/"
cp -a "$build/lib/." "$out/lib/"
cp "$build"/tests/bin/* "$out/tests/bin/"
cp "$build"/bin/* "$out/bin/"
cp "$build"/tests/gpu_double/*.ptx "$build"/tests/gpu_double/*.fatbin "$build"/tests/gpu_double/*.cubin "$out/tests/gpu_double/"
find "$out" -type f -perm -u+x -exec strip --strip-unneeded {} + 2>/dev/null || true
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+changes') built $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME")" >"$out/BUNDLE"
du -sh "$out"
