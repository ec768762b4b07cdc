// A stand-in for the guest library's hooks (guest/export_hooks.h) so that the
// export tables can be tested without a daemon: a configurable set of devices,
// a per-thread current context, and ids handed out on first sight.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <vector>

namespace ivcuda::guest::fake {

struct Device {
  CUuuid uuid;
  int pci_domain;
  int pci_bus;
  int pci_device;
};

// Test configuration; set it before calling into the tables.
struct Config {
  int driver_version = 13000;
  std::vector<Device> devices;
};
Config& config();

// The primary context handle the fake reports for `dev` (distinct per device).
CUcontext primary_of(CUdevice dev);

// The calling thread's current context (what hooks::current_context returns).
void set_current(CUcontext ctx);

// The id the fake gives a context or a stream: a function of the handle alone,
// distinct for distinct handles.
std::uint64_t context_id_of(CUcontext ctx);
std::uint64_t stream_id_of(CUstream stream);

}  // namespace ivcuda::guest::fake
