// Peer access between the GPUs granted to one guest. The guest side is
// guest/peer.cc.
#include "host-daemon/worker/worker_internal.h"

namespace ivcuda::host {

using namespace ivcuda::proto;
using namespace detail;

// Guest ordinals map to the GPUs this guest was granted; a peer is only ever
// another of those.

CUresult Worker::on_PeerQuery(Call& c) {
  const auto r = c.req<ReqPeerQuery>();
  if (r.attrib >= kPeerAtomicQuery) {  // atomic capabilities of one operation, to the host or a peer
    if (!valid_device(r.device) || (r.peer != kPeerHost && !valid_device(r.peer))) return CUDA_ERROR_INVALID_DEVICE;
    const std::uint32_t op = r.attrib - kPeerAtomicQuery;
    if (op >= static_cast<std::uint32_t>(CU_ATOMIC_OPERATION_MAX)) return CUDA_ERROR_INVALID_VALUE;
    const CUatomicOperation operation = static_cast<CUatomicOperation>(op);
    unsigned caps = 0;
    const CUdevice a = devices_[dev_index(r.device)];
    const CUresult st =
        r.peer == kPeerHost
            ? cu_.cuDeviceGetHostAtomicCapabilities(&caps, &operation, 1, a)
            : cu_.cuDeviceGetP2PAtomicCapabilities(&caps, &operation, 1, a, devices_[dev_index(r.peer)]);
    if (st != CUDA_SUCCESS) return st;
    c.set_reply(RepValue{caps});
    return CUDA_SUCCESS;
  }
  if (!valid_device(r.device) || !valid_device(r.peer)) return CUDA_ERROR_INVALID_DEVICE;
  const CUdevice a = devices_[dev_index(r.device)];
  const CUdevice b = devices_[dev_index(r.peer)];
  // A value outside CUdevice_P2PAttribute cannot be made one (an enum
  // without a fixed type holds only its enumerators' range): refused here,
  // as the driver refuses an attribute it does not know (found by
  // tests/fuzz/worker_fuzz).
  const std::uint32_t attr = r.attrib - 1;
  if (r.attrib != 0 && (attr < static_cast<std::uint32_t>(CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK) ||
                        attr > static_cast<std::uint32_t>(CU_DEVICE_P2P_ATTRIBUTE_ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED)))
    return CUDA_ERROR_INVALID_VALUE;
  int v = 0;
  const CUresult st =
      r.attrib == 0 ? cu_.cuDeviceCanAccessPeer(&v, a, b)
                    : cu_.cuDeviceGetP2PAttribute(&v, static_cast<CUdevice_P2PAttribute>(attr), a, b);
  if (st != CUDA_SUCCESS) return st;
  c.set_reply(RepValue{v});
  return CUDA_SUCCESS;
}

CUresult Worker::on_PeerAccess(Call& c) {
  const auto r = c.req<ReqPeerAccess>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  const CtxEntry* peer = ctxs_.find(r.peer_ctx);
  if (peer == nullptr || peer->real == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  return r.enable != 0 ? cu_.cuCtxEnablePeerAccess(peer->real, r.flags) : cu_.cuCtxDisablePeerAccess(peer->real);
}

CUresult Worker::on_MemcpyPeer(Call& c) {
  const auto r = c.req<ReqCopyPeer>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  // A null context is the driver's to judge (with unified addressing it
  // accepts one); any other must be this guest's.
  CUcontext real[2] = {nullptr, nullptr};
  const std::uint64_t named[2] = {r.dst_ctx, r.src_ctx};
  for (int i = 0; i < 2; ++i) {
    if (named[i] == 0) continue;
    const CtxEntry* e = ctxs_.find(named[i]);
    if (e == nullptr || e->real == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    real[i] = e->real;
  }
  if (r.bytes == 0) return CUDA_SUCCESS;
  if (!owns_device(r.src, r.bytes) || !owns_device(r.dst, r.bytes)) return CUDA_ERROR_INVALID_VALUE;
  if ((r.flags & kAsync) != 0) {
    CUstream s;
    if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
    return cu_.cuMemcpyPeerAsync(r.dst, real[0], r.src, real[1], r.bytes, s);
  }
  return cu_.cuMemcpyPeer(r.dst, real[0], r.src, real[1], r.bytes);
}

}  // namespace ivcuda::host
