// Allocation bookkeeping, bad pointers, and copies (1D and 2D) checked byte for byte.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "test_support.h"

using namespace ivcuda::gpu_double::test;

namespace {

std::vector<unsigned char> pattern(std::size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(i * 31 + seed);
  return v;
}

size_t free_mem() {
  size_t free = 0, total = 0;
  CU_REQUIRE(cuMemGetInfo(&free, &total));
  return free;
}

CUdeviceptr dptr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

}  // namespace

TEST_CASE("allocations are tracked, and cuMemGetInfo reflects them",
          "[gpu_double][double_only][memory]") {
  ScopedContext ctx;
  size_t free0 = 0, total = 0;
  CU_REQUIRE(cuMemGetInfo(&free0, &total));
  CHECK(total == (size_t{4} << 30));
  CHECK(free0 <= total);

  CUdeviceptr p = 0;
  CU_REQUIRE(cuMemAlloc(&p, 1000));
  CHECK(p % 256 == 0);
  const size_t free1 = free_mem();
  CHECK(free1 <= free0 - 1000);
  CHECK(free1 >= free0 - 4096);

  CUdeviceptr base = 0;
  size_t size = 0;
  CU_REQUIRE(cuMemGetAddressRange(&base, &size, p + 999));
  CHECK(base == p);
  CHECK(size == 1000);
  CU_REQUIRE_ERR(cuMemGetAddressRange(&base, &size, p + 1000), CUDA_ERROR_NOT_FOUND);

  CU_REQUIRE_ERR(cuMemFree(p + 8), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuMemFree(p));
  CHECK(free_mem() == free0);
  CU_REQUIRE_ERR(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuMemFree(0));  // like cudaFree(0)
  CU_REQUIRE_ERR(cuMemGetAddressRange(&base, &size, p), CUDA_ERROR_NOT_FOUND);
}

TEST_CASE("allocation failures use the driver's error codes", "[gpu_double][double_only][memory]") {
  ScopedContext ctx;
  CUdeviceptr p = 0;
  CU_REQUIRE_ERR(cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemAlloc(nullptr, 16), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemAlloc(&p, (size_t{4} << 30) + 1), CUDA_ERROR_OUT_OF_MEMORY);
  CU_REQUIRE_ERR(cuMemAlloc(&p, SIZE_MAX), CUDA_ERROR_OUT_OF_MEMORY);
  size_t pitch = 0;
  CU_REQUIRE_ERR(cuMemAllocPitch(&p, &pitch, 100, 10, 3), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemAllocPitch(&p, &pitch, 0, 10, 4), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemAllocPitch(&p, &pitch, SIZE_MAX / 2, 4, 4), CUDA_ERROR_OUT_OF_MEMORY);
}

TEST_CASE("1D copies move bytes exactly and stop at allocation ends", "[gpu_double][memory]") {
  ScopedContext ctx;
  constexpr size_t kN = 4099;
  CUdeviceptr a = 0, b = 0;
  CU_REQUIRE(cuMemAlloc(&a, kN));
  CU_REQUIRE(cuMemAlloc(&b, kN));
  const auto src = pattern(kN, 3);
  CU_REQUIRE(cuMemcpyHtoD(a, src.data(), kN));
  CU_REQUIRE(cuMemcpyDtoD(b, a, kN));
  std::vector<unsigned char> back(kN, 0);
  CU_REQUIRE(cuMemcpyDtoH(back.data(), b, kN));
  CHECK(back == src);

  // A window ending exactly at the end is fine; one byte more is not, and copies nothing.
  CU_REQUIRE(cuMemcpyHtoD(a + 100, src.data(), kN - 100));
  std::vector<unsigned char> marker(kN + 1, 0xEE);
  CU_REQUIRE_ERR(cuMemcpyHtoD(a + 100, marker.data(), kN - 99), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemcpyDtoH(back.data(), a, kN + 1), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemcpyDtoD(b, a + 1, kN), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuMemcpyDtoH(back.data(), a + 100, kN - 100));
  CHECK(std::equal(back.begin(), back.begin() + (kN - 100), src.begin()));

  CU_REQUIRE(cuMemcpyHtoD(a, src.data(), 0));
  CU_REQUIRE(cuMemcpyHtoD(0, src.data(), 0));  // empty copies succeed whatever the pointers
  CU_REQUIRE_ERR(cuMemcpyHtoD(a, nullptr, 4), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemcpyDtoH(nullptr, a, 4), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemcpyHtoD(0, src.data(), 4), CUDA_ERROR_INVALID_VALUE);
  int on_stack = 0;
  CU_REQUIRE_ERR(cuMemcpyDtoH(back.data(), dptr(&on_stack), 4), CUDA_ERROR_INVALID_VALUE);

  // Async forms: same checks plus the stream handle.
  CUstream s = nullptr;
  CU_REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const auto src2 = pattern(kN, 9);
  CU_REQUIRE(cuMemcpyHtoDAsync(a, src2.data(), kN, s));
  CU_REQUIRE(cuMemcpyDtoDAsync(b, a, kN, s));
  CU_REQUIRE(cuMemcpyDtoHAsync(back.data(), b, kN, s));
  CU_REQUIRE(cuStreamSynchronize(s));
  CHECK(back == src2);
  CU_REQUIRE(cuStreamDestroy(s));
  CU_REQUIRE(cuMemFree(a));
  CU_REQUIRE(cuMemFree(b));
}

