"""NVML through ivcuda compared with the host's NVML (pynvml, from nvidia-ml-py).

Three steps, run by tests/gpu/run_nvml_on_gpu.sh:
  nvml_compare.py dump OUT.json
      what the NVML this process loads says: every GPU's name, UUID, PCI bus id,
      memory, and its compute processes (pid, bytes). Natively: the host's view.
  nvml_compare.py guest OUT.json --alloc-mib N --ready FILE --done FILE
      through ivcuda (LD_LIBRARY_PATH: ivcuda's libcuda.so.1 and libnvidia-ml.so.1):
      allocates N MiB on GPU 0 through the CUDA driver API, then dumps what the
      guest's NVML says, touches FILE (--ready) and holds the memory until --done
      exists, so that the host's NVML can be asked meanwhile.
  nvml_compare.py compare NATIVE.json GUEST.json DURING.json --worker-pids P,... --alloc-mib N
      the verdicts, one line each ("PASS ..."/"FAIL ..."); exit status 1 on any FAIL.
"""
import argparse
import ctypes
import json
import os
import sys
import time


def dump_nvml():
    import pynvml

    pynvml.nvmlInit()
    out = {"pid": os.getpid(), "driver": pynvml.nvmlSystemGetDriverVersion(), "gpus": []}
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        pci = pynvml.nvmlDeviceGetPciInfo(h)
        procs = []
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            procs.append({"pid": p.pid, "used": p.usedGpuMemory})
        def text(v):
            return v.decode() if isinstance(v, bytes) else v
        out["gpus"].append({
            "name": text(pynvml.nvmlDeviceGetName(h)),
            "uuid": text(pynvml.nvmlDeviceGetUUID(h)),
            "bus_id": text(pci.busId),
            "total": mem.total, "used": mem.used, "free": mem.free,
            "processes": procs,
        })
    pynvml.nvmlShutdown()
    return out


def cuda_alloc(mib):
    """N MiB on device 0 through the CUDA driver API; the pointer (kept for the process's life)."""
    cu = ctypes.CDLL("libcuda.so.1")
    def check(r, what):
        if r != 0:
            sys.exit(f"nvml_compare: {what} failed with CUresult {r}")
    check(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    ptr = ctypes.c_uint64()
    check(cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib << 20)), "cuMemAlloc")
    return cu, ptr


def compare(native, guest, during, worker_pids, alloc_mib):
    failed = 0

    def verdict(name, ok, detail=""):
        nonlocal failed
        print(("PASS " if ok else "FAIL ") + name + (f": {detail}" if detail and not ok else ""))
        failed += 0 if ok else 1

    verdict("the guest sees as many GPUs as the host", len(guest["gpus"]) == len(native["gpus"]),
            f"{len(guest['gpus'])} vs {len(native['gpus'])}")
    for i, (g, n) in enumerate(zip(guest["gpus"], native["gpus"])):
        for key in ("name", "uuid", "bus_id", "total"):
            verdict(f"GPU {i}: {key} identical ({n[key]})", g[key] == n[key], f"guest {g[key]!r}, host {n[key]!r}")
    g0, d0 = guest["gpus"][0], during["gpus"][0]
    mine = [p for p in d0["processes"] if p["pid"] in worker_pids]
    host_used = sum(p["used"] for p in mine)
    verdict("GPU 0: the host's NVML lists the guest's worker", len(mine) >= 1,
            f"worker pids {sorted(worker_pids)}, host's list {d0['processes']}")
    verdict(f"GPU 0: the guest's memory used is what its worker holds on the host ({host_used >> 20} MiB)",
            g0["used"] == host_used, f"guest {g0['used']}, host {host_used}")
    verdict(f"GPU 0: the guest's memory used covers the {alloc_mib} MiB it allocated",
            g0["used"] >= alloc_mib << 20, f"{g0['used']} bytes")
    verdict("GPU 0: the guest's free is its total less its used", g0["free"] == g0["total"] - g0["used"],
            f"{g0['free']} != {g0['total']} - {g0['used']}")
    pids = [p["pid"] for p in g0["processes"]]
    verdict(f"GPU 0: the guest's process list is the guest process alone, by its own pid ({guest['pid']})",
            pids == [guest["pid"]], f"{g0['processes']}")
    others = [p["pid"] for p in d0["processes"] if p["pid"] not in worker_pids]
    leaked = [p for p in others if p in pids]
    verdict(f"GPU 0: none of the host's other processes ({others}) is listed in the guest", not leaked, f"{leaked}")
    if g0["processes"]:
        verdict("GPU 0: the guest's process entry holds its worker's bytes", g0["processes"][0]["used"] == host_used,
                f"{g0['processes'][0]['used']} vs {host_used}")
    return failed


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out")
    g = sub.add_parser("guest")
    g.add_argument("out")
    g.add_argument("--alloc-mib", type=int, default=512)
    g.add_argument("--ready", required=True)
    g.add_argument("--done", required=True)
    g.add_argument("--hold-s", type=float, default=120)
    c = sub.add_parser("compare")
    c.add_argument("native")
    c.add_argument("guest")
    c.add_argument("during")
    c.add_argument("--worker-pids", required=True)
    c.add_argument("--alloc-mib", type=int, default=512)
    a = ap.parse_args()

    if a.cmd == "dump":
        with open(a.out, "w") as f:
            json.dump(dump_nvml(), f, indent=1)
        return 0
    if a.cmd == "guest":
        keep = cuda_alloc(a.alloc_mib)
        with open(a.out, "w") as f:
            json.dump(dump_nvml(), f, indent=1)
        open(a.ready, "w").close()
        until = time.time() + a.hold_s
        while not os.path.exists(a.done) and time.time() < until:
            time.sleep(0.1)
        del keep
        return 0
    load = lambda p: json.load(open(p))
    pids = {int(p) for p in a.worker_pids.split(",") if p}
    return 1 if compare(load(a.native), load(a.guest), load(a.during), pids, a.alloc_mib) else 0


if __name__ == "__main__":
    sys.exit(main())
