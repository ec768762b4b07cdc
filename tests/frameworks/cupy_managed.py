"""CuPy on managed memory: its pool over cudaMallocManaged for every array (matmul, FFT,
elementwise and reduction kernels), and one managed buffer the CPU writes through NumPy,
a kernel updates and the CPU reads back after a synchronisation; prefetch and advice."""
import ctypes
import time

import cupy as cp
import numpy as np

t0 = time.perf_counter()
cp.cuda.set_allocator(cp.cuda.MemoryPool(cp.cuda.malloc_managed).malloc)
a = cp.arange(1 << 20, dtype=cp.float32).reshape(1024, 1024) / (1 << 20)
b = cp.ones((1024, 1024), dtype=cp.float32)
print(f"matmul sum: {float((a @ b).sum()):.6e}")
print(f"fft |X0|: {float(cp.abs(cp.fft.fft(a[0]))[0]):.6e}")
print(f"elementwise sum: {float((a * a + 1).sum()):.6e}")

n = 3 << 20
ptr = cp.cuda.malloc_managed(n * 4)  # a MemoryPointer; ptr.mem is the ManagedMemory
host = np.ctypeslib.as_array(ctypes.cast(ptr.ptr, ctypes.POINTER(ctypes.c_float)), (n,))
host[:] = np.arange(n, dtype=np.float32) % 1000
dev = cp.ndarray((n,), cp.float32, ptr)
dev *= 2
dev += 1
cp.cuda.Device().synchronize()
print(f"managed buffer after the kernels: sum {float(host.astype(np.float64).sum()):.6e}, "
      f"host[999] {host[999]:.1f}")
host[::4096] = -1.0
print(f"kernel sees the CPU's writes: {float(dev.sum()):.6e}")
for what, call in (("prefetch", lambda: ptr.mem.prefetch(cp.cuda.Stream.null)),
                   ("advise", lambda: ptr.mem.advise(cp.cuda.runtime.cudaMemAdviseSetReadMostly, cp.cuda.Device()))):
    try:
        call()
        print(f"{what}: ok")
    except Exception as e:  # the same exception natively and through ivcuda
        print(f"{what}: {type(e).__name__}")
cp.cuda.Device().synchronize()
print(f"after prefetch: host[4097] {host[4097]:.1f}")
print(f"TIME {time.perf_counter() - t0:.4f}")
