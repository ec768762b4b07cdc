// Stream capture and running graphs: capture as the host stream does it
// (begun, ended, asked about, into an existing graph, and the copies a
// capture must refuse), instantiation, launches and uploads, executable
// graphs' flags, user objects and a device's graph memory. The guest's side
// is guest/graph_exec.cc; graphs are built in graph_build.cc and edited in
// graph_edit.cc.
#include <atomic>
#include <cstring>
#include <vector>

#include "host-daemon/shared/log.h"
#include "host-daemon/worker/graph_internal.h"
#include "host-daemon/worker/worker_internal.h"
#include "ivcuda/graph_codec.h"

namespace ivcuda::host {

using namespace ivcuda::proto;
using graphs::kEdgeBytes;
using graphs::kMaxListed;

// ------------------------------------------------------------------ capture helpers

CUresult Worker::on_CaptureMode(Call& c) {
  const auto r = c.req<ReqCaptureMode>();
  if (r.mode > CU_STREAM_CAPTURE_MODE_RELAXED || !wire_enum(r.mode, &c.ch.capture_mode))
    return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

// A copy through memory the worker only lends for the duration of the call
// (an inline record, a staging chunk, a reply's buffer) cannot become a graph
// node: the graph would replay from memory that has been reused. Such a copy
// into a capturing stream fails as CUDA fails an unsupported capture
// operation, and the capture is invalidated the way the driver does it for
// other illegal calls (synchronising a capturing stream does exactly that).
// Called right before the copy is issued. A stream whose state the driver
// cannot tell is refused too (the legacy stream during another stream's
// global capture: the copy itself would fail there).
CUresult Worker::refuse_in_capture(CUstream s) {
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  if (CUresult st = cu_.cuStreamIsCapturing(s, &cs); st != CUDA_SUCCESS) return st;
  if (cs == CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_SUCCESS;
  if (cs == CU_STREAM_CAPTURE_STATUS_ACTIVE) (void)cu_.cuStreamSynchronize(s);
  if (errors_logged_++ < 100)
    IVLOG_INFO("guest %u: a pageable-memory copy cannot be captured into a graph", cfg_.guest_id);
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

// ------------------------------------------------------------------ capture

// What starting a capture names: the context made current, the mode, the stream.
CUresult Worker::capture_start(std::uint64_t ctx, std::uint32_t wire_mode, std::uint64_t stream,
                               CUstreamCaptureMode* mode, CUstream* s) {
  if (CUresult st = use_ctx(ctx); st != CUDA_SUCCESS) return st;
  if (wire_mode > CU_STREAM_CAPTURE_MODE_RELAXED || !wire_enum(wire_mode, mode)) return CUDA_ERROR_INVALID_VALUE;
  return resolve_stream(ctx, stream, s);
}

CUresult Worker::on_StreamBeginCapture(Call& c) {
  const auto r = c.req<ReqCapture>();
  CUstreamCaptureMode mode;
  CUstream s;
  if (CUresult st = capture_start(r.ctx, r.mode, r.stream, &mode, &s); st != CUDA_SUCCESS) return st;
  const CUresult st = cu_.cuStreamBeginCapture(s, mode);
  if (st == CUDA_SUCCESS) captures_[s] = CaptureEntry{c.ch.index, mode};
  return st;
}

CUresult Worker::on_StreamEndCapture(Call& c) {
  const auto r = c.req<ReqHandle>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.handle, &s); st != CUDA_SUCCESS) return st;
  // A capture ends in a graph, which the guest then holds. Past the limit
  // the capture still ends (the stream must not stay capturing).
  const bool over = full(graphs_, cfg_.limits.graphs, "graph");
  CUgraph g = nullptr;
  const CUresult st = cu_.cuStreamEndCapture(s, &g);
  // Ended, or never begun: either way no capture is under way on it now.
  captures_.erase(s);
  std::uint64_t known = 0;
  if (auto it = capture_graphs_.find(s); it != capture_graphs_.end()) {
    known = it->second;
    capture_graphs_.erase(it);
  }
  RepHandle rep{};
  if (g != nullptr) {
    // The guest's own graph (cuStreamBeginCaptureToGraph), or one it already
    // saw while the capture ran, keeps its handle.
    graphs_.for_each([&](std::uint64_t h, GraphEntry& e) {
      if (e.real == g) rep.handle = h;
    });
    if (rep.handle == 0 && over) {
      cu_.cuGraphDestroy(g);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (rep.handle == 0) rep.handle = graphs_.insert(GraphEntry{g, r.ctx, 0});
  }
  // The driver destroyed the graph of a failed capture.
  if (known != 0 && known != rep.handle) drop_graph(known);
  c.set_reply(rep);
  return st;
}

CUresult Worker::on_StreamCaptureInfo(Call& c) {
  const auto r = c.req<ReqHandle>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.handle, &s); st != CUDA_SUCCESS) return st;
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  size_t n = 0;
  const CUresult st = cu_.cuStreamGetCaptureInfo(s, &cs, &id, nullptr, nullptr, nullptr, &n);
  c.set_reply(RepCaptureInfo{static_cast<std::uint32_t>(cs), 0, id, n});
  return st;
}

CUresult Worker::on_CaptureGraphInfo(Call& c) {
  const auto r = c.req<ReqHandle>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.handle, &s); st != CUDA_SUCCESS) return st;
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  CUgraph g = nullptr;
  const CUgraphNode* deps = nullptr;
  const CUgraphEdgeData* data = nullptr;
  size_t n = 0;
  const CUresult st = cu_.cuStreamGetCaptureInfo(s, &cs, &id, &g, &deps, &data, &n);
  if (st != CUDA_SUCCESS) return st;
  if (cs != CU_STREAM_CAPTURE_STATUS_ACTIVE || g == nullptr) n = 0;
  if (n > kMaxListed) return CUDA_ERROR_NOT_SUPPORTED;
  c.set_reply(RepCaptureInfo{static_cast<std::uint32_t>(cs), 0, id, n});
  if (cs != CU_STREAM_CAPTURE_STATUS_ACTIVE || g == nullptr) return CUDA_SUCCESS;
  std::uint64_t gh = 0;
  graphs_.for_each([&](std::uint64_t h, GraphEntry& e) {
    if (e.real == g) gh = h;
  });
  if (gh == 0) {
    gh = graphs_.insert(GraphEntry{g, r.ctx, 0});
    capture_graphs_[s] = gh;
  }
  c.append(&gh, sizeof gh);
  for (size_t i = 0; i < n; ++i) {
    const std::uint64_t h = node_handle(deps[i], gh);
    c.append(&h, sizeof h);
  }
  for (size_t i = 0; i < n; ++i) {
    const CUgraphEdgeData e = data != nullptr ? data[i] : CUgraphEdgeData{};
    c.append(&e, sizeof e);
  }
  return CUDA_SUCCESS;
}

