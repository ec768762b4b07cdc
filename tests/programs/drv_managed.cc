// Managed memory (cuMemAllocManaged) as programs use it, within what CUDA
// promises on every device, with or without concurrent managed access: the
// CPU touches managed memory only once the GPU work that may use it is
// synchronised.
//   basics      the CPU fills two arrays, a kernel adds them into a third, the
//               CPU checks it; the CPU then changes a few scattered elements
//               and the kernel runs again; sizes not a multiple of a page;
//   copies      cuMemcpyHtoD / DtoH / DtoD / cuMemcpy / cuMemcpy2D with managed
//               memory on either side, also as the "host" pointer; a memset of
//               part of an array the CPU wrote around it;
//   large       64 MiB written by the CPU, overwritten by a kernel, read back;
//   threads     four threads read and write parts of an array a kernel wrote;
//   graph       a captured kernel replayed after the CPU changed its input;
//   attributes  pointer attributes, address range, device attribute;
//   advice      cuMemAdvise and cuMemRangeGetAttribute(s), prefetches both ways;
//   attach      CU_MEM_ATTACH_HOST memory attached to one stream;
//   refusals    sizes, flags, locations, interior frees.
//
//   drv_managed --ptx test_kernels.ptx
#include <cuda.h>

#include <atomic>
#include <thread>
#include <vector>

#include "check.h"

