#!/usr/bin/env bash
# CUDA IPC handles stay inside their tenant. ivcudad listens on two sockets
# (--socket and --guest-socket: two tenants); drv_ipc exports memory and an
# event in a parent process and opens them in a child process. Served by one
# socket, the child opens them (each process has its own worker: the handles
# cross workers through the tenant's registry); with the child served by the
# other socket, both opens answer CUDA_ERROR_INVALID_HANDLE and nothing is
# mapped. A second daemon is a third tenant and refuses them as well.
#   run_tenant_ipc_test.sh BUILD_DIR DRIVER_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
prog=$build/tests/bin/drv_ipc
work=$(mktemp -d /tmp/ivcuda-tenants.XXXXXX)
# shellcheck source=../lib/verdicts.sh
. "$(dirname "$0")/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"
cleanup() {
  stop_ivcudad
  rm -rf "$work"
}
trap cleanup EXIT
expect_cases 5

start() {  # socket path, log, further ivcudad arguments
  local sock=$1 log=$2; shift 2
  start_ivcudad "$log" --socket "$sock" --shm-size 256M --staging-size 4M --channels 8 --driver "$driver" "$@" || exit 1
}
start "$work/a.sock" "$work/a.log" --guest-socket "$work/b.sock=0"
start "$work/c.sock" "$work/c.log"

run() {  # name, parent's socket, then drv_ipc arguments
  local name=$1 sock=$2; shift 2
  IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 120 "$prog" "$@" >"$work/out" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && cat "$work/out"
  verdict "$name" $rc
}
run "one tenant (--socket): the child opens the parent's handles" "$work/a.sock"
run "one tenant (--guest-socket): the child opens the parent's handles" "$work/b.sock"
run "handles of --socket opened by a guest of --guest-socket: INVALID_HANDLE" "$work/a.sock" \
  --child-env "IVCUDA_SOCKET=$work/b.sock" --foreign CUDA_ERROR_INVALID_HANDLE
run "handles of --guest-socket opened by a guest of --socket: INVALID_HANDLE" "$work/b.sock" \
  --child-env "IVCUDA_SOCKET=$work/a.sock" --foreign CUDA_ERROR_INVALID_HANDLE
run "handles of one daemon opened by a guest of another daemon: INVALID_HANDLE" "$work/a.sock" \
  --child-env "IVCUDA_SOCKET=$work/c.sock" --foreign CUDA_ERROR_INVALID_HANDLE
finish
