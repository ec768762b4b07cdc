// Memory of the GPU test double. "Device memory" is host memory, so a CUdeviceptr is a host
// address and copies are memcpy; every allocation is tracked so that bad frees, copies past
// an allocation's end and address-range queries behave as on a GPU.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "state.h"
#include "strays.h"

using namespace ivcuda::gpu_double;

namespace {

bool align_up(std::size_t v, std::size_t a, std::size_t* out) {
  if (v > SIZE_MAX - (a - 1)) return false;
  *out = (v + a - 1) / a * a;
  return true;
}

CUresult allocate(State& s, Handle ctx, std::size_t bytes, MemKind kind, unsigned flags,
                  void** out) {
  // The real driver refuses empty device allocations but hands out empty pinned ones.
  if (bytes == 0 && kind == MemKind::kDevice) return CUDA_ERROR_INVALID_VALUE;
  bytes = std::max<std::size_t>(bytes, 1);
  const std::size_t align = kind == MemKind::kDevice ? kDeviceAllocAlign : kHostAllocAlign;
  std::size_t rounded = 0;
  if (!align_up(bytes, align, &rounded)) return CUDA_ERROR_OUT_OF_MEMORY;
  const int device = s.contexts.at(ctx).device;
  std::size_t& used = s.used[static_cast<std::size_t>(device)];
  const bool charged = kind == MemKind::kDevice;
  if (charged && rounded > total_mem() - std::min(total_mem(), used + ledger_others(device))) return CUDA_ERROR_OUT_OF_MEMORY;
  // Device memory comes from a range of its own, as a GPU's does: with the
  // heap's addresses, a device pointer could equal a host pointer of the
  // guest process (another address space), which a real device never does.
  void* p = nullptr;
  std::size_t mapped = 0;
  if (kind == MemKind::kDevice) {
    // A hint that moves on and wraps around in a window of its own, so that
    // a long run (the fuzz harness: millions of processes' worth of
    // allocations in one) reuses addresses: ever new ones grew the page
    // tables of ASan's shadow without bound. Only a hint (not
    // MAP_FIXED_NOREPLACE): a fixed mapping where something lives would fail
    // (state.h: kDeviceWindowBase, and where TSan builds put it).
    static std::uintptr_t next_hint = kDeviceWindowBase;
    if (next_hint + rounded > kDeviceWindowBase + kDeviceWindow) next_hint = kDeviceWindowBase;
    mapped = rounded;
    p = s.reuse_freed(ctx, rounded);  // a small block the context freed, bytes and all
    if (p == nullptr) {
      p = ::mmap(reinterpret_cast<void*>(next_hint), rounded, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      // The next hint: past this one and a 2 MiB gap, 2 MiB-aligned.
      next_hint = (next_hint + rounded + (4u << 20) - 1) & ~std::uintptr_t{(2u << 20) - 1};
      if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    }
  } else {
    p = std::aligned_alloc(align, rounded);
  }
  if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  Allocation a;
  a.mapped = mapped;
  a.base = reinterpret_cast<std::uintptr_t>(p);
  a.size = bytes;
  a.accounted = charged ? rounded : 0;
  a.kind = kind;
  a.ctx = ctx;
  a.device = device;
  a.flags = flags;
  a.storage = p;
  try {
    s.allocations.emplace(a.base, a);
  } catch (...) {
    if (mapped != 0)
      ::munmap(p, mapped);
    else
      std::free(p);
    throw;
  }
  if (charged) {
    used += rounded;
    ledger_publish(device, used);
  }
  *out = p;
  return CUDA_SUCCESS;
}

// Frees the allocation based exactly at p if it is of `kind`. Device frees also take
// pointers imported from another process's pool, which CUDA frees with cuMemFree and
// cuMemFreeAsync (one free unmaps it: the driver does not count imports).
CUresult free_kind(State& s, std::uintptr_t p, MemKind kind, CUresult not_found) {
  const auto it = s.allocations.find(p);
  if (p == 0 || it == s.allocations.end()) return not_found;
  const MemKind k = it->second.kind;
  if (k != kind && !(kind == MemKind::kDevice && k == MemKind::kPoolImport)) return not_found;
  s.release(it);
  return CUDA_SUCCESS;
}

// A pointer of either kind under unified addressing: tracked memory is bounds-checked,
// anything else is taken for pageable host memory.
CUresult check_unified(const State& s, std::uintptr_t p, std::size_t n) {
  if (p == 0) return CUDA_ERROR_INVALID_VALUE;
  if (s.find(p) == nullptr) return CUDA_SUCCESS;
  return check_device_range(s, p, n);
}

CUresult check_host(const void* p) {
  return p == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

void* as_ptr(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)); }

// Shared body of every 1D copy. The double runs everything at once, so the async forms
// differ only in the stream check.
template <class CheckDst, class CheckSrc>
CUresult copy(State& s, void* dst, const void* src, std::size_t n, const CUstream* stream,
              CheckDst check_dst, CheckSrc check_src) {
  Handle ctx = 0;
  if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
  if (stream != nullptr)
    if (const CUresult r = check_stream(s, *stream); r != CUDA_SUCCESS) return r;
  if (n == 0) return CUDA_SUCCESS;  // whatever the pointers, as the real driver does
  if (dst == nullptr || src == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (const CUresult r = check_dst(n); r != CUDA_SUCCESS) return r;
  if (const CUresult r = check_src(n); r != CUDA_SUCCESS) return r;
  std::memmove(dst, src, n);
  return CUDA_SUCCESS;
}

template <class T>
CUresult memset_n(CUdeviceptr dst, T value, std::size_t count, const CUstream* stream) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    if (stream != nullptr)
      if (const CUresult r = check_stream(s, *stream); r != CUDA_SUCCESS) return r;
    if (dst % sizeof(T) != 0 || count > SIZE_MAX / sizeof(T)) return CUDA_ERROR_INVALID_VALUE;
    if (count == 0) return CUDA_SUCCESS;
    if (const CUresult r = check_device_range(s, dst, count * sizeof(T)); r != CUDA_SUCCESS)
      return r;
    auto* p = static_cast<unsigned char*>(as_ptr(dst));
    std::size_t bytes = count * sizeof(T);
    // Zeroing whole pages of private device memory (a kept context's scrub
    // zeroes all a guest held): the kernel's zero pages, rather than touching
    // (and so committing) every page of a mapping made with MAP_NORESERVE.
    if (value == T{} && bytes >= (std::size_t{1} << 20)) {
      const Allocation* a = s.find(dst, bytes);
      const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
      const std::uintptr_t from = (dst + page - 1) & ~(page - 1), to = (dst + bytes) & ~(page - 1);
      if (a != nullptr && a->kind == MemKind::kDevice && a->mapped != 0 && a->ipc_fd < 0 && from < to &&
          ::madvise(reinterpret_cast<void*>(from), to - from, MADV_DONTNEED) == 0) {
        std::memset(p, 0, from - dst);
        std::memset(reinterpret_cast<unsigned char*>(to), 0, dst + bytes - to);
        return CUDA_SUCCESS;
      }
    }
    for (std::size_t i = 0; i < count; ++i) std::memcpy(p + i * sizeof(T), &value, sizeof(T));
    return CUDA_SUCCESS;
  });
}

