// The driver's process checkpointing, as the double models it: another
// process of the same "GPU" (the ledger, identity.h) locks a process - its
// calls under way finish, later ones fail with CUDA_ERROR_OPERATING_SYSTEM
// until it is unlocked, as driver 580's do (ApiGate, state.h) - checkpoints
// it - its device memory and contexts leave the device: others' free memory
// grows, NVML's list drops it - restores it, which needs that memory free
// again, and unlocks it. The driver does part of a checkpoint and of a
// restore inside the process itself, from a thread of its own, and so does
// the double (its checkpoint thread): the system calls driver 580 makes
// there, which a sandbox must allow, or the checkpoint (or restore) fails
// with CUDA_ERROR_OPERATING_SYSTEM; and the caller's reach into the process
// through /proc, which the kernel must allow (reach). The process's pointers and handles never change
// (its memory here is host memory all along). The states and their order are
// the driver's (cuda.h's CUprocessState); without a ledger there is no other
// process to act on.
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "state.h"

using namespace ivcuda::gpu_double;

namespace {

// An entry's state, or the error for a process the double does not know.
CUresult entry_for(int pid, Ledger::Entry** out) {
  *out = ledger_entry_of(pid);
  return *out != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

long futex(std::atomic<std::uint32_t>* word, int op, std::uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE: the word is in the ledger, shared between processes.
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), op, value, timeout, nullptr, 0);
}

constexpr std::uint32_t kPartCheckpoint = 1, kPartRestore = 2;

// The driver's part inside the process, as driver 580 does it (traced on the
// GPU machine, 2026-12-07, tests/gpu/trace_checkpoint_syscalls.sh): a
// checkpoint parks the process's device descriptors on a placeholder with
// dup2; a restore looks its device files up with stat, makes sure
// /dev/nvidia-caps exists (mkdir: EEXIST) and tries its /dev/char links
// (symlink: ENOENT where there is no /dev/char). Returns the errno that
// stopped it, 0 when done.
int driver_part(std::uint32_t part, int placeholder, int parked) {
  if (part == kPartCheckpoint) {
    if (::syscall(SYS_dup2, placeholder, parked) < 0) return errno;
    (void)::fcntl(parked, F_SETFD, FD_CLOEXEC);  // dup2 clears it
    return 0;
  }
  struct stat st {};
  if (::syscall(SYS_stat, "/dev/null", &st) < 0) return errno;
  if (::syscall(SYS_mkdir, "/dev", 0755) < 0 && errno != EEXIST) return errno;
  if (::syscall(SYS_symlink, "../null", "/dev/.ivcuda-double-none/null") < 0 && errno != ENOENT) return errno;
  return 0;
}

// Asks the process of entry `e` to do its part (its checkpoint thread);
// its errno, ETIMEDOUT when it did not answer within 2 s.
int process_part(Ledger::Entry* e, std::uint32_t part) {
  const std::uint32_t ask = (((e->part_asked.load() >> 2) + 1) << 2) | part;
  e->part_asked.store(ask);
  futex(&e->part_asked, FUTEX_WAKE, INT_MAX, nullptr);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (;;) {
    const std::uint32_t done = e->part_done.load();
    if (done == ask) return e->part_errno.load();
    if (std::chrono::steady_clock::now() > until) return ETIMEDOUT;
    const timespec step{0, 50'000'000};
    futex(&e->part_done, FUTEX_WAIT, done, &step);
  }
}

// The caller's reach into the process: driver 580's caller lists
// /proc/PID/task and reopens the process's pipes as /proc/PID/fd/N at each
// step (traced, as above). The kernel lets it only into a process it may
// trace (the same user and the target dumpable, or CAP_SYS_PTRACE), and
// then only a pipe its user may open (a pipe is its maker's, mode 0600).
// Refused, the step fails with CUDA_ERROR_OPERATING_SYSTEM, as driver 580's
// lock did where the checkpointer ran as a worker's --user: the worker, which
// changed its user, was not dumpable, and its driver's pipes, made before
// the change, were root's (traced on an H100: EACCES).
CUresult reach(int pid, const Ledger::Entry* e, const char* what) {
  const int pipe_fd = e->pipe_fd.load();
  const std::string path =
      "/proc/" + std::to_string(pid) + "/fd" + (pipe_fd >= 0 ? "/" + std::to_string(pipe_fd) : std::string());
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd >= 0) {
    ::close(fd);
    return CUDA_SUCCESS;
  }
  if (errno != EACCES && errno != EPERM) return CUDA_SUCCESS;  // gone: the ledger answers for it
  log("%s of process %d: its %s: %s", what, pid, path.c_str(), std::strerror(errno));
  return CUDA_ERROR_OPERATING_SYSTEM;
}

