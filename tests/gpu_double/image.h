// Module images the GPU test double understands: PTX text, and fatbins that carry
// uncompressed PTX. Only what a CPU stand-in needs is extracted: entry names with their
// parameter layout, and module-scope globals with sizes and simple initialisers.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ivcuda::gpu_double {

struct PtxParam {
  std::size_t offset = 0;  // in the packed parameter buffer, as the launch ABI lays it out
  std::size_t size = 0;
  std::size_t align = 1;
};

struct PtxEntry {
  std::string name;
  std::vector<PtxParam> params;
  std::size_t param_bytes = 0;    // end of the last parameter
  std::size_t static_shared = 0;  // sum of the entry's .shared declarations
  bool calls_malloc = false;      // it uses the device heap (api_context.cc, cuCtxSetLimit)
};

struct PtxGlobal {
  std::string name;
  bool constant = false;  // .const rather than .global
  std::size_t size = 0;
  std::size_t align = 1;
  std::vector<std::uint8_t> init;  // empty = zero-filled
};

struct PtxImage {
  int ptx_version = 0;  // .version 9.0 -> 90
  int target_sm = 0;    // .target sm_90 -> 90
  std::vector<PtxEntry> entries;
  std::vector<PtxGlobal> globals;
};

// Largest parameter buffer a CUDA 12.1+ kernel may take.
inline constexpr std::size_t kMaxParamBytes = 32764;

// True when IVCUDA_DOUBLE_UNKNOWN_KERNELS=skip: images without usable PTX (cubins, SASS-only or
// compressed fatbins, as the toolkit's libraries carry) load with the entries, parameter
// layouts and globals their ELF declares, and launches of kernels without a CPU version do
// nothing. Lets CI check a library's API flow and data movement; off by default.
bool foreign_images_enabled();

// Parses PTX text. CUDA_ERROR_INVALID_PTX when the text is not PTX we can lay out; `why`
// says what was wrong.
CUresult parse_ptx(std::string_view text, PtxImage& out, std::string& why);

// Accepts what cuModuleLoadData accepts: NUL-terminated PTX, a fatbin (magic 0xBA55ED50) or
// the fatbin wrapper nvcc emits (magic 0x466243B1). A cubin or a fatbin without
// uncompressed PTX gives CUDA_ERROR_NO_BINARY_FOR_GPU; anything unrecognised,
// CUDA_ERROR_INVALID_IMAGE.
CUresult load_image(const void* image, PtxImage& out, std::string& why);

}  // namespace ivcuda::gpu_double