struct Plane {
  unsigned char* row0 = nullptr;  // first byte touched
  std::size_t pitch = 0;
};

// Resolves one side of a 2D copy and checks that every row it touches is in bounds.
CUresult plane(const State& s, CUmemorytype type, const void* host, CUdeviceptr device,
               std::size_t x, std::size_t y, std::size_t pitch, std::size_t width,
               std::size_t height, Plane* out) {
  // Rows may not overlap each other, and the API caps pitches at MAX_PITCH. A single row
  // needs no pitch (the real driver agrees).
  if (height > 1 && (pitch > 2147483647u || x > pitch || width > pitch - x))
    return CUDA_ERROR_INVALID_VALUE;
  std::size_t first = 0, span = 0;
  if (__builtin_mul_overflow(y, pitch, &first) || __builtin_add_overflow(first, x, &first) ||
      __builtin_mul_overflow(height - 1, pitch, &span) ||
      __builtin_add_overflow(span, width, &span))
    return CUDA_ERROR_INVALID_VALUE;
  std::uintptr_t base = 0;
  bool tracked = false;
  switch (type) {
    case CU_MEMORYTYPE_HOST: base = reinterpret_cast<std::uintptr_t>(host); break;
    case CU_MEMORYTYPE_DEVICE:
      base = static_cast<std::uintptr_t>(device);
      tracked = true;
      break;
    case CU_MEMORYTYPE_UNIFIED:
      base = static_cast<std::uintptr_t>(device);
      tracked = s.find(base) != nullptr;
      break;
    case CU_MEMORYTYPE_ARRAY: return CUDA_ERROR_NOT_SUPPORTED;  // CUDA arrays are not emulated
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  std::uintptr_t start = 0;
  if (base == 0 || __builtin_add_overflow(base, first, &start)) return CUDA_ERROR_INVALID_VALUE;
  if (tracked)
    if (const CUresult r = check_device_range(s, start, span); r != CUDA_SUCCESS) return r;
  out->row0 = reinterpret_cast<unsigned char*>(start);
  out->pitch = pitch;
  return CUDA_SUCCESS;
}

CUresult copy_2d(const CUDA_MEMCPY2D* p, const CUstream* stream) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    if (stream != nullptr)
      if (const CUresult r = check_stream(s, *stream); r != CUDA_SUCCESS) return r;
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const CUDA_MEMCPY2D c = *p;
    if (c.WidthInBytes == 0 || c.Height == 0) return CUDA_SUCCESS;
    Plane src, dst;
    if (const CUresult r = plane(s, c.srcMemoryType, c.srcHost, c.srcDevice, c.srcXInBytes, c.srcY,
                                 c.srcPitch, c.WidthInBytes, c.Height, &src);
        r != CUDA_SUCCESS)
      return r;
    if (const CUresult r = plane(s, c.dstMemoryType, c.dstHost, c.dstDevice, c.dstXInBytes, c.dstY,
                                 c.dstPitch, c.WidthInBytes, c.Height, &dst);
        r != CUDA_SUCCESS)
      return r;
    for (std::size_t row = 0; row < c.Height; ++row)
      std::memmove(dst.row0 + row * dst.pitch, src.row0 + row * src.pitch, c.WidthInBytes);
    return CUDA_SUCCESS;
  });
}

}  // namespace

