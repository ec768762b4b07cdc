// Stream-ordered memory: cuMemAllocAsync and friends, the devices' default
// and current pools, explicit pools (cuMemPoolCreate, attributes, access,
// trim, destroy), and pools shared between the processes of a tenant. Pools
// are host handles (host-daemon/worker/pools.cc): the host's driver does the work
// and judges most arguments itself, so the guest hears the driver's answers.
// Device ordinals are the application's here and the worker's on the wire.
//
// Sharing: a pool made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR exports
// as a sealed memfd holding the host's token (as VMM exports do, guest/vmm.cc)
// and imports, in another process of the tenant, as a new pool handle; a
// pointer's CUmemPoolPtrExportData is a ticket of the tenant's registry (as
// an IPC handle is). An imported pointer is booked like memory opened through
// IPC (reserved here, counted as device memory) and cuMemFree/cuMemFreeAsync
// of it end the import. Inside a VM, where one worker serves every process,
// the host answers a sibling's import with the exporter's own pool and
// memory (docs/design.md, "Memory pools").
//
// This file sees cuda.h without its renaming macros, so every ABI
// generation is defined under its exact exported name.
#define __CUDA_API_VERSION_INTERNAL
#include <cuda.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"
#include "guest/family.h"

namespace {

// A location on the wire: device ordinals become the worker's. One this
// process cannot see travels as -1, which the host turns into an ordinal
// the driver has no device for, so the driver's own answer comes back.
void to_wire(Runtime* rt, const CUmemLocation& loc, std::uint32_t* type, std::int32_t* id) {
  *type = static_cast<std::uint32_t>(loc.type);
  *id = loc.id;
  if (loc.type == CU_MEM_LOCATION_TYPE_DEVICE)
    *id = loc.id >= 0 && loc.id < rt->device_count() ? rt->to_worker(loc.id) : -1;
}

CUresult alloc_async(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream s) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    if (bytes == 0) {  // driver 580 answers success for an empty allocation; it has no memory
      *dptr = 0;
      return CUDA_SUCCESS;
    }
    proto::RepMemAlloc rep{};
    const CUresult st = rt->call<Op::kMemAllocAsync>(proto::ReqMemAllocAsync{ctx, h(s), h(pool), bytes}, {}, &rep);
    if (st != CUDA_SUCCESS) return st;
    // Pools hand out addresses inside ranges they reserved: keep this
    // process's own memory out of them, as for cuMemAlloc.
    if (!rt->reserve_device_range(rep.dptr, bytes))
      ivcuda::guest::log_once("va-collision-async",
                              "stream-ordered allocation at 0x%llx overlaps this process's own memory",
                              static_cast<unsigned long long>(rep.dptr));
    {
      std::lock_guard lk(rt->books_mu);
      rt->dev_allocs[rep.dptr] = bytes;
    }
    *dptr = rep.dptr;
    return CUDA_SUCCESS;
  });
}

CUresult free_async(CUdeviceptr d, CUstream s) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    if (CUresult imported; ivcuda::guest::internal::free_pool_import(rt, d, s, true, &imported)) return imported;
    const CUresult st = rt->call<Op::kMemFreeAsync>(proto::ReqFreeAsync{ctx, h(s), d});
    if (st != CUDA_SUCCESS) return st;
    std::uint64_t size = 0;
    {
      std::lock_guard lk(rt->books_mu);
      if (auto it = rt->dev_allocs.find(d); it != rt->dev_allocs.end()) {
        size = it->second;
        rt->dev_allocs.erase(it);
      }
    }
    rt->release_device_range(d, size);
    return CUDA_SUCCESS;
  });
}

CUresult pool_op(proto::ReqMemPool r, std::int64_t* out) {
  return guard([&] {
    NEED_RT();
    r.ctx = current_ctx();
    proto::RepValue rep{};
    const CUresult st = rt->call<Op::kMemPool>(r, {}, &rep);
    if (st == CUDA_SUCCESS && out != nullptr) *out = rep.value;
    return st;
  });
}

bool pool_attr_is_int(CUmemPool_attribute a) {
  return a == CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES || a == CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC ||
         a == CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
}
bool pool_attr_known(CUmemPool_attribute a) {
  return pool_attr_is_int(a) || (a >= CU_MEMPOOL_ATTR_RELEASE_THRESHOLD && a <= CU_MEMPOOL_ATTR_USED_MEM_HIGH);
}

}  // namespace

