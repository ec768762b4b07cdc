#!/usr/bin/env python3
"""Runs each security rule's test with the rule removed: a test that still passes is no test.

The rule table of docs/security.md ("Rules the host enforces") gives every rule an id (first
column, in backticks) and, in its test column, the CTest tests that must FAIL when the rule is
gone, each in backticks (a Catch2 TEST_CASE name or a script test's CTest name, exactly). The
code marks where each rule is enforced with IVCUDA_RULE("id") (host-daemon/shared/rules.h); in the
mutation build (the asan preset, IVCUDA_MUTANTS) IVCUDA_MUTATE=id removes it at run time.

This script
  1. parses every table of the file whose first column is headed "id";
  2. checks that every id is kebab-case and unique, appears in the code as IVCUDA_RULE("id"),
     and that every IVCUDA_RULE in the code has a row;
  3. runs each named test once as CTest would (command, environment and working directory
     from `ctest --show-only=json-v1`), requiring a pass, and once per row with
     IVCUDA_MUTATE=id, requiring a failure (a test that times out has failed); with
     --passed-in, a test that a CTest run of this very build shows passing (its JUnit report)
     has that pass and its time as its baseline instead of running again;
  4. prints a table (rule, test, without the mutation, with it, time) and exits non-zero on
     any surviving mutant, failing baseline, unknown test or unmarked rule.

A row whose test column names no test must say "not in CI:" and why; it is listed, not run.
Tests run in parallel (-j), except that RUN_SERIAL tests run alone and tests sharing a
RESOURCE_LOCK one at a time, as under ctest.

usage: run_mutations.py BUILD_DIR [-j N] [--rule ID ...] [--passed-in JUNIT] [--check-only]
  --check-only   steps 1 and 2 only (any build; tests/mutations registers this as a CTest test)
"""
import argparse
import json
import xml.etree.ElementTree as ET
import os
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.normpath(os.path.join(HERE, "..", ".."))
TABLE = os.path.join(SOURCE, "docs", "security.md")
# Where rules are enforced. rules.h itself only defines the macro (and shows it in a comment).
CODE_DIRS = ("host-daemon", "ring", "include", "guest")
CODE_EXT = (".cc", ".h", ".c")
SKIP_FILES = {os.path.join("host-daemon", "shared", "rules.h")}
ID_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
MARK_RE = re.compile(r'IVCUDA_RULE\(\s*"([^"]*)"\s*\)')
NOT_IN_CI = "not in ci:"


class Row:
    def __init__(self, rule_id, tests, text, line, not_in_ci):
        self.id = rule_id
        self.tests = tests
        self.text = text
        self.line = line
        self.not_in_ci = not_in_ci


def cells(line):
    # A table line: "| a | b |". Pipes inside backticks are kept (none are expected).
    parts, cur, code = [], "", False
    for ch in line.strip()[1:]:
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return parts


def parse_table(path):
    rows, errors = [], []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    i = 0
    while i < len(lines):
        head = lines[i]
        if head.startswith("|") and cells(head)[:1] == ["id"]:
            names = [c.lower() for c in cells(head)]
            if "test" not in names:
                errors.append(f"{path}:{i + 1}: a rule table without a test column")
            t = names.index("test") if "test" in names else -1
            i += 2  # the header and its |---| line
            while i < len(lines) and lines[i].startswith("|"):
                c = cells(lines[i])
                ident = re.fullmatch(r"`([^`]*)`", c[0]) if c else None
                if ident is None:
                    errors.append(f"{path}:{i + 1}: the first column must be the rule's id in backticks")
                else:
                    test_cell = c[t] if 0 <= t < len(c) else ""
                    tests = re.findall(r"`([^`]+)`", test_cell)
                    rule_text = c[1] if len(c) > 1 else ""
                    rows.append(Row(ident.group(1), tests, rule_text, i + 1, NOT_IN_CI in test_cell.lower()))
                i += 1
            continue
        i += 1
    return rows, errors


