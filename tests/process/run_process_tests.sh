#!/usr/bin/env bash
# Process-mode end-to-end tests: ivcudad with a driver library (the GPU test
# double in CI, the real libcuda.so.1 on a GPU machine), and the unmodified
# driver-API test programs running through the guest libcuda.so.1.
#
#   run_process_tests.sh BUILD_DIR DRIVER_LIB
# Prints one line per case and "N passed, N failed" at the end.
set -u
build=$(cd "$1" && pwd)
driver=$2
bin=$build/tests/bin
ptx=$build/tests/gpu_double/test_kernels.ptx
fatbin=$build/tests/gpu_double/test_kernels.fatbin
work=$(mktemp -d /tmp/ivcuda-proc.XXXXXX)
sock=$work/ivcudad.sock
log=$work/ivcudad.log
# shellcheck source=../lib/verdicts.sh
. "$(dirname "$0")/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"

cleanup() {
  stop_ivcudad
  rm -rf "$work"
}
trap cleanup EXIT
# NVRTC's compile cache keeps its files here, not in the user's home (guest/compile_cache.cc).
export CUDA_CACHE_PATH=$work/cuda-cache

start_daemon() {
  # A second socket is a second tenant (drv_vmm_share and drv_pool_share --child-socket).
  # The double's processes (one per worker) share one "GPU" through a ledger,
  # so that drv_isolation sees another process's memory come and go.
  IVCUDA_DOUBLE_LEDGER=$work/ledger start_ivcudad --append "$log" --socket "$sock" --shm-size 512M --staging-size 4M \
    --channels 16 --guest-socket "$work/other.sock=0" --driver "$driver" || exit 1
}

# Runs a program with ivcuda's libcuda.so.1 on the library path; its process
# id lands in $work/pid, so that the daemon's log can prove it was served.
through_ivcuda() { through_ivcuda_as "$work/pid" "$@"; }
through_ivcuda_as() {  # PIDFILE PROGRAM ARGS...
  local pidfile=$1; shift
  IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 120 "${tagged[@]}" "$pidfile" "$@"
}
# case_ivcuda NAME ENV... -- PROGRAM ARGS...: one case, run through ivcuda.
# It passes when the program exits 0 and ivcudad served that very process
# (a program that found another libcuda.so.1 would never say hello).
case_ivcuda() {
  local name=$1; shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  rm -f "$work/pid"
  local mark
  mark=$(log_mark "$log")
  env "${envs[@]}" IVCUDA_SOCKET="$sock" timeout 300 "${tagged[@]}" "$work/pid" "$@" >"$work/out" 2>&1
  local rc=$?
  [ $rc -eq 0 ] && ! served_here "$mark" "$work/pid" && rc=99
  [ $rc -ne 0 ] && cat "$work/out"
  verdict "$name" $rc
}
# served_here MARK PIDFILE: ivcudad's log, past MARK, has the hello of the process in PIDFILE.
served_here() {
  local pid
  pid=$(cat "$2" 2>/dev/null)
  served_by "$log" "${pid:-0}" "$1" && return 0
  echo "not served by ivcudad: no hello from process ${pid:-?} in its log"
  return 1
}
lib=LD_LIBRARY_PATH=$build/lib

start_daemon

# drv_isolation --reclaim wants all of its child's memory back, less what others took meanwhile:
# with a real driver, each of the two workers the daemon starts for its two processes (the next
# warm worker) holds a context, measured here as nvidia-smi lists the daemon's warm worker. The
# double's contexts cost the same each (16 MiB, tests/gpu_double/README.md): the one warm worker
# that can start after the child said it holds is paid for by the child's own context coming back
# with its memory, so with the double nothing may stay taken.
reclaim_allow=0
if ! [[ $driver == *gpu-double* ]] && command -v nvidia-smi >/dev/null; then
  for _ in $(seq 100); do grep -q "started ahead for" "$log" && break; sleep 0.1; done
  reclaim_allow=$((2 * $(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits |
    awk -F', *' '$2 ~ /ivcudad$/ && $3 > m { m = $3 } END { print m + 0 }')))
