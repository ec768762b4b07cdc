// Peer access between the GPUs a guest was granted. Ordinals are the
// application's (after CUDA_VISIBLE_DEVICES); the daemon maps them onto the
// real GPUs and answers with its driver, so what a program learns about a
// link (can-access, attributes) is what the host's hardware says.
#include <cuda.h>

#include <cstdint>

#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"
#include "guest/family.h"

namespace {

CUresult peer_query(int* value, std::uint32_t attrib, CUdevice dev, CUdevice peer) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int a = rt->to_worker(dev);
    const int b = rt->to_worker(peer);
    if (a < 0 || b < 0) return CUDA_ERROR_INVALID_DEVICE;
    ivcuda::proto::RepValue rep{};
    const CUresult st = rt->call<Op::kPeerQuery>(ivcuda::proto::ReqPeerQuery{a, b, attrib, 0}, {}, &rep);
    if (st == CUDA_SUCCESS) *value = static_cast<int>(rep.value);
    return st;
  });
}

// Atomic capabilities, one operation a query (to the host: peer kPeerHost).
// What cuda.h documents is refused here: no arrays, no operations, an
// operation outside CUatomicOperation.
CUresult atomic_caps(unsigned* caps, const CUatomicOperation* ops, unsigned count, CUdevice dev, CUdevice peer,
                     bool host) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    const int a = rt->to_worker(dev);
    const int b = host ? ivcuda::proto::kPeerHost : rt->to_worker(peer);
    if (a < 0 || (!host && (b < 0 || dev == peer))) return CUDA_ERROR_INVALID_DEVICE;
    if (caps == nullptr || ops == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned k = 0; k < count; ++k) {
      const int op = ivcuda::guest::internal::raw_enum(ops[k]);
      if (op < 0 || op >= static_cast<int>(CU_ATOMIC_OPERATION_MAX)) return CUDA_ERROR_INVALID_VALUE;
    }
    for (unsigned k = 0; k < count; ++k) {
      ivcuda::proto::RepValue rep{};
      const auto attrib = ivcuda::proto::kPeerAtomicQuery + static_cast<std::uint32_t>(ivcuda::guest::internal::raw_enum(ops[k]));
      const CUresult st = rt->call<Op::kPeerQuery>(ivcuda::proto::ReqPeerQuery{a, b, attrib, 0}, {}, &rep);
      if (st != CUDA_SUCCESS) return st;
      caps[k] = static_cast<unsigned>(rep.value);
    }
    return CUDA_SUCCESS;
  });
}

CUresult peer_access(CUcontext peer, unsigned flags, bool enable) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    const std::uint64_t ctx = ivcuda::guest::current_ctx();
    if (ctx == 0 || peer == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    return rt->call<Op::kPeerAccess>(ivcuda::proto::ReqPeerAccess{ctx, h(peer), flags, enable ? 1u : 0u});
  });
}

CUresult peer_copy(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
                   CUstream stream, bool async) {
  return guard([&] {
    Runtime* rt = nullptr;
    if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
    const std::uint64_t ctx = ivcuda::guest::current_ctx();
    if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
    ivcuda::proto::ReqCopyPeer r{};
    r.ctx = ctx;
    r.stream = h(stream);
    r.dst = dst;
    r.dst_ctx = h(dst_ctx);
    r.src = src;
    r.src_ctx = h(src_ctx);
    r.bytes = n;
    r.flags = async ? ivcuda::proto::kAsync : 0;
    return async ? rt->post<Op::kMemcpyPeer>(r) : rt->call<Op::kMemcpyPeer>(r);
  });
}

}  // namespace

CUresult cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) { return peer_query(can, 0, dev, peer); }

CUresult cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attrib, CUdevice src, CUdevice dst) {
  if (static_cast<int>(attrib) < 0) return CUDA_ERROR_INVALID_VALUE;
  return peer_query(value, static_cast<std::uint32_t>(attrib) + 1, src, dst);
}

CUresult cuDeviceGetHostAtomicCapabilities(unsigned int* capabilities, const CUatomicOperation* operations,
                                           unsigned int count, CUdevice dev) {
  return atomic_caps(capabilities, operations, count, dev, dev, true);
}

CUresult cuDeviceGetP2PAtomicCapabilities(unsigned int* capabilities, const CUatomicOperation* operations,
                                          unsigned int count, CUdevice srcDevice, CUdevice dstDevice) {
  return atomic_caps(capabilities, operations, count, srcDevice, dstDevice, false);
}

CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) { return peer_access(peer, flags, true); }

CUresult cuCtxDisablePeerAccess(CUcontext peer) { return peer_access(peer, 0, false); }

CUresult cuMemcpyPeer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n) {
  return peer_copy(dst, dst_ctx, src, src_ctx, n, nullptr, false);
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
                           CUstream s) {
  return peer_copy(dst, dst_ctx, src, src_ctx, n, s, true);
}

// cuda.h declares the per-thread variants only when a program asks for them.
extern "C" {
CUresult cuMemcpyPeer_ptds(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n) {
  return cuMemcpyPeer(dst, dst_ctx, src, src_ctx, n);
}

CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
                                CUstream s) {
  return cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, n, s == nullptr ? CU_STREAM_PER_THREAD : s);
}
}  // extern "C"
