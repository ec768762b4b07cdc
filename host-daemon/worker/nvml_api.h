// The host's NVML (libnvidia-ml.so.1), loaded with dlopen by a worker at its
// guest's first NVML query (nvml.cc), as driver_api.h loads libcuda: ivcudad
// builds and runs where there is none. nvml.h is included for its types and
// constants only; each entry is the symbol nvml.h's macros select for a
// CUDA 13 caller (nvmlInit -> nvmlInit_v2, nvmlDeviceGetPciInfo -> _v3,
// nvmlDeviceGetHandleByPciBusId -> _v2, nvmlDeviceGetComputeRunningProcesses
// -> _v3, nvmlDeviceGetNvLinkRemotePciInfo -> _v2).
#pragma once

#include <nvml.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ivcuda/nvml_wire.h"
#include "ivcuda/result.h"

namespace ivcuda::host {

// What a worker cannot serve without: it must start NVML and find its GPUs.
#define IVCUDA_NVML_REQUIRED(X) X(nvmlInit_v2) X(nvmlShutdown) X(nvmlDeviceGetHandleByPciBusId_v2)

// The rest: a driver that lacks one answers that query with
// NVML_ERROR_FUNCTION_NOT_FOUND, as NVML's own loaders do.
#define IVCUDA_NVML_OPTIONAL(X)                                                                               \
  X(nvmlSystemGetDriverVersion) X(nvmlSystemGetNVMLVersion) X(nvmlSystemGetCudaDriverVersion_v2)             \
  X(nvmlDeviceGetName) X(nvmlDeviceGetSerial) X(nvmlDeviceGetBoardPartNumber) X(nvmlDeviceGetVbiosVersion)   \
  X(nvmlDeviceGetInforomImageVersion) X(nvmlDeviceGetPciInfo_v3) X(nvmlDeviceGetMinorNumber)                 \
  X(nvmlDeviceGetArchitecture) X(nvmlDeviceGetCudaComputeCapability) X(nvmlDeviceGetBrand)                   \
  X(nvmlDeviceGetBoardId) X(nvmlDeviceGetMultiGpuBoard) X(nvmlDeviceGetMemoryInfo_v2)                        \
  X(nvmlDeviceGetMemoryInfo) X(nvmlDeviceGetBAR1MemoryInfo) X(nvmlDeviceGetUtilizationRates)                 \
  X(nvmlDeviceGetEncoderUtilization) X(nvmlDeviceGetDecoderUtilization) X(nvmlDeviceGetTemperature)          \
  X(nvmlDeviceGetTemperatureThreshold) X(nvmlDeviceGetPowerUsage) X(nvmlDeviceGetPowerManagementLimit)       \
  X(nvmlDeviceGetPowerManagementDefaultLimit) X(nvmlDeviceGetPowerManagementLimitConstraints)                \
  X(nvmlDeviceGetEnforcedPowerLimit) X(nvmlDeviceGetTotalEnergyConsumption) X(nvmlDeviceGetClockInfo)        \
  X(nvmlDeviceGetMaxClockInfo) X(nvmlDeviceGetClock) X(nvmlDeviceGetApplicationsClock)                       \
  X(nvmlDeviceGetDefaultApplicationsClock) X(nvmlDeviceGetPerformanceState) X(nvmlDeviceGetFanSpeed)         \
  X(nvmlDeviceGetFanSpeed_v2) X(nvmlDeviceGetNumFans) X(nvmlDeviceGetEccMode) X(nvmlDeviceGetComputeMode)    \
  X(nvmlDeviceGetMigMode) X(nvmlDeviceGetPersistenceMode) X(nvmlDeviceGetDisplayMode)                        \
  X(nvmlDeviceGetDisplayActive) X(nvmlDeviceGetCurrPcieLinkGeneration) X(nvmlDeviceGetCurrPcieLinkWidth)     \
  X(nvmlDeviceGetMaxPcieLinkGeneration) X(nvmlDeviceGetMaxPcieLinkWidth) X(nvmlDeviceGetPcieThroughput)      \
  X(nvmlDeviceGetCurrentClocksEventReasons) X(nvmlDeviceGetComputeRunningProcesses_v3)                       \
  X(nvmlDeviceGetNvLinkState) X(nvmlDeviceGetNvLinkRemoteDeviceType) X(nvmlDeviceGetNvLinkRemotePciInfo_v2)  \
  X(nvmlDeviceGetTopologyCommonAncestor) X(nvmlDeviceGetP2PStatus) X(nvmlDeviceGetTotalEccErrors)          \
  X(nvmlDeviceGetMPSComputeRunningProcesses_v3) X(nvmlDeviceGetProcessUtilization) X(nvmlDeviceGetFieldValues)

// And the pass-through queries' (tools/nvml_passthrough.txt), generated:
// IVCUDA_NVML_PASSTHROUGH(X) and kPassthroughRows.
#include "nvml_passthrough_host.inc"

struct NvmlApi {
#define IVCUDA_NVML_MEMBER(f) decltype(&::f) f = nullptr;
  IVCUDA_NVML_REQUIRED(IVCUDA_NVML_MEMBER)
  IVCUDA_NVML_OPTIONAL(IVCUDA_NVML_MEMBER)
  IVCUDA_NVML_PASSTHROUGH(IVCUDA_NVML_MEMBER)
#undef IVCUDA_NVML_MEMBER
  void* handle = nullptr;
};

// A pass-through query (NvmlFn kPassthroughBase + row): its kind (1 system,
// 0 device, -1 no such row), and the call itself (nvml_passthrough.cc) on
// device `h` (null for a system query): NVML's code, a list's entry count in
// *count, the outputs' bytes in *out on success (never more than `cap`).
int nvml_passthrough_kind(std::uint32_t fn);
int nvml_passthrough(const NvmlApi& a, std::uint32_t fn, nvmlDevice_t h, std::uint64_t arg0, std::uint64_t arg1,
                     std::uint32_t cap, std::uint64_t* count, std::vector<std::byte>* out);

// Loads the library at `path` and resolves every function; fails when the
// library cannot be loaded or lacks a required one (the error names it).
Result<NvmlApi> load_nvml(const std::string& path);

}  // namespace ivcuda::host
