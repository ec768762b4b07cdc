// Stream-ordered memory pools as NCCL and PyTorch's cudaMallocAsync backend
// use them: create pools with several properties, set and read attributes
// (release threshold, reuse flags, watermarks), access, allocate from them on
// a stream, run copies, memsets and a kernel on that memory, make a created
// pool the device's current one, trim, destroy (also with an allocation still
// out), and the refusals, printed so that native and ivcuda runs are compared
// on them.
//   drv_pools --ptx test_kernels.ptx [--hostile] [--unsupported]
// --hostile uses a destroyed and a forged pool handle (undefined on the real
// driver: not for native runs). --unsupported prints what ivcuda answers
// differently from the driver by design (host and managed pools); see
// docs/design.md. Sharing pools between processes is drv_pool_share's.
#include <cstdint>

#include "check.h"

namespace {

const char* flag_name(CUmemAccess_flags f) {
  switch (f) {
    case CU_MEM_ACCESS_FLAGS_PROT_NONE: return "none";
    case CU_MEM_ACCESS_FLAGS_PROT_READ: return "read";
    case CU_MEM_ACCESS_FLAGS_PROT_READWRITE: return "readwrite";
    default: return "?";
  }
}

CUmemPoolProps device_props(CUdevice dev) {
  CUmemPoolProps p{};
  p.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  return p;
}

cuuint64_t u64_attr(CUmemoryPool pool, CUmemPool_attribute a) {
  cuuint64_t v = 0;
  OK(cuMemPoolGetAttribute(pool, a, &v));
  return v;
}

bool holds(const std::vector<unsigned>& v, size_t from, size_t to, unsigned want) {
  for (size_t i = from; i < to; ++i)
    if (v[i] != want) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const char* ptx = check::arg(argc, argv, "--ptx");
  if (ptx == nullptr) {
    std::fprintf(stderr, "usage: drv_pools --ptx FILE [--hostile] [--unsupported]\n");
    return 2;
  }
  bool hostile = false, unsupported = false;
  for (int i = 1; i < argc; ++i) {
    hostile |= std::strcmp(argv[i], "--hostile") == 0;
    unsupported |= std::strcmp(argv[i], "--unsupported") == 0;
  }
  OK(cuInit(0));
  CUdevice dev;
  OK(cuDeviceGet(&dev, 0));
  int ndev = 0;
  OK(cuDeviceGetCount(&ndev));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  int pools = 0;
  OK(cuDeviceGetAttribute(&pools, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev));
  EXPECT(pools == 1);
  if (check::g_failures != 0) return check::finish("drv_pools");

  // ---- creation with several properties (NCCL's: pinned, device, no handle
  // type; its shadow pool adds a maximum size).
  CUmemPoolProps props = device_props(dev);
  CUmemoryPool a = nullptr, b = nullptr, c = nullptr;
  OK(cuMemPoolCreate(&a, &props));
  props.maxSize = 64 << 20;
  OK(cuMemPoolCreate(&b, &props));
  props = device_props(dev);
  props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  const CUresult rc = cuMemPoolCreate(&c, &props);
  std::printf("pools: created with a POSIX fd handle type: %s\n", check::name(rc));
  EXPECT(a != nullptr && b != nullptr && a != b);
  CUmemoryPool def = nullptr, cur = nullptr;
  OK(cuDeviceGetDefaultMemPool(&def, dev));
  EXPECT(def != nullptr && def != a && def != b);

  // ---- attributes
  const cuuint64_t max = ~cuuint64_t{0};
  OK(cuMemPoolSetAttribute(a, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, const_cast<cuuint64_t*>(&max)));
  EXPECT(u64_attr(a, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == max);
  EXPECT(u64_attr(b, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == 0);
  int on = -1;
  OK(cuMemPoolGetAttribute(a, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, &on));
  EXPECT(on == 1);
  int off = 0;
  OK(cuMemPoolSetAttribute(a, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &off));
  on = -1;
  OK(cuMemPoolGetAttribute(a, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &on));
  EXPECT(on == 0);
  on = -1;
  OK(cuMemPoolGetAttribute(b, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &on));
  EXPECT(on == 1);  // per pool
  OK(cuMemPoolSetAttribute(a, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &off));
  EXPECT(u64_attr(a, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
  cuuint64_t one = 1;
  std::printf("pools: set USED_MEM_HIGH to 1: %s\n",
              check::name(cuMemPoolSetAttribute(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &one)));
  std::printf("pools: set RESERVED_MEM_CURRENT: %s\n",
              check::name(cuMemPoolSetAttribute(a, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &one)));
  std::printf("pools: unknown attribute: %s\n",
              check::name(cuMemPoolGetAttribute(a, static_cast<CUmemPool_attribute>(99), &one)));

  // ---- access
  CUmemLocation here{};
  here.type = CU_MEM_LOCATION_TYPE_DEVICE;
  here.id = dev;
  CUmemAccess_flags fl = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  OK(cuMemPoolGetAccess(&fl, a, &here));
  EXPECT(fl == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CUmemAccessDesc desc{};
  desc.location = here;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  OK(cuMemPoolSetAccess(a, &desc, 1));
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  std::printf("pools: owner's access set to none: %s\n", check::name(cuMemPoolSetAccess(a, &desc, 1)));
  CUmemLocation nowhere = here;
  nowhere.id = 99;
  std::printf("pools: access of device 99: %s\n", check::name(cuMemPoolGetAccess(&fl, a, &nowhere)));
  desc.location = nowhere;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  std::printf("pools: grant device 99: %s\n", check::name(cuMemPoolSetAccess(a, &desc, 1)));
  if (ndev > 1) {  // a peer: access follows what was set, per device
    CUmemLocation peer = here;
    peer.id = 1;
    int can = 0;
    OK(cuDeviceCanAccessPeer(&can, dev, 1));
    OK(cuMemPoolGetAccess(&fl, a, &peer));
    std::printf("pools: peer access before: %s\n", flag_name(fl));
    if (can != 0) {
      desc.location = peer;
      desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      OK(cuMemPoolSetAccess(a, &desc, 1));
      OK(cuMemPoolGetAccess(&fl, a, &peer));
      EXPECT(fl == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    }
  }

  // ---- allocations on a stream, used by copies, memsets and a kernel
  CUstream s = nullptr;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const size_t n = 1 << 18;  // words: 1 MiB
  CUdeviceptr x = 0, y = 0;
  OK(cuMemAllocFromPoolAsync(&x, n * 4, a, s));
  OK(cuMemAllocFromPoolAsync(&y, n * 4, b, s));
  EXPECT(x != 0 && y != 0 && x != y);
  OK(cuMemsetD32Async(x, 0x5a5a5a5au, n, s));
  const std::string text = check::read_file(ptx);
  CUmodule m = nullptr;
  OK(cuModuleLoadData(&m, text.c_str()));
  CUfunction fill = nullptr;
  if (m != nullptr) OK(cuModuleGetFunction(&fill, m, "ivc_fill_u32"));
  if (fill != nullptr) {
    CUdeviceptr at = x + 4096;
    unsigned v = 77;
    unsigned long long count = 1024;
    void* args[] = {&at, &v, &count};
    OK(cuLaunchKernel(fill, 4, 1, 1, 256, 1, 1, 0, s, args, nullptr));
  }
  OK(cuMemcpyDtoDAsync(y, x, n * 4, s));
  std::vector<unsigned> back(n);
  OK(cuMemcpyDtoHAsync(back.data(), y, n * 4, s));
  OK(cuStreamSynchronize(s));
  EXPECT(holds(back, 0, 1024, 0x5a5a5a5au));
  if (fill != nullptr) EXPECT(holds(back, 1024, 2048, 77));
  EXPECT(holds(back, 2048, n, 0x5a5a5a5au));
  EXPECT(u64_attr(a, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) >= n * 4);
  EXPECT(u64_attr(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH) >= n * 4);
  EXPECT(u64_attr(a, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) >= n * 4);
  // The maximum size holds: 1 MiB + 32 MiB fit in 64 MiB, 40 MiB more do not.
  CUdeviceptr big = 0, over = 0;
  OK(cuMemAllocFromPoolAsync(&big, 32 << 20, b, s));
  std::printf("pools: beyond the pool's maximum size: %s\n",
              check::name(cuMemAllocFromPoolAsync(&over, 40 << 20, b, s)));
  OK(cuMemFreeAsync(big, s));
  // A synchronous copy into pool memory, then the frees.
  const auto data = check::random_bytes(4096, 5);
  std::vector<unsigned char> got(4096);
  OK(cuMemcpyHtoD(x + 100, data.data(), data.size()));
  OK(cuMemcpyDtoH(got.data(), x + 100, got.size()));
  EXPECT(got == data);
  OK(cuMemFreeAsync(x, s));
  OK(cuMemFreeAsync(y, s));
  OK(cuStreamSynchronize(s));
  EXPECT(u64_attr(a, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
  std::printf("pools: free twice: %s\n", check::name(cuMemFreeAsync(x, s)));

  // ---- trim: with nothing in use and the threshold at its maximum, the
  // pool keeps its memory until trimmed.
  OK(cuMemPoolTrimTo(a, 0));
  OK(cuStreamSynchronize(s));
  std::printf("pools: reserved after trimming to 0: %s\n",
              u64_attr(a, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0 ? "0" : "not 0");
  OK(cuMemPoolTrimTo(b, 1 << 20));
  cuuint64_t zero = 0;
  OK(cuMemPoolSetAttribute(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
  EXPECT(u64_attr(a, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 0);

  // ---- a created pool as the device's current pool (cuMemAllocAsync's)
  OK(cuDeviceGetMemPool(&cur, dev));
  EXPECT(cur == def);
  OK(cuDeviceSetMemPool(dev, a));
  OK(cuDeviceGetMemPool(&cur, dev));
  EXPECT(cur == a);
  CUdeviceptr z = 0;
  OK(cuMemAllocAsync(&z, 8192, s));
  OK(cuMemsetD8Async(z, 3, 8192, s));
  unsigned char byte = 0;
  OK(cuMemcpyDtoHAsync(&byte, z + 8191, 1, s));
  OK(cuStreamSynchronize(s));
  EXPECT(byte == 3);
  EXPECT(u64_attr(a, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) >= 8192);
  OK(cuMemFreeAsync(z, s));
  OK(cuDeviceSetMemPool(dev, def));
  OK(cuDeviceGetMemPool(&cur, dev));
  EXPECT(cur == def);

  // ---- sharing a pool made without a shareable handle type: refused
  int fd = -1;
  std::printf("pools: export a pool without a handle type: %s\n",
              check::name(cuMemPoolExportToShareableHandle(&fd, a, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)));
  OK(cuMemAllocFromPoolAsync(&x, 4096, a, s));
  OK(cuStreamSynchronize(s));
  CUmemPoolPtrExportData exp{};
  std::printf("pools: export a pointer of that pool: %s\n", check::name(cuMemPoolExportPointer(&exp, x)));
  std::printf("pools: export a pointer of the default pool: %s\n",
              check::name(cuMemAllocAsync(&y, 4096, s) == CUDA_SUCCESS ? cuMemPoolExportPointer(&exp, y)
                                                                      : CUDA_ERROR_UNKNOWN));
  OK(cuMemFreeAsync(x, s));
  OK(cuMemFreeAsync(y, s));
  OK(cuStreamSynchronize(s));

  // ---- destroying a pool with an allocation still out: the allocation
  // stays usable until freed.
  CUmemoryPool d = nullptr;
  props = device_props(dev);
  OK(cuMemPoolCreate(&d, &props));
  CUdeviceptr left = 0;
  OK(cuMemAllocFromPoolAsync(&left, 1 << 16, d, s));
  OK(cuMemsetD32Async(left, 0x11223344u, (1 << 16) / 4, s));
  OK(cuStreamSynchronize(s));
  OK(cuDeviceSetMemPool(dev, d));
  OK(cuMemPoolDestroy(d));
  OK(cuDeviceGetMemPool(&cur, dev));
  EXPECT(cur == def);  // the destroyed current pool gives way to the default
  unsigned word = 0;
  OK(cuMemcpyDtoH(&word, left + 1000, 4));
  EXPECT(word == 0x11223344u);
  OK(cuMemFreeAsync(left, s));
  OK(cuStreamSynchronize(s));

  // ---- refusals
  std::printf("pools: destroy the default pool: %s\n", check::name(cuMemPoolDestroy(def)));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemPoolCreate(&d, nullptr));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemAllocFromPoolAsync(&x, 4096, nullptr, s));
  std::printf("pools: zero bytes from a pool: %s\n", check::name(cuMemAllocFromPoolAsync(&x, 0, a, s)));
  std::printf("pools: zero bytes from the current pool: %s\n", check::name(cuMemAllocAsync(&x, 0, s)));
  props = device_props(dev);
  props.allocType = CU_MEM_ALLOCATION_TYPE_INVALID;
  std::printf("pools: create with an invalid allocation type: %s\n", check::name(cuMemPoolCreate(&d, &props)));
  props = device_props(dev);
  props.location.id = 99;
  std::printf("pools: create on device 99: %s\n", check::name(cuMemPoolCreate(&d, &props)));
  props = device_props(dev);
  props.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
  std::printf("pools: create at HOST_NUMA_CURRENT: %s\n", check::name(cuMemPoolCreate(&d, &props)));
  props = device_props(dev);
  props.reserved[3] = 1;
  std::printf("pools: create with reserved bytes set: %s\n", check::name(cuMemPoolCreate(&d, &props)));
  std::printf("pools: set another device's pool current: %s\n",
              check::name(ndev > 1 ? cuDeviceSetMemPool(1, a) : CUDA_ERROR_INVALID_VALUE));

  if (hostile) {  // only through ivcuda: the real driver may crash on these
    CUmemoryPool gone = nullptr;
    props = device_props(dev);
    OK(cuMemPoolCreate(&gone, &props));
    OK(cuMemPoolDestroy(gone));
    cuuint64_t v = 0;
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemPoolGetAttribute(gone, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemAllocFromPoolAsync(&x, 4096, gone, s));
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemPoolDestroy(gone));
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuDeviceSetMemPool(dev, gone));
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemPoolTrimTo(gone, 0));
    // Another guest's pool handle would read as one of ours: a handle this
    // process never received is no pool.
    auto* forged = reinterpret_cast<CUmemoryPool>(reinterpret_cast<std::uintptr_t>(a) + 0x7);
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemPoolGetAttribute(forged, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemPoolSetAccess(forged, &desc, 1));
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemPoolGetAccess(&fl, forged, &here));
    std::printf("pools: hostile handles refused\n");
  }
  if (unsupported) {  // ivcuda's answers that differ from the driver's by design
    props = device_props(dev);
    props.location.type = CU_MEM_LOCATION_TYPE_HOST;
    props.location.id = 0;
    std::printf("pools: host pool: %s\n", check::name(cuMemPoolCreate(&d, &props)));
    props = device_props(dev);
    props.allocType = CU_MEM_ALLOCATION_TYPE_MANAGED;
    std::printf("pools: managed pool: %s\n", check::name(cuMemPoolCreate(&d, &props)));
  }

  if (c != nullptr) OK(cuMemPoolDestroy(c));
  OK(cuMemPoolDestroy(a));
  OK(cuMemPoolDestroy(b));
  OK(cuStreamDestroy(s));
  if (m != nullptr) OK(cuModuleUnload(m));
  OK(cuDevicePrimaryCtxRelease(dev));
  return check::finish("drv_pools");
}
