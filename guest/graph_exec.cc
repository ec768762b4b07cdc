// Stream capture and running graphs: capture as the host stream does it
// (begun, ended, asked about, into an existing graph), instantiation,
// launches and uploads, executable graphs' flags, user objects and a device's
// graph memory. Graphs are built in graph_build.cc and edited in
// graph_edit.cc; the worker's side is host-daemon/worker/graph_exec.cc.
//
// Graphs, executable graphs, graph nodes and user objects are host
// handles: the host's driver does the work (docs/design.md, "Graphs"). Capture
// is forwarded as it is: the host stream captures what the guest's calls
// enqueue on it, so kernels, memsets, device copies and copies of page-locked
// (arena) memory become graph nodes unchanged. Copies of pageable memory
// cannot: they pass through memory the worker reuses once the call returns,
// so a capturing stream refuses them with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
// and the capture is invalidated.
#define __CUDA_API_VERSION_INTERNAL
#include <cuda.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "guest/graph_internal.h"
#include "guest/graphs.h"
#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/managed.h"
#include "guest/runtime.h"

using namespace ivcuda::guest::graphs;  // graph_internal.h: the names the graph files share
using ivcuda::guest::internal::known_stream;
using ivcuda::guest::internal::ptsz;

namespace {

// Streams this process began capturing and has not ended. While there are
// none, no stream of ours can be capturing and the capture queries (cuBLAS
// asks five times per GEMM) are answered here without a round trip.
// Every call asks any_capture() (guest/runtime.cc), so the count of streams
// is also kept in an atomic that is read without the lock.
struct Captures {
  std::mutex mu;
  std::unordered_map<std::uint64_t, unsigned> streams;  // guarded by mu
  std::atomic<std::size_t> open{0};                      // streams.size(), written under mu
};
Captures& captures() {
  static auto* c = new Captures;  // never destroyed: atexit handlers may still ask
  return *c;
}

bool valid_mode(CUstreamCaptureMode mode) {
  return mode == CU_STREAM_CAPTURE_MODE_GLOBAL || mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
         mode == CU_STREAM_CAPTURE_MODE_RELAXED;
}

// The host began a capture on s: it counts until it ends.
void capture_begun(CUstream s) {
  Captures& c = captures();
  std::lock_guard lk(c.mu);
  ++c.streams[h(s)];
  c.open.store(c.streams.size(), std::memory_order_release);
}

CUresult begin_capture(CUstream s, CUstreamCaptureMode mode) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (!valid_mode(mode)) return CUDA_ERROR_INVALID_VALUE;
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    const CUresult st = rt->call<Op::kStreamBeginCapture>(proto::ReqCapture{ctx, h(s), static_cast<proto::u32>(mode), 0});
    if (st == CUDA_SUCCESS) capture_begun(s);
    return st;
  });
}

CUresult end_capture(CUstream s, CUgraph* graph) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    proto::RepHandle rep{};
    const CUresult st = rt->call<Op::kStreamEndCapture>(proto::ReqHandle{ctx, h(s)}, {}, &rep);
    *graph = reinterpret_cast<CUgraph>(rep.handle);
    // Whatever the outcome, the stream is no longer capturing unless the
    // host says it never was ours to end.
    if (st != CUDA_ERROR_ILLEGAL_STATE && st != CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) {
      Captures& c = captures();
      std::lock_guard lk(c.mu);
      if (auto it = c.streams.find(h(s)); it != c.streams.end() && --it->second == 0) c.streams.erase(it);
      c.open.store(c.streams.size(), std::memory_order_release);
    }
    return st;
  });
}

// The dependency arrays cuStreamGetCaptureInfo hands out, per stream: valid
// until the next query of that stream, as CUDA promises until the next call.
struct CaptureDeps {
  std::mutex mu;
  std::unordered_map<std::uint64_t, std::pair<std::vector<CUgraphNode>, std::vector<CUgraphEdgeData>>> by_stream;
};
CaptureDeps& capture_deps() {
  static auto* c = new CaptureDeps;
  return *c;
}

