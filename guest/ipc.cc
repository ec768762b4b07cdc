// CUDA IPC, forwarded: memory and event handles passed between processes of
// one tenant (the host side and its rules are host-daemon/worker/ipc.cc). A handle
// is 64 opaque bytes the host made; this library only carries them. Memory
// opened from a handle is booked like cuMemAlloc memory: its range is
// reserved in this process and counted as device memory, so that unified
// addressing, cuPointerGetAttribute and cuMemGetAddressRange see it.
#include <unistd.h>

#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <map>

#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"
#include "guest/family.h"

namespace {

// Opened ranges of this process: device address -> (size, opens). CUDA
// answers a second open of one handle with the same pointer; the range is
// booked once and released with the last close. Under rt->books_mu.
struct Opened {
  std::uint64_t size = 0;
  unsigned opens = 0;
};
std::map<std::uint64_t, Opened>& opened() {
  static auto* m = new std::map<std::uint64_t, Opened>();  // never destroyed: exit handlers may close
  return *m;
}

}  // namespace

CUresult cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    const std::uint64_t ctx = current_ctx();
    if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::RepIpcHandle rep{};
    const CUresult st = rt->call<Op::kIpcGetMemHandle>(proto::ReqIpcGet{ctx, dptr, proc_id(), 0}, {}, &rep);
    if (st == CUDA_SUCCESS) std::memcpy(handle->reserved, rep.bytes, sizeof handle->reserved);
    return st;
  });
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    const std::uint64_t ctx = current_ctx();
    if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (pdptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::ReqIpcOpen r{};
    r.ctx = ctx;
    r.flags = flags;
    r.proc = proc_id();
    static_assert(sizeof r.handle == sizeof handle.reserved);
    std::memcpy(r.handle, handle.reserved, sizeof r.handle);
    proto::RepRange rep{};
    const CUresult st = rt->call<Op::kIpcOpenMemHandle>(r, {}, &rep);
    if (st != CUDA_SUCCESS) return st;
    bool first;
    {
      std::lock_guard lk(rt->books_mu);
      Opened& o = opened()[rep.base];
      first = o.opens++ == 0;
      if (first) {
        o.size = rep.size;
        rt->dev_allocs[rep.base] = rep.size;
      }
    }
    // The worker's address space decides where the mapping lies; a collision
    // with this process's own memory is logged by the runtime's books alone.
    if (first && !rt->reserve_device_range(rep.base, rep.size))
      ivcuda::guest::log_once("ipc-va-collision",
                              "memory opened through IPC at 0x%llx overlaps this process's own memory: cuMemcpy "
                              "with unified addressing may take one for the other",
                              static_cast<unsigned long long>(rep.base));
    *pdptr = rep.base;
    return CUDA_SUCCESS;
  });
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    const CUresult st = rt->call<Op::kIpcCloseMemHandle>(proto::ReqIpcClose{current_ctx(), dptr, proc_id(), 0});
    if (st != CUDA_SUCCESS) return st;
    std::uint64_t release = 0;
    {
      std::lock_guard lk(rt->books_mu);
      auto it = opened().find(dptr);
      if (it != opened().end() && --it->second.opens == 0) {
        release = it->second.size;
        opened().erase(it);
        rt->dev_allocs.erase(dptr);
      }
    }
    if (release != 0) rt->release_device_range(dptr, release);
    return CUDA_SUCCESS;
  });
}

CUresult cuIpcGetEventHandle(CUipcEventHandle* handle, CUevent event) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto e = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(event));
    {
      std::lock_guard lk(rt->books_mu);
      if (rt->events.count(e) == 0) return CUDA_ERROR_INVALID_HANDLE;
    }
    proto::RepIpcHandle rep{};
    const CUresult st =
        rt->call<Op::kIpcGetEventHandle>(proto::ReqIpcGet{current_ctx(), e, proc_id(), 0}, {}, &rep);
    if (st == CUDA_SUCCESS) std::memcpy(handle->reserved, rep.bytes, sizeof handle->reserved);
    return st;
  });
}

CUresult cuIpcOpenEventHandle(CUevent* event, CUipcEventHandle handle) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    const std::uint64_t ctx = current_ctx();
    if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (event == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::ReqIpcOpen r{};
    r.ctx = ctx;
    r.proc = proc_id();
    static_assert(sizeof r.handle == sizeof handle.reserved);
    std::memcpy(r.handle, handle.reserved, sizeof r.handle);
    proto::RepHandle rep{};
    const CUresult st = rt->call<Op::kIpcOpenEventHandle>(r, {}, &rep);
    if (st != CUDA_SUCCESS) return st;
    {
      std::lock_guard lk(rt->books_mu);
      rt->events[rep.handle] = ctx;
    }
    *event = reinterpret_cast<CUevent>(rep.handle);
    return CUDA_SUCCESS;
  });
}