// ==================================================================== stream-ordered allocation

CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream s) {
  return alloc_async(dptr, bytes, nullptr, s);
}
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUstream s) {
  return alloc_async(dptr, bytes, nullptr, ptsz(s));
}
CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream s) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return alloc_async(dptr, bytes, pool, s);
}
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream s) {
  return cuMemAllocFromPoolAsync(dptr, bytes, pool, ptsz(s));
}
CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr d, CUstream s) { return free_async(d, s); }
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr d, CUstream s) { return free_async(d, ptsz(s)); }

namespace {
// A device's default (kPoolGetDefault) or current (kPoolGetCurrent) pool.
CUresult device_pool(CUmemoryPool* pool, CUdevice dev, std::uint32_t kind) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Runtime* rt = Runtime::current();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  proto::ReqMemPool r{};
  r.device = rt->to_worker(dev);
  r.kind = kind;
  std::int64_t v = 0;
  const CUresult st = pool_op(r, &v);
  if (st == CUDA_SUCCESS) *pool = reinterpret_cast<CUmemoryPool>(v);
  return st;
}
}  // namespace

CUresult CUDAAPI cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
  return device_pool(pool, dev, proto::kPoolGetDefault);
}

CUresult CUDAAPI cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  return device_pool(pool, dev, proto::kPoolGetCurrent);
}

CUresult CUDAAPI cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  Runtime* rt = Runtime::current();
  if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  proto::ReqMemPool r{};
  r.device = rt->to_worker(dev);
  r.pool = h(pool);
  r.kind = proto::kPoolSetCurrent;
  return pool_op(r, nullptr);
}

CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  if (value == nullptr || !pool_attr_known(attr)) return CUDA_ERROR_INVALID_VALUE;
  proto::ReqMemPool r{};
  r.pool = h(pool);
  r.attr = attr;
  r.kind = proto::kPoolSetAttr;
  if (pool_attr_is_int(attr)) {
    int v = 0;
    std::memcpy(&v, value, sizeof v);
    r.value = static_cast<std::uint64_t>(static_cast<std::int64_t>(v));
  } else {
    std::memcpy(&r.value, value, sizeof r.value);
  }
  return pool_op(r, nullptr);
}

CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  if (value == nullptr || !pool_attr_known(attr)) return CUDA_ERROR_INVALID_VALUE;
  proto::ReqMemPool r{};
  r.pool = h(pool);
  r.attr = attr;
  r.kind = proto::kPoolGetAttr;
  std::int64_t v = 0;
  const CUresult st = pool_op(r, &v);
  if (st != CUDA_SUCCESS) return st;
  if (pool_attr_is_int(attr)) {
    const int i = static_cast<int>(v);
    std::memcpy(value, &i, sizeof i);
  } else {
    const auto u = static_cast<cuuint64_t>(v);
    std::memcpy(value, &u, sizeof u);
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  proto::ReqMemPool r{};
  r.pool = h(pool);
  r.value = keep;
  r.kind = proto::kPoolTrim;
  return pool_op(r, nullptr);
}

// ==================================================================== explicit pools

CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  return guard([&] {
    NEED_RT();
    if (pool == nullptr || props == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::ReqMemPoolCreate r{};
    r.alloc_type = static_cast<std::uint32_t>(props->allocType);
    r.handle_types = static_cast<std::uint32_t>(props->handleTypes);
    to_wire(rt, props->location, &r.loc_type, &r.loc_id);
    r.max_size = props->maxSize;
    r.usage = props->usage;
    r.win32_attrs = props->win32SecurityAttributes != nullptr ? 1 : 0;
    for (unsigned char b : props->reserved) r.reserved_set |= b != 0 ? 1 : 0;
    proto::RepHandle rep{};
    const CUresult st = rt->call<Op::kMemPoolCreate>(r, {}, &rep);
    if (st == CUDA_SUCCESS) *pool = reinterpret_cast<CUmemoryPool>(rep.handle);
    return st;
  });
}

// Allocations still out stay valid, and this process's, until freed: the
// driver releases the pool's memory once they are.
CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool) {
  proto::ReqMemPool r{};
  r.pool = h(pool);
  r.kind = proto::kPoolDestroy;
  return pool_op(r, nullptr);
}

CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc* map, size_t count) {
  return guard([&] {
    NEED_RT();
    if ((map == nullptr && count != 0) || count > proto::kMaxDevices) return CUDA_ERROR_INVALID_VALUE;
    std::vector<proto::MemAccess> wire(count);
    for (size_t i = 0; i < count; ++i) {
      to_wire(rt, map[i].location, &wire[i].loc_type, &wire[i].loc_id);
      wire[i].flags = static_cast<std::uint32_t>(map[i].flags);
    }
    return rt->call<Op::kMemPoolSetAccess>(proto::ReqMemPoolSetAccess{h(pool), static_cast<std::uint32_t>(count), 0},
                                           std::as_bytes(std::span(wire)));
  });
}

CUresult CUDAAPI cuMemPoolGetAccess(CUmemAccess_flags* flags, CUmemoryPool pool, CUmemLocation* location) {
  return guard([&] {
    NEED_RT();
    if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::ReqMemPool r{};
    r.pool = h(pool);
    r.kind = proto::kPoolGetAccess;
    std::uint32_t type = 0;
    to_wire(rt, *location, &type, &r.device);
    r.attr = static_cast<std::int32_t>(type);
    std::int64_t v = 0;
    const CUresult st = pool_op(r, &v);
    if (st == CUDA_SUCCESS) *flags = static_cast<CUmemAccess_flags>(v);
    return st;
  });
}

// ==================================================================== sharing

CUresult CUDAAPI cuMemPoolExportToShareableHandle(void* handle_out, CUmemoryPool pool, CUmemAllocationHandleType type,
                                                  unsigned long long flags) {
  return guard([&] {
    NEED_RT();
    if (handle_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::RepShareToken rep{};
    const CUresult st = rt->call<Op::kMemPoolExport>(
        proto::ReqPoolExport{h(pool), flags, static_cast<std::uint32_t>(type), proc_id()}, {}, &rep);
    if (st != CUDA_SUCCESS) return st;
    return ivcuda::guest::internal::make_share_fd(rep.token, static_cast<int*>(handle_out));
  });
}

CUresult CUDAAPI cuMemPoolImportFromShareableHandle(CUmemoryPool* pool_out, void* handle, CUmemAllocationHandleType type,
                                                    unsigned long long flags) {
  return guard([&] {
    NEED_RT();
    if (pool_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (type == CU_MEM_HANDLE_TYPE_FABRIC || type == CU_MEM_HANDLE_TYPE_WIN32 || type == CU_MEM_HANDLE_TYPE_WIN32_KMT)
      return CUDA_ERROR_NOT_SUPPORTED;  // nothing of the kind can reach a guest (docs/design.md)
    // fd 0 arrives as a null handle, which the driver refuses as one.
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::ReqPoolImport r{};
    r.flags = flags;
    r.handle_type = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    r.proc = proc_id();
    // Any other fd gets the host driver's answer for an fd that is no exported pool.
    r.no_token = ivcuda::guest::internal::read_share_fd(static_cast<int>(reinterpret_cast<std::intptr_t>(handle)),
                                                        r.token)
                     ? 0
                     : 1;
    proto::RepHandle rep{};
    const CUresult st = rt->call<Op::kMemPoolImport>(r, {}, &rep);
    if (st == CUDA_SUCCESS) *pool_out = reinterpret_cast<CUmemoryPool>(rep.handle);
    return st;
  });
}

CUresult CUDAAPI cuMemPoolExportPointer(CUmemPoolPtrExportData* out, CUdeviceptr ptr) {
  return guard([&] {
    NEED_RT();
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::RepIpcHandle rep{};
    const CUresult st =
        rt->call<Op::kMemPoolExportPtr>(proto::ReqPoolPtr{current_ctx(), ptr, proc_id(), 0}, {}, &rep);
    static_assert(sizeof out->reserved == sizeof rep.bytes);
    if (st == CUDA_SUCCESS) std::memcpy(out->reserved, rep.bytes, sizeof out->reserved);
    return st;
  });
}

CUresult CUDAAPI cuMemPoolImportPointer(CUdeviceptr* ptr_out, CUmemoryPool pool, CUmemPoolPtrExportData* data) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (ptr_out == nullptr || pool == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::ReqPoolPtrImport r{};
    r.ctx = ctx;
    r.pool = h(pool);
    r.proc = proc_id();
    static_assert(sizeof r.data == sizeof data->reserved);
    std::memcpy(r.data, data->reserved, sizeof r.data);
    proto::RepRange rep{};
    const CUresult st = rt->call<Op::kMemPoolImportPtr>(r, {}, &rep);
    if (st != CUDA_SUCCESS) return st;
    // Booked once per address, released with the last free; an address that
    // is this process's own memory already (a host that answered with the
    // exporter's allocation in the exporting process) keeps its books.
    bool book = false;
    {
      std::lock_guard lk(rt->books_mu);
      Runtime::PoolImport& imp = rt->pool_imports[rep.base];
      if (imp.count++ == 0) {
        imp.size = rep.size;
        imp.booked = book = rt->dev_allocs.count(rep.base) == 0;
        if (book) rt->dev_allocs[rep.base] = rep.size;
      }
    }
    if (book && !rt->reserve_device_range(rep.base, rep.size))
      ivcuda::guest::log_once("pool-import-va-collision",
                              "memory imported from a pool at 0x%llx overlaps this process's own memory: cuMemcpy "
                              "with unified addressing may take one for the other",
                              static_cast<unsigned long long>(rep.base));
    *ptr_out = rep.base;
    return CUDA_SUCCESS;
  });
}

