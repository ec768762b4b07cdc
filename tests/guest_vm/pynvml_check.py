# pynvml (NVIDIA's nvidia-ml-py, unchanged) in the test guest, over ivcuda's
# libnvidia-ml.so.1, against what the host's doubles really hold. Run by
# vm_ivcuda_test.sh:
#
#   pynvml_check.py TOTAL_MIB CONTEXT_MIB
#
# TOTAL_MIB is the VM's quota (ivcudad --mem-limit), CONTEXT_MIB what a
# context holds in the GPU test double (tests/gpu_double/README.md): the
# host's NVML (the NVML test double) lists every process with a context, and
# each worker holds one. So this process, which holds nothing but its
# worker's context, is listed alone, by its own pid, with CONTEXT_MIB; a
# second process of the VM (nvml_api --hold, 100 MiB) is listed beside it
# with CONTEXT_MIB + 100; whatever else the VM's memory.used holds is whole
# contexts (its spare workers'); the total is the quota. Name and UUID are
# the C library's as ivcuda-smi prints them (nvml_api, run just before,
# checks those against libcuda).
import os
import subprocess
import sys
import time

import pynvml

MIB = 1 << 20
HOLD_MIB = 100
total_mib, ctx_mib = int(sys.argv[1]), int(sys.argv[2])
failures = []


def check(ok, what):
    print(f"pynvml: {'ok' if ok else 'FAIL'}: {what}")
    if not ok:
        failures.append(what)


def listed(h):
    return {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}


def settle(h, want):
    """The process list once it is `want` (pid -> bytes), or what it was after 5 s:
    a process of the VM that just ended may still be on it until the host
    reclaims it."""
    seen = listed(h)
    deadline = time.monotonic() + 5
    while seen != want and time.monotonic() < deadline:
        time.sleep(0.05)
        seen = listed(h)
    return seen


def mib(procs):
    return {pid: used / MIB for pid, used in procs.items()}


pynvml.nvmlInit()
count = pynvml.nvmlDeviceGetCount()
smi = subprocess.run(["ivcuda-smi", "--query-gpu=name,uuid", "--format=csv,noheader,nounits"],
                     capture_output=True, text=True, check=True).stdout.strip().splitlines()
check(count > 0 and count == len(smi), f"{count} GPU(s), as many as ivcuda-smi lists ({len(smi)})")
for i in range(min(count, len(smi))):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    line = f"{pynvml.nvmlDeviceGetName(h)}, {pynvml.nvmlDeviceGetUUID(h)}"
    check(line == smi[i].strip(), f"GPU {i}: {line} (ivcuda-smi: {smi[i].strip()})")
    total = pynvml.nvmlDeviceGetMemoryInfo(h).total
    check(total == total_mib * MIB, f"GPU {i}: memory total {total / MIB:g} MiB, the VM's quota {total_mib} MiB")

h = pynvml.nvmlDeviceGetHandleByIndex(0)
me = os.getpid()
alone = {me: ctx_mib * MIB}
seen = settle(h, alone)
check(seen == alone, f"GPU 0 lists this process alone, by its pid, with its worker's context "
                     f"({mib(alone)} MiB): {mib(seen)}")

child = subprocess.Popen(["nvml_api", "--hold", str(HOLD_MIB)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
ready = child.stdout.readline().strip()
check(ready == "ready", f"a second process holds {HOLD_MIB} MiB (it said {ready!r})")
both = {me: ctx_mib * MIB, child.pid: (ctx_mib + HOLD_MIB) * MIB}
seen = settle(h, both)
check(seen == both, f"GPU 0 lists both of the VM's processes with their memory, contexts included "
                    f"({mib(both)} MiB): {mib(seen)}")
used = pynvml.nvmlDeviceGetMemoryInfo(h).used
rest = used - sum(seen.values())
check(rest >= 0 and rest % (ctx_mib * MIB) == 0,
      f"memory used {used / MIB:g} MiB: the listed processes' and whole contexts of spare workers "
      f"({rest / MIB:g} MiB more)")
child.stdin.close()
check(child.wait() == 0, "the second process ended well")
seen = settle(h, alone)
check(seen == alone, f"once it ended, this process alone again: {mib(seen)}")

try:
    pynvml.nvmlDeviceSetPowerManagementLimit(h, 100000)
    check(False, "a setter answers NO_PERMISSION (it was allowed)")
except pynvml.NVMLError_NoPermission:
    check(True, "a setter answers NO_PERMISSION")
pynvml.nvmlShutdown()
print("pynvml_check:", "PASS" if not failures else f"FAIL ({len(failures)} of the checks above)")
sys.exit(0 if not failures else 1)
