"""worker_fuzz seeds, one or more per op of include/ivcuda/proto.h (make_seeds.py writes them as
corpus/worker_fuzz/seed-op-<Op>[-<what>]).

Each seed says hello, makes the objects its op needs (contexts, memory, streams, events, a
module and its functions, graphs and nodes, pools, arrays, virtual memory, exports) and then
calls the op on them, in its variants (kinds, flags, types). Requests are packed by field name
from the header (proto_layout.py); handles and addresses the worker hands out are named by
reply-substitution words (worker_fuzz.cc: the op that made them, which word of its reply, and
how many replies of that op ago), so a seed names live objects and keeps naming them when the
fuzzer inserts or drops records. Every record asks for a reply, posted ops too, so that a run
can count which ops answered CUDA_SUCCESS.

`expect` lists, per reply, the op and whether the seed means it to succeed: check_seeds()
replays each seed with IVCUDA_FUZZ_TRACE=1 and reports where the worker answered otherwise
(make_seeds.py --check BINARY).
"""
import os
import struct
from collections import Counter

from proto_layout import ROOT, Proto, cuda_constants

P = Proto()
C = cuda_constants()

# worker_fuzz's layout (1 MiB, 4 channels, 16 KiB rings, 64 KiB staging), as ring/layout.cc
# plans it: the arena starts after the superblock, the channel table and four channels' rings.
PAGE = 4096


def round_up(v, a):
    return (v + a - 1) // a * a


RINGS_OFF = round_up(4096 + 128 * 4, PAGE)
STRIDE = round_up(2 * (128 + 16 * 1024), PAGE)
ARENA_OFF = round_up(RINGS_OFF + 4 * STRIDE, PAGE)   # BAR offset of the arena
STAGING = 64 * 1024                                   # per channel, at the arena's start
POOL_OFF = ARENA_OFF + 4 * STAGING                    # page-locked memory after the staging slots
MIB2 = 2 << 20

REPLY_TAG = 0xF0CC01


class Ref:
    """A reply word, resolved when the record that uses it is written: the `index`-th
    successful reply of `op` (in the seed's order), its u64 at `word`, plus `add`."""

    def __init__(self, op, word, index, add=0):
        self.op, self.word, self.index, self.add = op, word, index, add

    def __add__(self, k):
        return Ref(self.op, self.word, self.index, self.add + k)


class Words:
    """u64 values (ints or Refs; bytes as they are) packed into a byte-array field or a tail."""

    def __init__(self, *vals):
        self.vals = vals


class Seed:
    def __init__(self, name):
        self.name = name
        self.data = bytearray()
        self.ok = Counter()   # successful replies of each op so far, as the seed means them
        self.expect = []      # (op, ok) per reply

    # -- raw chunks
    def arena(self, off, data):
        """Bytes at arena offset `off` (BAR offset ARENA_OFF + off)."""
        self.data += struct.pack("<BIH", 1, off, len(data)) + data
        return self

    def raw(self, op_number, payload, reply=True):
        self.data += struct.pack("<BBHH", 0x0C if reply else 0x08, 0, op_number & 0xFFFF, len(payload)) + payload
        if reply:
            self.expect.append((None, False))
        return self

    # -- records
    def resolve(self, v):
        if isinstance(v, Ref):
            n = self.ok[v.op]
            if not 0 <= v.index < n:
                raise ValueError(f"{self.name}: {v.op} reply {v.index} named, {n} made")
            if not 0 <= v.add < 1 << 24:
                raise ValueError(f"{self.name}: addend {v.add} does not fit")
            age = n - 1 - v.index
            if age >= 32:
                raise ValueError(f"{self.name}: {v.op} reply {v.index} is {age} replies old")
            return (REPLY_TAG << 40) | ((P.op(v.op) & 0xFF) << 32) | (v.word << 29) | (age << 24) | v.add
        if isinstance(v, Words):
            return b"".join(x if isinstance(x, bytes) else struct.pack("<Q", self.resolve(x)) for x in v.vals)
        if isinstance(v, dict):
            return {k: self.resolve(x) for k, x in v.items()}
        if isinstance(v, list):
            return [self.resolve(x) for x in v]
        return v

    def call(self, op, ok=True, tail=b"", ch=0, cut=None, **fields):
        """One request of `op` (reply wanted, served at once); `cut` cuts or pads the payload."""
        payload = P.pack(P.request(op), **self.resolve(fields)) + self.resolve(tail if not isinstance(tail, list)
                                                                               else Words(*tail))
        if cut is not None:
            payload = payload[:cut] + bytes(max(0, cut - len(payload)))
        self.data += struct.pack("<BBHH", 0x0C, ch, P.op(op), len(payload)) + payload
        self.expect.append((op, ok))
        if ok:
            self.ok[op] += 1
        return self

    def new(self, op, field=None, word=None, **fields):
        """call() that must succeed; returns a Ref to `field` (or `word`) of its reply."""
        self.call(op, **fields)
        if word is None:
            rep = P.struct(P.reply(op))
            word = P.word(rep.name, field or rep.fields[0].name)
        return Ref(op, word, self.ok[op] - 1)

    # -- fixtures
    def hello(self):
        self.base = self.new("Hello", "arena_device_base", proto_version=P.consts["kProtoVersion"], pid=1, ppid=1)
        return self

    def context(self, device=0):
        return self.new("PrimaryRetain", device=device)

    def alloc(self, ctx, n=65536):
        return self.new("MemAlloc", "dptr", ctx=ctx, bytes=n)

    def stream(self, ctx, flags=0):
        return self.new("StreamCreate", ctx=ctx, flags=flags)

    def event(self, ctx, flags=0):
        return self.new("EventCreate", ctx=ctx, flags=flags)

    def module(self, ctx, at=0x1000):
        self.arena(at, PTX)
        return self.new("ModuleLoad", ctx=ctx, bytes=len(PTX), arena_off=ARENA_OFF + at)

    def function(self, ctx, mod, name=b"ivc_fill_u32"):
        return self.new("ModuleGetFunction", "function", ctx=ctx, module=mod, name_len=len(name), tail=name)

    def graph(self, ctx):
        return self.new("GraphCreate", ctx=ctx)

    def node(self, ctx, graph, deps=(), tail=b"", **params):
        return self.new("GraphAddNode", ctx=ctx, graph=graph, ndeps=len(deps),
                        tail=[*deps, P.pack("GraphNodeParams", **self.resolve(params)) + tail])

    def pinned(self, n=8192):
        """Page-locked arena memory: (BAR offset, device alias) Refs."""
        off = self.new("HostAlloc", "arena_off", bytes=n)
        return off, Ref("HostAlloc", P.word("RepHostAlloc", "dptr"), off.index)

    def vmm(self, size=MIB2, handle_types=0, usage=0, device=0):
        """Physical memory mapped into a reservation, readable and writable: (handle, base)."""
        h = self.new("MemCreate", prop=prop(device, handle_types, usage), size=size)
        base = self.new("MemAddressReserve", "base", size=size)
        self.call("MemMap", ptr=base, size=size, handle=h)
        self.call("MemSetAccess", ptr=base, size=size, count=1, tail=access(device))
        return h, base


def prop(device=0, handle_types=0, usage=0):
    return dict(type=C["CU_MEM_ALLOCATION_TYPE_PINNED"], loc_type=C["CU_MEM_LOCATION_TYPE_DEVICE"], loc_id=device,
                handle_types=handle_types, usage=usage)


def access(device=0, flags=None):
    return P.pack("MemAccess", loc_type=C["CU_MEM_LOCATION_TYPE_DEVICE"], loc_id=device,
                  flags=C["CU_MEM_ACCESS_FLAGS_PROT_READWRITE"] if flags is None else flags)


