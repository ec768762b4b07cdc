// Sleep kernels: one thread waits on the GPU's global timer for a set time, so the kernel's GPU
// time is known in advance and whatever a run adds above it is overhead.
//   sleep_1ms    a fixed 1 ms sleep
//   sleep_sweep  Duration from 0 to 1 ms in steps of 0.1 ms (-a 'Duration=[...]' picks others)
#include <nvbench/nvbench.cuh>

#include <cstdint>
#include <vector>

namespace {

__device__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void wait_ns(std::uint64_t ns) {
  const std::uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < ns) {
  }
}

void launch_wait(nvbench::launch& launch, double seconds) {
  const auto ns = static_cast<std::uint64_t>(seconds * 1e9);
  wait_ns<<<1, 1, 0, launch.get_stream()>>>(ns);
  NVBENCH_CUDA_CALL(cudaGetLastError());
}

void sleep_1ms(nvbench::state& state) {
  state.exec([](nvbench::launch& launch) { launch_wait(launch, 1e-3); });
}

void sleep_sweep(nvbench::state& state) {
  const double seconds = state.get_float64("Duration");
  state.exec([seconds](nvbench::launch& launch) { launch_wait(launch, seconds); });
}

// 0, 0.1 ms, ..., 1 ms: computed as i / 10^4 so that each value prints as written.
std::vector<nvbench::float64_t> durations() {
  std::vector<nvbench::float64_t> v;
  for (int i = 0; i <= 10; ++i) v.push_back(i / 1e4);
  return v;
}

}  // namespace

NVBENCH_BENCH(sleep_1ms);
NVBENCH_BENCH(sleep_sweep).add_float64_axis("Duration", durations());
