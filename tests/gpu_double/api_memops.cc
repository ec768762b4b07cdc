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

#include "state.h"

using namespace ivcuda::gpu_double;

namespace {

constexpr auto kWaitLimit = std::chrono::seconds(60);

// The word at a device address: it must be 4-byte aligned and lie in memory the device
// may reach. In the double a device address of host memory is its host address, which is
// what lets a wait observe another process's store through shared memory.
CUresult check_word(State& s, CUstream stream, CUdeviceptr addr) {
  Handle ctx = 0;
  if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
  if (const CUresult r = check_stream(s, stream); r != CUDA_SUCCESS) return r;
  if (addr % alignof(std::uint32_t) != 0) return CUDA_ERROR_INVALID_VALUE;
  return check_device_range(s, addr, sizeof(std::uint32_t));
}

std::atomic_ref<std::uint32_t> word(CUdeviceptr addr) {
  return std::atomic_ref<std::uint32_t>(*reinterpret_cast<std::uint32_t*>(addr));
}

bool satisfied(std::uint32_t v, std::uint32_t value, unsigned op) {
  switch (op) {
    case CU_STREAM_WAIT_VALUE_GEQ:  // as the driver: a wrap-aware comparison
      return static_cast<std::int32_t>(v - value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return v == value;
    case CU_STREAM_WAIT_VALUE_AND: return (v & value) != 0;
    case CU_STREAM_WAIT_VALUE_NOR: return ~(v | value) != 0;
    default: return false;
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
  return guarded([&](State& s) -> CUresult {
    if ((flags & ~static_cast<unsigned>(CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    if (const CUresult r = check_word(s, stream, addr); r != CUDA_SUCCESS) return r;
    // Release: whatever the stream did before (copies, kernels) is visible to the reader
    // that acquires this word, as the driver's memory barrier promises.
    word(addr).store(value, std::memory_order_release);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags) {
  IVC_MEMOP_CAPTURE(stream, cuStreamWaitValue32_v2(stream, addr, value, flags));
  const unsigned op = flags & ~static_cast<unsigned>(CU_STREAM_WAIT_VALUE_FLUSH);
  if (op > CU_STREAM_WAIT_VALUE_NOR) return CUDA_ERROR_INVALID_VALUE;
  if (const CUresult r = guarded([&](State& s) { return check_word(s, stream, addr); }); r != CUDA_SUCCESS)
    return r;
  const auto deadline = std::chrono::steady_clock::now() + kWaitLimit;
  for (unsigned spins = 0;; ++spins) {
    // Acquire pairs with the release store of whoever satisfies the wait (the guest's
    // host-function dispatcher): the work after the wait sees what it wrote before.
    if (satisfied(word(addr).load(std::memory_order_acquire), value, op)) return CUDA_SUCCESS;
    if (spins < 1000) continue;
    if (std::chrono::steady_clock::now() > deadline) {
      log("cuStreamWaitValue32: 0x%llx never satisfied the wait for %u (flags %u)",
          static_cast<unsigned long long>(addr), value, flags);
      return CUDA_ERROR_LAUNCH_TIMEOUT;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}
