// Stream-capture modes across threads, as PyTorch and XLA rely on them: one
// thread captures while another allocates. A thread-local capture must not
// restrict other threads; a global one restricts every thread that is not
// relaxed (and its capture is invalidated by their unsafe calls); a relaxed
// thread may allocate during any capture. The verdicts the driver gives are
// printed, so that the native and ivcuda runs are compared line by line.
#include <condition_variable>
#include <mutex>
#include <thread>

#include "check.h"

namespace {

CUcontext g_ctx = nullptr;

// Runs `during` on another thread while this one has a capture of `mode`
// under way on a fresh stream (with a memset captured before and after).
void scenario(const char* name, CUstreamCaptureMode capture_mode, CUstreamCaptureMode other_mode,
              bool expect_alloc_ok) {
  CUstream s;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr buf = 0;
  OK(cuMemAlloc(&buf, 4096));
  OK(cuStreamBeginCapture(s, capture_mode));
  OK(cuMemsetD32Async(buf, 1, 16, s));
  CUresult alloc_res = CUDA_SUCCESS;
  CUresult free_res = CUDA_SUCCESS;
  std::thread other([&] {
    OK(cuCtxSetCurrent(g_ctx));
    CUstreamCaptureMode m = other_mode;
    OK(cuThreadExchangeStreamCaptureMode(&m));
    CUdeviceptr d = 0;
    alloc_res = cuMemAlloc(&d, 1 << 20);
    if (alloc_res == CUDA_SUCCESS) free_res = cuMemFree(d);
    m = CU_STREAM_CAPTURE_MODE_GLOBAL;
    OK(cuThreadExchangeStreamCaptureMode(&m));
  });
  other.join();
  const CUresult rec = cuMemsetD32Async(buf, 2, 16, s);
  CUgraph g = nullptr;
  const CUresult end = cuStreamEndCapture(s, &g);
  std::printf("%s: other thread's cuMemAlloc -> %s (free %s); capture continues -> %s; end -> %s%s\n", name,
              check::name(alloc_res), check::name(free_res), check::name(rec), check::name(end),
              g != nullptr ? ", graph made" : "");
  if (expect_alloc_ok) {
    EXPECT(alloc_res == CUDA_SUCCESS);
    EXPECT(end == CUDA_SUCCESS && g != nullptr);
  }
  if (g != nullptr) OK(cuGraphDestroy(g));
  // The stream is usable again whatever happened to the capture.
  OK(cuMemsetD32Async(buf, 3, 16, s));
  OK(cuStreamSynchronize(s));
  OK(cuMemFree(buf));
  OK(cuStreamDestroy(s));
}

}  // namespace

int main() {
  OK(cuInit(0));
  CUdevice dev;
  OK(cuDeviceGet(&dev, 0));
  OK(cuDevicePrimaryCtxRetain(&g_ctx, dev));
  OK(cuCtxSetCurrent(g_ctx));
  scenario("thread-local capture, other thread global", CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
           CU_STREAM_CAPTURE_MODE_GLOBAL, true);
  scenario("thread-local capture, other thread thread-local", CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
           CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, true);
  scenario("relaxed capture, other thread global", CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_GLOBAL,
           true);
  scenario("global capture, other thread relaxed", CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_RELAXED,
           true);
  scenario("global capture, other thread global", CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL,
           false);
  // Driver 580 on the H200: a thread-local thread is not restricted by
  // another thread's global capture.
  scenario("global capture, other thread thread-local", CU_STREAM_CAPTURE_MODE_GLOBAL,
           CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, true);
  // The capturing thread itself, in its own thread-local capture.
  CUstream s;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  CUdeviceptr d = 0;
  const CUresult own = cuMemAlloc(&d, 1 << 20);
  CUgraph g = nullptr;
  const CUresult end = cuStreamEndCapture(s, &g);
  std::printf("own thread-local capture: cuMemAlloc -> %s; end -> %s\n", check::name(own), check::name(end));
  if (own == CUDA_SUCCESS) OK(cuMemFree(d));
  if (g != nullptr) OK(cuGraphDestroy(g));
  OK(cuStreamDestroy(s));
  OK(cuDevicePrimaryCtxRelease(dev));
  return check::finish("drv_capture_modes");
}
