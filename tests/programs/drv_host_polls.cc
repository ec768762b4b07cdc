// Posted work behind a kernel that may poll host memory (guest/host_polls.cc).
// While a kernel given a pointer into page-locked memory (or a stream wait on
// such memory) may still run, a posted call returns only once the worker has
// taken its request, as a native call returns with its work queued on the GPU:
// NVBench's blocking kernel, released by a CPU store, must find the work
// queued behind it already on the GPU. Once the worker says the polling work
// is over, posted calls return at once again.
//
//   drv_host_polls --ptx test_kernels.ptx [--double] [--off]
//
// Every run checks the flows' results. --double: the driver is the GPU test
// double, which runs a kernel inside the worker's launch call: a kernel
// waiting for a store holds the worker until the store, so a launch behind it
// that waits to be taken returns only after the store (a helper thread makes
// it 40 ms after the blocking kernel's launch), and one that is posted returns
// at once. --off: the library runs with IVCUDA_HOST_POLLS=off, and no call may
// wait.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "check.h"

namespace {

constexpr unsigned long long kSpinNs = 20'000'000;     // 20 ms
constexpr auto kStoreAfter = std::chrono::milliseconds(40);
constexpr unsigned long long kWaitNs = 10'000'000'000;  // the blocking kernel's own give-up time
constexpr int kLaunches = 3;
CUfunction g_spin, g_inc, g_wait;
bool g_double = false;
bool g_off = false;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void spin(CUstream s, unsigned long long ns) {
  void* args[] = {&ns};
  OK(cuLaunchKernel(g_spin, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr));
}

// kLaunches launches of a 20 ms kernel on s return at once (double only: a
// launch that waited to be taken would have waited for the kernel too).
void expect_posted(CUstream s, const char* what) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kLaunches; ++i) spin(s, kSpinNs);
  const double ms = ms_since(t0);
  if (g_double) {
    ++check::g_checks;
    if (ms >= 0.5 * kLaunches * (kSpinNs / 1e6))
      check::fail(__FILE__, __LINE__, std::string(what) + ": launches took " + std::to_string(ms) + " ms, posted ones return at once");
  }
  std::printf("%s: posted calls return at once\n", what);
}

// Stores 1 to *flag kStoreAfter from now, from another thread.
std::thread store_later(unsigned* flag) {
  return std::thread([flag] {
    std::this_thread::sleep_for(kStoreAfter);
    std::atomic_ref<unsigned>(*flag).store(1, std::memory_order_release);
  });
}

// The call right after work that waits for a CPU store: on the double it
// returns only once the store came (it waited to be taken) unless --off.
void expect_taken_after_store(CUstream s, std::chrono::steady_clock::time_point launched, const char* what) {
  spin(s, 0);
  const double ms = ms_since(launched);
  if (g_double) {
    const bool waited = ms >= 0.75 * static_cast<double>(kStoreAfter.count());
    ++check::g_checks;
    if (waited == g_off)
      check::fail(__FILE__, __LINE__, std::string(what) + ": the next launch returned " + std::to_string(ms) +
                                          " ms after the blocking work's, expected " +
                                          (g_off ? "at once" : "after the store"));
  }
  std::printf("%s: the next posted call %s\n", what, g_off ? "returns at once" : "waits to be taken");
}

unsigned load(const unsigned* p) { return std::atomic_ref<unsigned>(*const_cast<unsigned*>(p)).load(); }

// A blocking kernel on `flag` (its answer in `out`), released by a store 40 ms later.
void blocked_kernel(CUstream a, CUstream b, unsigned* flag, CUdeviceptr dflag, unsigned* out, CUdeviceptr dout,
                    const char* what) {
  std::atomic_ref<unsigned>(*flag).store(0);
  std::atomic_ref<unsigned>(*out).store(0);
  unsigned long long timeout = kWaitNs;
  void* args[] = {&dflag, &dout, &timeout};
  const auto t0 = std::chrono::steady_clock::now();
  OK(cuLaunchKernel(g_wait, 1, 1, 1, 1, 1, 1, 0, a, args, nullptr));
  std::thread t = store_later(flag);
  expect_taken_after_store(b, t0, what);
  t.join();
  OK(cuStreamSynchronize(b));
  // No synchronisation of `a`: the worker says the kernel is over.
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  expect_posted(b, (std::string(what) + ", over").c_str());
  OK(cuStreamSynchronize(a));
  OK(cuStreamSynchronize(b));
  ++check::g_checks;
  if (load(out) != 2) check::fail(__FILE__, __LINE__, std::string(what) + ": the blocking kernel saw the store");
}

}  // namespace

