#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/<harness>/seed-*).

Seeds are small valid inputs in each harness's input format (see the comment at the top of
each harness): the fuzzer starts from requests the worker accepts, greetings a client
completes and replies a guest takes, and mutates from there. worker_fuzz gets one or more
seeds per op (seed-op-*, op_seeds.py, generated from include/ivcuda/proto.h) and a libFuzzer
dictionary (worker_fuzz.dict: a record's start for every op, and the reply-substitution word
that names each op's newest reply). Run after changing a format, a request struct or the op
table; the files are committed. Regression inputs (regress-*) are not touched.

usage: make_seeds.py [CORPUS_DIR]
       make_seeds.py --check WORKER_FUZZ   the committed seeds and dictionary are what this
                                           script writes now (proto.h changed since?), and
                                           each seed-op-* replayed answers as the seed means
                                           (every reply's status); exit 1 otherwise (CTest
                                           fuzz_worker_seeds)
"""
import os
import re
import struct
import subprocess
import sys
import tempfile

import op_seeds

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")


def op_numbers():
    """Op name -> number, in IVCUDA_OPS order from 1 (include/ivcuda/proto.h)."""
    text = open(os.path.join(ROOT, "include", "ivcuda", "proto.h")).read()
    table = text[text.index("#define IVCUDA_OPS(X)"):]
    table = table[:table.index("\n\n")]
    names = re.findall(r"^\s*X\((\w+),", table, re.M)
    return {n: i + 1 for i, n in enumerate(names)}


OP = op_numbers()


def nvml_fns():
    """NvmlFn name -> number (include/ivcuda/nvml_wire.h: kInit = 1, then in order)."""
    text = open(os.path.join(ROOT, "include", "ivcuda", "nvml_wire.h")).read()
    body = text[text.index("enum class NvmlFn"):]
    body = body[:body.index("};")]
    names = re.findall(r"^\s*(k\w+)", body, re.M)
    return {n: i + 1 for i, n in enumerate(names)}


FN = nvml_fns()

# worker_fuzz's layout (1 MiB, 4 channels, 16 KiB rings, 64 KiB staging), as
# ring/layout.cc plans it: the arena starts after the superblock, the channel
# table and four channels' rings, page-aligned.
PAGE = 4096
def round_up(v, a): return (v + a - 1) // a * a
RINGS_OFF = round_up(4096 + 128 * 4, PAGE)
STRIDE = round_up(2 * (128 + 16 * 1024), PAGE)
ARENA_OFF = round_up(RINGS_OFF + 4 * STRIDE, PAGE)


def subst(newest_index, add=0):
    """A payload word worker_fuzz replaces with a value a reply carried."""
    return (0xF0CC00 << 40) | (newest_index << 32) | add


def rec(op, payload=b"", ch=0, reply=True, serve=True):
    tag = 0 | (0x04 if reply else 0) | (0x08 if serve else 0)
    return struct.pack("<BBHH", tag, ch, OP[op], len(payload)) + payload


def raw_rec(op_number, payload=b"", ch=0, reply=True):
    return struct.pack("<BBHH", 0x0C if reply else 0x08, ch, op_number, len(payload)) + payload


def arena(off, data):
    return struct.pack("<BIH", 1, off, len(data)) + data


def poke(ch, field, value):
    return struct.pack("<BBBI", 2, ch, field, value)


SERVE = b"\x03"
HELLO = rec("Hello", struct.pack("<IIIIQ", 1, 1, 0, 0, 0))
# Primary context of device 0; its handle is then the newest value.
RETAIN = rec("PrimaryRetain", struct.pack("<iI", 0, 0))

PTX = b"""
.version 8.0
.target sm_90
.address_size 64

.visible .entry ivc_fill_u32(
\t.param .u64 ivc_fill_u32_param_0,
\t.param .u32 ivc_fill_u32_param_1,
\t.param .u64 ivc_fill_u32_param_2
)
{
\tret;
}
"""


def worker_seeds():
    s = {}
    s["hello"] = HELLO
    s["devices"] = HELLO + rec("DeviceInfo", struct.pack("<iI", 0, 0)) + rec("DeviceInfo", struct.pack("<iI", 1, 0))
    # ctx = newest after RETAIN; after MemAlloc the pointer is newest, ctx next.
    s["alloc_copy"] = (HELLO + RETAIN
                       + rec("MemAlloc", struct.pack("<QQQQII", subst(0), 4096, 0, 0, 0, 0))
                       + rec("MemcpyHtoDInline", struct.pack("<QQQQQQII", subst(1), 0, subst(0), 0, 16, 0, 0, 0)
                             + bytes(range(16)), reply=False, serve=False)
                       + rec("MemcpyDtoHArena", struct.pack("<QQQQQQII", subst(1), 0, 0, subst(0), 16, ARENA_OFF, 0, 0),
                             reply=False, serve=False)
                       + rec("Memset", struct.pack("<QQQQQQIIII", subst(1), 0, subst(0), 0, 64, 1, 7, 1, 0, 0),
                             reply=False, serve=False)
                       + rec("MemcpyDtoD", struct.pack("<QQQQQQII", subst(1), 0, subst(0, 1024), subst(0), 64, 0, 0, 0),
                             reply=False, serve=False)
                       + rec("CtxSynchronize", struct.pack("<Q", subst(1)))
                       + rec("MemGetAddressRange", struct.pack("<QQ", subst(1), subst(0, 8)))
                       + rec("MemFree", struct.pack("<QQ", subst(3), subst(2))))
    s["host_alloc"] = (HELLO + RETAIN + rec("HostAlloc", struct.pack("<QII", 8192, 0, 0))
                       + rec("HostFree", struct.pack("<Q", subst(1))))
    s["stream_event"] = (HELLO + RETAIN
                         + rec("StreamCreate", struct.pack("<QIi", subst(0), 1, 0))
                         + rec("EventCreate", struct.pack("<QII", subst(1), 0, 0))
                         + rec("EventRecord", struct.pack("<QQQ", subst(2), subst(0), subst(1)), reply=False)
                         + rec("StreamSynchronize", struct.pack("<QQ", subst(2), subst(1)))
                         + rec("EventSynchronize", struct.pack("<QQ", subst(2), subst(0)))
                         + rec("EventQuery", struct.pack("<QQ", subst(2), subst(0)))
                         + rec("EventDestroy", struct.pack("<QQ", subst(2), subst(0)))
                         + rec("StreamDestroy", struct.pack("<QQ", subst(2), subst(1))))
    name = b"ivc_fill_u32"
    # Newest values: ctx; then the pointer; the module; then the function's
    # reply: function, counts, two parameter slots.
    s["module_launch"] = (HELLO + RETAIN + arena(0, PTX)
                          + rec("MemAlloc", struct.pack("<QQQQII", subst(0), 4096, 0, 0, 0, 0))
                          + rec("ModuleLoad", struct.pack("<QQQII", subst(1), len(PTX), ARENA_OFF, 0, 0))
                          + rec("ModuleGetFunction", struct.pack("<QQII", subst(2), subst(0), len(name), 0) + name)
                          + rec("Launch", struct.pack("<QQQ3I3III", subst(6), subst(3), 0, 1, 1, 1, 1, 1, 1, 0, 24)
                                + struct.pack("<QIIQ", subst(5), 5, 0, 16), reply=False)
                          + rec("CtxSynchronize", struct.pack("<Q", subst(6)))
                          + rec("ModuleUnload", struct.pack("<QQ", subst(6), subst(4))))
    # Virtual memory left mapped at the end: the worker must give it back.
    # Newest values after the reservation: its size, its base, the handle.
    mib2 = 2 << 20
    s["vmm_left_mapped"] = (HELLO + RETAIN
                            + rec("MemCreate", struct.pack("<IIiIBBHIQQ", 1, 1, 0, 0, 0, 0, 0, 0, mib2, 0))
                            + rec("MemAddressReserve", struct.pack("<QQQQ", mib2, 0, 0, 0))
                            + rec("MemMap", struct.pack("<QQQQQ", subst(1), mib2, 0, subst(2), 0))
                            + rec("MemSetAccess", struct.pack("<QQII", subst(1), mib2, 1, 0)
                                  + struct.pack("<IiII", 1, 0, 3, 0)))
    s["two_channels"] = (HELLO + RETAIN
                         + rec("MemGetInfo", struct.pack("<Q", subst(0)), ch=1, serve=False)
                         + rec("CtxSynchronize", struct.pack("<Q", subst(0)), ch=2, serve=False) + SERVE)
    # What no guest library sends: unknown and truncated ops, a stray pad, a
    # request ring index moved backwards.
    s["hostile"] = (HELLO + raw_rec(0, b"") + raw_rec(999, b"abcd") + raw_rec(OP["MemAlloc"], b"\x01\x02\x03\x04")
                    + raw_rec(0xFFFF, b"") + SERVE + poke(1, 0, 0xFFFFFFF0) + rec("Hello", b"", ch=1))
    # NVML queries (host-daemon/worker/nvml.cc; worker_fuzz gives the worker the NVML test double):
    # what the guest library asks, then what it never would.
    def nvml(fn, dev, a0=0, a1=0, cap=256):
        return rec("Nvml", struct.pack("<IiQQII", FN[fn] if isinstance(fn, str) else fn, dev, a0, a1, cap, 0))
    nodev = -1
    s["nvml"] = (HELLO + nvml("kInit", nodev) + nvml("kDeviceCount", nodev) + nvml("kSystemDriverVersion", nodev)
                 + nvml("kDeviceName", 0) + nvml("kDeviceUuid", 1, cap=8) + nvml("kDevicePciInfo", 0)
                 + nvml("kDeviceMemoryInfo", 1) + nvml("kDeviceTemperature", 0) + nvml("kDeviceClock", 0, 1, 0)
                 + nvml("kDeviceComputeRunningProcesses", 0, 4, 0, 96) + nvml("kDeviceNvLinkState", 0, 1)
                 + nvml("kDeviceTopologyCommonAncestor", 0, 1) + nvml("kDeviceP2PStatus", 1, 0, 2)
                 + nvml("kDeviceTotalEccErrors", 0, 1, 1))
    s["nvml_hostile"] = (HELLO + nvml(0, 0) + nvml(FN["kCount"], nodev) + nvml(0xFFFFFFFF, 0)
                         + nvml("kDeviceName", 2) + nvml("kDeviceName", nodev) + nvml("kDeviceCount", 0)
                         + nvml("kDeviceTemperature", 0, 1 << 63) + nvml("kDeviceClock", 0, 1, 1 << 40)
                         + nvml("kDeviceP2PStatus", 0, 7, 1) + nvml("kDeviceNvLinkState", 0, 1 << 32)
                         + nvml("kDeviceComputeRunningProcesses", 0, 1 << 40, 0, 0xFFFFFFFF)
                         + raw_rec(OP["Nvml"], b"\x01\x00\x00\x00"))
    return s


def msg(value, fd_kind=0, page=False):
    """One ivshmem_fuzz message: eight value bytes, an fd of fd_kind attached."""
    return struct.pack("<B", fd_kind | (0x20 if page else 0)) + struct.pack("<q", value)


def ivshmem_seeds():
    s = {}
    # The greeting ivcudad sends a guest with one vector: version 0, own id 3,
    # the memory, the host peer's eventfd, then our own.
    greet1 = msg(0) + msg(3) + msg(-1, 2, page=True) + msg(0, 1) + msg(3, 1)
    s["greeting"] = b"\x00" + bytes([1, 2, 0]) + greet1 + b"\xff" + bytes([0, 0, 0xff, 0])
    # Two vectors, another peer joining and leaving after the greeting.
    greet2 = msg(0) + msg(5) + msg(-1, 2, page=True) + msg(0, 1) + msg(0, 1) + msg(5, 1) + msg(5, 1)
    s["peers"] = b"\x00" + bytes([2, 1, 0]) + greet2 + msg(7, 1) + msg(7, 1) + msg(7) + b"\xff"
    # vectors learned from the memory (0 asked for).
    s["learned"] = b"\x00" + bytes([0, 3, 1]) + msg(0) + msg(1) + msg(-1, 2, page=True) + msg(1, 1)
    # The fd broker: deposit on line 0, fetch on line 1, fetch of nothing.
    dep = struct.pack("<BBBQ", 0 | (1 << 1), 1, 0x11, 4096)
    fetch = struct.pack("<BBBQ", 1, 2, 0x11, 0)
    miss = struct.pack("<BBBQ", 1, 2, 0x22, 0)
    s["broker"] = b"\x01" + dep + fetch + miss
    return s


def reply_seeds():
    s = {}
    # A completion ring of 16 cells with two replies: one for seq 7 (a
    # thread that died), then seq 8 with 24 payload bytes and console text.
    def record(op, flags, seq, status, payload):
        h = struct.pack("<IHHIi", len(payload), op, flags, seq, status)
        body = h + payload
        return body + b"\0" * ((-len(body)) % 64)
    console = b"hi\n"
    r1 = record(OP["MemAlloc"], 0, 7, 0, struct.pack("<QQ", 0x1000, 0))
    r2 = record(OP["MemAlloc"], 1 << 8, 8, 0, struct.pack("<QQQ", 0x2000, 0, 5) + console + struct.pack("<I", len(console)))
    data = r1 + r2
    cells = len(data) // 64
    s["replies"] = struct.pack("<BBIIIHB", 0, 2, 0, cells, 8, 16, 1) + data
    # A pad to the end of the ring, then a reply from cell 0.
    pad = struct.pack("<IHHIi", 64 * 2 - 16, 0xFFFF, 0, 0, 0) + b"\0" * (64 * 2 - 16)
    s["pad"] = struct.pack("<BBIIIHB", 0, 0, 2, 4 + 1, 9, 8, 0) + record(1, 0, 9, 0, b"\1" * 8) + b"\0" * 64 + pad
    # A superblock as format_bar writes it for a 256 KiB BAR: one channel of
    # 1 KiB rings, 4 KiB of staging.
    shm, ring_bytes = 256 * 1024, 1024
    rings_off = round_up(4096 + 128, PAGE)
    stride = round_up(2 * (128 + ring_bytes), PAGE)
    arena_off = round_up(rings_off + stride, PAGE)
    sb = bytearray(4096)
    struct.pack_into("<8sHHIQQQIII", sb, 0, b"IVCUDA\0\1", 1, 1, 64, 3, shm, 1, 0, 1, 1)
    struct.pack_into("<QIIQQQQQ", sb, 64, 4096, 1, ring_bytes, rings_off, stride, arena_off,
                     (shm - arena_off) // PAGE * PAGE, 4096)
    s["superblock"] = b"\x01" + struct.pack("<I", shm) + bytes(sb)
    s["producer"] = b"\x02\x02" + b"".join(struct.pack("<HI", n, h) for n, h in
                                            [(16, 0), (100, 0), (40, 1), (200, 4), (8, 8), (8, 2)])
    return s


def all_worker_seeds():
    seeds = worker_seeds()
    for name, seed in op_seeds.op_seeds().items():
        seeds["op-" + name] = bytes(seed.data)
    return seeds


def worker_dict():
    """worker_fuzz.dict: libFuzzer's dictionary for the worker's records."""
    P = op_seeds.P
    lines = ["# Generated by tests/fuzz/make_seeds.py from include/ivcuda/proto.h: do not edit.",
             "# A record's start (tag 0x0C: reply wanted, served; channel 0; the op) for every op,",
             "# then the reply-substitution word naming the newest successful reply of each op."]

    def esc(b):
        return "".join(f"\\x{c:02X}" for c in b)
    for name, (num, _, _, _) in P.ops.items():
        lines.append(f'rec_{name}="{esc(struct.pack("<BBH", 0x0C, 0, num))}"')
    for name, (num, _, rep, _) in P.ops.items():
        words = [0]
        if name in ("HostAlloc", "GraphAddNode"):
            words.append(1)
        if name == "Hello":
            words = [P.word(rep, "arena_device_base")]
        for w in words:
            v = (op_seeds.REPLY_TAG << 40) | ((num & 0xFF) << 32) | (w << 29)
            lines.append(f'ref_{name}_{w}="{esc(struct.pack("<Q", v))}"')
    return "\n".join(lines) + "\n"


def stale():
    """Files of corpus/ and the dictionary that differ from what main() would write."""
    out = []
    want = {os.path.join("worker_fuzz", "seed-" + k): v for k, v in all_worker_seeds().items()}
    for harness, seeds in (("ivshmem_fuzz", ivshmem_seeds()), ("reply_fuzz", reply_seeds())):
        want.update({os.path.join(harness, "seed-" + k): v for k, v in seeds.items()})
    corpus = os.path.join(HERE, "corpus")
    for rel, data in want.items():
        path = os.path.join(corpus, rel)
        if not os.path.exists(path) or open(path, "rb").read() != data:
            out.append(rel)
    for harness in ("worker_fuzz", "ivshmem_fuzz", "reply_fuzz"):
        for f in sorted(os.listdir(os.path.join(corpus, harness))):
            if f.startswith("seed-") and os.path.join(harness, f) not in want:
                out.append(os.path.join(harness, f) + " (no longer written)")
    if open(os.path.join(HERE, "worker_fuzz.dict")).read() != worker_dict():
        out.append("worker_fuzz.dict")
    return out


def check(binary):
    """Seeds up to date; every seed-op-* seed's replies as the seed means them."""
    bad = 0
    for f in stale():
        print(f"{f}: not what make_seeds.py writes now (run it: tests/fuzz/README.md)")
        bad += 1
    env = dict(os.environ, IVCUDA_FUZZ_TRACE="1")
    for name, seed in op_seeds.op_seeds().items():
        with tempfile.NamedTemporaryFile() as f:
            f.write(seed.data)
            f.flush()
            r = subprocess.run([binary, "-detect_leaks=0", f.name], env=env, capture_output=True, text=True)
        got = re.findall(r"^worker_fuzz: reply op \d+ (\w+) status (-?\d+) payload", r.stderr, re.M)
        if r.returncode != 0:
            print(f"{name}: worker_fuzz exited {r.returncode}:\n{r.stderr[-3000:]}")
            bad += 1
            continue
        for i, (op, ok) in enumerate(seed.expect):
            if i >= len(got):
                print(f"{name}: reply {i} ({op}) missing")
                bad += 1
                break
            gop, st = got[i][0], int(got[i][1])
            if (op is not None and gop != op) or (st == 0) != ok:
                print(f"{name}: reply {i}: {gop} status {st}, meant {op} {'success' if ok else 'failure'}")
                bad += 1
        if len(got) > len(seed.expect):
            print(f"{name}: {len(got) - len(seed.expect)} replies more than meant")
            bad += 1
    print(f"make_seeds --check: {len(op_seeds.op_seeds())} op seeds, {bad} problems")
    return 1 if bad else 0


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--check":
        sys.exit(check(sys.argv[2]))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "corpus")
    worker = all_worker_seeds()
    with open(os.path.join(HERE, "worker_fuzz.dict"), "w") as f:
        f.write(worker_dict())
    for harness, seeds in (("worker_fuzz", worker), ("ivshmem_fuzz", ivshmem_seeds()),
                           ("reply_fuzz", reply_seeds())):
        d = os.path.join(out, harness)
        os.makedirs(d, exist_ok=True)
        for f in os.listdir(d):
            if f.startswith("seed-"):
                os.remove(os.path.join(d, f))
        for name, data in seeds.items():
            with open(os.path.join(d, "seed-" + name), "wb") as f:
                f.write(data)
        print(f"make_seeds: {len(seeds)} seeds in {os.path.relpath(d)}")


if __name__ == "__main__":
    main()
