// Streams. The guest side is guest/streams.cc.
#include "host-daemon/worker_internal.h"

namespace ivcuda::host {

using namespace ivcuda::proto;
using namespace detail;

CUresult Worker::on_StreamCreate(Call& c) {
  const auto r = c.req<ReqStreamCreate>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
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