// The capture state of s. The host answers only while some stream of ours
// captures; the graph and its dependency nodes come back as handles only
// when asked for.
CUresult capture_info(CUstream s, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                      const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* ndeps) {
  return guard([&] {
    if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::RepCaptureInfo rep{};
    std::vector<std::byte> extra;
    if (ivcuda::guest::any_capture()) {
      NEED_RT();
      NEED_CTX();
      if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
      const bool full = graph != nullptr || deps != nullptr || edges != nullptr;
      const CUresult st = full ? rt->call<Op::kCaptureGraphInfo>(proto::ReqHandle{ctx, h(s)}, {}, &rep, &extra)
                               : rt->call<Op::kStreamCaptureInfo>(proto::ReqHandle{ctx, h(s)}, {}, &rep);
      if (st != CUDA_SUCCESS) return st;
    }
    *status = static_cast<CUstreamCaptureStatus>(rep.status);
    if (id != nullptr) *id = rep.id;
    if (graph != nullptr) *graph = nullptr;
    if (deps != nullptr) *deps = nullptr;
    if (edges != nullptr) *edges = nullptr;
    if (ndeps != nullptr) *ndeps = 0;
    if (rep.status != CU_STREAM_CAPTURE_STATUS_ACTIVE) return CUDA_SUCCESS;
    if (ndeps != nullptr) *ndeps = static_cast<size_t>(rep.num_deps);
    const std::size_t n = static_cast<std::size_t>(rep.num_deps);
    if (extra.size() < sizeof(std::uint64_t) + n * (sizeof(std::uint64_t) + sizeof(CUgraphEdgeData))) {
      return CUDA_SUCCESS;  // only the plain query was made
    }
    std::uint64_t gh = 0;
    std::memcpy(&gh, extra.data(), sizeof gh);
    if (graph != nullptr) *graph = reinterpret_cast<CUgraph>(gh);
    CaptureDeps& cd = capture_deps();
    std::lock_guard lk(cd.mu);
    auto& [nodes, data] = cd.by_stream[h(s)];
    nodes.resize(n);
    data.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      std::uint64_t v;
      std::memcpy(&v, extra.data() + (1 + i) * sizeof v, sizeof v);
      nodes[i] = reinterpret_cast<CUgraphNode>(v);
    }
    if (n != 0) std::memcpy(data.data(), extra.data() + (1 + n) * sizeof(std::uint64_t), n * sizeof(CUgraphEdgeData));
    if (deps != nullptr) *deps = n != 0 ? nodes.data() : nullptr;
    if (edges != nullptr) *edges = n != 0 ? data.data() : nullptr;
    return CUDA_SUCCESS;
  });
}

// Node handles, then edge data (zero: the default), as the capture ops carry them.
std::vector<std::byte> capture_tail(const CUgraphNode* nodes, const CUgraphEdgeData* data, size_t n) {
  std::vector<std::byte> t(n * (sizeof(std::uint64_t) + sizeof(CUgraphEdgeData)));
  for (size_t i = 0; i < n; ++i) {
    const std::uint64_t v = h(nodes[i]);
    std::memcpy(t.data() + i * sizeof v, &v, sizeof v);
  }
  if (data != nullptr && n != 0)
    std::memcpy(t.data() + n * sizeof(std::uint64_t), data, n * sizeof(CUgraphEdgeData));
  return t;
}

CUresult begin_capture_to_graph(CUstream s, CUgraph graph, const CUgraphNode* deps, const CUgraphEdgeData* data,
                                size_t n, CUstreamCaptureMode mode) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (!valid_mode(mode)) return CUDA_ERROR_INVALID_VALUE;
    if ((n != 0 && deps == nullptr) || n > kMaxDeps) return CUDA_ERROR_INVALID_VALUE;
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    proto::ReqCaptureToGraph r{};
    r.ctx = ctx;
    r.stream = h(s);
    r.graph = h(graph);
    r.mode = static_cast<proto::u32>(mode);
    r.count = static_cast<proto::u32>(n);
    const CUresult st = rt->call<Op::kCaptureToGraph>(r, capture_tail(deps, data, n));
    if (st == CUDA_SUCCESS) capture_begun(s);
    return st;
  });
}

