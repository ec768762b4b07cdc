// Stream capture and graphs, cooperative launches, module enumeration, and
// the occupancy and tensor-map calls the CUDA 13 libraries make. (Stream-
// ordered memory and pools are guest/pools.cc.)
//
// Graphs and executable graphs are host handles: the host's driver
// does the work. Capture is forwarded as it is: the host stream captures
// what the guest's calls enqueue on it, so kernels, memsets, device copies
// and copies of page-locked (arena) memory become graph nodes unchanged.
// Copies of pageable memory cannot: they pass through memory the worker
// reuses once the call returns, so a capturing stream refuses them with
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and the capture is invalidated.
//
// This file sees cuda.h without its renaming macros, so every ABI
// generation is defined under its exact exported name.
#define __CUDA_API_VERSION_INTERNAL
#include <cuda.h>

#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "guest/graphs.h"
#include "guest/guard.h"
#include "guest/runtime.h"

using ivcuda::guest::current_ctx;
using ivcuda::guest::guard;
using ivcuda::guest::Runtime;
namespace proto = ivcuda::proto;
using proto::Op;

namespace {

std::uint64_t h(const void* p) { return reinterpret_cast<std::uint64_t>(p); }
CUstream ptsz(CUstream s) { return s == nullptr ? CU_STREAM_PER_THREAD : s; }

Runtime* runtime(CUresult* st) {
  Runtime* rt = Runtime::current();
  *st = rt == nullptr ? CUDA_ERROR_NOT_INITIALIZED : rt->dead() ? CUDA_ERROR_DEVICE_UNAVAILABLE : CUDA_SUCCESS;
  return *st == CUDA_SUCCESS ? rt : nullptr;
}

#define NEED_RT()             \
  CUresult st_rt_;            \
  Runtime* rt = runtime(&st_rt_); \
  if (rt == nullptr) return st_rt_

#define NEED_CTX()                         \
  const std::uint64_t ctx = current_ctx(); \
  if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT

bool known_stream(Runtime* rt, CUstream s) {
  const auto v = h(s);
  if (v == 0 || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return true;
  std::lock_guard lk(rt->books_mu);
  return rt->streams.count(v) != 0;
}

// Streams this process began capturing and has not ended. While there are
// none, no stream of ours can be capturing and the capture queries (cuBLAS
// asks five times per GEMM) are answered here without a round trip.
struct Captures {
  std::mutex mu;
  std::unordered_map<std::uint64_t, unsigned> streams;
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
    }
    return st;
  });
}

// The capture state of s. The host answers only while some stream of ours
// captures; the graph under construction and its dependency nodes are the
// host driver's and are not handed out (NULL, 0).
CUresult capture_info(CUstream s, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                      const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* ndeps) {
  return guard([&] {
    if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::RepCaptureInfo rep{};
    if (ivcuda::guest::any_capture()) {
      NEED_RT();
      NEED_CTX();
      if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
      const CUresult st = rt->call<Op::kStreamCaptureInfo>(proto::ReqHandle{ctx, h(s)}, {}, &rep);
      if (st != CUDA_SUCCESS) return st;
      if (rep.status == CU_STREAM_CAPTURE_STATUS_ACTIVE && (graph != nullptr || deps != nullptr))
        ivcuda::guest::log_once("capture-graph",
                                "cuStreamGetCaptureInfo: the graph being captured stays on the host; NULL returned");
    }
    *status = static_cast<CUstreamCaptureStatus>(rep.status);
    if (id != nullptr) *id = rep.id;
    if (graph != nullptr) *graph = nullptr;
    if (deps != nullptr) *deps = nullptr;
    if (edges != nullptr) *edges = nullptr;
    if (ndeps != nullptr) *ndeps = 0;
    return CUDA_SUCCESS;
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
    return rt->post<op>(proto::ReqGraphLaunch{ctx, h(exec), h(s)});
  });
}

