#!/usr/bin/env python3
"""A test-only ivshmem server: just enough of QEMU's shared-memory server
protocol for one ivshmem-doorbell guest, plus an echo for doorbell tests.

It listens on a UNIX socket, accepts one connection (QEMU's), and sends:
version 0, the guest's peer id (1), -1 with the shared-memory fd, then the
"host" peer 0 with N eventfds (the guest rings host vector k by writing
`0 << 16 | k` to its Doorbell register), then the guest's own id with its N
eventfds. Before that it writes b"IVCUDAT\\0" and the guest's id (u64 LE) at
the start of the shared memory, so the guest can check that IVPosition
agrees and that BAR2 is this memory.

Then it echoes: each ring of host vector k rings the guest's vector k. It
exits when the guest disconnects (QEMU quit) or --timeout passes; the exit
status is 0 when at least --expect-rings rings were echoed.

The project's real server is ivcudad (ring/ivshmem.h); this one exists so the
VM tests of the guest driver do not depend on it.

usage: ivshmem-test-server.py --socket PATH [--vectors N] [--shm-size BYTES]
                              [--timeout SEC] [--expect-rings N]
"""

import argparse
import os
import select
import socket
import statistics
import struct
import sys
import time

GUEST_ID = 1
HOST_ID = 0
MAGIC = b"IVCUDAT\0"


def send(conn, value, fd=None):
    data = struct.pack("<q", value)
    if fd is None:
        conn.sendall(data)
    else:
        socket.send_fds(conn, [data], [fd])


def log(msg):
    print(f"ivshmem-test-server: {msg}", file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--vectors", type=int, default=1)
    ap.add_argument("--shm-size", type=int, default=1 << 20)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--expect-rings", type=int, default=1)
    args = ap.parse_args()
    if not 1 <= args.vectors <= 64:
        ap.error("--vectors must be 1..64")
    size = args.shm_size
    if size < 4096 or size & (size - 1):
        ap.error("--shm-size must be a power of two of at least 4096 (it becomes BAR2)")

    deadline = time.monotonic() + args.timeout
    try:
        os.unlink(args.socket)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.socket)
    listener.listen(1)
    log(f"listening on {args.socket}, {args.vectors} vector(s), {size} bytes")

    if not select.select([listener], [], [], args.timeout)[0]:
        log("nobody connected")
        return 1
    conn, _ = listener.accept()
    listener.close()
    os.unlink(args.socket)

    shm = os.memfd_create("ivcuda-test-shm")
    os.ftruncate(shm, size)
    os.pwrite(shm, MAGIC + struct.pack("<Q", GUEST_ID), 0)
    host_fds = [os.eventfd(0, os.EFD_NONBLOCK) for _ in range(args.vectors)]
    guest_fds = [os.eventfd(0, os.EFD_NONBLOCK) for _ in range(args.vectors)]

    send(conn, 0)
    send(conn, GUEST_ID)
    send(conn, -1, shm)
    for fd in host_fds:
        send(conn, HOST_ID, fd)
    for fd in guest_fds:
        send(conn, GUEST_ID, fd)
    log(f"greeted peer {GUEST_ID}")

    vector_of = {fd: k for k, fd in enumerate(host_fds)}
    rings = [0] * args.vectors
    # From our ring of the guest to the guest's next ring of us: the guest's
    # half of a round trip (MSI-X, wake-up, read(), register write), plus QEMU.
    answer_us = []
    last_echo = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            log("timed out")
            break
        ready = select.select([conn] + host_fds, [], [], left)[0]
        now = time.monotonic()
        if conn in ready:
            if not conn.recv(4096):
                break
            log("peer sent data: the protocol gives it nothing to send")
            return 1
        for fd in ready:
            k = vector_of[fd]
            try:
                os.eventfd_read(fd)
            except BlockingIOError:
                continue
            if last_echo is not None:
                answer_us.append((now - last_echo) * 1e6)
            rings[k] += 1
            os.eventfd_write(guest_fds[k], 1)
            last_echo = time.monotonic()

    log(f"guest disconnected; rings echoed per vector: {rings}")
    if len(answer_us) >= 2:
        answer_us.sort()
        log(f"guest half of the round trip (host ring -> guest ring back), "
            f"{len(answer_us)} samples: median {statistics.median(answer_us):.1f} us, "
            f"min {answer_us[0]:.1f} us, max {answer_us[-1]:.1f} us")
    total = sum(rings)
    if total < args.expect_rings:
        log(f"expected at least {args.expect_rings} rings, got {total}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
