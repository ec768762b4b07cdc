// Stream capture and graphs (built by capture or node by node, edited,
// instantiated, launched). (Stream-ordered memory and pools are
// guest/pools.cc; launches, occupancy and tensor maps guest/launch.cc.)
//
// Graphs, executable graphs, graph nodes and user objects are host
// handles: the host's driver does the work (docs/design.md, "Graphs"). Capture
// is forwarded as it is: the host stream captures what the guest's calls
// enqueue on it, so kernels, memsets, device copies and copies of page-locked
// (arena) memory become graph nodes unchanged. Copies of pageable memory
// cannot: they pass through memory the worker reuses once the call returns,
// so a capturing stream refuses them with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
// and the capture is invalidated; a memcpy node naming pageable memory is
// refused with CUDA_ERROR_NOT_SUPPORTED for the same reason.
//
// This file sees cuda.h without its renaming macros, so every ABI
// generation is defined under its exact exported name.
#define __CUDA_API_VERSION_INTERNAL
#include <cuda.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "guest/graphs.h"
#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/managed.h"
#include "guest/runtime.h"
#include "ivcuda/graph_codec.h"

using ivcuda::guest::current_ctx;
using ivcuda::guest::guard;
using ivcuda::guest::Runtime;
using ivcuda::guest::internal::h;
using ivcuda::guest::internal::ptsz;
using ivcuda::guest::internal::known_stream;
namespace codec = ivcuda::codec;
namespace proto = ivcuda::proto;
using proto::Op;

namespace {

// The most dependencies or edges one request carries (the host's limit too).
constexpr size_t kMaxDeps = size_t{1} << 16;

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

CUresult begin_capture(CUstream s, CUstreamCaptureMode mode) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
      return CUDA_ERROR_INVALID_VALUE;
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    const CUresult st = rt->call<Op::kStreamBeginCapture>(proto::ReqCapture{ctx, h(s), static_cast<proto::u32>(mode), 0});
    if (st == CUDA_SUCCESS) {
      Captures& c = captures();
      std::lock_guard lk(c.mu);
      ++c.streams[h(s)];
      c.open.store(c.streams.size(), std::memory_order_release);
    }
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
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
      return CUDA_ERROR_INVALID_VALUE;
    if ((n != 0 && deps == nullptr) || n > kMaxDeps) return CUDA_ERROR_INVALID_VALUE;
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    proto::ReqCaptureToGraph r{};
    r.ctx = ctx;
    r.stream = h(s);
    r.graph = h(graph);
    r.mode = static_cast<proto::u32>(mode);
    r.count = static_cast<proto::u32>(n);
    const CUresult st = rt->call<Op::kCaptureToGraph>(r, capture_tail(deps, data, n));
    if (st == CUDA_SUCCESS) {
      Captures& c = captures();
      std::lock_guard lk(c.mu);
      ++c.streams[h(s)];
      c.open.store(c.streams.size(), std::memory_order_release);
    }
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
  if (m != CU_STREAM_CAPTURE_MODE_GLOBAL && m != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      m != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  *mode = ivcuda::guest::thread_capture_mode();
  ivcuda::guest::thread_capture_mode() = m;
  return CUDA_SUCCESS;
}

// ==================================================================== graphs

CUresult CUDAAPI cuGraphCreate(CUgraph* graph, unsigned int flags) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (graph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    proto::RepHandle rep{};
    const CUresult st = rt->call<Op::kGraphCreate>(proto::ReqGraphCreate{ctx, 0, flags}, {}, &rep);
    if (st == CUDA_SUCCESS) *graph = reinterpret_cast<CUgraph>(rep.handle);
    return st;
  });
}

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

CUresult CUDAAPI cuGraphDestroy(CUgraph graph) {
  return guard([&] {
    NEED_RT();
    return rt->call<Op::kGraphDestroy>(proto::ReqHandle{current_ctx(), h(graph)});
  });
}

// ==================================================================== graph building
//
// Nodes are host handles, as graphs are; a CUgraphNode here is that handle.
// Parameters travel in one form (proto::GraphNodeParams): kernels packed by
// the layout the guest learned when it looked the function up, as for a
// launch; memory as device addresses, or as arena offsets for page-locked
// memory. Pageable host memory cannot be part of a graph that runs on the
// host: a memcpy node naming it is refused with CUDA_ERROR_NOT_SUPPORTED.

