// NVML queries from the guest (include/ivcuda/nvml_wire.h): the worker asks
// the host's NVML (nvml_api.h) about the GPUs it was granted, in the guest's
// numbering, and answers with the tenant's view of memory and processes.
//
// Every answer is a RepNvml with CUDA_SUCCESS as the record's status; its
// `ret` is the nvmlReturn_t. A query the worker refuses before NVML sees it
// answers NVML_ERROR_INVALID_ARGUMENT (an fn outside NvmlFn, a device outside
// the granted ones, kNoDevice on a device query, an enum argument outside
// NVML's enum, a second device that is not granted). Where the host's NVML
// cannot be loaded or lacks a required function every query answers
// NVML_ERROR_LIBRARY_NOT_FOUND; where nvmlInit_v2 fails, what it said
// (NVML_ERROR_DRIVER_NOT_LOADED on a host without the kernel module). The
// library is loaded once per worker: a failure is not retried.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <string_view>

#include "host-daemon/shared/log.h"
#include "host-daemon/worker/nvml_api.h"
#include "host-daemon/shared/rules.h"
#include "host-daemon/shared/from_worker.h"
#include "host-daemon/worker/worker.h"
#include "host-daemon/worker/worker_internal.h"

namespace ivcuda::host {

#define IVCUDA_NVML_STR_(x) #x
#define IVCUDA_NVML_STR(x) IVCUDA_NVML_STR_(x)

Result<NvmlApi> load_nvml(const std::string& path) {
  NvmlApi api;
  // RTLD_LOCAL: NVML's symbols must not satisfy anything else.
  api.handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (api.handle == nullptr) {
    const char* e = ::dlerror();
    return make_error(ENOENT, "cannot load NVML '" + path + "': " + (e ? e : "?"));
  }
#define IVCUDA_NVML_LOAD(f) api.f = reinterpret_cast<decltype(api.f)>(::dlsym(api.handle, IVCUDA_NVML_STR(f)));
  IVCUDA_NVML_REQUIRED(IVCUDA_NVML_LOAD)
  IVCUDA_NVML_OPTIONAL(IVCUDA_NVML_LOAD)
  IVCUDA_NVML_PASSTHROUGH(IVCUDA_NVML_LOAD)
#undef IVCUDA_NVML_LOAD
#define IVCUDA_NVML_CHECK(f) \
  if (api.f == nullptr) return make_error(ENOENT, "NVML '" + path + "' lacks " IVCUDA_NVML_STR(f));
  IVCUDA_NVML_REQUIRED(IVCUDA_NVML_CHECK)
#undef IVCUDA_NVML_CHECK
  return api;
}

using nvml_wire::NvmlFn;
using nvml_wire::NvmlPci;
using nvml_wire::NvmlProcess;

struct Worker::NvmlState {
  NvmlApi api;
  // NVML_SUCCESS once loaded and initialised; else what every query answers.
  nvmlReturn_t status = NVML_ERROR_UNINITIALIZED;
  // By guest index: NVML's handle (null until first asked) and the PCI
  // address the worker's driver gives the GPU (domain, bus, device).
  std::vector<nvmlDevice_t> handles;
  std::vector<std::array<unsigned, 3>> pci;
  NvmlState() = default;
  NvmlState(const NvmlState&) = delete;
  NvmlState& operator=(const NvmlState&) = delete;
  ~NvmlState() {
    if (status == NVML_SUCCESS) (void)api.nvmlShutdown();
  }
};

Worker::NvmlState& Worker::nvml_state() {
  if (nvml_) return *nvml_;
  nvml_ = std::make_shared<NvmlState>();
  NvmlState& s = *nvml_;
  if (cfg_.nvml_path.empty()) {  // --nvml none
    s.status = NVML_ERROR_LIBRARY_NOT_FOUND;
    return s;
  }
  auto api = load_nvml(cfg_.nvml_path);
  if (!api) {
    IVLOG_WARN("guest %u: NVML queries answer LIBRARY_NOT_FOUND: %s", cfg_.guest_id, api.error().what.c_str());
    s.status = NVML_ERROR_LIBRARY_NOT_FOUND;
    return s;
  }
  s.api = *api;
  s.status = s.api.nvmlInit_v2();
  if (s.status != NVML_SUCCESS) {
    IVLOG_WARN("guest %u: nvmlInit_v2 of '%s' failed (%d); NVML queries answer that", cfg_.guest_id,
               cfg_.nvml_path.c_str(), static_cast<int>(s.status));
    return s;
  }
  s.handles.assign(devices_.size(), nullptr);
  s.pci.assign(devices_.size(), {~0u, ~0u, ~0u});
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    char bus[64] = {};
    unsigned dom = 0, b = 0, d = 0, fn = 0;
    if (cu_.cuDeviceGetPCIBusId(bus, sizeof bus - 1, devices_[i]) == CUDA_SUCCESS &&
        std::sscanf(bus, "%x:%x:%x.%x", &dom, &b, &d, &fn) == 4)
      s.pci[i] = {dom, b, d};
    // Each granted GPU's handle now, and one query of each kind the guest
    // asks most, while the worker is not yet sandboxed: NVML opens the GPU's
    // files and reads the driver's tables on a device's first use, which the
    // sandbox no longer allows (inside it, those first uses answer
    // NVML_ERROR_UNKNOWN on the H200).
    nvmlDevice_t h = nullptr;
    if (bus[0] == '\0' || s.api.nvmlDeviceGetHandleByPciBusId_v2(bus, &h) != NVML_SUCCESS) continue;
    s.handles[i] = h;
    if (s.api.nvmlDeviceGetMemoryInfo != nullptr) {
      nvmlMemory_t mem{};
      (void)s.api.nvmlDeviceGetMemoryInfo(h, &mem);
    }
    if (s.api.nvmlDeviceGetUtilizationRates != nullptr) {
      nvmlUtilization_t u{};
      (void)s.api.nvmlDeviceGetUtilizationRates(h, &u);
    }
    if (s.api.nvmlDeviceGetComputeRunningProcesses_v3 != nullptr) {
      unsigned n = 0;
      (void)s.api.nvmlDeviceGetComputeRunningProcesses_v3(h, &n, nullptr);
    }
    if (s.api.nvmlDeviceGetPowerUsage != nullptr) {
      unsigned mw = 0;
      (void)s.api.nvmlDeviceGetPowerUsage(h, &mw);
    }
  }
  return s;
}

