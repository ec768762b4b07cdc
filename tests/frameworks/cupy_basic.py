"""CuPy: elementwise and reduction kernels (NVRTC), cuBLAS matmul, FFT, a raw kernel."""
import time

import cupy as cp

t0 = time.perf_counter()
a = cp.arange(1 << 20, dtype=cp.float32).reshape(1024, 1024) / (1 << 20)
b = cp.ones((1024, 1024), dtype=cp.float32)
print(f"matmul sum: {float((a @ b).sum()):.6e}")
print(f"fft |X0|: {float(cp.abs(cp.fft.fft(a[0]))[0]):.6e}")
sq = cp.ElementwiseKernel("float32 x", "float32 y", "y = x * x + 1", "sq")
print(f"elementwise sum: {float(sq(a).sum()):.6e}")
raw = cp.RawKernel(r'''extern "C" __global__ void inc(int *p, int n)
{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] += i; }''', "inc")
v = cp.zeros(1000, dtype=cp.int32)
raw((4,), (256,), (v, cp.int32(1000)))
print(f"raw kernel sum: {int(v.sum())}")
cp.cuda.Stream.null.synchronize()
print(f"TIME {time.perf_counter() - t0:.4f}")
