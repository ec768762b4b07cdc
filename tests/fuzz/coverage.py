#!/usr/bin/env python3
"""How much of the worker's request handlers a worker_fuzz run reached, and whether that is
above the floor CI holds it to.

    coverage.py LOG [--floor FILE] [--min-success N] [--min-share PCT] [--table FILE]
    coverage.py LOG --write-floor FILE [--margin 0.8]

LOG is worker_fuzz's output of a run with -print_coverage=1 and IVCUDA_FUZZ_OPSTATS=1
(run_fuzz.sh runs it so): libFuzzer's COVERED_FUNC / UNCOVERED_FUNC lines (instrumented edges
covered of those instrumented, per function; ASan's and UBSan's report paths are edges too, so
no handler gets near 100 %) and the harness's OPSTAT lines (replies per op, and how many said
CUDA_SUCCESS). A handler is Worker::on_<Op> of include/ivcuda/proto.h's op table, with the
lambdas and template instances defined inside it and its parts: the functions named
Worker::on_<Op>_<part> it hands its request to (on_GraphQuery's answers, one per kind of
question). Helpers that several handlers share count for none of them. A handler is "entered"
if on_<Op> ran at all and "past its first check" if it covered more than the two edges of its
entry and its first early return (or all of its edges).

The floor (exit 1 below it): every handler entered; each handler at least the edges --floor
FILE names for it (worker_floor.tsv: --write-floor writes --margin, 80 %, of what LOG reached,
from a replay of the committed corpus alone: tests/fuzz/README.md); at least --min-share
percent of its own edges; at least --min-success ops answering CUDA_SUCCESS. Prints the totals
and one line per handler; --table also writes the per-handler numbers as TSV.
"""
import argparse
import os
import re
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from proto_layout import Proto  # noqa: E402

FUNC = re.compile(r"^(COVERED|UNCOVERED)_FUNC: hits: (\d+) edges: (\d+)/(\d+) (.*?) \S+:\d+$")
OPSTAT = re.compile(r"^OPSTAT: (\w+) replies (\d+) success (\d+)$")


