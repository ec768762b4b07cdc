// A tenant's registry of shared objects: what one worker of a tenant exports
// (CUDA IPC memory and event handles, pointers of exported memory pools:
// whatever the driver hands out as plain bytes; driver file descriptors
// travel through fd_broker.h instead) so that another worker of the same
// tenant can import it.
//
// The daemon keeps one registry per tenant in its own memory (fd_broker.h
// says what a tenant is and how a worker's line gets one). No worker maps
// any of it: a worker publishes, looks up and withdraws over its line to
// the daemon, which answers from the registry of that line's tenant only.
// So the driver's raw handles of one tenant are never in memory that a
// worker of another tenant can read, and no worker can hold a lock that
// another tenant's workers wait for. A worker without a line (--join,
// tests) keeps a registry of its own, for its own guest processes.
//
// The guest never sees the driver's handle: it gets a ticket (slot index and
// a 128-bit random token, drawn with getrandom) packed into the 64 opaque
// bytes of CUipcMemHandle / CUipcEventHandle / CUmemPoolPtrExportData. A
// forged token, a stale slot or a ticket issued in another tenant (whose
// tokens this registry never held) finds nothing.
//
// Bounded twice: a tenant has `slots` entries, and one guest (one
// connection) at most `per_guest` of them, so that one guest cannot use up
// the room of its tenant's other guests (nor the daemon's memory). An entry
// goes when its exporter withdraws it, when the line it came on ends (the
// worker ended, however), or when its guest's connection ends.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

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
  std::uint32_t owner_proc = 0;   // the guest process that exported it, as that guest numbers it
  std::uint64_t key = 0;          // the exporter's own name for it (allocation base, event handle)
  std::uint64_t base = 0;         // memory: the allocation's address in the exporter
  std::uint64_t size = 0;         // memory: its size
  std::uint64_t aux = 0;          // kind-specific: pool pointers: the exporter's driver pool
  std::array<std::byte, 64> payload{};  // the driver's handle; never leaves the host
};

// Who published an entry: the line it came on (one worker) and that line's
// guest (its connection).
struct ShareOwner {
  std::uint64_t line = 0;
  std::uint32_t guest = 0;
};

// A lookup's answer. `mine`: the asking line published it (its worker serves
// the exporting process, or a sibling process of it in a VM). Otherwise the
// exporter's own names (key, base, aux) are not told: an importer in another
// worker needs the driver's handle and the size, nothing of the exporter's
// address space.
struct ShareFound {
  ShareEntry entry;
  bool mine = false;
};

class ShareRegistry {
 public:
  static constexpr std::uint32_t kDefaultSlots = 4096;
  static constexpr std::uint32_t kDefaultPerGuest = 1024;
  static constexpr std::uint32_t kMaxSlots = 1u << 20;

  explicit ShareRegistry(std::uint32_t slots = kDefaultSlots, std::uint32_t per_guest = kDefaultPerGuest);

  // Stores e for `owner` under a fresh slot and token. An object its line
  // already published (same kind and key) keeps its ticket: exported twice,
  // it is the same handle, as the driver gives. ENOSPC: the tenant's slots,
  // or its guest's share of them, are taken.
  Result<ShareTicket> publish(const ShareEntry& e, ShareOwner owner);
  // The entry a ticket names, if slot, kind and token all match.
  std::optional<ShareFound> lookup(ShareKind kind, const ShareTicket& t, std::uint64_t line) const;
  // The line's entry for (kind, key) goes (the object was freed). Whether there was one.
  bool withdraw(ShareKind kind, std::uint64_t key, std::uint64_t line);
  // Every entry of a line that ended, or of a guest whose connection ended.
  unsigned drop_line(std::uint64_t line);
  unsigned drop_guest(std::uint32_t guest);

  std::uint32_t capacity() const noexcept { return slots_; }
  std::uint32_t in_use() const noexcept { return used_; }
  std::uint32_t of_guest(std::uint32_t guest) const;

 private:
  struct Slot {
    ShareEntry e;
    ShareToken token;
    ShareOwner owner;
    bool used = false;
  };
  using OwnKey = std::tuple<std::uint64_t, std::uint32_t, std::uint64_t>;  // line, kind, key
  void release(std::uint32_t i);

  std::uint32_t slots_;
  std::uint32_t per_guest_;
  std::vector<Slot> slot_;             // grows as needed, up to slots_
  std::vector<std::uint32_t> free_;    // slots to use again (with a fresh token)
  std::map<OwnKey, std::uint32_t> own_;
  std::map<std::uint32_t, std::uint32_t> guest_used_;
  std::uint32_t used_ = 0;
};

// The 64 opaque bytes a guest holds: magic, slot, token, zeros. decode
// refuses anything else, so a flipped bit anywhere is noticed.
void encode_ticket(std::uint32_t magic, const ShareTicket& t, std::byte out[64]) noexcept;
std::optional<ShareTicket> decode_ticket(std::uint32_t magic, const std::byte in[64]) noexcept;

}  // namespace ivcuda::host
