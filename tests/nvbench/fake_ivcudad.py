#!/usr/bin/env python3
"""Stands in for ivcudad in the run.sh tests: listens on --socket and, for each client that sends
its process id (fake_nvbench.py), logs the line ivcudad's worker logs for a served hello. Its arguments are
appended to FAKE_RECORD (as {"daemon": [...]}). Ends on SIGTERM."""
import json
import os
import signal
import socket
import sys

args = sys.argv[1:]
with open(os.environ["FAKE_RECORD"], "a", encoding="utf-8") as f:
    f.write(json.dumps({"daemon": args}) + "\n")
path = args[args.index("--socket") + 1]
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
    server.bind(path)
    server.listen(8)
    print("fake ivcudad: listening", flush=True)
    while True:
        conn, _ = server.accept()
        with conn:
            pid = conn.recv(64).decode().strip()
            print(f"00:00:00.000 ivcudad worker g1 info: guest 1: process {pid} says hello (parent 1)",
                  flush=True)
            conn.sendall(b"ok")
