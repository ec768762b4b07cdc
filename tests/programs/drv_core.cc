// Devices, contexts, memory and copies through the Driver API, with every
// byte verified after each round trip.
#include <cudaProfiler.h>

#include <thread>

#include "check.h"

namespace {

void devices() {
  int v = 0;
  OK(cuDriverGetVersion(&v));
  EXPECT(v >= 13000);
  int n = 0;
  OK(cuDeviceGetCount(&n));
  EXPECT(n >= 1);
  CUdevice d;
  OK(cuDeviceGet(&d, 0));
  EXPECT_RES(CUDA_ERROR_INVALID_DEVICE, cuDeviceGet(&d, n));
  OK(cuDeviceGet(&d, 0));
  char name[256] = {};
  OK(cuDeviceGetName(name, sizeof name, d));
  EXPECT(std::strlen(name) > 0);
  std::printf("device 0: %s\n", name);
  CUuuid u{};
  OK(cuDeviceGetUuid(&u, d));
  bool nonzero = false;
  for (char b : u.bytes) nonzero |= b != 0;
  EXPECT(nonzero);
  size_t total = 0;
  OK(cuDeviceTotalMem(&total, d));
  EXPECT(total > (1ull << 30));
  int major = 0, minor = -1, sms = 0, warp = 0, uva = 0;
  OK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d));
  OK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d));
  OK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d));
  OK(cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, d));
  OK(cuDeviceGetAttribute(&uva, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, d));
  EXPECT(major >= 7 && minor >= 0 && sms > 0 && warp == 32 && uva == 1);
  std::printf("compute %d.%d, %d SMs\n", major, minor, sms);
  char bus[32] = {};
  OK(cuDeviceGetPCIBusId(bus, sizeof bus, d));
  EXPECT(std::strchr(bus, ':') != nullptr);
  int pci_bus = -1;
  OK(cuDeviceGetAttribute(&pci_bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d));
  EXPECT(pci_bus >= 0);
  const char* s = nullptr;
  OK(cuGetErrorName(CUDA_ERROR_INVALID_VALUE, &s));
  EXPECT(s != nullptr && std::strcmp(s, "CUDA_ERROR_INVALID_VALUE") == 0);
  OK(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s));
  EXPECT(s != nullptr && std::strlen(s) > 0);
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuGetErrorName(static_cast<CUresult>(123456), &s));
}

