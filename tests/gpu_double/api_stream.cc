// Streams and events of the GPU test double. Work runs synchronously in call order, so
// every stream is idle whenever the caller can observe it; the objects still exist, are
// validated, and events carry real timestamps.
#include <algorithm>

#include "state.h"

using namespace ivcuda::gpu_double;

namespace {

// The context a stream handle stands for: its own, or the current one for the defaults.
CUresult stream_context(State& s, CUstream h, Handle* ctx, const Stream** stream) {
  *stream = nullptr;
  if (h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
    return current_context(s, ctx);
  const auto it = s.streams.find(from_handle(h));
  if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  *ctx = it->second.ctx;
  *stream = &it->second;
  return CUDA_SUCCESS;
}

CUresult create_stream(CUstream* ph, unsigned flags, int priority) {
  return guarded([&](State& s) -> CUresult {
    if (ph == nullptr || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING)) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    const Handle h = s.new_handle();
    // Out-of-range priorities are clamped, as the driver documents.
    const int prio = std::clamp(priority, kGreatestStreamPriority, kLeastStreamPriority);
    s.streams[h] = Stream{.ctx = ctx, .flags = flags, .priority = prio, .id = s.next_stream_id++};
    *ph = to_handle<CUstream_st>(h);
    return CUDA_SUCCESS;
  });
}

CUresult elapsed(float* ms, CUevent start, CUevent end) {
  return guarded([&](State& s) -> CUresult {
    if (ms == nullptr) return CUDA_ERROR_INVALID_HANDLE;  // sic: the real driver's answer
    const auto a = s.events.find(from_handle(start));
    const auto b = s.events.find(from_handle(end));
    if (a == s.events.end() || b == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
    const Event& ea = a->second;
    const Event& eb = b->second;
    if (((ea.flags | eb.flags) & CU_EVENT_DISABLE_TIMING) != 0) return CUDA_ERROR_INVALID_HANDLE;
    if (!ea.recorded || !eb.recorded) return CUDA_ERROR_INVALID_HANDLE;
    if (const CUresult r = s.fault_of(ea.ctx); r != CUDA_SUCCESS) return r;
    *ms = std::chrono::duration<float, std::milli>(eb.when - ea.when).count();
    return CUDA_SUCCESS;
  });
}

}  // namespace

CUresult CUDAAPI cuStreamCreate(CUstream* phStream, unsigned int Flags) {
  return create_stream(phStream, Flags, 0);
}

CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* phStream, unsigned int flags, int priority) {
  return create_stream(phStream, flags, priority);
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream) {
  return guarded([&](State& s) -> CUresult {
    const auto it = s.streams.find(from_handle(hStream));
    if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    s.streams.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    const Stream* st = nullptr;
    if (const CUresult r = stream_context(s, hStream, &ctx, &st); r != CUDA_SUCCESS) return r;
    return s.fault_of(ctx);
  });
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) { return cuStreamQuery(hStream); }

CUresult CUDAAPI cuStreamGetPriority(CUstream hStream, int* priority) {
  return guarded([&](State& s) -> CUresult {
    if (priority == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    const Stream* st = nullptr;
    if (const CUresult r = stream_context(s, hStream, &ctx, &st); r != CUDA_SUCCESS) return r;
    *priority = st != nullptr ? st->priority : 0;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamGetFlags(CUstream hStream, unsigned int* flags) {
  return guarded([&](State& s) -> CUresult {
    if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    const Stream* st = nullptr;
    if (const CUresult r = stream_context(s, hStream, &ctx, &st); r != CUDA_SUCCESS) return r;
    *flags = st != nullptr ? st->flags : 0;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamGetId(CUstream hStream, unsigned long long* streamId) {
  return guarded([&](State& s) -> CUresult {
    if (streamId == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    const Stream* st = nullptr;
    if (const CUresult r = stream_context(s, hStream, &ctx, &st); r != CUDA_SUCCESS) return r;
    // The defaults get small fixed ids, as the driver does.
    *streamId = st != nullptr ? st->id : (hStream == CU_STREAM_PER_THREAD ? 2 : 1);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext* pctx) {
  return guarded([&](State& s) -> CUresult {
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    const Stream* st = nullptr;
    if (const CUresult r = stream_context(s, hStream, &ctx, &st); r != CUDA_SUCCESS) return r;
    *pctx = to_handle<CUctx_st>(ctx);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  return guarded([&](State& s) -> CUresult {
    if ((Flags & ~static_cast<unsigned>(CU_EVENT_WAIT_EXTERNAL)) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    const Stream* st = nullptr;
    if (const CUresult r = stream_context(s, hStream, &ctx, &st); r != CUDA_SUCCESS) return r;
    if (!s.events.contains(from_handle(hEvent))) return CUDA_ERROR_INVALID_HANDLE;
    // The event's work has already run: nothing to wait for.
    return s.fault_of(ctx);
  });
}

CUresult CUDAAPI cuEventCreate(CUevent* phEvent, unsigned int Flags) {
  return guarded([&](State& s) -> CUresult {
    constexpr unsigned kKnown =
        CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (phEvent == nullptr || (Flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
    if ((Flags & CU_EVENT_INTERPROCESS) != 0 && (Flags & CU_EVENT_DISABLE_TIMING) == 0)
      return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    const Handle h = s.new_handle();
    s.events[h] = Event{.ctx = ctx, .flags = Flags, .recorded = false, .when = {}};
    *phEvent = to_handle<CUevent_st>(h);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent) {
  return guarded([&](State& s) -> CUresult {
    return s.events.erase(from_handle(hEvent)) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
  });
}

CUresult CUDAAPI cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
  return guarded([&](State& s) -> CUresult {
    if ((flags & ~static_cast<unsigned>(CU_EVENT_RECORD_EXTERNAL)) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    const auto it = s.events.find(from_handle(hEvent));
    if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
    Handle ctx = 0;
    const Stream* st = nullptr;
    if (const CUresult r = stream_context(s, hStream, &ctx, &st); r != CUDA_SUCCESS) return r;
    if (ctx != it->second.ctx) return CUDA_ERROR_INVALID_HANDLE;
    if (const CUresult r = s.fault_of(ctx); r != CUDA_SUCCESS) return r;
    it->second.recorded = true;
    it->second.when = std::chrono::steady_clock::now();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream) {
  return cuEventRecordWithFlags(hEvent, hStream, CU_EVENT_RECORD_DEFAULT);
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent) {
  return guarded([&](State& s) -> CUresult {
    const auto it = s.events.find(from_handle(hEvent));
    if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
    return s.fault_of(it->second.ctx);
  });
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) { return cuEventQuery(hEvent); }

CUresult CUDAAPI cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return elapsed(pMilliseconds, hStart, hEnd);
}