CUresult ivcuda::gpu_double::graph_mem_alloc(State& s, Handle ctx, std::size_t bytes, CUdeviceptr* out) {
  void* p = nullptr;
  if (const CUresult r = allocate(s, ctx, bytes, MemKind::kDevice, 0, &p); r != CUDA_SUCCESS) return r;
  *out = reinterpret_cast<std::uintptr_t>(p);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  return guarded([&](State& s) -> CUresult {
    if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    if (const CUresult r = unsafe_during_capture(s); r != CUDA_SUCCESS) return r;
    void* p = nullptr;
    if (const CUresult r = allocate(s, ctx, bytesize, MemKind::kDevice, 0, &p); r != CUDA_SUCCESS)
      return r;
    *dptr = reinterpret_cast<std::uintptr_t>(p);
    return CUDA_SUCCESS;
  });
}

// Managed memory, for programs run on the double directly (ivcuda-bench's
// native side in CI): the double's device memory is this process's own, so
// the CPU may touch it at any time. Advice, prefetches and attachment are
// not modelled; the guest library builds managed memory itself.
CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
  if (bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  return cuMemAlloc_v2(dptr, bytesize);
}

CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pPitch, size_t WidthInBytes,
                                    size_t Height, unsigned int ElementSizeBytes) {
  return guarded([&](State& s) -> CUresult {
    if (dptr == nullptr || pPitch == nullptr || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
      return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    std::size_t pitch = 0, bytes = 0;
    if (!align_up(WidthInBytes, kPitchAlign, &pitch) ||
        __builtin_mul_overflow(pitch, Height, &bytes))
      return CUDA_ERROR_OUT_OF_MEMORY;
    void* p = nullptr;
    if (const CUresult r = allocate(s, ctx, bytes, MemKind::kDevice, 0, &p); r != CUDA_SUCCESS)
      return r;
    *dptr = reinterpret_cast<std::uintptr_t>(p);
    *pPitch = pitch;
    return CUDA_SUCCESS;
  });
}

namespace {
// A pool's reserve: freed memory it keeps (up to its release threshold) stays
// the device's used memory, as a driver's pool keeps it mapped; a trim, a
// lower threshold, reuse or the pool's end gives it back.
void pool_give_back(State& s, Pool& p, cuuint64_t bytes) {
  bytes = std::min(bytes, p.kept);
  if (bytes == 0) return;
  p.kept -= bytes;
  std::size_t& used = s.used[static_cast<std::size_t>(p.device)];
  used -= std::min<std::size_t>(used, bytes);
  ledger_publish(p.device, used);
}

// Frees a device allocation; one of a pool with a release threshold leaves its bytes with the pool.
CUresult free_device(State& s, CUdeviceptr dptr) {
  const auto a = s.allocations.find(static_cast<std::uintptr_t>(dptr));
  const Handle pool = a != s.allocations.end() ? a->second.pool : 0;
  const std::size_t bytes = a != s.allocations.end() ? a->second.accounted : 0;
  const CUresult r = free_kind(s, static_cast<std::uintptr_t>(dptr), MemKind::kDevice, CUDA_ERROR_INVALID_VALUE);
  const auto p = s.pools.find(pool);
  if (r != CUDA_SUCCESS || pool == 0 || p == s.pools.end() || p->second.release_threshold <= p->second.kept) return r;
  const cuuint64_t keep = std::min<cuuint64_t>(bytes, p->second.release_threshold - p->second.kept);
  p->second.kept += keep;
  std::size_t& used = s.used[static_cast<std::size_t>(p->second.device)];
  used += keep;
  ledger_publish(p->second.device, used);
  return r;
}
}  // namespace

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    if (dptr == 0) return CUDA_SUCCESS;  // as cudaFree(0), and the real driver
    return free_device(s, dptr);
  });
}

CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  return guarded([&](State& s) -> CUresult {
    if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    *total = total_mem();
    const int device = s.contexts.at(ctx).device;
    *free = total_mem() - std::min(total_mem(), s.used[static_cast<std::size_t>(device)] + ledger_others(device));
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize, CUdeviceptr dptr) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    const Allocation* a = s.find(static_cast<std::uintptr_t>(dptr));
    if (a == nullptr) return CUDA_ERROR_NOT_FOUND;
    if (pbase != nullptr) *pbase = a->base;
    if (psize != nullptr) *psize = a->size;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytesize, unsigned int Flags) {
  return guarded([&](State& s) -> CUresult {
    constexpr unsigned kKnown =
        CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
    if (pp == nullptr || (Flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    return allocate(s, ctx, bytesize, MemKind::kPinnedHost, Flags, pp);
  });
}

CUresult CUDAAPI cuMemAllocHost_v2(void** pp, size_t bytesize) {
  return cuMemHostAlloc(pp, bytesize, 0);
}

CUresult CUDAAPI cuMemFreeHost(void* p) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    return free_kind(s, reinterpret_cast<std::uintptr_t>(p), MemKind::kPinnedHost,
                     CUDA_ERROR_INVALID_VALUE);
  });
}

