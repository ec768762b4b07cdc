"""torch.distributed with NCCL, one rank on one GPU: all-reduce and broadcast."""
import os
import time

import torch
import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29511")
t0 = time.perf_counter()
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
x = torch.arange(4096, dtype=torch.float32, device="cuda:0")
dist.all_reduce(x)
dist.broadcast(x, src=0)
torch.cuda.synchronize()
print(f"all-reduce sum: {x.sum().item():.6e}")
dist.destroy_process_group()
print(f"TIME {time.perf_counter() - t0:.4f}")