// Moves entry `e` from state `from` to `to`; ILLEGAL_STATE if it is not in `from`.
CUresult step(Ledger::Entry* e, CUprocessState from, CUprocessState to) {
  std::uint32_t want = from;
  return e->checkpoint.compare_exchange_strong(want, to) ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_STATE;
}

}  // namespace

void ivcuda::gpu_double::start_checkpoint_thread(Ledger::Entry* e) {
  // Its placeholder and the descriptor it parks there, opened while the process may still open anything.
  const int placeholder = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int parked = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int pipe_ends[2];
  if (::pipe2(pipe_ends, O_CLOEXEC) == 0) e->pipe_fd.store(pipe_ends[0]);  // both ends kept, as the driver's
  std::thread([e, placeholder, parked] {
    for (;;) {
      const std::uint32_t asked = e->part_asked.load();
      if (asked == e->part_done.load()) {
        const timespec a_while{1, 0};
        futex(&e->part_asked, FUTEX_WAIT, asked, &a_while);
        continue;
      }
      e->part_errno.store(placeholder < 0 || parked < 0 ? EBADF : driver_part(asked & 3, placeholder, parked));
      e->part_done.store(asked);
      futex(&e->part_done, FUTEX_WAKE, INT_MAX, nullptr);
    }
  }).detach();
}