def f32(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


# Two kernels the GPU double runs (tests/gpu_double/kernels.cc) and a global.
PTX = b"""
.version 8.0
.target sm_90
.address_size 64

.visible .global .align 4 .u32 ivc_counter[16];

.visible .entry ivc_fill_u32(
\t.param .u64 ivc_fill_u32_param_0,
\t.param .u32 ivc_fill_u32_param_1,
\t.param .u64 ivc_fill_u32_param_2
)
{
\tret;
}

.visible .entry ivc_inc_u32(
\t.param .u64 ivc_inc_u32_param_0
)
{
\tret;
}
"""


def fill_params(ptr, value=7, n=16):
    """ivc_fill_u32's packed parameters (24 bytes: u64, u32 + pad, u64)."""
    return [ptr, value, n]


def launch_fields(ctx, fn, stream=0, block=32):
    return dict(ctx=ctx, function=fn, stream=stream, grid=[1, 1, 1], block=[block, 1, 1], param_bytes=24)


def start(name, devices=1):
    s = Seed(name).hello()
    s.ctx = s.context(0)
    if devices > 1:
        s.ctx1 = s.context(1)
    return s


# ----------------------------------------------------------------- sessions, devices, contexts

def session_seeds():
    s = Seed("Hello").hello()
    s.call("Hello", ok=False, proto_version=99, pid=1)
    s.call("Hello", ok=False, cut=4)  # truncated
    yield s
    s = start("DeviceInfo")
    for d, ok in ((0, True), (1, True), (2, False), (-1, False)):
        s.call("DeviceInfo", ok=ok, device=d)
    yield s
    s = start("PrimaryRetain", devices=2)
    s.call("PrimaryRetain", device=0)
    s.call("PrimaryRetain", ok=False, device=7)
    yield s
    # Releasing the last reference frees what the guest made in the context.
    s = start("PrimaryRelease")
    buf = s.alloc(s.ctx)
    st = s.stream(s.ctx)
    s.event(s.ctx)
    mod = s.module(s.ctx)
    s.function(s.ctx, mod)
    s.graph(s.ctx)
    s.new("MemAllocAsync", "dptr", ctx=s.ctx, stream=st, bytes=4096)
    s.call("PrimaryRelease", device=0)
    s.call("PrimaryRelease", ok=False, device=0)
    s.call("MemFree", ok=False, ctx=s.ctx, dptr=buf)
    s.call("PrimaryRelease", ok=False, device=9)
    yield s
    s = start("PrimaryReset")
    s.alloc(s.ctx)
    s.stream(s.ctx)
    s.call("PrimaryReset", device=0)
    s.call("PrimaryReset", device=1)
    s.call("PrimaryReset", ok=False, device=3)
    yield s
    s = start("PrimaryGetState")
    s.call("PrimaryGetState", device=0)
    s.call("PrimaryGetState", device=1)
    s.call("PrimaryGetState", ok=False, device=2)
    yield s
    s = start("PrimarySetFlags")
    s.call("PrimarySetFlags", device=1, flags=C["CU_CTX_SCHED_BLOCKING_SYNC"])
    s.call("PrimarySetFlags", device=0, flags=0)
    s.call("PrimarySetFlags", ok=False, device=0, flags=0x10000)
    s.call("PrimarySetFlags", ok=False, device=5, flags=0)
    yield s
    s = start("CtxCreate")
    c = s.new("CtxCreate", device=1, flags=0)
    s.call("CtxSynchronize", ctx=c)
    s.call("CtxCreate", ok=False, device=4)
    yield s
    # A created context dies with everything in it.
    s = start("CtxDestroy")
    c = s.new("CtxCreate", device=0)
    s.alloc(c)
    s.stream(c)
    s.event(c)
    s.graph(c)
    s.module(c)
    s.new("ArrayCreate", ctx=c, desc=dict(width=16, height=16, format=C["CU_AD_FORMAT_FLOAT"], channels=1))
    s.call("CtxDestroy", handle=c)
    s.call("CtxDestroy", ok=False, handle=c)
    s.call("CtxDestroy", ok=False, handle=s.ctx)  # a primary context
    yield s
    s = start("CtxSynchronize")
    s.call("CtxSynchronize", ctx=s.ctx)
    s.call("CtxSynchronize", ok=False, ctx=0)
    s.call("CtxSynchronize", ok=False, ctx=s.ctx + 1)
    yield s
    s = start("CtxGetLimit")
    for lim in ("CU_LIMIT_STACK_SIZE", "CU_LIMIT_PRINTF_FIFO_SIZE", "CU_LIMIT_MALLOC_HEAP_SIZE"):
        s.call("CtxGetLimit", ctx=s.ctx, limit=C[lim])
    s.call("CtxGetLimit", ok=False, ctx=s.ctx, limit=0x7FFFFFFF)
    yield s
    s = start("CtxSetLimit")
    s.call("CtxSetLimit", ctx=s.ctx, limit=C["CU_LIMIT_STACK_SIZE"], value=4096)
    s.call("CtxSetLimit", ctx=s.ctx, limit=C["CU_LIMIT_MALLOC_HEAP_SIZE"], value=1 << 20)
    s.call("CtxSetLimit", ok=False, ctx=s.ctx, limit=-1, value=1)
    yield s
    s = start("CtxMisc")
    ev = s.event(s.ctx)
    s.call("CtxMisc", ctx=s.ctx, kind=P.consts["kCtxGetFlags"])
    s.call("CtxMisc", ctx=s.ctx, kind=P.consts["kCtxSetFlags"], value=C["CU_CTX_SCHED_SPIN"])
    s.call("CtxMisc", ctx=s.ctx, kind=P.consts["kCtxGetCacheConfig"])
    s.call("CtxMisc", ctx=s.ctx, kind=P.consts["kCtxSetCacheConfig"], value=C["CU_FUNC_CACHE_PREFER_L1"])
    s.call("CtxMisc", ok=False, ctx=s.ctx, kind=P.consts["kCtxSetCacheConfig"], value=77)
    s.call("CtxMisc", ctx=s.ctx, kind=P.consts["kCtxResetPersistingL2"])
    s.call("CtxMisc", ctx=s.ctx, kind=P.consts["kCtxRecordEvent"], event=ev)
    s.call("CtxMisc", ctx=s.ctx, kind=P.consts["kCtxWaitEvent"], event=ev)
    s.call("CtxMisc", ok=False, ctx=s.ctx, kind=P.consts["kCtxWaitEvent"], event=ev + 1)
    s.call("CtxMisc", ok=False, ctx=s.ctx, kind=99)
    yield s
    s = start("Flush")
    buf = s.alloc(s.ctx)
    s.call("MemcpyHtoDArena", ctx=s.ctx, dst=buf, bytes=512, arena_off=ARENA_OFF)  # a staged chunk
    s.call("Flush", ctx=s.ctx)
    yield s
    s = start("FlushWait")
    buf = s.alloc(s.ctx)
    s.call("MemcpyHtoDArena", ctx=s.ctx, dst=buf, bytes=512, arena_off=ARENA_OFF)  # a staged chunk
    s.call("FlushWait", ctx=s.ctx)
    yield s
    s = start("Goodbye")
    s.call("Goodbye", ctx=s.ctx)
    s.call("Goodbye", ctx=0)
    yield s


# ----------------------------------------------------------------- memory and copies

def memory_seeds():
    s = start("MemAlloc")
    s.alloc(s.ctx, 4096)
    s.call("MemAlloc", ctx=s.ctx, bytes=0, width=100, height=10, elem_size=4)  # pitched
    s.call("MemAlloc", ok=False, ctx=s.ctx, bytes=0)
    s.call("MemAlloc", ok=False, ctx=s.ctx, width=1 << 40, height=1 << 40, elem_size=4)
    s.call("MemAlloc", ok=False, ctx=0, bytes=64)
    yield s
    s = start("MemFree")
    buf = s.alloc(s.ctx)
    s.call("MemFree", ctx=s.ctx, dptr=buf)
    s.call("MemFree", ok=False, ctx=s.ctx, dptr=buf)
    s.call("MemFree", ok=False, ctx=s.ctx, dptr=s.alloc(s.ctx) + 16)
    yield s
    s = start("MemGetInfo")
    s.alloc(s.ctx)
    s.call("MemGetInfo", ctx=s.ctx)
    s.call("MemGetInfo", ok=False, ctx=0)
    yield s
    s = start("MemGetAddressRange")
    buf = s.alloc(s.ctx)
    s.call("MemGetAddressRange", ctx=s.ctx, dptr=buf + 100)
    s.call("MemGetAddressRange", ok=False, ctx=s.ctx, dptr=buf + 65536)
    s.call("MemGetAddressRange", ok=False, ctx=s.ctx, dptr=8)
    yield s
    s = start("Memset")
    buf = s.alloc(s.ctx)
    st = s.stream(s.ctx)
    for elem in (1, 2, 4):
        s.call("Memset", ctx=s.ctx, dptr=buf, width=64, height=1, value=0x5A, elem_size=elem)
    s.call("Memset", ctx=s.ctx, dptr=buf, pitch=256, width=16, height=8, value=1, elem_size=4)  # 2D
    s.call("Memset", ctx=s.ctx, stream=st, dptr=buf + 64, width=32, height=1, value=2, elem_size=2,
           flags=P.consts["kAsync"])
    s.call("Memset", ok=False, ctx=s.ctx, dptr=buf, width=1 << 20, height=1, elem_size=4)
    s.call("Memset", ok=False, ctx=s.ctx, dptr=buf, pitch=8, width=16, height=4, elem_size=1)
    s.call("Memset", ok=False, ctx=s.ctx, dptr=buf, width=4, height=1, elem_size=3)
    yield s
    s = start("MemcpyHtoDInline")
    buf = s.alloc(s.ctx)
    st = s.stream(s.ctx)
    s.call("MemcpyHtoDInline", ctx=s.ctx, dst=buf, bytes=32, tail=bytes(range(32)))
    s.call("MemcpyHtoDInline", ctx=s.ctx, stream=st, dst=buf + 32, bytes=16, flags=P.consts["kAsync"],
           tail=bytes(16))
    s.call("MemcpyHtoDInline", ok=False, ctx=s.ctx, dst=buf, bytes=40, tail=bytes(8))
    s.call("MemcpyHtoDInline", ok=False, ctx=s.ctx, dst=buf + 65530, bytes=8, tail=bytes(8))
    yield s
    s = start("MemcpyHtoDArena")
    buf = s.alloc(s.ctx)
    st = s.stream(s.ctx)
    off, _ = s.pinned()
    s.call("MemcpyHtoDArena", ctx=s.ctx, dst=buf, bytes=4096, arena_off=off)            # page-locked
    s.call("MemcpyHtoDArena", ctx=s.ctx, dst=buf, bytes=4096, arena_off=off, stream=st,
           flags=P.consts["kAsync"] | P.consts["kWaitStream"])
    s.call("MemcpyHtoDArena", ctx=s.ctx, dst=buf, bytes=1024, arena_off=ARENA_OFF)     # a staged chunk
    s.call("MemcpyHtoDArena", ctx=s.ctx, dst=buf, bytes=1024, arena_off=ARENA_OFF + 1024, stream=st,
           flags=P.consts["kAsync"])
    s.call("MemcpyHtoDArena", ok=False, ctx=s.ctx, dst=buf, bytes=4096, arena_off=8)
    s.call("MemcpyHtoDArena", ok=False, ctx=s.ctx, dst=buf + 65000, bytes=4096, arena_off=off)
    yield s
    s = start("MemcpyDtoHArena")
    buf = s.alloc(s.ctx)
    st = s.stream(s.ctx)
    off, _ = s.pinned()
    s.call("MemcpyDtoHArena", ctx=s.ctx, src=buf, bytes=4096, arena_off=off)
    s.call("MemcpyDtoHArena", ctx=s.ctx, src=buf, bytes=2048, arena_off=off, stream=st, flags=P.consts["kAsync"])
    s.call("MemcpyDtoHArena", ctx=s.ctx, src=buf, bytes=1024, arena_off=ARENA_OFF + STAGING)  # channel 1's slot
    s.call("MemcpyDtoHArena", ctx=s.ctx, src=buf, bytes=1024, arena_off=ARENA_OFF + 2048, stream=st,
           flags=P.consts["kAsync"])
    s.call("MemcpyDtoHArena", ok=False, ctx=s.ctx, src=buf, bytes=1 << 30, arena_off=off)
    yield s
    s = start("MemcpyDtoHInline")
    buf = s.alloc(s.ctx)
    st = s.stream(s.ctx)
    s.call("MemcpyDtoHInline", ctx=s.ctx, src=buf, bytes=256)
    s.call("MemcpyDtoHInline", ctx=s.ctx, src=buf, bytes=128, stream=st, flags=P.consts["kAsync"])
    s.call("MemcpyDtoHInline", ctx=s.ctx, src=buf, bytes=0)
    s.call("MemcpyDtoHInline", ok=False, ctx=s.ctx, src=buf, bytes=P.consts["kInlineCopyMax"] + 8)
    s.call("MemcpyDtoHInline", ok=False, ctx=s.ctx, src=buf + 65528, bytes=64)
    yield s
    s = start("MemcpyDtoD")
    a, b = s.alloc(s.ctx), s.alloc(s.ctx)
    st = s.stream(s.ctx)
    s.call("MemcpyDtoD", ctx=s.ctx, dst=b, src=a, bytes=4096)
    s.call("MemcpyDtoD", ctx=s.ctx, dst=b + 4096, src=a, bytes=4096, stream=st, flags=P.consts["kAsync"])
    s.call("MemcpyDtoD", ctx=s.ctx, dst=b, src=a, bytes=0)
    s.call("MemcpyDtoD", ok=False, ctx=s.ctx, dst=b, src=a + 4096, bytes=65536)
    yield s
    s = start("Memcpy2D")
    a = s.alloc(s.ctx)
    off, _ = s.pinned(16384)
    st = s.stream(s.ctx)
    dev, host = C["CU_MEMORYTYPE_DEVICE"], C["CU_MEMORYTYPE_HOST"]
    s.call("Memcpy2D", ctx=s.ctx, src_type=host, src_arena_off=off, src_pitch=128, dst_type=dev, dst_device=a,
           dst_pitch=256, width_bytes=64, height=16)
    s.call("Memcpy2D", ctx=s.ctx, src_type=dev, src_device=a, src_pitch=256, src_x_bytes=8, src_y=2,
           dst_type=host, dst_arena_off=off, dst_pitch=64, width_bytes=32, height=8, stream=st,
           flags=P.consts["kAsync"] | P.consts["kWaitStream"])
    s.call("Memcpy2D", ctx=s.ctx, src_type=dev, src_device=a, src_pitch=256, dst_type=dev, dst_device=a + 8192,
           dst_pitch=256, width_bytes=100, height=4, unaligned=1)
    s.call("Memcpy2D", ok=False, ctx=s.ctx, src_type=dev, src_device=a, src_pitch=16, dst_type=dev,
           dst_device=a, dst_pitch=256, width_bytes=64, height=4)
    s.call("Memcpy2D", ok=False, ctx=s.ctx, src_type=3, dst_type=dev, dst_device=a, width_bytes=4, height=1)
    yield s
    s = start("HostAlloc")
    s.pinned(4096)
    s.pinned(100000)
    s.call("HostAlloc", ok=False, bytes=0)
    s.call("HostAlloc", ok=False, bytes=1 << 30)
    yield s
    s = start("HostFree")
    off, _ = s.pinned()
    s.call("HostFree", arena_off=off)
    s.call("HostFree", ok=False, arena_off=off)
    s.call("HostFree", ok=False, arena_off=s.pinned()[0] + 64)
    yield s
    s = start("MemcpyPeer", devices=2)
    a, b = s.alloc(s.ctx), s.alloc(s.ctx1)
    st = s.stream(s.ctx)
    s.call("MemcpyPeer", ctx=s.ctx, dst=b, dst_ctx=s.ctx1, src=a, src_ctx=s.ctx, bytes=4096)
    s.call("MemcpyPeer", ctx=s.ctx, stream=st, dst=a, dst_ctx=s.ctx, src=b, src_ctx=s.ctx1, bytes=1024,
           flags=P.consts["kAsync"])
    s.call("MemcpyPeer", ctx=s.ctx, bytes=0)
    s.call("MemcpyPeer", ok=False, ctx=s.ctx, dst=b, dst_ctx=s.ctx1 + 1, src=a, src_ctx=s.ctx, bytes=64)
    yield s
    s = start("StreamMemOps")
    buf = s.alloc(s.ctx)
    st = s.stream(s.ctx)

    w32 = C["CU_STREAM_MEM_OP_WRITE_VALUE_32"]
    for kind in ("CU_STREAM_MEM_OP_WRITE_VALUE_32", "CU_STREAM_MEM_OP_WAIT_VALUE_32",
                 "CU_STREAM_MEM_OP_WRITE_VALUE_64", "CU_STREAM_MEM_OP_WAIT_VALUE_64"):
        s.call("StreamMemOps", ctx=s.ctx, stream=st, count=1, single=1,
               tail=memop(s, C[kind], buf + 64))
    s.call("StreamMemOps", ctx=s.ctx, stream=st, count=3,
           tail=memop(s, w32, buf) + memop(s, C["CU_STREAM_MEM_OP_BARRIER"], 0)
           + memop(s, C["CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES"], 0))
    s.call("StreamMemOps", ok=False, ctx=s.ctx, stream=st, count=1, single=1, tail=memop(s, w32, buf + 65536))
    s.call("StreamMemOps", ok=False, ctx=s.ctx, stream=st, count=2, tail=memop(s, w32, buf))
    s.call("StreamMemOps", ok=False, ctx=s.ctx, stream=st, count=1, tail=memop(s, 99, buf))
    yield s
    s = start("HostFunc")
    st = s.stream(s.ctx)
    s.pinned(0x1000)  # the words' page, page-locked as the guest library's pairs are (the pool's first block)
    off = POOL_OFF + 0x100
    # The pairs' "done" words already past their seq: no guest runs the functions here, and
    # the double (IVCUDA_GPU_DOUBLE_FUZZ) gives up on a wait at once.
    s.arena(off - ARENA_OFF, struct.pack("<4I", 0, 1, 0, 2))
    s.call("HostFunc", ctx=s.ctx, stream=st, reached=s.base + off, done=s.base + off + 4, seq=1)
    s.call("HostFunc", ctx=s.ctx, stream=0, reached=s.base + off + 8, done=s.base + off + 12, seq=2)
    s.call("HostFunc", ok=False, ctx=s.ctx, stream=st, reached=s.base + off + 2, done=s.base + off + 4, seq=1)
    s.call("HostFunc", ok=False, ctx=s.ctx, stream=st + 1, reached=s.base + off, done=s.base + off + 4, seq=3)
    s.call("HostFunc", ok=False, ctx=s.ctx, stream=st, reached=s.base + off, done=s.base + off + 4,
           seq=P.consts["kHostFuncFailed"])
    yield s


def memop(s, operation, addr, value=1, flags=0):
    """One MemOp with its address resolved now (it goes in a tail)."""
    return struct.pack("<IIQQ", operation, flags, s.resolve(addr), value)


# ----------------------------------------------------------------- modules and launches

def module_seeds():
    s = start("ModuleLoad")
    s.module(s.ctx)
    s.arena(0x8000, b"not an image at all")
    s.call("ModuleLoad", ok=False, ctx=s.ctx, bytes=19, arena_off=ARENA_OFF + 0x8000)
    s.call("ModuleLoad", ok=False, ctx=s.ctx, bytes=0, arena_off=ARENA_OFF)
    s.call("ModuleLoad", ok=False, ctx=s.ctx, bytes=1 << 30, arena_off=ARENA_OFF)
    yield s
    s = start("ModuleUnload")
    mod = s.module(s.ctx)
    s.function(s.ctx, mod)
    s.new("ModuleGetGlobal", "base", ctx=s.ctx, module=mod, name_len=11, tail=b"ivc_counter")
    s.call("ModuleUnload", ctx=s.ctx, handle=mod)
    s.call("ModuleUnload", ok=False, ctx=s.ctx, handle=mod)
    yield s
    s = start("ModuleGetFunction")
    mod = s.module(s.ctx)
    s.function(s.ctx, mod)
    s.function(s.ctx, mod)  # again: the same handle
    s.function(s.ctx, mod, b"ivc_inc_u32")
    s.call("ModuleGetFunction", ok=False, ctx=s.ctx, module=mod, name_len=7, tail=b"nothere")
    s.call("ModuleGetFunction", ok=False, ctx=s.ctx, module=mod, name_len=5, tail=b"ab\0cd")
    s.call("ModuleGetFunction", ok=False, ctx=s.ctx, module=mod, name_len=9, tail=b"short")
    yield s
    s = start("ModuleGetGlobal")
    mod = s.module(s.ctx)
    g = s.new("ModuleGetGlobal", "base", ctx=s.ctx, module=mod, name_len=11, tail=b"ivc_counter")
    s.call("ModuleGetGlobal", ctx=s.ctx, module=mod, name_len=11, tail=b"ivc_counter")
    s.call("MemcpyHtoDInline", ctx=s.ctx, dst=g, bytes=8, tail=bytes(8))
    s.call("ModuleGetGlobal", ok=False, ctx=s.ctx, module=mod, name_len=4, tail=b"none")
    yield s
    s = start("ModuleEnumerate")
    mod = s.module(s.ctx)
    s.call("ModuleEnumerate", ctx=s.ctx, handle=mod)
    s.call("ModuleEnumerate", ok=False, ctx=s.ctx, handle=mod + 1)
    yield s
    # The JIT linker: create, add, complete, read back, load the output, destroy; and refusals.
    s = start("Link")
    opt = P.pack("LinkOption", option=0, value=32)  # CU_JIT_MAX_REGISTERS
    link = s.new("Link", ctx=s.ctx, kind=P.consts["kLinkCreate"], count=1, tail=opt)
    s.call("Link", ok=False, ctx=s.ctx, kind=P.consts["kLinkCreate"], count=2, tail=opt)
    s.arena(0x1000, PTX)
    add = dict(ctx=s.ctx, link=link, kind=P.consts["kLinkAdd"], input_type=1,  # CU_JIT_INPUT_PTX
               bytes=len(PTX), arena_off=ARENA_OFF + 0x1000)
    s.call("Link", **add, name_len=4, tail=b"main")
    s.call("Link", ok=False, **{**add, "link": link + 1})
    s.call("Link", ok=False, **{**add, "input_type": 0})  # PTX added as a cubin (CU_JIT_INPUT_CUBIN)
    size = s.new("Link", "size", ctx=s.ctx, link=link, kind=P.consts["kLinkComplete"])
    s.call("Link", ctx=s.ctx, link=link, kind=P.consts["kLinkRead"], bytes=size, arena_off=ARENA_OFF + 0x20000)
    s.call("Link", ok=False, ctx=s.ctx, link=link, kind=P.consts["kLinkRead"], bytes=size + 1,
           arena_off=ARENA_OFF + 0x20000)
    s.call("Link", ok=False, ctx=s.ctx, link=link, kind=9)
    s.call("Link", ctx=s.ctx, link=link, kind=P.consts["kLinkDestroy"])
    s.call("Link", ok=False, ctx=s.ctx, link=link, kind=P.consts["kLinkDestroy"])
    yield s
    for op in ("FuncGetAttribute", "FuncSetAttribute", "FuncSetCacheConfig", "FuncMisc", "Occupancy"):
        s = start(op)
        mod = s.module(s.ctx)
        s.fn = s.function(s.ctx, mod)
        yield from FUNC_OPS[op](s)
    for op in ("Launch", "LaunchCooperative"):
        s = start(op)
        buf = s.alloc(s.ctx)
        st = s.stream(s.ctx)
        fn = s.function(s.ctx, s.module(s.ctx))
        s.call(op, **launch_fields(s.ctx, fn), tail=fill_params(buf))
        s.call(op, **launch_fields(s.ctx, fn, st), tail=fill_params(buf + 1024, 9, 64))
        s.call(op, ok=False, **launch_fields(s.ctx, fn), tail=fill_params(buf)[:2])
        s.call(op, ok=False, **launch_fields(s.ctx, fn + 1), tail=fill_params(buf))
        s.call("CtxSynchronize", ctx=s.ctx)
        yield s
    s = start("LaunchEx")
    buf = s.alloc(s.ctx)
    fn = s.function(s.ctx, s.module(s.ctx))

    def attr(name, *value):
        return P.pack("LaunchAttr", id=C[name], value=list(value))
    attrs = (attr("CU_LAUNCH_ATTRIBUTE_PRIORITY", 1) + attr("CU_LAUNCH_ATTRIBUTE_COOPERATIVE", 0)
             + attr("CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN", 0) + attr("CU_LAUNCH_ATTRIBUTE_IGNORE"))
    s.call("LaunchEx", launch=launch_fields(s.ctx, fn), attr_count=4, tail=[attrs, *fill_params(buf)])
    s.call("LaunchEx", launch=launch_fields(s.ctx, fn), attr_count=2,
           tail=[attr("CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION", 1)
                 + attr("CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP", 0, 1), *fill_params(buf)])
    s.call("LaunchEx", launch=launch_fields(s.ctx, fn), attr_count=0, tail=fill_params(buf))
    s.call("LaunchEx", ok=False, launch=launch_fields(s.ctx, fn), attr_count=1,
           tail=[attr("CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION", 2, 1, 1), *fill_params(buf)])
    s.call("LaunchEx", ok=False, launch=launch_fields(s.ctx, fn), attr_count=1,
           tail=[attr("CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE", 77), *fill_params(buf)])
    s.call("LaunchEx", ok=False, launch=launch_fields(s.ctx, fn), attr_count=1,
           tail=[attr("CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW"), *fill_params(buf)])
    s.call("LaunchEx", ok=False, launch=launch_fields(s.ctx, fn), attr_count=17, tail=fill_params(buf))
    yield s
    s = start("OccupancyCluster")
    fn = s.function(s.ctx, s.module(s.ctx))
    s.call("OccupancyCluster", ctx=s.ctx, function=fn, grid=[2, 1, 1], block=[32, 1, 1])
    s.call("OccupancyCluster", ctx=s.ctx, function=fn, grid=[2, 1, 1], block=[32, 1, 1],
           cluster=[2, 1, 1], policy=C["CU_CLUSTER_SCHEDULING_POLICY_SPREAD"])
    s.call("OccupancyCluster", ok=False, ctx=s.ctx, function=fn, grid=[1, 1, 1], block=[1, 1, 1], policy=99)
    yield s
    s = start("TensorMapEncodeTiled")
    buf = s.alloc(s.ctx)
    tm = dict(ctx=s.ctx, global_address=buf, global_dim=[64, 64], global_strides=[64], box_dim=[8, 8],
              element_strides=[1, 1], data_type=C["CU_TENSOR_MAP_DATA_TYPE_UINT8"], rank=2)
    s.call("TensorMapEncodeTiled", **tm)
    s.call("TensorMapEncodeTiled", **dict(tm, ctx=0, swizzle=C["CU_TENSOR_MAP_SWIZZLE_32B"]))
    s.call("TensorMapEncodeTiled", ok=False, **dict(tm, rank=6))
    s.call("TensorMapEncodeTiled", ok=False, **dict(tm, data_type=1 << 20))
    s.call("TensorMapEncodeTiled", ok=False, **dict(tm, global_strides=[60]))
    yield s
    s = start("OccupancyClusterSize")
    fn = s.function(s.ctx, s.module(s.ctx))
    s.call("OccupancyClusterSize", ctx=s.ctx, function=fn, grid=[16, 1, 1], block=[128, 1, 1])
    s.call("OccupancyClusterSize", ctx=s.ctx, function=fn, grid=[2, 1, 1], block=[32, 1, 1],
           cluster=[2, 1, 1], policy=C["CU_CLUSTER_SCHEDULING_POLICY_SPREAD"])
    s.call("OccupancyClusterSize", ok=False, ctx=s.ctx, function=fn, grid=[1, 1, 1], block=[0, 1, 1])
    s.call("OccupancyClusterSize", ok=False, ctx=s.ctx, function=fn, grid=[1, 1, 1], block=[1, 1, 1], policy=99)
    yield s
    s = start("TensorMapEncodeIm2col")
    buf = s.alloc(s.ctx)
    col = dict(ctx=s.ctx, global_address=buf, global_dim=[16, 8, 8, 1], global_strides=[64, 512, 4096],
               element_strides=[1, 1, 1, 1], lower_corner=[-1, -1], upper_corner=[-1, -1], channels_per_pixel=16,
               pixels_per_column=32, data_type=C["CU_TENSOR_MAP_DATA_TYPE_FLOAT32"], rank=4)
    s.call("TensorMapEncodeIm2col", **col)
    s.call("TensorMapEncodeIm2col", **dict(col, ctx=0, rank=3, global_dim=[16, 8, 1], global_strides=[64, 512]))
    s.call("TensorMapEncodeIm2col", ok=False, **dict(col, rank=2))
    s.call("TensorMapEncodeIm2col", ok=False, **dict(col, channels_per_pixel=0))
    s.call("TensorMapEncodeIm2col", **dict(col, wide=1, mode=C["CU_TENSOR_MAP_IM2COL_WIDE_MODE_W128"],
                                           lower_width=-1, upper_width=-1))
    s.call("TensorMapEncodeIm2col", ok=False, **dict(col, wide=2))
    s.call("TensorMapEncodeIm2col", ok=False, **dict(col, mode=77))
    yield s
    s = start("TensorMapReplaceAddress")
    buf = s.alloc(s.ctx)
    s.call("TensorMapReplaceAddress", ctx=s.ctx, global_address=buf, words=[buf, 0x200000000])
    s.call("TensorMapReplaceAddress", ctx=0, global_address=buf + 256, words=[buf, 0x200000000])
    s.call("TensorMapReplaceAddress", ok=False, ctx=s.ctx, global_address=buf + 3, words=[buf])
    yield s
    s = start("Texture1DLinearMaxWidth")
    s.call("Texture1DLinearMaxWidth", device=0, format=C["CU_AD_FORMAT_FLOAT"], channels=4)
    s.call("Texture1DLinearMaxWidth", device=0, format=C["CU_AD_FORMAT_UNSIGNED_INT8"], channels=1)
    s.call("Texture1DLinearMaxWidth", ok=False, device=0, format=C["CU_AD_FORMAT_FLOAT"], channels=3)
    s.call("Texture1DLinearMaxWidth", ok=False, device=0, format=999, channels=1)
    s.call("Texture1DLinearMaxWidth", ok=False, device=9, format=C["CU_AD_FORMAT_FLOAT"], channels=1)
    yield s
    # The fuzz harness has no connection, so no file ever arrives with a token:
    # every registration is refused, as is unregistering what was never registered.
    s = start("HostRegisterShared")
    s.call("HostRegisterShared", ok=False, token=1, file_off=0, bytes=4096, flags=0)
    s.call("HostRegisterShared", ok=False, token=2, file_off=4096, bytes=1 << 20,
           flags=C["CU_MEMHOSTREGISTER_READ_ONLY"])
    s.call("HostRegisterShared", ok=False, token=3, file_off=1, bytes=100, flags=0xff)
    yield s
    s = start("HostUnregisterShared")
    s.call("HostUnregisterShared", ok=False, arena_off=1 << 40)
    s.call("HostUnregisterShared", ok=False, arena_off=s.pinned()[0])
    yield s
    # IVCUDA_TRACE_STAGES' question: the medians of what the guest marked
    # (nothing here: the harness marks no record), asked twice.
    s = start("StageTrace")
    s.call("StageTrace", ctx=0)
    s.call("StageTrace", ctx=0)
    yield s


def _func_get_attribute(s):
    for a in ("CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK", "CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES",
              "CU_FUNC_ATTRIBUTE_NUM_REGS"):
        s.call("FuncGetAttribute", ctx=s.ctx, function=s.fn, attrib=C[a])
    s.call("FuncGetAttribute", ok=False, ctx=s.ctx, function=s.fn + 1, attrib=0)
    s.call("FuncGetAttribute", ok=False, ctx=s.ctx, function=s.fn, attrib=1 << 20)  # no CUfunction_attribute
    s.call("FuncGetAttribute", ok=False, ctx=s.ctx, function=s.fn, attrib=-1)
    yield s


def _func_set_attribute(s):
    s.call("FuncSetAttribute", ctx=s.ctx, function=s.fn, attrib=C["CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES"],
           value=1024)
    s.call("FuncSetAttribute", ctx=s.ctx, function=s.fn,
           attrib=C["CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT"], value=50)
    s.call("FuncSetAttribute", ok=False, ctx=s.ctx, function=s.fn, attrib=-5, value=1)
    yield s


def _func_set_cache_config(s):
    s.call("FuncSetCacheConfig", ctx=s.ctx, function=s.fn, config=C["CU_FUNC_CACHE_PREFER_SHARED"])
    s.call("FuncSetCacheConfig", ok=False, ctx=s.ctx, function=s.fn, config=9)
    s.call("FuncSetCacheConfig", ok=False, ctx=s.ctx, function=s.fn + 1, config=0)
    yield s


def _func_misc(s):
    for k in ("kFuncName", "kFuncModule", "kFuncIsLoaded", "kFuncLoad"):
        s.call("FuncMisc", function=s.fn, kind=P.consts[k])
    s.call("FuncMisc", ok=False, function=s.fn, kind=9)
    s.call("FuncMisc", ok=False, function=s.fn + 1, kind=0)
    yield s


def _occupancy(s):
    s.call("Occupancy", ctx=s.ctx, function=s.fn, block_size=128, kind=P.consts["kOccMaxActiveBlocks"])
    s.call("Occupancy", ctx=s.ctx, function=s.fn, block_size=128, num_blocks=2,
           kind=P.consts["kOccAvailableDynamicSmem"])
    s.call("Occupancy", ctx=s.ctx, function=s.fn, block_size=1024, kind=P.consts["kOccMaxPotentialBlockSize"])
    s.call("Occupancy", ok=False, ctx=s.ctx, function=s.fn, kind=5)
    yield s


FUNC_OPS = {"FuncGetAttribute": _func_get_attribute, "FuncSetAttribute": _func_set_attribute,
            "FuncSetCacheConfig": _func_set_cache_config, "FuncMisc": _func_misc, "Occupancy": _occupancy}


# ----------------------------------------------------------------- streams and events

def stream_seeds():
    s = start("StreamCreate")
    s.stream(s.ctx)
    s.call("StreamCreate", ctx=s.ctx, flags=C["CU_STREAM_NON_BLOCKING"], priority=-1)
    s.call("StreamCreate", ok=False, ctx=0)
    yield s
    s = start("StreamDestroy")
    st = s.stream(s.ctx)
    s.call("StreamDestroy", ctx=s.ctx, handle=st)
    s.call("StreamDestroy", ok=False, ctx=s.ctx, handle=st)
    yield s
    for op in ("StreamQuery", "StreamSynchronize", "StreamGetPriority"):
        s = start(op)
        st = s.stream(s.ctx, C["CU_STREAM_NON_BLOCKING"])
        buf = s.alloc(s.ctx)
        s.call("Memset", ctx=s.ctx, stream=st, dptr=buf, width=64, height=1, elem_size=1, flags=P.consts["kAsync"])
        s.call(op, ctx=s.ctx, handle=st)
        s.call(op, ctx=s.ctx, handle=0)
        s.call(op, ctx=s.ctx, handle=1)  # CU_STREAM_LEGACY
        s.call(op, ctx=s.ctx, handle=2)  # CU_STREAM_PER_THREAD
        s.call(op, ok=False, ctx=s.ctx, handle=st + 1)
        yield s
    s = start("StreamWaitEvent")
    st = s.stream(s.ctx)
    ev = s.event(s.ctx)
    s.call("EventRecord", ctx=s.ctx, event=ev)
    s.call("StreamWaitEvent", ctx=s.ctx, stream=st, event=ev)
    s.call("StreamWaitEvent", ctx=s.ctx, stream=0, event=ev)
    s.call("StreamWaitEvent", ok=False, ctx=s.ctx, stream=st, event=ev + 1)
    yield s
    s = start("StreamAttr")
    a, b = s.stream(s.ctx), s.stream(s.ctx)
    buf = s.alloc(s.ctx)
    get, set_, copy = (P.consts[k] for k in ("kKernelAttrGet", "kKernelAttrSet", "kKernelAttrCopy"))
    prio = C["CU_LAUNCH_ATTRIBUTE_PRIORITY"]
    window = C["CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW"]
    s.call("StreamAttr", ctx=s.ctx, stream=a, kind=get, attr=prio)
    s.call("StreamAttr", ctx=s.ctx, stream=a, kind=set_, attr=C["CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY"],
           value=struct.pack("<I", C["CU_SYNC_POLICY_SPIN"]))
    s.call("StreamAttr", ctx=s.ctx, stream=a, kind=set_, attr=window,
           value=Words(buf, 4096, f32(0.5) | C["CU_ACCESS_PROPERTY_PERSISTING"] << 32,
                       C["CU_ACCESS_PROPERTY_STREAMING"]))
    s.call("StreamAttr", ctx=s.ctx, stream=a, kind=get, attr=window)
    s.call("StreamAttr", ctx=s.ctx, stream=b, src=a, kind=copy)
    s.call("StreamAttr", ok=False, ctx=s.ctx, stream=a, kind=set_, attr=window, value=Words(8, 4096))
    s.call("StreamAttr", ok=False, ctx=s.ctx, stream=a, kind=get, attr=C["CU_LAUNCH_ATTRIBUTE_COOPERATIVE"])
    s.call("StreamAttr", ok=False, ctx=s.ctx, stream=a, kind=7, attr=prio)
    s.call("StreamAttr", ok=False, ctx=s.ctx, stream=b, src=b + 1, kind=copy)
    yield s
    s = start("EventCreate")
    s.event(s.ctx)
    s.event(s.ctx, C["CU_EVENT_DISABLE_TIMING"] | C["CU_EVENT_BLOCKING_SYNC"])
    s.call("EventCreate", ok=False, ctx=0)
    yield s
    for op in ("EventRecord", "EventRecordFlags"):
        s = start(op)
        st = s.stream(s.ctx)
        ev = s.event(s.ctx)
        s.call(op, ctx=s.ctx, event=ev, stream=st)
        s.call(op, ctx=s.ctx, event=ev, stream=0)
        s.call(op, ok=False, ctx=s.ctx, event=ev + 1, stream=st)
        s.call(op, ok=False, ctx=s.ctx, event=ev, stream=st + 1)
        if op == "EventRecordFlags":
            s.call(op, ctx=s.ctx, event=ev, stream=st, flags=C["CU_EVENT_RECORD_DEFAULT"])
            s.call(op, ok=False, ctx=s.ctx, event=ev, stream=st, flags=C["CU_EVENT_RECORD_EXTERNAL"])
        yield s
    for op in ("EventQuery", "EventSynchronize", "EventDestroy"):
        s = start(op)
        ev = s.event(s.ctx)
        s.call("EventRecord", ctx=s.ctx, event=ev)
        s.call(op, ctx=s.ctx, handle=ev)
        s.call(op, ok=False, ctx=s.ctx, handle=ev + 1)
        yield s
    s = start("EventElapsedTime")
    a, b = s.event(s.ctx), s.event(s.ctx)
    s.call("EventRecord", ctx=s.ctx, event=a)
    s.call("EventRecord", ctx=s.ctx, event=b)
    s.call("EventElapsedTime", ctx=s.ctx, start=a, end=b)
    s.call("EventElapsedTime", ok=False, ctx=s.ctx, start=a, end=b + 1)
    yield s
    s = start("PeerQuery", devices=1)
    s.call("PeerQuery", device=0, peer=1)
    for attr in ("CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK", "CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED",
                 "CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED"):
        s.call("PeerQuery", device=1, peer=0, attrib=C[attr] + 1)
    s.call("PeerQuery", ok=False, device=0, peer=1, attrib=200)
    s.call("PeerQuery", ok=False, device=0, peer=2)
    # Atomic capabilities: to the host (peer -1), to a peer, an operation past the enum.
    s.call("PeerQuery", device=0, peer=-1, attrib=0x10000 + C["CU_ATOMIC_OPERATION_CAS"])
    s.call("PeerQuery", device=0, peer=1, attrib=0x10000 + C["CU_ATOMIC_OPERATION_FLOAT_ADD"])
    s.call("PeerQuery", ok=False, device=0, peer=-1, attrib=0x10000 + C["CU_ATOMIC_OPERATION_MAX"])
    s.call("PeerQuery", ok=False, device=0, peer=-2, attrib=0x10000)
    yield s
    s = start("PeerAccess", devices=2)
    s.call("PeerAccess", ctx=s.ctx, peer_ctx=s.ctx1, enable=1)
    s.call("PeerAccess", ok=False, ctx=s.ctx, peer_ctx=s.ctx1, enable=1)  # already enabled
    s.call("PeerAccess", ctx=s.ctx, peer_ctx=s.ctx1, enable=0)
    s.call("PeerAccess", ok=False, ctx=s.ctx, peer_ctx=s.ctx1 + 1, enable=1)
    yield s


# ----------------------------------------------------------------- stream-ordered memory and pools

def pool_seeds():
    fd = C["CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"]
    dev = C["CU_MEM_LOCATION_TYPE_DEVICE"]
    pinned = C["CU_MEM_ALLOCATION_TYPE_PINNED"]

    def pool(s, handle_types=0, device=0):
        return s.new("MemPoolCreate", alloc_type=pinned, handle_types=handle_types, loc_type=dev, loc_id=device)
    s = start("MemPool")
    k = P.consts
    s.call("MemPool", ctx=s.ctx, device=0, kind=k["kPoolGetDefault"])
    default = Ref("MemPool", 0, s.ok["MemPool"] - 1)
    s.call("MemPool", ctx=s.ctx, device=1, kind=k["kPoolGetCurrent"])
    p = pool(s)
    s.call("MemPool", ctx=s.ctx, device=0, pool=p, kind=k["kPoolSetCurrent"])
    s.call("MemPool", ctx=0, device=0, kind=k["kPoolGetCurrent"])
    for attr, v in (("CU_MEMPOOL_ATTR_RELEASE_THRESHOLD", 1 << 20), ("CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC", 0)):
        s.call("MemPool", ctx=s.ctx, pool=p, attr=C[attr], value=v, kind=k["kPoolSetAttr"])
        s.call("MemPool", ctx=s.ctx, pool=p, attr=C[attr], kind=k["kPoolGetAttr"])
    s.call("MemPool", ctx=s.ctx, pool=default, attr=C["CU_MEMPOOL_ATTR_USED_MEM_HIGH"], kind=k["kPoolGetAttr"])
    s.call("MemPool", ok=False, ctx=s.ctx, pool=p, attr=99, kind=k["kPoolGetAttr"])
    s.call("MemPool", ctx=s.ctx, pool=p, value=0, kind=k["kPoolTrim"])
    s.call("MemPool", ctx=s.ctx, pool=p, attr=dev, device=1, kind=k["kPoolGetAccess"])
    s.call("MemPool", ok=False, ctx=s.ctx, pool=default, kind=k["kPoolDestroy"])
    s.call("MemPool", ctx=s.ctx, pool=p, kind=k["kPoolDestroy"])
    s.call("MemPool", ok=False, ctx=s.ctx, pool=p, kind=k["kPoolTrim"])
    s.call("MemPool", ok=False, ctx=s.ctx, device=5, kind=k["kPoolSetCurrent"])
    s.call("MemPool", ok=False, ctx=s.ctx, pool=default, kind=42)
    yield s
    s = start("MemAllocAsync")
    st = s.stream(s.ctx)
    p = pool(s)
    s.new("MemAllocAsync", "dptr", ctx=s.ctx, stream=st, bytes=8192)
    s.new("MemAllocAsync", "dptr", ctx=s.ctx, stream=st, pool=p, bytes=4096)
    s.call("MemAllocAsync", ok=False, ctx=s.ctx, stream=st, bytes=0)
    s.call("MemAllocAsync", ok=False, ctx=s.ctx, stream=st, pool=p + 1, bytes=64)
    yield s
    s = start("MemFreeAsync")
    st = s.stream(s.ctx)
    d = s.new("MemAllocAsync", "dptr", ctx=s.ctx, stream=st, bytes=8192)
    s.call("MemFreeAsync", ctx=s.ctx, stream=st, dptr=d)
    s.call("MemFreeAsync", ok=False, ctx=s.ctx, stream=st, dptr=d)
    s.call("MemFreeAsync", ctx=s.ctx, stream=0, dptr=s.alloc(s.ctx))
    yield s
    s = start("MemPoolCreate")
    pool(s)
    pool(s, fd, 1)
    s.call("MemPoolCreate", ok=False, alloc_type=pinned, loc_type=C["CU_MEM_LOCATION_TYPE_HOST"])
    s.call("MemPoolCreate", ok=False, alloc_type=pinned, loc_type=dev, win32_attrs=1)
    s.call("MemPoolCreate", ok=False, alloc_type=99, loc_type=dev)
    yield s
    s = start("MemPoolSetAccess")
    p = pool(s)
    s.call("MemPoolSetAccess", pool=p, count=1, tail=access(1))
    s.call("MemPoolSetAccess", pool=p, count=2, tail=access(0) + access(1))
    s.call("MemPoolSetAccess", ok=False, pool=p, count=1, tail=access(0, C["CU_MEM_ACCESS_FLAGS_PROT_READ"]))
    s.call("MemPoolSetAccess", ok=False, pool=p, count=1, tail=access(0, 77))
    s.call("MemPoolSetAccess", ok=False, pool=p, count=3, tail=access(0))
    yield s
    # Export a pool and a pointer of it, import both as a sibling process (proc 2) of the same worker.
    for last in ("MemPoolExport", "MemPoolImport", "MemPoolExportPtr", "MemPoolImportPtr", "MemPoolPtrFree"):
        s = start(last)
        st = s.stream(s.ctx)
        p = pool(s, fd)
        tok = s.new("MemPoolExport", "token", pool=p, handle_type=fd, proc=1)
        if last == "MemPoolExport":
            s.call("MemPoolExport", pool=p, handle_type=fd, proc=1)
            s.call("MemPoolExport", ok=False, pool=pool(s), handle_type=fd, proc=1)
            s.call("MemPoolExport", ok=False, pool=p, handle_type=C["CU_MEM_HANDLE_TYPE_WIN32"], proc=1)
            s.call("MemPoolExport", ok=False, pool=p + 1, handle_type=fd, proc=1)
            yield s
            continue
        imp = s.new("MemPoolImport", token=Words(tok, Ref(tok.op, tok.word + 1, tok.index)), handle_type=fd,
                    proc=2)
        if last == "MemPoolImport":
            s.call("MemPoolImport", token=Words(tok, Ref(tok.op, tok.word + 1, tok.index)), handle_type=fd, proc=1)
            s.call("MemPoolImport", ok=False, handle_type=fd, proc=2)  # no such token
            s.call("MemPoolImport", ok=False, handle_type=fd, proc=2, no_token=1)
            s.call("MemPoolImport", ok=False, handle_type=0, proc=2)
            yield s
            continue
        d = s.new("MemAllocAsync", "dptr", ctx=s.ctx, stream=st, pool=p, bytes=4096)
        data = s.new("MemPoolExportPtr", "bytes", ctx=s.ctx, dptr=d, proc=1)
        if last == "MemPoolExportPtr":
            s.call("MemPoolExportPtr", ctx=s.ctx, dptr=d, proc=1)
            s.call("MemPoolExportPtr", ok=False, ctx=s.ctx, dptr=s.alloc(s.ctx) + 65536, proc=1)
            yield s
            continue
        words = Words(*(Ref(data.op, w, data.index) for w in range(8)))
        got = s.new("MemPoolImportPtr", "base", ctx=s.ctx, pool=imp, proc=2, data=words)
        # The exporting process importing its own pool: the driver's import, not an alias.
        own = s.new("MemPoolImport", token=Words(tok, Ref(tok.op, tok.word + 1, tok.index)), handle_type=fd, proc=1)
        got_own = s.new("MemPoolImportPtr", "base", ctx=s.ctx, pool=own, proc=1, data=words)
        if last == "MemPoolPtrFree":
            s.call("MemPoolPtrFree", ctx=s.ctx, stream=st, dptr=got_own, proc=1, **{"async": 1})
        if last == "MemPoolImportPtr":
            s.call("MemPoolImportPtr", ctx=s.ctx, pool=own, proc=3, data=words)
            s.call("MemPoolImportPtr", ok=False, ctx=s.ctx, pool=p, proc=2, data=words)   # not an imported pool
            s.call("MemPoolImportPtr", ok=False, ctx=s.ctx, pool=imp, proc=1, data=words)  # the exporter
            s.call("MemPoolImportPtr", ok=False, ctx=s.ctx, pool=imp, proc=2, data=Words(1, 2, 3))
            yield s
            continue
        s.call("MemPoolPtrFree", ctx=s.ctx, dptr=got, proc=2)
        s.call("MemPoolPtrFree", ok=False, ctx=s.ctx, dptr=got, proc=2)
        s.call("MemPoolPtrFree", ok=False, ctx=s.ctx, stream=st, dptr=d + 8, proc=2, **{"async": 1})
        yield s


# ----------------------------------------------------------------- capture and graphs

NODE = {n: C["CU_GRAPH_NODE_TYPE_" + n] for n in ("KERNEL", "MEMCPY", "MEMSET", "HOST", "GRAPH", "EMPTY",
                                                      "WAIT_EVENT", "EVENT_RECORD", "MEM_ALLOC", "MEM_FREE",
                                                      "CONDITIONAL")}


def copy_end(addr, kind="DEVICE"):
    return dict(type=C["CU_MEMORYTYPE_" + kind], addr=addr)


class GraphWorld:
    """A graph with one node of each kind the worker forwards."""

    def __init__(self, s, with_exec=True):
        self.s = s
        self.buf = s.alloc(s.ctx)
        self.ev = s.event(s.ctx)
        self.fn = s.function(s.ctx, s.module(s.ctx))
        self.g = s.graph(s.ctx)
        self.child = s.graph(s.ctx)
        self.host_off, _ = s.pinned()
        self.empty = s.node(s.ctx, self.g, type=NODE["EMPTY"])
        self.kernel = s.node(s.ctx, self.g, [self.empty], tail=s.resolve(Words(*fill_params(self.buf))),
                             type=NODE["KERNEL"], handle=self.fn, grid=[1, 1, 1], block=[32, 1, 1], param_bytes=24)
        self.memset = s.node(s.ctx, self.g, [self.kernel], type=NODE["MEMSET"], dst=self.buf, width=16, height=1,
                             value=3, elem_size=4)
        self.memcpy = s.node(s.ctx, self.g, [self.memset], type=NODE["MEMCPY"], src=copy_end(self.buf),
                             dst_copy=copy_end(self.host_off, "HOST"), width_bytes=64, copy_height=1, depth=1)
        self.record = s.node(s.ctx, self.g, type=NODE["EVENT_RECORD"], handle=self.ev)
        self.wait = s.node(s.ctx, self.g, [self.record], type=NODE["WAIT_EVENT"], handle=self.ev)
        self.host = s.node(s.ctx, self.g, type=NODE["HOST"], dst=self.host_off + 64)
        s.node(s.ctx, self.child, type=NODE["EMPTY"])
        self.child_node = s.node(s.ctx, self.g, type=NODE["GRAPH"], handle=self.child)
        if with_exec:
            self.exec = s.new("GraphInstantiate", ctx=s.ctx, graph=self.g)


def graph_seeds():
    k = P.consts
    s = start("StreamBeginCapture")
    st = s.stream(s.ctx)
    buf = s.alloc(s.ctx)
    relaxed = C["CU_STREAM_CAPTURE_MODE_RELAXED"]
    s.call("StreamBeginCapture", ctx=s.ctx, stream=st, mode=relaxed)
    s.call("Memset", ctx=s.ctx, stream=st, dptr=buf, width=64, height=1, elem_size=1, flags=k["kAsync"])
    s.call("StreamCaptureInfo", ctx=s.ctx, handle=st)
    s.call("MemcpyHtoDArena", ok=False, ctx=s.ctx, stream=st, dst=buf, bytes=64, arena_off=ARENA_OFF,
           flags=k["kAsync"])  # staging cannot be captured; it ends the capture
    s.call("StreamEndCapture", ok=False, ctx=s.ctx, handle=st)
    s.call("StreamBeginCapture", ctx=s.ctx, stream=st, mode=C["CU_STREAM_CAPTURE_MODE_GLOBAL"])
    s.call("StreamBeginCapture", ok=False, ctx=s.ctx, stream=st, mode=relaxed)
    s.call("StreamEndCapture", ctx=s.ctx, handle=st)
    s.call("StreamBeginCapture", ok=False, ctx=s.ctx, stream=st, mode=9)
    s.call("StreamBeginCapture", ok=False, ctx=s.ctx, stream=0, mode=relaxed)
    yield s
    s = start("StreamEndCapture")
    st = s.stream(s.ctx)
    buf = s.alloc(s.ctx)
    fn = s.function(s.ctx, s.module(s.ctx))
    s.call("StreamBeginCapture", ctx=s.ctx, stream=st, mode=C["CU_STREAM_CAPTURE_MODE_RELAXED"])
    s.call("Launch", **launch_fields(s.ctx, fn, st), tail=fill_params(buf))
    s.call("MemcpyDtoD", ctx=s.ctx, stream=st, dst=buf + 1024, src=buf, bytes=64, flags=k["kAsync"])
    g = s.new("StreamEndCapture", ctx=s.ctx, handle=st)
    s.call("GraphNodeCount", ctx=s.ctx, handle=g)
    e = s.new("GraphInstantiate", ctx=s.ctx, graph=g)
    s.call("GraphLaunch", ctx=s.ctx, exec=e, stream=st)
    s.call("StreamEndCapture", ok=False, ctx=s.ctx, handle=st)
    yield s
    s = start("StreamCaptureInfo")
    st = s.stream(s.ctx)
    s.call("StreamCaptureInfo", ctx=s.ctx, handle=st)
    s.call("StreamBeginCapture", ctx=s.ctx, stream=st, mode=C["CU_STREAM_CAPTURE_MODE_RELAXED"])
    s.call("StreamCaptureInfo", ctx=s.ctx, handle=st)
    s.call("CaptureGraphInfo", ctx=s.ctx, handle=st)
    s.call("StreamCaptureInfo", ok=False, ctx=s.ctx, handle=st + 1)
    yield s
    s = start("CaptureGraphInfo")
    st = s.stream(s.ctx)
    buf = s.alloc(s.ctx)
    s.call("CaptureGraphInfo", ctx=s.ctx, handle=st)
    s.call("StreamBeginCapture", ctx=s.ctx, stream=st, mode=C["CU_STREAM_CAPTURE_MODE_RELAXED"])
    s.call("Memset", ctx=s.ctx, stream=st, dptr=buf, width=64, height=1, elem_size=1, flags=k["kAsync"])
    s.call("CaptureGraphInfo", ctx=s.ctx, handle=st)
    s.call("StreamEndCapture", ctx=s.ctx, handle=st)
    s.call("CaptureGraphInfo", ok=False, ctx=s.ctx, handle=st + 1)
    yield s
    s = start("CaptureToGraph")
    st = s.stream(s.ctx)
    g = s.graph(s.ctx)
    n = s.node(s.ctx, g, type=NODE["EMPTY"])
    s.call("CaptureToGraph", ctx=s.ctx, stream=st, graph=g, mode=C["CU_STREAM_CAPTURE_MODE_RELAXED"], count=1,
           tail=[n, 0])
    s.call("StreamEndCapture", ctx=s.ctx, handle=st)
    s.call("CaptureToGraph", ctx=s.ctx, stream=st, graph=g, mode=C["CU_STREAM_CAPTURE_MODE_THREAD_LOCAL"])
    s.call("StreamEndCapture", ctx=s.ctx, handle=st)
    s.call("CaptureToGraph", ok=False, ctx=s.ctx, stream=st, graph=g + 1, mode=0)
    s.call("CaptureToGraph", ok=False, ctx=s.ctx, stream=st, graph=g, mode=0, count=1, tail=[n + 1, 0])
    s.call("CaptureToGraph", ok=False, ctx=s.ctx, stream=st, graph=g, mode=0, count=2, tail=[n, 0])
    yield s
    s = start("CaptureUpdateDeps")
    st = s.stream(s.ctx)
    g = s.graph(s.ctx)
    n = s.node(s.ctx, g, type=NODE["EMPTY"])
    s.call("CaptureToGraph", ctx=s.ctx, stream=st, graph=g, mode=C["CU_STREAM_CAPTURE_MODE_RELAXED"])
    s.call("CaptureUpdateDeps", ctx=s.ctx, stream=st, count=1, flags=C["CU_STREAM_ADD_CAPTURE_DEPENDENCIES"],
           tail=[n, 0])
    s.call("CaptureUpdateDeps", ctx=s.ctx, stream=st, count=0, flags=C["CU_STREAM_SET_CAPTURE_DEPENDENCIES"])
    s.call("CaptureUpdateDeps", ok=False, ctx=s.ctx, stream=st, count=1, tail=[n + 1, 0])
    s.call("StreamEndCapture", ctx=s.ctx, handle=st)
    yield s
    s = start("CaptureMode")
    for m in ("CU_STREAM_CAPTURE_MODE_GLOBAL", "CU_STREAM_CAPTURE_MODE_THREAD_LOCAL",
              "CU_STREAM_CAPTURE_MODE_RELAXED"):
        s.call("CaptureMode", mode=C[m])
    s.call("CaptureMode", ok=False, mode=3)
    yield s
    s = start("GraphCreate")
    s.graph(s.ctx)
    s.call("GraphCreate", ok=False, ctx=s.ctx, flags=1 << 40)
    s.call("GraphCreate", ok=False, ctx=0)
    yield s
    s = start("GraphNodeCount")
    w = GraphWorld(s, with_exec=False)
    s.call("GraphNodeCount", ctx=s.ctx, handle=w.g)
    s.call("GraphNodeCount", ok=False, ctx=s.ctx, handle=w.g + 1)
    yield s
    s = start("GraphInstantiate")
    w = GraphWorld(s)
    s.call("GraphInstantiate", ctx=0, graph=w.g, flags=C["CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH"])
    s.call("GraphInstantiate", ok=False, ctx=s.ctx, graph=w.g + 1)
    yield s
    for op in ("GraphLaunch", "GraphUpload"):
        s = start(op)
        w = GraphWorld(s)
        st = s.stream(s.ctx)
        s.call(op, ctx=s.ctx, exec=w.exec, stream=st)
        s.call(op, ctx=s.ctx, exec=w.exec, stream=0)
        s.call(op, ok=False, ctx=s.ctx, exec=w.exec + 1, stream=st)
        s.call("StreamSynchronize", ctx=s.ctx, handle=st)
        yield s
    s = start("GraphExecDestroy")
    w = GraphWorld(s)
    s.call("GraphExecDestroy", ctx=s.ctx, handle=w.exec)
    s.call("GraphExecDestroy", ok=False, ctx=s.ctx, handle=w.exec)
    yield s
    s = start("GraphDestroy")
    w = GraphWorld(s, with_exec=False)
    s.call("GraphQuery", ctx=s.ctx, handle=w.child_node, kind=k["kQueryChildGraph"])
    s.call("GraphDestroy", ok=False, ctx=s.ctx, handle=Ref("GraphQuery", 0, s.ok["GraphQuery"] - 1))  # the node's
    s.call("GraphDestroy", ctx=s.ctx, handle=w.g)
    s.call("GraphDestroy", ok=False, ctx=s.ctx, handle=w.g)
    yield s
    yield from add_node_seeds()
    yield from node_params_seeds()
    yield from graph_query_seeds()
    s = start("GraphEdges")
    g = s.graph(s.ctx)
    a = s.node(s.ctx, g, type=NODE["EMPTY"])
    b = s.node(s.ctx, g, type=NODE["EMPTY"])
    c = s.node(s.ctx, g, type=NODE["EMPTY"])
    s.call("GraphEdges", ctx=s.ctx, graph=g, count=2, tail=[a, a, b, c, 0, 0])
    s.call("GraphEdges", ctx=s.ctx, graph=g, count=1, remove=1, tail=[a, c, 0])
    s.call("GraphEdges", ctx=s.ctx, graph=g, count=0)
    s.call("GraphEdges", ok=False, ctx=s.ctx, graph=g, count=1, tail=[a, c + 1, 0])
    s.call("GraphEdges", ok=False, ctx=s.ctx, graph=g, count=2, tail=[a, b, 0])
    s.call("GraphEdges", ctx=s.ctx, graph=g, count=1, tail=[b, a, 0])  # a cycle: instantiation refuses it
    s.call("GraphInstantiate", ok=False, ctx=s.ctx, graph=g)
    yield s
    s = start("UserObject")
    g = s.graph(s.ctx)
    off, _ = s.pinned()
    nosync = C["CU_USER_OBJECT_NO_DESTRUCTOR_SYNC"]
    u = s.new("UserObject", ctx=s.ctx, off=off, count=2, flags=nosync, kind=k["kUserObjCreate"])
    s.call("UserObject", ctx=s.ctx, object=u, count=1, kind=k["kUserObjRetain"])
    s.call("UserObject", ctx=s.ctx, object=u, graph=g, count=1, kind=k["kUserObjGraphRetain"])
    s.call("UserObject", ctx=s.ctx, object=u, graph=g, count=1, flags=C["CU_GRAPH_USER_OBJECT_MOVE"],
           kind=k["kUserObjGraphRetain"])
    s.call("UserObject", ctx=s.ctx, object=u, graph=g, count=1, kind=k["kUserObjGraphRelease"])
    s.call("UserObject", ctx=s.ctx, object=u, count=1, kind=k["kUserObjRelease"])
    s.call("UserObject", ok=False, ctx=s.ctx, object=u, count=5, kind=k["kUserObjRelease"])
    s.call("UserObject", ok=False, ctx=s.ctx, off=off + 1, count=1, flags=nosync, kind=k["kUserObjCreate"])
    s.call("UserObject", ok=False, ctx=s.ctx, off=off, count=1, flags=0, kind=k["kUserObjCreate"])
    s.call("UserObject", ok=False, ctx=s.ctx, object=u + 1, count=1, kind=k["kUserObjRetain"])
    s.call("UserObject", ok=False, ctx=s.ctx, object=u, count=1, kind=9)
    s.call("GraphDestroy", ctx=s.ctx, handle=g)
    yield s
    s = start("GraphKernelAttr")
    w = GraphWorld(s, with_exec=False)
    k2 = s.node(s.ctx, w.g, tail=s.resolve(Words(*fill_params(w.buf))), type=NODE["KERNEL"], handle=w.fn,
                grid=[1, 1, 1], block=[32, 1, 1], param_bytes=24)
    prio = P.pack("LaunchAttr", id=C["CU_LAUNCH_ATTRIBUTE_PRIORITY"], value=[1])
    get, set_, copy = (k[n] for n in ("kKernelAttrGet", "kKernelAttrSet", "kKernelAttrCopy"))
    s.call("GraphKernelAttr", ctx=s.ctx, node=w.kernel, kind=set_, attr=prio)
    s.call("GraphKernelAttr", ctx=s.ctx, node=w.kernel, kind=get, attr=prio)
    s.call("GraphKernelAttr", ctx=s.ctx, node=w.kernel, kind=set_,
           attr=P.pack("LaunchAttr", id=C["CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION"], value=[1, 1, 1]))
    s.call("GraphKernelAttr", ctx=s.ctx, node=k2, src=w.kernel, kind=copy)
    s.call("GraphKernelAttr", ok=False, ctx=s.ctx, node=k2, src=k2 + 1, kind=copy)
    s.call("GraphKernelAttr", ok=False, ctx=s.ctx, node=w.kernel, kind=get,
           attr=P.pack("LaunchAttr", id=C["CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW"]))
    s.call("GraphKernelAttr", ok=False, ctx=s.ctx, node=w.kernel, kind=5, attr=prio)
    s.call("GraphKernelAttr", ok=False, ctx=s.ctx, node=w.empty, kind=get, attr=prio)
    yield s


def add_node_seeds():
    s = start("GraphAddNode")
    GraphWorld(s, with_exec=False)
    yield s
    # The nodes that bring memory or graphs of their own.
    s = start("GraphAddNode-mem")
    g = s.graph(s.ctx)
    mem = P.pack("MemAllocNode", prop=prop(0))
    a = s.node(s.ctx, g, tail=mem, type=NODE["MEM_ALLOC"], width=65536)
    dptr = Ref("GraphAddNode", 1, a.index)
    s.node(s.ctx, g, [a], type=NODE["MEMSET"], dst=dptr, width=64, height=1, value=1, elem_size=1)
    s.node(s.ctx, g, [a], type=NODE["MEM_FREE"], dst=dptr)
    s.node(s.ctx, g, tail=P.pack("MemAllocNode", prop=prop(1), access_count=1) + access(0), type=NODE["MEM_ALLOC"],
           width=4096)
    s.call("GraphAddNode", ok=False, ctx=s.ctx, graph=g, ndeps=0,
           tail=[P.pack("GraphNodeParams", type=NODE["MEM_FREE"], dst=8)])
    s.call("GraphAddNode", ok=False, ctx=s.ctx, graph=g, ndeps=0,
           tail=[P.pack("GraphNodeParams", type=NODE["MEM_ALLOC"], width=64)])
    s.call("GraphAddNode", ok=False, ctx=s.ctx, graph=g, ndeps=0,
           tail=[P.pack("GraphNodeParams", type=NODE["MEM_ALLOC"], width=64) + P.pack("MemAllocNode", access_count=65)])
    e = s.new("GraphInstantiate", ctx=s.ctx, graph=g)
    s.call("GraphLaunch", ctx=s.ctx, exec=e)
    s.call("CtxSynchronize", ctx=s.ctx)
    yield s
    s = start("GraphAddNode-conditional")
    g = s.graph(s.ctx)
    s.call("GraphQuery", ctx=s.ctx, handle=g, capacity=1, flags=C["CU_GRAPH_COND_ASSIGN_DEFAULT"],
           kind=P.consts["kQueryCondHandle"])
    cond = Ref("GraphQuery", 0, s.ok["GraphQuery"] - 1)
    c = s.node(s.ctx, g, type=NODE["CONDITIONAL"], handle=cond, value=C["CU_GRAPH_COND_TYPE_IF"], elem_size=1)
    body = Ref("GraphAddNode", 1, c.index)
    s.node(s.ctx, body, type=NODE["EMPTY"])
    s.node(s.ctx, g, type=NODE["CONDITIONAL"], handle=cond, value=C["CU_GRAPH_COND_TYPE_SWITCH"], elem_size=2)
    s.call("GraphAddNode", ok=False, ctx=s.ctx, graph=g, ndeps=0,
           tail=[P.pack("GraphNodeParams", type=NODE["CONDITIONAL"], handle=0, value=0, elem_size=65)])
    s.call("GraphAddNode", ok=False, ctx=s.ctx, graph=g, ndeps=0,
           tail=[P.pack("GraphNodeParams", type=NODE["CONDITIONAL"], value=77, elem_size=1)])
    s.call("GraphDestroy", ok=False, ctx=s.ctx, handle=body)
    e = s.new("GraphInstantiate", ctx=s.ctx, graph=g)
    s.call("GraphLaunch", ctx=s.ctx, exec=e)
    yield s
    s = start("GraphAddNode-refused")
    w = GraphWorld(s, with_exec=False)
    bad = [
        dict(type=NODE["KERNEL"], handle=w.fn, param_bytes=16),
        dict(type=NODE["KERNEL"], handle=w.fn + 1, param_bytes=24),
        dict(type=NODE["MEMSET"], dst=w.buf, width=1 << 20, height=1, elem_size=4),
        dict(type=NODE["MEMSET"], dst=w.buf, width=16, height=2, pitch=8, elem_size=4),
        dict(type=NODE["MEMSET"], dst=w.buf, width=16, height=1, elem_size=8),
        dict(type=NODE["MEMCPY"], src=copy_end(w.buf), dst_copy=copy_end(8), width_bytes=64, copy_height=1, depth=1),
        dict(type=NODE["MEMCPY"], src=copy_end(1 << 30, "HOST"), dst_copy=copy_end(w.buf), width_bytes=64,
             copy_height=1, depth=1),
        dict(type=NODE["MEMCPY"], src=copy_end(w.buf), dst_copy=copy_end(w.buf), width_bytes=64, copy_height=2,
             depth=1),
        dict(type=NODE["HOST"], dst=w.host_off + 2),
        dict(type=NODE["GRAPH"], handle=w.g + 1),
        dict(type=NODE["EVENT_RECORD"], handle=w.ev + 1),
        dict(type=C["CU_GRAPH_NODE_TYPE_BATCH_MEM_OP"]),
    ]
    for p in bad:
        tail = [P.pack("GraphNodeParams", **s.resolve(p))]
        if p.get("param_bytes") == 16:
            tail.append(bytes(16))
        elif p.get("param_bytes") == 24:
            tail.append(bytes(24))
        s.call("GraphAddNode", ok=False, ctx=s.ctx, graph=w.g, ndeps=0, tail=tail)
    s.call("GraphAddNode", ok=False, ctx=s.ctx, graph=w.g, ndeps=1,
           tail=[w.empty + 1, P.pack("GraphNodeParams", type=NODE["EMPTY"])])
    s.call("GraphAddNode", ok=False, ctx=s.ctx, graph=w.g, ndeps=3, tail=[w.empty])
    s.call("GraphAddNode", ok=False, ctx=s.ctx, graph=w.g + 1, ndeps=0, tail=[P.pack("GraphNodeParams")])
    yield s


def node_params_seeds():
    k = P.consts
    s = start("GraphNodeParams")
    w = GraphWorld(s)
    for n in (w.empty, w.kernel, w.memset, w.memcpy, w.record, w.wait, w.host, w.child_node):
        s.call("GraphNodeParams", ctx=s.ctx, node=n, kind=k["kNodeParamsGet"])
    s.call("GraphNodeParams", ok=False, ctx=s.ctx, node=w.kernel + 1, kind=k["kNodeParamsGet"])
    yield s
    s = start("GraphNodeParams-set")
    w = GraphWorld(s)
    ev2 = s.event(s.ctx)
    child2 = s.graph(s.ctx)
    s.node(s.ctx, child2, type=NODE["EMPTY"])  # the same shape as the node's own child
    sets = [
        (w.kernel, dict(type=NODE["KERNEL"], handle=w.fn, grid=[2, 1, 1], block=[32, 1, 1], param_bytes=24),
         fill_params(w.buf, 1, 8)),
        (w.memset, dict(type=NODE["MEMSET"], dst=w.buf, width=8, height=1, value=9, elem_size=2), []),
        (w.memcpy, dict(type=NODE["MEMCPY"], src=copy_end(w.host_off, "HOST"), dst_copy=copy_end(w.buf),
                        width_bytes=32, copy_height=1, depth=1), []),
        (w.record, dict(type=NODE["EVENT_RECORD"], handle=ev2), []),
        (w.wait, dict(type=NODE["WAIT_EVENT"], handle=ev2), []),
        (w.host, dict(type=NODE["HOST"], dst=w.host_off + 128), []),
    ]
    for node, params, packed in sets:
        for kind in ("kNodeParamsSet", "kNodeParamsExecSet"):
            s.call("GraphNodeParams", ctx=s.ctx, node=node, exec=w.exec, kind=k[kind],
                   tail=[P.pack("GraphNodeParams", **s.resolve(params)), *packed])
    s.call("GraphNodeParams", ctx=s.ctx, node=w.child_node, exec=w.exec, kind=k["kNodeParamsExecSet"],
           tail=[P.pack("GraphNodeParams", **s.resolve(dict(type=NODE["GRAPH"], handle=child2)))])
    s.call("GraphNodeParams", ok=False, ctx=s.ctx, node=w.child_node, kind=k["kNodeParamsSet"],
           tail=[P.pack("GraphNodeParams", **s.resolve(dict(type=NODE["GRAPH"], handle=child2)))])
    s.call("GraphNodeParams", ok=False, ctx=s.ctx, node=w.memset, kind=k["kNodeParamsSet"],
           tail=[P.pack("GraphNodeParams", type=NODE["EMPTY"])])
    s.call("GraphNodeParams", ok=False, ctx=s.ctx, node=w.memset, exec=w.exec + 1, kind=k["kNodeParamsExecSet"],
           tail=[P.pack("GraphNodeParams", type=NODE["MEMSET"])])
    s.call("GraphNodeParams", ok=False, ctx=s.ctx, node=w.memset, kind=k["kNodeParamsSet"], tail=[bytes(8)])
    s.call("GraphNodeParams", ok=False, ctx=s.ctx, node=w.memset, kind=7)
    yield s


def graph_query_seeds():
    k = P.consts
    arrays, data = k["kQueryArrays"], k["kQueryEdgeData"]
    s = start("GraphQuery")
    w = GraphWorld(s)
    for kind, flags, cap in (("kQueryNodes", 0, 0), ("kQueryNodes", arrays, 16), ("kQueryNodes", arrays, 2),
                             ("kQueryRoots", arrays, 8), ("kQueryEdges", 0, 0),
                             ("kQueryEdges", arrays | data, 8), ("kQueryEdges", arrays, 0)):
        s.call("GraphQuery", ctx=s.ctx, handle=w.g, flags=flags, capacity=cap, kind=k[kind])
    for kind in ("kQueryDeps", "kQueryDependents"):
        s.call("GraphQuery", ctx=s.ctx, handle=w.kernel, flags=arrays | data, capacity=4, kind=k[kind])
    s.call("GraphQuery", ctx=s.ctx, handle=w.memcpy, kind=k["kQueryType"])
    s.call("GraphQuery", ctx=s.ctx, handle=w.child_node, kind=k["kQueryChildGraph"])
    s.call("GraphQuery", ctx=s.ctx, handle=w.g, kind=k["kQueryClone"])
    clone = Ref("GraphQuery", 0, s.ok["GraphQuery"] - 1)
    s.call("GraphQuery", ctx=s.ctx, handle=w.kernel, other=clone, kind=k["kQueryFindInClone"])
    s.call("GraphQuery", ctx=s.ctx, handle=w.exec, kind=k["kQueryExecFlags"])
    s.call("GraphQuery", ctx=s.ctx, handle=w.exec, other=clone, kind=k["kQueryExecUpdate"])
    s.call("GraphQuery", ctx=s.ctx, handle=w.exec, other=w.memset, kind=k["kQueryGetEnabled"])
    s.call("GraphQuery", ctx=s.ctx, handle=w.exec, other=w.memset, capacity=0, kind=k["kQuerySetEnabled"])
    s.call("GraphQuery", ctx=s.ctx, handle=w.g, flags=C["CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE"], kind=k["kQueryDot"])
    s.call("GraphQuery", ctx=s.ctx, handle=w.g, capacity=0, flags=0, kind=k["kQueryCondHandle"])
    s.call("GraphQuery", ctx=s.ctx, handle=0, other=C["CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT"], kind=k["kQueryGraphMem"])
    s.call("GraphQuery", ctx=s.ctx, handle=1, other=C["CU_GRAPH_MEM_ATTR_USED_MEM_HIGH"], flags=1,
           kind=k["kQueryGraphMem"])
    s.call("GraphQuery", ctx=s.ctx, handle=0, flags=2, kind=k["kQueryGraphMem"])
    s.call("GraphQuery", ctx=s.ctx, handle=w.wait, kind=k["kQueryDestroyNode"])
    yield s
    s = start("GraphQuery-refused")
    w = GraphWorld(s)
    bad = [("kQueryNodes", w.g + 1, 0, 0, 0), ("kQueryNodes", w.g, 0, 1 << 17, arrays),
           ("kQueryDeps", w.kernel + 1, 0, 0, 0), ("kQueryType", w.g, 0, 0, 0), ("kQueryDestroyNode", 5, 0, 0, 0),
           ("kQueryClone", w.kernel, 0, 0, 0), ("kQueryFindInClone", w.kernel, w.g + 1, 0, 0),
           ("kQueryExecFlags", w.g, 0, 0, 0), ("kQueryExecUpdate", w.exec, 7, 0, 0),
           ("kQuerySetEnabled", w.exec, w.memset, 2, 0), ("kQueryGetEnabled", w.exec, 9, 0, 0),
           ("kQueryGraphMem", 3, 0, 0, 0), ("kQueryGraphMem", 0, 99, 0, 0), ("kQueryGraphMem", 0, 0, 0, 5),
           ("kQueryDot", w.g + 1, 0, 0, 0), ("kQueryCondHandle", w.g, 0, 1 << 33, 0),
           ("kQueryChildGraph", w.kernel, 0, 0, 0)]
    for kind, h, other, cap, flags in bad:
        s.call("GraphQuery", ok=False, ctx=s.ctx, handle=h, other=other, capacity=cap, flags=flags, kind=k[kind])
    s.call("GraphQuery", ok=False, ctx=s.ctx, handle=w.g, kind=99)
    yield s


# ----------------------------------------------------------------- virtual memory

def vmm_seeds():
    fd = C["CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"]
    s = start("MemGranularity")
    s.call("MemGranularity", prop=prop(0), option=C["CU_MEM_ALLOC_GRANULARITY_MINIMUM"])
    s.call("MemGranularity", prop=prop(1, fd), option=C["CU_MEM_ALLOC_GRANULARITY_RECOMMENDED"])
    s.call("MemGranularity", ok=False, prop=dict(prop(3)), option=0)
    s.call("MemGranularity", ok=False, prop=dict(prop(0), loc_type=77), option=0)
    s.call("MemGranularity", ok=False, prop=prop(0), option=2)  # no CUmemAllocationGranularity_flags
    yield s
    s = start("MemAddressReserve")
    s.new("MemAddressReserve", "base", size=MIB2)
    s.new("MemAddressReserve", "base", size=2 * MIB2, alignment=MIB2)
    s.call("MemAddressReserve", ok=False, size=0)
    yield s
    s = start("MemAddressFree")
    h, base = s.vmm()
    spare = s.new("MemAddressReserve", "base", size=MIB2)
    s.call("MemAddressFree", ptr=spare, size=MIB2)
    s.call("MemAddressFree", ok=False, ptr=spare, size=MIB2)
    s.call("MemAddressFree", ok=False, ptr=base, size=MIB2)  # still mapped
    s.call("MemAddressFree", ok=False, ptr=base, size=4096)
    yield s
    s = start("MemCreate")
    s.new("MemCreate", prop=prop(0), size=MIB2)
    s.new("MemCreate", prop=prop(1, fd), size=MIB2)
    s.call("MemCreate", ok=False, prop=prop(0), size=4096)  # not a granule
    s.call("MemCreate", ok=False, prop=dict(prop(0), type=9), size=MIB2)
    yield s
    s = start("MemRelease")
    h = s.new("MemCreate", prop=prop(0), size=MIB2)
    s.call("MemRelease", handle=h)
    s.call("MemRelease", ok=False, handle=h)
    h2, base = s.vmm()
    s.call("MemRelease", handle=h2)                 # released while mapped: lives on
    s.call("MemUnmap", ptr=base, size=MIB2)
    yield s
    s = start("MemMap")
    h = s.new("MemCreate", prop=prop(0), size=MIB2)
    base = s.new("MemAddressReserve", "base", size=2 * MIB2)
    s.call("MemMap", ptr=base, size=MIB2, handle=h)
    s.call("MemMap", ok=False, ptr=base, size=MIB2, handle=h)              # overlaps
    s.call("MemMap", ptr=base + MIB2, size=MIB2, handle=h)                 # aliases the same memory
    s.call("MemMap", ok=False, ptr=base, size=0, handle=h)
    s.call("MemMap", ok=False, ptr=base, size=MIB2, handle=h + 1)
    s.call("MemMap", ok=False, ptr=base + 4096, size=4 * MIB2, handle=h)
    s.call("MemMap", ok=False, ptr=8, size=MIB2, handle=h)
    yield s
    s = start("MemUnmap")
    h, base = s.vmm()
    s.call("MemUnmap", ok=False, ptr=base + 4096, size=4096)
    s.call("MemUnmap", ptr=base, size=MIB2)
    s.call("MemUnmap", ok=False, ptr=base, size=MIB2)
    s.call("MemUnmap", ok=False, ptr=base, size=0)
    yield s
    s = start("MemSetAccess")
    h, base = s.vmm()
    s.call("MemSetAccess", ptr=base, size=MIB2, count=2, tail=access(0) + access(1, C["CU_MEM_ACCESS_FLAGS_PROT_READ"]))
    s.call("MemSetAccess", ok=False, ptr=base, size=MIB2, count=0)
    s.call("MemSetAccess", ok=False, ptr=base, size=2 * MIB2, count=1, tail=access(0))
    s.call("MemSetAccess", ok=False, ptr=base, size=MIB2, count=1, tail=access(5))
    s.call("MemSetAccess", ok=False, ptr=base, size=MIB2, count=1, tail=access(0, 99))
    buf = base + 64
    s.call("Memset", ctx=s.ctx, dptr=buf, width=64, height=1, value=1, elem_size=4)
    yield s
    s = start("MemGetAccess")
    h, base = s.vmm()
    s.call("MemGetAccess", ptr=base, loc_type=C["CU_MEM_LOCATION_TYPE_DEVICE"], loc_id=0)
    s.call("MemGetAccess", ptr=base + 4096, loc_type=C["CU_MEM_LOCATION_TYPE_DEVICE"], loc_id=1)
    s.call("MemGetAccess", ok=False, ptr=8, loc_type=C["CU_MEM_LOCATION_TYPE_DEVICE"], loc_id=0)
    s.call("MemGetAccess", ok=False, ptr=base, loc_type=C["CU_MEM_LOCATION_TYPE_DEVICE"], loc_id=4)
    yield s
    s = start("MemGetProperties")
    h = s.new("MemCreate", prop=prop(1, fd), size=MIB2)
    s.call("MemGetProperties", handle=h)
    s.call("MemGetProperties", ok=False, handle=h + 1)
    yield s
    s = start("MemRetainHandle")
    h, base = s.vmm()
    r = s.new("MemRetainHandle", ctx=s.ctx, dptr=base + 4096)
    s.call("MemRelease", handle=r)
    s.call("MemRetainHandle", ok=False, ctx=s.ctx, dptr=8)
    s.call("MemRetainHandle", ok=False, ctx=s.ctx, dptr=base + MIB2)
    yield s
    for last in ("MemExportShareable", "MemImportShareable"):
        s = start(last)
        h = s.new("MemCreate", prop=prop(0, fd), size=MIB2)
        tok = s.new("MemExportShareable", "token", handle=h, handle_type=fd)
        token = Words(tok, Ref(tok.op, tok.word + 1, tok.index))
        if last == "MemExportShareable":
            s.call("MemExportShareable", handle=h, handle_type=fd)
            s.call("MemExportShareable", ok=False, handle=h, handle_type=C["CU_MEM_HANDLE_TYPE_WIN32"])
            s.call("MemExportShareable", ok=False, handle=s.new("MemCreate", prop=prop(0), size=MIB2),
                   handle_type=fd)
            s.call("MemExportShareable", ok=False, handle=h + 1, handle_type=fd)
        else:
            imp = s.new("MemImportShareable", token=token, handle_type=fd)
            base = s.new("MemAddressReserve", "base", size=MIB2)
            s.call("MemMap", ptr=base, size=MIB2, handle=imp)
            s.call("MemImportShareable", ok=False, handle_type=fd)
            s.call("MemImportShareable", ok=False, token=token, handle_type=0)
        yield s


# ----------------------------------------------------------------- arrays and textures

def arrays_seeds():
    k = P.consts
    fl = C["CU_AD_FORMAT_FLOAT"]

    def array(s, w=64, h=64, d=0, flags=0, kind="kArrayCreate2D", levels=0, fmt=fl, ch=1):
        return s.new("ArrayCreate", ctx=s.ctx, desc=dict(width=w, height=h, depth=d, format=fmt, channels=ch,
                                                          flags=flags), kind=k[kind], levels=levels)
    s = start("ArrayCreate")
    array(s)
    array(s, 32, 32, 4, kind="kArrayCreate3D")
    array(s, 64, 64, 0, kind="kArrayCreateMipmap", levels=4)
    array(s, 256, 256, 0, C["CUDA_ARRAY3D_SPARSE"], kind="kArrayCreate3D")
    array(s, 16, 16, 0, C["CUDA_ARRAY3D_SURFACE_LDST"], kind="kArrayCreate3D", fmt=C["CU_AD_FORMAT_UNSIGNED_INT8"],
          ch=4)
    s.call("ArrayCreate", ok=False, ctx=s.ctx, desc=dict(width=4, height=4, format=0x7FFFFFFF + 1, channels=1))
    s.call("ArrayCreate", ok=False, ctx=s.ctx, desc=dict(width=4, height=4, format=fl, channels=1), kind=7)
    s.call("ArrayCreate", ok=False, ctx=s.ctx, desc=dict(width=1 << 40, height=1 << 40, format=fl, channels=4),
           kind=k["kArrayCreateMipmap"], levels=1 << 31)
    yield s
    s = start("ArrayDestroy")
    a = array(s)
    m = array(s, kind="kArrayCreateMipmap", levels=2)
    s.new("MipmapLevel", ctx=s.ctx, mipmap=m, level=1)
    s.call("ArrayDestroy", ok=False, ctx=s.ctx, array=Ref("MipmapLevel", 0, 0), kind=k["kDestroyArray"])
    s.call("ArrayDestroy", ctx=s.ctx, array=a, kind=k["kDestroyArray"])
    s.call("ArrayDestroy", ok=False, ctx=s.ctx, array=a, kind=k["kDestroyArray"])
    s.call("ArrayDestroy", ok=False, ctx=s.ctx, array=a, kind=k["kDestroyMipmap"])
    s.call("ArrayDestroy", ctx=s.ctx, array=m, kind=k["kDestroyMipmap"])
    yield s
    s = start("ArrayQuery")
    a = array(s)
    a3 = array(s, 32, 32, 4, kind="kArrayCreate3D")
    sparse = array(s, 256, 256, 0, C["CUDA_ARRAY3D_SPARSE"], kind="kArrayCreate3D")
    deferred = array(s, 64, 64, 0, C["CUDA_ARRAY3D_DEFERRED_MAPPING"], kind="kArrayCreate3D")
    m = array(s, 256, 256, 0, C["CUDA_ARRAY3D_SPARSE"], kind="kArrayCreateMipmap", levels=3)
    md = array(s, 64, 64, 0, C["CUDA_ARRAY3D_DEFERRED_MAPPING"], kind="kArrayCreateMipmap", levels=2)
    s.call("ArrayQuery", ctx=s.ctx, array=a, kind=k["kArrayQuery2D"])
    s.call("ArrayQuery", ctx=s.ctx, array=a3, kind=k["kArrayQuery3D"])
    s.call("ArrayQuery", ctx=s.ctx, array=deferred, kind=k["kArrayQueryMemReq"], device=0)
    s.call("ArrayQuery", ctx=s.ctx, array=sparse, kind=k["kArrayQuerySparse"])
    s.call("ArrayQuery", ctx=s.ctx, array=md, kind=k["kArrayQueryMipmapMemReq"], device=0)
    s.call("ArrayQuery", ctx=s.ctx, array=m, kind=k["kArrayQueryMipmapSparse"])
    s.call("ArrayQuery", ok=False, ctx=s.ctx, array=a, kind=k["kArrayQueryMemReq"], device=0)
    s.call("ArrayQuery", ok=False, ctx=s.ctx, array=deferred, kind=k["kArrayQueryMemReq"], device=3)
    s.call("ArrayQuery", ok=False, ctx=s.ctx, array=md, kind=k["kArrayQueryMipmapMemReq"], device=-1)
    s.call("ArrayQuery", ok=False, ctx=s.ctx, array=a + 1, kind=k["kArrayQuery2D"])
    s.call("ArrayQuery", ok=False, ctx=s.ctx, array=a, kind=9)
    yield s
    s = start("MipmapLevel")
    m = array(s, 64, 64, 0, kind="kArrayCreateMipmap", levels=3)
    s.call("MipmapLevel", ctx=s.ctx, mipmap=m, level=0)
    s.call("MipmapLevel", ctx=s.ctx, mipmap=m, level=2)
    s.call("MipmapLevel", ctx=s.ctx, mipmap=m, level=2)  # known already
    s.call("MipmapLevel", ok=False, ctx=s.ctx, mipmap=m, level=3)
    s.call("MipmapLevel", ok=False, ctx=s.ctx, mipmap=m + 1, level=0)
    yield s
    s = start("Memcpy3D")
    a = array(s)
    a3 = array(s, 32, 32, 4, kind="kArrayCreate3D")
    buf = s.alloc(s.ctx, 1 << 20)
    off, _ = s.pinned(65536)
    st = s.stream(s.ctx)
    arr = C["CU_MEMORYTYPE_ARRAY"]
    dev, host = C["CU_MEMORYTYPE_DEVICE"], C["CU_MEMORYTYPE_HOST"]
    s.call("Memcpy3D", ctx=s.ctx, src=dict(type=dev, device=buf, pitch=256, height=64), dst=dict(type=arr, array=a),
           width_bytes=256, height=64, depth=1)
    s.call("Memcpy3D", ctx=s.ctx, src=dict(type=arr, array=a, x_bytes=16, y=4), dst=dict(type=host, arena_off=off,
                                                                                        pitch=128, height=16),
           width_bytes=64, height=8, depth=1, stream=st, flags=P.consts["kAsync"] | P.consts["kWaitStream"])
    s.call("Memcpy3D", ctx=s.ctx, src=dict(type=host, arena_off=off, pitch=128, height=32),
           dst=dict(type=arr, array=a3, z=1), width_bytes=128, height=32, depth=2)
    s.call("Memcpy3D", ctx=s.ctx, src=dict(type=dev, device=buf, pitch=512, height=64),
           dst=dict(type=dev, device=buf + 65536, pitch=512, height=64), width_bytes=256, height=64, depth=3)
    s.call("Memcpy3D", ctx=s.ctx, width_bytes=0, height=1, depth=1)
    for src, dst, wb, h, d in (
            (dict(type=arr, array=a, x_bytes=200), dict(type=dev, device=buf, pitch=256, height=64), 64, 1, 1),
            (dict(type=dev, device=buf, pitch=16, height=64), dict(type=arr, array=a), 64, 2, 1),
            (dict(type=dev, device=buf, pitch=256, height=2), dict(type=arr, array=a3), 64, 4, 2),
            (dict(type=arr, array=a + 1), dict(type=dev, device=buf, pitch=256, height=64), 64, 1, 1),
            (dict(type=host, arena_off=1 << 30, pitch=64, height=1), dict(type=arr, array=a), 64, 1, 1),
            (dict(type=7), dict(type=arr, array=a), 4, 1, 1)):
        s.call("Memcpy3D", ok=False, ctx=s.ctx, src=src, dst=dst, width_bytes=wb, height=h, depth=d)
    yield s
    s = start("TexCreate")
    a = array(s)
    m = array(s, 64, 64, 0, kind="kArrayCreateMipmap", levels=3)
    surf = array(s, 16, 16, 0, C["CUDA_ARRAY3D_SURFACE_LDST"], kind="kArrayCreate3D",
                 fmt=C["CU_AD_FORMAT_UNSIGNED_INT8"], ch=4)
    buf = s.alloc(s.ctx)
    rt = {n: C["CU_RESOURCE_TYPE_" + n] for n in ("ARRAY", "MIPMAPPED_ARRAY", "LINEAR", "PITCH2D")}
    tex = dict(address=[C["CU_TR_ADDRESS_MODE_CLAMP"]] * 3, filter=C["CU_TR_FILTER_MODE_LINEAR"])
    s.call("TexCreate", ctx=s.ctx, res=dict(type=rt["ARRAY"], handle=a), tex=tex)
    s.call("TexCreate", ctx=s.ctx, res=dict(type=rt["MIPMAPPED_ARRAY"], handle=m), tex=tex)
    s.call("TexCreate", ctx=s.ctx, res=dict(type=rt["LINEAR"], format=C["CU_AD_FORMAT_FLOAT"], channels=1, dptr=buf,
                                            size_bytes=4096), tex=tex)
    s.call("TexCreate", ctx=s.ctx, res=dict(type=rt["PITCH2D"], format=C["CU_AD_FORMAT_FLOAT"], channels=1, dptr=buf,
                                            width=64, height=16, pitch=256), tex=tex)
    s.call("TexCreate", ctx=s.ctx, res=dict(type=rt["ARRAY"], handle=a), tex=tex,
           view=dict(format=C["CU_RES_VIEW_FORMAT_FLOAT_1X32"], width=64, height=64), flags=P.consts["kTexHasView"])
    s.call("TexCreate", ctx=s.ctx, res=dict(type=rt["ARRAY"], handle=surf), flags=P.consts["kTexSurface"])
    for res, t in ((dict(type=rt["ARRAY"], handle=a + 1), tex), (dict(type=rt["MIPMAPPED_ARRAY"], handle=a), tex),
                   (dict(type=rt["LINEAR"], format=C["CU_AD_FORMAT_FLOAT"], channels=1, dptr=buf, size_bytes=1 << 20),
                    tex),
                   (dict(type=rt["LINEAR"], format=C["CU_AD_FORMAT_FLOAT"], channels=1, dptr=buf), tex),
                   (dict(type=rt["PITCH2D"], format=C["CU_AD_FORMAT_FLOAT"], channels=1, dptr=buf, width=64,
                         height=16, pitch=16), tex),
                   (dict(type=rt["PITCH2D"], format=0x12345, channels=1, dptr=buf, width=1, height=1, pitch=4), tex),
                   (dict(type=9), tex), (dict(type=rt["ARRAY"], handle=a), dict(address=[99, 0, 0])),
                   (dict(type=rt["ARRAY"], handle=a), dict(filter=5))):
        s.call("TexCreate", ok=False, ctx=s.ctx, res=res, tex=t)
    yield s
    for op in ("TexQuery", "TexDestroy"):
        s = start(op)
        a = array(s)
        surf = array(s, 16, 16, 0, C["CUDA_ARRAY3D_SURFACE_LDST"], kind="kArrayCreate3D",
                     fmt=C["CU_AD_FORMAT_UNSIGNED_INT8"], ch=4)
        buf = s.alloc(s.ctx)
        t1 = s.new("TexCreate", ctx=s.ctx, res=dict(type=C["CU_RESOURCE_TYPE_ARRAY"], handle=a))
        t2 = s.new("TexCreate", ctx=s.ctx, res=dict(type=C["CU_RESOURCE_TYPE_LINEAR"], format=C["CU_AD_FORMAT_FLOAT"],
                                                     channels=1, dptr=buf, size_bytes=4096),
                   view=dict(format=C["CU_RES_VIEW_FORMAT_FLOAT_1X32"], width=1024), flags=0)
        t3 = s.new("TexCreate", ctx=s.ctx, res=dict(type=C["CU_RESOURCE_TYPE_PITCH2D"], format=C["CU_AD_FORMAT_FLOAT"],
                                                     channels=1, dptr=buf, width=16, height=16, pitch=64))
        sf = s.new("TexCreate", ctx=s.ctx, res=dict(type=C["CU_RESOURCE_TYPE_ARRAY"], handle=surf),
                   flags=P.consts["kTexSurface"])
        if op == "TexQuery":
            for t in (t1, t2, t3):
                for q in ("kTexQueryResource", "kTexQueryTexture", "kTexQueryView"):
                    s.call("TexQuery", ctx=s.ctx, object=t, query=P.consts[q])
            s.call("TexQuery", ctx=s.ctx, object=sf, flags=P.consts["kTexSurface"], query=P.consts["kTexQueryResource"])
            s.call("TexQuery", ok=False, ctx=s.ctx, object=sf, flags=P.consts["kTexSurface"],
                   query=P.consts["kTexQueryTexture"])
            s.call("TexQuery", ok=False, ctx=s.ctx, object=sf, query=0)
            s.call("TexQuery", ok=False, ctx=s.ctx, object=0x7EADBEEF, query=0)
        else:
            s.call("TexDestroy", ctx=s.ctx, object=t1)
            s.call("TexDestroy", ctx=s.ctx, object=t1)   # gone: succeeds, as on the driver
            s.call("TexDestroy", ctx=s.ctx, object=sf)   # not a texture: left alone
            s.call("TexDestroy", ctx=s.ctx, object=sf, flags=P.consts["kTexSurface"])
            s.call("ArrayDestroy", ctx=s.ctx, array=a, kind=P.consts["kDestroyArray"])
        yield s
    s = start("MemMapArrays")
    st = s.stream(s.ctx)
    sparse = array(s, 256, 256, 0, C["CUDA_ARRAY3D_SPARSE"], kind="kArrayCreate3D")
    deferred = array(s, 64, 64, 0, C["CUDA_ARRAY3D_DEFERRED_MAPPING"], kind="kArrayCreate3D")
    msparse = array(s, 256, 256, 0, C["CUDA_ARRAY3D_SPARSE"], kind="kArrayCreateMipmap", levels=3)
    tiles = s.new("MemCreate", prop=prop(0, usage=C["CU_MEM_CREATE_USAGE_TILE_POOL"]), size=MIB2)
    MAP, UNMAP = C["CU_MEM_OPERATION_TYPE_MAP"], C["CU_MEM_OPERATION_TYPE_UNMAP"]
    level, tail_ = C["CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL"], C["CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL"]

    def entry(res, mem, op=MAP, rtype="ARRAY", sub=level, x=0, y=0, w=128, h=128, off=0, lvl=0, mask=1):
        sr = struct.pack("<8I", lvl, 0, x, y, 0, w, h, 1) if sub == level else struct.pack("<IIQQQ", 0, 0, 0, 65536,
                                                                                            0)
        return P.pack("ArrayMapEntry", resource=s.resolve(res), mem_handle=s.resolve(mem), offset=off,
                      subresource=sr, resource_type=C["CU_RESOURCE_TYPE_" + rtype], subresource_type=sub, op=op,
                      mem_handle_type=C["CU_MEM_HANDLE_TYPE_GENERIC"], device_mask=mask)
    s.call("MemMapArrays", ctx=s.ctx, stream=st, count=2,
           tail=entry(sparse, tiles) + entry(sparse, tiles, x=128, y=128, off=65536))
    s.call("MemMapArrays", ctx=s.ctx, stream=st, count=1, tail=entry(deferred, tiles, off=4 * 65536))
    s.call("MemMapArrays", ctx=s.ctx, stream=st, count=1, tail=entry(msparse, tiles, rtype="MIPMAPPED_ARRAY",
                                                                      off=8 * 65536))
    s.call("MemMapArrays", ctx=s.ctx, stream=st, count=1,
           tail=entry(msparse, tiles, rtype="MIPMAPPED_ARRAY", sub=tail_, off=10 * 65536))
    s.call("MemMapArrays", ctx=s.ctx, stream=st, count=1, tail=entry(sparse, 0, op=UNMAP))
    # The list in the arena, as the guest sends a long one (no reply words there: a null
    # array, which the driver refuses).
    s.arena(0x9000, entry(0, 0, op=UNMAP))
    s.call("MemMapArrays", ok=False, ctx=s.ctx, stream=st, count=1, arena_off=ARENA_OFF + 0x9000,
           flags=P.consts["kMapListInArena"])
    s.call("MemRelease", handle=tiles)  # arrays still map it: the worker keeps it
    s.call("StreamSynchronize", ctx=s.ctx, handle=st)
    s.call("MemMapArrays", ctx=s.ctx, stream=st, count=0, flags=P.consts["kMapListNull"])
    for e in (entry(sparse + 1, tiles), entry(sparse, 0), entry(sparse, tiles + 1), entry(sparse, tiles, off=1 << 40),
              entry(sparse, tiles, mask=1 << 5), entry(sparse, tiles, rtype="LINEAR"), entry(sparse, tiles, op=9),
              entry(sparse, tiles, sub=7)):
        s.call("MemMapArrays", ok=False, ctx=s.ctx, stream=st, count=1, tail=e)
    s.call("MemMapArrays", ok=False, ctx=s.ctx, stream=st, count=2, tail=entry(sparse, tiles))
    s.call("MemMapArrays", ok=False, ctx=s.ctx, stream=st, count=1, flags=4)
    s.call("MemMapArrays", ok=False, ctx=s.ctx, stream=st, count=1, arena_off=1 << 30,
           flags=P.consts["kMapListInArena"])
    yield s


# ----------------------------------------------------------------- IPC

def ipc_seeds():
    for last in ("IpcGetMemHandle", "IpcOpenMemHandle", "IpcCloseMemHandle"):
        s = start(last)
        buf = s.alloc(s.ctx)
        hnd = s.new("IpcGetMemHandle", "bytes", ctx=s.ctx, object=buf, proc=1)
        handle = Words(*(Ref(hnd.op, w, hnd.index) for w in range(8)))
        if last == "IpcGetMemHandle":
            s.call("IpcGetMemHandle", ctx=s.ctx, object=buf + 64, proc=1)  # the same allocation: the same ticket
            s.call("IpcGetMemHandle", ok=False, ctx=s.ctx, object=0, proc=1)
            s.call("IpcGetMemHandle", ok=False, ctx=s.ctx, object=buf + 65536, proc=1)
            s.call("MemFree", ctx=s.ctx, dptr=buf)
            yield s
            continue
        d = s.new("IpcOpenMemHandle", "base", ctx=s.ctx, flags=C["CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS"], proc=2,
                  handle=handle)
        if last == "IpcOpenMemHandle":
            s.call("IpcOpenMemHandle", ctx=s.ctx, proc=2, handle=handle)             # again
            s.call("IpcOpenMemHandle", ok=False, ctx=s.ctx, proc=1, handle=handle)   # the exporter itself
            s.call("IpcOpenMemHandle", ok=False, ctx=s.ctx, proc=2, handle=Words(hnd, 0, 0, 1))
            s.call("MemFree", ctx=s.ctx, dptr=buf)                                   # the importer keeps it
            s.call("MemcpyDtoD", ctx=s.ctx, dst=d, src=d + 64, bytes=64)
            yield s
            continue
        s.call("IpcCloseMemHandle", ctx=s.ctx, dptr=d, proc=2)
        s.call("IpcCloseMemHandle", ok=False, ctx=s.ctx, dptr=d, proc=2)
        s.call("IpcCloseMemHandle", ok=False, ctx=s.ctx, dptr=buf + 8, proc=3)
        s.call("IpcOpenMemHandle", ctx=s.ctx, proc=2, handle=handle)
        s.call("MemFree", ctx=s.ctx, dptr=buf)
        s.call("IpcCloseMemHandle", ctx=s.ctx, dptr=buf, proc=2)   # the last close frees it
        yield s
    for last in ("IpcGetEventHandle", "IpcOpenEventHandle"):
        s = start(last)
        ipc = C["CU_EVENT_INTERPROCESS"] | C["CU_EVENT_DISABLE_TIMING"]
        ev = s.event(s.ctx, ipc)
        hnd = s.new("IpcGetEventHandle", "bytes", ctx=s.ctx, object=ev, proc=1)
        handle = Words(*(Ref(hnd.op, w, hnd.index) for w in range(8)))
        if last == "IpcGetEventHandle":
            s.call("IpcGetEventHandle", ctx=s.ctx, object=ev, proc=1)
            s.call("IpcGetEventHandle", ok=False, ctx=s.ctx, object=s.event(s.ctx), proc=1)  # not interprocess
            s.call("IpcGetEventHandle", ok=False, ctx=s.ctx, object=ev + 1, proc=1)
            s.call("EventDestroy", ctx=s.ctx, handle=ev)
        else:
            e2 = s.new("IpcOpenEventHandle", ctx=s.ctx, proc=2, handle=handle)
            s.call("EventRecord", ctx=s.ctx, event=ev)
            s.call("StreamWaitEvent", ctx=s.ctx, event=e2)
            s.call("IpcOpenEventHandle", ok=False, ctx=s.ctx, proc=1, handle=handle)
            s.call("IpcOpenEventHandle", ok=False, ctx=s.ctx, proc=2, handle=Words(1))
            s.call("EventDestroy", ctx=s.ctx, handle=ev)
            s.call("EventDestroy", ctx=s.ctx, handle=e2)
        yield s


def nvml_seeds():
    fn = P.nvml_fns
    s = start("Nvml")
    nodev = P.consts["kNoDevice"]

    def q(f, dev, a0=0, a1=0, cap=256, ok=True):
        s.call("Nvml", ok=ok, fn=fn[f] if isinstance(f, str) else f, device=dev, arg0=a0, arg1=a1, out_cap=cap)
    for f in fn:
        if f == "kCount":
            continue
        system = f in ("kInit", "kSystemDriverVersion", "kSystemNvmlVersion", "kSystemCudaDriverVersion",
                       "kDeviceCount")
        q(f, nodev if system else 0, 0, 0, 8 if f == "kDeviceUuid" else 256)
    yield s
    # The pass-through rows (tools/nvml_passthrough.txt; its row is the wire number past
    # kPassthroughBase), each asked as its kind wants, then a row past the list: seeds of
    # their own, 40 rows each (one seed's records and replies must fit the ring).
    base = P.consts["kPassthroughBase"]
    rows = [line.lstrip("#-").split()[0] for line in open(os.path.join(ROOT, "tools", "nvml_passthrough.txt"))
            if line.strip() and (not line.startswith("#") or line.startswith("#-"))]
    per_seed = 40
    for first in range(0, len(rows), per_seed):
        s = start(f"Nvml-passthrough{first // per_seed}")
        for row in range(first, min(first + per_seed, len(rows))):
            q(base + row, nodev if rows[row].startswith("nvmlSystem") else 0, 4, 0x100000004, 64)
        if first + per_seed >= len(rows):
            q(base + len(rows), 0)
        yield s


def random_bar_seeds():
    """A worker whose BAR is mapped at a random address (the leading 0x83: worker_fuzz.cc), as
    ivcudad maps every worker's: what the guest learns of it (the arena's device alias) and
    the copies, memsets and host functions through it."""
    s = Seed("random-bar")
    s.data += b"\x83"
    s.hello()
    s.ctx = s.context(0)
    buf = s.alloc(s.ctx)
    off, dev = s.pinned(0x10000)  # the pool's first block: the host function's words below are in it
    st = s.stream(s.ctx)
    s.call("MemcpyHtoDArena", ctx=s.ctx, dst=buf, bytes=4096, arena_off=off)
    s.call("MemcpyDtoHArena", ctx=s.ctx, src=buf, bytes=1024, arena_off=ARENA_OFF)
    s.call("MemcpyDtoD", ctx=s.ctx, dst=dev, src=buf, bytes=4096)  # into page-locked memory
    s.call("Memset", ctx=s.ctx, dptr=dev + 4096, width=64, height=1, value=1, elem_size=4)
    s.call("Memset", ok=False, ctx=s.ctx, dptr=dev + 0xA0000, width=64, height=1, value=1, elem_size=4)
    s.arena(POOL_OFF + 0x8000 - ARENA_OFF, struct.pack("<2I", 0, 1))
    s.call("HostFunc", ctx=s.ctx, stream=st, reached=s.base + POOL_OFF + 0x8000, done=s.base + POOL_OFF + 0x8004,
           seq=1)
    s.call("HostFunc", ok=False, ctx=s.ctx, stream=st, reached=s.base + 8, done=s.base + 12, seq=1)
    s.call("StreamSynchronize", ctx=s.ctx, handle=st)
    yield s


# ----------------------------------------------------------------- green contexts

def green_seeds():
    """The resource questions succeed; the rest meets the worker's refusals: a split or a
    descriptor of images it never gave out, a descriptor and green contexts that do not exist
    (a seed cannot carry an image back: the substitution words cover a reply's first eight)."""
    s = start("Green")
    k = P.consts
    s.call("Green", kind=k["kGreenDeviceResource"], device=0, type=1)  # CU_DEV_RESOURCE_TYPE_SM
    s.call("Green", ok=False, kind=k["kGreenDeviceResource"], device=0, type=0x7FFFFFFF)
    s.call("Green", ok=False, kind=k["kGreenDeviceResource"], device=5, type=1)
    s.call("Green", kind=k["kGreenCtxResource"], ctx=s.ctx, type=1)
    s.call("Green", ok=False, kind=k["kGreenCtxResource"], ctx=s.ctx + 1, type=1)
    s.call("Green", ok=False, kind=k["kGreenOwnResource"], handle=s.ctx, type=1)
    image = bytes([1, 0, 0, 0]) + bytes(range(140))
    s.call("Green", ok=False, kind=k["kGreenSplit"], count=2, min_count=8, want_remaining=1, tail=image)
    s.call("Green", ok=False, kind=k["kGreenSplit"], count=0, tail=image[:100])
    s.call("Green", ok=False, kind=k["kGreenDesc"], count=2, tail=image + image)
    s.call("Green", ok=False, kind=k["kGreenDesc"], count=0)
    s.call("Green", ok=False, kind=k["kGreenCreate"], handle=s.ctx, device=0, flags=1)
    for kind in ("kGreenDestroy", "kGreenStreamCreate", "kGreenRecordEvent", "kGreenWaitEvent"):
        s.call("Green", ok=False, kind=k[kind], handle=s.ctx, flags=1)
    s.call("Green", ok=False, kind=77)
    yield s


FAMILIES = (session_seeds, memory_seeds, module_seeds, stream_seeds, pool_seeds, graph_seeds, vmm_seeds,
            arrays_seeds, ipc_seeds, nvml_seeds, green_seeds, random_bar_seeds)


def op_seeds():
    """name -> Seed, every op of the table covered (an op without a seed is an error)."""
    seeds = {}
    for family in FAMILIES:
        for s in family():
            if s.name in seeds:
                raise ValueError(f"two seeds named {s.name}")
            seeds[s.name] = s
    missing = [op for op in P.ops if op not in seeds]
    if missing:
        raise SystemExit(f"op_seeds: no seed for {', '.join(missing)} (add one to tests/fuzz/op_seeds.py)")
    return seeds
