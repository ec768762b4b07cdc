// nvmlErrorString: answered here for every code nvml.h names. No `default`
// in the switch, so that -Wswitch names a code a new header adds.
#include "guest/nvml/internal.h"

namespace {

const char* describe(nvmlReturn_t r) noexcept {
  switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "The requested vgpu operation is not available on target device, because ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Ran out of critical resources, other than memory";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "The requested frequency is not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "The provided version is invalid/unsupported";
    case NVML_ERROR_DEPRECATED: return "The requested functionality has been deprecated";
    case NVML_ERROR_NOT_READY: return "The system is not ready for the request";
    case NVML_ERROR_GPU_NOT_FOUND: return "The GPU was not found";
    case NVML_ERROR_INVALID_STATE: return "The state is invalid";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "The reset type is not supported";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
  }
  return "Unknown Error";
}

}  // namespace

// Works before nvmlInit, as NVIDIA's does.
extern "C" const char* nvmlErrorString(nvmlReturn_t result) { return describe(result); }
