// The NVML test double (libivcuda-nvml-double.so): a stand-in for the host's
// libnvidia-ml.so.1 on machines without a GPU, for ivcudad's workers
// (--nvml PATH) in CI. A test double only: installed nowhere, never shipped.
//
// Its GPUs are the GPU test double's (tests/gpu_double/identity.h): the same
// count (IVCUDA_GPU_DOUBLE_DEVICES), name, PCI addresses and UUIDs. The
// process lists and memory used come from the GPU double's ledger
// (IVCUDA_DOUBLE_LEDGER): as the driver's NVML lists every process that holds
// a context on a GPU, with its memory there, contexts included, every live
// process with a context on the device in the ledger (or memory there, as VMM
// memory needs no context) is a compute process with that much memory;
// without a ledger there are none. Everything else is a fixed, plausible
// value (an H200-like board).
// It implements what ivcudad's worker resolves (host-daemon/worker/nvml_api.h) and a
// few basics (init with flags, count, handle by index, UUID); setters are not exported.
#include <fcntl.h>
#include <nvml.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "identity.h"

using namespace ivcuda::gpu_double;

struct nvmlDevice_st {
  int index;
};

namespace {

nvmlDevice_st g_devices[kMaxDevices] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}};
std::mutex g_mu;
int g_inits = 0;    // nvmlInit minus nvmlShutdown
int g_count = 0;

bool inited() {
  std::lock_guard lock(g_mu);
  return g_inits > 0;
}

// The device a handle names, or -1 (a forged or foreign handle).
int index_of(nvmlDevice_t d) {
  for (int i = 0; i < g_count; ++i)
    if (d == &g_devices[i]) return i;
  return -1;
}

// The checks every device query starts with.
#define DEVICE_OR_RETURN(d, i, ...)                                       \
  if (!inited()) return NVML_ERROR_UNINITIALIZED;                         \
  const int i = index_of(d);                                              \
  if (i < 0 || __VA_ARGS__) return NVML_ERROR_INVALID_ARGUMENT;

nvmlReturn_t put(const char* s, char* out, unsigned len) {
  if (out == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  if (std::strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
  std::memcpy(out, s, std::strlen(s) + 1);
  return NVML_SUCCESS;
}

std::size_t total_mem() {
  const char* f = std::getenv("IVCUDA_GPU_DOUBLE_FUZZ");
  return f != nullptr && std::strcmp(f, "1") == 0 ? kFuzzTotalMem : kTotalMem;
}

// The GPU double's ledger, mapped read-only once it exists; null until then
// (the GPU double makes it at its first use) and without one.
const Ledger* ledger(int* fd_out) {
  static std::mutex mu;
  static int fd = -1;
  static const Ledger* l = nullptr;
  std::lock_guard lock(mu);
  if (l == nullptr) {
    const char* path = std::getenv("IVCUDA_DOUBLE_LEDGER");
    if (path == nullptr || *path == '\0') return nullptr;
    const int f = ::open(path, O_RDONLY | O_CLOEXEC);
    if (f < 0) return nullptr;
    struct stat st {};
    void* p = MAP_FAILED;
    if (::fstat(f, &st) == 0 && static_cast<std::size_t>(st.st_size) >= sizeof(Ledger))
      p = ::mmap(nullptr, sizeof(Ledger), PROT_READ, MAP_SHARED, f, 0);
    if (p == MAP_FAILED) {
      ::close(f);
      return nullptr;
    }
    fd = f;
    l = static_cast<const Ledger*>(p);
  }
  *fd_out = fd;
  return l;
}

// Whether a live process holds ledger entry i (its lock on byte i).
bool live(int fd, int i) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = i;
  fl.l_len = 1;
  return ::fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
}

// Processes holding a context or memory on device d: (pid, bytes), at most
// `cap` stored, the count returned.
unsigned processes(int d, nvmlProcessInfo_t* out, unsigned cap) {
  int fd = -1;
  const Ledger* l = ledger(&fd);
  if (l == nullptr) return 0;
  unsigned n = 0;
  for (int i = 0; i < Ledger::kEntries; ++i) {
    const std::uint64_t used = l->e[i].used[d].load();
    if ((used == 0 && l->e[i].contexts[d].load() == 0) || !live(fd, i)) continue;
    if (n < cap && out != nullptr)
      out[n] = {static_cast<unsigned>(l->e[i].pid), used, 0xFFFFFFFFu, 0xFFFFFFFFu};
    ++n;
  }
  return n;
}

std::uint64_t used_on(int d) {
  int fd = -1;
  const Ledger* l = ledger(&fd);
  if (l == nullptr) return 0;
  std::uint64_t sum = 0;
  for (int i = 0; i < Ledger::kEntries; ++i)
    if (const std::uint64_t u = l->e[i].used[d].load(); u != 0 && live(fd, i)) sum += u;
  return sum;
}

void pci_of(int i, nvmlPciInfo_t* p) {
  *p = {};
  const unsigned bus = static_cast<unsigned>(pci_bus(i)) & 0xffu;
  std::snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "%04x:%02x:%02x.0", kPciDomain, bus, kPciDevice);
  std::snprintf(p->busId, sizeof p->busId, "%08x:%02x:%02x.0", kPciDomain, bus, kPciDevice);
  p->domain = kPciDomain;
  p->bus = static_cast<unsigned>(pci_bus(i));
  p->device = kPciDevice;
  p->pciDeviceId = 0x233510DE;  // an H200's device and vendor ids
  p->pciSubSystemId = 0x18A610DE;
}

