// Events: created (with their flags), recorded (with flags, also during
// capture), queried, waited for, timed and destroyed on the host
// (host-daemon/worker/events.cc); the guest books which context each belongs to.
#include <cuda.h>

#include <mutex>

#include "guest/graphs.h"
#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"
#include "guest/family.h"

// ==================================================================== events

CUresult cuEventCreate(CUevent* pe, unsigned int flags) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    constexpr unsigned kKnown = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (pe == nullptr || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
    proto::RepHandle rep{};
    const CUresult st = rt->call<Op::kEventCreate>(proto::ReqEventCreate{ctx, flags, 0}, {}, &rep);
    if (st != CUDA_SUCCESS) return st;
    {
      std::lock_guard lk(rt->books_mu);
      rt->events[rep.handle] = ctx;
    }
    *pe = reinterpret_cast<CUevent>(rep.handle);
    return CUDA_SUCCESS;
  });
}

CUresult cuEventRecord(CUevent e, CUstream s) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (!known_event(rt, e) || !known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    return rt->post<Op::kEventRecord>(proto::ReqEventRecord{ctx, h(e), h(s)});
  });
}

CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags) {
  if (flags == CU_EVENT_RECORD_DEFAULT) return cuEventRecord(e, s);
  // Checked here, as the driver checks it at the call: a default record is
  // posted, so its errors would come late.
  if ((flags & ~static_cast<unsigned>(CU_EVENT_RECORD_EXTERNAL)) != 0) return CUDA_ERROR_INVALID_VALUE;
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (!known_event(rt, e) || !known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    // EXTERNAL is for a capturing stream only; the driver refuses it at once
    // elsewhere. No capture of ours runs: no stream can capture. Otherwise the
    // host answers (a stream can join another's capture through an event).
    if (!ivcuda::guest::any_capture()) return CUDA_ERROR_ILLEGAL_STATE;
    return rt->call<Op::kEventRecordFlags>(proto::ReqEventRecordFlags{ctx, h(e), h(s), flags, 0});
  });
}

CUresult cuEventQuery(CUevent e) {
  return guard([&] {
    NEED_RT();
    if (!known_event(rt, e)) return CUDA_ERROR_INVALID_HANDLE;
    return rt->call<Op::kEventQuery>(proto::ReqHandle{current_ctx(), h(e)});
  });
}

CUresult cuEventSynchronize(CUevent e) {
  return guard([&] {
    NEED_RT();
    if (!known_event(rt, e)) return CUDA_ERROR_INVALID_HANDLE;
    return rt->call<Op::kEventSynchronize>(proto::ReqHandle{current_ctx(), h(e)});
  });
}

CUresult cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
  return guard([&] {
    NEED_RT();
    if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!known_event(rt, a) || !known_event(rt, b)) return CUDA_ERROR_INVALID_HANDLE;
    proto::RepElapsed rep{};
    const CUresult st = rt->call<Op::kEventElapsedTime>(proto::ReqEventElapsed{current_ctx(), h(a), h(b)}, {}, &rep);
    if (st == CUDA_SUCCESS) *ms = rep.ms;
    return st;
  });
}

CUresult cuEventDestroy(CUevent e) {
  return guard([&] {
    NEED_RT();
    {
      std::lock_guard lk(rt->books_mu);
      if (rt->events.erase(h(e)) == 0) return CUDA_ERROR_INVALID_HANDLE;
    }
    return rt->call<Op::kEventDestroy>(proto::ReqHandle{current_ctx(), h(e)});
  });
}
