#!/usr/bin/env python3
"""tools/lint_tests.py against snippets: each known-bad one is refused with its rule, each
known-good one passes. (The audit's finding for each rule is named with it.)

    lint_tests_test.py LINT_TESTS_PY
"""
import os
import subprocess
import sys
import tempfile
import textwrap

SOURCE = ". \"$(dirname \"$0\")/../lib/verdicts.sh\"\n"

# (name, file name, text, the rule it must raise or None)
CASES = [
    # Row 1: the program's status is lost to the substitution's.
    ("status after a command substitution", "a.sh", SOURCE + """
        expect_cases 1
        prog >"$f"
        verdict "runs: $(tail -1 "$f")" $?
        finish
    """, "status-after-substitution"),
    ("the same in backticks and over two lines", "b.sh", SOURCE + """
        expect_cases 1
        prog
        verdict "runs: `tail -1 f`" \\
          "$?"
        finish
    """, "status-after-substitution"),
    ("a status taken on the program's line", "c.sh", SOURCE + """
        expect_cases 1
        prog >"$f"; rc=$?
        verdict "runs: $(tail -1 "$f")" $rc
        finish
    """, None),
    ("$? of a test with a plain variable in the name", "d.sh", SOURCE + """
        expect_cases 1
        [ "$n" -gt 0 ]; verdict "lists $n sections" $?
        finish
    """, None),
    # Row 8: a case that cannot fail.
    ("a literal status", "e.sh", SOURCE + """
        expect_cases 1
        cat out.txt
        verdict "nvidia-smi ran (recorded, not judged)" 0
        finish
    """, "literal-status"),
    ("a literal failure in a function", "f.sh", SOURCE + """
        expect_cases 1
        check() { if ok; then verdict "$1" "$rc"; else verdict "$1" 1; fi; }
        check x
        finish
    """, "literal-status"),
    # Row 11: no expected count.
    ("no expect_cases", "g.sh", SOURCE + """
        prog; verdict "runs" $?
        finish
    """, "no-expected-count"),
    ("no finish", "h.sh", SOURCE + """
        expect_cases 1
        prog; verdict "runs" $?
    """, "no-finish"),
    ("a verdict of its own", "i.sh", """
        passed=0 failed=0
        verdict() { if [ "$2" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi; }
        prog; verdict "runs" $?
        [ "$failed" -eq 0 ]
    """, "own-verdicts"),
    ("a literal count while a loop makes the cases", "j.sh", SOURCE + """
        expect_cases 3
        for p in a b c; do
          "$p"; verdict "$p" $?
        done
        finish
    """, "literal-count-with-loops"),
    ("a literal count while a loop calls a function that makes a case", "k.sh", SOURCE + """
        expect_cases 3
        run_one() {
          "$1"
          verdict "$1" $?
        }
        while read -r p; do run_one "$p"; done <list
        finish
    """, "literal-count-with-loops"),
    ("a count derived from the loop's list", "l.sh", SOURCE + """
        programs=(a b c)
        expect_cases $((${#programs[@]} + 1))
        for p in "${programs[@]}"; do "$p"; verdict "$p" $?; done
        [ -s log ]; verdict "the log has lines" $?
        finish
    """, None),
    ("a literal count in a script without loops of cases, waits in loops", "m.sh", SOURCE + """
        expect_cases 2
        for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
        prog; verdict "one" $?
        judge "two" grep -q x out
        cat <<'PY' | python3
for case in cases:
    verdict(case, 0)
PY
        finish
    """, None),
    # Row 19: a skip rule of its own.
    ("IVCUDA_ALLOW_SKIPS read outside tests/skip.h", "n_test.cc", """
        if (std::getenv("IVCUDA_ALLOW_SKIPS") == nullptr) FAIL("missing");
    """, "own-skip-rule"),
    ("IVCUDA_SKIP used", "o_test.cc", """
        if (!have_tool) IVCUDA_SKIP("no tool");
    """, None),
]


def main():
    lint = sys.argv[1]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, file, text, rule in CASES:
            path = os.path.join(tmp, file)
            with open(path, "w", encoding="utf-8") as f:
                f.write(textwrap.dedent(text).lstrip("\n"))
            p = subprocess.run([sys.executable, lint, path], capture_output=True, text=True, timeout=60)
            found = [line.split(": ")[1] for line in p.stdout.splitlines() if line.startswith(path + ":")]
            ok = (p.returncode == 0 and not found) if rule is None else (p.returncode == 1 and found == [rule])
            print(f"{'PASS' if ok else 'FAIL'} {name}: {'refused: ' + ', '.join(found) if found else 'accepted'}"
                  f" (expected: {rule or 'accepted'})")
            if not ok:
                print(p.stdout + p.stderr)
                failures += 1
    print(f"{len(CASES) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