// One value per device query: fixed, plausible.
#define SCALAR(name, type, value)                          \
  nvmlReturn_t name(nvmlDevice_t device, type* out) {      \
    DEVICE_OR_RETURN(device, i, out == nullptr)            \
    (void)i;                                               \
    *out = value;                                          \
    return NVML_SUCCESS;                                   \
  }

// Graphics, SM, memory, video clocks (MHz): current, maximum and application clocks alike.
unsigned clock_of(nvmlClockType_t t) {
  static constexpr unsigned kClocks[NVML_CLOCK_COUNT] = {1980, 1980, 3201, 1755};
  return kClocks[t];
}
// NVLink: link l of GPU d leads to GPU l (every other GPU, one link each);
// links past the GPUs, and a GPU's link to itself, are down.
bool link_up(int d, unsigned link) { return link != static_cast<unsigned>(d) && link < static_cast<unsigned>(g_count); }
}  // namespace

extern "C" {

nvmlReturn_t nvmlInit_v2() {
  const int n = device_count_env();
  std::lock_guard lock(g_mu);
  g_count = n < 0 ? 1 : n;
  ++g_inits;
  return NVML_SUCCESS;
}

// What pynvml's nvmlInit() calls (tests/gpu/run_vm_on_gpu.sh asks the double natively, as the host's NVML).
nvmlReturn_t nvmlInitWithFlags(unsigned flags) { return flags == 0 ? nvmlInit_v2() : NVML_ERROR_INVALID_ARGUMENT; }

nvmlReturn_t nvmlShutdown() {
  std::lock_guard lock(g_mu);
  if (g_inits == 0) return NVML_ERROR_UNINITIALIZED;
  --g_inits;
  return NVML_SUCCESS;
}

const char* nvmlErrorString(nvmlReturn_t r) { return r == NVML_SUCCESS ? "Success" : "NVML test double error"; }

nvmlReturn_t nvmlSystemGetDriverVersion(char* v, unsigned len) {
  if (!inited()) return NVML_ERROR_UNINITIALIZED;
  return put("580.00.00", v, len);
}
nvmlReturn_t nvmlSystemGetNVMLVersion(char* v, unsigned len) {
  if (!inited()) return NVML_ERROR_UNINITIALIZED;
  return put("13.580.00", v, len);
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* v) {
  if (v == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *v = kDriverVersion;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned* n) {
  if (!inited()) return NVML_ERROR_UNINITIALIZED;
  if (n == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *n = static_cast<unsigned>(g_count);
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t* d) {
  if (!inited()) return NVML_ERROR_UNINITIALIZED;
  if (d == nullptr || i >= static_cast<unsigned>(g_count)) return NVML_ERROR_INVALID_ARGUMENT;
  *d = &g_devices[i];
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, nvmlDevice_t* d) {
  if (!inited()) return NVML_ERROR_UNINITIALIZED;
  if (bus_id == nullptr || d == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned dom = 0, bus = 0, dev = 0;
  if (std::sscanf(bus_id, "%x:%x:%x", &dom, &bus, &dev) != 3) return NVML_ERROR_INVALID_ARGUMENT;
  for (int i = 0; i < g_count; ++i)
    if (dom == kPciDomain && bus == static_cast<unsigned>(pci_bus(i)) && dev == kPciDevice) {
      *d = &g_devices[i];
      return NVML_SUCCESS;
    }
  return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned len) {
  DEVICE_OR_RETURN(device, i, false)
  (void)i;
  return put(kDeviceName, name, len);
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned len) {
  DEVICE_OR_RETURN(device, i, false)
  unsigned char b[16];
  device_uuid(i, b);
  char s[64];
  std::snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return put(s, uuid, len);
}
nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char* serial, unsigned len) {
  DEVICE_OR_RETURN(device, i, false)
  char s[32];
  std::snprintf(s, sizeof s, "16540000000%02d", i);
  return put(s, serial, len);
}
nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t device, char* pn, unsigned len) {
  DEVICE_OR_RETURN(device, i, false)
  (void)i;
  return put("692-2G520-0280-000", pn, len);
}
nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char* v, unsigned len) {
  DEVICE_OR_RETURN(device, i, false)
  (void)i;
  return put("96.00.A5.00.01", v, len);
}
nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t device, char* v, unsigned len) {
  DEVICE_OR_RETURN(device, i, false)
  (void)i;
  return put("G520.0280.00.05", v, len);
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* p) {
  DEVICE_OR_RETURN(device, i, p == nullptr)
  pci_of(i, p);
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned* v) {
  DEVICE_OR_RETURN(device, i, v == nullptr)
  *v = static_cast<unsigned>(i);
  return NVML_SUCCESS;
}
SCALAR(nvmlDeviceGetArchitecture, nvmlDeviceArchitecture_t, NVML_DEVICE_ARCH_HOPPER)
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int* major, int* minor) {
  DEVICE_OR_RETURN(device, i, major == nullptr || minor == nullptr)
  (void)i;
  *major = 9;  // as the GPU double's attributes
  *minor = 0;
  return NVML_SUCCESS;
}
SCALAR(nvmlDeviceGetBrand, nvmlBrandType_t, NVML_BRAND_NVIDIA)
nvmlReturn_t nvmlDeviceGetBoardId(nvmlDevice_t device, unsigned* v) {
  DEVICE_OR_RETURN(device, i, v == nullptr)
  *v = 0x4100u + static_cast<unsigned>(i);
  return NVML_SUCCESS;
}
SCALAR(nvmlDeviceGetMultiGpuBoard, unsigned, 0)

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* m) {
  DEVICE_OR_RETURN(device, i, m == nullptr)
  m->total = total_mem();
  m->used = std::min<std::uint64_t>(used_on(i), m->total);
  m->free = m->total - m->used;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* m) {
  DEVICE_OR_RETURN(device, i, m == nullptr)
  if (m->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  m->total = total_mem();
  m->reserved = 0;
  m->used = std::min<std::uint64_t>(used_on(i), m->total);
  m->free = m->total - m->used;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t* m) {
  DEVICE_OR_RETURN(device, i, m == nullptr)
  (void)i;
  m->bar1Total = std::uint64_t{256} << 20;
  m->bar1Used = std::uint64_t{2} << 20;
  m->bar1Free = m->bar1Total - m->bar1Used;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* u) {
  DEVICE_OR_RETURN(device, i, u == nullptr)
  (void)i;
  u->gpu = 7;
  u->memory = 3;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned* util, unsigned* period) {
  DEVICE_OR_RETURN(device, i, util == nullptr || period == nullptr)
  (void)i;
  *util = 0;
  *period = 167000;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned* util, unsigned* period) {
  return nvmlDeviceGetEncoderUtilization(device, util, period);
}
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensor, unsigned* t) {
  DEVICE_OR_RETURN(device, i, t == nullptr || sensor != NVML_TEMPERATURE_GPU)
  (void)i;
  *t = 34;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, nvmlTemperatureThresholds_t type, unsigned* t) {
  DEVICE_OR_RETURN(device, i, t == nullptr || static_cast<unsigned>(type) >= NVML_TEMPERATURE_THRESHOLD_COUNT)
  (void)i;
  switch (type) {
    case NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: *t = 92; return NVML_SUCCESS;
    case NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: *t = 89; return NVML_SUCCESS;
    case NVML_TEMPERATURE_THRESHOLD_MEM_MAX: *t = 95; return NVML_SUCCESS;
    case NVML_TEMPERATURE_THRESHOLD_GPU_MAX: *t = 87; return NVML_SUCCESS;
    default: return NVML_ERROR_NOT_SUPPORTED;
  }
}
SCALAR(nvmlDeviceGetPowerUsage, unsigned, 71234)
SCALAR(nvmlDeviceGetPowerManagementLimit, unsigned, 700000)
SCALAR(nvmlDeviceGetPowerManagementDefaultLimit, unsigned, 700000)
SCALAR(nvmlDeviceGetEnforcedPowerLimit, unsigned, 700000)
nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned* lo, unsigned* hi) {
  DEVICE_OR_RETURN(device, i, lo == nullptr || hi == nullptr)
  (void)i;
  *lo = 200000;
  *hi = 700000;
  return NVML_SUCCESS;
}
SCALAR(nvmlDeviceGetTotalEnergyConsumption, unsigned long long, 123456789ull)

