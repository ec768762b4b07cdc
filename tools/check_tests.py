#!/usr/bin/env python3
"""Checks that a build registers exactly the tests tests/expected-tests.tsv names.

A test group that configure dropped, a test case renamed or deleted, or a discovery that
found nothing shows up here as a named difference, instead of as a shorter green run.

usage: check_tests.py BUILD_DIR [--labels L1,L2] [--exclude-labels L1,L2]
       check_tests.py BUILD_DIR --update        rewrite the list from this build (default preset)

The list holds one test per line, "labels<TAB>name", sorted. --labels keeps the tests with any
of those labels (on both sides), --exclude-labels drops them: the presets run subsets.
Tests with a label of OWN_PRESET_LABELS are registered by their own preset only (the fuzz
harnesses: the fuzz preset), so the other presets' checks exclude them, and an --update from
a build that registers none of them keeps their lines:
       check_tests.py build/fuzz --update --labels fuzz   rewrites just the fuzz tests
"""
import argparse
import json
import os
import subprocess
import sys

OWN_PRESET_LABELS = {"fuzz"}
LIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "expected-tests.tsv")


def registered(build):
    res = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"check_tests: ctest --show-only failed in {build}: {res.stderr}")
    tests = {}
    for t in json.loads(res.stdout)["tests"]:
        labels = []
        for p in t.get("properties", []):
            if p["name"] == "LABELS":
                labels = sorted(p["value"])
        tests[t["name"]] = labels
    return tests


def expected():
    tests = {}
    with open(LIST) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            labels, name = line.split("\t", 1)
            tests[name] = sorted(labels.split(";")) if labels else []
    return tests


def keep(tests, include, exclude):
    return {n: l for n, l in tests.items()
            if (not include or set(l) & include) and not (set(l) & exclude)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--labels", default="")
    ap.add_argument("--exclude-labels", default="")
    ap.add_argument("--update", action="store_true")
    a = ap.parse_args()
    have = registered(a.build)
    include = set(filter(None, a.labels.split(",")))
    exclude = set(filter(None, a.exclude_labels.split(",")))
    if a.update:
        old = expected() if os.path.exists(LIST) else {}
        if include or exclude:
            # Only the tests this selection covers are rewritten.
            have = keep(have, include, exclude)
            kept = {n: l for n, l in old.items() if n not in keep(old, include, exclude)}
        else:
            # Another preset's own tests stay, unless this build registers some.
            mine = {lab for labels in have.values() for lab in labels}
            kept = {n: l for n, l in old.items() if set(l) & (OWN_PRESET_LABELS - mine)}
        have = {**kept, **have}
        with open(LIST, "w") as f:
            f.write("# Every test the default preset registers, as labels<TAB>name (tools/check_tests.py).\n"
                    "# tools/test.sh fails when a build registers fewer or others; after adding or renaming\n"
                    "# tests, regenerate: python3 tools/check_tests.py build/default --update\n"
                    "# (the fuzz preset's: tools/check_tests.py build/fuzz --update --labels fuzz)\n")
            for name in sorted(have):
                f.write(";".join(have[name]) + "\t" + name + "\n")
        print(f"check_tests: wrote {len(have)} tests to {os.path.relpath(LIST)}")
        return
    want = keep(expected(), include, exclude)
    have = keep(have, include, exclude)
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    for n in missing:
        print(f"check_tests: MISSING {n!r} (labels {';'.join(want[n])})")
    for n in extra:
        print(f"check_tests: NOT IN THE LIST {n!r}: add it with tools/check_tests.py build/default --update")
    relabelled = sorted(n for n in set(want) & set(have) if want[n] != have[n])
    for n in relabelled:
        print(f"check_tests: LABELS CHANGED {n!r}: {';'.join(want[n])} -> {';'.join(have[n])}")
    print(f"check_tests: {len(have)} tests registered in {a.build}, {len(want)} expected"
          + (f" (labels {a.labels})" if include else "") + (f" (without {a.exclude_labels})" if exclude else ""))
    if missing or extra or relabelled:
        sys.exit(1)


if __name__ == "__main__":
    main()
