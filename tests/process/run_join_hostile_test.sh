#!/usr/bin/env bash
# ivcudad --join against hostile peers of the ivshmem-server it joined: every
# peer of such a server holds the memory's fd (the server seals nothing) and
# sends the daemon eventfds. A peer that shrinks the memory must not kill the
# daemon (it refuses the memory until it is whole again), and peers that come
# and go, or crowd the server, must not run it out of descriptors.
#   run_join_hostile_test.sh BUILD_DIR DRIVER_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/ivcuda-join-hostile.XXXXXX)
size=$((256 << 20)) vectors=4
server= crowd=
cleanup() {
  [ -n "$crowd" ] && kill "$crowd" 2>/dev/null && wait "$crowd" 2>/dev/null
  stop_ivcudad
  [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
# shellcheck source=../lib/verdicts.sh
. "$here/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$here/../lib/daemon.sh"
expect_cases 5
# Waits up to 10 s for PATTERN to appear at least N times in the daemon's log.
wait_log() { for _ in $(seq 200); do [ "$(grep -c -- "$1" "$work/log")" -ge "$2" ] && return 0; sleep 0.05; done; return 1; }
alive() { kill -0 "$ivcudad_pid" 2>/dev/null; }
fds() { ls "/proc/$ivcudad_pid/fd" | wc -l; }
peer() { python3 "$here/hostile_peer.py" "$work/server.sock" "$@"; }

python3 "$here/std_ivshmem_server.py" "$work/server.sock" $size $vectors &
server=$!
for _ in $(seq 100); do [ -S "$work/server.sock" ] && break; sleep 0.05; done
start_ivcudad --wait-log "waiting for a guest" "$work/log" --join "$work/server.sock" --vectors $vectors --channels 8 \
  --staging-size 4M --driver "$driver" || exit 1
base_fds=$(fds)

# 1. A peer truncates the memory to one page and leaves.
peer resize 4096
wait_log "not serving it until that changes" 1; rc=$?
sleep 0.5
alive && [ $rc -eq 0 ]; rc=$?
[ $rc -ne 0 ] && cat "$work/log"
verdict "a peer that shrinks the memory does not kill the daemon, which refuses the memory" $rc

# 2. Another peer makes it whole again: the daemon formats it and serves guests again.
waits=$(grep -c "waiting for a guest" "$work/log")
peer resize $size
wait_log "waiting for a guest" $((waits + 1)); rc=$?
if [ $rc -eq 0 ]; then
  IVCUDA_SOCKET=$work/server.sock LD_LIBRARY_PATH=$build/lib timeout 120 "$build/tests/bin/drv_core" \
    >"$work/out" 2>&1; rc=$?
fi
[ $rc -ne 0 ] && cat "$work/out" "$work/log"
verdict "once the memory is whole again, a guest is served" $rc

# 3. Peers that come and go leave nothing behind in the daemon.
peer churn 300
sleep 0.5
churn_fds=$(fds)
echo "daemon descriptors: $base_fds at start, $churn_fds after 300 peers came and went"
alive && [ "$churn_fds" -le $((base_fds + 2)) ]
verdict "300 peers that come and go cost the daemon no descriptors" $?

# 4. 40 peers at once: the daemon keeps the eventfds of a bounded number.
mkfifo "$work/crowd.in" "$work/crowd.out"
peer crowd 40 <"$work/crowd.in" >"$work/crowd.out" &
crowd=$!
exec 7>"$work/crowd.in"  # the crowd stays until this closes
line=
read -r -t 30 line <"$work/crowd.out"
sleep 0.5
crowd_fds=$(fds)
echo "daemon descriptors with 40 peers present: $crowd_fds (bound: $((base_fds + 8 * vectors + 4)))"
alive && [ "$line" = ready ] && [ "$crowd_fds" -le $((base_fds + 8 * vectors + 4)) ]
verdict "40 peers at once cost the daemon at most 8 peers' eventfds" $?
exec 7>&-
wait "$crowd" 2>/dev/null; crowd=

alive; verdict "ivcudad is still running" $?
finish
