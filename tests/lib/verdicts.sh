# Shared by the test scripts (sourced): one line per case, counted, and a
# closing line whose numbers are the script's exit status.
#   verdict NAME RC      PASS when RC is 0, FAIL otherwise. RC is a status taken on the line of
#                        the command it judges (`prog; rc=$?`): `$?` after a `$(...)` in NAME is
#                        that substitution's status, not the program's (tools/lint_tests.py)
#   judge NAME CMD...    runs CMD and judges its status: verdict NAME with it
#   not_run NAME REASON  a case that cannot run here: FAIL, unless the developer
#                        asked for skips (IVCUDA_ALLOW_SKIPS=1), then SKIP
#   expect_cases N       the script's own count of cases, derived from its lists
#                        where it loops over them: fewer or more verdicts fail,
#                        and so does a script that never says how many
#   finish               prints "N passed, N failed[, N skipped]"; returns non-zero on any failure
#   "${tagged[@]}" PIDFILE CMD...  runs CMD with its process id written to PIDFILE first (exec
#                        keeps it); an array, so that timeout and env can run it
#   log_mark LOG         prints where LOG ends now (bytes), for served_by
#   served_by LOG PID MARK  true if ivcudad's LOG, past MARK, has that process, or a child of
#                        it (a framework's worker processes), saying hello to a worker: the
#                        INFO line a served hello logs, not the refusal of one; and only past
#                        MARK (log_mark before the process started), so that an earlier
#                        process with the same pid proves nothing
# With IVCUDA_FAIL_FAST=1 (the mutation runner's mutant runs: tests/mutations/run_mutations.py)
# the first FAIL ends the script with status 1, through its EXIT trap: a run with a security rule
# removed needs only to fail, and the cases after the first failure cost it time.
passed=0 failed=0 skipped=0 expected_cases=
verdict() {
  if [ "$2" -eq 0 ]; then echo "PASS $1"; passed=$((passed + 1))
  else echo "FAIL $1 (exit $2)"; failed=$((failed + 1)); fail_fast; fi
}
fail_fast() {
  if [ "${IVCUDA_FAIL_FAST:-}" = 1 ]; then echo "(IVCUDA_FAIL_FAST: stopping at the first failure)"; exit 1; fi
}
judge() {
  local name=$1; shift
  "$@"
  verdict "$name" $?
}
not_run() {
  if [ "${IVCUDA_ALLOW_SKIPS:-}" = 1 ]; then echo "SKIP $1: $2"; skipped=$((skipped + 1))
  else echo "FAIL $1: not run: $2 (IVCUDA_ALLOW_SKIPS=1 lets it skip)"; failed=$((failed + 1)); fail_fast; fi
}
expect_cases() { expected_cases=$1; }
finish() {
  local seen=$((passed + failed + skipped))
  if [ -z "$expected_cases" ]; then
    echo "FAIL the script never said how many cases to expect (expect_cases)"
    failed=$((failed + 1))
  elif [ "$seen" -ne "$expected_cases" ]; then
    echo "FAIL $expected_cases cases expected, $seen reported"
    failed=$((failed + 1))
  fi
  echo "$passed passed, $failed failed, $skipped skipped"
  [ "$failed" -eq 0 ]
}
# shellcheck disable=SC2016 # expanded by that sh
tagged=(sh -c 'echo $$ >"$0"; exec "$@"')
log_mark() { if [ -e "$1" ]; then wc -c <"$1"; else echo 0; fi; }
served_by() {
  if [ $# -ne 3 ] || ! [[ $2 =~ ^[0-9]+$ && $3 =~ ^[0-9]+$ ]]; then
    echo "served_by LOG PID MARK: got '$*'" >&2
    return 2
  fi
  # The worker's line is "... info: guest G: process P says hello (parent Q)" (host-daemon/worker/contexts.cc).
  # Not grep -q: it would leave tail to die of SIGPIPE, a failure under pipefail.
  tail -c +"$(($3 + 1))" "$1" 2>/dev/null |
    grep -E " info: guest [0-9]+: process ($2 says hello \(parent [0-9]+\)|[0-9]+ says hello \(parent $2\))$" >/dev/null
}
