// cuGetErrorName / cuGetErrorString answered locally from a table generated
// from cuda.h.
#pragma once

#include <cuda.h>

namespace ivcuda::guest {
// nullptr for a value that is no CUresult.
const char* error_name(CUresult e) noexcept;
const char* error_string(CUresult e) noexcept;
}  // namespace ivcuda::guest
