// Bad input gets the right CUresult and the process keeps working; an
// asynchronous error surfaces at the next synchronising call.
//   drv_errors --ptx test_kernels.ptx [--fault]
//   drv_errors --call-unsupported   (ivcuda only) calls a function ivcuda never forwards, twice
#include "check.h"

int main(int argc, char** argv) {
  const char* ptx = check::arg(argc, argv, "--ptx");
  bool fault = false, spin = false, expect_loss = false, expect_no_device = false, forged = false,
       unsupported = false;
  for (int i = 1; i < argc; ++i) {
    fault |= std::strcmp(argv[i], "--fault") == 0;
    spin |= std::strcmp(argv[i], "--spin-forever") == 0;
    expect_loss |= std::strcmp(argv[i], "--expect-daemon-loss") == 0;
    expect_no_device |= std::strcmp(argv[i], "--expect-no-device") == 0;
    forged |= std::strcmp(argv[i], "--forged-handles") == 0;
    unsupported |= std::strcmp(argv[i], "--call-unsupported") == 0;
  }
  if (unsupported) {
    // Graphics interop has no place in a guest: ivcuda answers NOT_SUPPORTED
    // (and lists the calls at exit under IVCUDA_LOG_UNSUPPORTED).
    OK(cuInit(0));
    EXPECT_RES(CUDA_ERROR_NOT_SUPPORTED, cuGraphicsUnregisterResource(nullptr));
    EXPECT_RES(CUDA_ERROR_NOT_SUPPORTED, cuGraphicsUnregisterResource(nullptr));
    return check::finish("drv_errors --call-unsupported");
  }
  if (expect_no_device) {
    // No GPU service reachable: cuInit says so, promptly, like a machine
    // without a GPU.
    EXPECT_RES(CUDA_ERROR_NO_DEVICE, cuInit(0));
    return check::finish("drv_errors --expect-no-device");
  }
  if (spin) {
    // Keeps calls in flight until killed, or until the daemon goes away
    // (then every call must fail promptly with DEVICE_UNAVAILABLE).
    OK(cuInit(0));
    CUdevice dev;
    CUcontext c;
    OK(cuDeviceGet(&dev, 0));
    OK(cuDevicePrimaryCtxRetain(&c, dev));
    OK(cuCtxSetCurrent(c));
    const size_t n = 8 << 20;
    std::vector<unsigned char> a(n, 0x42), b(n);
    CUdeviceptr dp = 0;
    OK(cuMemAlloc(&dp, n));
    if (check::g_failures != 0) return check::finish("drv_errors --spin-forever");
    std::printf("ready\n");  // a test that kills us waits for this line
    std::fflush(stdout);
    for (;;) {
      CUresult r = cuMemcpyHtoD(dp, a.data(), n);
      if (r == CUDA_SUCCESS) r = cuMemcpyDtoH(b.data(), dp, n);
      if (r != CUDA_SUCCESS) {
        std::printf("call failed: %s\n", check::name(r));
        if (!expect_loss) return 1;
        EXPECT_RES(CUDA_ERROR_DEVICE_UNAVAILABLE, r);
        EXPECT_RES(CUDA_ERROR_DEVICE_UNAVAILABLE, cuCtxSynchronize());
        return check::finish("drv_errors --expect-daemon-loss");
      }
    }
  }
  CUdevice d;
  EXPECT_RES(CUDA_ERROR_NOT_INITIALIZED, cuDeviceGet(&d, 0));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuInit(1));
  OK(cuInit(0));
  OK(cuDeviceGet(&d, 0));
  EXPECT_RES(CUDA_ERROR_INVALID_DEVICE, cuDeviceGet(&d, -1));
  CUdeviceptr p = 0;
  EXPECT_RES(CUDA_ERROR_INVALID_CONTEXT, cuMemAlloc(&p, 16));  // no context yet
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, d));
  OK(cuCtxSetCurrent(ctx));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemAlloc(&p, 0));
  OK(cuMemAlloc(&p, 4096));
  std::vector<unsigned char> h(8192, 1);
  // copies that run past the allocation, or to memory this process does not own
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD(p, h.data(), 8192));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH(h.data(), p + 4000, 200));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemFree(p + 8));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemsetD32(p, 0, 2000));
  // the allocation is intact and usable after all that
  OK(cuMemsetD8(p, 7, 4096));
  OK(cuMemcpyDtoH(h.data(), p, 4096));
  EXPECT(h[0] == 7 && h[4095] == 7);
  if (forged) {
    // Forged handles: the real driver dereferences them (and crashes), so
    // this part runs only through ivcuda, which must refuse them.
    CUstream bogus_s = reinterpret_cast<CUstream>(0x5151515151515151ull);
    CUevent bogus_e = reinterpret_cast<CUevent>(0x5252525252525252ull);
    EXPECT_RES(CUDA_ERROR_INVALID_HANDLE, cuStreamSynchronize(bogus_s));
    EXPECT_RES(CUDA_ERROR_INVALID_HANDLE, cuEventRecord(bogus_e, nullptr));
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemFreeHost(h.data()));
  }
  CUmodule m = nullptr;
  EXPECT_RES(CUDA_ERROR_FILE_NOT_FOUND, cuModuleLoad(&m, "/nonexistent/kernels.ptx"));
  const char junk[] = "this is not a module image";
  CUresult r = cuModuleLoadData(&m, junk);
  EXPECT(r != CUDA_SUCCESS);
  // a posted (asynchronous) copy that the host refuses: its error comes back
  // at the next synchronising call, as CUDA reports asynchronous errors
  std::vector<unsigned char> big(64);
  r = cuMemcpyHtoDAsync(p + 4090, big.data(), 64, nullptr);
  const CUresult sync = cuCtxSynchronize();
  EXPECT(r != CUDA_SUCCESS || sync != CUDA_SUCCESS);
  OK(cuCtxSynchronize());  // reported once, not sticky
  // Zero-byte copies and memsets at null or at memory nobody allocated (XLA issues them for
  // empty buffers): the answers, and what the next synchronisations report. The GPU suite
  // compares these lines with the driver's.
  CUstream zs;
  OK(cuStreamCreate(&zs, CU_STREAM_NON_BLOCKING));
  const struct {
    const char* what;
    CUresult r;
  } zero[] = {
      {"cuMemcpyDtoDAsync(0, 0, 0)", cuMemcpyDtoDAsync(0, 0, 0, zs)},
      {"cuMemcpyDtoD(0, 0, 0)", cuMemcpyDtoD(0, 0, 0)},
      {"cuMemcpyDtoDAsync(p, 0x80, 0)", cuMemcpyDtoDAsync(p, 0x80, 0, zs)},
      {"cuMemcpyHtoDAsync(0, host, 0)", cuMemcpyHtoDAsync(0, h.data(), 0, zs)},
      {"cuMemcpyDtoHAsync(host, 0, 0)", cuMemcpyDtoHAsync(h.data(), 0, 0, zs)},
      {"cuMemcpyAsync(0, 0, 0)", cuMemcpyAsync(0, 0, 0, zs)},
      {"cuMemsetD8Async(0x80, 0, 0)", cuMemsetD8Async(0x80, 0, 0, zs)},
      {"cuMemsetD32(0, 0, 0)", cuMemsetD32(0, 0, 0)},
  };
  for (const auto& z : zero) std::printf("zero bytes: %s -> %s\n", z.what, check::name(z.r));
  const CUresult zsync = cuStreamSynchronize(zs);
  std::printf("zero bytes: then cuStreamSynchronize -> %s, cuCtxSynchronize -> %s\n", check::name(zsync),
              check::name(cuCtxSynchronize()));
  // A memset recorded into a capture at a placeholder address (XLA traces command buffers so,
  // with buffers at small addresses, and updates the graph before it runs): recorded, as the
  // driver records it; the graph is never launched.
  OK(cuStreamBeginCapture(zs, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  const CUresult placeholder = cuMemsetD8Async(0x80, 0, 802816, zs);
  CUgraph zg = nullptr;
  const CUresult ended = cuStreamEndCapture(zs, &zg);
  std::printf("capture: a memset at placeholder 0x80 -> %s, end of capture -> %s\n", check::name(placeholder),
              check::name(ended));
  EXPECT(placeholder == CUDA_SUCCESS && ended == CUDA_SUCCESS);
  if (zg != nullptr) OK(cuGraphDestroy(zg));
  if (forged) {
    // Through ivcuda only: outside the placeholder region the worker refuses it, capture or not
    // (the driver would record it; the worker never records work at memory it does not own).
    OK(cuStreamBeginCapture(zs, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemsetD8Async(0x7f0000001000ull, 0, 4096, zs));
    zg = nullptr;
    (void)cuStreamEndCapture(zs, &zg);
    if (zg != nullptr) OK(cuGraphDestroy(zg));
  }
  OK(cuStreamDestroy(zs));
  // GPU core dump settings, as a driver reads them by default; the error log's entry points.
  bool on_exception = true, trigger_host = false, lightweight = true;
  int gen_flags = -1;
  char file[1024] = {};
  size_t bsz = sizeof(bool), isz = sizeof(int), fsz = sizeof file;
  OK(cuCoredumpGetAttribute(CU_COREDUMP_ENABLE_ON_EXCEPTION, &on_exception, &bsz));
  OK(cuCoredumpGetAttribute(CU_COREDUMP_TRIGGER_HOST, &trigger_host, &bsz));
  OK(cuCoredumpGetAttributeGlobal(CU_COREDUMP_LIGHTWEIGHT, &lightweight, &bsz));
  OK(cuCoredumpGetAttribute(CU_COREDUMP_GENERATION_FLAGS, &gen_flags, &isz));
  OK(cuCoredumpGetAttribute(CU_COREDUMP_FILE, file, &fsz));
  std::printf("core dumps: on exception %d, trigger host %d, lightweight %d, flags %d\n", on_exception, trigger_host,
              lightweight, gen_flags);
  CUlogIterator it = 0;
  OK(cuLogsCurrent(&it, 0));
  OK(cuLogsCurrent(&it, 1));  // the driver ignores the reserved flags (measured on the H200)
  if (forged) {
    // Through ivcuda: core dumps stay off (the default file is named as the driver documents
    // it), and a failed call is in the log and its callback.
    EXPECT(std::strncmp(file, "core.cuda.", 10) == 0);
    bool yes = true;
    EXPECT_RES(CUDA_ERROR_NOT_PERMITTED, cuCoredumpSetAttribute(CU_COREDUMP_ENABLE_ON_EXCEPTION, &yes, &bsz));
    bool no = false;
    OK(cuCoredumpSetAttributeGlobal(CU_COREDUMP_ENABLE_ON_EXCEPTION, &no, &bsz));
    static int seen = 0;
    CUlogsCallbackHandle cb = nullptr;
    OK(cuLogsRegisterCallback([](void*, CUlogLevel, char*, size_t) { ++seen; }, nullptr, &cb));
    CUdeviceptr none = 0;
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemAlloc(&none, 0));
    char logbuf[4096];
    size_t logsz = sizeof logbuf;
    OK(cuLogsDumpToMemory(&it, logbuf, &logsz, 0));
    EXPECT(logsz > 0 && std::strstr(logbuf, "cuMemAlloc") != nullptr && seen == 1);
    OK(cuLogsUnregisterCallback(cb));
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuLogsUnregisterCallback(cb));
  }
  OK(cuMemFree(p));
  if (fault && ptx != nullptr) {
    // A kernel that writes through a wild pointer: the launch is posted;
    // the fault is reported by the next synchronising call.
    OK(cuModuleLoad(&m, ptx));
    CUfunction f;
    OK(cuModuleGetFunction(&f, m, "ivc_fault"));
    CUdeviceptr wild = 0x10;
    void* args[] = {&wild};
    OK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
    EXPECT_RES(CUDA_ERROR_ILLEGAL_ADDRESS, cuCtxSynchronize());
  }
  return check::finish("drv_errors");
}
