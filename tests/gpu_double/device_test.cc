// Initialisation, device identity and attributes, error strings.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "test_support.h"

using namespace ivcuda::gpu_double::test;

namespace {

// Captured during static initialisation, before any test can have called cuInit: the only
// moment in this process when the driver is provably uninitialised.
struct BeforeInit {
  CUresult count, alloc, ctx_create, version;
  int driver_version = 0;
  BeforeInit() {
    int n = 0;
    CUdeviceptr p = 0;
    CUcontext c = nullptr;
    count = cuDeviceGetCount(&n);
    alloc = cuMemAlloc(&p, 16);
    ctx_create = cuCtxCreate(&c, nullptr, 0, 0);
    version = cuDriverGetVersion(&driver_version);
  }
};
const BeforeInit g_before_init;

}  // namespace

TEST_CASE("calls before cuInit fail with NOT_INITIALIZED, except the version query",
          "[gpu_double][device]") {
  CHECK(g_before_init.count == CUDA_ERROR_NOT_INITIALIZED);
  CHECK(g_before_init.alloc == CUDA_ERROR_NOT_INITIALIZED);
  CHECK(g_before_init.ctx_create == CUDA_ERROR_NOT_INITIALIZED);
  CHECK(g_before_init.version == CUDA_SUCCESS);
  CHECK(g_before_init.driver_version == 13000);
}

TEST_CASE("cuInit takes no flags and may be called again", "[gpu_double][device]") {
  CU_REQUIRE_ERR(cuInit(1), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuInit(0));
  CU_REQUIRE(cuInit(0));
  int v = 0;
  CU_REQUIRE(cuDriverGetVersion(&v));
  CHECK(v == 13000);
  CU_REQUIRE_ERR(cuDriverGetVersion(nullptr), CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("one device by default, named and sized as the test double",
          "[gpu_double][double_only][device]") {
  CU_REQUIRE(cuInit(0));
  int n = 0;
  CU_REQUIRE(cuDeviceGetCount(&n));
  if (const char* env = std::getenv("IVCUDA_GPU_DOUBLE_DEVICES"); env == nullptr) CHECK(n == 1);
  CUdevice dev = -1;
  CU_REQUIRE(cuDeviceGet(&dev, 0));
  CHECK(dev == 0);
  CU_REQUIRE_ERR(cuDeviceGet(&dev, n), CUDA_ERROR_INVALID_DEVICE);
  CU_REQUIRE_ERR(cuDeviceGet(&dev, -1), CUDA_ERROR_INVALID_DEVICE);
  CU_REQUIRE_ERR(cuDeviceGet(nullptr, 0), CUDA_ERROR_INVALID_VALUE);

  char name[256];
  CU_REQUIRE(cuDeviceGetName(name, sizeof name, 0));
  CHECK(std::string(name) == "ivcuda GPU test double");
  char tiny[6];
  CU_REQUIRE(cuDeviceGetName(tiny, sizeof tiny, 0));
  CHECK(std::string(tiny) == "ivcud");
  CU_REQUIRE_ERR(cuDeviceGetName(name, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuDeviceGetName(name, sizeof name, n), CUDA_ERROR_INVALID_DEVICE);

  size_t total = 0;
  CU_REQUIRE(cuDeviceTotalMem(&total, 0));
  CHECK(total == (size_t{4} << 30));

  CUuuid a{}, b{};
  CU_REQUIRE(cuDeviceGetUuid(&a, 0));
  CU_REQUIRE(cuDeviceGetUuid(&b, 0));
  CHECK(std::memcmp(a.bytes, b.bytes, sizeof a.bytes) == 0);
  CHECK(std::vector<char>(a.bytes, a.bytes + 16) != std::vector<char>(16, 0));
  CU_REQUIRE_ERR(cuDeviceGetUuid(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("the PCI bus id agrees with the PCI attributes and maps back", "[gpu_double][device]") {
  CU_REQUIRE(cuInit(0));
  char bus_id[32];
  CU_REQUIRE(cuDeviceGetPCIBusId(bus_id, sizeof bus_id, 0));
  int domain = -1, bus = -1, device = -1;
  CU_REQUIRE(cuDeviceGetAttribute(&domain, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0));
  CU_REQUIRE(cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0));
  CU_REQUIRE(cuDeviceGetAttribute(&device, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0));
  char want[32];
  std::snprintf(want, sizeof want, "%04x:%02x:%02x.0", domain, bus, device);
  CHECK(std::string(bus_id) == want);
  CUdevice back = -1;
  CU_REQUIRE(cuDeviceGetByPCIBusId(&back, bus_id));
  CHECK(back == 0);
  CU_REQUIRE_ERR(cuDeviceGetByPCIBusId(&back, "0000:ff:1f.0"), CUDA_ERROR_INVALID_DEVICE);
}

TEST_CASE("every device attribute has a plausible value", "[gpu_double][device]") {
  CU_REQUIRE(cuInit(0));
  for (int a = 1; a < CU_DEVICE_ATTRIBUTE_MAX; ++a) {
    int v = -12345;
    INFO("attribute " << a);
    CU_REQUIRE(cuDeviceGetAttribute(&v, static_cast<CUdevice_attribute>(a), 0));
    CHECK(v != -12345);
  }
  auto attr = [](CUdevice_attribute a) {
    int v = 0;
    CU_REQUIRE(cuDeviceGetAttribute(&v, a, 0));
    return v;
  };
  CHECK(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) == 9);
  CHECK(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) == 0);
  CHECK(attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE) == 32);
  CHECK(attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK) == 1024);
  CHECK(attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) > 0);
  CHECK(attr(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING) == 1);
  CHECK(attr(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY) == 1);
  CHECK(attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN) >=
        attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK));
  CHECK(attr(CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED) == 1);

  int v = 0;
  CU_REQUIRE_ERR(cuDeviceGetAttribute(&v, static_cast<CUdevice_attribute>(0), 0),
                 CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuDeviceGetAttribute(nullptr, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0),
                 CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 99),
                 CUDA_ERROR_INVALID_DEVICE);
}

