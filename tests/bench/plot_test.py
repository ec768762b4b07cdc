#!/usr/bin/env python3
"""bench/plot.py end to end: draw a sample bench JSON, then read the PNG back
(Pillow) and check what a viewer relies on: a valid image of the expected
width, a white background, both series drawn in their colours, and a valid
image even for a JSON without figures.

    plot_test.py PLOT_PY SAMPLE_JSON WORK_DIR
"""
import json
import os
import subprocess
import sys

from PIL import Image


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def colours_of(path):
    with Image.open(path) as im:
        im.verify()  # chunk CRCs and structure
    with Image.open(path) as im:
        rgb = im.convert("RGB")
        return rgb.size, {c: n for n, c in rgb.getcolors(maxcolors=1 << 24)}


def main(argv):
    plot, sample, work = argv[1:4]
    os.makedirs(work, exist_ok=True)
    out = os.path.join(work, "plot_test.png")
    if os.path.exists(out):
        os.remove(out)
    subprocess.run([sys.executable, plot, sample, out], check=True)
    (w, h), colours = colours_of(out)
    n_figures = len(json.load(open(sample, encoding="utf-8"))["figures"])
    if w != 1200 or h < 600:
        fail("unexpected size %dx%d" % (w, h))
    background = max(colours, key=colours.get)
    if background != (255, 255, 255):
        fail("background is %r, not white" % (background,))
    drawn = sum(n for c, n in colours.items() if c != background)
    if drawn < 0.01 * w * h:
        fail("only %d non-background pixels" % drawn)
    # Both series (plot.py's NATIVE and IVCUDA colours) and the axes' black.
    for name, rgb in (("native", (0x32, 0x5a, 0xc8)), ("ivcuda", (0xe6, 0x78, 0x14)), ("black", (0, 0, 0))):
        if colours.get(rgb, 0) < 100:
            fail("hardly any %s pixels (%d)" % (name, colours.get(rgb, 0)))
    # Garbage in: a JSON without figures still gives a valid (empty) chart.
    empty = os.path.join(work, "empty.json")
    with open(empty, "w", encoding="utf-8") as f:
        json.dump({"quick": True, "figures": []}, f)
    subprocess.run([sys.executable, plot, empty, out], check=True)
    colours_of(out)
    print("PASS: plot.py draws %d figures as a %dx%d PNG, %d pixels drawn" % (n_figures, w, h, drawn))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
