// Contexts of the GPU test double: created ones, primary ones, and each thread's stack.
#include <algorithm>
#include <mutex>
#include <thread>

#include "state.h"

using namespace ivcuda::gpu_double;

namespace {

bool valid_ctx_flags(unsigned flags) {
  if ((flags & ~static_cast<unsigned>(CU_CTX_FLAGS_MASK)) != 0) return false;
  switch (flags & CU_CTX_SCHED_MASK) {
    case CU_CTX_SCHED_AUTO:
    case CU_CTX_SCHED_SPIN:
    case CU_CTX_SCHED_YIELD:
    case CU_CTX_SCHED_BLOCKING_SYNC: return true;
    default: return false;
  }
}

CUresult device_of(const State& s, CUdevice dev) {
  return dev >= 0 && dev < s.device_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

// A context holds device memory of its own while it lives (on the H200 about
// 440-500 MiB each), which cuMemGetInfo and NVML count as used: the double
// charges context_mem() for each, refuses a context that does not fit as the
// driver does, and tells the ledger, so that the NVML double lists every
// process holding a context, with its memory, contexts included.
CUresult charge_context(State& s, int dev) {
  const auto d = static_cast<std::size_t>(dev);
  const std::size_t cost = context_mem();
  if (cost > total_mem() - std::min(total_mem(), s.used[d] + ledger_others(dev))) return CUDA_ERROR_OUT_OF_MEMORY;
  if (const auto delay = context_delay(); delay.count() > 0) std::this_thread::sleep_for(delay);
  s.used[d] += cost;
  ++s.held_contexts[d];
  ledger_publish(dev, s.used[d]);
  ledger_contexts(dev, s.held_contexts[d]);
  return CUDA_SUCCESS;
}

void discharge_context(State& s, int dev) {
  const auto d = static_cast<std::size_t>(dev);
  s.used[d] -= context_mem();
  --s.held_contexts[d];
  ledger_publish(dev, s.used[d]);
  ledger_contexts(dev, s.held_contexts[d]);
}

// Everything created in the primary context goes, and the context's own
// memory with it. A sticky fault stays: on a GPU only a new process recovers
// from one.
void reset_primary(State& s, Handle h) {
  s.release_context_resources(h);
  s.heap_used = false;
  Context& c = s.contexts.at(h);
  if (c.active) discharge_context(s, c.device);
  c.active = false;
}

}  // namespace

CUresult ivcuda::gpu_double::retain_primary(State& s, int dev) {
  const Handle h = s.primary[static_cast<std::size_t>(dev)];
  Context& c = s.contexts.at(h);
  if (!c.active)
    if (const CUresult r = charge_context(s, dev); r != CUDA_SUCCESS) return r;
  ++c.refs;
  c.active = true;
  return CUDA_SUCCESS;
}

CUresult ivcuda::gpu_double::release_primary(State& s, int dev) {
  const Handle h = s.primary[static_cast<std::size_t>(dev)];
  Context& c = s.contexts.at(h);
  if (c.refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--c.refs == 0) reset_primary(s, h);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* ctxCreateParams,
                                unsigned int flags, CUdevice dev) {
  return guarded([&](State& s) -> CUresult {
    if (pctx == nullptr || !valid_ctx_flags(flags)) return CUDA_ERROR_INVALID_VALUE;
    if (const CUresult r = device_of(s, dev); r != CUDA_SUCCESS) return r;
    if (ctxCreateParams != nullptr) {
      if (ctxCreateParams->numExecAffinityParams != 0 ||
          ctxCreateParams->execAffinityParams != nullptr)
        return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
      if (ctxCreateParams->cigParams != nullptr) return CUDA_ERROR_NOT_SUPPORTED;
    }
    const Handle h = s.new_handle();
    if (const CUresult r = s.fault[static_cast<std::size_t>(dev)]; r != CUDA_SUCCESS) return r;
    if (const CUresult r = charge_context(s, dev); r != CUDA_SUCCESS) return r;
    s.contexts[h] =
        Context{.device = dev, .flags = flags, .primary = false, .refs = 0, .active = true};
    ctx_stack().push_back(h);
    *pctx = to_handle<CUctx_st>(h);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx) {
  return guarded([&](State& s) -> CUresult {
    const Handle h = from_handle(ctx);
    const auto it = s.contexts.find(h);
    if (ctx == nullptr || it == s.contexts.end() || it->second.primary)
      return CUDA_ERROR_INVALID_CONTEXT;
    s.release_context_resources(h);
    discharge_context(s, it->second.device);
    s.contexts.erase(it);
    // Other threads that still have it current find it gone and get INVALID_CONTEXT.
    std::erase(ctx_stack(), h);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  return guarded([&](State& s) -> CUresult {
    auto& stack = ctx_stack();
    if (ctx == nullptr) {
      if (!stack.empty()) stack.pop_back();
      return CUDA_SUCCESS;
    }
    Handle named = 0;  // a green context's converted context is pushed as itself
    if (const CUresult r = resolve_context(s, from_handle(ctx), &named); r != CUDA_SUCCESS) return r;
    if (stack.empty())
      stack.push_back(from_handle(ctx));
    else
      stack.back() = from_handle(ctx);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext* pctx) {
  return guarded([&](State&) -> CUresult {
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto& stack = ctx_stack();
    *pctx = stack.empty() ? nullptr : to_handle<CUctx_st>(stack.back());
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx) {
  return guarded([&](State& s) -> CUresult {
    if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle named = 0;
    if (const CUresult r = resolve_context(s, from_handle(ctx), &named); r != CUDA_SUCCESS) return r;
    ctx_stack().push_back(from_handle(ctx));
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* pctx) {
  return guarded([&](State&) -> CUresult {
    auto& stack = ctx_stack();
    if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
    if (pctx != nullptr) *pctx = to_handle<CUctx_st>(stack.back());
    stack.pop_back();
    return CUDA_SUCCESS;
  });
}

namespace {
// All work already ran; only a fault is left to report, and kernels still "running"
// (IVCUDA_GPU_DOUBLE_KERNEL_US) to wait for, outside the state lock.
CUresult ctx_synchronize(CUcontext ctx) {
  const ApiGate gate;  // one call all along for a checkpoint's lock
  if (gate.refused()) return CUDA_ERROR_OPERATING_SYSTEM;
  for (;;) {
    const CUresult r = guarded([&](State& s) -> CUresult {
      Handle h = 0;
      if (ctx == nullptr) {
        if (const CUresult w = work_context(s, &h); w != CUDA_SUCCESS) return w;
      } else {
        if (const CUresult e = resolve_context(s, from_handle(ctx), &h); e != CUDA_SUCCESS) return e;
        const auto it = s.contexts.find(h);
        if (!it->second.active) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
        h = it->first;
        if (const CUresult f = s.fault_of(h); f != CUDA_SUCCESS) return f;
      }
      return std::chrono::steady_clock::now() < busy_end(s, h, nullptr, true) ? CUDA_ERROR_NOT_READY
                                                                               : CUDA_SUCCESS;
    });
    if (r != CUDA_ERROR_NOT_READY) return r;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}
}  // namespace

CUresult CUDAAPI cuCtxSynchronize() { return ctx_synchronize(nullptr); }

CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) { return ctx_synchronize(ctx); }

CUresult CUDAAPI cuCtxGetDevice(CUdevice* device) {
  return guarded([&](State& s) -> CUresult {
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // A converted context still current after its green context's end keeps its device (the
    // H200's driver answers it there, and CONTEXT_IS_DESTROYED to work).
    if (const auto& stack = ctx_stack(); !stack.empty())
      if (const auto d = s.dead_converted.find(stack.back()); d != s.dead_converted.end()) {
        *device = d->second;
        return CUDA_SUCCESS;
      }
    Handle h = 0;
    if (const CUresult r = current_context(s, &h); r != CUDA_SUCCESS) return r;
    *device = s.contexts.at(h).device;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice* device, CUcontext ctx) {
  if (ctx == nullptr) return cuCtxGetDevice(device);
  return guarded([&](State& s) -> CUresult {
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle h = 0;
    if (const CUresult r = resolve_context(s, from_handle(ctx), &h); r != CUDA_SUCCESS) return r;
    *device = s.contexts.at(h).device;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxGetFlags(unsigned int* flags) {
  return guarded([&](State& s) -> CUresult {
    if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle h = 0;
    if (const CUresult r = current_context(s, &h); r != CUDA_SUCCESS) return r;
    *flags = s.contexts.at(h).flags;
    return CUDA_SUCCESS;
  });
}

// The scheduling, memory-op synchronization and coredump flags the driver
// documents for cuCtxSetFlags; the double only keeps them.
CUresult CUDAAPI cuCtxSetFlags(unsigned int flags) {
  return guarded([&](State& s) -> CUresult {
    constexpr unsigned kSettable = CU_CTX_SCHED_MASK | CU_CTX_LMEM_RESIZE_TO_MAX | CU_CTX_COREDUMP_ENABLE |
                                   CU_CTX_USER_COREDUMP_ENABLE | CU_CTX_SYNC_MEMOPS;
    if ((flags & ~kSettable) != 0) return CUDA_ERROR_INVALID_VALUE;
    Handle h = 0;
    if (const CUresult r = current_context(s, &h); r != CUDA_SUCCESS) return r;
    s.contexts.at(h).flags = flags;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxGetCacheConfig(CUfunc_cache* config) {
  return guarded([&](State& s) -> CUresult {
    if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle h = 0;
    if (const CUresult r = current_context(s, &h); r != CUDA_SUCCESS) return r;
    *config = s.contexts.at(h).cache;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxSetCacheConfig(CUfunc_cache config) {
  return guarded([&](State& s) -> CUresult {
    if (config > CU_FUNC_CACHE_PREFER_EQUAL) return CUDA_ERROR_INVALID_VALUE;
    Handle h = 0;
    if (const CUresult r = current_context(s, &h); r != CUDA_SUCCESS) return r;
    s.contexts.at(h).cache = config;
    return CUDA_SUCCESS;
  });
}

// The double has no L2: nothing persists, there is nothing to reset.
CUresult CUDAAPI cuCtxResetPersistingL2Cache() {
  return guarded([&](State& s) -> CUresult {
    Handle h = 0;
    return current_context(s, &h);
  });
}

namespace {
// The context must exist and the event be one of its own.
CUresult ctx_event(CUcontext ctx, CUevent ev) {
  return guarded([&](State& s) -> CUresult {
    Handle h = 0;
    if (const CUresult r = resolve_context(s, from_handle(ctx), &h); r != CUDA_SUCCESS) return r;
    const auto it = s.events.find(from_handle(ev));
    if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
    return it->second.ctx == h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
  });
}
}  // namespace

// All of the context's work is complete when a call returns (the double runs
// work in the caller): recording marks the event now, waiting has nothing to wait for.
CUresult CUDAAPI cuCtxRecordEvent(CUcontext ctx, CUevent ev) {
  if (const CUresult r = ctx_event(ctx, ev); r != CUDA_SUCCESS) return r;
  return cuEventRecordWithFlags(ev, nullptr, CU_EVENT_RECORD_DEFAULT);
}

CUresult CUDAAPI cuCtxWaitEvent(CUcontext ctx, CUevent ev) { return ctx_event(ctx, ev); }

CUresult CUDAAPI cuCtxGetApiVersion(CUcontext ctx, unsigned int* version) {
  return guarded([&](State& s) -> CUresult {
    if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle h = from_handle(ctx);
    if (ctx == nullptr) {
      if (const CUresult r = current_context(s, &h); r != CUDA_SUCCESS) return r;
    } else if (const CUresult r = resolve_context(s, h, &h); r != CUDA_SUCCESS) {
      return r;
    }
    *version = 3020;  // what every context since CUDA 3.2 reports
    return CUDA_SUCCESS;
  });
}

// Ids are given on first ask, one per CUcontext handle (handles are never reused): a green
// context's converted context has one of its own, apart from the primary context's.
CUresult CUDAAPI cuCtxGetId(CUcontext ctx, unsigned long long* ctxId) {
  return guarded([&](State& s) -> CUresult {
    if (ctxId == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle h = from_handle(ctx);
    Handle work = 0;
    if (ctx == nullptr) {
      if (const CUresult r = current_context(s, &work); r != CUDA_SUCCESS) return r;
      h = ctx_stack().back();
    } else if (const CUresult r = resolve_context(s, h, &work); r != CUDA_SUCCESS) {
      return r;
    }
    const auto [it, fresh] = s.context_ids.try_emplace(h, 0);
    if (fresh) it->second = s.next_context_id++;
    *ctxId = it->second;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxGetStreamPriorityRange(int* leastPriority, int* greatestPriority) {
  return guarded([&](State& s) -> CUresult {
    Handle h = 0;
    if (const CUresult r = current_context(s, &h); r != CUDA_SUCCESS) return r;
    if (leastPriority != nullptr) *leastPriority = kLeastStreamPriority;
    if (greatestPriority != nullptr) *greatestPriority = kGreatestStreamPriority;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  return guarded([&](State& s) -> CUresult {
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (const CUresult r = device_of(s, dev); r != CUDA_SUCCESS) return r;
    if (const CUresult r = retain_primary(s, dev); r != CUDA_SUCCESS) return r;
    *pctx = to_handle<CUctx_st>(s.primary[static_cast<std::size_t>(dev)]);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return guarded([&](State& s) -> CUresult {
    if (const CUresult r = device_of(s, dev); r != CUDA_SUCCESS) return r;
    return release_primary(s, dev);
  });
}

CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  return guarded([&](State& s) -> CUresult {
    if (const CUresult r = device_of(s, dev); r != CUDA_SUCCESS) return r;
    reset_primary(s, s.primary[static_cast<std::size_t>(dev)]);  // inactive until the next retain
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  return guarded([&](State& s) -> CUresult {
    if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (const CUresult r = device_of(s, dev); r != CUDA_SUCCESS) return r;
    const Context& c = s.contexts.at(s.primary[static_cast<std::size_t>(dev)]);
    *flags = c.flags;
    *active = c.active ? 1 : 0;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
  return guarded([&](State& s) -> CUresult {
    if (const CUresult r = device_of(s, dev); r != CUDA_SUCCESS) return r;
    if (!valid_ctx_flags(flags)) return CUDA_ERROR_INVALID_VALUE;
    s.contexts.at(s.primary[static_cast<std::size_t>(dev)]).flags = flags;
    return CUDA_SUCCESS;
  });
}

// Context limits: remembered per process (the double has one device model),
// with the defaults a Hopper GPU reports.
namespace {
std::mutex g_limits_mu;
std::size_t g_limits[CU_LIMIT_MAX] = {};
bool g_limits_set = false;
void init_limits() {
  if (g_limits_set) return;
  g_limits[CU_LIMIT_STACK_SIZE] = 1024;
  g_limits[CU_LIMIT_PRINTF_FIFO_SIZE] = 1 << 20;
  g_limits[CU_LIMIT_MALLOC_HEAP_SIZE] = 8 << 20;
  g_limits[CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT] = 2048;
  g_limits[CU_LIMIT_MAX_L2_FETCH_GRANULARITY] = 64;
  g_limits[CU_LIMIT_PERSISTING_L2_CACHE_SIZE] = 0;
  g_limits_set = true;
}
}  // namespace

CUresult CUDAAPI cuCtxGetLimit(size_t* pvalue, CUlimit limit) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    if (pvalue == nullptr || limit < 0 || limit >= CU_LIMIT_MAX || limit == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH)
      return CUDA_ERROR_UNSUPPORTED_LIMIT;
    std::lock_guard lk(g_limits_mu);
    init_limits();
    *pvalue = g_limits[limit];
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    if (limit < 0 || limit >= CU_LIMIT_MAX || limit == CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH)
      return CUDA_ERROR_UNSUPPORTED_LIMIT;
    if (limit == CU_LIMIT_MALLOC_HEAP_SIZE && s.heap_used) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lk(g_limits_mu);
    init_limits();
    g_limits[limit] = value;
    return CUDA_SUCCESS;
  });
}