void contexts() {
  CUdevice d;
  OK(cuDeviceGet(&d, 0));
  unsigned flags = 99;
  int active = 99;
  OK(cuDevicePrimaryCtxGetState(d, &flags, &active));
  EXPECT(active == 0);
  // The flags set are the flags read, and setting them leaves it inactive.
  const unsigned start_flags = flags;
  OK(cuDevicePrimaryCtxSetFlags(d, CU_CTX_SCHED_SPIN));
  OK(cuDevicePrimaryCtxGetState(d, &flags, &active));
  EXPECT(flags == CU_CTX_SCHED_SPIN && active == 0);
  OK(cuDevicePrimaryCtxSetFlags(d, start_flags));
  OK(cuDevicePrimaryCtxGetState(d, &flags, &active));
  EXPECT(flags == start_flags && active == 0);
  CUcontext prim = nullptr;
  OK(cuDevicePrimaryCtxRetain(&prim, d));
  EXPECT(prim != nullptr);
  OK(cuDevicePrimaryCtxGetState(d, &flags, &active));
  EXPECT(active == 1);
  CUcontext cur = reinterpret_cast<CUcontext>(1);
  OK(cuCtxGetCurrent(&cur));
  EXPECT(cur == nullptr);  // retain does not make it current
  OK(cuCtxSetCurrent(prim));
  OK(cuCtxGetCurrent(&cur));
  EXPECT(cur == prim);
  CUdevice cd = -1;
  OK(cuCtxGetDevice(&cd));
  EXPECT(cd == d);
  OK(cuCtxSynchronize());
  size_t stack = 0, fifo = 0;
  OK(cuCtxGetLimit(&stack, CU_LIMIT_STACK_SIZE));
  EXPECT(stack > 0);
  OK(cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 4u << 20));
  OK(cuCtxGetLimit(&fifo, CU_LIMIT_PRINTF_FIFO_SIZE));
  EXPECT(fifo >= (4u << 20));
  // Flags, cache configuration, the persisting L2, whole-context events.
  unsigned cflags = 0;
  OK(cuCtxGetFlags(&cflags));
  OK(cuCtxSetFlags(CU_CTX_SCHED_BLOCKING_SYNC));
  unsigned cflags2 = 0;
  OK(cuCtxGetFlags(&cflags2));
  EXPECT((cflags2 & CU_CTX_SCHED_MASK) == CU_CTX_SCHED_BLOCKING_SYNC);
  OK(cuCtxSetFlags(cflags));
  OK(cuCtxSetCacheConfig(CU_FUNC_CACHE_PREFER_L1));
  CUfunc_cache cache = CU_FUNC_CACHE_PREFER_NONE;
  OK(cuCtxGetCacheConfig(&cache));
  std::printf("context: blocking-sync flag kept %d, cache config %d\n",
              (cflags2 & CU_CTX_SCHED_MASK) == CU_CTX_SCHED_BLOCKING_SYNC, static_cast<int>(cache));
  OK(cuCtxSetCacheConfig(CU_FUNC_CACHE_PREFER_NONE));
  OK(cuCtxResetPersistingL2Cache());
  CUevent ce = nullptr;
  OK(cuEventCreate(&ce, CU_EVENT_DEFAULT));
  OK(cuCtxRecordEvent(prim, ce));
  OK(cuCtxWaitEvent(prim, ce));
  OK(cuEventSynchronize(ce));
  std::printf("cuCtxRecordEvent on a null context: %s\n", check::name(cuCtxRecordEvent(nullptr, ce)));
  // Profiler control with no profiling tool attached (cudaProfilerStart in a program run
  // without one): the driver answers success and does nothing.
  std::printf("cuProfilerStart, cuProfilerStop without a tool: %s, %s\n", check::name(cuProfilerStart()),
              check::name(cuProfilerStop()));
  OK(cuEventDestroy(ce));

  CUcontext mine = nullptr;
  OK(cuCtxCreate(&mine, nullptr, 0, d));
  OK(cuCtxGetCurrent(&cur));
  EXPECT(cur == mine);
  CUcontext popped = nullptr;
  OK(cuCtxPopCurrent(&popped));
  EXPECT(popped == mine);
  OK(cuCtxGetCurrent(&cur));
  EXPECT(cur == prim);
  OK(cuCtxPushCurrent(mine));
  CUdeviceptr p = 0;
  OK(cuMemAlloc(&p, 4096));
  OK(cuMemFree(p));
  OK(cuCtxPopCurrent(nullptr));

  // cuCtxCreate as a program built with CUDA 12.4 or before gets it (no creation
  // parameters), and as one built with CUDA 11.4 to 12.4 (execution affinity).
  {
    using Create32 = CUresult (*)(CUcontext*, unsigned, CUdevice);
    using Create114 = CUresult (*)(CUcontext*, CUexecAffinityParam*, int, unsigned, CUdevice);
    void* fn = nullptr;
    CUdriverProcAddressQueryResult found{};
    OK(cuGetProcAddress("cuCtxCreate", &fn, 11000, CU_GET_PROC_ADDRESS_DEFAULT, &found));
    CUcontext old = nullptr;
    EXPECT(fn != nullptr);
    if (fn != nullptr) {
      OK(reinterpret_cast<Create32>(fn)(&old, 0, d));
      OK(cuCtxGetCurrent(&cur));
      EXPECT(cur == old && old != nullptr);
      OK(cuCtxDestroy(old));
    }
    OK(cuGetProcAddress("cuCtxCreate", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &found));
    EXPECT(fn != nullptr);
    if (fn != nullptr) {
      OK(reinterpret_cast<Create114>(fn)(&old, nullptr, 0, 0, d));
      OK(cuCtxDestroy(old));
    }
    std::printf("contexts made through cuCtxCreate of CUDA 11.0 and 12.0\n");
  }

  // The current context is per thread.
  std::thread t([&] {
    CUcontext c = reinterpret_cast<CUcontext>(1);
    OK(cuCtxGetCurrent(&c));
    EXPECT(c == nullptr);
    OK(cuCtxSetCurrent(mine));
    CUdeviceptr q = 0;
    OK(cuMemAlloc(&q, 1 << 20));
    std::vector<unsigned char> h(1 << 20, 0x3c), back(1 << 20);
    OK(cuMemcpyHtoD(q, h.data(), h.size()));
    OK(cuMemcpyDtoH(back.data(), q, back.size()));
    EXPECT(back == h);
    OK(cuMemFree(q));
  });
  t.join();
  OK(cuCtxGetCurrent(&cur));
  EXPECT(cur == prim);
  OK(cuCtxDestroy(mine));
  OK(cuDevicePrimaryCtxRelease(d));
  OK(cuDevicePrimaryCtxGetState(d, &flags, &active));
  EXPECT(active == 0);
  OK(cuDevicePrimaryCtxRetain(&prim, d));
  OK(cuCtxSetCurrent(prim));
}