#define CLOCK(name)                                                                      \
  nvmlReturn_t name(nvmlDevice_t device, nvmlClockType_t type, unsigned* mhz) {          \
    DEVICE_OR_RETURN(device, i, mhz == nullptr || static_cast<unsigned>(type) >= NVML_CLOCK_COUNT)  \
    (void)i;                                                                             \
    *mhz = clock_of(type);                                                               \
    return NVML_SUCCESS;                                                                 \
  }
CLOCK(nvmlDeviceGetClockInfo)
CLOCK(nvmlDeviceGetMaxClockInfo)
CLOCK(nvmlDeviceGetApplicationsClock)
CLOCK(nvmlDeviceGetDefaultApplicationsClock)
nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, nvmlClockType_t type, nvmlClockId_t id, unsigned* mhz) {
  DEVICE_OR_RETURN(device, i, mhz == nullptr || static_cast<unsigned>(type) >= NVML_CLOCK_COUNT || static_cast<unsigned>(id) >= NVML_CLOCK_ID_COUNT)
  (void)i;
  *mhz = clock_of(type);
  return NVML_SUCCESS;
}
SCALAR(nvmlDeviceGetPerformanceState, nvmlPstates_t, NVML_PSTATE_0)
// A data-centre board: no fans.
nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned* v) {
  DEVICE_OR_RETURN(device, i, v == nullptr)
  (void)i;
  return NVML_ERROR_NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned fan, unsigned* v) {
  DEVICE_OR_RETURN(device, i, v == nullptr)
  (void)i;
  (void)fan;
  return NVML_ERROR_NOT_SUPPORTED;
}
SCALAR(nvmlDeviceGetNumFans, unsigned, 0)
nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t* cur, nvmlEnableState_t* pend) {
  DEVICE_OR_RETURN(device, i, cur == nullptr || pend == nullptr)
  (void)i;
  *cur = *pend = NVML_FEATURE_ENABLED;
  return NVML_SUCCESS;
}
SCALAR(nvmlDeviceGetComputeMode, nvmlComputeMode_t, NVML_COMPUTEMODE_DEFAULT)
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned* cur, unsigned* pend) {
  DEVICE_OR_RETURN(device, i, cur == nullptr || pend == nullptr)
  (void)i;
  *cur = *pend = NVML_DEVICE_MIG_DISABLE;
  return NVML_SUCCESS;
}
SCALAR(nvmlDeviceGetPersistenceMode, nvmlEnableState_t, NVML_FEATURE_ENABLED)
SCALAR(nvmlDeviceGetDisplayMode, nvmlEnableState_t, NVML_FEATURE_DISABLED)
SCALAR(nvmlDeviceGetDisplayActive, nvmlEnableState_t, NVML_FEATURE_DISABLED)
SCALAR(nvmlDeviceGetCurrPcieLinkGeneration, unsigned, 5)
SCALAR(nvmlDeviceGetMaxPcieLinkGeneration, unsigned, 5)
SCALAR(nvmlDeviceGetCurrPcieLinkWidth, unsigned, 16)
SCALAR(nvmlDeviceGetMaxPcieLinkWidth, unsigned, 16)
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t c, unsigned* v) {
  DEVICE_OR_RETURN(device, i, v == nullptr || static_cast<unsigned>(c) >= NVML_PCIE_UTIL_COUNT)
  (void)i;
  *v = c == NVML_PCIE_UTIL_TX_BYTES ? 1200 : 3400;
  return NVML_SUCCESS;
}
SCALAR(nvmlDeviceGetCurrentClocksEventReasons, unsigned long long, nvmlClocksEventReasonGpuIdle)

