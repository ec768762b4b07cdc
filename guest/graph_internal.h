// What the guest's graph files share: graph_build.cc (graphs, nodes of each
// kind, edges, lists, clones), graph_edit.cc (node parameters read and set,
// on nodes and on executable graphs) and graph_exec.cc (capture,
// instantiation, launches). The wire form of a node's parameters is
// ivcuda/graph_codec.h's, shared with the worker.
//
// The graph files see cuda.h without its renaming macros (each defines
// __CUDA_API_VERSION_INTERNAL first), so that every ABI generation is
// defined under its exact exported name.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "guest/internal.h"
#include "guest/runtime.h"
#include "ivcuda/graph_codec.h"
#include "ivcuda/proto.h"

namespace ivcuda::guest::graphs {

// What each graph file takes in with `using namespace ivcuda::guest::graphs`.
using ivcuda::guest::current_ctx;
using ivcuda::guest::guard;
using ivcuda::guest::Runtime;
using ivcuda::guest::internal::h;
namespace codec = ivcuda::codec;
namespace proto = ivcuda::proto;
using proto::Op;

// The most dependencies or edges one request carries (the worker's limit too).
inline constexpr std::size_t kMaxDeps = std::size_t{1} << 16;

inline CUgraphNode node_of(std::uint64_t v) { return reinterpret_cast<CUgraphNode>(v); }

// One ReqGraphQuery (proto.h lists the kinds): the answer in *value, a
// list's or a text's bytes in *extra.
CUresult query(std::uint32_t kind, std::uint64_t handle, std::uint64_t other, std::int64_t* value,
               std::uint64_t capacity = 0, std::uint32_t flags = 0, std::vector<std::byte>* extra = nullptr);

// A question whose answer is one value, a handle or a number, written to *out
// (which the caller must give) when the host answers CUDA_SUCCESS.
template <class T>
CUresult ask(std::uint32_t kind, std::uint64_t handle, std::uint64_t other, T* out, std::uint64_t capacity = 0,
             std::uint32_t flags = 0) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::int64_t v = 0;
  const CUresult st = query(kind, handle, other, &v, capacity, flags);
  if (st != CUDA_SUCCESS) return st;
  if constexpr (std::is_pointer_v<T>)
    *out = reinterpret_cast<T>(v);
  else
    *out = static_cast<T>(v);
  return CUDA_SUCCESS;
}

// ---- how a node's parameters travel (graph_build.cc): what an add and a set both send

// A kernel's function and arguments, packed by the layout the guest learned
// when it looked the function up, as for a launch.
CUresult pack_kernel_args(Runtime* rt, CUfunction func, void** params, void** extra, proto::GraphNodeParams* out,
                          std::vector<std::byte>* packed);
// CUDA_KERNEL_NODE_PARAMS v1, v2 or v3 (the caller's, maybe null), naming function f.
template <class K>
CUresult pack_kernel(Runtime* rt, const K* k, CUfunction f, proto::GraphNodeParams* out,
                     std::vector<std::byte>* packed) {
  if (k == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = pack_kernel_args(rt, f, k->kernelParams, k->extra, out, packed); st != CUDA_SUCCESS) return st;
  codec::kernel_to_wire(*k, out);
  return CUDA_SUCCESS;
}
// v2 and v3 name the kernel either as a function or as a CUkernel.
template <class K>
CUfunction kernel_of(const K& k) {
  return k.func != nullptr ? k.func : reinterpret_cast<CUfunction>(k.kern);
}
// A memcpy node: device memory as it is, page-locked memory as arena offsets.
CUresult pack_copy(Runtime* rt, const CUDA_MEMCPY3D& m, proto::GraphNodeParams* out);
// A host node: the pair of arena words the dispatcher watches (hostfunc.cc).
CUresult pack_host(CUhostFn fn, void* data, proto::GraphNodeParams* out);
// cuGraphAddNode's generic form, for the types forwarded so.
CUresult pack_generic(Runtime* rt, const CUgraphNodeParams& g, proto::GraphNodeParams* out,
                      std::vector<std::byte>* packed);
// The tail of an add or a set: the parameters, then a kernel's packed arguments.
std::vector<std::byte> params_tail(const proto::GraphNodeParams& p, const std::vector<std::byte>& packed);

// ---- graph_edit.cc

// The kernel arguments cuGraphKernelNodeGetParams handed out for a node,
// freed when the node is destroyed.
void forget_kernel_args(std::uint64_t node);

}  // namespace ivcuda::guest::graphs
