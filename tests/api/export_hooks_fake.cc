// The fake hooks (see export_hooks_fake.h).
#include "tests/api/export_hooks_fake.h"

#include <cstring>

#include "guest/export_hooks.h"

namespace ivcuda::guest {
namespace fake {
namespace {
thread_local CUcontext t_current = nullptr;
constexpr std::uintptr_t kPrimaryBase = 0x7c000000;
}  // namespace

Config& config() {
  static Config c;
  return c;
}

CUcontext primary_of(CUdevice dev) {
  return reinterpret_cast<CUcontext>(kPrimaryBase + 0x1000 * static_cast<std::uintptr_t>(dev));
}

void set_current(CUcontext ctx) { t_current = ctx; }

std::uint64_t context_id_of(CUcontext ctx) { return reinterpret_cast<std::uintptr_t>(ctx) * 2 + 1; }
std::uint64_t stream_id_of(CUstream stream) { return reinterpret_cast<std::uintptr_t>(stream) + 100; }

}  // namespace fake

namespace hooks {
namespace {
bool valid(CUdevice dev) { return dev >= 0 && static_cast<std::size_t>(dev) < fake::config().devices.size(); }
}  // namespace

CUresult primary_context(CUdevice dev, CUcontext* out) noexcept {
  if (!valid(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *out = fake::primary_of(dev);
  return CUDA_SUCCESS;
}

CUresult current_context(CUcontext* out) noexcept {
  *out = fake::t_current;
  return CUDA_SUCCESS;
}

CUresult context_id(CUcontext ctx, std::uint64_t* out) noexcept {
  if (ctx == nullptr) ctx = fake::t_current;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *out = fake::context_id_of(ctx);
  return CUDA_SUCCESS;
}

CUresult stream_id(CUcontext, CUstream stream, std::uint64_t* out) noexcept {
  *out = fake::stream_id_of(stream);
  return CUDA_SUCCESS;
}

CUresult driver_version(int* out) noexcept {
  *out = fake::config().driver_version;
  return CUDA_SUCCESS;
}

CUresult device_count(int* out) noexcept {
  *out = static_cast<int>(fake::config().devices.size());
  return CUDA_SUCCESS;
}

CUresult device_uuid(CUdevice dev, CUuuid* out) noexcept {
  if (!valid(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *out = fake::config().devices[static_cast<std::size_t>(dev)].uuid;
  return CUDA_SUCCESS;
}

CUresult device_attribute(CUdevice dev, CUdevice_attribute attr, int* out) noexcept {
  if (!valid(dev)) return CUDA_ERROR_INVALID_DEVICE;
  const fake::Device& d = fake::config().devices[static_cast<std::size_t>(dev)];
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *out = d.pci_domain; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *out = d.pci_bus; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *out = d.pci_device; return CUDA_SUCCESS;
    default: return CUDA_ERROR_NOT_SUPPORTED;
  }
}

// Any non-null module holds two kernels, whose handles are the module's + 1 and + 2.
CUresult module_functions(CUmodule mod, void (*cb)(void*, CUfunction), void* user) noexcept {
  if (mod == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  for (std::uintptr_t k = 1; k <= 2; ++k)
    cb(user, reinterpret_cast<CUfunction>(reinterpret_cast<std::uintptr_t>(mod) + k));
  return CUDA_SUCCESS;
}

}  // namespace hooks
}  // namespace ivcuda::guest
