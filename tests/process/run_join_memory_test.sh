#!/usr/bin/env bash
# ivcudad --join, served memory that cannot be used: the memory of an
# ivshmem-server is every peer's, so the daemon checks its size and lets a
# short-lived child touch it (docs/security.md: `shared-memory-size`,
# `format-in-child`).
#  1. a peer shrinks the memory below the layout: refused for its size (the
#     child would also die, but the size check must say so first);
#  2. memory of the right size whose pages its file system cannot back (a
#     256 MiB file on a 1 MiB tmpfs, in a mount namespace of the server's):
#     touching it raises SIGBUS, which costs the child, never the daemon.
#   run_join_memory_test.sh BUILD_DIR DRIVER_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib/verdicts.sh
. "$here/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$here/../lib/daemon.sh"
expect_cases 4
work=$(mktemp -d /tmp/ivcuda-join-memory.XXXXXX)
size=$((256 << 20)) vectors=4
server=
cleanup() {
  stop_ivcudad
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
# Waits up to 10 s for PATTERN in the daemon's log.
wait_log() { for _ in $(seq 200); do grep -q -- "$1" "$work/log" && return 0; sleep 0.05; done; return 1; }
start_daemon() {  # start_ivcudad's options: the log line that says the daemon took (or refused) the memory
  for _ in $(seq 100); do [ -S "$work/server.sock" ] && break; sleep 0.05; done
  start_ivcudad "$@" "$work/log" --join "$work/server.sock" --vectors $vectors --channels 8 --staging-size 4M \
    --driver "$driver"
}
stop() {
  stop_ivcudad
  kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; server=
  rm -f "$work/server.sock"
}

# 1. Shrunk below the layout.
python3 "$here/std_ivshmem_server.py" "$work/server.sock" $size $vectors &
server=$!
start_daemon --wait-log "waiting for a guest" || exit 1
python3 "$here/hostile_peer.py" "$work/server.sock" resize 4096
wait_log "the shared memory has 4096 bytes, the layout needs"; rc=$?
[ $rc -ne 0 ] && cat "$work/log"
verdict "memory shrunk below the layout is refused for its size" $rc
kill -0 "$ivcudad_pid" 2>/dev/null
verdict "the daemon lives on" $?
stop

# 2. The right size, pages nobody can back. The server holds the file in a
# mount namespace of its own (unshare -m; -r where we are not root), so the
# small tmpfs goes when it ends.
mkdir "$work/small"
userns=-r
[ "$(id -u)" = 0 ] && userns=
# shellcheck disable=SC2016 # expanded by that sh
unshare ${userns:+"$userns"} -m sh -c 'mount -t tmpfs -o size=1m ivcuda-test "$1" && exec python3 "$2" "$3" "$4" "$5" "$1/memory"' \
  sh "$work/small" "$here/std_ivshmem_server.py" "$work/server.sock" $size $vectors &
server=$!
for _ in $(seq 100); do [ -S "$work/server.sock" ] && break; sleep 0.05; done
if [ ! -S "$work/server.sock" ]; then
  why="no server: a mount namespace with a tmpfs (unshare $userns -m) is not permitted here"
  not_run "memory whose pages cannot be backed is refused" "$why"
  not_run "a fault in formatting costs the child, not the daemon" "$why"
else
  # The daemon dying of the memory is what the cases below would show: not a failed start.
  start_daemon --may-stop --wait-log "not serving it until that changes\|waiting for a guest"
  sleep 0.5
  grep -q "not serving it until that changes" "$work/log"; rc=$?
  [ $rc -ne 0 ] && cat "$work/log"
  verdict "memory whose pages cannot be backed is refused" $rc
  kill -0 "$ivcudad_pid" 2>/dev/null; rc=$?
  [ $rc -ne 0 ] && cat "$work/log"
  verdict "a fault in formatting costs the child, not the daemon" $rc
fi
stop
finish
