// Editing graphs: node parameters read back and set, on a node or on an
// executable graph's copy of it (kernels, memsets, copies, host functions,
// events, child graphs, cuGraphNodeSetParams' generic form), kernel node
// attributes, executable graphs updated from a graph and nodes enabled in
// them. Parameters are packed as graph_build.cc packs them for an add; the
// worker's side is host-daemon/worker/graph_edit.cc.
#define __CUDA_API_VERSION_INTERNAL
#include <cuda.h>

#include <cstring>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "guest/graph_internal.h"
#include "guest/graphs.h"
#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"

using namespace ivcuda::guest::graphs;  // graph_internal.h: the names the graph files share

namespace {

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

// A worker's device ordinal as the application numbers it (-1: none).
int app_ordinal(Runtime* rt, int worker) {
  for (int i = 0; i < rt->device_count(); ++i)
    if (rt->to_worker(i) == worker) return i;
  return -1;
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

// The parameters of a node that must be of type `type`.
CUresult get_typed(CUgraphNode node, CUgraphNodeType type, proto::GraphNodeParams* p,
                   std::vector<std::byte>* packed) {
  if (CUresult st = get_params(node, p, packed); st != CUDA_SUCCESS) return st;
  return p->type == static_cast<proto::u32>(type) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
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
    if (CUresult st = get_typed(node, CU_GRAPH_NODE_TYPE_KERNEL, &p, &packed); st != CUDA_SUCCESS) return st;
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

template <class P>
CUresult kernel_set(CUgraphExec exec, CUgraphNode node, const P* in, CUfunction f) {
  return guard([&] {
    NEED_RT();
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    if (CUresult st = pack_kernel(rt, in, f, &p, &packed); st != CUDA_SUCCESS) return st;
    return set_params(exec, node, p, packed);
  });
}

CUresult event_get(CUgraphNode node, CUevent* ev, CUgraphNodeType want) {
  return guard([&] {
    if (ev == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    if (CUresult st = get_typed(node, want, &p, &packed); st != CUDA_SUCCESS) return st;
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

// Where a set goes: the node itself, or an executable graph's copy of it
// (whose exec must be given). Each kind's set checks its arguments in the
// order its two calls did.
enum class Target { kNode, kExec };

CUresult memset_set(Target to, CUgraphExec exec, CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS* m) {
  return guard([&] {
    if (m == nullptr || (to == Target::kExec && exec == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    codec::memset_to_wire(*m, &p);
    return set_params(exec, node, p, {});
  });
}

CUresult copy_set(Target to, CUgraphExec exec, CUgraphNode node, const CUDA_MEMCPY3D* m) {
  return guard([&] {
    NEED_RT();
    if (m == nullptr || (to == Target::kExec && exec == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    if (CUresult st = pack_copy(rt, *m, &p); st != CUDA_SUCCESS) return st;
    return set_params(exec, node, p, {});
  });
}

CUresult host_set(Target to, CUgraphExec exec, CUgraphNode node, const CUDA_HOST_NODE_PARAMS* hp) {
  return guard([&] {
    if (hp == nullptr || (to == Target::kExec && exec == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    if (CUresult st = pack_host(hp->fn, hp->userData, &p); st != CUDA_SUCCESS) return st;
    return set_params(exec, node, p, {});
  });
}

CUresult generic_set(Target to, CUgraphExec exec, CUgraphNode node, const CUgraphNodeParams* g) {
  return guard([&] {
    NEED_RT();
    if (g == nullptr || (to == Target::kExec && exec == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    if (CUresult st = pack_generic(rt, *g, &p, &packed); st != CUDA_SUCCESS) return st;
    return set_params(exec, node, p, packed);
  });
}
}  // namespace

void ivcuda::guest::graphs::forget_kernel_args(std::uint64_t node) {
  KernelArgsCache& cache = kernel_args_cache();
  std::lock_guard lk(cache.mu);
  cache.by_node.erase(node);
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

CUresult CUDAAPI cuGraphMemsetNodeGetParams(CUgraphNode node, CUDA_MEMSET_NODE_PARAMS* m) {
  return guard([&] {
    if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    if (CUresult st = get_typed(node, CU_GRAPH_NODE_TYPE_MEMSET, &p, &packed); st != CUDA_SUCCESS) return st;
    *m = codec::memset_from_wire(p);
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphMemsetNodeSetParams(CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS* m) {
  return memset_set(Target::kNode, nullptr, node, m);
}
CUresult CUDAAPI cuGraphExecMemsetNodeSetParams(CUgraphExec exec, CUgraphNode node, const CUDA_MEMSET_NODE_PARAMS* m,
                                                CUcontext) {
  return memset_set(Target::kExec, exec, node, m);
}

CUresult CUDAAPI cuGraphMemcpyNodeGetParams(CUgraphNode node, CUDA_MEMCPY3D* m) {
  return guard([&] {
    NEED_RT();
    if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    if (CUresult st = get_typed(node, CU_GRAPH_NODE_TYPE_MEMCPY, &p, &packed); st != CUDA_SUCCESS) return st;
    *m = unpack_copy(rt, p);
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphMemcpyNodeSetParams(CUgraphNode node, const CUDA_MEMCPY3D* m) {
  return copy_set(Target::kNode, nullptr, node, m);
}
CUresult CUDAAPI cuGraphExecMemcpyNodeSetParams(CUgraphExec exec, CUgraphNode node, const CUDA_MEMCPY3D* m,
                                                CUcontext) {
  return copy_set(Target::kExec, exec, node, m);
}

CUresult CUDAAPI cuGraphHostNodeGetParams(CUgraphNode node, CUDA_HOST_NODE_PARAMS* hp) {
  return guard([&] {
    if (hp == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    if (CUresult st = get_typed(node, CU_GRAPH_NODE_TYPE_HOST, &p, &packed); st != CUDA_SUCCESS) return st;
    *hp = CUDA_HOST_NODE_PARAMS{};
    if (!ivcuda::guest::host_node_of(p.dst, &hp->fn, &hp->userData)) return CUDA_ERROR_UNKNOWN;
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphHostNodeSetParams(CUgraphNode node, const CUDA_HOST_NODE_PARAMS* hp) {
  return host_set(Target::kNode, nullptr, node, hp);
}
CUresult CUDAAPI cuGraphExecHostNodeSetParams(CUgraphExec exec, CUgraphNode node, const CUDA_HOST_NODE_PARAMS* hp) {
  return host_set(Target::kExec, exec, node, hp);
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

CUresult CUDAAPI cuGraphExecChildGraphNodeSetParams(CUgraphExec exec, CUgraphNode node, CUgraph child) {
  return guard([&] {
    if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    p.type = CU_GRAPH_NODE_TYPE_GRAPH;
    p.handle = h(child);
    return set_params(exec, node, p, {});
  });
}

CUresult CUDAAPI cuGraphMemFreeNodeGetParams(CUgraphNode node, CUdeviceptr* dptr) {
  return guard([&] {
    if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::GraphNodeParams p{};
    std::vector<std::byte> packed;
    if (CUresult st = get_typed(node, CU_GRAPH_NODE_TYPE_MEM_FREE, &p, &packed); st != CUDA_SUCCESS) return st;
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
    if (CUresult st = get_typed(node, CU_GRAPH_NODE_TYPE_MEM_ALLOC, &p, &packed); st != CUDA_SUCCESS) return st;
    if (packed.size() < sizeof(proto::MemAllocNode)) return CUDA_ERROR_INVALID_VALUE;
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

CUresult CUDAAPI cuGraphNodeSetParams(CUgraphNode node, CUgraphNodeParams* g) {
  return generic_set(Target::kNode, nullptr, node, g);
}
CUresult CUDAAPI cuGraphExecNodeSetParams(CUgraphExec exec, CUgraphNode node, CUgraphNodeParams* g) {
  return generic_set(Target::kExec, exec, node, g);
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
  return guard([&] { return ask(proto::kQueryGetEnabled, h(exec), h(node), enabled); });
}
