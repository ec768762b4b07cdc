// Virtual memory management, forwarded: address reservations, physical
// allocations, their mappings and access (the host side and its rules are
// host-daemon/worker/vmm.cc). A reserved range is reserved in this process too and
// counted as device memory from the start, so that cuMemcpy's unified
// addressing tells its pointers from host ones; what is mapped where, and who
// may touch it, only the host decides. Device ordinals are the application's
// (after CUDA_VISIBLE_DEVICES) here and the worker's on the wire.
#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"
#include "guest/family.h"

namespace {

// A stretch of this process's address space that nothing uses, held (no
// access, no memory behind it) while its start is offered to the host as a
// reservation's hint. The start is aligned to the requested alignment and to
// the lowest set bit of the size: a size is a whole number of granules and a
// granule a power of two, so that is a granule boundary, as the driver wants
// of a hint, whatever the device's granularity.
struct FreePlace {
  CUdeviceptr at = 0;
  void* map = nullptr;
  std::size_t span = 0;

  FreePlace() = default;
  FreePlace(FreePlace&& o) noexcept : at(o.at), map(std::exchange(o.map, nullptr)), span(o.span) {}
  FreePlace& operator=(FreePlace&& o) noexcept {
    if (this != &o) {
      release();
      at = o.at;
      map = std::exchange(o.map, nullptr);
      span = o.span;
    }
    return *this;
  }
  ~FreePlace() { release(); }

