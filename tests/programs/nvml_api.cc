// The guest's NVML (libnvidia-ml.so.1, guest/nvml) as a program sees it, in
// process mode against ivcudad (--nvml: the host's NVML, or the NVML test
// double in CI). NVML's answers are compared with the guest's own libcuda
// (name, UUID, PCI address, memory), so nothing here knows the double's
// values.
//
//   nvml_api                 every check (tests/process/run_nvml_test.sh)
//   nvml_api --same-tenant-child
//                            the same in a VM (tests/guest_vm): the second
//                            process is the same tenant, so it is listed by
//                            its guest pid and its memory counts
//   nvml_api --hold MIB      a second tenant: allocates MIB, says "ready",
//                            waits for stdin to close (its processes and
//                            memory must not show in the first one's view)
//
// Not for a real GPU's own NVML as root: it calls setters, which must be
// refused here and would not be there.
// The legacy generations by their own names too (nvmlInit, nvmlDeviceGetPciInfo v1, ...):
// programs built against old headers call them.
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <cuda.h>
#include <nvml.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <strings.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace {

int g_checks = 0, g_failures = 0;

void expect(bool ok, int line, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::fprintf(stderr, "FAIL nvml_api.cc:%d: %s\n", line, what.c_str());
  }
}
#define CHECK_TRUE(cond) expect((cond), __LINE__, #cond)
#define EXPECT_RET(call, want)                                                                              \
  do {                                                                                                      \
    const nvmlReturn_t r_ = (call);                                                                         \
    expect(r_ == (want), __LINE__,                                                                          \
           std::string(#call) + " = " + nvmlErrorString(r_) + " (" + std::to_string(r_) + "), want " #want); \
  } while (0)

constexpr unsigned long long kMiB = 1ULL << 20;

std::string uuid_string(const CUuuid& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  char s[64];
  std::snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return s;
}

int hold(unsigned mib) {
  CUdevice dev;
  CUcontext ctx;
  CUdeviceptr p;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
      cuMemAlloc(&p, mib * kMiB) != CUDA_SUCCESS)
    return 1;
  std::printf("ready\n");
  std::fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  return 0;
}

// Before nvmlInit: nothing answers but nvmlErrorString.
void before_init() {
  unsigned n = 0;
  nvmlDevice_t d = nullptr;
  EXPECT_RET(nvmlDeviceGetCount_v2(&n), NVML_ERROR_UNINITIALIZED);
  EXPECT_RET(nvmlDeviceGetHandleByIndex_v2(0, &d), NVML_ERROR_UNINITIALIZED);
  EXPECT_RET(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
  EXPECT_RET(nvmlDeviceSetPersistenceMode(d, NVML_FEATURE_ENABLED), NVML_ERROR_UNINITIALIZED);
  EXPECT_RET(nvmlDeviceGetFieldValues(d, 0, nullptr), NVML_ERROR_UNINITIALIZED);
  char buf[80];
  EXPECT_RET(nvmlSystemGetDriverVersion(buf, sizeof buf), NVML_ERROR_UNINITIALIZED);
  // Every code has its own text; an unknown one still gets one.
  const nvmlReturn_t codes[] = {NVML_SUCCESS, NVML_ERROR_UNINITIALIZED, NVML_ERROR_INVALID_ARGUMENT,
                                NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NO_PERMISSION, NVML_ERROR_INSUFFICIENT_SIZE,
                                NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_TIMEOUT, NVML_ERROR_GPU_IS_LOST,
                                NVML_ERROR_ARGUMENT_VERSION_MISMATCH, NVML_ERROR_RESET_TYPE_NOT_SUPPORTED,
                                NVML_ERROR_UNKNOWN};
  for (std::size_t i = 0; i < sizeof codes / sizeof codes[0]; ++i) {
    const char* s = nvmlErrorString(codes[i]);
    CHECK_TRUE(s != nullptr && *s != '\0');
    for (std::size_t j = 0; j < i; ++j) CHECK_TRUE(std::strcmp(s, nvmlErrorString(codes[j])) != 0);
  }
  CHECK_TRUE(std::strcmp(nvmlErrorString(NVML_ERROR_NO_PERMISSION), "Insufficient Permissions") == 0);
  CHECK_TRUE(nvmlErrorString(static_cast<nvmlReturn_t>(12345)) != nullptr);
  EXPECT_RET(nvmlInitWithFlags(0x100), NVML_ERROR_INVALID_ARGUMENT);
}

// Handles that are not this library's, and NULL pointers.
void bad_arguments(nvmlDevice_t d, unsigned count) {
  nvmlDevice_st* forged[] = {nullptr, reinterpret_cast<nvmlDevice_st*>(std::uintptr_t{0x1234}),
                             reinterpret_cast<nvmlDevice_st*>(reinterpret_cast<char*>(d) + 1)};
  char buf[96];
  nvmlMemory_t m{};
  unsigned idx = 0;
  for (nvmlDevice_t f : forged) {
    EXPECT_RET(nvmlDeviceGetName(f, buf, sizeof buf), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT_RET(nvmlDeviceGetMemoryInfo(f, &m), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT_RET(nvmlDeviceGetIndex(f, &idx), NVML_ERROR_INVALID_ARGUMENT);
  }
  nvmlDevice_t h = nullptr;
  EXPECT_RET(nvmlDeviceGetHandleByIndex_v2(count, &h), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlDeviceGetCount_v2(nullptr), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlDeviceGetHandleByIndex_v2(0, nullptr), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlDeviceGetHandleByUUID(nullptr, &h), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlDeviceGetHandleByPciBusId_v2(nullptr, &h), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlDeviceGetHandleByPciBusId_v2("not a bus id", &h), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlDeviceGetName(d, nullptr, 64), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlDeviceGetMemoryInfo(d, nullptr), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlDeviceGetMemoryInfo_v2(d, nullptr), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlDeviceGetPciInfo_v3(d, nullptr), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlDeviceGetUtilizationRates(d, nullptr), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlDeviceGetIndex(d, nullptr), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlDeviceGetComputeRunningProcesses_v3(d, nullptr, nullptr), NVML_ERROR_INVALID_ARGUMENT);
  unsigned n = 4;
  EXPECT_RET(nvmlDeviceGetComputeRunningProcesses_v3(d, &n, nullptr), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlSystemGetDriverVersion(nullptr, 80), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlDeviceGetTemperature(d, NVML_TEMPERATURE_GPU, nullptr), NVML_ERROR_INVALID_ARGUMENT);
}

// A guest administers nothing: every setter is refused in the guest.
void setters(nvmlDevice_t d) {
  nvmlReturn_t status = NVML_SUCCESS;
  EXPECT_RET(nvmlDeviceSetPersistenceMode(d, NVML_FEATURE_ENABLED), NVML_ERROR_NO_PERMISSION);
  EXPECT_RET(nvmlDeviceSetComputeMode(d, NVML_COMPUTEMODE_EXCLUSIVE_PROCESS), NVML_ERROR_NO_PERMISSION);
  EXPECT_RET(nvmlDeviceSetPowerManagementLimit(d, 100000), NVML_ERROR_NO_PERMISSION);
  EXPECT_RET(nvmlDeviceSetGpuLockedClocks(d, 1000, 1500), NVML_ERROR_NO_PERMISSION);
  EXPECT_RET(nvmlDeviceResetGpuLockedClocks(d), NVML_ERROR_NO_PERMISSION);
  EXPECT_RET(nvmlDeviceSetApplicationsClocks(d, 1000, 1500), NVML_ERROR_NO_PERMISSION);
  EXPECT_RET(nvmlDeviceResetApplicationsClocks(d), NVML_ERROR_NO_PERMISSION);
  EXPECT_RET(nvmlDeviceSetMigMode(d, NVML_DEVICE_MIG_ENABLE, &status), NVML_ERROR_NO_PERMISSION);
  EXPECT_RET(nvmlDeviceSetEccMode(d, NVML_FEATURE_DISABLED), NVML_ERROR_NO_PERMISSION);
  EXPECT_RET(nvmlDeviceClearEccErrorCounts(d, NVML_VOLATILE_ECC), NVML_ERROR_NO_PERMISSION);
  EXPECT_RET(nvmlDeviceSetAutoBoostedClocksEnabled(d, NVML_FEATURE_DISABLED), NVML_ERROR_NO_PERMISSION);
  EXPECT_RET(nvmlDeviceSetAccountingMode(d, NVML_FEATURE_ENABLED), NVML_ERROR_NO_PERMISSION);
  EXPECT_RET(nvmlDeviceModifyDrainState(nullptr, NVML_FEATURE_ENABLED), NVML_ERROR_NO_PERMISSION);
  // Queries nothing implements answer NOT_SUPPORTED (a guest is no vGPU host).
  unsigned n = 0;
  EXPECT_RET(nvmlDeviceGetCreatableVgpus(d, &n, nullptr), NVML_ERROR_NOT_SUPPORTED);
  // What a guest has none of: accounted processes (not kept for guests).
  n = 5;
  EXPECT_RET(nvmlDeviceGetAccountingPids(d, &n, nullptr), NVML_SUCCESS);
  CHECK_TRUE(n == 0);
}

void events(nvmlDevice_t d) {
  nvmlEventSet_t set = nullptr;
  EXPECT_RET(nvmlEventSetCreate(nullptr), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlEventSetCreate(&set), NVML_SUCCESS);
  unsigned long long types = ~0ULL;
  EXPECT_RET(nvmlDeviceGetSupportedEventTypes(d, &types), NVML_SUCCESS);
  CHECK_TRUE(types == 0);
  EXPECT_RET(nvmlDeviceRegisterEvents(d, nvmlEventTypeXidCriticalError, set), NVML_ERROR_NOT_SUPPORTED);
  nvmlEventData_t data{};
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_RET(nvmlEventSetWait_v2(set, &data, 50), NVML_ERROR_TIMEOUT);
  CHECK_TRUE(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(50));
  EXPECT_RET(nvmlEventSetWait_v2(set, nullptr, 0), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlEventSetWait_v2(reinterpret_cast<nvmlEventSet_t>(std::uintptr_t{0x40}), &data, 0),
             NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlEventSetFree(set), NVML_SUCCESS);
  EXPECT_RET(nvmlEventSetFree(set), NVML_ERROR_INVALID_ARGUMENT);
}

// Identity, consistent with the guest's libcuda.
void identity(unsigned i, nvmlDevice_t d) {
  CUdevice dev = 0;
  CHECK_TRUE(cuDeviceGet(&dev, static_cast<int>(i)) == CUDA_SUCCESS);
  unsigned idx = 99;
  EXPECT_RET(nvmlDeviceGetIndex(d, &idx), NVML_SUCCESS);
  CHECK_TRUE(idx == i);
  nvmlDevice_t legacy = nullptr;
  EXPECT_RET(nvmlDeviceGetHandleByIndex(i, &legacy), NVML_SUCCESS);
  CHECK_TRUE(legacy == d);

  char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE] = {}, cu_name[256] = {};
  EXPECT_RET(nvmlDeviceGetName(d, name, sizeof name), NVML_SUCCESS);
  cuDeviceGetName(cu_name, sizeof cu_name, dev);
  expect(std::strcmp(name, cu_name) == 0, __LINE__, std::string("name ") + name + " vs cuDeviceGetName " + cu_name);
  EXPECT_RET(nvmlDeviceGetName(d, name, 1), NVML_ERROR_INSUFFICIENT_SIZE);
  EXPECT_RET(nvmlDeviceGetName(d, name, static_cast<unsigned>(std::strlen(cu_name))), NVML_ERROR_INSUFFICIENT_SIZE);

  char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE] = {};
  CUuuid cu_uuid{};
  EXPECT_RET(nvmlDeviceGetUUID(d, uuid, sizeof uuid), NVML_SUCCESS);
  CHECK_TRUE(cuDeviceGetUuid_v2(&cu_uuid, dev) == CUDA_SUCCESS);
  expect(uuid_string(cu_uuid) == uuid, __LINE__, std::string("uuid ") + uuid + " vs cuDeviceGetUuid " + uuid_string(cu_uuid));
  EXPECT_RET(nvmlDeviceGetUUID(d, uuid, 5), NVML_ERROR_INSUFFICIENT_SIZE);
  EXPECT_RET(nvmlDeviceGetUUID(d, uuid, sizeof uuid), NVML_SUCCESS);
  nvmlDevice_t by = nullptr;
  EXPECT_RET(nvmlDeviceGetHandleByUUID(uuid, &by), NVML_SUCCESS);
  CHECK_TRUE(by == d);
  EXPECT_RET(nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000", &by), NVML_ERROR_NOT_FOUND);

  // PCI, three generations: v1/v2 write the legacy prefix only.
  nvmlPciInfo_t pci{};
  EXPECT_RET(nvmlDeviceGetPciInfo_v3(d, &pci), NVML_SUCCESS);
  int dom = -1, bus = -1, devno = -1;
  cuDeviceGetAttribute(&dom, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, dev);
  cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev);
  cuDeviceGetAttribute(&devno, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, dev);
  CHECK_TRUE(pci.domain == static_cast<unsigned>(dom) && pci.bus == static_cast<unsigned>(bus) &&
         pci.device == static_cast<unsigned>(devno));
  char want_bus[32];
  std::snprintf(want_bus, sizeof want_bus, "%08x:%02x:%02x.0", dom, bus, devno);
  expect(strcasecmp(pci.busId, want_bus) == 0, __LINE__, std::string("busId ") + pci.busId + ", want " + want_bus);
  nvmlPciInfo_t old;
  std::memset(&old, 0xab, sizeof old);
  EXPECT_RET(nvmlDeviceGetPciInfo(d, &old), NVML_SUCCESS);
  CHECK_TRUE(std::memcmp(&old, &pci, offsetof(nvmlPciInfo_t, busId)) == 0);
  CHECK_TRUE(static_cast<unsigned char>(old.busId[0]) == 0xab);
  std::memset(&old, 0xab, sizeof old);
  EXPECT_RET(nvmlDeviceGetPciInfo_v2(d, &old), NVML_SUCCESS);
  CHECK_TRUE(std::memcmp(&old, &pci, offsetof(nvmlPciInfo_t, busId)) == 0);
  EXPECT_RET(nvmlDeviceGetHandleByPciBusId_v2(pci.busId, &by), NVML_SUCCESS);
  CHECK_TRUE(by == d);
  EXPECT_RET(nvmlDeviceGetHandleByPciBusId(pci.busIdLegacy, &by), NVML_SUCCESS);
  CHECK_TRUE(by == d);
  char short_id[16];
  std::snprintf(short_id, sizeof short_id, "%02x:%02x.0", pci.bus, pci.device);
  EXPECT_RET(nvmlDeviceGetHandleByPciBusId_v2(short_id, &by), NVML_SUCCESS);
  CHECK_TRUE(by == d);
  EXPECT_RET(nvmlDeviceGetHandleByPciBusId_v2("0000:ff:1f.0", &by), NVML_ERROR_NOT_FOUND);

  int major = 0, minor = 0, cu_major = 0, cu_minor = 0;
  EXPECT_RET(nvmlDeviceGetCudaComputeCapability(d, &major, &minor), NVML_SUCCESS);
  cuDeviceGetAttribute(&cu_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  cuDeviceGetAttribute(&cu_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  CHECK_TRUE(major == cu_major && minor == cu_minor);
}

// The GPU's own figures: the host answers them for a granted GPU.
void figures(nvmlDevice_t d) {
  nvmlUtilization_t u{};
  unsigned v = 0, w = 0;
  EXPECT_RET(nvmlDeviceGetUtilizationRates(d, &u), NVML_SUCCESS);
  CHECK_TRUE(u.gpu <= 100 && u.memory <= 100);
  EXPECT_RET(nvmlDeviceGetTemperature(d, NVML_TEMPERATURE_GPU, &v), NVML_SUCCESS);
  nvmlTemperature_t t{};
  t.version = nvmlTemperature_v1;
  t.sensorType = NVML_TEMPERATURE_GPU;
  EXPECT_RET(nvmlDeviceGetTemperatureV(d, &t), NVML_SUCCESS);
  CHECK_TRUE(t.temperature == static_cast<int>(v));
  t.version = 0;
  EXPECT_RET(nvmlDeviceGetTemperatureV(d, &t), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
  EXPECT_RET(nvmlDeviceGetPowerUsage(d, &v), NVML_SUCCESS);
  EXPECT_RET(nvmlDeviceGetPowerManagementLimit(d, &w), NVML_SUCCESS);
  EXPECT_RET(nvmlDeviceGetPowerManagementLimitConstraints(d, &v, &w), NVML_SUCCESS);
  CHECK_TRUE(v <= w);
  EXPECT_RET(nvmlDeviceGetClockInfo(d, NVML_CLOCK_SM, &v), NVML_SUCCESS);
  EXPECT_RET(nvmlDeviceGetMaxClockInfo(d, NVML_CLOCK_MEM, &v), NVML_SUCCESS);
  nvmlPstates_t p{};
  EXPECT_RET(nvmlDeviceGetPerformanceState(d, &p), NVML_SUCCESS);
  nvmlEnableState_t cur{}, pend{};
  EXPECT_RET(nvmlDeviceGetEccMode(d, &cur, &pend), NVML_SUCCESS);
  nvmlComputeMode_t cm{};
  EXPECT_RET(nvmlDeviceGetComputeMode(d, &cm), NVML_SUCCESS);
  unsigned mig = 0, mig_pending = 0;
  const nvmlReturn_t r = nvmlDeviceGetMigMode(d, &mig, &mig_pending);
  CHECK_TRUE(r == NVML_SUCCESS || r == NVML_ERROR_NOT_SUPPORTED);
  nvmlBAR1Memory_t bar1{};
  EXPECT_RET(nvmlDeviceGetBAR1MemoryInfo(d, &bar1), NVML_SUCCESS);
  CHECK_TRUE(bar1.bar1Total >= bar1.bar1Used);
  unsigned is_mig = 7;
  EXPECT_RET(nvmlDeviceIsMigDeviceHandle(d, &is_mig), NVML_SUCCESS);
  CHECK_TRUE(is_mig == 0);
}

// The pass-through queries (tools/nvml_passthrough.txt): one of each shape the
// generated code has, checked against each other and against the forwarded
// queries, so that a layout the two sides disagree on shows.
void passthrough(nvmlDevice_t d) {
  unsigned v = 0, w = 0;
  EXPECT_RET(nvmlDeviceGetPcieSpeed(d, &v), NVML_SUCCESS);
  CHECK_TRUE(v > 0);
  EXPECT_RET(nvmlDeviceGetPcieSpeed(d, nullptr), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlDeviceGetPcieSpeed(nullptr, &v), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlDeviceGetGspFirmwareMode(d, &v, &w), NVML_SUCCESS);
  CHECK_TRUE(v <= 1 && w <= 1);
  unsigned rows[4] = {~0u, ~0u, ~0u, ~0u};
  EXPECT_RET(nvmlDeviceGetRemappedRows(d, &rows[0], &rows[1], &rows[2], &rows[3]), NVML_SUCCESS);
  CHECK_TRUE(rows[2] <= 1 && rows[3] <= 1);  // pending and failure are flags

  // Two inputs, two outputs: P0's range ends at the GPU's maximum clock.
  unsigned lo = 0, hi = 0, max = 0;
  EXPECT_RET(nvmlDeviceGetMinMaxClockOfPState(d, NVML_CLOCK_GRAPHICS, NVML_PSTATE_0, &lo, &hi), NVML_SUCCESS);
  EXPECT_RET(nvmlDeviceGetMaxClockInfo(d, NVML_CLOCK_GRAPHICS, &max), NVML_SUCCESS);
  expect(lo <= hi && hi == max, __LINE__,
         "P0 " + std::to_string(lo) + "-" + std::to_string(hi) + " MHz, max clock " + std::to_string(max));

  // A versioned struct: the caller's version travels; a newer one than nvml.h's is refused.
  nvmlMarginTemperature_t m{};
  m.version = nvmlMarginTemperature_v1;
  m.marginTemperature = -999;
  EXPECT_RET(nvmlDeviceGetMarginTemperature(d, &m), NVML_SUCCESS);
  CHECK_TRUE(m.version == nvmlMarginTemperature_v1 && m.marginTemperature != -999);
  m.version = 0;
  EXPECT_RET(nvmlDeviceGetMarginTemperature(d, &m), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
  m.version = static_cast<unsigned>(sizeof m + 64) | 1u << 24;
  EXPECT_RET(nvmlDeviceGetMarginTemperature(d, &m), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);

  // Texts: the caller's length, and nvml.h's fixed size.
  char text[96];
  EXPECT_RET(nvmlDeviceGetInforomVersion(d, NVML_INFOROM_OEM, text, sizeof text), NVML_SUCCESS);
  CHECK_TRUE(std::strlen(text) > 0 && std::strlen(text) < sizeof text);
  EXPECT_RET(nvmlDeviceGetInforomVersion(d, NVML_INFOROM_OEM, text, 1), NVML_ERROR_INSUFFICIENT_SIZE);
  EXPECT_RET(nvmlDeviceGetInforomVersion(d, NVML_INFOROM_OEM, nullptr, 16), NVML_ERROR_INVALID_ARGUMENT);
  char gsp[NVML_GSP_FIRMWARE_VERSION_BUF_SIZE];
  std::memset(gsp, 'x', sizeof gsp);
  EXPECT_RET(nvmlDeviceGetGspFirmwareVersion(d, gsp), NVML_SUCCESS);
  CHECK_TRUE(std::memchr(gsp, '\0', sizeof gsp) != nullptr && gsp[0] != '\0');

  // A list of the caller's size, the rest of it left as NVML leaves it.
  unsigned long cpus[4] = {0, 0, 0, 0};
  EXPECT_RET(nvmlDeviceGetCpuAffinity(d, 4, cpus), NVML_SUCCESS);
  CHECK_TRUE((cpus[0] | cpus[1] | cpus[2] | cpus[3]) != 0);

  // A list whose size is in bytes (nvml.h's pstates): nothing written past those bytes.
  nvmlPstates_t ps[NVML_MAX_GPU_PERF_PSTATES + 1];
  for (auto& x : ps) x = static_cast<nvmlPstates_t>(7);
  EXPECT_RET(nvmlDeviceGetSupportedPerformanceStates(d, ps, NVML_MAX_GPU_PERF_PSTATES * sizeof(nvmlPstates_t)),
             NVML_SUCCESS);
  CHECK_TRUE(ps[0] != 7 && static_cast<int>(ps[NVML_MAX_GPU_PERF_PSTATES]) == 7);
  for (auto& x : ps) x = static_cast<nvmlPstates_t>(7);
  const nvmlReturn_t rp = nvmlDeviceGetSupportedPerformanceStates(d, ps, 2 * sizeof(nvmlPstates_t));
  CHECK_TRUE((rp == NVML_SUCCESS || rp == NVML_ERROR_INSUFFICIENT_SIZE) && static_cast<int>(ps[2]) == 7);

  // A list that says how many entries it holds: asked, too small, enough.
  unsigned n = 0;
  const nvmlReturn_t r = nvmlDeviceGetSupportedMemoryClocks(d, &n, nullptr);
  CHECK_TRUE((r == NVML_ERROR_INSUFFICIENT_SIZE || r == NVML_SUCCESS) && n > 0);
  std::vector<unsigned> clocks(n + 4, 0);
  unsigned small = n - 1;
  EXPECT_RET(nvmlDeviceGetSupportedMemoryClocks(d, &small, clocks.data()), NVML_ERROR_INSUFFICIENT_SIZE);
  CHECK_TRUE(small == n);
  unsigned cap = n + 4;
  EXPECT_RET(nvmlDeviceGetSupportedMemoryClocks(d, &cap, clocks.data()), NVML_SUCCESS);
  CHECK_TRUE(cap == n);
  EXPECT_RET(nvmlDeviceGetMaxClockInfo(d, NVML_CLOCK_MEM, &max), NVML_SUCCESS);
  for (unsigned k = 0; k < n; ++k)
    expect(clocks[k] > 0 && clocks[k] <= max, __LINE__,
           "memory clock " + std::to_string(clocks[k]) + " MHz, max " + std::to_string(max));
  CHECK_TRUE(clocks[n] == 0);  // nothing past the entries
  EXPECT_RET(nvmlDeviceGetSupportedMemoryClocks(d, nullptr, clocks.data()), NVML_ERROR_INVALID_ARGUMENT);

  // A list with a 64-bit input and a value out beside it: the samples after a time stamp.
  nvmlValueType_t type{};
  unsigned ns = 0;
  EXPECT_RET(nvmlDeviceGetSamples(d, NVML_GPU_UTILIZATION_SAMPLES, 0, &type, &ns, nullptr), NVML_SUCCESS);
  if (ns > 0) {
    std::vector<nvmlSample_t> samples(ns + 1);
    unsigned got = ns + 1;
    EXPECT_RET(nvmlDeviceGetSamples(d, NVML_GPU_UTILIZATION_SAMPLES, 0, &type, &got, samples.data()), NVML_SUCCESS);
    CHECK_TRUE(got >= 1 && got <= ns + 1);
    bool ordered = true;
    for (unsigned k = 1; k < got; ++k) ordered = ordered && samples[k].timeStamp >= samples[k - 1].timeStamp;
    CHECK_TRUE(ordered);
    if (got >= 2) {  // after the first one's time stamp, the first one is not returned again
      unsigned later = got;
      std::vector<nvmlSample_t> rest(got);
      const nvmlReturn_t rr = nvmlDeviceGetSamples(d, NVML_GPU_UTILIZATION_SAMPLES, samples[0].timeStamp, &type,
                                                   &later, rest.data());
      CHECK_TRUE(rr == NVML_SUCCESS && later >= 1 && rest[0].timeStamp > samples[0].timeStamp);
    }
  }

  // Never forwarded, by design (a guest is no vGPU host), and a forwarded query whatever the
  // host answers: tests/process/run_nvml_test.sh finds both in IVCUDA_LOG_UNSUPPORTED's list.
  unsigned vgpus = 0;
  EXPECT_RET(nvmlDeviceGetActiveVgpus(d, &vgpus, nullptr), NVML_ERROR_NOT_SUPPORTED);
  (void)nvmlDeviceGetFanSpeed(d, &v);

  // Field values, three of them (two queries): each with its own answer, in the caller's order.
  nvmlFieldValue_t f[3] = {};
  f[0].fieldId = NVML_FI_DEV_ECC_CURRENT;
  f[1].fieldId = NVML_FI_DEV_PCIE_REPLAY_COUNTER;
  f[2].fieldId = NVML_FI_DEV_ECC_CURRENT;
  f[2].scopeId = 0;
  EXPECT_RET(nvmlDeviceGetFieldValues(d, 3, f), NVML_SUCCESS);
  CHECK_TRUE(f[0].fieldId == NVML_FI_DEV_ECC_CURRENT && f[1].fieldId == NVML_FI_DEV_PCIE_REPLAY_COUNTER);
  CHECK_TRUE(f[0].nvmlReturn == NVML_SUCCESS && f[2].nvmlReturn == NVML_SUCCESS && f[0].timestamp > 0);
  CHECK_TRUE(f[0].value.ullVal == f[2].value.ullVal || f[0].value.uiVal == f[2].value.uiVal);
  EXPECT_RET(nvmlDeviceGetFieldValues(d, 1, nullptr), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_RET(nvmlDeviceGetFieldValues(d, 0, nullptr), NVML_SUCCESS);

  // A system query.
  EXPECT_RET(nvmlSystemGetNvlinkBwMode(&v), NVML_SUCCESS);
  EXPECT_RET(nvmlSystemGetNvlinkBwMode(nullptr), NVML_ERROR_INVALID_ARGUMENT);
}

struct Memory {
  unsigned long long total = 0, free = 0, used = 0;
};
Memory memory(nvmlDevice_t d) {
  nvmlMemory_t m{};
  EXPECT_RET(nvmlDeviceGetMemoryInfo(d, &m), NVML_SUCCESS);
  CHECK_TRUE(m.total == m.free + m.used);
  nvmlMemory_v2_t m2{};
  m2.version = 1;
  EXPECT_RET(nvmlDeviceGetMemoryInfo_v2(d, &m2), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
  m2.version = nvmlMemory_v2;
  EXPECT_RET(nvmlDeviceGetMemoryInfo_v2(d, &m2), NVML_SUCCESS);
  CHECK_TRUE(m2.total == m.total);
  return {m.total, m.free, m.used};
}

// This process's entry (v3), or none; checks the three layouts agree.
std::vector<nvmlProcessInfo_t> processes(nvmlDevice_t d) {
  unsigned n = 0;
  nvmlReturn_t r = nvmlDeviceGetComputeRunningProcesses_v3(d, &n, nullptr);
  CHECK_TRUE(r == NVML_SUCCESS || r == NVML_ERROR_INSUFFICIENT_SIZE);
  std::vector<nvmlProcessInfo_t> v(n + 2);
  unsigned cap = static_cast<unsigned>(v.size());
  EXPECT_RET(nvmlDeviceGetComputeRunningProcesses_v3(d, &cap, v.data()), NVML_SUCCESS);
  v.resize(cap);
  if (cap > 0) {
    unsigned small = cap - 1;
    std::vector<nvmlProcessInfo_t> s(cap);
    EXPECT_RET(nvmlDeviceGetComputeRunningProcesses_v3(d, &small, s.data()), NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK_TRUE(small == cap);  // the entries there are
    std::vector<nvmlProcessInfo_v1_t> v1(cap);
    unsigned n1 = cap;
    EXPECT_RET(nvmlDeviceGetComputeRunningProcesses(d, &n1, v1.data()), NVML_SUCCESS);
    CHECK_TRUE(n1 == cap);
    for (unsigned k = 0; k < n1 && k < cap; ++k) CHECK_TRUE(v1[k].pid == v[k].pid && v1[k].usedGpuMemory == v[k].usedGpuMemory);
    std::vector<nvmlProcessInfo_v2_t> v2(cap);
    unsigned n2 = cap;
    EXPECT_RET(nvmlDeviceGetComputeRunningProcesses_v2(d, &n2, v2.data()), NVML_SUCCESS);
    CHECK_TRUE(n2 == cap && v2[0].pid == v[0].pid);
  }
  unsigned g = 0;
  EXPECT_RET(nvmlDeviceGetGraphicsRunningProcesses_v3(d, &g, nullptr), NVML_SUCCESS);
  CHECK_TRUE(g == 0);
  return v;
}

const nvmlProcessInfo_t* find(const std::vector<nvmlProcessInfo_t>& v, unsigned pid) {
  for (const auto& p : v)
    if (p.pid == pid) return &p;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--hold") == 0) return hold(static_cast<unsigned>(std::stoul(argv[2])));
  const bool same_tenant = argc == 2 && std::strcmp(argv[1], "--same-tenant-child") == 0;

  before_init();
  EXPECT_RET(nvmlInit_v2(), NVML_SUCCESS);
  EXPECT_RET(nvmlInit(), NVML_SUCCESS);  // reference counted: two shutdowns follow

  unsigned count = 0;
  EXPECT_RET(nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
  int cu_count = -1;
  CHECK_TRUE(cuInit(0) == CUDA_SUCCESS && cuDeviceGetCount(&cu_count) == CUDA_SUCCESS);
  expect(count == static_cast<unsigned>(cu_count) && count > 0, __LINE__,
         "nvml count " + std::to_string(count) + " vs cuda " + std::to_string(cu_count));
  unsigned legacy_count = 0;
  EXPECT_RET(nvmlDeviceGetCount(&legacy_count), NVML_SUCCESS);
  CHECK_TRUE(legacy_count == count);

  char s[96];
  EXPECT_RET(nvmlSystemGetDriverVersion(s, sizeof s), NVML_SUCCESS);
  EXPECT_RET(nvmlSystemGetDriverVersion(s, 1), NVML_ERROR_INSUFFICIENT_SIZE);
  EXPECT_RET(nvmlSystemGetNVMLVersion(s, sizeof s), NVML_SUCCESS);
  int cuda_version = 0;
  EXPECT_RET(nvmlSystemGetCudaDriverVersion_v2(&cuda_version), NVML_SUCCESS);
  CHECK_TRUE(cuda_version >= 12000);

  nvmlDevice_t d0 = nullptr;
  if (count > 0) {
    EXPECT_RET(nvmlDeviceGetHandleByIndex_v2(0, &d0), NVML_SUCCESS);
    for (unsigned i = 0; i < count; ++i) {
      nvmlDevice_t d = nullptr;
      EXPECT_RET(nvmlDeviceGetHandleByIndex_v2(i, &d), NVML_SUCCESS);
      identity(i, d);
      figures(d);
      passthrough(d);
    }
    bad_arguments(d0, count);
    setters(d0);
    events(d0);

    // Memory and processes: the tenant's view. With a context, this process
    // is listed; what it allocates shows as used, byte for byte.
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    CHECK_TRUE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS &&
           cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    size_t cu_free = 0, cu_total = 0;
    CHECK_TRUE(cuMemGetInfo(&cu_free, &cu_total) == CUDA_SUCCESS);
    const Memory before = memory(d0);
    // NVML's total is the device's memory; cuMemGetInfo's leaves out what the
    // driver keeps for itself (614 MiB of the H200's 143771 MiB, natively as
    // through ivcuda). Under a quota both are the quota.
    expect(before.total >= cu_total && before.total - cu_total <= before.total / 50, __LINE__,
           "nvml total " + std::to_string(before.total) + " vs cuMemGetInfo total " + std::to_string(cu_total) +
               " (NVML's may be larger by the driver's reserve, at most 2 %)");
    CUdeviceptr p = 0;
    CHECK_TRUE(cuMemAlloc(&p, 64 * kMiB) == CUDA_SUCCESS);
    const Memory after = memory(d0);
    expect(after.used - before.used == 64 * kMiB, __LINE__,
           "used grew by " + std::to_string(after.used - before.used) + ", allocated 64 MiB");
    const auto procs = processes(d0);
    const nvmlProcessInfo_t* me = find(procs, static_cast<unsigned>(getpid()));
    expect(me != nullptr, __LINE__, "this process (pid " + std::to_string(getpid()) + ") is not listed");
    if (me != nullptr) CHECK_TRUE(me->usedGpuMemory >= 64 * kMiB);

    // A second process holding 100 MiB. In process mode it is another
    // tenant: not in this one's processes, not in its memory used. In a VM
    // it is this tenant: listed by its guest pid, its memory counted.
    int to_child[2], from_child[2];
    if (pipe(to_child) == 0 && pipe(from_child) == 0) {
      posix_spawn_file_actions_t fa;
      posix_spawn_file_actions_init(&fa);
      posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
      posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
      posix_spawn_file_actions_addclose(&fa, to_child[1]);
      posix_spawn_file_actions_addclose(&fa, from_child[0]);
      char hold_arg[] = "--hold", mib[] = "100";
      char* args[] = {argv[0], hold_arg, mib, nullptr};
      pid_t child = 0;
      CHECK_TRUE(posix_spawn(&child, "/proc/self/exe", &fa, nullptr, args, environ) == 0);
      posix_spawn_file_actions_destroy(&fa);
      close(to_child[0]);
      close(from_child[1]);
      char ready[16] = {};
      const ssize_t got = read(from_child[0], ready, sizeof ready - 1);
      expect(got > 0 && std::strncmp(ready, "ready", 5) == 0, __LINE__, "the second tenant did not start");
      const Memory with_other = memory(d0);
      const auto seen = processes(d0);
      if (same_tenant) {
        expect(with_other.used >= after.used + 100 * kMiB, __LINE__,
               "the VM's other process's memory is missing: used " + std::to_string(with_other.used) + " vs " +
                   std::to_string(after.used));
        const nvmlProcessInfo_t* other = find(seen, static_cast<unsigned>(child));
        expect(other != nullptr && other->usedGpuMemory >= 100 * kMiB, __LINE__,
               "the VM's other process (pid " + std::to_string(child) + ") is not listed with its 100 MiB");
      } else {
        expect(with_other.used == after.used, __LINE__,
               "the other tenant's memory shows: used " + std::to_string(with_other.used) + " vs " +
                   std::to_string(after.used));
        CHECK_TRUE(find(seen, static_cast<unsigned>(child)) == nullptr);
      }
      CHECK_TRUE(find(seen, static_cast<unsigned>(getpid())) != nullptr);
      close(to_child[1]);
      int st = 0;
      waitpid(child, &st, 0);
      CHECK_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
      close(from_child[0]);
    }
    cuMemFree(p);
    cuDevicePrimaryCtxRelease(dev);
  }

  EXPECT_RET(nvmlShutdown(), NVML_SUCCESS);
  EXPECT_RET(nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);  // one nvmlInit still holds
  EXPECT_RET(nvmlShutdown(), NVML_SUCCESS);
  EXPECT_RET(nvmlDeviceGetCount_v2(&count), NVML_ERROR_UNINITIALIZED);
  EXPECT_RET(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
  std::printf("nvml_api: %d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
