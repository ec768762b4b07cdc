// What crosses from the daemon's side to a worker: what a worker is started
// with, and what the process that starts it (a connection's supervisor,
// host-daemon/daemon/vm_supervisor.h) may then do with it. This is the one
// header of the worker's that trusted code includes: the daemon's side never
// sees the worker's tables, its handlers or the guest's request formats
// (ivcuda/proto.h), and it never loads the driver itself - start_worker()
// does that in the freshly forked worker process, after the sandbox's first
// step (host-daemon/sandbox/sandbox.h). The other direction, what a worker
// writes that trusted code reads, is host-daemon/shared/from_worker.h.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ivcuda/result.h"
#include "ring/layout.h"

namespace ivcuda::host {

// The checkpointer (host-daemon/daemon/suspend.h), in the process ivcudad
// forked for it, once sandbox::for_checkpointer applied: loads `driver`,
// cuInit, then serves the daemon's requests on `line_fd` until it closes
// (host-daemon/worker/checkpointer.cc).
[[noreturn]] void run_checkpointer(int line_fd, const std::string& driver);

class VmShared;
struct GuestStats;

// How many objects of each kind one worker (a guest process) may hold at once,
// so that no guest exhausts its worker's memory or the driver's (--object-limits).
// Generous: far above what frameworks make (PyTorch's caching allocator keeps
// thousands of events).
struct ObjectLimits {
  std::uint32_t contexts = 256;
  std::uint32_t streams = 16384;
  std::uint32_t events = 262144;
  std::uint32_t modules = 16384;
  std::uint32_t graphs = 65536;
  std::uint32_t graph_nodes = 1u << 20;
  std::uint32_t graph_execs = 65536;
  std::uint32_t arrays = 65536;
  std::uint32_t pools = 1024;
  std::uint32_t mem_handles = 262144;
  std::uint32_t user_objects = 65536;
  std::uint32_t links = 256;                // JIT linkers (cuLinkCreate)
  std::uint32_t green_contexts = 64;        // cuGreenCtxCreate (each also counts as a context)
  std::uint32_t resource_descs = 1024;      // cuDevResourceGenerateDesc (the driver frees none before exit)
  std::uint32_t resources = 4096;           // distinct CUdevResource images handed out (green.cc)
};

// What a CUDA context costs on the device before the guest allocates anything
// (--context-reserve): measured on the H200 (driver 580, 2026-12-02,
// tests/programs/drv_context_cost.cc through tests/gpu/run_all.sh cost): 523.6
// MiB for a context made, 663.6 MiB once a module is loaded and a kernel has
// run in it (the driver grows its local memory and code space then).
inline constexpr std::uint64_t kDefaultContextReserve = 664ull << 20;

struct WorkerConfig {
  std::uint32_t guest_id = 0;
  int shm_fd = -1;                 // borrowed; the worker maps it
  ring::Layout layout;             // the layout the daemon formatted (private copy)
  std::uint64_t generation = 0;
  std::vector<int> host_fds;       // the guest rings us on these (non-blocking eventfds)
  std::vector<int> guest_fds;      // we ring the guest on these
  int conn_fd = -1;                // the guest's socket: hang-up ends the worker
  // A warm worker (ivcudad's pool, vm_supervisor.h) starts before its guest
  // connects: conn_fd comes later through attach_connection().
  bool defer_connection = false;
  std::string driver_path = "libcuda.so.1";
  // The host's NVML (--nvml; empty: none), loaded and initialised when the
  // worker starts, before its sandbox (nvml.cc).
  std::string nvml_path = "libnvidia-ml.so.1";
  // NAME=VALUE pairs set in the worker's process before the driver loads
  // (an MPS client's settings: host-daemon/daemon/mps.h).
  std::vector<std::string> driver_env;
  std::vector<int> devices;        // host ordinals this guest may use; empty = all
  std::chrono::microseconds spin{200};
  // ivshmem-plain: the guest cannot ring us, so an idle worker wakes up
  // every `poll_interval` instead of sleeping until a doorbell.
  bool poll_only = false;
  std::chrono::microseconds poll_interval{500};
  // Point fd 1 at a pipe and forward what lands there (the driver's device
  // printf output) to the guest with the replies of synchronising calls.
  bool forward_stdout = true;
  // This worker's line to the daemon (fd_broker.h): exported allocations and
  // the tenant's registry of IPC handles and pool pointers (tenant_share.h),
  // shared with the other workers of its tenant. -1: none, only this
  // worker's own exports can be imported. Owned by the worker.
  int broker_fd = -1;
  // A VM's per-process worker (vm_supervisor.h): serves only the channels
  // the supervisor gives slot `vm_slot`, takes page-locked memory from the
  // VM's shared pool, and wakes the supervisor through `vm_notify_fd` when
  // it lets a channel go. Null: the worker serves every channel (one
  // process, or one guest).
  VmShared* vm = nullptr;
  std::uint32_t vm_slot = 0;
  int vm_notify_fd = -1;
  // The guest's device-memory quota in bytes (--mem-limit; 0: none). In a VM
  // it is the VM's, shared by its processes' workers (quota.h).
  std::uint64_t mem_limit = 0;
  // Charged to that quota for every context the worker holds for the guest
  // (the one it starts with, created ones, other GPUs' primary contexts);
  // 0: contexts are not charged.
  std::uint64_t context_reserve = kDefaultContextReserve;
  // The arena is page-locked for the GPU piece by piece, as the guest comes
  // to use it (a channel's staging when the channel is first served, a
  // page-locked allocation when it is made), rather than all of it when the
  // worker starts (--pin-arena at-start): a GiB takes the driver about 0.8 s
  // to pin, which a guest whose worker is made for it would wait for.
  bool pin_arena_at_start = false;
  ObjectLimits limits;
  // The guest's status board (from_worker.h), borrowed: calls, copies, memory and
  // the last error go there, and the daemon asks through it for the guest's
  // eviction. Null: nothing is reported (tests).
  GuestStats* stats = nullptr;
  // The BAR is mapped at a random address (docs/security.md, "Addresses the
  // guest learns"). Only tests/fuzz turns it off: in one process that makes
  // millions of workers, every new address under ASan grows the page tables
  // of its shadow memory until the kernel's OOM killer ends the run.
  bool random_bar_address = true;
  // A process-mode warm worker (ivcudad's pool) that may serve another guest
  // of the same tenant once its guest is gone, if it left nothing under way
  // (docs/design.md, "Recycled workers"): run() then ends with kRecycled.
  bool recyclable = false;
  // A VM's worker (vm != null) whose process ends - it says goodbye on its
  // last channel, or the supervisor reports its exit - with nothing under
  // way: run() ends with kRecycled and the worker serves on as the VM's spare
  // (VmShared::Slot::recycle). Else the process's end ends the worker.
  bool vm_recycle = false;
  // With recyclable or vm_recycle: the GPUs' contexts stay for the tenant's next guest
  // when the guest used only what the worker can scrub from them (every
  // allocation zeroed before the driver has it back, shared and local memory
  // and the device heap zeroed by the worker's own kernels); otherwise they
  // are reset (docs/security.md, "Recycled workers"; keep.cc).
  bool keep_contexts = false;
};

// A recycled worker's next guest: its own memory and doorbells (borrowed, as
// in WorkerConfig).
struct NextGuest {
  int shm_fd = -1;
  std::vector<int> host_fds, guest_fds;
};

// A worker, as the process that started it holds it. Made by start_worker()
// in the worker's own process; every call runs there too.
class GuestWorker {
 public:
  virtual ~GuestWorker() = default;

