// Building graphs: graphs made and destroyed, nodes of each kind added, edges,
// the lists and questions about a graph's shape (on_GraphQuery and the
// answers of graph_build.cc's family: types, clones, child graphs,
// conditional handles, the DOT text), and a node's parameters in the
// driver's terms, checked, for graph_edit.cc's sets as well. Host nodes run
// here. The guest's side is guest/graph_build.cc.
//
// The graph lives here, in the driver; the guest holds handles. Graphs,
// executable graphs and nodes are entries of this worker's handle tables; a
// node entry names the graph it belongs to, so a guest can only name nodes of
// its own graphs, and the driver itself refuses a node of another of them
// where CUDA says so. Nodes made by capture, cloning or an update get their
// handles when the guest first sees them (node_handle). Node parameters are
// translated as the corresponding calls are (ivcuda/graph_codec.h converts,
// the checks are here): functions, events and graphs are this guest's
// handles, device memory must be its own (owns_device), and host memory in a
// memcpy node must be page-locked memory of its arena (a BAR offset);
// pageable host memory cannot be reached from here.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "host-daemon/worker/graph_internal.h"
#include "host-daemon/worker/worker_internal.h"
#include "ivcuda/graph_codec.h"
#include "ring/validate.h"

namespace ivcuda::host {

using namespace ivcuda::proto;
using graphs::host_node_call;
using graphs::kEdgeBytes;
using graphs::kernel_args;
using graphs::KernelArgs;
using graphs::kMaxListed;

namespace {
// Host nodes' pairs live as long as the worker: a guest cannot make more.
constexpr std::size_t kMaxHostSlots = 1u << 16;

// The last byte offset + 1 a 3D region of width x height x depth at (x, y, z)
// reaches from its base, or false on overflow or an impossible pitch.
bool copy_extent(const CopyEnd& e, std::uint64_t width, std::uint64_t height, std::uint64_t depth,
                 std::uint64_t* out) {
  if (width == 0 || height == 0 || depth == 0) {
    *out = 0;
    return true;
  }
  if ((height > 1 || depth > 1 || e.y != 0 || e.z != 0) && width > e.pitch) return false;
  if ((depth > 1 || e.z != 0) && (height > e.height || e.y > e.height - height)) return false;
  std::uint64_t slice = 0, zs = 0, ys = 0, end = 0;
  if (__builtin_mul_overflow(e.pitch, e.height, &slice)) return false;
  if (__builtin_mul_overflow(e.z + depth - 1, slice, &zs) || e.z + depth - 1 < e.z) return false;
  if (__builtin_mul_overflow(e.y + height - 1, e.pitch, &ys) || e.y + height - 1 < e.y) return false;
  if (__builtin_add_overflow(zs, ys, &end) || __builtin_add_overflow(end, e.x_bytes, &end) ||
      __builtin_add_overflow(end, width, &end))
    return false;
  *out = end;
  return true;
}
}  // namespace

std::uint64_t Worker::node_handle(CUgraphNode real, std::uint64_t graph) {
  if (real == nullptr) return 0;
  if (auto it = node_of_.find(real); it != node_of_.end()) return it->second;
  const std::uint64_t h = nodes_.insert(NodeEntry{real, graph});
  node_of_[real] = h;
  return h;
}

// Forgets a node, and the child graph it owns if the guest asked for it.
void Worker::drop_node(std::uint64_t node) {
  NodeEntry* n = nodes_.find(node);
  if (n == nullptr) return;
  node_of_.erase(n->real);
  nodes_.erase(node);
  std::vector<std::uint64_t> owned;
  graphs_.for_each([&](std::uint64_t h, GraphEntry& g) {
    if (g.owner_node == node) owned.push_back(h);
  });
  for (auto h : owned) drop_graph(h);
}

// Forgets a graph the driver destroyed, its nodes and the graphs they own.
void Worker::drop_graph(std::uint64_t graph) {
  std::vector<std::uint64_t> dead;
  nodes_.for_each([&](std::uint64_t h, NodeEntry& n) {
    if (n.graph == graph) dead.push_back(h);
  });
  graphs_.erase(graph);
  for (auto h : dead) drop_node(h);
}

CUresult Worker::node_in_ctx(std::uint64_t h, NodeEntry** out) {
  NodeEntry* n = nodes_.find(h);
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GraphEntry* g = graphs_.find(n->graph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = use_ctx(g->ctx); st != CUDA_SUCCESS) return st;
  *out = n;
  return CUDA_SUCCESS;
}

namespace {
// Set when the guest is gone: nobody will run the functions host nodes wait for.
std::atomic<bool> g_abandoned{false};
}  // namespace

void abandon_host_nodes() noexcept { g_abandoned.store(true, std::memory_order_release); }
void revive_host_nodes() noexcept { g_abandoned.store(false, std::memory_order_release); }

// A host node runs here, on the driver's callback thread: it tells the guest
// (one more step of `reached`) and waits until the guest's dispatcher has run
// the function (`done` caught up). Waiting blocks only this guest's work.
void CUDA_CB graphs::host_node_call(void* user) {
  note_console_output();  // the driver flushed device printf before calling us
  auto* slot = static_cast<const std::uint32_t* const*>(user);
  std::uint32_t* reached = const_cast<std::uint32_t*>(slot[0]);
  const std::uint32_t* done = slot[1];
  // Pairs with load_acquire in guest/hostfunc.cc's dispatcher.
  const std::uint32_t seq = std::atomic_ref<std::uint32_t>(*reached).fetch_add(1, std::memory_order_acq_rel) + 1;
  for (unsigned polls = 0;; ++polls) {
    // Pairs with the dispatcher's store_release of `done` (wrap-aware >=).
    const std::uint32_t v = ring::load_acquire(*done);
    if (static_cast<std::int32_t>(v - seq) >= 0 || g_abandoned.load(std::memory_order_acquire)) return;
    if (polls < 2000) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else {
      ::usleep(polls < 4000 ? 20 : 200);
    }
  }
}

// The worker's host node parameters for the guest's pair at BAR offset p.dst.
CUresult Worker::host_node_params(const GraphNodeParams& p, CUDA_HOST_NODE_PARAMS* out) {
  constexpr std::uint64_t kWord = sizeof(std::uint32_t);
  if (IVCUDA_RULE("graph-node-params") && (p.dst % kWord != 0 || !arena_range(p.dst, 2 * kWord)))
    return CUDA_ERROR_INVALID_VALUE;
  auto it = host_slots_.find(p.dst);
  if (it == host_slots_.end()) {
    if (host_slots_.size() >= kMaxHostSlots) return CUDA_ERROR_OUT_OF_MEMORY;
    auto slot = std::make_unique<HostNodeSlot>();
    slot->reached = reinterpret_cast<std::uint32_t*>(arena_ptr(p.dst));
    slot->done = reinterpret_cast<std::uint32_t*>(arena_ptr(p.dst + kWord));
    slot->off = p.dst;
    it = host_slots_.emplace(p.dst, std::move(slot)).first;
  }
  static_assert(offsetof(HostNodeSlot, reached) == 0 && offsetof(HostNodeSlot, done) == sizeof(void*));
  *out = CUDA_HOST_NODE_PARAMS{};
  out->fn = host_node_call;
  out->userData = it->second.get();
  return CUDA_SUCCESS;
}

CUresult Worker::to_driver_memset(const GraphNodeParams& p, CUDA_MEMSET_NODE_PARAMS* out) {
  if (p.elem_size != 1 && p.elem_size != 2 && p.elem_size != 4) return CUDA_ERROR_INVALID_VALUE;
  std::uint64_t row = 0, extent = 0;
  if (__builtin_mul_overflow(p.width, p.elem_size, &row)) return CUDA_ERROR_INVALID_VALUE;
  if (p.height == 0 || row == 0) {
    extent = 0;
  } else {
    if (p.height > 1 && row > p.pitch) return CUDA_ERROR_INVALID_VALUE;
    std::uint64_t rows = 0;
    if (__builtin_mul_overflow(p.pitch, p.height - 1, &rows) || __builtin_add_overflow(rows, row, &extent))
      return CUDA_ERROR_INVALID_VALUE;
  }
  if (IVCUDA_RULE("graph-node-params") && extent != 0 && !owns_device(p.dst, extent)) return CUDA_ERROR_INVALID_VALUE;
  *out = codec::memset_from_wire(p);
  return CUDA_SUCCESS;
}

CUresult Worker::to_driver_copy(const GraphNodeParams& p, CUDA_MEMCPY3D* out) {
  const auto end = [&](const CopyEnd& e, CUmemorytype* type, CUdeviceptr* dev, const void** host) {
    std::uint64_t extent = 0;
    if (!copy_extent(e, p.width_bytes, p.copy_height, p.depth, &extent)) return CUDA_ERROR_INVALID_VALUE;
    if (e.type == CU_MEMORYTYPE_DEVICE) {
      if (IVCUDA_RULE("graph-node-params") && extent != 0 && !owns_device(e.addr, extent))
        return CUDA_ERROR_INVALID_VALUE;
      *type = CU_MEMORYTYPE_DEVICE;
      *dev = e.addr;
      return CUDA_SUCCESS;
    }
    if (e.type == CU_MEMORYTYPE_HOST) {
      if (IVCUDA_RULE("graph-node-params") && !arena_range(e.addr, std::max<std::uint64_t>(extent, 1)))
        return CUDA_ERROR_INVALID_VALUE;
      *type = CU_MEMORYTYPE_HOST;
      *host = arena_ptr(e.addr);
      return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
  };
  return codec::copy_from_wire(p, out, end);
}

CUresult Worker::on_GraphCreate(Call& c) {
  const auto r = c.req<ReqGraphCreate>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  if (r.flags > 0xffffffffu) return CUDA_ERROR_INVALID_VALUE;
  if (full(graphs_, cfg_.limits.graphs, "graph")) return CUDA_ERROR_OUT_OF_MEMORY;
  CUgraph g = nullptr;
  const CUresult st = cu_.cuGraphCreate(&g, static_cast<unsigned>(r.flags));
  if (st != CUDA_SUCCESS) return st;
  c.set_reply(RepHandle{graphs_.insert(GraphEntry{g, r.ctx, 0})});
  return CUDA_SUCCESS;
}

CUresult Worker::on_GraphNodeCount(Call& c) {
  const auto r = c.req<ReqHandle>();
  GraphEntry* g = graphs_.find(r.handle);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = use_ctx(g->ctx); st != CUDA_SUCCESS) return st;
  size_t n = 0;
  const CUresult st = cu_.cuGraphGetNodes(g->real, nullptr, &n);
  c.set_reply(RepValue{static_cast<std::int64_t>(n)});
  return st;
}

CUresult Worker::on_GraphDestroy(Call& c) {
  const auto h = c.req<ReqHandle>().handle;
  GraphEntry* g = graphs_.find(h);
  // A child graph node's graph is the node's: only destroying the node frees it.
  if (g == nullptr || g->owner_node != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = use_ctx(g->ctx); st != CUDA_SUCCESS) return st;
  const CUresult st = cu_.cuGraphDestroy(g->real);
  drop_graph(h);
  return st;
}

CUresult Worker::add_node(GraphEntry& g, std::span<const CUgraphNode> deps, const GraphNodeParams& p,
                          std::span<const std::byte> packed, CUgraphNode* out) {
  const CUgraphNode* d = deps.empty() ? nullptr : deps.data();
  const size_t n = deps.size();
  switch (p.type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      KernelArgs k;
      if (CUresult st = kernel_args(funcs_.find(p.handle), p, packed, &k); st != CUDA_SUCCESS) return st;
      return cu_.cuGraphAddKernelNode(out, g.real, d, n, &k.params);
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      CUDA_MEMSET_NODE_PARAMS m;
      if (CUresult st = to_driver_memset(p, &m); st != CUDA_SUCCESS) return st;
      return cu_.cuGraphAddMemsetNode(out, g.real, d, n, &m, current_);
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: {
      CUDA_MEMCPY3D m;
      if (CUresult st = to_driver_copy(p, &m); st != CUDA_SUCCESS) return st;
      return cu_.cuGraphAddMemcpyNode(out, g.real, d, n, &m, current_);
    }
    case CU_GRAPH_NODE_TYPE_EMPTY: return cu_.cuGraphAddEmptyNode(out, g.real, d, n);
    case CU_GRAPH_NODE_TYPE_GRAPH: {
      GraphEntry* child = graphs_.find(p.handle);
      if (child == nullptr) return CUDA_ERROR_INVALID_VALUE;
      return cu_.cuGraphAddChildGraphNode(out, g.real, d, n, child->real);
    }
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: {
      EventEntry* e = events_.find(p.handle);
      if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      return p.type == CU_GRAPH_NODE_TYPE_EVENT_RECORD ? cu_.cuGraphAddEventRecordNode(out, g.real, d, n, e->real)
                                                       : cu_.cuGraphAddEventWaitNode(out, g.real, d, n, e->real);
    }
    case CU_GRAPH_NODE_TYPE_HOST: {
      CUDA_HOST_NODE_PARAMS hp;
      if (CUresult st = host_node_params(p, &hp); st != CUDA_SUCCESS) return st;
      return cu_.cuGraphAddHostNode(out, g.real, d, n, &hp);
    }
    case CU_GRAPH_NODE_TYPE_MEM_FREE: {
      // Only memory an allocation node of this guest handed out.
      auto it = ranges_.find(p.dst);
      if (it == ranges_.end() || it->second.kind != RangeKind::kGraphMem) return CUDA_ERROR_INVALID_VALUE;
      return cu_.cuGraphAddMemFreeNode(out, g.real, d, n, p.dst);
    }
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

CUresult Worker::on_GraphAddNode(Call& c) {
  const auto r = c.req<ReqGraphAddNode>();
  auto tail = c.tail<ReqGraphAddNode>();
  GraphEntry* g = graphs_.find(r.graph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = use_ctx(g->ctx); st != CUDA_SUCCESS) return st;
  // A node may bring graphs with it (child and conditional bodies).
  if (full(nodes_, cfg_.limits.graph_nodes, "graph node") || full(graphs_, cfg_.limits.graphs, "graph"))
    return CUDA_ERROR_OUT_OF_MEMORY;
  if (r.ndeps > kMaxListed || tail.size() < r.ndeps * sizeof(std::uint64_t) + sizeof(GraphNodeParams))
    return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUgraphNode> deps(r.ndeps);
  for (std::uint32_t i = 0; i < r.ndeps; ++i) {
    std::uint64_t h;
    std::memcpy(&h, tail.data() + i * sizeof h, sizeof h);
    NodeEntry* n = nodes_.find(h);
    if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
    deps[i] = n->real;
  }
  tail = tail.subspan(r.ndeps * sizeof(std::uint64_t));
  GraphNodeParams p;
  std::memcpy(&p, tail.data(), sizeof p);
  CUgraphNode node = nullptr;
  CUdeviceptr dptr = 0;
  Charge charge;  // an allocation node's memory against the quota
  std::vector<CUgraph> bodies;
  const CUresult st = p.type == CU_GRAPH_NODE_TYPE_MEM_ALLOC
                          ? add_mem_alloc_node(*g, deps, p, tail.subspan(sizeof p), &node, &dptr, &charge)
                      : p.type == CU_GRAPH_NODE_TYPE_CONDITIONAL ? add_conditional_node(*g, deps, p, &node, &bodies)
                                                                 : add_node(*g, deps, p, tail.subspan(sizeof p), &node);
  if (st != CUDA_SUCCESS) return st;
  const std::uint64_t nh = node_handle(node, r.graph);
  if (charge) nodes_.find(nh)->charge = std::move(charge);  // given back with the node
  const std::uint64_t ctx = g->ctx;
  c.set_reply(RepHandle{nh});
  if (p.type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) c.append(&dptr, sizeof dptr);
  for (CUgraph b : bodies) {
    // The bodies are the node's, as a child graph node's graph is. One the
    // driver left unfilled stays null for the guest too.
    const std::uint64_t bh = b == nullptr ? 0 : graphs_.insert(GraphEntry{b, ctx, nh});
    c.append(&bh, sizeof bh);
  }
  return CUDA_SUCCESS;
}

// The address the driver picks is the guest's device memory from now on
// (kernels and copies of the graph use it), as a stream-ordered allocation's
// is; the driver keeps the same address for the graph's whole life.
CUresult Worker::add_mem_alloc_node(GraphEntry& g, std::span<const CUgraphNode> deps, const GraphNodeParams& p,
                                    std::span<const std::byte> tail, CUgraphNode* out, CUdeviceptr* dptr,
                                    Charge* charge) {
  if (tail.size() < sizeof(MemAllocNode)) return CUDA_ERROR_INVALID_VALUE;
  MemAllocNode m;
  std::memcpy(&m, tail.data(), sizeof m);
  if (m.access_count > kMaxDevices || tail.size() != sizeof m + m.access_count * sizeof(MemAccess))
    return CUDA_ERROR_INVALID_VALUE;
  CUDA_MEM_ALLOC_NODE_PARAMS a;
  CUmemAccessDesc desc[kMaxDevices];
  const auto location = [&](std::uint32_t type, std::int32_t id, CUmemLocation* l) {
    return to_driver_location(type, id, l);
  };
  if (CUresult st = codec::mem_alloc_from_wire(m, tail.subspan(sizeof m), checked_enum, location, &a, desc);
      st != CUDA_SUCCESS)
    return st;
  a.bytesize = p.width;
  // Graph memory counts while its allocation node lives (the driver
  // allocates it at launches, and may keep it between them): the caller puts
  // the charge in the node's record; the range holds only the address.
  Charge taken = quota_.take(a.bytesize);
  if (!taken) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult st =
      cu_.cuGraphAddMemAllocNode(out, g.real, deps.empty() ? nullptr : deps.data(), deps.size(), &a);
  if (st != CUDA_SUCCESS) return st;
  *charge = std::move(taken);
  ranges_[a.dptr] = DevRange{a.bytesize, g.ctx, RangeKind::kGraphMem};
  *dptr = a.dptr;
  return CUDA_SUCCESS;
}

CUresult Worker::add_conditional_node(GraphEntry& g, std::span<const CUgraphNode> deps, const GraphNodeParams& p,
                                      CUgraphNode* out, std::vector<CUgraph>* bodies) {
  if (p.elem_size == 0 || p.elem_size > kMaxCondBodies) return CUDA_ERROR_INVALID_VALUE;
  bodies->assign(p.elem_size, nullptr);
  CUgraphNodeParams np{};
  np.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  np.conditional.handle = p.handle;
  if (!wire_enum(p.value, &np.conditional.type)) return CUDA_ERROR_INVALID_VALUE;
  np.conditional.size = p.elem_size;
  np.conditional.phGraph_out = bodies->data();
  np.conditional.ctx = current_;
  const CUresult st =
      cu_.cuGraphAddNode(out, g.real, deps.empty() ? nullptr : deps.data(), nullptr, deps.size(), &np);
  if (st != CUDA_SUCCESS) bodies->clear();
  return st;
}

CUresult Worker::on_GraphEdges(Call& c) {
  const auto r = c.req<ReqGraphEdges>();
  const auto tail = c.tail<ReqGraphEdges>();
  GraphEntry* g = graphs_.find(r.graph);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = use_ctx(g->ctx); st != CUDA_SUCCESS) return st;
  const std::size_t per = 2 * sizeof(std::uint64_t) + kEdgeBytes;
  if (r.count > kMaxListed || tail.size() != r.count * per) return CUDA_ERROR_INVALID_VALUE;
  std::vector<CUgraphNode> from(r.count), to(r.count);
  std::vector<CUgraphEdgeData> data(r.count);
  for (std::uint32_t i = 0; i < r.count; ++i) {
    std::uint64_t hf, ht;
    std::memcpy(&hf, tail.data() + i * sizeof hf, sizeof hf);
    std::memcpy(&ht, tail.data() + (r.count + i) * sizeof ht, sizeof ht);
    NodeEntry* nf = nodes_.find(hf);
    NodeEntry* nt = nodes_.find(ht);
    if (nf == nullptr || nt == nullptr) return CUDA_ERROR_INVALID_VALUE;
    from[i] = nf->real;
    to[i] = nt->real;
  }
  if (r.count != 0) std::memcpy(data.data(), tail.data() + 2 * r.count * sizeof(std::uint64_t), r.count * kEdgeBytes);
  const CUgraphEdgeData* pd = r.count == 0 ? nullptr : data.data();
  return r.remove != 0 ? cu_.cuGraphRemoveDependencies(g->real, from.data(), to.data(), pd, r.count)
                       : cu_.cuGraphAddDependencies(g->real, from.data(), to.data(), pd, r.count);
}

// ------------------------------------------------------------------ questions (on_GraphQuery)

// One answer per ReqGraphQuery kind (proto.h), each beside its family's other
// calls: exec flags and graph memory in graph_exec.cc, updates and enabling
// in graph_edit.cc. tests/fuzz/coverage.py counts every on_GraphQuery_* as
// this handler.
CUresult Worker::on_GraphQuery(Call& c) {
  using Answer = CUresult (Worker::*)(Call&, const ReqGraphQuery&);
  static constexpr auto kAnswers = [] {
    std::array<Answer, kQueryGraphMem + 1> a{};
    for (std::uint32_t k : {kQueryNodes, kQueryRoots, kQueryEdges, kQueryDeps, kQueryDependents})
      a[k] = &Worker::on_GraphQuery_list;
    a[kQueryType] = &Worker::on_GraphQuery_type;
    a[kQueryDestroyNode] = &Worker::on_GraphQuery_destroy_node;
    a[kQueryClone] = &Worker::on_GraphQuery_clone;
    a[kQueryFindInClone] = &Worker::on_GraphQuery_find_in_clone;
    a[kQueryExecFlags] = &Worker::on_GraphQuery_exec_flags;
    a[kQueryExecUpdate] = &Worker::on_GraphQuery_exec_update;
    a[kQueryGetEnabled] = a[kQuerySetEnabled] = &Worker::on_GraphQuery_enabled;
    a[kQueryChildGraph] = &Worker::on_GraphQuery_child_graph;
    a[kQueryCondHandle] = &Worker::on_GraphQuery_cond_handle;
    a[kQueryDot] = &Worker::on_GraphQuery_dot;
    a[kQueryGraphMem] = &Worker::on_GraphQuery_graph_mem;
    return a;
  }();
  const auto r = c.req<ReqGraphQuery>();
  if (r.kind >= kAnswers.size() || kAnswers[r.kind] == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return (this->*kAnswers[r.kind])(c, r);
}

// The lists: the driver is asked with the guest's capacity, so it answers the
// counts, the NULL padding and LOSSY_QUERY exactly as it would the guest.
CUresult Worker::on_GraphQuery_list(Call& c, const ReqGraphQuery& r) {
  const bool arrays = (r.flags & kQueryArrays) != 0;
  const bool want_data = (r.flags & kQueryEdgeData) != 0;
  const bool edges = r.kind == kQueryEdges;
  const std::uint64_t cap = arrays ? r.capacity : 0;
  const std::size_t per = (edges ? 2 : 1) * sizeof(std::uint64_t) + (want_data ? kEdgeBytes : 0);
  if (cap > kMaxListed || sizeof(RepValue) + cap * per > c.ch.cpl.max_payload()) return CUDA_ERROR_NOT_SUPPORTED;
  std::uint64_t graph = 0;
  CUgraph g = nullptr;
  CUgraphNode node = nullptr;
  if (r.kind == kQueryNodes || r.kind == kQueryRoots || edges) {
    GraphEntry* ge = graphs_.find(r.handle);
    if (ge == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult st = use_ctx(ge->ctx); st != CUDA_SUCCESS) return st;
    graph = r.handle;
    g = ge->real;
  } else {
    NodeEntry* n = nullptr;
    if (CUresult st = node_in_ctx(r.handle, &n); st != CUDA_SUCCESS) return st;
    graph = n->graph;
    node = n->real;
  }
  std::vector<CUgraphNode> a(cap), b(edges ? cap : 0);
  std::vector<CUgraphEdgeData> data(want_data ? cap : 0);
  size_t count = cap;
  CUgraphNode* pa = arrays ? a.data() : nullptr;
  CUgraphEdgeData* pd = want_data ? data.data() : nullptr;
  // An empty vector's data() may be null or not; the driver tells "no array" by null.
  if (cap == 0 && arrays) pa = reinterpret_cast<CUgraphNode*>(&count);
  CUresult st;
  switch (r.kind) {
    case kQueryNodes: st = cu_.cuGraphGetNodes(g, pa, &count); break;
    case kQueryRoots: st = cu_.cuGraphGetRootNodes(g, pa, &count); break;
    case kQueryEdges:
      st = cu_.cuGraphGetEdges(g, pa, arrays ? (cap == 0 ? pa : b.data()) : nullptr, pd, &count);
      break;
    case kQueryDeps: st = cu_.cuGraphNodeGetDependencies(node, pa, pd, &count); break;
    default: st = cu_.cuGraphNodeGetDependentNodes(node, pa, pd, &count); break;
  }
  c.set_reply(RepValue{static_cast<std::int64_t>(count)});
  if (st != CUDA_SUCCESS && st != CUDA_ERROR_LOSSY_QUERY) return st;
  for (std::uint64_t i = 0; i < cap; ++i) {
    const std::uint64_t h = node_handle(a[i], graph);
    c.append(&h, sizeof h);
  }
  for (std::uint64_t i = 0; edges && i < cap; ++i) {
    const std::uint64_t h = node_handle(b[i], graph);
    c.append(&h, sizeof h);
  }
  if (want_data) c.append(data.data(), cap * kEdgeBytes);
  return st;
}

CUresult Worker::on_GraphQuery_type(Call& c, const ReqGraphQuery& r) {
  NodeEntry* n = nullptr;
  if (CUresult st = node_in_ctx(r.handle, &n); st != CUDA_SUCCESS) return st;
  CUgraphNodeType t;
  const CUresult st = cu_.cuGraphNodeGetType(n->real, &t);
  c.set_reply(RepValue{static_cast<std::int64_t>(t)});
  return st;
}

CUresult Worker::on_GraphQuery_destroy_node(Call&, const ReqGraphQuery& r) {
  NodeEntry* n = nullptr;
  if (CUresult st = node_in_ctx(r.handle, &n); st != CUDA_SUCCESS) return st;
  const CUresult st = cu_.cuGraphDestroyNode(n->real);
  if (st == CUDA_SUCCESS) drop_node(r.handle);
  return st;
}

CUresult Worker::on_GraphQuery_clone(Call& c, const ReqGraphQuery& r) {
  GraphEntry* g = graphs_.find(r.handle);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = use_ctx(g->ctx); st != CUDA_SUCCESS) return st;
  if (full(graphs_, cfg_.limits.graphs, "graph")) return CUDA_ERROR_OUT_OF_MEMORY;
  CUgraph clone = nullptr;
  const CUresult st = cu_.cuGraphClone(&clone, g->real);
  if (st != CUDA_SUCCESS) return st;
  c.set_reply(RepValue{static_cast<std::int64_t>(graphs_.insert(GraphEntry{clone, g->ctx, 0}))});
  return CUDA_SUCCESS;
}

CUresult Worker::on_GraphQuery_find_in_clone(Call& c, const ReqGraphQuery& r) {
  NodeEntry* n = nullptr;
  if (CUresult st = node_in_ctx(r.handle, &n); st != CUDA_SUCCESS) return st;
  GraphEntry* g = graphs_.find(r.other);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUgraphNode found = nullptr;
  const CUresult st = cu_.cuGraphNodeFindInClone(&found, n->real, g->real);
  if (st != CUDA_SUCCESS) return st;
  c.set_reply(RepValue{static_cast<std::int64_t>(node_handle(found, r.other))});
  return CUDA_SUCCESS;
}

CUresult Worker::on_GraphQuery_child_graph(Call& c, const ReqGraphQuery& r) {
  NodeEntry* n = nullptr;
  if (CUresult st = node_in_ctx(r.handle, &n); st != CUDA_SUCCESS) return st;
  CUgraph child = nullptr;
  const CUresult st = cu_.cuGraphChildGraphNodeGetGraph(n->real, &child);
  if (st != CUDA_SUCCESS) return st;
  std::uint64_t h = 0;
  graphs_.for_each([&](std::uint64_t gh, GraphEntry& g) {
    if (g.real == child) h = gh;
  });
  if (h == 0) h = graphs_.insert(GraphEntry{child, graphs_.find(n->graph)->ctx, r.handle});
  c.set_reply(RepValue{static_cast<std::int64_t>(h)});
  return CUDA_SUCCESS;
}

CUresult Worker::on_GraphQuery_cond_handle(Call& c, const ReqGraphQuery& r) {
  GraphEntry* g = graphs_.find(r.handle);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = use_ctx(g->ctx); st != CUDA_SUCCESS) return st;
  if (r.capacity > 0xffffffffu) return CUDA_ERROR_INVALID_VALUE;
  CUgraphConditionalHandle h = 0;
  const CUresult st =
      cu_.cuGraphConditionalHandleCreate(&h, g->real, current_, static_cast<unsigned>(r.capacity), r.flags);
  c.set_reply(RepValue{static_cast<std::int64_t>(h)});
  return st;
}

namespace {
// The DOT text the driver wrote into fd; NOT_SUPPORTED past `room` bytes
// (more than one reply holds).
CUresult read_dot(int fd, std::size_t room, std::string* text) {
  char buf[16384];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n < 0) return CUDA_ERROR_OPERATING_SYSTEM;
    if (n == 0) return CUDA_SUCCESS;
    text->append(buf, static_cast<std::size_t>(n));
    at += n;
    if (text->size() > room) return CUDA_ERROR_NOT_SUPPORTED;
  }
}

