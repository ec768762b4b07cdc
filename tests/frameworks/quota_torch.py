"""PyTorch under an ivcudad device-memory quota (--mem-limit, QUOTA_GIB):
the device reports the quota as its memory, the caching allocator runs out
at the quota with torch.OutOfMemoryError, and the process carries on."""
import os
import sys

import torch

GiB = 1 << 30
quota = int(os.environ.get("QUOTA_GIB", "20")) * GiB
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    failures += 0 if ok else 1


free, total = torch.cuda.mem_get_info()
print(f"torch: mem_get_info free {free / GiB:.2f} GiB, total {total / GiB:.2f} GiB")
check(total == quota, "cuMemGetInfo's total is the quota")
check(torch.cuda.get_device_properties(0).total_memory == quota, "the device's total memory is the quota")
held = []
try:
    while len(held) < 100:
        held.append(torch.empty(GiB, dtype=torch.uint8, device="cuda"))
    check(False, "an allocation past the quota fails")
except torch.OutOfMemoryError as e:
    print(f"torch: out of memory after {len(held)} GiB: {str(e).splitlines()[0][:120]}")
    check(quota // GiB - 2 <= len(held) <= quota // GiB, "1 GiB tensors up to the quota, then OutOfMemoryError")
del held
torch.cuda.empty_cache()
a = torch.randn(2048, 2048, device="cuda")
b = (a @ a.T).diagonal()
check(torch.allclose(b, (a * a).sum(1), rtol=1e-3, atol=1e-2), "work after the refusal is correct")
free, total = torch.cuda.mem_get_info()
print(f"torch: after freeing, free {free / GiB:.2f} GiB of {total / GiB:.2f}")
check(free > quota - GiB, "freed memory is back in the quota")
print("quota_torch: %d failed" % failures)
sys.exit(1 if failures else 0)