void roundtrip(size_t n, unsigned seed, bool async, CUstream s) {
  auto h = check::random_bytes(n, seed);
  std::vector<unsigned char> back(n, 0);
  CUdeviceptr a = 0, b = 0;
  OK(cuMemAlloc(&a, n));
  OK(cuMemAlloc(&b, n));
  if (async) {
    OK(cuMemcpyHtoDAsync(a, h.data(), n, s));
    OK(cuMemcpyDtoDAsync(b, a, n, s));
    OK(cuMemcpyDtoHAsync(back.data(), b, n, s));
    OK(cuStreamSynchronize(s));
  } else {
    OK(cuMemcpyHtoD(a, h.data(), n));
    OK(cuMemcpyDtoD(b, a, n));
    OK(cuMemcpyDtoH(back.data(), b, n));
  }
  if (back != h) {
    size_t at = 0;
    while (back[at] == h[at]) ++at;
    std::fprintf(stderr, "round trip of %zu bytes (%s) differs from byte %zu on\n", n, async ? "async" : "sync", at);
  }
  EXPECT(back == h);
  OK(cuMemFree(a));
  OK(cuMemFree(b));
}

void memory() {
  size_t free_b = 0, total = 0;
  OK(cuMemGetInfo(&free_b, &total));
  EXPECT(free_b > 0 && total >= free_b);
  CUdeviceptr p = 0;
  OK(cuMemAlloc(&p, 3 << 20));
  CUdeviceptr base = 0;
  size_t size = 0;
  OK(cuMemGetAddressRange(&base, &size, p + 12345));
  EXPECT(base == p && size >= (3u << 20));

  // memsets, sync and async, checked element by element
  CUstream s;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  std::vector<unsigned char> b8(1000);
  OK(cuMemsetD8(p, 0xab, 1000));
  OK(cuMemcpyDtoH(b8.data(), p, 1000));
  EXPECT(b8 == std::vector<unsigned char>(1000, 0xab));
  std::vector<unsigned short> b16(1000);
  OK(cuMemsetD16Async(p, 0x1234, 1000, s));
  OK(cuStreamSynchronize(s));
  OK(cuMemcpyDtoH(b16.data(), p, 2000));
  EXPECT(b16 == std::vector<unsigned short>(1000, 0x1234));
  std::vector<unsigned> b32(1000);
  OK(cuMemsetD32(p, 0xdeadbeef, 1000));
  OK(cuMemsetD8Async(p, 0x11, 4, s));
  OK(cuMemsetD32Async(p + 4000, 7u, 0, s));
  OK(cuStreamSynchronize(s));
  OK(cuMemcpyDtoH(b32.data(), p, 4000));
  EXPECT(b32[0] == 0x11111111u && b32[999] == 0xdeadbeefu);
  // 2D memset: 16 rows of 100 bytes at pitch 256, leaving the gaps alone
  OK(cuMemsetD8(p, 0, 256 * 16));
  OK(cuMemsetD2D8(p, 256, 0x5a, 100, 16));
  std::vector<unsigned char> plane(256 * 16);
  OK(cuMemcpyDtoH(plane.data(), p, plane.size()));
  bool ok2d = true;
  for (size_t y = 0; y < 16; ++y)
    for (size_t x = 0; x < 256; ++x) ok2d &= plane[y * 256 + x] == (x < 100 ? 0x5a : 0);
  EXPECT(ok2d);
  OK(cuMemFree(p));

  // copies of many sizes: inline, one staging chunk, several chunks
  for (size_t n : {size_t{1}, size_t{100}, size_t{4096}, size_t{8193}, size_t{1} << 20, size_t{20} << 20})
    roundtrip(n, static_cast<unsigned>(n), false, nullptr);
  for (size_t n : {size_t{64}, size_t{100000}, size_t{9} << 20}) roundtrip(n, 7, true, s);

  // unified addressing: cuMemcpy works out each side
  const size_t n = 70000;
  auto h = check::random_bytes(n, 99);
  std::vector<unsigned char> back(n);
  CUdeviceptr d1, d2;
  OK(cuMemAlloc(&d1, n));
  OK(cuMemAlloc(&d2, n));
  OK(cuMemcpy(d1, reinterpret_cast<CUdeviceptr>(h.data()), n));
  OK(cuMemcpyAsync(d2, d1, n, s));
  OK(cuStreamSynchronize(s));
  OK(cuMemcpy(reinterpret_cast<CUdeviceptr>(back.data()), d2, n));
  EXPECT(back == h);

  // 2D copies: a 37x300 window, pageable host <-> pitched device
  size_t pitch = 0;
  CUdeviceptr img;
  OK(cuMemAllocPitch(&img, &pitch, 512, 64, 4));
  EXPECT(pitch >= 512);
  auto src = check::random_bytes(400 * 64, 5);
  CUDA_MEMCPY2D c{};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = src.data();
  c.srcPitch = 400;
  c.srcXInBytes = 3;
  c.srcY = 2;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = img;
  c.dstPitch = pitch;
  c.dstXInBytes = 10;
  c.dstY = 1;
  c.WidthInBytes = 300;
  c.Height = 37;
  OK(cuMemcpy2D(&c));
  std::vector<unsigned char> dst(300 * 37);
  CUDA_MEMCPY2D r{};
  r.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  r.srcDevice = img;
  r.srcPitch = pitch;
  r.srcXInBytes = 10;
  r.srcY = 1;
  r.dstMemoryType = CU_MEMORYTYPE_HOST;
  r.dstHost = dst.data();
  r.dstPitch = 300;
  r.WidthInBytes = 300;
  r.Height = 37;
  OK(cuMemcpy2DUnaligned(&r));
  bool same = true;
  for (size_t y = 0; y < 37; ++y)
    same &= std::memcmp(&dst[y * 300], &src[(y + 2) * 400 + 3], 300) == 0;
  EXPECT(same);

  // page-locked memory: zero-copy DMA source/target and device alias
  void* pin = nullptr;
  OK(cuMemAllocHost(&pin, 1 << 20));
  void* pin2 = nullptr;
  OK(cuMemHostAlloc(&pin2, 1 << 20, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  unsigned pf = 0;
  OK(cuMemHostGetFlags(&pf, pin2));
  EXPECT((pf & CU_MEMHOSTALLOC_DEVICEMAP) != 0);
  auto pat = check::random_bytes(1 << 20, 3);
  std::memcpy(pin, pat.data(), pat.size());
  OK(cuMemcpyHtoDAsync(d1, pin, n, s));
  OK(cuMemcpyDtoHAsync(pin2, d1, n, s));
  OK(cuStreamSynchronize(s));
  EXPECT(std::memcmp(pin2, pat.data(), n) == 0);
  CUdeviceptr alias = 0;
  OK(cuMemHostGetDevicePointer(&alias, pin, 0));
  EXPECT(alias != 0);
  // The device alias is device-accessible memory: copy from it on the device.
  OK(cuMemcpyDtoD(d2, alias + 100, 1000));
  OK(cuMemcpyDtoH(back.data(), d2, 1000));
  EXPECT(std::memcmp(back.data(), pat.data() + 100, 1000) == 0);
  // Unified addressing: a page-locked pointer is its own device pointer
  // (XLA memsets and copies through cuMemHostAlloc pointers directly).
  EXPECT(alias == reinterpret_cast<CUdeviceptr>(pin));
  OK(cuMemsetD32(reinterpret_cast<CUdeviceptr>(pin2), 0x5a5a5a5au, 4));
  OK(cuMemcpyDtoH(back.data(), reinterpret_cast<CUdeviceptr>(pin2), 16));
  EXPECT(back[0] == 0x5a && back[15] == 0x5a);
  // 2D between page-locked host and device
  CUDA_MEMCPY2D pc{};
  pc.srcMemoryType = CU_MEMORYTYPE_HOST;
  pc.srcHost = pin;
  pc.srcPitch = 1000;
  pc.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  pc.dstDevice = img;
  pc.dstPitch = pitch;
  pc.WidthInBytes = 500;
  pc.Height = 20;
  OK(cuMemcpy2DAsync(&pc, s));
  OK(cuStreamSynchronize(s));
  std::vector<unsigned char> row(500);
  OK(cuMemcpyDtoH(row.data(), img + 19 * pitch, 500));
  EXPECT(std::memcmp(row.data(), pat.data() + 19 * 1000, 500) == 0);
  OK(cuMemFreeHost(pin));
  OK(cuMemFreeHost(pin2));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemFreeHost(pin));
  OK(cuMemFree(img));
  OK(cuMemFree(d1));
  OK(cuMemFree(d2));
  OK(cuStreamDestroy(s));
}

}  // namespace

int main() {
  OK(cuInit(0));
  if (check::g_failures != 0) return check::finish("drv_core");
  devices();
  contexts();
  memory();
  return check::finish("drv_core");
}