def strip_comments(text):
    # Line comments only: markers are code, and a "//" inside a string literal does not occur
    # on a marker's line.
    return "\n".join(line.split("//", 1)[0] for line in text.split("\n"))


def markers(source):
    found = {}
    for d in CODE_DIRS:
        for root, _, files in os.walk(os.path.join(source, d)):
            for name in sorted(files):
                if not name.endswith(CODE_EXT):
                    continue
                path = os.path.join(root, name)
                rel = os.path.relpath(path, source)
                if rel in SKIP_FILES:
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    code = strip_comments(f.read())
                for n, line in enumerate(code.split("\n"), 1):
                    for m in MARK_RE.finditer(line):
                        found.setdefault(m.group(1), []).append(f"{rel}:{n}")
    return found


def check(rows, errors, marks):
    seen = {}
    for r in rows:
        if not ID_RE.match(r.id):
            errors.append(f"rule table line {r.line}: id {r.id!r} is not kebab-case")
        if r.id in seen:
            errors.append(f"rule table line {r.line}: id {r.id!r} also on line {seen[r.id]}")
        seen[r.id] = r.line
        if r.id not in marks:
            errors.append(f"rule table line {r.line}: no IVCUDA_RULE(\"{r.id}\") in {', '.join(CODE_DIRS)}")
        if not r.tests and not r.not_in_ci:
            errors.append(f"rule table line {r.line}: `{r.id}` names no test (backticks) and does not say "
                          f"\"not in CI:\" and why")
    for ident, where in sorted(marks.items()):
        if ident not in seen:
            errors.append(f"IVCUDA_RULE(\"{ident}\") at {', '.join(where)} has no row in the rule table")
    return errors


def registry(build):
    res = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"run_mutations: ctest --show-only failed in {build}: {res.stderr}")
    tests = {}
    for t in json.loads(res.stdout)["tests"]:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        tests[t["name"]] = {
            "command": t.get("command", []),
            "cwd": props.get("WORKING_DIRECTORY", build),
            "env": props.get("ENVIRONMENT", []),
            "timeout": float(props.get("TIMEOUT", 1500)),
            "serial": bool(props.get("RUN_SERIAL", False)),
            "locks": set(props.get("RESOURCE_LOCK", [])),
        }
    return tests


def mutation_build(build):
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            return any(re.match(r"IVCUDA_MUTANTS:BOOL=(ON|1|TRUE|YES)$", line.strip(), re.I) for line in f)
    except OSError:
        return False


