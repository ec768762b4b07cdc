// What the guest's libnvidia-ml.so.1 shares between its files: the library's
// state (initialised or not, the transport, the device handles), the
// forwarding helper and the checks every entry point makes first.
//
// Handles: the guest makes its own, one per GPU the daemon granted (the
// guest's index, the same as its CUDA ordinal before CUDA_VISIBLE_DEVICES,
// which NVML ignores as NVIDIA's does). A handle is the address of one of
// them; anything else (NULL, a forged pointer, another library's handle, an
// index past the count) is NVML_ERROR_INVALID_ARGUMENT. Handles stay valid
// across nvmlShutdown/nvmlInit, as NVIDIA's do, but no call answers before
// nvmlInit: NVML_ERROR_UNINITIALIZED.
#pragma once

#include <nvml.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <source_location>

#include "guest/nvml/query.h"
#include "ivcuda/nvml_wire.h"

struct nvmlDevice_st {
  std::uint32_t index;
};

namespace ivcuda::nvml {

namespace nvml_wire = ::ivcuda::nvml_wire;  // for the extern "C" definitions
using nvml_wire::NvmlFn;
inline constexpr unsigned kMaxDevices = 64;  // proto::kMaxDevices

bool initialized() noexcept;
unsigned device_count() noexcept;
// The handle of guest index i (i < kMaxDevices).
nvmlDevice_t handle_of(unsigned i) noexcept;
// NVML_SUCCESS with *index set when `d` is one of this library's handles for
// a granted GPU; NVML_ERROR_UNINITIALIZED before nvmlInit;
// NVML_ERROR_INVALID_ARGUMENT for anything else.
nvmlReturn_t check_device(nvmlDevice_t d, unsigned* index) noexcept;

// The entry point a failed answer is booked under (IVCUDA_LOG_UNSUPPORTED,
// IVCUDA_LOG_ERRORS: errors.cc): the function that asked, as the compiler
// names it where a helper is called.
using Caller = std::source_location;

// One query to the worker. `out` (cap bytes) gets the trailing bytes,
// `*rep` the answer. Returns rep->ret, or the transport's failure mapped to
// NVML's codes; a failure is booked under `who`.
nvmlReturn_t query(NvmlFn fn, int device, std::uint64_t arg0, std::uint64_t arg1, void* out, std::uint32_t cap,
                   nvml_wire::RepNvml* rep, const char* who = Caller::current().function_name()) noexcept;
inline nvmlReturn_t query(NvmlFn fn, int device, std::uint64_t arg0, nvml_wire::RepNvml* rep,
                          const char* who = Caller::current().function_name()) noexcept {
  return query(fn, device, arg0, 0, nullptr, 0, rep, who);
}

// Books answer `r` of entry point `who` (a bare name or a compiler's
// signature) for the logs at exit; returns r.
nvmlReturn_t note_answer(const char* who, nvmlReturn_t r) noexcept;
// Books that `name` answered with its generated default (nothing here forwards it).
void note_default(const char* name) noexcept;

// A string answer (name, UUID, serial, versions) into the caller's buffer of
// `length` bytes: NVML_ERROR_INSUFFICIENT_SIZE when it does not fit with its
// NUL. device = nvml_wire::kNoDevice for the system's strings.
nvmlReturn_t query_string(NvmlFn fn, int device, char* buf, unsigned length,
                          const char* who = Caller::current().function_name()) noexcept;

// The device-scalar getters: check the handle and the pointer, ask, store
// val[0] converted to T.
template <class T>
nvmlReturn_t device_value(NvmlFn fn, nvmlDevice_t d, T* out, std::uint64_t arg0 = 0, std::uint64_t arg1 = 0,
                          Caller who = Caller::current()) noexcept {
  unsigned i = 0;
  if (const nvmlReturn_t r = check_device(d, &i); r != NVML_SUCCESS) return r;
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  nvml_wire::RepNvml rep{};
  const nvmlReturn_t r = query(fn, static_cast<int>(i), arg0, arg1, nullptr, 0, &rep, who.function_name());
  if (r == NVML_SUCCESS) *out = static_cast<T>(rep.val[0]);
  return r;
}

// Two values (val[0], val[1]).
template <class A, class B>
nvmlReturn_t device_pair(NvmlFn fn, nvmlDevice_t d, A* a, B* b, std::uint64_t arg0 = 0,
                         Caller who = Caller::current()) noexcept {
  unsigned i = 0;
  if (const nvmlReturn_t r = check_device(d, &i); r != NVML_SUCCESS) return r;
  if (a == nullptr || b == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  nvml_wire::RepNvml rep{};
  const nvmlReturn_t r = query(fn, static_cast<int>(i), arg0, 0, nullptr, 0, &rep, who.function_name());
  if (r == NVML_SUCCESS) {
    *a = static_cast<A>(rep.val[0]);
    *b = static_cast<B>(rep.val[1]);
  }
  return r;
}

// Runs an entry point's body with nothing thrown across the C ABI.
template <class F>
nvmlReturn_t guard(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return NVML_ERROR_MEMORY;
  } catch (...) {
    return NVML_ERROR_UNKNOWN;
  }
}

// The answer of a function nothing here implements (generated stubs, `name`):
// UNINITIALIZED before nvmlInit, else `code` (NOT_SUPPORTED or NO_PERMISSION).
int default_answer(int code, const char* name) noexcept;

}  // namespace ivcuda::nvml
