#!/usr/bin/env python3
"""Compare NVBench `--json` result files: a native run and one or more other runs of the same
benchmarks (through ivcuda in process mode, in a guest, in a VFIO passthrough guest).

Usage: compare.py [--json OUT] [--plot PNG] NATIVE.json [LABEL=]RUN.json...

States are matched by benchmark name and state name (NVBench's "Device=0 Duration=0.0001"
string). For each matched state it prints cold GPU time, cold CPU time, batch GPU time and
bandwidth of every run, each run's ratio to native, and each run's overhead per task: its cold
CPU mean minus the native cold CPU mean. A cold sample is one isolated launch timed on the CPU
from submission to completion, so that difference is what forwarding adds to every synchronous
task. A run given without LABEL= is called "guest" when it is the only one, else by its file name.

--plot draws the ratios (matplotlib; without it the plot is left out, saying so, and the rest
goes on). Exit status: 0 when every state the native run measured was measured by every other
run too; 3 when the comparison is incomplete: a state native measured is missing from another
run or was skipped there (a state native skipped too is no fault of the other run), or no state
at all was measured by native and another run (NVBench exits 0 for skipped states, so a run that
skipped everything looks like success); 1 if OUT or PNG cannot be written; 2 on unreadable or
invalid input. The comparison itself needs the standard library only, so that it runs in a bare
guest.
"""

import argparse
import json
import math
import os
import sys

# (key, summary tag, label, unit): the summaries compared, in print order. Times are in seconds,
# bandwidth in bytes per second (NVBench's global memory bandwidth, from the cold GPU time).
METRICS = (
    ("cold_gpu", "nv/cold/time/gpu/mean", "cold GPU time", "s"),
    ("cold_cpu", "nv/cold/time/cpu/mean", "cold CPU time", "s"),
    ("batch_gpu", "nv/batch/time/gpu/mean", "batch GPU time", "s"),
    ("bandwidth", "nv/cold/bw/global/bytes_per_second", "bandwidth", "B/s"),
)

# json_printer writes meta.version.json; 1.x is the list-of-summaries layout read here.
SUPPORTED_JSON_MAJOR = 1


class InvalidInput(Exception):
    """The file is not NVBench JSON output this tool understands."""


def _expect(cond, path, where, what):
    if not cond:
        raise InvalidInput(f"{path}: {where}: {what}")


def _parse_number(path, where, entry):
    """Return a summary data entry's value as a float, or None if it is not finite.

    NVBench writes int64 and float64 values as strings (JSON numbers would lose int64
    precision); older writers used plain numbers, which are accepted too.
    """
    kind = entry.get("type")
    value = entry.get("value")
    _expect(kind in ("float64", "int64"), path, where,
            f"value has type {kind!r}, expected float64 or int64")
    if isinstance(value, bool):
        raise InvalidInput(f"{path}: {where}: value is a boolean")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise InvalidInput(f"{path}: {where}: value {value!r} is not a number") from None
    else:
        raise InvalidInput(f"{path}: {where}: value is neither a string nor a number")
    # A mean of no samples is NaN or inf: there is nothing to compare.
    return number if math.isfinite(number) else None


def _summary_values(path, where, summaries):
    """Map the tags in METRICS to their "value" entry (seconds), validating every summary."""
    found = {}
    if summaries is None:  # json_printer leaves a state without summaries as null.
        return found
    _expect(isinstance(summaries, list), path, where, "'summaries' is not a list")
    wanted = {tag: key for key, tag, _, _ in METRICS}
    for i, summ in enumerate(summaries):
        swhere = f"{where}, summary {i}"
        _expect(isinstance(summ, dict), path, swhere, "not an object")
        tag = summ.get("tag")
        _expect(isinstance(tag, str), path, swhere, "missing string 'tag'")
        data = summ.get("data", [])
        _expect(isinstance(data, list), path, f"{swhere} ({tag})", "'data' is not a list")
        for j, entry in enumerate(data):
            ewhere = f"{swhere} ({tag}), data {j}"
            _expect(isinstance(entry, dict), path, ewhere, "not an object")
            _expect(isinstance(entry.get("name"), str), path, ewhere, "missing string 'name'")
            _expect(isinstance(entry.get("type"), str), path, ewhere, "missing string 'type'")
            _expect("value" in entry, path, ewhere, "missing 'value'")
            if tag in wanted and entry["name"] == "value":
                found[wanted[tag]] = _parse_number(path, ewhere, entry)
    return found


