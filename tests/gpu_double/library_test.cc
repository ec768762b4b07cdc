// Libraries: the context-independent loading that cudart 13 uses for its fatbins, with
// CUkernel handles accepted wherever a CUfunction is expected.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "test_support.h"

using namespace ivcuda::gpu_double::test;

namespace {

// What nvcc registers with cudart and cudart hands to cuLibraryLoadData.
struct FatbinWrapper {
  uint32_t magic;
  uint32_t version;
  const void* data;
  const void* unused;
};

CUlibrary load_library(const FatbinWrapper& wrapper) {
  CUlibraryOption opt = CU_LIBRARY_BINARY_IS_PRESERVED;
  void* one = reinterpret_cast<void*>(uintptr_t{1});
  CUlibrary lib = nullptr;
  CU_REQUIRE(cuLibraryLoadData(&lib, &wrapper, nullptr, nullptr, 0, &opt, &one, 1));
  return lib;
}

float read_float(CUdeviceptr p) {
  float f = 0;
  CU_REQUIRE(cuMemcpyDtoH(&f, p, sizeof f));
  return f;
}

}  // namespace

TEST_CASE("a library loads as cudart loads it and launches through CUkernel handles",
          "[gpu_double][library]") {
  ScopedContext ctx;
  const std::string fatbin = kernels_fatbin();
  REQUIRE_KERNELS(fatbin);
  const FatbinWrapper wrapper{0x466243B1u, 1, fatbin.data(), nullptr};
  CUlibrary lib = load_library(wrapper);

  unsigned count = 0;
  CU_REQUIRE(cuLibraryGetKernelCount(&count, lib));
  CHECK(count == 20);  // the entries of test_kernels.cu
  std::vector<CUkernel> all(count);
  CU_REQUIRE(cuLibraryEnumerateKernels(all.data(), count, lib));

  CUkernel k = nullptr;
  CU_REQUIRE(cuLibraryGetKernel(&k, lib, "ivc_scale_struct"));
  CHECK(std::find(all.begin(), all.end(), k) != all.end());
  const char* name = nullptr;
  CU_REQUIRE(cuKernelGetName(&name, k));
  CHECK(std::string(name) == "ivc_scale_struct");
  size_t off = 0, size = 0;
  CU_REQUIRE(cuKernelGetParamInfo(k, 0, &off, &size));
  CHECK(off == 0);
  CHECK(size == 16);
  CU_REQUIRE(cuKernelGetParamInfo(k, 2, &off, &size));
  CHECK(off == 24);
  CHECK(size == 4);
  CU_REQUIRE_ERR(cuKernelGetParamInfo(k, 3, &off, &size), CUDA_ERROR_INVALID_VALUE);
  CUlibrary owner = nullptr;
  CU_REQUIRE(cuKernelGetLibrary(&owner, k));
  CHECK(owner == lib);

  CUkernel missing = nullptr;
  CU_REQUIRE_ERR(cuLibraryGetKernel(&missing, lib, "ivc_nothing"), CUDA_ERROR_NOT_FOUND);

  // A CUkernel where a CUfunction is expected, as cudart's <<<>>> does.
  CUkernel add = nullptr;
  CU_REQUIRE(cuLibraryGetKernel(&add, lib, "ivc_vec_add"));
  constexpr int kN = 300;
  std::vector<float> a(kN, 1.25f), b(kN, 2.0f), c(kN, 0.0f);
  CUdeviceptr da = 0, db = 0, dc = 0;
  CU_REQUIRE(cuMemAlloc(&da, sizeof(float) * kN));
  CU_REQUIRE(cuMemAlloc(&db, sizeof(float) * kN));
  CU_REQUIRE(cuMemAlloc(&dc, sizeof(float) * kN));
  CU_REQUIRE(cuMemcpyHtoD(da, a.data(), sizeof(float) * kN));
  CU_REQUIRE(cuMemcpyHtoD(db, b.data(), sizeof(float) * kN));
  int n = kN;
  void* args[] = {&da, &db, &dc, &n};
  CU_REQUIRE(cuLaunchKernel(reinterpret_cast<CUfunction>(add), 3, 1, 1, 128, 1, 1, 0, nullptr, args,
                            nullptr));
  CU_REQUIRE(cuMemcpyDtoH(c.data(), dc, sizeof(float) * kN));
  for (int i = 0; i < kN; ++i) REQUIRE(c[i] == 3.25f);

  CUfunction f = nullptr;
  CU_REQUIRE(cuKernelGetFunction(&f, add));
  CU_REQUIRE(cuFuncGetName(&name, f));
  CHECK(std::string(name) == "ivc_vec_add");
  int threads = 0;
  CU_REQUIRE(cuKernelGetAttribute(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, add, 0));
  CHECK(threads == 1024);
  CUmodule mod = nullptr;
  CU_REQUIRE(cuLibraryGetModule(&mod, lib));
  CUfunction via_module = nullptr;
  CU_REQUIRE(cuModuleGetFunction(&via_module, mod, "ivc_vec_add"));
  CHECK(via_module == f);
  CU_REQUIRE(cuLibraryUnload(lib));
}

