// Contexts: created, current per thread, stacked, and the reference-counted primary ones.
#include <thread>

#include "test_support.h"

using namespace ivcuda::gpu_double::test;

namespace {

CUcontext current() {
  CUcontext c = reinterpret_cast<CUcontext>(0x1);
  CU_REQUIRE(cuCtxGetCurrent(&c));
  return c;
}

}  // namespace

TEST_CASE("a created context is current to its creator only", "[gpu_double][context]") {
  ScopedContext ctx;
  CHECK(current() == ctx.get());
  CUdevice dev = -1;
  CU_REQUIRE(cuCtxGetDevice(&dev));
  CHECK(dev == 0);
  CU_REQUIRE(cuCtxSynchronize());

  CUcontext seen_by_other = reinterpret_cast<CUcontext>(0x1);
  CUresult other_sync = CUDA_SUCCESS;
  CUcontext other_created = nullptr;
  std::thread t([&] {
    cuCtxGetCurrent(&seen_by_other);
    other_sync = cuCtxSynchronize();
    // A thread of its own: its context does not leak into the creator's thread.
    if (cuCtxCreate(&other_created, nullptr, 0, 0) == CUDA_SUCCESS) cuCtxDestroy(other_created);
  });
  t.join();
  CHECK(seen_by_other == nullptr);
  CHECK(other_sync == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(other_created != nullptr);
  CHECK(other_created != ctx.get());
  CHECK(current() == ctx.get());
}

TEST_CASE("contexts can be shared between threads with cuCtxSetCurrent", "[gpu_double][context]") {
  ScopedContext ctx;
  CUdeviceptr p = 0;
  CU_REQUIRE(cuMemAlloc(&p, 64));
  CUresult copy = CUDA_ERROR_UNKNOWN;
  std::thread t([&] {
    if (cuCtxSetCurrent(ctx.get()) != CUDA_SUCCESS) return;
    const int v = 7;
    copy = cuMemcpyHtoD(p, &v, sizeof v);
  });
  t.join();
  CU_REQUIRE(copy);
  int back = 0;
  CU_REQUIRE(cuMemcpyDtoH(&back, p, sizeof back));
  CHECK(back == 7);
}

TEST_CASE("push and pop form a per-thread stack", "[gpu_double][context]") {
  ScopedContext a;
  CUcontext b = nullptr;
  CU_REQUIRE(cuCtxCreate(&b, nullptr, CU_CTX_SCHED_BLOCKING_SYNC, 0));
  CHECK(current() == b);
  unsigned flags = 0;
  CU_REQUIRE(cuCtxGetFlags(&flags));
  CHECK(flags == CU_CTX_SCHED_BLOCKING_SYNC);
  CUcontext popped = nullptr;
  CU_REQUIRE(cuCtxPopCurrent(&popped));
  CHECK(popped == b);
  CHECK(current() == a.get());
  CU_REQUIRE(cuCtxPushCurrent(b));
  CHECK(current() == b);
  CU_REQUIRE(cuCtxSetCurrent(a.get()));  // replaces the top
  CHECK(current() == a.get());
  CU_REQUIRE(cuCtxPopCurrent(nullptr));
  CHECK(current() == a.get());  // the bottom entry
  CU_REQUIRE(cuCtxDestroy(b));
  CU_REQUIRE_ERR(cuCtxPushCurrent(nullptr), CUDA_ERROR_INVALID_VALUE);

  std::thread t([] {
    CUcontext c = nullptr;
    CHECK(cuCtxPopCurrent(&c) == CUDA_ERROR_INVALID_CONTEXT);
  });
  t.join();
}

TEST_CASE("a destroyed context leaves its thread without a context", "[gpu_double][context]") {
  CU_REQUIRE(cuInit(0));
  CUcontext c = nullptr;
  CU_REQUIRE(cuCtxCreate(&c, nullptr, 0, 0));
  CUdeviceptr p = 0;
  CU_REQUIRE(cuMemAlloc(&p, 128));
  CU_REQUIRE(cuCtxDestroy(c));
  CHECK(current() == nullptr);
  CU_REQUIRE_ERR(cuMemAlloc(&p, 16), CUDA_ERROR_INVALID_CONTEXT);

  // Its memory went with it.
  ScopedContext fresh;
  CUdeviceptr base = 0;
  CU_REQUIRE_ERR(cuMemGetAddressRange(&base, nullptr, p), CUDA_ERROR_NOT_FOUND);
}

TEST_CASE("cuCtxCreate validates its arguments", "[gpu_double][context]") {
  CU_REQUIRE(cuInit(0));
  CUcontext c = nullptr;
  CU_REQUIRE_ERR(cuCtxCreate(nullptr, nullptr, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuCtxCreate(&c, nullptr, 3, 0), CUDA_ERROR_INVALID_VALUE);  // no such sched
  CU_REQUIRE_ERR(cuCtxCreate(&c, nullptr, 0x100, 0), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuCtxCreate(&c, nullptr, 0, 42), CUDA_ERROR_INVALID_DEVICE);
  CUexecAffinityParam affinity{};
  affinity.type = CU_EXEC_AFFINITY_TYPE_SM_COUNT;
  affinity.param.smCount.val = 4;
  CUctxCreateParams params{};
  params.execAffinityParams = &affinity;
  params.numExecAffinityParams = 1;
  CU_REQUIRE_ERR(cuCtxCreate(&c, &params, 0, 0), CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY);
  CUctxCreateParams empty{};
  CU_REQUIRE(cuCtxCreate(&c, &empty, 0, 0));
  CU_REQUIRE(cuCtxDestroy(c));
}

TEST_CASE("primary contexts are reference counted", "[gpu_double][context]") {
  CU_REQUIRE(cuInit(0));
  unsigned flags = 99;
  int active = -1;
  CU_REQUIRE(cuDevicePrimaryCtxGetState(0, &flags, &active));
  CHECK(active == 0);

  CUcontext p1 = nullptr, p2 = nullptr;
  CU_REQUIRE(cuDevicePrimaryCtxRetain(&p1, 0));
  CU_REQUIRE(cuDevicePrimaryCtxRetain(&p2, 0));
  CHECK(p1 == p2);
  CU_REQUIRE(cuDevicePrimaryCtxGetState(0, &flags, &active));
  CHECK(active == 1);
  CU_REQUIRE_ERR(cuCtxDestroy(p1), CUDA_ERROR_INVALID_CONTEXT);

  CU_REQUIRE(cuCtxSetCurrent(p1));
  CUdeviceptr mem = 0;
  CU_REQUIRE(cuMemAlloc(&mem, 256));
  CU_REQUIRE(cuDevicePrimaryCtxRelease(0));
  CU_REQUIRE(cuDevicePrimaryCtxGetState(0, &flags, &active));
  CHECK(active == 1);  // one reference left
  CUdeviceptr base = 0;
  CU_REQUIRE(cuMemGetAddressRange(&base, nullptr, mem));
  CU_REQUIRE(cuDevicePrimaryCtxRelease(0));
  CU_REQUIRE(cuDevicePrimaryCtxGetState(0, &flags, &active));
  CHECK(active == 0);
  CU_REQUIRE_ERR(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);

  // Current but not retained: unusable (cudart always retains before use).
  CU_REQUIRE_ERR(cuMemAlloc(&mem, 16), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  // Retained again, it starts empty: the last release freed everything.
  CU_REQUIRE(cuDevicePrimaryCtxRetain(&p1, 0));
  CU_REQUIRE_ERR(cuMemGetAddressRange(&base, nullptr, mem), CUDA_ERROR_NOT_FOUND);
  CU_REQUIRE(cuMemAlloc(&mem, 16));

  CU_REQUIRE(cuDevicePrimaryCtxSetFlags(0, CU_CTX_SCHED_SPIN));
  CU_REQUIRE(cuDevicePrimaryCtxGetState(0, &flags, &active));
  CHECK(flags == CU_CTX_SCHED_SPIN);
  CU_REQUIRE_ERR(cuDevicePrimaryCtxSetFlags(0, 0x1000), CUDA_ERROR_INVALID_VALUE);

  // A reset frees everything and deactivates, but keeps the count of retains.
  CU_REQUIRE(cuDevicePrimaryCtxReset(0));
  CU_REQUIRE(cuDevicePrimaryCtxGetState(0, &flags, &active));
  CHECK(active == 0);
  CU_REQUIRE_ERR(cuMemAlloc(&base, 16), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CU_REQUIRE(cuDevicePrimaryCtxRetain(&p1, 0));
  CU_REQUIRE_ERR(cuMemGetAddressRange(&base, nullptr, mem), CUDA_ERROR_NOT_FOUND);
  CU_REQUIRE(cuDevicePrimaryCtxRelease(0));
  CU_REQUIRE(cuDevicePrimaryCtxRelease(0));
  CU_REQUIRE_ERR(cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
  CU_REQUIRE(cuCtxSetCurrent(nullptr));

  CUcontext dummy = nullptr;
  CU_REQUIRE_ERR(cuDevicePrimaryCtxRetain(&dummy, 7), CUDA_ERROR_INVALID_DEVICE);
  CU_REQUIRE_ERR(cuDevicePrimaryCtxGetState(0, nullptr, &active), CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("stream priorities span 0 (least) to -5 (greatest)", "[gpu_double][context]") {
  ScopedContext ctx;
  int least = 1, greatest = 1;
  CU_REQUIRE(cuCtxGetStreamPriorityRange(&least, &greatest));
  CHECK(least == 0);
  CHECK(greatest == -5);
  CU_REQUIRE(cuCtxGetStreamPriorityRange(nullptr, &greatest));
}

TEST_CASE("CUDA 13 forms of cuCtxSynchronize and cuCtxGetDevice take a context",
          "[gpu_double][context]") {
  ScopedContext ctx;
  CU_REQUIRE(cuCtxSynchronize_v2(ctx.get()));
  CU_REQUIRE(cuCtxSynchronize_v2(nullptr));
  CUdevice dev = -1;
  CU_REQUIRE(cuCtxGetDevice_v2(&dev, ctx.get()));
  CHECK(dev == 0);
}
