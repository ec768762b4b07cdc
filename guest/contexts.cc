// Initialisation, devices and contexts: what cuInit, cuDevice* and cuCtx*
// answer. Device facts come from the host once per device and are answered
// here; contexts are the host's (host-daemon/worker/contexts.cc), with the
// per-thread context stack kept in this process.
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "guest/errors.h"
#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"
#include "guest/export_tables.h"
#include "guest/family.h"

// ====================================================================== init

CUresult cuInit(unsigned int flags) {
  return guard([&] {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult st;
    Runtime::get(&st);
    return st;
  });
}

CUresult cuDriverGetVersion(int* v) {
  return guard([&] {
    if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // The version of the API this library implements, the same before and
    // after cuInit: cudart hashes it into its integrity check. The host's
    // own driver version is in the daemon's log.
    *v = CUDA_VERSION;
    return CUDA_SUCCESS;
  });
}

CUresult cuGetErrorName(CUresult error, const char** s) {
  if (s == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *s = ivcuda::guest::error_name(error);
  return *s != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char** s) {
  if (s == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *s = ivcuda::guest::error_string(error);
  return *s != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// ==================================================================== device

CUresult cuDeviceGetCount(int* count) {
  return guard([&] {
    NEED_RT();
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *count = rt->device_count();
    return CUDA_SUCCESS;
  });
}

CUresult cuDeviceGet(CUdevice* dev, int ordinal) {
  return guard([&] {
    NEED_RT();
    if (dev == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= rt->device_count()) return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
  });
}

#define DEVICE_INFO(dev)                                   \
  NEED_RT();                                               \
  CUresult st_dev_;                                        \
  const proto::RepDeviceInfo* info = rt->device(dev, &st_dev_); \
  if (info == nullptr) return st_dev_

CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  return guard([&] {
    if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    DEVICE_INFO(dev);
    const size_t n = strnlen(info->name, sizeof info->name);
    const size_t k = std::min(n, static_cast<size_t>(len) - 1);
    std::memcpy(name, info->name, k);
    name[k] = '\0';
    return CUDA_SUCCESS;
  });
}

CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  return guard([&] {
    if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
    DEVICE_INFO(dev);
    std::memcpy(uuid->bytes, info->uuid, sizeof uuid->bytes);
    return CUDA_SUCCESS;
  });
}

CUresult cuDeviceTotalMem(size_t* bytes, CUdevice dev) {
  return guard([&] {
    if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    DEVICE_INFO(dev);
    *bytes = info->total_mem;
    return CUDA_SUCCESS;
  });
}

CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice dev) {
  return guard([&] {
    if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
    DEVICE_INFO(dev);
    const int i = static_cast<int>(a);
    if (i <= 0 || i >= static_cast<int>(proto::kAttrSlots) || info->attr_valid[i] == 0)
      return CUDA_ERROR_INVALID_VALUE;
    *v = info->attrs[i];
    return CUDA_SUCCESS;
  });
}

// The widest 1D texture over linear memory of a format and channel count: the
// host's driver knows it for its GPU.
CUresult cuDeviceGetTexture1DLinearMaxWidth(size_t* width, CUarray_format format, unsigned channels, CUdevice dev) {
  return guard([&] {
    if (width == nullptr) return CUDA_ERROR_INVALID_VALUE;
    DEVICE_INFO(dev);
    (void)info;
    proto::RepValue rep{};
    const proto::ReqTexWidth r{rt->to_worker(dev), static_cast<proto::u32>(ivcuda::guest::internal::raw_enum(format)),
                               channels, 0};
    const CUresult st = rt->call<Op::kTexture1DLinearMaxWidth>(r, {}, &rep);
    if (st == CUDA_SUCCESS) *width = static_cast<size_t>(rep.value);
    return st;
  });
}

CUresult cuDeviceComputeCapability(int* major, int* minor, CUdevice dev) {
  return guard([&] {
    if (major == nullptr || minor == nullptr) return CUDA_ERROR_INVALID_VALUE;
    DEVICE_INFO(dev);
    *major = info->attrs[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR];
    *minor = info->attrs[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR];
    return CUDA_SUCCESS;
  });
}

