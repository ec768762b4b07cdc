#!/usr/bin/env bash
# ivcudad --mps against test doubles (the GPU test double for the driver, a
# fake nvidia-cuda-mps-control): the daemon starts an MPS control daemon
# with its own directories, or joins one that answers there; each worker's
# driver loads as an MPS client with its socket's share of the SMs and a
# memory cap of its quota plus the headroom; a daemon that started MPS stops
# it, one that joined leaves it; bad shares are refused. What a driver was
# given is what the GPU double found in its environment at cuInit
# (IVCUDA_GPU_DOUBLE_MPS_LOG), not what ivcudad's log says it set. The GPU
# machine's tests/gpu/run_mps_share.sh measures what the shares do on the H200.
#   run_mps_test.sh BUILD_DIR DRIVER_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
here=$(cd "$(dirname "$0")" && pwd)
bin=$build/tests/bin
work=$(mktemp -d /tmp/ivcuda-mps.XXXXXX)
# shellcheck source=../lib/verdicts.sh
. "$here/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$here/../lib/daemon.sh"
expect_cases 6
cleanup() {
  stop_ivcudad
  rm -rf "$work"
}
trap cleanup EXIT
# The double, under the real tool's name, first in PATH.
mkdir -p "$work/bin" "$work/mps" "$work/mpslog"
ln -s "$here/fake_mps_control.sh" "$work/bin/nvidia-cuda-mps-control"
export PATH=$work/bin:$PATH
mpslog=$work/mpslog/control.log

start_daemon() {  # LOG ARGS... (the drivers' MPS variables go to LOG.mps)
  local log=$1
  shift
  IVCUDA_GPU_DOUBLE_MPS_LOG=$log.mps start_ivcudad "$log" --socket "$work/a.sock" --driver "$driver" --shm-size 128M \
    --staging-size 4M --channels 8 --control-socket none --gpus 0 --mps --mps-pipe-dir "$work/mps" \
    --mps-log-dir "$work/mpslog" "$@" || exit 1
}
run_guest() {  # SOCKET
  IVCUDA_SOCKET=$1 LD_LIBRARY_PATH=$build/lib timeout 60 "$bin/drv_core" >"$work/out" 2>&1 || { cat "$work/out"; return 1; }
}
# driver_saw RECORD VARS: some worker's driver found exactly the CUDA_MPS_*
# variables VARS (sorted by name, space-separated) in its environment at
# cuInit; says what the drivers saw when none did.
driver_saw() {
  grep -qxF -- "$2" <(sed 's/^pid [0-9]*: //' "$1" 2>/dev/null) && return 0
  echo "no driver saw: $2"
  echo "the drivers saw:"
  cat "$1" 2>/dev/null
  return 1
}

start_daemon "$work/d1.log" --mem-limit 2G --compute-share 50 --guest-socket "$work/b.sock=0:mem-limit=2560M:compute=25"
grep -q "^start pipe=$work/mps log=$work/mpslog" "$mpslog" 2>/dev/null && grep -q "MPS: started a control daemon" "$work/d1.log"
verdict "--mps starts an MPS control daemon with the daemon's own directories" $?
run_guest "$work/a.sock" &&
  driver_saw "$work/d1.log.mps" "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 CUDA_MPS_LOG_DIRECTORY=$work/mpslog CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M CUDA_MPS_PIPE_DIRECTORY=$work/mps"
verdict "a worker's driver starts as an MPS client: --compute-share 50, memory capped at quota + 2 GiB headroom" $?
run_guest "$work/b.sock" &&
  driver_saw "$work/d1.log.mps" "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 CUDA_MPS_LOG_DIRECTORY=$work/mpslog CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4608M CUDA_MPS_PIPE_DIRECTORY=$work/mps"
verdict "a --guest-socket's compute=25 and mem-limit reach its workers' drivers" $?
stop_ivcudad
grep -q "^command quit" "$mpslog"
verdict "a daemon that started MPS stops it" $?

: >"$work/mps/control"  # one that another runs
: >"$mpslog"
start_daemon "$work/d2.log"
run_guest "$work/a.sock"
stop_ivcudad
grep -q "MPS: joined the control daemon" "$work/d2.log" && ! grep -q "^start\|^command quit" "$mpslog" &&
  driver_saw "$work/d2.log.mps" "CUDA_MPS_LOG_DIRECTORY=$work/mpslog CUDA_MPS_PIPE_DIRECTORY=$work/mps" &&
  ! grep -q "ACTIVE_THREAD\|PINNED" "$work/d2.log.mps"
verdict "a running MPS control daemon is joined and left running; 100 % and no quota give the drivers nothing more" $?

timeout 20 "$build/host-daemon/ivcudad" --socket "$work/c.sock" --driver "$driver" --control-socket none \
  --guest-socket "$work/d.sock=0:compute=101" >"$work/bad" 2>&1
[ $? -eq 2 ] && grep -q "compute: '101' is not a percentage from 1 to 100" "$work/bad"
verdict "a share that is not a percentage is refused" $?
finish
