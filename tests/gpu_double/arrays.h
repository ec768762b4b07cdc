// CUDA arrays and texture/surface objects of the GPU test double (api_arrays.cc), for the
// CPU kernels that sample and write them (kernels.cc). Internal; under the state lock.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "state.h"

namespace ivcuda::gpu_double {

// Where a 64 KiB tile of a sparse array (or a deferred-mapping array as a whole) lies: an
// offset into physical memory made by cuMemCreate, or nowhere (mem 0: reads are zero,
// writes are dropped).
struct TileBacking {
  Handle mem = 0;
  std::size_t offset = 0;
};
inline constexpr std::size_t kTileBytes = 64 * 1024;

// An array is a host buffer laid out densely: row after row, slice after slice. A sparse
// (CUDA_ARRAY3D_SPARSE) or deferred-mapping array has no buffer: its bytes are where
// cuMemMapArrayAsync put its tiles (api_arrays.cc), each tile laid out densely in its 64 KiB.
struct ArrayObj {
  Handle ctx = 0;
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  std::size_t elem = 0;  // bytes per element
  std::vector<unsigned char> data;
  Handle mipmap = 0;     // a level of this mipmapped array, or 0
  unsigned level = 0;    // which level
  // Sparse: the tile extent in elements, tiles per dimension (z: slices or layers), and
  // each tile's backing, x fastest. A level in its mipmapped array's mip tail has no tiles:
  // its bytes lie at tail_base in each layer's mip tail.
  std::size_t tile[3] = {0, 0, 0};
  std::size_t grid[3] = {0, 0, 0};
  std::vector<TileBacking> tiles;
  bool in_tail = false;
  std::size_t tail_base = 0;
  TileBacking whole;     // deferred mapping (not a level): the array's one backing

  bool sparse() const { return (desc.Flags & CUDA_ARRAY3D_SPARSE) != 0; }
  bool deferred() const { return (desc.Flags & CUDA_ARRAY3D_DEFERRED_MAPPING) != 0; }
  bool dense() const { return !sparse() && !deferred(); }

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
// Destroys ctx's arrays, mipmapped arrays and texture and surface objects, as the driver
// does with their context; their tiles let go of the physical memory that backs them.
void release_context_arrays(State& s, Handle ctx);

}  // namespace ivcuda::gpu_double
