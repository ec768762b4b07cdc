// Stream-ordered memory and memory pools: the devices' default pools, pools
// the guest creates (cuMemPoolCreate), their attributes and access, and the
// allocations made from them (cuMemAllocAsync, cuMemAllocFromPoolAsync,
// cuMemFreeAsync). The guest side is guest/pools.cc.
//
// A pool is a handle of this worker's table: the driver's pool pointers never
// reach the guest, and a handle of another guest (or a destroyed pool) finds
// nothing here. Whatever the driver itself would judge (attribute values,
// access flags, a pool of the wrong device, destroying a default pool) is left
// to the driver, so that the guest hears the driver's own answer. What ivcuda
// cannot honour is refused with CUDA_ERROR_NOT_SUPPORTED:
//   - pools of host memory (location HOST, HOST_NUMA) and managed pools: their
//     memory would be the worker's host memory, which the guest's CPU cannot
//     reach;
//   - exporting a pool or a pointer of a pool created with a shareable handle
//     type: that needs sharing between the guest processes of one tenant
//     (not yet). A pool without the handle type asked for goes to the driver,
//     which refuses it in its own words.
// Allocations from any pool are device memory the guest owns (ranges_) until
// freed, also after their pool is destroyed (the driver keeps them alive).
#include <unistd.h>

#include <cstring>

#include "host-daemon/log.h"
#include "host-daemon/worker_internal.h"

