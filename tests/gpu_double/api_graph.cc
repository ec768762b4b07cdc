// Graphs of the GPU test double: built node by node or by stream capture, queried, edited,
// cloned, instantiated into a snapshot in topological order, launched, updated. Work runs
// at once in the double, so a launch runs the snapshot's nodes one after the other.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>

#include "state.h"

using namespace ivcuda::gpu_double;

namespace {

GraphNode* find_node(State& s, CUgraphNode h) {
  const auto it = s.graph_nodes.find(from_handle(h));
  return it == s.graph_nodes.end() ? nullptr : &it->second;
}

Graph* find_graph(State& s, CUgraph h) {
  const auto it = s.graphs.find(from_handle(h));
  return it == s.graphs.end() ? nullptr : &it->second;
}

bool is_default(const CUgraphEdgeData& e) {
  const auto* b = reinterpret_cast<const unsigned char*>(&e);
  return std::all_of(b, b + sizeof e, [](unsigned char c) { return c == 0; });
}

// Checks a memset node's parameters as the driver does (the memory must be the device's).
CUresult check_memset(const State& s, const CUDA_MEMSET_NODE_PARAMS& m) {
  if (m.elementSize != 1 && m.elementSize != 2 && m.elementSize != 4) return CUDA_ERROR_INVALID_VALUE;
  if (m.width == 0 || m.height == 0) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t row = m.width * m.elementSize;
  if (m.height > 1 && m.pitch < row) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t extent = (m.height - 1) * m.pitch + row;
  return check_device_range(s, m.dst, extent) == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult check_copy(const CUDA_MEMCPY3D& c) {
  if (c.WidthInBytes == 0 || c.Height == 0 || c.Depth == 0) return CUDA_ERROR_INVALID_VALUE;
  const auto type_ok = [](CUmemorytype t) {
    return t == CU_MEMORYTYPE_HOST || t == CU_MEMORYTYPE_DEVICE || t == CU_MEMORYTYPE_UNIFIED;
  };
  if (!type_ok(c.srcMemoryType) || !type_ok(c.dstMemoryType)) return CUDA_ERROR_INVALID_VALUE;
  if (c.Depth > 1 && (c.srcHeight < c.Height || c.dstHeight < c.Height)) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

CUresult set_kernel(State& s, GraphNode* n, const CUDA_KERNEL_NODE_PARAMS& p) {
  const CUfunction f = p.func != nullptr ? p.func : reinterpret_cast<CUfunction>(p.kern);
  std::vector<unsigned char> args;
  if (const CUresult r = pack_kernel_args(s, f, p.kernelParams, p.extra, &args); r != CUDA_SUCCESS) return r;
  if (p.gridDimX == 0 || p.gridDimY == 0 || p.gridDimZ == 0 || p.blockDimX == 0 || p.blockDimY == 0 ||
      p.blockDimZ == 0)
    return CUDA_ERROR_INVALID_VALUE;
  n->type = CU_GRAPH_NODE_TYPE_KERNEL;
  n->func = f;
  n->grid[0] = p.gridDimX;
  n->grid[1] = p.gridDimY;
  n->grid[2] = p.gridDimZ;
  n->block[0] = p.blockDimX;
  n->block[1] = p.blockDimY;
  n->block[2] = p.blockDimZ;
  n->shmem = p.sharedMemBytes;
  n->args = std::move(args);
  return CUDA_SUCCESS;
}

Handle clone_graph(State& s, Handle g, Handle owner_node, std::map<Handle, Handle>* mapping);

// Adds a node with its dependencies, which must be distinct nodes of the same graph.
CUresult add(State& s, CUgraphNode* out, CUgraph hg, const CUgraphNode* deps, std::size_t n, GraphNode node) {
  if (out == nullptr || (n != 0 && deps == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  Graph* g = find_graph(s, hg);
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::set<Handle> seen;
  for (std::size_t i = 0; i < n; ++i) {
    const GraphNode* d = find_node(s, deps[i]);
    if (d == nullptr || d->graph != from_handle(hg) || !seen.insert(from_handle(deps[i])).second)
      return CUDA_ERROR_INVALID_VALUE;
  }
  node.graph = from_handle(hg);
  for (std::size_t i = 0; i < n; ++i) {
    node.deps.push_back(from_handle(deps[i]));
    node.dep_data.push_back(CUgraphEdgeData{});
  }
  const Handle h = s.new_handle();
  if (node.type == CU_GRAPH_NODE_TYPE_GRAPH) {
    if (find_graph(s, to_handle<CUgraph_st>(node.child)) == nullptr) return CUDA_ERROR_INVALID_VALUE;
    node.child = clone_graph(s, node.child, h, nullptr);  // the node holds a clone
  }
  s.graph_nodes[h] = std::move(node);
  g = find_graph(s, hg);  // the clone may have rehashed the table
  g->nodes.push_back(h);
  *out = to_handle<CUgraphNode_st>(h);
  return CUDA_SUCCESS;
}

Handle clone_graph(State& s, Handle g, Handle owner_node, std::map<Handle, Handle>* mapping) {
  const Graph src = s.graphs.at(g);
  const Handle c = s.new_handle();
  s.graphs[c] = Graph{.ctx = src.ctx, .nodes = {}, .owner_node = owner_node, .user_refs = src.user_refs};
  for (const auto& [obj, n] : src.user_refs) s.user_objects.at(obj).refs += n;
  std::map<Handle, Handle> local;
  std::map<Handle, Handle>& map = mapping != nullptr ? *mapping : local;
  for (Handle h : src.nodes) map[h] = s.new_handle();
  for (Handle h : src.nodes) {
    GraphNode n = s.graph_nodes.at(h);
    n.graph = c;
    n.origin = h;
    for (Handle& d : n.deps) d = map.at(d);
    n.argv.clear();
    if (n.type == CU_GRAPH_NODE_TYPE_GRAPH) n.child = clone_graph(s, n.child, map.at(h), nullptr);
    for (Handle& b : n.bodies) b = clone_graph(s, b, map.at(h), nullptr);
    s.graph_nodes[map.at(h)] = std::move(n);
    s.graphs.at(c).nodes.push_back(map.at(h));
  }
  return c;
}

void destroy_node(State& s, Handle h) {
  const auto it = s.graph_nodes.find(h);
  if (it == s.graph_nodes.end()) return;
  const Handle child = it->second.type == CU_GRAPH_NODE_TYPE_GRAPH ? it->second.child : 0;
  const std::vector<Handle> bodies = it->second.bodies;
  Graph& g = s.graphs.at(it->second.graph);
  std::erase(g.nodes, h);
  for (Handle other : g.nodes) {
    GraphNode& n = s.graph_nodes.at(other);
    for (std::size_t i = n.deps.size(); i-- > 0;)
      if (n.deps[i] == h) {
        n.deps.erase(n.deps.begin() + static_cast<std::ptrdiff_t>(i));
        n.dep_data.erase(n.dep_data.begin() + static_cast<std::ptrdiff_t>(i));
      }
  }
  s.graph_nodes.erase(it);
  if (child != 0) destroy_graph(s, child);
  for (Handle b : bodies) destroy_graph(s, b);
}

// A topological order: Kahn's algorithm, taking ready nodes in creation order.
CUresult topo_order(State& s, const Graph& g, std::vector<Handle>* out) {
  std::map<Handle, std::size_t> waiting;
  for (Handle h : g.nodes) waiting[h] = s.graph_nodes.at(h).deps.size();
  out->clear();
  std::set<Handle> done;
  while (out->size() < g.nodes.size()) {
    bool progress = false;
    for (Handle h : g.nodes) {
      if (done.contains(h)) continue;
      const GraphNode& n = s.graph_nodes.at(h);
      if (std::all_of(n.deps.begin(), n.deps.end(), [&](Handle d) { return done.contains(d); })) {
        out->push_back(h);
        done.insert(h);
        progress = true;
      }
    }
    if (!progress) return CUDA_ERROR_INVALID_VALUE;  // a cycle
  }
  return CUDA_SUCCESS;
}

CUresult build_exec(State& s, Handle g, Exec* out) {
  const Graph& graph = s.graphs.at(g);
  std::vector<Handle> order;
  if (const CUresult r = topo_order(s, graph, &order); r != CUDA_SUCCESS) return r;
  out->ctx = graph.ctx;
  out->graph = g;
  out->steps.clear();
  for (Handle h : order) {
    ExecStep step;
    step.node = h;
    step.params = s.graph_nodes.at(h);
    if (step.params.type == CU_GRAPH_NODE_TYPE_GRAPH) {
      step.child = std::make_shared<Exec>();
      if (const CUresult r = build_exec(s, step.params.child, step.child.get()); r != CUDA_SUCCESS) return r;
    }
    for (Handle b : step.params.bodies) {
      step.bodies.push_back(std::make_shared<Exec>());
      if (const CUresult r = build_exec(s, b, step.bodies.back().get()); r != CUDA_SUCCESS) return r;
    }
    if (step.params.type == CU_GRAPH_NODE_TYPE_CONDITIONAL)
      step.cond_value = s.cond_handles.at(step.params.cond).default_value;
    out->steps.push_back(std::move(step));
  }
  return CUDA_SUCCESS;
}

CUresult run_copy(const CUDA_MEMCPY3D& c) {
  // One 2D copy per slice: slice z of a 3D region is rows (z * height + y) onwards.
  for (std::size_t z = 0; z < c.Depth; ++z) {
    CUDA_MEMCPY2D m{};
    m.srcMemoryType = c.srcMemoryType;
    m.srcHost = c.srcHost;
    m.srcDevice = c.srcDevice;
    m.srcXInBytes = c.srcXInBytes;
    m.srcY = c.srcY + (c.srcZ + z) * c.srcHeight;
    m.srcPitch = c.srcPitch;
    m.dstMemoryType = c.dstMemoryType;
    m.dstHost = c.dstHost;
    m.dstDevice = c.dstDevice;
    m.dstXInBytes = c.dstXInBytes;
    m.dstY = c.dstY + (c.dstZ + z) * c.dstHeight;
    m.dstPitch = c.dstPitch;
    m.WidthInBytes = c.WidthInBytes;
    m.Height = c.Height;
    if (m.Height == 1 && m.srcY == 0 && m.dstY == 0) {
      // A 1D copy needs no pitch.
      if (m.srcPitch == 0) m.srcPitch = m.WidthInBytes;
      if (m.dstPitch == 0) m.dstPitch = m.WidthInBytes;
    }
    if (const CUresult r = cuMemcpy2DUnaligned(&m); r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}

CUresult run_step(const ExecStep& st) {
  const GraphNode& n = st.params;
  if (n.captured) return n.captured();
  switch (n.type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      std::size_t size = n.args.size();
      void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<unsigned char*>(n.args.data()),
                       CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
      return cuLaunchKernel(n.func, n.grid[0], n.grid[1], n.grid[2], n.block[0], n.block[1], n.block[2], n.shmem,
                            nullptr, nullptr, size == 0 ? nullptr : extra);
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      const CUDA_MEMSET_NODE_PARAMS& m = n.memset;
      const std::size_t pitch = m.height == 1 ? m.width * m.elementSize : m.pitch;
      switch (m.elementSize) {
        case 1: return cuMemsetD2D8(m.dst, pitch, static_cast<unsigned char>(m.value), m.width, m.height);
        case 2: return cuMemsetD2D16(m.dst, pitch, static_cast<unsigned short>(m.value), m.width, m.height);
        default: return cuMemsetD2D32(m.dst, pitch, m.value, m.width, m.height);
      }
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY: return run_copy(n.copy);
    case CU_GRAPH_NODE_TYPE_GRAPH: return run_exec(*st.child);
    case CU_GRAPH_NODE_TYPE_HOST: n.host.fn(n.host.userData); return CUDA_SUCCESS;
    case CU_GRAPH_NODE_TYPE_CONDITIONAL: {
      const unsigned v = st.cond_value;
      switch (n.cond_type) {
        case CU_GRAPH_COND_TYPE_IF:
          if (v != 0) return run_exec(*st.bodies[0]);
          return st.bodies.size() == 2 ? run_exec(*st.bodies[1]) : CUDA_SUCCESS;
        case CU_GRAPH_COND_TYPE_SWITCH:
          return v < st.bodies.size() ? run_exec(*st.bodies[v]) : CUDA_SUCCESS;
        default:
          if (v == 0) return CUDA_SUCCESS;
          // Only device code ends a while loop, and the double's kernels cannot.
          log("a WHILE conditional node with a nonzero value cannot end in the double");
          return CUDA_ERROR_NOT_SUPPORTED;
      }
    }
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD: return cuEventRecord(n.event, nullptr);
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT: return cuEventQuery(n.event) == CUDA_ERROR_INVALID_HANDLE
                                                   ? CUDA_ERROR_INVALID_HANDLE
                                                   : CUDA_SUCCESS;
    default: return CUDA_SUCCESS;
  }
}

// The step of an executable graph that stands for node h.
ExecStep* find_step(State& s, CUgraphExec e, CUgraphNode h) {
  const auto it = s.execs.find(from_handle(e));
  if (it == s.execs.end()) return nullptr;
  for (ExecStep& st : it->second.steps)
    if (st.node == from_handle(h)) return &st;
  return nullptr;
}

// The lists, with CUDA's conventions: no array asks for the count; a larger array is
// padded with NULL and the count written back; edge data that is not the default cannot
// be left out (LOSSY_QUERY).
CUresult answer_list(const std::vector<std::pair<Handle, Handle>>& items, const std::vector<CUgraphEdgeData>& data,
                     CUgraphNode* a, CUgraphNode* b, CUgraphEdgeData* d, std::size_t* count) {
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (a == nullptr) {
    *count = items.size();
    return CUDA_SUCCESS;
  }
  const std::size_t n = std::min(*count, items.size());
  bool lossy = false;
  for (std::size_t i = 0; i < *count; ++i) {
    a[i] = i < n ? to_handle<CUgraphNode_st>(items[i].first) : nullptr;
    if (b != nullptr) b[i] = i < n ? to_handle<CUgraphNode_st>(items[i].second) : nullptr;
    if (d != nullptr) d[i] = i < n ? data[i] : CUgraphEdgeData{};
    if (i < n && d == nullptr && !is_default(data[i])) lossy = true;
  }
  if (*count > items.size()) *count = items.size();
  return lossy ? CUDA_ERROR_LOSSY_QUERY : CUDA_SUCCESS;
}

CUresult node_list(CUgraphNode h, bool dependents, CUgraphNode* out, CUgraphEdgeData* data, std::size_t* count) {
  return guarded([&](State& s) -> CUresult {
    const GraphNode* n = find_node(s, h);
    if (n == nullptr || count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::pair<Handle, Handle>> items;
    std::vector<CUgraphEdgeData> ed;
    if (!dependents) {
      for (std::size_t i = 0; i < n->deps.size(); ++i) {
        items.emplace_back(n->deps[i], 0);
        ed.push_back(n->dep_data[i]);
      }
    } else {
      for (Handle other : s.graphs.at(n->graph).nodes) {
        const GraphNode& o = s.graph_nodes.at(other);
        for (std::size_t i = 0; i < o.deps.size(); ++i)
          if (o.deps[i] == from_handle(h)) {
            items.emplace_back(other, 0);
            ed.push_back(o.dep_data[i]);
          }
      }
    }
    return answer_list(items, ed, out, nullptr, data, count);
  });
}

CUresult edges(CUgraph hg, const CUgraphNode* from, const CUgraphNode* to, const CUgraphEdgeData* data,
               std::size_t n, bool remove) {
  return guarded([&](State& s) -> CUresult {
    if (find_graph(s, hg) == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (n != 0 && (from == nullptr || to == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    // Check everything first: an invalid edge changes nothing.
    for (std::size_t i = 0; i < n; ++i) {
      const GraphNode* f = find_node(s, from[i]);
      const GraphNode* t = find_node(s, to[i]);
      if (f == nullptr || t == nullptr || f->graph != from_handle(hg) || t->graph != from_handle(hg) ||
          from[i] == to[i])
        return CUDA_ERROR_INVALID_VALUE;
      const bool present = std::find(t->deps.begin(), t->deps.end(), from_handle(from[i])) != t->deps.end();
      if (present == !remove) return CUDA_ERROR_INVALID_VALUE;
    }
    for (std::size_t i = 0; i < n; ++i) {
      GraphNode& t = *find_node(s, to[i]);
      if (remove) {
        const auto at = std::find(t.deps.begin(), t.deps.end(), from_handle(from[i])) - t.deps.begin();
        t.deps.erase(t.deps.begin() + at);
        t.dep_data.erase(t.dep_data.begin() + at);
      } else {
        t.deps.push_back(from_handle(from[i]));
        t.dep_data.push_back(data != nullptr ? data[i] : CUgraphEdgeData{});
      }
    }
    return CUDA_SUCCESS;
  });
}

// Node parameters, set on the node itself or on an executable graph's step.
template <class F>
CUresult edit(CUgraphExec exec, CUgraphNode node, CUgraphNodeType type, F&& change) {
  return guarded([&](State& s) -> CUresult {
    GraphNode* n = nullptr;
    if (exec != nullptr) {
      if (s.execs.find(from_handle(exec)) == s.execs.end()) return CUDA_ERROR_INVALID_VALUE;
      ExecStep* st = find_step(s, exec, node);
      if (st == nullptr) return CUDA_ERROR_INVALID_VALUE;
      n = &st->params;
    } else {
      n = find_node(s, node);
    }
    if (n == nullptr || n->type != type || n->captured) return CUDA_ERROR_INVALID_VALUE;
    GraphNode copy = *n;
    if (const CUresult r = change(s, &copy); r != CUDA_SUCCESS) return r;
    copy.argv.clear();
    *n = std::move(copy);
    return CUDA_SUCCESS;
  });
}

}  // namespace

void ivcuda::gpu_double::release_user_object(State& s, Handle obj, unsigned long long count) {
  const auto it = s.user_objects.find(obj);
  if (it == s.user_objects.end()) return;
  it->second.refs -= std::min(count, it->second.refs);
  if (it->second.refs == 0) {
    s.dead_user_objects.push_back(it->second);
    s.user_objects.erase(it);
  }
}

void ivcuda::gpu_double::run_user_destructors() {
  std::vector<UserObject> dead;
  guarded([&](State& s) {
    dead.swap(s.dead_user_objects);
    return CUDA_SUCCESS;
  }, false);
  for (const UserObject& u : dead) u.destroy(u.ptr);
}

void ivcuda::gpu_double::destroy_graph(State& s, Handle g) {
  const auto it = s.graphs.find(g);
  if (it == s.graphs.end()) return;
  for (const auto& [obj, n] : it->second.user_refs) release_user_object(s, obj, n);
  const std::vector<Handle> nodes = it->second.nodes;
  for (Handle h : nodes) destroy_node(s, h);
  s.graphs.erase(g);
}

CUresult ivcuda::gpu_double::run_exec(const Exec& exec) {
  return replaying([&] {
    for (const ExecStep& st : exec.steps) {
      if (!st.enabled) continue;
      if (const CUresult r = run_step(st); r != CUDA_SUCCESS) return r;
    }
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  return guarded([&](State& s) -> CUresult {
    if (phGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    const Handle g = s.new_handle();
    s.graphs[g] = Graph{.ctx = ctx, .nodes = {}, .owner_node = 0, .user_refs = {}};
    *phGraph = to_handle<CUgraph_st>(g);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph) {
  const CUresult r = guarded([&](State& s) -> CUresult {
    const Handle g = from_handle(hGraph);
    for (const auto& [stream, c] : s.captures)
      if (c.graph == g) return CUDA_ERROR_INVALID_VALUE;  // still being captured
    if (!s.graphs.contains(g)) return CUDA_ERROR_INVALID_VALUE;
    destroy_graph(s, g);
    return CUDA_SUCCESS;
  });
  run_user_destructors();
  return r;
}

CUresult CUDAAPI cuUserObjectCreate(CUuserObject* out, void* ptr, CUhostFn destroy, unsigned int refs,
                                    unsigned int flags) {
  return guarded([&](State& s) -> CUresult {
    if (out == nullptr || destroy == nullptr || refs == 0 || flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)
      return CUDA_ERROR_INVALID_VALUE;
    const Handle h = s.new_handle();
    s.user_objects[h] = UserObject{.ptr = ptr, .destroy = destroy, .refs = refs};
    *out = to_handle<CUuserObject_st>(h);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuUserObjectRetain(CUuserObject obj, unsigned int count) {
  return guarded([&](State& s) -> CUresult {
    const auto it = s.user_objects.find(from_handle(obj));
    if (it == s.user_objects.end() || count == 0) return CUDA_ERROR_INVALID_VALUE;
    it->second.refs += count;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuUserObjectRelease(CUuserObject obj, unsigned int count) {
  const CUresult r = guarded([&](State& s) -> CUresult {
    if (!s.user_objects.contains(from_handle(obj)) || count == 0) return CUDA_ERROR_INVALID_VALUE;
    release_user_object(s, from_handle(obj), count);
    return CUDA_SUCCESS;
  });
  run_user_destructors();
  return r;
}

CUresult CUDAAPI cuGraphRetainUserObject(CUgraph g, CUuserObject obj, unsigned int count, unsigned int flags) {
  return guarded([&](State& s) -> CUresult {
    Graph* graph = find_graph(s, g);
    const auto it = s.user_objects.find(from_handle(obj));
    if (graph == nullptr || it == s.user_objects.end() || count == 0 ||
        (flags & ~static_cast<unsigned>(CU_GRAPH_USER_OBJECT_MOVE)) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    // MOVE hands over the caller's references; otherwise the graph takes new ones.
    if ((flags & CU_GRAPH_USER_OBJECT_MOVE) == 0) it->second.refs += count;
    graph->user_refs[from_handle(obj)] += count;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphReleaseUserObject(CUgraph g, CUuserObject obj, unsigned int count) {
  const CUresult r = guarded([&](State& s) -> CUresult {
    Graph* graph = find_graph(s, g);
    if (graph == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
    const auto held = graph->user_refs.find(from_handle(obj));
    if (held == graph->user_refs.end() || held->second < count) return CUDA_ERROR_INVALID_VALUE;
    if ((held->second -= count) == 0) graph->user_refs.erase(held);
    release_user_object(s, from_handle(obj), count);
    return CUDA_SUCCESS;
  });
  run_user_destructors();
  return r;
}

CUresult CUDAAPI cuGraphAddKernelNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                      const CUDA_KERNEL_NODE_PARAMS* p) {
  return guarded([&](State& s) -> CUresult {
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    GraphNode node;
    if (const CUresult r = set_kernel(s, &node, *p); r != CUDA_SUCCESS) return r;
    return add(s, out, g, deps, n, std::move(node));
  });
}

CUresult CUDAAPI cuGraphAddMemsetNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                      const CUDA_MEMSET_NODE_PARAMS* p, CUcontext) {
  return guarded([&](State& s) -> CUresult {
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (const CUresult r = check_memset(s, *p); r != CUDA_SUCCESS) return r;
    GraphNode node;
    node.type = CU_GRAPH_NODE_TYPE_MEMSET;
    node.memset = *p;
    return add(s, out, g, deps, n, std::move(node));
  });
}

CUresult CUDAAPI cuGraphAddMemcpyNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                      const CUDA_MEMCPY3D* p, CUcontext) {
  return guarded([&](State& s) -> CUresult {
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (const CUresult r = check_copy(*p); r != CUDA_SUCCESS) return r;
    GraphNode node;
    node.type = CU_GRAPH_NODE_TYPE_MEMCPY;
    node.copy = *p;
    return add(s, out, g, deps, n, std::move(node));
  });
}

CUresult CUDAAPI cuGraphAddHostNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                    const CUDA_HOST_NODE_PARAMS* p) {
  return guarded([&](State& s) -> CUresult {
    if (p == nullptr || p->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    GraphNode node;
    node.type = CU_GRAPH_NODE_TYPE_HOST;
    node.host = *p;
    return add(s, out, g, deps, n, std::move(node));
  });
}
CUresult CUDAAPI cuGraphHostNodeGetParams(CUgraphNode h, CUDA_HOST_NODE_PARAMS* p) {
  return guarded([&](State& s) -> CUresult {
    const GraphNode* n = find_node(s, h);
    if (n == nullptr || p == nullptr || n->type != CU_GRAPH_NODE_TYPE_HOST) return CUDA_ERROR_INVALID_VALUE;
    *p = n->host;
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphHostNodeSetParams(CUgraphNode h, const CUDA_HOST_NODE_PARAMS* p) {
  if (p == nullptr || p->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return edit(nullptr, h, CU_GRAPH_NODE_TYPE_HOST, [&](State&, GraphNode* n) {
    n->host = *p;
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphExecHostNodeSetParams(CUgraphExec e, CUgraphNode h, const CUDA_HOST_NODE_PARAMS* p) {
  if (p == nullptr || p->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return edit(e, h, CU_GRAPH_NODE_TYPE_HOST, [&](State&, GraphNode* n) {
    n->host = *p;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphAddMemAllocNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                        CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  return guarded([&](State& s) -> CUresult {
    const Graph* graph = find_graph(s, g);
    if (p == nullptr || graph == nullptr || p->bytesize == 0 || (p->accessDescCount != 0 && p->accessDescs == nullptr))
      return CUDA_ERROR_INVALID_VALUE;
    if (p->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE || p->poolProps.location.id < 0 ||
        p->poolProps.location.id >= s.device_count)
      return CUDA_ERROR_INVALID_VALUE;
    GraphNode node;
    node.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    node.alloc = *p;
    node.alloc_access.assign(p->accessDescs, p->accessDescs + p->accessDescCount);
    CUdeviceptr d = 0;
    if (const CUresult r = graph_mem_alloc(s, graph->ctx, p->bytesize, &d); r != CUDA_SUCCESS) return r;
    node.alloc.dptr = d;
    if (const CUresult r = add(s, out, g, deps, n, std::move(node)); r != CUDA_SUCCESS) return r;
    GraphNode& added = s.graph_nodes.at(from_handle(*out));
    added.alloc.accessDescs = added.alloc_access.empty() ? nullptr : added.alloc_access.data();
    p->dptr = d;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphAddMemFreeNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                       CUdeviceptr dptr) {
  return guarded([&](State& s) -> CUresult {
    if (check_device_range(s, dptr, 1) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_VALUE;
    GraphNode node;
    node.type = CU_GRAPH_NODE_TYPE_MEM_FREE;
    node.freed = dptr;
    return add(s, out, g, deps, n, std::move(node));
  });
}

CUresult CUDAAPI cuGraphMemAllocNodeGetParams(CUgraphNode h, CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  return guarded([&](State& s) -> CUresult {
    GraphNode* n = find_node(s, h);
    if (n == nullptr || p == nullptr || n->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return CUDA_ERROR_INVALID_VALUE;
    n->alloc.accessDescs = n->alloc_access.empty() ? nullptr : n->alloc_access.data();
    *p = n->alloc;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphMemFreeNodeGetParams(CUgraphNode h, CUdeviceptr* dptr) {
  return guarded([&](State& s) -> CUresult {
    const GraphNode* n = find_node(s, h);
    if (n == nullptr || dptr == nullptr || n->type != CU_GRAPH_NODE_TYPE_MEM_FREE) return CUDA_ERROR_INVALID_VALUE;
    *dptr = n->freed;
    return CUDA_SUCCESS;
  });
}

// A DOT graph of the nodes and edges (the driver's has far more detail).
CUresult CUDAAPI cuGraphDebugDotPrint(CUgraph g, const char* path, unsigned int) {
  std::string dot;
  const CUresult r = guarded([&](State& s) -> CUresult {
    const Graph* graph = find_graph(s, g);
    if (graph == nullptr || path == nullptr) return CUDA_ERROR_INVALID_VALUE;
    dot = "digraph dot {\n";
    for (Handle h : graph->nodes) {
      // The driver's labels name its own addresses (the node, a host node's
      // function and data), which ivcudad must mask for its guests; so do these.
      const GraphNode& n = s.graph_nodes.at(h);
      using ull = unsigned long long;
      char addr[96];
      if (n.type == CU_GRAPH_NODE_TYPE_HOST)
        std::snprintf(addr, sizeof addr, "0x%llx fn 0x%llx data 0x%llx", static_cast<ull>(h),
                      static_cast<ull>(reinterpret_cast<std::uintptr_t>(n.host.fn)),
                      static_cast<ull>(reinterpret_cast<std::uintptr_t>(n.host.userData)));
      else
        std::snprintf(addr, sizeof addr, "0x%llx", static_cast<ull>(h));
      dot += "  n" + std::to_string(h) + " [label=\"type " + std::to_string(n.type) + " at " + addr + "\"];\n";
      for (Handle d : s.graph_nodes.at(h).deps) dot += "  n" + std::to_string(d) + " -> n" + std::to_string(h) + ";\n";
    }
    dot += "}\n";
    return CUDA_SUCCESS;
  });
  if (r != CUDA_SUCCESS) return r;
  std::FILE* f = std::fopen(path, "w");
  if (f == nullptr) return CUDA_ERROR_OPERATING_SYSTEM;
  const bool ok = std::fwrite(dot.data(), 1, dot.size(), f) == dot.size();
  return std::fclose(f) == 0 && ok ? CUDA_SUCCESS : CUDA_ERROR_OPERATING_SYSTEM;
}

// Kernel node attributes are kept and read back; the double's launches ignore them.
CUresult CUDAAPI cuGraphKernelNodeSetAttribute(CUgraphNode h, CUkernelNodeAttrID id, const CUkernelNodeAttrValue* v) {
  return guarded([&](State& s) -> CUresult {
    GraphNode* n = find_node(s, h);
    if (n == nullptr || v == nullptr || n->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
    n->attrs[id] = *v;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphKernelNodeGetAttribute(CUgraphNode h, CUkernelNodeAttrID id, CUkernelNodeAttrValue* v) {
  return guarded([&](State& s) -> CUresult {
    const GraphNode* n = find_node(s, h);
    if (n == nullptr || v == nullptr || n->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
    const auto it = n->attrs.find(id);
    *v = it != n->attrs.end() ? it->second : CUkernelNodeAttrValue{};
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphKernelNodeCopyAttributes(CUgraphNode dst, CUgraphNode src) {
  return guarded([&](State& s) -> CUresult {
    GraphNode* d = find_node(s, dst);
    const GraphNode* from = find_node(s, src);
    if (d == nullptr || from == nullptr || d->type != CU_GRAPH_NODE_TYPE_KERNEL ||
        from->type != CU_GRAPH_NODE_TYPE_KERNEL)
      return CUDA_ERROR_INVALID_VALUE;
    d->attrs = from->attrs;
    return CUDA_SUCCESS;
  });
}

// Graph memory: allocation nodes are ordinary allocations here, so nothing is pooled.
CUresult CUDAAPI cuDeviceGraphMemTrim(CUdevice dev) {
  return guarded([&](State& s) -> CUresult {
    return dev >= 0 && dev < s.device_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
  });
}
CUresult CUDAAPI cuDeviceGetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void* value) {
  return guarded([&](State& s) -> CUresult {
    if (dev < 0 || dev >= s.device_count) return CUDA_ERROR_INVALID_DEVICE;
    if (value == nullptr || attr < CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT || attr > CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)
      return CUDA_ERROR_INVALID_VALUE;
    *static_cast<cuuint64_t*>(value) = 0;
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuDeviceSetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void* value) {
  return guarded([&](State& s) -> CUresult {
    if (dev < 0 || dev >= s.device_count) return CUDA_ERROR_INVALID_DEVICE;
    // Only the high watermarks can be set, and only to 0.
    if (value == nullptr || (attr != CU_GRAPH_MEM_ATTR_USED_MEM_HIGH && attr != CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) ||
        *static_cast<cuuint64_t*>(value) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphConditionalHandleCreate(CUgraphConditionalHandle* out, CUgraph g, CUcontext,
                                                 unsigned int default_value, unsigned int flags) {
  return guarded([&](State& s) -> CUresult {
    if (out == nullptr || find_graph(s, g) == nullptr || (flags & ~static_cast<unsigned>(CU_GRAPH_COND_ASSIGN_DEFAULT)) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    const auto h = static_cast<CUgraphConditionalHandle>(s.new_handle());
    s.cond_handles[h] = CondHandle{.graph = from_handle(g), .default_value = default_value, .flags = flags};
    *out = h;
    return CUDA_SUCCESS;
  });
}

// The generic form: the double makes conditional nodes this way (the forms with a call of
// their own cover the other types).
CUresult CUDAAPI cuGraphAddNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* data,
                                size_t n, CUgraphNodeParams* p) {
  return guarded([&](State& s) -> CUresult {
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (p->type != CU_GRAPH_NODE_TYPE_CONDITIONAL) return CUDA_ERROR_NOT_SUPPORTED;
    for (size_t i = 0; data != nullptr && i < n; ++i)
      if (!is_default(data[i])) return CUDA_ERROR_NOT_SUPPORTED;
    const CUDA_CONDITIONAL_NODE_PARAMS& c = p->conditional;
    const auto ch = s.cond_handles.find(c.handle);
    if (ch == s.cond_handles.end() || ch->second.graph != from_handle(g) || c.phGraph_out == nullptr)
      return CUDA_ERROR_INVALID_VALUE;
    const bool size_ok = c.type == CU_GRAPH_COND_TYPE_IF       ? c.size == 1 || c.size == 2
                         : c.type == CU_GRAPH_COND_TYPE_WHILE  ? c.size == 1
                         : c.type == CU_GRAPH_COND_TYPE_SWITCH ? c.size > 0
                                                               : false;
    if (!size_ok) return CUDA_ERROR_INVALID_VALUE;
    const Graph* graph = find_graph(s, g);
    const Handle ctx = graph->ctx;
    GraphNode node;
    node.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    node.cond = c.handle;
    node.cond_type = c.type;
    if (const CUresult r = add(s, out, g, deps, n, std::move(node)); r != CUDA_SUCCESS) return r;
    const Handle nh = from_handle(*out);
    for (unsigned i = 0; i < c.size; ++i) {
      const Handle b = s.new_handle();
      s.graphs[b] = Graph{.ctx = ctx, .nodes = {}, .owner_node = nh, .user_refs = {}};
      s.graph_nodes.at(nh).bodies.push_back(b);
      c.phGraph_out[i] = to_handle<CUgraph_st>(b);
    }
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphAddEmptyNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n) {
  return guarded([&](State& s) -> CUresult { return add(s, out, g, deps, n, GraphNode{}); });
}

CUresult CUDAAPI cuGraphAddChildGraphNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                          CUgraph child) {
  return guarded([&](State& s) -> CUresult {
    GraphNode node;
    node.type = CU_GRAPH_NODE_TYPE_GRAPH;
    node.child = from_handle(child);
    return add(s, out, g, deps, n, std::move(node));
  });
}

namespace {
CUresult add_event_node(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n, CUevent ev,
                        CUgraphNodeType type) {
  return guarded([&](State& s) -> CUresult {
    if (!s.events.contains(from_handle(ev))) return CUDA_ERROR_INVALID_VALUE;
    GraphNode node;
    node.type = type;
    node.event = ev;
    return add(s, out, g, deps, n, std::move(node));
  });
}
CUresult get_event(CUgraphNode h, CUevent* ev, CUgraphNodeType type) {
  return guarded([&](State& s) -> CUresult {
    const GraphNode* n = find_node(s, h);
    if (n == nullptr || ev == nullptr || n->type != type || n->captured) return CUDA_ERROR_INVALID_VALUE;
    *ev = n->event;
    return CUDA_SUCCESS;
  });
}
CUresult set_event(CUgraphExec e, CUgraphNode h, CUevent ev, CUgraphNodeType type) {
  return edit(e, h, type, [&](State& s, GraphNode* n) -> CUresult {
    if (!s.events.contains(from_handle(ev))) return CUDA_ERROR_INVALID_VALUE;
    n->event = ev;
    return CUDA_SUCCESS;
  });
}
}  // namespace

CUresult CUDAAPI cuGraphAddEventRecordNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                           CUevent ev) {
  return add_event_node(out, g, deps, n, ev, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
}
CUresult CUDAAPI cuGraphAddEventWaitNode(CUgraphNode* out, CUgraph g, const CUgraphNode* deps, size_t n,
                                         CUevent ev) {
  return add_event_node(out, g, deps, n, ev, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}
CUresult CUDAAPI cuGraphEventRecordNodeGetEvent(CUgraphNode h, CUevent* ev) {
  return get_event(h, ev, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
}
CUresult CUDAAPI cuGraphEventWaitNodeGetEvent(CUgraphNode h, CUevent* ev) {
  return get_event(h, ev, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}
CUresult CUDAAPI cuGraphEventRecordNodeSetEvent(CUgraphNode h, CUevent ev) {
  return set_event(nullptr, h, ev, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
}
CUresult CUDAAPI cuGraphEventWaitNodeSetEvent(CUgraphNode h, CUevent ev) {
  return set_event(nullptr, h, ev, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}
CUresult CUDAAPI cuGraphExecEventRecordNodeSetEvent(CUgraphExec e, CUgraphNode h, CUevent ev) {
  return set_event(e, h, ev, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
}
CUresult CUDAAPI cuGraphExecEventWaitNodeSetEvent(CUgraphExec e, CUgraphNode h, CUevent ev) {
  return set_event(e, h, ev, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}

CUresult CUDAAPI cuGraphKernelNodeGetParams(CUgraphNode h, CUDA_KERNEL_NODE_PARAMS* p) {
  return guarded([&](State& s) -> CUresult {
    GraphNode* n = find_node(s, h);
    if (n == nullptr || p == nullptr || n->type != CU_GRAPH_NODE_TYPE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::size_t> offsets;
    if (const CUresult r = kernel_arg_offsets(s, n->func, &offsets); r != CUDA_SUCCESS) return r;
    n->argv.clear();
    for (std::size_t off : offsets) n->argv.push_back(n->args.data() + off);
    *p = CUDA_KERNEL_NODE_PARAMS{};
    p->func = n->func;
    p->gridDimX = n->grid[0];
    p->gridDimY = n->grid[1];
    p->gridDimZ = n->grid[2];
    p->blockDimX = n->block[0];
    p->blockDimY = n->block[1];
    p->blockDimZ = n->block[2];
    p->sharedMemBytes = n->shmem;
    p->kernelParams = n->argv.empty() ? nullptr : n->argv.data();
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphKernelNodeSetParams(CUgraphNode h, const CUDA_KERNEL_NODE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return edit(nullptr, h, CU_GRAPH_NODE_TYPE_KERNEL, [&](State& s, GraphNode* n) { return set_kernel(s, n, *p); });
}
CUresult CUDAAPI cuGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode h, const CUDA_KERNEL_NODE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return edit(e, h, CU_GRAPH_NODE_TYPE_KERNEL, [&](State& s, GraphNode* n) -> CUresult {
    const CUfunction f = p->func != nullptr ? p->func : reinterpret_cast<CUfunction>(p->kern);
    if (f != n->func) return CUDA_ERROR_INVALID_VALUE;  // the function of an executable node stays
    return set_kernel(s, n, *p);
  });
}

CUresult CUDAAPI cuGraphMemsetNodeGetParams(CUgraphNode h, CUDA_MEMSET_NODE_PARAMS* p) {
  return guarded([&](State& s) -> CUresult {
    const GraphNode* n = find_node(s, h);
    if (n == nullptr || p == nullptr || n->type != CU_GRAPH_NODE_TYPE_MEMSET) return CUDA_ERROR_INVALID_VALUE;
    *p = n->memset;
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphMemsetNodeSetParams(CUgraphNode h, const CUDA_MEMSET_NODE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return edit(nullptr, h, CU_GRAPH_NODE_TYPE_MEMSET, [&](State& s, GraphNode* n) -> CUresult {
    if (const CUresult r = check_memset(s, *p); r != CUDA_SUCCESS) return r;
    n->memset = *p;
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphExecMemsetNodeSetParams(CUgraphExec e, CUgraphNode h, const CUDA_MEMSET_NODE_PARAMS* p,
                                                CUcontext) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return edit(e, h, CU_GRAPH_NODE_TYPE_MEMSET, [&](State& s, GraphNode* n) -> CUresult {
    if (const CUresult r = check_memset(s, *p); r != CUDA_SUCCESS) return r;
    n->memset = *p;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphMemcpyNodeGetParams(CUgraphNode h, CUDA_MEMCPY3D* p) {
  return guarded([&](State& s) -> CUresult {
    const GraphNode* n = find_node(s, h);
    if (n == nullptr || p == nullptr || n->type != CU_GRAPH_NODE_TYPE_MEMCPY) return CUDA_ERROR_INVALID_VALUE;
    *p = n->copy;
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphMemcpyNodeSetParams(CUgraphNode h, const CUDA_MEMCPY3D* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return edit(nullptr, h, CU_GRAPH_NODE_TYPE_MEMCPY, [&](State&, GraphNode* n) -> CUresult {
    if (const CUresult r = check_copy(*p); r != CUDA_SUCCESS) return r;
    n->copy = *p;
    return CUDA_SUCCESS;
  });
}
CUresult CUDAAPI cuGraphExecMemcpyNodeSetParams(CUgraphExec e, CUgraphNode h, const CUDA_MEMCPY3D* p, CUcontext) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return edit(e, h, CU_GRAPH_NODE_TYPE_MEMCPY, [&](State&, GraphNode* n) -> CUresult {
    if (const CUresult r = check_copy(*p); r != CUDA_SUCCESS) return r;
    n->copy = *p;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphChildGraphNodeGetGraph(CUgraphNode h, CUgraph* out) {
  return guarded([&](State& s) -> CUresult {
    const GraphNode* n = find_node(s, h);
    if (n == nullptr || out == nullptr || n->type != CU_GRAPH_NODE_TYPE_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    *out = to_handle<CUgraph_st>(n->child);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphExecChildGraphNodeSetParams(CUgraphExec e, CUgraphNode h, CUgraph child) {
  return guarded([&](State& s) -> CUresult {
    ExecStep* st = find_step(s, e, h);
    if (st == nullptr || st->params.type != CU_GRAPH_NODE_TYPE_GRAPH || !s.graphs.contains(from_handle(child)))
      return CUDA_ERROR_INVALID_VALUE;
    auto fresh = std::make_shared<Exec>();
    if (const CUresult r = build_exec(s, from_handle(child), fresh.get()); r != CUDA_SUCCESS) return r;
    if (fresh->steps.size() != st->child->steps.size()) return CUDA_ERROR_INVALID_VALUE;  // topology changed
    st->child = std::move(fresh);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphGetNodes(CUgraph hGraph, CUgraphNode* nodes, size_t* numNodes) {
  return guarded([&](State& s) -> CUresult {
    const Graph* g = find_graph(s, hGraph);
    if (g == nullptr || numNodes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::pair<Handle, Handle>> items;
    for (Handle h : g->nodes) items.emplace_back(h, 0);
    return answer_list(items, std::vector<CUgraphEdgeData>(items.size()), nodes, nullptr, nullptr, numNodes);
  });
}

CUresult CUDAAPI cuGraphGetRootNodes(CUgraph hGraph, CUgraphNode* nodes, size_t* numNodes) {
  return guarded([&](State& s) -> CUresult {
    const Graph* g = find_graph(s, hGraph);
    if (g == nullptr || numNodes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::pair<Handle, Handle>> items;
    for (Handle h : g->nodes)
      if (s.graph_nodes.at(h).deps.empty()) items.emplace_back(h, 0);
    return answer_list(items, std::vector<CUgraphEdgeData>(items.size()), nodes, nullptr, nullptr, numNodes);
  });
}

CUresult CUDAAPI cuGraphGetEdges(CUgraph hGraph, CUgraphNode* from, CUgraphNode* to, CUgraphEdgeData* data,
                                 size_t* numEdges) {
  return guarded([&](State& s) -> CUresult {
    const Graph* g = find_graph(s, hGraph);
    if (g == nullptr || numEdges == nullptr || (from == nullptr) != (to == nullptr) ||
        (data != nullptr && from == nullptr))
      return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::pair<Handle, Handle>> items;
    std::vector<CUgraphEdgeData> ed;
    for (Handle h : g->nodes) {
      const GraphNode& n = s.graph_nodes.at(h);
      for (std::size_t i = 0; i < n.deps.size(); ++i) {
        items.emplace_back(n.deps[i], h);
        ed.push_back(n.dep_data[i]);
      }
    }
    return answer_list(items, ed, from, to, data, numEdges);
  });
}

CUresult CUDAAPI cuGraphNodeGetDependencies(CUgraphNode h, CUgraphNode* deps, CUgraphEdgeData* data, size_t* n) {
  return node_list(h, false, deps, data, n);
}
CUresult CUDAAPI cuGraphNodeGetDependentNodes(CUgraphNode h, CUgraphNode* deps, CUgraphEdgeData* data, size_t* n) {
  return node_list(h, true, deps, data, n);
}
CUresult CUDAAPI cuGraphAddDependencies(CUgraph g, const CUgraphNode* from, const CUgraphNode* to,
                                        const CUgraphEdgeData* data, size_t n) {
  return edges(g, from, to, data, n, false);
}
CUresult CUDAAPI cuGraphRemoveDependencies(CUgraph g, const CUgraphNode* from, const CUgraphNode* to,
                                           const CUgraphEdgeData* data, size_t n) {
  return edges(g, from, to, data, n, true);
}

CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode h, CUgraphNodeType* type) {
  return guarded([&](State& s) -> CUresult {
    const GraphNode* n = find_node(s, h);
    if (n == nullptr || type == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *type = n->type;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphDestroyNode(CUgraphNode h) {
  return guarded([&](State& s) -> CUresult {
    if (find_node(s, h) == nullptr) return CUDA_ERROR_INVALID_VALUE;
    destroy_node(s, from_handle(h));
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphClone(CUgraph* out, CUgraph g) {
  return guarded([&](State& s) -> CUresult {
    if (out == nullptr || find_graph(s, g) == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *out = to_handle<CUgraph_st>(clone_graph(s, from_handle(g), 0, nullptr));
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphNodeFindInClone(CUgraphNode* out, CUgraphNode original, CUgraph clone) {
  return guarded([&](State& s) -> CUresult {
    const Graph* c = find_graph(s, clone);
    if (out == nullptr || c == nullptr || find_node(s, original) == nullptr) return CUDA_ERROR_INVALID_VALUE;
    for (Handle h : c->nodes)
      if (s.graph_nodes.at(h).origin == from_handle(original)) {
        *out = to_handle<CUgraphNode_st>(h);
        return CUDA_SUCCESS;
      }
    return CUDA_ERROR_INVALID_VALUE;
  });
}

CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* phGraphExec, CUgraph hGraph, unsigned long long flags) {
  return guarded([&](State& s) -> CUresult {
    if (phGraphExec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (find_graph(s, hGraph) == nullptr) return CUDA_ERROR_INVALID_VALUE;
    constexpr unsigned long long kKnown = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                          CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
                                          CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |
                                          CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
    if ((flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
    Exec e;
    if (const CUresult r = build_exec(s, from_handle(hGraph), &e); r != CUDA_SUCCESS) return r;
    e.flags = flags;
    // The executable graph holds its own references to the graph's user objects.
    e.user_refs = find_graph(s, hGraph)->user_refs;
    for (const auto& [obj, n] : e.user_refs) s.user_objects.at(obj).refs += n;
    const Handle h = s.new_handle();
    s.execs[h] = std::move(e);
    *phGraphExec = to_handle<CUgraphExec_st>(h);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphExecGetFlags(CUgraphExec e, cuuint64_t* flags) {
  return guarded([&](State& s) -> CUresult {
    const auto it = s.execs.find(from_handle(e));
    if (it == s.execs.end() || flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *flags = it->second.flags;
    return CUDA_SUCCESS;
  });
}

// Nodes pair up by position in creation order; the update takes the new graph's
// parameters when each pair has the same type (and kernels the same function) and the
// dependencies pair up too.
CUresult CUDAAPI cuGraphExecUpdate(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo* info) {
  return guarded([&](State& s) -> CUresult {
    const auto it = s.execs.find(from_handle(e));
    const Graph* ng = find_graph(s, g);
    if (it == s.execs.end() || ng == nullptr || info == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *info = CUgraphExecUpdateResultInfo{};
    Exec& ex = it->second;
    const auto fail = [&](CUgraphExecUpdateResult why, Handle node) {
      info->result = why;
      info->errorNode = to_handle<CUgraphNode_st>(node);
      return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    };
    const auto og = s.graphs.find(ex.graph);
    if (og == s.graphs.end() || og->second.nodes.size() != ng->nodes.size())
      return fail(CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, 0);
    std::map<Handle, Handle> pair;  // new node -> old node
    for (std::size_t i = 0; i < ng->nodes.size(); ++i) pair[ng->nodes[i]] = og->second.nodes[i];
    for (std::size_t i = 0; i < ng->nodes.size(); ++i) {
      const GraphNode& nn = s.graph_nodes.at(ng->nodes[i]);
      const GraphNode& on = s.graph_nodes.at(og->second.nodes[i]);
      if (nn.type != on.type || static_cast<bool>(nn.captured) != static_cast<bool>(on.captured))
        return fail(CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED, ng->nodes[i]);
      if (nn.type == CU_GRAPH_NODE_TYPE_KERNEL && nn.func != on.func)
        return fail(CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED, ng->nodes[i]);
      std::vector<Handle> mapped;
      for (Handle d : nn.deps) mapped.push_back(pair.at(d));
      std::vector<Handle> a = mapped, b = on.deps;
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      if (a != b) return fail(CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, ng->nodes[i]);
    }
    for (ExecStep& st : ex.steps) {
      const auto at = std::find(og->second.nodes.begin(), og->second.nodes.end(), st.node) - og->second.nodes.begin();
      GraphNode fresh = s.graph_nodes.at(ng->nodes[static_cast<std::size_t>(at)]);
      fresh.deps = st.params.deps;
      fresh.graph = st.params.graph;
      fresh.argv.clear();
      if (fresh.type == CU_GRAPH_NODE_TYPE_GRAPH) {
        auto child = std::make_shared<Exec>();
        if (const CUresult r = build_exec(s, fresh.child, child.get()); r != CUDA_SUCCESS) return r;
        st.child = std::move(child);
      }
      st.bodies.clear();
      for (Handle b : fresh.bodies) {
        st.bodies.push_back(std::make_shared<Exec>());
        if (const CUresult r = build_exec(s, b, st.bodies.back().get()); r != CUDA_SUCCESS) return r;
      }
      st.params = std::move(fresh);
    }
    info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphNodeSetEnabled(CUgraphExec e, CUgraphNode h, unsigned int on) {
  return guarded([&](State& s) -> CUresult {
    ExecStep* st = find_step(s, e, h);
    if (st == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const CUgraphNodeType t = st->params.type;
    if (t != CU_GRAPH_NODE_TYPE_KERNEL && t != CU_GRAPH_NODE_TYPE_MEMCPY && t != CU_GRAPH_NODE_TYPE_MEMSET)
      return CUDA_ERROR_INVALID_VALUE;
    st->enabled = on != 0;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuGraphNodeGetEnabled(CUgraphExec e, CUgraphNode h, unsigned int* on) {
  return guarded([&](State& s) -> CUresult {
    ExecStep* st = find_step(s, e, h);
    if (st == nullptr || on == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const CUgraphNodeType t = st->params.type;
    if (t != CU_GRAPH_NODE_TYPE_KERNEL && t != CU_GRAPH_NODE_TYPE_MEMCPY && t != CU_GRAPH_NODE_TYPE_MEMSET)
      return CUDA_ERROR_INVALID_VALUE;
    *on = st->enabled ? 1 : 0;
    return CUDA_SUCCESS;
  });
}

namespace {
CUresult graph_launch(CUgraphExec exec, CUstream stream, bool run) {
  auto snapshot = std::make_shared<Exec>();
  const CUresult r = guarded([&](State& s) -> CUresult {
    const auto it = s.execs.find(from_handle(exec));
    if (it == s.execs.end()) return CUDA_ERROR_INVALID_VALUE;
    if (const CUresult e = check_stream(s, stream); e != CUDA_SUCCESS) return e;
    if (run) *snapshot = it->second;
    return CUDA_SUCCESS;
  });
  if (r != CUDA_SUCCESS || !run) return r;
  // Launched into a capturing stream, the whole graph becomes part of that capture.
  if (CUresult c = CUDA_SUCCESS; capture_call(stream, [snapshot] { return run_exec(*snapshot); }, &c)) return c;
  return run_exec(*snapshot);
}
}  // namespace

CUresult CUDAAPI cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  return graph_launch(hGraphExec, hStream, true);
}

CUresult CUDAAPI cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream) {
  return graph_launch(hGraphExec, hStream, false);
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec) {
  const CUresult r = guarded([&](State& s) -> CUresult {
    const auto it = s.execs.find(from_handle(hGraphExec));
    if (it == s.execs.end()) return CUDA_ERROR_INVALID_VALUE;
    for (const auto& [obj, n] : it->second.user_refs) release_user_object(s, obj, n);
    s.execs.erase(it);
    return CUDA_SUCCESS;
  });
  run_user_destructors();
  return r;
}
