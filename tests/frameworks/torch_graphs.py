"""PyTorch CUDA graphs: torch.cuda.graph capture and replay of a small step."""
import time

import torch

dev = torch.device("cuda:0")
static_x = torch.ones(1024, 1024, device=dev)
w = torch.full((1024, 1024), 0.5, device=dev)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        static_y = (static_x @ w).relu()
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    static_y = (static_x @ w).relu()
t0 = time.perf_counter()
for i in range(20):
    static_x.fill_(float(i))
    g.replay()
torch.cuda.synchronize()
print(f"after 20 replays: {static_y.sum().item():.6e}")
print(f"TIME {time.perf_counter() - t0:.4f}")
