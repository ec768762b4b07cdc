#!/usr/bin/env bash
# The operator's view of a shared GPU, process mode against the GPU test
# double: ivcudactl status (table and JSON) over the control socket, the
# Prometheus endpoint scraped, `ivcudactl reload` changing a live guest's
# quota, `ivcudactl evict` (the guest's memory is released at once and its
# calls answer CUDA_ERROR_DEVICE_UNAVAILABLE without hanging:
# tests/programs/drv_quota.cc --until-evicted), and who may use the control
# socket.
#   run_control_test.sh BUILD_DIR DRIVER_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
bin=$build/tests/bin
ctl=$build/host-daemon/ivcudactl
work=$(mktemp -d /tmp/ivcuda-control.XXXXXX)
chmod 755 "$work"
sock=$work/a.sock
sock_b=$work/b.sock
csock=$work/control.sock
log=$work/ivcudad.log
holder= holder_b=
# shellcheck source=../lib/verdicts.sh
. "$(dirname "$0")/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$(dirname "$0")/../lib/daemon.sh"
expect_cases 10

cleanup() {
  [ -n "$holder" ] && kill "$holder" 2>/dev/null
  [ -n "$holder_b" ] && kill "$holder_b" 2>/dev/null
  stop_ivcudad
  rm -rf "$work"
}
trap cleanup EXIT
py=$(command -v python3)

write_config() {  # MEM_LIMIT
  cat >"$work/ivcudad.toml" <<CONF
socket = "$sock"
shm-size = "128M"
staging-size = "4M"
channels = 8
mem-limit = "$1"
context-reserve = "0"
guest-socket = ["$sock_b=0:mem-limit=128M"]
control-socket = "$csock"
metrics-listen = "127.0.0.1:0"
CONF
}
write_config 1G
start_ivcudad --wait "$sock" --wait "$sock_b" --wait "$csock" "$log" --config "$work/ivcudad.toml" --driver "$driver" ||
  exit 1
# The metrics line comes after the sockets exist: wait for it too.
port=
for _ in $(seq 100); do
  port=$(sed -n 's/.*metrics at .*(port \([0-9]*\)).*/\1/p' "$log" | head -1)
  [ -n "$port" ] && break
  sleep 0.05
done

# Two guests, one per socket, each with its own quota.
IVCUDA_SOCKET=$sock LD_LIBRARY_PATH=$build/lib timeout 120 "$bin/drv_quota" --hold-mib 256 --until-evicted \
  >"$work/hold" 2>&1 &
holder=$!
IVCUDA_SOCKET=$sock_b LD_LIBRARY_PATH=$build/lib timeout 120 "$bin/drv_quota" --hold-mib 64 >"$work/hold_b" 2>&1 &
holder_b=$!
for _ in $(seq 200); do grep -q '^holding' "$work/hold" && grep -q '^holding' "$work/hold_b" && break; sleep 0.05; done
sleep 1.5  # a sampling window of the daemon's rates

"$ctl" --socket "$csock" status --json >"$work/status.json" 2>&1
"$py" - "$work/status.json" "$sock" "$sock_b" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
g = {x["socket"]: x for x in s["guests"]}
a, b = g[sys.argv[2]], g[sys.argv[3]]
MiB = 1 << 20
assert a["mode"] == "process" and a["state"] == "serving", a
assert a["mem_used_bytes"] == 256 * MiB and a["mem_limit_bytes"] == 1024 * MiB, a
assert b["mem_used_bytes"] == 64 * MiB and b["mem_limit_bytes"] == 128 * MiB, b
assert a["calls"] > 10 and a["calls_per_s"] > 5 and a["copy_bytes_per_s"] > 1e6, a
assert a["processes"] == 1 and a["pid"] > 0 and a["peer_pid"] > 0 and a["id"] != b["id"], (a, b)
PY
verdict "status --json: two guests, each with its socket's quota, memory in use, call and copy rates" $?

"$ctl" --socket "$csock" status >"$work/table" 2>&1
grep -q '^GUEST  *MODE  *STATE  *SOCKET' "$work/table" && grep -q "process  *serving  *$sock .*256 MiB / 1 GiB" "$work/table"
verdict "status: a table with a row per guest" $?
[ $? -eq 0 ] || cat "$work/table"

