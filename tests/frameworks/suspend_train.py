# A deterministic PyTorch training loop for ivcudactl suspend on the GPU
# (tests/gpu/run_suspend_on_gpu.sh): a small MLP on fixed random data, one
# line per step ("step N loss X", X to full precision), flushed, and a short
# pause per step so that a suspension lands mid-run. Run natively and through
# ivcuda with a suspension in the middle, the two lists of losses must be the
# same: the guest saw nothing but time passing.
#   python suspend_train.py [STEPS] [HIDDEN]
import sys
import time

import torch

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
hidden = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
torch.manual_seed(1234)
torch.backends.cudnn.deterministic = True
torch.backends.cuda.matmul.allow_tf32 = False
torch.use_deterministic_algorithms(True)
dev = torch.device("cuda")
x = torch.randn(512, 1024, device=dev)
y = torch.randn(512, 10, device=dev)
model = torch.nn.Sequential(torch.nn.Linear(1024, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                            torch.nn.ReLU(), torch.nn.Linear(hidden, 10)).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
# Device memory the run holds all along besides the model (so a suspension moves a few GiB).
ballast = torch.full((int(sys.argv[3]) if len(sys.argv) > 3 else 2 << 30,), 7, dtype=torch.uint8, device=dev)
for step in range(steps):
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.10e}", flush=True)
    time.sleep(0.02)
assert int(ballast.sum().item()) == 7 * ballast.numel(), "ballast changed"
print("done", flush=True)
