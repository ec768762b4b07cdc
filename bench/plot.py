#!/usr/bin/env python3
"""Draws ivcuda-bench's JSON as a PNG, with the Python standard library only.

    plot.py BENCH.json OUT.png

The GPU machine has no plotting packages, so this file carries its own tiny
raster canvas, a 5x7 bitmap font and a PNG encoder (zlib + struct). Top: four
panels of bandwidth against copy size (HtoD/DtoH, pageable/page-locked),
native and ivcuda as two lines. Bottom: every other figure as the ratio
ivcuda / native on a log scale (for times, below 1 is better; for rates and
bandwidths, above 1 is).
"""
import json
import math
import struct
import sys
import zlib

WHITE = (255, 255, 255)
BLACK = (0, 0, 0)
GRID = (225, 225, 225)
NATIVE = (50, 90, 200)
IVCUDA = (230, 120, 20)
BAR_TIME = (120, 160, 120)

# 5x7 glyphs, one byte per row, bit 4 = leftmost column.
_FONT_HEX = {
    "0": "0E11131519110E", "1": "040C040404040E", "2": "0E11010204081F", "3": "1F02040201110E",
    "4": "02060A121F0202", "5": "1F101E0101110E", "6": "0608101E11110E", "7": "1F010204080808",
    "8": "0E11110E11110E", "9": "0E11110F01020C",
    "A": "0E11111F111111", "B": "1E11111E11111E", "C": "0E11101010110E", "D": "1C12111111121C",
    "E": "1F10101E10101F", "F": "1F10101E101010", "G": "0E11101711110F", "H": "1111111F111111",
    "I": "0E04040404040E", "J": "0702020202120C", "K": "11121418141211", "L": "1010101010101F",
    "M": "111B1515111111", "N": "11111915131111", "O": "0E11111111110E", "P": "1E11111E101010",
    "Q": "0E11111115120D", "R": "1E11111E141211", "S": "0F10100E01011E", "T": "1F040404040404",
    "U": "1111111111110E", "V": "11111111110A04", "W": "1111111515150A",
    "X": "11110A040A1111", "Y": "11110A04040404", "Z": "1F01020408101F",
    " ": "00000000000000", ".": "00000000000C0C", ",": "000000000C0408", "-": "0000001F000000",
    "+": "0004041F040400", "/": "01010204081010", "(": "02040808080402", ")": "08040202020408",
    "%": "18190204081303", ":": "000C0C000C0C00", "_": "0000000000001F", "=": "00001F001F0000",
    ";": "000C0C000C0408", "<": "02040810080402", ">": "08040201020408", "?": "0E110102040004",
}
FONT = {c: [int(h[i:i + 2], 16) for i in range(0, 14, 2)] for c, h in _FONT_HEX.items()}
GLYPH_W, GLYPH_H, ADVANCE = 5, 7, 6


class Canvas:
    """An RGB raster with the few primitives a chart needs."""

    def __init__(self, width, height, bg=WHITE):
        self.w, self.h = width, height
        self.px = bytearray(bytes(bg) * (width * height))

    def dot(self, x, y, c):
        if 0 <= x < self.w and 0 <= y < self.h:
            i = 3 * (y * self.w + x)
            self.px[i:i + 3] = bytes(c)

    def rect(self, x0, y0, x1, y1, c):
        x0, x1 = max(0, min(x0, x1)), min(self.w, max(x0, x1))
        y0, y1 = max(0, min(y0, y1)), min(self.h, max(y0, y1))
        row = bytes(c) * (x1 - x0)
        for y in range(y0, y1):
            i = 3 * (y * self.w + x0)
            self.px[i:i + len(row)] = row

    def line(self, x0, y0, x1, y1, c, width=1):
        # Bresenham; a wider line is the same line stamped as a square brush.
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        r = width // 2
        while True:
            if width == 1:
                self.dot(x0, y0, c)
            else:
                self.rect(x0 - r, y0 - r, x0 - r + width, y0 - r + width, c)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x, y, s, c=BLACK, scale=1):
        for ch in s.upper():
            rows = FONT.get(ch, FONT["?"])
            for ry, bits in enumerate(rows):
                for rx in range(GLYPH_W):
                    if bits & (0x10 >> rx):
                        self.rect(x + rx * scale, y + ry * scale, x + (rx + 1) * scale, y + (ry + 1) * scale, c)
            x += ADVANCE * scale

    def png(self):
        def chunk(kind, data):
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

        stride = 3 * self.w
        # Filter type 0 (none) on every scanline: simple, and zlib still
        # squeezes a mostly-white chart to a few tens of KiB.
        raw = b"".join(b"\x00" + bytes(self.px[y * stride:(y + 1) * stride]) for y in range(self.h))
        ihdr = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) +
                chunk(b"IEND", b""))


