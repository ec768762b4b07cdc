"""torch.distributed with NCCL: two processes, one GPU each, all-reduce and all-gather."""
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, world, q):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29512"
    dev = torch.device(f"cuda:{rank}")
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    x = torch.full((1 << 20,), float(rank + 1), device=dev)
    dist.all_reduce(x)
    parts = [torch.empty(4, device=dev) for _ in range(world)]
    dist.all_gather(parts, torch.full((4,), float(rank), device=dev))
    torch.cuda.synchronize()
    q.put((rank, x[0].item(), x.sum().item(), [p[0].item() for p in parts]))
    dist.destroy_process_group()


if __name__ == "__main__":
    t0 = time.perf_counter()
    world = 2
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, world, q)) for r in range(world)]
    for p in procs:
        p.start()
    got = sorted(q.get(timeout=240) for _ in range(world))
    for p in procs:
        p.join(timeout=60)
    for rank, first, total, gathered in got:
        print(f"rank {rank}: all-reduce element {first}, sum {total:.6e}, all-gather {gathered}")
    print(f"exit codes: {[p.exitcode for p in procs]}")
    print(f"TIME {time.perf_counter() - t0:.4f}")
