// cuLaunchKernelEx in the GPU test double: the attributes are checked as the real driver
// checks them, then the launch runs like any other (on the CPU, at once). Clusters group
// blocks on a GPU; here they only have to divide the grid.
#include <cuda.h>

#include "state.h"

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
  if (c == nullptr || (c->numAttrs != 0 && c->attrs == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  bool cooperative = false;
  for (unsigned i = 0; i < c->numAttrs; ++i) {
    const CUlaunchAttribute& a = c->attrs[i];
    switch (a.id) {
      case CU_LAUNCH_ATTRIBUTE_IGNORE:
      case CU_LAUNCH_ATTRIBUTE_PRIORITY:
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP: break;
      case CU_LAUNCH_ATTRIBUTE_COOPERATIVE: cooperative = a.value.cooperative != 0; break;
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: {
        const auto& d = a.value.clusterDim;
        if (d.x == 0 || d.y == 0 || d.z == 0 || c->gridDimX % d.x != 0 || c->gridDimY % d.y != 0 ||
            c->gridDimZ % d.z != 0 || d.x * d.y * d.z > 16)
          return CUDA_ERROR_INVALID_CLUSTER_SIZE;
        break;
      }
      default: return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
  if (cooperative)
    return cuLaunchCooperativeKernel(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY,
                                     c->blockDimZ, c->sharedMemBytes, c->hStream, params);
  return cuLaunchKernel(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                        c->sharedMemBytes, c->hStream, params, extra);
}
