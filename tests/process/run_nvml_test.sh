#!/usr/bin/env bash
# The guest's NVML (guest/nvml: libnvidia-ml.so.1) and ivcuda-smi in process
# mode, against ivcudad with the GPU test double and the NVML test double
# (--nvml): tests/programs/nvml_api.cc's checks (identity consistent with
# libcuda, the tenant's memory and processes, a second tenant invisible, bad
# handles and pointers, small buffers, setters refused, events), then
# ivcuda-smi's table, -L and --query-gpu as scripts read them, the quota as
# memory.total, and NVML refusing to start over a libcuda.so.1 that is not
# ivcuda's.
#   run_nvml_test.sh BUILD_DIR DRIVER_LIB NVML_DOUBLE_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
nvml=$3
bin=$build/tests/bin
smi=$build/bin/ivcuda-smi
work=$(mktemp -d /tmp/ivcuda-nvml.XXXXXX)
sock=$work/a.sock
log=$work/ivcudad.log
holder=
keep=
# shellcheck source=../lib/verdicts.sh
. "$(dirname "$0")/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"
expect_cases 9

cleanup() {
  [ -n "$keep" ] && kill "$keep" 2>/dev/null
  [ -n "$holder" ] && kill "$holder" 2>/dev/null
  stop_ivcudad
  rm -rf "$work"
}
trap cleanup EXIT

# What a context holds in the GPU double here (its default is 16 MiB): each
# worker holds one (the arena's), and NVML counts it, as on a GPU.
ctx_mib=24
start_daemon() {  # EXTRA ARGS...
  IVCUDA_GPU_DOUBLE_CONTEXT_MIB=$ctx_mib IVCUDA_DOUBLE_LEDGER=$work/ledger start_ivcudad --append "$log" --socket "$sock" \
    --shm-size 256M --staging-size 4M --channels 8 --driver "$driver" --nvml "$nvml" --control-socket "$work/control.sock" \
    "$@" || exit 1
}
guest() {  # PROGRAM ARGS... (output in $work/out)
  IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 120 "$@" >"$work/out" 2>&1
}
show() {  # RC: prints the output when RC is not 0, returns RC
  [ "$1" -ne 0 ] && cat "$work/out"
  return "$1"
}

start_daemon
IVCUDA_LOG_UNSUPPORTED=$work/unsupported.log IVCUDA_LOG_ERRORS=$work/errors.log guest "$bin/nvml_api"
show $?
verdict "nvml_api: identity as libcuda says it, the tenant's memory and processes, another tenant invisible, bad handles, small buffers, setters refused, events, the pass-through queries" $?

# What NVML answered that was not success, at the process's exit: a function nothing forwards
# (marked so), one the host's NVML refused (not marked), the setters' refusals and the host's
# INSUFFICIENT_SIZE in the errors' list - and no line for what succeeded.
rc=0
for want in "NOT_SUPPORTED nvmlDeviceGetActiveVgpus (not forwarded): 1 call(s)" \
  "NOT_SUPPORTED nvmlDeviceGetFanSpeed: "; do
  grep -qF "ivcuda-nvml: $want" "$work/unsupported.log" || { echo "missing in IVCUDA_LOG_UNSUPPORTED: $want"; rc=1; }
done
for want in "FAILED nvmlDeviceSetPersistenceMode -> Insufficient Permissions (4): 1 call(s)" \
  "FAILED nvmlDeviceGetInforomVersion -> Insufficient Size (7): " "FAILED nvmlDeviceGetActiveVgpus -> Not Supported (3)"; do
  grep -qF "ivcuda-nvml: $want" "$work/errors.log" || { echo "missing in IVCUDA_LOG_ERRORS: $want"; rc=1; }
done
if grep -q "nvmlDeviceGetPcieSpeed\|nvmlDeviceGetName" "$work/unsupported.log" "$work/errors.log"; then
  echo "a query that succeeded is listed"; rc=1
fi
[ $rc -ne 0 ] && cat "$work/unsupported.log" "$work/errors.log"
verdict "IVCUDA_LOG_UNSUPPORTED and IVCUDA_LOG_ERRORS list NVML's refusals at exit, by function, not forwarded marked" $rc

