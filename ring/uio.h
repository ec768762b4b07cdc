// The ivcuda UIO devices in a guest (uio-driver/ivcuda_uio.c): one UIO
// device per MSI-X vector, named "ivcuda-vec<k>", each carrying map 0 = the
// BAR0 registers (page-rounded; maps/map0/offset is where BAR0 starts) and
// map 1 = BAR2, the shared memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ivcuda/result.h"
#include "ring/sys.h"

namespace ivcuda::uio {

// BAR0 register offsets (QEMU docs/specs/ivshmem-spec.rst).
inline constexpr std::size_t kRegIvPosition = 8;
inline constexpr std::size_t kRegDoorbell = 12;
inline constexpr std::size_t kRegsUsed = 16;

struct UioVector {
  unsigned minor = 0;
  std::string pci;  // the PCI device it belongs to, e.g. 0000:00:03.0
};

// The ivcuda UIO devices of one PCI device, indexed by vector: the device
// named by `pci`, or the first one when `pci` is empty.
Result<std::vector<UioVector>> find_vectors(const std::string& pci);

struct Device {
  std::vector<UioVector> vectors;
  sys::Mapping regs;  // BAR0's pages
  std::size_t regs_off = 0;
  sys::Mapping shm;   // BAR2

  volatile std::uint32_t* reg(std::size_t off) const {
    return reinterpret_cast<volatile std::uint32_t*>(regs.data() + regs_off + off);
  }
  std::uint32_t peer_id() const { return *reg(kRegIvPosition); }
  // Rings `vector` of ivshmem peer `peer` (QEMU writes that peer's eventfd).
  void ring(std::uint32_t peer, std::uint32_t vector) const { *reg(kRegDoorbell) = peer << 16 | vector; }
};

// Maps BAR0 and BAR2 of the device (see find_vectors for `pci`).
Result<Device> open_device(const std::string& pci);

// Small sysfs helpers.
Result<std::string> read_text(const std::string& path);
Result<std::uint64_t> parse_u64(const std::string& s, const std::string& what);
Error errno_error(const std::string& what);

}  // namespace ivcuda::uio
