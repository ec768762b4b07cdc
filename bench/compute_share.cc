// ivcuda-compute-share: how much compute one process gets. It launches a
// compute-bound kernel (ivc_fma_loop from the test kernels) over the whole
// GPU back to back for a fixed time and prints kernels per second, so that
// runs side by side show how the GPU is shared: time-sliced (no MPS), or
// split by MPS's active-thread percentage (ivcudad --mps, --compute-share).
// tests/gpu/run_mps_share.sh runs it natively and through ivcuda.
//   ivcuda-compute-share --ptx test_kernels.ptx [--seconds S] [--start-at UNIX_MS] [--label NAME]
//                        [--blocks N] [--iters N]
// Output: one JSON line {"label", "kernels", "seconds", "kernels_per_s", "sms"}.
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace {

const char* arg(int argc, char** argv, const char* name, const char* dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return dflt;
}

[[noreturn]] void die(const char* what, CUresult st) {
  const char* name = nullptr;
  cuGetErrorName(st, &name);
  std::fprintf(stderr, "ivcuda-compute-share: %s: %s\n", what, name != nullptr ? name : "?");
  std::exit(1);
}

#define CHECK(call)                              \
  do {                                           \
    if (CUresult st_ = (call); st_ != CUDA_SUCCESS) die(#call, st_); \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  const char* ptx_path = arg(argc, argv, "--ptx", nullptr);
  if (ptx_path == nullptr) {
    std::fprintf(stderr, "usage: ivcuda-compute-share --ptx test_kernels.ptx [--seconds S] [--start-at UNIX_MS] "
                         "[--label NAME]\n");
    return 2;
  }
  const double seconds = std::atof(arg(argc, argv, "--seconds", "5"));
  const long long start_at = std::atoll(arg(argc, argv, "--start-at", "0"));
  const std::string label = arg(argc, argv, "--label", "run");
  std::ifstream f(ptx_path);
  std::stringstream ptx;
  ptx << f.rdbuf();
  if (ptx.str().empty()) {
    std::fprintf(stderr, "ivcuda-compute-share: cannot read %s\n", ptx_path);
    return 2;
  }
  CHECK(cuInit(0));
  CUdevice dev;
  CUcontext ctx;
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CUmodule mod;
  CUfunction fn;
  CHECK(cuModuleLoadData(&mod, ptx.str().c_str()));
  CHECK(cuModuleGetFunction(&fn, mod, "ivc_fma_loop"));
  int sms = 0;  // what this process may use: under MPS, its share of the SMs
  CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  // The same work whatever the share (8192 blocks of 256 threads: several
  // waves on a whole H200), so a share of the SMs shows as proportionally
  // fewer kernels per second.
  const unsigned blocks = static_cast<unsigned>(std::atoi(arg(argc, argv, "--blocks", "8192"))), threads = 256;
  int iters = std::atoi(arg(argc, argv, "--iters", "4000"));
  CUdeviceptr out;
  CHECK(cuMemAlloc(&out, static_cast<size_t>(blocks) * threads * sizeof(float)));
  void* params[] = {&out, &iters};
  // Warm-up (module load, clocks), then wait for the common start.
  CHECK(cuLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0, nullptr, params, nullptr));
  CHECK(cuCtxSynchronize());
  if (start_at > 0) {
    const auto when = std::chrono::system_clock::time_point(std::chrono::milliseconds(start_at));
    std::this_thread::sleep_until(when);
  }
  const auto t0 = std::chrono::steady_clock::now();
  long long kernels = 0;
  double elapsed = 0;
  while (elapsed < seconds) {
    CHECK(cuLaunchKernel(fn, blocks, 1, 1, threads, 1, 1, 0, nullptr, params, nullptr));
    CHECK(cuCtxSynchronize());
    ++kernels;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::printf("{\"label\": \"%s\", \"kernels\": %lld, \"seconds\": %.3f, \"kernels_per_s\": %.3f, \"sms\": %d}\n",
              label.c_str(), kernels, elapsed, static_cast<double>(kernels) / elapsed, sms);
  cuMemFree(out);
  cuModuleUnload(mod);
  cuDevicePrimaryCtxRelease(dev);
  return 0;
}