// Names of a module's kernels, as the host's driver enumerates them.
CUresult module_function_names(CUmodule mod, std::vector<std::string>* names) {
  NEED_RT();
  if (mod == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  proto::RepValue rep{};
  std::vector<std::byte> extra;
  const CUresult st = rt->call<Op::kModuleEnumerate>(proto::ReqHandle{current_ctx(), h(mod)}, {}, &rep, &extra);
  if (st != CUDA_SUCCESS) return st;
  std::size_t at = 0;
  for (std::int64_t i = 0; i < rep.value; ++i) {
    std::uint32_t len = 0;
    if (extra.size() - at < sizeof len) return CUDA_ERROR_UNKNOWN;
    std::memcpy(&len, extra.data() + at, sizeof len);
    at += sizeof len;
    if (len == 0 || extra.size() - at < len) return CUDA_ERROR_UNKNOWN;
    names->emplace_back(reinterpret_cast<const char*>(extra.data() + at), len);
    at += len;
  }
  return CUDA_SUCCESS;
}

}  // namespace

// ==================================================================== launches

CUresult ivcuda::guest::launch_kernel(CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned shmem,
                                      CUstream s, void** params, void** extra, bool cooperative,
                                      std::span<const proto::LaunchAttr> attrs) noexcept {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    if (attrs.size() > proto::kMaxLaunchAttrs) return CUDA_ERROR_INVALID_VALUE;
    f = kernel_function(f);
    // The record's tail: the attributes (LaunchEx only), then the packed
    // parameters. Small tails (nearly all launches) stay on the stack.
    const std::size_t attr_bytes = attrs.size_bytes();
    std::byte small[1024];
    std::vector<std::byte> large;
    std::span<std::byte> tail;
    {
      std::lock_guard lk(rt->books_mu);
      auto it = rt->funcs.find(h(f));
      if (it == rt->funcs.end()) return CUDA_ERROR_INVALID_HANDLE;
      const auto& info = it->second;
      if (attr_bytes + info.param_bytes <= sizeof small) {
        tail = std::span<std::byte>(small, attr_bytes + info.param_bytes);
      } else {
        large.resize(attr_bytes + info.param_bytes);
        tail = large;
      }
      std::memset(tail.data(), 0, tail.size());
      if (attr_bytes != 0) std::memcpy(tail.data(), attrs.data(), attr_bytes);
      std::byte* buf = tail.data() + attr_bytes;
      if (params != nullptr) {
        // kernelParams carries no sizes: pack by the layout the host learned.
        for (size_t i = 0; i < info.params.size(); ++i) {
          if (params[i] == nullptr) return CUDA_ERROR_INVALID_VALUE;
          std::memcpy(buf + info.params[i].offset, params[i], info.params[i].size);
        }
      } else if (extra != nullptr) {
        const void* p = nullptr;
        size_t n = 0;
        for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
          if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) p = extra[i + 1];
          else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) n = *static_cast<const size_t*>(extra[i + 1]);
          else return CUDA_ERROR_INVALID_VALUE;
        }
        if (p == nullptr || n < info.param_bytes) return CUDA_ERROR_INVALID_VALUE;
        std::memcpy(buf, p, info.param_bytes);
      } else if (!info.params.empty()) {
        return CUDA_ERROR_INVALID_VALUE;
      }
    }
    for (int i = 0; i < 3; ++i)
      if (grid[i] == 0 || block[i] == 0) return CUDA_ERROR_INVALID_VALUE;
    proto::ReqLaunch r{};
    r.ctx = ctx;
    r.function = h(f);
    r.stream = h(s);
    std::memcpy(r.grid, grid, sizeof r.grid);
    std::memcpy(r.block, block, sizeof r.block);
    r.shared_bytes = shmem;
    r.param_bytes = static_cast<std::uint32_t>(tail.size() - attr_bytes);
    if (!attrs.empty()) {
      proto::ReqLaunchEx x{};
      x.launch = r;
      x.attr_count = static_cast<std::uint32_t>(attrs.size());
      return rt->post<Op::kLaunchEx>(x, tail);
    }
    return cooperative ? rt->post<Op::kLaunchCooperative>(r, tail) : rt->post<Op::kLaunch>(r, tail);
  });
}

CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                           unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                           CUstream s, void** params) {
  const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
  return ivcuda::guest::launch_kernel(f, grid, block, shmem, s, params, nullptr, true);
}
CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                                unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                                CUstream s, void** params) {
  return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, ptsz(s), params);
}

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