"$py" - "$port" "$sock" <<'PY'
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
want = {"IVCUDA_FI_GUEST_FB_USED": 256.0, "IVCUDA_FI_GUEST_FB_QUOTA": 1024.0}
seen = {}
for line in body.splitlines():
    if line.startswith("#") or f'socket="{sys.argv[2]}"' not in line:
        continue
    name, value = line.split("{")[0], float(line.rsplit(" ", 1)[1])
    seen[name] = value
for k, v in want.items():
    assert seen.get(k) == v, (k, seen.get(k), body)
assert seen["IVCUDA_FI_GUEST_CALLS_TOTAL"] > 10 and seen["IVCUDA_FI_GUEST_COPY_BYTES_TOTAL"] > 0, seen
assert "# TYPE IVCUDA_FI_GUEST_CALLS_TOTAL counter" in body and "IVCUDA_FI_DAEMON_GUESTS 2" in body
try:
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/other", timeout=5)
    raise SystemExit("no 404")
except urllib.error.HTTPError as e:
    assert e.code == 404
PY
verdict "the metrics endpoint: DCGM-style gauges and counters per guest" $?

write_config 512M
"$ctl" --socket "$csock" reload >"$work/reload" 2>&1 &&
  grep -q "changed: $sock: mem-limit 1 GiB -> 512 MiB" "$work/reload" &&
  "$ctl" --socket "$csock" status --json | "$py" -c '
import json, sys
s = json.load(sys.stdin)
assert any(g["mem_limit_bytes"] == 512 << 20 for g in s["guests"]), s'
verdict "reload: a new quota reaches the guest that is connected" $?
[ $? -eq 0 ] || cat "$work/reload"

id=$("$ctl" --socket "$csock" status --json | "$py" -c '
import json, sys
print([g["id"] for g in json.load(sys.stdin)["guests"] if g["socket"] == sys.argv[1]][0])' "$sock")
"$ctl" --socket "$csock" evict "$id" >"$work/evict" 2>&1 && grep -q "evicted; it holds no device memory" "$work/evict"
verdict "evict: the guest's memory is released" $?
[ $? -eq 0 ] || cat "$work/evict"
wait "$holder"
rc=$?
holder=
[ $rc -eq 0 ] && grep -q '^evicted' "$work/hold"
verdict "evict: the evicted program's calls fail with CUDA_ERROR_DEVICE_UNAVAILABLE, none hangs" $?
[ $? -eq 0 ] || cat "$work/hold"
"$ctl" --socket "$csock" status --json | "$py" -c '
import json, sys
g = {x["socket"]: x for x in json.load(sys.stdin)["guests"]}
assert sys.argv[1] not in g or g[sys.argv[1]]["mem_used_bytes"] == 0, g
assert g[sys.argv[2]]["mem_used_bytes"] == 64 << 20 and g[sys.argv[2]]["state"] == "serving", g' "$sock" "$sock_b"
verdict "evict: the other guest is untouched" $?

"$ctl" --socket "$csock" evict 999 >"$work/bad" 2>&1
[ $? -eq 1 ] && grep -q "no guest 999" "$work/bad"
verdict "evict of an unknown guest: a clear error" $?

# Only root, the daemon's user or the control group: the socket file keeps
# others out, and the daemon checks credentials even when the file is open.
if command -v setpriv >/dev/null && [ "$(id -u)" -eq 0 ]; then
  setpriv --reuid=65534 --regid=65534 --clear-groups "$ctl" --socket "$csock" status >"$work/denied" 2>&1
  [ $? -eq 1 ] && grep -q "Permission denied" "$work/denied"
  verdict "another user cannot open the control socket" $?
  chmod 666 "$csock"
  setpriv --reuid=65534 --regid=65534 --clear-groups "$ctl" --socket "$csock" status >"$work/denied" 2>&1
  rc=$?
  [ $rc -eq 1 ] && grep -q "permission denied" "$work/denied" && grep -q "control socket: refused uid 65534" "$log" || { echo "exit $rc:"; cat "$work/denied"; false; }
  verdict "the daemon refuses another user even through an open socket file" $?
else
  not_run "another user cannot open the control socket" "needs root and setpriv"
  not_run "the daemon refuses another user even through an open socket file" "needs root and setpriv"
fi
finish
