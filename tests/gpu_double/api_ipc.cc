// CUDA IPC in the GPU test double, across real processes (ivcudad serves each process-mode
// guest from its own worker process, so an export and its import run in two processes).
//
// The double's device memory is host memory of the process, so sharing it means sharing
// pages: the first cuIpcGetMemHandle of an allocation moves it onto a memfd (contents copied,
// the memfd mapped MAP_SHARED over the same addresses, under the state lock, so no access
// sees the move), and the handle names the exporter's pid, that fd and its inode. An
// importer opens the memfd through /proc/PID/fd/N (same user, or root as in CI) and maps
// it at an address of its own. The mapping keeps the memory alive after the exporter frees
// it or exits, as the driver keeps IPC memory alive for importers. A test double, not a
// model of the driver's handle format. Pool pointer exports (api_memory.cc) share memory
// through the same two helpers, make_shareable and map_shared.
//
// Events: the double runs all work synchronously, so an event is complete as soon as it
// is recorded, in whichever process; an imported event is a fresh local event of the same
// flags, and there is no state to share. The handle names the exporter's pid so that an
// open in the exporting process is refused as the driver refuses it (INVALID_CONTEXT).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "state.h"
#include "strays.h"

using namespace ivcuda::gpu_double;

namespace {

constexpr std::uint32_t kMemMagic = 0x4d504944u;    // "DIPM"
constexpr std::uint32_t kEventMagic = 0x45504944u;  // "DIPE"

struct MemHandle {
  std::uint32_t magic;
  std::int32_t pid;
  std::int32_t fd;
  std::uint32_t reserved;
  std::uint64_t ino;
  std::uint64_t size;    // the allocation's size, as accesses are bounded
  std::uint64_t mapped;  // the memfd's length
};
static_assert(sizeof(MemHandle) <= sizeof(CUipcMemHandle));

struct EventHandle {
  std::uint32_t magic;
  std::int32_t pid;
  std::uint64_t event;
  std::uint32_t flags;
  std::uint32_t reserved;
};
static_assert(sizeof(EventHandle) <= sizeof(CUipcEventHandle));

}  // namespace