CUresult cuDeviceGetPCIBusId(char* id, int len, CUdevice dev) {
  return guard([&] {
    if (id == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    DEVICE_INFO(dev);
    std::snprintf(id, static_cast<size_t>(len), "%04x:%02x:%02x.0",
                  static_cast<unsigned>(info->attrs[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID]),
                  static_cast<unsigned>(info->attrs[CU_DEVICE_ATTRIBUTE_PCI_BUS_ID]),
                  static_cast<unsigned>(info->attrs[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID]));
    return CUDA_SUCCESS;
  });
}

// The inverse: "[domain:]bus:device[.function]" in hexadecimal, matched
// against the devices this process sees (NCCL and NVML-aware code map bus
// ids back to ordinals this way).
CUresult cuDeviceGetByPCIBusId(CUdevice* dev, const char* id) {
  return guard([&] {
    if (dev == nullptr || id == nullptr) return CUDA_ERROR_INVALID_VALUE;
    unsigned part[3] = {0, 0, 0};
    int parts = 0;
    const char* p = id;
    while (parts < 3) {
      char* end = nullptr;
      const unsigned long v = std::strtoul(p, &end, 16);
      if (end == p || v > 0xffff) return CUDA_ERROR_INVALID_VALUE;
      part[parts++] = static_cast<unsigned>(v);
      if (*end != ':') {
        p = end;
        break;
      }
      p = end + 1;
    }
    if (*p == '.') {  // the function: GPUs are function 0
      char* end = nullptr;
      const unsigned long fn = std::strtoul(p + 1, &end, 16);
      if (end == p + 1 || fn != 0) return CUDA_ERROR_INVALID_DEVICE;
      p = end;
    }
    if (*p != '\0' || parts < 2) return CUDA_ERROR_INVALID_VALUE;
    const unsigned domain = parts == 3 ? part[0] : 0;
    const unsigned bus = part[parts - 2], device = part[parts - 1];
    NEED_RT();
    for (int d = 0; d < rt->device_count(); ++d) {
      CUresult st = CUDA_SUCCESS;
      const proto::RepDeviceInfo* info = rt->device(d, &st);
      if (info == nullptr) return st;
      if (static_cast<unsigned>(info->attrs[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID]) == domain &&
          static_cast<unsigned>(info->attrs[CU_DEVICE_ATTRIBUTE_PCI_BUS_ID]) == bus &&
          static_cast<unsigned>(info->attrs[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID]) == device) {
        *dev = d;
        return CUDA_SUCCESS;
      }
    }
    return CUDA_ERROR_INVALID_DEVICE;
  });
}

// The deprecated property block, from the attributes.
CUresult cuDeviceGetProperties(CUdevprop* prop, CUdevice dev) {
  return guard([&] {
    if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    DEVICE_INFO(dev);
    const auto a = [&](CUdevice_attribute x) { return info->attrs[x]; };
    *prop = CUdevprop{};
    prop->maxThreadsPerBlock = a(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    prop->maxThreadsDim[0] = a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X);
    prop->maxThreadsDim[1] = a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y);
    prop->maxThreadsDim[2] = a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z);
    prop->maxGridSize[0] = a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
    prop->maxGridSize[1] = a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y);
    prop->maxGridSize[2] = a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z);
    prop->sharedMemPerBlock = a(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
    prop->totalConstantMemory = a(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY);
    prop->SIMDWidth = a(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
    prop->memPitch = a(CU_DEVICE_ATTRIBUTE_MAX_PITCH);
    prop->regsPerBlock = a(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
    prop->clockRate = a(CU_DEVICE_ATTRIBUTE_CLOCK_RATE);
    prop->textureAlign = a(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT);
    return CUDA_SUCCESS;
  });
}

// =========================================================== primary context

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  return guard([&] {
    NEED_RT();
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::RepHandle rep{};
    const CUresult st = rt->call<Op::kPrimaryRetain>(proto::ReqDevice{rt->to_worker(dev), 0}, {}, &rep);
    if (st != CUDA_SUCCESS) return st;
    {
      std::lock_guard lk(rt->books_mu);
      rt->ctx_device[rep.handle] = dev;
      ++rt->primary_refs[dev];
    }
    *pctx = reinterpret_cast<CUcontext>(rep.handle);
    return CUDA_SUCCESS;
  });
}

