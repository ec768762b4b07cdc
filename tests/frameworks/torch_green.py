"""PyTorch's green contexts (torch.cuda.green_contexts): two green contexts of 16 and 32 SMs, a
matmul and a reduction run in each (current, and on the green context's own stream where this
PyTorch has one), checked against the same work in the primary context; the timing of a
compute-bound loop in the smaller green context and on the whole GPU is printed as a figure.

Prints what must be identical natively and through ivcuda, and `TIME` (the loop in the green
context) for run_frameworks.sh.
"""
import time

import torch
from torch.cuda import green_contexts as gc

torch.backends.cuda.matmul.allow_tf32 = False
print("green contexts supported", gc.SUPPORTED)
if not gc.SUPPORTED:
    raise SystemExit(0)

torch.manual_seed(0)
a = torch.randn(2048, 2048, device="cuda")
b = torch.randn(2048, 2048, device="cuda")
want = (a @ b).sum(dim=0)
torch.cuda.synchronize()


def enter(g):
    (g.set_context if hasattr(g, "set_context") else g.make_current)()


def leave(g):
    (g.pop_context if hasattr(g, "pop_context") else g.pop_current)()


def loop(n=20):
    x = a
    for _ in range(n):
        x = torch.tanh(x @ b) * 0.5
    return x


timed = None
for sms in (16, 32):
    g = gc.GreenContext.create(num_sms=sms, device_id=0)
    enter(g)
    got = (a @ b).sum(dim=0)
    torch.cuda.synchronize()
    print(f"green context of {sms} SMs: matmul and sum as in the primary context", torch.equal(got, want))
    if hasattr(g, "Stream"):
        s = g.Stream()
        with torch.cuda.stream(s):
            on_stream = (a @ b).sum(dim=0)
        s.synchronize()
        print(f"  on its own stream: as in the primary context", torch.equal(on_stream, want))
    if sms == 16:
        loop(2)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = loop()
        torch.cuda.synchronize()
        timed = time.perf_counter() - t0
        print(f"  loop checksum {out.abs().sum().item():.3f}")
    leave(g)
    del g

torch.cuda.synchronize()
t0 = time.perf_counter()
out = loop()
torch.cuda.synchronize()
whole = time.perf_counter() - t0
print(f"loop on the whole GPU, checksum {out.abs().sum().item():.3f}")
print(f"FIG green16_over_whole_gpu {timed / whole:.2f}")
print(f"TIME {timed:.4f}")
