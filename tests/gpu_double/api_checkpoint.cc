// The driver's process checkpointing, as the double models it: another
// process of the same "GPU" (the ledger, identity.h) locks a process - its
// calls under way finish, later ones fail with CUDA_ERROR_OPERATING_SYSTEM
// until it is unlocked, as driver 580's do (ApiGate, state.h) - checkpoints
// it - its device memory and contexts leave the device: others' free memory
// grows, NVML's list drops it - restores it, which needs that memory free
// again, and unlocks it. A process under a seccomp filter cannot be
// checkpointed, as driver 580's sandboxed workers could not. The process's pointers and handles never change
// (its memory here is host memory all along). The states and their order are
// the driver's (cuda.h's CUprocessState); without a ledger there is no other
// process to act on.
#include <chrono>
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

// Whether process `pid` runs under a seccomp filter (its /proc status says
// "Seccomp: 2"; a process another user's or gone reads as not).
bool under_seccomp_filter(int pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/status").c_str(), "r");
  if (f == nullptr) return false;
  char line[256];
  bool filtered = false;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::strncmp(line, "Seccomp:", 8) == 0) filtered = std::atoi(line + 8) == 2;
  std::fclose(f);
  return filtered;
}

// Moves entry `e` from state `from` to `to`; ILLEGAL_STATE if it is not in `from`.
CUresult step(Ledger::Entry* e, CUprocessState from, CUprocessState to) {
  std::uint32_t want = from;
  return e->checkpoint.compare_exchange_strong(want, to) ? CUDA_SUCCESS : CUDA_ERROR_ILLEGAL_STATE;
}

}  // namespace

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
    // Driver 580 failed at once to checkpoint a worker under its seccomp
    // filter, with or without Landlock (H200, 2026-12-06), and left it
    // locked: something the driver does in the target is refused there.
    if (under_seccomp_filter(pid)) return CUDA_ERROR_OPERATING_SYSTEM;
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
    // The memory must be free again: what every other live process holds
    // (this caller's included) and this one's must fit.
    for (int d = 0; d < kMaxDevices; ++d) {
      const std::size_t want = e->moved_out[d].load();
      if (want == 0) continue;
      const std::size_t mine = static_cast<std::size_t>(d) < s.used.size() ? s.used[static_cast<std::size_t>(d)] : 0;
      const std::size_t others = ledger_others(d) + mine;
      if (others + want > total_mem()) return CUDA_ERROR_OUT_OF_MEMORY;  // still checkpointed
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
    return step(e, CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_RUNNING);
  });
}
