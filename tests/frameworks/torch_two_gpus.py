"""PyTorch on two GPUs of one guest: cuBLAS matmul on cuda:1, peer copies both ways."""
import time

import torch

torch.manual_seed(0)
t0 = time.perf_counter()
a = torch.randn(1024, 1024, device="cuda:1")
b = torch.randn(1024, 1024, device="cuda:1")
c = a @ b
print(f"matmul on cuda:1 checksum: {c.double().abs().sum().item():.6e}")
print(f"peer access 0->1: {torch.cuda.can_device_access_peer(0, 1)}")
x = torch.arange(1 << 22, dtype=torch.float32, device="cuda:0")
y = x.to("cuda:1")
z = (y * 2).to("cuda:0")
print(f"peer round trip exact: {torch.equal(z, x * 2)}")
with torch.cuda.device(1):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        w = (c.relu() + 1).sum()
    s.synchronize()
print(f"stream on cuda:1 sum: {w.item():.6e}")
torch.cuda.synchronize(0)
torch.cuda.synchronize(1)
print(f"TIME {time.perf_counter() - t0:.4f}")
