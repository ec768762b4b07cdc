// Managed memory (guest/managed.cc): what the rest of the guest library asks
// of it. Managed memory is built in the guest over ordinary device memory;
// the host sees device memory only. Every hook is one relaxed load while the
// process has no managed allocation.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "ivcuda/proto.h"

namespace ivcuda::guest {
class Runtime;
}

namespace ivcuda::guest::managed {

// Does the process hold any managed allocation? (The hooks' fast path.)
bool any() noexcept;

// Before GPU work that may touch any managed memory (a kernel launch, a graph
// launch) on `stream` of context `ctx`: what the CPU wrote goes back to the
// device and the CPU's view is withdrawn until its next access.
[[nodiscard]] CUresult before_launch(Runtime* rt, std::uint64_t stream);

// Before a copy or memset the host performs on [p, p + n) as device memory:
// what the CPU wrote there goes back to the device first; with `writes` the
// CPU's view of the range is withdrawn too. Ranges outside managed memory
// are left alone.
[[nodiscard]] CUresult device_use(Runtime* rt, std::uint64_t p, std::uint64_t n, bool writes);

// Is [p, p + n) (n >= 1) inside one managed allocation?
bool contains(const void* p, std::uint64_t n) noexcept;

// The managed allocation holding p, for pointer attributes and address ranges.
struct Range {
  std::uint64_t start = 0, size = 0;
  std::uint64_t ctx = 0;
};
bool find(std::uint64_t p, Range* out);

// cuMemFree of a managed pointer: true (with the answer in *st) when p is in
// managed memory, false for any other pointer.
bool free(Runtime* rt, std::uint64_t p, CUresult* st);

// The device attributes a guest sees for managed memory (the GPU's own
// answers describe memory the worker's process would manage).
void device_attributes(proto::RepDeviceInfo* info) noexcept;

}  // namespace ivcuda::guest::managed
