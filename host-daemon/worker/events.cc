// Events: created, recorded (with flags), queried, waited for, timed and
// destroyed in their own context. The guest side is guest/events.cc.
#include "host-daemon/worker/worker_internal.h"

namespace ivcuda::host {

using namespace ivcuda::proto;
using namespace detail;

CUresult Worker::on_EventCreate(Call& c) {
  const auto r = c.req<ReqEventCreate>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  if (full(events_, cfg_.limits.events, "event")) return CUDA_ERROR_OUT_OF_MEMORY;
  CUevent e = nullptr;
  const CUresult st = cu_.cuEventCreate(&e, r.flags);
  if (st != CUDA_SUCCESS) return st;
  c.set_reply(RepHandle{events_.insert(EventEntry{e, r.ctx})});
  return CUDA_SUCCESS;
}

CUresult Worker::on_EventRecord(Call& c) {
  const auto r = c.req<ReqEventRecord>();
  return record_event(r.ctx, r.event, r.stream, CU_EVENT_RECORD_DEFAULT);
}

CUresult Worker::on_EventRecordFlags(Call& c) {
  const auto r = c.req<ReqEventRecordFlags>();
  return record_event(r.ctx, r.event, r.stream, r.flags);
}

CUresult Worker::record_event(std::uint64_t ctx, std::uint64_t event, std::uint64_t stream, unsigned flags) {
  if (CUresult st = use_ctx(ctx); st != CUDA_SUCCESS) return st;
  EventEntry* e = events_.find(event);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUstream s;
  if (CUresult st = resolve_stream(ctx, stream, &s); st != CUDA_SUCCESS) return st;
  // The flags are plain values; the driver judges them (EXTERNAL only while
  // the stream captures).
  return flags == CU_EVENT_RECORD_DEFAULT ? cu_.cuEventRecord(e->real, s) : cu_.cuEventRecordWithFlags(e->real, s, flags);
}

CUresult Worker::on_EventQuery(Call& c) {
  const auto r = c.req<ReqHandle>();
  EventEntry* e = events_.find(r.handle);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(e->ctx); st != CUDA_SUCCESS) return st;
  return cu_.cuEventQuery(e->real);
}

CUresult Worker::on_EventSynchronize(Call& c) {
  const auto r = c.req<ReqHandle>();
  EventEntry* e = events_.find(r.handle);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(e->ctx); st != CUDA_SUCCESS) return st;
  const CUresult st = cu_.cuEventQuery(e->real);
  if (st == CUDA_SUCCESS) return cu_.cuEventSynchronize(e->real);  // flushes device printf, as above
  if (st != CUDA_ERROR_NOT_READY) return st;
  return park(c, Op::kEventSynchronize, r.handle);
}

CUresult Worker::on_EventElapsedTime(Call& c) {
  const auto r = c.req<ReqEventElapsed>();
  EventEntry* a = events_.find(r.start);
  EventEntry* b = events_.find(r.end);
  if (a == nullptr || b == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(a->ctx); st != CUDA_SUCCESS) return st;
  float ms = 0;
  const CUresult st = cu_.cuEventElapsedTime(&ms, a->real, b->real);
  c.set_reply(RepElapsed{ms, 0});
  return st;
}

CUresult Worker::on_EventDestroy(Call& c) {
  const std::uint64_t h = c.req<ReqHandle>().handle;
  return destroy_in_ctx(events_, h, [&](EventEntry& e) {
    return ipc_on_event_destroy(h, e.real) ? cu_.cuEventDestroy(e.real) : CUDA_SUCCESS;
  });
}

}  // namespace ivcuda::host
