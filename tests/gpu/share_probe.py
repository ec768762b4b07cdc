#!/usr/bin/env python3
"""Shared device memory and the quota, through whichever libcuda.so.1 the loader finds
(run_share_on_gpu.sh runs it through ivcuda's, against the real driver).

  share_probe.py export COUNT MIB HOLD_S   COUNT allocations of MIB MiB, each created with a
                                           POSIX-fd handle type, exported and released; then
                                           one more create; prints the quota's free bytes and
                                           the last create's result, and holds for HOLD_S s
  share_probe.py ipc MIB                   allocates MIB MiB, exports it as an IPC handle and
                                           runs `ipc-open` in a child process
  share_probe.py ipc-open HEX              (the child) prints the quota's free bytes before and
                                           after it opens the handle
Each line it prints is KEY=VALUE; the exit status is 0 when every call it needed succeeded.
"""
import ctypes
import os
import subprocess
import sys
import time

cu = ctypes.CDLL("libcuda.so.1")
POSIX_FD = 1


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class AllocProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", AllocFlags)]


class IpcMemHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


def check(what, rc):
    if rc != 0:
        print(f"{what}={rc}")
        sys.exit(1)


def context():
    check("cuInit", cu.cuInit(0))
    dev = ctypes.c_int()
    check("cuDeviceGet", cu.cuDeviceGet(ctypes.byref(dev), 0))
    ctx = ctypes.c_void_p()
    check("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
    check("cuCtxSetCurrent", cu.cuCtxSetCurrent(ctx))


def free_bytes():
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check("cuMemGetInfo", cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)))
    return free.value


def export(count, mib, hold):
    context()
    prop = AllocProp()
    prop.type = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
    prop.requestedHandleTypes = POSIX_FD
    prop.location.type = 1  # CU_MEM_LOCATION_TYPE_DEVICE
    size = mib << 20
    fds = []
    for _ in range(count):
        h = ctypes.c_ulonglong()
        check("cuMemCreate", cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(prop),
                                            ctypes.c_ulonglong(0)))
        fd = ctypes.c_int(-1)
        check("cuMemExportToShareableHandle",
              cu.cuMemExportToShareableHandle(ctypes.byref(fd), h, POSIX_FD, ctypes.c_ulonglong(0)))
        fds.append(fd.value)  # kept open, as a process that shares it would
        check("cuMemRelease", cu.cuMemRelease(h))
    print(f"free_after_exports={free_bytes()}")
    h = ctypes.c_ulonglong()
    rc = cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(2 * size), ctypes.byref(prop), ctypes.c_ulonglong(0))
    print(f"twice_more_create={rc}")
    print("holding=1", flush=True)
    time.sleep(hold)


def ipc(mib):
    context()
    dptr = ctypes.c_ulonglong()
    check("cuMemAlloc", cu.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(mib << 20)))
    handle = IpcMemHandle()
    check("cuIpcGetMemHandle", cu.cuIpcGetMemHandle(ctypes.byref(handle), dptr))
    raw = ctypes.string_at(ctypes.addressof(handle), 64)  # all 64 bytes: zeros are part of it
    child = subprocess.run([sys.executable, __file__, "ipc-open", raw.hex()],
                           capture_output=True, text=True, timeout=120)
    sys.stdout.write(child.stdout)
    sys.exit(child.returncode)


def ipc_open(hexed):
    context()
    handle = IpcMemHandle()
    ctypes.memmove(ctypes.addressof(handle), bytes.fromhex(hexed), 64)
    before = free_bytes()
    dptr = ctypes.c_ulonglong()
    check("cuIpcOpenMemHandle", cu.cuIpcOpenMemHandle_v2(ctypes.byref(dptr), handle, 1))
    print(f"free_before_open={before}")
    print(f"free_after_open={free_bytes()}")


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "export":
        export(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    elif mode == "ipc":
        ipc(int(sys.argv[2]))
    else:
        ipc_open(sys.argv[2])
