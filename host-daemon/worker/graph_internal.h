// What the worker's graph files share: graph_build.cc (graphs, nodes, edges,
// lists, and a node's parameters in the driver's terms, checked),
// graph_edit.cc (parameters read back and set, exec updates) and
// graph_exec.cc (capture, instantiation, launches, user objects). The guest's
// side has the same three files (guest/graph_*.cc).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ivcuda/graph_codec.h"
#include "ivcuda/proto.h"

namespace ivcuda::host::graphs {

// Dependencies per request and list entries per reply (a reply must also fit
// the completion ring: longer lists are refused rather than split).
inline constexpr std::uint64_t kMaxListed = 1u << 16;
inline constexpr std::size_t kEdgeBytes = 8;
static_assert(sizeof(CUgraphEdgeData) == kEdgeBytes);

// The driver's callback for every host node of this worker (graph_build.cc):
// its user data is the node's HostNodeSlot.
void CUDA_CB host_node_call(void* user);

// A kernel node's parameters in the driver's form; argv points into `packed`.
struct KernelArgs {
  CUDA_KERNEL_NODE_PARAMS params{};
  std::vector<void*> argv;
};

// f: the function the guest named (its FuncEntry), or null.
template <class Func>
CUresult kernel_args(const Func* f, const proto::GraphNodeParams& p, std::span<const std::byte> packed,
                     KernelArgs* k) {
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

}  // namespace ivcuda::host::graphs
