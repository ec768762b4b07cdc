// Streams: created, queried, synchronised and destroyed on the host
// (host-daemon/worker/streams.cc); their flags and contexts are also booked here so
// that cheap queries need no round trip.
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "guest/errors.h"
#include "guest/export_hooks.h"
#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"
#include "guest/family.h"

// =================================================================== streams

CUresult cuStreamCreateWithPriority(CUstream* ps, unsigned int flags, int priority) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (ps == nullptr || (flags & ~CU_STREAM_NON_BLOCKING) != 0) return CUDA_ERROR_INVALID_VALUE;
    proto::RepHandle rep{};
    const CUresult st = rt->call<Op::kStreamCreate>(proto::ReqStreamCreate{ctx, flags, priority}, {}, &rep);
    if (st != CUDA_SUCCESS) return st;
    {
      std::lock_guard lk(rt->books_mu);
      rt->streams[rep.handle] = ctx;
      rt->stream_flags[rep.handle] = flags;
    }
    *ps = reinterpret_cast<CUstream>(rep.handle);
    return CUDA_SUCCESS;
  });
}

CUresult cuStreamCreate(CUstream* ps, unsigned int flags) { return cuStreamCreateWithPriority(ps, flags, 0); }

// Flags and context are the guest's own books: no round trip.
CUresult cuStreamGetFlags(CUstream s, unsigned int* flags) {
  return guard([&] {
    NEED_RT();
    if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (h(s) == 0 || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
      if (current_ctx() == 0) return CUDA_ERROR_INVALID_CONTEXT;
      *flags = CU_STREAM_DEFAULT;
      return CUDA_SUCCESS;
    }
    std::lock_guard lk(rt->books_mu);
    const auto it = rt->stream_flags.find(h(s));
    if (it == rt->stream_flags.end()) return CUDA_ERROR_INVALID_HANDLE;
    *flags = it->second;
    return CUDA_SUCCESS;
  });
}

CUresult cuStreamGetCtx(CUstream s, CUcontext* pctx) {
  return guard([&] {
    NEED_RT();
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (h(s) == 0 || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
      NEED_CTX();
      // A green context has no per-thread stream (the driver's answer, on the H200).
      if (s == CU_STREAM_PER_THREAD && ivcuda::guest::internal::green_of_ctx(rt, ctx) != 0)
        return CUDA_ERROR_INVALID_HANDLE;
      *pctx = reinterpret_cast<CUcontext>(ctx);
      return CUDA_SUCCESS;
    }
    std::lock_guard lk(rt->books_mu);
    const auto it = rt->streams.find(h(s));
    if (it == rt->streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    *pctx = reinterpret_cast<CUcontext>(it->second);
    return CUDA_SUCCESS;
  });
}

// A green context's stream (or, for the special streams, a green context's
// converted context current) answers the green context and the device's
// primary context; any other, its context and no green context. Either
// output may be NULL, as the driver allows.
CUresult cuStreamGetCtx_v2(CUstream s, CUcontext* pctx, CUgreenCtx* pgreen) {
  return guard([&] {
    NEED_RT();
    // Asked for nothing: the driver refuses it (drv_green on the H100).
    if (pctx == nullptr && pgreen == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = nullptr;
    if (const CUresult st = cuStreamGetCtx(s, &c); st != CUDA_SUCCESS) return st;
    const std::uint64_t green = ivcuda::guest::internal::green_of_ctx(rt, h(c));
    if (green != 0) {
      CUdevice dev = 0;
      if (const CUresult st = cuCtxGetDevice_v2(&dev, c); st != CUDA_SUCCESS) return st;
      if (const CUresult st = ivcuda::guest::hooks::primary_context(dev, &c); st != CUDA_SUCCESS) return st;
    }
    if (pctx != nullptr) *pctx = c;
    if (pgreen != nullptr) *pgreen = reinterpret_cast<CUgreenCtx>(green);
    return CUDA_SUCCESS;
  });
}

// The stream's device: its context's.
CUresult cuStreamGetDevice(CUstream s, CUdevice* dev) {
  return guard([&] {
    if (dev == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = nullptr;
    if (const CUresult st = cuStreamGetCtx(s, &c); st != CUDA_SUCCESS) return st;
    return cuCtxGetDevice_v2(dev, c);
  });
}

namespace {
// cuStreamGetAttribute / SetAttribute / CopyAttributes: plain values, one
// synchronous request (the host checks an access-policy window's range).
CUresult stream_attr(std::uint32_t kind, CUstream s, CUstream src, CUstreamAttrID id, const CUstreamAttrValue* in,
                     CUstreamAttrValue* out) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (kind != proto::kKernelAttrCopy && in == nullptr && out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!known_stream(rt, s) || (kind == proto::kKernelAttrCopy && !known_stream(rt, src)))
      return CUDA_ERROR_INVALID_HANDLE;
    proto::ReqStreamAttr r{};
    r.ctx = ctx;
    r.stream = h(s);
    r.src = h(src);
    r.kind = kind;
    r.attr = static_cast<std::uint32_t>(id);
    static_assert(sizeof r.value == sizeof(CUstreamAttrValue));
    if (in != nullptr) std::memcpy(r.value, in, sizeof r.value);
    proto::RepStreamAttr rep{};
    const CUresult st = rt->call<Op::kStreamAttr>(r, {}, &rep);
    if (st == CUDA_SUCCESS && out != nullptr) std::memcpy(out, rep.value, sizeof rep.value);
    return st;
  });
}
}  // namespace

