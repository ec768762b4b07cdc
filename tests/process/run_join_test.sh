#!/usr/bin/env bash
# ivcudad --join: ivcudad joins an ivshmem-server it does not own (a
# test-only server with QEMU's ivshmem-server semantics) as the host peer and
# serves the guest that appears there, then the next one.
#   run_join_test.sh BUILD_DIR DRIVER_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/ivcuda-join.XXXXXX)
server=
cleanup() {
  stop_ivcudad
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
# shellcheck source=../lib/verdicts.sh
. "$here/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$here/../lib/daemon.sh"
expect_cases 3

python3 "$here/std_ivshmem_server.py" "$work/server.sock" $((256 << 20)) 4 &
server=$!
for _ in $(seq 100); do [ -S "$work/server.sock" ] && break; sleep 0.05; done
start_ivcudad --wait-log "waiting for a guest" "$work/log" --join "$work/server.sock" --vectors 4 --channels 8 \
  --staging-size 4M --driver "$driver" || exit 1

guest() { IVCUDA_SOCKET=$work/server.sock LD_LIBRARY_PATH=$build/lib timeout 120 "$build/tests/bin/drv_core" >"$work/out" 2>&1; }
guest; rc=$?; [ $rc -ne 0 ] && cat "$work/out" "$work/log"
verdict "a guest of somebody else's ivshmem-server is served" $rc
for _ in $(seq 100); do [ "$(grep -c 'waiting for a guest' "$work/log")" -ge 2 ] && break; sleep 0.05; done
guest; rc=$?; [ $rc -ne 0 ] && cat "$work/out" "$work/log"
verdict "the next guest after it left is served too" $rc
kill "$server"; wait "$server" 2>/dev/null; server=
for _ in $(seq 100); do kill -0 "$ivcudad_pid" 2>/dev/null || break; sleep 0.05; done
kill -0 "$ivcudad_pid" 2>/dev/null; alive=$?
verdict "ivcudad ends when the server goes away" $((alive == 0))
finish
