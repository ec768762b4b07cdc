# shellcheck shell=bash
# Starts and stops ivcudad for the test scripts; source it. The daemon is the
# script's own build's, $build/host-daemon/ivcudad, or $ivcudad_bin where the
# script sets it (the packaged one).
#   start_ivcudad [--append] [--log-pipe] [--wait PATH]... [--wait-log PATTERN] [--may-stop] LOG ARGS...
#       runs ivcudad ARGS... in the background, stdout and stderr to LOG (emptied
#       first; --append keeps what earlier daemons wrote, for scripts that mark the
#       log's length before a case; --log-pipe makes them a pipe that a cat of this
#       shell's copies into LOG, as `ivcudad 2>&1 | tee LOG` would), and returns
#       once it is ready: the sockets of
#       --socket and --guest-socket in ARGS and each --wait PATH (one a config file
#       names, a control socket) exist, and grep PATTERN matches in LOG (--join has
#       no socket of its own; a plain file's worker is a log line). Those socket
#       paths are removed first, so that an earlier daemon's cannot pass for this
#       one's. The pid is in $ivcudad_pid. The environment passes through
#       (VAR=value start_ivcudad ...).
#       Status 1, with LOG's last lines, when the daemon ends before it is ready,
#       or is not ready within 20 s (it is stopped then): a script's `|| exit 1`
#       fails with the reason instead of failing every case after it.
#       --may-stop: the daemon ending before it is ready is what the caller tests
#       for (a refused setting): status 1 without a word, and 2 for the time-out.
#   stop_ivcudad
#       SIGTERM to every daemon start_ivcudad started that still runs, then waits
#       for each; with none running it does nothing, so cleanup traps may call it.
ivcudad_pid=
ivcudad_pids=()

start_ivcudad() {
  local append="" may_stop="" pipe="" pattern="" log s ready pid rc daemon to
  local sockets=()
  daemon=${ivcudad_bin:-${build:?start_ivcudad: the script sets build, its build directory}/host-daemon/ivcudad}
  while :; do
    case "${1:-}" in
      --append) append=1; shift ;;
      --may-stop) may_stop=1; shift ;;
      --log-pipe) pipe=1; shift ;;
      --wait) sockets+=("$2"); shift 2 ;;
      --wait-log) pattern=$2; shift 2 ;;
      *) break ;;
    esac
  done
  log=$1
  shift
  local prev=""
  for s in "$@"; do
    case "$prev" in
      --socket) sockets+=("$s") ;;
      --guest-socket) sockets+=("${s%%=*}") ;;
    esac
    prev=$s
  done
  for s in "${sockets[@]}"; do rm -f "$s"; done
  # Where this daemon's lines begin: an earlier daemon's in the same log prove nothing.
  local mark=0
  [ -n "$append" ] && [ -e "$log" ] && mark=$(wc -c <"$log")
  if [ -n "$pipe" ]; then
    # Emptied here, not by the cat: a log emptied later could show an earlier daemon's line meanwhile.
    [ -n "$append" ] || : >"$log"
    exec {to}> >(exec cat >>"$log")
    "$daemon" "$@" >&"$to" 2>&1 &
    exec {to}>&-  # the daemon's alone: the cat ends with the daemon and what it started
  elif [ -n "$append" ]; then
    "$daemon" "$@" >>"$log" 2>&1 &
  else
    "$daemon" "$@" >"$log" 2>&1 &
  fi
  pid=$!
  ivcudad_pid=$pid
  ivcudad_pids+=("$pid")
  for _ in $(seq 400); do
    ready=1
    for s in "${sockets[@]}"; do [ -S "$s" ] || { ready=; break; }; done
    # Not grep -q: tail would die of SIGPIPE, a failure under pipefail.
    [ -n "$ready" ] && [ -n "$pattern" ] &&
      ! tail -c +"$((mark + 1))" "$log" 2>/dev/null | grep -- "$pattern" >/dev/null && ready=
    [ -n "$ready" ] && return 0
    # bash reaps an ended background job at once, so kill -0 fails as soon as it ends.
    if ! kill -0 "$pid" 2>/dev/null; then
      rc=0
      wait "$pid" 2>/dev/null || rc=$?
      ivcudad_forget "$pid"
      [ -n "$may_stop" ] && return 1
      echo "ivcudad did not start: it exited with status $rc before it was ready; the end of $log:"
      tail -40 "$log"
      return 1
    fi
    sleep 0.05
  done
  echo "ivcudad did not start: not ready within 20 s (sockets: ${sockets[*]:-none}; log line: ${pattern:-none});" \
    "the end of $log:"
  tail -40 "$log"
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  ivcudad_forget "$pid"
  if [ -n "$may_stop" ]; then return 2; fi
  return 1
}

stop_ivcudad() {
  local pid
  for pid in "${ivcudad_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${ivcudad_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  ivcudad_pids=()
  ivcudad_pid=
  return 0
}

# ivcudad_forget PID: no longer one of the daemons stop_ivcudad stops.
ivcudad_forget() {
  local kept=() pid
  for pid in "${ivcudad_pids[@]}"; do [ "$pid" = "$1" ] || kept+=("$pid"); done
  ivcudad_pids=("${kept[@]}")
  [ "$ivcudad_pid" = "$1" ] && ivcudad_pid=
  return 0
}
