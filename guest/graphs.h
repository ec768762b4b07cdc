// Entry points the graph files (graph_build.cc, graph_edit.cc, graph_exec.cc)
// share with the rest of the guest: the launch packing they reuse
// (launch.cc), host-node pairs (hostfunc.cc), whether a capture may be under
// way (graph_exec.cc), and module enumeration (modules.cc). What only the
// graph files share is guest/graph_internal.h.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <span>

#include "guest/runtime.h"
#include "ivcuda/proto.h"

namespace ivcuda::guest {

// cuLaunchKernel's argument packing, for a plain or a cooperative launch
// (cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_COOPERATIVE), or one with
// launch attributes (cuLaunchKernelEx with clusters and the like).
CUresult launch_kernel(CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned shmem, CUstream s,
                       void** params, void** extra, bool cooperative,
                       std::span<const proto::LaunchAttr> attrs = {}) noexcept;

// Packs a kernel's arguments into buf (info.param_bytes, zeroed by the
// caller) from kernelParams or from cuLaunchKernel's `extra` buffer, with
// the driver's answers for bad ones. An `extra` buffer shorter than the
// parameters is taken, as the driver takes it.
CUresult pack_kernel_params(const FuncInfo& info, void** params, void** extra, std::byte* buf) noexcept;

// The wire form of one stream memory operation (memops.cc).
proto::MemOp memop_to_wire(const CUstreamBatchMemOpParams& p) noexcept;

// True while a stream of this process may be capturing (one began and did
// not end): before that, capture queries are answered without a round trip.
bool any_capture() noexcept;

// Calls cb(user, f) for every kernel of `mod` (cuFFT's export-table hook; modules.cc).
CUresult for_each_module_function(CUmodule mod, void (*cb)(void* user, CUfunction f), void* user) noexcept;

// A graph host node's pair of arena words (hostfunc.cc): *off is its BAR
// offset; the dispatcher runs fn(data) once per step of the pair's `reached`
// word, for the rest of the process. One pair per (fn, data). `once`: a user
// object's destructor, a pair of its own that runs fn once and is then forgotten.
CUresult host_node_pair(CUhostFn fn, void* data, std::uint64_t* off, bool once = false) noexcept;
// The function and data of the pair at BAR offset off.
bool host_node_of(std::uint64_t off, CUhostFn* fn, void** data) noexcept;

}  // namespace ivcuda::guest