// `text` with every hexadecimal number (0x and at least one digit) as "0x?".
std::string masked_hex(const std::string& text) {
  std::string clean;
  clean.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    if (text[i] == '0' && i + 2 < text.size() && (text[i + 1] == 'x' || text[i + 1] == 'X') &&
        std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      clean += "0x?";
      i += 2;
      while (i < text.size() && std::isxdigit(static_cast<unsigned char>(text[i]))) ++i;
    } else {
      clean += text[i++];
    }
  }
  return clean;
}
}  // namespace

CUresult Worker::on_GraphQuery_dot(Call& c, const ReqGraphQuery& r) {
  GraphEntry* g = graphs_.find(r.handle);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = use_ctx(g->ctx); st != CUDA_SUCCESS) return st;
  // The driver writes a file: an anonymous one, read back for the guest,
  // which writes the file it named itself.
  sys::UniqueFd fd(::memfd_create("ivcuda-graph-dot", MFD_CLOEXEC));
  if (!fd.valid()) return CUDA_ERROR_OPERATING_SYSTEM;
  const std::string path = "/proc/self/fd/" + std::to_string(fd.get());
  if (CUresult st = cu_.cuGraphDebugDotPrint(g->real, path.c_str(), r.flags); st != CUDA_SUCCESS) return st;
  std::string text;
  if (CUresult st = read_dot(fd.get(), c.ch.cpl.max_payload() - sizeof(RepValue) - 4096, &text); st != CUDA_SUCCESS)
    return st;
  // The driver prints its own addresses (nodes, the worker's host-node
  // function): the guest may not learn where the worker's code and data
  // are (docs/security.md), so every hexadecimal number is masked.
  if (IVCUDA_RULE("graph-dot-masked")) text = masked_hex(text);
  c.set_reply(RepValue{static_cast<std::int64_t>(text.size())});
  c.append(text.data(), text.size());
  return CUDA_SUCCESS;
}

}  // namespace ivcuda::host