bool ivcuda::guest::internal::free_pool_import(Runtime* rt, CUdeviceptr d, CUstream s, bool async, CUresult* st) {
  {
    std::lock_guard lk(rt->books_mu);
    if (rt->pool_imports.count(d) == 0) return false;
  }
  *st = rt->call<Op::kMemPoolPtrFree>(
      proto::ReqPoolPtrFree{current_ctx(), h(s), d, proc_id(), async ? 1u : 0u});
  if (*st != CUDA_SUCCESS) return true;
  std::uint64_t release = 0;
  {
    std::lock_guard lk(rt->books_mu);
    auto it = rt->pool_imports.find(d);
    if (it != rt->pool_imports.end() && --it->second.count == 0) {
      if (it->second.booked) {
        release = it->second.size;
        rt->dev_allocs.erase(d);
      }
      rt->pool_imports.erase(it);
    }
  }
  if (release != 0) rt->release_device_range(d, release);
  return true;
}

// ==================================================================== pools by location (CUDA 13)

namespace {
// Device locations of pinned memory are the devices' pools; host and
// managed pools are not offered (host-daemon/worker/pools.cc says why).
CUresult location_device(const CUmemLocation* loc, CUmemAllocationType type, CUdevice* dev) {
  if (loc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (type == CU_MEM_ALLOCATION_TYPE_PINNED && loc->type == CU_MEM_LOCATION_TYPE_DEVICE) {
    *dev = loc->id;
    return CUDA_SUCCESS;
  }
  const bool known = (type == CU_MEM_ALLOCATION_TYPE_PINNED || type == CU_MEM_ALLOCATION_TYPE_MANAGED) &&
                     (loc->type == CU_MEM_LOCATION_TYPE_DEVICE || loc->type == CU_MEM_LOCATION_TYPE_HOST ||
                      loc->type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
                      (type == CU_MEM_ALLOCATION_TYPE_MANAGED && loc->type == CU_MEM_LOCATION_TYPE_NONE));
  return known ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE;
}
}  // namespace

CUresult CUDAAPI cuMemGetDefaultMemPool(CUmemoryPool* pool, CUmemLocation* loc, CUmemAllocationType type) {
  CUdevice dev = 0;
  if (const CUresult st = location_device(loc, type, &dev); st != CUDA_SUCCESS) return st;
  return cuDeviceGetDefaultMemPool(pool, dev);
}
CUresult CUDAAPI cuMemGetMemPool(CUmemoryPool* pool, CUmemLocation* loc, CUmemAllocationType type) {
  CUdevice dev = 0;
  if (const CUresult st = location_device(loc, type, &dev); st != CUDA_SUCCESS) return st;
  return cuDeviceGetMemPool(pool, dev);
}
CUresult CUDAAPI cuMemSetMemPool(CUmemLocation* loc, CUmemAllocationType type, CUmemoryPool pool) {
  CUdevice dev = 0;
  if (const CUresult st = location_device(loc, type, &dev); st != CUDA_SUCCESS) return st;
  return cuDeviceSetMemPool(dev, pool);
}
