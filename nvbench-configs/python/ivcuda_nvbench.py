#!/usr/bin/env python3
"""ivcuda's NVBench benchmarks in Python: the cuda-bench wheel's `cuda.bench` with CuPy kernels.

The same set, with the same names and axes, as the C++ executable (benchmarks/*.cu): sleep_1ms,
sleep_sweep, launch_empty, copy_d2d_kernel, copy_h2d and copy_d2h. It takes NVBench's command line
(`--json FILE`, `--stopping-criterion sample-count --target-samples N`, `-b NAME`, ...).

Needs cuda-bench[cu13] (0.3.0, with cuda-bindings 13) and cupy-cuda13x. Through ivcuda, run it
with ivcuda's libcuda.so.1 first on LD_LIBRARY_PATH, as any CUDA program (run.sh --python does).
"""

import sys

try:
    import cuda.bench as bench
    import cupy as cp
    import numpy as np
except ImportError as e:
    sys.exit(f"ivcuda_nvbench.py: {e}: needs cuda-bench[cu13] and cupy-cuda13x "
             "(run.sh puts the wheel from .deps/wheels on PYTHONPATH)")

# The kernels, compiled by CuPy (NVRTC) when a benchmark first asks for them - before NVBench
# starts timing, so that no module is loaded behind NVBench's blocking kernel.
_SOURCE = r"""
extern "C" __global__ void wait_ns(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

extern "C" __global__ void empty_kernel() {}

extern "C" __global__ void copy_kernel(const int* in, int* out, unsigned long long n) {
  const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    out[i] = in[i];
}
"""
_module = None


def kernel(name):
    global _module
    if _module is None:
        _module = cp.RawModule(code=_SOURCE)
    return _module.get_function(name)


def cupy_stream(stream):
    """NVBench's stream as a CuPy stream (CuPy 14 takes the __cuda_stream__ protocol)."""
    if hasattr(cp.cuda.Stream, "from_external"):
        return cp.cuda.Stream.from_external(stream)
    return cp.cuda.ExternalStream(stream.addressof())


def sleep_for(state, seconds):
    wait = kernel("wait_ns")
    ns = cp.uint64(int(seconds * 1e9))
    stream = cupy_stream(state.get_stream())

    def launcher(launch):
        with stream:
            wait((1,), (1,), (ns,))

    state.exec(launcher)


def sleep_1ms(state):
    sleep_for(state, 1e-3)


def sleep_sweep(state):
    sleep_for(state, state.get_float64("Duration"))


def launch_empty(state):
    empty = kernel("empty_kernel")
    stream = cupy_stream(state.get_stream())

    def launcher(launch):
        with stream:
            empty((1,), (1,), ())

    state.exec(launcher)


def copy_d2d_kernel(state):
    n = (64 << 20) // 4
    copy = kernel("copy_kernel")
    stream = cupy_stream(state.get_stream())
    with stream:
        src = cp.ones(n, dtype=cp.int32)
        dst = cp.empty(n, dtype=cp.int32)
    stream.synchronize()
    state.add_element_count(n)
    state.add_global_memory_reads(n * 4)
    state.add_global_memory_writes(n * 4)
    count = cp.uint64(n)

    def launcher(launch):
        with stream:
            copy((256,), (256,), (src, dst, count))

    state.exec(launcher)


def host_copy(state, to_device):
    nbytes = state.get_int64("Bytes")
    memory = state.get_string("Memory")
    device = cp.cuda.alloc(nbytes)
    device.memset(1, nbytes)
    if memory == "pinned":
        pinned = cp.cuda.alloc_pinned_memory(nbytes)
        host = np.frombuffer(pinned, dtype=np.uint8, count=nbytes)
    else:
        host = np.empty(nbytes, dtype=np.uint8)
    host.fill(1)  # touched: no page fault inside a measurement
    host_ptr = host.ctypes.data
    if to_device:
        dst, src, kind = device.ptr, host_ptr, cp.cuda.runtime.memcpyHostToDevice
        state.add_global_memory_writes(nbytes)
    else:
        dst, src, kind = host_ptr, device.ptr, cp.cuda.runtime.memcpyDeviceToHost
        state.add_global_memory_reads(nbytes)
    stream = cupy_stream(state.get_stream())

    def launcher(launch):
        cp.cuda.runtime.memcpyAsync(dst, src, nbytes, kind, stream.ptr)

    # A pageable copy waits on the host (see benchmarks/copy.cu): NVBench is told so.
    state.exec(launcher, sync=(memory != "pinned"))


def copy_h2d(state):
    host_copy(state, True)


def copy_d2h(state):
    host_copy(state, False)


def register_all():
    bench.register(sleep_1ms)
    bench.register(sleep_sweep).add_float64_axis("Duration", [i / 1e4 for i in range(11)])
    bench.register(launch_empty)
    bench.register(copy_d2d_kernel)
    for fn in (copy_h2d, copy_d2h):
        (bench.register(fn)
         .add_string_axis("Memory", ["pinned", "pageable"])
         .add_int64_power_of_two_axis("Bytes", [26]))


if __name__ == "__main__":
    register_all()
    bench.run_all_benchmarks(sys.argv)