TEST_CASE("cuMemcpy infers each side's kind from the address", "[gpu_double][memory]") {
  ScopedContext ctx;
  CUdeviceptr d = 0;
  CU_REQUIRE(cuMemAlloc(&d, 64));
  const auto src = pattern(64, 1);
  std::vector<unsigned char> host(64, 0), host2(64, 0);
  CU_REQUIRE(cuMemcpy(d, dptr(src.data()), 64));
  CU_REQUIRE(cuMemcpy(dptr(host.data()), d, 64));
  CHECK(host == src);
  CU_REQUIRE(cuMemcpyAsync(dptr(host2.data()), dptr(host.data()), 64, nullptr));
  CHECK(host2 == src);
  CU_REQUIRE_ERR(cuMemcpy(dptr(host.data()), d, 65), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemcpy(0, d, 4), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuMemFree(d));
}

TEST_CASE("memsets fill exact element counts with alignment checks", "[gpu_double][memory]") {
  ScopedContext ctx;
  CUdeviceptr d = 0;
  CU_REQUIRE(cuMemAlloc(&d, 64));
  std::vector<unsigned char> back(64);

  CU_REQUIRE(cuMemsetD8(d, 0xAB, 64));
  CU_REQUIRE(cuMemsetD8(d + 1, 0x11, 2));
  CU_REQUIRE(cuMemcpyDtoH(back.data(), d, 64));
  CHECK(back[0] == 0xAB);
  CHECK(back[1] == 0x11);
  CHECK(back[2] == 0x11);
  CHECK(back[3] == 0xAB);

  CU_REQUIRE(cuMemsetD16(d, 0xBEEF, 32));
  std::vector<std::uint16_t> h16(32);
  CU_REQUIRE(cuMemcpyDtoH(h16.data(), d, 64));
  CHECK(std::all_of(h16.begin(), h16.end(), [](auto v) { return v == 0xBEEF; }));

  CU_REQUIRE(cuMemsetD32Async(d, 0xDEADBEEF, 16, nullptr));
  std::vector<std::uint32_t> h32(16);
  CU_REQUIRE(cuMemcpyDtoH(h32.data(), d, 64));
  CHECK(std::all_of(h32.begin(), h32.end(), [](auto v) { return v == 0xDEADBEEFu; }));
  CU_REQUIRE(cuMemsetD8Async(d, 0, 64, nullptr));
  CU_REQUIRE(cuMemsetD16Async(d, 1, 32, nullptr));

  CU_REQUIRE_ERR(cuMemsetD16(d + 1, 0, 2), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemsetD32(d + 2, 0, 2), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemsetD32(d, 0, 17), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemsetD8(d + 64, 0, 1), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuMemFree(d));
}