def _json_format_major(root):
    """meta.version.json.major, or None where an older writer left it out."""
    node = root
    for name in ("meta", "version", "json", "major"):
        if not isinstance(node, dict):
            return None
        node = node.get(name)
    return node if isinstance(node, int) and not isinstance(node, bool) else None


def load(path):
    """Read one NVBench JSON file into an ordered list of state records.

    Each record: {"benchmark", "state", "occurrence", "skipped", "skip_reason", "values"}.
    occurrence counts earlier states with the same names, so that a benchmark given twice on
    the command line (`-b X -b X`) is matched run by run.
    """
    try:
        with open(path, "r", encoding="utf-8") as f:
            root = json.load(f)
    except OSError as e:
        raise InvalidInput(f"{path}: cannot read: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidInput(f"{path}: not valid JSON: {e}") from None

    _expect(isinstance(root, dict), path, "top level", "not an object")
    major = _json_format_major(root)
    if major is not None and major != SUPPORTED_JSON_MAJOR:
        raise InvalidInput(f"{path}: NVBench JSON format {major}.x is not supported "
                           f"(this tool reads {SUPPORTED_JSON_MAJOR}.x)")
    benchmarks = root.get("benchmarks")
    _expect(isinstance(benchmarks, list), path, "top level",
            "no 'benchmarks' list (is this NVBench --json output?)")

    records = []
    seen = {}
    for b, bench in enumerate(benchmarks):
        bwhere = f"benchmark {b}"
        _expect(isinstance(bench, dict), path, bwhere, "not an object")
        bname = bench.get("name")
        _expect(isinstance(bname, str), path, bwhere, "missing string 'name'")
        states = bench.get("states")
        if states is None:  # a benchmark with no states is written as null
            continue
        _expect(isinstance(states, list), path, f"{bwhere} ({bname})", "'states' is not a list")
        for s, state in enumerate(states):
            swhere = f"{bwhere} ({bname}), state {s}"
            _expect(isinstance(state, dict), path, swhere, "not an object")
            sname = state.get("name")
            if sname is None and "description" in state:
                raise InvalidInput(f"{path}: {swhere}: states carry 'description', not 'name': "
                                   "the JSON layout of NVBench before 1.0, not supported")
            _expect(isinstance(sname, str), path, swhere, "missing string 'name'")
            skipped = state.get("is_skipped", False)
            _expect(isinstance(skipped, bool), path, swhere, "'is_skipped' is not a boolean")
            reason = state.get("skip_reason", "")
            values = _summary_values(path, f"{swhere} ({sname})", state.get("summaries"))
            occurrence = seen.get((bname, sname), 0)
            seen[(bname, sname)] = occurrence + 1
            records.append({
                "benchmark": bname,
                "state": sname,
                "occurrence": occurrence,
                "skipped": skipped,
                "skip_reason": reason if isinstance(reason, str) else "",
                "values": values,
            })
    return records


def _key(rec):
    return (rec["benchmark"], rec["state"], rec["occurrence"])


def _ratio(native, other):
    if native is None or other is None or native <= 0.0:
        return None
    return other / native


def compare(native_records, runs):
    """Match states and compute the comparison; values in seconds (bandwidth in B/s), None
    where missing. `runs` is a list of (label, records) in column order."""
    by_key = [(label, {_key(r): r for r in records}) for label, records in runs]
    native_keys = {_key(r) for r in native_records}
    rows = []
    for nat in native_records:
        others = [(label, table.get(_key(nat))) for label, table in by_key]
        others = [(label, rec) for label, rec in others if rec is not None]
        if not others:
            continue
        metrics = {}
        for key, _, _, _ in METRICS:
            n = nat["values"].get(key)
            metrics[key] = {"native": n, "runs": {
                label: {"value": rec["values"].get(key),
                        "ratio": _ratio(n, rec["values"].get(key))}
                for label, rec in others}}
        n_cpu = nat["values"].get("cold_cpu")
        overhead = {}
        for label, rec in others:
            o_cpu = rec["values"].get("cold_cpu")
            overhead[label] = None if n_cpu is None or o_cpu is None else o_cpu - n_cpu
        rows.append({
            "benchmark": nat["benchmark"],
            "state": nat["state"],
            "occurrence": nat["occurrence"],
            "native_skipped": nat["skip_reason"] if nat["skipped"] else None,
            "skipped": {label: (rec["skip_reason"] if rec["skipped"] else None)
                        for label, rec in others},
            "metrics": metrics,
            "overhead_per_task_s": overhead,
        })

    def title(r):
        return {"benchmark": r["benchmark"], "state": r["state"], "occurrence": r["occurrence"]}

    every_run = set().union(*(set(table) for _, table in by_key)) if by_key else set()
    return {
        "labels": [label for label, _ in runs],
        "states": rows,
        "native_only": [title(r) for r in native_records if _key(r) not in every_run],
        "only": {label: [title(r) for r in records if _key(r) not in native_keys]
                 for label, records in runs},
    }


def gaps(result, native_records, runs):
    """Why the comparison is incomplete, one line each; empty when it is complete."""
    problems = []
    tables = [(label, {_key(r): r for r in records}) for label, records in runs]
    for nat in native_records:
        if nat["skipped"]:
            continue
        for label, table in tables:
            rec = table.get(_key(nat))
            if rec is None:
                problems.append(f"{_title(nat)}: measured natively, missing from the {label} run")
            elif rec["skipped"]:
                problems.append(f"{_title(nat)}: measured natively, skipped by the {label} run "
                                f"({rec['skip_reason'] or 'no reason given'})")
    measured = [row for row in result["states"]
                if row["native_skipped"] is None and any(v is None for v in row["skipped"].values())]
    if not measured:
        problems.append("no state was measured by the native run and another")
    return problems


def _title(rec):
    suffix = f" (run {rec['occurrence'] + 1})" if rec["occurrence"] else ""
    return f"{rec['benchmark']} [{rec['state']}]{suffix}"


def _show(value, unit):
    if value is None:
        return "-"
    if unit == "B/s":
        return f"{value / 1e9:.3f} GB/s"
    return f"{value * 1e6:.3f} us"


def render(result, native_path, paths):
    labels = result["labels"]
    out = [f"native: {native_path}"]
    out += [f"{label}: {paths[label]}" for label in labels]
    out.append("")
    header = f"  {'':<16}{'native':>16}"
    for label in labels:
        header += f"{label:>16}{label + '/native':>{max(14, len(label) + 9)}}"
    for row in result["states"]:
        out.append(_title(row))
        if row["native_skipped"] is not None:
            out.append(f"  native run skipped this state: {row['native_skipped'] or 'no reason given'}")
        for label in labels:
            reason = row["skipped"].get(label)
            if reason is not None:
                out.append(f"  {label} run skipped this state: {reason or 'no reason given'}")
        out.append(header)
        for key, _, name, unit in METRICS:
            m = row["metrics"][key]
            if m["native"] is None and all(r["value"] is None for r in m["runs"].values()):
                if key == "bandwidth":  # only copies report one: no line of dashes elsewhere
                    continue
            line = f"  {name:<16}{_show(m['native'], unit):>16}"
            for label in labels:
                r = m["runs"].get(label)
                value = None if r is None else r["value"]
                ratio = None if r is None else r["ratio"]
                shown = "-" if ratio is None else f"{ratio:.3f}"
                line += f"{_show(value, unit):>16}{shown:>{max(14, len(label) + 9)}}"
            out.append(line)
        for label in labels:
            if label not in row["overhead_per_task_s"]:
                continue
            overhead = row["overhead_per_task_s"][label]
            shown = "-" if overhead is None else f"{overhead * 1e6:+.3f} us"
            out.append(f"  overhead per task ({label} - native cold CPU mean): {shown}")
        out.append("")
    if result["native_only"]:
        out.append(f"only in the native run ({len(result['native_only'])}):")
        out.extend(f"  {_title(r)}" for r in result["native_only"])
        out.append("")
    for label in labels:
        lonely = result["only"][label]
        if lonely:
            out.append(f"only in the {label} run ({len(lonely)}):")
            out.extend(f"  {_title(r)}" for r in lonely)
            out.append("")
    if not result["states"]:
        out.append("no state is present in the native run and another")
    return "\n".join(out).rstrip("\n") + "\n"


def plot(result, path):
    """Draw each run's ratios to native, one panel per metric, one row of bars per state.

    Returns None when written, else why not. matplotlib is imported here, so that the
    comparison itself runs without it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed"
    labels = result["labels"]
    panels = []
    for key, _, name, _ in METRICS:
        states = [row for row in result["states"]
                  if any(r["ratio"] is not None for r in row["metrics"][key]["runs"].values())]
        if states:
            panels.append((key, name, states))
    if not panels:
        return "no state has a ratio to draw"
    height = sum(max(2.0, 0.35 * len(states) * max(1, len(labels))) for _, _, states in panels)
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 1.2 * len(panels) + height),
                             squeeze=False)
    bar = 0.8 / max(1, len(labels))
    for ax, (key, name, states) in zip(axes[:, 0], panels):
        for i, label in enumerate(labels):
            ys = [s + (i - (len(labels) - 1) / 2) * bar for s in range(len(states))]
            ratios = [(row["metrics"][key]["runs"].get(label) or {}).get("ratio") for row in states]
            ax.barh([y for y, r in zip(ys, ratios) if r is not None],
                    [r for r in ratios if r is not None], height=bar, label=label)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(states)))
        ax.set_yticklabels([_title(row) for row in states], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"{name}: run / native (1 = native)", fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        plt.close(fig)
        raise OSError(e.errno, f"cannot write {path}: {e.strerror or e}") from None
    plt.close(fig)
    return None


def _parse_run(arg, count):
    """'LABEL=PATH' or 'PATH' -> (label, path)."""
    label, sep, path = arg.partition("=")
    if sep and label and "/" not in label and not os.path.exists(arg):
        return label, path
    if count == 1:
        return "guest", arg
    base = os.path.basename(arg)
    return (base[:-5] if base.endswith(".json") else base), arg


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Compare NVBench --json results of a native run and runs through ivcuda.")
    parser.add_argument("native", metavar="NATIVE.json", help="NVBench --json output, native run")
    parser.add_argument("runs", metavar="[LABEL=]RUN.json", nargs="+",
                        help="NVBench --json output of another run (process mode, a guest, VFIO)")
    parser.add_argument("--json", metavar="OUT", dest="json_out",
                        help="also write the comparison as JSON (times in seconds)")
    parser.add_argument("--plot", metavar="PNG", help="also draw the ratios (needs matplotlib)")
    args = parser.parse_args(argv)

    runs = [_parse_run(arg, len(args.runs)) for arg in args.runs]
    labels = [label for label, _ in runs]
    if len(set(labels)) != len(labels) or "native" in labels:
        parser.error(f"each run needs its own label other than 'native', got {', '.join(labels)}")
    try:
        native = load(args.native)
        loaded = [(label, load(path)) for label, path in runs]
    except InvalidInput as e:
        print(f"compare.py: {e}", file=sys.stderr)
        return 2

    result = compare(native, loaded)
    sys.stdout.write(render(result, args.native, dict(runs)))
    problems = gaps(result, native, loaded)
    result["incomplete"] = problems

    status = 0
    if args.json_out:
        doc = {"native": args.native, "runs": dict(runs), **result}
        try:
            with open(args.json_out, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=2)
                f.write("\n")
        except OSError as e:
            print(f"compare.py: cannot write {args.json_out}: {e.strerror or e}", file=sys.stderr)
            status = 1
    if args.plot:
        try:
            why = plot(result, args.plot)
        except OSError as e:
            print(f"compare.py: {e.strerror or e}", file=sys.stderr)
            return 1
        if why is None:
            print(f"plot: {args.plot}")
        else:
            print(f"compare.py: {why}: no plot written (pip install matplotlib, or "
                  f"apt-get install python3-matplotlib)", file=sys.stderr)
    if problems:
        print(f"\ncomparison incomplete ({len(problems)}):")
        for line in problems:
            print(f"  {line}")
        print(f"compare.py: the comparison is incomplete: {problems[0]}"
              f"{f' (and {len(problems) - 1} more)' if len(problems) > 1 else ''}", file=sys.stderr)
        return status or 3
    return status


if __name__ == "__main__":
    sys.exit(main())