# Another tenant holds device memory while ivcuda-smi draws its table. The
# host's NVML lists every worker (each holds a context: this guest's, the
# other tenant's, the warm one); ivcuda-smi's view is its own process alone,
# by its pid, with its worker's context as its memory, and none of the other
# tenant's. (The holder holds until its stdin, a FIFO kept open by a sleeper,
# closes.)
mkfifo "$work/hold_in"
sleep 600 >"$work/hold_in" &
keep=$!
IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib "$bin/nvml_api" --hold 100 <"$work/hold_in" >"$work/hold" 2>&1 &
holder=$!
for _ in $(seq 200); do grep -q '^ready' "$work/hold" && break; sleep 0.05; done
# The shell says its pid, then becomes ivcuda-smi (by that name: the table
# shows the first word of /proc/PID/cmdline, cut to 54 columns).
guest bash -c 'echo "pid $$"; exec -a ivcuda-smi "$0"' "$smi"
rc=$?
smi_pid=$(sed -n 's/^pid //p' "$work/out")
rows=$(grep -Ec '^\| [0-9] +[0-9]+  ' "$work/out")
grep -q '^ready' "$work/hold" && [ $rc -eq 0 ] && [ -n "$smi_pid" ] &&
  grep -Eq "^\| 0 +.+ +[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.0 +$ctx_mib MiB / [0-9]+ MiB" "$work/out" &&
  grep -Eq "^\| 0 +$smi_pid  ivcuda-smi +${ctx_mib}MiB\|\$" "$work/out" && [ "$rows" -eq 1 ] &&
  ! grep -q 'No running processes found' "$work/out" && ! grep -q " $holder " "$work/out"
show $?
verdict "ivcuda-smi: the table (GPU, bus id, this tenant's memory: its context) and its own process alone (pid, name, memory), not another tenant's or the warm worker's" $?
kill "$keep" 2>/dev/null
wait "$holder" 2>/dev/null
holder= keep=

guest "$smi" -L
rc=$?
[ $rc -eq 0 ] && grep -Eq '^GPU 0: .+ \(UUID: GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\)$' "$work/out"
show $?
verdict "ivcuda-smi -L: GPU 0: NAME (UUID: GPU-...)" $?

fields=index,name,uuid,pci.bus_id,memory.total,memory.used,memory.free,utilization.gpu,temperature.gpu,power.draw,power.limit,driver_version
guest "$smi" --query-gpu=$fields --format=csv
rc=$?
[ $rc -eq 0 ] && head -1 "$work/out" | grep -qx 'index, name, uuid, pci.bus_id, memory.total \[MiB\], memory.used \[MiB\], memory.free \[MiB\], utilization.gpu \[%\], temperature.gpu, power.draw \[W\], power.limit \[W\], driver_version' &&
  sed -n 2p "$work/out" | grep -Eq '^0, .+, GPU-[0-9a-f-]{36}, [0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.0, [0-9]+ MiB, [0-9]+ MiB, [0-9]+ MiB, [0-9]+ %, [0-9]+, [0-9.]+ W, [0-9.]+ W, [0-9.]+$'
show $?
verdict "ivcuda-smi --query-gpu=... --format=csv: header with units, one line per GPU" $?

guest "$smi" --query-gpu=index,memory.total,power.draw --format=csv,noheader,nounits
rc=$?
[ $rc -eq 0 ] && grep -Eqx '0, [0-9]+, [0-9]+\.[0-9]{2}' "$work/out" && [ "$(wc -l <"$work/out")" -eq 1 ]
show $?
verdict "ivcuda-smi --format=csv,noheader,nounits: numbers only" $?

guest "$smi" --query-gpu=index,colour --format=csv
rc=$?
[ $rc -eq 2 ] && grep -q 'Field "colour" is not a valid field to query' "$work/out"
show $?
verdict "ivcuda-smi: an unknown field is refused (exit 2)" $?
stop_ivcudad

# A quota is the tenant's memory.total (the worker answers so), as cuMemGetInfo says it.
start_daemon --mem-limit 1G
guest "$smi" --query-gpu=memory.total --format=csv,noheader,nounits
rc=$?
[ $rc -eq 0 ] && grep -qx 1024 "$work/out"
show $?
verdict "ivcuda-smi: memory.total is the guest's quota (--mem-limit 1G: 1024 MiB)" $?
stop_ivcudad

# Over a libcuda.so.1 that is not ivcuda's (the toolkit's stub), NVML does not start.
stub=$(ls /usr/local/cuda/lib64/stubs/libcuda.so /usr/local/cuda/targets/*/lib/stubs/libcuda.so 2>/dev/null | head -1)
if [ -z "$stub" ]; then
  not_run "NVML over another libcuda.so.1: DRIVER_NOT_LOADED" "the toolkit's libcuda stub is not installed"
else
  mkdir -p "$work/other"
  ln -s "$stub" "$work/other/libcuda.so.1"
  ln -s "$build/lib/libnvidia-ml.so.1" "$work/other/libnvidia-ml.so.1"
  LD_LIBRARY_PATH=$work/other timeout 60 "$smi" -L >"$work/out" 2>&1
  rc=$?
  [ $rc -eq 9 ] && grep -q 'Driver Not Loaded' "$work/out"
  show $?
  verdict "NVML over a libcuda.so.1 that is not ivcuda's: nvmlInit answers DRIVER_NOT_LOADED (ivcuda-smi exit 9)" $?
fi
finish