namespace {
// The primary context of a device as the application numbers it.
CUcontext primary_of(Runtime* rt, CUdevice dev) {
  CUresult st;
  const auto* info = rt->device(dev, &st);
  return info == nullptr ? nullptr : reinterpret_cast<CUcontext>(info->primary_ctx);
}
}  // namespace

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  return guard([&] {
    NEED_RT();
    bool last = false;
    {
      std::lock_guard lk(rt->books_mu);
      auto it = rt->primary_refs.find(dev);
      if (it != rt->primary_refs.end() && it->second > 0) last = --it->second == 0;
    }
    if (last) ivcuda::guest::export_tables_context_gone(primary_of(rt, dev));
    return rt->call<Op::kPrimaryRelease>(proto::ReqDevice{rt->to_worker(dev), 0});
  });
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  return guard([&] {
    NEED_RT();
    if (CUcontext c = primary_of(rt, dev); c != nullptr) ivcuda::guest::export_tables_context_gone(c);
    return rt->call<Op::kPrimaryReset>(proto::ReqDevice{rt->to_worker(dev), 0});
  });
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  return guard([&] {
    NEED_RT();
    if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // The state is this process's own: active while it holds a retain (the
    // host's answer too), the flags it set. Only the first question per
    // device crosses (the flags the context started with); PyTorch asks
    // before many of its calls.
    {
      std::lock_guard lk(rt->books_mu);
      if (const auto f = rt->primary_flags.find(dev); f != rt->primary_flags.end()) {
        const auto r = rt->primary_refs.find(dev);
        *flags = f->second;
        *active = r != rt->primary_refs.end() && r->second > 0 ? 1 : 0;
        return CUDA_SUCCESS;
      }
    }
    proto::RepPrimaryState rep{};
    const CUresult st = rt->call<Op::kPrimaryGetState>(proto::ReqDevice{rt->to_worker(dev), 0}, {}, &rep);
    if (st == CUDA_SUCCESS) {
      *flags = rep.flags;
      *active = rep.active;
      std::lock_guard lk(rt->books_mu);
      rt->primary_flags.try_emplace(dev, rep.flags);
    }
    return st;
  });
}

CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  return guard([&] {
    NEED_RT();
    const CUresult st = rt->call<Op::kPrimarySetFlags>(proto::ReqDeviceFlags{rt->to_worker(dev), flags});
    if (st == CUDA_SUCCESS) {
      std::lock_guard lk(rt->books_mu);
      rt->primary_flags[dev] = flags;  // what the host keeps (host-daemon/worker/contexts.cc)
    }
    return st;
  });
}

// ================================================================== contexts

CUresult cuCtxCreate(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags, CUdevice dev) {
  return guard([&] {
    NEED_RT();
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (params != nullptr && (params->execAffinityParams != nullptr || params->cigParams != nullptr)) {
      return ivcuda::guest::not_supported("cuCtxCreate: execution-affinity and CIG parameters are not supported");
    }
    proto::RepHandle rep{};
    const CUresult st = rt->call<Op::kCtxCreate>(proto::ReqDeviceFlags{rt->to_worker(dev), flags}, {}, &rep);
    if (st != CUDA_SUCCESS) return st;
    {
      std::lock_guard lk(rt->books_mu);
      rt->ctx_device[rep.handle] = dev;
    }
    *pctx = reinterpret_cast<CUcontext>(rep.handle);
    // A new context is current, as in CUDA.
    return ctx_stack().push(rep.handle) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  });
}

CUresult cuCtxDestroy(CUcontext ctx) {
  return guard([&] {
    NEED_RT();
    if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    {
      std::lock_guard lk(rt->books_mu);
      if (rt->ctx_device.count(h(ctx)) == 0) return CUDA_ERROR_INVALID_CONTEXT;
    }
    // Context-local storage destructors run while the context still exists.
    ivcuda::guest::export_tables_context_gone(ctx);
    const CUresult st = rt->call<Op::kCtxDestroy>(proto::ReqHandle{0, h(ctx)});
    if (st != CUDA_SUCCESS) return st;
    ctx_stack().remove_all(h(ctx));
    std::lock_guard lk(rt->books_mu);
    rt->ctx_device.erase(h(ctx));
    return CUDA_SUCCESS;
  });
}

namespace {
bool known_ctx(Runtime* rt, std::uint64_t c) {
  std::lock_guard lk(rt->books_mu);
  return rt->ctx_device.count(c) != 0;
}
}  // namespace

CUresult cuCtxPushCurrent(CUcontext ctx) {
  return guard([&] {
    NEED_RT();
    if (ctx == nullptr || !known_ctx(rt, h(ctx))) return CUDA_ERROR_INVALID_CONTEXT;
    return ctx_stack().push(h(ctx)) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
  });
}

CUresult cuCtxPopCurrent(CUcontext* pctx) {
  return guard([&] {
    NEED_RT();
    auto& s = ctx_stack();
    if (s.empty()) return CUDA_ERROR_INVALID_CONTEXT;
    const std::uint64_t top = s.pop();
    if (pctx != nullptr) *pctx = reinterpret_cast<CUcontext>(top);
    return CUDA_SUCCESS;
  });
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  return guard([&] {
    NEED_RT();
    auto& s = ctx_stack();
    if (ctx == nullptr) {
      (void)s.pop();
      return CUDA_SUCCESS;
    }
    // The handle of a primary context is valid before it is retained (cudart
    // sets it current first); the host checks activation when it is used.
    if (!known_ctx(rt, h(ctx))) return CUDA_ERROR_INVALID_CONTEXT;
    s.set_top(h(ctx));
    return CUDA_SUCCESS;
  });
}