  static FreePlace find(std::uint64_t size, std::uint64_t alignment) {
    FreePlace f;
    const std::uint64_t align = std::max<std::uint64_t>(size & (~size + 1), alignment);
    if ((align & (align - 1)) != 0 || __builtin_add_overflow(size, align, &f.span)) return {};
    void* m = ::mmap(nullptr, f.span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return {};
    f.map = m;
    f.at = (reinterpret_cast<std::uint64_t>(m) + align - 1) / align * align;
    return f;
  }
  void release() {
    if (map != nullptr) ::munmap(map, span);
    map = nullptr;
  }
};

// An application's location on the wire: device ordinals become the worker's.
CUresult to_wire(Runtime* rt, const CUmemLocation& loc, std::uint32_t* type, std::int32_t* id) {
  *type = static_cast<std::uint32_t>(loc.type);
  *id = loc.id;
  if (loc.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    *id = rt->to_worker(loc.id);
    if (*id < 0) return CUDA_ERROR_INVALID_DEVICE;
  }
  return CUDA_SUCCESS;
}

CUresult to_wire(Runtime* rt, const CUmemAllocationProp& p, proto::MemProp* out) {
  *out = proto::MemProp{};
  out->type = static_cast<std::uint32_t>(p.type);
  out->handle_types = static_cast<std::uint32_t>(p.requestedHandleTypes);
  out->compression = p.allocFlags.compressionType;
  out->rdma = p.allocFlags.gpuDirectRDMACapable;
  out->usage = p.allocFlags.usage;
  return to_wire(rt, p.location, &out->loc_type, &out->loc_id);
}

// The application's ordinal of a worker ordinal (-1: not visible).
int app_ordinal(Runtime* rt, int worker) {
  for (int i = 0; i < rt->device_count(); ++i)
    if (rt->to_worker(i) == worker) return i;
  return -1;
}

}  // namespace

CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::ReqMemGranularity r{};
    if (const CUresult st = to_wire(rt, *prop, &r.prop); st != CUDA_SUCCESS) return st;
    r.option = static_cast<std::uint32_t>(option);
    proto::RepValue rep{};
    const CUresult st = rt->call<Op::kMemGranularity>(r, {}, &rep);
    if (st == CUDA_SUCCESS) *granularity = static_cast<size_t>(rep.value);
    return st;
  });
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    if (ptr == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    // A range that collides with this process's own memory is held and
    // another asked for, as cuMemAlloc does; the held ones are freed after.
    // Asking again alone walks the host's free space next to the first
    // answer, which may all be this process's (a mapping of tens of MiB where
    // the host hands out ranges): so each retry names, as its hint, a place
    // free here, kept mapped until the host answered so that no two retries
    // name the same place.
    std::vector<proto::RepRange> held;
    std::vector<FreePlace> places;
    CUresult st = CUDA_SUCCESS;
    proto::RepRange got{};
    bool reserved = false;
    CUdeviceptr want = addr;
    for (int attempt = 0; attempt < 8 && !reserved; ++attempt) {
      st = rt->call<Op::kMemAddressReserve>(proto::ReqMemAddressReserve{size, alignment, want, flags}, {}, &got);
      if (st != CUDA_SUCCESS) break;
      if (!places.empty() && got.base == places.back().at) {
        places.back().release();  // the host took the hint: the place becomes the range
        places.pop_back();
      }
      reserved = rt->reserve_device_range(got.base, got.size);
      if (reserved) break;
      held.push_back(got);
      places.push_back(FreePlace::find(size, alignment));
      want = places.back().at;  // 0 when none was found: the host chooses
    }
    places.clear();
    for (const auto& h : held) (void)rt->call<Op::kMemAddressFree>(proto::ReqMemRange{h.base, h.size});
    if (st != CUDA_SUCCESS) return st;
    if (!reserved) {
      (void)rt->call<Op::kMemAddressFree>(proto::ReqMemRange{got.base, got.size});
      return CUDA_ERROR_OUT_OF_MEMORY;  // no range this process could share with the device
    }
    {
      std::lock_guard lk(rt->books_mu);
      rt->dev_allocs[got.base] = got.size;
      rt->va_reservations.insert(got.base);
    }
    *ptr = got.base;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    const CUresult st = rt->call<Op::kMemAddressFree>(proto::ReqMemRange{ptr, size});
    if (st != CUDA_SUCCESS) return st;
    {
      std::lock_guard lk(rt->books_mu);
      rt->dev_allocs.erase(ptr);
      rt->va_reservations.erase(ptr);
    }
    rt->release_device_range(ptr, size);
    return CUDA_SUCCESS;
  });
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    if (handle == nullptr || prop == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    proto::ReqMemCreate r{};
    if (const CUresult st = to_wire(rt, *prop, &r.prop); st != CUDA_SUCCESS) return st;
    r.size = size;
    r.flags = flags;
    proto::RepHandle rep{};
    const CUresult st = rt->call<Op::kMemCreate>(r, {}, &rep);
    if (st == CUDA_SUCCESS) *handle = rep.handle;
    return st;
  });
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    return rt->call<Op::kMemRelease>(proto::ReqHandle{0, handle});
  });
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    return rt->call<Op::kMemMap>(proto::ReqMemMap{ptr, size, offset, handle, flags});
  });
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    return rt->call<Op::kMemUnmap>(proto::ReqMemRange{ptr, size});
  });
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    if (desc == nullptr || count == 0 || count > proto::kMaxDevices) return CUDA_ERROR_INVALID_VALUE;
    std::vector<proto::MemAccess> wire(count);
    for (size_t i = 0; i < count; ++i) {
      if (const CUresult st = to_wire(rt, desc[i].location, &wire[i].loc_type, &wire[i].loc_id); st != CUDA_SUCCESS)
        return st;
      wire[i].flags = static_cast<std::uint32_t>(desc[i].flags);
    }
    return rt->call<Op::kMemSetAccess>(proto::ReqMemSetAccess{ptr, size, static_cast<std::uint32_t>(count), 0},
                                       std::as_bytes(std::span(wire)));
  });
}

CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::ReqMemGetAccess r{};
    r.ptr = ptr;
    if (const CUresult st = to_wire(rt, *location, &r.loc_type, &r.loc_id); st != CUDA_SUCCESS) return st;
    proto::RepValue rep{};
    const CUresult st = rt->call<Op::kMemGetAccess>(r, {}, &rep);
    if (st == CUDA_SUCCESS) *flags = static_cast<unsigned long long>(rep.value);
    return st;
  });
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::RepMemProp rep{};
    const CUresult st = rt->call<Op::kMemGetProperties>(proto::ReqHandle{0, handle}, {}, &rep);
    if (st != CUDA_SUCCESS) return st;
    *prop = CUmemAllocationProp{};
    prop->type = static_cast<CUmemAllocationType>(rep.prop.type);
    prop->requestedHandleTypes = static_cast<CUmemAllocationHandleType>(rep.prop.handle_types);
    prop->location.type = static_cast<CUmemLocationType>(rep.prop.loc_type);
    prop->location.id = rep.prop.loc_type == CU_MEM_LOCATION_TYPE_DEVICE ? app_ordinal(rt, rep.prop.loc_id)
                                                                          : rep.prop.loc_id;
    prop->allocFlags.compressionType = rep.prop.compression;
    prop->allocFlags.gpuDirectRDMACapable = rep.prop.rdma;
    prop->allocFlags.usage = rep.prop.usage;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::RepHandle rep{};
    const CUresult st = rt->call<Op::kMemRetainHandle>(
        proto::ReqPtr{0, static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(addr))}, {}, &rep);
    if (st == CUDA_SUCCESS) *handle = rep.handle;
    return st;
  });
}