CUresult CUDAAPI cuCheckpointProcessGetState(int pid, CUprocessState* state) {
  return guarded([&](State&) -> CUresult {
    if (state == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Ledger::Entry* e = nullptr;
    if (const CUresult r = entry_for(pid, &e); r != CUDA_SUCCESS) return r;
    *state = static_cast<CUprocessState>(e->checkpoint.load());
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCheckpointProcessGetRestoreThreadId(int pid, int* tid) {
  return guarded([&](State&) -> CUresult {
    if (tid == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Ledger::Entry* e = nullptr;
    if (const CUresult r = entry_for(pid, &e); r != CUDA_SUCCESS) return r;
    *tid = pid;  // the double has no thread of its own for it
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuCheckpointProcessLock(int pid, CUcheckpointLockArgs* args) {
  Ledger::Entry* e = nullptr;
  const CUresult r = guarded([&](State&) -> CUresult {
    if (args != nullptr && (args->reserved0 != 0 || args->reserved1[0] != 0)) return CUDA_ERROR_INVALID_VALUE;
    if (const CUresult f = entry_for(pid, &e); f != CUDA_SUCCESS) return f;
    if (e->checkpoint.load() != CU_PROCESS_STATE_RUNNING) return CUDA_ERROR_ILLEGAL_STATE;
    if (const CUresult f = reach(pid, e, "lock"); f != CUDA_SUCCESS) return f;
    std::uint32_t none = 0;
    return e->lock_asked.compare_exchange_strong(none, 1) ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_STATE;
  });
  if (r != CUDA_SUCCESS) return r;
  // The calls under way finish (outside the state lock: this process's own
  // calls go on meanwhile); no timeout waits as long as they take.
  const unsigned timeout_ms = args != nullptr ? args->timeoutMs : 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (e->in_api.load() != 0) {
    if (timeout_ms != 0 && std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(timeout_ms)) {
      e->lock_asked.store(0);  // left running, as the driver leaves it
      return CUDA_ERROR_NOT_READY;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const CUresult s = step(e, CU_PROCESS_STATE_RUNNING, CU_PROCESS_STATE_LOCKED);
  e->lock_asked.store(0);  // the state holds the process's calls from here
  return s;
}

CUresult CUDAAPI cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs* args) {
  std::this_thread::sleep_for(checkpoint_delay());
  return guarded([&](State&) -> CUresult {
    if (args != nullptr && args->reserved[0] != 0) return CUDA_ERROR_INVALID_VALUE;
    Ledger::Entry* e = nullptr;
    if (const CUresult r = entry_for(pid, &e); r != CUDA_SUCCESS) return r;
    if (e->checkpoint.load() != CU_PROCESS_STATE_LOCKED) return CUDA_ERROR_ILLEGAL_STATE;
    if (const CUresult f = reach(pid, e, "checkpoint"); f != CUDA_SUCCESS) return f;
    // The process's own part: refused by its sandbox, the checkpoint fails at
    // once and leaves it locked, as driver 580 did to a worker whose filter
    // lacked dup2.
    if (const int err = process_part(e, kPartCheckpoint); err != 0) {
      log("checkpoint of process %d: its part failed: %s", pid, std::strerror(err));
      return CUDA_ERROR_OPERATING_SYSTEM;
    }
    // Its memory and contexts leave the device (into its host memory).
    for (int d = 0; d < kMaxDevices; ++d) {
      e->moved_out[d].store(e->used[d].exchange(0));
      e->contexts_out[d].store(e->contexts[d].exchange(0));
    }
    return step(e, CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_CHECKPOINTED);
  });
}

CUresult CUDAAPI cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs* args) {
  return guarded([&](State& s) -> CUresult {
    if (args != nullptr && args->reserved1 != 0) return CUDA_ERROR_INVALID_VALUE;
    // Onto the same GPUs only: remapping is for a host with two (issue 35).
    if (args != nullptr && args->gpuPairsCount != 0) {
      if (args->gpuPairs == nullptr) return CUDA_ERROR_INVALID_VALUE;
      for (unsigned i = 0; i < args->gpuPairsCount; ++i)
        if (std::memcmp(&args->gpuPairs[i].oldUuid, &args->gpuPairs[i].newUuid, sizeof(CUuuid)) != 0)
          return CUDA_ERROR_NOT_SUPPORTED;
    }
    Ledger::Entry* e = nullptr;
    if (const CUresult r = entry_for(pid, &e); r != CUDA_SUCCESS) return r;
    if (e->checkpoint.load() != CU_PROCESS_STATE_CHECKPOINTED) return CUDA_ERROR_ILLEGAL_STATE;
    if (const CUresult f = reach(pid, e, "restore"); f != CUDA_SUCCESS) return f;
    // The memory must be free again: what every other live process holds
    // (this caller's included) and this one's must fit.
    for (int d = 0; d < kMaxDevices; ++d) {
      const std::size_t want = e->moved_out[d].load();
      if (want == 0) continue;
      const std::size_t mine = static_cast<std::size_t>(d) < s.used.size() ? s.used[static_cast<std::size_t>(d)] : 0;
      const std::size_t others = ledger_others(d) + mine;
      if (others + want > total_mem()) return CUDA_ERROR_OUT_OF_MEMORY;  // still checkpointed
    }
    if (const int err = process_part(e, kPartRestore); err != 0) {
      log("restore of process %d: its part failed: %s", pid, std::strerror(err));
      return CUDA_ERROR_OPERATING_SYSTEM;  // still checkpointed
    }
    for (int d = 0; d < kMaxDevices; ++d) {
      e->used[d].store(e->moved_out[d].exchange(0));
      e->contexts[d].store(e->contexts_out[d].exchange(0));
    }
    return step(e, CU_PROCESS_STATE_CHECKPOINTED, CU_PROCESS_STATE_LOCKED);
  });
}

CUresult CUDAAPI cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs* args) {
  std::this_thread::sleep_for(checkpoint_delay());
  return guarded([&](State&) -> CUresult {
    if (args != nullptr && args->reserved[0] != 0) return CUDA_ERROR_INVALID_VALUE;
    Ledger::Entry* e = nullptr;
    if (const CUresult r = entry_for(pid, &e); r != CUDA_SUCCESS) return r;
    if (e->checkpoint.load() == CU_PROCESS_STATE_LOCKED)
      if (const CUresult f = reach(pid, e, "unlock"); f != CUDA_SUCCESS) return f;
    return step(e, CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_RUNNING);
  });
}
