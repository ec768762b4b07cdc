// A tenant's registry of shared objects: what one worker of a tenant exports
// (CUDA IPC memory and event handles, pointers of exported memory pools:
// whatever the driver hands out as plain bytes; driver file descriptors
// travel through fd_broker.h instead) so that another worker of the same
// tenant can import it.
//
// A tenant is one listening socket of ivcudad (or one ivshmem-plain file, or
// one guest of --join). The daemon creates one TenantShare per tenant before
// it forks that tenant's workers, so every worker of the tenant inherits the
// same anonymous MAP_SHARED region and no other tenant's worker has it (a
// worker unmaps the registries of other tenants right after fork). The region
// is host memory only: no guest ever maps it.
//
// The guest never sees the driver's handle: it gets a ticket (slot index and
// a 128-bit random token, drawn with getrandom) packed into the 64 opaque
// bytes of CUipcMemHandle / CUipcEventHandle / CUmemPoolPtrExportData. An importing worker looks the
// ticket up in its own tenant's registry: a forged token, a stale slot or a
// ticket issued by another tenant (whose tokens this registry never held)
// finds nothing.
//
// Concurrency: one process-shared robust mutex guards all slots; a worker
// that dies holding it (a kernel fault kills workers) leaves the registry
// usable, and a slot becomes visible only after it is complete. Nothing
// slow runs under the lock (no driver call). The daemon's parent takes the
// lock only with a timeout, since a worker that parses hostile input could
// be subverted and hold it.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "ivcuda/result.h"

namespace ivcuda::host {

// What a slot holds. Append new kinds; a ticket of one kind never finds an
// entry of another.
enum class ShareKind : std::uint32_t {
  kFree = 0,
  kIpcMem = 1,    // cuIpcGetMemHandle
  kIpcEvent = 2,  // cuIpcGetEventHandle
  kPoolPtr = 3,   // cuMemPoolExportPointer
};

struct ShareToken {
  std::uint64_t w[2] = {0, 0};
};

// What a guest is given for an exported object.
struct ShareTicket {
  std::uint32_t slot = 0;
  ShareToken token;
};

// One exported object as the exporter describes it.
struct ShareEntry {
  ShareKind kind = ShareKind::kFree;
  std::int32_t owner_pid = 0;     // the exporting worker (set by publish)
  std::uint32_t owner_guest = 0;  // its guest id, for logs
  std::uint32_t owner_proc = 0;   // the guest process that exported it, as that guest numbers it
  std::uint64_t key = 0;          // the exporter's own name for it (allocation base, event handle)
  std::uint64_t base = 0;         // memory: the allocation's range in the exporter
  std::uint64_t size = 0;
  std::uint64_t aux = 0;          // kind-specific: pool pointers: the exporter's driver pool
  std::array<std::byte, 64> payload{};  // the driver's handle; never leaves the host
};

class TenantShare {
 public:
  static constexpr std::uint32_t kDefaultSlots = 4096;

  // Maps a fresh registry of `slots` entries (anonymous, shared, inherited by fork).
  static Result<std::unique_ptr<TenantShare>> create(std::uint32_t slots = kDefaultSlots);
  ~TenantShare();
  TenantShare(const TenantShare&) = delete;
  TenantShare& operator=(const TenantShare&) = delete;

  // Exporter: stores e under a fresh slot and token, owned by this process.
  // ENOSPC when every slot is taken.
  Result<ShareTicket> publish(const ShareEntry& e);
  // Exporter: the ticket this process already holds for (kind, key), so that
  // exporting one object twice gives the same handle, as the driver does.
  std::optional<ShareTicket> find_own(ShareKind kind, std::uint64_t key);
  // Importer: the entry a ticket names, if slot, kind and token all match.
  std::optional<ShareEntry> lookup(ShareKind kind, const ShareTicket& t);
  // Exporter: forgets this process's entries for (kind, key) (the object was
  // freed). Returns how many.
  unsigned withdraw(ShareKind kind, std::uint64_t key);
  // Forgets every entry `pid` published: a worker at its end, and the daemon
  // after reaping one (a worker that crashed). `timeout_ms` < 0: wait for the
  // lock as long as it takes. Returns how many, or -1 if the lock was not had.
  int withdraw_owner(pid_t pid, int timeout_ms = -1);

  std::uint32_t capacity() const noexcept;
  std::uint32_t in_use();

  // Drops this process's mapping (a worker, for other tenants' registries).
  void unmap() noexcept;

 private:
  struct Region;
  struct Locked;
  TenantShare(Region* r, std::size_t bytes, std::uint32_t slots) : r_(r), bytes_(bytes), slots_(slots) {}
  Region* r_ = nullptr;
  std::size_t bytes_ = 0;
  std::uint32_t slots_ = 0;  // private: the region's header is writable by every worker
};

// The 64 opaque bytes a guest holds: magic, slot, token, zeros. decode
// refuses anything else, so a flipped bit anywhere is noticed.
void encode_ticket(std::uint32_t magic, const ShareTicket& t, std::byte out[64]) noexcept;
std::optional<ShareTicket> decode_ticket(std::uint32_t magic, const std::byte in[64]) noexcept;

}  // namespace ivcuda::host