class Job:
    def __init__(self, test, spec, rule, logdir, index):
        self.test, self.spec, self.rule = test, spec, rule
        self.log = os.path.join(logdir, f"{index:03d}-{rule or 'baseline'}.log")
        self.timeout = spec["timeout"]
        self.rc, self.timed_out, self.seconds = None, False, 0.0

    def run(self):
        env = {k: v for k, v in os.environ.items() if k not in ("IVCUDA_MUTATE", "IVCUDA_FAIL_FAST")}
        for kv in self.spec["env"]:
            k, _, v = kv.partition("=")
            env[k] = v
        if self.rule is not None:
            env["IVCUDA_MUTATE"] = self.rule
            # A mutant needs only to fail: test scripts stop at their first FAIL (tests/lib/verdicts.sh),
            # Catch2 cases at their first failed assertion (tests/test_main.cc).
            env["IVCUDA_FAIL_FAST"] = "1"
        start = time.monotonic()
        with open(self.log, "w") as out:
            out.write(f"# {self.test!r} with IVCUDA_MUTATE={self.rule or ''}\n# {' '.join(self.spec['command'])}\n")
            out.flush()
            p = subprocess.Popen(self.spec["command"], cwd=self.spec["cwd"], env=env, stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                self.rc = p.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self.timed_out = True
                os.killpg(p.pid, signal.SIGKILL)
                self.rc = p.wait()
            finally:
                # Whatever the test left running in its session (daemons, guests) goes too.
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.seconds = time.monotonic() - start

    @property
    def passed(self):
        return self.rc == 0 and not self.timed_out


class Passed:
    """A baseline that a CTest run of the same build already gave: the test passed, in `seconds`."""

    def __init__(self, test, seconds, report):
        self.test, self.seconds, self.log = test, seconds, report
        self.rc, self.timed_out = 0, False
        self.passed = True


def passed_in(report, build):
    """The tests a CTest JUnit report (ctest --output-junit) shows passing, with their times.

    The report must be newer than the build's test registry, so that it ran these very tests."""
    if os.path.getmtime(report) < os.path.getmtime(os.path.join(build, "CTestTestfile.cmake")):
        sys.exit(f"run_mutations: {report} is older than {build}'s tests: not a run of this build")
    out = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        if case.get("status") == "run" and case.find("failure") is None and case.find("error") is None:
            out[case.get("name")] = float(case.get("time", "0"))
    return out


def run_all(jobs, parallel):
    """Runs jobs, at most `parallel` at once, RUN_SERIAL ones alone, one per RESOURCE_LOCK."""
    pending = list(jobs)
    running = set()
    held = set()
    cond = threading.Condition()

    def worker(job):
        job.run()
        with cond:
            running.discard(job)
            held.difference_update(job.spec["locks"])
            cond.notify_all()

    with cond:
        while pending or running:
            started = False
            for job in list(pending):
                spec = job.spec
                if len(running) >= parallel or (running and spec["serial"]) or \
                        any(j.spec["serial"] for j in running) or spec["locks"] & held:
                    continue
                pending.remove(job)
                running.add(job)
                held.update(spec["locks"])
                threading.Thread(target=worker, args=(job,), daemon=True).start()
                started = True
            if not started:
                cond.wait()


def tail(path, n=25):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build", nargs="?", help="the mutation build (build/asan)")
    ap.add_argument("--table", default=TABLE)
    ap.add_argument("--source", default=SOURCE)
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--rule", action="append", default=[], help="only these ids (repeatable)")
    ap.add_argument("--mutant-timeout", type=float, default=30.0,
                    help="a test with its rule removed may run this many seconds or ten times as long as "
                         "it ran as is, whichever is more (within its CTest TIMEOUT); then it has failed")
    ap.add_argument("--passed-in", metavar="JUNIT",
                    help="a CTest JUnit report of a run of this build: the tests it shows passing are "
                         "not run again as their own baseline")
    ap.add_argument("--check-only", action="store_true")
    a = ap.parse_args()
    t0 = time.monotonic()

    rows, errors = parse_table(a.table)
    if not rows:
        errors.append(f"{a.table}: no rule table (a table whose first column is headed \"id\")")
    errors = check(rows, errors, markers(a.source))
    if a.check_only:
        for e in errors:
            print(f"run_mutations: {e}")
        print(f"run_mutations: {len(rows)} rules in {os.path.relpath(a.table)}, "
              f"{sum(len(r.tests) for r in rows)} tests named, {len(errors)} problems")
        return 1 if errors else 0
    if a.build is None:
        ap.error("BUILD_DIR is needed unless --check-only")
    build = os.path.abspath(a.build)
    if not mutation_build(build):
        sys.exit(f"run_mutations: {build} is no mutation build (IVCUDA_MUTANTS=ON: the asan preset)")
    tests = registry(build)
    chosen = [r for r in rows if not a.rule or r.id in a.rule]
    for ident in a.rule:
        if ident not in {r.id for r in rows}:
            errors.append(f"--rule {ident}: no such row")
    for r in chosen:
        for t in r.tests:
            if t not in tests:
                errors.append(f"rule table line {r.line}: `{r.id}` names {t!r}, which {build} does not register")

    logdir = os.path.join(build, "mutations")
    os.makedirs(logdir, exist_ok=True)
    for old in os.listdir(logdir):
        if old.endswith(".log"):
            os.unlink(os.path.join(logdir, old))
    earlier = passed_in(a.passed_in, build) if a.passed_in else {}
    jobs, baseline, fresh = [], {}, []
    for r in chosen:
        for t in r.tests:
            if t in tests and t not in baseline:
                if t in earlier:
                    baseline[t] = Passed(t, earlier[t], a.passed_in)
                else:
                    baseline[t] = Job(t, tests[t], None, logdir, len(jobs))
                    jobs.append(baseline[t])
                    fresh.append(baseline[t])
    mutants = []
    for r in chosen:
        for t in r.tests:
            if t in tests:
                mutants.append((r, Job(t, tests[t], r.id, logdir, len(jobs))))
                jobs.append(mutants[-1][1])

    # Scripts first in each phase, so that the tail of a phase is not one long test alone.
    def scripts_first(js):
        return sorted(js, key=lambda j: 0 if j.spec["command"][0].endswith(".sh") else 1)

    # Each test as it is first: that it passes is half the verdict, and how long it takes
    # bounds its mutants (one that hangs, a daemon stuck in a lie, has failed).
    run_all(scripts_first(fresh), max(1, a.jobs))
    for _, m in mutants:
        m.timeout = min(m.spec["timeout"], max(a.mutant_timeout, 10 * baseline[m.test].seconds))
    run_all(scripts_first(m for _, m in mutants), max(1, a.jobs))

    survivors, broken = [], []
    width_id = max([len(r.id) for r in chosen] + [4])
    width_t = min(70, max([len(t) for r in chosen for t in r.tests] + [4]))
    print(f"{'rule':<{width_id}}  {'test':<{width_t}}  {'as is':<6}  {'rule removed':<22}  time")
    for r in chosen:
        if not r.tests:
            print(f"{r.id:<{width_id}}  {'(not in CI: see the table)':<{width_t}}  {'-':<6}  {'not run':<22}")
            continue
        for t in r.tests:
            name = t if len(t) <= width_t else t[:width_t - 3] + "..."
            b = baseline.get(t)
            m = next((j for rr, j in mutants if rr is r and j.test == t), None)
            if b is None or m is None:
                print(f"{r.id:<{width_id}}  {name:<{width_t}}  {'?':<6}  {'unknown test':<22}")
                continue
            as_is = "pass" if b.passed else ("TIMEOUT" if b.timed_out else f"FAIL {b.rc}")
            if m.passed:
                verdict = "PASSES: not tested"
                survivors.append((r, m))
            else:
                verdict = "fails (timed out)" if m.timed_out else f"fails (exit {m.rc})"
            if not b.passed:
                broken.append(b)
            print(f"{r.id:<{width_id}}  {name:<{width_t}}  {as_is:<6}  {verdict:<22}  {m.seconds:5.1f}s")
    for b in {id(b): b for b in broken}.values():
        print(f"\n--- {b.test!r} fails without any mutation ({b.log}):\n{tail(b.log)}")
    for r, m in survivors:
        print(f"\n--- {m.test!r} passes with `{r.id}` removed ({m.log}):\n{tail(m.log, 10)}")
    for e in errors:
        print(f"run_mutations: {e}")
    runs = len(jobs)
    reused = f", {len(baseline) - len(fresh)} passed in {os.path.relpath(a.passed_in)}" if a.passed_in else ""
    print(f"run_mutations: {len(chosen)} rules, {len(mutants)} mutant runs, {len(fresh)} baseline runs{reused} "
          f"({runs} in all, -j {a.jobs}) in {time.monotonic() - t0:.0f} s; {len(survivors)} surviving mutants, "
          f"{len({id(b) for b in broken})} failing baselines, {len(errors)} other problems")
    return 1 if survivors or broken or errors else 0


if __name__ == "__main__":
    sys.exit(main())