CUresult update_capture_deps(CUstream s, CUgraphNode* deps, const CUgraphEdgeData* data, size_t n, unsigned flags) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if ((n != 0 && deps == nullptr) || n > kMaxDeps) return CUDA_ERROR_INVALID_VALUE;
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    proto::ReqCaptureDeps r{};
    r.ctx = ctx;
    r.stream = h(s);
    r.count = static_cast<proto::u32>(n);
    r.flags = flags;
    return rt->call<Op::kCaptureUpdateDeps>(r, capture_tail(deps, data, n));
  });
}

CUresult graph_instantiate(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  return guard([&] {
    NEED_RT();
    if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::RepHandle rep{};
    const CUresult st = rt->call<Op::kGraphInstantiate>(proto::ReqGraphCreate{current_ctx(), h(graph), flags}, {}, &rep);
    if (st == CUDA_SUCCESS) *exec = reinterpret_cast<CUgraphExec>(rep.handle);
    return st;
  });
}

template <Op op>
CUresult graph_post(CUgraphExec exec, CUstream s) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    if constexpr (op == Op::kGraphLaunch)
      if (CUresult st = ivcuda::guest::managed::before_launch(rt, h(s)); st != CUDA_SUCCESS) return st;
    return rt->post<op>(proto::ReqGraphLaunch{ctx, h(exec), h(s)});
  });
}

}  // namespace

// ==================================================================== capture

// CUDA 10.0's form captures in global mode.
CUresult CUDAAPI cuStreamBeginCapture(CUstream s) { return begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL); }
CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream s) {
  return begin_capture(ptsz(s), CU_STREAM_CAPTURE_MODE_GLOBAL);
}
CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) { return begin_capture(s, mode); }
CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) {
  return begin_capture(ptsz(s), mode);
}
CUresult CUDAAPI cuStreamEndCapture(CUstream s, CUgraph* graph) { return end_capture(s, graph); }
CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream s, CUgraph* graph) { return end_capture(ptsz(s), graph); }

CUresult CUDAAPI cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) {
  return capture_info(s, status, nullptr, nullptr, nullptr, nullptr, nullptr);
}
CUresult CUDAAPI cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus* status, cuuint64_t* id) {
  return capture_info(s, status, id, nullptr, nullptr, nullptr, nullptr);
}
CUresult CUDAAPI cuStreamGetCaptureInfo_ptsz(CUstream s, CUstreamCaptureStatus* status, cuuint64_t* id) {
  return capture_info(ptsz(s), status, id, nullptr, nullptr, nullptr, nullptr);
}
CUresult CUDAAPI cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                           const CUgraphNode** deps, size_t* ndeps) {
  return capture_info(s, status, id, graph, deps, nullptr, ndeps);
}
CUresult CUDAAPI cuStreamGetCaptureInfo_v2_ptsz(CUstream s, CUstreamCaptureStatus* status, cuuint64_t* id,
                                                CUgraph* graph, const CUgraphNode** deps, size_t* ndeps) {
  return capture_info(ptsz(s), status, id, graph, deps, nullptr, ndeps);
}
CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                           const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* ndeps) {
  return capture_info(s, status, id, graph, deps, edges, ndeps);
}

CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream s, CUgraph graph, const CUgraphNode* deps,
                                             const CUgraphEdgeData* data, size_t n, CUstreamCaptureMode mode) {
  return begin_capture_to_graph(s, graph, deps, data, n, mode);
}
CUresult CUDAAPI cuStreamUpdateCaptureDependencies(CUstream s, CUgraphNode* deps, size_t n, unsigned int flags) {
  return update_capture_deps(s, deps, nullptr, n, flags);
}
CUresult CUDAAPI cuStreamUpdateCaptureDependencies_v2(CUstream s, CUgraphNode* deps, const CUgraphEdgeData* data,
                                                      size_t n, unsigned int flags) {
  return update_capture_deps(s, deps, data, n, flags);
}
// cuda.h declares these _ptsz forms only for per-thread-default-stream builds.
extern "C" {
CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph graph, const CUgraphNode* deps,
                                                  const CUgraphEdgeData* data, size_t n, CUstreamCaptureMode mode) {
  return begin_capture_to_graph(ptsz(s), graph, deps, data, n, mode);
}
CUresult CUDAAPI cuStreamUpdateCaptureDependencies_ptsz(CUstream s, CUgraphNode* deps, size_t n, unsigned int flags) {
  return update_capture_deps(ptsz(s), deps, nullptr, n, flags);
}
CUresult CUDAAPI cuStreamUpdateCaptureDependencies_v2_ptsz(CUstream s, CUgraphNode* deps, const CUgraphEdgeData* data,
                                                           size_t n, unsigned int flags) {
  return update_capture_deps(ptsz(s), deps, data, n, flags);
}
}  // extern "C"

// The mode decides which calls a capture forbids in this thread (PyTorch's
// allocator turns relaxed around cudaMalloc while a graph captures). The host
// serves all of a guest's threads from one thread: each guest thread's mode is
// kept here, travels ahead of that thread's next call (Runtime::call_raw), and
// the worker's thread takes it on before serving the call.
CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUstreamCaptureMode m = *mode;
  if (!valid_mode(m)) return CUDA_ERROR_INVALID_VALUE;
  *mode = ivcuda::guest::thread_capture_mode();
  ivcuda::guest::thread_capture_mode() = m;
  return CUDA_SUCCESS;
}

// ==================================================================== executable graphs

CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  return graph_instantiate(exec, graph, flags);
}

// The pre-12.0 forms report a failing node and a log; instantiation errors
// here come back as the CUresult alone.
CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* exec, CUgraph graph, CUgraphNode* err_node, char* log,
                                    size_t log_size) {
  if (err_node != nullptr) *err_node = nullptr;
  if (log != nullptr && log_size > 0) log[0] = '\0';
  return graph_instantiate(exec, graph, 0);
}
CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec* exec, CUgraph graph, CUgraphNode* err_node, char* log,
                                       size_t log_size) {
  return cuGraphInstantiate(exec, graph, err_node, log, log_size);
}

CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  p->hErrNode_out = nullptr;
  CUresult st = graph_instantiate(exec, graph, p->flags);
  if (st == CUDA_SUCCESS && (p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0)
    st = graph_post<Op::kGraphUpload>(*exec, p->hUploadStream);
  p->result_out = st == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
  return st;
}
CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph graph,
                                                   CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_GRAPH_INSTANTIATE_PARAMS q = *p;
  q.hUploadStream = ptsz(q.hUploadStream);
  const CUresult st = cuGraphInstantiateWithParams(exec, graph, &q);
  p->hErrNode_out = q.hErrNode_out;
  p->result_out = q.result_out;
  return st;
}

CUresult CUDAAPI cuGraphLaunch(CUgraphExec exec, CUstream s) { return graph_post<Op::kGraphLaunch>(exec, s); }
CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s) {
  return graph_post<Op::kGraphLaunch>(exec, ptsz(s));
}
CUresult CUDAAPI cuGraphUpload(CUgraphExec exec, CUstream s) { return graph_post<Op::kGraphUpload>(exec, s); }
CUresult CUDAAPI cuGraphUpload_ptsz(CUgraphExec exec, CUstream s) {
  return graph_post<Op::kGraphUpload>(exec, ptsz(s));
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec exec) {
  return guard([&] {
    NEED_RT();
    return rt->call<Op::kGraphExecDestroy>(proto::ReqHandle{current_ctx(), h(exec)});
  });
}

CUresult CUDAAPI cuGraphExecGetFlags(CUgraphExec exec, cuuint64_t* flags) {
  return guard([&] { return ask(proto::kQueryExecFlags, h(exec), 0, flags); });
}

