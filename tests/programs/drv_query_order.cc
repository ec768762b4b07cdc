// cuMemGetInfo answers without waiting for the work queued before it, as the
// driver does. A kernel that waits for a flag in page-locked memory holds the
// stream; N launches of a kernel that increments a page-locked counter queue
// behind it; then cuMemGetInfo, while another thread sets the flag 0.2 s
// later. The counter the query finds is below N. Through ivcuda the query
// travels on a channel of its own and the worker takes it ahead of the
// queued launches (abi::kRecUnordered): with the GPU test double, which runs
// each kernel when the worker issues it (the waiting one blocks the worker),
// a query kept in order would find all N done; on a GPU the kernels run after
// their launch either way. Tried again, with a longer wait, if a run's flag
// came before its query.
// The counter and flag are page-locked memory, so ivcuda would otherwise wait
// for each launch to be taken (a kernel that may poll host memory:
// guest/host_polls.cc); IVCUDA_HOST_POLLS=off, set here before the first
// CUDA call, keeps them posted (natively it means nothing).
// usage: drv_query_order --ptx test_kernels.ptx
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "check.h"

int main(int argc, char** argv) {
  const char* ptx = check::arg(argc, argv, "--ptx");
  if (ptx == nullptr) {
    std::fprintf(stderr, "usage: drv_query_order --ptx test_kernels.ptx\n");
    return 2;
  }
  ::setenv("IVCUDA_HOST_POLLS", "off", 1);
  OK(cuInit(0));
  CUdevice dev;
  OK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  const std::string image = check::read_file(ptx);
  CUmodule mod;
  OK(cuModuleLoadData(&mod, image.data()));
  CUfunction inc, wait;
  OK(cuModuleGetFunction(&inc, mod, "ivc_inc_u32"));
  OK(cuModuleGetFunction(&wait, mod, "ivc_wait_flag"));
  CUstream s;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  void* host = nullptr;
  OK(cuMemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
  auto* words = static_cast<unsigned*>(host);  // [0] counter, [16] flag, [32] the waiting kernel's answer
  CUdeviceptr d = 0;
  OK(cuMemHostGetDevicePointer(&d, host, 0));
  CUdeviceptr counter = d, flag = d + 64, out = d + 128;
  constexpr unsigned n = 200;
  bool early = false, all_ran = true;
  for (const int delay_ms : {200, 1000, 3000}) {
    for (unsigned* w : {words, words + 16, words + 32}) std::atomic_ref<unsigned>(*w).store(0);
    unsigned long long timeout_ns = 20'000'000'000ull;
    void* wait_args[] = {&flag, &out, &timeout_ns};
    OK(cuLaunchKernel(wait, 1, 1, 1, 1, 1, 1, 0, s, wait_args, nullptr));
    void* args[] = {&counter};
    for (unsigned i = 0; i < n; ++i) OK(cuLaunchKernel(inc, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr));
    std::thread release([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      std::atomic_ref<unsigned>(words[16]).store(1, std::memory_order_release);
    });
    size_t free_b = 0, total = 0;
    OK(cuMemGetInfo(&free_b, &total));
    const unsigned seen = std::atomic_ref<unsigned>(words[0]).load(std::memory_order_acquire);
    release.join();
    EXPECT(total > 0 && free_b <= total);
    OK(cuStreamSynchronize(s));
    all_ran = all_ran && std::atomic_ref<unsigned>(words[0]).load(std::memory_order_acquire) == n &&
              std::atomic_ref<unsigned>(words[32]).load() == 2;
    if (seen < n) {
      early = true;
      break;
    }
  }
  EXPECT(all_ran);
  EXPECT(early);
  std::printf("cuMemGetInfo answered before the work queued ahead of it was over: %s\n", early ? "yes" : "no");
  std::printf("every queued launch ran: %s\n", all_ran ? "yes" : "no");
  OK(cuMemFreeHost(host));
  OK(cuStreamDestroy(s));
  OK(cuModuleUnload(mod));
  OK(cuDevicePrimaryCtxRelease(dev));
  return check::finish("drv_query_order");
}
