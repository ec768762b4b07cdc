// Editing graphs: node parameters read back (in the guest's terms: its
// function and event handles, arena offsets, its device numbering) and set,
// on a node or on an executable graph's copy of it; kernel node attributes;
// executable graphs updated from a graph and nodes enabled in them. What a
// set names is checked as an add's is (graph_build.cc). The guest's side is
// guest/graph_edit.cc.
#include <algorithm>
#include <cstring>
#include <vector>

#include "host-daemon/worker/graph_internal.h"
#include "host-daemon/worker/worker_internal.h"
#include "ivcuda/graph_codec.h"

namespace ivcuda::host {

using namespace ivcuda::proto;
using graphs::host_node_call;
using graphs::kernel_args;
using graphs::KernelArgs;

CUresult Worker::set_node_params(NodeEntry& n, CUgraphExec exec, const GraphNodeParams& p,
                                 std::span<const std::byte> packed) {
  CUgraphNodeType type;
  if (CUresult st = cu_.cuGraphNodeGetType(n.real, &type); st != CUDA_SUCCESS) return st;
  if (static_cast<std::uint32_t>(type) != p.type) return CUDA_ERROR_INVALID_VALUE;
  switch (p.type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      KernelArgs k;
      if (CUresult st = kernel_args(funcs_.find(p.handle), p, packed, &k); st != CUDA_SUCCESS) return st;
      return exec != nullptr ? cu_.cuGraphExecKernelNodeSetParams(exec, n.real, &k.params)
                             : cu_.cuGraphKernelNodeSetParams(n.real, &k.params);
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      CUDA_MEMSET_NODE_PARAMS m;
      if (CUresult st = to_driver_memset(p, &m); st != CUDA_SUCCESS) return st;
      return exec != nullptr ? cu_.cuGraphExecMemsetNodeSetParams(exec, n.real, &m, current_)
                             : cu_.cuGraphMemsetNodeSetParams(n.real, &m);
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: {
      CUDA_MEMCPY3D m;
      if (CUresult st = to_driver_copy(p, &m); st != CUDA_SUCCESS) return st;
      return exec != nullptr ? cu_.cuGraphExecMemcpyNodeSetParams(exec, n.real, &m, current_)
                             : cu_.cuGraphMemcpyNodeSetParams(n.real, &m);
    }
    case CU_GRAPH_NODE_TYPE_GRAPH: {
      if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;  // a child's graph is edited in place
      GraphEntry* child = graphs_.find(p.handle);
      if (child == nullptr) return CUDA_ERROR_INVALID_VALUE;
      return cu_.cuGraphExecChildGraphNodeSetParams(exec, n.real, child->real);
    }
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: {
      EventEntry* e = events_.find(p.handle);
      if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      const bool rec = p.type == CU_GRAPH_NODE_TYPE_EVENT_RECORD;
      if (exec != nullptr)
        return rec ? cu_.cuGraphExecEventRecordNodeSetEvent(exec, n.real, e->real)
                   : cu_.cuGraphExecEventWaitNodeSetEvent(exec, n.real, e->real);
      return rec ? cu_.cuGraphEventRecordNodeSetEvent(n.real, e->real) : cu_.cuGraphEventWaitNodeSetEvent(n.real, e->real);
    }
    case CU_GRAPH_NODE_TYPE_HOST: {
      CUDA_HOST_NODE_PARAMS hp;
      if (CUresult st = host_node_params(p, &hp); st != CUDA_SUCCESS) return st;
      return exec != nullptr ? cu_.cuGraphExecHostNodeSetParams(exec, n.real, &hp)
                             : cu_.cuGraphHostNodeSetParams(n.real, &hp);
    }
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

CUresult Worker::get_node_params(NodeEntry& n, Call& c) {
  GraphNodeParams p{};
  CUgraphNodeType type;
  if (CUresult st = cu_.cuGraphNodeGetType(n.real, &type); st != CUDA_SUCCESS) return st;
  p.type = static_cast<std::uint32_t>(type);
  std::vector<std::byte> packed;
  CUresult st = CUDA_SUCCESS;
  switch (type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: st = kernel_node_to_wire(n.real, &p, &packed); break;
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      CUDA_MEMSET_NODE_PARAMS m{};
      if ((st = cu_.cuGraphMemsetNodeGetParams(n.real, &m)) == CUDA_SUCCESS) codec::memset_to_wire(m, &p);
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: st = copy_node_to_wire(n.real, &p); break;
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: st = event_node_to_wire(n.real, &p); break;
    case CU_GRAPH_NODE_TYPE_MEM_FREE: {
      CUdeviceptr dp = 0;
      if ((st = cu_.cuGraphMemFreeNodeGetParams(n.real, &dp)) == CUDA_SUCCESS) p.dst = dp;
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: st = alloc_node_to_wire(n.real, &p, &packed); break;
    case CU_GRAPH_NODE_TYPE_HOST: st = host_node_to_wire(n.real, &p); break;
    default:
      break;  // the type alone
  }
  if (st != CUDA_SUCCESS) return st;
  c.set_reply(p);
  if (!packed.empty()) c.append(packed.data(), packed.size());
  return CUDA_SUCCESS;
}

// The guest knows functions by its handles: the one it looked up, with the
// arguments packed by that function's layout.
CUresult Worker::kernel_node_to_wire(CUgraphNode node, GraphNodeParams* p, std::vector<std::byte>* packed) {
  CUDA_KERNEL_NODE_PARAMS k{};
  if (CUresult st = cu_.cuGraphKernelNodeGetParams(node, &k); st != CUDA_SUCCESS) return st;
  std::uint64_t fh = 0;
  FuncEntry* fe = nullptr;
  funcs_.for_each([&](std::uint64_t h, FuncEntry& f) {
    if (fh == 0 && f.real == k.func) {
      fh = h;
      fe = &f;
    }
  });
  if (fe == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  p->handle = fh;
  codec::kernel_to_wire(k, p);
  p->param_bytes = fe->param_bytes;
  packed->resize(fe->param_bytes);
  if (k.kernelParams != nullptr) {
    for (std::size_t i = 0; i < fe->params.size(); ++i)
      std::memcpy(packed->data() + fe->params[i].offset, k.kernelParams[i], fe->params[i].size);
  } else if (!fe->params.empty()) {
    return CUDA_ERROR_NOT_SUPPORTED;  // parameters the driver holds as an `extra` buffer
  }
  return CUDA_SUCCESS;
}

// Host ends are arena memory (nothing else can be given or captured): the
// guest gets them back as BAR offsets.
CUresult Worker::copy_node_to_wire(CUgraphNode node, GraphNodeParams* p) {
  CUDA_MEMCPY3D m{};
  if (CUresult st = cu_.cuGraphMemcpyNodeGetParams(node, &m); st != CUDA_SUCCESS) return st;
  const auto end = [&](CUmemorytype t, CUdeviceptr dev, const void* host, CopyEnd* e) {
    const auto* hp = static_cast<const std::byte*>(host);
    const bool in_bar = hp >= bar_.data() && hp < bar_.data() + bar_.size();
    if ((t == CU_MEMORYTYPE_HOST || t == CU_MEMORYTYPE_UNIFIED) && in_bar) {
      e->type = CU_MEMORYTYPE_HOST;
      e->addr = static_cast<std::uint64_t>(hp - bar_.data());
    } else if (t == CU_MEMORYTYPE_DEVICE || t == CU_MEMORYTYPE_UNIFIED) {
      e->type = CU_MEMORYTYPE_DEVICE;
      e->addr = t == CU_MEMORYTYPE_DEVICE ? dev : reinterpret_cast<std::uint64_t>(host);
    } else {
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_SUCCESS;
  };
  return codec::copy_to_wire(m, p, end);
}

CUresult Worker::event_node_to_wire(CUgraphNode node, GraphNodeParams* p) {
  CUevent ev = nullptr;
  const CUresult st = p->type == CU_GRAPH_NODE_TYPE_EVENT_RECORD ? cu_.cuGraphEventRecordNodeGetEvent(node, &ev)
                                                                 : cu_.cuGraphEventWaitNodeGetEvent(node, &ev);
  if (st != CUDA_SUCCESS) return st;
  events_.for_each([&](std::uint64_t h, EventEntry& e) {
    if (p->handle == 0 && e.real == ev) p->handle = h;
  });
  return CUDA_SUCCESS;
}

// Locations go back in the guest's device numbering.
CUresult Worker::alloc_node_to_wire(CUgraphNode node, GraphNodeParams* p, std::vector<std::byte>* packed) {
  CUDA_MEM_ALLOC_NODE_PARAMS a{};
  if (CUresult st = cu_.cuGraphMemAllocNodeGetParams(node, &a); st != CUDA_SUCCESS) return st;
  p->dst = a.dptr;
  p->width = a.bytesize;
  const auto guest_id = [&](const CUmemLocation& l) {
    if (l.type != CU_MEM_LOCATION_TYPE_DEVICE) return l.id;
    for (std::size_t i = 0; i < devices_.size(); ++i)
      if (static_cast<int>(devices_[i]) == l.id) return static_cast<int>(i);
    return -1;
  };
  const auto location = [&](const CUmemLocation& l, std::uint32_t* type, std::int32_t* id) {
    *type = l.type;
    *id = guest_id(l);
    return CUDA_SUCCESS;
  };
  return codec::mem_alloc_to_wire(a, location, packed);
}

// Only a node of this worker's host nodes has a pair, the guest's BAR offset.
CUresult Worker::host_node_to_wire(CUgraphNode node, GraphNodeParams* p) {
  CUDA_HOST_NODE_PARAMS hp{};
  if (CUresult st = cu_.cuGraphHostNodeGetParams(node, &hp); st != CUDA_SUCCESS) return st;
  const auto* slot = static_cast<const HostNodeSlot*>(hp.userData);
  auto it = hp.fn == host_node_call ? host_slots_.find(slot->off) : host_slots_.end();
  if (it == host_slots_.end() || it->second.get() != slot) return CUDA_ERROR_NOT_SUPPORTED;
  p->dst = slot->off;
  return CUDA_SUCCESS;
}

CUresult Worker::on_GraphNodeParams(Call& c) {
  const auto r = c.req<ReqGraphNodeParams>();
  const auto tail = c.tail<ReqGraphNodeParams>();
  NodeEntry* n = nullptr;
  if (CUresult st = node_in_ctx(r.node, &n); st != CUDA_SUCCESS) return st;
  if (r.kind == kNodeParamsGet) return get_node_params(*n, c);
  CUgraphExec exec = nullptr;
  if (r.kind == kNodeParamsExecSet) {
    ExecEntry* e = execs_.find(r.exec);
    if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
    exec = e->real;
  } else if (r.kind != kNodeParamsSet) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (tail.size() < sizeof(GraphNodeParams)) return CUDA_ERROR_INVALID_VALUE;
  GraphNodeParams p;
  std::memcpy(&p, tail.data(), sizeof p);
  return set_node_params(*n, exec, p, tail.subspan(sizeof p));
}

namespace {
// Kernel node attributes whose values are plain numbers (no pointers, no
// events), at most 16 bytes of the value union.
bool plain_kernel_attr(std::uint32_t id) {
  switch (id) {
    case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
    case CU_LAUNCH_ATTRIBUTE_PRIORITY:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION:
    case CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE:
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      return true;
    default:
      return false;
  }
}
}  // namespace

CUresult Worker::on_GraphKernelAttr(Call& c) {
  const auto r = c.req<ReqGraphKernelAttr>();
  NodeEntry* n = nullptr;
  if (CUresult st = node_in_ctx(r.node, &n); st != CUDA_SUCCESS) return st;
  if (r.kind == kKernelAttrCopy) {
    NodeEntry* src = nodes_.find(r.src);
    if (src == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return cu_.cuGraphKernelNodeCopyAttributes(n->real, src->real);
  }
  if (!plain_kernel_attr(r.attr.id)) return CUDA_ERROR_NOT_SUPPORTED;
  CUkernelNodeAttrValue v{};
  static_assert(sizeof r.attr.value <= sizeof v);
  CUkernelNodeAttrID id;
  if (!wire_enum(r.attr.id, &id)) return CUDA_ERROR_INVALID_VALUE;
  if (r.kind == kKernelAttrSet) {
    std::memcpy(&v, r.attr.value, sizeof r.attr.value);
    return cu_.cuGraphKernelNodeSetAttribute(n->real, id, &v);
  }
  if (r.kind != kKernelAttrGet) return CUDA_ERROR_INVALID_VALUE;
  const CUresult st = cu_.cuGraphKernelNodeGetAttribute(n->real, id, &v);
  LaunchAttr out{};
  out.id = r.attr.id;
  std::memcpy(out.value, &v, sizeof out.value);
  c.set_reply(out);
  return st;
}

// ------------------------------------------------------------------ on_GraphQuery's answers (graph_build.cc)

CUresult Worker::on_GraphQuery_exec_update(Call& c, const ReqGraphQuery& r) {
  GraphEntry* g = graphs_.find(r.other);
  ExecEntry* e = nullptr;
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = exec_in_ctx(r.handle, &e); st != CUDA_SUCCESS) return st;
  CUgraphExecUpdateResultInfo info{};
  const CUresult st = cu_.cuGraphExecUpdate(e->real, g->real, &info);
  c.set_reply(RepValue{static_cast<std::int64_t>(info.result)});
  // The failing node is the new graph's; errorFromNode is the old graph's,
  // which may be gone: it is reported only if the guest has a handle for it.
  const auto known = [&](CUgraphNode real) {
    const auto it = node_of_.find(real);
    return it != node_of_.end() ? it->second : std::uint64_t{0};
  };
  const std::uint64_t err[2] = {node_handle(info.errorNode, r.other), known(info.errorFromNode)};
  c.append(err, sizeof err);
  return st;
}

CUresult Worker::on_GraphQuery_enabled(Call& c, const ReqGraphQuery& r) {
  NodeEntry* n = nodes_.find(r.other);
  ExecEntry* e = nullptr;
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = exec_in_ctx(r.handle, &e); st != CUDA_SUCCESS) return st;
  if (r.kind == kQuerySetEnabled) {
    if (r.capacity > 1) return CUDA_ERROR_INVALID_VALUE;
    return cu_.cuGraphNodeSetEnabled(e->real, n->real, static_cast<unsigned>(r.capacity));
  }
  unsigned on = 0;
  const CUresult st = cu_.cuGraphNodeGetEnabled(e->real, n->real, &on);
  c.set_reply(RepValue{on});
  return st;
}

}  // namespace ivcuda::host
