#!/usr/bin/env bash
# Which system calls does a worker make with the real NVIDIA driver after the
# sandbox point (docs/security.md, "Sandbox")? Runs ivcudad with --sandbox off
# under strace, marks (IVCUDA_SANDBOX_TRACE_MARK=1) each worker's start and
# the point where the sandbox would close, runs a representative set of the
# GPU suite's programs through it, and prints every call made after that
# point against the allowlist (MISSING lines: calls the allowlist lacks), the
# files the workers opened, and which of those no Landlock rule covers.
# First it starts a sandboxed daemon once (two programs) to show its log lines
# and Landlock rules. Every program must run to its end and be served by the
# daemon (its hello in the log), and the trace must show the workers past the
# sandbox point (tests/gpu/worker_syscalls.py): a run where the programs failed
# to start, or strace followed nothing, fails.
#   bash tests/gpu/trace_worker_syscalls.sh      (from the repository root, after
#                                                 tests/gpu/run_gpu_suite.sh built build/gpu)
# Needs strace: the system's, or Debian's strace and libunwind8 .debs in .deps/
# (tests/gpu/fetch-deps.sh downloads them), unpacked here into /tmp.
# Writes worker-trace.txt, worker-syscalls.txt and the daemons' logs to $OUT.
# Elsewhere (against the GPU test double): IVCUDA_TRACE_BUILD=build/default
# IVCUDA_TRACE_DRIVER=.../libivcuda-gpu-double.so IVCUDA_TRACE_NO_BUILD=1.
set -u
root=$(pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
build=$(cd "${IVCUDA_TRACE_BUILD:-$root/build/gpu}" 2>/dev/null && pwd || echo "$root/build/gpu")
driver=${IVCUDA_TRACE_DRIVER:-libcuda.so.1}
deps=/tmp/ivcuda-deps
. "$root/tests/gpu/sandbox_mode.sh"  # --sandbox degraded below Landlock ABI 6, said here

. "$root/tests/gpu/strace_env.sh" || exit 1

if [ -n "${IVCUDA_TRACE_NO_BUILD:-}" ]; then
  :
elif [ ! -x "$build/host-daemon/ivcudad" ]; then
  echo "== building (build/gpu is not there: tests/gpu/run_gpu_suite.sh builds it)"
  rm -rf "$deps" && mkdir -p "$deps"
  for f in "$root"/.deps/*.deb; do dpkg -x "$f" "$deps"; done
  export PKG_CONFIG_SYSROOT_DIR=$deps PKG_CONFIG_PATH=$deps/usr/lib/x86_64-linux-gnu/pkgconfig
  export CPLUS_INCLUDE_PATH=$deps/usr/include LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$deps/usr" \
    >"$out/trace-configure.log" 2>&1 || { tail -30 "$out/trace-configure.log"; exit 1; }
fi
targets="ivcudad ivcuda_guest ivcuda_gpu_double_kernels drv_core drv_kernels drv_graphs drv_hostfunc drv_vmm_share
  drv_pools drv_pool_share drv_ipc drv_graph_build drv_errors drv_arrays drv_memops drv_library rt_basic rt_ipc lib_cublas"
# shellcheck disable=SC2086 # one word per target
[ -n "${IVCUDA_TRACE_NO_BUILD:-}" ] || cmake --build "$build" -j "$(nproc)" --target $targets >"$out/trace-build.log" 2>&1 ||
  { grep -E "error|Error" "$out/trace-build.log" | head -30; exit 1; }

bin=$build/tests/bin
ptx=$build/tests/gpu_double/test_kernels.ptx
fatbin=$build/tests/gpu_double/test_kernels.fatbin
# A socket of this run's own: another run of this script at the same time must not share it.
sockdir=$(mktemp -d /tmp/ivcuda-trace.XXXXXX)
trap 'rm -rf "$sockdir"' EXIT
sock=$sockdir/ivcudad.sock
programs=(
  "$bin/drv_core"
  "$bin/drv_kernels --ptx $ptx --fatbin $fatbin"
  "$bin/drv_library --fatbin $fatbin --ptx $ptx"
  "$bin/drv_graphs --ptx $ptx"
  "$bin/drv_hostfunc --ptx $ptx"
  "$bin/drv_vmm_share"
  "$bin/drv_pools --ptx $ptx"
  "$bin/drv_pool_share --ptx $ptx"
  "$bin/drv_ipc --ptx $ptx"
  "$bin/drv_graph_build --ptx $ptx"
  "$bin/drv_errors --ptx $ptx --fault"
  "$bin/drv_arrays --ptx $ptx"
  "$bin/drv_memops"
  "$bin/rt_basic_static"
  "$bin/rt_ipc_static"
  "$bin/lib_cublas"
)
# IVCUDA_TRACE_QUICK=1: three programs only (a short device lease).
[ "${IVCUDA_TRACE_QUICK:-}" = 1 ] && programs=("${programs[0]}" "${programs[1]}" "$bin/rt_basic_static")
shm=${IVCUDA_TRACE_SHM:-2G}
# shellcheck source=../lib/verdicts.sh
. "$root/tests/lib/verdicts.sh"
sandboxed=("$bin/drv_core" "$bin/drv_kernels --ptx $ptx --fatbin $fatbin")
# each program with the sandbox on, each traced, and the trace against the allowlist and
# against the Landlock rules
expect_cases $((${#sandboxed[@]} + ${#programs[@]} + 3))
run_programs() {  # WHAT LOG PROGRAM...: runs each through the daemon at $sock, one case each
  local what=$1 log=$2 p rc mark pid
  shift 2
  for p in "$@"; do
    if [ ! -x "${p%% *}" ]; then not_run "$what: ${p#"$bin"/}" "not built: ${p%% *}"; continue; fi
    mark=$(log_mark "$log")
    rm -f "$out/trace-prog.pid"
    # shellcheck disable=SC2086 # the entry is a command line
    IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 600 "${tagged[@]}" "$out/trace-prog.pid" $p \
      >"$out/trace-prog.out" 2>&1
    rc=$?
    pid=$(cat "$out/trace-prog.pid" 2>/dev/null)
    if [ $rc -eq 0 ] && ! served_by "$log" "${pid:-0}" "$mark"; then
      echo "  not served by ivcudad: no hello from process ${pid:-?} in $log"
      rc=99
    fi
    [ $rc -eq 0 ] || tail -5 "$out/trace-prog.out"
    verdict "$what: ${p#"$bin"/}" $rc
  done
}

echo "== one sandboxed worker (its Landlock rules, its log line)"
rm -f "$sock"
IVCUDA_SANDBOX_SELFTEST=1 "$build/host-daemon/ivcudad" --socket "$sock" --shm-size "$shm" --driver "$driver" \
  --log-level debug >"$out/ivcudad-sandboxed.log" 2>&1 &
daemon=$!
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
run_programs "sandboxed" "$out/ivcudad-sandboxed.log" "${sandboxed[@]}"
kill "$daemon"; wait "$daemon" 2>/dev/null
grep -E "sandbox|cannot" "$out/ivcudad-sandboxed.log" | grep -v "landlock rule" | sort -u | sed 's/^/  /'

echo "== tracing ivcudad --sandbox off (the workers' calls after the sandbox point)"
rm -f "$sock"
# ivcudad's own pid in traced.pid: SIGTERM to strace would leave the daemon running.
rm -f "$out/traced.pid"
IVCUDA_SANDBOX_TRACE_MARK=1 strace_run -f -qq -e raw=ioctl,fcntl,sched_setaffinity,prlimit64 -o "$out/worker-trace.txt" "${tagged[@]}" "$out/traced.pid" \
  "$build/host-daemon/ivcudad" --sandbox off --socket "$sock" --shm-size "$shm" --driver "$driver" \
  >"$out/ivcudad-trace.log" 2>&1 &
daemon=$!
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
run_programs "traced" "$out/ivcudad-trace.log" "${programs[@]}"
kill "$(cat "$out/traced.pid" 2>/dev/null || echo "$daemon")"; wait "$daemon" 2>/dev/null

echo "== the workers' system calls after the sandbox point, against the allowlist"
"$build/host-daemon/ivcudad" --print-syscall-allowlist >"$out/allowlist.txt"
# Every traced program's process has a worker of its own.
syscalls() {
  python3 "$root/tests/gpu/worker_syscalls.py" "$out/worker-trace.txt" "$out/allowlist.txt" \
    "$out/ivcudad-sandboxed.log" --min-workers ${#programs[@]} "$@"
}
syscalls --check syscalls >"$out/worker-syscalls.txt"
rc=$?
cat "$out/worker-syscalls.txt"
verdict "the workers' calls after the sandbox point (${#programs[@]} programs' workers at least) are all allowed" $rc
# The sandboxed workers say whether Landlock was in force ("landlock no (why)" where not).
no_landlock=$(grep -o "landlock no ([^)]*)*" "$out/ivcudad-sandboxed.log" | head -1)
if [ -n "$no_landlock" ]; then
  not_run "the paths the workers opened after the sandbox point are all under Landlock rules" \
    "the sandboxed workers ran without Landlock: $no_landlock"
else
  syscalls --check landlock | grep -E "^(LANDLOCK\?|FAIL) "
  rc=${PIPESTATUS[0]}
  verdict "the paths the workers opened after the sandbox point are all under Landlock rules" $rc
fi
# Calls the filter narrows by their arguments (ioctl, fcntl, affinity, limits): what the driver
# asked of them that the filter would refuse.
python3 "$root/tests/gpu/worker_arguments.py" "$out/worker-trace.txt"
rc=$?
verdict "the workers' ioctl, fcntl, sched_setaffinity and prlimit64 calls pass the filter's argument rules" $rc
finish
