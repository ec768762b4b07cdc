// NVML over the ring: what the guest's libnvidia-ml.so.1 (guest/nvml/) asks
// the worker (host-daemon/worker/nvml.cc), in one op, proto::Op::kNvml. Each
// forwarded query is an NvmlFn; its arguments ride in ReqNvml, its answer
// in RepNvml (the NVML return code, up to four numbers) and, for strings,
// structs and lists, `out_len` bytes after RepNvml.
//
// What never travels: NVML's device handles (the guest makes its own, one per
// granted GPU), setters and privileged calls (the guest library answers
// NVML_ERROR_NO_PERMISSION itself), error strings and events (answered in the
// guest: a device that supports no event types).
//
// Numbering and the tenant's view, as the worker answers: `device` is the
// guest's index (the same as its CUDA ordinal); only granted GPUs exist.
// Memory: total is the guest's quota where it has one (else the GPU's), used
// is what the guest's workers hold on that GPU (NVML's per-process figures:
// contexts included), free is total - used. Processes: only the guest's, by
// the guest's pids. Utilization, temperature, power, clocks are the GPU's.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ivcuda::nvml_wire {

// Append only: the numbers are the wire format.
enum class NvmlFn : std::uint32_t {
  kInit = 1,                     // loads the host's NVML in the worker; ret only
  kSystemDriverVersion,          // out: NUL-terminated string
  kSystemNvmlVersion,            // out: string
  kSystemCudaDriverVersion,      // val[0]
  kDeviceCount,                  // val[0]: granted GPUs
  kDeviceName,                   // out: string
  kDeviceUuid,                   // out: string ("GPU-...", the same as the guest's cuDeviceGetUuid)
  kDeviceSerial,                 // out: string
  kDeviceBoardPartNumber,        // out: string
  kDeviceVbiosVersion,           // out: string
  kDeviceInforomImageVersion,    // out: string
  kDevicePciInfo,                // out: NvmlPci
  kDeviceMinorNumber,            // val[0]
  kDeviceArchitecture,           // val[0]: nvmlDeviceArchitecture_t
  kDeviceCudaComputeCapability,  // val[0] major, val[1] minor
  kDeviceBrand,                  // val[0]: nvmlBrandType_t
  kDeviceBoardId,                // val[0]
  kDeviceMultiGpuBoard,          // val[0]
  kDeviceMemoryInfo,             // val[0] total, val[1] free, val[2] used, val[3] reserved (the tenant's view)
  kDeviceBar1MemoryInfo,         // val[0] total, val[1] free, val[2] used
  kDeviceUtilizationRates,       // val[0] gpu %, val[1] memory %
  kDeviceEncoderUtilization,     // val[0] %, val[1] sampling period us
  kDeviceDecoderUtilization,     // val[0] %, val[1] sampling period us
  kDeviceTemperature,            // arg0: nvmlTemperatureSensors_t; val[0] C
  kDeviceTemperatureThreshold,   // arg0: nvmlTemperatureThresholds_t; val[0] C
  kDevicePowerUsage,             // val[0] mW
  kDevicePowerManagementLimit,   // val[0] mW
  kDevicePowerManagementDefaultLimit,      // val[0] mW
  kDevicePowerManagementLimitConstraints,  // val[0] min mW, val[1] max mW
  kDeviceEnforcedPowerLimit,     // val[0] mW
  kDeviceTotalEnergyConsumption, // val[0] mJ
  kDeviceClockInfo,              // arg0: nvmlClockType_t; val[0] MHz
  kDeviceMaxClockInfo,           // arg0: nvmlClockType_t; val[0] MHz
  kDeviceClock,                  // arg0: nvmlClockType_t, arg1: nvmlClockId_t; val[0] MHz
  kDeviceApplicationsClock,      // arg0: nvmlClockType_t; val[0] MHz
  kDeviceDefaultApplicationsClock,  // arg0: nvmlClockType_t; val[0] MHz
  kDevicePerformanceState,       // val[0]: nvmlPstates_t
  kDeviceFanSpeed,               // val[0] %
  kDeviceFanSpeedV2,             // arg0: fan; val[0] %
  kDeviceNumFans,                // val[0]
  kDeviceEccMode,                // val[0] current, val[1] pending
  kDeviceComputeMode,            // val[0]: nvmlComputeMode_t
  kDeviceMigMode,                // val[0] current, val[1] pending
  kDevicePersistenceMode,        // val[0]
  kDeviceDisplayMode,            // val[0]
  kDeviceDisplayActive,          // val[0]
  kDeviceCurrPcieLinkGeneration, // val[0]
  kDeviceCurrPcieLinkWidth,      // val[0]
  kDeviceMaxPcieLinkGeneration,  // val[0]
  kDeviceMaxPcieLinkWidth,       // val[0]
  kDevicePcieThroughput,         // arg0: nvmlPcieUtilCounter_t; val[0] KB/s
  kDeviceClocksEventReasons,     // val[0]: the current clocks event (throttle) reasons mask
  kDeviceComputeRunningProcesses,   // arg0: capacity (entries); out: NvmlProcess[]; val[0]: count
                                    // (NVML_ERROR_INSUFFICIENT_SIZE with val[0] = needed when more)
  kDeviceGraphicsRunningProcesses,  // as above (a guest has none of its own: count 0)
  kDeviceNvLinkState,            // arg0: link; val[0]: nvmlEnableState_t (links to ungranted GPUs: disabled)
  kDeviceTopologyCommonAncestor, // arg0: the other guest index; val[0]: nvmlGpuTopologyLevel_t
  kDeviceP2PStatus,              // arg0: the other guest index, arg1: nvmlGpuP2PCapsIndex_t; val[0]
  kDeviceTotalEccErrors,         // arg0: nvmlMemoryErrorType_t, arg1: nvmlEccCounterType_t; val[0]
  kDeviceMPSComputeRunningProcesses,  // as kDeviceComputeRunningProcesses, from NVML's MPS client list
  kDeviceProcessUtilization,     // arg0: capacity (entries), arg1: last seen time stamp (us); out:
                                 // nvmlProcessUtilizationSample_t[] of the guest's processes, by guest
                                 // pid; val[0]: count (INSUFFICIENT_SIZE with val[0] = needed when
                                 // more; NOT_FOUND when the guest's processes have no samples)
  kDeviceFieldValues,            // arg0, arg1: field id | scope id << 32, field id 0 for none (two
                                 // fields a query); out: nvmlFieldValue_t[val[0]]
  kCount
};

