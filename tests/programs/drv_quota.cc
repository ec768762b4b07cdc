// A guest's device-memory quota (ivcudad --mem-limit), seen from the guest:
//   drv_quota --quota-mib N [--others-mib M]
//       the device's total is the quota (cuMemGetInfo, cuDeviceTotalMem) and
//       free is what is left of it (M MiB held by the guest's other processes,
//       a VM's, count); every way of making device memory - cuMemAlloc, pitch,
//       managed and stream-ordered allocations, cuMemCreate, arrays, graph memory
//       nodes - is refused with CUDA_ERROR_OUT_OF_MEMORY past it, and nothing
//       else is disturbed: the context keeps working, and freed memory returns
//       to the quota at once; with --big-module IMAGE (globals past the
//       quota) and --module IMAGE (one that fits), that a module's code
//       and globals count too;
//   drv_quota --hold-mib N
//       allocates N MiB, prints "holding N MiB" and waits until killed (for
//       the VM case: the quota is the VM's, and a killed process's memory
//       returns to it);
//   drv_quota --hold-mib N --until-evicted
//       as --hold-mib, with a copy of 8 MiB every 20 ms (so the guest's call
//       and copy rates show), until the operator evicts the guest (ivcudactl
//       evict): then every call answers CUDA_ERROR_DEVICE_UNAVAILABLE and none
//       hangs; it prints "evicted" and ends with 0.
// Only meaningful through ivcuda (natively there is no quota): the checks
// name what a tenant must see.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

#include "check.h"

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

std::uint64_t free_now() {
  size_t f = 0, t = 0;
  if (cuMemGetInfo(&f, &t) != CUDA_SUCCESS) return 0;
  return f;
}

int hold(std::uint64_t mib, bool until_evicted) {
  CUdeviceptr p = 0;
  OK(cuMemAlloc(&p, mib * kMiB));
  OK(cuMemsetD8(p, 1, mib * kMiB));
  OK(cuCtxSynchronize());
  std::printf("holding %llu MiB\n", static_cast<unsigned long long>(mib));
  std::fflush(stdout);
  if (!until_evicted)
    for (;;) ::pause();
  std::vector<unsigned char> host(8 * kMiB, 7);
  CUresult st = CUDA_SUCCESS;
  for (int i = 0; i < 3000 && st == CUDA_SUCCESS; ++i) {
    st = cuMemcpyHtoD(p, host.data(), host.size());
    if (st == CUDA_SUCCESS) st = cuCtxSynchronize();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_RES(CUDA_ERROR_DEVICE_UNAVAILABLE, st);
  // Nothing works from here on, and nothing hangs: a pageable copy's staged
  // chunks still come back, a new allocation is refused.
  CUdeviceptr q = 0;
  EXPECT_RES(CUDA_ERROR_DEVICE_UNAVAILABLE, cuMemAlloc(&q, kMiB));
  EXPECT_RES(CUDA_ERROR_DEVICE_UNAVAILABLE, cuMemcpyDtoH(host.data(), p, host.size()));
  EXPECT_RES(CUDA_ERROR_DEVICE_UNAVAILABLE, cuMemFree(p));
  CUstream s = nullptr;
  EXPECT_RES(CUDA_ERROR_DEVICE_UNAVAILABLE, cuStreamCreate(&s, 0));
  EXPECT_RES(CUDA_ERROR_DEVICE_UNAVAILABLE, cuCtxSynchronize());
  std::printf("evicted\n");
  std::fflush(stdout);
  // Stay a moment, evicted: the operator's tool then sees the release
  // before this guest's connection ends with it.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  return check::finish("drv_quota --until-evicted");
}

}  // namespace

