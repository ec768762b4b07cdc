// Compute shares through NVIDIA MPS (--mps). ivcuda does not schedule GPU
// time itself: without MPS the driver time-slices the workers' contexts (each
// guest's kernels run alone on the whole GPU in turn); with MPS the workers
// are clients of one MPS server per user, their kernels run side by side, and
// each client may use at most its active-thread percentage of the SMs
// (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and its pinned amount of device memory
// (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT). docs/operating.md says what that costs
// in fault isolation.
//
// The daemon starts an MPS control daemon with its own pipe and log
// directories (or joins one that answers there), before any worker exists,
// and stops it at exit if it started it. Each worker sets the client's
// environment before its driver loads.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ivcuda/result.h"

namespace ivcuda::host {

struct MpsConfig {
  std::string pipe_dir = "/run/ivcuda/mps";      // CUDA_MPS_PIPE_DIRECTORY
  std::string log_dir = "/run/ivcuda/mps-log";   // CUDA_MPS_LOG_DIRECTORY
  std::string control = "nvidia-cuda-mps-control";
};

class MpsControl {
 public:
  // Joins the control daemon answering in cfg.pipe_dir, or starts one.
  static Result<MpsControl> start_or_join(const MpsConfig& cfg);
  MpsControl() = default;
  MpsControl(MpsControl&& o) noexcept;
  MpsControl& operator=(MpsControl&& o) noexcept;
  ~MpsControl();

  const MpsConfig& config() const noexcept { return cfg_; }
  bool started_here() const noexcept { return started_; }
  // Sends one command to the control daemon (e.g. "get_server_list");
  // returns its answer.
  Result<std::string> command(const std::string& cmd) const;
  // Stops the control daemon if this object started it.
  void stop() noexcept;

 private:
  MpsConfig cfg_;
  bool started_ = false;
};

// The environment (NAME=VALUE) a worker sets before its driver loads, to be
// an MPS client with `percent` of the SMs and, where limit_bytes is not 0,
// that much device memory pinned per GPU (host ordinals `devices`, empty:
// `device_count` GPUs).
// How many NVIDIA GPUs the host has (/proc/driver/nvidia/gpus), without
// loading the driver; 0 when that cannot be read.
int count_gpus();

std::vector<std::string> mps_client_env(const MpsConfig& cfg, unsigned percent, std::uint64_t limit_bytes,
                                        const std::vector<int>& devices, int device_count);

}  // namespace ivcuda::host
