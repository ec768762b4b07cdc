// Streams. The guest side is guest/streams.cc.
#include "host-daemon/worker/worker_internal.h"

namespace ivcuda::host {

using namespace ivcuda::proto;
using namespace detail;

CUresult Worker::on_StreamCreate(Call& c) {
  const auto r = c.req<ReqStreamCreate>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  if (full(streams_, cfg_.limits.streams, "stream")) return CUDA_ERROR_OUT_OF_MEMORY;
  CUstream s = nullptr;
  const CUresult st = cu_.cuStreamCreateWithPriority(&s, r.flags, r.priority);
  if (st != CUDA_SUCCESS) return st;
  c.set_reply(RepHandle{streams_.insert(StreamEntry{s, r.ctx})});
  return CUDA_SUCCESS;
}

CUresult Worker::on_StreamDestroy(Call& c) {
  return destroy_in_ctx(streams_, c.req<ReqHandle>().handle, [&](StreamEntry& s) {
    captures_.erase(s.real);  // a capture ends with its stream
    return cu_.cuStreamDestroy(s.real);
  });
}

CUresult Worker::on_StreamQuery(Call& c) {
  const auto r = c.req<ReqHandle>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.handle, &s); st != CUDA_SUCCESS) return st;
  return cu_.cuStreamQuery(s);
}

CUresult Worker::on_StreamSynchronize(Call& c) {
  const auto r = c.req<ReqHandle>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.handle, &s); st != CUDA_SUCCESS) return st;
  if (streams_.find(r.handle) == nullptr) return cu_.cuStreamSynchronize(s);  // special streams
  // A capturing stream cannot be waited for: the driver's own answer (and
  // its invalidation of the capture) is the one CUDA gives.
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  if (cu_.cuStreamIsCapturing(s, &cs) == CUDA_SUCCESS && cs != CU_STREAM_CAPTURE_STATUS_NONE)
    return cu_.cuStreamSynchronize(s);
  const CUresult st = cu_.cuStreamQuery(s);
  // Done: the synchronise itself returns at once, and unlike a query it
  // makes the driver write out pending device printf output.
  if (st == CUDA_SUCCESS) return cu_.cuStreamSynchronize(s);
  if (st != CUDA_ERROR_NOT_READY) return st;
  // Not done: park the call so that this guest's other channels keep moving.
  return park(c, Op::kStreamSynchronize, r.handle);
}

CUresult Worker::on_StreamWaitEvent(Call& c) {
  const auto r = c.req<ReqStreamWaitEvent>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  EventEntry* e = events_.find(r.event);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return cu_.cuStreamWaitEvent(s, e->real, r.flags);
}

CUresult Worker::on_StreamGetPriority(Call& c) {
  const auto r = c.req<ReqHandle>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.handle, &s); st != CUDA_SUCCESS) return st;
  int p = 0;
  const CUresult st = cu_.cuStreamGetPriority(s, &p);
  c.set_reply(RepValue{p});
  return st;
}

}  // namespace ivcuda::host

namespace ivcuda::host {

using namespace ivcuda::proto;

namespace {
// Stream attributes whose values are plain numbers, and the access-policy
// window, whose range is checked. The event-bearing launch attributes are
// not stream attributes: the driver's answer for them is INVALID_VALUE.
bool stream_attr(std::uint32_t id) {
  switch (id) {
    case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
    case CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY:
    case CU_LAUNCH_ATTRIBUTE_PRIORITY:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
      return true;
    default:
      return false;
  }
}
}  // namespace

CUresult Worker::on_StreamAttr(Call& c) {
  const auto r = c.req<ReqStreamAttr>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  if (r.kind == kKernelAttrCopy) {
    CUstream src;
    if (CUresult st = resolve_stream(r.ctx, r.src, &src); st != CUDA_SUCCESS) return st;
    return cu_.cuStreamCopyAttributes(s, src);
  }
  if (!stream_attr(r.attr)) return CUDA_ERROR_INVALID_VALUE;
  CUstreamAttrValue v{};
  static_assert(sizeof v == sizeof r.value);
  CUstreamAttrID id;
  if (!wire_enum(r.attr, &id)) return CUDA_ERROR_INVALID_VALUE;
  if (r.kind == kKernelAttrSet) {
    std::memcpy(&v, r.value, sizeof v);
    // A window over memory that is not the guest's would steer the L2 for
    // someone else's data; an empty window clears it.
    if (IVCUDA_RULE("access-policy-window") && id == CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW &&
        v.accessPolicyWindow.num_bytes != 0 &&
        !owns_device(reinterpret_cast<std::uint64_t>(v.accessPolicyWindow.base_ptr), v.accessPolicyWindow.num_bytes))
      return CUDA_ERROR_INVALID_VALUE;
    return cu_.cuStreamSetAttribute(s, id, &v);
  }
  if (r.kind != kKernelAttrGet) return CUDA_ERROR_INVALID_VALUE;
  const CUresult st = cu_.cuStreamGetAttribute(s, id, &v);
  RepStreamAttr out{};
  std::memcpy(out.value, &v, sizeof out.value);
  c.set_reply(out);
  return st;
}

}  // namespace ivcuda::host
