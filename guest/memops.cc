// Stream memory operations: cuStreamWaitValue32/64, cuStreamWriteValue32/64
// and cuStreamBatchMemOp (the _v2 generation CUDA 12 and 13 programs call,
// and their per-thread-stream forms). Each becomes one posted request; the
// host (host-daemon/worker/memops.cc) checks that every address is device memory
// of this guest and makes the same driver call. The deprecated v1 entry
// points stay unforwarded (docs/api-coverage.md).
//
// This file sees cuda.h without its renaming macros, so every ABI
// generation is defined under its exact exported name.
#define __CUDA_API_VERSION_INTERNAL
#include <cuda.h>

#include <cstdint>
#include <vector>

#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"
#include "guest/family.h"

namespace ivcuda::guest {

// The wire form of one CUstreamBatchMemOpParams. The union's tag says which
// member counts.
proto::MemOp memop_to_wire(const CUstreamBatchMemOpParams& p) noexcept {
  proto::MemOp m{};
  m.operation = static_cast<std::uint32_t>(p.operation);
  switch (p.operation) {
    case CU_STREAM_MEM_OP_WAIT_VALUE_32:
    case CU_STREAM_MEM_OP_WAIT_VALUE_64:
      m.address = p.waitValue.address;
      m.value = p.operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 ? p.waitValue.value : p.waitValue.value64;
      m.flags = p.waitValue.flags;
      break;
    case CU_STREAM_MEM_OP_WRITE_VALUE_32:
    case CU_STREAM_MEM_OP_WRITE_VALUE_64:
      m.address = p.writeValue.address;
      m.value = p.operation == CU_STREAM_MEM_OP_WRITE_VALUE_32 ? p.writeValue.value : p.writeValue.value64;
      m.flags = p.writeValue.flags;
      break;
    case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES: m.flags = p.flushRemoteWrites.flags; break;
    case CU_STREAM_MEM_OP_BARRIER: m.flags = p.memoryBarrier.flags; break;
    default: break;  // the host refuses an operation it does not know
  }
  return m;
}

}  // namespace ivcuda::guest

namespace {

// Whether [addr, addr + n) is device memory of this process: an allocation or
// mapping, or page-locked memory's device alias. The host checks again (it
// trusts no guest); checking here answers at once, as the driver does,
// instead of at the next synchronising call of a posted request.
bool device_words(Runtime* rt, std::uint64_t addr, std::uint64_t n) {
  if (ivcuda::guest::internal::is_device(rt, addr) && ivcuda::guest::internal::is_device(rt, addr + n - 1)) return true;
  const std::uint64_t base = rt->hello().arena_device_base;
  const auto& l = rt->layout();
  return base != 0 && addr >= base + l.arena_off && addr - base - l.arena_off <= l.arena_size &&
         n <= l.arena_size - (addr - base - l.arena_off);
}

bool has_address(std::uint32_t op) {
  return op == CU_STREAM_MEM_OP_WAIT_VALUE_32 || op == CU_STREAM_MEM_OP_WAIT_VALUE_64 ||
         op == CU_STREAM_MEM_OP_WRITE_VALUE_32 || op == CU_STREAM_MEM_OP_WRITE_VALUE_64;
}
std::uint64_t op_bytes(std::uint32_t op) {
  return op == CU_STREAM_MEM_OP_WAIT_VALUE_64 || op == CU_STREAM_MEM_OP_WRITE_VALUE_64 ? 8 : 4;
}

CUresult post_ops(CUstream s, const proto::MemOp* ops, unsigned count, unsigned flags, bool single) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    for (unsigned i = 0; i < count; ++i)
      if (has_address(ops[i].operation) && !device_words(rt, ops[i].address, op_bytes(ops[i].operation)))
        return CUDA_ERROR_INVALID_VALUE;
    proto::ReqStreamMemOps r{};
    r.ctx = ctx;
    r.stream = h(s);
    r.count = count;
    r.flags = flags;
    r.single = single ? 1 : 0;
    // A wait on page-locked memory is released by a store from the CPU
    // (guest/host_polls.cc).
    bool polls_host = false;
    for (unsigned i = 0; i < count && Runtime::wants_host_polls(); ++i) {
      const std::uint32_t o = ops[i].operation;
      polls_host |= (o == CU_STREAM_MEM_OP_WAIT_VALUE_32 || o == CU_STREAM_MEM_OP_WAIT_VALUE_64) &&
                    rt->maps_page_locked(ops[i].address);
    }
    const auto tail = std::as_bytes(std::span<const proto::MemOp>(ops, count));
    return polls_host ? rt->post_host_polled<Op::kStreamMemOps>(ctx, h(s), r, tail)
                      : rt->post<Op::kStreamMemOps>(r, tail);
  });
}