TEST_CASE("every error the double returns has a name and a description", "[gpu_double][device]") {
  const CUresult codes[] = {CUDA_SUCCESS,
                            CUDA_ERROR_INVALID_VALUE,
                            CUDA_ERROR_OUT_OF_MEMORY,
                            CUDA_ERROR_NOT_INITIALIZED,
                            CUDA_ERROR_NO_DEVICE,
                            CUDA_ERROR_INVALID_DEVICE,
                            CUDA_ERROR_INVALID_IMAGE,
                            CUDA_ERROR_INVALID_CONTEXT,
                            CUDA_ERROR_NO_BINARY_FOR_GPU,
                            CUDA_ERROR_INVALID_PTX,
                            CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY,
                            CUDA_ERROR_INVALID_HANDLE,
                            CUDA_ERROR_NOT_FOUND,
                            CUDA_ERROR_ILLEGAL_ADDRESS,
                            CUDA_ERROR_MISALIGNED_ADDRESS,
                            CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
                            CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
                            CUDA_ERROR_NOT_SUPPORTED,
                            CUDA_ERROR_UNKNOWN};
  for (CUresult c : codes) {
    const char* name = nullptr;
    const char* text = nullptr;
    INFO("code " << static_cast<int>(c));
    CU_REQUIRE(cuGetErrorName(c, &name));
    CU_REQUIRE(cuGetErrorString(c, &text));
    REQUIRE(name != nullptr);
    REQUIRE(text != nullptr);
    CHECK(std::string(name).rfind("CUDA_", 0) == 0);
    CHECK(std::strlen(text) > 0);
  }
  const char* name = nullptr;
  CHECK(cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &name) == CUDA_SUCCESS);
  CHECK(std::string(name) == "CUDA_ERROR_ILLEGAL_ADDRESS");
  CU_REQUIRE_ERR(cuGetErrorName(static_cast<CUresult>(12345), &name), CUDA_ERROR_INVALID_VALUE);
  CHECK(name == nullptr);
}

TEST_CASE("cuGetProcAddress picks the ABI generation by the caller's cudaVersion",
          "[gpu_double][double_only][device]") {
  CU_REQUIRE(cuInit(0));
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  CU_REQUIRE(cuGetProcAddress("cuMemAlloc", &fn, 13000, 0, &status));
  CHECK(fn == reinterpret_cast<void*>(&cuMemAlloc_v2));
  CHECK(status == CU_GET_PROC_ADDRESS_SUCCESS);
  CU_REQUIRE(cuGetProcAddress("cuCtxSynchronize", &fn, 12000, 0, &status));
  CHECK(fn == reinterpret_cast<void*>(&cuCtxSynchronize));
  CU_REQUIRE(cuGetProcAddress("cuCtxSynchronize", &fn, 13000, 0, &status));
  CHECK(fn == reinterpret_cast<void*>(&cuCtxSynchronize_v2));
  CU_REQUIRE(cuGetProcAddress("cuEventElapsedTime", &fn, 12080, 0, nullptr));
  CHECK(fn == reinterpret_cast<void*>(&cuEventElapsedTime_v2));
  CU_REQUIRE(cuGetProcAddress("cuLaunchKernel", &fn, 13000,
                              CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr));
  CHECK(fn == reinterpret_cast<void*>(&cuLaunchKernel));

  // cudart's first probe, an unknown name, and a generation older than any implemented.
  CU_REQUIRE_ERR(cuGetProcAddress("", &fn, 0, 0, &status), CUDA_ERROR_NOT_FOUND);
  CHECK(status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  CHECK(fn == nullptr);
  CU_REQUIRE_ERR(cuGetProcAddress("cuNoSuchThing", &fn, 13000, 0, &status), CUDA_ERROR_NOT_FOUND);
  CU_REQUIRE_ERR(cuGetProcAddress("cuMemAlloc", &fn, 2000, 0, &status), CUDA_ERROR_NOT_FOUND);
  CHECK(status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  CU_REQUIRE_ERR(cuGetProcAddress("cuMemAlloc", &fn, 13000, 0x80, &status),
                 CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuGetProcAddress(nullptr, &fn, 13000, 0, &status), CUDA_ERROR_INVALID_VALUE);

  // An old generation with its old signature: cuCtxCreate as cudart 13 asks for it (@3020).
  CU_REQUIRE(cuGetProcAddress("cuCtxCreate", &fn, 3020, 0, &status));
  using CtxCreateV2 = CUresult(CUcontext*, unsigned, CUdevice);
  CUcontext ctx = nullptr;
  CU_REQUIRE(reinterpret_cast<CtxCreateV2*>(fn)(&ctx, 0, 0));
  CU_REQUIRE(cuCtxDestroy(ctx));
}
