// Shared by the benchmark files: owning wrappers for the buffers they time, so that a state that
// throws (NVBench reports a CUDA error as an exception) frees what it allocated.
#pragma once

#include <nvbench/cuda_call.cuh>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <memory>

namespace ivcuda_nvbench {

struct DeviceFree {
  void operator()(void* p) const noexcept { cudaFree(p); }
};
struct HostFree {
  void operator()(void* p) const noexcept { cudaFreeHost(p); }
};

using DeviceBuffer = std::unique_ptr<void, DeviceFree>;
using PinnedBuffer = std::unique_ptr<void, HostFree>;

inline DeviceBuffer device_buffer(std::size_t bytes) {
  void* p = nullptr;
  NVBENCH_CUDA_CALL(cudaMalloc(&p, bytes));
  return DeviceBuffer{p};
}

// Page-locked host memory (cudaMallocHost): the copy engine reads and writes it directly. Through
// ivcuda it lives in the shared arena, which ivcudad registered with the GPU.
inline PinnedBuffer pinned_buffer(std::size_t bytes) {
  void* p = nullptr;
  NVBENCH_CUDA_CALL(cudaMallocHost(&p, bytes));
  std::memset(p, 1, bytes);
  return PinnedBuffer{p};
}

// Ordinary (pageable) host memory, touched so that no page fault lands inside a measurement.
inline std::unique_ptr<std::byte[]> pageable_buffer(std::size_t bytes) {
  auto p = std::make_unique<std::byte[]>(bytes);
  std::memset(p.get(), 1, bytes);
  return p;
}

}  // namespace ivcuda_nvbench