CUresult one(CUstream s, CUstreamBatchMemOpType op, CUdeviceptr addr, std::uint64_t value, unsigned flags) {
  proto::MemOp m{};
  m.operation = static_cast<std::uint32_t>(op);
  m.address = addr;
  m.value = value;
  m.flags = flags;
  return post_ops(s, &m, 1, 0, true);
}

CUresult batch(CUstream s, unsigned count, const CUstreamBatchMemOpParams* params, unsigned flags) {
  // "count ... must be less than 256" (the driver's documentation); the
  // host refuses anything above its wire limit too.
  if (count == 0) return CUDA_SUCCESS;  // the driver's answer: nothing to enqueue
  if (count > proto::kMaxMemOps || params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<proto::MemOp> ops(count);
  for (unsigned i = 0; i < count; ++i) ops[i] = ivcuda::guest::memop_to_wire(params[i]);
  return post_ops(s, ops.data(), count, flags, false);
}

}  // namespace

CUresult CUDAAPI cuStreamWaitValue32_v2(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  return one(s, CU_STREAM_MEM_OP_WAIT_VALUE_32, addr, value, flags);
}
CUresult CUDAAPI cuStreamWriteValue32_v2(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  return one(s, CU_STREAM_MEM_OP_WRITE_VALUE_32, addr, value, flags);
}
CUresult CUDAAPI cuStreamWaitValue64_v2(CUstream s, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  return one(s, CU_STREAM_MEM_OP_WAIT_VALUE_64, addr, value, flags);
}
CUresult CUDAAPI cuStreamWriteValue64_v2(CUstream s, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  return one(s, CU_STREAM_MEM_OP_WRITE_VALUE_64, addr, value, flags);
}
CUresult CUDAAPI cuStreamBatchMemOp_v2(CUstream s, unsigned int count, CUstreamBatchMemOpParams* params,
                                       unsigned int flags) {
  return batch(s, count, params, flags);
}

extern "C" {
CUresult CUDAAPI cuStreamWaitValue32_v2_ptsz(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  return one(ptsz(s), CU_STREAM_MEM_OP_WAIT_VALUE_32, addr, value, flags);
}
CUresult CUDAAPI cuStreamWriteValue32_v2_ptsz(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  return one(ptsz(s), CU_STREAM_MEM_OP_WRITE_VALUE_32, addr, value, flags);
}
CUresult CUDAAPI cuStreamWaitValue64_v2_ptsz(CUstream s, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  return one(ptsz(s), CU_STREAM_MEM_OP_WAIT_VALUE_64, addr, value, flags);
}
CUresult CUDAAPI cuStreamWriteValue64_v2_ptsz(CUstream s, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  return one(ptsz(s), CU_STREAM_MEM_OP_WRITE_VALUE_64, addr, value, flags);
}
CUresult CUDAAPI cuStreamBatchMemOp_v2_ptsz(CUstream s, unsigned int count, CUstreamBatchMemOpParams* params,
                                            unsigned int flags) {
  return batch(ptsz(s), count, params, flags);
}
}  // extern "C"
