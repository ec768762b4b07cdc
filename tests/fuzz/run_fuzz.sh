#!/usr/bin/env bash
# One harness's run in the fuzz test group (ctest -L fuzz):
#   run_fuzz.sh HARNESS CORPUS_DIR SECONDS [COVERAGE-FLOOR-ARGS...]
# Replays CORPUS_DIR (seeds and regression inputs, tests/fuzz/corpus/<harness>) and then
# fuzzes for SECONDS, with the harness's dictionary (tests/fuzz/<harness>.dict) where there
# is one. New inputs go to a scratch corpus: the committed one is only read.
# Any crash, sanitizer report, leak, timeout (10 s an input) or out-of-memory fails the test;
# the input that did it is kept in the current directory (crash-*, leak-*, ...) and shown.
# With COVERAGE-FLOOR-ARGS (worker_fuzz: coverage.py's options), the run also records which
# code it reached (-print_coverage=1, IVCUDA_FUZZ_OPSTATS=1), coverage.py reports it per handler
# (<harness>.coverage.txt, and .tsv), and a run under the floor fails.
set -euo pipefail
bin=$1 corpus=$2 secs=${3:-30}
shift $(( $# < 3 ? $# : 3 ))
floor=("$@")
here=$(cd "$(dirname "$0")" && pwd)
name=$(basename "$bin")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
log="$PWD/$name.log"
extra=()
[ ! -f "$here/$name.dict" ] || extra+=(-dict="$here/$name.dict")
[ ${#floor[@]} -eq 0 ] || { extra+=(-print_coverage=1); export IVCUDA_FUZZ_OPSTATS=1; }
rc=0
"$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${extra[@]}" \
  -artifact_prefix="$PWD/$name-" "$scratch" "$corpus" >"$log" 2>&1 || rc=$?
grep -E "^INFO: seed corpus|^#[0-9]+ *(INITED|DONE)|^stat::|^OPSTAT: [0-9]" "$log" || true
if [ "$rc" -ne 0 ]; then
  echo "FAIL: $name exited $rc; the end of its log ($log):"
  grep -vE "^(UN)?COVERED_(FUNC|PC)|^  UNCOVERED_PC|^OPSTAT" "$log" | tail -n 60
  for f in "$PWD/$name-"*; do
    [ -f "$f" ] || continue
    case "$f" in *-coverage.tsv) continue ;; esac
    echo "input that failed: $f (base64 below; add it to $corpus as regress-<what> once fixed)"
    base64 "$f" | head -c 8192
    echo
  done
  exit 1
fi
if [ ${#floor[@]} -ne 0 ]; then
  crc=0
  python3 "$here/coverage.py" "$log" --table "$PWD/$name.coverage.tsv" "${floor[@]}" >"$PWD/$name.coverage.txt" || crc=$?
  cat "$PWD/$name.coverage.txt"
  if [ "$crc" -ne 0 ]; then
    echo "FAIL: $name reached less of the worker than the floor (tests/fuzz/README.md, \"Coverage floor\")"
    exit 1
  fi
fi
echo "PASS: $name, no crash in ${secs} s"
