// Every exported driver function runs its body through guard(): nothing may
// be thrown across the C ABI, so allocation failures become
// CUDA_ERROR_OUT_OF_MEMORY and anything else CUDA_ERROR_UNKNOWN. guard()
// also knows which function it runs for (the call site's), so that
// IVCUDA_LOG_ERRORS can list every call that failed (guest/unsupported.h).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <new>
#include <source_location>

namespace ivcuda::guest {

// Counts one failed call of `function` (IVCUDA_LOG_ERRORS; no-op without it).
void note_error(const char* function, CUresult st) noexcept;
bool log_errors_enabled() noexcept;
// The driver's error log (cuLogs*, guest/logs.cc): in use once a program asked for it.
bool logs_enabled() noexcept;
void logs_note_error(const char* function, CUresult st) noexcept;

namespace call_stats {
// IVCUDA_CALL_STATS also times each outermost API call from entry to return
// (guest/call_stats.cc): where a program's time in the library goes besides
// round trips.
bool enabled() noexcept;
class ApiScope {
 public:
  explicit ApiScope(const char* function) noexcept;
  ~ApiScope();
  ApiScope(const ApiScope&) = delete;
  ApiScope& operator=(const ApiScope&) = delete;

 private:
  const char* function_;
  std::uint64_t start_ns_ = 0;
};
}  // namespace call_stats

template <class F>
CUresult guarded_body(F& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

template <class F>
CUresult guard(F&& f, std::source_location where = std::source_location::current()) noexcept {
  CUresult st;
  if (call_stats::enabled()) {
    const call_stats::ApiScope timed(where.function_name());
    st = guarded_body(f);
  } else {
    st = guarded_body(f);
  }
  // NOT_READY is an answer, not a failure (cuStreamQuery, cuEventQuery).
  if (st != CUDA_SUCCESS && st != CUDA_ERROR_NOT_READY) {
    if (log_errors_enabled()) note_error(where.function_name(), st);
    if (logs_enabled()) logs_note_error(where.function_name(), st);
  }
  return st;
}

}  // namespace ivcuda::guest
