// Test-only modes of the GPU test double that make hostile tests test ivcudad's worker, not
// the double (README.md, "Ranges outside the books"). Internal: nothing here is exported.
//
// The double keeps its own table of allocations and refuses a range outside it with the same
// error the worker gives; a hostile test that sends such a range then passes whether or not
// the worker checked it. Two switches, read once when the library is loaded (before any
// sandbox), close that gap:
//  - IVCUDA_GPU_DOUBLE_HMM=1: like a driver with HMM/ATS, any range of pages mapped in this
//    process is device memory, so a range the guest does not own (the worker's own memory,
//    a freed allocation's heap) is accepted, as a real driver would;
//  - IVCUDA_GPU_DOUBLE_STRAYS=FILE: every request outside what the double handed this
//    process is appended to FILE, one line each, whether it is then refused or accepted: a
//    device range outside its allocations, an IPC or pool-pointer export of memory it never
//    allocated, an import into a pool it never imported, a sparse map of no memory or past
//    it. A test asserts the file empty: nothing outside the guest's books reached the
//    driver.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ivcuda::gpu_double {

bool hmm();
// [p, p + n) (at least one byte) lies in readable and writable pages of this process.
bool mapped(std::uintptr_t p, std::size_t n);
// Records a request outside the double's books, by the address (or handle) and length it
// named (no-op unless IVCUDA_GPU_DOUBLE_STRAYS).
// `file` and `line`: the double's source line that saw it (__FILE__, __LINE__).
void note_stray(std::uintptr_t p, std::size_t n, const char* file, unsigned line);

}  // namespace ivcuda::gpu_double
