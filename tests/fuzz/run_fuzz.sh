#!/usr/bin/env bash
# One harness's run in the fuzz test group (ctest -L fuzz):
#   run_fuzz.sh HARNESS CORPUS_DIR SECONDS
# Replays CORPUS_DIR (seeds and regression inputs, tests/fuzz/corpus/<harness>) and then
# fuzzes for SECONDS. New inputs go to a scratch corpus: the committed one is only read.
# Any crash, sanitizer report, leak, timeout (10 s an input) or out-of-memory fails the test;
# the input that did it is kept in the current directory (crash-*, leak-*, ...) and shown.
set -euo pipefail
bin=$1 corpus=$2 secs=${3:-30}
name=$(basename "$bin")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
log="$PWD/$name.log"
rc=0
"$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$PWD/$name-" "$scratch" "$corpus" >"$log" 2>&1 || rc=$?
grep -E "^INFO: seed corpus|^#[0-9]+ *INITED|^stat::" "$log" || true
if [ "$rc" -ne 0 ]; then
  echo "FAIL: $name exited $rc; the end of its log ($log):"
  tail -n 60 "$log"
  for f in "$PWD/$name-"*; do
    [ -f "$f" ] || continue
    echo "input that failed: $f (base64 below; add it to $corpus as regress-<what> once fixed)"
    base64 "$f" | head -c 8192
    echo
  done
  exit 1
fi
echo "PASS: $name, no crash in ${secs} s"
