// Device handles and what identifies a device: count, handles by index,
// UUID, serial and PCI bus id, index, name, UUID, serial, board and
// firmware facts, architecture and compute capability.
#include <cstdio>
#include <cstring>
#include <string>

#include "guest/nvml/internal.h"

using namespace ivcuda::nvml;

namespace {

nvmlReturn_t count(unsigned* n) noexcept {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (n == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *n = device_count();
  return NVML_SUCCESS;
}

nvmlReturn_t by_index(unsigned index, nvmlDevice_t* device) noexcept {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (device == nullptr || index >= device_count()) return NVML_ERROR_INVALID_ARGUMENT;
  *device = handle_of(index);
  return NVML_SUCCESS;
}

// The device whose string `fn` equals `want`. NOT_FOUND when none does; a
// failure to ask (the host's NVML refusing) is passed on.
nvmlReturn_t by_string(NvmlFn fn, const char* want, nvmlDevice_t* device) noexcept {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (want == nullptr || device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  for (unsigned i = 0; i < device_count(); ++i) {
    char s[128];
    const nvmlReturn_t r = query_string(fn, static_cast<int>(i), s, sizeof s);
    if (r != NVML_SUCCESS) return r;
    if (std::strcmp(s, want) == 0) {
      *device = handle_of(i);
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}

// "domain:bus:device.function" or "bus:device.function", hexadecimal, the
// domain 4 or 8 digits: NVML's bus id forms.
bool parse_bus_id(const char* s, unsigned* domain, unsigned* bus, unsigned* dev) noexcept {
  unsigned d = 0, b = 0, v = 0, f = 0;
  int used = 0;
  const bool full = std::sscanf(s, "%x:%x:%x.%x%n", &d, &b, &v, &f, &used) == 4 && s[used] == '\0';
  if (!full) {
    d = 0;
    used = 0;
    if (std::sscanf(s, "%x:%x.%x%n", &b, &v, &f, &used) != 3 || s[used] != '\0') return false;
  }
  *domain = d;
  *bus = b;
  *dev = v;
  return true;
}

nvmlReturn_t by_pci(const char* bus_id, nvmlDevice_t* device) noexcept {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (bus_id == nullptr || device == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned domain = 0, bus = 0, dev = 0;
  if (!parse_bus_id(bus_id, &domain, &bus, &dev)) return NVML_ERROR_INVALID_ARGUMENT;
  for (unsigned i = 0; i < device_count(); ++i) {
    ivcuda::nvml_wire::NvmlPci pci{};
    ivcuda::nvml_wire::RepNvml rep{};
    const nvmlReturn_t r = query(NvmlFn::kDevicePciInfo, static_cast<int>(i), 0, 0, &pci, sizeof pci, &rep);
    if (r != NVML_SUCCESS) return r;
    if (rep.out_len < sizeof pci) return NVML_ERROR_UNKNOWN;
    if (pci.domain == domain && pci.bus == bus && pci.device == dev) {
      *device = handle_of(i);
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t device_string(NvmlFn fn, nvmlDevice_t d, char* buf, unsigned length) noexcept {
  unsigned i = 0;
  if (const nvmlReturn_t r = check_device(d, &i); r != NVML_SUCCESS) return r;
  return query_string(fn, static_cast<int>(i), buf, length);
}

}  // namespace

extern "C" {

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* deviceCount) { return count(deviceCount); }
nvmlReturn_t nvmlDeviceGetCount(unsigned int* deviceCount) { return count(deviceCount); }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) { return by_index(index, device); }
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t* device) { return by_index(index, device); }
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  return by_string(NvmlFn::kDeviceUuid, uuid, device);
}
nvmlReturn_t nvmlDeviceGetHandleBySerial(const char* serial, nvmlDevice_t* device) {
  return by_string(NvmlFn::kDeviceSerial, serial, device);
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* pciBusId, nvmlDevice_t* device) {
  return by_pci(pciBusId, device);
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char* pciBusId, nvmlDevice_t* device) {
  return by_pci(pciBusId, device);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) {
  unsigned i = 0;
  if (const nvmlReturn_t r = check_device(device, &i); r != NVML_SUCCESS) return r;
  if (index == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *index = i;
  return NVML_SUCCESS;
}

// A guest's handles are whole GPUs, never MIG devices.
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int* isMigDevice) {
  unsigned i = 0;
  if (const nvmlReturn_t r = check_device(device, &i); r != NVML_SUCCESS) return r;
  if (isMigDevice == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *isMigDevice = 0;
  return NVML_SUCCESS;
}

// So the questions only a MIG device handle answers get NVML's answer for a
// whole GPU's handle (as measured on the H200: INVALID_ARGUMENT).
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int* id) {
  unsigned i = 0;
  if (const nvmlReturn_t r = check_device(device, &i); r != NVML_SUCCESS) return r;
  (void)id;
  return NVML_ERROR_INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int* id) {
  unsigned i = 0;
  if (const nvmlReturn_t r = check_device(device, &i); r != NVML_SUCCESS) return r;
  (void)id;
  return NVML_ERROR_INVALID_ARGUMENT;
}
nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t* device) {
  unsigned i = 0;
  if (const nvmlReturn_t r = check_device(migDevice, &i); r != NVML_SUCCESS) return r;
  (void)device;
  return NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length) {
  return device_string(NvmlFn::kDeviceName, device, name, length);
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  return device_string(NvmlFn::kDeviceUuid, device, uuid, length);
}
nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char* serial, unsigned int length) {
  return device_string(NvmlFn::kDeviceSerial, device, serial, length);
}
nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t device, char* partNumber, unsigned int length) {
  return device_string(NvmlFn::kDeviceBoardPartNumber, device, partNumber, length);
}
nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char* version, unsigned int length) {
  return device_string(NvmlFn::kDeviceVbiosVersion, device, version, length);
}
nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t device, char* version, unsigned int length) {
  return device_string(NvmlFn::kDeviceInforomImageVersion, device, version, length);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int* minorNumber) {
  return device_value(NvmlFn::kDeviceMinorNumber, device, minorNumber);
}
nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, nvmlDeviceArchitecture_t* arch) {
  return device_value(NvmlFn::kDeviceArchitecture, device, arch);
}
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int* major, int* minor) {
  return device_pair(NvmlFn::kDeviceCudaComputeCapability, device, major, minor);
}
nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t* type) {
  return device_value(NvmlFn::kDeviceBrand, device, type);
}
nvmlReturn_t nvmlDeviceGetBoardId(nvmlDevice_t device, unsigned int* boardId) {
  return device_value(NvmlFn::kDeviceBoardId, device, boardId);
}
nvmlReturn_t nvmlDeviceGetMultiGpuBoard(nvmlDevice_t device, unsigned int* multiGpuBool) {
  return device_value(NvmlFn::kDeviceMultiGpuBoard, device, multiGpuBool);
}
nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t* mode) {
  return device_value(NvmlFn::kDeviceComputeMode, device, mode);
}
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int* currentMode, unsigned int* pendingMode) {
  return device_pair(NvmlFn::kDeviceMigMode, device, currentMode, pendingMode);
}
nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t* current, nvmlEnableState_t* pending) {
  return device_pair(NvmlFn::kDeviceEccMode, device, current, pending);
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType, unsigned long long* eccCounts) {
  return device_value(NvmlFn::kDeviceTotalEccErrors, device, eccCounts, static_cast<std::uint64_t>(errorType),
                      static_cast<std::uint64_t>(counterType));
}
nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t* mode) {
  return device_value(NvmlFn::kDevicePersistenceMode, device, mode);
}
nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, nvmlEnableState_t* display) {
  return device_value(NvmlFn::kDeviceDisplayMode, device, display);
}
nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device, nvmlEnableState_t* isActive) {
  return device_value(NvmlFn::kDeviceDisplayActive, device, isActive);
}

}  // extern "C"
