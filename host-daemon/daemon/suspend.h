// Suspending a guest (ivcudactl suspend, resume and drain; docs/design.md,
// "Suspend and resume"): its worker stops making driver calls, and the
// driver's process checkpointing (cuCheckpointProcessLock, Checkpoint,
// Restore, Unlock) moves the worker's device memory and contexts into its
// host memory and gives the GPU back; on resume they come back at the same
// device addresses and the worker serves on.
//
// Who calls the driver's checkpoint functions: the checkpointer, a process
// of the daemon's own, forked from it when a suspension starts and ended
// when none is left. The daemon never loads the driver; workers cannot do it
// for themselves (driver 580 ends a process that checkpoints itself, measured
// on the H200), and a worker is hostile ground. The checkpointer holds no
// context, serves no guest, reads nothing but the daemon's fixed-size
// requests, and acts only on worker pids the daemon itself forked or was
// told of by its own processes; it runs with no_new_privs, no capabilities
// and, under --user, as the workers' user (sandbox::for_checkpointer).
//
// Its line: a SOCK_SEQPACKET pair; a CheckpointRequest, and a
// CheckpointReply back, one at a time (host-daemon/shared/from_worker.h).
// Its driver side is host-daemon/worker/checkpointer.cc (run_checkpointer):
// the daemon's side never includes cuda.h nor loads a library.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "host-daemon/sandbox/sandbox.h"
#include "host-daemon/shared/from_worker.h"
#include "ring/sys.h"

namespace ivcuda::host {

class Checkpointer {
 public:
  // Forks the process. `in_child` runs first in the child (the daemon's
  // forget_in_child). nullopt (logged) when it cannot start.
  template <class F>
  static std::optional<Checkpointer> start(const std::string& driver, const sandbox::Config& sc, F&& in_child);
  Checkpointer(Checkpointer&&) noexcept = default;
  Checkpointer& operator=(Checkpointer&&) noexcept = default;
  ~Checkpointer();

  pid_t pid() const noexcept { return pid_; }
  // It ended and was reaped: nothing is to be signalled or reaped any more.
  void reaped() noexcept { pid_ = -1; }
  int fd() const noexcept { return line_.get(); }
  bool send(const CheckpointRequest& r);
  // The reply waiting on fd(); nullopt when the process ended or said
  // something of the wrong size.
  std::optional<CheckpointReply> receive();

 private:
  Checkpointer(pid_t pid, sys::UniqueFd line) : pid_(pid), line_(std::move(line)) {}
  static std::optional<Checkpointer> fork_with(const std::string& driver, const sandbox::Config& sc,
                                               void (*in_child)(void*), void* arg);
  pid_t pid_ = -1;
  sys::UniqueFd line_;
};

// Whether `pid` is a live (not yet ended) child of `parent` now, as
// /proc says: a VM's worker is acted on only while the kernel still says it
// is its supervisor's, never on a pid that ended and went to somebody else.
bool live_child_of(pid_t pid, pid_t parent);

template <class F>
std::optional<Checkpointer> Checkpointer::start(const std::string& driver, const sandbox::Config& sc,
                                                F&& in_child) {
  return fork_with(driver, sc, [](void* f) { (*static_cast<F*>(f))(); }, &in_child);
}

}  // namespace ivcuda::host