// Counting is forwarded; the nodes themselves live on the host.
CUresult CUDAAPI cuGraphGetNodes(CUgraph graph, CUgraphNode* nodes, size_t* count) {
  return guard([&] {
    NEED_RT();
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (nodes != nullptr) {
      return ivcuda::guest::not_supported("cuGraphGetNodes: node handles are not forwarded yet (count only)");
    }
    proto::RepValue rep{};
    const CUresult st = rt->call<Op::kGraphNodeCount>(proto::ReqHandle{current_ctx(), h(graph)}, {}, &rep);
    if (st == CUDA_SUCCESS) *count = static_cast<size_t>(rep.value);
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

// ==================================================================== module enumeration

CUresult CUDAAPI cuModuleGetFunctionCount(unsigned int* count, CUmodule mod) {
  return guard([&] {
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::string> names;
    const CUresult st = module_function_names(mod, &names);
    if (st == CUDA_SUCCESS) *count = static_cast<unsigned>(names.size());
    return st;
  });
}

CUresult CUDAAPI cuModuleEnumerateFunctions(CUfunction* fns, unsigned int n, CUmodule mod) {
  return guard([&] {
    if (fns == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::string> names;
    CUresult st = module_function_names(mod, &names);
    if (st != CUDA_SUCCESS) return st;
    if (n > names.size()) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; ++i)
      if ((st = cuModuleGetFunction(&fns[i], mod, names[i].c_str())) != CUDA_SUCCESS) return st;
    return CUDA_SUCCESS;
  });
}

CUresult ivcuda::guest::for_each_module_function(CUmodule mod, void (*cb)(void*, CUfunction), void* user) noexcept {
  return guard([&] {
    if (cb == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::vector<std::string> names;
    CUresult st = module_function_names(mod, &names);
    if (st != CUDA_SUCCESS) return st;
    for (const auto& name : names) {
      CUfunction f = nullptr;
      if ((st = cuModuleGetFunction(&f, mod, name.c_str())) != CUDA_SUCCESS) return st;
      cb(user, f);
    }
    return CUDA_SUCCESS;
  });
}

// ==================================================================== occupancy

CUresult CUDAAPI cuOccupancyMaxActiveClusters(int* clusters, CUfunction f, const CUlaunchConfig* cfg) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (clusters == nullptr || cfg == nullptr || (cfg->numAttrs != 0 && cfg->attrs == nullptr))
      return CUDA_ERROR_INVALID_VALUE;
    if (!known_stream(rt, cfg->hStream)) return CUDA_ERROR_INVALID_HANDLE;
    proto::ReqOccCluster r{};
    r.ctx = ctx;
    r.function = h(f);
    r.stream = h(cfg->hStream);
    r.grid[0] = cfg->gridDimX;
    r.grid[1] = cfg->gridDimY;
    r.grid[2] = cfg->gridDimZ;
    r.block[0] = cfg->blockDimX;
    r.block[1] = cfg->blockDimY;
    r.block[2] = cfg->blockDimZ;
    r.shared_bytes = cfg->sharedMemBytes;
    // Only the attributes that shape a cluster matter to this question.
    for (unsigned i = 0; i < cfg->numAttrs; ++i) {
      const CUlaunchAttribute& a = cfg->attrs[i];
      if (a.id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
        r.cluster[0] = a.value.clusterDim.x;
        r.cluster[1] = a.value.clusterDim.y;
        r.cluster[2] = a.value.clusterDim.z;
      } else if (a.id == CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE) {
        r.policy = static_cast<proto::u32>(a.value.clusterSchedulingPolicyPreference);
      }
    }
    proto::RepValue rep{};
    const CUresult st = rt->call<Op::kOccupancyCluster>(r, {}, &rep);
    if (st == CUDA_SUCCESS) *clusters = static_cast<int>(rep.value);
    return st;
  });
}

// Without a callback the host's driver searches. With one, the callback
// must run here, so the search runs here too: from the largest block size
// down in warp steps, keep the size whose resident threads per
// multiprocessor are highest, stopping early at full occupancy.
CUresult CUDAAPI cuOccupancyMaxPotentialBlockSizeWithFlags(int* min_grid, int* block_size, CUfunction f,
                                                           CUoccupancyB2DSize smem_of, size_t smem, int limit,
                                                           unsigned int flags) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (min_grid == nullptr || block_size == nullptr || limit < 0) return CUDA_ERROR_INVALID_VALUE;
    if (smem_of == nullptr) {
      proto::ReqOccupancy r{};
      r.ctx = ctx;
      r.function = h(f);
      r.dynamic_smem = smem;
      r.block_size = limit;
      r.flags = flags;
      r.kind = proto::kOccMaxPotentialBlockSize;
      proto::RepValue rep{};
      const CUresult st = rt->call<Op::kOccupancy>(r, {}, &rep);
      if (st != CUDA_SUCCESS) return st;
      const auto v = static_cast<std::uint64_t>(rep.value);
      *min_grid = static_cast<int>(static_cast<std::uint32_t>(v >> 32));
      *block_size = static_cast<int>(static_cast<std::uint32_t>(v));
      return CUDA_SUCCESS;
    }
    CUdevice dev = 0;
    CUresult st = cuCtxGetDevice(&dev);
    if (st != CUDA_SUCCESS) return st;
    int sm_threads = 0, warp = 0, sms = 0, dev_block = 0, fn_block = 0;
    if ((st = cuDeviceGetAttribute(&sm_threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev)) ||
        (st = cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev)) ||
        (st = cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)) ||
        (st = cuDeviceGetAttribute(&dev_block, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, dev)) ||
        (st = cuFuncGetAttribute(&fn_block, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f)))
      return st;
    if (warp <= 0) return CUDA_ERROR_INVALID_VALUE;
    int cap = std::min(dev_block, fn_block);
    if (limit > 0) cap = std::min(cap, limit);
    int best_block = 0, best_blocks = 0, best_threads = 0;
    const int top = (cap + warp - 1) / warp * warp;
    for (int aligned = top; aligned > 0; aligned -= warp) {
      const int b = std::min(cap, aligned);
      int blocks = 0;
      st = cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, f, b, smem_of(b), flags);
      if (st != CUDA_SUCCESS) return st;
      if (blocks * b > best_threads) {
        best_threads = blocks * b;
        best_block = b;
        best_blocks = blocks;
      }
      if (best_threads == sm_threads) break;
    }
    *min_grid = best_blocks * sms;
    *block_size = best_block;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuOccupancyMaxPotentialBlockSize(int* min_grid, int* block_size, CUfunction f,
                                                  CUoccupancyB2DSize smem_of, size_t smem, int limit) {
  return cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid, block_size, f, smem_of, smem, limit, 0);
}

