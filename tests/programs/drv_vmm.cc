// Virtual memory management as frameworks use it (XLA's allocator, PyTorch's
// expandable segments): reserve an address range, create physical memory,
// map it (twice: the two views alias), grant access, copy, memset and run a
// kernel through it, retain and release handles, unmap and free. Output is
// relative to the reservation, so native and ivcuda runs print the same.
// With --own-range, the program first maps memory of its own where the
// device's last range was: the next reservation must land elsewhere and work.
//   drv_vmm --ptx test_kernels.ptx [--own-range]
#include <sys/mman.h>

#include "check.h"

int main(int argc, char** argv) {
  const char* ptx = check::arg(argc, argv, "--ptx");
  if (ptx == nullptr) {
    std::fprintf(stderr, "usage: drv_vmm --ptx FILE\n");
    return 2;
  }
  OK(cuInit(0));
  CUdevice dev;
  OK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  int vmm = 0;
  OK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
  EXPECT(vmm == 1);
  if (check::g_failures != 0) return check::finish("drv_vmm");

  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  size_t g = 0, rec = 0;
  OK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  OK(cuMemGetAllocationGranularity(&rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  EXPECT(g != 0 && (g & (g - 1)) == 0 && rec >= g);
  std::printf("vmm: granularity %zu KiB, recommended %zu KiB\n", g >> 10, rec >> 10);
  if (g == 0) return check::finish("drv_vmm");

  if (check::flag(argc, argv, "--own-range")) {
    // The device's ranges must stay clear of this process's own memory (unified
    // addressing tells one from the other by address). A freed reservation's
    // place, and 64 MiB below it, become the process's own: through ivcuda the
    // device side would hand out that place and its neighbours again.
    CUdeviceptr was = 0;
    OK(cuMemAddressReserve(&was, g, 0, 0, 0));
    OK(cuMemAddressFree(was, g));
    const size_t own_size = size_t{64} << 20;
    void* want = reinterpret_cast<void*>(was + g - own_size);
    void* own = ::mmap(want, own_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                       -1, 0);
    // The native driver may keep a freed range for itself: then there is nothing to prove.
    const bool mine = own == want;
    if (own != MAP_FAILED && !mine) ::munmap(own, own_size);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle ch = 0;
    OK(cuMemAddressReserve(&va, g, 0, 0, 0));
    if (mine) EXPECT(va + g <= was + g - own_size || va >= was + g);
    OK(cuMemCreate(&ch, g, &prop, 0));
    OK(cuMemMap(va, g, 0, ch, 0));
    CUmemAccessDesc rw{};
    rw.location = prop.location;
    rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    OK(cuMemSetAccess(va, g, &rw, 1));
    const auto bytes = check::random_bytes(4096, 5);
    std::vector<unsigned char> got(4096);
    OK(cuMemcpyHtoD(va, bytes.data(), bytes.size()));
    OK(cuMemcpyDtoH(got.data(), va, got.size()));
    EXPECT(got == bytes);
    if (mine) {
      std::memset(own, 0x5a, own_size);  // the process's own memory is its own still
      EXPECT(static_cast<unsigned char*>(own)[own_size - 1] == 0x5a);
      ::munmap(own, own_size);
    }
    OK(cuMemUnmap(va, g));
    OK(cuMemRelease(ch));
    OK(cuMemAddressFree(va, g));
    std::printf("vmm: a range clear of the process's own memory, mapped and copied through: %s\n",
                check::g_failures == 0 ? "yes" : "no");
  }

  // Four granules of address space; one allocation of two granules mapped at
  // the start and again right after it.
  CUdeviceptr base = 0;
  OK(cuMemAddressReserve(&base, 4 * g, 0, 0, 0));
  CUmemGenericAllocationHandle h = 0;
  OK(cuMemCreate(&h, 2 * g, &prop, 0));
  OK(cuMemMap(base, 2 * g, 0, h, 0));
  OK(cuMemMap(base + 2 * g, 2 * g, 0, h, 0));
  CUmemAccessDesc acc{};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  OK(cuMemSetAccess(base, 4 * g, &acc, 1));
  unsigned long long flags = 0;
  OK(cuMemGetAccess(&flags, &prop.location, base + g));
  std::printf("vmm: access flags %llu\n", flags);

  const auto data = check::random_bytes(2 * g, 7);
  std::vector<unsigned char> back(2 * g);
  OK(cuMemcpyHtoD(base, data.data(), data.size()));
  OK(cuMemcpyDtoH(back.data(), base + 2 * g, back.size()));
  EXPECT(back == data);  // the second view sees what went through the first
  OK(cuMemsetD32(base + g, 0x01020304u, 16));
  unsigned word = 0;
  OK(cuMemcpyDtoH(&word, base + 3 * g + 60, 4));
  EXPECT(word == 0x01020304u);
  CUdeviceptr rb = 0;
  size_t rs = 0;
  OK(cuMemGetAddressRange(&rb, &rs, base + 2 * g + 100));
  std::printf("vmm: address range of a pointer in the second view: +%llu KiB, %zu KiB\n",
              static_cast<unsigned long long>((rb - base) >> 10), rs >> 10);

  // A kernel writes through the mapping.
  const std::string text = check::read_file(ptx);
  CUmodule m = nullptr;
  OK(cuModuleLoadData(&m, text.c_str()));
  CUfunction fill = nullptr;
  if (m != nullptr) OK(cuModuleGetFunction(&fill, m, "ivc_fill_u32"));
  if (fill != nullptr) {
    CUdeviceptr at = base + 4096;
    unsigned v = 77;
    unsigned long long count = 1024;
    void* args[] = {&at, &v, &count};
    OK(cuLaunchKernel(fill, 4, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
    OK(cuCtxSynchronize());
    std::vector<unsigned> out(1024);
    OK(cuMemcpyDtoH(out.data(), base + 2 * g + 4096, out.size() * 4));
    bool all = true;
    for (unsigned x : out) all &= x == 77;
    EXPECT(all);
  }

  // Properties and a retained handle.
  CUmemAllocationProp got{};
  OK(cuMemGetAllocationPropertiesFromHandle(&got, h));
  EXPECT(got.type == CU_MEM_ALLOCATION_TYPE_PINNED && got.location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
         got.location.id == dev);
  CUmemGenericAllocationHandle again = 0;
  OK(cuMemRetainAllocationHandle(&again, reinterpret_cast<void*>(base + 2 * g + 8)));
  OK(cuMemRelease(again));
  std::printf("vmm: a retained handle is the allocation's own: %s\n", again == h ? "yes" : "no");
  // Released while mapped: the mappings keep the memory.
  OK(cuMemRelease(h));
  OK(cuMemcpyDtoH(back.data(), base, back.size()));
  EXPECT(back[0] == data[0] && back[back.size() - 1] == data[data.size() - 1]);
  // NCCL's free: retain the handle of a mapped address, release it, unmap,
  // release again (each retain and the creation count one reference).
  CUmemGenericAllocationHandle h3 = 0, r3 = 0;
  CUdeviceptr va3 = 0;
  OK(cuMemAddressReserve(&va3, g, 0, 0, 0));
  OK(cuMemCreate(&h3, g, &prop, 0));
  OK(cuMemMap(va3, g, 0, h3, 0));
  OK(cuMemSetAccess(va3, g, &acc, 1));
  OK(cuMemRelease(h3));  // only the mapping holds it now
  OK(cuMemRetainAllocationHandle(&r3, reinterpret_cast<void*>(va3)));
  OK(cuMemRetainAllocationHandle(&r3, reinterpret_cast<void*>(va3)));
  OK(cuMemRelease(r3));
  OK(cuMemUnmap(va3, g));
  OK(cuMemRelease(r3));
  OK(cuMemAddressFree(va3, g));

  // A buffer grown chunk by chunk (XLA's and PyTorch's expandable allocators): two
  // allocations mapped back to back are one stretch of device memory, and copies and memsets
  // run across the seam.
  {
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle c0 = 0, c1 = 0;
    OK(cuMemAddressReserve(&va, 2 * g, 0, 0, 0));
    OK(cuMemCreate(&c0, g, &prop, 0));
    OK(cuMemCreate(&c1, g, &prop, 0));
    OK(cuMemMap(va, g, 0, c0, 0));
    OK(cuMemMap(va + g, g, 0, c1, 0));
    OK(cuMemSetAccess(va, 2 * g, &acc, 1));
    const auto seam = check::random_bytes(4096, 11);
    std::vector<unsigned char> out(4096);
    OK(cuMemcpyHtoD(va + g - 2048, seam.data(), seam.size()));
    OK(cuMemcpyDtoD(va, va + g - 2048, seam.size()));
    OK(cuMemcpyDtoH(out.data(), va, out.size()));
    EXPECT(out == seam);
    OK(cuMemsetD8(va + g - 16, 0x7e, 32));
    OK(cuMemcpyDtoH(out.data(), va + g - 2048, out.size()));
    EXPECT(out[2032] == 0x7e && out[2047] == 0x7e && out[2048] == 0x7e && out[2063] == 0x7e && out[2064] == seam[2064]);
    std::printf("vmm: copies and a memset across two mappings back to back: %s\n",
                out[2048] == 0x7e ? "done" : "not done");
    OK(cuMemUnmap(va, 2 * g));
    OK(cuMemRelease(c0));
    OK(cuMemRelease(c1));
    OK(cuMemAddressFree(va, 2 * g));
  }

  // Refusals, printed so that native and ivcuda runs are compared on them.
  std::printf("vmm: free with mappings left: %s\n", check::name(cuMemAddressFree(base, 4 * g)));
  std::printf("vmm: unmap half a mapping: %s\n", check::name(cuMemUnmap(base, g)));
  OK(cuMemUnmap(base, 4 * g));
  std::printf("vmm: copy to the unmapped range: %s\n",
              check::name(cuMemcpyHtoD(base, data.data(), 64)));
  std::printf("vmm: free with the wrong size: %s\n", check::name(cuMemAddressFree(base, 2 * g)));
  OK(cuMemAddressFree(base, 4 * g));
  if (m != nullptr) OK(cuModuleUnload(m));
  OK(cuDevicePrimaryCtxRelease(dev));
  return check::finish("drv_vmm");
}
