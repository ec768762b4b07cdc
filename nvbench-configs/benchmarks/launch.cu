// The smallest task: one empty kernel. Its cold CPU time is the whole submit-to-completion path
// (what forwarding adds shows here first); its batch GPU time is the launch rate, back to back.
#include <nvbench/nvbench.cuh>

namespace {

__global__ void empty_kernel() {}

void launch_empty(nvbench::state& state) {
  state.exec([](nvbench::launch& launch) {
    empty_kernel<<<1, 1, 0, launch.get_stream()>>>();
    NVBENCH_CUDA_CALL(cudaGetLastError());
  });
}

}  // namespace

NVBENCH_BENCH(launch_empty);