// Every process holding a context or memory in the ledger; NVML's list conventions.
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned* count, nvmlProcessInfo_t* infos) {
  DEVICE_OR_RETURN(device, i, count == nullptr || (*count != 0 && infos == nullptr))
  const unsigned n = processes(i, infos, *count);
  const bool fits = n <= *count;
  *count = n;
  return fits ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
}

// No MPS server here: no MPS clients.
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned* count, nvmlProcessInfo_t* infos) {
  DEVICE_OR_RETURN(device, i, count == nullptr || (*count != 0 && infos == nullptr))
  (void)i;
  *count = 0;
  return NVML_SUCCESS;
}
// One sample for each process of the compute list, at a fixed time stamp, SM busy 5 %,
// with stray bytes in the padding as the real NVML leaves there.
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t* samples,
                                             unsigned* count, unsigned long long last_seen) {
  DEVICE_OR_RETURN(device, i, count == nullptr)
  constexpr unsigned long long kStamp = 1'700'000'000'000'000ULL;
  nvmlProcessInfo_t procs[64];
  const unsigned n = std::min(processes(i, procs, 64), 64u);
  if (n == 0 || last_seen >= kStamp) return NVML_ERROR_NOT_FOUND;
  if (samples == nullptr || *count < n) {
    *count = n;
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  for (unsigned k = 0; k < n; ++k) {
    samples[k] = {procs[k].pid, kStamp, 5, 1, 0, 0};
    // What the H200's NVML leaves in the padding after the pid: a host address's upper half.
    static_assert(offsetof(nvmlProcessUtilizationSample_t, timeStamp) == 8);
    const unsigned stray = 0x5578;
    std::memcpy(reinterpret_cast<char*>(&samples[k]) + 4, &stray, sizeof stray);
  }
  *count = n;
  return NVML_SUCCESS;
}
// Field values: each field's value is its id times ten (an unsigned long long), scope
// ids past the links answer NVML_ERROR_INVALID_ARGUMENT in that field.
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int n, nvmlFieldValue_t* values) {
  DEVICE_OR_RETURN(device, i, n < 0 || (n > 0 && values == nullptr))
  (void)i;
  for (int k = 0; k < n; ++k) {
    values[k].timestamp = 1'700'000'000'000'000LL;
    values[k].latencyUsec = 1;
    values[k].valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
    values[k].nvmlReturn = values[k].scopeId < NVML_NVLINK_MAX_LINKS ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    values[k].value.ullVal = 10ull * values[k].fieldId;
  }
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned link, nvmlEnableState_t* v) {
  DEVICE_OR_RETURN(device, i, v == nullptr || link >= NVML_NVLINK_MAX_LINKS)
  *v = link_up(i, link) ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned link, nvmlIntNvLinkDeviceType_t* t) {
  DEVICE_OR_RETURN(device, i, t == nullptr || link >= NVML_NVLINK_MAX_LINKS)
  if (!link_up(i, link)) return NVML_ERROR_NOT_SUPPORTED;
  *t = NVML_NVLINK_DEVICE_TYPE_GPU;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned link, nvmlPciInfo_t* p) {
  DEVICE_OR_RETURN(device, i, p == nullptr || link >= NVML_NVLINK_MAX_LINKS)
  if (!link_up(i, link)) return NVML_ERROR_NOT_SUPPORTED;
  pci_of(static_cast<int>(link), p);
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, nvmlGpuTopologyLevel_t* v) {
  DEVICE_OR_RETURN(a, i, v == nullptr || index_of(b) < 0)
  *v = index_of(b) == i ? NVML_TOPOLOGY_INTERNAL : NVML_TOPOLOGY_NODE;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, nvmlGpuP2PCapsIndex_t idx, nvmlGpuP2PStatus_t* v) {
  DEVICE_OR_RETURN(a, i, v == nullptr || index_of(b) < 0 || static_cast<unsigned>(idx) >= NVML_P2P_CAPS_INDEX_UNKNOWN)
  (void)i;
  *v = NVML_P2P_STATUS_OK;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t e, nvmlEccCounterType_t c,
                                         unsigned long long* v) {
  DEVICE_OR_RETURN(device, i, v == nullptr || static_cast<unsigned>(e) >= NVML_MEMORY_ERROR_TYPE_COUNT ||
                                  static_cast<unsigned>(c) >= NVML_ECC_COUNTER_TYPE_COUNT)
  (void)i;
  *v = 0;
  return NVML_SUCCESS;
}


