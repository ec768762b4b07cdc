#!/usr/bin/env python3
"""Stands in for an NVBench executable in the run.sh tests (no GPU needed).

It writes data/native.json or data/guest.json to the --json path - guest when ivcuda's library
directory (FAKE_LIBDIR) is on LD_LIBRARY_PATH or its libcuda.so.1 is in LD_PRELOAD - and
appends what it was given (arguments and the environment that matters) to FAKE_RECORD.
FAKE_FAIL=native|guest makes that run fail.
"""
import json
import os
import shutil
import sys

here = os.path.dirname(os.path.abspath(__file__))
libdir = os.environ.get("FAKE_LIBDIR", "")
on_path = libdir and libdir in os.environ.get("LD_LIBRARY_PATH", "").split(":")
preloaded = libdir and os.environ.get("LD_PRELOAD", "") == os.path.join(libdir, "libcuda.so.1")
side = "guest" if on_path or preloaded else "native"

args = sys.argv[1:]
with open(os.environ["FAKE_RECORD"], "a", encoding="utf-8") as f:
    env = {k: os.environ.get(k) for k in
           ("LD_LIBRARY_PATH", "LD_PRELOAD", "IVCUDA_SOCKET", "CUDA_MODULE_LOADING")}
    f.write(json.dumps({"side": side, "args": args, "env": env}) + "\n")

if os.environ.get("FAKE_FAIL") == side:
    print(f"fake {side} run failing on purpose", file=sys.stderr)
    sys.exit(1)
if "--json" not in args or args.index("--json") + 1 >= len(args):
    print("fake nvbench: no --json FILE", file=sys.stderr)
    sys.exit(1)
shutil.copyfile(os.path.join(here, "data", side + ".json"), args[args.index("--json") + 1])