TEST_CASE("2D copies honour pitches, offsets and bounds", "[gpu_double][memory]") {
  ScopedContext ctx;
  constexpr size_t kWidth = 100, kHeight = 7;
  CUdeviceptr d = 0;
  size_t pitch = 0;
  CU_REQUIRE(cuMemAllocPitch(&d, &pitch, kWidth, kHeight, 4));
  CHECK(pitch >= kWidth);
  CHECK(pitch % 32 == 0);

  constexpr size_t kHostPitch = 130;
  const auto host = pattern(kHostPitch * kHeight, 5);
  CUDA_MEMCPY2D up{};
  up.srcMemoryType = CU_MEMORYTYPE_HOST;
  up.srcHost = host.data();
  up.srcPitch = kHostPitch;
  up.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  up.dstDevice = d;
  up.dstPitch = pitch;
  up.WidthInBytes = kWidth;
  up.Height = kHeight;
  CU_REQUIRE(cuMemcpy2D(&up));

  // Back down a window: rows 2..5, bytes 10..59, into a tight host buffer.
  std::vector<unsigned char> win(50 * 4, 0);
  CUDA_MEMCPY2D down{};
  down.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  down.srcDevice = d;
  down.srcPitch = pitch;
  down.srcXInBytes = 10;
  down.srcY = 2;
  down.dstMemoryType = CU_MEMORYTYPE_HOST;
  down.dstHost = win.data();
  down.dstPitch = 50;
  down.WidthInBytes = 50;
  down.Height = 4;
  CU_REQUIRE(cuMemcpy2DUnaligned(&down));
  for (size_t r = 0; r < 4; ++r)
    for (size_t c = 0; c < 50; ++c) {
      INFO("row " << r << " col " << c);
      REQUIRE(win[r * 50 + c] == host[(r + 2) * kHostPitch + 10 + c]);
    }

  // Device to device with the unified type, async.
  CUdeviceptr d2 = 0;
  CU_REQUIRE(cuMemAlloc(&d2, kWidth * kHeight));
  CUDA_MEMCPY2D dd{};
  dd.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
  dd.srcDevice = d;
  dd.srcPitch = pitch;
  dd.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
  dd.dstDevice = d2;
  dd.dstPitch = kWidth;
  dd.WidthInBytes = kWidth;
  dd.Height = kHeight;
  CU_REQUIRE(cuMemcpy2DAsync(&dd, nullptr));
  std::vector<unsigned char> tight(kWidth * kHeight);
  CU_REQUIRE(cuMemcpyDtoH(tight.data(), d2, tight.size()));
  for (size_t r = 0; r < kHeight; ++r)
    REQUIRE(std::equal(tight.begin() + r * kWidth, tight.begin() + (r + 1) * kWidth,
                       host.begin() + r * kHostPitch));

  // One row too many for the tight destination; a row wider than its pitch; an array.
  CUDA_MEMCPY2D bad = dd;
  bad.Height = kHeight + 1;
  bad.srcMemoryType = CU_MEMORYTYPE_HOST;
  std::vector<unsigned char> big(pitch * (kHeight + 1));
  bad.srcHost = big.data();
  CU_REQUIRE_ERR(cuMemcpy2D(&bad), CUDA_ERROR_INVALID_VALUE);
  bad = up;
  bad.WidthInBytes = kHostPitch + 1;
  CU_REQUIRE_ERR(cuMemcpy2D(&bad), CUDA_ERROR_INVALID_VALUE);
  bad = up;
  bad.dstXInBytes = pitch - 10;  // x + width past the pitch
  CU_REQUIRE_ERR(cuMemcpy2D(&bad), CUDA_ERROR_INVALID_VALUE);
  bad = up;
  bad.Height = 1;
  bad.srcPitch = 0;  // a single row needs no pitch
  CU_REQUIRE(cuMemcpy2D(&bad));
  if (on_double()) {  // CUDA arrays are not emulated
    bad = up;
    bad.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    CU_REQUIRE_ERR(cuMemcpy2D(&bad), CUDA_ERROR_NOT_SUPPORTED);
  }
  CU_REQUIRE_ERR(cuMemcpy2D(nullptr), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuMemFree(d));
  CU_REQUIRE(cuMemFree(d2));
}