int main(int argc, char** argv) {
  OK(cuInit(0));
  CUdevice d;
  CUcontext ctx;
  OK(cuDeviceGet(&d, 0));
  OK(cuDevicePrimaryCtxRetain(&ctx, d));
  OK(cuCtxSetCurrent(ctx));
  if (const char* h = check::arg(argc, argv, "--hold-mib"))
    return hold(std::strtoull(h, nullptr, 10), check::flag(argc, argv, "--until-evicted"));
  const char* q = check::arg(argc, argv, "--quota-mib");
  if (q == nullptr) {
    std::fprintf(stderr, "usage: drv_quota --quota-mib N [--others-mib M] | --hold-mib N\n");
    return 2;
  }
  const std::uint64_t quota = std::strtoull(q, nullptr, 10) * kMiB;
  const char* o = check::arg(argc, argv, "--others-mib");
  const std::uint64_t others = o != nullptr ? std::strtoull(o, nullptr, 10) * kMiB : 0;

  // The tenant's view. Memory of a process that just died comes back to the
  // quota once the host reclaimed it: allow that 3 s.
  for (int i = 0; i < 300 && free_now() != quota - others; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  size_t f = 0, t = 0;
  OK(cuMemGetInfo(&f, &t));
  EXPECT(t == quota);
  EXPECT(f == quota - others);
  size_t total = 0;
  OK(cuDeviceTotalMem(&total, d));
  EXPECT(total == quota);
  const std::uint64_t room = quota - others;
  // Asked over and over (JAX at its start, PyTorch's mem_get_info), with
  // work queued meanwhile: the same tenant's view every time, and it follows
  // the process's own allocations at once.
  for (int i = 0; i < 1000; ++i) {
    size_t f2 = 0, t2 = 0;
    OK(cuMemGetInfo(&f2, &t2));
    if (f2 != room || t2 != quota) {
      EXPECT(f2 == room && t2 == quota);
      break;
    }
    if (i % 100 == 0) {
      CUdeviceptr p = 0;
      OK(cuMemAlloc(&p, kMiB));
      EXPECT(free_now() == room - kMiB);
      OK(cuMemFree(p));
    }
  }

  // Up to the quota, then refused; what was held is untouched.
  CUdeviceptr a = 0, b = 0;
  OK(cuMemAlloc(&a, room / 2));
  EXPECT(free_now() == room - room / 2);
  EXPECT_RES(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc(&b, room / 2 + kMiB));
  OK(cuMemsetD32(a, 0x5a5a5a5a, 1024));
  std::uint32_t word = 0;
  OK(cuMemcpyDtoH(&word, a + 4 * 100, 4));
  EXPECT(word == 0x5a5a5a5au);

  // Every other way of making device memory, past what is left.
  const std::uint64_t left = room - room / 2;
  size_t pitch = 0;
  EXPECT_RES(CUDA_ERROR_OUT_OF_MEMORY, cuMemAllocPitch(&b, &pitch, 1 << 20, left / (1 << 20) + 1, 4));
  // Managed memory is device memory the guest maps (guest/managed.cc): charged as such.
  EXPECT_RES(CUDA_ERROR_OUT_OF_MEMORY, cuMemAllocManaged(&b, left + kMiB, CU_MEM_ATTACH_GLOBAL));
  OK(cuMemAllocManaged(&b, 4 * kMiB, CU_MEM_ATTACH_GLOBAL));
  EXPECT(free_now() <= left - 4 * kMiB && free_now() + 4 * kMiB + 64 * 1024 >= left);
  OK(cuMemFree(b));
  EXPECT(free_now() == left);
  CUstream s;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  EXPECT_RES(CUDA_ERROR_OUT_OF_MEMORY, cuMemAllocAsync(&b, left + kMiB, s));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  OK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle h = 0;
  const std::uint64_t over = (left / gran + 1) * gran;
  EXPECT_RES(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&h, over, &prop, 0));
  CUDA_ARRAY3D_DESCRIPTOR ad{};
  ad.Width = 8192;
  ad.Height = left / (8192 * 16) + 1;
  ad.Format = CU_AD_FORMAT_FLOAT;
  ad.NumChannels = 4;
  CUarray arr = nullptr;
  EXPECT_RES(CUDA_ERROR_OUT_OF_MEMORY, cuArray3DCreate(&arr, &ad));
  CUgraph g;
  OK(cuGraphCreate(&g, 0));
  CUDA_MEM_ALLOC_NODE_PARAMS mp{};
  mp.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  mp.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  mp.poolProps.location.id = 0;
  mp.bytesize = left + kMiB;
  CUgraphNode node;
  EXPECT_RES(CUDA_ERROR_OUT_OF_MEMORY, cuGraphAddMemAllocNode(&node, g, nullptr, 0, &mp));
  // An allocation node inside the quota counts while it lives: destroying
  // its graph gives the memory back.
  mp.bytesize = 2 * kMiB;
  OK(cuGraphAddMemAllocNode(&node, g, nullptr, 0, &mp));
  EXPECT(free_now() == left - 2 * kMiB);
  OK(cuGraphDestroy(g));
  EXPECT(free_now() == left);

  // Inside what is left, each works and counts.
  OK(cuMemAllocAsync(&b, 2 * kMiB, s));
  OK(cuStreamSynchronize(s));
  EXPECT(free_now() == left - 2 * kMiB);
  OK(cuMemFreeAsync(b, s));
  OK(cuStreamSynchronize(s));
  EXPECT(free_now() == left);
  OK(cuMemCreate(&h, gran, &prop, 0));
  EXPECT(free_now() == left - gran);
  CUdeviceptr va = 0;
  OK(cuMemAddressReserve(&va, gran, 0, 0, 0));
  OK(cuMemMap(va, gran, 0, h, 0));
  OK(cuMemRelease(h));  // mapped memory stays, and stays charged
  EXPECT(free_now() == left - gran);
  OK(cuMemUnmap(va, gran));
  OK(cuMemAddressFree(va, gran));
  EXPECT(free_now() == left);
  ad.Height = 16;  // 8192 x 16 float4: 2 MiB
  OK(cuArray3DCreate(&arr, &ad));
  EXPECT(free_now() == left - 2 * kMiB);
  OK(cuArrayDestroy(arr));
  EXPECT(free_now() == left);

  // Freed memory returns at once: the whole room is there again.
  OK(cuMemFree(a));
  EXPECT(free_now() == room);
  OK(cuMemAlloc(&a, room));
  EXPECT(free_now() == 0);
  EXPECT_RES(CUDA_ERROR_OUT_OF_MEMORY, cuMemAlloc(&b, kMiB));
  OK(cuMemFree(a));
  OK(cuStreamDestroy(s));

  // A module's globals count: one declaring more than the quota (512 MiB,
  // tests/host/big_global.cu) is refused, one that fits is charged while loaded.
  if (const char* big = check::arg(argc, argv, "--big-module")) {
    const std::string image = check::read_file(big);
    EXPECT(!image.empty());
    CUmodule m = nullptr;
    EXPECT_RES(CUDA_ERROR_OUT_OF_MEMORY, cuModuleLoadData(&m, image.data()));
    EXPECT(free_now() == room);
  }
  if (const char* small = check::arg(argc, argv, "--module")) {
    const std::string image = check::read_file(small);
    CUmodule m = nullptr;
    OK(cuModuleLoadData(&m, image.data()));
    EXPECT(free_now() < room);
    OK(cuModuleUnload(m));
    EXPECT(free_now() == room);
  }
  return check::finish("drv_quota");
}
