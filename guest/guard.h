// Every exported driver function runs its body through guard(): nothing may
// be thrown across the C ABI, so allocation failures become
// CUDA_ERROR_OUT_OF_MEMORY and anything else CUDA_ERROR_UNKNOWN.
#pragma once

#include <cuda.h>

#include <new>

namespace ivcuda::guest {

template <class F>
CUresult guard(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

}  // namespace ivcuda::guest
