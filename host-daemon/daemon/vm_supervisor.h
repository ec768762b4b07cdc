// A worker per guest process in a VM. QEMU connects once per VM, and every
// CUDA process of that VM talks through the same BAR. The process forked for
// the connection becomes the VM's supervisor: it never loads the driver, and
// it starts one worker per guest process (its own contexts, handle tables and
// sticky-error state), tells each worker which channels are its process's,
// passes the guest's doorbells on to sleeping workers, and reclaims a process
// the moment the guest's kernel driver reports that it exited.
//
// A guest process is what its channels' claims say, (PID namespace, pid): a
// hint from the guest about its own processes, never trusted further. So
// that one connection cannot take the host's GPUs with workers, it has at
// most --max-workers-per-guest of them, starts them at a bounded rate, and
// every one beyond its first that serves a process counts in its user id's
// --max-guests-per-uid (worker_budget.h); a process refused a worker sees
// its channels lost (ChannelDesc::host_lost = kHostLostRefused).
//
// A connection whose first channel belongs to the connecting process itself
// (process mode: the CUDA program is the ivshmem peer) skips all of this and
// is served by a worker in the supervisor's own process, as before.
#pragma once

#include <signal.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "host-daemon/shared/from_worker.h"
#include "host-daemon/shared/to_worker.h"
#include "host-daemon/daemon/worker_budget.h"
#include "ivcuda/result.h"
#include "ivcuda/shm_abi.h"
#include "ring/layout.h"

namespace ivcuda::host {

// A guest process of a VM, as the guest names it: its pid and its PID
// namespace (ABI minor 4; 0: not said). Two containers in one VM may each
// have a process 1: the namespace tells them apart.
struct GuestProcess {
  std::int32_t pid = 0;     // 0: none (a spare worker)
  std::uint32_t pidns = 0;
  bool operator==(const GuestProcess&) const = default;
};

// What the supervisor needs beyond one worker's configuration.
struct SupervisorConfig {
  WorkerConfig worker;        // the connection's fds, layout, driver; as for one worker
  pid_t peer_pid = -1;        // the connecting process (SO_PEERCRED); -1: never process mode
  std::uint32_t spares = 1;   // workers kept started ahead of the next guest process
  // --max-workers-per-guest: a VM's workers at once, spares included.
  std::uint32_t max_workers = 8;
  // The per-uid budget (worker_budget.h), inherited from the daemon; null:
  // none. A VM's workers beyond its first that serve guest processes take
  // units from it, at most `uid_limit` per uid (--max-guests-per-uid; 0: no limit).
  WorkerBudget* budget = nullptr;
  unsigned uid_limit = 0;
  // Called in each worker process: right after fork, before the driver is
  // loaded (still one thread), and after Worker::create succeeded, before it
  // serves. The sandbox's two steps go here (host-daemon/sandbox/sandbox.h). An error
  // ends the worker.
  std::function<Result<void>(const WorkerConfig&)> before_start;
  std::function<Result<void>(GuestWorker&)> after_start;
  // Where a worker running in this process is published, for the SIGTERM
  // handler (it calls stop()).
  GuestWorker** running = nullptr;
  // A warm entry's worker serving a process-mode guest may serve the
  // tenant's next guest once this one ended with nothing under way
  // (--recycle-workers; docs/design.md, "Recycled workers").
  bool recycle = false;
  // With recycle: the worker keeps its contexts for that guest where it can
  // scrub them (--recycle-workers keep; WorkerConfig::keep_contexts).
  bool keep_contexts = false;
  // A warm entry's line to the daemon (-1: none): a worker that becomes
  // ready only after its guest came is named on it then ('R' and its pid),
  // as one ready before is named by the entry (run_warm_supervisor).
  int daemon_line = -1;
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
// whole entry go.
//
// With `cfg.recycle`, a process-mode guest's worker that ends cleanly
// (GuestWorker::kRecycled) comes back: this process writes 'C' and the worker's
// pid to handoff_fd, reads the next guest's memory and doorbells from it
// (1 + 2N ivshmem messages, the value counting from 0: the memory, the
// host's N eventfds, the guest's N), passes them to the worker, and is a
// warm entry again ('R' once the worker is ready). Returns the exit status
// for the process.
int run_warm_supervisor(SupervisorConfig cfg, int handoff_fd, volatile sig_atomic_t* stop_flag);

}  // namespace ivcuda::host