namespace {

constexpr std::uint64_t kNotAvailable = NVML_VALUE_NOT_AVAILABLE;

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx": NVML's form of the 16 bytes
// cuDeviceGetUuid gives, so that the guest's NVML and CUDA name a GPU alike.
std::string uuid_string(const CUuuid& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  char s[64];
  std::snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return s;
}

// An NVML enum argument from the wire, or false when it is outside NVML's
// enum (its enumerators below `count`).
template <class E>
bool nvml_enum(std::uint64_t v, std::uint64_t count, E* out) {
  if (v >= count) return false;
  *out = static_cast<E>(v);
  return true;
}

// One of NVML's lists, which can grow between asking how long it is and
// filling it: `call(entries, &count)` a few times, with room to spare.
template <class T, class Call>
nvmlReturn_t growing_list(std::vector<T>* all, Call call) {
  unsigned n = 0;
  nvmlReturn_t st = NVML_ERROR_INSUFFICIENT_SIZE;
  for (int tries = 0; tries < 4 && st == NVML_ERROR_INSUFFICIENT_SIZE; ++tries) {
    all->resize(n + 8);
    n = static_cast<unsigned>(all->size());
    st = call(all->data(), &n);
  }
  if (st == NVML_SUCCESS) all->resize(std::min<std::size_t>(n, all->size()));
  return st;
}

// NVML's `f`, or FUNCTION_NOT_FOUND where the host's library lacks it (as
// NVML's own loaders answer).
template <class F, class... Args>
nvmlReturn_t call(F* f, Args... args) {
  return f == nullptr ? NVML_ERROR_FUNCTION_NOT_FOUND : f(args...);
}

// The granted GPUs as the worker's driver and NVML know them, by guest index.
struct Gpus {
  const DriverApi& cu;
  const std::vector<CUdevice>& devices;
  std::vector<nvmlDevice_t>& handles;               // null until first asked
  const std::vector<std::array<unsigned, 3>>& pci;  // domain, bus, device
};

// Whose processes NVML's lists may show the guest, and its memory quota.
struct Tenant {
  VmShared* vm;             // a VM's workers; null in process mode
  std::uint32_t hello_pid;  // process mode: the guest process's pid
  const MemQuota& quota;
};

// One query being answered: the guest's request, the host's NVML, the granted
// GPU the request names, and where the answer goes (val[] of the reply, and
// the body: never more than `cap` bytes).
struct Query {
  const proto::ReqNvml& r;
  NvmlFn fn;
  std::uint32_t cap;
  const NvmlApi& a;
  Gpus& gpus;
  const Tenant& tenant;
  proto::RepNvml* rep;
  std::vector<std::byte>* out;
  std::size_t gpu = 0;  // device queries: the guest index and NVML's handle
  nvmlDevice_t h = nullptr;
};

// What a family answers to a query of another family's: no nvmlReturn_t.
constexpr int kOtherFamily = -1;

// A string answer: NUL included, at most `cap` bytes.
int put_string(const Query& q, nvmlReturn_t st, const char* str) {
  if (st != NVML_SUCCESS) return st;
  const std::size_t n = ::strnlen(str, 255) + 1;
  if (n > q.cap) {
    q.rep->val[0] = n;
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  q.out->resize(n);
  std::memcpy(q.out->data(), str, n - 1);
  (*q.out)[n - 1] = std::byte{0};
  return NVML_SUCCESS;
}

// NVML's string getter `f`, of the system or of the device, into a buffer
// NVML cannot leave unterminated: its last byte is never offered.
template <class F>
int system_text(const Query& q, F* f) {
  char buf[256] = {};
  return put_string(q, call(f, buf, static_cast<unsigned>(sizeof buf - 1)), buf);
}
template <class F>
int device_text(const Query& q, F* f) {
  char buf[256] = {};
  return put_string(q, call(f, q.h, buf, static_cast<unsigned>(sizeof buf - 1)), buf);
}

// The value NVML's getter `f` gives of the device into val[0], also when it
// fails (then what the getter left, or 0); `in` are the arguments between the
// device and the value.
template <class T, class F, class... In>
int value(const Query& q, F* f, In... in) {
  T v{};
  const nvmlReturn_t st = call(f, q.h, in..., &v);
  q.rep->val[0] = static_cast<std::uint64_t>(v);
  return st;
}

// As value(), for a getter of two values (val[0], val[1]).
template <class T, class F>
int values(const Query& q, F* f) {
  T first{}, second{};
  const nvmlReturn_t st = call(f, q.h, &first, &second);
  q.rep->val[0] = static_cast<std::uint64_t>(first);
  q.rep->val[1] = static_cast<std::uint64_t>(second);
  return st;
}

// As value(), for a getter of one enum argument E, which the guest gives in
// arg0: refused outside NVML's enum (its enumerators below `count`).
template <class E, class T, class F>
int value_of(const Query& q, std::uint64_t count, F* f) {
  E e{};
  if (!nvml_enum(q.r.arg0, count, &e)) return NVML_ERROR_INVALID_ARGUMENT;
  return value<T>(q, f, e);
}

// NVML's handle of granted GPU `i`, found by the PCI address the worker's
// driver gives it (so that NVML and CUDA mean the same GPU).
int gpu_handle(const NvmlApi& a, Gpus& g, std::size_t i, nvmlDevice_t* out) {
  if (g.handles[i] == nullptr) {
    char bus[64] = {};
    if (g.cu.cuDeviceGetPCIBusId(bus, sizeof bus - 1, g.devices[i]) != CUDA_SUCCESS) return NVML_ERROR_UNKNOWN;
    nvmlDevice_t found = nullptr;
    const nvmlReturn_t st = a.nvmlDeviceGetHandleByPciBusId_v2(bus, &found);
    if (st != NVML_SUCCESS) return st;
    g.handles[i] = found;
  }
  *out = g.handles[i];
  return NVML_SUCCESS;
}

int system_query(const Query& q) {
  switch (q.fn) {
    case NvmlFn::kInit: return NVML_SUCCESS;
    case NvmlFn::kSystemDriverVersion: return system_text(q, q.a.nvmlSystemGetDriverVersion);
    case NvmlFn::kSystemNvmlVersion: return system_text(q, q.a.nvmlSystemGetNVMLVersion);
    case NvmlFn::kSystemCudaDriverVersion: {
      int v = 0;
      const nvmlReturn_t st = call(q.a.nvmlSystemGetCudaDriverVersion_v2, &v);
      q.rep->val[0] = static_cast<std::uint64_t>(v);
      return st;
    }
    case NvmlFn::kDeviceCount: q.rep->val[0] = q.gpus.devices.size(); return NVML_SUCCESS;
    default: return NVML_ERROR_INVALID_ARGUMENT;  // not a system query
  }
}

// What a GPU is and how it is set (guest/nvml/device.cc).
int device_query(const Query& q) {
  const NvmlApi& a = q.a;
  switch (q.fn) {
    case NvmlFn::kDeviceName: return device_text(q, a.nvmlDeviceGetName);
    case NvmlFn::kDeviceUuid: {
      CUuuid u{};
      if (q.gpus.cu.cuDeviceGetUuid(&u, q.gpus.devices[q.gpu]) != CUDA_SUCCESS) return NVML_ERROR_UNKNOWN;
      return put_string(q, NVML_SUCCESS, uuid_string(u).c_str());
    }
    case NvmlFn::kDeviceSerial: return device_text(q, a.nvmlDeviceGetSerial);
    case NvmlFn::kDeviceBoardPartNumber: return device_text(q, a.nvmlDeviceGetBoardPartNumber);
    case NvmlFn::kDeviceVbiosVersion: return device_text(q, a.nvmlDeviceGetVbiosVersion);
    case NvmlFn::kDeviceInforomImageVersion: return device_text(q, a.nvmlDeviceGetInforomImageVersion);
    case NvmlFn::kDeviceMinorNumber: return value<unsigned>(q, a.nvmlDeviceGetMinorNumber);
    case NvmlFn::kDeviceArchitecture: return value<nvmlDeviceArchitecture_t>(q, a.nvmlDeviceGetArchitecture);
    case NvmlFn::kDeviceCudaComputeCapability: return values<int>(q, a.nvmlDeviceGetCudaComputeCapability);
    case NvmlFn::kDeviceBrand: return value<nvmlBrandType_t>(q, a.nvmlDeviceGetBrand);
    case NvmlFn::kDeviceBoardId: return value<unsigned>(q, a.nvmlDeviceGetBoardId);
    case NvmlFn::kDeviceMultiGpuBoard: return value<unsigned>(q, a.nvmlDeviceGetMultiGpuBoard);
    case NvmlFn::kDeviceEccMode: return values<nvmlEnableState_t>(q, a.nvmlDeviceGetEccMode);
    case NvmlFn::kDeviceComputeMode: return value<nvmlComputeMode_t>(q, a.nvmlDeviceGetComputeMode);
    case NvmlFn::kDeviceMigMode: return values<unsigned>(q, a.nvmlDeviceGetMigMode);
    case NvmlFn::kDevicePersistenceMode: return value<nvmlEnableState_t>(q, a.nvmlDeviceGetPersistenceMode);
    case NvmlFn::kDeviceDisplayMode: return value<nvmlEnableState_t>(q, a.nvmlDeviceGetDisplayMode);
    case NvmlFn::kDeviceDisplayActive: return value<nvmlEnableState_t>(q, a.nvmlDeviceGetDisplayActive);
    case NvmlFn::kDeviceTotalEccErrors: {
      nvmlMemoryErrorType_t et{};
      nvmlEccCounterType_t ct{};
      if (!nvml_enum(q.r.arg0, NVML_MEMORY_ERROR_TYPE_COUNT, &et) ||
          !nvml_enum(q.r.arg1, NVML_ECC_COUNTER_TYPE_COUNT, &ct))
        return NVML_ERROR_INVALID_ARGUMENT;
      return value<unsigned long long>(q, a.nvmlDeviceGetTotalEccErrors, et, ct);
    }
    default: return kOtherFamily;
  }
}

// Where a GPU sits on PCI and how its link runs (guest/nvml/pci.cc).
int pci_query(const Query& q) {
  const NvmlApi& a = q.a;
  switch (q.fn) {
    case NvmlFn::kDevicePciInfo: {
      nvmlPciInfo_t p{};
      const nvmlReturn_t st = call(a.nvmlDeviceGetPciInfo_v3, q.h, &p);
      if (st != NVML_SUCCESS) return st;
      if (q.cap < sizeof(NvmlPci)) {
        q.rep->val[0] = sizeof(NvmlPci);
        return NVML_ERROR_INSUFFICIENT_SIZE;
      }
      NvmlPci w{};
      static_assert(sizeof w.bus_id_legacy <= sizeof p.busIdLegacy && sizeof w.bus_id <= sizeof p.busId);
      std::memcpy(w.bus_id_legacy, p.busIdLegacy, sizeof w.bus_id_legacy - 1);
      std::memcpy(w.bus_id, p.busId, sizeof w.bus_id - 1);
      w.domain = p.domain;
      w.bus = p.bus;
      w.device = p.device;
      w.pci_device_id = p.pciDeviceId;
      w.pci_subsystem_id = p.pciSubSystemId;
      q.out->resize(sizeof w);
      std::memcpy(q.out->data(), &w, sizeof w);
      return NVML_SUCCESS;
    }
    case NvmlFn::kDeviceCurrPcieLinkGeneration: return value<unsigned>(q, a.nvmlDeviceGetCurrPcieLinkGeneration);
    case NvmlFn::kDeviceCurrPcieLinkWidth: return value<unsigned>(q, a.nvmlDeviceGetCurrPcieLinkWidth);
    case NvmlFn::kDeviceMaxPcieLinkGeneration: return value<unsigned>(q, a.nvmlDeviceGetMaxPcieLinkGeneration);
    case NvmlFn::kDeviceMaxPcieLinkWidth: return value<unsigned>(q, a.nvmlDeviceGetMaxPcieLinkWidth);
    case NvmlFn::kDevicePcieThroughput:
      return value_of<nvmlPcieUtilCounter_t, unsigned>(q, NVML_PCIE_UTIL_COUNT, a.nvmlDeviceGetPcieThroughput);
    default: return kOtherFamily;
  }
}

// Two fields a query, in arg0 and arg1 (field id | scope id << 32; field id 0: none).
int field_values(const Query& q) {
  if (q.a.nvmlDeviceGetFieldValues == nullptr) return NVML_ERROR_FUNCTION_NOT_FOUND;
  nvmlFieldValue_t v[2] = {};
  int count = 0;
  for (const std::uint64_t arg : {q.r.arg0, q.r.arg1}) {
    const auto id = static_cast<unsigned>(arg);
    if (id == 0) break;
    v[count].fieldId = id;
    v[count].scopeId = static_cast<unsigned>(arg >> 32);
    ++count;
  }
  if (count == 0 || q.cap < count * sizeof(nvmlFieldValue_t)) return NVML_ERROR_INVALID_ARGUMENT;
  const nvmlReturn_t st = q.a.nvmlDeviceGetFieldValues(q.h, count, v);
  if (st != NVML_SUCCESS) return st;
  q.rep->val[0] = static_cast<std::uint64_t>(count);
  q.out->resize(count * sizeof(nvmlFieldValue_t));
  std::memcpy(q.out->data(), v, q.out->size());
  return NVML_SUCCESS;
}

// How busy a GPU is and what it takes: utilisation, temperatures, power,
// clocks, fans, field values (guest/nvml/performance.cc).
int performance_query(const Query& q) {
  const NvmlApi& a = q.a;
  switch (q.fn) {
    case NvmlFn::kDeviceUtilizationRates: {
      nvmlUtilization_t u{};
      const nvmlReturn_t st = call(a.nvmlDeviceGetUtilizationRates, q.h, &u);
      q.rep->val[0] = u.gpu;
      q.rep->val[1] = u.memory;
      return st;
    }
    case NvmlFn::kDeviceEncoderUtilization: return values<unsigned>(q, a.nvmlDeviceGetEncoderUtilization);
    case NvmlFn::kDeviceDecoderUtilization: return values<unsigned>(q, a.nvmlDeviceGetDecoderUtilization);
    case NvmlFn::kDeviceTemperature:
      return value_of<nvmlTemperatureSensors_t, unsigned>(q, NVML_TEMPERATURE_COUNT, a.nvmlDeviceGetTemperature);
    case NvmlFn::kDeviceTemperatureThreshold:
      return value_of<nvmlTemperatureThresholds_t, unsigned>(q, NVML_TEMPERATURE_THRESHOLD_COUNT,
                                                             a.nvmlDeviceGetTemperatureThreshold);
    case NvmlFn::kDevicePowerUsage: return value<unsigned>(q, a.nvmlDeviceGetPowerUsage);
    case NvmlFn::kDevicePowerManagementLimit: return value<unsigned>(q, a.nvmlDeviceGetPowerManagementLimit);
    case NvmlFn::kDevicePowerManagementDefaultLimit:
      return value<unsigned>(q, a.nvmlDeviceGetPowerManagementDefaultLimit);
    case NvmlFn::kDevicePowerManagementLimitConstraints:
      return values<unsigned>(q, a.nvmlDeviceGetPowerManagementLimitConstraints);
    case NvmlFn::kDeviceEnforcedPowerLimit: return value<unsigned>(q, a.nvmlDeviceGetEnforcedPowerLimit);
    case NvmlFn::kDeviceTotalEnergyConsumption:
      return value<unsigned long long>(q, a.nvmlDeviceGetTotalEnergyConsumption);
    case NvmlFn::kDeviceClockInfo: return value_of<nvmlClockType_t, unsigned>(q, NVML_CLOCK_COUNT, a.nvmlDeviceGetClockInfo);
    case NvmlFn::kDeviceMaxClockInfo:
      return value_of<nvmlClockType_t, unsigned>(q, NVML_CLOCK_COUNT, a.nvmlDeviceGetMaxClockInfo);
    case NvmlFn::kDeviceApplicationsClock:
      return value_of<nvmlClockType_t, unsigned>(q, NVML_CLOCK_COUNT, a.nvmlDeviceGetApplicationsClock);
    case NvmlFn::kDeviceDefaultApplicationsClock:
      return value_of<nvmlClockType_t, unsigned>(q, NVML_CLOCK_COUNT, a.nvmlDeviceGetDefaultApplicationsClock);
    case NvmlFn::kDeviceClock: {
      nvmlClockType_t t{};
      nvmlClockId_t id{};
      if (!nvml_enum(q.r.arg0, NVML_CLOCK_COUNT, &t) || !nvml_enum(q.r.arg1, NVML_CLOCK_ID_COUNT, &id))
        return NVML_ERROR_INVALID_ARGUMENT;
      return value<unsigned>(q, a.nvmlDeviceGetClock, t, id);
    }
    case NvmlFn::kDevicePerformanceState: {
      nvmlPstates_t v{};
      const nvmlReturn_t st = call(a.nvmlDeviceGetPerformanceState, q.h, &v);
      q.rep->val[0] = static_cast<std::uint64_t>(static_cast<std::uint32_t>(v));  // NVML_PSTATE_UNKNOWN is 32
      return st;
    }
    case NvmlFn::kDeviceFanSpeed: return value<unsigned>(q, a.nvmlDeviceGetFanSpeed);
    case NvmlFn::kDeviceFanSpeedV2:
      if (q.r.arg0 > 0xffffffffu) return NVML_ERROR_INVALID_ARGUMENT;
      return value<unsigned>(q, a.nvmlDeviceGetFanSpeed_v2, static_cast<unsigned>(q.r.arg0));
    case NvmlFn::kDeviceNumFans: return value<unsigned>(q, a.nvmlDeviceGetNumFans);
    case NvmlFn::kDeviceClocksEventReasons:
      return value<unsigned long long>(q, a.nvmlDeviceGetCurrentClocksEventReasons);
    case NvmlFn::kDeviceFieldValues: return field_values(q);
    default: return kOtherFamily;
  }
}

// Which links lead where (guest/nvml/topology.cc): only to the granted GPUs.
int topology_query(const Query& q) {
  const NvmlApi& a = q.a;
  // Another granted GPU, named by its guest index in arg0.
  auto other = [&](nvmlDevice_t* o) -> int {
    if (q.r.arg0 >= q.gpus.devices.size()) return NVML_ERROR_INVALID_ARGUMENT;
    return gpu_handle(a, q.gpus, static_cast<std::size_t>(q.r.arg0), o);
  };
  nvmlDevice_t o = nullptr;
  switch (q.fn) {
    case NvmlFn::kDeviceNvLinkState: {
      // Links past nvml.h's count go to NVML too: it answers for them as natively.
      if (q.r.arg0 > 0xFFFFFFFFu) return NVML_ERROR_INVALID_ARGUMENT;
      const auto link = static_cast<unsigned>(q.r.arg0);
      nvmlEnableState_t v{};
      const nvmlReturn_t st = call(a.nvmlDeviceGetNvLinkState, q.h, link, &v);
      if (st != NVML_SUCCESS) return st;
      // A link leads to a switch (every GPU behind it is reached the same
      // way) or to one GPU: a GPU the guest was not granted, or one NVML
      // cannot name, reads as a disabled link.
      if (v == NVML_FEATURE_ENABLED) {
        nvmlIntNvLinkDeviceType_t type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
        if (call(a.nvmlDeviceGetNvLinkRemoteDeviceType, q.h, link, &type) != NVML_SUCCESS ||
            type != NVML_NVLINK_DEVICE_TYPE_SWITCH) {
          nvmlPciInfo_t p{};
          const auto& pci = q.gpus.pci;
          const bool granted = call(a.nvmlDeviceGetNvLinkRemotePciInfo_v2, q.h, link, &p) == NVML_SUCCESS &&
                               std::find(pci.begin(), pci.end(), std::array<unsigned, 3>{p.domain, p.bus, p.device}) !=
                                   pci.end();
          if (!granted) v = NVML_FEATURE_DISABLED;
        }
      }
      q.rep->val[0] = static_cast<std::uint64_t>(v);
      return NVML_SUCCESS;
    }
    case NvmlFn::kDeviceTopologyCommonAncestor:
      if (const int st = other(&o); st != NVML_SUCCESS) return st;
      return value<nvmlGpuTopologyLevel_t>(q, a.nvmlDeviceGetTopologyCommonAncestor, o);
    case NvmlFn::kDeviceP2PStatus: {
      nvmlGpuP2PCapsIndex_t idx{};
      if (!nvml_enum(q.r.arg1, NVML_P2P_CAPS_INDEX_UNKNOWN, &idx)) return NVML_ERROR_INVALID_ARGUMENT;
      if (const int st = other(&o); st != NVML_SUCCESS) return st;
      return value<nvmlGpuP2PStatus_t>(q, a.nvmlDeviceGetP2PStatus, o, idx);
    }
    default: return kOtherFamily;
  }
}

// The tenant's own processes among NVML's: worker pid -> its guest process.
struct Own {
  std::uint32_t guest_pid;
  bool listed;
};
// This worker (process mode), or every worker of the VM's (spares serve no
// guest process yet: not listed).
std::map<std::uint32_t, Own> own_workers(const Tenant& t) {
  std::map<std::uint32_t, Own> mine;
  if (t.vm != nullptr) {  // this worker's own slot among them
    for (std::uint32_t i = 0; i < VmShared::kMaxSlots; ++i) {
      const std::int32_t w = t.vm->slot(i).worker_pid.load();
      const std::int32_t g = t.vm->slot(i).guest_pid.load();
      if (w > 0) mine[static_cast<std::uint32_t>(w)] = {static_cast<std::uint32_t>(std::max(g, 0)), g > 0};
    }
  } else {
    mine[static_cast<std::uint32_t>(::getpid())] = {t.hello_pid, true};
  }
  return mine;
}

// The guest's own processes on this GPU, from NVML's list for it (`source`:
// the compute or the MPS list), and the memory all its workers hold.
using ProcessList = decltype(NvmlApi::nvmlDeviceGetComputeRunningProcesses_v3);
int own_processes(const Query& q, ProcessList source, std::vector<NvmlProcess>* listed, std::uint64_t* used) {
  std::map<std::uint32_t, Own> mine = own_workers(q.tenant);
  if (source == nullptr) return NVML_ERROR_FUNCTION_NOT_FOUND;
  std::vector<nvmlProcessInfo_t> all;
  if (const nvmlReturn_t st = growing_list(&all, [&](nvmlProcessInfo_t* e, unsigned* n) { return source(q.h, n, e); });
      st != NVML_SUCCESS)
    return st;
  *used = 0;
  for (const auto& p : all) {
    auto it = mine.find(p.pid);
    if (it == mine.end()) {
      // Another tenant's worker, a warm worker waiting for its guest, or a
      // native process: each holds a context, so the host lists it.
      if (IVCUDA_RULE("nvml-own-processes")) continue;
      it = mine.emplace(p.pid, Own{p.pid, true}).first;  // the mutant: theirs passes for the guest's
    }
    if (p.usedGpuMemory != kNotAvailable) *used += p.usedGpuMemory;
    if (it->second.listed)
      listed->push_back({it->second.guest_pid, 0, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId});
  }
  return NVML_SUCCESS;
}

// A list answer: val[0] entries, when the guest's capacity (arg0, in entries)
// and `cap` hold them all.
template <class T>
int put_list(const Query& q, const std::vector<T>& list) {
  const std::uint64_t room = std::min<std::uint64_t>(q.r.arg0, q.cap / sizeof(T));
  q.rep->val[0] = list.size();
  if (list.size() > room) return NVML_ERROR_INSUFFICIENT_SIZE;
  q.out->resize(list.size() * sizeof(T));
  if (!list.empty()) std::memcpy(q.out->data(), list.data(), q.out->size());
  return NVML_SUCCESS;
}

// The guest's processes' utilisation samples since arg1 (a time stamp), by
// their guest pids; none of another tenant's.
int own_samples(const Query& q) {
  if (q.a.nvmlDeviceGetProcessUtilization == nullptr) return NVML_ERROR_FUNCTION_NOT_FOUND;
  const std::map<std::uint32_t, Own> mine = own_workers(q.tenant);
  std::vector<nvmlProcessUtilizationSample_t> all;
  if (const nvmlReturn_t st = growing_list(&all, [&](nvmlProcessUtilizationSample_t* e, unsigned* n) {
        return q.a.nvmlDeviceGetProcessUtilization(q.h, e, n, q.r.arg1);
      });
      st != NVML_SUCCESS)
    return st;
  std::vector<nvmlProcessUtilizationSample_t> own;
  for (const auto& sample : all) {
    const auto it = mine.find(sample.pid);
    if ((it == mine.end() || !it->second.listed) && IVCUDA_RULE("nvml-own-samples")) continue;
    // Field by field into a zeroed sample: the host's NVML leaves what it
    // likes in the 4 bytes of padding after the pid (the upper halves of host
    // addresses were seen there), and none of it is the guest's to read.
    nvmlProcessUtilizationSample_t out{};
    if (!IVCUDA_RULE("nvml-sample-padding")) out = sample;  // the mutant: the host's bytes pass
    out.pid = it == mine.end() ? sample.pid  // the mutant: another tenant's sample passes for the guest's
                               : it->second.guest_pid;
    out.timeStamp = sample.timeStamp;
    out.smUtil = sample.smUtil;
    out.memUtil = sample.memUtil;
    out.encUtil = sample.encUtil;
    out.decUtil = sample.decUtil;
    own.push_back(out);
  }
  if (own.empty()) return NVML_ERROR_NOT_FOUND;  // as NVML answers without samples
  return put_list(q, own);
}

// The guest's processes and their samples (guest/nvml/processes.cc).
int process_query(const Query& q) {
  switch (q.fn) {
    case NvmlFn::kDeviceComputeRunningProcesses:
    case NvmlFn::kDeviceGraphicsRunningProcesses:
    case NvmlFn::kDeviceMPSComputeRunningProcesses: {
      std::vector<NvmlProcess> list;
      std::uint64_t used = 0;
      // The guest has no graphics contexts: an empty list, from NVML all the same
      // (an NVML that fails answers that). MPS clients: the guest's among NVML's.
      const ProcessList source = q.fn == NvmlFn::kDeviceMPSComputeRunningProcesses
                                     ? q.a.nvmlDeviceGetMPSComputeRunningProcesses_v3
                                     : q.a.nvmlDeviceGetComputeRunningProcesses_v3;
      if (const int st = own_processes(q, source, &list, &used); st != NVML_SUCCESS) return st;
      if (q.fn == NvmlFn::kDeviceGraphicsRunningProcesses) list.clear();
      return put_list(q, list);
    }
    case NvmlFn::kDeviceProcessUtilization: return own_samples(q);
    default: return kOtherFamily;
  }
}

// The tenant's view of a GPU's memory (guest/nvml/memory.cc).
int memory_query(const Query& q) {
  const NvmlApi& a = q.a;
  switch (q.fn) {
    case NvmlFn::kDeviceMemoryInfo: {
      // Its quota as the total (never more than the GPU's, as
      // cuDeviceTotalMem answers it), what its workers hold as used.
      std::uint64_t total = 0;
      if (a.nvmlDeviceGetMemoryInfo_v2 != nullptr) {
        nvmlMemory_v2_t m{};
        m.version = nvmlMemory_v2;
        const nvmlReturn_t st = a.nvmlDeviceGetMemoryInfo_v2(q.h, &m);
        if (st != NVML_SUCCESS) return st;
        total = m.total;
      } else {
        nvmlMemory_t m{};
        const nvmlReturn_t st = call(a.nvmlDeviceGetMemoryInfo, q.h, &m);
        if (st != NVML_SUCCESS) return st;
        total = m.total;
      }
      if (q.tenant.quota.limit() != 0) total = std::min<std::uint64_t>(total, q.tenant.quota.limit());
      std::vector<NvmlProcess> ignored;
      std::uint64_t used = 0;
      if (const int st = own_processes(q, a.nvmlDeviceGetComputeRunningProcesses_v3, &ignored, &used);
          st != NVML_SUCCESS)
        return st;
      q.rep->val[0] = total;
      q.rep->val[1] = total > used ? total - used : 0;
      q.rep->val[2] = used;
      q.rep->val[3] = 0;
      return NVML_SUCCESS;
    }
    case NvmlFn::kDeviceBar1MemoryInfo: {
      nvmlBAR1Memory_t m{};
      const nvmlReturn_t st = call(a.nvmlDeviceGetBAR1MemoryInfo, q.h, &m);
      q.rep->val[0] = m.bar1Total;
      q.rep->val[1] = m.bar1Free;
      q.rep->val[2] = m.bar1Used;
      return st;
    }
    default: return kOtherFamily;
  }
}

// The device queries by family, as guest/nvml/ has them: each answers its
// own and kOtherFamily to the rest.
using Family = int (*)(const Query&);
constexpr Family kFamilies[] = {device_query, memory_query, pci_query, performance_query, process_query, topology_query};

}  // namespace

int Worker::nvml_answer(const proto::ReqNvml& r, std::uint32_t cap, proto::RepNvml* rep,
                        std::vector<std::byte>* out) {
  const auto fn = static_cast<NvmlFn>(r.fn);
  const int passthrough = nvml_passthrough_kind(r.fn);  // -1: one of NvmlFn's own
  if (passthrough < 0 &&
      (r.fn < static_cast<std::uint32_t>(NvmlFn::kInit) || r.fn >= static_cast<std::uint32_t>(NvmlFn::kCount)))
    return NVML_ERROR_INVALID_ARGUMENT;
  const bool system = passthrough >= 0 ? passthrough == 1
                                       : fn == NvmlFn::kInit || fn == NvmlFn::kSystemDriverVersion ||
                                             fn == NvmlFn::kSystemNvmlVersion || fn == NvmlFn::kSystemCudaDriverVersion ||
                                             fn == NvmlFn::kDeviceCount;
  if (system ? r.device != nvml_wire::kNoDevice : !valid_device(r.device)) return NVML_ERROR_INVALID_ARGUMENT;

  NvmlState& s = nvml_state();
  if (s.status != NVML_SUCCESS) return s.status;
  Gpus gpus{cu_, devices_, s.handles, s.pci};
  const Tenant tenant{cfg_.vm, hello_pid_, quota_};
  Query q{.r = r, .fn = fn, .cap = cap, .a = s.api, .gpus = gpus, .tenant = tenant, .rep = rep, .out = out};
  if (passthrough == 1) return nvml_passthrough(s.api, r.fn, nullptr, r.arg0, r.arg1, cap, &rep->val[0], out);
  if (system) return system_query(q);

  q.gpu = dev_index(r.device);
  if (const int st = gpu_handle(s.api, gpus, q.gpu, &q.h); st != NVML_SUCCESS) return st;
  if (passthrough == 0) return nvml_passthrough(s.api, r.fn, q.h, r.arg0, r.arg1, cap, &rep->val[0], out);
  for (const Family family : kFamilies)
    if (const int st = family(q); st != kOtherFamily) return st;
  return NVML_ERROR_INVALID_ARGUMENT;  // none: every NvmlFn has its family
}

CUresult Worker::on_Nvml(Call& c) {
  const auto r = c.req<proto::ReqNvml>();
  proto::RepNvml rep{};
  std::vector<std::byte> body;
  // Never more than the guest takes, nor than one reply record holds.
  const std::size_t room = c.ch.cpl.max_payload() > 4096 + sizeof rep ? c.ch.cpl.max_payload() - 4096 - sizeof rep : 0;
  const auto cap = static_cast<std::uint32_t>(std::min<std::size_t>(r.out_cap, room));
  rep.ret = nvml_answer(r, cap, &rep, &body);
  if (rep.ret != NVML_SUCCESS || body.size() > cap) body.clear();
  rep.out_len = static_cast<std::uint32_t>(body.size());
  c.set_reply(rep);
  if (!body.empty()) c.append(body.data(), body.size());
  return CUDA_SUCCESS;
}

}  // namespace ivcuda::host
