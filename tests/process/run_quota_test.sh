#!/usr/bin/env bash
# Device-memory quotas (ivcudad --mem-limit, --guest-socket ...:mem-limit=),
# process mode against the GPU test double: each socket's guests see their
# quota as the device's total and are refused past it on every path that
# makes device memory (tests/programs/drv_quota.cc); each process-mode guest
# has its own; the settings work from a config file; malformed socket
# settings are refused with a clear message.
#   run_quota_test.sh BUILD_DIR DRIVER_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
bin=$build/tests/bin
work=$(mktemp -d /tmp/ivcuda-quota.XXXXXX)
sock=$work/a.sock
sock_b=$work/b.sock
log=$work/ivcudad.log
holder=
# shellcheck source=../lib/verdicts.sh
. "$(dirname "$0")/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"
expect_cases 6

cleanup() {
  [ -n "$holder" ] && kill "$holder" 2>/dev/null
  stop_ivcudad
  rm -rf "$work"
}
trap cleanup EXIT

# As an operator would write it: a config file (docs/operating.md).
cat >"$work/ivcudad.toml" <<CONF
socket = "$sock"
shm-size = "128M"
staging-size = "4M"
channels = 8
mem-limit = "256M"
context-reserve = "0"  # drv_quota counts what the guest allocates; contexts' charge: hostile_worker_test
object-limits = "streams=1000,events=50000"
guest-socket = ["$sock_b=0:mem-limit=128M"]
CONF
start_ivcudad --wait "$sock" --wait "$sock_b" "$log" --config "$work/ivcudad.toml" --driver "$driver" || exit 1
run_guest() {  # SOCKET PROGRAM ARGS...
  local s=$1
  shift
  IVCUDA_SOCKET=$s LD_LIBRARY_PATH=$build/lib timeout 120 "$@" >"$work/out" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && cat "$work/out"
  return $rc
}

images=$build/tests/host/images
run_guest "$sock" "$bin/drv_quota" --quota-mib 256 --big-module "$images/big.cubin" --module "$images/k_plain.fatbin"
verdict "mem-limit 256M (config file): the guest's total is 256 MiB, refused past it on every path, modules included" $?
run_guest "$sock_b" "$bin/drv_quota" --quota-mib 128
verdict "guest-socket ...:mem-limit=128M (config file): that socket's guests get 128 MiB" $?

# A process-mode guest is a guest of its own: another one's memory is not in its books.
IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 120 "$bin/drv_quota" --hold-mib 200 >"$work/hold" 2>&1 &
holder=$!
for _ in $(seq 200); do grep -q '^holding' "$work/hold" && break; sleep 0.05; done
grep -q '^holding 200 MiB' "$work/hold" && run_guest "$sock" "$bin/drv_quota" --quota-mib 256
verdict "a guest holding 200 MiB does not shrink another guest's quota" $?
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null
holder=

grep -q "listening on $sock_b for guests granted GPU(s) 0, device memory: 128 MiB per guest" "$log"
verdict "the daemon's log names each socket's quota" $?
stop_ivcudad

# Malformed settings: the daemon refuses to start, naming the problem.
bad() {  # SPEC PATTERN
  timeout 20 "$build/host-daemon/ivcudad" --socket "$work/c.sock" --driver "$driver" --guest-socket "$1" \
    >"$work/bad" 2>&1
  local rc=$?
  [ "$rc" -eq 2 ] && grep -q "$2" "$work/bad" || { echo "exit $rc:"; cat "$work/bad"; return 1; }
}
bad "$work/d.sock=0:mem-limit=lots" "mem-limit"
verdict "a mem-limit that is not a size is refused" $?
bad "$work/d.sock=0:colour=red" "unknown setting 'colour=red'"
verdict "an unknown socket setting is refused" $?
finish
