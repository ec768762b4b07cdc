// Stale and made-up handles. The real driver may crash on these; the double must answer
// with an error instead, so that a forwarding bug shows up as a failed call, not a crash.
#include <cstdint>
#include <vector>

#include "test_support.h"

using namespace ivcuda::gpu_double::test;

namespace {
template <class T>
T made_up(std::uintptr_t v) {
  return reinterpret_cast<T>(v);
}
}  // namespace

TEST_CASE("stale and made-up handles are rejected, never dereferenced",
          "[gpu_double][double_only][handles]") {
  ScopedContext ctx;

  CUcontext c = nullptr;
  CU_REQUIRE(cuCtxCreate(&c, nullptr, 0, 0));
  CU_REQUIRE(cuCtxDestroy(c));
  CU_REQUIRE_ERR(cuCtxDestroy(c), CUDA_ERROR_INVALID_CONTEXT);
  CU_REQUIRE_ERR(cuCtxSetCurrent(c), CUDA_ERROR_INVALID_CONTEXT);
  CU_REQUIRE_ERR(cuCtxSetCurrent(made_up<CUcontext>(0xdead0)), CUDA_ERROR_INVALID_CONTEXT);
  CU_REQUIRE_ERR(cuCtxSynchronize_v2(made_up<CUcontext>(0xbad0)), CUDA_ERROR_INVALID_CONTEXT);
  CU_REQUIRE(cuCtxSetCurrent(ctx.get()));

  CUstream s = nullptr;
  CU_REQUIRE(cuStreamCreate(&s, 0));
  CU_REQUIRE(cuStreamDestroy(s));
  CU_REQUIRE_ERR(cuStreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);
  CU_REQUIRE_ERR(cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
  CU_REQUIRE_ERR(cuStreamSynchronize(made_up<CUstream>(0x4321)), CUDA_ERROR_INVALID_HANDLE);
  CUdeviceptr d = 0;
  CU_REQUIRE(cuMemAlloc(&d, 16));
  int v = 0;
  CU_REQUIRE_ERR(cuMemcpyHtoDAsync(d, &v, sizeof v, s), CUDA_ERROR_INVALID_HANDLE);
  CU_REQUIRE_ERR(cuMemsetD8Async(d, 0, 16, made_up<CUstream>(0x5150)), CUDA_ERROR_INVALID_HANDLE);

  CUevent e = nullptr;
  CU_REQUIRE(cuEventCreate(&e, 0));
  CU_REQUIRE(cuEventDestroy(e));
  CU_REQUIRE_ERR(cuEventDestroy(e), CUDA_ERROR_INVALID_HANDLE);
  CU_REQUIRE_ERR(cuEventRecord(e, nullptr), CUDA_ERROR_INVALID_HANDLE);
  CU_REQUIRE_ERR(cuEventQuery(e), CUDA_ERROR_INVALID_HANDLE);
  CU_REQUIRE_ERR(cuStreamWaitEvent(nullptr, made_up<CUevent>(0x777), 0), CUDA_ERROR_INVALID_HANDLE);

  CUmodule m = nullptr;
  CU_REQUIRE(cuModuleLoadData(&m,
                              ".version 9.0\n.target sm_90\n.address_size 64\n"
                              ".global .align 4 .u32 g;\n"
                              ".visible .entry ivc_spin_ns(.param .u64 ns)\n{\n ret;\n}\n"));
  CUfunction f = nullptr;
  CU_REQUIRE(cuModuleGetFunction(&f, m, "ivc_spin_ns"));
  CU_REQUIRE(cuModuleUnload(m));
  CU_REQUIRE_ERR(cuModuleUnload(m), CUDA_ERROR_INVALID_HANDLE);
  CUdeviceptr g = 0;
  CU_REQUIRE_ERR(cuModuleGetGlobal(&g, nullptr, m, "g"), CUDA_ERROR_INVALID_HANDLE);
  CU_REQUIRE_ERR(cuModuleGetFunction(&f, m, "ivc_spin_ns"), CUDA_ERROR_INVALID_HANDLE);
  unsigned long long ns = 0;
  void* args[] = {&ns};
  CU_REQUIRE_ERR(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr),
                 CUDA_ERROR_INVALID_HANDLE);
  int attr = 0;
  CU_REQUIRE_ERR(cuFuncGetAttribute(&attr, CU_FUNC_ATTRIBUTE_NUM_REGS, f),
                 CUDA_ERROR_INVALID_HANDLE);
  size_t off = 0;
  CU_REQUIRE_ERR(cuFuncGetParamInfo(made_up<CUfunction>(0x31337), 0, &off, nullptr),
                 CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("inputs the real driver lets through are refused", "[gpu_double][double_only][handles]") {
  ScopedContext ctx;
  // Each of these succeeds on a real driver (or crashes it) by wrapping arithmetic.
  CUdeviceptr d = 0;
  CU_REQUIRE(cuMemAlloc(&d, 64));
  CU_REQUIRE_ERR(cuMemsetD32(d, 0, SIZE_MAX / 2), CUDA_ERROR_INVALID_VALUE);
  std::vector<unsigned char> host(64);
  CUDA_MEMCPY2D c{};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = host.data();
  c.srcPitch = 64;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = d;
  c.dstPitch = 64;
  c.dstY = SIZE_MAX / 2;
  c.WidthInBytes = 64;
  c.Height = 1;
  CU_REQUIRE_ERR(cuMemcpy2D(&c), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuGetErrorString(CUDA_SUCCESS, nullptr), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuGetErrorName(CUDA_SUCCESS, nullptr), CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("a function cannot be launched in a context its module was not loaded in",
          "[gpu_double][double_only][handles]") {
  ScopedContext ctx;
  CUmodule m = nullptr;
  CU_REQUIRE(cuModuleLoadData(&m,
                              ".version 9.0\n.target sm_90\n.address_size 64\n"
                              ".visible .entry ivc_spin_ns(.param .u64 ns)\n{\n ret;\n}\n"));
  CUfunction f = nullptr;
  CU_REQUIRE(cuModuleGetFunction(&f, m, "ivc_spin_ns"));
  CUcontext other = nullptr;
  CU_REQUIRE(cuCtxCreate(&other, nullptr, 0, 0));
  unsigned long long ns = 0;
  void* args[] = {&ns};
  CU_REQUIRE_ERR(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr),
                 CUDA_ERROR_INVALID_HANDLE);
  CU_REQUIRE(cuCtxDestroy(other));
  CU_REQUIRE(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
}
