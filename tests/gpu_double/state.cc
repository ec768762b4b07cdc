#include "state.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdlib>
#include <cstring>

namespace ivcuda::gpu_double {

State& state() {
  // Never destroyed: threads may still call in while the process exits.
  static State* s = new State();
  return *s;
}

std::vector<Handle>& ctx_stack() {
  thread_local std::vector<Handle> stack;
  return stack;
}

bool fuzzing() {
  static const bool on = [] {
    const char* v = std::getenv("IVCUDA_GPU_DOUBLE_FUZZ");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return on;
}

void log(const char* fmt, ...) {
  if (fuzzing()) return;
  std::va_list ap;
  va_start(ap, fmt);
  std::fputs("ivcuda GPU test double: ", stderr);
  std::vfprintf(stderr, fmt, ap);
  std::fputc('\n', stderr);
  va_end(ap);
}

const Allocation* State::find(std::uintptr_t p, std::size_t n) const {
  auto it = allocations.upper_bound(p);
  if (it == allocations.begin()) return nullptr;
  --it;
  const Allocation& a = it->second;
  const std::uintptr_t off = p - a.base;  // p >= a.base by construction
  if (off >= a.size || n > a.size - off) return nullptr;
  return &a;
}

void State::release(std::map<std::uintptr_t, Allocation>::iterator it) {
  Allocation& a = it->second;
  if (a.accounted != 0) used[static_cast<std::size_t>(a.device)] -= a.accounted;
  if (a.mapped != 0)
    ::munmap(a.storage, a.mapped);
  else
    std::free(a.storage);
  if (a.ipc_fd >= 0) ::close(a.ipc_fd);
  allocations.erase(it);
}

void State::release_context_resources(Handle ctx) {
  for (auto it = allocations.begin(); it != allocations.end();) {
    auto cur = it++;
    if (cur->second.ctx == ctx) release(cur);
  }
  std::erase_if(streams, [&](const auto& kv) { return kv.second.ctx == ctx; });
  std::erase_if(events, [&](const auto& kv) { return kv.second.ctx == ctx; });
  for (auto it = modules.begin(); it != modules.end();) {
    if (it->second.ctx != ctx) {
      ++it;
      continue;
    }
    for (const auto& [name, fn] : it->second.functions) functions.erase(fn);
    it = modules.erase(it);  // its globals went with the allocations above
  }
  std::vector<Handle> dead_graphs;
  for (const auto& [h, g] : graphs)
    if (g.ctx == ctx && g.owner_node == 0) dead_graphs.push_back(h);
  for (Handle h : dead_graphs) destroy_graph(*this, h);
  std::erase_if(execs, [&](const auto& kv) { return kv.second.ctx == ctx; });
  std::erase_if(captures, [&](const auto& kv) { return !streams.contains(kv.first); });
}

namespace {
thread_local bool t_replaying = false;
}

bool record_if_capturing(State& s, CUstream stream, Node node, CUresult* st) {
  if (t_replaying) return false;
  const auto it = s.captures.find(from_handle(stream));
  if (it == s.captures.end()) return false;
  if (it->second.invalidated) {
    *st = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    return true;
  }
  Capture& c = it->second;
  const Handle h = s.new_handle();
  GraphNode n;
  n.graph = c.graph;
  n.captured = std::move(node);
  n.deps = c.deps;
  n.dep_data.assign(c.deps.size(), CUgraphEdgeData{});
  s.graph_nodes[h] = std::move(n);
  s.graphs.at(c.graph).nodes.push_back(h);
  c.deps = {h};
  *st = CUDA_SUCCESS;
  return true;
}

bool capture_call(CUstream stream, Node node, CUresult* st) {
  if (t_replaying) return false;
  bool recorded = false;
  const CUresult r = guarded([&](State& s) -> CUresult {
    CUresult inner = CUDA_SUCCESS;
    recorded = record_if_capturing(s, stream, std::move(node), &inner);
    return inner;
  });
  *st = r;
  return recorded;
}

CUresult replaying(const std::function<CUresult()>& fn) {
  const bool outer = t_replaying;  // a graph launched inside a graph
  t_replaying = true;
  const CUresult st = fn();
  t_replaying = outer;
  return st;
}

CUresult current_context(State& s, Handle* out) {
  const auto& stack = ctx_stack();
  if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  const auto it = s.contexts.find(stack.back());
  if (it == s.contexts.end()) return CUDA_ERROR_INVALID_CONTEXT;
  // What the real driver says about a current primary context nobody retains.
  if (!it->second.active) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = it->first;
  return CUDA_SUCCESS;
}

CUresult work_context(State& s, Handle* out) {
  if (const CUresult r = current_context(s, out); r != CUDA_SUCCESS) return r;
  return s.fault_of(*out);
}

CUresult check_stream(const State& s, CUstream stream) {
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD)
    return CUDA_SUCCESS;
  return s.streams.contains(from_handle(stream)) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult check_device_range(const State& s, CUdeviceptr p, std::size_t n) {
  if (p == 0) return CUDA_ERROR_INVALID_VALUE;
  return s.find(static_cast<std::uintptr_t>(p), n) != nullptr ? CUDA_SUCCESS
                                                              : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace ivcuda::gpu_double
