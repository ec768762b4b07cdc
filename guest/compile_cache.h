// The compile cache NVRTC and nvJitLink ask libcuda for (export table
// da9151d3..., guest/export_tables.cc), kept in the guest process. Without it
// NVRTC compiles every program from scratch: cuDNN's runtime-compiled
// attention kernels, built again for every new sequence length, made an LLM's
// generate step 2.8x slower than native (docs/performance.md).
//
// The protocol, as NVRTC 13.0 uses the real driver's table (measured with
// tests/gpu/probe_nvrtc_cache.cc on the H200): for each compilation stage NVRTC
// opens an entry for its key (stage, input bytes, options, compiler build),
// looks it up, on a miss compiles and stores the result, on a hit takes the
// bytes and gives them back, and closes the entry.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ivcuda::guest::compile_cache {

// The table's slots ([0] is its size word, 0x38).
// [1] open: *entry = a new entry for the key.
int open(void** entry, std::uint32_t stage, const void* input, std::size_t input_len, const char* options,
         const char* build) noexcept;
// [2] close: forgets the entry (not what it stored).
int close(void* entry, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t) noexcept;
// [3] lookup: 0 and *data (for release) / *len on a hit, 500 (CUDA_ERROR_NOT_FOUND) on a miss.
int lookup(void* entry, std::uint64_t, void** data, std::uint32_t* len, std::uint64_t, std::uint64_t) noexcept;
// [4] store: the bytes the compilation produced for the entry's key.
int store(void* entry, std::uint64_t, const void* data, std::size_t len, std::uint64_t, std::uint64_t) noexcept;
// [5] not seen called: answers NOT_FOUND.
int unknown5(std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t) noexcept;
// [6] release: frees bytes a lookup handed out.
int release(void* data, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t) noexcept;

// Lookups and hits so far (IVCUDA_CALL_STATS prints them; tests read them).
struct Counts {
  std::uint64_t lookups = 0, hits = 0, stored_bytes = 0;
  std::uint64_t disk_hits = 0;  // of the hits, those found in the guest's cache directory
};
Counts counts() noexcept;

}  // namespace ivcuda::guest::compile_cache