fi
# drv_host_polls times launch calls against kernels that run inside them: the double's way.
double_flag=
[[ $driver == *gpu-double* ]] && double_flag=--double
# The driver-API programs, one case each: "name|program and arguments" (one word per argument).
drv_cases=(
  "drv_core (LD_LIBRARY_PATH)|drv_core"
  "drv_kernels: PTX JIT, fatbin, launches, streams, events|drv_kernels --ptx $ptx --fatbin $fatbin"
  "drv_graphs: stream-ordered memory, capture and graphs, cooperative launch, printf|drv_graphs --ptx $ptx"
  "drv_hostfunc: host functions and stream callbacks in stream order|drv_hostfunc --ptx $ptx"
  "drv_library: libraries loaded with no context current, used in two contexts|drv_library --fatbin $fatbin --ptx $ptx"
  "drv_library: a kernel taken in one context launched in another|drv_library --fatbin $fatbin --ptx $ptx --cross-context-only"
  "drv_errors: bad input, async error, faulting kernel|drv_errors --ptx $ptx --fault --forged-handles"
  "drv_hostreg: registered heap/stack/global memory and shared mappings shared with running kernels|drv_hostreg --ptx $ptx --shared-devptr"
  "drv_query_order: cuMemGetInfo answered ahead of the work queued before it|drv_query_order --ptx $ptx"
  "drv_host_polls: posted calls behind a kernel that polls page-locked memory are taken before they return|drv_host_polls --ptx $ptx $double_flag"
  "drv_vmm: reserve (clear of the process's own memory), create, map twice (aliasing), access, copies and a kernel through a mapping|drv_vmm --ptx $ptx --own-range"
  "drv_vmm_share: an fd-exported allocation imported and written by another process of the tenant|drv_vmm_share"
  "drv_vmm_share: another tenant's process cannot import it (CUDA_ERROR_UNKNOWN)|drv_vmm_share --child-socket $work/other.sock"
  "drv_capture_modes: one thread captures while another allocates (thread-local, relaxed, global)|drv_capture_modes"
  "drv_devices: every device's attributes, bus id both ways, properties, primary context|drv_devices"
  "drv_memops: stream waits and writes on device and page-locked words, a batch, bad addresses|drv_memops"
  "drv_isolation --fault: a process that faults leaves another one's work correct|drv_isolation --fault --ptx $ptx"
  "drv_isolation --reclaim: a SIGKILLed process's device memory is all free within 1 s|drv_isolation --reclaim --mib 256 --allow-mib $reclaim_allow"
  "drv_isolation --foreign: another process's pointer and stream are refused|drv_isolation --foreign"
  "drv_ctx_timing: contexts made, reset and torn down beside each other in eleven guest processes|drv_ctx_timing --rounds 1 --mib 16"
  "drv_arrays: arrays (1D/2D/3D, mipmapped), copies with them, texture and surface objects|drv_arrays --ptx $ptx --destroyed-handles"
  "drv_sparse: sparse 2D/3D/mipmapped and deferred-mapping arrays, tiles mapped, copied, unmapped; refusals|drv_sparse --forged-handles"
  "drv_pools: created pools, attributes, access, allocations used by kernels, destroy, refusals|drv_pools --ptx $ptx --hostile --unsupported"
  "drv_pool_share: a pool and a pointer exported to another process of the tenant, imported, written, freed|drv_pool_share --ptx $ptx --forged"
  "drv_pool_share: another tenant's process cannot import the pool|drv_pool_share --child-socket $work/other.sock"
  "drv_ipc: memory and an event shared with a child process (another worker), forged handles refused|drv_ipc --ptx $ptx --forged CUDA_ERROR_INVALID_HANDLE"
  "drv_graph_build: graphs built node by node, queried, launched, updated, cloned; forged handles|drv_graph_build --ptx $ptx --limits"
  "drv_link: relocatable PTX linked at run time (data and file), loaded, launched; unresolved and bad inputs|drv_link --dir $(dirname "$ptx")"
  "drv_managed: managed memory the CPU and kernels take turns on, copies, threads, graphs, advice, attach|drv_managed --ptx $ptx"
  "drv_batches: batches of 1D and 3D copies (pointers, arrays, pitches), the failing index, refusals|drv_batches"
  "drv_green: SMs split, green contexts, their streams, kernels and events; forged resources refused|drv_green --ptx $ptx --forged"
)
# Runtime-API programs, each in its static and its shared cudart build: "program|what it shows".
rt_kinds=(static shared)
rt_programs=(
  "rt_basic|runtime API"
  "rt_graphs|graphs built with the runtime API"
  "rt_texture|cudaMallocArray, 2D copies to and from it, tex2D and surf2Dwrite"
  "rt_ipc|cudaIpc memory and event handles between two processes"
  "rt_nvbench_pattern|NVBench's blocking kernel released by a CPU store"
)
# rt_features' sections, as its own table names them (tests/runtime/rt_features.cu): what each
# build must list, and run section by section.
mapfile -t rt_sections < <(grep -o '{"[a-z0-9_]*", section_' "$(dirname "$0")/../runtime/rt_features.cu" | cut -d'"' -f2)
libs=(lib_cublas lib_cublaslt lib_cufft lib_curand lib_nvrtc)
preload_case=1
[ -n "${IVCUDA_SANITIZE:-}" ] && preload_case=0
# Every row of the tables; each runtime program, rt_features' list and its sections in both
# builds; each library; and the cases written out one by one below: four call-log pairs (8),
# the stage trace's pair (2), three about function attributes answered in the guest,
# drv_core preloaded (unless a sanitizer build), drv_host_polls --off, five about guests,
# workers and the daemon, and three about NVRTC's compile cache.
expect_cases $((${#drv_cases[@]} + ${#rt_kinds[@]} * (${#rt_programs[@]} + 1 + ${#rt_sections[@]}) + ${#libs[@]} \
  + 8 + 2 + 3 + preload_case + 1 + 5 + 3))

for entry in "${drv_cases[@]}"; do
  read -ra cmd <<<"${entry#*|}"
  case_ivcuda "${entry%%|*}" "$lib" -- "$bin/${cmd[0]}" "${cmd[@]:1}"
done
# IVCUDA_HOST_POLLS=off: posted calls never wait to be taken.
case_ivcuda "drv_host_polls --off: IVCUDA_HOST_POLLS=off keeps every posted call posted" "$lib" \
  "IVCUDA_HOST_POLLS=off" -- "$bin/drv_host_polls" --ptx "$ptx" $double_flag --off
# IVCUDA_LOG_ERRORS: at exit, every call that failed, by function and error.
case_ivcuda "IVCUDA_LOG_ERRORS lists the failed calls by function" "$lib" \
  "IVCUDA_LOG_ERRORS=$work/errors.txt" -- "$bin/drv_errors" --ptx "$ptx"
grep -q "FAILED cuMemFree.* -> CUDA_ERROR_INVALID_VALUE: [0-9]* call(s)" "$work/errors.txt"
rc=$?
[ $rc -ne 0 ] && cat "$work/errors.txt"
verdict "  ... and the list names cuMemFree's INVALID_VALUE" $rc
# IVCUDA_LOG_UNSUPPORTED: at exit, every call that answered NOT_SUPPORTED, counted.
case_ivcuda "IVCUDA_LOG_UNSUPPORTED lists the unsupported calls" "$lib" \
  "IVCUDA_LOG_UNSUPPORTED=$work/unsupported.txt" -- "$bin/drv_errors" --call-unsupported
grep -q "NOT_SUPPORTED cuGraphicsUnregisterResource (not forwarded): 2 call(s)" "$work/unsupported.txt"
rc=$?
[ $rc -ne 0 ] && cat "$work/unsupported.txt"
verdict "  ... and the list names cuGraphicsUnregisterResource, 2 calls" $rc
# IVCUDA_CALL_STATS: at exit, the requests by kind, round trips and times.
# drv_core asks its primary context's state six times: only the first crosses.
case_ivcuda "IVCUDA_CALL_STATS: drv_core's primary context states" "$lib" \
  "IVCUDA_CALL_STATS=$work/core-calls.txt" -- "$bin/drv_core"
grep -Eq "^ivcuda: PrimaryGetState +1 +1 " "$work/core-calls.txt"
rc=$?
[ $rc -ne 0 ] && cat "$work/core-calls.txt"
verdict "  ... and one of them was a round trip (the state is the process's own)" $rc
# drv_roundtrip makes 100 + 2 x 10 cuEventQuery round trips here, and as many queries of its
# idle stream, of which only the first crosses (guest/idle_streams.cc).
case_ivcuda "IVCUDA_CALL_STATS counts the requests by kind" "$lib" \
  "IVCUDA_CALL_STATS=$work/calls.txt" -- "$bin/drv_roundtrip" --rounds 10 --gap-us 1
grep -Eq "^ivcuda: EventQuery +120 +120 +[0-9.]+ +[0-9.]+$" "$work/calls.txt" &&
  grep -Eq "^ivcuda: StreamQuery +1 +1 +[0-9.]+ +[0-9.]+$" "$work/calls.txt"
rc=$?
[ $rc -ne 0 ] && cat "$work/calls.txt"
verdict "  ... and the table counts 120 EventQuery round trips and 1 StreamQuery" $rc
# IVCUDA_TRACE_STAGES: the same round trips by stage, the guest's stamps and
# the worker's (proto StageTrace): a row of 120 EventQuery calls with every
# column a number (process mode: one time-stamp counter, so `in` and `back` too).
case_ivcuda "IVCUDA_TRACE_STAGES times the round trips by stage" "$lib" \
  "IVCUDA_TRACE_STAGES=$work/stages.txt" -- "$bin/drv_roundtrip" --rounds 10 --gap-us 1
grep -q "round trips by stage (IVCUDA_TRACE_STAGES; medians in ns; guest and worker read one time-stamp counter)" \
  "$work/stages.txt" &&
  awk '$2 == "EventQuery" && $3 == 120 && $8 == "|" { ok = 1
         for (i = 4; i <= 13; i++) if (i != 8 && $i !~ /^-?[0-9]+$/) ok = 0
         if ($11 + 0 <= 0) ok = 0   # the handler: the call into the driver double
         found = ok }
       END { exit found ? 0 : 1 }' "$work/stages.txt"