// User objects: the host's driver counts the references (the guest's and
// graphs'); when the last one goes, the guest's destructor runs here, on the
// host-function dispatcher, once.
namespace {
CUresult user_object(std::uint32_t kind, CUuserObject obj, CUgraph graph, unsigned count, unsigned flags) {
  return guard([&] {
    NEED_RT();
    proto::ReqUserObject r{};
    r.ctx = current_ctx();
    r.object = h(obj);
    r.graph = h(graph);
    r.count = count;
    r.flags = flags;
    r.kind = kind;
    return rt->call<Op::kUserObject>(r);
  });
}
}  // namespace

CUresult CUDAAPI cuUserObjectCreate(CUuserObject* out, void* ptr, CUhostFn destroy, unsigned int refs,
                                    unsigned int flags) {
  return guard([&] {
    NEED_RT();
    if (out == nullptr || destroy == nullptr || refs == 0 || flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)
      return CUDA_ERROR_INVALID_VALUE;
    std::uint64_t off = 0;
    if (CUresult st = ivcuda::guest::host_node_pair(destroy, ptr, &off, true); st != CUDA_SUCCESS) return st;
    proto::ReqUserObject r{};
    r.ctx = current_ctx();
    r.off = off;
    r.count = refs;
    r.flags = flags;
    r.kind = proto::kUserObjCreate;
    proto::RepHandle rep{};
    const CUresult st = rt->call<Op::kUserObject>(r, {}, &rep);
    if (st == CUDA_SUCCESS) *out = reinterpret_cast<CUuserObject>(rep.handle);
    return st;
  });
}
CUresult CUDAAPI cuUserObjectRetain(CUuserObject obj, unsigned int count) {
  return user_object(proto::kUserObjRetain, obj, nullptr, count, 0);
}
CUresult CUDAAPI cuUserObjectRelease(CUuserObject obj, unsigned int count) {
  return user_object(proto::kUserObjRelease, obj, nullptr, count, 0);
}
CUresult CUDAAPI cuGraphRetainUserObject(CUgraph graph, CUuserObject obj, unsigned int count, unsigned int flags) {
  return user_object(proto::kUserObjGraphRetain, obj, graph, count, flags);
}
CUresult CUDAAPI cuGraphReleaseUserObject(CUgraph graph, CUuserObject obj, unsigned int count) {
  return user_object(proto::kUserObjGraphRelease, obj, graph, count, 0);
}

// Graph memory of a device: the host's driver counts this guest's alone.
namespace {
CUresult graph_mem(CUdevice dev, CUgraphMem_attribute attr, std::uint32_t op, std::uint64_t in, std::uint64_t* out) {
  return guard([&] {
    NEED_RT();
    const int w = rt->to_worker(dev);
    if (w < 0) return CUDA_ERROR_INVALID_DEVICE;
    std::int64_t v = 0;
    const CUresult st = query(proto::kQueryGraphMem, static_cast<std::uint64_t>(w), static_cast<std::uint64_t>(attr),
                              &v, in, op);
    if (st == CUDA_SUCCESS && out != nullptr) *out = static_cast<std::uint64_t>(v);
    return st;
  });
}
}  // namespace

CUresult CUDAAPI cuDeviceGraphMemTrim(CUdevice dev) {
  return graph_mem(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, 2, 0, nullptr);
}
CUresult CUDAAPI cuDeviceGetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void* value) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::uint64_t v = 0;
  const CUresult st = graph_mem(dev, attr, 0, 0, &v);
  if (st == CUDA_SUCCESS) std::memcpy(value, &v, sizeof v);  // every attribute is a cuuint64_t
  return st;
}
CUresult CUDAAPI cuDeviceSetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void* value) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::uint64_t v = 0;
  std::memcpy(&v, value, sizeof v);
  return graph_mem(dev, attr, 1, v, nullptr);
}

bool ivcuda::guest::any_capture() noexcept {
  // Pairs with the release stores above: a capture begun before this call
  // (on any thread that synchronised with this one) is seen.
  return captures().open.load(std::memory_order_acquire) != 0;
}
