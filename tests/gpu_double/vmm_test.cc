// Virtual memory management: reservations, physical allocations, mappings and access, and
// sharing allocations as file descriptors. The expectations are the real driver's (580 on an
// H200); those it does not share are tagged [double_only].
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "test_support.h"

using namespace ivcuda::gpu_double::test;

namespace {

constexpr size_t kG = size_t{2} << 20;  // the granularity, on an H200 and on the double

CUmemAllocationProp device_prop(unsigned long long handle_types = CU_MEM_HANDLE_TYPE_NONE) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  p.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(handle_types);
  return p;
}

CUmemAccessDesc access_desc(CUmemAccess_flags flags, int device = 0) {
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = device;
  d.flags = flags;
  return d;
}

unsigned long long access_of(CUdeviceptr p) {
  const CUmemLocation loc{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  unsigned long long flags = 99;
  CU_REQUIRE(cuMemGetAccess(&flags, &loc, p));
  return flags;
}

std::vector<unsigned char> pattern(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(i * 13 + seed);
  return v;
}

// Owns what a test reserves, creates and maps, and undoes it in the driver's order
// (unmap, release, free the address space) even when the test fails half way.
class Vmm {
 public:
  Vmm() = default;
  Vmm(const Vmm&) = delete;
  Vmm& operator=(const Vmm&) = delete;
  ~Vmm() {
    for (const auto& [p, n] : maps_) cuMemUnmap(p, n);
    for (CUmemGenericAllocationHandle h : handles_) cuMemRelease(h);
    for (const auto& [p, n] : reserved_) cuMemAddressFree(p, n);
  }
  CUdeviceptr reserve(size_t size) {
    CUdeviceptr p = 0;
    CU_REQUIRE(cuMemAddressReserve(&p, size, 0, 0, 0));
    reserved_.emplace_back(p, size);
    return p;
  }
  CUmemGenericAllocationHandle create(size_t size,
                                      unsigned long long handle_types = CU_MEM_HANDLE_TYPE_NONE) {
    const CUmemAllocationProp prop = device_prop(handle_types);
    CUmemGenericAllocationHandle h = 0;
    CU_REQUIRE(cuMemCreate(&h, size, &prop, 0));
    handles_.push_back(h);
    return h;
  }
  // A handle obtained otherwise (import, retain): released at the end too.
  void own(CUmemGenericAllocationHandle h) { handles_.push_back(h); }
  // The caller released h itself.
  void disown(CUmemGenericAllocationHandle h) { std::erase(handles_, h); }
  void map(CUdeviceptr p, size_t size, CUmemGenericAllocationHandle h) {
    CU_REQUIRE(cuMemMap(p, size, 0, h, 0));
    maps_.emplace_back(p, size);
  }
  void unmap(CUdeviceptr p, size_t size) {
    CU_REQUIRE(cuMemUnmap(p, size));
    std::erase(maps_, std::pair{p, size});
  }
  void free(CUdeviceptr p, size_t size) {
    CU_REQUIRE(cuMemAddressFree(p, size));
    std::erase(reserved_, std::pair{p, size});
  }
  // Reserves, creates and maps `size` bytes read-write for device 0.
  CUdeviceptr mapped(size_t size, CUmemGenericAllocationHandle* out = nullptr) {
    const CUdeviceptr p = reserve(size);
    const CUmemGenericAllocationHandle h = create(size);
    map(p, size, h);
    const CUmemAccessDesc rw = access_desc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CU_REQUIRE(cuMemSetAccess(p, size, &rw, 1));
    if (out != nullptr) *out = h;
    return p;
  }

 private:
  std::vector<std::pair<CUdeviceptr, size_t>> reserved_, maps_;
  std::vector<CUmemGenericAllocationHandle> handles_;
};

}  // namespace

