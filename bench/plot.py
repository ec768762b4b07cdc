#!/usr/bin/env python3
"""Draws ivcuda-bench's JSON as a PNG with matplotlib.

    plot.py BENCH.json OUT.png

Top: four panels of bandwidth against copy size (host-to-device and
device-to-host, pageable and page-locked), native and ivcuda as two lines.
Bottom: every other figure as the ratio ivcuda / native on a log scale (for
times, below 1 is better; for rates and bandwidths, above 1 is).
matplotlib comes from the setup step (Debian's python3-matplotlib; the
interpreter that has it is the one CMake configured for the bench).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

NATIVE = "#325ac8"
IVCUDA = "#e67814"
BAR_TIME = "#78a078"
COPY_KINDS = (("htod.pageable", "host to device, pageable"), ("dtoh.pageable", "device to host, pageable"),
              ("htod.pinned", "host to device, page-locked"), ("dtoh.pinned", "device to host, page-locked"))


def is_copy(name):
    return any(name.startswith(k + ".") and name.endswith("KiB") for k, _ in COPY_KINDS)


def bandwidth_series(figures, kind):
    """[(size_kib, native, ivcuda)] for figures named KIND.<n>KiB, by size."""
    out = []
    for f in figures:
        head, _, last = f["name"].rpartition(".")
        if head == kind and last.endswith("KiB") and last[:-3].isdigit():
            out.append((int(last[:-3]), float(f["native"]), float(f["ivcuda"])))
    return sorted(out)


def size_label(kib):
    return "%d GiB" % (kib >> 20) if kib >= 1 << 20 else "%d MiB" % (kib >> 10) if kib >= 1024 else "%d KiB" % kib


def is_time(unit):
    return unit in ("us", "ms", "s", "us/launch")


def figure_order(name):
    """Sort key: by name, but sizes (X.<n>KiB) in numeric order."""
    head, _, last = name.rpartition(".")
    if head and last.endswith("KiB") and last[:-3].isdigit():
        return (head, int(last[:-3]))
    return (name, 0)


def render(doc, out):
    figures = doc.get("figures", [])
    others = sorted(((f["name"], float(f["native"]), float(f["ivcuda"]), f.get("unit", ""))
                     for f in figures if not is_copy(f["name"])), key=lambda o: figure_order(o[0]))
    ratio_h = max(2.0, 0.22 * len(others))
    fig = plt.figure(figsize=(12, 6 + ratio_h), dpi=100)
    grid = fig.add_gridspec(3, 2, height_ratios=[3, 3, ratio_h])
    fig.suptitle("ivcuda-bench" + (" (quick run)" if doc.get("quick") else ""))
    for i, (kind, label) in enumerate(COPY_KINDS):
        ax = fig.add_subplot(grid[i // 2, i % 2])
        series = bandwidth_series(figures, kind)
        ax.set_title(label, fontsize=10)
        ax.set_ylabel("GB/s")
        ax.grid(True, color="#e1e1e1")
        if not series:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            continue
        xs = [s[0] for s in series]
        ax.plot(xs, [s[1] for s in series], "o-", color=NATIVE, linewidth=2, label="native")
        ax.plot(xs, [s[2] for s in series], "o-", color=IVCUDA, linewidth=2, label="ivcuda")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([size_label(x) for x in xs], fontsize=7)
        ax.legend(fontsize=8)
    ax = fig.add_subplot(grid[2, :])
    ax.set_title("ivcuda / native (log scale). Times: below 1 is better; rates and bandwidths: above 1", fontsize=10)
    rows = [(name, ivc / nat if nat > 0 and ivc > 0 else 0.0, unit) for name, nat, ivc, unit in others]
    if rows:
        ys = range(len(rows))
        ratios = [r[1] if r[1] > 0 else 1.0 for r in rows]
        colours = [BAR_TIME if is_time(r[2]) else IVCUDA for r in rows]
        ax.barh(list(ys), [r - 1.0 for r in ratios], left=1.0, color=colours)
        ax.set_xscale("log", base=2)
        ax.set_yticks(list(ys))
        ax.set_yticklabels([r[0] for r in rows], fontsize=7)
        ax.invert_yaxis()
        ax.axvline(1.0, color="black", linewidth=1)
        for y, (name, ratio, unit) in zip(ys, rows):
            ax.text(ratio if ratio > 0 else 1.0, y, " %.3g" % ratio if ratio > 0 else " n/a", va="center", fontsize=7)
    else:
        ax.text(0.5, 0.5, "no figures", ha="center", va="center", transform=ax.transAxes)
    ax.grid(True, axis="x", color="#e1e1e1")
    fig.tight_layout()
    fig.savefig(out, format="png", facecolor="white")
    plt.close(fig)


def main(argv):
    if len(argv) != 3:
        sys.stderr.write("usage: plot.py BENCH.json OUT.png\n")
        return 2
    with open(argv[1], encoding="utf-8") as f:
        doc = json.load(f)
    render(doc, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