CUresult CUDAAPI cuMemHostRegister_v2(void* p, size_t bytesize, unsigned int Flags) {
  return guarded([&](State& s) -> CUresult {
    constexpr unsigned kKnown = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
    if (p == nullptr || bytesize == 0 || (Flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
    // Only PCI BAR memory may be registered as I/O memory, and the double has none; the real
    // driver answers the same for ordinary memory.
    if ((Flags & CU_MEMHOSTREGISTER_IOMEMORY) != 0) return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    // Potentially unsafe during a capture, as on the H200 (a registration in global mode
    // invalidated another thread's capture there).
    if (const CUresult r = unsafe_during_capture(s); r != CUDA_SUCCESS) return r;
    const auto base = reinterpret_cast<std::uintptr_t>(p);
    if (base > UINTPTR_MAX - bytesize) return CUDA_ERROR_INVALID_VALUE;
    // Overlap with anything tracked: the allocation starting before the range's end must
    // end before the range starts.
    const auto next = s.allocations.lower_bound(base + bytesize);
    if (next != s.allocations.begin()) {
      const Allocation& prev = std::prev(next)->second;
      if (prev.base + prev.size > base) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    Allocation a;
    a.base = base;
    a.size = bytesize;
    a.kind = MemKind::kRegisteredHost;
    a.ctx = ctx;
    a.device = s.contexts.at(ctx).device;
    a.flags = Flags;
    s.allocations.emplace(base, a);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemHostUnregister(void* p) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    if (const CUresult r = unsafe_during_capture(s); r != CUDA_SUCCESS) return r;
    // Inside a registration but not its start: INVALID_VALUE, as the real driver says.
    const Allocation* a = s.find(reinterpret_cast<std::uintptr_t>(p));
    if (a != nullptr && a->kind == MemKind::kRegisteredHost &&
        a->base != reinterpret_cast<std::uintptr_t>(p))
      return CUDA_ERROR_INVALID_VALUE;
    return free_kind(s, reinterpret_cast<std::uintptr_t>(p), MemKind::kRegisteredHost,
                     CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  });
}

CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr* pdptr, void* p, unsigned int Flags) {
  return guarded([&](State& s) -> CUresult {
    if (pdptr == nullptr || p == nullptr || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    const Allocation* a = s.find(reinterpret_cast<std::uintptr_t>(p));
    if (a == nullptr || (a->kind != MemKind::kPinnedHost && a->kind != MemKind::kRegisteredHost))
      return CUDA_ERROR_INVALID_VALUE;
    *pdptr = reinterpret_cast<std::uintptr_t>(p);  // unified addressing: the alias is p
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemHostGetFlags(unsigned int* pFlags, void* p) {
  return guarded([&](State& s) -> CUresult {
    if (pFlags == nullptr || p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    const Allocation* a = s.find(reinterpret_cast<std::uintptr_t>(p));
    if (a == nullptr || a->kind != MemKind::kPinnedHost) return CUDA_ERROR_INVALID_VALUE;
    // The real driver reports every pinned allocation as mapped (unified addressing) and
    // never reports PORTABLE.
    *pFlags =
        (a->flags | CU_MEMHOSTALLOC_DEVICEMAP) & ~static_cast<unsigned>(CU_MEMHOSTALLOC_PORTABLE);
    return CUDA_SUCCESS;
  });
}

// ---- 1D copies -------------------------------------------------------------------------

namespace {

CUresult htod(CUdeviceptr dst, const void* src, std::size_t n, const CUstream* stream) {
  return guarded([&](State& s) {
    return copy(
        s, as_ptr(dst), src, n, stream,
        [&](std::size_t k) { return check_device_range(s, dst, k); },
        [&](std::size_t) { return check_host(src); });
  });
}

CUresult dtoh(void* dst, CUdeviceptr src, std::size_t n, const CUstream* stream) {
  return guarded([&](State& s) {
    return copy(
        s, dst, as_ptr(src), n, stream, [&](std::size_t) { return check_host(dst); },
        [&](std::size_t k) { return check_device_range(s, src, k); });
  });
}

CUresult dtod(CUdeviceptr dst, CUdeviceptr src, std::size_t n, const CUstream* stream) {
  return guarded([&](State& s) {
    return copy(
        s, as_ptr(dst), as_ptr(src), n, stream,
        [&](std::size_t k) { return check_device_range(s, dst, k); },
        [&](std::size_t k) { return check_device_range(s, src, k); });
  });
}

CUresult unified(CUdeviceptr dst, CUdeviceptr src, std::size_t n, const CUstream* stream) {
  return guarded([&](State& s) {
    return copy(
        s, as_ptr(dst), as_ptr(src), n, stream,
        [&](std::size_t k) { return check_unified(s, dst, k); },
        [&](std::size_t k) { return check_unified(s, src, k); });
  });
}

}  // namespace

CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  return htod(dst, src, n, nullptr);
}
CUresult CUDAAPI cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  return dtoh(dst, src, n, nullptr);
}
CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return dtod(dst, src, n, nullptr);
}
// Work given to a capturing stream is recorded (state.h), not run: the closure repeats
// the call, with every argument by value, when the graph is launched.
#define IVC_CAPTURE(stream, call)                                                   \
  do {                                                                              \
    CUresult r_ = CUDA_SUCCESS;                                                     \
    if (capture_call(stream, [=]() -> CUresult { return call; }, &r_)) return r_; \
  } while (0)

CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream h) {
  IVC_CAPTURE(h, cuMemcpyHtoDAsync_v2(dst, src, n, h));
  return htod(dst, src, n, &h);
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream h) {
  IVC_CAPTURE(h, cuMemcpyDtoHAsync_v2(dst, src, n, h));
  return dtoh(dst, src, n, &h);
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
  IVC_CAPTURE(h, cuMemcpyDtoDAsync_v2(dst, src, n, h));
  return dtod(dst, src, n, &h);
}
CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return unified(dst, src, n, nullptr);
}
CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
  IVC_CAPTURE(h, cuMemcpyAsync(dst, src, n, h));
  return unified(dst, src, n, &h);
}

// ---- memsets -----------------------------------------------------------------------------

CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dst, unsigned char uc, size_t N) {
  return memset_n(dst, uc, N, nullptr);
}
CUresult CUDAAPI cuMemsetD16_v2(CUdeviceptr dst, unsigned short us, size_t N) {
  return memset_n(dst, us, N, nullptr);
}
CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dst, unsigned int ui, size_t N) {
  return memset_n(dst, ui, N, nullptr);
}
CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char uc, size_t N, CUstream h) {
  IVC_CAPTURE(h, cuMemsetD8Async(dst, uc, N, h));
  return memset_n(dst, uc, N, &h);
}
CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dst, unsigned short us, size_t N, CUstream h) {
  IVC_CAPTURE(h, cuMemsetD16Async(dst, us, N, h));
  return memset_n(dst, us, N, &h);
}
CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dst, unsigned int ui, size_t N, CUstream h) {
  IVC_CAPTURE(h, cuMemsetD32Async(dst, ui, N, h));
  return memset_n(dst, ui, N, &h);
}

