// The JIT linker options that cross the wire (proto::LinkOption): those whose
// value is a plain number. Log buffers and other pointers stay in the guest
// (guest/link.cc); the host honours only these (host-daemon/worker/link.cc).
#pragma once

#include <cuda.h>

#include <cstdint>

namespace ivcuda::proto {

constexpr bool forwarded_link_option(std::uint32_t o) noexcept {
  switch (o) {
    case CU_JIT_MAX_REGISTERS:
    case CU_JIT_THREADS_PER_BLOCK:
    case CU_JIT_OPTIMIZATION_LEVEL:
    case CU_JIT_TARGET:
    case CU_JIT_FALLBACK_STRATEGY:
    case CU_JIT_GENERATE_DEBUG_INFO:
    case CU_JIT_LOG_VERBOSE:
    case CU_JIT_GENERATE_LINE_INFO:
    case CU_JIT_CACHE_MODE:
    case CU_JIT_POSITION_INDEPENDENT_CODE:
    case CU_JIT_MIN_CTA_PER_SM:
    case CU_JIT_MAX_THREADS_PER_BLOCK:
    case CU_JIT_OVERRIDE_DIRECTIVE_VALUES:
      return true;
    default:
      return false;
  }
}

}  // namespace ivcuda::proto
