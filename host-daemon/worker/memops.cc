// Stream memory operations (cuStreamWaitValue32/64, cuStreamWriteValue32/64,
// cuStreamBatchMemOp): the guest's side is guest/memops.cc. Every address a
// wait or a write names must be device memory this guest owns (its
// allocations, mappings, or its own page-locked arena): the GPU would
// otherwise store to, or spin on, memory of the host or of another guest.
// A wait that is never satisfied stalls only the guest's own stream.
#include "host-daemon/worker/worker_internal.h"

namespace ivcuda::host {

using namespace ivcuda::proto;
using namespace detail;

namespace {

bool is_wait(std::uint32_t op) { return op == CU_STREAM_MEM_OP_WAIT_VALUE_32 || op == CU_STREAM_MEM_OP_WAIT_VALUE_64; }
bool is_write(std::uint32_t op) {
  return op == CU_STREAM_MEM_OP_WRITE_VALUE_32 || op == CU_STREAM_MEM_OP_WRITE_VALUE_64;
}
std::uint64_t word_bytes(std::uint32_t op) {
  return op == CU_STREAM_MEM_OP_WAIT_VALUE_64 || op == CU_STREAM_MEM_OP_WRITE_VALUE_64 ? 8 : 4;
}

}  // namespace

// Rebuilds the driver's parameter array from the wire, refusing addresses
// the guest does not own. Shared with graphs' batch memory operation nodes.
CUresult Worker::memops_from_wire(std::span<const MemOp> ops, std::vector<CUstreamBatchMemOpParams>* out) const {
  out->assign(ops.size(), CUstreamBatchMemOpParams{});
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const MemOp& m = ops[i];
    CUstreamBatchMemOpParams& p = (*out)[i];
    if (is_wait(m.operation) || is_write(m.operation)) {
      // Another guest's or the host's memory: INVALID_VALUE, the driver's
      // answer for an address it cannot use (alignment it checks itself).
      if (IVCUDA_RULE("memops-own-memory") && !owns_device(m.address, word_bytes(m.operation)))
        return CUDA_ERROR_INVALID_VALUE;
      // A 32-bit operation's value is the low half of the union (x86-64).
      const cuuint64_t v = word_bytes(m.operation) == 4 ? static_cast<cuuint32_t>(m.value) : m.value;
      if (is_wait(m.operation)) {
        if (!wire_enum(m.operation, &p.waitValue.operation)) return CUDA_ERROR_INVALID_VALUE;
        p.waitValue.address = m.address;
        p.waitValue.value64 = v;
        p.waitValue.flags = m.flags;
      } else {
        if (!wire_enum(m.operation, &p.writeValue.operation)) return CUDA_ERROR_INVALID_VALUE;
        p.writeValue.address = m.address;
        p.writeValue.value64 = v;
        p.writeValue.flags = m.flags;
      }
    } else if (m.operation == CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES) {
      p.flushRemoteWrites.operation = CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES;
      p.flushRemoteWrites.flags = m.flags;
    } else if (m.operation == CU_STREAM_MEM_OP_BARRIER) {
      p.memoryBarrier.operation = CU_STREAM_MEM_OP_BARRIER;
      p.memoryBarrier.flags = m.flags;
    } else {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return CUDA_SUCCESS;
}

CUresult Worker::on_StreamMemOps(Call& c) {
  const auto r = c.req<ReqStreamMemOps>();
  const auto tail = c.tail<ReqStreamMemOps>();
  if (r.count == 0 || r.count > kMaxMemOps || tail.size() != std::size_t{r.count} * sizeof(MemOp) ||
      (r.single != 0 && r.count != 1))
    return CUDA_ERROR_INVALID_VALUE;
  std::vector<MemOp> ops(r.count);
  std::memcpy(ops.data(), tail.data(), tail.size());
  std::vector<CUstreamBatchMemOpParams> params;
  if (CUresult st = memops_from_wire(ops, &params); st != CUDA_SUCCESS) return st;
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  if (r.single == 0) return cu_.cuStreamBatchMemOp(s, r.count, params.data(), r.flags);
  const MemOp& m = ops[0];
  switch (m.operation) {
    case CU_STREAM_MEM_OP_WAIT_VALUE_32:
      return cu_.cuStreamWaitValue32(s, m.address, static_cast<cuuint32_t>(m.value), m.flags);
    case CU_STREAM_MEM_OP_WRITE_VALUE_32:
      return cu_.cuStreamWriteValue32(s, m.address, static_cast<cuuint32_t>(m.value), m.flags);
    case CU_STREAM_MEM_OP_WAIT_VALUE_64: return cu_.cuStreamWaitValue64(s, m.address, m.value, m.flags);
    case CU_STREAM_MEM_OP_WRITE_VALUE_64: return cu_.cuStreamWriteValue64(s, m.address, m.value, m.flags);
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace ivcuda::host
