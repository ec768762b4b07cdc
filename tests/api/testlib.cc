// The one hand-written driver function of the test libcuda.so.1. Being a strong definition it
// must replace the generated weak stub of the same name, in the export table and in
// cuGetProcAddress's answers alike; api_surface_test checks both.
#include <cuda.h>

extern "C" CUresult cuDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = CUDA_VERSION;
  return CUDA_SUCCESS;
}
