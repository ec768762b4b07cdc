// Peer access in the GPU test double. Every emulated device lives in this process's memory,
// so any two distinct devices can reach each other; what the double checks is the
// bookkeeping the real driver enforces: peer access is enabled once per (context, peer)
// pair, a device is never its own peer, and peer copies name live contexts and ranges.
#include <cuda.h>

#include <cstring>
#include <set>
#include <utility>

#include "state.h"

namespace ivcuda::gpu_double {
namespace {

bool valid_dev(const State& s, CUdevice d) { return d >= 0 && d < s.device_count; }

// (current context, peer context) pairs with access enabled. Guarded by the state lock;
// pairs naming a destroyed context are never matched again (handles are not reused).
std::set<std::pair<Handle, Handle>>& enabled() {
  static auto* pairs = new std::set<std::pair<Handle, Handle>>;
  return *pairs;
}

CUresult peer_copy(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
                   const CUstream* stream) {
  return guarded([&](State& s) -> CUresult {
    Handle cur = 0;
    if (const CUresult r = work_context(s, &cur); r != CUDA_SUCCESS) return r;
    // A null context is accepted, as the real driver (unified addressing) does.
    Handle named = 0;
    if ((dst_ctx != nullptr && resolve_context(s, from_handle(dst_ctx), &named) != CUDA_SUCCESS) ||
        (src_ctx != nullptr && resolve_context(s, from_handle(src_ctx), &named) != CUDA_SUCCESS))
      return CUDA_ERROR_INVALID_CONTEXT;
    if (stream != nullptr)
      if (const CUresult r = check_stream(s, *stream); r != CUDA_SUCCESS) return r;
    if (n == 0) return CUDA_SUCCESS;
    if (const CUresult r = check_device_range(s, dst, n); r != CUDA_SUCCESS) return r;
    if (const CUresult r = check_device_range(s, src, n); r != CUDA_SUCCESS) return r;
    std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
    return CUDA_SUCCESS;
  });
}

}  // namespace
}  // namespace ivcuda::gpu_double

using namespace ivcuda::gpu_double;

CUresult CUDAAPI cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  return guarded([&](State& s) -> CUresult {
    if (can == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(s, dev) || !valid_dev(s, peer)) return CUDA_ERROR_INVALID_DEVICE;
    *can = dev != peer ? 1 : 0;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attrib, CUdevice src, CUdevice dst) {
  return guarded([&](State& s) -> CUresult {
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(s, src) || !valid_dev(s, dst) || src == dst) return CUDA_ERROR_INVALID_DEVICE;
    switch (attrib) {
      case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: *value = 0; return CUDA_SUCCESS;
      case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED:
      case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED:
      case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED: *value = 1; return CUDA_SUCCESS;
      default: return CUDA_ERROR_INVALID_VALUE;
    }
  });
}

// Atomics: integer operations signed and unsigned at 32 and 64 bits, the
// float ones at 32 and 64 bits, nothing at 128; the host's link has no
// float minimum or maximum (a plausible PCIe link), peers everything listed.
namespace {
unsigned atomic_caps_of(int op, bool host) {
  constexpr unsigned kInt = CU_ATOMIC_CAPABILITY_SIGNED | CU_ATOMIC_CAPABILITY_UNSIGNED |
                            CU_ATOMIC_CAPABILITY_SCALAR_32 | CU_ATOMIC_CAPABILITY_SCALAR_64;
  constexpr unsigned kFloat = CU_ATOMIC_CAPABILITY_SCALAR_32 | CU_ATOMIC_CAPABILITY_SCALAR_64;
  if (op >= CU_ATOMIC_OPERATION_FLOAT_ADD) return host && op != CU_ATOMIC_OPERATION_FLOAT_ADD ? 0u : kFloat;
  return kInt;
}
CUresult atomic_caps(State& s, unsigned* caps, const CUatomicOperation* ops, unsigned count, CUdevice a, CUdevice b,
                     bool host) {
  if (!valid_dev(s, a) || (!host && (!valid_dev(s, b) || a == b))) return CUDA_ERROR_INVALID_DEVICE;
  if (caps == nullptr || ops == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned k = 0; k < count; ++k) {
    int op = 0;
    std::memcpy(&op, &ops[k], sizeof op);
    if (op < 0 || op >= CU_ATOMIC_OPERATION_MAX) return CUDA_ERROR_INVALID_VALUE;
  }
  for (unsigned k = 0; k < count; ++k) {
    int op = 0;
    std::memcpy(&op, &ops[k], sizeof op);
    caps[k] = atomic_caps_of(op, host);
  }
  return CUDA_SUCCESS;
}
}  // namespace

CUresult CUDAAPI cuDeviceGetHostAtomicCapabilities(unsigned* caps, const CUatomicOperation* ops, unsigned count,
                                                   CUdevice dev) {
  return guarded([&](State& s) -> CUresult { return atomic_caps(s, caps, ops, count, dev, dev, true); });
}

CUresult CUDAAPI cuDeviceGetP2PAtomicCapabilities(unsigned* caps, const CUatomicOperation* ops, unsigned count,
                                                  CUdevice src, CUdevice dst) {
  return guarded([&](State& s) -> CUresult { return atomic_caps(s, caps, ops, count, src, dst, false); });
}

CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  return guarded([&](State& s) -> CUresult {
    Handle cur = 0;
    if (const CUresult r = work_context(s, &cur); r != CUDA_SUCCESS) return r;
    Handle peer_ctx = 0;  // a green context's converted context is its primary context
    if (const CUresult r = resolve_context(s, from_handle(peer), &peer_ctx); r != CUDA_SUCCESS) return r;
    const auto it = s.contexts.find(peer_ctx);
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (it->second.device == s.contexts.at(cur).device) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    if (!enabled().emplace(cur, it->first).second) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peer) {
  return guarded([&](State& s) -> CUresult {
    Handle cur = 0;
    if (const CUresult r = current_context(s, &cur); r != CUDA_SUCCESS) return r;
    Handle peer_ctx = 0;
    if (const CUresult r = resolve_context(s, from_handle(peer), &peer_ctx); r != CUDA_SUCCESS) return r;
    return enabled().erase({cur, peer_ctx}) == 1 ? CUDA_SUCCESS : CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
  });
}

CUresult CUDAAPI cuMemcpyPeer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n) {
  return peer_copy(dst, dst_ctx, src, src_ctx, n, nullptr);
}

CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                                   size_t n, CUstream stream) {
  CUresult st = CUDA_SUCCESS;
  if (capture_call(stream, [=] { return cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, n, stream); }, &st))
    return st;
  return peer_copy(dst, dst_ctx, src, src_ctx, n, &stream);
}
