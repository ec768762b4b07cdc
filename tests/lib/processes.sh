# shellcheck shell=bash
# Shell helpers for tests that watch the daemon's processes; source it.

# process_ended PID: every thread of PID has exited (each is gone or a zombie).
# The thread-group leader alone is not enough: it can be a zombie while other
# threads still run, and the process's files (its device memory, its locks)
# are let go only when the last thread exits.
process_ended() {
  local t
  [ -e "/proc/$1" ] || return 0
  for t in /proc/"$1"/task/*; do
    [ -e "$t/stat" ] || continue
    grep -qE '^[0-9]+ \(.*\) [ZX]' "$t/stat" 2>/dev/null || return 1
  done
  return 0
}

# children_of PID: the processes whose parent is PID, one a line, read from
# every /proc/N/stat (its fourth field, after the command's closing
# parenthesis). /proc/PID/task/PID/children names only the main thread's
# children and, while others are forked or exit, may leave some out.
children_of() {
  local f s
  for f in /proc/[0-9]*/stat; do
    s=$(cat "$f" 2>/dev/null) || continue
    s=${s##*) }
    s=${s#* }
    [ "${s%% *}" = "$1" ] && { f=${f#/proc/}; echo "${f%/stat}"; }
  done
  return 0
}