// ==================================================================== tensor maps

CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* addr,
                                        const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                        const cuuint32_t* elem_strides, CUtensorMapInterleave interleave,
                                        CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                        CUtensorMapFloatOOBfill oob) {
  return guard([&] {
    NEED_RT();
    if (map == nullptr || rank == 0 || rank > proto::kTensorMaxRank || dims == nullptr || box == nullptr ||
        elem_strides == nullptr || (rank > 1 && strides == nullptr))
      return CUDA_ERROR_INVALID_VALUE;
    proto::ReqTensorMap r{};
    r.ctx = current_ctx();
    r.global_address = h(addr);
    std::memcpy(r.global_dim, dims, rank * sizeof *dims);
    if (rank > 1) std::memcpy(r.global_strides, strides, (rank - 1) * sizeof *strides);
    std::memcpy(r.box_dim, box, rank * sizeof *box);
    std::memcpy(r.element_strides, elem_strides, rank * sizeof *elem_strides);
    r.data_type = static_cast<proto::u32>(type);
    r.rank = rank;
    r.interleave = static_cast<proto::u32>(interleave);
    r.swizzle = static_cast<proto::u32>(swizzle);
    r.l2_promotion = static_cast<proto::u32>(l2);
    r.oob_fill = static_cast<proto::u32>(oob);
    proto::RepTensorMap rep{};
    const CUresult st = rt->call<Op::kTensorMapEncodeTiled>(r, {}, &rep);
    if (st == CUDA_SUCCESS) std::memcpy(map, &rep, sizeof rep);
    return st;
  });
}

bool ivcuda::guest::any_capture() noexcept {
  Captures& c = captures();
  std::lock_guard lk(c.mu);
  return !c.streams.empty();
}
