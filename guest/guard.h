// Every exported driver function runs its body through guard(): nothing may
// be thrown across the C ABI, so allocation failures become
// CUDA_ERROR_OUT_OF_MEMORY and anything else CUDA_ERROR_UNKNOWN. guard()
// also knows which function it runs for (the call site's), so that
// IVCUDA_LOG_ERRORS can list every call that failed (guest/unsupported.h).
#pragma once

#include <cuda.h>

#include <new>
#include <source_location>

namespace ivcuda::guest {

// Counts one failed call of `function` (IVCUDA_LOG_ERRORS; no-op without it).
void note_error(const char* function, CUresult st) noexcept;
bool log_errors_enabled() noexcept;

template <class F>
CUresult guard(F&& f, std::source_location where = std::source_location::current()) noexcept {
  CUresult st;
  try {
    st = f();
  } catch (const std::bad_alloc&) {
    st = CUDA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    st = CUDA_ERROR_UNKNOWN;
  }
  // NOT_READY is an answer, not a failure (cuStreamQuery, cuEventQuery).
  if (st != CUDA_SUCCESS && st != CUDA_ERROR_NOT_READY && log_errors_enabled())
    note_error(where.function_name(), st);
  return st;
}

}  // namespace ivcuda::guest
