// Stream capture and graphs: capture as the host stream does it, graphs built
// node by node, their executable forms, launches and updates. The guest side
// is guest/graphs.cc.
//
// The graph lives here, in the driver; the guest holds handles. Graphs,
// executable graphs and nodes are entries of this worker's handle tables; a
// node entry names the graph it belongs to, so a guest can only name nodes of
// its own graphs, and the driver itself refuses a node of another of them
// where CUDA says so. Nodes made by capture, cloning or an update get their
// handles when the guest first sees them (node_handle). Node parameters are
// translated as the corresponding calls are: functions, events and graphs
// are this guest's handles, device memory must be its own (owns_device), and
// host memory in a memcpy node must be page-locked memory of its arena (a BAR
// offset); pageable host memory cannot be reached from here.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "host-daemon/shared/log.h"
#include "host-daemon/worker/worker_internal.h"
#include "ivcuda/graph_codec.h"
#include "ring/validate.h"

namespace ivcuda::host {

using namespace ivcuda::proto;

namespace {
// Dependencies per request and list entries per reply (a reply must also fit
// the completion ring: longer lists are refused rather than split).
constexpr std::uint64_t kMaxListed = 1u << 16;
constexpr std::size_t kEdgeBytes = 8;
// Host nodes' pairs live as long as the worker: a guest cannot make more.
constexpr std::size_t kMaxHostSlots = 1u << 16;
static_assert(sizeof(CUgraphEdgeData) == kEdgeBytes);

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

// ------------------------------------------------------------------ capture and graphs

CUresult Worker::on_StreamBeginCapture(Call& c) {
  const auto r = c.req<ReqCapture>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstreamCaptureMode mode;
  if (r.mode > CU_STREAM_CAPTURE_MODE_RELAXED || !wire_enum(r.mode, &mode)) return CUDA_ERROR_INVALID_VALUE;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
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
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstreamCaptureMode mode;
  if (r.mode > CU_STREAM_CAPTURE_MODE_RELAXED || !wire_enum(r.mode, &mode)) return CUDA_ERROR_INVALID_VALUE;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
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
  ExecEntry* e = execs_.find(h);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = use_ctx(e->ctx); st != CUDA_SUCCESS) return st;
  const CUresult st = cu_.cuGraphExecDestroy(e->real);
  execs_.erase(h);
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


// ------------------------------------------------------------------ graph building

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

namespace {
// A host node runs here, on the driver's callback thread: it tells the guest
// (one more step of `reached`) and waits until the guest's dispatcher has run
// the function (`done` caught up). Waiting blocks only this guest's work.
void CUDA_CB host_node_call(void* user) {
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
}  // namespace

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

namespace {
// A kernel node's parameters in the driver's form; argv points into `packed`.
struct KernelArgs {
  CUDA_KERNEL_NODE_PARAMS params{};
  std::vector<void*> argv;
};

// f: the function the guest named (its FuncEntry), or null.
template <class Func>
CUresult kernel_args(const Func* f, const GraphNodeParams& p, std::span<const std::byte> packed, KernelArgs* k) {
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (p.param_bytes != f->param_bytes || packed.size() != f->param_bytes) return CUDA_ERROR_INVALID_VALUE;
  // Offsets were bounded by param_bytes when the function was looked up.
  k->argv.resize(f->params.size());
  for (std::size_t i = 0; i < f->params.size(); ++i)
    k->argv[i] = const_cast<std::byte*>(packed.data()) + f->params[i].offset;
  k->params.func = f->real;
  codec::kernel_from_wire(p, &k->params);
  k->params.kernelParams = k->argv.empty() ? nullptr : k->argv.data();
  return CUDA_SUCCESS;
}
}  // namespace

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
  switch (type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      CUDA_KERNEL_NODE_PARAMS k{};
      if (CUresult st = cu_.cuGraphKernelNodeGetParams(n.real, &k); st != CUDA_SUCCESS) return st;
      // The guest knows functions by its handles: find the one it looked up.
      std::uint64_t fh = 0;
      FuncEntry* fe = nullptr;
      funcs_.for_each([&](std::uint64_t h, FuncEntry& f) {
        if (fh == 0 && f.real == k.func) {
          fh = h;
          fe = &f;
        }
      });
      if (fe == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
      p.handle = fh;
      codec::kernel_to_wire(k, &p);
      p.param_bytes = fe->param_bytes;
      packed.resize(fe->param_bytes);
      if (k.kernelParams != nullptr) {
        for (std::size_t i = 0; i < fe->params.size(); ++i)
          std::memcpy(packed.data() + fe->params[i].offset, k.kernelParams[i], fe->params[i].size);
      } else if (!fe->params.empty()) {
        return CUDA_ERROR_NOT_SUPPORTED;  // parameters the driver holds as an `extra` buffer
      }
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      CUDA_MEMSET_NODE_PARAMS m{};
      if (CUresult st = cu_.cuGraphMemsetNodeGetParams(n.real, &m); st != CUDA_SUCCESS) return st;
      codec::memset_to_wire(m, &p);
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: {
      CUDA_MEMCPY3D m{};
      if (CUresult st = cu_.cuGraphMemcpyNodeGetParams(n.real, &m); st != CUDA_SUCCESS) return st;
      // Host ends are arena memory (nothing else can be given or captured):
      // the guest gets them back as BAR offsets.
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
      if (CUresult st = codec::copy_to_wire(m, &p, end); st != CUDA_SUCCESS) return st;
      break;
    }
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: {
      CUevent ev = nullptr;
      const CUresult st = type == CU_GRAPH_NODE_TYPE_EVENT_RECORD ? cu_.cuGraphEventRecordNodeGetEvent(n.real, &ev)
                                                                 : cu_.cuGraphEventWaitNodeGetEvent(n.real, &ev);
      if (st != CUDA_SUCCESS) return st;
      events_.for_each([&](std::uint64_t h, EventEntry& e) {
        if (p.handle == 0 && e.real == ev) p.handle = h;
      });
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEM_FREE: {
      CUdeviceptr dp = 0;
      if (CUresult st = cu_.cuGraphMemFreeNodeGetParams(n.real, &dp); st != CUDA_SUCCESS) return st;
      p.dst = dp;
      break;
    }
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: {
      CUDA_MEM_ALLOC_NODE_PARAMS a{};
      if (CUresult st = cu_.cuGraphMemAllocNodeGetParams(n.real, &a); st != CUDA_SUCCESS) return st;
      p.dst = a.dptr;
      p.width = a.bytesize;
      // Locations back in the guest's device numbering.
      const auto guest_id = [&](const CUmemLocation& l) {
        if (l.type != CU_MEM_LOCATION_TYPE_DEVICE) return l.id;
        for (std::size_t i = 0; i < devices_.size(); ++i)
          if (static_cast<int>(devices_[i]) == l.id) return static_cast<int>(i);
        return -1;
      };
      const auto location = [&](const CUmemLocation& l, std::uint32_t* loc_type, std::int32_t* id) {
        *loc_type = l.type;
        *id = guest_id(l);
        return CUDA_SUCCESS;
      };
      (void)codec::mem_alloc_to_wire(a, location, &packed);
      break;
    }
    case CU_GRAPH_NODE_TYPE_HOST: {
      CUDA_HOST_NODE_PARAMS hp{};
      if (CUresult st = cu_.cuGraphHostNodeGetParams(n.real, &hp); st != CUDA_SUCCESS) return st;
      const auto* slot = static_cast<const HostNodeSlot*>(hp.userData);
      auto it = hp.fn == host_node_call ? host_slots_.find(slot->off) : host_slots_.end();
      if (it == host_slots_.end() || it->second.get() != slot) return CUDA_ERROR_NOT_SUPPORTED;
      p.dst = slot->off;
      break;
    }
    default:
      break;  // the type alone
  }
  c.set_reply(p);
  if (!packed.empty()) c.append(packed.data(), packed.size());
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

// The lists: the driver is asked with the guest's capacity, so it answers the
// counts, the NULL padding and LOSSY_QUERY exactly as it would the guest.
CUresult Worker::graph_list(Call& c, const ReqGraphQuery& r) {
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

CUresult Worker::on_GraphQuery(Call& c) {
  const auto r = c.req<ReqGraphQuery>();
  switch (r.kind) {
    case kQueryNodes:
    case kQueryRoots:
    case kQueryEdges:
    case kQueryDeps:
    case kQueryDependents:
      return graph_list(c, r);
    case kQueryType: {
      NodeEntry* n = nullptr;
      if (CUresult st = node_in_ctx(r.handle, &n); st != CUDA_SUCCESS) return st;
      CUgraphNodeType t;
      const CUresult st = cu_.cuGraphNodeGetType(n->real, &t);
      c.set_reply(RepValue{static_cast<std::int64_t>(t)});
      return st;
    }
    case kQueryDestroyNode: {
      NodeEntry* n = nullptr;
      if (CUresult st = node_in_ctx(r.handle, &n); st != CUDA_SUCCESS) return st;
      const CUresult st = cu_.cuGraphDestroyNode(n->real);
      if (st == CUDA_SUCCESS) drop_node(r.handle);
      return st;
    }
    case kQueryClone: {
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
    case kQueryFindInClone: {
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
    case kQueryExecFlags: {
      ExecEntry* e = execs_.find(r.handle);
      if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
      if (CUresult st = use_ctx(e->ctx); st != CUDA_SUCCESS) return st;
      cuuint64_t flags = 0;
      const CUresult st = cu_.cuGraphExecGetFlags(e->real, &flags);
      c.set_reply(RepValue{static_cast<std::int64_t>(flags)});
      return st;
    }
    case kQueryExecUpdate: {
      ExecEntry* e = execs_.find(r.handle);
      GraphEntry* g = graphs_.find(r.other);
      if (e == nullptr || g == nullptr) return CUDA_ERROR_INVALID_VALUE;
      if (CUresult st = use_ctx(e->ctx); st != CUDA_SUCCESS) return st;
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
    case kQueryGetEnabled:
    case kQuerySetEnabled: {
      ExecEntry* e = execs_.find(r.handle);
      NodeEntry* n = nodes_.find(r.other);
      if (e == nullptr || n == nullptr) return CUDA_ERROR_INVALID_VALUE;
      if (CUresult st = use_ctx(e->ctx); st != CUDA_SUCCESS) return st;
      if (r.kind == kQuerySetEnabled) {
        if (r.capacity > 1) return CUDA_ERROR_INVALID_VALUE;
        return cu_.cuGraphNodeSetEnabled(e->real, n->real, static_cast<unsigned>(r.capacity));
      }
      unsigned on = 0;
      const CUresult st = cu_.cuGraphNodeGetEnabled(e->real, n->real, &on);
      c.set_reply(RepValue{on});
      return st;
    }
    case kQueryGraphMem: {
      // The device's graph memory is this worker's, hence this guest's alone.
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
    case kQueryDot: {
      GraphEntry* g = graphs_.find(r.handle);
      if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
      if (CUresult st = use_ctx(g->ctx); st != CUDA_SUCCESS) return st;
      // The driver writes a file: an anonymous one, read back for the guest,
      // which writes the file it named itself.
      sys::UniqueFd fd(::memfd_create("ivcuda-graph-dot", MFD_CLOEXEC));
      if (!fd.valid()) return CUDA_ERROR_OPERATING_SYSTEM;
      const std::string path = "/proc/self/fd/" + std::to_string(fd.get());
      const CUresult st = cu_.cuGraphDebugDotPrint(g->real, path.c_str(), r.flags);
      if (st != CUDA_SUCCESS) return st;
      const std::size_t room = c.ch.cpl.max_payload() - sizeof(RepValue) - 4096;
      std::string text;
      char buf[16384];
      for (off_t at = 0;;) {
        const ssize_t n = ::pread(fd.get(), buf, sizeof buf, at);
        if (n < 0) return CUDA_ERROR_OPERATING_SYSTEM;
        if (n == 0) break;
        text.append(buf, static_cast<std::size_t>(n));
        at += n;
        if (text.size() > room) return CUDA_ERROR_NOT_SUPPORTED;  // more than one reply holds
      }
      // The driver prints its own addresses (nodes, the worker's host-node
      // function): the guest may not learn where the worker's code and data
      // are (docs/security.md), so every hexadecimal number is masked.
      std::string clean;
      clean.reserve(text.size());
      const bool mask = IVCUDA_RULE("graph-dot-masked");
      for (std::size_t i = 0; i < text.size();) {
        if (mask && text[i] == '0' && i + 2 < text.size() && (text[i + 1] == 'x' || text[i + 1] == 'X') &&
            std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
          clean += "0x?";
          i += 2;
          while (i < text.size() && std::isxdigit(static_cast<unsigned char>(text[i]))) ++i;
        } else {
          clean += text[i++];
        }
      }
      c.set_reply(RepValue{static_cast<std::int64_t>(clean.size())});
      c.append(clean.data(), clean.size());
      return CUDA_SUCCESS;
    }
    case kQueryCondHandle: {
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
    case kQueryChildGraph: {
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
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
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

}  // namespace ivcuda::host
