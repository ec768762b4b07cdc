#!/usr/bin/env python3
"""Writes a folder as a cpio archive in the "newc" format the kernel's
initramfs unpacker reads (Documentation/driver-api/early-userspace/
buffer-format.rst), for machines without cpio (Ubuntu 24.04 images).

usage: newc.py ROOT [OUT]     (OUT defaults to stdout)

Directories, regular files and symbolic links, owned by root, paths relative
to ROOT in sorted order so that a parent always precedes its children. The
kernel accepts several archives concatenated, each compressed or not, so this
one can be appended to an existing initramfs: entries for directories that
exist already are harmless, files replace files.
"""
import os
import stat
import sys

MAGIC = b"070701"
# newc fields are 8 hex digits: sizes and numbers above this cannot be written.
FIELD_MAX = 0xFFFFFFFF


def pad4(n: int) -> bytes:
    return b"\0" * (-n % 4)


def header(ino: int, mode: int, mtime: int, size: int, name: bytes) -> bytes:
    namesize = len(name) + 1  # with its NUL
    for what, v in (("size", size), ("mtime", mtime), ("ino", ino)):
        if not 0 <= v <= FIELD_MAX:
            raise ValueError(f"{name.decode(errors='replace')}: {what} {v} does not fit a newc header")
    # ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor rdevminor namesize check
    fields = (ino, mode, 0, 0, 1, mtime, size, 0, 0, 0, 0, namesize, 0)
    h = MAGIC + b"".join(b"%08X" % f for f in fields) + name + b"\0"
    return h + pad4(len(h))


def write_archive(root: str, out) -> None:
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for n in sorted(dirnames + filenames):
            entries.append(os.path.join(dirpath, n))
    entries.sort(key=lambda p: os.path.relpath(p, root).split(os.sep))
    ino = 1
    for path in entries:
        rel = os.path.relpath(path, root).encode()
        st = os.lstat(path)
        mtime = int(st.st_mtime)
        if stat.S_ISLNK(st.st_mode):
            data = os.readlink(path).encode()
        elif stat.S_ISREG(st.st_mode):
            with open(path, "rb") as f:
                data = f.read()
        elif stat.S_ISDIR(st.st_mode):
            data = b""
        else:
            raise ValueError(f"{path}: only files, folders and symbolic links go into the archive")
        out.write(header(ino, st.st_mode, mtime, len(data), rel))
        out.write(data)
        out.write(pad4(len(data)))
        ino += 1
    out.write(header(0, 0, 0, 0, b"TRAILER!!!"))


def main() -> int:
    if len(sys.argv) not in (2, 3) or not os.path.isdir(sys.argv[1]):
        print("usage: newc.py ROOT [OUT]", file=sys.stderr)
        return 2
    try:
        if len(sys.argv) == 3:
            with open(sys.argv[2], "wb") as out:
                write_archive(sys.argv[1], out)
        else:
            write_archive(sys.argv[1], sys.stdout.buffer)
            sys.stdout.buffer.flush()
    except (OSError, ValueError) as e:
        print(f"newc.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
