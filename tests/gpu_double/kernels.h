// CPU stand-ins for the test kernels of test_kernels.cu, looked up by entry name.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string_view>

#include "image.h"

namespace ivcuda::gpu_double {

// What a CPU kernel may see and touch during one launch.
struct KernelEnv {
  const PtxEntry& entry;
  const unsigned char* params;  // packed as entry.params lays them out
  unsigned grid[3];
  unsigned block[3];
  // True when [p, p + n) is memory the device could reach (an allocation, pinned or
  // registered host memory, a module global).
  std::function<bool(std::uintptr_t p, std::size_t n)> reachable;
  // The module global `name`, or null when the module has none of that size.
  std::function<unsigned char*(std::string_view name, std::size_t size)> global;

  // Reads parameter i, which must be exactly sizeof(T) bytes as the PTX declares it.
  template <class T>
  bool param(std::size_t i, T* out) const {
    if (i >= entry.params.size() || entry.params[i].size != sizeof(T)) return false;
    std::memcpy(out, params + entry.params[i].offset, sizeof(T));
    return true;
  }

  // Threads along x, which is what the 1D test kernels index with.
  std::uint64_t threads_x() const { return std::uint64_t{grid[0]} * block[0]; }
};

// CUDA_SUCCESS, CUDA_ERROR_ILLEGAL_ADDRESS or CUDA_ERROR_MISALIGNED_ADDRESS (a bad access:
// the context becomes poisoned, as on a GPU) or CUDA_ERROR_NOT_SUPPORTED (the PTX's parameter list
// is not the one the CPU version was written for).
using CpuKernel = CUresult (*)(KernelEnv& env);

// Null for an entry the double has no CPU version of.
CpuKernel find_cpu_kernel(std::string_view name);

}  // namespace ivcuda::gpu_double