TEST_CASE("the device supports VMM with a 2 MiB granularity", "[gpu_double][vmm]") {
  ScopedContext ctx;
  int v = 0;
  CU_REQUIRE(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
  CHECK(v == 1);
  CU_REQUIRE(
      cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0));
  CHECK(v == 1);
  const CUmemAllocationProp prop = device_prop();
  size_t g = 0;
  CU_REQUIRE(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CHECK(g == kG);
  g = 0;
  CU_REQUIRE(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  CHECK(g == kG);
  CU_REQUIRE_ERR(cuMemGetAllocationGranularity(nullptr, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                 CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemGetAllocationGranularity(&g, nullptr, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                 CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(
      cuMemGetAllocationGranularity(&g, &prop, static_cast<CUmemAllocationGranularity_flags>(7)),
      CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("mapped memory with access is device memory for copies, memsets and kernels",
          "[gpu_double][vmm]") {
  ScopedContext ctx;
  Vmm vmm;
  const size_t size = 2 * kG;
  const CUdeviceptr va = vmm.reserve(size);
  CHECK(va % kG == 0);
  const CUmemGenericAllocationHandle h = vmm.create(size);
  vmm.map(va, size, h);

  // Mapped without access: not yet memory a device may touch.
  CHECK(access_of(va) == CU_MEM_ACCESS_FLAGS_PROT_NONE);
  const auto src = pattern(size, 5);
  CU_REQUIRE_ERR(cuMemcpyHtoD(va, src.data(), 16), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr base = 0;
  size_t bytes = 0;
  CU_REQUIRE_ERR(cuMemGetAddressRange(&base, &bytes, va), CUDA_ERROR_NOT_FOUND);

  const CUmemAccessDesc rw = access_desc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CU_REQUIRE(cuMemSetAccess(va, size, &rw, 1));
  CHECK(access_of(va + kG + 1) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CU_REQUIRE(cuMemGetAddressRange(&base, &bytes, va + kG + 123));
  CHECK(base == va);
  CHECK(bytes == size);

  CU_REQUIRE(cuMemcpyHtoD(va, src.data(), size));
  std::vector<unsigned char> back(size);
  CU_REQUIRE(cuMemcpyDtoH(back.data(), va, size));
  CHECK(back == src);
  CU_REQUIRE(cuMemsetD32(va + 64, 0xdeadbeef, 4));
  CU_REQUIRE(cuMemcpyDtoD(va + kG, va + 64, 16));
  unsigned words[4] = {};
  CU_REQUIRE(cuMemcpyDtoH(words, va + kG, sizeof words));
  for (unsigned w : words) CHECK(w == 0xdeadbeefu);
  // The mapping ends where the reservation's mapped part does.
  CU_REQUIRE_ERR(cuMemcpyHtoD(va + size - 8, src.data(), 16), CUDA_ERROR_INVALID_VALUE);

  const std::string ptx = kernels_ptx();
  if (!ptx.empty()) {
    CUmodule m = nullptr;
    CU_REQUIRE(cuModuleLoadData(&m, ptx.c_str()));
    CUfunction f = nullptr;
    CU_REQUIRE(cuModuleGetFunction(&f, m, "ivc_fill_u32"));
    CUdeviceptr p = va + kG;
    unsigned value = 0x01020304;
    unsigned long long n = kG / 4;
    void* args[] = {&p, &value, &n};
    CU_REQUIRE(cuLaunchKernel(f, 64, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
    CU_REQUIRE(cuCtxSynchronize());
    std::vector<unsigned> out(kG / 4);
    CU_REQUIRE(cuMemcpyDtoH(out.data(), va + kG, kG));
    for (unsigned w : out) REQUIRE(w == value);
  }

  // Read-only access still reads; no access takes the range away again.
  const CUmemAccessDesc ro = access_desc(CU_MEM_ACCESS_FLAGS_PROT_READ);
  CU_REQUIRE(cuMemSetAccess(va, size, &ro, 1));
  CHECK(access_of(va) == CU_MEM_ACCESS_FLAGS_PROT_READ);
  CU_REQUIRE(cuMemcpyDtoH(back.data(), va, 64));
  CHECK(std::memcmp(back.data(), src.data(), 64) == 0);
  const CUmemAccessDesc none = access_desc(CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CU_REQUIRE(cuMemSetAccess(va, size, &none, 1));
  CHECK(access_of(va) == CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CU_REQUIRE_ERR(cuMemGetAddressRange(&base, &bytes, va), CUDA_ERROR_NOT_FOUND);
  CU_REQUIRE_ERR(cuMemcpyDtoH(back.data(), va, 16), CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("two mappings of one allocation alias", "[gpu_double][vmm]") {
  ScopedContext ctx;
  Vmm vmm;
  const CUdeviceptr a = vmm.reserve(kG);
  const CUdeviceptr b = vmm.reserve(kG);
  const CUmemGenericAllocationHandle h = vmm.create(kG);
  vmm.map(a, kG, h);
  vmm.map(b, kG, h);
  const CUmemAccessDesc rw = access_desc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CU_REQUIRE(cuMemSetAccess(a, kG, &rw, 1));
  CU_REQUIRE(cuMemSetAccess(b, kG, &rw, 1));
  const auto src = pattern(4096, 9);
  CU_REQUIRE(cuMemcpyHtoD(a + 12345, src.data(), src.size()));
  std::vector<unsigned char> back(src.size());
  CU_REQUIRE(cuMemcpyDtoH(back.data(), b + 12345, back.size()));
  CHECK(back == src);
  CU_REQUIRE(cuMemsetD8(b, 0x7e, 100));
  unsigned char c = 0;
  CU_REQUIRE(cuMemcpyDtoH(&c, a + 99, 1));
  CHECK(c == 0x7e);
  // Each mapping is an address range of its own.
  CUdeviceptr base = 0;
  size_t bytes = 0;
  CU_REQUIRE(cuMemGetAddressRange(&base, &bytes, b + 5));
  CHECK(base == b);
  CHECK(bytes == kG);
}

TEST_CASE("an unmapped range is no device memory, but stays reserved", "[gpu_double][vmm]") {
  ScopedContext ctx;
  Vmm vmm;
  CUmemGenericAllocationHandle h = 0;
  const CUdeviceptr va = vmm.mapped(kG, &h);
  const auto src = pattern(256, 1);
  CU_REQUIRE(cuMemcpyHtoD(va, src.data(), src.size()));
  vmm.unmap(va, kG);

  std::vector<unsigned char> back(src.size());
  CU_REQUIRE_ERR(cuMemcpyHtoD(va, src.data(), 16), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemcpyDtoH(back.data(), va, 16), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemsetD8(va, 0, 16), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr base = 0;
  size_t bytes = 0;
  CU_REQUIRE_ERR(cuMemGetAddressRange(&base, &bytes, va), CUDA_ERROR_NOT_FOUND);
  const CUmemLocation loc{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  unsigned long long flags = 0;
  CU_REQUIRE_ERR(cuMemGetAccess(&flags, &loc, va), CUDA_ERROR_INVALID_VALUE);
  CUmemGenericAllocationHandle r = 0;
  CU_REQUIRE_ERR(cuMemRetainAllocationHandle(&r, reinterpret_cast<void*>(va)),
                 CUDA_ERROR_INVALID_VALUE);
  // Unmapping a stretch that holds no mapping is harmless.
  CU_REQUIRE(cuMemUnmap(va, kG));

  // The address space and the physical memory both survived: map it again, same bytes.
  vmm.map(va, kG, h);
  const CUmemAccessDesc rw = access_desc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CU_REQUIRE(cuMemSetAccess(va, kG, &rw, 1));
  CU_REQUIRE(cuMemcpyDtoH(back.data(), va, back.size()));
  CHECK(back == src);
}

TEST_CASE("a released allocation lives on while it is mapped", "[gpu_double][vmm]") {
  ScopedContext ctx;
  Vmm vmm;
  CUmemGenericAllocationHandle h = 0;
  const CUdeviceptr va = vmm.mapped(kG, &h);
  const auto src = pattern(kG, 3);
  CU_REQUIRE(cuMemcpyHtoD(va, src.data(), src.size()));
  CU_REQUIRE(cuMemRelease(h));
  vmm.disown(h);

  std::vector<unsigned char> back(kG);
  CU_REQUIRE(cuMemcpyDtoH(back.data(), va, back.size()));
  CHECK(back == src);
  // The caller's last reference is gone: releasing again is an error.
  CU_REQUIRE_ERR(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
  // The mapping still knows it, by the same handle.
  CUmemGenericAllocationHandle r = 0;
  CU_REQUIRE(cuMemRetainAllocationHandle(&r, reinterpret_cast<void*>(va + 100)));
  CHECK(r == h);
  CUmemAllocationProp prop{};
  CU_REQUIRE(cuMemGetAllocationPropertiesFromHandle(&prop, r));
  CHECK(prop.location.id == 0);
  CU_REQUIRE(cuMemRelease(r));
  vmm.unmap(va, kG);
}

TEST_CASE("cuMemRetainAllocationHandle adds a reference to the mapping's handle",
          "[gpu_double][vmm]") {
  ScopedContext ctx;
  Vmm vmm;
  CUmemGenericAllocationHandle h = 0;
  const CUdeviceptr va = vmm.mapped(2 * kG, &h);
  CUmemGenericAllocationHandle r = 0;
  CU_REQUIRE(cuMemRetainAllocationHandle(&r, reinterpret_cast<void*>(va + kG + 77)));
  CHECK(r == h);
  // Two references now (cuMemCreate's and the retain's), and a third release is one too many.
  CU_REQUIRE(cuMemRelease(r));
  CU_REQUIRE(cuMemRelease(h));
  vmm.disown(h);
  CU_REQUIRE_ERR(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);

  CU_REQUIRE_ERR(cuMemRetainAllocationHandle(nullptr, reinterpret_cast<void*>(va)),
                 CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemRetainAllocationHandle(&r, nullptr), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr plain = 0;
  CU_REQUIRE(cuMemAlloc(&plain, 4096));
  CU_REQUIRE_ERR(cuMemRetainAllocationHandle(&r, reinterpret_cast<void*>(plain)),
                 CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuMemFree(plain));
  // cuMemFree does not free mapped memory.
  CU_REQUIRE_ERR(cuMemFree(va), CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("allocation properties come back from the handle", "[gpu_double][vmm]") {
  ScopedContext ctx;
  Vmm vmm;
  const CUmemGenericAllocationHandle plain = vmm.create(kG);
  const CUmemGenericAllocationHandle fd = vmm.create(kG, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CUmemAllocationProp prop{};
  CU_REQUIRE(cuMemGetAllocationPropertiesFromHandle(&prop, plain));
  CHECK(prop.type == CU_MEM_ALLOCATION_TYPE_PINNED);
  CHECK(prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE);
  CHECK(prop.location.id == 0);
  CHECK(prop.requestedHandleTypes == CU_MEM_HANDLE_TYPE_NONE);
  CU_REQUIRE(cuMemGetAllocationPropertiesFromHandle(&prop, fd));
  CHECK(prop.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CU_REQUIRE_ERR(cuMemGetAllocationPropertiesFromHandle(nullptr, plain), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemGetAllocationPropertiesFromHandle(&prop, 0), CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("an allocation exported as a file descriptor and imported is the same memory",
          "[gpu_double][vmm]") {
  ScopedContext ctx;
  Vmm vmm;
  const CUmemGenericAllocationHandle plain = vmm.create(kG);
  const CUmemGenericAllocationHandle h = vmm.create(kG, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  int fd = -1;
  // Only an allocation created exportable exports, and only as what it was created for.
  CU_REQUIRE_ERR(cuMemExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_NONE, 0),
                 CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
                 CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemExportToShareableHandle(nullptr, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  REQUIRE(fd >= 0);

  CUmemGenericAllocationHandle imported = 0;
  void* os_handle = reinterpret_cast<void*>(static_cast<std::intptr_t>(fd));
  CU_REQUIRE(cuMemImportFromShareableHandle(&imported, os_handle,
                                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  vmm.own(imported);
  CHECK(imported != h);  // a handle of its own over the same memory
  CU_REQUIRE_ERR(cuMemImportFromShareableHandle(nullptr, os_handle,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                 CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemImportFromShareableHandle(&imported, os_handle, CU_MEM_HANDLE_TYPE_NONE),
                 CUDA_ERROR_INVALID_VALUE);
  ::close(fd);  // the import holds the memory, not the caller's descriptor

  CUmemAllocationProp prop{};
  CU_REQUIRE(cuMemGetAllocationPropertiesFromHandle(&prop, imported));
  CHECK(prop.type == CU_MEM_ALLOCATION_TYPE_PINNED);
  CHECK(prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE);
  CHECK(prop.location.id == 0);

  const CUdeviceptr a = vmm.reserve(kG);
  const CUdeviceptr b = vmm.reserve(kG);
  vmm.map(a, kG, h);
  vmm.map(b, kG, imported);
  const CUmemAccessDesc rw = access_desc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CU_REQUIRE(cuMemSetAccess(a, kG, &rw, 1));
  CU_REQUIRE(cuMemSetAccess(b, kG, &rw, 1));
  const auto src = pattern(1000, 77);
  CU_REQUIRE(cuMemcpyHtoD(a + 4096, src.data(), src.size()));
  std::vector<unsigned char> back(src.size());
  CU_REQUIRE(cuMemcpyDtoH(back.data(), b + 4096, back.size()));
  CHECK(back == src);
  CUmemGenericAllocationHandle r = 0;
  CU_REQUIRE(cuMemRetainAllocationHandle(&r, reinterpret_cast<void*>(b)));
  CHECK(r == imported);
  CU_REQUIRE(cuMemRelease(r));
}

TEST_CASE("importing a descriptor that is no exported memory fails", "[gpu_double][vmm]") {
  ScopedContext ctx;
  int fds[2] = {-1, -1};
  REQUIRE(::pipe(fds) == 0);
  CUmemGenericAllocationHandle h = 0;
  CU_REQUIRE_ERR(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(std::intptr_t{fds[0]}),
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                 CUDA_ERROR_UNKNOWN);
  CU_REQUIRE_ERR(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(std::intptr_t{-1}),
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                 CUDA_ERROR_UNKNOWN);
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST_CASE("VMM calls refuse bad arguments with the driver's codes", "[gpu_double][vmm]") {
  ScopedContext ctx;
  Vmm vmm;
  int devices = 0;
  CU_REQUIRE(cuDeviceGetCount(&devices));
  const CUmemAllocationProp prop = device_prop();
  CUdeviceptr p = 0;
  CUmemGenericAllocationHandle h = 0;

  SECTION("reservations") {
    CU_REQUIRE_ERR(cuMemAddressReserve(&p, 0, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemAddressReserve(&p, 4096, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemAddressReserve(&p, kG + 4096, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemAddressReserve(&p, kG, 3 * kG, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemAddressReserve(&p, kG, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemAddressReserve(nullptr, kG, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    const CUdeviceptr va = vmm.reserve(4 * kG);
    CU_REQUIRE_ERR(cuMemAddressReserve(&p, kG, 0, va + 4096, 0), CUDA_ERROR_INVALID_VALUE);
    // A taken address is only a hint: the reservation lands elsewhere.
    CU_REQUIRE(cuMemAddressReserve(&p, kG, 0, va, 0));
    CHECK(p != va);
    CU_REQUIRE(cuMemAddressFree(p, kG));
    // A large alignment is honoured.
    CU_REQUIRE(cuMemAddressReserve(&p, kG, size_t{1} << 30, 0, 0));
    CHECK(p % (size_t{1} << 30) == 0);
    CU_REQUIRE(cuMemAddressFree(p, kG));
    // Only whole reservations are freed, once.
    CU_REQUIRE_ERR(cuMemAddressFree(va, 2 * kG), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemAddressFree(va + 2 * kG, 2 * kG), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemAddressFree(va, 0), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemAddressFree(0, kG), CUDA_ERROR_INVALID_VALUE);
    vmm.free(va, 4 * kG);
    CU_REQUIRE_ERR(cuMemAddressFree(va, 4 * kG), CUDA_ERROR_INVALID_VALUE);
  }
  SECTION("physical allocations") {
    CU_REQUIRE_ERR(cuMemCreate(&h, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemCreate(&h, 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemCreate(&h, kG, &prop, 1), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemCreate(nullptr, kG, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemCreate(&h, kG, nullptr, 0), CUDA_ERROR_INVALID_VALUE);
    CUmemAllocationProp bad = prop;
    bad.location.id = devices;
    CU_REQUIRE_ERR(cuMemCreate(&h, kG, &bad, 0), CUDA_ERROR_INVALID_DEVICE);
    bad = prop;
    bad.type = CU_MEM_ALLOCATION_TYPE_INVALID;
    CU_REQUIRE_ERR(cuMemCreate(&h, kG, &bad, 0), CUDA_ERROR_INVALID_VALUE);
    bad = prop;
    bad.requestedHandleTypes = CU_MEM_HANDLE_TYPE_WIN32;
    CU_REQUIRE_ERR(cuMemCreate(&h, kG, &bad, 0), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemRelease(0), CUDA_ERROR_INVALID_VALUE);
  }
  SECTION("mappings") {
    const CUdeviceptr va = vmm.reserve(4 * kG);
    const CUmemGenericAllocationHandle big = vmm.create(2 * kG);
    const CUmemGenericAllocationHandle small = vmm.create(kG);
    CU_REQUIRE_ERR(cuMemMap(va, 2 * kG, 0, big, 1), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemMap(va, 0, 0, big, 0), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemMap(0, 2 * kG, 0, big, 0), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemMap(va, kG, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    // Part of an allocation, at an offset, or more than it: the driver maps whole
    // allocations only.
    CU_REQUIRE_ERR(cuMemMap(va, 4096, 0, big, 0), CUDA_ERROR_NOT_SUPPORTED);
    CU_REQUIRE_ERR(cuMemMap(va, kG, 0, big, 0), CUDA_ERROR_NOT_SUPPORTED);
    CU_REQUIRE_ERR(cuMemMap(va + 2 * kG, kG, kG, big, 0), CUDA_ERROR_NOT_SUPPORTED);
    CU_REQUIRE_ERR(cuMemMap(va, 4 * kG, 0, big, 0), CUDA_ERROR_NOT_SUPPORTED);
    // A misaligned address, or one outside every reservation.
    CU_REQUIRE_ERR(cuMemMap(va + 4096, 2 * kG, 0, big, 0), CUDA_ERROR_INVALID_VALUE);
    // (Far from any address space the driver manages: it accepts mappings that run past a
    // reservation's end into address space it reserved for itself.)
    const CUdeviceptr nowhere = 0x7e0000000000;
    CU_REQUIRE_ERR(cuMemMap(nowhere, 2 * kG, 0, big, 0), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemUnmap(nowhere, 2 * kG), CUDA_ERROR_INVALID_VALUE);

    vmm.map(va, 2 * kG, big);
    // Overlaps with a mapping.
    CU_REQUIRE_ERR(cuMemMap(va, kG, 0, small, 0), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemMap(va + kG, kG, 0, small, 0), CUDA_ERROR_INVALID_VALUE);
    vmm.map(va + 3 * kG, kG, small);

    // Access and unmapping go by whole mappings.
    const CUmemAccessDesc rw = access_desc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CU_REQUIRE_ERR(cuMemSetAccess(va, kG, &rw, 1), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemSetAccess(va + 2 * kG, kG, &rw, 1), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemSetAccess(va, 4096, &rw, 1), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemSetAccess(va, 2 * kG, &rw, 0), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemSetAccess(va, 2 * kG, nullptr, 1), CUDA_ERROR_INVALID_VALUE);
    CUmemAccessDesc bad = rw;
    bad.flags = static_cast<CUmemAccess_flags>(7);
    CU_REQUIRE_ERR(cuMemSetAccess(va, 2 * kG, &bad, 1), CUDA_ERROR_INVALID_VALUE);
    bad = rw;
    bad.location.id = devices;
    CU_REQUIRE_ERR(cuMemSetAccess(va, 2 * kG, &bad, 1), CUDA_ERROR_INVALID_VALUE);
    bad = rw;
    bad.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CU_REQUIRE_ERR(cuMemSetAccess(va, kG, &bad, 1), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemSetAccess(va, 2 * kG, &bad, 1), CUDA_ERROR_NOT_SUPPORTED);
    CU_REQUIRE(cuMemSetAccess(va, 2 * kG, &rw, 1));

    unsigned long long flags = 0;
    const CUmemLocation loc{CU_MEM_LOCATION_TYPE_DEVICE, 0};
    const CUmemLocation far{CU_MEM_LOCATION_TYPE_DEVICE, devices};
    CU_REQUIRE_ERR(cuMemGetAccess(nullptr, &loc, va), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemGetAccess(&flags, nullptr, va), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemGetAccess(&flags, &loc, 0), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemGetAccess(&flags, &loc, va + 2 * kG), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemGetAccess(&flags, &far, va), CUDA_ERROR_INVALID_DEVICE);

    CU_REQUIRE_ERR(cuMemUnmap(va, kG), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemUnmap(va + 4096, 2 * kG), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuMemUnmap(va, 0), CUDA_ERROR_INVALID_VALUE);
    // The address space goes only once nothing is mapped in it.
    CU_REQUIRE_ERR(cuMemAddressFree(va, 4 * kG), CUDA_ERROR_INVALID_VALUE);
    vmm.unmap(va, 2 * kG);
    CU_REQUIRE_ERR(cuMemAddressFree(va, 4 * kG), CUDA_ERROR_INVALID_VALUE);
    vmm.unmap(va + 3 * kG, kG);
    vmm.free(va, 4 * kG);
  }
}

TEST_CASE("VMM objects belong to no context", "[gpu_double][vmm]") {
  CU_REQUIRE(cuInit(0));
  CUcontext first = nullptr;
  CU_REQUIRE(cuCtxCreate(&first, nullptr, 0, 0));
  Vmm vmm;
  const CUdeviceptr va = vmm.mapped(kG);
  CU_REQUIRE(cuCtxDestroy(first));
  ScopedContext second;
  CU_REQUIRE(cuMemsetD8(va, 0x42, kG));
  unsigned char c = 0;
  CU_REQUIRE(cuMemcpyDtoH(&c, va + kG - 1, 1));
  CHECK(c == 0x42);

  // Nor do they need a current context at all.
  CUresult results[8] = {};
  std::thread([&] {
    const CUmemAllocationProp prop = device_prop();
    const CUmemAccessDesc rw = access_desc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CUdeviceptr p = 0;
    CUmemGenericAllocationHandle h = 0;
    size_t g = 0;
    results[0] = cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    results[1] = cuMemAddressReserve(&p, kG, 0, 0, 0);
    results[2] = cuMemCreate(&h, kG, &prop, 0);
    results[3] = cuMemMap(p, kG, 0, h, 0);
    results[4] = cuMemSetAccess(p, kG, &rw, 1);
    results[5] = cuMemUnmap(p, kG);
    results[6] = cuMemRelease(h);
    results[7] = cuMemAddressFree(p, kG);
  }).join();
  for (CUresult r : results) CHECK(error_name(r) == "CUDA_SUCCESS");
}

TEST_CASE("cuGetProcAddress resolves the VMM functions", "[gpu_double][vmm]") {
  CU_REQUIRE(cuInit(0));
  const char* names[] = {"cuMemGetAllocationGranularity", "cuMemAddressReserve", "cuMemAddressFree",
                         "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemSetAccess",
                         "cuMemGetAccess", "cuMemGetAllocationPropertiesFromHandle",
                         "cuMemRetainAllocationHandle", "cuMemExportToShareableHandle",
                         "cuMemImportFromShareableHandle"};
  for (const char* name : names) {
    INFO(name);
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status{};
    CU_REQUIRE(cuGetProcAddress(name, &fn, 13000, 0, &status));
    CHECK(fn != nullptr);
  }
  void* fn = nullptr;
  CU_REQUIRE(cuGetProcAddress("cuMemCreate", &fn, 10020, 0, nullptr));
  CHECK(fn != nullptr);
}

// ---- where the double is stricter than the driver ----------------------------------------

TEST_CASE("the double refuses VMM handles that are gone or made up",
          "[gpu_double][vmm][double_only]") {
  // The driver answers for any handle value here (reading freed memory); the double knows.
  ScopedContext ctx;
  const CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle h = 0;
  CU_REQUIRE(cuMemCreate(&h, kG, &prop, 0));
  CU_REQUIRE(cuMemRelease(h));
  CUmemAllocationProp got{};
  CU_REQUIRE_ERR(cuMemGetAllocationPropertiesFromHandle(&got, h), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemGetAllocationPropertiesFromHandle(&got, 0x1234), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemRelease(0x1234), CUDA_ERROR_INVALID_VALUE);
  CUdeviceptr va = 0;
  CU_REQUIRE(cuMemAddressReserve(&va, kG, 0, 0, 0));
  CU_REQUIRE_ERR(cuMemMap(va, kG, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
  int fd = -1;
  CU_REQUIRE_ERR(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuMemAddressFree(va, kG));
}

TEST_CASE("the double sets access only on fully mapped ranges, and maps across adjacent "
          "reservations",
          "[gpu_double][vmm][double_only]") {
  // The driver accepts a range with an unmapped hole but then gives access to the mappings
  // before the hole only; the double refuses the call.
  ScopedContext ctx;
  Vmm vmm;
  const CUdeviceptr va = vmm.reserve(4 * kG);
  const CUmemGenericAllocationHandle a = vmm.create(kG);
  const CUmemGenericAllocationHandle b = vmm.create(kG);
  vmm.map(va, kG, a);
  vmm.map(va + 2 * kG, kG, b);
  const CUmemAccessDesc rw = access_desc(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CU_REQUIRE_ERR(cuMemSetAccess(va, 3 * kG, &rw, 1), CUDA_ERROR_INVALID_VALUE);
  CHECK(access_of(va) == CU_MEM_ACCESS_FLAGS_PROT_NONE);
  // Back to back, two mappings take access in one call, and stay two address ranges.
  vmm.map(va + kG, kG, vmm.create(kG));
  CU_REQUIRE(cuMemSetAccess(va, 3 * kG, &rw, 1));
  CUdeviceptr base = 0;
  size_t bytes = 0;
  CU_REQUIRE(cuMemGetAddressRange(&base, &bytes, va + kG + 1));
  CHECK(base == va + kG);
  CHECK(bytes == kG);
  // A copy may run from one mapping into the next (a buffer grown chunk by chunk), as on the
  // driver (tests/programs/drv_vmm.cc asks it); not past the last one.
  std::vector<unsigned char> buf(64, 0x5a), back(64);
  CU_REQUIRE(cuMemcpyHtoD(va + kG - 32, buf.data(), buf.size()));
  CU_REQUIRE(cuMemcpyDtoH(back.data(), va + kG - 32, back.size()));
  CHECK(back == buf);
  CU_REQUIRE_ERR(cuMemcpyHtoD(va + 3 * kG - 32, buf.data(), buf.size()), CUDA_ERROR_INVALID_VALUE);

  // Adjacent reservations (the hint makes them so here) are one range for cuMemMap, as the
  // driver treats them.
  CUdeviceptr lo = 0, hi = 0;
  CU_REQUIRE(cuMemAddressReserve(&lo, kG, 0, 0, 0));
  CU_REQUIRE(cuMemAddressReserve(&hi, kG, 0, lo + kG, 0));
  if (hi == lo + kG) {
    const CUmemGenericAllocationHandle two = vmm.create(2 * kG);
    CU_REQUIRE(cuMemMap(lo, 2 * kG, 0, two, 0));
    CU_REQUIRE_ERR(cuMemAddressFree(hi, kG), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE(cuMemUnmap(lo, 2 * kG));
  }
  CU_REQUIRE(cuMemAddressFree(hi, kG));
  CU_REQUIRE(cuMemAddressFree(lo, kG));
}

TEST_CASE("VMM memory counts against the device's memory", "[gpu_double][vmm][double_only]") {
  ScopedContext ctx;
  size_t free0 = 0, total = 0;
  CU_REQUIRE(cuMemGetInfo(&free0, &total));
  const CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle h = 0;
  CU_REQUIRE(cuMemCreate(&h, 8 * kG, &prop, 0));
  size_t free1 = 0;
  CU_REQUIRE(cuMemGetInfo(&free1, &total));
  CHECK(free0 - free1 == 8 * kG);
  CUmemGenericAllocationHandle too_big = 0;
  CU_REQUIRE_ERR(cuMemCreate(&too_big, total, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CU_REQUIRE(cuMemRelease(h));
  CU_REQUIRE(cuMemGetInfo(&free1, &total));
  CHECK(free1 == free0);
}