namespace {

struct Kernels {
  CUfunction add = nullptr;   // ivc_vec_add(a, b, c, n): c = a + b
  CUfunction fill = nullptr;  // ivc_fill_u32(p, value, n)
};

void launch_add(const Kernels& k, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, int n, CUstream s) {
  void* args[] = {&a, &b, &c, &n};
  OK(cuLaunchKernel(k.add, static_cast<unsigned>((n + 255) / 256), 1, 1, 256, 1, 1, 0, s, args, nullptr));
}

void launch_fill(const Kernels& k, CUdeviceptr p, unsigned v, unsigned long long n, CUstream s) {
  void* args[] = {&p, &v, &n};
  OK(cuLaunchKernel(k.fill, 256, 1, 1, 256, 1, 1, 0, s, args, nullptr));
}

float* host(CUdeviceptr p) { return reinterpret_cast<float*>(p); }

int count_wrong(const float* got, const std::vector<float>& want) {
  int wrong = 0;
  for (size_t i = 0; i < want.size(); ++i) wrong += got[i] != want[i];
  return wrong;
}

#define EXPECT_SAME(got, want)                                                                      \
  do {                                                                                              \
    ++check::g_checks;                                                                              \
    const int w_ = count_wrong((got), (want));                                                      \
    if (w_ != 0) check::fail(__FILE__, __LINE__, std::to_string(w_) + " elements wrong: " #got); \
  } while (0)

void basics(const Kernels& k) {
  const int n = (5 << 18) + 3;  // 5 MiB and 12 bytes: not a whole page
  const size_t bytes = n * sizeof(float);
  CUdeviceptr a, b, c;
  OK(cuMemAllocManaged(&a, bytes, CU_MEM_ATTACH_GLOBAL));
  OK(cuMemAllocManaged(&b, bytes, CU_MEM_ATTACH_GLOBAL));
  OK(cuMemAllocManaged(&c, bytes, CU_MEM_ATTACH_GLOBAL));
  if (check::g_failures != 0) return;
  std::vector<float> want(n);
  for (int i = 0; i < n; ++i) {
    host(a)[i] = static_cast<float>(i % 1000);
    host(b)[i] = 0.5f * static_cast<float>(i % 7);
    want[i] = host(a)[i] + host(b)[i];
  }
  launch_add(k, a, b, c, n, nullptr);
  OK(cuCtxSynchronize());
  EXPECT_SAME(host(c), want);
  // Scattered writes by the CPU to the inputs, then the kernel again.
  for (int i = 0; i < n; i += 40009) {
    host(a)[i] = -1.0f;
    want[i] = -1.0f + host(b)[i];
  }
  host(b)[n - 1] = 100.0f;
  want[n - 1] = host(a)[n - 1] + 100.0f;
  launch_add(k, a, b, c, n, nullptr);
  OK(cuCtxSynchronize());
  EXPECT_SAME(host(c), want);
  // The inputs kept the CPU's writes.
  EXPECT(host(a)[0] == -1.0f && host(b)[n - 1] == 100.0f && host(a)[1] == 1.0f);
  std::printf("basics: %d elements added twice, the CPU's writes in between seen\n", n);
  OK(cuMemFree(a));
  OK(cuMemFree(b));
  OK(cuMemFree(c));
}

void copies() {
  const int n = 300000;
  const size_t bytes = n * sizeof(float);
  CUdeviceptr m, d;
  OK(cuMemAllocManaged(&m, bytes, CU_MEM_ATTACH_GLOBAL));
  OK(cuMemAlloc(&d, bytes));
  if (check::g_failures != 0) return;
  std::vector<float> src(n), back(n);
  for (int i = 0; i < n; ++i) src[i] = static_cast<float>(i) * 0.25f;
  // Host to managed, read by the CPU.
  OK(cuMemcpyHtoD(m, src.data(), bytes));
  OK(cuCtxSynchronize());
  EXPECT_SAME(host(m), src);
  // The CPU changes it; managed to host and managed to device see the change.
  host(m)[7] = 7000.0f;
  src[7] = 7000.0f;
  OK(cuMemcpyDtoH(back.data(), m, bytes));
  EXPECT_SAME(back.data(), src);
  OK(cuMemcpyDtoD(d, m, bytes));
  std::fill(back.begin(), back.end(), 0.0f);
  OK(cuMemcpyDtoH(back.data(), d, bytes));
  EXPECT_SAME(back.data(), src);
  // Managed memory passed as the host side of a copy.
  host(m)[8] = 8000.0f;
  src[8] = 8000.0f;
  OK(cuMemcpyHtoD(d, host(m), bytes));
  OK(cuMemcpyDtoH(back.data(), d, bytes));
  EXPECT_SAME(back.data(), src);
  for (auto& v : src) v += 1.0f;
  OK(cuMemcpyHtoD(d, src.data(), bytes));
  OK(cuMemcpyDtoH(host(m), d, bytes));
  OK(cuCtxSynchronize());
  EXPECT_SAME(host(m), src);
  // cuMemcpy with unified addressing, both ways.
  host(m)[9] = 9000.0f;
  src[9] = 9000.0f;
  OK(cuMemcpy(d, m, bytes));
  OK(cuMemcpyDtoH(back.data(), d, bytes));
  EXPECT_SAME(back.data(), src);
  // A memset of the middle of an array the CPU wrote all over: the CPU's
  // bytes around it stay.
  for (int i = 0; i < n; ++i) host(m)[i] = static_cast<float>(n - i);
  const int from = 1000, count = 100000;
  unsigned bits;
  const float v = 3.5f;
  std::memcpy(&bits, &v, sizeof bits);
  OK(cuMemsetD32(m + from * sizeof(float), bits, count));
  OK(cuCtxSynchronize());
  std::vector<float> want(n);
  for (int i = 0; i < n; ++i) want[i] = i >= from && i < from + count ? 3.5f : static_cast<float>(n - i);
  EXPECT_SAME(host(m), want);
  // A 2D copy out of managed memory (device type) into device memory.
  CUDA_MEMCPY2D c2{};
  c2.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
  c2.srcDevice = m;
  c2.srcPitch = 1000 * sizeof(float);
  c2.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c2.dstDevice = d;
  c2.dstPitch = 500 * sizeof(float);
  c2.WidthInBytes = 500 * sizeof(float);
  c2.Height = 200;
  host(m)[1000 * 199 + 499] = -2.0f;  // the last element the copy takes
  OK(cuMemcpy2D(&c2));
  OK(cuMemcpyDtoH(back.data(), d, 500 * 200 * sizeof(float)));
  int wrong = 0;
  for (int r = 0; r < 200; ++r)
    for (int x = 0; x < 500; ++x) wrong += back[r * 500 + x] != host(m)[r * 1000 + x];
  EXPECT(wrong == 0);
  EXPECT(back[199 * 500 + 499] == -2.0f);
  std::printf("copies: HtoD, DtoH, DtoD, cuMemcpy and 2D with managed memory, a memset inside CPU writes\n");
  OK(cuMemFree(m));
  OK(cuMemFree(d));
}

void large(const Kernels& k) {
  const size_t n = size_t{16} << 20;  // 64 MiB of u32
  CUdeviceptr m;
  OK(cuMemAllocManaged(&m, n * 4, CU_MEM_ATTACH_GLOBAL));
  if (check::g_failures != 0) return;
  auto* p = reinterpret_cast<unsigned*>(m);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<unsigned>(i);
  unsigned long long sum = 0;
  for (size_t i = 0; i < n; ++i) sum += p[i];
  EXPECT(sum == (n - 1) * n / 2);
  launch_fill(k, m + 4096, 0xabcdu, n - 1024, nullptr);  // all but the first 4 KiB
  OK(cuCtxSynchronize());
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += p[i] != (i < 1024 ? static_cast<unsigned>(i) : 0xabcdu);
  EXPECT(wrong == 0);
  std::printf("large: 64 MiB written by the CPU, overwritten by a kernel past its first page, read back\n");
  OK(cuMemFree(m));
}

void threads(const Kernels& k) {
  const size_t n = size_t{4} << 20;
  CUdeviceptr m;
  OK(cuMemAllocManaged(&m, n * 4, CU_MEM_ATTACH_GLOBAL));
  if (check::g_failures != 0) return;
  launch_fill(k, m, 5u, n, nullptr);
  OK(cuCtxSynchronize());
  auto* p = reinterpret_cast<unsigned*>(m);
  std::atomic<size_t> wrong{0};
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      size_t bad = 0;
      // Interleaved 16 KiB stripes: every thread faults on blocks the others use too.
      for (size_t i = t * 4096; i < n; i += 4 * 4096)
        for (size_t j = i; j < i + 4096 && j < n; ++j) {
          bad += p[j] != 5u;
          p[j] = static_cast<unsigned>(j) + t;
        }
      wrong += bad;
    });
  for (auto& th : ts) th.join();
  EXPECT(wrong.load() == 0);
  // The kernel sees what every thread wrote: copy it out through the device.
  std::vector<unsigned> back(n);
  OK(cuMemcpyDtoH(back.data(), m, n * 4));
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += back[i] != static_cast<unsigned>(i) + static_cast<unsigned>((i / 4096) % 4);
  EXPECT(bad == 0);
  std::printf("threads: four threads read and wrote 16 MiB a kernel had filled\n");
  OK(cuMemFree(m));
}

