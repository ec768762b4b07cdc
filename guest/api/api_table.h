// Internal to guest/api: the generated tables behind resolve() and get_proc_address().
// Kept out of procaddress.h so that users of the API do not compile 600 rows of data.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>

namespace ivcuda::api::detail {

// One exported symbol. `base` is the public name cuGetProcAddress knows it by, `version` the
// CUDA version whose headers introduced this ABI, `per_thread` whether it is a _ptds/_ptsz form.
struct SymbolRow {
  std::string_view symbol;
  std::string_view base;
  int version;
  bool per_thread;
};

inline constexpr SymbolRow kSymbols[] = {
#define IVCUDA_API_ROW(symbol, base, version, per_thread) {#symbol, #base, version, per_thread != 0},
#include "cuda_api_table.inc"
#undef IVCUDA_API_ROW
};

// One ABI generation of a public name: from `version` on, kSymbols[symbol] answers for it,
// among the default-stream forms or (per_thread) among the _ptds/_ptsz forms.
struct ProcEntry {
  std::string_view name;
  bool per_thread;
  int version;
  std::uint16_t symbol;
};

#include "cuda_procaddress.inc"

static_assert(std::size(kSymbols) == kSymbolCount);
static_assert(kSymbolCount <= 0xffff, "symbol indexes are 16-bit");
// Both lookups are binary searches; the generator sorts, these keep it honest.
static_assert(std::is_sorted(std::begin(kSymbols), std::end(kSymbols),
                             [](const SymbolRow& a, const SymbolRow& b) { return a.symbol < b.symbol; }));
static_assert(std::adjacent_find(std::begin(kSymbols), std::end(kSymbols),
                                 [](const SymbolRow& a, const SymbolRow& b) {
                                   return a.symbol == b.symbol;
                                 }) == std::end(kSymbols));
static_assert(std::is_sorted(std::begin(kProcEntries), std::end(kProcEntries),
                             [](const ProcEntry& a, const ProcEntry& b) {
                               if (a.name != b.name) return a.name < b.name;
                               if (a.per_thread != b.per_thread) return b.per_thread;
                               return a.version < b.version;
                             }));
static_assert(std::all_of(std::begin(kProcEntries), std::end(kProcEntries), [](const ProcEntry& e) {
  return e.symbol < kSymbolCount && e.version > 0 && kSymbols[e.symbol].base == e.name &&
         kSymbols[e.symbol].version == e.version && kSymbols[e.symbol].per_thread == e.per_thread;
}));

// Address of kSymbols[index] as the linker bound it (generated cuda_symbols.cc); nullptr when
// out of range.
void* symbol_address(std::size_t index) noexcept;
// How many calls the NOT_SUPPORTED stub of kSymbols[index] answered (generated cuda_stubs.cc).
unsigned stub_calls(std::size_t index) noexcept;
extern const std::size_t kSymbolAddressCount;

}  // namespace ivcuda::api::detail