// 2D memsets: row by row, each row checked like a 1D memset.
template <class T>
CUresult memset_2d(CUdeviceptr dst, std::size_t pitch, T value, std::size_t width, std::size_t height,
                   const CUstream* stream) {
  if (height > 1 && pitch < width * sizeof(T)) return CUDA_ERROR_INVALID_VALUE;
  // Nothing to set: the context and stream checks once, not once per row of
  // a height that may be 2^64 - 1 (found by tests/fuzz/worker_fuzz).
  if (width == 0 || height == 0) return memset_n(dst, value, 0, stream);
  for (std::size_t y = 0; y < height; ++y)
    if (const CUresult r = memset_n(dst + y * pitch, value, width, stream); r != CUDA_SUCCESS) return r;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemsetD2D8_v2(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h) {
  return memset_2d(d, pitch, v, w, h, nullptr);
}
CUresult CUDAAPI cuMemsetD2D16_v2(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h) {
  return memset_2d(d, pitch, v, w, h, nullptr);
}
CUresult CUDAAPI cuMemsetD2D32_v2(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h) {
  return memset_2d(d, pitch, v, w, h, nullptr);
}
CUresult CUDAAPI cuMemsetD2D8Async(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t h,
                                   CUstream st) {
  IVC_CAPTURE(st, cuMemsetD2D8Async(d, pitch, v, w, h, st));
  return memset_2d(d, pitch, v, w, h, &st);
}
CUresult CUDAAPI cuMemsetD2D16Async(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t h,
                                    CUstream st) {
  IVC_CAPTURE(st, cuMemsetD2D16Async(d, pitch, v, w, h, st));
  return memset_2d(d, pitch, v, w, h, &st);
}
CUresult CUDAAPI cuMemsetD2D32Async(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t h,
                                    CUstream st) {
  IVC_CAPTURE(st, cuMemsetD2D32Async(d, pitch, v, w, h, st));
  return memset_2d(d, pitch, v, w, h, &st);
}

// ---- 2D copies ---------------------------------------------------------------------------

CUresult CUDAAPI cuMemcpy2D_v2(const CUDA_MEMCPY2D* pCopy) { return copy_2d(pCopy, nullptr); }
CUresult CUDAAPI cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D* pCopy) {
  return copy_2d(pCopy, nullptr);
}
CUresult CUDAAPI cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D* pCopy, CUstream hStream) {
  if (pCopy != nullptr) {
    const CUDA_MEMCPY2D c = *pCopy;
    IVC_CAPTURE(hStream, cuMemcpy2DAsync_v2(&c, hStream));
  }
  return copy_2d(pCopy, &hStream);
}

// ---- stream-ordered memory ---------------------------------------------------------------

