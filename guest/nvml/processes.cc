// Running processes: only the tenant's, by its own pids (the worker answers
// so). Three generations of the entry: v1 {pid, usedGpuMemory} (16 bytes),
// v2 and v3 nvmlProcessInfo_t {pid, usedGpuMemory, gpuInstanceId,
// computeInstanceId} (24 bytes).
//
// infoCount, as nvml.h has it: in, the entries `infos` has room for; out,
// the entries written, or (NVML_ERROR_INSUFFICIENT_SIZE) the entries there
// are. A NULL `infos` with *infoCount 0 asks for the count alone: SUCCESS
// when there are none, else INSUFFICIENT_SIZE with the count.
#include <algorithm>
#include <vector>

#include "guest/nvml/internal.h"

using namespace ivcuda::nvml;

namespace {

// The most entries one reply carries (the worker never sends more than asked).
constexpr unsigned kMaxEntries = 1024;

template <class Info>
void store(Info* out, const ivcuda::nvml_wire::NvmlProcess& p) noexcept {
  Info v{};
  v.pid = p.pid;
  v.usedGpuMemory = p.used_gpu_memory;
  if constexpr (requires { v.gpuInstanceId; }) {
    v.gpuInstanceId = p.gpu_instance_id;
    v.computeInstanceId = p.compute_instance_id;
  }
  *out = v;
}

template <class Info>
nvmlReturn_t processes(NvmlFn fn, nvmlDevice_t device, unsigned* count, Info* infos) noexcept {
  return guard([&]() -> nvmlReturn_t {
    unsigned i = 0;
    if (const nvmlReturn_t r = check_device(device, &i); r != NVML_SUCCESS) return r;
    if (count == nullptr || (infos == nullptr && *count != 0)) return NVML_ERROR_INVALID_ARGUMENT;
    const unsigned cap = std::min(*count, kMaxEntries);
    std::vector<ivcuda::nvml_wire::NvmlProcess> got(cap);
    ivcuda::nvml_wire::RepNvml rep{};
    const nvmlReturn_t r =
        query(fn, static_cast<int>(i), cap, 0, cap == 0 ? nullptr : got.data(),
              static_cast<std::uint32_t>(cap * sizeof(ivcuda::nvml_wire::NvmlProcess)), &rep);
    if (r == NVML_ERROR_INSUFFICIENT_SIZE) {
      *count = static_cast<unsigned>(rep.val[0]);
      return r;
    }
    if (r != NVML_SUCCESS) return r;
    // The count the worker claims, bounded by the entries that came.
    const auto n = static_cast<unsigned>(
        std::min<std::uint64_t>(rep.val[0], rep.out_len / sizeof(ivcuda::nvml_wire::NvmlProcess)));
    if (n > cap) return NVML_ERROR_UNKNOWN;
    for (unsigned k = 0; k < n; ++k) store(&infos[k], got[k]);
    *count = n;
    return NVML_SUCCESS;
  });
}

}  // namespace

extern "C" {

// The process lists in their three ABI generations (v1, v2 and the current one,
// whose entries differ in size): each is processes() of its list and layout.
#define IVCUDA_PROCESS_LIST(name, info, fn)                                            \
  nvmlReturn_t name(nvmlDevice_t device, unsigned int* infoCount, info* infos) {       \
    return processes(NvmlFn::fn, device, infoCount, infos);                           \
  }
IVCUDA_PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t, kDeviceMPSComputeRunningProcesses)
IVCUDA_PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_v2_t, kDeviceMPSComputeRunningProcesses)
IVCUDA_PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t, kDeviceMPSComputeRunningProcesses)
IVCUDA_PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t, kDeviceComputeRunningProcesses)
IVCUDA_PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_v2_t, kDeviceComputeRunningProcesses)
IVCUDA_PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, kDeviceComputeRunningProcesses)
IVCUDA_PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t, kDeviceGraphicsRunningProcesses)
IVCUDA_PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_v2_t, kDeviceGraphicsRunningProcesses)
IVCUDA_PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t, kDeviceGraphicsRunningProcesses)
#undef IVCUDA_PROCESS_LIST

// Utilisation samples of the guest's own processes (by their guest pids).
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t* utilization,
                                             unsigned int* processSamplesCount, unsigned long long lastSeenTimeStamp) {
  return guard([&]() -> nvmlReturn_t {
    unsigned i = 0;
    if (const nvmlReturn_t r = check_device(device, &i); r != NVML_SUCCESS) return r;
    if (processSamplesCount == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    const unsigned cap = utilization == nullptr ? 0 : std::min(*processSamplesCount, kMaxEntries);
    std::vector<nvmlProcessUtilizationSample_t> got(cap);
    ivcuda::nvml_wire::RepNvml rep{};
    const nvmlReturn_t r = query(NvmlFn::kDeviceProcessUtilization, static_cast<int>(i), cap, lastSeenTimeStamp,
                                 cap == 0 ? nullptr : got.data(),
                                 static_cast<std::uint32_t>(cap * sizeof(nvmlProcessUtilizationSample_t)), &rep);
    if (r == NVML_ERROR_INSUFFICIENT_SIZE) *processSamplesCount = static_cast<unsigned>(rep.val[0]);
    if (r != NVML_SUCCESS) return r;
    const auto n = static_cast<unsigned>(
        std::min<std::uint64_t>(rep.val[0], rep.out_len / sizeof(nvmlProcessUtilizationSample_t)));
    if (n > cap) return NVML_ERROR_UNKNOWN;
    std::copy(got.begin(), got.begin() + n, utilization);
    *processSamplesCount = n;
    return NVML_SUCCESS;
  });
}

// Lists of what a guest cannot have: encoder and frame-capture sessions (no
// video API is forwarded, so no guest process holds one) and accounted
// processes (accounting of a guest's processes is not kept; the host's list
// names other tenants). Empty, as NVML answers where there are none.
namespace {
nvmlReturn_t none(nvmlDevice_t device, unsigned* count) noexcept {
  unsigned i = 0;
  if (const nvmlReturn_t r = check_device(device, &i); r != NVML_SUCCESS) return r;
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *count = 0;
  return NVML_SUCCESS;
}
}  // namespace
nvmlReturn_t nvmlDeviceGetEncoderSessions(nvmlDevice_t device, unsigned int* sessionCount,
                                          nvmlEncoderSessionInfo_t* sessionInfos) {
  (void)sessionInfos;
  return none(device, sessionCount);
}
nvmlReturn_t nvmlDeviceGetFBCSessions(nvmlDevice_t device, unsigned int* sessionCount,
                                      nvmlFBCSessionInfo_t* sessionInfo) {
  (void)sessionInfo;
  return none(device, sessionCount);
}
nvmlReturn_t nvmlDeviceGetAccountingPids(nvmlDevice_t device, unsigned int* count, unsigned int* pids) {
  (void)pids;
  return none(device, count);
}

}  // extern "C"