rc=$?
[ $rc -ne 0 ] && cat "$work/stages.txt"
verdict "  ... and the table has 120 EventQuery calls with the guest's and the worker's stages" $rc
# drv_kernels, for each of its three modules (PTX from a file, PTX with JIT options, a fatbin),
# asks ivc_vec_add's threads per block once and its reduction kernel's eight fixed attributes
# five times each: 41 queries a module, of which 9 cross (guest/modules.cc); with
# IVCUDA_FUNC_ATTR_ANSWERS=off all of them do.
case_ivcuda "IVCUDA_CALL_STATS: drv_kernels' fixed function attributes" "$lib" \
  "IVCUDA_CALL_STATS=$work/attr-calls.txt" -- "$bin/drv_kernels" --ptx "$ptx" --fatbin "$fatbin"
on=$(awk '$2 == "FuncGetAttribute" { print $3 }' "$work/attr-calls.txt")
case_ivcuda "  ... the same program with IVCUDA_FUNC_ATTR_ANSWERS=off" "$lib" "IVCUDA_FUNC_ATTR_ANSWERS=off" \
  "IVCUDA_CALL_STATS=$work/attr-calls-off.txt" -- "$bin/drv_kernels" --ptx "$ptx" --fatbin "$fatbin"
off=$(awk '$2 == "FuncGetAttribute" { print $3 }' "$work/attr-calls-off.txt")
echo "cuFuncGetAttribute round trips: ${on:-?} answered in the guest's way, ${off:-?} with IVCUDA_FUNC_ATTR_ANSWERS=off"
[ "${on:-0}" -eq 27 ] && [ "${off:-0}" -eq 123 ]
verdict "  ... and 27 of its 123 queries crossed (the first of each function's fixed attribute), all 123 with the switch off" $?
if [ -n "${IVCUDA_SANITIZE:-}" ]; then
  # A sanitizer runtime must be the first library loaded; preloading an
  # instrumented libcuda.so.1 ahead of it is refused by design: not a case here.
  echo "N/A drv_core (LD_PRELOAD): a sanitizer build cannot be preloaded ($IVCUDA_SANITIZE)"