def text_width(s, scale=1):
    return len(s) * ADVANCE * scale


def nice_step(span, ticks=5):
    """A 1/2/5 x 10^k step that cuts span into about `ticks` pieces."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def fmt(v):
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return "%d" % round(v)
    if abs(v) >= 10:
        return ("%.1f" % v).rstrip("0").rstrip(".")
    return ("%.2f" % v).rstrip("0").rstrip(".")


def size_label(kib):
    if kib >= 1 << 20:
        return "%dG" % (kib >> 20)
    if kib >= 1 << 10:
        return "%dM" % (kib >> 10)
    return "%dK" % kib


def bandwidth_series(figures, kind):
    """{size_kib: (native, ivcuda)} for figures named KIND.<n>KiB."""
    out = {}
    prefix = kind + "."
    for f in figures:
        name = f["name"]
        if name.startswith(prefix) and name.endswith("KiB"):
            try:
                kib = int(name[len(prefix):-3])
            except ValueError:
                continue
            out[kib] = (float(f["native"]), float(f["ivcuda"]))
    return out


def draw_bandwidth(cv, x0, y0, w, h, title, series):
    cv.text(x0, y0, title, scale=2)
    left, top, right, bottom = x0 + 44, y0 + 24, x0 + w - 10, y0 + h - 26
    sizes = sorted(series)
    if not sizes:
        cv.text(left, top + 20, "NO DATA")
        return
    ymax = max(max(v) for v in series.values()) or 1.0
    step = nice_step(ymax)
    ymax = step * math.ceil(ymax / step)
    lx0, lx1 = math.log2(sizes[0]), math.log2(sizes[-1])

    def px(kib):
        if lx1 == lx0:
            return (left + right) // 2
        return round(left + (math.log2(kib) - lx0) / (lx1 - lx0) * (right - left))

    def py(v):
        return round(bottom - v / ymax * (bottom - top))

    t = 0.0
    while t <= ymax + step / 2:
        y = py(t)
        cv.line(left, y, right, y, GRID)
        lab = fmt(t)
        cv.text(left - 4 - text_width(lab), y - 3, lab)
        t += step
    for kib in sizes:
        x = px(kib)
        cv.line(x, top, x, bottom, GRID)
        lab = size_label(kib)
        cv.text(x - text_width(lab) // 2, bottom + 5, lab)
    cv.line(left, top, left, bottom, BLACK)
    cv.line(left, bottom, right, bottom, BLACK)
    cv.text(x0, y0 + 14, "GB/S")
    cv.text(right - text_width("COPY SIZE"), bottom + 15, "COPY SIZE")
    for idx, colour in ((0, NATIVE), (1, IVCUDA)):
        pts = [(px(k), py(series[k][idx])) for k in sizes]
        for (ax, ay), (bx, by) in zip(pts, pts[1:]):
            cv.line(ax, ay, bx, by, colour, width=2)
        for x, y in pts:
            cv.rect(x - 2, y - 2, x + 3, y + 3, colour)


def is_time(unit):
    return unit in ("us", "ms", "s", "us/launch")


def draw_ratios(cv, x0, y0, w, rows):
    cv.text(x0, y0, "IVCUDA / NATIVE (LOG SCALE). TIMES: BELOW 1 IS BETTER; RATES, BANDWIDTHS: ABOVE 1", scale=2)
    label_w = max([text_width(r[0]) for r in rows] + [60]) + 10
    left, right = x0 + label_w, x0 + w - 60
    top = y0 + 40
    row_h = 16
    ratios = [r[1] for r in rows if r[1] > 0]
    lo = min([0.5] + ratios)
    hi = max([2.0] + ratios)
    e_lo = max(-8, math.floor(math.log2(lo)))
    e_hi = min(8, math.ceil(math.log2(hi)))

    def px(v):
        e = min(max(math.log2(v), e_lo), e_hi)
        return round(left + (e - e_lo) / (e_hi - e_lo) * (right - left))

    bottom = top + row_h * len(rows)
    for e in range(e_lo, e_hi + 1):
        x = px(2.0 ** e)
        cv.line(x, top - 4, x, bottom, GRID if e != 0 else BLACK)
        lab = fmt(2.0 ** e) if e >= 0 else "1/%d" % (2 ** -e)
        cv.text(x - text_width(lab) // 2, top - 14, lab)
    one = px(1.0)
    for i, (name, ratio, unit) in enumerate(rows):
        y = top + i * row_h
        cv.text(x0, y + 4, name)
        colour = BAR_TIME if is_time(unit) else IVCUDA
        if ratio > 0:
            x = px(ratio)
            cv.rect(min(one, x), y + 2, max(one, x) + 1, y + row_h - 2, colour)
            lab = fmt(ratio)
            cv.text(max(one, x) + 4, y + 4, lab)
        else:
            cv.text(one + 4, y + 4, "N/A")
    cv.text(x0, bottom + 8, "GREEN: TIMES (US)   ORANGE: RATES AND BANDWIDTHS")
    return bottom + 20


def figure_order(name):
    """Sort key: by name, but sizes (X.<n>KiB) in numeric order."""
    head, _, last = name.rpartition(".")
    if head and last.endswith("KiB") and last[:-3].isdigit():
        return (head, int(last[:-3]), "")
    return (name, 0, "")


COPY_KINDS = (("htod.pageable", "HTOD PAGEABLE"), ("dtoh.pageable", "DTOH PAGEABLE"),
              ("htod.pinned", "HTOD PAGE-LOCKED"), ("dtoh.pinned", "DTOH PAGE-LOCKED"))


def render(doc):
    figures = doc.get("figures", [])
    width, panel_h = 1200, 300
    others = []
    for f in figures:
        name = f["name"]
        if any(name.startswith(k + ".") and name.endswith("KiB") for k, _ in COPY_KINDS):
            continue
        nat, ivc = float(f["native"]), float(f["ivcuda"])
        others.append((name, ivc / nat if nat > 0 and ivc > 0 else 0.0, f.get("unit", "")))
    others.sort(key=lambda o: figure_order(o[0]))
    height = 40 + 2 * panel_h + 60 + 16 * len(others) + 40
    cv = Canvas(width, height)
    title = "IVCUDA-BENCH" + (" (QUICK RUN)" if doc.get("quick") else "")
    cv.text(10, 10, title, scale=2)
    # legend
    lx = width - 260
    cv.rect(lx, 12, lx + 20, 16, NATIVE)
    cv.text(lx + 26, 10, "NATIVE")
    cv.rect(lx + 100, 12, lx + 120, 16, IVCUDA)
    cv.text(lx + 126, 10, "IVCUDA")
    for i, (kind, label) in enumerate(COPY_KINDS):
        col, row = i % 2, i // 2
        draw_bandwidth(cv, 10 + col * width // 2, 40 + row * panel_h, width // 2 - 20, panel_h - 10, label,
                       bandwidth_series(figures, kind))
    draw_ratios(cv, 10, 40 + 2 * panel_h + 10, width - 20, others)
    return cv.png()


def main(argv):
    if len(argv) != 3:
        sys.stderr.write("usage: plot.py BENCH.json OUT.png\n")
        return 2
    with open(argv[1], encoding="utf-8") as f:
        doc = json.load(f)
    data = render(doc)
    with open(argv[2], "wb") as f:
        f.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