TEST_CASE("each context gets its own copy of a library's globals", "[gpu_double][library]") {
  ScopedContext ctx;
  const std::string fatbin = kernels_fatbin();
  REQUIRE_KERNELS(fatbin);
  const FatbinWrapper wrapper{0x466243B1u, 1, fatbin.data(), nullptr};
  CUlibrary lib = load_library(wrapper);

  CUdeviceptr here = 0;
  size_t bytes = 0;
  CU_REQUIRE(cuLibraryGetGlobal(&here, &bytes, lib, "ivc_const_addend"));
  CHECK(bytes == 4);
  CHECK(read_float(here) == 1.5f);
  const float seven = 7.0f;
  CU_REQUIRE(cuMemcpyHtoD(here, &seven, sizeof seven));
  CUdeviceptr again = 0;
  CU_REQUIRE(cuLibraryGetGlobal(&again, nullptr, lib, "ivc_const_addend"));
  CHECK(again == here);

  CUcontext other = nullptr;
  CU_REQUIRE(cuCtxCreate(&other, nullptr, 0, 0));
  CUdeviceptr there = 0;
  CU_REQUIRE(cuLibraryGetGlobal(&there, nullptr, lib, "ivc_const_addend"));
  CHECK(there != here);
  CHECK(read_float(there) == 1.5f);
  CU_REQUIRE(cuCtxDestroy(other));
  CHECK(read_float(here) == 7.0f);
  CU_REQUIRE_ERR(cuLibraryGetGlobal(&there, nullptr, lib, "ivc_nothing"), CUDA_ERROR_NOT_FOUND);
  CU_REQUIRE(cuLibraryUnload(lib));
}

TEST_CASE("unloaded libraries and their kernels are gone", "[gpu_double][double_only][library]") {
  ScopedContext ctx;
  const std::string fatbin = kernels_fatbin();
  REQUIRE_KERNELS(fatbin);
  const FatbinWrapper wrapper{0x466243B1u, 1, fatbin.data(), nullptr};
  CUlibrary lib = load_library(wrapper);
  CUkernel k = nullptr;
  CU_REQUIRE(cuLibraryGetKernel(&k, lib, "ivc_fault"));
  CUdeviceptr g = 0;
  CU_REQUIRE(cuLibraryGetGlobal(&g, nullptr, lib, "ivc_launch_count"));
  CU_REQUIRE(cuLibraryUnload(lib));
  CU_REQUIRE_ERR(cuLibraryUnload(lib), CUDA_ERROR_INVALID_HANDLE);
  CU_REQUIRE_ERR(cuLibraryGetKernel(&k, lib, "ivc_fault"), CUDA_ERROR_INVALID_HANDLE);
  const char* name = nullptr;
  CU_REQUIRE_ERR(cuKernelGetName(&name, k), CUDA_ERROR_INVALID_HANDLE);
  CUdeviceptr base = 0;
  CU_REQUIRE_ERR(cuMemGetAddressRange(&base, nullptr, g), CUDA_ERROR_NOT_FOUND);
  CUlibrary bad = nullptr;
  CU_REQUIRE_ERR(cuLibraryLoadData(&bad, "garbage", nullptr, nullptr, 0, nullptr, nullptr, 0),
                 CUDA_ERROR_INVALID_IMAGE);
}
