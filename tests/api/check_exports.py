#!/usr/bin/env python3
"""The dynamic symbols a library defines must be exactly the generated API table.

usage: check_exports.py LIBRARY cuda_api_table.inc [--allow NAME]...

--allow names a symbol beyond the table that the library exports on purpose: the guest's
libcuda.so.1 exports ivcuda_nvml_query_v1, the private entry point of ivcuda's own
libnvidia-ml.so.1 (guest/nvml/query.h), and nothing else.
"""
import re
import shutil
import subprocess
import sys


def main():
    lib, table = sys.argv[1:3]
    rest = sys.argv[3:]
    if len(rest) % 2 or any(flag != "--allow" for flag in rest[::2]):
        sys.exit("usage: check_exports.py LIBRARY TABLE [--allow NAME]...")
    allowed = set(rest[1::2])
    if shutil.which("nm") is None:
        print("SKIPPED: nm (binutils) is not installed")
        return 0
    res = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"check_exports: nm failed on {lib}: {res.stderr}")
    exported = {f[2] for f in (l.split() for l in res.stdout.splitlines()) if len(f) >= 3}
    with open(table) as f:
        rows = set(re.findall(r"^IVCUDA_API_ROW\((\w+),", f.read(), re.M))
    for name in sorted(allowed):
        if name not in exported:
            print(f"MISSING {name} (allowed beyond the table, and expected)")
            return 1
    extra, missing = sorted(exported - rows - allowed), sorted(rows - exported)
    print(f"{lib}: {len(exported)} exported, table has {len(rows)}")
    for name in extra:
        print(f"EXTRA   {name}")
    for name in missing:
        print(f"MISSING {name}")
    return 1 if extra or missing or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
