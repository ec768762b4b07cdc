#!/usr/bin/env python3
"""Extracts the uncompressed ELF vmlinux from a bzImage (/boot/vmlinuz-*).

QEMU boots an ELF vmlinux through its PVH entry point, which skips the
real-mode setup and the in-guest decompression: under TCG that is about 5 s
less per boot than booting the bzImage.

A bzImage is a setup stub followed by a compressed payload. We look for each
compressor's magic bytes, try to decompress from every hit, and keep the first
result that is an ELF file. xz, gzip and bzip2 use the Python standard
library; zstd and lz4 use their command-line tools when they are installed.

usage: extract-vmlinux.py VMLINUZ OUTPUT
"""

import bz2
import lzma
import os
import shutil
import subprocess
import sys
import zlib

ELF_MAGIC = b"\x7fELF"


def _stream(decompressor, data):
    # Decompresses one stream and ignores whatever follows it (the bzImage
    # appends the uncompressed size and padding).
    try:
        return decompressor.decompress(data)
    except (lzma.LZMAError, zlib.error, OSError, EOFError, ValueError):
        return b""


def _tool(argv, data):
    if shutil.which(argv[0]) is None:
        return b""
    proc = subprocess.run(argv, input=data, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, check=False)
    # A decompressor complains about the trailing bytes but has written the
    # whole stream by then: judge by the output, not by the exit status.
    return proc.stdout


FORMATS = [
    # (name, magic, decompress(data at the magic) -> bytes)
    ("xz", b"\xfd7zXZ\x00",
     lambda d: _stream(lzma.LZMADecompressor(format=lzma.FORMAT_XZ), d)),
    ("gzip", b"\x1f\x8b\x08",
     lambda d: _stream(zlib.decompressobj(16 + zlib.MAX_WBITS), d)),
    ("zstd", b"\x28\xb5\x2f\xfd", lambda d: _tool(["zstd", "-dc"], d)),
    ("bzip2", b"BZh", lambda d: _stream(bz2.BZ2Decompressor(), d)),
    ("lzma", b"\x5d\x00\x00\x00",
     lambda d: _stream(lzma.LZMADecompressor(format=lzma.FORMAT_ALONE), d)),
    ("lz4", b"\x02\x21\x4c\x18", lambda d: _tool(["lz4", "-dc"], d)),
]


def extract(image):
    for name, magic, decompress in FORMATS:
        pos = image.find(magic)
        while pos >= 0:
            out = decompress(image[pos:])
            if out.startswith(ELF_MAGIC):
                return name, out
            pos = image.find(magic, pos + 1)
    return None, None


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    src, dst = argv[1], argv[2]
    with open(src, "rb") as f:
        image = f.read()
    if image.startswith(ELF_MAGIC):
        name, out = "none", image
    else:
        name, out = extract(image)
    if out is None:
        print(f"extract-vmlinux: no compressed ELF kernel found in {src}",
              file=sys.stderr)
        return 1
    tmp = dst + ".tmp"
    with open(tmp, "wb") as f:
        f.write(out)
    os.replace(tmp, dst)
    print(f"extract-vmlinux: {src} ({name}) -> {dst}, {len(out)} bytes",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
