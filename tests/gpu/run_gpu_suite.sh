#!/usr/bin/env bash
# The GPU-machine suite: builds everything there, runs the driver-API test
# programs natively and through ivcuda (process mode, the real driver behind
# ivcudad), compares them, runs the process-mode end-to-end script against
# the real driver, and the ring benchmark. One call of the device tool:
#   bash tests/gpu/run_gpu_suite.sh            (from the repository root)
# A comparison passes when both runs exit 0, their outputs are identical and
# ivcudad's log shows that the ivcuda run's very process said hello to a
# worker (a program that found the system's libcuda.so.1 instead would agree
# with native and prove nothing). The exit status is the verdict: every case
# the lists below make must pass (IVCUDA_GPU_QUICK=1 leaves out the
# process-mode script and the ring benchmark, and says so). IVCUDA_GPU_ONLY="drv_vmm ..."
# builds and compares just those programs (and runs the bypass control): a re-check.
# IVCUDA_GPU_PREBUILT=DIR runs what tools/gpu-bundle.sh built elsewhere (a carried bundle, for a
# lease too short to build in), with the same cases; it says so in the machine section.
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

set -o pipefail
only=${IVCUDA_GPU_ONLY:-}
if [ -n "${IVCUDA_GPU_PREBUILT:-}" ]; then
  build=$(cd "$IVCUDA_GPU_PREBUILT" && pwd) || exit 1
  echo "prebuilt: $build ($(cat "$build/BUNDLE" 2>/dev/null || echo "no BUNDLE note"))"
