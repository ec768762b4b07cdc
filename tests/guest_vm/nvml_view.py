# What pynvml (NVIDIA's nvidia-ml-py, unchanged) sees, in lines a shell script
# compares: natively on a host, the host's NVML; in a guest, ivcuda's
# libnvidia-ml.so.1 (tests/gpu/run_vm_on_gpu.sh runs it both ways).
#
#   nvml_view.py [--alloc-mib N]
#
# With --alloc-mib, this process first allocates N MiB on GPU 0 through
# libcuda.so.1 (ctypes) and holds them while it asks NVML, so that it must be
# in the process list. It prints:
#   library: PATH                          (the NVML library this process loaded)
#   pid: PID
#   gpu I: NAME, UUID, TOTAL MiB, BUS_ID   (what nvidia-smi --query-gpu=name,uuid,
#                                           memory.total,pci.bus_id --format=csv,noheader prints)
#   name I: NAME, uuid I: UUID, bus_id I: BUS_ID, total I: BYTES (the memory total to the byte)
#   processes I: PID=BYTES ...             (compute processes; "none" when there are none)
# Exit status 0 when NVML answered every question.
import ctypes
import os
import sys

import pynvml


def text(v):
    return v.decode() if isinstance(v, bytes) else v


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--alloc-mib":
        cu = ctypes.CDLL("libcuda.so.1")
        dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
        for what, r in (("cuInit", lambda: cu.cuInit(0)), ("cuDeviceGet", lambda: cu.cuDeviceGet(ctypes.byref(dev), 0)),
                        ("cuDevicePrimaryCtxRetain", lambda: cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)),
                        ("cuCtxSetCurrent", lambda: cu.cuCtxSetCurrent(ctx)),
                        ("cuMemAlloc", lambda: cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(int(sys.argv[2]) << 20)))):
            st = r()
            if st != 0:
                print(f"nvml_view: {what} failed with CUresult {st}")
                return 1
    elif len(sys.argv) != 1:
        print("usage: nvml_view.py [--alloc-mib N]")
        return 2
    pynvml.nvmlInit()
    with open("/proc/self/maps") as maps:
        libs = [line.split()[-1] for line in maps
                if any(n in line.rsplit("/", 1)[-1] for n in ("nvidia-ml", "nvml")) and ".so" in line]
    print("library:", libs[0] if libs else "?")
    print("pid:", os.getpid())
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        pci = pynvml.nvmlDeviceGetPciInfo(h)
        name, uuid, bus_id = text(pynvml.nvmlDeviceGetName(h)), text(pynvml.nvmlDeviceGetUUID(h)), text(pci.busId)
        print(f"gpu {i}: {name}, {uuid}, {mem.total >> 20} MiB, {bus_id}")
        print(f"name {i}: {name}")
        print(f"uuid {i}: {uuid}")
        print(f"bus_id {i}: {bus_id}")
        print(f"total {i}: {mem.total}")
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        print(f"processes {i}:", " ".join(f"{p.pid}={p.usedGpuMemory}" for p in procs) or "none")
    pynvml.nvmlShutdown()  # the allocation lives until the process ends
    return 0


if __name__ == "__main__":
    sys.exit(main())