void graph(const Kernels& k, CUstream s) {
  const int n = 100000;
  CUdeviceptr a, b, c;
  OK(cuMemAllocManaged(&a, n * 4, CU_MEM_ATTACH_GLOBAL));
  OK(cuMemAllocManaged(&b, n * 4, CU_MEM_ATTACH_GLOBAL));
  OK(cuMemAllocManaged(&c, n * 4, CU_MEM_ATTACH_GLOBAL));
  if (check::g_failures != 0) return;
  for (int i = 0; i < n; ++i) {
    host(a)[i] = 1.0f;
    host(b)[i] = static_cast<float>(i);
  }
  CUgraph g = nullptr;
  OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  launch_add(k, a, b, c, n, s);
  OK(cuStreamEndCapture(s, &g));
  CUgraphExec e = nullptr;
  OK(cuGraphInstantiate(&e, g, 0));
  OK(cuGraphLaunch(e, s));
  OK(cuStreamSynchronize(s));
  std::vector<float> want(n);
  for (int i = 0; i < n; ++i) want[i] = 1.0f + static_cast<float>(i);
  EXPECT_SAME(host(c), want);
  for (int i = 0; i < n; ++i) host(a)[i] = 2.0f;
  OK(cuGraphLaunch(e, s));
  OK(cuStreamSynchronize(s));
  for (int i = 0; i < n; ++i) want[i] = 2.0f + static_cast<float>(i);
  EXPECT_SAME(host(c), want);
  std::printf("graph: a captured kernel replayed after the CPU changed its input\n");
  OK(cuGraphExecDestroy(e));
  OK(cuGraphDestroy(g));
  OK(cuMemFree(a));
  OK(cuMemFree(b));
  OK(cuMemFree(c));
}