namespace ivcuda::host {

using namespace ivcuda::proto;

std::uint64_t Worker::pool_handle(CUmemoryPool real, int device) {
  std::uint64_t found = 0;
  pools_.for_each([&](std::uint64_t h, PoolEntry& p) {
    if (p.real == real) found = h;
  });
  return found != 0 ? found : pools_.insert(PoolEntry{real, device});
}

// A guest location in the driver's numbering. A device the guest may not use
// becomes an ordinal the driver has no device for, so that the driver answers
// a bad ordinal as it answers one on bare metal.
CUresult Worker::pool_location(std::uint32_t type, std::int32_t id, CUmemLocation* out) {
  out->type = static_cast<CUmemLocationType>(type);
  out->id = id;
  if (type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_SUCCESS;
  if (valid_device(id)) {
    out->id = static_cast<int>(devices_[dev_index(id)]);
    return CUDA_SUCCESS;
  }
  int count = 0;
  if (CUresult st = cu_.cuDeviceGetCount(&count); st != CUDA_SUCCESS) return st;
  out->id = count;
  return CUDA_SUCCESS;
}

void Worker::destroy_created_pools() noexcept {
  pools_.for_each([&](std::uint64_t, PoolEntry& p) {
    if (p.created && p.real != nullptr) (void)cu_.cuMemPoolDestroy(p.real);
    p.real = nullptr;
  });
}

CUresult Worker::on_MemPoolCreate(Call& c) {
  const auto r = c.req<ReqMemPoolCreate>();
  // The driver wants both zero; the guest's pointer means nothing here.
  if (r.win32_attrs != 0 || r.reserved_set != 0) return CUDA_ERROR_INVALID_VALUE;
  if (r.alloc_type == CU_MEM_ALLOCATION_TYPE_MANAGED || r.loc_type == CU_MEM_LOCATION_TYPE_HOST ||
      r.loc_type == CU_MEM_LOCATION_TYPE_HOST_NUMA) {
    if (errors_logged_++ < 100)
      IVLOG_INFO("guest %u: memory pools of host or managed memory are not supported", cfg_.guest_id);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  CUmemPoolProps props{};
  props.allocType = static_cast<CUmemAllocationType>(r.alloc_type);
  props.handleTypes = static_cast<CUmemAllocationHandleType>(r.handle_types);
  if (CUresult st = pool_location(r.loc_type, r.loc_id, &props.location); st != CUDA_SUCCESS) return st;
  props.maxSize = r.max_size;
  props.usage = r.usage;
  CUmemoryPool real = nullptr;
  const CUresult st = cu_.cuMemPoolCreate(&real, &props);
  if (st != CUDA_SUCCESS) return st;
  PoolEntry e{real, r.loc_id};
  e.created = true;
  e.handle_types = r.handle_types;
  c.set_reply(RepHandle{pools_.insert(e)});
  return CUDA_SUCCESS;
}

CUresult Worker::on_MemPoolSetAccess(Call& c) {
  const auto r = c.req<ReqMemPoolSetAccess>();
  const auto tail = c.tail<ReqMemPoolSetAccess>();
  if (r.count > kMaxDevices || tail.size() != r.count * sizeof(MemAccess)) return CUDA_ERROR_INVALID_VALUE;
  PoolEntry* p = pools_.find(r.pool);
  if (p == nullptr || p->real == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUmemAccessDesc desc[kMaxDevices] = {};
  for (std::uint32_t i = 0; i < r.count; ++i) {
    MemAccess a;
    std::memcpy(&a, tail.data() + i * sizeof a, sizeof a);
    if (CUresult st = pool_location(a.loc_type, a.loc_id, &desc[i].location); st != CUDA_SUCCESS) return st;
    desc[i].flags = static_cast<CUmemAccess_flags>(a.flags);
  }
  return cu_.cuMemPoolSetAccess(p->real, r.count != 0 ? desc : nullptr, r.count);
}

CUresult Worker::on_MemPool(Call& c) {
  const auto r = c.req<ReqMemPool>();
  if (r.ctx != 0)
    if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  RepValue rep{};
  CUresult st = CUDA_SUCCESS;
  // Every kind but the device queries and pointer export names a pool (the
  // device is checked first where there is one).
  if (r.kind == kPoolSetCurrent && !valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  PoolEntry* p = nullptr;
  if (r.kind != kPoolGetDefault && r.kind != kPoolGetCurrent && r.kind != kPoolExportPtr) {
    p = pools_.find(r.pool);
    if (p == nullptr || p->real == nullptr) return CUDA_ERROR_INVALID_VALUE;
  }
  switch (r.kind) {
    case kPoolGetDefault:
    case kPoolGetCurrent: {
      if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
      const CUdevice d = devices_[dev_index(r.device)];
      CUmemoryPool got = nullptr;
      st = r.kind == kPoolGetDefault ? cu_.cuDeviceGetDefaultMemPool(&got, d) : cu_.cuDeviceGetMemPool(&got, d);
      if (st != CUDA_SUCCESS) return st;
      rep.value = static_cast<std::int64_t>(pool_handle(got, r.device));
      break;
    }
    case kPoolSetCurrent:
      st = cu_.cuDeviceSetMemPool(devices_[dev_index(r.device)], p->real);
      break;
    case kPoolSetAttr:
    case kPoolGetAttr: {
      const auto attr = static_cast<CUmemPool_attribute>(r.attr);
      // The value's type depends on the attribute: the first three are ints.
      const bool is_int = attr == CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES ||
                          attr == CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC ||
                          attr == CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
      const bool is_u64 = attr >= CU_MEMPOOL_ATTR_RELEASE_THRESHOLD && attr <= CU_MEMPOOL_ATTR_USED_MEM_HIGH;
      if (!is_int && !is_u64) return CUDA_ERROR_INVALID_VALUE;
      int iv = static_cast<int>(r.value);
      cuuint64_t uv = r.value;
      void* v = is_int ? static_cast<void*>(&iv) : static_cast<void*>(&uv);
      if (r.kind == kPoolSetAttr) {
        st = cu_.cuMemPoolSetAttribute(p->real, attr, v);
      } else {
        st = cu_.cuMemPoolGetAttribute(p->real, attr, v);
        rep.value = is_int ? iv : static_cast<std::int64_t>(uv);
      }
      break;
    }
    case kPoolTrim:
      st = cu_.cuMemPoolTrimTo(p->real, r.value);
      break;
    case kPoolDestroy:
      // The driver refuses a default pool itself. Allocations still out stay
      // valid (and the guest's) until freed; the handle dies now.
      st = cu_.cuMemPoolDestroy(p->real);
      if (st == CUDA_SUCCESS) pools_.erase(r.pool);
      break;
    case kPoolGetAccess: {
      CUmemLocation loc{};
      if ((st = pool_location(static_cast<std::uint32_t>(r.attr), r.device, &loc)) != CUDA_SUCCESS) return st;
      CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
      st = cu_.cuMemPoolGetAccess(&flags, p->real, &loc);
      rep.value = static_cast<std::int64_t>(flags);
      break;
    }
    case kPoolExport: {
      const auto type = static_cast<std::uint32_t>(r.attr);
      if (type != 0 && (p->handle_types & type) == type) {
        if (errors_logged_++ < 100)
          IVLOG_INFO("guest %u: exporting a memory pool is not supported yet", cfg_.guest_id);
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      // Not exportable as asked: the driver says why. Should it export after
      // all, nothing leaves the worker.
      alignas(8) unsigned char out[64] = {};
      st = cu_.cuMemPoolExportToShareableHandle(out, p->real, static_cast<CUmemAllocationHandleType>(type), r.value);
      if (st == CUDA_SUCCESS) {
        if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
          int fd = -1;
          std::memcpy(&fd, out, sizeof fd);
          if (fd >= 0) ::close(fd);
        }
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      break;
    }
    case kPoolExportPtr: {
      auto it = ranges_.upper_bound(r.value);
      if (it != ranges_.begin()) {
        const auto& [base, range] = *std::prev(it);
        if (r.value - base < range.size && range.pool != 0) {
          const PoolEntry* from = pools_.find(range.pool);
          if (from != nullptr && from->created && from->handle_types != 0) {
            if (errors_logged_++ < 100)
              IVLOG_INFO("guest %u: exporting a pool allocation is not supported yet", cfg_.guest_id);
            return CUDA_ERROR_NOT_SUPPORTED;
          }
        }
      }
      CUmemPoolPtrExportData data{};
      st = cu_.cuMemPoolExportPointer(&data, r.value);
      if (st == CUDA_SUCCESS) return CUDA_ERROR_NOT_SUPPORTED;
      break;
    }
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  c.set_reply(rep);
  return st;
}

CUresult Worker::on_MemAllocAsync(Call& c) {
  const auto r = c.req<ReqMemAllocAsync>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  if (r.bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  CUdeviceptr d = 0;
  CUresult st;
  if (r.pool != 0) {
    PoolEntry* p = pools_.find(r.pool);
    if (p == nullptr || p->real == nullptr) return CUDA_ERROR_INVALID_VALUE;
    st = cu_.cuMemAllocFromPoolAsync(&d, r.bytes, p->real, s);
  } else {
    st = cu_.cuMemAllocAsync(&d, r.bytes, s);
  }
  if (st != CUDA_SUCCESS) return st;
  // The guest's memory like any allocation: device-pointer checks accept it,
  // cuMemFree may free it and it is freed when the guest goes away.
  ranges_[d] = DevRange{r.bytes, r.ctx, RangeKind::kAlloc, r.pool};
  c.set_reply(RepMemAlloc{d, 0});
  return CUDA_SUCCESS;
}

CUresult Worker::on_MemFreeAsync(Call& c) {
  const auto r = c.req<ReqFreeAsync>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  auto it = ranges_.find(r.dptr);
  if (it == ranges_.end() || it->second.kind != RangeKind::kAlloc) return CUDA_ERROR_INVALID_VALUE;
  if (!ipc_on_free(r.dptr)) return CUDA_SUCCESS;  // freed at the last IPC close
  const CUresult st = cu_.cuMemFreeAsync(r.dptr, s);
  // Work queued before the free may still use the memory; nothing the guest
  // sends from now on may.
  if (st == CUDA_SUCCESS) ranges_.erase(it);
  return st;
}

}  // namespace ivcuda::host
