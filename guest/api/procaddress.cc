// cuGetProcAddress for the guest libcuda.so.1, and the two exported entry points around it.
//
// __CUDA_API_VERSION_INTERNAL makes cuda.h declare every ABI generation under its own name
// (cuGetProcAddress with 4 arguments, cuGetProcAddress_v2 with 5) instead of remapping the
// public names by macro, so the definitions below are checked against NVIDIA's prototypes.
#define __CUDA_API_VERSION_INTERNAL 1
#include "guest/api/procaddress.h"

#include <algorithm>
#include <iterator>
#include <string_view>

#include "guest/api/api_table.h"

namespace ivcuda::api {
namespace {

using detail::kProcEntries;
using detail::kSymbols;

constexpr unsigned long long kLegacy = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
constexpr unsigned long long kPerThread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

void set_status(CUdriverProcAddressQueryResult* out, CUdriverProcAddressQueryResult v) noexcept {
  if (out != nullptr) *out = v;
}

}  // namespace

void* resolve(const char* symbol_name) noexcept {
  if (symbol_name == nullptr) return nullptr;
  const std::string_view want(symbol_name);
  const auto* it = std::lower_bound(
      std::begin(kSymbols), std::end(kSymbols), want,
      [](const detail::SymbolRow& row, std::string_view key) { return row.symbol < key; });
  if (it == std::end(kSymbols) || it->symbol != want) return nullptr;
  return detail::symbol_address(static_cast<std::size_t>(it - std::begin(kSymbols)));
}

int api_cuda_version() noexcept { return detail::kHeaderCudaVersion; }

CUresult get_proc_address(const char* name, void** pfn, int cudaVersion, unsigned long long flags,
                          CUdriverProcAddressQueryResult* symbolStatus) noexcept {
  // Refusals leave *pfn and *symbolStatus alone, as NVIDIA's driver does.
  if (pfn == nullptr || name == nullptr || (flags & ~(kLegacy | kPerThread)) != 0 ||
      cudaVersion > detail::kHeaderCudaVersion) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  *pfn = nullptr;
  set_status(symbolStatus, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);

  // "Not found" is a successful search with no result: the driver returns CUDA_SUCCESS, a
  // NULL *pfn and the reason in *symbolStatus (what the documentation says and 580.159.04 does).
  const std::string_view want(name);
  const auto [first, last] = std::equal_range(
      std::begin(kProcEntries), std::end(kProcEntries), detail::ProcEntry{want, false, 0, 0},
      [](const detail::ProcEntry& a, const detail::ProcEntry& b) { return a.name < b.name; });
  if (first == last) return CUDA_SUCCESS;

  // A name's rows are its default-stream forms, then its per-thread forms. PER_THREAD (which
  // wins over LEGACY when both are set) searches only the per-thread forms of names that have
  // any; DEFAULT means legacy here, since only the caller's compiler knew about
  // --default-stream per-thread and cuda.h's inline wrapper turns that into the flag.
  const auto* split = std::partition_point(
      first, last, [](const detail::ProcEntry& e) { return !e.per_thread; });
  const bool per_thread = (flags & kPerThread) != 0 && split != last;
  const auto* lo = per_thread ? split : first;
  const auto* hi = per_thread ? last : split;

  // Unsigned, like the driver: a negative cudaVersion passes the check above and then counts
  // as newer than every ABI.
  const auto version = static_cast<unsigned>(cudaVersion);
  const auto* hit = std::upper_bound(lo, hi, version, [](unsigned v, const detail::ProcEntry& e) {
    return v < static_cast<unsigned>(e.version);
  });
  if (hit == lo) {
    set_status(symbolStatus, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    return CUDA_SUCCESS;
  }
  void* address = detail::symbol_address(std::prev(hit)->symbol);
  if (address == nullptr) return CUDA_SUCCESS;  // unreachable: indexes are checked statically
  *pfn = address;
  set_status(symbolStatus, CU_GET_PROC_ADDRESS_SUCCESS);
  return CUDA_SUCCESS;
}

}  // namespace ivcuda::api

// The exported entry points. cudart resolves cuGetProcAddress_v2 with dlsym and everything
// else through it; the 4-argument cuGetProcAddress is the CUDA 11.3 ABI. They are not marked
// noexcept only because cuda.h declares them without it (a differing exception specification
// is an error outside system headers); get_proc_address is noexcept, so nothing can escape.
extern "C" CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                        cuuint64_t flags,
                                        CUdriverProcAddressQueryResult* symbolStatus) {
  return ivcuda::api::get_proc_address(symbol, pfn, cudaVersion, flags, symbolStatus);
}

extern "C" CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                     cuuint64_t flags) {
  return ivcuda::api::get_proc_address(symbol, pfn, cudaVersion, flags, nullptr);
}
