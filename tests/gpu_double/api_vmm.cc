// Virtual memory management of the GPU test double: address reservations, physical
// allocations (cuMemCreate), mappings and their access, and sharing them as POSIX file
// descriptors. Device memory is host memory here too, so a reservation is PROT_NONE address
// space, physical memory a memfd, and a mapping a MAP_SHARED view of the memfd: two mappings
// of one allocation alias, as on a GPU, and an exported fd is the memory itself.
//
// Error codes follow what the real driver (580, H200) answers; see README.md for where the
// double is stricter. Nothing here needs a current context: the driver's VMM objects belong
// to the process, not to a context.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <new>

#include "state.h"

using namespace ivcuda::gpu_double;

namespace {

constexpr std::size_t kG = kVmmGranularity;

bool granular(std::uintptr_t v) { return v % kG == 0; }

// [p, p + n) without wrapping around the address space; n > 0.
bool range_ok(std::uintptr_t p, std::size_t n) { return n != 0 && p <= UINTPTR_MAX - n; }

// The physical memory behind a handle the caller still holds a reference to.
PhysicalMem* held(State& s, CUmemGenericAllocationHandle h) {
  const auto it = s.physical.find(static_cast<Handle>(h));
  if (it == s.physical.end() || it->second.refs == 0) return nullptr;
  return &it->second;
}

// Frees physical memory once neither the caller nor a mapping holds it.
void maybe_free(State& s, Handle h) {
  const auto it = s.physical.find(h);
  if (it == s.physical.end() || it->second.refs != 0 || it->second.maps != 0) return;
  PhysicalMem& m = it->second;
  if (m.accounted != 0) {
    s.used[static_cast<std::size_t>(m.prop.location.id)] -= m.accounted;
    ledger_publish(m.prop.location.id, s.used[static_cast<std::size_t>(m.prop.location.id)]);
  }
  if (m.view != nullptr) ::munmap(m.view, m.size);
  ::close(m.fd);
  s.physical.erase(it);
}

// Whether [p, p + n) lies in reserved address space. Adjacent reservations count as one
// range: the real driver maps across their boundary.
bool reserved(const State& s, std::uintptr_t p, std::size_t n) {
  const std::uintptr_t end = p + n;
  auto it = s.reservations.upper_bound(p);
  if (it == s.reservations.begin()) return false;
  --it;
  std::uintptr_t reach = it->first + it->second;  // [it->first, reach) is reserved
  for (++it; reach < end && it != s.reservations.end() && it->first == reach; ++it)
    reach += it->second;
  return reach >= end;
}

// The mapping holding address p, or end().
std::map<std::uintptr_t, VmmMapping>::iterator mapping_at(State& s, std::uintptr_t p) {
  auto it = s.mappings.upper_bound(p);
  if (it == s.mappings.begin()) return s.mappings.end();
  --it;
  return p - it->first < it->second.size ? it : s.mappings.end();
}

// The first mapping that ends after p (it may start after p, or hold it).
std::map<std::uintptr_t, VmmMapping>::iterator first_mapping_from(State& s, std::uintptr_t p) {
  auto it = s.mappings.upper_bound(p);
  if (it != s.mappings.begin()) {
    const auto prev = std::prev(it);
    if (prev->first + prev->second.size > p) return prev;
  }
  return it;
}

// Every mapping that overlaps [p, p + n) must lie wholly inside it: the driver maps,
// unmaps and sets access by whole mappings only.
bool whole_mappings_only(State& s, std::uintptr_t p, std::size_t n) {
  for (auto it = first_mapping_from(s, p); it != s.mappings.end() && it->first < p + n; ++it)
    if (it->first < p || it->first + it->second.size > p + n) return false;
  return true;
}

// A mapping some device may access is device memory for copies, memsets, kernels and
// cuMemGetAddressRange; one nobody may access is not (the driver refuses copies to it).
// The host side is read-write whenever any device has access, even read-only access: the
// copies and CPU kernels that stand in for the GPU would otherwise crash the whole process
// with SIGSEGV where a GPU reports an error.
CUresult apply_access(State& s, std::uintptr_t base, const VmmMapping& m) {
  const bool accessible =
      std::any_of(m.access.begin(), m.access.end(), [](unsigned char f) { return f != 0; });
  if (::mprotect(reinterpret_cast<void*>(base), m.size,
                 accessible ? PROT_READ | PROT_WRITE : PROT_NONE) != 0)
    return CUDA_ERROR_UNKNOWN;
  if (!accessible) {
    s.allocations.erase(base);
    return CUDA_SUCCESS;
  }
  Allocation a;
  a.base = base;
  a.size = m.size;
  a.kind = MemKind::kMapped;
  a.device = s.physical.at(m.mem).prop.location.id;
  s.allocations.insert_or_assign(base, a);
  return CUDA_SUCCESS;
}

}  // namespace