else
  case_ivcuda "drv_core (LD_PRELOAD)" "LD_PRELOAD=$build/lib/libcuda.so.1" -- "$bin/drv_core"
fi

# Runtime-API programs, static and shared cudart, unchanged. nvcc builds
# them without sanitizers: in a sanitizer build, the runtimes our library
# needs must be loaded first: the build's compiler's (IVCUDA_SANITIZER_PRELOAD, tests/process/CMakeLists.txt).
rt_env_preload="LD_PRELOAD=${IVCUDA_SANITIZER_PRELOAD:-}" rt_env_path="LD_LIBRARY_PATH=$build/lib:/usr/local/cuda/lib64"
for entry in "${rt_programs[@]}"; do
  for kind in "${rt_kinds[@]}"; do
    prog=$bin/${entry%%|*}_$kind
    name="${entry%%|*}: ${entry#*|}, $kind cudart"
    if [ ! -x "$prog" ]; then not_run "$name" "not built (no nvcc)"; continue; fi
    case_ivcuda "$name" "$rt_env_preload" "$rt_env_path" -- "$prog"
  done
done

# rt_features: runtime-API features section by section (one process each, so that a crash or
# a poisoned context stays in its section). Each build must list exactly the sections of the
# program's table, and there must be some.
for kind in "${rt_kinds[@]}"; do
  prog=$bin/rt_features_$kind
  if [ ! -x "$prog" ]; then
    not_run "rt_features ($kind cudart) lists its sections" "not built (no nvcc)"
    for section in "${rt_sections[@]}"; do not_run "rt_features $section, $kind cudart" "not built (no nvcc)"; done
    continue
  fi
  env "$rt_env_path" "$prog" --list >"$work/sections" 2>&1
  rc=$?
  [ $rc -eq 0 ] && [ ${#rt_sections[@]} -gt 0 ] && [ "$(cat "$work/sections")" = "$(printf '%s\n' "${rt_sections[@]}")" ]
  listed=$?
  [ $listed -ne 0 ] && { echo "rt_features_$kind --list (exit $rc) gave:"; cat "$work/sections"; }
  verdict "rt_features ($kind cudart) lists the ${#rt_sections[@]} sections of its table" $listed
  for section in "${rt_sections[@]}"; do
    case_ivcuda "rt_features $section, $kind cudart" "$rt_env_preload" "$rt_env_path" -- "$prog" --only "$section"
  done
done

# The toolkit's libraries (cuBLAS, cuBLASLt, cuFFT, cuRAND, NVRTC). The GPU test double runs
# none of their SASS: against it, a daemon whose double loads SASS-only and compressed images
# and skips kernels it has no CPU version of, and the programs in flow-only mode (every call
# succeeds, data round-trips; library results not compared: tests/libs/README.md).
libs_flow=
case "$driver" in
  *gpu-double*) libs_flow=--flow-only ;;
esac
if [ -n "$libs_flow" ]; then
  stop_ivcudad
  IVCUDA_DOUBLE_UNKNOWN_KERNELS=skip start_daemon
fi
for p in "${libs[@]}"; do
  if [ ! -x "$bin/$p" ]; then not_run "$p" "not built (no nvcc or no library)"; continue; fi
  # shellcheck disable=SC2086 # no flag is no word
  case_ivcuda "$p ${libs_flow:-(results compared)}" "$rt_env_preload" "$rt_env_path" -- "$bin/$p" $libs_flow
done
# NVRTC's compile cache in the guest (guest/compile_cache.h): lib_nvrtc compiles its program a
# second time, and NVRTC takes both stages from the cache (IVCUDA_CALL_STATS counts the hits).
if [ -x "$bin/lib_nvrtc" ]; then
  rm -f "$work/nvrtc.stats"
  # shellcheck disable=SC2086 # no flag is no word
  case_ivcuda "lib_nvrtc, to count the compile cache's hits" "$rt_env_preload" "$rt_env_path" IVCUDA_CALL_STATS="$work/nvrtc.stats" -- \
    "$bin/lib_nvrtc" $libs_flow
  hits=$(sed -n 's/.*compile cache (NVRTC, nvJitLink): [0-9]* lookups, \([0-9]*\) hits.*/\1/p' "$work/nvrtc.stats" 2>/dev/null)
  [ "${hits:-0}" -ge 2 ]
  verdict "NVRTC compiles a program again from the guest's compile cache (${hits:-no} hits)" $?
  # lib_nvrtc ran before (the libraries above): this process finds what that one compiled in the
  # guest's cache directory (CUDA_CACHE_PATH, set above), its first compile too.
  disk=$(sed -n 's/.*compile cache (NVRTC, nvJitLink): .*, \([0-9]*\) hits from the cache directory.*/\1/p' \
    "$work/nvrtc.stats" 2>/dev/null)
  files=$(find "$CUDA_CACHE_PATH" -name '*.ivc' 2>/dev/null | wc -l)
  [ "${disk:-0}" -ge 2 ] && [ "$files" -ge 2 ]
  verdict "a later process takes NVRTC's output from the guest's cache directory (${disk:-no} hits, $files files)" $?
else
  not_run "lib_nvrtc, to count the compile cache's hits" "not built"
  not_run "NVRTC compiles a program again from the guest's compile cache" "not built"
  not_run "a later process takes NVRTC's output from the guest's cache directory" "not built"
fi
if [ -n "$libs_flow" ]; then
  stop_ivcudad
  start_daemon
fi

# Two guests at once: isolated memory, both correct, both served.
mark=$(log_mark "$log")
rm -f "$work/pid1" "$work/pid2"
through_ivcuda_as "$work/pid1" "$bin/drv_kernels" --ptx "$ptx" >"$work/o1" 2>&1 & p1=$!
through_ivcuda_as "$work/pid2" "$bin/drv_core" >"$work/o2" 2>&1 & p2=$!
wait $p1; r1=$?; wait $p2; r2=$?
[ $r1 -eq 0 ] && ! served_here "$mark" "$work/pid1" && r1=99
[ $r2 -eq 0 ] && ! served_here "$mark" "$work/pid2" && r2=99
[ $r1 -ne 0 ] && cat "$work/o1"; [ $r2 -ne 0 ] && cat "$work/o2"
verdict "two guests at once" $((r1 | r2))

# A guest killed in the middle of its calls: the daemon reclaims its worker
# and keeps serving everybody else. The victim says "ready" once its copies
# run; the kill must be what ended it (SIGKILL: status 137 through timeout).
# Reclaimed: the worker ended, or (killed between two calls, with nothing
# under way) it reset its contexts and was kept for the next guest
# (--recycle-workers; tests/process/run_recycle_test.sh).
reclaims() { grep -cE "ended \(status|is kept for the next guest" "$log"; }
before=$(reclaims)
rm -f "$work/pid"
through_ivcuda "$bin/drv_errors" --spin-forever >"$work/out" 2>&1 & victim=$!
ok=1
for _ in $(seq 200); do grep -q '^ready' "$work/out" && { ok=0; break; }; sleep 0.05; done
[ $ok -ne 0 ] && { echo "the victim never said ready:"; cat "$work/out"; }
victim_pid=$(cat "$work/pid" 2>/dev/null)
kill -0 "$victim_pid" 2>/dev/null || { ok=1; echo "the victim was not running when it was to be killed"; }
kill -9 "$victim_pid"; wait $victim; vrc=$?
[ $vrc -eq 137 ] || { ok=1; echo "the victim ended with status $vrc, not by SIGKILL (137)"; }
reclaimed=1
for _ in $(seq 100); do
  [ "$(reclaims)" -gt "$before" ] && { reclaimed=0; break; }; sleep 0.05
done
[ $reclaimed -eq 0 ] || { ok=1; echo "its worker did not end"; }
kill -0 "$ivcudad_pid" 2>/dev/null || ok=1
through_ivcuda "$bin/drv_core" >"$work/out" 2>&1 || ok=1
verdict "guest killed mid-call: worker reclaimed, daemon serves on" $ok

# The reverse: a worker killed under a running guest (a crash of the worker).
# The guest's next call fails at once with CUDA_ERROR_DEVICE_UNAVAILABLE: the
# daemon hangs up on the guest when it reaps the worker, whatever the dead
# worker's io_uring still holds.
rm -f "$work/pid"
through_ivcuda "$bin/drv_errors" --spin-forever >"$work/out" 2>&1 & victim=$!
ok=1
for _ in $(seq 200); do grep -q '^ready' "$work/out" && { ok=0; break; }; sleep 0.05; done
guest_pid=$(cat "$work/pid" 2>/dev/null)
worker=$(grep "process $guest_pid says hello" "$log" | tail -1 | grep -o "worker g[0-9]*" | head -1)
# (the connection line names a cold worker; a warm entry's process names its worker on a line of its own)
wpid=$(grep -E "guest ${worker#worker g}( \(uid [0-9]+\) connected|: worker pid)" "$log" | grep -o "worker pid [0-9]*" |
  tail -1 | awk '{print $3}')
[ -n "$wpid" ] && kill -9 "$wpid" || { ok=1; echo "no worker found for process $guest_pid"; }
ended=1
for _ in $(seq 100); do kill -0 "$guest_pid" 2>/dev/null || { ended=0; break; }; sleep 0.02; done
wait $victim 2>/dev/null
[ $ended -eq 0 ] || { ok=1; echo "the guest did not notice within 2 s"; kill -9 "$guest_pid" 2>/dev/null; }
grep -q "CUDA_ERROR_DEVICE_UNAVAILABLE" "$work/out" || { ok=1; echo "the guest did not report CUDA_ERROR_DEVICE_UNAVAILABLE:"; cat "$work/out"; }
through_ivcuda "$bin/drv_core" >"$work/out" 2>&1 || ok=1
verdict "worker killed under a running guest: the guest's calls fail at once, the daemon serves on" $ok

# No driver at all: cuInit fails cleanly with NO_DEVICE, no hang.
IVCUDA_SOCKET=$work/nobody.sock LD_LIBRARY_PATH=$build/lib timeout 30 "$bin/drv_errors" --expect-no-device \
  >"$work/out" 2>&1; rc=$?
[ $rc -ne 0 ] && cat "$work/out"
verdict "no daemon: cuInit returns CUDA_ERROR_NO_DEVICE" $rc

# The daemon goes away under a running guest: calls fail, nothing hangs;
# a restarted daemon serves new guests.
through_ivcuda "$bin/drv_errors" --spin-forever --expect-daemon-loss >"$work/out" 2>&1 & victim=$!
for _ in $(seq 200); do grep -q '^ready' "$work/out" && break; sleep 0.05; done
stop_ivcudad
wait $victim; rc=$?
[ $rc -ne 0 ] && cat "$work/out"
start_daemon
through_ivcuda "$bin/drv_core" >"$work/out" 2>&1 || { rc=1; cat "$work/out"; }
verdict "daemon restart: running guest fails cleanly, new guest served" $rc

echo "--- ivcudad log (last lines) ---"
tail -n 15 "$log"
finish