void attributes(CUdevice dev) {
  int v = -1;
  OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, dev));
  EXPECT(v == 1);
  int concurrent = -1;
  OK(cuDeviceGetAttribute(&concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, dev));
  EXPECT(concurrent == 0 || concurrent == 1);
  const size_t bytes = 10000;
  CUdeviceptr m;
  OK(cuMemAllocManaged(&m, bytes, CU_MEM_ATTACH_GLOBAL));
  if (check::g_failures != 0) return;
  unsigned managed = 0;
  OK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, m + 100));
  EXPECT(managed == 1);
  CUdeviceptr dp = 0;
  OK(cuPointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, m + 100));
  EXPECT(dp == m + 100);
  void* hp = nullptr;
  OK(cuPointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, m + 100));
  EXPECT(hp == reinterpret_cast<void*>(m + 100));
  unsigned type = 0;
  OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, m));
  EXPECT(type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_HOST);
  CUdeviceptr base = 0;
  size_t size = 0;
  OK(cuMemGetAddressRange(&base, &size, m + 5000));
  EXPECT(base == m && size >= bytes);
  CUdeviceptr d;
  OK(cuMemAlloc(&d, 4096));
  managed = 7;
  OK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, d));
  EXPECT(managed == 0);
  std::printf("attributes: managed memory is managed, device and host pointer alike; device memory is not\n");
  OK(cuMemFree(d));
  OK(cuMemFree(m));
}

int range_int(CUmem_range_attribute a, CUdeviceptr p, size_t n) {
  int v = -99;
  OK(cuMemRangeGetAttribute(&v, sizeof v, a, p, n));
  return v;
}

void advice(const Kernels& k, CUstream s) {
  const size_t bytes = size_t{8} << 20;
  CUdeviceptr m;
  OK(cuMemAllocManaged(&m, bytes, CU_MEM_ATTACH_GLOBAL));
  if (check::g_failures != 0) return;
  const CUmemLocation dev0{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  const CUmemLocation cpu{CU_MEM_LOCATION_TYPE_HOST, 0};
  EXPECT(range_int(CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, bytes) == 0);
  OK(cuMemAdvise(m, bytes / 2, CU_MEM_ADVISE_SET_READ_MOSTLY, dev0));
  EXPECT(range_int(CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, bytes / 2) == 1);
  EXPECT(range_int(CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, bytes) == 0);
  OK(cuMemAdvise(m, bytes / 2, CU_MEM_ADVISE_UNSET_READ_MOSTLY, dev0));
  EXPECT(range_int(CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, bytes / 2) == 0);
  OK(cuMemAdvise(m, bytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, dev0));
  EXPECT(range_int(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, m, bytes) == 0);
  OK(cuMemAdvise(m + bytes / 2, bytes / 2, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, cpu));
  EXPECT(range_int(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, m + bytes / 2, bytes / 2) == CU_DEVICE_CPU);
  EXPECT(range_int(CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, m, bytes) == CU_DEVICE_INVALID);
  OK(cuMemAdvise(m, bytes, CU_MEM_ADVISE_SET_ACCESSED_BY, dev0));
  int by[3] = {-99, -99, -99};
  OK(cuMemRangeGetAttribute(by, sizeof by, CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, m, bytes));
  EXPECT(by[0] == 0 && by[1] == CU_DEVICE_INVALID && by[2] == CU_DEVICE_INVALID);
  // Several at once.
  int rm = -1, pl = -1;
  void* data[] = {&rm, &pl};
  size_t sizes[] = {sizeof rm, sizeof pl};
  CUmem_range_attribute attrs[] = {CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION};
  OK(cuMemRangeGetAttributes(data, sizes, attrs, 2, m, bytes / 2));
  EXPECT(rm == 0 && pl == 0);
  // Prefetches: to the device ahead of a kernel, to the host ahead of the CPU.
  for (size_t i = 0; i < bytes / 4; ++i) reinterpret_cast<unsigned*>(m)[i] = 1u;
  OK(cuMemPrefetchAsync(m, bytes, dev0, 0, s));
  launch_fill(k, m, 9u, bytes / 8, s);  // the first half
  OK(cuMemPrefetchAsync(m, bytes, cpu, 0, s));
  OK(cuStreamSynchronize(s));
  EXPECT(range_int(CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, bytes) == CU_DEVICE_CPU);
  size_t wrong = 0;
  for (size_t i = 0; i < bytes / 4; ++i) wrong += reinterpret_cast<unsigned*>(m)[i] != (i < bytes / 8 ? 9u : 1u);
  EXPECT(wrong == 0);
  OK(cuMemPrefetchAsync(m, bytes, dev0, 0, s));
  OK(cuStreamSynchronize(s));
  EXPECT(range_int(CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, bytes) == 0);
  EXPECT(reinterpret_cast<unsigned*>(m)[0] == 9u);
  std::printf("advice: read-mostly, preferred location, accessed-by and prefetches recorded and honoured\n");
  // Refusals.
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemAdvise(m, bytes, static_cast<CUmem_advise>(99), dev0));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemPrefetchAsync(m, bytes, dev0, 1, s));
  EXPECT_RES(CUDA_ERROR_INVALID_DEVICE,
             cuMemPrefetchAsync(m, bytes, CUmemLocation{CU_MEM_LOCATION_TYPE_DEVICE, 99}, 0, s));
  int bad = 0;
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemRangeGetAttribute(&bad, 3, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, bytes));
  OK(cuMemFree(m));
}