  // run()'s status when the guest (WorkerConfig::recyclable) hung up with
  // nothing under way: successor() then lets go of everything held for it -
  // its contexts are reset (the driver frees and scrubs their memory), its
  // arena unregistered - and serves the next with tables made anew.
  static constexpr int kRecycled = 100;

  // A warm worker's guest arrived: its connection is watched from now on
  // (WorkerConfig::defer_connection). Makes no system call but io_uring's,
  // so it works inside the sandbox.
  virtual void attach_connection(int conn_fd) noexcept = 0;
  // Serves until the guest hangs up or stop() is called. Returns 0 on a
  // clean end, kRecycled (above), or another exit status for the process.
  virtual int run() = 0;
  // After kRecycled: releases everything held for the guest and resets each
  // GPU's primary context (successor() does it if it was not done). Once.
  virtual void release_for_recycle() noexcept = 0;
  // A recycled worker's next guest. The successor keeps the driver, NVML,
  // the io_uring (rebound to the new doorbell), the fd-broker line and the
  // console; it makes everything else anew, handle generations included, and
  // takes the guest's connection later through attach_connection(). Works
  // inside the sandbox. This object is spent afterwards.
  virtual Result<std::unique_ptr<GuestWorker>> successor(const NextGuest& next) = 0;
  // Async-signal-safe: the SIGTERM handler calls it.
  virtual void stop() noexcept = 0;
};

// Loads the driver, retains the first GPU's primary context, maps and
// page-locks the guest's memory as cfg says, loads NVML: everything before the
// first request (host-daemon/worker/worker.cc).
Result<std::unique_ptr<GuestWorker>> start_worker(WorkerConfig cfg);

}  // namespace ivcuda::host