// ---------------------------------------------------------------- sharing
//
// An exported allocation is, for the application, a file descriptor it may
// pass to another process of its own (SCM_RIGHTS, fork) and import there.
// The driver's fd stays on the host (host-daemon/daemon/fd_broker.h); the guest's fd
// is a sealed memfd that holds the host's token for it. Pools exported as
// file descriptors (guest/pools.cc) travel the same way.

namespace {
constexpr char kShareMagic[8] = {'i', 'v', 'c', 'u', 'd', 'a', 's', 'h'};
struct ShareFile {
  char magic[8];
  unsigned char token[ivcuda::guest::internal::kShareTokenBytes];
};
}  // namespace

namespace ivcuda::guest::internal {

CUresult make_share_fd(const std::uint8_t (&token)[kShareTokenBytes], int* fd_out) {
  ShareFile f{};
  std::memcpy(f.magic, kShareMagic, sizeof f.magic);
  std::memcpy(f.token, token, sizeof f.token);
  const int fd = ::memfd_create("ivcuda-shareable", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
  if (::pwrite(fd, &f, sizeof f, 0) != static_cast<ssize_t>(sizeof f) ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    ::close(fd);
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  *fd_out = fd;
  return CUDA_SUCCESS;
}

bool read_share_fd(int fd, std::uint8_t (&token)[kShareTokenBytes]) {
  ShareFile f{};
  if (::pread(fd, &f, sizeof f, 0) != static_cast<ssize_t>(sizeof f) ||
      std::memcmp(f.magic, kShareMagic, sizeof f.magic) != 0)
    return false;
  std::memcpy(token, f.token, sizeof token);
  return true;
}

}  // namespace ivcuda::guest::internal

CUresult cuMemExportToShareableHandle(void* shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType, unsigned long long flags) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    if (shareableHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::ReqMemExport r{};
    r.handle = handle;
    r.handle_type = static_cast<std::uint32_t>(handleType);
    r.flags = flags;
    proto::RepShareToken rep{};
    const CUresult st = rt->call<Op::kMemExportShareable>(r, {}, &rep);
    if (st != CUDA_SUCCESS) return st;
    return ivcuda::guest::internal::make_share_fd(rep.token, static_cast<int*>(shareableHandle));
  });
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle,
                                        CUmemAllocationHandleType shHandleType) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (shHandleType == CU_MEM_HANDLE_TYPE_FABRIC || shHandleType == CU_MEM_HANDLE_TYPE_WIN32 ||
        shHandleType == CU_MEM_HANDLE_TYPE_WIN32_KMT)
      return CUDA_ERROR_NOT_SUPPORTED;  // nothing of the kind can reach a guest (docs/design.md)
    // fd 0 arrives as a null osHandle, which the driver refuses as one.
    if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || osHandle == nullptr)
      return CUDA_ERROR_INVALID_VALUE;
    proto::ReqMemImport r{};
    // Any other fd is, as on the driver, no exported memory.
    if (!ivcuda::guest::internal::read_share_fd(static_cast<int>(reinterpret_cast<std::intptr_t>(osHandle)),
                                                r.token))
      return CUDA_ERROR_UNKNOWN;
    r.handle_type = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    proto::RepHandle rep{};
    const CUresult st = rt->call<Op::kMemImportShareable>(r, {}, &rep);
    if (st == CUDA_SUCCESS) *handle = rep.handle;
    return st;
  });
}
