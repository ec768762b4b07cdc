// Streams and events of the GPU test double. Work runs synchronously in call order, so
// every stream is idle whenever the caller can observe it; the objects still exist, are
// validated, and events carry real timestamps.
#include <algorithm>
#include <chrono>
#include <thread>

#include "state.h"
#include "strays.h"

using namespace ivcuda::gpu_double;

namespace {

// The context a stream handle stands for: its own, or the current one for the defaults.
CUresult stream_context(State& s, CUstream h, Handle* ctx, const Stream** stream) {
  *stream = nullptr;
  if (h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
    return current_context(s, ctx);
  const auto it = s.streams.find(from_handle(h));
  if (it == s.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (orphaned(it->second)) return CUDA_ERROR_CONTEXT_IS_DESTROYED;  // its green context is gone
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
    // Made while a green context's converted context is current, it is that green context's.
    s.streams[h] = Stream{
        .ctx = ctx, .flags = flags, .priority = prio, .id = s.next_stream_id++, .attrs = {}, .green = current_green(s)};
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
    // Waiting for a capturing stream is illegal and ends the capture, as on the driver.
    if (const auto c = s.captures.find(from_handle(hStream)); c != s.captures.end()) {
      c->second.invalidated = true;
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (const CUresult r = s.fault_of(ctx); r != CUDA_SUCCESS) return r;
    return std::chrono::steady_clock::now() < busy_end(s, ctx, hStream) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream) {
  // Outside the state lock: other threads go on while this one waits (IVCUDA_GPU_DOUBLE_KERNEL_US);
  // one call all along for a checkpoint's lock.
  const ApiGate gate;
  if (gate.refused()) return CUDA_ERROR_OPERATING_SYSTEM;
  for (;;) {
    const CUresult r = cuStreamQuery(hStream);
    if (r != CUDA_ERROR_NOT_READY) return r;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

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

namespace {
bool stream_attr(CUstreamAttrID id) {
  return id == CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW || id == CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY ||
         id == CU_LAUNCH_ATTRIBUTE_PRIORITY || id == CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP ||
         id == CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN;
}
// The stream's record, or the one the null streams share.
CUresult attr_stream(State& s, CUstream h, Stream** out) {
  Handle ctx = 0;
  const Stream* st = nullptr;
  if (const CUresult r = stream_context(s, h, &ctx, &st); r != CUDA_SUCCESS) return r;
  *out = st != nullptr ? const_cast<Stream*>(st) : &s.null_stream;
  return CUDA_SUCCESS;
}
}  // namespace

// Stream attributes are kept as set; unset ones read as the driver's
// defaults (automatic synchronization, domain map {0, 1}, the priority the
// stream was made with).
CUresult CUDAAPI cuStreamGetAttribute(CUstream hStream, CUstreamAttrID id, CUstreamAttrValue* value) {
  return guarded([&](State& s) -> CUresult {
    if (value == nullptr || !stream_attr(id)) return CUDA_ERROR_INVALID_VALUE;
    Stream* st = nullptr;
    if (const CUresult r = attr_stream(s, hStream, &st); r != CUDA_SUCCESS) return r;
    *value = CUstreamAttrValue{};
    if (const auto it = st->attrs.find(id); it != st->attrs.end()) {
      *value = it->second;
    } else if (id == CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY) {
      value->syncPolicy = CU_SYNC_POLICY_AUTO;
    } else if (id == CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP) {
      value->memSyncDomainMap.remote = 1;
    }
    if (id == CU_LAUNCH_ATTRIBUTE_PRIORITY) value->priority = st->priority;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamSetAttribute(CUstream hStream, CUstreamAttrID id, const CUstreamAttrValue* value) {
  return guarded([&](State& s) -> CUresult {
    if (value == nullptr || !stream_attr(id)) return CUDA_ERROR_INVALID_VALUE;
    Stream* st = nullptr;
    if (const CUresult r = attr_stream(s, hStream, &st); r != CUDA_SUCCESS) return r;
    if (id == CU_LAUNCH_ATTRIBUTE_PRIORITY) st->priority = value->priority;
    // The driver takes any window (it only steers the L2), and so does the
    // double; one outside its allocations is still a stray (strays.h).
    if (const auto& w = value->accessPolicyWindow; id == CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW && w.num_bytes != 0)
      if (const auto base = reinterpret_cast<std::uintptr_t>(w.base_ptr); s.find(base, w.num_bytes) == nullptr)
        note_stray(base, w.num_bytes, __FILE__, __LINE__);
    st->attrs[id] = *value;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamCopyAttributes(CUstream dst, CUstream src) {
  return guarded([&](State& s) -> CUresult {
    Stream* d = nullptr;
    Stream* from = nullptr;
    if (const CUresult r = attr_stream(s, dst, &d); r != CUDA_SUCCESS) return r;
    if (const CUresult r = attr_stream(s, src, &from); r != CUDA_SUCCESS) return r;
    d->attrs = from->attrs;
    d->priority = from->priority;
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

// A green context's stream answers its converted context.
CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext* pctx) {
  return guarded([&](State& s) -> CUresult {
    if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    Handle green = 0;
    if (const CUresult r = stream_owner(s, hStream, &ctx, &green); r != CUDA_SUCCESS) return r;
    *pctx = to_handle<CUctx_st>(ctx);
    return CUDA_SUCCESS;
  });
}

// CUDA 12.5's form: a green context's stream (or a special stream while its converted context
// is current) answers the green context and the device's primary context, others their context
// and NULL. CU_STREAM_PER_THREAD under a converted context is INVALID_HANDLE, as cuda.h says.
// Either output may be NULL (the H200's driver, 580, takes that too).
CUresult CUDAAPI cuStreamGetCtx_v2(CUstream hStream, CUcontext* pCtx, CUgreenCtx* pGreenCtx) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    Handle green = 0;
    if (const CUresult r = stream_owner(s, hStream, &ctx, &green); r != CUDA_SUCCESS) return r;
    if (green != 0) {
      if (hStream == CU_STREAM_PER_THREAD) return CUDA_ERROR_INVALID_HANDLE;
      ctx = s.primary[static_cast<std::size_t>(s.greens.at(green).device)];
    }
    if (pCtx != nullptr) *pCtx = to_handle<CUctx_st>(ctx);
    if (pGreenCtx != nullptr) *pGreenCtx = to_handle<CUgreenCtx_st>(green);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
  if (CUresult r = CUDA_SUCCESS; capture_call(hStream, [=] { return cuStreamWaitEvent(hStream, hEvent, Flags); }, &r))
    return r;
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
  if (CUresult r = CUDA_SUCCESS;
      capture_call(hStream, [=] {
        // The node records the event when the graph runs (EXTERNAL or not).
        return cuEventRecordWithFlags(hEvent, hStream, CU_EVENT_RECORD_DEFAULT);
      }, &r))
    return r;
  return guarded([&](State& s) -> CUresult {
    if ((flags & ~static_cast<unsigned>(CU_EVENT_RECORD_EXTERNAL)) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    // EXTERNAL makes a node of a capture; on a stream that does not capture
    // the driver answers ILLEGAL_STATE (a capturing stream never gets here).
    if ((flags & CU_EVENT_RECORD_EXTERNAL) != 0) return CUDA_ERROR_ILLEGAL_STATE;
    const auto it = s.events.find(from_handle(hEvent));
    if (it == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
    Handle ctx = 0;
    const Stream* st = nullptr;
    if (const CUresult r = stream_context(s, hStream, &ctx, &st); r != CUDA_SUCCESS) return r;
    if (ctx != it->second.ctx) return CUDA_ERROR_INVALID_HANDLE;
    if (const CUresult r = s.fault_of(ctx); r != CUDA_SUCCESS) return r;
    it->second.recorded = true;
    // Behind a kernel still "running" (IVCUDA_GPU_DOUBLE_KERNEL_US), the event completes when it ends.
    it->second.when = std::max(std::chrono::steady_clock::now(), busy_end(s, ctx, hStream));
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
    if (const CUresult r = s.fault_of(it->second.ctx); r != CUDA_SUCCESS) return r;
    const auto ready = it->second.when + event_delay();
    return it->second.recorded && std::chrono::steady_clock::now() < ready ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent) {
  // Outside the state lock: other threads go on while this one waits.
  const ApiGate gate;
  if (gate.refused()) return CUDA_ERROR_OPERATING_SYSTEM;
  for (;;) {
    const CUresult r = cuEventQuery(hEvent);
    if (r != CUDA_ERROR_NOT_READY) return r;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

CUresult CUDAAPI cuEventElapsedTime_v2(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return elapsed(pMilliseconds, hStart, hEnd);
}

// ---- stream capture (graphs: api_graph.cc) ---------------------------------------------------------------

namespace {

// A capture needs a stream of its own: the legacy default stream synchronises with every
// other and cannot be captured.
CUresult capturable(State& s, CUstream h, Handle* ctx) {
  if (h == nullptr || h == CU_STREAM_LEGACY) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  const Stream* st = nullptr;
  return stream_context(s, h, ctx, &st);
}

CUresult begin_capture(CUstream h, CUstreamCaptureMode mode) {
  return guarded([&](State& s) -> CUresult {
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
      return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    if (const CUresult r = capturable(s, h, &ctx); r != CUDA_SUCCESS) return r;
    if (s.captures.contains(from_handle(h))) return CUDA_ERROR_ILLEGAL_STATE;
    const Handle g = s.new_handle();
    s.graphs[g] = Graph{.ctx = ctx, .nodes = {}, .owner_node = 0, .user_refs = {}};
    s.captures[from_handle(h)] = Capture{.graph = g,
                                         .mode = mode,
                                         .invalidated = false,
                                         .id = s.next_capture_id++,
                                         .owner = std::this_thread::get_id(),
                                         .deps = {},
                                         .deps_out = {},
                                         .data_out = {},
                                         .own_graph = true};
    return CUDA_SUCCESS;
  });
}

}  // namespace

CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  return begin_capture(hStream, mode);
}

CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream) {
  return begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph, const CUgraphNode* deps,
                                             const CUgraphEdgeData* data, size_t n, CUstreamCaptureMode mode) {
  return guarded([&](State& s) -> CUresult {
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
      return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    if (const CUresult r = capturable(s, hStream, &ctx); r != CUDA_SUCCESS) return r;
    if (s.captures.contains(from_handle(hStream))) return CUDA_ERROR_ILLEGAL_STATE;
    const auto g = s.graphs.find(from_handle(hGraph));
    if (g == s.graphs.end() || (n != 0 && deps == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    std::vector<Handle> start;
    for (size_t i = 0; i < n; ++i) {
      const auto d = s.graph_nodes.find(from_handle(deps[i]));
      if (d == s.graph_nodes.end() || d->second.graph != from_handle(hGraph)) return CUDA_ERROR_INVALID_VALUE;
      if (data != nullptr && data[i].type != 0) return CUDA_ERROR_NOT_SUPPORTED;  // programmatic edges
      start.push_back(from_handle(deps[i]));
    }
    s.captures[from_handle(hStream)] = Capture{.graph = from_handle(hGraph),
                                               .mode = mode,
                                               .invalidated = false,
                                               .id = s.next_capture_id++,
                                               .owner = std::this_thread::get_id(),
                                               .deps = std::move(start),
                                               .deps_out = {},
                                               .data_out = {},
                                               .own_graph = false};
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamUpdateCaptureDependencies(CUstream hStream, CUgraphNode* deps, const CUgraphEdgeData* data,
                                                   size_t n, unsigned int flags) {
  return guarded([&](State& s) -> CUresult {
    const auto it = s.captures.find(from_handle(hStream));
    if (it == s.captures.end() || it->second.invalidated) return CUDA_ERROR_ILLEGAL_STATE;
    if (flags != CU_STREAM_ADD_CAPTURE_DEPENDENCIES && flags != CU_STREAM_SET_CAPTURE_DEPENDENCIES)
      return CUDA_ERROR_INVALID_VALUE;
    if (n != 0 && deps == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Capture& c = it->second;
    std::vector<Handle> next = flags == CU_STREAM_SET_CAPTURE_DEPENDENCIES ? std::vector<Handle>{} : c.deps;
    for (size_t i = 0; i < n; ++i) {
      const auto d = s.graph_nodes.find(from_handle(deps[i]));
      if (d == s.graph_nodes.end() || d->second.graph != c.graph) return CUDA_ERROR_INVALID_VALUE;
      if (data != nullptr && data[i].type != 0) return CUDA_ERROR_NOT_SUPPORTED;
      if (std::find(next.begin(), next.end(), from_handle(deps[i])) == next.end()) next.push_back(from_handle(deps[i]));
    }
    c.deps = std::move(next);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph* phGraph) {
  return guarded([&](State& s) -> CUresult {
    if (phGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    if (const CUresult r = capturable(s, hStream, &ctx); r != CUDA_SUCCESS) return r;
    const auto it = s.captures.find(from_handle(hStream));
    if (it == s.captures.end()) return CUDA_ERROR_ILLEGAL_STATE;
    const Capture c = it->second;
    s.captures.erase(it);
    if (c.invalidated) {
      if (c.own_graph) destroy_graph(s, c.graph);
      *phGraph = nullptr;
      return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *phGraph = to_handle<CUgraph_st>(c.graph);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus* status) {
  return guarded([&](State& s) -> CUresult {
    if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    const Stream* st = nullptr;
    if (const CUresult r = stream_context(s, hStream, &ctx, &st); r != CUDA_SUCCESS) return r;
    const auto it = s.captures.find(from_handle(hStream));
    *status = it == s.captures.end()      ? CU_STREAM_CAPTURE_STATUS_NONE
              : it->second.invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                       : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus* status, cuuint64_t* id,
                                           CUgraph* graph, const CUgraphNode** deps,
                                           const CUgraphEdgeData** edges, size_t* ndeps) {
  return guarded([&](State& s) -> CUresult {
    if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    const Stream* st = nullptr;
    if (const CUresult r = stream_context(s, hStream, &ctx, &st); r != CUDA_SUCCESS) return r;
    const auto it = s.captures.find(from_handle(hStream));
    const bool active = it != s.captures.end() && !it->second.invalidated;
    *status = it == s.captures.end() ? CU_STREAM_CAPTURE_STATUS_NONE
              : active              ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                    : CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    if (id != nullptr && active) *id = it->second.id;
    if (!active) return CUDA_SUCCESS;
    Capture& c = it->second;
    if (graph != nullptr) *graph = to_handle<CUgraph_st>(c.graph);
    c.deps_out.clear();
    for (Handle d : c.deps) c.deps_out.push_back(to_handle<CUgraphNode_st>(d));
    c.data_out.assign(c.deps.size(), CUgraphEdgeData{});
    if (deps != nullptr) *deps = c.deps_out.empty() ? nullptr : c.deps_out.data();
    if (edges != nullptr) *edges = c.data_out.empty() ? nullptr : c.data_out.data();
    if (ndeps != nullptr) *ndeps = c.deps.size();
    return CUDA_SUCCESS;
  });
}

CUstreamCaptureMode& ivcuda::gpu_double::thread_capture_mode() {
  thread_local CUstreamCaptureMode current = CU_STREAM_CAPTURE_MODE_GLOBAL;
  return current;
}

CUresult ivcuda::gpu_double::unsafe_during_capture(State& s) {
  const CUstreamCaptureMode mine = thread_capture_mode();
  if (mine == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  const auto me = std::this_thread::get_id();
  bool prohibited = false;
  for (auto& [stream, c] : s.captures) {
    if (c.invalidated) continue;
    // This thread's own capture, unless begun relaxed; another thread's global
    // capture, unless this thread is thread-local.
    const bool by = (c.owner == me && c.mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
                    (c.owner != me && c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL && mine == CU_STREAM_CAPTURE_MODE_GLOBAL);
    if (by) {
      c.invalidated = true;
      prohibited = true;
    }
  }
  return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUstreamCaptureMode m = *mode;
  if (m != CU_STREAM_CAPTURE_MODE_GLOBAL && m != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      m != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  *mode = thread_capture_mode();
  thread_capture_mode() = m;
  return CUDA_SUCCESS;
}
