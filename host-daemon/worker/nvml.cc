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

}  // namespace

#define IVCUDA_NVML_CALL(f, ...) (a.f == nullptr ? NVML_ERROR_FUNCTION_NOT_FOUND : a.f(__VA_ARGS__))

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
  const NvmlApi& a = s.api;

  // A string answer: NUL included, at most `cap` bytes.
  auto put_string = [&](nvmlReturn_t st, const char* str) -> int {
    if (st != NVML_SUCCESS) return st;
    const std::size_t n = ::strnlen(str, 255) + 1;
    if (n > cap) {
      rep->val[0] = n;
      return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    out->resize(n);
    std::memcpy(out->data(), str, n - 1);
    (*out)[n - 1] = std::byte{0};
    return NVML_SUCCESS;
  };
  char buf[256] = {};
  constexpr unsigned kBuf = sizeof buf - 1;  // always NUL-terminated

  if (passthrough == 1) return nvml_passthrough(a, r.fn, nullptr, r.arg0, r.arg1, cap, &rep->val[0], out);

  switch (fn) {
    case NvmlFn::kInit: return NVML_SUCCESS;
    case NvmlFn::kSystemDriverVersion: return put_string(IVCUDA_NVML_CALL(nvmlSystemGetDriverVersion, buf, kBuf), buf);
    case NvmlFn::kSystemNvmlVersion: return put_string(IVCUDA_NVML_CALL(nvmlSystemGetNVMLVersion, buf, kBuf), buf);
    case NvmlFn::kSystemCudaDriverVersion: {
      int v = 0;
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlSystemGetCudaDriverVersion_v2, &v);
      rep->val[0] = static_cast<std::uint64_t>(v);
      return st;
    }
    case NvmlFn::kDeviceCount: rep->val[0] = devices_.size(); return NVML_SUCCESS;
    default: break;
  }

  // A device query: the granted GPU's handle, found by the PCI address the
  // worker's driver gives it (so that NVML and CUDA mean the same GPU).
  auto handle_for = [&](std::size_t i, nvmlDevice_t* out_h) -> int {
    if (s.handles[i] == nullptr) {
      char bus[64] = {};
      if (cu_.cuDeviceGetPCIBusId(bus, sizeof bus - 1, devices_[i]) != CUDA_SUCCESS) return NVML_ERROR_UNKNOWN;
      nvmlDevice_t found = nullptr;
      const nvmlReturn_t st = a.nvmlDeviceGetHandleByPciBusId_v2(bus, &found);
      if (st != NVML_SUCCESS) return st;
      s.handles[i] = found;
    }
    *out_h = s.handles[i];
    return NVML_SUCCESS;
  };
  const std::size_t gi = dev_index(r.device);
  nvmlDevice_t h = nullptr;
  if (const int st = handle_for(gi, &h); st != NVML_SUCCESS) return st;
  if (passthrough == 0) return nvml_passthrough(a, r.fn, h, r.arg0, r.arg1, cap, &rep->val[0], out);
  // Another granted GPU, named by its guest index in arg0 (topology, P2P).
  auto other = [&](nvmlDevice_t* o) -> int {
    if (r.arg0 >= devices_.size()) return NVML_ERROR_INVALID_ARGUMENT;
    return handle_for(static_cast<std::size_t>(r.arg0), o);
  };
  // The guest's own processes on this GPU, from NVML's list for it: this
  // worker's (process mode), or every worker of the VM's (spares, which
  // serve no guest process yet, count in memory but are not listed).
  struct Own {
    std::uint32_t guest_pid;
    bool listed;
  };
  // worker pid -> its guest process: this worker (process mode), or every
  // worker of the VM's (spares serve no guest process yet: not listed).
  auto own_workers = [&] {
    std::map<std::uint32_t, Own> mine;
    if (cfg_.vm != nullptr) {  // this worker's own slot among them
      for (std::uint32_t i = 0; i < VmShared::kMaxSlots; ++i) {
        const std::int32_t w = cfg_.vm->slot(i).worker_pid.load();
        const std::int32_t g = cfg_.vm->slot(i).guest_pid.load();
        if (w > 0) mine[static_cast<std::uint32_t>(w)] = {static_cast<std::uint32_t>(std::max(g, 0)), g > 0};
      }
    } else {
      mine[static_cast<std::uint32_t>(::getpid())] = {hello_pid_, true};
    }
    return mine;
  };
  // The guest's own processes on this GPU, from NVML's list for it (`source`:
  // the compute or the MPS list).
  using ProcessList = decltype(a.nvmlDeviceGetComputeRunningProcesses_v3);
  auto own_processes = [&](std::vector<NvmlProcess>* listed, std::uint64_t* used,
                           ProcessList source) -> int {
    std::map<std::uint32_t, Own> mine = own_workers();
    if (source == nullptr) return NVML_ERROR_FUNCTION_NOT_FOUND;
    std::vector<nvmlProcessInfo_t> all;
    if (const nvmlReturn_t st = growing_list(&all, [&](nvmlProcessInfo_t* e, unsigned* n) { return source(h, n, e); });
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
  };

  switch (fn) {
    case NvmlFn::kDeviceName: return put_string(IVCUDA_NVML_CALL(nvmlDeviceGetName, h, buf, kBuf), buf);
    case NvmlFn::kDeviceUuid: {
      CUuuid u{};
      if (cu_.cuDeviceGetUuid(&u, devices_[gi]) != CUDA_SUCCESS) return NVML_ERROR_UNKNOWN;
      return put_string(NVML_SUCCESS, uuid_string(u).c_str());
    }
    case NvmlFn::kDeviceSerial: return put_string(IVCUDA_NVML_CALL(nvmlDeviceGetSerial, h, buf, kBuf), buf);
    case NvmlFn::kDeviceBoardPartNumber:
      return put_string(IVCUDA_NVML_CALL(nvmlDeviceGetBoardPartNumber, h, buf, kBuf), buf);
    case NvmlFn::kDeviceVbiosVersion: return put_string(IVCUDA_NVML_CALL(nvmlDeviceGetVbiosVersion, h, buf, kBuf), buf);
    case NvmlFn::kDeviceInforomImageVersion:
      return put_string(IVCUDA_NVML_CALL(nvmlDeviceGetInforomImageVersion, h, buf, kBuf), buf);
    case NvmlFn::kDevicePciInfo: {
      nvmlPciInfo_t p{};
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetPciInfo_v3, h, &p);
      if (st != NVML_SUCCESS) return st;
      if (cap < sizeof(NvmlPci)) {
        rep->val[0] = sizeof(NvmlPci);
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
      out->resize(sizeof w);
      std::memcpy(out->data(), &w, sizeof w);
      return NVML_SUCCESS;
    }
    case NvmlFn::kDeviceMinorNumber: {
      unsigned v = 0;
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetMinorNumber, h, &v);
      rep->val[0] = v;
      return st;
    }
    case NvmlFn::kDeviceArchitecture: {
      nvmlDeviceArchitecture_t v = 0;
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetArchitecture, h, &v);
      rep->val[0] = v;
      return st;
    }
    case NvmlFn::kDeviceCudaComputeCapability: {
      int major = 0, minor = 0;
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetCudaComputeCapability, h, &major, &minor);
      rep->val[0] = static_cast<std::uint64_t>(major);
      rep->val[1] = static_cast<std::uint64_t>(minor);
      return st;
    }
    case NvmlFn::kDeviceBrand: {
      nvmlBrandType_t v{};
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetBrand, h, &v);
      rep->val[0] = static_cast<std::uint64_t>(v);
      return st;
    }
    case NvmlFn::kDeviceBoardId: {
      unsigned v = 0;
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetBoardId, h, &v);
      rep->val[0] = v;
      return st;
    }
    case NvmlFn::kDeviceMultiGpuBoard: {
      unsigned v = 0;
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetMultiGpuBoard, h, &v);
      rep->val[0] = v;
      return st;
    }
    case NvmlFn::kDeviceMemoryInfo: {
      // The tenant's view: its quota as the total (never more than the
      // GPU's, as cuDeviceTotalMem answers it), what its workers hold as used.
      std::uint64_t total = 0;
      if (a.nvmlDeviceGetMemoryInfo_v2 != nullptr) {
        nvmlMemory_v2_t m{};
        m.version = nvmlMemory_v2;
        const nvmlReturn_t st = a.nvmlDeviceGetMemoryInfo_v2(h, &m);
        if (st != NVML_SUCCESS) return st;
        total = m.total;
      } else {
        nvmlMemory_t m{};
        const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetMemoryInfo, h, &m);
        if (st != NVML_SUCCESS) return st;
        total = m.total;
      }
      if (quota_.limit() != 0) total = std::min<std::uint64_t>(total, quota_.limit());
      std::vector<NvmlProcess> ignored;
      std::uint64_t used = 0;
      if (const int st = own_processes(&ignored, &used, a.nvmlDeviceGetComputeRunningProcesses_v3); st != NVML_SUCCESS) return st;
      rep->val[0] = total;
      rep->val[1] = total > used ? total - used : 0;
      rep->val[2] = used;
      rep->val[3] = 0;
      return NVML_SUCCESS;
    }
    case NvmlFn::kDeviceBar1MemoryInfo: {
      nvmlBAR1Memory_t m{};
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetBAR1MemoryInfo, h, &m);
      rep->val[0] = m.bar1Total;
      rep->val[1] = m.bar1Free;
      rep->val[2] = m.bar1Used;
      return st;
    }
    case NvmlFn::kDeviceUtilizationRates: {
      nvmlUtilization_t u{};
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetUtilizationRates, h, &u);
      rep->val[0] = u.gpu;
      rep->val[1] = u.memory;
      return st;
    }
    case NvmlFn::kDeviceEncoderUtilization:
    case NvmlFn::kDeviceDecoderUtilization: {
      unsigned util = 0, period = 0;
      const nvmlReturn_t st = fn == NvmlFn::kDeviceEncoderUtilization
                                  ? IVCUDA_NVML_CALL(nvmlDeviceGetEncoderUtilization, h, &util, &period)
                                  : IVCUDA_NVML_CALL(nvmlDeviceGetDecoderUtilization, h, &util, &period);
      rep->val[0] = util;
      rep->val[1] = period;
      return st;
    }
    case NvmlFn::kDeviceTemperature: {
      nvmlTemperatureSensors_t sensor{};
      if (!nvml_enum(r.arg0, NVML_TEMPERATURE_COUNT, &sensor)) return NVML_ERROR_INVALID_ARGUMENT;
      unsigned v = 0;
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetTemperature, h, sensor, &v);
      rep->val[0] = v;
      return st;
    }
    case NvmlFn::kDeviceTemperatureThreshold: {
      nvmlTemperatureThresholds_t t{};
      if (!nvml_enum(r.arg0, NVML_TEMPERATURE_THRESHOLD_COUNT, &t)) return NVML_ERROR_INVALID_ARGUMENT;
      unsigned v = 0;
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetTemperatureThreshold, h, t, &v);
      rep->val[0] = v;
      return st;
    }
    case NvmlFn::kDevicePowerUsage:
    case NvmlFn::kDevicePowerManagementLimit:
    case NvmlFn::kDevicePowerManagementDefaultLimit:
    case NvmlFn::kDeviceEnforcedPowerLimit:
    case NvmlFn::kDeviceNumFans:
    case NvmlFn::kDeviceFanSpeed:
    case NvmlFn::kDeviceCurrPcieLinkGeneration:
    case NvmlFn::kDeviceCurrPcieLinkWidth:
    case NvmlFn::kDeviceMaxPcieLinkGeneration:
    case NvmlFn::kDeviceMaxPcieLinkWidth: {
      unsigned v = 0;
      nvmlReturn_t st = NVML_ERROR_UNKNOWN;
      switch (fn) {
        case NvmlFn::kDevicePowerUsage: st = IVCUDA_NVML_CALL(nvmlDeviceGetPowerUsage, h, &v); break;
        case NvmlFn::kDevicePowerManagementLimit: st = IVCUDA_NVML_CALL(nvmlDeviceGetPowerManagementLimit, h, &v); break;
        case NvmlFn::kDevicePowerManagementDefaultLimit:
          st = IVCUDA_NVML_CALL(nvmlDeviceGetPowerManagementDefaultLimit, h, &v);
          break;
        case NvmlFn::kDeviceEnforcedPowerLimit: st = IVCUDA_NVML_CALL(nvmlDeviceGetEnforcedPowerLimit, h, &v); break;
        case NvmlFn::kDeviceNumFans: st = IVCUDA_NVML_CALL(nvmlDeviceGetNumFans, h, &v); break;
        case NvmlFn::kDeviceFanSpeed: st = IVCUDA_NVML_CALL(nvmlDeviceGetFanSpeed, h, &v); break;
        case NvmlFn::kDeviceCurrPcieLinkGeneration:
          st = IVCUDA_NVML_CALL(nvmlDeviceGetCurrPcieLinkGeneration, h, &v);
          break;
        case NvmlFn::kDeviceCurrPcieLinkWidth: st = IVCUDA_NVML_CALL(nvmlDeviceGetCurrPcieLinkWidth, h, &v); break;
        case NvmlFn::kDeviceMaxPcieLinkGeneration:
          st = IVCUDA_NVML_CALL(nvmlDeviceGetMaxPcieLinkGeneration, h, &v);
          break;
        default: st = IVCUDA_NVML_CALL(nvmlDeviceGetMaxPcieLinkWidth, h, &v); break;
      }
      rep->val[0] = v;
      return st;
    }
    case NvmlFn::kDevicePowerManagementLimitConstraints: {
      unsigned lo = 0, hi = 0;
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetPowerManagementLimitConstraints, h, &lo, &hi);
      rep->val[0] = lo;
      rep->val[1] = hi;
      return st;
    }
    case NvmlFn::kDeviceTotalEnergyConsumption: {
      unsigned long long v = 0;
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetTotalEnergyConsumption, h, &v);
      rep->val[0] = v;
      return st;
    }
    case NvmlFn::kDeviceClockInfo:
    case NvmlFn::kDeviceMaxClockInfo:
    case NvmlFn::kDeviceApplicationsClock:
    case NvmlFn::kDeviceDefaultApplicationsClock: {
      nvmlClockType_t t{};
      if (!nvml_enum(r.arg0, NVML_CLOCK_COUNT, &t)) return NVML_ERROR_INVALID_ARGUMENT;
      unsigned v = 0;
      nvmlReturn_t st = NVML_ERROR_UNKNOWN;
      switch (fn) {
        case NvmlFn::kDeviceClockInfo: st = IVCUDA_NVML_CALL(nvmlDeviceGetClockInfo, h, t, &v); break;
        case NvmlFn::kDeviceMaxClockInfo: st = IVCUDA_NVML_CALL(nvmlDeviceGetMaxClockInfo, h, t, &v); break;
        case NvmlFn::kDeviceApplicationsClock: st = IVCUDA_NVML_CALL(nvmlDeviceGetApplicationsClock, h, t, &v); break;
        default: st = IVCUDA_NVML_CALL(nvmlDeviceGetDefaultApplicationsClock, h, t, &v); break;
      }
      rep->val[0] = v;
      return st;
    }
    case NvmlFn::kDeviceClock: {
      nvmlClockType_t t{};
      nvmlClockId_t id{};
      if (!nvml_enum(r.arg0, NVML_CLOCK_COUNT, &t) || !nvml_enum(r.arg1, NVML_CLOCK_ID_COUNT, &id))
        return NVML_ERROR_INVALID_ARGUMENT;
      unsigned v = 0;
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetClock, h, t, id, &v);
      rep->val[0] = v;
      return st;
    }
    case NvmlFn::kDevicePerformanceState: {
      nvmlPstates_t v{};
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetPerformanceState, h, &v);
      rep->val[0] = static_cast<std::uint64_t>(static_cast<std::uint32_t>(v));  // NVML_PSTATE_UNKNOWN is 32
      return st;
    }
    case NvmlFn::kDeviceFanSpeedV2: {
      if (r.arg0 > 0xffffffffu) return NVML_ERROR_INVALID_ARGUMENT;
      unsigned v = 0;
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetFanSpeed_v2, h, static_cast<unsigned>(r.arg0), &v);
      rep->val[0] = v;
      return st;
    }
    case NvmlFn::kDeviceEccMode: {
      nvmlEnableState_t cur{}, pend{};
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetEccMode, h, &cur, &pend);
      rep->val[0] = static_cast<std::uint64_t>(cur);
      rep->val[1] = static_cast<std::uint64_t>(pend);
      return st;
    }
    case NvmlFn::kDeviceComputeMode: {
      nvmlComputeMode_t v{};
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetComputeMode, h, &v);
      rep->val[0] = static_cast<std::uint64_t>(v);
      return st;
    }
    case NvmlFn::kDeviceMigMode: {
      unsigned cur = 0, pend = 0;
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetMigMode, h, &cur, &pend);
      rep->val[0] = cur;
      rep->val[1] = pend;
      return st;
    }
    case NvmlFn::kDevicePersistenceMode:
    case NvmlFn::kDeviceDisplayMode:
    case NvmlFn::kDeviceDisplayActive: {
      nvmlEnableState_t v{};
      const nvmlReturn_t st = fn == NvmlFn::kDevicePersistenceMode ? IVCUDA_NVML_CALL(nvmlDeviceGetPersistenceMode, h, &v)
                              : fn == NvmlFn::kDeviceDisplayMode   ? IVCUDA_NVML_CALL(nvmlDeviceGetDisplayMode, h, &v)
                                                                   : IVCUDA_NVML_CALL(nvmlDeviceGetDisplayActive, h, &v);
      rep->val[0] = static_cast<std::uint64_t>(v);
      return st;
    }
    case NvmlFn::kDevicePcieThroughput: {
      nvmlPcieUtilCounter_t t{};
      if (!nvml_enum(r.arg0, NVML_PCIE_UTIL_COUNT, &t)) return NVML_ERROR_INVALID_ARGUMENT;
      unsigned v = 0;
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetPcieThroughput, h, t, &v);
      rep->val[0] = v;
      return st;
    }
    case NvmlFn::kDeviceClocksEventReasons: {
      unsigned long long v = 0;
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetCurrentClocksEventReasons, h, &v);
      rep->val[0] = v;
      return st;
    }
    case NvmlFn::kDeviceComputeRunningProcesses:
    case NvmlFn::kDeviceGraphicsRunningProcesses:
    case NvmlFn::kDeviceMPSComputeRunningProcesses: {
      std::vector<NvmlProcess> list;
      std::uint64_t used = 0;
      // The guest has no graphics contexts: an empty list, from NVML all the same
      // (an NVML that fails answers that). MPS clients: the guest's among NVML's.
      const ProcessList source = fn == NvmlFn::kDeviceMPSComputeRunningProcesses
                                     ? a.nvmlDeviceGetMPSComputeRunningProcesses_v3
                                     : a.nvmlDeviceGetComputeRunningProcesses_v3;
      if (const int st = own_processes(&list, &used, source); st != NVML_SUCCESS) return st;
      if (fn == NvmlFn::kDeviceGraphicsRunningProcesses) list.clear();
      const std::uint64_t room = std::min<std::uint64_t>(r.arg0, cap / sizeof(NvmlProcess));
      rep->val[0] = list.size();
      if (list.size() > room) return NVML_ERROR_INSUFFICIENT_SIZE;
      out->resize(list.size() * sizeof(NvmlProcess));
      if (!list.empty()) std::memcpy(out->data(), list.data(), out->size());
      return NVML_SUCCESS;
    }
    case NvmlFn::kDeviceProcessUtilization: {  // arg0: capacity, arg1: last seen time stamp
      if (a.nvmlDeviceGetProcessUtilization == nullptr) return NVML_ERROR_FUNCTION_NOT_FOUND;
      const std::map<std::uint32_t, Own> mine = own_workers();
      std::vector<nvmlProcessUtilizationSample_t> all;
      if (const nvmlReturn_t st = growing_list(&all, [&](nvmlProcessUtilizationSample_t* e, unsigned* n) {
            return a.nvmlDeviceGetProcessUtilization(h, e, n, r.arg1);
          });
          st != NVML_SUCCESS)
        return st;
      // The guest's processes' samples, by their guest pids; none of another tenant's.
      std::vector<nvmlProcessUtilizationSample_t> own;
      for (auto sample : all) {
        const auto it = mine.find(sample.pid);
        if ((it == mine.end() || !it->second.listed) && IVCUDA_RULE("nvml-own-samples")) continue;
        if (it == mine.end()) {  // the mutant: another tenant's sample passes for the guest's
          own.push_back(sample);
          continue;
        }
        sample.pid = it->second.guest_pid;
        own.push_back(sample);
      }
      if (own.empty()) return NVML_ERROR_NOT_FOUND;  // as NVML answers without samples
      const std::uint64_t room = std::min<std::uint64_t>(r.arg0, cap / sizeof(nvmlProcessUtilizationSample_t));
      rep->val[0] = own.size();
      if (own.size() > room) return NVML_ERROR_INSUFFICIENT_SIZE;
      out->resize(own.size() * sizeof(nvmlProcessUtilizationSample_t));
      std::memcpy(out->data(), own.data(), out->size());
      return NVML_SUCCESS;
    }
    case NvmlFn::kDeviceFieldValues: {  // arg0, arg1: (field id, scope id) pairs; field id 0: none
      if (a.nvmlDeviceGetFieldValues == nullptr) return NVML_ERROR_FUNCTION_NOT_FOUND;
      nvmlFieldValue_t v[2] = {};
      int count = 0;
      for (const std::uint64_t arg : {r.arg0, r.arg1}) {
        const auto id = static_cast<unsigned>(arg);
        if (id == 0) break;
        v[count].fieldId = id;
        v[count].scopeId = static_cast<unsigned>(arg >> 32);
        ++count;
      }
      if (count == 0 || cap < count * sizeof(nvmlFieldValue_t)) return NVML_ERROR_INVALID_ARGUMENT;
      const nvmlReturn_t st = a.nvmlDeviceGetFieldValues(h, count, v);
      if (st != NVML_SUCCESS) return st;
      rep->val[0] = static_cast<std::uint64_t>(count);
      out->resize(count * sizeof(nvmlFieldValue_t));
      std::memcpy(out->data(), v, out->size());
      return NVML_SUCCESS;
    }
    case NvmlFn::kDeviceNvLinkState: {
      // Links past nvml.h's count go to NVML too: it answers for them as natively.
      if (r.arg0 > 0xFFFFFFFFu) return NVML_ERROR_INVALID_ARGUMENT;
      const auto link = static_cast<unsigned>(r.arg0);
      nvmlEnableState_t v{};
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetNvLinkState, h, link, &v);
      if (st != NVML_SUCCESS) return st;
      // A link leads to a switch (every GPU behind it is reached the same
      // way) or to one GPU: a GPU the guest was not granted, or one NVML
      // cannot name, reads as a disabled link.
      if (v == NVML_FEATURE_ENABLED) {
        nvmlIntNvLinkDeviceType_t type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
        if (IVCUDA_NVML_CALL(nvmlDeviceGetNvLinkRemoteDeviceType, h, link, &type) != NVML_SUCCESS ||
            type != NVML_NVLINK_DEVICE_TYPE_SWITCH) {
          nvmlPciInfo_t p{};
          const bool granted = IVCUDA_NVML_CALL(nvmlDeviceGetNvLinkRemotePciInfo_v2, h, link, &p) == NVML_SUCCESS &&
                               std::find(s.pci.begin(), s.pci.end(), std::array<unsigned, 3>{p.domain, p.bus, p.device}) !=
                                   s.pci.end();
          if (!granted) v = NVML_FEATURE_DISABLED;
        }
      }
      rep->val[0] = static_cast<std::uint64_t>(v);
      return NVML_SUCCESS;
    }
    case NvmlFn::kDeviceTopologyCommonAncestor: {
      nvmlDevice_t o = nullptr;
      if (const int st = other(&o); st != NVML_SUCCESS) return st;
      nvmlGpuTopologyLevel_t v{};
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetTopologyCommonAncestor, h, o, &v);
      rep->val[0] = static_cast<std::uint64_t>(v);
      return st;
    }
    case NvmlFn::kDeviceP2PStatus: {
      nvmlGpuP2PCapsIndex_t idx{};
      if (!nvml_enum(r.arg1, NVML_P2P_CAPS_INDEX_UNKNOWN, &idx)) return NVML_ERROR_INVALID_ARGUMENT;
      nvmlDevice_t o = nullptr;
      if (const int st = other(&o); st != NVML_SUCCESS) return st;
      nvmlGpuP2PStatus_t v{};
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetP2PStatus, h, o, idx, &v);
      rep->val[0] = static_cast<std::uint64_t>(v);
      return st;
    }
    case NvmlFn::kDeviceTotalEccErrors: {
      nvmlMemoryErrorType_t et{};
      nvmlEccCounterType_t ct{};
      if (!nvml_enum(r.arg0, NVML_MEMORY_ERROR_TYPE_COUNT, &et) || !nvml_enum(r.arg1, NVML_ECC_COUNTER_TYPE_COUNT, &ct))
        return NVML_ERROR_INVALID_ARGUMENT;
      unsigned long long v = 0;
      const nvmlReturn_t st = IVCUDA_NVML_CALL(nvmlDeviceGetTotalEccErrors, h, et, ct, &v);
      rep->val[0] = v;
      return st;
    }
    default: return NVML_ERROR_INVALID_ARGUMENT;  // the system queries were answered above
  }
}

#undef IVCUDA_NVML_CALL

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