CUresult cuStreamGetAttribute(CUstream s, CUstreamAttrID id, CUstreamAttrValue* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return stream_attr(proto::kKernelAttrGet, s, nullptr, id, nullptr, out);
}
CUresult cuStreamSetAttribute(CUstream s, CUstreamAttrID id, const CUstreamAttrValue* in) {
  if (in == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return stream_attr(proto::kKernelAttrSet, s, nullptr, id, in, nullptr);
}
CUresult cuStreamCopyAttributes(CUstream dst, CUstream src) {
  return stream_attr(proto::kKernelAttrCopy, dst, src, CU_LAUNCH_ATTRIBUTE_IGNORE, nullptr, nullptr);
}

// cuda.h declares the per-thread variants only when a program asks for them.
extern "C" {
CUresult cuStreamGetDevice_ptsz(CUstream s, CUdevice* dev) {
  return cuStreamGetDevice(s == nullptr ? CU_STREAM_PER_THREAD : s, dev);
}
CUresult cuStreamGetAttribute_ptsz(CUstream s, CUstreamAttrID id, CUstreamAttrValue* out) {
  return cuStreamGetAttribute(s == nullptr ? CU_STREAM_PER_THREAD : s, id, out);
}
CUresult cuStreamSetAttribute_ptsz(CUstream s, CUstreamAttrID id, const CUstreamAttrValue* in) {
  return cuStreamSetAttribute(s == nullptr ? CU_STREAM_PER_THREAD : s, id, in);
}
CUresult cuStreamCopyAttributes_ptsz(CUstream dst, CUstream src) {
  return cuStreamCopyAttributes(dst == nullptr ? CU_STREAM_PER_THREAD : dst, src == nullptr ? CU_STREAM_PER_THREAD : src);
}
CUresult cuStreamGetFlags_ptsz(CUstream s, unsigned int* flags) {
  return cuStreamGetFlags(s == nullptr ? CU_STREAM_PER_THREAD : s, flags);
}
CUresult cuStreamGetCtx_ptsz(CUstream s, CUcontext* pctx) {
  return cuStreamGetCtx(s == nullptr ? CU_STREAM_PER_THREAD : s, pctx);
}
CUresult cuStreamGetCtx_v2_ptsz(CUstream s, CUcontext* pctx, CUgreenCtx* pgreen) {
  return cuStreamGetCtx_v2(s == nullptr ? CU_STREAM_PER_THREAD : s, pctx, pgreen);
}
}  // extern "C"

CUresult cuStreamDestroy(CUstream s) {
  return guard([&] {
    NEED_RT();
    {
      std::lock_guard lk(rt->books_mu);
      if (rt->streams.erase(h(s)) == 0) return CUDA_ERROR_INVALID_HANDLE;
      rt->stream_flags.erase(h(s));
    }
    return rt->call<Op::kStreamDestroy>(proto::ReqHandle{current_ctx(), h(s)});
  });
}

CUresult cuStreamQuery(CUstream s) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    return rt->call<Op::kStreamQuery>(proto::ReqHandle{ctx, h(s)});
  });
}

CUresult cuStreamSynchronize(CUstream s) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    return rt->call<Op::kStreamSynchronize>(proto::ReqHandle{ctx, h(s)});
  });
}

CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (!known_stream(rt, s) || !known_event(rt, e)) return CUDA_ERROR_INVALID_HANDLE;
    return rt->post<Op::kStreamWaitEvent>(proto::ReqStreamWaitEvent{ctx, h(s), h(e), flags, 0});
  });
}

CUresult cuStreamGetPriority(CUstream s, int* priority) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (priority == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    proto::RepValue rep{};
    const CUresult st = rt->call<Op::kStreamGetPriority>(proto::ReqHandle{ctx, h(s)}, {}, &rep);
    if (st == CUDA_SUCCESS) *priority = static_cast<int>(rep.value);
    return st;
  });
}
