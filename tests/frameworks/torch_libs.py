"""PyTorch's library paths: cuDNN convolution and batch norm (forward and backward),
cuSOLVER (Cholesky, QR, eigh), cuSPARSE (sparse x dense), cuFFT, cuRAND."""
import time

import torch

torch.manual_seed(0)
dev = torch.device("cuda:0")
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False
t0 = time.perf_counter()

conv = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU()).to(dev)
img = torch.randn(8, 3, 32, 32, device=dev, requires_grad=True)
out = conv(img)
out.sum().backward()
print(f"cudnn conv forward finite: {bool(torch.isfinite(out).all())}, shape {tuple(out.shape)}")
print(f"cudnn conv grad norm: {img.grad.norm().item():.3e}")

a = torch.randn(64, 64, device=dev, dtype=torch.float64)
spd = a @ a.T + 64 * torch.eye(64, device=dev, dtype=torch.float64)
chol = torch.linalg.cholesky(spd)
print(f"cusolver cholesky residual small: {torch.dist(chol @ chol.T, spd).item() < 1e-8}")
q, r = torch.linalg.qr(a)
print(f"cusolver qr residual small: {torch.dist(q @ r, a).item() < 1e-8}")
w = torch.linalg.eigvalsh(spd)
print(f"cusolver eigvalsh min > 0: {bool(w.min() > 0)}")

idx = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0]], device=dev)
sp = torch.sparse_coo_tensor(idx, torch.tensor([1.0, 2.0, 3.0, 4.0], device=dev), (4, 4))
dense = torch.arange(16, dtype=torch.float32, device=dev).reshape(4, 4)
print(f"cusparse spmm: {torch.sparse.mm(sp, dense).sum().item():.1f}")
csr = sp.to_sparse_csr()
print(f"cusparse csr mv: {(csr @ torch.ones(4, device=dev)).tolist()}")

sig = torch.sin(torch.arange(1024, device=dev, dtype=torch.float32) * 0.1)
spec = torch.fft.rfft(sig)
print(f"cufft peak bin: {int(spec.abs().argmax())}")
g = torch.Generator(device=dev).manual_seed(1)
print(f"curand mean near 0: {abs(torch.randn(1 << 20, device=dev, generator=g).mean().item()) < 0.01}")
torch.cuda.synchronize()
print(f"TIME {time.perf_counter() - t0:.4f}")
