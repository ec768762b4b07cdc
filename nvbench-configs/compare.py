#!/usr/bin/env python3
"""Compare two NVBench `--json` result files: a native run and a run through ivcuda.

Usage: compare.py [--json OUT] NATIVE.json GUEST.json

States are matched by benchmark name and state name (NVBench's "Device=0 Duration=0.0001"
string). For each matched state it prints cold GPU time, cold CPU time and batch GPU time of
both runs, their guest/native ratios, and the overhead per task: guest cold CPU mean minus
native cold CPU mean. A cold sample is one isolated launch timed on the CPU from submission
to completion, so that difference is what forwarding adds to every synchronous task.

Exit status: 0 on success, 1 if OUT cannot be written, 2 on unreadable or invalid input.
Standard library only, so that it runs in a bare guest.
"""

import argparse
import json
import math
import sys

# (key, summary tag, label): the summaries compared, in print order.
METRICS = (
    ("cold_gpu", "nv/cold/time/gpu/mean", "cold GPU time"),
    ("cold_cpu", "nv/cold/time/cpu/mean", "cold CPU time"),
    ("batch_gpu", "nv/batch/time/gpu/mean", "batch GPU time"),
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
    wanted = {tag: key for key, tag, _ in METRICS}
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


def _ratio(native, guest):
    if native is None or guest is None or native <= 0.0:
        return None
    return guest / native


def compare(native_records, guest_records):
    """Match states and compute the comparison; values in seconds, None where missing."""
    guest_by_key = {_key(r): r for r in guest_records}
    native_keys = {_key(r) for r in native_records}
    rows = []
    for nat in native_records:
        gst = guest_by_key.get(_key(nat))
        if gst is None:
            continue
        metrics = {}
        for key, _, _ in METRICS:
            n = nat["values"].get(key)
            g = gst["values"].get(key)
            metrics[key] = {"native": n, "guest": g, "ratio": _ratio(n, g)}
        n_cpu = metrics["cold_cpu"]["native"]
        g_cpu = metrics["cold_cpu"]["guest"]
        overhead = None if n_cpu is None or g_cpu is None else g_cpu - n_cpu
        rows.append({
            "benchmark": nat["benchmark"],
            "state": nat["state"],
            "occurrence": nat["occurrence"],
            "native_skipped": nat["skip_reason"] if nat["skipped"] else None,
            "guest_skipped": gst["skip_reason"] if gst["skipped"] else None,
            "metrics": metrics,
            "overhead_per_task_s": overhead,
        })

    def only(records, other_keys):
        return [{"benchmark": r["benchmark"], "state": r["state"], "occurrence": r["occurrence"]}
                for r in records if _key(r) not in other_keys]

    return {
        "states": rows,
        "native_only": only(native_records, set(guest_by_key)),
        "guest_only": only(guest_records, native_keys),
    }


def _title(rec):
    suffix = f" (run {rec['occurrence'] + 1})" if rec["occurrence"] else ""
    return f"{rec['benchmark']} [{rec['state']}]{suffix}"


def _us(seconds):
    return "-" if seconds is None else f"{seconds * 1e6:.3f} us"


def render(result, native_path, guest_path):
    out = [f"native: {native_path}", f"guest:  {guest_path}", ""]
    for row in result["states"]:
        out.append(_title(row))
        for side in ("native", "guest"):
            reason = row[f"{side}_skipped"]
            if reason is not None:
                out.append(f"  {side} run skipped this state: {reason or 'no reason given'}")
        out.append(f"  {'':<16}{'native':>16}{'guest':>16}{'guest/native':>14}")
        for key, _, label in METRICS:
            m = row["metrics"][key]
            ratio = "-" if m["ratio"] is None else f"{m['ratio']:.3f}"
            out.append(f"  {label:<16}{_us(m['native']):>16}{_us(m['guest']):>16}{ratio:>14}")
        overhead = row["overhead_per_task_s"]
        shown = "-" if overhead is None else f"{overhead * 1e6:+.3f} us"
        out.append(f"  overhead per task (guest - native cold CPU mean): {shown}")
        out.append("")
    for side in ("native", "guest"):
        lonely = result[f"{side}_only"]
        if lonely:
            out.append(f"only in the {side} run ({len(lonely)}):")
            out.extend(f"  {_title(r)}" for r in lonely)
            out.append("")
    if not result["states"]:
        out.append("no state is present in both runs")
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Compare NVBench --json results of a native run and a run through ivcuda.")
    parser.add_argument("native", metavar="NATIVE.json", help="NVBench --json output, native run")
    parser.add_argument("guest", metavar="GUEST.json", help="NVBench --json output, through ivcuda")
    parser.add_argument("--json", metavar="OUT", dest="json_out",
                        help="also write the comparison as JSON (times in seconds)")
    args = parser.parse_args(argv)

    try:
        native = load(args.native)
        guest = load(args.guest)
    except InvalidInput as e:
        print(f"compare.py: {e}", file=sys.stderr)
        return 2

    result = compare(native, guest)
    sys.stdout.write(render(result, args.native, args.guest))

    if args.json_out:
        doc = {"native": args.native, "guest": args.guest, **result}
        try:
            with open(args.json_out, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=2)
                f.write("\n")
        except OSError as e:
            print(f"compare.py: cannot write {args.json_out}: {e.strerror or e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