// A few of the pass-through queries (tools/nvml_passthrough.txt), one of each
// shape the generated code has: a scalar, two and four values out, inputs in,
// a versioned struct, a text of the caller's length and one of nvml.h's
// fixed size, a list sized by the caller and one that says how many it holds,
// and a system query. The rest are not exported: the worker answers
// NVML_ERROR_FUNCTION_NOT_FOUND for them, as for a driver that lacks them.
SCALAR(nvmlDeviceGetPcieSpeed, unsigned, 32000u)
nvmlReturn_t nvmlDeviceGetGspFirmwareMode(nvmlDevice_t device, unsigned* enabled, unsigned* default_mode) {
  DEVICE_OR_RETURN(device, i, enabled == nullptr || default_mode == nullptr)
  (void)i;
  *enabled = 1;
  *default_mode = 1;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned* corr, unsigned* unc, unsigned* pending,
                                       unsigned* failure) {
  DEVICE_OR_RETURN(device, i, corr == nullptr || unc == nullptr || pending == nullptr || failure == nullptr)
  *corr = 2u + static_cast<unsigned>(i);
  *unc = 1;
  *pending = 0;
  *failure = 0;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMinMaxClockOfPState(nvmlDevice_t device, nvmlClockType_t type, nvmlPstates_t pstate,
                                              unsigned* min, unsigned* max) {
  DEVICE_OR_RETURN(device, i, min == nullptr || max == nullptr || static_cast<unsigned>(type) >= NVML_CLOCK_COUNT)
  (void)i;
  if (pstate != NVML_PSTATE_0) return NVML_ERROR_NOT_SUPPORTED;
  *min = 345;
  *max = clock_of(type);
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetMarginTemperature(nvmlDevice_t device, nvmlMarginTemperature_t* t) {
  DEVICE_OR_RETURN(device, i, t == nullptr)
  (void)i;
  if (t->version != nvmlMarginTemperature_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  t->marginTemperature = 56;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetInforomVersion(nvmlDevice_t device, nvmlInforomObject_t object, char* version, unsigned length) {
  DEVICE_OR_RETURN(device, i, static_cast<unsigned>(object) >= NVML_INFOROM_COUNT)
  (void)i;
  static constexpr const char* kVersions[] = {"2.1", "7.16", "N/A", "N/A"};
  return put(kVersions[object], version, length);
}
nvmlReturn_t nvmlDeviceGetGspFirmwareVersion(nvmlDevice_t device, char* version) {
  DEVICE_OR_RETURN(device, i, version == nullptr)
  (void)i;
  return put("580.00.00", version, NVML_GSP_FIRMWARE_VERSION_BUF_SIZE);
}
nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned size, unsigned long* set) {
  DEVICE_OR_RETURN(device, i, set == nullptr || size == 0)
  // GPU i near CPUs 8i..8i+7.
  for (unsigned k = 0; k < size; ++k) set[k] = 0;
  set[0] = 0xFFul << (8 * (i % 8));
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetSupportedMemoryClocks(nvmlDevice_t device, unsigned* count, unsigned* clocks) {
  DEVICE_OR_RETURN(device, i, count == nullptr)
  (void)i;
  static constexpr unsigned kMem[] = {3201, 2201, 1593};
  constexpr unsigned n = sizeof kMem / sizeof kMem[0];
  if (clocks == nullptr || *count < n) {
    *count = n;
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  std::copy(kMem, kMem + n, clocks);
  *count = n;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, nvmlSamplingType_t type, unsigned long long last_seen,
                                  nvmlValueType_t* value_type, unsigned* count, nvmlSample_t* samples) {
  DEVICE_OR_RETURN(device, i, value_type == nullptr || count == nullptr ||
                                  static_cast<unsigned>(type) >= NVML_SAMPLINGTYPE_COUNT)
  (void)i;
  // Ten samples a second apart from a fixed start; those after last_seen are returned.
  constexpr unsigned long long kStart = 1'700'000'000'000'000ULL;
  constexpr unsigned kAll = 10;
  unsigned first = 0;
  while (first < kAll && kStart + first * 1'000'000ULL <= last_seen) ++first;
  const unsigned have = kAll - first;
  *value_type = NVML_VALUE_TYPE_UNSIGNED_INT;
  if (samples == nullptr) {
    *count = have;
    return have == 0 ? NVML_ERROR_NOT_FOUND : NVML_SUCCESS;
  }
  if (have == 0) return NVML_ERROR_NOT_FOUND;
  const unsigned n = std::min(*count, have);
  for (unsigned k = 0; k < n; ++k) {
    samples[k].timeStamp = kStart + (first + k) * 1'000'000ULL;
    samples[k].sampleValue.uiVal = 10 * (first + k);
  }
  *count = n;
  return NVML_SUCCESS;
}
// size in bytes (nvml.h): P0 and P2, the rest NVML_PSTATE_UNKNOWN.
nvmlReturn_t nvmlDeviceGetSupportedPerformanceStates(nvmlDevice_t device, nvmlPstates_t* pstates, unsigned size) {
  DEVICE_OR_RETURN(device, i, pstates == nullptr)
  (void)i;
  const unsigned n = size / sizeof(nvmlPstates_t);
  if (n < 2) return NVML_ERROR_INSUFFICIENT_SIZE;
  for (unsigned k = 0; k < n && k < NVML_MAX_GPU_PERF_PSTATES; ++k) pstates[k] = NVML_PSTATE_UNKNOWN;
  pstates[0] = NVML_PSTATE_0;
  pstates[1] = NVML_PSTATE_2;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetHicVersion(unsigned* count, nvmlHwbcEntry_t* entries) {
  if (!inited()) return NVML_ERROR_UNINITIALIZED;
  if (count == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  (void)entries;
  *count = 0;  // no HIC boards
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetConfComputeState(nvmlConfComputeSystemState_t* state) {
  if (!inited()) return NVML_ERROR_UNINITIALIZED;
  if (state == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *state = {NVML_CC_SYSTEM_ENVIRONMENT_UNAVAILABLE, NVML_CC_SYSTEM_FEATURE_DISABLED, NVML_CC_SYSTEM_DEVTOOLS_MODE_OFF};
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetConfComputeCapabilities(nvmlConfComputeSystemCaps_t* caps) {
  if (!inited()) return NVML_ERROR_UNINITIALIZED;
  if (caps == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *caps = {NVML_CC_SYSTEM_CPU_CAPS_NONE, NVML_CC_SYSTEM_GPUS_CC_CAPABLE};
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlSystemGetNvlinkBwMode(unsigned* mode) {
  if (!inited()) return NVML_ERROR_UNINITIALIZED;
  if (mode == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *mode = 0;
  return NVML_SUCCESS;
}

}  // extern "C"
