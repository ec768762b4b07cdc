#!/usr/bin/env python3
"""A test-only server with the semantics of QEMU's contrib/ivshmem-server:
one shared memory for every peer, N eventfds per peer, every peer told about
every other. ivcudad --join is tested against it (Debian ships no
ivshmem-server). Written from the protocol description in
shared/reference/ivshmem-notes.md.

usage: std_ivshmem_server.py SOCKET SHM_BYTES VECTORS [MEMORY_FILE]
  MEMORY_FILE: the shared memory is that file (made SHM_BYTES long) instead of a
  memfd, as QEMU's server takes a path too (e.g. a file on a full file system).
"""
import os
import select
import socket
import struct
import sys


def send(conn, value, fd=None):
    data = struct.pack("<q", value)
    if fd is None:
        conn.sendall(data)
    else:
        socket.send_fds(conn, [data], [fd])


def main():
    path, size, vectors = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if len(sys.argv) > 4:
        shm = os.open(sys.argv[4], os.O_RDWR | os.O_CREAT, 0o600)
    else:
        shm = os.memfd_create("std-ivshmem")
    os.ftruncate(shm, size)
    if os.path.exists(path):
        os.unlink(path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    peers = {}  # id -> (conn, [eventfds])
    next_id = 1
    while True:
        ready, _, _ = select.select([srv] + [c for c, _ in peers.values()], [], [])
        for r in ready:
            if r is srv:
                conn, _ = srv.accept()
                pid = next_id
                next_id += 1
                fds = [os.eventfd(0, os.EFD_NONBLOCK) for _ in range(vectors)]
                try:
                    send(conn, 0)
                    send(conn, pid)
                    send(conn, -1, shm)
                    for oid, (oconn, ofds) in peers.items():
                        for fd in ofds:
                            send(conn, oid, fd)
                    for fd in fds:
                        send(conn, pid, fd)
                except OSError:  # it left during its greeting: nobody heard of it
                    conn.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                for oconn, _ in peers.values():
                    for fd in fds:
                        try:
                            send(oconn, pid, fd)
                        except OSError:
                            pass  # that one left; its hang-up is handled below
                peers[pid] = (conn, fds)
                continue
            # A peer spoke or hung up: peers never speak, so it left.
            gone = [pid for pid, (c, _) in peers.items() if c is r]
            for pid in gone:
                conn, fds = peers.pop(pid)
                conn.close()
                for fd in fds:
                    os.close(fd)
                for oconn, _ in peers.values():
                    try:
                        send(oconn, pid)
                    except OSError:
                        pass


if __name__ == "__main__":
    main()
