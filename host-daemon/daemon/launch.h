// How ivcudad starts a guest's process: the configuration a worker is
// given (host-daemon/shared/to_worker.h), the sandbox's two steps around its
// start, the memory formatted for it, and the processes that serve one
// connection (a VM's supervisor or a process-mode guest's worker), one
// ivshmem-plain file, or one guest of somebody else's ivshmem-server (--join).
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "host-daemon/daemon/options.h"
#include "host-daemon/daemon/vm_supervisor.h"
#include "ivcuda/result.h"
#include "ring/ivshmem.h"
#include "ring/layout.h"

namespace ivcuda::host {

class FdBroker;
class WorkerBudget;
struct GuestStats;

// Each of ivcudad's processes has its own copy (a forked child inherits it).
extern volatile sig_atomic_t g_stop;    // SIGINT, SIGTERM: stop serving
extern volatile sig_atomic_t g_reload;  // SIGHUP: read the configuration again
extern GuestWorker* g_worker;           // a worker serving in this process: SIGTERM stops it
// SIGINT and SIGTERM stop, SIGHUP (with `reload`) reloads, SIGPIPE is ignored.
void install_signal_handlers(bool reload);

// What a guest connection's process is given: everything a worker needs,
// and what its supervisor needs beyond that. conn_fd and peer_pid are -1
// for a warm entry (they come with the guest).
struct GuestSetup {
  const std::vector<int>* gpus = nullptr;
  std::uint64_t mem_limit = 0;
  const ring::Layout* layout = nullptr;
  std::uint64_t generation = 0;
  std::int64_t id = 0;
  int shm_fd = -1;
  const ivshmem::GuestConnection* fds = nullptr;  // doorbells (and conn when there)
  int broker_fd = -1;
  pid_t peer_pid = -1;
  GuestStats* stats = nullptr;
  std::vector<std::string> driver_env;
  // The per-uid books of workers (worker_budget.h), made before the daemon
  // forks anything; null: none.
  WorkerBudget* budget = nullptr;
};

// The sandbox's two steps around each worker's start (host-daemon/sandbox/sandbox.h),
// as sc's before_start and after_start: the first in the freshly forked
// worker before the driver loads, the second once its driver, contexts and
// arena are ready.
void add_sandbox_steps(const Options& o, SupervisorConfig& sc);

// What every worker of a guest is started with, from the options: the
// guest's memory, layout, GPUs, quota, limits and driver. The doorbells, the
// connection, the board and the broker line are the caller's to add.
WorkerConfig worker_config(const Options& o, const GuestSetup& g);
// The same, with the doorbells and connection of g.fds, for a connection's
// process (vm_supervisor.h), the sandbox's steps around each worker's start.
SupervisorConfig supervisor_config(const Options& o, const GuestSetup& g);

// A connection's process: a VM's supervisor with a worker per guest
// process, or, when the peer is the CUDA program itself, its one worker.
// Returns its exit status.
int run_connection(const Options& o, const GuestSetup& g);
// A warm entry's process: the same, started before its guest connects; the
// daemon hands it the guest on handoff_fd (vm_supervisor.h).
int run_warm_entry(const Options& o, const GuestSetup& g, int handoff_fd);

// Creates and formats an ivshmem-plain memory file and forks the process
// that serves it (a VM's supervisor that polls). `forget_in_child` runs in
// that process first. Returns its pid, or -1 (logged).
pid_t spawn_plain_guest(const Options& o, GuestSetup g, const std::string& path, FdBroker& broker,
                        const std::function<void()>& forget_in_child);

// --join: ivcudad is one peer of somebody else's ivshmem-server and serves
// its guests one at a time. Returns the daemon's exit status.
int run_join(const Options& o, const std::vector<int>& gpus, std::uint64_t generation,
             const std::vector<std::string>& driver_env);

// The environment a worker's driver loads in: with --mps, that of a client of
// the one MPS control daemon, with its guest's share of the SMs and its quota
// plus --mps-mem-headroom as its memory; else none.
std::vector<std::string> driver_env(const Options& o, unsigned compute, std::uint64_t mem_limit,
                                    const std::vector<int>& grant, int gpu_count);

// A random generation for the memory ivcudad formats (never zero).
std::uint64_t new_generation();

// Clears and formats memory that others hold too (an ivshmem-plain file,
// an ivshmem-server's memory), in a short-lived child: such memory can
// shrink under a mapping, and a fault must cost that child, never the daemon.
Result<void> format_shared(int fd, const ring::Layout& layout, std::uint64_t generation, std::uint32_t host_peer,
                           std::uint32_t vectors, std::uint64_t features);

}  // namespace ivcuda::host
