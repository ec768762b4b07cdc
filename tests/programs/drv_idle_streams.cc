// Streams known to be idle (guest/idle_streams.cc): a stream the host found
// idle, with no work sent since, is answered in the guest - and every answer
// must still be the driver's. The flows:
//   read back   a kernel behind a busy stream, its 4-byte result read back into
//               pageable memory, then cuStreamSynchronize (PyTorch's .item()):
//               each value right, the stream idle after;
//   busy again  an idle stream given a long kernel is NOT_READY at once;
//   context     cuCtxSynchronize makes every stream idle; a kernel in one of
//               them makes that one busy and leaves the other idle;
//   other thread  a kernel launched by another thread, whose launch returned
//               first, makes the stream NOT_READY for this one;
//   capture     an idle stream that begins capturing answers the capture's
//               error, not SUCCESS, and the capture is invalidated.
// Run with IVCUDA_CALL_STATS, the table says which of them crossed.
//
//   drv_idle_streams --ptx test_kernels.ptx [--rounds N] [--double]
//
// --double: the driver is the GPU test double, run with
// IVCUDA_GPU_DOUBLE_KERNEL_US=20000 so that a launch keeps its stream busy for
// 20 ms (there, kernels do their work inside the launch call; the short
// kernels here spin for no time). On a GPU the long kernel spins 50 ms.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "check.h"

namespace {

CUfunction g_spin, g_fill;
unsigned long long g_long_ns = 50'000'000;  // a kernel still running when the next call comes
unsigned long long g_short_ns = 20'000;     // long enough for the read back to find it running

void spin(CUstream s, unsigned long long ns) {
  void* args[] = {&ns};
  OK(cuLaunchKernel(g_spin, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr));
}

void fill(CUstream s, CUdeviceptr p, unsigned value, unsigned long long n) {
  void* args[] = {&p, &value, &n};
  OK(cuLaunchKernel(g_fill, 1, 1, 1, 32, 1, 1, 0, s, args, nullptr));
}

void read_back(CUstream s, CUdeviceptr d, int rounds) {
  int wrong = 0;
  for (int i = 0; i < rounds; ++i) {
    spin(s, g_short_ns);
    fill(s, d, 1000u + static_cast<unsigned>(i), 1);
    unsigned v = 0;
    OK(cuMemcpyDtoHAsync(&v, d, sizeof v, s));
    OK(cuStreamSynchronize(s));
    wrong += v != 1000u + static_cast<unsigned>(i);
  }
  ++check::g_checks;
  if (wrong != 0) check::fail(__FILE__, __LINE__, std::to_string(wrong) + " values read back wrong");
  OK(cuStreamQuery(s));
  std::printf("read back: %d of %d kernel results read back behind a busy stream right\n", rounds - wrong, rounds);
}

void busy_again(CUstream s) {
  OK(cuStreamSynchronize(s));
  OK(cuStreamQuery(s));
  OK(cuStreamQuery(s));
  spin(s, g_long_ns);
  EXPECT_RES(CUDA_ERROR_NOT_READY, cuStreamQuery(s));
  OK(cuStreamSynchronize(s));
  OK(cuStreamQuery(s));
  std::printf("busy again: an idle stream given a kernel is NOT_READY at once\n");
}

void whole_context(CUstream a, CUstream b) {
  spin(a, g_short_ns);
  spin(b, g_short_ns);
  OK(cuCtxSynchronize());
  OK(cuStreamQuery(a));
  OK(cuStreamQuery(b));
  OK(cuStreamQuery(nullptr));
  OK(cuStreamSynchronize(CU_STREAM_PER_THREAD));
  OK(cuCtxSynchronize());
  spin(a, g_long_ns);
  EXPECT_RES(CUDA_ERROR_NOT_READY, cuStreamQuery(a));
  OK(cuStreamQuery(b));
  OK(cuCtxSynchronize());
  OK(cuStreamQuery(a));
  std::printf("context: cuCtxSynchronize makes every stream idle, a new kernel makes its own busy\n");
}

// Another thread's launch, returned before this thread asks: the host must be asked, and the
// stream is busy. (The answer from the guest's books would be SUCCESS: this thread found the
// stream idle just before.)
void other_thread(CUcontext ctx, CUstream s) {
  int wrong = 0;
  for (int i = 0; i < 5; ++i) {
    OK(cuStreamSynchronize(s));
    OK(cuStreamQuery(s));
    std::atomic<bool> launched{false};
    std::thread t([&] {
      OK(cuCtxSetCurrent(ctx));
      spin(s, g_long_ns);
      launched.store(true, std::memory_order_release);
    });
    while (!launched.load(std::memory_order_acquire)) std::this_thread::yield();
    wrong += cuStreamQuery(s) != CUDA_ERROR_NOT_READY;
    t.join();
  }
  ++check::g_checks;
  if (wrong != 0) check::fail(__FILE__, __LINE__, std::to_string(wrong) + " of 5 queries after another thread's launch were not NOT_READY");
  OK(cuStreamSynchronize(s));
  std::printf("other thread: a stream given a kernel by another thread is NOT_READY at once\n");
}

void capture(CUstream b) {
  OK(cuStreamSynchronize(b));
  OK(cuStreamQuery(b));
  OK(cuStreamBeginCapture(b, CU_STREAM_CAPTURE_MODE_GLOBAL));
  EXPECT_RES(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuStreamQuery(b));
  CUgraph g = nullptr;
  EXPECT_RES(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(b, &g));
  EXPECT(g == nullptr);
  OK(cuStreamQuery(b));
  std::printf("capture: a capturing stream answers the capture's error\n");
}

}  // namespace

int main(int argc, char** argv) {
  const char* ptx = check::arg(argc, argv, "--ptx");
  const char* r = check::arg(argc, argv, "--rounds");
  const int rounds = r != nullptr ? std::atoi(r) : 200;
  if (ptx == nullptr || rounds < 1 || rounds > 1000000) {
    std::fprintf(stderr, "usage: drv_idle_streams --ptx test_kernels.ptx [--rounds N] [--double]\n");
    return 2;
  }
  if (check::flag(argc, argv, "--double")) g_long_ns = g_short_ns = 0;
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
  OK(cuModuleGetFunction(&g_fill, mod, "ivc_fill_u32"));
  CUstream a, b;
  OK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  OK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d = 0;
  OK(cuMemAlloc(&d, 4096));
  if (check::g_failures != 0) return check::finish("drv_idle_streams");

  read_back(a, d, rounds);
  busy_again(a);
  whole_context(a, b);
  other_thread(ctx, a);
  capture(b);

  OK(cuMemFree(d));
  OK(cuStreamDestroy(a));
  OK(cuStreamDestroy(b));
  OK(cuModuleUnload(mod));
  OK(cuDevicePrimaryCtxRelease(dev));
  return check::finish("drv_idle_streams");
}