CUresult cuCtxGetCurrent(CUcontext* pctx) {
  return guard([&] {
    NEED_RT();
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *pctx = reinterpret_cast<CUcontext>(current_ctx());
    return CUDA_SUCCESS;
  });
}

namespace {
CUresult ctx_device_of(Runtime* rt, std::uint64_t ctx, CUdevice* dev) {
  std::lock_guard lk(rt->books_mu);
  auto it = rt->ctx_device.find(ctx);
  if (it == rt->ctx_device.end()) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = it->second;
  return CUDA_SUCCESS;
}
}  // namespace

CUresult cuCtxGetDevice(CUdevice* dev) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (dev == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return ctx_device_of(rt, ctx, dev);
  });
}

CUresult cuCtxGetDevice_v2(CUdevice* dev, CUcontext c) {
  return guard([&] {
    NEED_RT();
    if (dev == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::uint64_t ctx = c != nullptr ? h(c) : current_ctx();
    if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
    return ctx_device_of(rt, ctx, dev);
  });
}

CUresult cuCtxSynchronize() {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    return rt->call<Op::kCtxSynchronize>(proto::ReqCtx{ctx});
  });
}

CUresult cuCtxSynchronize_v2(CUcontext c) {
  return guard([&] {
    NEED_RT();
    const std::uint64_t ctx = c != nullptr ? h(c) : current_ctx();
    if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
    return rt->call<Op::kCtxSynchronize>(proto::ReqCtx{ctx});
  });
}

CUresult cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  return guard([&] {
    NEED_RT();
    if (least != nullptr) *least = rt->hello().stream_priority_lo;
    if (greatest != nullptr) *greatest = rt->hello().stream_priority_hi;
    return CUDA_SUCCESS;
  });
}

CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int* version) {
  return guard([&] {
    NEED_RT();
    if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::uint64_t c = ctx != nullptr ? h(ctx) : current_ctx();
    if (c == 0 || !known_ctx(rt, c)) return CUDA_ERROR_INVALID_CONTEXT;
    *version = 12010;  // the context API version CUDA 12/13 drivers report
    return CUDA_SUCCESS;
  });
}

// ==================================================== flags, configuration, whole-context events

namespace {
CUresult ctx_misc(std::uint64_t ctx, std::uint32_t kind, std::uint32_t value, std::uint64_t event,
                  std::int64_t* out) {
  return guard([&] {
    NEED_RT();
    if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
    proto::RepValue rep{};
    const CUresult st = rt->call<Op::kCtxMisc>(proto::ReqCtxMisc{ctx, event, kind, value}, {}, &rep);
    if (st == CUDA_SUCCESS && out != nullptr) *out = rep.value;
    return st;
  });
}
}  // namespace

CUresult cuCtxGetFlags(unsigned int* flags) {
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::int64_t v = 0;
  const CUresult st = ctx_misc(current_ctx(), proto::kCtxGetFlags, 0, 0, &v);
  if (st == CUDA_SUCCESS) *flags = static_cast<unsigned>(v);
  return st;
}
CUresult cuCtxSetFlags(unsigned int flags) { return ctx_misc(current_ctx(), proto::kCtxSetFlags, flags, 0, nullptr); }
CUresult cuCtxGetCacheConfig(CUfunc_cache* config) {
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::int64_t v = 0;
  const CUresult st = ctx_misc(current_ctx(), proto::kCtxGetCacheConfig, 0, 0, &v);
  if (st == CUDA_SUCCESS) *config = static_cast<CUfunc_cache>(v);
  return st;
}
CUresult cuCtxSetCacheConfig(CUfunc_cache config) {
  return ctx_misc(current_ctx(), proto::kCtxSetCacheConfig, static_cast<std::uint32_t>(config), 0, nullptr);
}
CUresult cuCtxResetPersistingL2Cache() {
  return ctx_misc(current_ctx(), proto::kCtxResetPersistingL2, 0, 0, nullptr);
}
CUresult cuCtxRecordEvent(CUcontext c, CUevent e) {
  return ctx_misc(h(c), proto::kCtxRecordEvent, 0, h(e), nullptr);
}
CUresult cuCtxWaitEvent(CUcontext c, CUevent e) {
  return ctx_misc(h(c), proto::kCtxWaitEvent, 0, h(e), nullptr);
}
