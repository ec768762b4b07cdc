#!/usr/bin/env python3
"""Stands in for an NVBench executable in the run.sh tests (no GPU needed).

Which run it is in follows from its environment, as the real benchmark's libcuda.so.1 would:
  guest    LD_LIBRARY_PATH holds FAKE_GUEST_LIB (the --guest-ssh tests' "VM")
  process  LD_LIBRARY_PATH holds FAKE_LIBDIR (ivcuda's lib) or LD_PRELOAD its libcuda.so.1;
           then it also says hello to the daemon on IVCUDA_SOCKET (fake_ivcudad.py), as
           ivcuda's library does
  native   otherwise
It writes data/<run>.json (data/guest.json when there is none) to the --json path and appends what it was given to FAKE_RECORD.
FAKE_FAIL=<run> makes that run fail; FAKE_NO_HELLO=1 keeps it from saying hello.
"""
import json
import os
import shutil
import socket
import sys

here = os.path.dirname(os.path.abspath(__file__))
path = os.environ.get("LD_LIBRARY_PATH", "").split(":")
libdir = os.environ.get("FAKE_LIBDIR", "")
guest_lib = os.environ.get("FAKE_GUEST_LIB", "")
if guest_lib and guest_lib in path:
    side = "guest"
elif libdir and (libdir in path or
                 os.environ.get("LD_PRELOAD", "") == os.path.join(libdir, "libcuda.so.1")):
    side = "process"
else:
    side = "native"

args = sys.argv[1:]
with open(os.environ["FAKE_RECORD"], "a", encoding="utf-8") as f:
    env = {k: os.environ.get(k) for k in
           ("LD_LIBRARY_PATH", "LD_PRELOAD", "IVCUDA_SOCKET", "CUDA_MODULE_LOADING")}
    f.write(json.dumps({"side": side, "args": args, "env": env}) + "\n")

if side == "process" and os.environ.get("IVCUDA_SOCKET") and not os.environ.get("FAKE_NO_HELLO"):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(os.environ["IVCUDA_SOCKET"])
        s.sendall(f"{os.getpid()}\n".encode())
        s.recv(16)  # the daemon's answer: it has logged the hello

if os.environ.get("FAKE_FAIL") == side:
    print(f"fake {side} run failing on purpose", file=sys.stderr)
    sys.exit(1)
if "--json" not in args or args.index("--json") + 1 >= len(args):
    print("fake nvbench: no --json FILE", file=sys.stderr)
    sys.exit(1)
# FAKE_DATA: where data/ is when this file was copied elsewhere (the --guest-ssh "VM").
data_dir = os.environ.get("FAKE_DATA", os.path.join(here, "data"))
data = os.path.join(data_dir, side + ".json")
if not os.path.exists(data):
    data = os.path.join(data_dir, "guest.json")
shutil.copyfile(data, args[args.index("--json") + 1])
