// Copies:
//   copy_d2d_kernel  64 MiB of int32 copied by a grid-stride kernel, <<<256, 256>>>: device memory
//                    bandwidth, which forwarding must not touch
//   copy_h2d         host to device by the copy engine (cudaMemcpyAsync), from page-locked
//   copy_d2h         (cudaMallocHost) or pageable memory, Bytes (default 64 MiB) per copy
// A pageable copy stages through the driver's (or ivcuda's) page-locked buffers and so waits on
// the host: NVBench is told (exec_tag::sync), which skips its blocking kernel and the batch
// measurement for those states. Page-locked copies stay asynchronous and get both.
#include <nvbench/nvbench.cuh>

#include "common.cuh"

#include <cstddef>
#include <cstdint>
#include <string>

namespace {

using ivcuda_nvbench::device_buffer;

__global__ void copy_kernel(const std::int32_t* in, std::int32_t* out, std::size_t n) {
  const std::size_t stride = std::size_t{blockDim.x} * gridDim.x;
  for (std::size_t i = std::size_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = in[i];
}

void copy_d2d_kernel(nvbench::state& state) {
  constexpr std::size_t n = (std::size_t{64} << 20) / sizeof(std::int32_t);
  auto in = device_buffer(n * sizeof(std::int32_t));
  auto out = device_buffer(n * sizeof(std::int32_t));
  NVBENCH_CUDA_CALL(cudaMemset(in.get(), 1, n * sizeof(std::int32_t)));
  state.add_element_count(n);
  state.add_global_memory_reads<std::int32_t>(n);
  state.add_global_memory_writes<std::int32_t>(n);
  const auto* src = static_cast<const std::int32_t*>(in.get());
  auto* dst = static_cast<std::int32_t*>(out.get());
  state.exec([src, dst](nvbench::launch& launch) {
    copy_kernel<<<256, 256, 0, launch.get_stream()>>>(src, dst, n);
    NVBENCH_CUDA_CALL(cudaGetLastError());
  });
}

// One host<->device copy benchmark; `to_device` picks the direction.
void host_copy(nvbench::state& state, bool to_device) {
  const auto bytes = static_cast<std::size_t>(state.get_int64("Bytes"));
  const std::string& memory = state.get_string("Memory");
  auto device = device_buffer(bytes);
  ivcuda_nvbench::PinnedBuffer pinned;
  std::unique_ptr<std::byte[]> pageable;
  void* host = nullptr;
  if (memory == "pinned") {
    pinned = ivcuda_nvbench::pinned_buffer(bytes);
    host = pinned.get();
  } else {
    pageable = ivcuda_nvbench::pageable_buffer(bytes);
    host = pageable.get();
  }
  NVBENCH_CUDA_CALL(cudaMemset(device.get(), 1, bytes));
  // Bandwidth: the bytes that cross the bus, once - as device memory written (to the device) or
  // read (from it) - so that NVBench's figure is the copy's rate.
  if (to_device)
    state.add_global_memory_writes(bytes);
  else
    state.add_global_memory_reads(bytes);
  void* dst = to_device ? device.get() : host;
  const void* src = to_device ? static_cast<const void*>(host) : device.get();
  const auto kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  auto copy = [=](nvbench::launch& launch) {
    NVBENCH_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, kind, launch.get_stream()));
  };
  if (memory == "pinned")
    state.exec(copy);
  else
    state.exec(nvbench::exec_tag::sync, copy);
}

void copy_h2d(nvbench::state& state) { host_copy(state, true); }
void copy_d2h(nvbench::state& state) { host_copy(state, false); }

}  // namespace

NVBENCH_BENCH(copy_d2d_kernel);
NVBENCH_BENCH(copy_h2d)
    .add_string_axis("Memory", {"pinned", "pageable"})
    .add_int64_power_of_two_axis("Bytes", {26});
NVBENCH_BENCH(copy_d2h)
    .add_string_axis("Memory", {"pinned", "pageable"})
    .add_int64_power_of_two_axis("Bytes", {26});
