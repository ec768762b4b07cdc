// PCI: the device's bus id and ids in nvmlPciInfo_t's three generations, and
// the link. v1 and v2 callers pass the old struct, whose first 36 bytes
// (a 16-byte bus id, domain, bus, device, pciDeviceId, pciSubSystemId) are
// the current struct's prefix and whose tail is reserved: they get that
// prefix only. v3 adds the 32-byte busId after it.
#include <cstddef>
#include <cstring>

#include "guest/nvml/internal.h"

using namespace ivcuda::nvml;

namespace {

constexpr std::size_t kLegacyBytes = offsetof(nvmlPciInfo_t, busId);
static_assert(kLegacyBytes == 36);

nvmlReturn_t pci_info(nvmlDevice_t device, nvmlPciInfo_t* pci, bool with_bus_id) noexcept {
  unsigned i = 0;
  if (const nvmlReturn_t r = check_device(device, &i); r != NVML_SUCCESS) return r;
  if (pci == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  ivcuda::nvml_wire::NvmlPci p{};
  ivcuda::nvml_wire::RepNvml rep{};
  const nvmlReturn_t r = query(NvmlFn::kDevicePciInfo, static_cast<int>(i), 0, 0, &p, sizeof p, &rep);
  if (r != NVML_SUCCESS) return r;
  if (rep.out_len < sizeof p) return NVML_ERROR_UNKNOWN;
  nvmlPciInfo_t v{};
  std::memcpy(v.busIdLegacy, p.bus_id_legacy, sizeof v.busIdLegacy - 1);
  v.domain = p.domain;
  v.bus = p.bus;
  v.device = p.device;
  v.pciDeviceId = p.pci_device_id;
  v.pciSubSystemId = p.pci_subsystem_id;
  std::memcpy(v.busId, p.bus_id, sizeof v.busId - 1);
  std::memcpy(pci, &v, with_bus_id ? sizeof v : kLegacyBytes);
  return NVML_SUCCESS;
}

}  // namespace

extern "C" {

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) { return pci_info(device, pci, true); }
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t* pci) { return pci_info(device, pci, false); }
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t* pci) { return pci_info(device, pci, false); }

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int* currLinkGen) {
  return device_value(NvmlFn::kDeviceCurrPcieLinkGeneration, device, currLinkGen);
}
nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int* currLinkWidth) {
  return device_value(NvmlFn::kDeviceCurrPcieLinkWidth, device, currLinkWidth);
}
nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int* maxLinkGen) {
  return device_value(NvmlFn::kDeviceMaxPcieLinkGeneration, device, maxLinkGen);
}
nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int* maxLinkWidth) {
  return device_value(NvmlFn::kDeviceMaxPcieLinkWidth, device, maxLinkWidth);
}
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter, unsigned int* value) {
  return device_value(NvmlFn::kDevicePcieThroughput, device, value, static_cast<std::uint64_t>(counter));
}

}  // extern "C"
