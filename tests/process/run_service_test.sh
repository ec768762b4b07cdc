#!/usr/bin/env bash
# ivcudad as a service: it tells systemd it is ready (sd_notify READY=1 on
# $NOTIFY_SOCKET, what Type=notify waits for) only once its sockets accept
# guests, and STOPPING=1 at SIGTERM; --socket-group/--socket-mode give the
# sockets the group and mode QEMU's user needs; the example configuration
# (packaging/ivcudad.toml) is accepted, with only its paths changed (the GPU
# double plays a host with two GPUs, as the example grants GPU 1).
#   run_service_test.sh BUILD_DIR DRIVER_LIB
set -u
build=$(cd "$1" && pwd)
driver=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/ivcuda-service.XXXXXX)
listener=
cleanup() {
  stop_ivcudad
  [ -n "$listener" ] && kill "$listener" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
# shellcheck source=../lib/verdicts.sh
. "$here/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$here/../lib/daemon.sh"
expect_cases 4
group=$(id -gn nobody 2>/dev/null || echo nogroup)

# A stand-in for systemd's notification socket: prints each datagram, with
# whether the daemon's sockets existed when it arrived.
python3 - "$work/notify" "$work/vm1.sock" "$work/vm2.sock" >"$work/notes" <<'PY' &
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(30)
while True:
    try:
        msg = s.recv(4096).decode()
    except socket.timeout:
        break
    ready = all(os.path.exists(p) for p in sys.argv[2:])
    print(msg.replace("\n", " ") + " | sockets present: " + str(ready), flush=True)
    if "STOPPING=1" in msg:
        break
PY
listener=$!
for _ in $(seq 100); do [ -S "$work/notify" ] && break; sleep 0.05; done

# The example configuration, with its paths moved here, and the group and the
# workers' user ones that exist (only root may make workers another user).
worker_user=nobody
[ "$(id -u)" -eq 0 ] || worker_user=$(id -un)
sed -e "s|/run/ivcuda/|$work/|g" -e "s|socket-group = \"ivcuda\"|socket-group = \"$group\"|" \
  -e "s|^user = \"ivcuda-worker\"|user = \"$worker_user\"|" \
  "$here/../../packaging/ivcudad.toml" >"$work/ivcudad.toml"
IVCUDA_GPU_DOUBLE_DEVICES=2 NOTIFY_SOCKET=$work/notify start_ivcudad --wait "$work/vm1.sock" --wait "$work/vm2.sock" \
  "$work/log" --config "$work/ivcudad.toml" --driver "$driver" --shm-size 256M --channels 8 --staging-size 4M || exit 1
for _ in $(seq 200); do grep -q "READY=1" "$work/notes" && break; sleep 0.05; done
grep -q "READY=1 STATUS=serving on 2 socket(s) | sockets present: True" "$work/notes" || { cat "$work/notes" "$work/log"; false; }
verdict "READY=1 reaches the notification socket once both sockets exist" $?

ok=0
for s in vm1.sock vm2.sock; do
  [ "$(stat -c '%G %a' "$work/$s")" = "$group 660" ] || { stat -c '%n %G %a' "$work/$s"; ok=1; }
done
verdict "the sockets have the configured group and mode 0660" $ok

IVCUDA_SOCKET=$work/vm2.sock LD_LIBRARY_PATH=$build/lib timeout 60 "$build/tests/bin/drv_core" >"$work/out" 2>&1 ||
  { tail -5 "$work/out"; false; }
verdict "a guest is served through the example configuration's second socket" $?

stop_ivcudad
wait "$listener" 2>/dev/null
listener=
grep -q "STOPPING=1" "$work/notes" || { cat "$work/notes"; false; }
verdict "SIGTERM: STOPPING=1, then the daemon ends" $?
finish
