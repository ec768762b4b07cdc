#!/usr/bin/env bash
# tests/lib/verdicts.sh against made-up daemon logs and scripts: served_by takes only a served
# hello of that process (or its child) past the mark, not a refused one (the audit's E4) nor an
# earlier process's with the same pid; finish fails a script without an expected count, or
# with another count than reported; not_run fails unless IVCUDA_ALLOW_SKIPS is exactly 1.
#   verdicts_test.sh   (from anywhere)
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../lib/verdicts.sh
. "$here/../lib/verdicts.sh"
work=$(mktemp -d /tmp/ivcuda-verdicts.XXXXXX)
trap 'rm -rf "$work"' EXIT
log=$work/ivcudad.log
hello() { echo "12:00:00.000 ivcudad worker g$1 info: guest $1: process $2 says hello (parent $3)" >>"$log"; }
refused() {
  echo "12:00:00.000 ivcudad worker g$1 warn: guest $1 channel 2: process $2 says hello on a channel of process $3; refused" >>"$log"
}
# isnt CMD...: true when CMD fails
isnt() { ! "$@"; }
# script BODY: runs BODY in a bash that sourced verdicts.sh; its exit status
script() { IVCUDA_ALLOW_SKIPS=${allow-} bash -c ". '$here/../lib/verdicts.sh'; $1" >"$work/script.out" 2>&1; }
expect_cases 11

: >"$log"
mark=$(log_mark "$log")
hello 1 4242 17
judge "served_by: the hello of that very process" served_by "$log" 4242 "$mark"
: >"$log"
refused 3 4242 17
judge "served_by: a refused hello is no proof (E4)" isnt served_by "$log" 4242 0
: >"$log"
hello 1 5000 1
mark=$(log_mark "$log")
echo "12:00:01.000 ivcudad info: guest 2 (uid 0) connected on s; worker pid 77" >>"$log"
judge "served_by: a reused pid's earlier hello, before the mark, is no proof" isnt served_by "$log" 5000 "$mark"
hello 2 6001 5000
judge "served_by: a child of the process said hello past the mark" served_by "$log" 5000 "$mark"
hello 3 5000 1
judge "served_by: the process's own hello past the mark" served_by "$log" 5000 "$mark"
isnt served_by "$log" "" 0 2>/dev/null && isnt served_by "$log" 5000 2>/dev/null &&
  isnt served_by "$log" '5.*' 0 2>/dev/null
verdict "served_by: no pid, no mark or a pattern for a pid is an error, not a match" $?
allow=
judge "finish: a script that never said how many cases fails" isnt script 'verdict a 0; finish'
judge "finish: fewer cases than expected fail" isnt script 'expect_cases 2; verdict a 0; finish'
judge "finish: as many cases as expected pass" script 'expect_cases 2; verdict a 0; judge b true; finish'
allow=0
judge "not_run with IVCUDA_ALLOW_SKIPS=0 is a failure" isnt script 'expect_cases 1; not_run a "no tool"; finish'
allow=1
judge "not_run with IVCUDA_ALLOW_SKIPS=1 is a skip" script 'expect_cases 1; not_run a "no tool"; finish'
finish