else
  echo "== unpacking build dependencies"
  rm -rf "$deps" && mkdir -p "$deps"
  for f in "$root"/.deps/*.deb; do dpkg -x "$f" "$deps"; done
  export PKG_CONFIG_SYSROOT_DIR=$deps
  export PKG_CONFIG_PATH=$deps/usr/lib/x86_64-linux-gnu/pkgconfig
  export CPLUS_INCLUDE_PATH=$deps/usr/include
  export LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu

  echo "== build"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$deps/usr" \
    >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
  core=$(grep -v "^#" "$root/tests/gpu/suite-targets.txt" | tr "\n" " ")
  [ -n "${IVCUDA_GPU_QUICK:-}" ] || [ -n "$only" ] || core="$core ivcuda-ring-bench"
  # (a runtime program's two builds, NAME_static and NAME_shared, are one target NAME)
  [ -z "$only" ] || core="ivcudad ivcuda_guest drv_core ivcuda_gpu_double_kernels $(echo "$only" | sed -E 's/_(static|shared)( |$)/\2/g')"
  cmake --build "$build" -j "$jobs" --target $core >"$out/build.log" 2>&1 ||
    { grep -E "error|Error" "$out/build.log" | head -30; exit 1; }
  echo "built: $core"
fi

bin=$build/tests/bin
ptx=$build/tests/gpu_double/test_kernels.ptx
fatbin=$build/tests/gpu_double/test_kernels.fatbin
sock=/tmp/ivcuda-gpu.sock
rm -f "$sock"
"$build/host-daemon/ivcudad" --socket "$sock" --shm-size 2G --driver libcuda.so.1 >"$out/ivcudad.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done

# shellcheck source=../lib/verdicts.sh
. "$root/tests/lib/verdicts.sh"
log=$out/ivcudad.log
compare() {  # name, then the program and its arguments
  local name=$1; shift
  local extra=${extra_libs:-} mark pid rc=0
  LD_LIBRARY_PATH=$extra timeout 300 "$@" >"$out/$name.native" 2>&1; local rn=$?
  rm -f "$out/$name.pid"
  mark=$(log_mark "$log")
  IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib${extra:+:$extra} timeout 300 "${tagged[@]}" "$out/$name.pid" "$@" \
    >"$out/$name.ivcuda" 2>&1; local ri=$?
  pid=$(cat "$out/$name.pid" 2>/dev/null)
  [ $rn -eq 0 ] && [ $ri -eq 0 ] || rc=1
  diff -q "$out/$name.native" "$out/$name.ivcuda" >/dev/null || rc=1
  if ! served_by "$log" "${pid:-0}" "$mark"; then
    echo "  no hello from process ${pid:-?} in ivcudad's log: not served by ivcuda"
    rc=1
  fi
  [ $rc -eq 0 ] || diff "$out/$name.native" "$out/$name.ivcuda" | head -20
  verdict "$name: native rc=$rn, ivcuda rc=$ri, outputs $([ $rc -eq 0 ] && echo agree || echo differ or unserved) ($(tail -1 "$out/$name.ivcuda"))" $rc
}
# What a worker's context takes on the GPU (MiB): what the warm worker the log says was started
# holds, as nvidia-smi lists the daemon's processes (workers are ivcudad, forked). drv_isolation
# --reclaim allows that much, for each of the two workers the daemon starts for its two
# processes (each connection takes the warm worker and starts the next), to stay taken after its
# child died: the rest must come back.
worker_context_mib() {
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits 2>/dev/null |
    awk -F', *' '$2 ~ /ivcudad$/ && $3 > m { m = $3 } END { print m + 0 }'
}
for _ in $(seq 100); do grep -q "started ahead for" "$log" && break; sleep 0.1; done
reclaim_allow=$((2 * $(worker_context_mib)))
echo "a worker's context: $((reclaim_allow / 2)) MiB (drv_isolation --reclaim --allow-mib $reclaim_allow)"
# The programs compared: "name|program and arguments|extra library path".
programs=(
  "drv_core|$bin/drv_core|"
  "drv_kernels|$bin/drv_kernels --ptx $ptx --fatbin $fatbin|"
  "drv_library|$bin/drv_library --fatbin $fatbin --ptx $ptx|"
  "drv_library_xctx|$bin/drv_library --fatbin $fatbin --ptx $ptx --cross-context-only|"
  "drv_graphs|$bin/drv_graphs --ptx $ptx|"
  "drv_vmm|$bin/drv_vmm --ptx $ptx --own-range|"
  "drv_vmm_share|$bin/drv_vmm_share|"
  "drv_capture_modes|$bin/drv_capture_modes|"
  "drv_memops|$bin/drv_memops|"
  "drv_isolation_fault|$bin/drv_isolation --fault --ptx $ptx|"
  "drv_isolation_reclaim|$bin/drv_isolation --reclaim --mib 1024 --allow-mib $reclaim_allow --report $out/reclaim.txt|"
  "drv_arrays|$bin/drv_arrays --ptx $ptx|"
  "drv_sparse|$bin/drv_sparse|"
  "rt_texture|$bin/rt_texture_static|"
  "drv_pools|$bin/drv_pools --ptx $ptx|"
  "drv_pool_share|$bin/drv_pool_share --ptx $ptx|"
  "drv_ipc|$bin/drv_ipc --ptx $ptx|"
  "drv_graph_build|$bin/drv_graph_build --ptx $ptx|"
  "drv_link|$bin/drv_link --dir $(dirname "$ptx") --cubin|"
  "drv_managed|$bin/drv_managed --ptx $ptx|"
  "drv_batches|$bin/drv_batches|"
  "drv_green|$bin/drv_green --ptx $ptx|"
  "drv_hostfunc|$bin/drv_hostfunc --ptx $ptx|"
  "drv_errors|$bin/drv_errors --ptx $ptx|"
  "drv_fault|$bin/drv_errors --ptx $ptx --fault|"
  "drv_peer|$bin/drv_peer|"
  "rt_basic_static|$bin/rt_basic_static|"
  "drv_hostreg|$bin/drv_hostreg --ptx $ptx --shared-devptr|"
  "drv_query_order|$bin/drv_query_order --ptx $ptx|"
  "rt_nvbench_pattern_static|$bin/rt_nvbench_pattern_static|"
  "rt_basic_shared|$bin/rt_basic_shared|/usr/local/cuda/lib64"
  "rt_ipc_static|$bin/rt_ipc_static|"
  "rt_ipc_shared|$bin/rt_ipc_shared|/usr/local/cuda/lib64"
  "rt_graphs_static|$bin/rt_graphs_static|"
  "rt_graphs_shared|$bin/rt_graphs_shared|/usr/local/cuda/lib64"
  "rt_features_shared|$bin/rt_features_shared|/usr/local/cuda/lib64"
)
libs=(lib_cublas lib_cublaslt lib_cufft lib_curand lib_nvrtc)
quick=${IVCUDA_GPU_QUICK:-}
if [ -n "$only" ]; then
  kept=()
  for entry in "${programs[@]}"; do
    case " $only " in *" ${entry%%|*} "*) kept+=("$entry") ;; esac
  done
  programs=("${kept[@]}") libs=() quick=1
  # only those programs and the bypass control
  expect_cases $((${#programs[@]} + 1))
else
  # rt_features (static cudart) runs section by section: a crash or a poisoned context stays
  # in its section. Its sections are its own table's (tests/runtime/rt_features.cu).
  mapfile -t sections < <(grep -o '{"[a-z0-9_]*", section_' "$root/tests/runtime/rt_features.cu" | cut -d'"' -f2)
  # each program, the section list and each section, each library, the bypass control; the
  # process-mode script unless quick
  expect_cases $((${#programs[@]} + 1 + ${#sections[@]} + ${#libs[@]} + 1 + (quick ? 0 : 1)))
fi

echo "== driver-API, runtime-API and library programs, native vs ivcuda (real GPU behind ivcudad)"
for entry in "${programs[@]}"; do
  IFS='|' read -r name cmd extra <<<"$entry"
  # shellcheck disable=SC2086 # one word per argument
  extra_libs=$extra compare "$name" $cmd
done
if [ -z "$only" ]; then
  "$bin/rt_features_static" --list >"$out/rt_features.list" 2>&1; rc=$?
  [ $rc -eq 0 ] && [ ${#sections[@]} -gt 0 ] && [ "$(cat "$out/rt_features.list")" = "$(printf '%s\n' "${sections[@]}")" ]
  listed=$?
  verdict "rt_features_static lists the ${#sections[@]} sections of its table (exit $rc)" $listed
  for section in "${sections[@]}"; do
    compare "rt_features_static_$section" "$bin/rt_features_static" --only "$section"
  done
fi
for p in "${libs[@]}"; do
  if [ -x "$bin/$p" ]; then extra_libs=/usr/local/cuda/lib64 compare "$p" "$bin/$p"; else not_run "$p" "not built"; fi
done
# The check above must catch a program that did not go through ivcuda: run one
# with the library path pointing away from ivcuda's library (it then finds this
# machine's driver) and expect no hello from it.
rm -f "$out/bypass.pid"
mark=$(log_mark "$log")
IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=/nonexistent timeout 120 "${tagged[@]}" "$out/bypass.pid" "$bin/drv_core" \
  >"$out/bypass.out" 2>&1
bypass=$(cat "$out/bypass.pid")
# It must have run (a pid), and run to its end on the machine's driver, unseen by ivcudad.
[ -n "$bypass" ] && grep -q "checks, 0 failed" "$out/bypass.out" && ! served_by "$log" "$bypass" "$mark"; rc=$?
verdict "control: a program that bypassed ivcuda is caught (no hello from its process $bypass)" $rc
kill $daemon; wait $daemon 2>/dev/null

if [ -n "$quick" ]; then
  echo "== quick or only: the process-mode script and the ring benchmark are not run"
else
  echo "== process-mode end-to-end script against the real driver"
  bash "$root/tests/process/run_process_tests.sh" "$build" libcuda.so.1 >"$out/process.log" 2>&1
  rc=$?
  grep -E "^(FAIL|SKIP)" "$out/process.log"
  verdict "process-mode script with the real driver: $(tail -1 "$out/process.log")" $rc
  if [ -x "$build/bench/ivcuda-ring-bench" ]; then
    echo "== ring benchmark (figures, not a case)"
    "$build/bench/ivcuda-ring-bench" 2>&1 | tee "$out/ring-bench.txt" | tail -20
  fi
fi
echo "== suite summary:"
finish
