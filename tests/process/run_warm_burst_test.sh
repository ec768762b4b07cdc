#!/usr/bin/env bash
# ivcudad's pool of warm workers grows while guests arrive fast and shrinks
# when they stop (--warm-burst; host-daemon/daemon/warm_pool.cc fill_pools, issue 30):
# with --warm-workers 1 --warm-burst 2, a loop of short programs makes the
# socket keep more than one worker started ahead, never more than 1 + 2, and
# 30 s without a guest brings it back to one. Read from ivcudactl status
# --json (warm_workers: ready + starting), against the GPU test double.
#   run_warm_burst_test.sh BUILD_DIR DRIVER_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
bin=$build/tests/bin
ctl=$build/host-daemon/ivcudactl
work=$(mktemp -d /tmp/ivcuda-warm.XXXXXX)
sock=$work/ivcudad.sock
csock=$work/control.sock
log=$work/ivcudad.log
# shellcheck source=../lib/verdicts.sh
. "$(dirname "$0")/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"
expect_cases 4
cleanup() {
  stop_ivcudad
  rm -rf "$work"
}
trap cleanup EXIT

start_ivcudad --wait "$csock" "$log" --socket "$sock" --control-socket "$csock" --shm-size 64M --staging-size 2M \
  --channels 4 --warm-workers 1 --warm-burst 2 --driver "$driver" || exit 1
# pool: the socket's warm entries, ready or starting.
pool() {
  "$ctl" --socket "$csock" status --json 2>/dev/null |
    python3 -c 'import json,sys; w=json.load(sys.stdin)["warm_workers"]; print(w["ready"] + w["starting"])'
}
for _ in $(seq 100); do [ "$(pool)" = 1 ] && break; sleep 0.05; done
first=$(pool)
echo "before any guest: $first warm entries"
[ "$first" = 1 ]
verdict "an idle socket keeps its --warm-workers 1" $?

# Six short programs one after another: several arrive within 2 s.
ok=0
most=0
for _ in $(seq 6); do
  IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib "$bin/drv_isolation" --used >/dev/null || ok=1
  n=$(pool)
  [ "${n:-0}" -gt "$most" ] && most=$n
done
for _ in $(seq 20); do n=$(pool); [ "${n:-0}" -gt "$most" ] && most=$n; sleep 0.05; done
echo "six programs back-to-back: they ran (status $ok); the pool held at most $most warm entries"
[ $ok -eq 0 ] && [ "$most" -ge 2 ]
verdict "guests arriving back-to-back grow the pool beyond --warm-workers" $?
[ "$most" -le 3 ]
verdict "the pool never holds more than --warm-workers + --warm-burst" $?

# 30 s without a guest: the extra entries go.
for _ in $(seq 450); do [ "$(pool)" = 1 ] && break; sleep 0.1; done
last=$(pool)
echo "after 30 s without a guest: $last warm entries"
[ "$last" = 1 ]
verdict "30 s without a guest brings the pool back to --warm-workers" $?
finish