// Node handles [count] and edge data [count] after a capture request.
CUresult Worker::capture_nodes(std::span<const std::byte> tail, std::uint32_t count, std::vector<CUgraphNode>* nodes,
                               std::vector<CUgraphEdgeData>* data) {
  if (count > kMaxListed || tail.size() != count * (sizeof(std::uint64_t) + kEdgeBytes)) return CUDA_ERROR_INVALID_VALUE;
  nodes->resize(count);
  data->resize(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    std::uint64_t h;
    std::memcpy(&h, tail.data() + i * sizeof h, sizeof h);
    NodeEntry* n = nodes_.find(h);
    if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
    (*nodes)[i] = n->real;
  }
  if (count != 0) std::memcpy(data->data(), tail.data() + count * sizeof(std::uint64_t), count * kEdgeBytes);
  return CUDA_SUCCESS;
}

CUresult Worker::on_CaptureToGraph(Call& c) {
  const auto r = c.req<ReqCaptureToGraph>();
  CUstreamCaptureMode mode;
  CUstream s;
  if (CUresult st = capture_start(r.ctx, r.mode, r.stream, &mode, &s); st != CUDA_SUCCESS) return st;
  GraphEntry* g = graphs_.find(r.graph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUgraphNode> deps;
  std::vector<CUgraphEdgeData> data;
  if (CUresult st = capture_nodes(c.tail<ReqCaptureToGraph>(), r.count, &deps, &data); st != CUDA_SUCCESS) return st;
  const CUresult st = cu_.cuStreamBeginCaptureToGraph(s, g->real, deps.empty() ? nullptr : deps.data(),
                                                      data.empty() ? nullptr : data.data(), deps.size(),
                                                      mode);
  // The same bookkeeping as cuStreamBeginCapture (capture modes per guest thread).
  if (st == CUDA_SUCCESS) captures_[s] = CaptureEntry{c.ch.index, mode};
  return st;
}

CUresult Worker::on_CaptureUpdateDeps(Call& c) {
  const auto r = c.req<ReqCaptureDeps>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  std::vector<CUgraphNode> deps;
  std::vector<CUgraphEdgeData> data;
  if (CUresult st = capture_nodes(c.tail<ReqCaptureDeps>(), r.count, &deps, &data); st != CUDA_SUCCESS) return st;
  return cu_.cuStreamUpdateCaptureDependencies(s, deps.empty() ? nullptr : deps.data(),
                                               data.empty() ? nullptr : data.data(), deps.size(), r.flags);
}

// ------------------------------------------------------------------ executable graphs

// An executable graph of this guest's, its context made current.
CUresult Worker::exec_in_ctx(std::uint64_t h, ExecEntry** out) {
  ExecEntry* e = execs_.find(h);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = use_ctx(e->ctx); st != CUDA_SUCCESS) return st;
  *out = e;
  return CUDA_SUCCESS;
}

