// Profiler control (cuProfilerStart, cuProfilerStop), answered in the guest.
// A profiling tool (Nsight Systems, Nsight Compute) attaches to the process
// that holds the driver, the worker on the host, which a guest's program
// cannot reach; so in the guest these do what the driver does when no tool is
// attached: nothing, with CUDA_SUCCESS for a thread that has a current
// context (cudaProfilerStart in a program that is run without a profiler, as
// PyTorch's and many benchmarks' code does). cuProfilerInitialize answers
// CUDA_ERROR_NOT_SUPPORTED, as the driver has since CUDA 12.0 (measured on the
// H100 too).
#include <cuda.h>
#include <cudaProfiler.h>

#include "guest/guard.h"
#include "guest/internal.h"

using ivcuda::guest::guard;
using ivcuda::guest::Runtime;

namespace {

CUresult no_tool_attached() {
  return guard([&] {
    NEED_RT();
    (void)rt;
    NEED_CTX();
    (void)ctx;
    return CUDA_SUCCESS;
  });
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuProfilerStart(void) { return no_tool_attached(); }
CUresult CUDAAPI cuProfilerStop(void) { return no_tool_attached(); }
CUresult CUDAAPI cuProfilerInitialize(const char*, const char*, CUoutput_mode) { return CUDA_ERROR_NOT_SUPPORTED; }

}  // extern "C"
