// Memory: the tenant's view as the worker gives it (total is the guest's
// quota where it has one, used what its workers hold), and BAR1.
#include "guest/nvml/internal.h"

using namespace ivcuda::nvml;

namespace {

nvmlReturn_t memory(nvmlDevice_t device, ivcuda::nvml_wire::RepNvml* rep) noexcept {
  unsigned i = 0;
  if (const nvmlReturn_t r = check_device(device, &i); r != NVML_SUCCESS) return r;
  return query(NvmlFn::kDeviceMemoryInfo, static_cast<int>(i), 0, rep);
}

}  // namespace

extern "C" {

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* mem) {
  unsigned i = 0;
  if (const nvmlReturn_t r = check_device(device, &i); r != NVML_SUCCESS) return r;
  if (mem == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  ivcuda::nvml_wire::RepNvml rep{};
  const nvmlReturn_t r = memory(device, &rep);
  if (r != NVML_SUCCESS) return r;
  // v1's used counts what the driver reserves too (nvml.h: "Sum of Reserved
  // and Allocated").
  const unsigned long long used = rep.val[2] + rep.val[3];
  mem->total = rep.val[0];
  mem->used = used;
  mem->free = used < rep.val[0] ? rep.val[0] - used : 0;  // v1 keeps total = free + used
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* mem) {
  unsigned i = 0;
  if (const nvmlReturn_t r = check_device(device, &i); r != NVML_SUCCESS) return r;
  if (mem == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (mem->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  ivcuda::nvml_wire::RepNvml rep{};
  const nvmlReturn_t r = memory(device, &rep);
  if (r != NVML_SUCCESS) return r;
  mem->total = rep.val[0];
  mem->free = rep.val[1];
  mem->used = rep.val[2];
  mem->reserved = rep.val[3];
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t* bar1Memory) {
  unsigned i = 0;
  if (const nvmlReturn_t r = check_device(device, &i); r != NVML_SUCCESS) return r;
  if (bar1Memory == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  ivcuda::nvml_wire::RepNvml rep{};
  const nvmlReturn_t r = query(NvmlFn::kDeviceBar1MemoryInfo, static_cast<int>(i), 0, &rep);
  if (r != NVML_SUCCESS) return r;
  bar1Memory->bar1Total = rep.val[0];
  bar1Memory->bar1Free = rep.val[1];
  bar1Memory->bar1Used = rep.val[2];
  return NVML_SUCCESS;
}

}  // extern "C"