TEST_CASE("pinned host memory is device-addressable at its host address", "[gpu_double][memory]") {
  ScopedContext ctx;
  void* pinned = nullptr;
  CU_REQUIRE(cuMemAllocHost(&pinned, 256));
  void* mapped = nullptr;
  CU_REQUIRE(cuMemHostAlloc(&mapped, 256, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  // Reported as the real driver does: always mapped, never PORTABLE.
  unsigned flags = 0;
  CU_REQUIRE(cuMemHostGetFlags(&flags, mapped));
  CHECK(flags == CU_MEMHOSTALLOC_DEVICEMAP);
  CU_REQUIRE(cuMemHostGetFlags(&flags, pinned));
  CHECK(flags == CU_MEMHOSTALLOC_DEVICEMAP);
  void* wc = nullptr;
  CU_REQUIRE(cuMemHostAlloc(&wc, 64, CU_MEMHOSTALLOC_WRITECOMBINED));
  CU_REQUIRE(cuMemHostGetFlags(&flags, static_cast<char*>(wc) + 8));
  CHECK(flags == (CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED));
  CU_REQUIRE_ERR(cuMemFreeHost(static_cast<char*>(wc) + 8), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuMemFreeHost(wc));
  void* empty = nullptr;
  CU_REQUIRE(cuMemAllocHost(&empty, 0));  // allowed, unlike cuMemAlloc(0)
  CU_REQUIRE(cuMemFreeHost(empty));
  CUdeviceptr alias = 0;
  CU_REQUIRE(cuMemHostGetDevicePointer(&alias, mapped, 0));
  CHECK(alias == dptr(mapped));

  const auto src = pattern(256, 2);
  std::memcpy(pinned, src.data(), 256);
  CU_REQUIRE(cuMemcpyDtoD(alias, dptr(pinned), 256));
  CHECK(std::memcmp(mapped, src.data(), 256) == 0);
  CU_REQUIRE_ERR(cuMemcpyDtoD(alias, dptr(pinned), 257), CUDA_ERROR_INVALID_VALUE);

  CU_REQUIRE_ERR(cuMemHostAlloc(&mapped, 16, 0x80), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemFree(alias), CUDA_ERROR_INVALID_VALUE);  // not device memory
  CU_REQUIRE(cuMemFreeHost(pinned));
  CU_REQUIRE(cuMemFreeHost(mapped));
  CU_REQUIRE_ERR(cuMemFreeHost(pinned), CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("registered host memory aliases itself and refuses overlaps", "[gpu_double][memory]") {
  ScopedContext ctx;
  std::vector<unsigned char> buf(8192, 0);
  CU_REQUIRE(cuMemHostRegister(buf.data(), 4096, CU_MEMHOSTREGISTER_DEVICEMAP));
  CUdeviceptr alias = 0;
  CU_REQUIRE(cuMemHostGetDevicePointer(&alias, buf.data() + 100, 0));
  CHECK(alias == dptr(buf.data() + 100));
  CU_REQUIRE_ERR(cuMemHostRegister(buf.data(), 4096, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  CU_REQUIRE_ERR(cuMemHostRegister(buf.data() + 4095, 10, 0),
                 CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  CU_REQUIRE(cuMemHostRegister(buf.data() + 4096, 4096, 0));  // adjacent is fine

  CUdeviceptr d = 0;
  CU_REQUIRE(cuMemAlloc(&d, 4096));
  const auto src = pattern(4096, 7);
  CU_REQUIRE(cuMemcpyHtoD(d, src.data(), 4096));
  CU_REQUIRE(cuMemcpyDtoD(alias - 100, d, 4096));
  CHECK(std::equal(src.begin(), src.end(), buf.begin()));
  CU_REQUIRE_ERR(cuMemcpyDtoD(alias, d, 4096), CUDA_ERROR_INVALID_VALUE);  // past the end

  CU_REQUIRE_ERR(cuMemHostUnregister(buf.data() + 1), CUDA_ERROR_INVALID_VALUE);  // interior
  int elsewhere = 0;
  CU_REQUIRE_ERR(cuMemHostUnregister(&elsewhere), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  CU_REQUIRE(cuMemHostUnregister(buf.data()));
  CU_REQUIRE(cuMemHostUnregister(buf.data() + 4096));
  CU_REQUIRE_ERR(cuMemHostUnregister(buf.data()), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  CU_REQUIRE_ERR(cuMemHostGetDevicePointer(&alias, buf.data(), 0), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemHostRegister(nullptr, 16, 0), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemHostRegister(buf.data(), 16, CU_MEMHOSTREGISTER_IOMEMORY),
                 CUDA_ERROR_INVALID_VALUE);  // ordinary memory is not I/O memory
  CU_REQUIRE(cuMemFree(d));
}

TEST_CASE("concurrent allocation and copies from several threads stay consistent",
          "[gpu_double][memory]") {
  ScopedContext ctx;
  const size_t free0 = free_mem();
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      if (cuCtxSetCurrent(ctx.get()) != CUDA_SUCCESS) {
        ++failures[t];
        return;
      }
      for (int i = 0; i < 200; ++i) {
        CUdeviceptr p = 0;
        const size_t n = 64 + static_cast<size_t>(i);
        std::vector<unsigned char> in(n, static_cast<unsigned char>(t * 50 + i)), out(n, 0);
        if (cuMemAlloc(&p, n) != CUDA_SUCCESS || cuMemcpyHtoD(p, in.data(), n) != CUDA_SUCCESS ||
            cuMemcpyDtoH(out.data(), p, n) != CUDA_SUCCESS || in != out ||
            cuMemFree(p) != CUDA_SUCCESS)
          ++failures[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(std::accumulate(failures.begin(), failures.end(), 0) == 0);
  CHECK(free_mem() == free0);
}

namespace {
CUmemPoolProps pool_props(int device) {
  CUmemPoolProps p{};
  p.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  return p;
}
}  // namespace

TEST_CASE("created pools allocate, keep their own attributes and outlive nothing they handed out",
          "[gpu_double][memory][pools]") {
  ScopedContext ctx;
  const CUmemPoolProps props = pool_props(0);
  CUmemoryPool pool = nullptr, def = nullptr, cur = nullptr;
  CU_REQUIRE(cuMemPoolCreate(&pool, &props));
  CU_REQUIRE(cuDeviceGetDefaultMemPool(&def, 0));
  CHECK(pool != def);
  cuuint64_t threshold = ~cuuint64_t{0}, v = 0;
  CU_REQUIRE(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
  CU_REQUIRE(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
  CHECK(v == threshold);
  CU_REQUIRE(cuMemPoolGetAttribute(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
  CHECK(v == 0);
  CUmemLocation here{CU_MEM_LOCATION_TYPE_DEVICE, 0};
  CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  CU_REQUIRE(cuMemPoolGetAccess(&flags, pool, &here));
  CHECK(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);

  CUdeviceptr p = 0;
  CU_REQUIRE(cuMemAllocFromPoolAsync(&p, 4096, pool, nullptr));
  CU_REQUIRE(cuMemsetD8(p, 7, 4096));
  CU_REQUIRE(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v));
  CHECK(v >= 4096);
  // the current pool is what cuMemAllocAsync draws from; destroying it falls back to the default
  CU_REQUIRE(cuDeviceSetMemPool(0, pool));
  CU_REQUIRE(cuDeviceGetMemPool(&cur, 0));
  CHECK(cur == pool);
  CU_REQUIRE(cuMemPoolDestroy(pool));
  CU_REQUIRE(cuDeviceGetMemPool(&cur, 0));
  CHECK(cur == def);
  unsigned char b = 0;
  CU_REQUIRE(cuMemcpyDtoH(&b, p + 4095, 1));  // still usable after the pool went
  CHECK(b == 7);
  CU_REQUIRE(cuMemFreeAsync(p, nullptr));
  CU_REQUIRE(cuCtxSynchronize());
}

TEST_CASE("created pools: maximum size, access and sharing refusals", "[gpu_double][double_only][memory][pools]") {
  ScopedContext ctx;
  CUmemPoolProps props = pool_props(0);
  props.maxSize = 1 << 20;
  CUmemoryPool pool = nullptr;
  CU_REQUIRE(cuMemPoolCreate(&pool, &props));
  CUdeviceptr p = 0, q = 0;
  CU_REQUIRE(cuMemAllocFromPoolAsync(&p, 768 << 10, pool, nullptr));
  CU_REQUIRE_ERR(cuMemAllocFromPoolAsync(&q, 512 << 10, pool, nullptr), CUDA_ERROR_OUT_OF_MEMORY);
  CUmemAccessDesc d{};
  d.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
  CU_REQUIRE_ERR(cuMemPoolSetAccess(pool, &d, 1), CUDA_ERROR_INVALID_DEVICE);
  d.location.id = 5;
  CU_REQUIRE_ERR(cuMemPoolSetAccess(pool, &d, 1), CUDA_ERROR_INVALID_DEVICE);
  int fd = -1;
  CU_REQUIRE_ERR(cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 CUDA_ERROR_INVALID_VALUE);
  CUmemPoolPtrExportData e{};
  CU_REQUIRE_ERR(cuMemPoolExportPointer(&e, p), CUDA_ERROR_INVALID_VALUE);
  props = pool_props(3);
  CUmemoryPool bad = nullptr;
  CU_REQUIRE_ERR(cuMemPoolCreate(&bad, &props), CUDA_ERROR_INVALID_DEVICE);
  props = pool_props(0);
  props.allocType = CU_MEM_ALLOCATION_TYPE_INVALID;
  CU_REQUIRE_ERR(cuMemPoolCreate(&bad, &props), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuMemFreeAsync(p, nullptr));
  CU_REQUIRE(cuMemPoolDestroy(pool));
  CU_REQUIRE_ERR(cuMemPoolDestroy(pool), CUDA_ERROR_INVALID_VALUE);
  CUmemoryPool def = nullptr;
  CU_REQUIRE(cuDeviceGetDefaultMemPool(&def, 0));
  CU_REQUIRE_ERR(cuMemPoolDestroy(def), CUDA_ERROR_INVALID_VALUE);
}

// The double imports its own exports in the exporting process (the real driver's answer
// there is for drv_pool_share on a GPU to show): double_only. Across processes, the same
// code runs behind ivcudad (tests/process, drv_pool_share).
TEST_CASE("a pool exported as a file descriptor imports, and its pointers import as the same memory",
          "[gpu_double][double_only][memory][pools]") {
  ScopedContext ctx;
  CUmemPoolProps props = pool_props(0);
  props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemoryPool pool = nullptr, other = nullptr;
  CU_REQUIRE(cuMemPoolCreate(&pool, &props));
  CU_REQUIRE(cuMemPoolCreate(&other, &props));
  int fd = -1, other_fd = -1;
  CU_REQUIRE_ERR(cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
                 CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CU_REQUIRE(cuMemPoolExportToShareableHandle(&other_fd, other, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CUmemoryPool imported = nullptr, imported_other = nullptr;
  void* os = reinterpret_cast<void*>(static_cast<std::intptr_t>(fd));
  CU_REQUIRE_ERR(cuMemPoolImportFromShareableHandle(&imported, os, CU_MEM_HANDLE_TYPE_NONE, 0),
                 CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuMemPoolImportFromShareableHandle(&imported, os, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CU_REQUIRE(cuMemPoolImportFromShareableHandle(
      &imported_other, reinterpret_cast<void*>(static_cast<std::intptr_t>(other_fd)),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  ::close(fd);
  ::close(other_fd);
  CHECK(imported != pool);
  // An imported pool hands out nothing and cannot be a device's current pool.
  CUdeviceptr q = 0;
  CU_REQUIRE_ERR(cuMemAllocFromPoolAsync(&q, 4096, imported, nullptr), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuDeviceSetMemPool(0, imported), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemPoolExportToShareableHandle(&fd, imported, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 CUDA_ERROR_INVALID_VALUE);

  CUdeviceptr p = 0;
  CU_REQUIRE(cuMemAllocFromPoolAsync(&p, 3 * 4096 + 100, pool, nullptr));
  const auto data = pattern(3 * 4096 + 100, 9);
  CU_REQUIRE(cuMemcpyHtoD(p, data.data(), data.size()));
  CUmemPoolPtrExportData e{};
  CU_REQUIRE_ERR(cuMemPoolExportPointer(&e, p + 256), CUDA_ERROR_INVALID_VALUE);  // not an allocation's start
  CU_REQUIRE(cuMemPoolExportPointer(&e, p));
  std::vector<unsigned char> back(data.size());
  CU_REQUIRE(cuMemcpyDtoH(back.data(), p, back.size()));
  CHECK(back == data);  // exporting moved the allocation, not its contents

  // Only the pool it came from imports it, whole and untouched.
  CUdeviceptr got = 0;
  CU_REQUIRE_ERR(cuMemPoolImportPointer(&got, pool, &e), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuMemPoolImportPointer(&got, imported_other, &e), CUDA_ERROR_INVALID_VALUE);
  for (std::size_t i : {0u, 4u, 20u}) {
    CUmemPoolPtrExportData bad = e;
    bad.reserved[i] = static_cast<unsigned char>(bad.reserved[i] ^ 0x40);
    CU_REQUIRE_ERR(cuMemPoolImportPointer(&got, imported, &bad), CUDA_ERROR_INVALID_VALUE);
  }
  CU_REQUIRE(cuMemPoolImportPointer(&got, imported, &e));
  CHECK(got != p);
  CUdeviceptr again = 0;
  CU_REQUIRE(cuMemPoolImportPointer(&again, imported, &e));
  CHECK(again == got);
  CU_REQUIRE(cuMemcpyDtoH(back.data(), got, back.size()));
  CHECK(back == data);
  CU_REQUIRE(cuMemsetD8(got + 10, 0xee, 5));
  unsigned char b = 0;
  CU_REQUIRE(cuMemcpyDtoH(&b, p + 12, 1));
  CHECK(b == 0xee);
  CUmemoryPool of = nullptr;
  CU_REQUIRE(cuPointerGetAttribute(&of, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p));
  CHECK(of == pool);
  CU_REQUIRE_ERR(cuMemcpyDtoH(back.data(), got, back.size() + 1), CUDA_ERROR_INVALID_VALUE);

  // The importer frees its mapping (once: imports are not counted); the exporter's memory stays.
  CU_REQUIRE(cuMemFreeAsync(got, nullptr));
  CU_REQUIRE_ERR(cuMemFree(got), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuMemcpyDtoH(&b, p + 12, 1));
  CHECK(b == 0xee);
  CU_REQUIRE(cuMemFreeAsync(p, nullptr));
  CU_REQUIRE(cuMemPoolDestroy(imported));
  CU_REQUIRE(cuMemPoolDestroy(imported_other));
  CU_REQUIRE(cuMemPoolDestroy(other));
  CU_REQUIRE(cuMemPoolDestroy(pool));
}

TEST_CASE("a descriptor that is no exported pool does not import", "[gpu_double][double_only][memory][pools]") {
  ScopedContext ctx;
  int fds[2] = {-1, -1};
  REQUIRE(::pipe(fds) == 0);
  CUmemoryPool p = nullptr;
  CU_REQUIRE_ERR(cuMemPoolImportFromShareableHandle(&p, reinterpret_cast<void*>(std::intptr_t{fds[0]}),
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 CUDA_ERROR_INVALID_VALUE);
  // An exported allocation (VMM) is not an exported pool.
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t g = 0;
  CU_REQUIRE(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle h = 0;
  CU_REQUIRE(cuMemCreate(&h, g, &prop, 0));
  int vmm_fd = -1;
  CU_REQUIRE(cuMemExportToShareableHandle(&vmm_fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  CU_REQUIRE_ERR(cuMemPoolImportFromShareableHandle(&p, reinterpret_cast<void*>(std::intptr_t{vmm_fd}),
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 CUDA_ERROR_INVALID_VALUE);
  ::close(vmm_fd);
  CU_REQUIRE(cuMemRelease(h));
  ::close(fds[0]);
  ::close(fds[1]);
}
