// CUDA arrays and texture/surface objects of the GPU test double (api_arrays.cc), for the
// CPU kernels that sample and write them (kernels.cc). Internal; under the state lock.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "state.h"

namespace ivcuda::gpu_double {

// An array is a host buffer laid out densely: row after row, slice after slice.
struct ArrayObj {
  Handle ctx = 0;
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  std::size_t elem = 0;  // bytes per element
  std::vector<unsigned char> data;
  Handle mipmap = 0;     // a level of this mipmapped array, or 0

  std::size_t row_bytes() const { return desc.Width * elem; }
  std::size_t rows() const { return desc.Height == 0 ? 1 : desc.Height; }
  unsigned char* at(std::size_t x_bytes, std::size_t y, std::size_t z) {
    return data.data() + (z * rows() + y) * row_bytes() + x_bytes;
  }
};

struct TexObj {
  Handle ctx = 0;
  bool surface = false;
  CUDA_RESOURCE_DESC res{};
  CUDA_TEXTURE_DESC tex{};
  CUDA_RESOURCE_VIEW_DESC view{};
};

// Null when unknown.
ArrayObj* find_array(Handle h);
const TexObj* find_object(unsigned long long value, bool surface);

}  // namespace ivcuda::gpu_double
