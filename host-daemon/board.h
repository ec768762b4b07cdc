// A guest's status board: what ivcudactl status and the metrics endpoint
// show about it. One page of host memory per guest connection, mapped
// MAP_SHARED|MAP_ANONYMOUS by the daemon before it forks that guest's
// process, so the connection's supervisor and workers write it and the
// daemon reads it, and nobody else has it (a guest never maps it; every
// forked process unmaps the boards of the guests served before it, as with
// tenant registries).
//
// Trust: the counters are written by the guest's own workers, which parse
// hostile input. A subverted worker can make its own numbers lie, never
// another guest's, and never the daemon's record of who the guest is (socket,
// uid, pid, GPUs: the daemon keeps those in its own memory). The daemon
// copies what it reads and bounds the one string.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ivcuda::host {

// How a connection is served, as its supervisor found out.
enum class GuestMode : std::uint32_t {
  kStarting = 0,  // no CUDA process yet
  kProcess = 1,   // the CUDA program is the ivshmem peer itself
  kVm = 2,        // a QEMU VM (ivshmem-doorbell), a worker per guest process
  kPlain = 3,     // a QEMU VM over ivshmem-plain (polling)
};
const char* mode_name(GuestMode m) noexcept;

struct GuestStats {
  // Written by the daemon, read by workers.
  std::atomic<std::uint64_t> mem_limit;  // the guest's quota (0: none); `ivcudactl reload` changes it
  std::atomic<std::uint32_t> evict;      // 1: release everything, answer every call with an error
  std::atomic<std::uint32_t> reserved0;
  // Written by the guest's supervisor and workers.
  std::atomic<std::uint32_t> mode;       // GuestMode
  std::atomic<std::uint32_t> processes;  // guest processes served now
  std::atomic<std::uint64_t> mem_used;   // device memory charged to the quota (quota.h)
  std::atomic<std::uint64_t> calls;      // requests handled
  std::atomic<std::uint64_t> copy_bytes; // bytes copied between host and device memory
  std::atomic<std::uint64_t> errors;     // calls that answered an error
  std::atomic<std::uint32_t> evicted;    // workers: the last one that released after `evict`
  // The last error a call answered: a seqlock (odd while written).
  std::atomic<std::uint32_t> error_seq;
  std::atomic<std::uint64_t> error_time_ns;  // CLOCK_REALTIME
  char last_error[96];

  // Worker side: records that `op` answered `error` (both short constant strings).
  void note_error(const char* op, const char* error) noexcept;
  // Daemon side: a recycled worker's board for its next guest (main.cc):
  // everything but the quota's limit starts from nothing.
  void reset_for_next_guest() noexcept;
  // Daemon side: the last error as text, "" when none; bounded, and
  // never torn (a writer that keeps it odd gets "(being written)").
  std::string read_last_error(std::uint64_t* time_ns) const;
};

// One guest's board: the mapping and its lifetime.
class GuestBoard {
 public:
  // A zeroed board; nullptr (logged by the caller) when mmap fails.
  static std::unique_ptr<GuestBoard> create();
  ~GuestBoard();
  GuestBoard(const GuestBoard&) = delete;
  GuestBoard& operator=(const GuestBoard&) = delete;

  GuestStats& stats() noexcept { return *stats_; }
  const GuestStats& stats() const noexcept { return *stats_; }
  // In a forked process that serves another guest: drop this mapping
  // without touching it (the object stays, owning nothing).
  void unmap_in_child() noexcept;

 private:
  explicit GuestBoard(GuestStats* s) : stats_(s) {}
  GuestStats* stats_;
};

}  // namespace ivcuda::host
