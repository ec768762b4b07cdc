// NVLink state and topology between granted GPUs only (the worker answers
// links to GPUs the guest was not given as disabled).
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

}  // extern "C"
