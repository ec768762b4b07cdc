"""PyTorch eager: a small MLP trained with AMP, events timing it. Deterministic lines first
(loss and checksums rounded), then one TIME line."""
import time

import torch

torch.manual_seed(0)
torch.backends.cudnn.deterministic = True
torch.backends.cuda.matmul.allow_tf32 = False
dev = torch.device("cuda:0")
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = torch.amp.GradScaler("cuda")
x = torch.randn(1024, 256, device=dev)
y = torch.randint(0, 10, (1024,), device=dev)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
t0 = time.perf_counter()
start.record()
for step in range(50):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
end.record()
end.synchronize()
torch.cuda.synchronize()
print(f"loss after 50 steps: {loss.item():.3f}")
print(f"weight checksum: {sum(p.double().sum().item() for p in model.parameters()):.2f}")
a = torch.arange(4096, device=dev, dtype=torch.float32).reshape(64, 64)
print(f"matmul checksum: {(a @ a).sum().item():.6e}")
print(f"event elapsed is positive: {start.elapsed_time(end) > 0}")
print(f"TIME {time.perf_counter() - t0:.4f}")