namespace ivcuda::gpu_double {

bool make_shareable(Allocation& a) {
  if (a.ipc_fd >= 0) return true;
  const int fd = ::memfd_create("ivcuda-gpu-double-ipc", MFD_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::ftruncate(fd, static_cast<off_t>(a.mapped)) == 0;
  for (std::size_t done = 0; ok && done < a.mapped;) {
    const ssize_t n = ::pwrite(fd, static_cast<const char*>(a.storage) + done, a.mapped - done,
                               static_cast<off_t>(done));
    if (n <= 0) ok = false;
    else done += static_cast<std::size_t>(n);
  }
  if (ok)
    ok = ::mmap(a.storage, a.mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == a.storage;
  if (!ok) {
    ::close(fd);
    return false;
  }
  a.ipc_fd = fd;
  return true;
}

CUresult map_shared(State& s, Handle ctx, const SharedMemRef& ref, MemKind kind, std::uintptr_t* out) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/fd/%d", ref.pid, ref.fd);
  const int fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_VALUE;  // the exporter or its allocation is gone
  struct stat st {};
  const bool same = ::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_ino) == ref.ino &&
                    static_cast<std::uint64_t>(st.st_size) == ref.mapped;
  // Away from where processes keep their own memory, as device memory is (state.h).
  static std::uintptr_t next_hint = kIpcWindowBase;
  void* p = same ? ::mmap(reinterpret_cast<void*>(next_hint), ref.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                 : MAP_FAILED;
  if (p != MAP_FAILED) next_hint = reinterpret_cast<std::uintptr_t>(p) + ref.mapped + (2u << 20);
  ::close(fd);
  if (!same) return CUDA_ERROR_INVALID_VALUE;
  if (p == MAP_FAILED) return CUDA_ERROR_MAP_FAILED;
  Allocation a;
  a.base = reinterpret_cast<std::uintptr_t>(p);
  a.size = ref.size;
  a.kind = kind;
  a.ctx = ctx;
  a.device = s.contexts.at(ctx).device;
  a.storage = p;
  a.mapped = ref.mapped;
  a.ipc_pid = ref.pid;
  a.ipc_ino = ref.ino;
  a.ipc_opens = 1;
  try {
    s.allocations.emplace(a.base, a);
  } catch (...) {
    ::munmap(p, ref.mapped);
    throw;
  }
  *out = a.base;
  return CUDA_SUCCESS;
}

}  // namespace ivcuda::gpu_double

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* pHandle, CUdeviceptr dptr) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const Allocation* found = s.find(static_cast<std::uintptr_t>(dptr));
    if (found == nullptr) note_stray(static_cast<std::uintptr_t>(dptr), 1, __FILE__, __LINE__);
    // cuMemAlloc memory only: stream-ordered allocations belong to a pool (the driver
    // answers INVALID_VALUE for them too), the rest is not device memory of this kind.
    if (found == nullptr || found->kind != MemKind::kDevice || found->pool != 0 || found->mapped == 0)
      return CUDA_ERROR_INVALID_VALUE;
    Allocation& a = s.allocations.at(found->base);
    if (!make_shareable(a)) return CUDA_ERROR_MAP_FAILED;
    struct stat st {};
    if (::fstat(a.ipc_fd, &st) != 0) return CUDA_ERROR_MAP_FAILED;
    MemHandle h{kMemMagic, static_cast<std::int32_t>(::getpid()), a.ipc_fd, 0, static_cast<std::uint64_t>(st.st_ino),
                a.size, a.mapped};
    std::memset(pHandle, 0, sizeof *pHandle);
    std::memcpy(pHandle->reserved, &h, sizeof h);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int Flags) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    MemHandle h;
    std::memcpy(&h, handle.reserved, sizeof h);
    if (pdptr == nullptr || h.magic != kMemMagic || h.mapped == 0 || h.size > h.mapped ||
        (Flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    if (h.pid == static_cast<std::int32_t>(::getpid())) return CUDA_ERROR_INVALID_CONTEXT;
    // Opened before in this context: the same pointer, one more reference.
    for (auto& [base, a] : s.allocations)
      if (a.kind == MemKind::kIpc && a.ctx == ctx && a.ipc_pid == h.pid && a.ipc_ino == h.ino) {
        ++a.ipc_opens;
        *pdptr = base;
        return CUDA_SUCCESS;
      }
    std::uintptr_t base = 0;
    const CUresult r = map_shared(s, ctx, SharedMemRef{h.pid, h.fd, h.ino, h.size, h.mapped}, MemKind::kIpc, &base);
    if (r == CUDA_SUCCESS) *pdptr = base;
    return r;
  });
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = current_context(s, &ctx); r != CUDA_SUCCESS) return r;
    const auto it = s.allocations.find(static_cast<std::uintptr_t>(dptr));
    if (it == s.allocations.end() || it->second.kind != MemKind::kIpc) return CUDA_ERROR_INVALID_VALUE;
    if (--it->second.ipc_opens == 0) s.release(it);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuIpcGetEventHandle(CUipcEventHandle* pHandle, CUevent event) {
  return guarded([&](State& s) -> CUresult {
    if (pHandle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto it = s.events.find(from_handle(event));
    if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
    constexpr unsigned kNeeded = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
    if ((it->second.flags & kNeeded) != kNeeded) return CUDA_ERROR_INVALID_VALUE;
    EventHandle h{kEventMagic, static_cast<std::int32_t>(::getpid()), it->first, it->second.flags, 0};
    std::memset(pHandle, 0, sizeof *pHandle);
    std::memcpy(pHandle->reserved, &h, sizeof h);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuIpcOpenEventHandle(CUevent* phEvent, CUipcEventHandle handle) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    EventHandle h;
    std::memcpy(&h, handle.reserved, sizeof h);
    if (phEvent == nullptr || h.magic != kEventMagic) return CUDA_ERROR_INVALID_VALUE;
    if (h.pid == static_cast<std::int32_t>(::getpid())) return CUDA_ERROR_INVALID_CONTEXT;
    const Handle e = s.new_handle();
    s.events[e] = Event{.ctx = ctx, .flags = h.flags, .recorded = false, .when = {}};
    *phEvent = to_handle<CUevent_st>(e);
    return CUDA_SUCCESS;
  });
}
