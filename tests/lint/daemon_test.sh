#!/usr/bin/env bash
# tests/lib/daemon.sh against a stand-in ivcudad (a script that listens, logs, or exits as told):
# start_ivcudad is ready only once every socket it was given exists (--socket, --guest-socket,
# --wait) and the log line it waits for is there, never on an earlier daemon's socket; a daemon
# that exits before it is ready fails the start with its status and its log's end (--may-stop:
# quietly); stop_ivcudad ends every daemon started, and again does nothing; ivcudad_bin names
# another daemon than the build's; --log-pipe gives it a pipe into its log for stdout and stderr.
#   daemon_test.sh   (from anywhere)
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib/verdicts.sh
. "$here/../lib/verdicts.sh"
# shellcheck source=../lib/daemon.sh
. "$here/../lib/daemon.sh"
work=$(mktemp -d /tmp/ivcuda-daemon-lib.XXXXXX)
trap 'stop_ivcudad; rm -rf "$work"' EXIT
build=$work/build
mkdir -p "$build/host-daemon"
# The stand-in: FAKE_DELAY seconds, then FAKE_EXIT (exits with that status, saying so) or listens
# on each --socket and --guest-socket path, logs "listening" FAKE_LINE_DELAY seconds later, and
# runs until SIGTERM.
cat >"$build/host-daemon/ivcudad" <<'FAKE'
#!/usr/bin/env bash
sleep "${FAKE_DELAY:-0}"
if [ -n "${FAKE_EXIT:-}" ]; then echo "fake ivcudad: refused, exit $FAKE_EXIT"; exit "$FAKE_EXIT"; fi
paths=()
while [ $# -gt 0 ]; do
  case "$1" in
    --socket) paths+=("$2"); shift ;;
    --guest-socket) paths+=("${2%%=*}"); shift ;;
  esac
  shift
done
exec python3 -c '
import os, socket, sys, time
held = []
for p in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    s.bind(p)
    s.listen()
    held.append(s)
time.sleep(float(os.environ.get("FAKE_LINE_DELAY", "0")))
print("listening", flush=True)
time.sleep(600)
' "${paths[@]}"
FAKE
chmod +x "$build/host-daemon/ivcudad"
log=$work/log
expect_cases 10

FAKE_DELAY=0.3 start_ivcudad "$log" --socket "$work/a.sock" --guest-socket "$work/b.sock=0:mem-limit=1G" --x 1
rc=$?
[ $rc -eq 0 ] && [ -S "$work/a.sock" ] && [ -S "$work/b.sock" ] && kill -0 "$ivcudad_pid" 2>/dev/null
verdict "ready once the sockets of --socket and --guest-socket exist, its pid in ivcudad_pid" $?
first=$ivcudad_pid
stop_ivcudad
stopped=$?
stop_ivcudad >"$work/out" 2>&1
again=$?
[ $stopped -eq 0 ] && ! kill -0 "$first" 2>/dev/null && [ -z "$ivcudad_pid" ] && [ $again -eq 0 ] && [ ! -s "$work/out" ]
verdict "stop_ivcudad ends it, and again says and does nothing" $?

# The first one's socket file is still there (the stand-in leaves it): not this one's readiness.
[ -S "$work/a.sock" ]
left=$?
FAKE_DELAY=0.5 start_ivcudad "$log" --socket "$work/a.sock"
rc=$?
[ $left -eq 0 ] && [ $rc -eq 0 ] && grep -q listening "$log"
verdict "an earlier daemon's socket file does not pass for this one's" $?

# The socket at once, the line later: ready on the line.
FAKE_LINE_DELAY=0.5 start_ivcudad --wait-log "^listening" --append "$log" --socket "$work/c.sock"
rc=$?
second=$ivcudad_pid
[ $rc -eq 0 ] && [ "$(grep -c listening "$log")" -eq 2 ]
verdict "--wait-log: ready once this daemon's line is in the log, not on the socket or an earlier line" $?

FAKE_DELAY=0.3 start_ivcudad --wait "$work/f.sock" "$work/log2" --socket "$work/d.sock" --guest-socket "$work/f.sock"
rc=$?
third=$ivcudad_pid
[ $rc -eq 0 ] && [ -S "$work/f.sock" ] && [ "$third" != "$second" ]
verdict "--wait PATH: ready once that socket exists too" $?

stop_ivcudad
! kill -0 "$second" 2>/dev/null && ! kill -0 "$third" 2>/dev/null
verdict "stop_ivcudad ends every daemon it started" $?

FAKE_EXIT=3 start_ivcudad "$log" --socket "$work/e.sock" >"$work/out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "exited with status 3 before it was ready" "$work/out" &&
  grep -q "fake ivcudad: refused, exit 3" "$work/out" && [ -z "$ivcudad_pid" ]
ok=$?
[ $ok -eq 0 ] || { echo "start_ivcudad returned $rc and said:"; cat "$work/out"; }
verdict "a daemon that exits first fails the start, with its status and its log's end" $ok

# A packaged daemon (ivcudad_bin) instead of the build's, which is not there.
mkdir -p "$work/pkg"
printf '#!/bin/sh\necho packaged\nexec "%s" "$@"\n' "$build/host-daemon/ivcudad" >"$work/pkg/ivcudad"
chmod +x "$work/pkg/ivcudad"
ivcudad_bin=$work/pkg/ivcudad build=$work/nowhere start_ivcudad "$log" --socket "$work/g.sock"
rc=$?
[ $rc -eq 0 ] && grep -q packaged "$log"
verdict "ivcudad_bin: that daemon, not the build's" $?
stop_ivcudad

# As `ivcudad 2>&1 | tee LOG` would start it: both a pipe, its lines in LOG, an earlier one gone.
echo "an earlier daemon's line" >"$work/log3"
start_ivcudad --log-pipe --wait-log "^listening" "$work/log3" --socket "$work/h.sock"
rc=$?
out=$(readlink "/proc/$ivcudad_pid/fd/1") err=$(readlink "/proc/$ivcudad_pid/fd/2")
[ $rc -eq 0 ] && [[ $out == pipe:* ]] && [ "$err" = "$out" ] && ! grep -q "earlier" "$work/log3"
verdict "--log-pipe: the daemon's stdout and stderr are one pipe, copied into LOG (emptied first)" $?
stop_ivcudad

FAKE_EXIT=2 start_ivcudad --may-stop "$log" --socket "$work/e.sock" >"$work/out" 2>&1
rc=$?
[ $rc -eq 1 ] && [ ! -s "$work/out" ]
verdict "--may-stop: a daemon that exits first is status 1, without a word" $?
finish
