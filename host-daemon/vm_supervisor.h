// A worker per guest process in a VM. QEMU connects once per VM, and every
// CUDA process of that VM talks through the same BAR. The process forked for
// the connection becomes the VM's supervisor: it never loads the driver, and
// it starts one worker per guest process (its own contexts, handle tables and
// sticky-error state), tells each worker which channels are its process's,
// passes the guest's doorbells on to sleeping workers, and reclaims a process
// the moment the guest's kernel driver reports that it exited.
//
// A connection whose first channel belongs to the connecting process itself
// (process mode: the CUDA program is the ivshmem peer) skips all of this and
// is served by a worker in the supervisor's own process, as before.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "host-daemon/worker.h"
#include "ivcuda/result.h"
#include "ivcuda/shm_abi.h"
#include "ring/layout.h"

namespace ivcuda::host {

// Host-private memory shared by a VM's supervisor and its workers: a
// MAP_SHARED anonymous mapping made before any worker forks. The guest
// never sees it. Which worker serves which channel, which guest process
// each worker serves, and who holds which pages of the page-locked pool
// (one arena shared by the VM's processes: any process of the VM maps the
// whole BAR anyway, so partitioning it would protect nothing).
class VmShared {
 public:
  static constexpr std::uint32_t kMaxSlots = abi::kMaxChannels + 8;
  static constexpr std::uint64_t kPage = 4096;

  struct Slot {
    std::atomic<std::int32_t> guest_pid;   // the guest process served (0: a spare)
    std::atomic<std::int32_t> worker_pid;  // the worker process (0: slot free)
    std::atomic<std::uint32_t> ready;      // worker: 1 once it serves (driver and arena ready)
    std::atomic<std::uint32_t> reserved;
    std::atomic<std::uint64_t> mem;        // device memory charged to the VM's quota (quota.h)
  };

  // Maps and initialises the memory for layout l; nullptr on failure (errno).
  static VmShared* create(const ring::Layout& l);

  // Channel c's worker slot + 1, or 0 when no worker serves it.
  std::atomic<std::uint32_t>& owner(std::uint32_t c) noexcept { return hdr_()->owner[c]; }
  // The claim (ChannelDesc::guest_claim) the channel was last given out for:
  // a channel a worker released is not given out again until it is claimed anew.
  std::atomic<std::uint64_t>& bound_claim(std::uint32_t c) noexcept { return hdr_()->bound_claim[c]; }
  // Bumped by the supervisor after every change of owners; workers rescan on change.
  std::atomic<std::uint32_t>& version() noexcept { return hdr_()->version; }
  Slot& slot(std::uint32_t s) noexcept { return hdr_()->slots[s]; }

  // The page-locked pool: first fit in whole pages, for worker slot s.
  std::optional<std::uint64_t> pool_allocate(std::uint64_t bytes, std::uint32_t s);
  // Frees [off, off + bytes) if slot s holds all of it.
  bool pool_free(std::uint64_t off, std::uint64_t bytes, std::uint32_t s);
  // Frees everything slot s holds; returns the bytes.
  std::uint64_t pool_release_all(std::uint32_t s);

  // The VM's device-memory quota (quota.h): slot s's charge grows by `bytes`
  // unless the VM's total would pass `limit` (0: no limit).
  bool mem_charge(std::uint32_t s, std::uint64_t bytes, std::uint64_t limit) noexcept;
  // Returns the bytes taken off (never more than slot s holds).
  std::uint64_t mem_uncharge(std::uint32_t s, std::uint64_t bytes) noexcept;
  std::uint64_t mem_used() noexcept;
  // A reaped worker's charge returns to the VM; returns the bytes.
  std::uint64_t mem_release_all(std::uint32_t s) noexcept;

 private:
  struct Header {
    pthread_mutex_t pool_mu;  // process-shared, robust: a worker may die holding it
    std::uint64_t pool_off;
    std::uint64_t pages;
    std::atomic<std::uint32_t> version;
    std::atomic<std::uint32_t> owner[abi::kMaxChannels];
    std::atomic<std::uint64_t> bound_claim[abi::kMaxChannels];
    Slot slots[kMaxSlots];
  };
  Header* hdr_() noexcept { return reinterpret_cast<Header*>(this); }
  // Per pool page: the holding slot + 1, or 0.
  std::uint16_t* page_owner() noexcept {
    return reinterpret_cast<std::uint16_t*>(reinterpret_cast<std::byte*>(this) + sizeof(Header));
  }
  bool lock() noexcept;
  void unlock() noexcept;
};

// What the supervisor needs beyond one worker's configuration.
struct SupervisorConfig {
  WorkerConfig worker;        // the connection's fds, layout, driver; as for one worker
  pid_t peer_pid = -1;        // the connecting process (SO_PEERCRED); -1: never process mode
  std::uint32_t spares = 1;   // workers kept started ahead of the next guest process
  // Called in each worker process: right after fork, before the driver is
  // loaded (still one thread), and after Worker::create succeeded, before it
  // serves. The sandbox's two steps go here (host-daemon/sandbox.h). An error
  // ends the worker.
  std::function<Result<void>(const WorkerConfig&)> before_start;
  std::function<Result<void>(Worker&)> after_start;
  // Where a worker running in this process is published, for the SIGTERM
  // handler (it calls stop()).
  Worker** running = nullptr;
};

// Serves one connection until it hangs up or *stop_flag becomes nonzero (a
// signal handler sets it). Returns the exit status for the process.
int run_supervisor(SupervisorConfig cfg, volatile sig_atomic_t* stop_flag);

// A connection's process started before its guest connects: one of
// ivcudad's warm workers (docs/design.md, "Warm workers"). `cfg` is complete
// but for the guest's connection (conn_fd) and its pid (peer_pid).
//
// It forks the worker at once, which loads the driver, retains the first
// GPU's primary context, registers the arena, loads NVML and enters its
// sandbox, then waits; this process itself stays clear of the driver, so
// that it can still become a VM's supervisor (a process that loaded the
// driver cannot fork workers that use it). On `handoff_fd`, a socket to the
// daemon, it writes the byte 'R' once the worker is ready, and reads the
// guest's connection: an ivshmem message whose value is the peer's pid and
// whose fd is the connection. A process-mode guest is then served by the
// worker started ahead; a VM lets it go and is served as run_supervisor()
// serves one. The byte 'R' is followed by the worker's pid (4 bytes, host
// order). The daemon closing handoff_fd before a guest came lets the
// whole entry go. Returns the exit status for the process.
int run_warm_supervisor(SupervisorConfig cfg, int handoff_fd, volatile sig_atomic_t* stop_flag);

}  // namespace ivcuda::host
