// What the daemon reports about the guests it serves: one snapshot, shown
// two ways - JSON for `ivcudactl status` (control.h) and Prometheus text for
// the metrics endpoint (metrics.h). The daemon fills a snapshot from its own
// records (who the guest is) and each guest's status board (shared/from_worker.h: what
// its workers count).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ivcuda::host {

struct GuestStatus {
  std::int64_t id = 0;          // the daemon-wide guest number (logs say "guest N")
  std::string socket;           // the socket it connected on, or the ivshmem-plain file
  std::string mode;             // from_worker.h's mode_name
  std::string state;            // "serving", "evicting", "evicted", "suspending", "suspended", "resuming"
  pid_t pid = 0;                // the connection's process (supervisor or process-mode worker)
  pid_t peer_pid = 0;           // the connecting process (QEMU, or the CUDA program); 0: unknown
  uid_t uid = 0;                // its user
  std::vector<int> gpus;        // host GPUs granted; empty: all
  unsigned compute = 0;         // % of the SMs under MPS (--mps); 0: no MPS, time-sliced
  std::uint32_t processes = 0;  // guest processes served now
  std::uint64_t mem_used = 0;   // bytes charged to the quota
  std::uint64_t mem_limit = 0;  // bytes; 0: no quota
  // Where that memory is: on the GPU, or (suspended) in its worker's host memory.
  std::uint64_t mem_device = 0;
  std::uint64_t mem_host = 0;
  std::string suspend_note;     // the last suspend's or resume's outcome ("" when none)
  double suspend_lock_ms = 0, suspend_out_ms = 0, suspend_back_ms = 0;  // its lock, checkpoint and restore
  std::uint64_t calls = 0;      // since it connected
  std::uint64_t copy_bytes = 0;
  std::uint64_t errors = 0;
  double calls_per_s = 0;       // over the daemon's last sampling window (about a second)
  double copy_bytes_per_s = 0;
  double uptime_s = 0;
  std::string last_error;       // "op: CUDA_ERROR_...", "" when none
  std::uint64_t last_error_time_ns = 0;  // CLOCK_REALTIME
};

struct DaemonStatus {
  std::string version;
  pid_t pid = 0;
  double uptime_s = 0;
  std::uint64_t guests_refused = 0;  // connections refused (limits)
  std::uint32_t warm_ready = 0;      // warm workers ready for the next guest (all sockets)
  std::uint32_t warm_starting = 0;   // warm workers still starting
  std::vector<int> drained;          // GPUs taken out of service (ivcudactl drain)
  std::vector<GuestStatus> guests;
};

nlohmann::json to_json(const DaemonStatus& s);
// Parses what to_json made (ivcudactl); throws nlohmann::json::exception on
// a reply of another shape.
DaemonStatus status_from_json(const nlohmann::json& j);

// The Prometheus text exposition of s, with names in the style of NVIDIA's
// DCGM exporter (IVCUDA_FI_...; memory in MiB as DCGM's FB_USED).
std::string prometheus_text(const DaemonStatus& s);

// "1.5 GiB", "512 MiB"
std::string human_bytes(std::uint64_t bytes);

}  // namespace ivcuda::host