namespace {

CUgraphNode node_of(std::uint64_t v) { return reinterpret_cast<CUgraphNode>(v); }

// A kernel's function and arguments, packed by the layout the guest learned
// when it looked the function up, as for a launch.
CUresult pack_kernel_args(Runtime* rt, CUfunction func, void** params, void** extra, proto::GraphNodeParams* out,
                          std::vector<std::byte>* packed) {
  const CUfunction f = ivcuda::guest::kernel_function(func);
  if (f == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lk(rt->books_mu);
  auto it = rt->funcs.find(h(f));
  if (it == rt->funcs.end()) return CUDA_ERROR_INVALID_HANDLE;
  const auto& info = it->second;
  packed->assign(info.param_bytes, std::byte{0});
  if (const CUresult st = ivcuda::guest::pack_kernel_params(info, params, extra, packed->data()); st != CUDA_SUCCESS)
    return st;
  out->handle = h(f);
  out->param_bytes = info.param_bytes;
  return CUDA_SUCCESS;
}

// CUDA_KERNEL_NODE_PARAMS v1, v2 or v3, naming function f.
template <class K>
CUresult pack_kernel(Runtime* rt, const K& k, CUfunction f, proto::GraphNodeParams* out,
                     std::vector<std::byte>* packed) {
  if (CUresult st = pack_kernel_args(rt, f, k.kernelParams, k.extra, out, packed); st != CUDA_SUCCESS) return st;
  codec::kernel_to_wire(k, out);
  return CUDA_SUCCESS;
}

// One end of a copy (its geometry already on the wire): device memory as it
// is, page-locked memory as its arena offset. Pageable memory and arrays
// cannot be reached from the host.
CUresult pack_copy_end(Runtime* rt, CUmemorytype type, CUdeviceptr dev, const void* host, const CUDA_MEMCPY3D& m,
                       proto::CopyEnd* e) {
  const std::uint64_t extent = (e->z + m.Depth - 1) * e->pitch * e->height + (e->y + m.Height - 1) * e->pitch +
                               e->x_bytes + m.WidthInBytes;
  if (type == CU_MEMORYTYPE_UNIFIED) {
    host = reinterpret_cast<const void*>(dev);
    type = rt->pinned_offset(host, extent) ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
  }
  if (type == CU_MEMORYTYPE_DEVICE) {
    e->type = CU_MEMORYTYPE_DEVICE;
    e->addr = dev;
    return CUDA_SUCCESS;
  }
  if (type == CU_MEMORYTYPE_HOST) {
    const auto off = rt->pinned_offset(host, extent);
    if (!off)
      return ivcuda::guest::not_supported(
          "graph memcpy node: pageable host memory cannot be reached by the host's graph (use cuMemHostAlloc)");
    e->type = CU_MEMORYTYPE_HOST;
    e->addr = *off;
    return CUDA_SUCCESS;
  }
  if (type == CU_MEMORYTYPE_ARRAY) return ivcuda::guest::not_supported("graph memcpy node: CUDA arrays");
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult pack_copy(Runtime* rt, const CUDA_MEMCPY3D& m, proto::GraphNodeParams* out) {
  out->type = CU_GRAPH_NODE_TYPE_MEMCPY;
  if (m.WidthInBytes == 0 || m.Height == 0 || m.Depth == 0) return CUDA_ERROR_INVALID_VALUE;
  return codec::copy_to_wire(m, out, [&](CUmemorytype type, CUdeviceptr dev, const void* host, proto::CopyEnd* e) {
    return pack_copy_end(rt, type, dev, host, m, e);
  });
}

// The worker answers page-locked ends as arena offsets: pointers of this process again.
CUDA_MEMCPY3D unpack_copy(Runtime* rt, const proto::GraphNodeParams& p) {
  const auto end = [&](const proto::CopyEnd& e, CUmemorytype* type, CUdeviceptr* dev, const void** host) {
    *type = static_cast<CUmemorytype>(e.type);
    if (e.type == CU_MEMORYTYPE_HOST)
      *host = rt->pinned_base() + e.addr;
    else
      *dev = e.addr;
    return CUDA_SUCCESS;
  };
  CUDA_MEMCPY3D m;
  (void)codec::copy_from_wire(p, &m, end);
  return m;
}

// The tail of an add or set: the parameters, then a kernel's packed arguments.
std::vector<std::byte> params_tail(const proto::GraphNodeParams& p, const std::vector<std::byte>& packed) {
  std::vector<std::byte> t(sizeof p + packed.size());
  std::memcpy(t.data(), &p, sizeof p);
  if (!packed.empty()) std::memcpy(t.data() + sizeof p, packed.data(), packed.size());
  return t;
}

CUresult add_node(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t ndeps,
                  const proto::GraphNodeParams& p, const std::vector<std::byte>& packed,
                  std::uint64_t* extra_out = nullptr, std::size_t extra_count = 1) {
  NEED_RT();
  if (out == nullptr || (ndeps != 0 && deps == nullptr) || ndeps > kMaxDeps) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::byte> tail(ndeps * sizeof(std::uint64_t));
  for (size_t i = 0; i < ndeps; ++i) {
    const std::uint64_t v = h(deps[i]);
    std::memcpy(tail.data() + i * sizeof v, &v, sizeof v);
  }
  const auto rest = params_tail(p, packed);
  tail.insert(tail.end(), rest.begin(), rest.end());
  proto::ReqGraphAddNode r{};
  r.ctx = current_ctx();
  r.graph = h(graph);
  r.ndeps = static_cast<proto::u32>(ndeps);
  proto::RepHandle rep{};
  std::vector<std::byte> extra;
  const CUresult st = rt->call<Op::kGraphAddNode>(r, tail, &rep, &extra);
  if (st != CUDA_SUCCESS) return st;
  *out = node_of(rep.handle);
  // What the driver made with the node: an allocation's address, a
  // conditional node's body graphs.
  if (extra_out != nullptr) {
    if (extra.size() < extra_count * sizeof *extra_out) return CUDA_ERROR_UNKNOWN;
    std::memcpy(extra_out, extra.data(), extra_count * sizeof *extra_out);
  }
  return CUDA_SUCCESS;
}

// An application's location on the wire: device ordinals become the worker's.
CUresult location_to_wire(Runtime* rt, const CUmemLocation& loc, proto::u32* type, proto::i32* id) {
  *type = static_cast<proto::u32>(loc.type);
  *id = loc.id;
  if (loc.type == CU_MEM_LOCATION_TYPE_DEVICE && (*id = rt->to_worker(loc.id)) < 0) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}
int app_ordinal(Runtime* rt, int worker) {
  for (int i = 0; i < rt->device_count(); ++i)
    if (rt->to_worker(i) == worker) return i;
  return -1;
}

// A memory allocation node: the driver on the host picks the address, which
// is written back into the caller's parameters, as the driver does.
CUresult add_mem_alloc(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n,
                       CUDA_MEM_ALLOC_NODE_PARAMS* a) {
  NEED_RT();
  if (a == nullptr || (a->accessDescCount != 0 && a->accessDescs == nullptr) ||
      a->accessDescCount > proto::kMaxDevices)
    return CUDA_ERROR_INVALID_VALUE;
  proto::GraphNodeParams p{};
  p.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
  p.width = a->bytesize;
  const auto loc = [&](const CUmemLocation& l, proto::u32* type, proto::i32* id) {
    return location_to_wire(rt, l, type, id);
  };
  std::vector<std::byte> tail;
  if (CUresult st = codec::mem_alloc_to_wire(*a, loc, &tail); st != CUDA_SUCCESS) return st;
  std::uint64_t dptr = 0;
  const CUresult st = add_node(out, graph, deps, n, p, tail, &dptr);
  if (st != CUDA_SUCCESS) return st;
  // Keep this process's own memory out of the range, as for cuMemAlloc.
  if (!rt->reserve_device_range(dptr, a->bytesize))
    ivcuda::guest::log_once("va-collision-graph", "graph allocation at 0x%llx overlaps this process's own memory",
                            static_cast<unsigned long long>(dptr));
  a->dptr = dptr;
  return CUDA_SUCCESS;
}

// Access descriptors cuGraphMemAllocNodeGetParams hands out, per node.
struct AllocDescCache {
  std::mutex mu;
  std::unordered_map<std::uint64_t, std::vector<CUmemAccessDesc>> by_node;
};
AllocDescCache& alloc_desc_cache() {
  static auto* c = new AllocDescCache;
  return *c;
}

// Sets a node's parameters (exec 0) or an executable graph's copy of them.
CUresult set_params(CUgraphExec exec, CUgraphNode node, const proto::GraphNodeParams& p,
                    const std::vector<std::byte>& packed) {
  NEED_RT();
  proto::ReqGraphNodeParams r{};
  r.ctx = current_ctx();
  r.node = h(node);
  r.exec = h(exec);
  r.kind = exec != nullptr ? proto::kNodeParamsExecSet : proto::kNodeParamsSet;
  return rt->call<Op::kGraphNodeParams>(r, params_tail(p, packed));
}

CUresult get_params(CUgraphNode node, proto::GraphNodeParams* p, std::vector<std::byte>* packed) {
  NEED_RT();
  proto::ReqGraphNodeParams r{};
  r.ctx = current_ctx();
  r.node = h(node);
  r.kind = proto::kNodeParamsGet;
  return rt->call<Op::kGraphNodeParams>(r, {}, p, packed);
}

CUresult query(std::uint32_t kind, std::uint64_t handle, std::uint64_t other, std::int64_t* value,
               std::uint64_t capacity = 0, std::uint32_t flags = 0, std::vector<std::byte>* extra = nullptr) {
  NEED_RT();
  proto::ReqGraphQuery r{};
  r.ctx = current_ctx();
  r.handle = handle;
  r.other = other;
  r.capacity = capacity;
  r.kind = kind;
  r.flags = flags;
  proto::RepValue rep{};
  const CUresult st = rt->call<Op::kGraphQuery>(r, {}, &rep, extra);
  if (value != nullptr) *value = rep.value;
  return st;
}

// The lists (nodes, roots, edges, dependencies, dependents) with CUDA's
// semantics: the host asks its driver with the caller's capacity and arrays.
CUresult list(std::uint32_t kind, std::uint64_t handle, CUgraphNode* a, CUgraphNode* b, CUgraphEdgeData* data,
              size_t* count) {
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const bool arrays = a != nullptr;
  if (data != nullptr && !arrays) return CUDA_ERROR_INVALID_VALUE;
  if (kind == proto::kQueryEdges && (a == nullptr) != (b == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  const std::uint32_t flags = (arrays ? proto::kQueryArrays : 0u) | (data != nullptr ? proto::kQueryEdgeData : 0u);
  const std::uint64_t cap = arrays ? *count : 0;
  std::int64_t n = 0;
  std::vector<std::byte> extra;
  const CUresult st = query(kind, handle, 0, &n, cap, flags, &extra);
  if (st == CUDA_ERROR_NOT_SUPPORTED && arrays)
    return ivcuda::guest::not_supported("graph list of %llu entries: longer than one reply holds",
                                        static_cast<unsigned long long>(cap));
  if (st != CUDA_SUCCESS && st != CUDA_ERROR_LOSSY_QUERY) return st;
  const std::size_t lists = kind == proto::kQueryEdges ? 2 : 1;
  if (extra.size() < cap * (lists * sizeof(std::uint64_t) + (data != nullptr ? sizeof(CUgraphEdgeData) : 0)))
    return CUDA_ERROR_UNKNOWN;
  for (std::uint64_t i = 0; i < cap; ++i) {
    std::uint64_t v;
    std::memcpy(&v, extra.data() + i * sizeof v, sizeof v);
    a[i] = node_of(v);
    if (lists == 2) {
      std::memcpy(&v, extra.data() + (cap + i) * sizeof v, sizeof v);
      b[i] = node_of(v);
    }
  }
  if (data != nullptr && cap != 0)
    std::memcpy(data, extra.data() + lists * cap * sizeof(std::uint64_t), cap * sizeof(CUgraphEdgeData));
  *count = static_cast<size_t>(n);
  return st;
}

CUresult edges(CUgraph graph, const CUgraphNode* from, const CUgraphNode* to, const CUgraphEdgeData* data, size_t n,
               bool remove) {
  NEED_RT();
  if (n != 0 && (from == nullptr || to == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (n > kMaxDeps) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::byte> tail(n * (2 * sizeof(std::uint64_t) + sizeof(CUgraphEdgeData)));
  for (size_t i = 0; i < n; ++i) {
    const std::uint64_t f = h(from[i]), t = h(to[i]);
    std::memcpy(tail.data() + i * sizeof f, &f, sizeof f);
    std::memcpy(tail.data() + (n + i) * sizeof t, &t, sizeof t);
  }
  if (data != nullptr && n != 0)
    std::memcpy(tail.data() + 2 * n * sizeof(std::uint64_t), data, n * sizeof(CUgraphEdgeData));
  proto::ReqGraphEdges r{};
  r.ctx = current_ctx();
  r.graph = h(graph);
  r.count = static_cast<proto::u32>(n);
  r.remove = remove ? 1 : 0;
  return rt->call<Op::kGraphEdges>(r, tail);
}

bool default_edges(const CUgraphEdgeData* data, size_t n) {
  if (data == nullptr) return true;
  for (size_t i = 0; i < n; ++i) {
    const auto* b = reinterpret_cast<const unsigned char*>(&data[i]);
    for (size_t k = 0; k < sizeof data[i]; ++k)
      if (b[k] != 0) return false;
  }
  return true;
}

// Kernel parameters handed out by cuGraphKernelNodeGetParams point here: they
// stay valid until the node's parameters are asked for again.
struct KernelArgsCache {
  std::mutex mu;
  std::unordered_map<std::uint64_t, std::pair<std::vector<std::byte>, std::vector<void*>>> by_node;
};
KernelArgsCache& kernel_args_cache() {
  static auto* c = new KernelArgsCache;
  return *c;
}

template <class P>
CUresult kernel_get(CUgraphNode node, P* out) {
  return guard([&] {
    NEED_RT();
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    CUresult st = get_params(node, &p, &packed);
    if (st != CUDA_SUCCESS) return st;
    if (p.type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
    std::vector<proto::ParamSlot> slots;
    {
      std::lock_guard lk(rt->books_mu);
      auto it = rt->funcs.find(p.handle);
      if (it == rt->funcs.end() || it->second.param_bytes != packed.size()) return CUDA_ERROR_UNKNOWN;
      slots = it->second.params;
    }
    KernelArgsCache& cache = kernel_args_cache();
    std::lock_guard lk(cache.mu);
    auto& [buf, argv] = cache.by_node[h(node)];
    buf = std::move(packed);
    argv.resize(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) argv[i] = buf.data() + slots[i].offset;
    *out = P{};
    out->func = reinterpret_cast<CUfunction>(p.handle);
    codec::kernel_from_wire(p, out);
    out->kernelParams = argv.empty() ? nullptr : argv.data();
    out->extra = nullptr;
    return CUDA_SUCCESS;
  });
}

// v2/v3 name the kernel either as a function or as a CUkernel.
template <class P>
CUfunction kernel_of(const P& p) {
  return p.func != nullptr ? p.func : reinterpret_cast<CUfunction>(p.kern);
}

template <class P>
CUresult kernel_set(CUgraphExec exec, CUgraphNode node, const P* in, CUfunction f) {
  return guard([&] {
    NEED_RT();
    if (in == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    if (CUresult st = pack_kernel(rt, *in, f, &p, &packed); st != CUDA_SUCCESS) return st;
    return set_params(exec, node, p, packed);
  });
}

template <class P>
CUresult kernel_add(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n, const P* in, CUfunction f) {
  return guard([&] {
    NEED_RT();
    if (in == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    if (CUresult st = pack_kernel(rt, *in, f, &p, &packed); st != CUDA_SUCCESS) return st;
    return add_node(out, graph, deps, n, p, packed);
  });
}

// A host node: the function runs here, on the dispatcher (hostfunc.cc), when
// the host's graph reaches the node; the node names the pair of arena words
// the two sides meet at.
CUresult pack_host(CUhostFn fn, void* data, proto::GraphNodeParams* p) {
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::uint64_t off = 0;
  if (CUresult st = ivcuda::guest::host_node_pair(fn, data, &off); st != CUDA_SUCCESS) return st;
  p->type = CU_GRAPH_NODE_TYPE_HOST;
  p->dst = off;
  return CUDA_SUCCESS;
}

// cuGraphAddNode / cuGraphNodeSetParams / cuGraphExecNodeSetParams: the
// generic form, for the node types that are forwarded.
CUresult pack_generic(Runtime* rt, const CUgraphNodeParams& g, proto::GraphNodeParams* p,
                      std::vector<std::byte>* packed) {
  switch (g.type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
      return pack_kernel(rt, g.kernel, kernel_of(g.kernel), p, packed);
    case CU_GRAPH_NODE_TYPE_MEMSET:
      codec::memset_to_wire(g.memset, p);
      return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      if (g.memcpy.flags != 0 || g.memcpy.reserved != 0) return CUDA_ERROR_INVALID_VALUE;
      return pack_copy(rt, g.memcpy.copyParams, p);
    case CU_GRAPH_NODE_TYPE_EMPTY:
      p->type = CU_GRAPH_NODE_TYPE_EMPTY;
      return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_GRAPH:
      if (g.graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE)
        return ivcuda::guest::not_supported("cuGraphAddNode: child graphs are cloned, not moved");
      p->type = CU_GRAPH_NODE_TYPE_GRAPH;
      p->handle = h(g.graph.graph);
      return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      p->type = CU_GRAPH_NODE_TYPE_EVENT_RECORD;
      p->handle = h(g.eventRecord.event);
      return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      p->type = CU_GRAPH_NODE_TYPE_WAIT_EVENT;
      p->handle = h(g.eventWait.event);
      return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_HOST:
      return pack_host(g.host.fn, g.host.userData, p);
    case CU_GRAPH_NODE_TYPE_MEM_FREE:
      p->type = CU_GRAPH_NODE_TYPE_MEM_FREE;
      p->dst = g.free.dptr;
      return CUDA_SUCCESS;
    default:
      return ivcuda::guest::not_supported("graph node type %d is not forwarded", static_cast<int>(g.type));
  }
}

CUresult event_get(CUgraphNode node, CUevent* ev, CUgraphNodeType want) {
  return guard([&] {
    if (ev == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    const CUresult st = get_params(node, &p, &packed);
    if (st != CUDA_SUCCESS) return st;
    if (p.type != static_cast<proto::u32>(want)) return CUDA_ERROR_INVALID_VALUE;
    *ev = reinterpret_cast<CUevent>(p.handle);
    return CUDA_SUCCESS;
  });
}

CUresult event_set(CUgraphExec exec, CUgraphNode node, CUevent ev, CUgraphNodeType type) {
  return guard([&] {
    proto::GraphNodeParams p{};
    p.type = static_cast<proto::u32>(type);
    p.handle = h(ev);
    return set_params(exec, node, p, {});
  });
}

CUresult event_add(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n, CUevent ev,
                   CUgraphNodeType type) {
  return guard([&] {
    proto::GraphNodeParams p{};
    p.type = static_cast<proto::u32>(type);
    p.handle = h(ev);
    return add_node(out, graph, deps, n, p, {});
  });
}

}  // namespace

CUresult CUDAAPI cuGraphAddKernelNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n,
                                      const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  return kernel_add(out, graph, deps, n, p, p != nullptr ? p->func : nullptr);
}
CUresult CUDAAPI cuGraphAddKernelNode_v2(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n,
                                         const CUDA_KERNEL_NODE_PARAMS_v2* p) {
  return kernel_add(out, graph, deps, n, p, p != nullptr ? kernel_of(*p) : nullptr);
}

CUresult CUDAAPI cuGraphKernelNodeGetParams(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS_v1* p) {
  return kernel_get(node, p);
}
CUresult CUDAAPI cuGraphKernelNodeGetParams_v2(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS_v2* p) {
  return kernel_get(node, p);
}
CUresult CUDAAPI cuGraphKernelNodeSetParams(CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  return kernel_set(nullptr, node, p, p != nullptr ? p->func : nullptr);
}
CUresult CUDAAPI cuGraphKernelNodeSetParams_v2(CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v2* p) {
  return kernel_set(nullptr, node, p, p != nullptr ? kernel_of(*p) : nullptr);
}
CUresult CUDAAPI cuGraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                                const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return kernel_set(exec, node, p, p != nullptr ? p->func : nullptr);
}
CUresult CUDAAPI cuGraphExecKernelNodeSetParams_v2(CUgraphExec exec, CUgraphNode node,
                                                   const CUDA_KERNEL_NODE_PARAMS_v2* p) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return kernel_set(exec, node, p, p != nullptr ? kernel_of(*p) : nullptr);
}

CUresult CUDAAPI cuGraphAddMemsetNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n,
                                      const CUDA_MEMSET_NODE_PARAMS* m, CUcontext) {
  return guard([&] {
    if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    codec::memset_to_wire(*m, &p);
    return add_node(out, graph, deps, n, p, {});
  });
}
CUresult CUDAAPI cuGraphMemsetNodeGetParams(CUgraphNode node, CUDA_MEMSET_NODE_PARAMS* m) {
  return guard([&] {
    if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    const CUresult st = get_params(node, &p, &packed);
    if (st != CUDA_SUCCESS) return st;
    if (p.type != CU_GRAPH_NODE_TYPE_MEMSET) return CUDA_ERROR_INVALID_VALUE;
    *m = codec::memset_from_wire(p);
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphMemsetNodeSetParams(CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS* m) {
  return guard([&] {
    if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    codec::memset_to_wire(*m, &p);
    return set_params(nullptr, node, p, {});
  });
}
CUresult CUDAAPI cuGraphExecMemsetNodeSetParams(CUgraphExec exec, CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS* m,
                                                CUcontext) {
  return guard([&] {
    if (m == nullptr || exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    codec::memset_to_wire(*m, &p);
    return set_params(exec, node, p, {});
  });
}

CUresult CUDAAPI cuGraphAddMemcpyNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n,
                                      const CUDA_MEMCPY3D* m, CUcontext) {
  return guard([&] {
    NEED_RT();
    if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    if (CUresult st = pack_copy(rt, *m, &p); st != CUDA_SUCCESS) return st;
    return add_node(out, graph, deps, n, p, {});
  });
}
CUresult CUDAAPI cuGraphMemcpyNodeGetParams(CUgraphNode node, CUDA_MEMCPY3D* m) {
  return guard([&] {
    NEED_RT();
    if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    const CUresult st = get_params(node, &p, &packed);
    if (st != CUDA_SUCCESS) return st;
    if (p.type != CU_GRAPH_NODE_TYPE_MEMCPY) return CUDA_ERROR_INVALID_VALUE;
    *m = unpack_copy(rt, p);
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphMemcpyNodeSetParams(CUgraphNode node, const CUDA_MEMCPY3D* m) {
  return guard([&] {
    NEED_RT();
    if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    if (CUresult st = pack_copy(rt, *m, &p); st != CUDA_SUCCESS) return st;
    return set_params(nullptr, node, p, {});
  });
}
CUresult CUDAAPI cuGraphExecMemcpyNodeSetParams(CUgraphExec exec, CUgraphNode node, const CUDA_MEMCPY3D* m,
                                                CUcontext) {
  return guard([&] {
    NEED_RT();
    if (m == nullptr || exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    if (CUresult st = pack_copy(rt, *m, &p); st != CUDA_SUCCESS) return st;
    return set_params(exec, node, p, {});
  });
}

CUresult CUDAAPI cuGraphAddHostNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n,
                                    const CUDA_HOST_NODE_PARAMS* hp) {
  return guard([&] {
    if (hp == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    if (CUresult st = pack_host(hp->fn, hp->userData, &p); st != CUDA_SUCCESS) return st;
    return add_node(out, graph, deps, n, p, {});
  });
}
CUresult CUDAAPI cuGraphHostNodeGetParams(CUgraphNode node, CUDA_HOST_NODE_PARAMS* hp) {
  return guard([&] {
    if (hp == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    const CUresult st = get_params(node, &p, &packed);
    if (st != CUDA_SUCCESS) return st;
    if (p.type != CU_GRAPH_NODE_TYPE_HOST) return CUDA_ERROR_INVALID_VALUE;
    *hp = CUDA_HOST_NODE_PARAMS{};
    if (!ivcuda::guest::host_node_of(p.dst, &hp->fn, &hp->userData)) return CUDA_ERROR_UNKNOWN;
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphHostNodeSetParams(CUgraphNode node, const CUDA_HOST_NODE_PARAMS* hp) {
  return guard([&] {
    if (hp == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    if (CUresult st = pack_host(hp->fn, hp->userData, &p); st != CUDA_SUCCESS) return st;
    return set_params(nullptr, node, p, {});
  });
}
CUresult CUDAAPI cuGraphExecHostNodeSetParams(CUgraphExec exec, CUgraphNode node, const CUDA_HOST_NODE_PARAMS* hp) {
  return guard([&] {
    if (hp == nullptr || exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    if (CUresult st = pack_host(hp->fn, hp->userData, &p); st != CUDA_SUCCESS) return st;
    return set_params(exec, node, p, {});
  });
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

// The host's driver writes the DOT text (with the host's names for nodes and
// handles); the file is written here, where the caller named it.
CUresult CUDAAPI cuGraphDebugDotPrint(CUgraph graph, const char* path, unsigned int flags) {
  return guard([&] {
    if (path == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::int64_t n = 0;
    std::vector<std::byte> text;
    const CUresult st = query(proto::kQueryDot, h(graph), 0, &n, 0, flags, &text);
    if (st != CUDA_SUCCESS) return st;
    if (n < 0 || static_cast<std::uint64_t>(n) > text.size()) return CUDA_ERROR_UNKNOWN;
    std::FILE* f = std::fopen(path, "w");
    if (f == nullptr) return CUDA_ERROR_OPERATING_SYSTEM;
    const bool ok = std::fwrite(text.data(), 1, static_cast<std::size_t>(n), f) == static_cast<std::size_t>(n);
    return std::fclose(f) == 0 && ok ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
  });
}

// Kernel node attributes made of plain values travel as 16 bytes of the
// value union; the others (access-policy windows, events) are refused.
namespace {
CUresult kernel_attr(std::uint32_t kind, CUgraphNode node, CUgraphNode src, CUkernelNodeAttrID id,
                     const CUkernelNodeAttrValue* in, CUkernelNodeAttrValue* out) {
  return guard([&] {
    NEED_RT();
    proto::ReqGraphKernelAttr r{};
    r.ctx = current_ctx();
    r.node = h(node);
    r.src = h(src);
    r.kind = kind;
    r.attr.id = static_cast<proto::u32>(id);
    if (in != nullptr) std::memcpy(r.attr.value, in, sizeof r.attr.value);
    proto::LaunchAttr rep{};
    const CUresult st = rt->call<Op::kGraphKernelAttr>(r, {}, &rep);
    if (st == CUDA_ERROR_NOT_SUPPORTED)
      return ivcuda::guest::not_supported("kernel node attribute %d is not forwarded", static_cast<int>(id));
    if (st == CUDA_SUCCESS && out != nullptr) {
      *out = CUkernelNodeAttrValue{};
      std::memcpy(out, rep.value, sizeof rep.value);
    }
    return st;
  });
}
}  // namespace

CUresult CUDAAPI cuGraphKernelNodeGetAttribute(CUgraphNode node, CUkernelNodeAttrID id, CUkernelNodeAttrValue* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return kernel_attr(proto::kKernelAttrGet, node, nullptr, id, nullptr, out);
}
CUresult CUDAAPI cuGraphKernelNodeSetAttribute(CUgraphNode node, CUkernelNodeAttrID id,
                                               const CUkernelNodeAttrValue* in) {
  if (in == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return kernel_attr(proto::kKernelAttrSet, node, nullptr, id, in, nullptr);
}
CUresult CUDAAPI cuGraphKernelNodeCopyAttributes(CUgraphNode dst, CUgraphNode src) {
  return kernel_attr(proto::kKernelAttrCopy, dst, src, CU_LAUNCH_ATTRIBUTE_IGNORE, nullptr, nullptr);
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

CUresult CUDAAPI cuGraphConditionalHandleCreate(CUgraphConditionalHandle* out, CUgraph graph, CUcontext,
                                                 unsigned int default_value, unsigned int flags) {
  return guard([&] {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::int64_t v = 0;
    const CUresult st = query(proto::kQueryCondHandle, h(graph), 0, &v, default_value, flags);
    if (st == CUDA_SUCCESS) *out = static_cast<CUgraphConditionalHandle>(v);
    return st;
  });
}

CUresult CUDAAPI cuGraphAddMemAllocNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n,
                                        CUDA_MEM_ALLOC_NODE_PARAMS* a) {
  return guard([&] { return add_mem_alloc(out, graph, deps, n, a); });
}
CUresult CUDAAPI cuGraphAddMemFreeNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n,
                                       CUdeviceptr dptr) {
  return guard([&] {
    proto::GraphNodeParams p{};
    p.type = CU_GRAPH_NODE_TYPE_MEM_FREE;
    p.dst = dptr;
    return add_node(out, graph, deps, n, p, {});
  });
}
CUresult CUDAAPI cuGraphMemFreeNodeGetParams(CUgraphNode node, CUdeviceptr* dptr) {
  return guard([&] {
    if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    const CUresult st = get_params(node, &p, &packed);
    if (st != CUDA_SUCCESS) return st;
    if (p.type != CU_GRAPH_NODE_TYPE_MEM_FREE) return CUDA_ERROR_INVALID_VALUE;
    *dptr = p.dst;
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS* a) {
  return guard([&] {
    NEED_RT();
    if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    const CUresult st = get_params(node, &p, &packed);
    if (st != CUDA_SUCCESS) return st;
    if (p.type != CU_GRAPH_NODE_TYPE_MEM_ALLOC || packed.size() < sizeof(proto::MemAllocNode))
      return CUDA_ERROR_INVALID_VALUE;
    proto::MemAllocNode m;
    std::memcpy(&m, packed.data(), sizeof m);
    if (packed.size() < sizeof m + m.access_count * sizeof(proto::MemAccess)) return CUDA_ERROR_UNKNOWN;
    // Locations come back in the application's device numbering.
    const auto loc = [&](std::uint32_t type, std::int32_t id, CUmemLocation* l) {
      l->type = static_cast<CUmemLocationType>(type);
      l->id = type == CU_MEM_LOCATION_TYPE_DEVICE ? app_ordinal(rt, id) : id;
      return CUDA_SUCCESS;
    };
    AllocDescCache& cache = alloc_desc_cache();
    std::lock_guard lk(cache.mu);
    auto& descs = cache.by_node[h(node)];
    descs.assign(m.access_count, CUmemAccessDesc{});
    const auto access = std::span(packed).subspan(sizeof m);
    (void)codec::mem_alloc_from_wire(m, access, codec::trusted_enum, loc, a, descs.data());
    a->bytesize = p.width;
    a->dptr = p.dst;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphAddEmptyNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n) {
  return guard([&] {
    proto::GraphNodeParams p{};
    p.type = CU_GRAPH_NODE_TYPE_EMPTY;
    return add_node(out, graph, deps, n, p, {});
  });
}

CUresult CUDAAPI cuGraphAddChildGraphNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n,
                                          CUgraph child) {
  return guard([&] {
    proto::GraphNodeParams p{};
    p.type = CU_GRAPH_NODE_TYPE_GRAPH;
    p.handle = h(child);
    return add_node(out, graph, deps, n, p, {});
  });
}
CUresult CUDAAPI cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph* child) {
  return guard([&] {
    if (child == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::int64_t v = 0;
    const CUresult st = query(proto::kQueryChildGraph, h(node), 0, &v);
    if (st == CUDA_SUCCESS) *child = reinterpret_cast<CUgraph>(v);
    return st;
  });
}
CUresult CUDAAPI cuGraphExecChildGraphNodeSetParams(CUgraphExec exec, CUgraphNode node, CUgraph child) {
  return guard([&] {
    if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    p.type = CU_GRAPH_NODE_TYPE_GRAPH;
    p.handle = h(child);
    return set_params(exec, node, p, {});
  });
}

CUresult CUDAAPI cuGraphAddEventRecordNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n,
                                           CUevent ev) {
  return event_add(out, graph, deps, n, ev, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
}
CUresult CUDAAPI cuGraphAddEventWaitNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n,
                                         CUevent ev) {
  return event_add(out, graph, deps, n, ev, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}
CUresult CUDAAPI cuGraphEventRecordNodeGetEvent(CUgraphNode node, CUevent* ev) {
  return event_get(node, ev, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
}
CUresult CUDAAPI cuGraphEventWaitNodeGetEvent(CUgraphNode node, CUevent* ev) {
  return event_get(node, ev, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}
CUresult CUDAAPI cuGraphEventRecordNodeSetEvent(CUgraphNode node, CUevent ev) {
  return event_set(nullptr, node, ev, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
}
CUresult CUDAAPI cuGraphEventWaitNodeSetEvent(CUgraphNode node, CUevent ev) {
  return event_set(nullptr, node, ev, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}
CUresult CUDAAPI cuGraphExecEventRecordNodeSetEvent(CUgraphExec exec, CUgraphNode node, CUevent ev) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return event_set(exec, node, ev, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
}
CUresult CUDAAPI cuGraphExecEventWaitNodeSetEvent(CUgraphExec exec, CUgraphNode node, CUevent ev) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return event_set(exec, node, ev, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}

CUresult CUDAAPI cuGraphAddNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n,
                                CUgraphNodeParams* g) {
  return guard([&] {
    NEED_RT();
    if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (g->type == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
      const CUDA_CONDITIONAL_NODE_PARAMS& cp = g->conditional;
      if (cp.size == 0 || cp.size > proto::kMaxCondBodies || cp.phGraph_out == nullptr) return CUDA_ERROR_INVALID_VALUE;
      proto::GraphNodeParams p{};
      p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
      p.handle = cp.handle;
      p.value = static_cast<proto::u32>(cp.type);
      p.elem_size = cp.size;
      std::vector<std::uint64_t> bodies(cp.size);
      const CUresult st = add_node(out, graph, deps, n, p, {}, bodies.data(), cp.size);
      if (st == CUDA_SUCCESS)
        for (unsigned i = 0; i < cp.size; ++i) cp.phGraph_out[i] = reinterpret_cast<CUgraph>(bodies[i]);
      return st;
    }
    if (g->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
      CUDA_MEM_ALLOC_NODE_PARAMS a{};
      a.poolProps = g->alloc.poolProps;
      a.accessDescs = g->alloc.accessDescs;
      a.accessDescCount = g->alloc.accessDescCount;
      a.bytesize = g->alloc.bytesize;
      const CUresult st = add_mem_alloc(out, graph, deps, n, &a);
      if (st == CUDA_SUCCESS) g->alloc.dptr = a.dptr;
      return st;
    }
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    if (CUresult st = pack_generic(rt, *g, &p, &packed); st != CUDA_SUCCESS) return st;
    return add_node(out, graph, deps, n, p, packed);
  });
}
// Edge data other than the default is set by adding the edges after the node.
CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps,
                                   const CUgraphEdgeData* data, size_t n, CUgraphNodeParams* g) {
  if (default_edges(data, n)) return cuGraphAddNode(out, graph, deps, n, g);
  CUresult st = cuGraphAddNode(out, graph, nullptr, 0, g);
  if (st != CUDA_SUCCESS) return st;
  std::vector<CUgraphNode> to(n, *out);
  st = guard([&] { return edges(graph, deps, to.data(), data, n, false); });
  if (st != CUDA_SUCCESS) {
    (void)cuGraphDestroyNode(*out);
    *out = nullptr;
  }
  return st;
}
CUresult CUDAAPI cuGraphNodeSetParams(CUgraphNode node, CUgraphNodeParams* g) {
  return guard([&] {
    NEED_RT();
    if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    if (CUresult st = pack_generic(rt, *g, &p, &packed); st != CUDA_SUCCESS) return st;
    return set_params(nullptr, node, p, packed);
  });
}
CUresult CUDAAPI cuGraphExecNodeSetParams(CUgraphExec exec, CUgraphNode node, CUgraphNodeParams* g) {
  return guard([&] {
    NEED_RT();
    if (g == nullptr || exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    if (CUresult st = pack_generic(rt, *g, &p, &packed); st != CUDA_SUCCESS) return st;
    return set_params(exec, node, p, packed);
  });
}

CUresult CUDAAPI cuGraphGetNodes(CUgraph graph, CUgraphNode* nodes, size_t* count) {
  return guard([&] { return list(proto::kQueryNodes, h(graph), nodes, nullptr, nullptr, count); });
}
CUresult CUDAAPI cuGraphGetRootNodes(CUgraph graph, CUgraphNode* nodes, size_t* count) {
  return guard([&] { return list(proto::kQueryRoots, h(graph), nodes, nullptr, nullptr, count); });
}
CUresult CUDAAPI cuGraphGetEdges(CUgraph graph, CUgraphNode* from, CUgraphNode* to, size_t* count) {
  return guard([&] { return list(proto::kQueryEdges, h(graph), from, to, nullptr, count); });
}
CUresult CUDAAPI cuGraphGetEdges_v2(CUgraph graph, CUgraphNode* from, CUgraphNode* to, CUgraphEdgeData* data,
                                    size_t* count) {
  return guard([&] { return list(proto::kQueryEdges, h(graph), from, to, data, count); });
}
CUresult CUDAAPI cuGraphNodeGetDependencies(CUgraphNode node, CUgraphNode* deps, size_t* count) {
  return guard([&] { return list(proto::kQueryDeps, h(node), deps, nullptr, nullptr, count); });
}
CUresult CUDAAPI cuGraphNodeGetDependencies_v2(CUgraphNode node, CUgraphNode* deps, CUgraphEdgeData* data,
                                               size_t* count) {
  return guard([&] { return list(proto::kQueryDeps, h(node), deps, nullptr, data, count); });
}
CUresult CUDAAPI cuGraphNodeGetDependentNodes(CUgraphNode node, CUgraphNode* deps, size_t* count) {
  return guard([&] { return list(proto::kQueryDependents, h(node), deps, nullptr, nullptr, count); });
}
CUresult CUDAAPI cuGraphNodeGetDependentNodes_v2(CUgraphNode node, CUgraphNode* deps, CUgraphEdgeData* data,
                                                 size_t* count) {
  return guard([&] { return list(proto::kQueryDependents, h(node), deps, nullptr, data, count); });
}

CUresult CUDAAPI cuGraphAddDependencies(CUgraph graph, const CUgraphNode* from, const CUgraphNode* to, size_t n) {
  return guard([&] { return edges(graph, from, to, nullptr, n, false); });
}
CUresult CUDAAPI cuGraphAddDependencies_v2(CUgraph graph, const CUgraphNode* from, const CUgraphNode* to,
                                           const CUgraphEdgeData* data, size_t n) {
  return guard([&] { return edges(graph, from, to, data, n, false); });
}
CUresult CUDAAPI cuGraphRemoveDependencies(CUgraph graph, const CUgraphNode* from, const CUgraphNode* to, size_t n) {
  return guard([&] { return edges(graph, from, to, nullptr, n, true); });
}
CUresult CUDAAPI cuGraphRemoveDependencies_v2(CUgraph graph, const CUgraphNode* from, const CUgraphNode* to,
                                              const CUgraphEdgeData* data, size_t n) {
  return guard([&] { return edges(graph, from, to, data, n, true); });
}

CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType* type) {
  return guard([&] {
    if (type == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::int64_t v = 0;
    const CUresult st = query(proto::kQueryType, h(node), 0, &v);
    if (st == CUDA_SUCCESS) *type = static_cast<CUgraphNodeType>(v);
    return st;
  });
}

CUresult CUDAAPI cuGraphDestroyNode(CUgraphNode node) {
  return guard([&] {
    const CUresult st = query(proto::kQueryDestroyNode, h(node), 0, nullptr);
    if (st == CUDA_SUCCESS) {
      KernelArgsCache& cache = kernel_args_cache();
      std::lock_guard lk(cache.mu);
      cache.by_node.erase(h(node));
    }
    return st;
  });
}

CUresult CUDAAPI cuGraphClone(CUgraph* clone, CUgraph graph) {
  return guard([&] {
    if (clone == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::int64_t v = 0;
    const CUresult st = query(proto::kQueryClone, h(graph), 0, &v);
    if (st == CUDA_SUCCESS) *clone = reinterpret_cast<CUgraph>(v);
    return st;
  });
}

CUresult CUDAAPI cuGraphNodeFindInClone(CUgraphNode* found, CUgraphNode original, CUgraph clone) {
  return guard([&] {
    if (found == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::int64_t v = 0;
    const CUresult st = query(proto::kQueryFindInClone, h(original), h(clone), &v);
    if (st == CUDA_SUCCESS) *found = node_of(static_cast<std::uint64_t>(v));
    return st;
  });
}

CUresult CUDAAPI cuGraphExecGetFlags(CUgraphExec exec, cuuint64_t* flags) {
  return guard([&] {
    if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::int64_t v = 0;
    const CUresult st = query(proto::kQueryExecFlags, h(exec), 0, &v);
    if (st == CUDA_SUCCESS) *flags = static_cast<cuuint64_t>(v);
    return st;
  });
}

CUresult CUDAAPI cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph graph, CUgraphExecUpdateResultInfo* info) {
  return guard([&] {
    if (info == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::int64_t v = 0;
    std::vector<std::byte> extra;
    const CUresult st = query(proto::kQueryExecUpdate, h(exec), h(graph), &v, 0, 0, &extra);
    std::uint64_t err[2] = {0, 0};
    if (extra.size() >= sizeof err) std::memcpy(err, extra.data(), sizeof err);
    info->result = static_cast<CUgraphExecUpdateResult>(v);
    info->errorNode = node_of(err[0]);
    info->errorFromNode = node_of(err[1]);
    return st;
  });
}
CUresult CUDAAPI cuGraphExecUpdate(CUgraphExec exec, CUgraph graph, CUgraphNode* err_node,
                                   CUgraphExecUpdateResult* result) {
  if (err_node == nullptr || result == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUgraphExecUpdateResultInfo info{};
  const CUresult st = cuGraphExecUpdate_v2(exec, graph, &info);
  *err_node = info.errorNode;
  *result = info.result;
  return st;
}

CUresult CUDAAPI cuGraphNodeSetEnabled(CUgraphExec exec, CUgraphNode node, unsigned int enabled) {
  return guard([&] { return query(proto::kQuerySetEnabled, h(exec), h(node), nullptr, enabled != 0 ? 1 : 0); });
}
CUresult CUDAAPI cuGraphNodeGetEnabled(CUgraphExec exec, CUgraphNode node, unsigned int* enabled) {
  return guard([&] {
    if (enabled == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::int64_t v = 0;
    const CUresult st = query(proto::kQueryGetEnabled, h(exec), h(node), &v);
    if (st == CUDA_SUCCESS) *enabled = static_cast<unsigned>(v);
    return st;
  });
}

bool ivcuda::guest::any_capture() noexcept {
  // Pairs with the release stores above: a capture begun before this call
  // (on any thread that synchronised with this one) is seen.
  return captures().open.load(std::memory_order_acquire) != 0;
}