int main(int argc, char** argv) {
  const char* ptx = check::arg(argc, argv, "--ptx");
  if (ptx == nullptr) {
    std::fprintf(stderr, "usage: drv_host_polls --ptx test_kernels.ptx [--double] [--off]\n");
    return 2;
  }
  g_double = check::flag(argc, argv, "--double");
  g_off = check::flag(argc, argv, "--off");
  OK(cuInit(0));
  CUdevice dev;
  OK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  const std::string image = check::read_file(ptx);
  CUmodule mod;
  OK(cuModuleLoadData(&mod, image.c_str()));
  OK(cuModuleGetFunction(&g_spin, mod, "ivc_spin_ns"));
  OK(cuModuleGetFunction(&g_inc, mod, "ivc_inc_u32"));
  OK(cuModuleGetFunction(&g_wait, mod, "ivc_wait_flag"));
  CUstream a, b;
  OK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  OK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  if (check::g_failures != 0) return check::finish("drv_host_polls");

  // A registered word and a page-locked allocation, both mapped.
  alignas(64) static unsigned word[16];
  OK(cuMemHostRegister(word, sizeof word, CU_MEMHOSTREGISTER_DEVICEMAP));
  CUdeviceptr dword = 0;
  OK(cuMemHostGetDevicePointer(&dword, word, 0));
  void* pinned = nullptr;
  OK(cuMemHostAlloc(&pinned, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
  CUdeviceptr dpinned = 0;
  OK(cuMemHostGetDevicePointer(&dpinned, pinned, 0));
  CUdeviceptr ddev = 0;
  OK(cuMemAlloc(&ddev, 4096));
  OK(cuMemsetD8(ddev, 0, 4096));

  expect_posted(a, "no kernel on host memory yet");
  OK(cuStreamSynchronize(a));
  // A kernel on device memory only: nothing waits.
  void* dargs[] = {&ddev};
  OK(cuLaunchKernel(g_inc, 1, 1, 1, 1, 1, 1, 0, a, dargs, nullptr));
  expect_posted(a, "after a kernel on device memory");
  OK(cuStreamSynchronize(a));

  // Blocking kernels on registered memory and on cuMemHostAlloc memory, by
  // their device pointers.
  blocked_kernel(a, b, &word[0], dword, &word[1], dword + sizeof(unsigned), "a kernel waiting on registered memory");
  auto* pw = static_cast<unsigned*>(pinned);
  blocked_kernel(a, b, &pw[0], dpinned, &pw[1], dpinned + sizeof(unsigned), "a kernel waiting on cuMemHostAlloc memory");

  // A stream wait on a registered word, released by the CPU.
  std::atomic_ref<unsigned>(word[4]).store(0);
  const auto t0 = std::chrono::steady_clock::now();
  OK(cuStreamWaitValue32(a, dword + 4 * sizeof(unsigned), 1, CU_STREAM_WAIT_VALUE_GEQ));
  std::thread t = store_later(&word[4]);
  expect_taken_after_store(b, t0, "a stream wait on registered memory");
  t.join();
  OK(cuCtxSynchronize());
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  expect_posted(b, "a stream wait on registered memory, over");
  OK(cuCtxSynchronize());

  OK(cuMemHostUnregister(word));
  OK(cuMemFreeHost(pinned));
  OK(cuMemFree(ddev));
  OK(cuStreamDestroy(a));
  OK(cuStreamDestroy(b));
  OK(cuModuleUnload(mod));
  OK(cuDevicePrimaryCtxRelease(dev));
  return check::finish("drv_host_polls");
}