inline constexpr std::int32_t kNoDevice = -1;  // ReqNvml::device for the system-wide queries

// The pass-through queries (tools/nvml_passthrough.txt): NvmlFn kPassthroughBase + row of that
// list, generated on both sides from each function's prototype in nvml.h. Their arguments are
// up to four 32-bit slots, arg0 = slot0 | slot1 << 32, arg1 = slot2 | slot3 << 32, taken in the
// order of the function's parameters: each by-value argument (64-bit ones take two slots), the
// version of each versioned struct out, a list's capacity (kPassthroughNullItems set where the
// caller passed no array), a text buffer's length. The answer is the outputs' bytes one after
// the other, each section as large as the request makes it, and a list's entry count in val[0].
inline constexpr std::uint32_t kPassthroughBase = 0x1000;
inline constexpr std::uint32_t kPassthroughSlots = 4;
inline constexpr std::uint32_t kPassthroughNullItems = 1u << 31;
inline constexpr std::uint32_t kPassthroughMaxBody = 16384;  // bytes of all sections together
inline constexpr std::uint32_t kPassthroughMaxText = 256;
// A list's capacity as both sides size its section: what was asked, as far as the room left after
// `used` bytes holds `elem`-byte entries.
constexpr std::uint32_t passthrough_items(std::uint32_t asked, std::size_t used, std::size_t elem) {
  const std::size_t room = used < kPassthroughMaxBody ? (kPassthroughMaxBody - used) / elem : 0;
  return static_cast<std::uint32_t>(asked < room ? asked : room);
}

struct ReqNvml {
  std::uint32_t fn;        // NvmlFn
  std::int32_t device;     // the guest's index, or kNoDevice
  std::uint64_t arg0;
  std::uint64_t arg1;
  std::uint32_t out_cap;   // bytes of `out` the guest takes (the worker never sends more)
  std::uint32_t reserved;
};

struct RepNvml {
  std::int32_t ret;        // nvmlReturn_t
  std::uint32_t out_len;   // bytes after this struct
  std::uint64_t val[4];
};

// kDevicePciInfo's out.
struct NvmlPci {
  char bus_id_legacy[16];  // nvmlPciInfo_t's busIdLegacy
  char bus_id[32];         // busId, "00000000:19:00.0"
  std::uint32_t domain;
  std::uint32_t bus;
  std::uint32_t device;
  std::uint32_t pci_device_id;     // device << 16 | vendor
  std::uint32_t pci_subsystem_id;
  std::uint32_t reserved;
};

// One entry of kDevice*RunningProcesses' out.
struct NvmlProcess {
  std::uint32_t pid;                  // the guest's pid
  std::uint32_t reserved;
  std::uint64_t used_gpu_memory;      // bytes, NVML's figure for the worker serving that process
  std::uint32_t gpu_instance_id;      // 0xFFFFFFFF: none (no MIG)
  std::uint32_t compute_instance_id;  // 0xFFFFFFFF: none
};

static_assert(sizeof(ReqNvml) == 32);
static_assert(sizeof(RepNvml) == 40);
static_assert(sizeof(NvmlPci) == 72);
static_assert(sizeof(NvmlProcess) == 24);

}  // namespace ivcuda::nvml_wire
