"""PyTorch torch.compile(mode="reduce-overhead"): Triton kernels replayed through CUDA graphs."""
import time

import torch

torch.manual_seed(0)
dev = torch.device("cuda:0")
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 64)).to(dev)
x = torch.randn(128, 256, device=dev)
fn = torch.compile(model, mode="reduce-overhead")
with torch.no_grad():
    ref = model(x)
    for _ in range(3):  # warm-up, recording, replay
        out = fn(x)
    t0 = time.perf_counter()
    for _ in range(50):
        out = fn(x)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
print(f"compiled matches eager: {torch.allclose(out, ref, rtol=1e-3, atol=1e-4)}")
print(f"output checksum: {out.double().sum().item():.3e}")
print(f"TIME {elapsed:.4f}")
