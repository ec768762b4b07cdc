#!/usr/bin/env python3
"""Runs api_probe on ivcuda's libcuda.so.1 and compares every answer with NVIDIA's driver.

usage: compare_answers.py API_PROBE LIBCUDA REQUESTS RECORDED

RECORDED is api_probe's output on the real driver (data/real_driver_answers.txt). Every
question asked here must have a recorded answer, and the answers must be equal, except for
graphics interop names, which ivcuda deliberately does not provide: those must be "not found".
"""
import re
import subprocess
import sys

INTEROP = re.compile(r"^'(cuGL|cuEGL|cuVDPAU|cuGraphicsGL|cuGraphicsEGL|cuGraphicsVDPAU|"
                     r"cuGraphicsResourceGetMappedEgl)")
LINE = re.compile(r"^(?P<q>.*?) -> (?P<a>.*)$")


def parse(text):
    answers = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        if not m:
            sys.exit(f"compare_answers: unparsable line: {line!r}")
        answers.setdefault(m.group("q"), m.group("a"))  # repeated questions: first answer
    return answers


def main():
    probe, lib, requests, recorded = sys.argv[1:5]
    res = subprocess.run([probe, lib, requests], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"compare_answers: api_probe failed ({res.returncode}): {res.stderr}")
    ours = parse(res.stdout)
    with open(recorded) as f:
        real = parse(f.read())

    bad = []
    compared = interop = 0
    for q, a in ours.items():
        if INTEROP.match(q):
            interop += 1
            if a != "rc=0 status=1 NULL":
                bad.append(f"{q}: interop must be not found, got {a}")
        elif q == "(null) 13000 0":
            if not a.startswith("rc=1 "):  # the real driver crashes here; refuse instead
                bad.append(f"{q}: expected INVALID_VALUE, got {a}")
        elif q not in real:
            bad.append(f"{q}: no recorded answer (re-record with api_probe on a real driver)")
        elif a != real[q]:
            bad.append(f"{q}: driver says {real[q]}, ivcuda says {a}")
        else:
            compared += 1
    print(f"{compared} answers equal to the driver's, {interop} interop names not found, "
          f"{len(bad)} differences")
    for b in bad[:50]:
        print("DIFF " + b)
    return 1 if bad or compared < 1000 else 0


if __name__ == "__main__":
    sys.exit(main())
