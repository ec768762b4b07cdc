// Building graphs: graphs made and destroyed, nodes of each kind added
// (kernels, memsets, copies, host functions, events, child graphs, memory
// allocations and frees, empty and conditional nodes, cuGraphAddNode's
// generic form), edges, the lists and questions about a graph's shape,
// clones and the DOT text. How a node's parameters travel is here too, for
// graph_edit.cc's sets as well. The worker's side is
// host-daemon/worker/graph_build.cc.
//
// Nodes are host handles, as graphs are; a CUgraphNode here is that handle.
// Parameters travel in one form (proto::GraphNodeParams, ivcuda/graph_codec.h):
// kernels packed by the layout the guest learned when it looked the function
// up, as for a launch; memory as device addresses, or as arena offsets for
// page-locked memory. Pageable host memory cannot be part of a graph that
// runs on the host: a memcpy node naming it is refused with
// CUDA_ERROR_NOT_SUPPORTED.
#define __CUDA_API_VERSION_INTERNAL
#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "guest/graph_internal.h"
#include "guest/graphs.h"
#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"

using namespace ivcuda::guest::graphs;  // graph_internal.h: the names the graph files share

namespace {

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

}  // namespace

namespace ivcuda::guest::graphs {

CUresult query(std::uint32_t kind, std::uint64_t handle, std::uint64_t other, std::int64_t* value,
               std::uint64_t capacity, std::uint32_t flags, std::vector<std::byte>* extra) {
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

CUresult pack_copy(Runtime* rt, const CUDA_MEMCPY3D& m, proto::GraphNodeParams* out) {
  out->type = CU_GRAPH_NODE_TYPE_MEMCPY;
  if (m.WidthInBytes == 0 || m.Height == 0 || m.Depth == 0) return CUDA_ERROR_INVALID_VALUE;
  return codec::copy_to_wire(m, out, [&](CUmemorytype type, CUdeviceptr dev, const void* host, proto::CopyEnd* e) {
    return pack_copy_end(rt, type, dev, host, m, e);
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
      return pack_kernel(rt, &g.kernel, kernel_of(g.kernel), p, packed);
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

// The tail of an add or set: the parameters, then a kernel's packed arguments.
std::vector<std::byte> params_tail(const proto::GraphNodeParams& p, const std::vector<std::byte>& packed) {
  std::vector<std::byte> t(sizeof p + packed.size());
  std::memcpy(t.data(), &p, sizeof p);
  if (!packed.empty()) std::memcpy(t.data() + sizeof p, packed.data(), packed.size());
  return t;
}

}  // namespace ivcuda::guest::graphs

namespace {

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

template <class P>
CUresult kernel_add(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n, const P* in, CUfunction f) {
  return guard([&] {
    NEED_RT();
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    if (CUresult st = pack_kernel(rt, in, f, &p, &packed); st != CUDA_SUCCESS) return st;
    return add_node(out, graph, deps, n, p, packed);
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

CUresult CUDAAPI cuGraphDestroy(CUgraph graph) {
  return guard([&] {
    NEED_RT();
    return rt->call<Op::kGraphDestroy>(proto::ReqHandle{current_ctx(), h(graph)});
  });
}

CUresult CUDAAPI cuGraphAddKernelNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n,
                                      const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  return kernel_add(out, graph, deps, n, p, p != nullptr ? p->func : nullptr);
}
CUresult CUDAAPI cuGraphAddKernelNode_v2(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n,
                                         const CUDA_KERNEL_NODE_PARAMS_v2* p) {
  return kernel_add(out, graph, deps, n, p, p != nullptr ? kernel_of(*p) : nullptr);
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

CUresult CUDAAPI cuGraphAddHostNode(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps, size_t n,
                                    const CUDA_HOST_NODE_PARAMS* hp) {
  return guard([&] {
    if (hp == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    if (CUresult st = pack_host(hp->fn, hp->userData, &p); st != CUDA_SUCCESS) return st;
    return add_node(out, graph, deps, n, p, {});
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

CUresult CUDAAPI cuGraphConditionalHandleCreate(CUgraphConditionalHandle* out, CUgraph graph, CUcontext,
                                                 unsigned int default_value, unsigned int flags) {
  return guard([&] { return ask(proto::kQueryCondHandle, h(graph), 0, out, default_value, flags); });
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
  return guard([&] { return ask(proto::kQueryType, h(node), 0, type); });
}

CUresult CUDAAPI cuGraphDestroyNode(CUgraphNode node) {
  return guard([&] {
    const CUresult st = query(proto::kQueryDestroyNode, h(node), 0, nullptr);
    if (st == CUDA_SUCCESS) ivcuda::guest::graphs::forget_kernel_args(h(node));
    return st;
  });
}

CUresult CUDAAPI cuGraphClone(CUgraph* clone, CUgraph graph) {
  return guard([&] { return ask(proto::kQueryClone, h(graph), 0, clone); });
}

CUresult CUDAAPI cuGraphNodeFindInClone(CUgraphNode* found, CUgraphNode original, CUgraph clone) {
  return guard([&] { return ask(proto::kQueryFindInClone, h(original), h(clone), found); });
}

CUresult CUDAAPI cuGraphChildGraphNodeGetGraph(CUgraphNode node, CUgraph* child) {
  return guard([&] { return ask(proto::kQueryChildGraph, h(node), 0, child); });
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