def read(log):
    ops = list(Proto().ops)
    handlers = {op: {"entered": False, "covered": 0, "edges": 0, "seen": False} for op in ops}
    replies, successes = {}, {}
    total_cov = total_edges = None
    with open(log, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = FUNC.match(line)
            if m:
                hits, cov, edges, name = int(m.group(2)), int(m.group(3)), int(m.group(4)), m.group(5)
                # Op names are CamelCase: an underscore after one starts a part's name.
                h = re.search(r"Worker::on_([A-Za-z0-9]+)(_\w+)?\(", name)
                if h is None or h.group(1) not in handlers:
                    continue
                d = handlers[h.group(1)]
                d["covered"] += cov
                d["edges"] += edges
                # The handler itself, not a part, nor a lambda or instance inside one.
                if h.group(2) is None and re.search(r"Worker::on_\w+\([^()]*\)$", name):
                    d["seen"] = True
                    d["entered"] |= hits > 0
                continue
            m = OPSTAT.match(line)
            if m:
                replies[m.group(1)] = int(m.group(2))
                successes[m.group(1)] = int(m.group(3))
                continue
            m = re.match(r"^#\d+\s+DONE\s+cov: (\d+)", line)
            if m:
                total_cov = int(m.group(1))
            m = re.match(r"^INFO: Loaded 1 modules\s+\((\d+) inline 8-bit counters\)", line)
            if m:
                total_edges = int(m.group(1))
    return handlers, replies, successes, total_cov, total_edges


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log")
    ap.add_argument("--min-share", type=float, default=0.0, help="percent of its edges every handler must cover")
    ap.add_argument("--min-success", type=int, default=0, help="ops that must have answered CUDA_SUCCESS")
    ap.add_argument("--table", help="write the per-handler numbers here (TSV)")
    ap.add_argument("--floor", help="TSV of op and the edges each handler must cover at least")
    ap.add_argument("--write-floor", help="write such a TSV from LOG instead of checking")
    ap.add_argument("--margin", type=float, default=0.8, help="--write-floor: the share of LOG's edges")
    a = ap.parse_args()
    handlers, replies, successes, total_cov, total_edges = read(a.log)
    if a.write_floor:
        with open(a.write_floor, "w") as f:
            f.write(f"# Edges each worker handler must cover in CI's worker_fuzz run (tests/fuzz/coverage.py):\n"
                    f"# {a.margin:g} of what a replay of the committed corpus reached. Regenerate after changing\n"
                    f"# handlers or seeds (tests/fuzz/README.md, \"Coverage floor\").\n"
                    f"op\tmin_edges\tedges\n")
            for op, d in handlers.items():
                f.write(f"{op}\t{int(d['covered'] * a.margin)}\t{d['edges']}\n")
        print(f"coverage: wrote {a.write_floor} ({len(handlers)} handlers, {a.margin:g} of {a.log})")
        return 0
    floor = {}
    if a.floor:
        for line in open(a.floor):
            if line.startswith("#") or line.startswith("op\t") or not line.strip():
                continue
            op, n, _ = line.rstrip("\n").split("\t")
            floor[op] = int(n)
    if not any(d["seen"] for d in handlers.values()):
        print(f"coverage: no COVERED_FUNC lines for Worker::on_* in {a.log} (run with -print_coverage=1)")
        return 1
    if not replies and a.min_success > 0:
        print(f"coverage: no OPSTAT lines in {a.log} (run with IVCUDA_FUZZ_OPSTATS=1)")
        return 1
    failures = []
    rows = []
    for op, d in handlers.items():
        share = 100.0 * d["covered"] / d["edges"] if d["edges"] else 100.0
        past = d["covered"] > 2 or (d["edges"] > 0 and d["covered"] == d["edges"])
        rows.append((op, d, share, past))
        if not d["seen"]:
            failures.append(f"on_{op}: not in the coverage listing (not instrumented?)")
        elif not d["entered"]:
            failures.append(f"on_{op}: never entered")
        elif share < a.min_share:
            failures.append(f"on_{op}: {d['covered']}/{d['edges']} edges ({share:.0f} %) < {a.min_share:g} %")
        elif d["covered"] < floor.get(op, 0):
            failures.append(f"on_{op}: {d['covered']} edges covered < {floor[op]}, its floor")
    for op in floor:
        if op not in handlers:
            failures.append(f"{a.floor}: {op} is no op of the table (regenerate the floor)")
    cov = sum(d["covered"] for d in handlers.values())
    edges = sum(d["edges"] for d in handlers.values())
    entered = sum(1 for _, d, _, _ in rows if d["entered"])
    past = sum(1 for _, d, _, p in rows if d["entered"] and p)
    ok = sum(1 for op in handlers if successes.get(op, 0) > 0)
    if ok < a.min_success:
        failures.append(f"{ok} ops answered CUDA_SUCCESS < {a.min_success}")
    print(f"coverage: {total_cov} of {total_edges} instrumented edges covered in all; "
          f"handlers: {cov} of {edges} edges ({100.0 * cov / max(edges, 1):.1f} %), "
          f"{entered} of {len(handlers)} entered, {past} past their first check, "
          f"{ok} ops answered CUDA_SUCCESS")
    for op, d, share, p in sorted(rows, key=lambda r: (r[2], r[0])):
        print(f"  {op:24s} {d['covered']:4d}/{d['edges']:<4d} {share:5.1f} %  replies {replies.get(op, 0):8d}"
              f"  success {successes.get(op, 0):8d}{'' if d['entered'] else '  NEVER ENTERED'}")
    if a.table:
        with open(a.table, "w") as f:
            f.write("op\tcovered\tedges\tshare\treplies\tsuccess\n")
            for op, d, share, _ in rows:
                f.write(f"{op}\t{d['covered']}\t{d['edges']}\t{share:.1f}\t{replies.get(op, 0)}\t"
                        f"{successes.get(op, 0)}\n")
    if failures:
        print(f"coverage: FAIL, under the floor (every handler entered, each at least its edges in "
              f"{a.floor} and {a.min_share:g} % of its edges, >= {a.min_success} ops answering CUDA_SUCCESS):")
        for f in failures:
            print("  " + f)
        return 1
    print(f"coverage: PASS (floor: every handler entered, each at least its edges in {a.floor} and "
          f"{a.min_share:g} % of its edges, >= {a.min_success} ops answering CUDA_SUCCESS)")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` is no error
    sys.exit(main())