CUresult Worker::on_GraphInstantiate(Call& c) {
  const auto r = c.req<ReqGraphCreate>();
  GraphEntry* g = graphs_.find(r.graph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = use_ctx(r.ctx != 0 ? r.ctx : g->ctx); st != CUDA_SUCCESS) return st;
  if (full(execs_, cfg_.limits.graph_execs, "executable graph")) return CUDA_ERROR_OUT_OF_MEMORY;
  CUgraphExec e = nullptr;
  const CUresult st = cu_.cuGraphInstantiate(&e, g->real, r.flags);
  if (st != CUDA_SUCCESS) return st;
  c.set_reply(RepHandle{execs_.insert(ExecEntry{e, g->ctx})});
  return CUDA_SUCCESS;
}

// cuGraphLaunch and cuGraphUpload: an executable graph and a stream.
template <class DriverCall>
CUresult Worker::exec_on_stream(Call& c, DriverCall call) {
  const auto r = c.req<ReqGraphLaunch>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  ExecEntry* e = execs_.find(r.exec);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  return call(e->real, s);
}

CUresult Worker::on_GraphLaunch(Call& c) { return exec_on_stream(c, cu_.cuGraphLaunch); }

CUresult Worker::on_GraphUpload(Call& c) { return exec_on_stream(c, cu_.cuGraphUpload); }

CUresult Worker::on_GraphExecDestroy(Call& c) {
  const auto h = c.req<ReqHandle>().handle;
  ExecEntry* e = nullptr;
  if (CUresult st = exec_in_ctx(h, &e); st != CUDA_SUCCESS) return st;
  const CUresult st = cu_.cuGraphExecDestroy(e->real);
  execs_.erase(h);
  return st;
}

// ------------------------------------------------------------------ user objects

namespace {
// A user object's destructor: tells the guest, which runs its own once. The
// driver may call it on its own thread, after the last graph using the
// object has finished.
void CUDA_CB user_object_destroyed(void* user) {
  auto* slot = static_cast<std::uint32_t* const*>(user);
  // Pairs with load_acquire in guest/hostfunc.cc's dispatcher.
  std::atomic_ref<std::uint32_t>(*slot[0]).fetch_add(1, std::memory_order_acq_rel);
}
}  // namespace

