"""torch.multiprocessing: a CUDA tensor made in the parent is changed in place by a child
process (CUDA IPC memory and event handles under the hood)."""
import time

import torch
import torch.multiprocessing as mp


def child(t, q):
    t.mul_(2).add_(1)
    torch.cuda.synchronize()
    q.put(float(t.sum().item()))


if __name__ == "__main__":
    mp.set_start_method("spawn")
    t0 = time.perf_counter()
    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")
    q = mp.Queue()
    p = mp.Process(target=child, args=(t, q))
    p.start()
    seen = q.get(timeout=90)
    p.join(timeout=90)
    print(f"child exit code: {p.exitcode}")
    print(f"child saw sum: {seen:.6e}")
    print(f"parent sees sum: {t.sum().item():.6e}")
    print(f"TIME {time.perf_counter() - t0:.4f}")