namespace {

// The device's default pool, made on first use.
Handle default_pool(State& s, int device) {
  if (s.default_pool.empty()) s.default_pool.assign(static_cast<std::size_t>(s.device_count), 0);
  Handle& h = s.default_pool.at(static_cast<std::size_t>(device));
  if (h == 0) {
    h = s.new_handle();
    Pool p;
    p.device = device;
    s.pools[h] = p;
  }
  return h;
}

CUresult alloc_async(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream stream) {
  return guarded([&](State& s) -> CUresult {
    if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    if (const CUresult r = check_stream(s, stream); r != CUDA_SUCCESS) return r;
    const int device = s.contexts.at(ctx).device;
    Handle p = from_handle(pool);
    if (p == 0) {
      if (s.current_pool.size() > static_cast<std::size_t>(device) && s.current_pool[static_cast<std::size_t>(device)] != 0)
        p = s.current_pool[static_cast<std::size_t>(device)];
      else
        p = default_pool(s, device);
    }
    const auto pit = s.pools.find(p);
    // An explicit pool may belong to another device than the stream's. An imported pool
    // hands out nothing (CUDA: it only imports pointers).
    if (pit == s.pools.end() || (pool == nullptr && pit->second.device != device) || pit->second.imported)
      return CUDA_ERROR_INVALID_VALUE;
    if (pit->second.max_size != 0) {
      cuuint64_t in_use = 0;
      for (const auto& [base, a] : s.allocations)
        if (a.pool == p) in_use += a.size;
      if (bytes > pit->second.max_size || in_use > pit->second.max_size - bytes) return CUDA_ERROR_OUT_OF_MEMORY;
    }
    // Allocated at once, also while capturing: the address must be known to the work
    // captured after it (a graph's allocation node would provide it at launch).
    void* out = nullptr;
    if (const CUresult r = allocate(s, ctx, bytes, MemKind::kDevice, 0, &out); r != CUDA_SUCCESS) return r;
    Allocation& made = s.allocations.at(reinterpret_cast<std::uintptr_t>(out));
    made.pool = p;
    pool_give_back(s, pit->second, made.accounted);  // what the pool kept is used again
    cuuint64_t used = 0;
    for (const auto& [base, a] : s.allocations)
      if (a.pool == p) used += a.size;
    pit->second.used_high = std::max(pit->second.used_high, used);
    *dptr = reinterpret_cast<CUdeviceptr>(out);
    return CUDA_SUCCESS;
  });
}

}  // namespace

CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  return alloc_async(dptr, bytesize, nullptr, hStream);
}

CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                         CUstream hStream) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return alloc_async(dptr, bytesize, pool, hStream);
}

// Freed at once, also while capturing (the double's graphs have no free nodes): work
// recorded earlier that still uses the memory would fault when replayed, so tests free
// captured allocations outside the capture.
CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    if (const CUresult r = check_stream(s, hStream); r != CUDA_SUCCESS) return r;
    return free_device(s, dptr);
  });
}

CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool* pool_out, CUdevice dev) {
  return guarded([&](State& s) -> CUresult {
    if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= s.device_count) return CUDA_ERROR_INVALID_DEVICE;
    *pool_out = to_handle<CUmemPoolHandle_st>(default_pool(s, dev));
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  return guarded([&](State& s) -> CUresult {
    if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= s.device_count) return CUDA_ERROR_INVALID_DEVICE;
    const auto d = static_cast<std::size_t>(dev);
    const Handle cur = s.current_pool.size() > d ? s.current_pool[d] : 0;
    *pool = to_handle<CUmemPoolHandle_st>(cur != 0 ? cur : default_pool(s, dev));
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  return guarded([&](State& s) -> CUresult {
    if (dev < 0 || dev >= s.device_count) return CUDA_ERROR_INVALID_DEVICE;
    const auto it = s.pools.find(from_handle(pool));
    if (it == s.pools.end() || it->second.device != dev || it->second.imported) return CUDA_ERROR_INVALID_VALUE;
    if (s.current_pool.empty()) s.current_pool.assign(static_cast<std::size_t>(s.device_count), 0);
    s.current_pool[static_cast<std::size_t>(dev)] = from_handle(pool);
    return CUDA_SUCCESS;
  });
}

namespace {
cuuint64_t pool_used(const State& s, Handle pool) {
  cuuint64_t used = 0;
  for (const auto& [base, a] : s.allocations)
    if (a.pool == pool) used += a.size;
  return used;
}
}  // namespace

CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  return guarded([&](State& s) -> CUresult {
    const auto it = s.pools.find(from_handle(pool));
    if (it == s.pools.end() || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Pool& p = it->second;
    switch (attr) {
      case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        std::memcpy(&p.reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES], value, sizeof(int));
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        std::memcpy(&p.release_threshold, value, sizeof(cuuint64_t));
        // The driver gives the excess back at the next synchronisation; the double at once.
        if (p.kept > p.release_threshold) pool_give_back(s, p, p.kept - p.release_threshold);
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      case CU_MEMPOOL_ATTR_USED_MEM_HIGH: {
        // Only a reset to 0 is allowed; the watermark restarts from what is in use.
        cuuint64_t v = 0;
        std::memcpy(&v, value, sizeof v);
        if (v != 0) return CUDA_ERROR_INVALID_VALUE;
        p.used_high = pool_used(s, from_handle(pool));
        return CUDA_SUCCESS;
      }
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
  });
}

CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  return guarded([&](State& s) -> CUresult {
    const auto it = s.pools.find(from_handle(pool));
    if (it == s.pools.end() || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const Pool& p = it->second;
    cuuint64_t v = 0;
    switch (attr) {
      case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        std::memcpy(value, &p.reuse[attr - CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES], sizeof(int));
        return CUDA_SUCCESS;
      case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: v = p.release_threshold; break;
      case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: v = pool_used(s, from_handle(pool)) + p.kept; break;
      case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: v = pool_used(s, from_handle(pool)); break;
      case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      case CU_MEMPOOL_ATTR_USED_MEM_HIGH: v = p.used_high; break;
      default: return CUDA_ERROR_INVALID_VALUE;
    }
    std::memcpy(value, &v, sizeof v);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  return guarded([&](State& s) -> CUresult {
    const auto it = s.pools.find(from_handle(pool));
    if (it == s.pools.end()) return CUDA_ERROR_INVALID_VALUE;
    // Reserved bytes above `keep` go, as far as they are unused.
    const cuuint64_t in_use = pool_used(s, it->first);
    const cuuint64_t room = keep > in_use ? keep - in_use : 0;
    if (it->second.kept > room) pool_give_back(s, it->second, it->second.kept - room);
    return CUDA_SUCCESS;
  });
}

// ---- explicit pools -----------------------------------------------------------------------

CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  return guarded([&](State& s) -> CUresult {
    if (pool == nullptr || props == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED || props->win32SecurityAttributes != nullptr)
      return CUDA_ERROR_INVALID_VALUE;
    for (unsigned char b : props->reserved)
      if (b != 0) return CUDA_ERROR_INVALID_VALUE;
    // The double has device pools only (it reports no host-memory pools).
    if (props->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (props->location.id < 0 || props->location.id >= s.device_count) return CUDA_ERROR_INVALID_DEVICE;
    if ((props->handleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0 || props->usage != 0)
      return CUDA_ERROR_NOT_SUPPORTED;
    const Handle h = s.new_handle();
    Pool p;
    p.device = props->location.id;
    p.created = true;
    p.handle_types = static_cast<unsigned>(props->handleTypes);
    p.max_size = props->maxSize;
    s.pools[h] = p;
    *pool = to_handle<CUmemPoolHandle_st>(h);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
  return guarded([&](State& s) -> CUresult {
    const Handle h = from_handle(pool);
    const auto it = s.pools.find(h);
    if (it == s.pools.end() || !(it->second.created || it->second.imported)) return CUDA_ERROR_INVALID_VALUE;
    // The device's current pool falls back to its default one.
    for (Handle& cur : s.current_pool)
      if (cur == h) cur = 0;
    pool_give_back(s, it->second, it->second.kept);
    s.pools.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  return guarded([&](State& s) -> CUresult {
    const auto it = s.pools.find(from_handle(pool));
    if (it == s.pools.end() || (map == nullptr && count != 0)) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; ++i) {
      const CUmemAccessDesc& d = map[i];
      if (d.location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
      if (d.location.id < 0 || d.location.id >= s.device_count) return CUDA_ERROR_INVALID_DEVICE;
      if (d.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && d.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        return CUDA_ERROR_INVALID_VALUE;
      // The owning device always has read-write access; taking it away is refused.
      if (d.location.id == it->second.device && d.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        return CUDA_ERROR_INVALID_DEVICE;
    }
    for (size_t i = 0; i < count; ++i)
      if (map[i].location.id != it->second.device) it->second.access[map[i].location.id] = map[i].flags;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemPoolGetAccess(CUmemAccess_flags* flags, CUmemoryPool pool, CUmemLocation* location) {
  return guarded([&](State& s) -> CUresult {
    const auto it = s.pools.find(from_handle(pool));
    if (it == s.pools.end() || flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (location->type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    if (location->id < 0 || location->id >= s.device_count) return CUDA_ERROR_INVALID_DEVICE;
    if (location->id == it->second.device) {
      *flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    } else {
      const auto a = it->second.access.find(location->id);
      *flags = a == it->second.access.end() ? CU_MEM_ACCESS_FLAGS_PROT_NONE : a->second;
    }
    return CUDA_SUCCESS;
  });
}

// ---- sharing pools between processes ------------------------------------------------------
//
// A pool made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR exports as a fresh sealed memfd
// naming this process, the pool and its device; importing one (in any process, this one
// included) makes a pool that only imports pointers of that very pool. A pointer export
// moves the allocation onto a memfd (api_ipc.cc) and names pid, fd and inode as an IPC
// handle does, plus the pool; importing maps the exporter's memfd (/proc/PID/fd/N) as a
// new allocation of the importing context, and importing it again gives the same pointer.
// A test double, not a model of the driver's formats.

namespace {

constexpr std::uint32_t kPoolFileMagic = 0x50504944u;  // "DIPP"
constexpr std::uint32_t kPoolPtrMagic = 0x58504944u;   // "DIPX"

struct PoolFile {
  std::uint32_t magic;
  std::int32_t pid;
  std::uint64_t pool;
  std::int32_t device;
  std::uint32_t reserved;
};

struct PoolPtrData {
  std::uint32_t magic;
  std::int32_t pid;
  std::int32_t fd;
  std::uint32_t reserved;
  std::uint64_t ino;
  std::uint64_t size;
  std::uint64_t mapped;
  std::uint64_t pool;  // the exporter's pool
};
static_assert(sizeof(PoolPtrData) <= sizeof(CUmemPoolPtrExportData));

// What an fd holds if it is an exported pool: a sealed memfd of exactly one PoolFile.
bool read_pool_file(int fd, PoolFile* f) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::fcntl(fd, F_GET_SEALS) > 0 &&
         st.st_size == static_cast<off_t>(sizeof *f) &&
         ::pread(fd, f, sizeof *f, 0) == static_cast<ssize_t>(sizeof *f) && f->magic == kPoolFileMagic;
}

}  // namespace

CUresult CUDAAPI cuMemPoolExportToShareableHandle(void* out, CUmemoryPool pool, CUmemAllocationHandleType type,
                                                  unsigned long long flags) {
  return guarded([&](State& s) -> CUresult {
    const auto it = s.pools.find(from_handle(pool));
    if (it == s.pools.end() || out == nullptr || flags != 0 || it->second.imported) return CUDA_ERROR_INVALID_VALUE;
    if (type == CU_MEM_HANDLE_TYPE_NONE || (it->second.handle_types & static_cast<unsigned>(type)) == 0)
      return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    const PoolFile f{kPoolFileMagic, static_cast<std::int32_t>(::getpid()), it->first, it->second.device, 0};
    const int fd = ::memfd_create("ivcuda-gpu-double-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
    if (::pwrite(fd, &f, sizeof f, 0) != static_cast<ssize_t>(sizeof f) ||
        ::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      ::close(fd);
      return CUDA_ERROR_OPERATING_SYSTEM;
    }
    *static_cast<int*>(out) = fd;
    it->second.exported = true;
    return CUDA_SUCCESS;
  });
}

// Any fd that is no exported pool is INVALID_VALUE here (what the driver answers is for
// the GPU runs of drv_pool_share to show).
CUresult CUDAAPI cuMemPoolImportFromShareableHandle(CUmemoryPool* pool_out, void* handle,
                                                    CUmemAllocationHandleType type, unsigned long long flags) {
  return guarded([&](State& s) -> CUresult {
    if (pool_out == nullptr || flags != 0 || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
      return CUDA_ERROR_INVALID_VALUE;
    PoolFile f{};
    if (!read_pool_file(static_cast<int>(reinterpret_cast<std::intptr_t>(handle)), &f) || f.device < 0 ||
        f.device >= s.device_count)
      return CUDA_ERROR_INVALID_VALUE;
    Pool p;
    p.device = f.device;
    p.handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.imported = true;
    p.origin_pid = f.pid;
    p.origin_pool = static_cast<Handle>(f.pool);
    const Handle h = s.new_handle();
    s.pools[h] = p;
    *pool_out = to_handle<CUmemPoolHandle_st>(h);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemPoolExportPointer(CUmemPoolPtrExportData* out, CUdeviceptr ptr) {
  return guarded([&](State& s) -> CUresult {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto a = s.allocations.find(static_cast<std::uintptr_t>(ptr));
    if (s.find(static_cast<std::uintptr_t>(ptr)) == nullptr)
      note_stray(static_cast<std::uintptr_t>(ptr), 1, __FILE__, __LINE__);
    if (a == s.allocations.end() || a->second.pool == 0 || a->second.kind != MemKind::kDevice)
      return CUDA_ERROR_INVALID_VALUE;
    const auto it = s.pools.find(a->second.pool);
    // The H200's driver exports pointers only of a pool exported itself.
    if (it == s.pools.end() || (it->second.handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0 ||
        !it->second.exported)
      return CUDA_ERROR_INVALID_VALUE;
    if (!make_shareable(a->second)) return CUDA_ERROR_MAP_FAILED;
    struct stat st {};
    if (::fstat(a->second.ipc_fd, &st) != 0) return CUDA_ERROR_MAP_FAILED;
    const PoolPtrData d{kPoolPtrMagic, static_cast<std::int32_t>(::getpid()), a->second.ipc_fd, 0,
                        static_cast<std::uint64_t>(st.st_ino), a->second.size, a->second.mapped, it->first};
    std::memset(out, 0, sizeof *out);
    std::memcpy(out->reserved, &d, sizeof d);
    return CUDA_SUCCESS;
  });
}

// Only an imported pool imports, and only pointers of the pool it was imported from.
CUresult CUDAAPI cuMemPoolImportPointer(CUdeviceptr* ptr_out, CUmemoryPool pool, CUmemPoolPtrExportData* data) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    const auto it = s.pools.find(from_handle(pool));
    if (it != s.pools.end() && !it->second.imported) note_stray(from_handle(pool), 0, __FILE__, __LINE__);
    if (ptr_out == nullptr || data == nullptr || it == s.pools.end() || !it->second.imported)
      return CUDA_ERROR_INVALID_VALUE;
    PoolPtrData d;
    std::memcpy(&d, data->reserved, sizeof d);
    if (d.magic != kPoolPtrMagic || d.pid != it->second.origin_pid || d.pool != it->second.origin_pool ||
        d.mapped == 0 || d.size > d.mapped)
      return CUDA_ERROR_INVALID_VALUE;
    for (const auto& [base, a] : s.allocations)
      if (a.kind == MemKind::kPoolImport && a.ipc_pid == d.pid && a.ipc_ino == d.ino) {
        *ptr_out = base;
        return CUDA_SUCCESS;
      }
    std::uintptr_t base = 0;
    const CUresult r =
        map_shared(s, ctx, SharedMemRef{d.pid, d.fd, d.ino, d.size, d.mapped}, MemKind::kPoolImport, &base);
    if (r != CUDA_SUCCESS) return r;
    s.allocations.at(base).pool = it->first;
    *ptr_out = base;
    return CUDA_SUCCESS;
  });
}

// The attributes a worker asks (the rest of cuPointerGetAttribute is not emulated).
CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  return guarded([&](State& s) -> CUresult {
    if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const Allocation* a = s.find(static_cast<std::uintptr_t>(ptr));
    if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
      case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        *static_cast<CUmemoryPool*>(data) = to_handle<CUmemPoolHandle_st>(a->pool);
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *static_cast<CUdeviceptr*>(data) = a->base;
        return CUDA_SUCCESS;
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *static_cast<size_t*>(data) = a->size;
        return CUDA_SUCCESS;
      default:
        return CUDA_ERROR_NOT_SUPPORTED;
    }
  });
}