CUresult Worker::on_UserObject(Call& c) {
  const auto r = c.req<ReqUserObject>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  if (r.kind == kUserObjCreate) {
    if (r.count == 0 || r.flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) return CUDA_ERROR_INVALID_VALUE;
    if (full(user_objs_, cfg_.limits.user_objects, "user object")) return CUDA_ERROR_OUT_OF_MEMORY;
    // The same pair bookkeeping as host nodes: one slot per pair, for the worker's life.
    GraphNodeParams p{};
    p.dst = r.off;
    CUDA_HOST_NODE_PARAMS hp;
    if (CUresult st = host_node_params(p, &hp); st != CUDA_SUCCESS) return st;
    CUuserObject obj = nullptr;
    const CUresult st = cu_.cuUserObjectCreate(&obj, hp.userData, user_object_destroyed, r.count, r.flags);
    if (st != CUDA_SUCCESS) return st;
    c.set_reply(RepHandle{user_objs_.insert(UserObjEntry{obj, r.count})});
    return CUDA_SUCCESS;
  }
  UserObjEntry* u = user_objs_.find(r.object);
  if (u == nullptr || r.count == 0) return CUDA_ERROR_INVALID_VALUE;
  switch (r.kind) {
    case kUserObjRetain: {
      const CUresult st = cu_.cuUserObjectRetain(u->real, r.count);
      if (st == CUDA_SUCCESS) u->refs += r.count;
      return st;
    }
    case kUserObjRelease: {
      // More than the guest holds would free what graphs still use.
      if (r.count > u->refs) return CUDA_ERROR_INVALID_VALUE;
      const CUresult st = cu_.cuUserObjectRelease(u->real, r.count);
      if (st == CUDA_SUCCESS) u->refs -= r.count;
      return st;
    }
    case kUserObjGraphRetain:
    case kUserObjGraphRelease: {
      GraphEntry* g = graphs_.find(r.graph);
      if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
      if (r.kind == kUserObjGraphRelease) return cu_.cuGraphReleaseUserObject(g->real, u->real, r.count);
      const bool move = (r.flags & CU_GRAPH_USER_OBJECT_MOVE) != 0;
      if (move && r.count > u->refs) return CUDA_ERROR_INVALID_VALUE;
      const CUresult st = cu_.cuGraphRetainUserObject(g->real, u->real, r.count, r.flags);
      if (st == CUDA_SUCCESS && move) u->refs -= r.count;
      return st;
    }
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// ------------------------------------------------------------------ on_GraphQuery's answers (graph_build.cc)

CUresult Worker::on_GraphQuery_exec_flags(Call& c, const ReqGraphQuery& r) {
  ExecEntry* e = nullptr;
  if (CUresult st = exec_in_ctx(r.handle, &e); st != CUDA_SUCCESS) return st;
  cuuint64_t flags = 0;
  const CUresult st = cu_.cuGraphExecGetFlags(e->real, &flags);
  c.set_reply(RepValue{static_cast<std::int64_t>(flags)});
  return st;
}

// The device's graph memory is this worker's, hence this guest's alone.
CUresult Worker::on_GraphQuery_graph_mem(Call& c, const ReqGraphQuery& r) {
  const auto dev = static_cast<int>(r.handle);
  if (r.handle > 0x7fffffffu || !valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  const CUdevice d = devices_[dev_index(dev)];
  if (r.flags == 2) return cu_.cuDeviceGraphMemTrim(d);
  CUgraphMem_attribute attr;
  if (r.other > CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH || !wire_enum(r.other, &attr)) return CUDA_ERROR_INVALID_VALUE;
  cuuint64_t v = r.capacity;
  if (r.flags == 1) return cu_.cuDeviceSetGraphMemAttribute(d, attr, &v);
  if (r.flags != 0) return CUDA_ERROR_INVALID_VALUE;
  const CUresult st = cu_.cuDeviceGetGraphMemAttribute(d, attr, &v);
  c.set_reply(RepValue{static_cast<std::int64_t>(v)});
  return st;
}

}  // namespace ivcuda::host
