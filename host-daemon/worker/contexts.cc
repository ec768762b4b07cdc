// Sessions (hello, goodbye, flush), device information and contexts: primary
// contexts as the guest retains them, created contexts, limits. The guest side
// is guest/contexts.cc.
#include <algorithm>
#include <cstring>

#include "host-daemon/shared/log.h"
#include "host-daemon/shared/rules.h"
#include "host-daemon/shared/from_worker.h"
#include "host-daemon/worker/worker_internal.h"

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
    if (IVCUDA_RULE("vm-process-workers") && static_cast<std::int32_t>(r.pid) != mine) {
      if (errors_logged_++ < 100)
        IVLOG_WARN("guest %u channel %u: process %u says hello on a channel of process %d; refused", cfg_.guest_id,
                   c.ch.index, r.pid, mine);
      return CUDA_ERROR_NOT_PERMITTED;
    }
    // ...or a process with the same pid in another PID namespace (another
    // container of the VM): the channel was claimed for this worker's.
    const std::uint32_t ns = cfg_.vm->slot(cfg_.vm_slot).guest_pidns.load();
    if (IVCUDA_RULE("vm-process-pidns") && r.pidns != ns) {
      if (errors_logged_++ < 100)
        IVLOG_WARN("guest %u channel %u: process %u of pid namespace %u says hello on a channel of pid namespace %u; "
                   "refused", cfg_.guest_id, c.ch.index, r.pid, r.pidns, ns);
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
// A guest thread that waits for its staged chunks (guest/memory.cc
// wait_staged) asks for this instead of Flush: answered as Flush is, once the
// channel's copies are done, but it is no synchronising call, so it leaves
// the errors of posted work for the next one to report (when a wait turns
// into a round trip is a matter of timing, a reported error must not be).
CUresult Worker::on_FlushWait(Call&) { return CUDA_SUCCESS; }

// cuDeviceGetTexture1DLinearMaxWidth of a granted GPU.
CUresult Worker::on_Texture1DLinearMaxWidth(Call& c) {
  const auto r = c.req<ReqTexWidth>();
  if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  CUarray_format format;
  if (!wire_enum(r.format, &format)) return CUDA_ERROR_INVALID_VALUE;
  std::size_t width = 0;
  const CUresult st = cu_.cuDeviceGetTexture1DLinearMaxWidth(&width, format, r.channels, devices_[dev_index(r.device)]);
  c.set_reply(RepValue{static_cast<std::int64_t>(width)});
  return st;
}

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

namespace {
// Context flags a guest may ask for: a primary context's
// (cuDevicePrimaryCtxSetFlags), and a created context's (cuCtxCreate,
// cuCtxSetFlags), which may also ask for synchronous memory operations to
// synchronise. The core-dump flags are not among them: they make the driver
// write a GPU core dump file (and open a pipe) from the worker's process, on
// the host (issue 28).
constexpr unsigned kPrimaryCtxFlags = CU_CTX_SCHED_MASK | CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX;
constexpr unsigned kGuestCtxFlags = kPrimaryCtxFlags | CU_CTX_SYNC_MEMOPS;
}  // namespace

// A context the worker makes for the guest is charged to its quota before
// the driver sees the call (the first GPU's primary, which the worker holds
// from its start, is charged in init()).
Charge Worker::context_charge() {
  if (!IVCUDA_RULE("context-charged")) return quota_.take(0);
  Charge ch = quota_.take(cfg_.context_reserve);
  if (!ch && errors_logged_++ < 100)
    IVLOG_WARN("guest %u: no room in its quota for one more context (--context-reserve %llu MiB); refused",
               cfg_.guest_id, static_cast<unsigned long long>(cfg_.context_reserve >> 20));
  return ch;
}

CUresult Worker::on_PrimaryRetain(Call& c) {
  const auto r = c.req<ReqDevice>();
  if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  const auto h = primary_[dev_index(r.device)];
  CtxEntry* e = ctxs_.find(h);
  if (e->guest_refs == 0) {
    // Another GPU's primary context is made now; the first GPU's exists
    // already (the arena's) and was charged then.
    Charge ch;
    if (devices_[dev_index(r.device)] != devices_[0] && !(ch = context_charge())) return CUDA_ERROR_OUT_OF_MEMORY;
    CUcontext real = nullptr;
    const CUresult st = cu_.cuDevicePrimaryCtxRetain(&real, devices_[dev_index(r.device)]);
    if (st != CUDA_SUCCESS) return st;
    e->real = real;
    e->charge = std::move(ch);
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
    settle_pools(false);  // its stream-ordered allocations went back to their pools
    cu_.cuDevicePrimaryCtxRelease(devices_[dev_index(r.device)]);
    if (current_ == e->real && e->real != arena_ctx_) current_ = nullptr;
    if (e->real != arena_ctx_) {
      // The driver's context went with the last retain, and with it what it
      // and its limits held.
      e->real = nullptr;
      e->charge.release();
      e->limits = LimitBooks{};
    }
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
  if (e->real != nullptr && e->guest_refs > 0) {
    release_primary_objects(*e, h);
    settle_pools(false);
  }
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
  if ((r.flags & ~kPrimaryCtxFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  CtxEntry* e = ctxs_.find(primary_[dev_index(r.device)]);
  const CUresult st = cu_.cuDevicePrimaryCtxSetFlags(devices_[dev_index(r.device)], r.flags);
  if (st == CUDA_SUCCESS) e->flags = r.flags;
  return st;
}

CUresult Worker::on_CtxCreate(Call& c) {
  const auto r = c.req<ReqDeviceFlags>();
  if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  if (IVCUDA_RULE("context-flags") && (r.flags & ~kGuestCtxFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (full(ctxs_, cfg_.limits.contexts, "context")) return CUDA_ERROR_OUT_OF_MEMORY;
  Charge ch = context_charge();
  if (!ch) return CUDA_ERROR_OUT_OF_MEMORY;
  CUcontext real = nullptr;
  const CUresult st = cu_.cuCtxCreate(&real, nullptr, r.flags, devices_[dev_index(r.device)]);
  if (st != CUDA_SUCCESS) return st;
  current_ = real;  // cuCtxCreate made it current on this thread
  CtxEntry e;
  e.real = real;
  e.device = r.device;
  e.charge = std::move(ch);
  c.set_reply(RepHandle{ctxs_.insert(std::move(e))});
  return CUDA_SUCCESS;
}

CUresult Worker::on_CtxDestroy(Call& c) {
  const auto r = c.req<ReqHandle>();
  CtxEntry* e = ctxs_.find(r.handle);
  // A green context's converted context goes with cuGreenCtxDestroy only.
  if (e == nullptr || e->primary || e->real == nullptr || e->green != 0) return CUDA_ERROR_INVALID_CONTEXT;
  const CUresult st = cu_.cuCtxDestroy(e->real);
  if (st != CUDA_SUCCESS) return st;
  if (current_ == e->real) current_ = nullptr;
  drop_ctx_objects(r.handle);
  ctxs_.erase(r.handle);
  settle_pools(false);  // its stream-ordered allocations went back to their pools
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

// Device bytes a limit's value reserves in a context of guest device `device`
// beyond `base`, the driver's value before the guest first set it; false when
// the product overflows (refused).
bool Worker::limit_bytes(CUlimit limit, std::uint64_t value, std::uint64_t base, int device, std::uint64_t* out) {
  const std::uint64_t extra = value > base ? value - base : 0;
  switch (limit) {
    case CU_LIMIT_STACK_SIZE: {
      // Each thread the device can hold resident gets the stack: the driver
      // reserves it up front, for all of them (cudaDeviceSetLimit fails with
      // an allocation error for this reason).
      int sms = 0, per_sm = 0;
      const CUdevice d = devices_[dev_index(device)];
      if (cu_.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d) != CUDA_SUCCESS ||
          cu_.cuDeviceGetAttribute(&per_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, d) != CUDA_SUCCESS)
        sms = per_sm = 4096;  // cannot tell: as if very large
      const std::uint64_t threads = static_cast<std::uint64_t>(std::max(sms, 1)) * static_cast<std::uint64_t>(std::max(per_sm, 1));
      return mul_ok(extra, threads, out);
    }
    case CU_LIMIT_PRINTF_FIFO_SIZE:
    case CU_LIMIT_MALLOC_HEAP_SIZE:
      *out = extra;
      return true;
    case CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT:
      // The device runtime keeps a record per pending launch; its size is not
      // documented. The estimate errs high (a launch's parameters alone may be
      // 32 KiB) until tests/programs/drv_context_cost measures it.
      return mul_ok(extra, kPendingLaunchBytes, out);
    default:
      *out = 0;
      return true;
  }
}

// What a limit reserves on the device is charged before the driver sees the
// value (issue 28: a stack of 1 MiB per thread is 260 GiB on an H200's
// resident threads): the bytes beyond what the context had before the
// guest's first set, after the value the driver actually took.
CUresult Worker::on_CtxSetLimit(Call& c) {
  const auto r = c.req<ReqLimit>();
  CtxEntry* ce = nullptr;
  if (CUresult st = use_ctx(r.ctx, &ce); st != CUDA_SUCCESS) return st;
  CUlimit limit;
  if (!wire_enum(r.limit, &limit)) return CUDA_ERROR_INVALID_VALUE;
  const int slot = static_cast<int>(limit);
  const bool charged = limit == CU_LIMIT_STACK_SIZE || limit == CU_LIMIT_PRINTF_FIFO_SIZE ||
                       limit == CU_LIMIT_MALLOC_HEAP_SIZE || limit == CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT;
  static_assert(CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT < kChargedLimits);
  if (!charged || !IVCUDA_RULE("context-limits-charged")) return cu_.cuCtxSetLimit(limit, r.value);
  LimitBooks& b = ce->limits;
  if (!b.known[slot]) {
    size_t v = 0;
    if (CUresult st = cu_.cuCtxGetLimit(&v, limit); st != CUDA_SUCCESS) return st;
    b.base[slot] = v;
    b.known[slot] = true;
  }
  if (!b.charge) b.charge = quota_.take(0);
  std::uint64_t want = 0;
  if (!limit_bytes(limit, r.value, b.base[slot], ce->device, &want)) return CUDA_ERROR_OUT_OF_MEMORY;
  const std::uint64_t had = b.bytes[slot];
  if (want > had) {
    Charge more = quota_.take(want - had);  // through take(): pools give back what they keep first
    if (!more) return CUDA_ERROR_OUT_OF_MEMORY;
    b.charge.absorb(std::move(more));
  }
  const CUresult st = cu_.cuCtxSetLimit(limit, r.value);
  if (st != CUDA_SUCCESS) {
    if (want > had) b.charge.shrink(want - had);
    return st;
  }
  // The driver may round the value up; what it took is what it holds.
  size_t took = 0;
  std::uint64_t held = want;
  if (cu_.cuCtxGetLimit(&took, limit) == CUDA_SUCCESS && took > r.value &&
      limit_bytes(limit, took, b.base[slot], ce->device, &held) && held > want)
    (void)b.charge.hold(held - want);
  else
    held = want;
  if (held < had) b.charge.shrink(had - held);
  b.bytes[slot] = held;
  return CUDA_SUCCESS;
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
    case kCtxSetFlags:
      if (IVCUDA_RULE("context-flags") && (r.value & ~std::uint64_t{kGuestCtxFlags}) != 0)
        return CUDA_ERROR_INVALID_VALUE;
      return cu_.cuCtxSetFlags(static_cast<unsigned>(r.value));
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
