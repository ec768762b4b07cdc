// Name lookups of the guest libcuda.so.1: by exact exported symbol (what dlsym would give) and
// by cuGetProcAddress's (public name, CUDA version, flags).
#pragma once

#include <cuda.h>

namespace ivcuda::api {

// Address of the exported function called exactly `symbol_name` (e.g. "cuMemAlloc_v2"), as
// linked into this library: its real implementation, or the NOT_SUPPORTED stub. nullptr for a
// NULL or unknown name.
[[nodiscard]] void* resolve(const char* symbol_name) noexcept;

// cuGetProcAddress_v2, with the semantics of NVIDIA's driver 580 (CUDA 13.0), checked answer
// for answer against it (tests/api/data/real_driver_answers.txt). `name` is a public name
// ("cuMemAlloc"); the answer is its ABI generation with the highest version <= cudaVersion.
// With CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, names that have _ptds/_ptsz forms are
// answered from those alone. An empty or unknown name, or a cudaVersion older than every
// candidate, is CUDA_SUCCESS with *pfn = nullptr and *symbolStatus (optional) saying
// SYMBOL_NOT_FOUND or VERSION_NOT_SUFFICIENT. CUDA_ERROR_INVALID_VALUE, touching nothing,
// for a NULL pfn or name, unknown flag bits, or a cudaVersion newer than api_cuda_version().
[[nodiscard]] CUresult get_proc_address(const char* name, void** pfn, int cudaVersion,
                                        unsigned long long flags,
                                        CUdriverProcAddressQueryResult* symbolStatus) noexcept;

// The newest CUDA version this library has ABIs for (CUDA_VERSION of the generating headers).
[[nodiscard]] int api_cuda_version() noexcept;

}  // namespace ivcuda::api