void attach(const Kernels& k) {
  const size_t n = 100000;
  CUdeviceptr m;
  OK(cuMemAllocManaged(&m, n * 4, CU_MEM_ATTACH_HOST));
  if (check::g_failures != 0) return;
  auto* p = reinterpret_cast<unsigned*>(m);
  for (size_t i = 0; i < n; ++i) p[i] = 3u;
  CUstream s;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuStreamAttachMemAsync(nullptr, m, 0, CU_MEM_ATTACH_SINGLE));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuStreamAttachMemAsync(s, m, 12, CU_MEM_ATTACH_SINGLE));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuStreamAttachMemAsync(s, m, 0, 8));
  OK(cuStreamAttachMemAsync(s, m, 0, CU_MEM_ATTACH_SINGLE));
  OK(cuStreamSynchronize(s));
  launch_fill(k, m, 11u, n / 2, s);
  OK(cuStreamSynchronize(s));
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += p[i] != (i < n / 2 ? 11u : 3u);
  EXPECT(wrong == 0);
  OK(cuStreamAttachMemAsync(s, m, n * 4, CU_MEM_ATTACH_GLOBAL));
  OK(cuStreamSynchronize(s));
  std::printf("attach: host-attached memory given to one stream, its kernel's writes seen after that stream\n");
  OK(cuStreamDestroy(s));
  OK(cuMemFree(m));
}

void refusals() {
  CUdeviceptr m = 0;
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemAllocManaged(&m, 0, CU_MEM_ATTACH_GLOBAL));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemAllocManaged(&m, 4096, 0));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemAllocManaged(&m, 4096, CU_MEM_ATTACH_SINGLE));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemAllocManaged(nullptr, 4096, CU_MEM_ATTACH_GLOBAL));
  OK(cuMemAllocManaged(&m, 4096, CU_MEM_ATTACH_GLOBAL));
  if (m == 0) return;
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemFree(m + 16));
  CUdeviceptr d;
  OK(cuMemAlloc(&d, 4096));
  int v = 0;
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemRangeGetAttribute(&v, sizeof v, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, d, 4096));
  OK(cuMemFree(d));
  OK(cuMemFree(m));
  // Freed managed memory is nothing: copies and memsets to it are refused.
  unsigned word = 1;
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD(m, &word, sizeof word));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH(&word, m, sizeof word));
  std::printf("refusals: bad sizes, flags, ranges, interior frees, freed memory\n");
}

}  // namespace

int main(int argc, char** argv) {
  const char* ptx = check::arg(argc, argv, "--ptx");
  if (ptx == nullptr) {
    std::fprintf(stderr, "usage: drv_managed --ptx FILE\n");
    return 2;
  }
  OK(cuInit(0));
  CUdevice dev;
  OK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  if (check::g_failures != 0) return check::finish("drv_managed");
  const std::string text = check::read_file(ptx);
  CUmodule mod;
  OK(cuModuleLoadData(&mod, text.data()));
  Kernels k;
  OK(cuModuleGetFunction(&k.add, mod, "ivc_vec_add"));
  OK(cuModuleGetFunction(&k.fill, mod, "ivc_fill_u32"));
  if (check::g_failures != 0) return check::finish("drv_managed");
  CUstream s;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  basics(k);
  copies();
  large(k);
  threads(k);
  graph(k, s);
  attributes(dev);
  advice(k, s);
  attach(k);
  refusals();
  OK(cuStreamDestroy(s));
  OK(cuModuleUnload(mod));
  OK(cuDevicePrimaryCtxRelease(dev));
  return check::finish("drv_managed");
}
