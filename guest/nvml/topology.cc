// NVLink state and topology between granted GPUs only (the worker answers
// links to GPUs the guest was not given as disabled). The GPUs near a CPU:
// the granted ones whose CPU affinity (the host's, passed through) holds it.
#include <vector>

#include "guest/nvml/internal.h"

using namespace ivcuda::nvml;

extern "C" {

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t* isActive) {
  return device_value(NvmlFn::kDeviceNvLinkState, device, isActive, link);
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                 nvmlGpuTopologyLevel_t* pathInfo) {
  unsigned other = 0;
  if (const nvmlReturn_t r = check_device(device2, &other); r != NVML_SUCCESS) return r;
  return device_value(NvmlFn::kDeviceTopologyCommonAncestor, device1, pathInfo, other);
}

nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2, nvmlGpuP2PCapsIndex_t p2pIndex,
                                    nvmlGpuP2PStatus_t* p2pStatus) {
  unsigned other = 0;
  if (const nvmlReturn_t r = check_device(device2, &other); r != NVML_SUCCESS) return r;
  return device_value(NvmlFn::kDeviceP2PStatus, device1, p2pStatus, other, static_cast<std::uint64_t>(p2pIndex));
}

nvmlReturn_t nvmlSystemGetTopologyGpuSet(unsigned int cpuNumber, unsigned int* count, nvmlDevice_t* deviceArray) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (count == nullptr || (deviceArray == nullptr && *count != 0)) return NVML_ERROR_INVALID_ARGUMENT;
  constexpr unsigned kWords = 1024 / (8 * sizeof(unsigned long));  // 1024 CPUs
  if (cpuNumber >= kWords * 8 * sizeof(unsigned long)) return NVML_ERROR_INVALID_ARGUMENT;
  std::vector<nvmlDevice_t> near;
  for (unsigned i = 0; i < device_count(); ++i) {
    unsigned long set[kWords] = {};
    const nvmlReturn_t r = nvmlDeviceGetCpuAffinity(handle_of(i), kWords, set);
    if (r != NVML_SUCCESS) return r;
    if ((set[cpuNumber / (8 * sizeof(unsigned long))] >> (cpuNumber % (8 * sizeof(unsigned long)))) & 1ul)
      near.push_back(handle_of(i));
  }
  if (*count == 0) {  // the count alone
    *count = static_cast<unsigned>(near.size());
    return NVML_SUCCESS;
  }
  if (*count < near.size()) {
    *count = static_cast<unsigned>(near.size());
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  for (std::size_t k = 0; k < near.size(); ++k) deviceArray[k] = near[k];
  *count = static_cast<unsigned>(near.size());
  return NVML_SUCCESS;
}

}  // extern "C"