namespace ivcuda::gpu_double {

PhysicalMem* held_physical(State& s, CUmemGenericAllocationHandle h) { return held(s, h); }

unsigned char* physical_view(State& s, Handle mem) {
  PhysicalMem& m = s.physical.at(mem);
  if (m.view == nullptr) {
    void* p = ::mmap(nullptr, m.size, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();  // guarded() answers OUT_OF_MEMORY
    m.view = static_cast<unsigned char*>(p);
  }
  return m.view;
}

void physical_ref(State& s, Handle mem) { ++s.physical.at(mem).maps; }

void physical_unref(State& s, Handle mem) {
  --s.physical.at(mem).maps;
  maybe_free(s, mem);
}

}  // namespace ivcuda::gpu_double

CUresult CUDAAPI cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags option) {
  // The driver answers for any prop (even an invalid type or device), so the double does too.
  return guarded([&](State&) -> CUresult {
    if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // Read as an integer: a caller's out-of-range value is not a valid load of the enum.
    int raw = 0;
    static_assert(sizeof raw == sizeof option);
    std::memcpy(&raw, &option, sizeof raw);
    if (raw != CU_MEM_ALLOC_GRANULARITY_MINIMUM && raw != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
      return CUDA_ERROR_INVALID_VALUE;
    *granularity = kG;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                     unsigned long long flags) {
  return guarded([&](State& s) -> CUresult {
    if (ptr == nullptr || flags != 0 || size == 0 || !granular(size)) return CUDA_ERROR_INVALID_VALUE;
    if ((alignment & (alignment - 1)) != 0 || !granular(addr)) return CUDA_ERROR_INVALID_VALUE;
    const std::size_t align = std::max(alignment, kG);
    constexpr int kFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    void* p = MAP_FAILED;
    // The address is only a hint: taken when free (and aligned), else ignored, as the
    // driver does.
    if (addr != 0 && addr % align == 0 && range_ok(addr, size)) {
      p = ::mmap(reinterpret_cast<void*>(addr), size, PROT_NONE, kFlags | MAP_FIXED_NOREPLACE, -1, 0);
      if (p != MAP_FAILED && reinterpret_cast<std::uintptr_t>(p) != addr) {
        ::munmap(p, size);  // a kernel without MAP_FIXED_NOREPLACE took it as a hint
        p = MAP_FAILED;
      }
    }
    if (p == MAP_FAILED) {
      // Over-reserve by the alignment and trim both ends.
      std::size_t total = 0;
      if (__builtin_add_overflow(size, align, &total)) return CUDA_ERROR_OUT_OF_MEMORY;
      void* raw = ::mmap(nullptr, total, PROT_NONE, kFlags, -1, 0);
      if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
      const auto lo = reinterpret_cast<std::uintptr_t>(raw);
      const std::uintptr_t base = (lo + align - 1) / align * align;
      if (base > lo) ::munmap(raw, base - lo);
      if (lo + total > base + size)
        ::munmap(reinterpret_cast<void*>(base + size), lo + total - (base + size));
      p = reinterpret_cast<void*>(base);
    }
    const auto base = reinterpret_cast<std::uintptr_t>(p);
    try {
      s.reservations.emplace(base, size);
    } catch (...) {
      ::munmap(p, size);
      throw;
    }
    *ptr = base;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return guarded([&](State& s) -> CUresult {
    const auto it = s.reservations.find(static_cast<std::uintptr_t>(ptr));
    if (ptr == 0 || size == 0 || it == s.reservations.end() || it->second != size)
      return CUDA_ERROR_INVALID_VALUE;
    // Mappings first: the driver refuses to free address space that is still mapped.
    const auto m = first_mapping_from(s, it->first);
    if (m != s.mappings.end() && m->first < it->first + size) return CUDA_ERROR_INVALID_VALUE;
    ::munmap(reinterpret_cast<void*>(it->first), size);
    s.reservations.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                             unsigned long long flags) {
  return guarded([&](State& s) -> CUresult {
    if (handle == nullptr || prop == nullptr || flags != 0 || size == 0 || !granular(size))
      return CUDA_ERROR_INVALID_VALUE;
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
    switch (prop->location.type) {
      case CU_MEM_LOCATION_TYPE_DEVICE:
        if (prop->location.id < 0 || prop->location.id >= s.device_count) return CUDA_ERROR_INVALID_DEVICE;
        break;
      case CU_MEM_LOCATION_TYPE_HOST:
      case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        return CUDA_ERROR_NOT_SUPPORTED;  // host-located VMM memory is not emulated
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    // Windows handles are refused, fabric handles need an IMEX channel nobody has here;
    // other unknown bits are ignored, as the driver does.
    const unsigned long long types = prop->requestedHandleTypes;
    if ((types & (CU_MEM_HANDLE_TYPE_WIN32 | CU_MEM_HANDLE_TYPE_WIN32_KMT)) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    if ((types & CU_MEM_HANDLE_TYPE_FABRIC) != 0) return CUDA_ERROR_NOT_PERMITTED;
    std::size_t& used = s.used[static_cast<std::size_t>(prop->location.id)];
    if (size > total_mem() - used) return CUDA_ERROR_OUT_OF_MEMORY;
    const int fd = ::memfd_create("ivcuda-gpu-double-vmm", MFD_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      ::close(fd);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    PhysicalMem m;
    m.size = size;
    m.prop = *prop;
    m.prop.win32HandleMetaData = nullptr;
    m.fd = fd;
    m.accounted = size;
    m.refs = 1;
    const Handle h = s.new_handle();
    try {
      s.physical.emplace(h, m);
    } catch (...) {
      ::close(fd);
      throw;
    }
    used += size;
    ledger_publish(prop->location.id, used);
    *handle = h;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  return guarded([&](State& s) -> CUresult {
    PhysicalMem* m = held(s, handle);
    if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
    --m->refs;
    maybe_free(s, static_cast<Handle>(handle));
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
  return guarded([&](State& s) -> CUresult {
    const auto p = static_cast<std::uintptr_t>(ptr);
    if (flags != 0 || p == 0 || !range_ok(p, size)) return CUDA_ERROR_INVALID_VALUE;
    PhysicalMem* m = held(s, handle);
    if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // The driver maps whole allocations only (offset 0, the allocation's size).
    if (offset != 0 || size != m->size) return CUDA_ERROR_NOT_SUPPORTED;
    if (!granular(p) || !reserved(s, p, size)) return CUDA_ERROR_INVALID_VALUE;
    const auto next = first_mapping_from(s, p);
    if (next != s.mappings.end() && next->first < p + size) return CUDA_ERROR_INVALID_VALUE;
    VmmMapping vm;
    vm.size = size;
    vm.mem = static_cast<Handle>(handle);
    const auto it = s.mappings.emplace(p, vm).first;
    // Access comes with cuMemSetAccess; until then the range faults, as it does on a GPU.
    if (::mmap(reinterpret_cast<void*>(p), size, PROT_NONE, MAP_SHARED | MAP_FIXED, m->fd, 0) ==
        MAP_FAILED) {
      s.mappings.erase(it);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ++m->maps;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return guarded([&](State& s) -> CUresult {
    const auto p = static_cast<std::uintptr_t>(ptr);
    if (p == 0 || !range_ok(p, size) || !granular(p) || !granular(size)) return CUDA_ERROR_INVALID_VALUE;
    // Unmapped stretches inside the range are fine (the driver agrees); cut mappings not.
    if (!reserved(s, p, size) || !whole_mappings_only(s, p, size)) return CUDA_ERROR_INVALID_VALUE;
    for (auto it = first_mapping_from(s, p); it != s.mappings.end() && it->first < p + size;) {
      // The address space stays reserved: PROT_NONE anonymous memory replaces the mapping.
      if (::mmap(reinterpret_cast<void*>(it->first), it->second.size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
        return CUDA_ERROR_UNKNOWN;
      s.allocations.erase(it->first);
      const Handle mem = it->second.mem;
      it = s.mappings.erase(it);
      --s.physical.at(mem).maps;
      maybe_free(s, mem);
    }
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  return guarded([&](State& s) -> CUresult {
    const auto p = static_cast<std::uintptr_t>(ptr);
    if (desc == nullptr || count == 0 || p == 0 || !range_ok(p, size) || !granular(p) ||
        !granular(size))
      return CUDA_ERROR_INVALID_VALUE;
    bool host = false;
    for (std::size_t i = 0; i < count; ++i) {
      const CUmemAccessDesc& d = desc[i];
      if (d.location.type == CU_MEM_LOCATION_TYPE_HOST ||
          d.location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
          d.location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT)
        host = true;
      else if (d.location.type != CU_MEM_LOCATION_TYPE_DEVICE || d.location.id < 0 ||
               d.location.id >= s.device_count)
        return CUDA_ERROR_INVALID_VALUE;
      if (d.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && d.flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
          d.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        return CUDA_ERROR_INVALID_VALUE;
    }
    // Whole mappings, back to back. (The driver also accepts a range with unmapped holes but
    // then sets only the first mappings'; the double refuses it.)
    std::uintptr_t at = p;
    for (auto it = mapping_at(s, p); it != s.mappings.end() && it->first == at && at < p + size; ++it)
      at += it->second.size;
    if (at != p + size) return CUDA_ERROR_INVALID_VALUE;
    // Host access to device-located memory, as the driver answers it.
    if (host) return CUDA_ERROR_NOT_SUPPORTED;
    for (auto it = s.mappings.find(p); it != s.mappings.end() && it->first < p + size; ++it) {
      for (std::size_t i = 0; i < count; ++i)
        it->second.access[static_cast<std::size_t>(desc[i].location.id)] =
            static_cast<unsigned char>(desc[i].flags);
      if (const CUresult r = apply_access(s, it->first, it->second); r != CUDA_SUCCESS) return r;
    }
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  return guarded([&](State& s) -> CUresult {
    if (flags == nullptr || location == nullptr || ptr == 0) return CUDA_ERROR_INVALID_VALUE;
    const bool device = location->type == CU_MEM_LOCATION_TYPE_DEVICE;
    if (device && (location->id < 0 || location->id >= s.device_count)) return CUDA_ERROR_INVALID_DEVICE;
    if (!device && location->type != CU_MEM_LOCATION_TYPE_HOST) return CUDA_ERROR_INVALID_VALUE;
    const auto it = mapping_at(s, static_cast<std::uintptr_t>(ptr));
    if (it == s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    // The driver reports read-write for the host, whatever the devices' access.
    *flags = device ? it->second.access[static_cast<std::size_t>(location->id)]
                    : static_cast<unsigned long long>(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  return guarded([&](State& s) -> CUresult {
    if (handle == nullptr || addr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto it = mapping_at(s, reinterpret_cast<std::uintptr_t>(addr));
    if (it == s.mappings.end()) return CUDA_ERROR_INVALID_VALUE;
    // The same handle value, also after the caller released it: the mapping kept it alive.
    ++s.physical.at(it->second.mem).refs;
    *handle = it->second.mem;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                        CUmemGenericAllocationHandle handle) {
  // A released handle whose memory is still mapped still answers, as on the driver.
  return guarded([&](State& s) -> CUresult {
    const auto it = s.physical.find(static_cast<Handle>(handle));
    if (prop == nullptr || it == s.physical.end()) return CUDA_ERROR_INVALID_VALUE;
    *prop = it->second.prop;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemExportToShareableHandle(void* shareableHandle, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType,
                                              unsigned long long flags) {
  return guarded([&](State& s) -> CUresult {
    if (shareableHandle == nullptr || flags != 0 || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
      return CUDA_ERROR_INVALID_VALUE;
    const PhysicalMem* m = held(s, handle);
    // Only what was created exportable as an fd may be exported as one.
    if (m == nullptr || (m->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0)
      return CUDA_ERROR_INVALID_VALUE;
    const int fd = ::fcntl(m->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
    *static_cast<int*>(shareableHandle) = fd;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* osHandle,
                                                CUmemAllocationHandleType shHandleType) {
  return guarded([&](State& s) -> CUresult {
    // fd 0 arrives as a null osHandle, which the driver refuses as one.
    if (handle == nullptr || osHandle == nullptr || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
      return CUDA_ERROR_INVALID_VALUE;
    const auto fd = static_cast<int>(reinterpret_cast<std::intptr_t>(osHandle));
    // An fd that is not exported memory is CUDA_ERROR_UNKNOWN on the driver. Memory here is
    // a memfd (the only files with seals) of a whole number of granules.
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || ::fcntl(fd, F_GET_SEALS) < 0 ||
        st.st_size <= 0 || !granular(static_cast<std::uintptr_t>(st.st_size)))
      return CUDA_ERROR_UNKNOWN;
    PhysicalMem m;
    m.size = static_cast<std::size_t>(st.st_size);
    m.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    m.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    // The exporter's device when it is this process (the fd carries none); the driver does
    // not report the requested handle types of an imported allocation.
    for (const auto& [h, other] : s.physical) {
      struct stat ost {};
      if (::fstat(other.fd, &ost) == 0 && ost.st_dev == st.st_dev && ost.st_ino == st.st_ino) {
        m.prop.location = other.prop.location;
        break;
      }
    }
    m.fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (m.fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
    m.refs = 1;
    const Handle h = s.new_handle();
    try {
      s.physical.emplace(h, m);
    } catch (...) {
      ::close(m.fd);
      throw;
    }
    *handle = h;
    return CUDA_SUCCESS;
  });
}
