// cuMemHostRegister of ordinary guest memory, made truly shared with the GPU.
//
// The GPU can reach only the arena (the BAR memory the daemon registered), so
// registering a range moves the pages holding it onto arena pages: their
// contents are copied into freshly allocated arena pages, which are then
// mapped at the same virtual addresses. Stores by the guest CPU and by
// kernels meet in the same physical pages, with no API call in between.
// Unregistering moves the pages back into private anonymous memory.
//
// Pages are reference-counted: registrations that share a page share its
// arena page, which goes back to private memory with the last of them.
// Memory of a shared mapping (a memfd, a /dev/shm file) is not moved (that
// would cut it off from the mapping's other users): in process mode the
// worker maps and page-locks the same pages of the file, so copies DMA them
// and they have a device alias; where it cannot (a VM's process, a file with
// no descriptor or path here) the registration is recorded and copies stage it.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "guest/runtime.h"

namespace ivcuda::guest::hostreg {

// The cuMemHostRegister / cuMemHostUnregister semantics; `ctx` is the
// caller's current context.
CUresult register_range(Runtime* rt, std::uint64_t ctx, void* p, std::size_t bytes, unsigned flags);
CUresult unregister_range(Runtime* rt, void* p);

// The registration containing byte p.
struct Found {
  std::uintptr_t base = 0;    // what was registered
  std::size_t size = 0;
  unsigned flags = 0;         // CU_MEMHOSTREGISTER_*
  std::uint64_t ctx = 0;      // the context current at registration
  std::uint64_t dptr = 0;     // device alias of p (not of base); 0 for memory of a shared
                              // mapping the worker could not page-lock (staged)
};
std::optional<Found> find(Runtime* rt, const void* p);

}  // namespace ivcuda::guest::hostreg
