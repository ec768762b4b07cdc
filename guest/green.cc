// Green contexts: a granted GPU's SMs partitioned (cuDeviceGetDevResource,
// cuDevSmResourceSplitByCount, cuDevResourceGenerateDesc), green contexts made
// on a partition, their streams and events. The host's driver answers
// (host-daemon/worker/green.cc); resources travel as the driver's images, which the
// worker takes back only as it gave them out. Kept here: each green context's
// converted context (cuCtxFromGreenCtx, answered locally) and the way back,
// which cuStreamGetGreenCtx and cuStreamGetCtx_v2 (guest/streams.cc) answer
// from. A green context's id is its handle, as a context's is (cuCtxGetId).
#include <cuda.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <span>
#include <vector>

#include "guest/export_tables.h"
#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"
#include "guest/family.h"

using ivcuda::guest::internal::green_of_ctx;

static_assert(sizeof(CUdevResource) == proto::kResourceBytes, "CUdevResource's ABI changed: see ivcuda/proto.h");

namespace {

constexpr std::size_t kImage = proto::kResourceBytes;

// A resource question (of a device, a context or a green context): one image back.
CUresult resource(Runtime* rt, const proto::ReqGreen& r, CUdevResource* out) {
  proto::RepGreen rep{};
  std::vector<std::byte> extra;
  const CUresult st = rt->call<Op::kGreen>(r, {}, &rep, &extra);
  if (st != CUDA_SUCCESS) return st;
  if (rep.count != 1 || extra.size() != kImage) return CUDA_ERROR_UNKNOWN;  // not what the worker sends
  std::memcpy(out, extra.data(), kImage);
  return CUDA_SUCCESS;
}

// The converted context of a green context this process made, or 0.
std::uint64_t converted(Runtime* rt, CUgreenCtx g) {
  std::lock_guard lk(rt->books_mu);
  const auto it = rt->green_ctx.find(h(g));
  return it == rt->green_ctx.end() ? 0 : it->second;
}

}  // namespace

