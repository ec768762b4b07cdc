#!/usr/bin/env python3
"""A hostile peer of an ivshmem-server (tests only): what any peer of a
server that seals nothing can do to the memory and to the other peers.

usage: hostile_peer.py SOCKET resize BYTES   take the memory's fd, stay 0.5 s (long enough to be
                                             taken for a guest), truncate it to BYTES, leave
       hostile_peer.py SOCKET churn N        connect and leave N times
       hostile_peer.py SOCKET crowd N        stay connected as N peers; prints "ready", waits for EOF on stdin
"""
import os
import socket
import struct
import sys
import time


def greeting(path):
    """Connects and reads messages until the shared memory's fd arrived."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    while True:
        data, fds, _, _ = socket.recv_fds(s, 8, 4)
        if len(data) < 8:
            data += s.recv(8 - len(data), socket.MSG_WAITALL)
        value = struct.unpack("<q", data)[0]
        if value == -1 and fds:
            for fd in fds[1:]:
                os.close(fd)
            return s, fds[0]
        for fd in fds:
            os.close(fd)


def main():
    path, mode, arg = sys.argv[1], sys.argv[2], int(sys.argv[3], 0)
    if mode == "resize":
        s, shm = greeting(path)
        time.sleep(0.5)
        os.ftruncate(shm, arg)
        os.close(shm)
        s.close()
    elif mode == "churn":
        for _ in range(arg):
            s, shm = greeting(path)
            os.close(shm)
            s.close()
    elif mode == "crowd":
        held = []
        for _ in range(arg):
            s, shm = greeting(path)
            os.close(shm)
            held.append(s)
        print("ready", flush=True)
        sys.stdin.read()
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
