// Sessions (hello, goodbye, flush), device information and contexts: primary
// contexts as the guest retains them, created contexts, limits. The guest side
// is guest/contexts.cc.
#include <cstring>

#include "host-daemon/log.h"
#include "host-daemon/vm_supervisor.h"
#include "host-daemon/worker_internal.h"

namespace ivcuda::host {

using namespace ivcuda::proto;
using namespace detail;

CUresult Worker::on_Hello(Call& c) {
  const auto r = c.req<ReqHello>();
  if (r.proto_version != kProtoVersion) {
    IVLOG_ERROR("guest %u speaks protocol %u, this daemon %u", cfg_.guest_id, r.proto_version,
                kProtoVersion);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  // A VM's worker serves one guest process: a hello from another process on
  // one of its channels is somebody using a channel that is not theirs.
  if (cfg_.vm != nullptr) {
    const std::int32_t mine = cfg_.vm->slot(cfg_.vm_slot).guest_pid.load();
    if (static_cast<std::int32_t>(r.pid) != mine) {
      if (errors_logged_++ < 100)
        IVLOG_WARN("guest %u channel %u: process %u says hello on a channel of process %d; refused", cfg_.guest_id,
                   c.ch.index, r.pid, mine);
      return CUDA_ERROR_NOT_PERMITTED;
    }
  }
  hello_pid_ = r.pid;  // process mode: the guest's pid in NVML's process lists (nvml.cc)
  RepHello rep{};
  rep.proto_version = kProtoVersion;
  int v = 0;
  cu_.cuDriverGetVersion(&v);
  rep.driver_version = v;
  rep.device_count = static_cast<std::uint32_t>(devices_.size());
  int lo = 0, hi = 0;
  if (cu_.cuCtxGetStreamPriorityRange(&lo, &hi) == CUDA_SUCCESS) {
    rep.stream_priority_lo = lo;
    rep.stream_priority_hi = hi;
  }
  rep.arena_device_base = arena_dev_ - l_.arena_off;
  rep.generation = cfg_.generation;
  IVLOG_INFO("guest %u: process %u says hello (parent %u)", cfg_.guest_id, r.pid, r.ppid);
  c.set_reply(rep);
  return CUDA_SUCCESS;
}

// A process lets a channel go (at exit). In a VM the channel returns to the
// supervisor once this is answered (serve_once).
CUresult Worker::on_Goodbye(Call& c) {
  if (cfg_.vm != nullptr) c.ch.detach = true;
  return CUDA_SUCCESS;
}

CUresult Worker::on_Flush(Call&) { return CUDA_SUCCESS; }

CUresult Worker::on_DeviceInfo(Call& c) {
  const auto r = c.req<ReqDevice>();
  if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  const CUdevice d = devices_[dev_index(r.device)];
  RepDeviceInfo rep{};
  rep.primary_ctx = primary_[dev_index(r.device)];
  CUresult st = cu_.cuDeviceGetName(rep.name, sizeof rep.name - 1, d);
  if (st != CUDA_SUCCESS) return st;
  CUuuid u{};
  if ((st = cu_.cuDeviceGetUuid(&u, d)) != CUDA_SUCCESS) return st;
  std::memcpy(rep.uuid, u.bytes, sizeof rep.uuid);
  size_t total = 0;
  if ((st = cu_.cuDeviceTotalMem(&total, d)) != CUDA_SUCCESS) return st;
  rep.total_mem = total;
  if (quota_.limit() != 0) rep.total_mem = std::min<std::uint64_t>(total, quota_.limit());  // the tenant's view
  for (int a = 1; a < static_cast<int>(kAttrSlots) && a < CU_DEVICE_ATTRIBUTE_MAX; ++a) {
    int v = 0;
    if (cu_.cuDeviceGetAttribute(&v, static_cast<CUdevice_attribute>(a), d) == CUDA_SUCCESS) {
      rep.attrs[a] = v;
      rep.attr_valid[a] = 1;
    }
  }
  // What the GPU has but a guest cannot use is reported absent, so that
  // frameworks take their other path instead of failing later (NCCL tries
  // NVLink SHARP where multicast is reported, for one).
  for (const CUdevice_attribute a : {
           // cuMulticast* is not forwarded.
           CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED,
           // Fabric handles and dma-bufs are host objects no guest can hold.
           CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
           CU_DEVICE_ATTRIBUTE_HOST_ALLOC_DMA_BUF_SUPPORTED,
           // Registered guest memory is moved onto the arena: its device
           // pointer is the arena's, not the guest's own address.
           CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM})
    if (static_cast<int>(a) < static_cast<int>(kAttrSlots)) rep.attrs[a] = 0;
  // Pools the guest may not have (pools.cc): host-memory pools. Of the
  // shareable handle types only POSIX fds travel.
  for (const auto a : {CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED, CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED})
    if (static_cast<std::size_t>(a) < kAttrSlots) rep.attrs[a] = 0;
  static_assert(CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES < kAttrSlots);
  rep.attrs[CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES] &=
      static_cast<std::int32_t>(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  c.set_reply(rep);
  return CUDA_SUCCESS;
}

CUresult Worker::on_PrimaryRetain(Call& c) {
  const auto r = c.req<ReqDevice>();
  if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  const auto h = primary_[dev_index(r.device)];
  CtxEntry* e = ctxs_.find(h);
  if (e->guest_refs == 0) {
    CUcontext real = nullptr;
    const CUresult st = cu_.cuDevicePrimaryCtxRetain(&real, devices_[dev_index(r.device)]);
    if (st != CUDA_SUCCESS) return st;
    e->real = real;
  }
  ++e->guest_refs;
  c.set_reply(RepHandle{h});
  return CUDA_SUCCESS;
}

CUresult Worker::on_PrimaryRelease(Call& c) {
  const auto r = c.req<ReqDevice>();
  if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  const auto h = primary_[dev_index(r.device)];
  CtxEntry* e = ctxs_.find(h);
  if (e->guest_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--e->guest_refs == 0) {
    release_primary_objects(*e, h);
    cu_.cuDevicePrimaryCtxRelease(devices_[dev_index(r.device)]);
    if (current_ == e->real && e->real != arena_ctx_) current_ = nullptr;
    if (e->real != arena_ctx_) e->real = nullptr;
  }
  return CUDA_SUCCESS;
}

CUresult Worker::on_PrimaryReset(Call& c) {
  const auto r = c.req<ReqDevice>();
  if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  const auto h = primary_[dev_index(r.device)];
  CtxEntry* e = ctxs_.find(h);
  // Resetting destroys what the guest made in the primary context. The
  // driver context itself is kept when it holds the arena registration: the
  // guest cannot tell the difference, and its page-locked memory stays valid.
  if (e->real != nullptr && e->guest_refs > 0) release_primary_objects(*e, h);
  if (e->real != nullptr) cu_.cuCtxSynchronize();
  return CUDA_SUCCESS;
}

CUresult Worker::on_PrimaryGetState(Call& c) {
  const auto r = c.req<ReqDevice>();
  if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  CtxEntry* e = ctxs_.find(primary_[dev_index(r.device)]);
  RepPrimaryState rep{};
  rep.flags = e->flags;
  rep.active = e->guest_refs > 0 ? 1 : 0;
  c.set_reply(rep);
  return CUDA_SUCCESS;
}

CUresult Worker::on_PrimarySetFlags(Call& c) {
  const auto r = c.req<ReqDeviceFlags>();
  if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  constexpr unsigned kKnown = CU_CTX_SCHED_MASK | CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX;
  if ((r.flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  CtxEntry* e = ctxs_.find(primary_[dev_index(r.device)]);
  const CUresult st = cu_.cuDevicePrimaryCtxSetFlags(devices_[dev_index(r.device)], r.flags);
  if (st == CUDA_SUCCESS) e->flags = r.flags;
  return st;
}

CUresult Worker::on_CtxCreate(Call& c) {
  const auto r = c.req<ReqDeviceFlags>();
  if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  if (full(ctxs_, cfg_.limits.contexts, "context")) return CUDA_ERROR_OUT_OF_MEMORY;
  CUcontext real = nullptr;
  const CUresult st = cu_.cuCtxCreate(&real, nullptr, r.flags, devices_[dev_index(r.device)]);
  if (st != CUDA_SUCCESS) return st;
  current_ = real;  // cuCtxCreate made it current on this thread
  CtxEntry e;
  e.real = real;
  e.device = r.device;
  c.set_reply(RepHandle{ctxs_.insert(e)});
  return CUDA_SUCCESS;
}

CUresult Worker::on_CtxDestroy(Call& c) {
  const auto r = c.req<ReqHandle>();
  CtxEntry* e = ctxs_.find(r.handle);
  if (e == nullptr || e->primary || e->real == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  const CUresult st = cu_.cuCtxDestroy(e->real);
  if (st != CUDA_SUCCESS) return st;
  if (current_ == e->real) current_ = nullptr;
  drop_ctx_objects(r.handle);
  ctxs_.erase(r.handle);
  return CUDA_SUCCESS;
}

CUresult Worker::on_CtxSynchronize(Call& c) {
  const auto r = c.req<ReqCtx>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  return cu_.cuCtxSynchronize();
}

CUresult Worker::on_CtxGetLimit(Call& c) {
  const auto r = c.req<ReqLimit>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  size_t v = 0;
  CUlimit limit;
  if (!wire_enum(r.limit, &limit)) return CUDA_ERROR_INVALID_VALUE;
  const CUresult st = cu_.cuCtxGetLimit(&v, limit);
  c.set_reply(RepValue{static_cast<std::int64_t>(v)});
  return st;
}

CUresult Worker::on_CtxSetLimit(Call& c) {
  const auto r = c.req<ReqLimit>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUlimit limit;
  if (!wire_enum(r.limit, &limit)) return CUDA_ERROR_INVALID_VALUE;
  return cu_.cuCtxSetLimit(limit, r.value);
}

// Context flags and configuration, the persisting-L2 reset, and events of
// a whole context: the driver judges every value; they touch only the
// guest's own context.
CUresult Worker::on_CtxMisc(Call& c) {
  const auto r = c.req<ReqCtxMisc>();
  CtxEntry* ce = nullptr;
  if (CUresult st = use_ctx(r.ctx, &ce); st != CUDA_SUCCESS) return st;
  unsigned u = 0;
  switch (r.kind) {
    case kCtxGetFlags: {
      const CUresult st = cu_.cuCtxGetFlags(&u);
      c.set_reply(RepValue{u});
      return st;
    }
    case kCtxSetFlags: return cu_.cuCtxSetFlags(r.value);
    case kCtxGetCacheConfig: {
      CUfunc_cache v = CU_FUNC_CACHE_PREFER_NONE;
      const CUresult st = cu_.cuCtxGetCacheConfig(&v);
      c.set_reply(RepValue{static_cast<std::int64_t>(v)});
      return st;
    }
    case kCtxSetCacheConfig: {
      CUfunc_cache v;
      if (!wire_enum(r.value, &v)) return CUDA_ERROR_INVALID_VALUE;
      return cu_.cuCtxSetCacheConfig(v);
    }
    case kCtxResetPersistingL2: return cu_.cuCtxResetPersistingL2Cache();
    case kCtxRecordEvent:
    case kCtxWaitEvent: {
      EventEntry* e = events_.find(r.event);
      if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      return r.kind == kCtxRecordEvent ? cu_.cuCtxRecordEvent(ce->real, e->real) : cu_.cuCtxWaitEvent(ce->real, e->real);
    }
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace ivcuda::host