CUresult cuDeviceGetDevResource(CUdevice dev, CUdevResource* res, CUdevResourceType type) {
  return guard([&] {
    NEED_RT();
    if (res == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int w = rt->to_worker(dev);
    if (w < 0) return CUDA_ERROR_INVALID_DEVICE;
    proto::ReqGreen r{};
    r.kind = proto::kGreenDeviceResource;
    r.device = w;
    r.type = static_cast<proto::u32>(type);
    return resource(rt, r, res);
  });
}

CUresult cuCtxGetDevResource(CUcontext c, CUdevResource* res, CUdevResourceType type) {
  return guard([&] {
    NEED_RT();
    if (res == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    proto::ReqGreen r{};
    r.kind = proto::kGreenCtxResource;
    r.ctx = h(c);
    r.type = static_cast<proto::u32>(type);
    return resource(rt, r, res);
  });
}

CUresult cuGreenCtxGetDevResource(CUgreenCtx g, CUdevResource* res, CUdevResourceType type) {
  return guard([&] {
    NEED_RT();
    if (res == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (converted(rt, g) == 0) return CUDA_ERROR_INVALID_CONTEXT;
    proto::ReqGreen r{};
    r.kind = proto::kGreenOwnResource;
    r.handle = h(g);
    r.type = static_cast<proto::u32>(type);
    return resource(rt, r, res);
  });
}

CUresult cuDevSmResourceSplitByCount(CUdevResource* result, unsigned int* nb, const CUdevResource* input,
                                     CUdevResource* remaining, unsigned int flags, unsigned int min_count) {
  return guard([&] {
    NEED_RT();
    if (nb == nullptr || input == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (result != nullptr && *nb == 0) return CUDA_ERROR_INVALID_VALUE;
    proto::ReqGreen r{};
    r.kind = proto::kGreenSplit;
    // No GPU has two SMs for each of more than kGreenMaxGroups groups (the
    // smallest group is 2 SMs): asking for more changes nothing.
    r.count = result == nullptr ? 0 : std::min(*nb, proto::kGreenMaxGroups);
    r.flags = flags;
    r.min_count = min_count;
    r.want_remaining = remaining != nullptr ? 1 : 0;
    proto::RepGreen rep{};
    std::vector<std::byte> extra;
    const CUresult st =
        rt->call<Op::kGreen>(r, std::as_bytes(std::span(input, 1)), &rep, &extra);
    if (st != CUDA_SUCCESS) return st;
    const std::size_t groups = result == nullptr ? 0 : rep.count;
    if (groups > r.count || rep.remaining > r.want_remaining || extra.size() != (groups + rep.remaining) * kImage)
      return CUDA_ERROR_UNKNOWN;  // not what the worker sends
    if (groups != 0) std::memcpy(result, extra.data(), groups * kImage);
    if (rep.remaining != 0) std::memcpy(remaining, extra.data() + groups * kImage, kImage);
    *nb = rep.count;
    return CUDA_SUCCESS;
  });
}

CUresult cuDevResourceGenerateDesc(CUdevResourceDesc* desc, CUdevResource* resources, unsigned int n) {
  return guard([&] {
    NEED_RT();
    if (desc == nullptr || resources == nullptr || n == 0 || n > proto::kGreenMaxGroups + 1)
      return CUDA_ERROR_INVALID_VALUE;
    proto::ReqGreen r{};
    r.kind = proto::kGreenDesc;
    r.count = n;
    proto::RepGreen rep{};
    const CUresult st = rt->call<Op::kGreen>(r, std::as_bytes(std::span(resources, n)), &rep);
    if (st != CUDA_SUCCESS) return st;
    *desc = reinterpret_cast<CUdevResourceDesc>(rep.handle);
    return CUDA_SUCCESS;
  });
}

CUresult cuGreenCtxCreate(CUgreenCtx* out, CUdevResourceDesc desc, CUdevice dev, unsigned int flags) {
  return guard([&] {
    NEED_RT();
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int w = rt->to_worker(dev);
    if (w < 0) return CUDA_ERROR_INVALID_DEVICE;
    proto::ReqGreen r{};
    r.kind = proto::kGreenCreate;
    r.handle = h(desc);
    r.device = w;
    r.flags = flags;
    proto::RepGreen rep{};
    const CUresult st = rt->call<Op::kGreen>(r, {}, &rep);
    if (st != CUDA_SUCCESS) return st;
    {
      std::lock_guard lk(rt->books_mu);
      rt->green_ctx[rep.handle] = rep.ctx;
      rt->ctx_green[rep.ctx] = rep.handle;
      rt->ctx_device[rep.ctx] = dev;
    }
    *out = reinterpret_cast<CUgreenCtx>(rep.handle);
    return CUDA_SUCCESS;
  });
}

CUresult cuGreenCtxDestroy(CUgreenCtx g) {
  return guard([&] {
    NEED_RT();
    const std::uint64_t c = converted(rt, g);
    if (c == 0) return CUDA_ERROR_INVALID_CONTEXT;
    // Context-local storage destructors run while the context still exists.
    ivcuda::guest::export_tables_context_gone(reinterpret_cast<CUcontext>(c));
    proto::ReqGreen r{};
    r.kind = proto::kGreenDestroy;
    r.handle = h(g);
    const CUresult st = rt->call<Op::kGreen>(r);
    if (st != CUDA_SUCCESS) return st;
    ctx_stack().remove_all(c);
    std::lock_guard lk(rt->books_mu);
    rt->green_ctx.erase(h(g));
    rt->ctx_green.erase(c);
    rt->ctx_device.erase(c);
    return CUDA_SUCCESS;
  });
}

CUresult cuCtxFromGreenCtx(CUcontext* pctx, CUgreenCtx g) {
  return guard([&] {
    NEED_RT();
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::uint64_t c = converted(rt, g);
    if (c == 0) return CUDA_ERROR_INVALID_CONTEXT;
    *pctx = reinterpret_cast<CUcontext>(c);
    return CUDA_SUCCESS;
  });
}

CUresult cuGreenCtxGetId(CUgreenCtx g, unsigned long long* id) {
  return guard([&] {
    NEED_RT();
    if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // No green context named: the current one's, as the driver answers.
    if (g == nullptr) g = reinterpret_cast<CUgreenCtx>(green_of_ctx(rt, current_ctx()));
    if (converted(rt, g) == 0) return CUDA_ERROR_INVALID_CONTEXT;
    *id = h(g);  // unique for the process's life: the worker never reuses a handle
    return CUDA_SUCCESS;
  });
}

CUresult cuGreenCtxStreamCreate(CUstream* ps, CUgreenCtx g, unsigned int flags, int priority) {
  return guard([&] {
    NEED_RT();
    if (ps == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const std::uint64_t c = converted(rt, g);
    if (c == 0) return CUDA_ERROR_INVALID_CONTEXT;
    proto::ReqGreen r{};
    r.kind = proto::kGreenStreamCreate;
    r.handle = h(g);
    r.flags = flags;
    r.priority = priority;
    proto::RepGreen rep{};
    const CUresult st = rt->call<Op::kGreen>(r, {}, &rep);
    if (st != CUDA_SUCCESS) return st;
    {
      std::lock_guard lk(rt->books_mu);
      rt->streams[rep.value] = c;
      rt->stream_flags[rep.value] = flags;
    }
    *ps = reinterpret_cast<CUstream>(rep.value);
    return CUDA_SUCCESS;
  });
}

namespace {
CUresult green_event(std::uint32_t kind, CUgreenCtx g, CUevent e) {
  return guard([&] {
    NEED_RT();
    if (converted(rt, g) == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (!known_event(rt, e)) return CUDA_ERROR_INVALID_HANDLE;
    proto::ReqGreen r{};
    r.kind = kind;
    r.handle = h(g);
    r.event = h(e);
    return rt->call<Op::kGreen>(r);
  });
}
}  // namespace

CUresult cuGreenCtxRecordEvent(CUgreenCtx g, CUevent e) { return green_event(proto::kGreenRecordEvent, g, e); }
CUresult cuGreenCtxWaitEvent(CUgreenCtx g, CUevent e) { return green_event(proto::kGreenWaitEvent, g, e); }

CUresult cuStreamGetGreenCtx(CUstream s, CUgreenCtx* pg) {
  return guard([&] {
    NEED_RT();
    if (pg == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::uint64_t c = 0;
    if (h(s) == 0 || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
      c = current_ctx();
      if (c == 0) return CUDA_ERROR_INVALID_CONTEXT;
      // A green context has no per-thread stream (the driver's answer, on the H200).
      if (s == CU_STREAM_PER_THREAD && green_of_ctx(rt, c) != 0) return CUDA_ERROR_INVALID_HANDLE;
    } else {
      std::lock_guard lk(rt->books_mu);
      const auto it = rt->streams.find(h(s));
      if (it == rt->streams.end()) return CUDA_ERROR_INVALID_HANDLE;
      c = it->second;
    }
    *pg = reinterpret_cast<CUgreenCtx>(green_of_ctx(rt, c));
    return CUDA_SUCCESS;
  });
}
