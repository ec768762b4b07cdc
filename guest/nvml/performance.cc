// Utilization, temperature, power, energy, clocks, performance state and
// fans: the GPU's own figures (shared by every tenant), forwarded.
#include <algorithm>
#include <utility>

#include "guest/nvml/internal.h"

using namespace ivcuda::nvml;

extern "C" {

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* utilization) {
  if (utilization == nullptr) {
    unsigned i = 0;
    const nvmlReturn_t r = check_device(device, &i);
    return r != NVML_SUCCESS ? r : NVML_ERROR_INVALID_ARGUMENT;
  }
  return device_pair(NvmlFn::kDeviceUtilizationRates, device, &utilization->gpu, &utilization->memory);
}
nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int* utilization,
                                             unsigned int* samplingPeriodUs) {
  return device_pair(NvmlFn::kDeviceEncoderUtilization, device, utilization, samplingPeriodUs);
}
nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int* utilization,
                                             unsigned int* samplingPeriodUs) {
  return device_pair(NvmlFn::kDeviceDecoderUtilization, device, utilization, samplingPeriodUs);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int* temp) {
  return device_value(NvmlFn::kDeviceTemperature, device, temp, static_cast<std::uint64_t>(sensorType));
}
// The versioned form (nvml.h's replacement for the one above, which nvitop
// asks first): the same query in a struct that names its version.
nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t* temperature) {
  if (temperature == nullptr) {
    unsigned i = 0;
    const nvmlReturn_t r = check_device(device, &i);
    return r != NVML_SUCCESS ? r : NVML_ERROR_INVALID_ARGUMENT;
  }
  if (temperature->version != nvmlTemperature_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  unsigned value = 0;
  const nvmlReturn_t r = device_value(NvmlFn::kDeviceTemperature, device, &value,
                                      static_cast<std::uint64_t>(temperature->sensorType));
  if (r == NVML_SUCCESS) temperature->temperature = static_cast<int>(value);
  return r;
}
nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, nvmlTemperatureThresholds_t thresholdType,
                                               unsigned int* temp) {
  return device_value(NvmlFn::kDeviceTemperatureThreshold, device, temp, static_cast<std::uint64_t>(thresholdType));
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int* power) {
  return device_value(NvmlFn::kDevicePowerUsage, device, power);
}
nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int* limit) {
  return device_value(NvmlFn::kDevicePowerManagementLimit, device, limit);
}
nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int* defaultLimit) {
  return device_value(NvmlFn::kDevicePowerManagementDefaultLimit, device, defaultLimit);
}
nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned int* minLimit,
                                                          unsigned int* maxLimit) {
  return device_pair(NvmlFn::kDevicePowerManagementLimitConstraints, device, minLimit, maxLimit);
}
nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int* limit) {
  return device_value(NvmlFn::kDeviceEnforcedPowerLimit, device, limit);
}
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long* energy) {
  return device_value(NvmlFn::kDeviceTotalEnergyConsumption, device, energy);
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int* clock) {
  return device_value(NvmlFn::kDeviceClockInfo, device, clock, static_cast<std::uint64_t>(type));
}
nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int* clock) {
  return device_value(NvmlFn::kDeviceMaxClockInfo, device, clock, static_cast<std::uint64_t>(type));
}
nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, nvmlClockType_t clockType, nvmlClockId_t clockId,
                                unsigned int* clockMHz) {
  return device_value(NvmlFn::kDeviceClock, device, clockMHz, static_cast<std::uint64_t>(clockType),
                      static_cast<std::uint64_t>(clockId));
}
nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t device, nvmlClockType_t clockType, unsigned int* clockMHz) {
  return device_value(NvmlFn::kDeviceApplicationsClock, device, clockMHz, static_cast<std::uint64_t>(clockType));
}
nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t device, nvmlClockType_t clockType,
                                                   unsigned int* clockMHz) {
  return device_value(NvmlFn::kDeviceDefaultApplicationsClock, device, clockMHz,
                      static_cast<std::uint64_t>(clockType));
}
nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long* clocksEventReasons) {
  return device_value(NvmlFn::kDeviceClocksEventReasons, device, clocksEventReasons);
}
// The deprecated name of the same question.
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long* clocksThrottleReasons) {
  return device_value(NvmlFn::kDeviceClocksEventReasons, device, clocksThrottleReasons);
}

nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t* pState) {
  return device_value(NvmlFn::kDevicePerformanceState, device, pState);
}
// Deprecated in nvml.h in favour of nvmlDeviceGetPerformanceState: the same answer.
nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, nvmlPstates_t* pState) {
  return device_value(NvmlFn::kDevicePerformanceState, device, pState);
}

nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int* speed) {
  return device_value(NvmlFn::kDeviceFanSpeed, device, speed);
}
nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan, unsigned int* speed) {
  return device_value(NvmlFn::kDeviceFanSpeedV2, device, speed, fan);
}
nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t device, unsigned int* numFans) {
  return device_value(NvmlFn::kDeviceNumFans, device, numFans);
}

// Field values (DCGM's and XLA's way of asking): two fields a query, each
// answered with its own nvmlReturn as NVML does; the call fails only when a
// query does.
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t* values) {
  unsigned i = 0;
  if (const nvmlReturn_t r = check_device(device, &i); r != NVML_SUCCESS) return r;
  if (valuesCount < 0 || (values == nullptr && valuesCount > 0)) return NVML_ERROR_INVALID_ARGUMENT;
  for (int k = 0; k < valuesCount; k += 2) {
    const int n = valuesCount - k >= 2 ? 2 : 1;
    nvmlFieldValue_t got[2] = {};
    std::uint64_t args[2] = {0, 0};
    for (int j = 0; j < n; ++j) {
      if (values[k + j].fieldId == 0) {  // no field: NVML's answer for it, without asking
        values[k + j].nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
        continue;
      }
      args[j] = values[k + j].fieldId | static_cast<std::uint64_t>(values[k + j].scopeId) << 32;
    }
    if (args[0] == 0 && args[1] == 0) continue;
    if (args[0] == 0) std::swap(args[0], args[1]);
    ivcuda::nvml_wire::RepNvml rep{};
    const nvmlReturn_t r = query(NvmlFn::kDeviceFieldValues, static_cast<int>(i), args[0], args[1], got, sizeof got, &rep);
    if (r != NVML_SUCCESS) return r;
    const auto m = std::min<std::uint64_t>(rep.val[0], rep.out_len / sizeof(nvmlFieldValue_t));
    for (std::uint64_t g = 0; g < m && g < 2; ++g)
      for (int j = 0; j < n; ++j)
        if (values[k + j].fieldId == got[g].fieldId && values[k + j].scopeId == got[g].scopeId) values[k + j] = got[g];
  }
  return NVML_SUCCESS;
}

}  // extern "C"
