#!/usr/bin/env python3
"""bench/plot.py end to end: draw a sample bench JSON, then decode the PNG
with an independent reader and check what a viewer would rely on.

    plot_test.py PLOT_PY SAMPLE_JSON WORK_DIR
"""
import json
import os
import struct
import subprocess
import sys
import zlib


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def read_png(data):
    """(width, height, rows of RGB bytes); checks every chunk's CRC."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("no PNG signature")
    pos, chunks = 8, []
    while pos < len(data):
        if pos + 8 > len(data):
            fail("truncated chunk header at %d" % pos)
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if len(body) != length or pos + 12 + length > len(data):
            fail("truncated %r chunk" % kind)
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            fail("bad CRC in %r" % kind)
        chunks.append((kind, body))
        pos += 12 + length
    kinds = [k for k, _ in chunks]
    if kinds[0] != b"IHDR" or kinds[-1] != b"IEND" or b"IDAT" not in kinds:
        fail("chunk order %r" % kinds)
    w, h, depth, ctype, comp, filt, inter = struct.unpack(">IIBBBBB", chunks[0][1])
    if (depth, ctype, comp, filt, inter) != (8, 2, 0, 0, 0):
        fail("unexpected IHDR format %r" % ((depth, ctype, comp, filt, inter),))
    raw = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
    stride = 3 * w
    if len(raw) != h * (stride + 1):
        fail("IDAT holds %d bytes, %dx%d RGB needs %d" % (len(raw), w, h, h * (stride + 1)))
    rows = []
    for y in range(h):
        line = raw[y * (stride + 1):(y + 1) * (stride + 1)]
        if line[0] != 0:
            fail("row %d uses filter %d; the writer only emits filter 0" % (y, line[0]))
        rows.append(line[1:])
    return w, h, rows


def main(argv):
    plot, sample, work = argv[1:4]
    os.makedirs(work, exist_ok=True)
    out = os.path.join(work, "plot_test.png")
    if os.path.exists(out):
        os.remove(out)
    subprocess.run([sys.executable, plot, sample, out], check=True)
    with open(out, "rb") as f:
        w, h, rows = read_png(f.read())
    n_figures = len(json.load(open(sample, encoding="utf-8"))["figures"])
    if w != 1200 or h < 600:
        fail("unexpected size %dx%d" % (w, h))
    colours = {}
    for row in rows:
        for x in range(0, len(row), 3):
            c = bytes(row[x:x + 3])
            colours[c] = colours.get(c, 0) + 1
    background = max(colours, key=colours.get)
    if background != b"\xff\xff\xff":
        fail("background is %r, not white" % background)
    drawn = sum(n for c, n in colours.items() if c != background)
    if drawn < 0.01 * w * h:
        fail("only %d non-background pixels" % drawn)
    # Both series (plot.py's NATIVE and IVCUDA colours) and the axes' black.
    for name, rgb in (("native", (50, 90, 200)), ("ivcuda", (230, 120, 20)), ("black", (0, 0, 0))):
        if colours.get(bytes(rgb), 0) < 100:
            fail("hardly any %s pixels (%d)" % (name, colours.get(bytes(rgb), 0)))
    # Garbage in: a JSON without figures still gives a valid (empty) chart.
    empty = os.path.join(work, "empty.json")
    with open(empty, "w", encoding="utf-8") as f:
        json.dump({"quick": True, "figures": []}, f)
    subprocess.run([sys.executable, plot, empty, out], check=True)
    with open(out, "rb") as f:
        read_png(f.read())
    print("PASS: plot.py draws %d figures as a %dx%d PNG, %d pixels drawn" % (n_figures, w, h, drawn))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
