# Shared by the test scripts (sourced): one line per case, counted, and a
# closing line whose numbers are the script's exit status.
#   verdict NAME RC      PASS when RC is 0, FAIL otherwise
#   not_run NAME REASON  a case that cannot run here: FAIL, unless the developer
#                        asked for skips (IVCUDA_ALLOW_SKIPS=1), then SKIP
#   expect_cases N       the script's own count of cases: fewer verdicts fail
#   finish               prints "N passed, N failed[, N skipped]"; returns non-zero on any failure
#   "${tagged[@]}" PIDFILE CMD...  runs CMD with its process id written to PIDFILE first (exec
#                        keeps it); an array, so that timeout and env can run it
#   served_by LOG PID    true if ivcudad's LOG shows that process, or a child of it (a
#                        framework's worker processes), said hello to a worker
passed=0 failed=0 skipped=0 expected_cases=
verdict() {
  if [ "$2" -eq 0 ]; then echo "PASS $1"; passed=$((passed + 1))
  else echo "FAIL $1 (exit $2)"; failed=$((failed + 1)); fi
}
not_run() {
  if [ "${IVCUDA_ALLOW_SKIPS:-}" = 1 ]; then echo "SKIP $1: $2"; skipped=$((skipped + 1))
  else echo "FAIL $1: not run: $2 (IVCUDA_ALLOW_SKIPS=1 lets it skip)"; failed=$((failed + 1)); fi
}
expect_cases() { expected_cases=$1; }
finish() {
  local seen=$((passed + failed + skipped))
  if [ -n "$expected_cases" ] && [ "$seen" -ne "$expected_cases" ]; then
    echo "FAIL $expected_cases cases expected, $seen reported"
    failed=$((failed + 1))
  fi
  echo "$passed passed, $failed failed, $skipped skipped"
  [ "$failed" -eq 0 ]
}
# shellcheck disable=SC2016 # expanded by that sh
tagged=(sh -c 'echo $$ >"$0"; exec "$@"')
served_by() { grep -Eq "process $2 says hello|says hello \(parent $2\)" "$1"; }
