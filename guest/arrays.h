// CUDA arrays (guest/arrays.cc): the hook guest/memory.cc's 2D copies use
// when one side is an array.
#pragma once

#include <cuda.h>

namespace ivcuda::guest {

// cuMemcpy2D(Async/Unaligned) with an array on either side, as a 3D copy of
// depth 1. The caller has checked the runtime, the context and the stream.
CUresult copy_2d_array(const CUDA_MEMCPY2D& c, CUstream s, bool async);

}  // namespace ivcuda::guest
