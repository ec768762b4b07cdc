// Who the GPU test double's devices are: names, memory, PCI addresses, UUIDs,
// what a context costs, and the layout of the ledger in which the double's
// processes publish the device memory and contexts each holds
// (IVCUDA_DOUBLE_LEDGER). Shared with the NVML test
// double (tests/nvml_double), so that both doubles describe the same GPUs and
// NVML's per-process figures are what the GPU double's processes hold.
// Test doubles only: nothing here is shipped.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

namespace ivcuda::gpu_double {

inline constexpr char kDeviceName[] = "ivcuda GPU test double";
inline constexpr int kDriverVersion = 13000;
inline constexpr std::size_t kTotalMem = std::size_t{4} << 30;
inline constexpr std::size_t kFuzzTotalMem = std::size_t{64} << 20;
inline constexpr int kMaxDevices = 16;
// What a context holds of its device's memory unless
// IVCUDA_GPU_DOUBLE_CONTEXT_MIB says otherwise: on the H200 one takes
// 440-500 MiB of 141 GiB (docs/operating.md), about 0.3 %; this is as much of
// the double's 4 GiB, rounded up.
inline constexpr std::size_t kDefaultContextMem = std::size_t{16} << 20;

// PCI location of a device; the integrity check of cudart hashes these, so they must stay
// consistent with the device attributes (api_device.cc).
inline constexpr int kPciDomain = 0;
inline constexpr int pci_bus(int dev) { return 0x41 + dev; }
inline constexpr int kPciDevice = 0;

// Fixed per ordinal so that runs (and the integrity hash) are reproducible.
inline void device_uuid(int dev, unsigned char (&out)[16]) {
  constexpr unsigned char kBase[16] = {'i', 'v', 'c', 'u', 'd', 'a', 0x40, 'd', 0x80, 'o', 'u', 'b', 'l', 'e', 0, 0};
  for (int i = 0; i < 16; ++i) out[i] = kBase[i];
  out[15] = static_cast<unsigned char>(dev);
}

// IVCUDA_GPU_DOUBLE_DEVICES (default 1); -1 when it is not a count from 0 to kMaxDevices.
inline int device_count_env() {
  const char* env = std::getenv("IVCUDA_GPU_DOUBLE_DEVICES");
  if (env == nullptr || *env == '\0') return 1;
  char* end = nullptr;
  const long n = std::strtol(env, &end, 10);
  if (*end != '\0' || n < 0 || n > kMaxDevices) return -1;
  return static_cast<int>(n);
}

// The ledger file: one entry per process. An entry belongs to the process
// holding a write lock (F_OFD_SETLK) on the byte at its index (an
// open-file-description lock: the kernel drops it when the process ends,
// however it ends), so liveness needs no signals or /proc (which a sandboxed
// worker may not use). `used` is the device memory the process holds, per
// device, its contexts' included; `contexts` how many contexts it holds
// there (created ones and active primary ones): NVML lists every process
// with a context on a device, as the driver's NVML does, even one that
// allocated nothing.
//
// The driver's process checkpointing (api_checkpoint.cc) lives here too:
// `checkpoint` is the process's CUprocessState, which another process moves
// on; `lock_asked` and `in_api` let a lock wait for the calls under way
// (each of the process's calls counts itself in `in_api` and waits while a
// lock is asked or held); `moved_out` and `contexts_out` are what a
// checkpoint took off the device (the memory counted as the process's host
// memory: gone from `used`, from others' view and NVML's list) until restored.
// `part_*`: the process's own share of a checkpoint and a restore, which its
// checkpoint thread does when another process asks (the system calls the
// driver makes inside the process, which its sandbox must allow).
struct Ledger {
  struct Entry {
    std::int32_t pid;
    std::atomic<std::uint32_t> checkpoint;
    std::atomic<std::uint64_t> used[kMaxDevices];
    std::atomic<std::uint32_t> contexts[kMaxDevices];
    std::atomic<std::uint32_t> lock_asked;
    std::atomic<std::uint32_t> in_api;
    std::atomic<std::uint64_t> moved_out[kMaxDevices];
    std::atomic<std::uint32_t> contexts_out[kMaxDevices];
    // The driver's own part of a checkpoint and a restore, done inside the
    // process by a thread of its (api_checkpoint.cc): what was asked last
    // (a sequence number << 2 | the part), the last done, and the errno
    // that stopped it (0: done).
    std::atomic<std::uint32_t> part_asked;
    std::atomic<std::uint32_t> part_done;
    std::atomic<std::int32_t> part_errno;
    // The read end of a pipe the process made when it joined the ledger, as
    // the driver makes its own at cuInit: another process's checkpoint calls
    // reopen it through /proc/PID/fd/N, as driver 580's do (-1: none).
    std::atomic<std::int32_t> pipe_fd;
  };
  static constexpr int kEntries = 512;
  Entry e[kEntries];
};

}  // namespace ivcuda::gpu_double
