# pynvml (NVIDIA's nvidia-ml-py, unchanged) in the test guest, over ivcuda's
# libnvidia-ml.so.1: it sees the GPUs ivcuda-smi sees, by the same name, UUID
# and memory total, and this VM's processes only. Run by vm_ivcuda_test.sh.
import subprocess
import sys

import pynvml

pynvml.nvmlInit()
count = pynvml.nvmlDeviceGetCount()
smi = subprocess.run(["ivcuda-smi", "--query-gpu=name,uuid,memory.total", "--format=csv,noheader,nounits"],
                     capture_output=True, text=True, check=True).stdout.strip().splitlines()
ok = count == len(smi) and count > 0
for i in range(count):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    name = pynvml.nvmlDeviceGetName(h)
    uuid = pynvml.nvmlDeviceGetUUID(h)
    total_mib = pynvml.nvmlDeviceGetMemoryInfo(h).total >> 20
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    line = f"{name}, {uuid}, {total_mib}"
    print(f"pynvml: GPU {i}: {line}; {len(procs)} process(es) of this VM")
    ok = ok and line == smi[i].strip()
    if line != smi[i].strip():
        print(f"pynvml: ivcuda-smi says {smi[i].strip()!r}")
try:
    pynvml.nvmlDeviceSetPowerManagementLimit(pynvml.nvmlDeviceGetHandleByIndex(0), 100000)
    ok = False
    print("pynvml: a setter was allowed")
except pynvml.NVMLError_NoPermission:
    print("pynvml: setters answer NO_PERMISSION")
pynvml.nvmlShutdown()
print("pynvml_check:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
