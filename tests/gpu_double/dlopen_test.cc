// The double loaded the way ivcudad loads a driver: dlopen by path, functions by their
// exported (versioned) names. Run by CTest with IVCUDA_GPU_DOUBLE_DEVICES=3.
#include <cuda.h>
#include <dlfcn.h>

#include <catch2/catch.hpp>

#include "tests/skip.h"
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace {

void* library() {
  static void* lib = dlopen(IVCUDA_GPU_DOUBLE_PATH, RTLD_NOW | RTLD_LOCAL);
  return lib;
}

template <class Fn>
Fn* sym(const char* name) {
  void* lib = library();
  REQUIRE(lib != nullptr);
  void* p = dlsym(lib, name);
  INFO("symbol " << name);
  REQUIRE(p != nullptr);
  return reinterpret_cast<Fn*>(p);
}

}  // namespace

TEST_CASE("the double exports the CUDA 13 ABI names", "[gpu_double][dlopen]") {
  INFO(dlerror());
  REQUIRE(library() != nullptr);
  for (const char* name : {"cuInit",
                           "cuDriverGetVersion",
                           "cuDeviceTotalMem_v2",
                           "cuCtxCreate_v4",
                           "cuCtxDestroy_v2",
                           "cuCtxSynchronize",
                           "cuCtxSynchronize_v2",
                           "cuMemAlloc_v2",
                           "cuMemFree_v2",
                           "cuMemcpyHtoD_v2",
                           "cuMemcpyDtoHAsync_v2",
                           "cuMemcpy2D_v2",
                           "cuMemsetD32_v2",
                           "cuMemHostRegister_v2",
                           "cuMemHostGetDevicePointer_v2",
                           "cuModuleGetGlobal_v2",
                           "cuStreamDestroy_v2",
                           "cuEventDestroy_v2",
                           "cuEventElapsedTime_v2",
                           "cuEventElapsedTime",
                           "cuDevicePrimaryCtxRelease_v2",
                           "cuDevicePrimaryCtxReset_v2",
                           "cuDeviceGetUuid_v2",
                           "cuLaunchKernel",
                           "cuFuncGetParamInfo",
                           "cuGetErrorName"}) {
    INFO(name);
    CHECK(dlsym(library(), name) != nullptr);
  }
  // Internal helpers stay hidden.
  CHECK(dlsym(library(), "_ZN6ivcuda10gpu_double5stateEv") == nullptr);
}

TEST_CASE("IVCUDA_GPU_DOUBLE_DEVICES sets the device count, each device distinct",
          "[gpu_double][dlopen]") {
  const char* env = std::getenv("IVCUDA_GPU_DOUBLE_DEVICES");
  if (env == nullptr || std::string(env) != "3") {
    IVCUDA_SKIP("run through CTest, which sets IVCUDA_GPU_DOUBLE_DEVICES=3");
  }
  REQUIRE(sym<decltype(cuInit)>("cuInit")(0) == CUDA_SUCCESS);
  int n = 0;
  REQUIRE(sym<decltype(cuDeviceGetCount)>("cuDeviceGetCount")(&n) == CUDA_SUCCESS);
  REQUIRE(n == 3);
  auto get_uuid = sym<decltype(cuDeviceGetUuid_v2)>("cuDeviceGetUuid_v2");
  auto get_bus = sym<decltype(cuDeviceGetPCIBusId)>("cuDeviceGetPCIBusId");
  std::set<std::string> uuids, buses;
  for (int d = 0; d < n; ++d) {
    CUuuid u{};
    REQUIRE(get_uuid(&u, d) == CUDA_SUCCESS);
    uuids.emplace(u.bytes, sizeof u.bytes);
    char bus[32];
    REQUIRE(get_bus(bus, sizeof bus, d) == CUDA_SUCCESS);
    buses.emplace(bus);
  }
  CHECK(uuids.size() == 3);
  CHECK(buses.size() == 3);

  // Allocate on the last device and round-trip a value, all through dlsym'd entry points.
  CUcontext ctx = nullptr;
  REQUIRE(sym<decltype(cuCtxCreate_v4)>("cuCtxCreate_v4")(&ctx, nullptr, 0, 2) == CUDA_SUCCESS);
  CUdevice dev = -1;
  REQUIRE(sym<decltype(cuCtxGetDevice)>("cuCtxGetDevice")(&dev) == CUDA_SUCCESS);
  CHECK(dev == 2);
  CUdeviceptr p = 0;
  REQUIRE(sym<decltype(cuMemAlloc_v2)>("cuMemAlloc_v2")(&p, 8) == CUDA_SUCCESS);
  const unsigned long long in = 0x1122334455667788ull;
  unsigned long long out = 0;
  REQUIRE(sym<decltype(cuMemcpyHtoD_v2)>("cuMemcpyHtoD_v2")(p, &in, 8) == CUDA_SUCCESS);
  REQUIRE(sym<decltype(cuMemcpyDtoH_v2)>("cuMemcpyDtoH_v2")(&out, p, 8) == CUDA_SUCCESS);
  CHECK(out == in);
  REQUIRE(sym<decltype(cuMemFree_v2)>("cuMemFree_v2")(p) == CUDA_SUCCESS);
  REQUIRE(sym<decltype(cuCtxDestroy_v2)>("cuCtxDestroy_v2")(ctx) == CUDA_SUCCESS);
}
