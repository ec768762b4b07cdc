// Stream memory operations of the GPU test double. ivcudad forwards cuLaunchHostFunc as a
// write ("the stream reached this point") and a wait ("the guest's host function returned")
// on words of the shared arena; see docs/design.md.
//
// The double runs work synchronously in the caller, so a wait spins right here until the
// word satisfies its condition. That cannot deadlock the host-function path: the other
// side of such a wait is a guest thread that only watches and writes memory and never
// calls into the driver. A wait that is never satisfied gives up after kWaitLimit with an
// error rather than hanging a test run forever. The spin runs outside the state lock, so
// other threads keep using the double meanwhile.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <type_traits>

#include "state.h"

using namespace ivcuda::gpu_double;

namespace {

constexpr auto kWaitLimit = std::chrono::seconds(60);

// The word at a device address: it must be 4-byte aligned and lie in memory the device
// may reach. In the double a device address of host memory is its host address, which is
// what lets a wait observe another process's store through shared memory.
template <class W>
CUresult check_word(State& s, CUstream stream, CUdeviceptr addr) {
  Handle ctx = 0;
  if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
  if (const CUresult r = check_stream(s, stream); r != CUDA_SUCCESS) return r;
  if (addr % alignof(W) != 0) return CUDA_ERROR_INVALID_VALUE;
  return check_device_range(s, addr, sizeof(W));
}

template <class W>
std::atomic_ref<W> word(CUdeviceptr addr) {
  return std::atomic_ref<W>(*reinterpret_cast<W*>(addr));
}

template <class W>
bool satisfied(W v, W value, unsigned op) {
  using S = std::make_signed_t<W>;
  switch (op) {
    case CU_STREAM_WAIT_VALUE_GEQ:  // as the driver: a wrap-aware comparison
      return static_cast<S>(v - value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return v == value;
    case CU_STREAM_WAIT_VALUE_AND: return (v & value) != 0;
    case CU_STREAM_WAIT_VALUE_NOR: return static_cast<W>(~(v | value)) != 0;
    default: return false;
  }
}

template <class W>
CUresult write_value(CUstream stream, CUdeviceptr addr, W value, unsigned flags) {
  return guarded([&](State& s) -> CUresult {
    if ((flags & ~static_cast<unsigned>(CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    if (const CUresult r = check_word<W>(s, stream, addr); r != CUDA_SUCCESS) return r;
    // Release: whatever the stream did before (copies, kernels) is visible to the reader
    // that acquires this word, as the driver's memory barrier promises.
    word<W>(addr).store(value, std::memory_order_release);
    return CUDA_SUCCESS;
  });
}

template <class W>
CUresult wait_value(CUstream stream, CUdeviceptr addr, W value, unsigned flags) {
  const unsigned op = flags & ~static_cast<unsigned>(CU_STREAM_WAIT_VALUE_FLUSH);
  if (op > CU_STREAM_WAIT_VALUE_NOR) return CUDA_ERROR_INVALID_VALUE;
  if (const CUresult r = guarded([&](State& s) { return check_word<W>(s, stream, addr); }); r != CUDA_SUCCESS)
    return r;
  const auto deadline = std::chrono::steady_clock::now() + (fuzzing() ? std::chrono::seconds(0) : kWaitLimit);
  for (unsigned spins = 0;; ++spins) {
    // Acquire pairs with the release store of whoever satisfies the wait (the guest's
    // host-function dispatcher): the work after the wait sees what it wrote before.
    if (satisfied<W>(word<W>(addr).load(std::memory_order_acquire), value, op)) return CUDA_SUCCESS;
    if (spins < 1000) continue;
    if (std::chrono::steady_clock::now() > deadline) {
      log("cuStreamWaitValue%zu: 0x%llx never satisfied the wait for %llu (flags %u)", sizeof(W) * 8,
          static_cast<unsigned long long>(addr), static_cast<unsigned long long>(value), flags);
      return CUDA_ERROR_LAUNCH_TIMEOUT;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace

// Mirrors the IVC_CAPTURE convention of api_memory.cc: a capturing stream records the call.
#define IVC_MEMOP_CAPTURE(stream, call)                                             \
  do {                                                                              \
    CUresult r_ = CUDA_SUCCESS;                                                     \
    if (capture_call(stream, [=]() -> CUresult { return call; }, &r_)) return r_; \
  } while (0)

CUresult CUDAAPI cuStreamWriteValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  IVC_MEMOP_CAPTURE(stream, cuStreamWriteValue32_v2(stream, addr, value, flags));
  return write_value<std::uint32_t>(stream, addr, value, flags);
}

CUresult CUDAAPI cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  IVC_MEMOP_CAPTURE(stream, cuStreamWaitValue32_v2(stream, addr, value, flags));
  return wait_value<std::uint32_t>(stream, addr, value, flags);
}

CUresult CUDAAPI cuStreamWriteValue64_v2(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  IVC_MEMOP_CAPTURE(stream, cuStreamWriteValue64_v2(stream, addr, value, flags));
  return write_value<std::uint64_t>(stream, addr, value, flags);
}

CUresult CUDAAPI cuStreamWaitValue64_v2(CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  IVC_MEMOP_CAPTURE(stream, cuStreamWaitValue64_v2(stream, addr, value, flags));
  return wait_value<std::uint64_t>(stream, addr, value, flags);
}

// The operations in order, each as its single call; barriers and flushes have nothing
// to do in a double that runs every operation to completion in the caller.
CUresult CUDAAPI cuStreamBatchMemOp_v2(CUstream stream, unsigned int count, CUstreamBatchMemOpParams* params,
                                       unsigned int flags) {
  if (count == 0) return CUDA_SUCCESS;  // as the driver: nothing to do
  if (count > 256 || params == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < count; ++i) {
    const CUstreamBatchMemOpParams& p = params[i];
    CUresult r = CUDA_SUCCESS;
    switch (p.operation) {
      case CU_STREAM_MEM_OP_WAIT_VALUE_32:
        r = cuStreamWaitValue32_v2(stream, p.waitValue.address, p.waitValue.value, p.waitValue.flags);
        break;
      case CU_STREAM_MEM_OP_WAIT_VALUE_64:
        r = cuStreamWaitValue64_v2(stream, p.waitValue.address, p.waitValue.value64, p.waitValue.flags);
        break;
      case CU_STREAM_MEM_OP_WRITE_VALUE_32:
        r = cuStreamWriteValue32_v2(stream, p.writeValue.address, p.writeValue.value, p.writeValue.flags);
        break;
      case CU_STREAM_MEM_OP_WRITE_VALUE_64:
        r = cuStreamWriteValue64_v2(stream, p.writeValue.address, p.writeValue.value64, p.writeValue.flags);
        break;
      case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
        if (p.flushRemoteWrites.flags != 0) r = CUDA_ERROR_INVALID_VALUE;
        break;
      case CU_STREAM_MEM_OP_BARRIER:
        if (p.memoryBarrier.flags > CU_STREAM_MEMORY_BARRIER_TYPE_GPU) r = CUDA_ERROR_INVALID_VALUE;
        break;
      default: r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}
