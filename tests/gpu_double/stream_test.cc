// Streams and events: real objects with flags and priorities, real timestamps.
#include <chrono>
#include <thread>

#include "test_support.h"

using namespace ivcuda::gpu_double::test;

TEST_CASE("streams keep their flags and clamped priorities", "[gpu_double][stream]") {
  ScopedContext ctx;
  CUstream s = nullptr, hi = nullptr, lo = nullptr;
  CU_REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CU_REQUIRE(cuStreamCreateWithPriority(&hi, 0, -100));
  CU_REQUIRE(cuStreamCreateWithPriority(&lo, 0, 7));
  unsigned flags = 99;
  int prio = 99;
  CU_REQUIRE(cuStreamGetFlags(s, &flags));
  CHECK(flags == CU_STREAM_NON_BLOCKING);
  CU_REQUIRE(cuStreamGetPriority(hi, &prio));
  CHECK(prio == -5);
  CU_REQUIRE(cuStreamGetPriority(lo, &prio));
  CHECK(prio == 0);
  CUcontext owner = nullptr;
  CU_REQUIRE(cuStreamGetCtx(s, &owner));
  CHECK(owner == ctx.get());
  unsigned long long id1 = 0, id2 = 0;
  CU_REQUIRE(cuStreamGetId(hi, &id1));
  CU_REQUIRE(cuStreamGetId(lo, &id2));
  CHECK(id1 != id2);

  CU_REQUIRE(cuStreamQuery(s));
  CU_REQUIRE(cuStreamSynchronize(s));
  CU_REQUIRE(cuStreamQuery(nullptr));
  CU_REQUIRE(cuStreamSynchronize(CU_STREAM_LEGACY));
  CU_REQUIRE(cuStreamSynchronize(CU_STREAM_PER_THREAD));

  CU_REQUIRE(cuStreamDestroy(s));
  CU_REQUIRE_ERR(cuStreamCreate(&s, 2), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuStreamCreate(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuStreamDestroy(hi));
  CU_REQUIRE(cuStreamDestroy(lo));
}

TEST_CASE("events time what happens between their records", "[gpu_double][stream]") {
  ScopedContext ctx;
  CUstream s = nullptr;
  CU_REQUIRE(cuStreamCreate(&s, 0));
  CUevent start = nullptr, stop = nullptr;
  CU_REQUIRE(cuEventCreate(&start, CU_EVENT_DEFAULT));
  CU_REQUIRE(cuEventCreate(&stop, CU_EVENT_BLOCKING_SYNC));

  float ms = -1;
  CU_REQUIRE_ERR(cuEventElapsedTime(&ms, start, stop), CUDA_ERROR_INVALID_HANDLE);  // unrecorded
  CU_REQUIRE(cuEventQuery(start));  // nothing pending: complete

  CU_REQUIRE(cuEventRecord(start, s));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CU_REQUIRE(cuEventRecord(stop, s));
  CU_REQUIRE(cuEventSynchronize(stop));
  CU_REQUIRE(cuEventQuery(stop));
  CU_REQUIRE(cuEventElapsedTime(&ms, start, stop));
  CHECK(ms >= 19.0f);
  CHECK(ms < 5000.0f);
  CU_REQUIRE(cuEventElapsedTime(&ms, stop, start));
  CHECK(ms <= -19.0f);

  CU_REQUIRE(cuStreamWaitEvent(s, stop, 0));
  CU_REQUIRE(cuStreamWaitEvent(nullptr, stop, 0));
  CU_REQUIRE_ERR(cuStreamWaitEvent(s, stop, 0x10), CUDA_ERROR_INVALID_VALUE);

  CUevent untimed = nullptr;
  CU_REQUIRE(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));
  CU_REQUIRE(cuEventRecord(untimed, nullptr));
  CU_REQUIRE_ERR(cuEventElapsedTime(&ms, start, untimed), CUDA_ERROR_INVALID_HANDLE);
  CU_REQUIRE_ERR(cuEventElapsedTime(nullptr, start, stop), CUDA_ERROR_INVALID_HANDLE);  // sic

  CUevent bad = nullptr;
  CU_REQUIRE_ERR(cuEventCreate(&bad, CU_EVENT_INTERPROCESS), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuEventCreate(&bad, 0x40), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuEventRecordWithFlags(start, s, CU_EVENT_RECORD_DEFAULT));
  CU_REQUIRE_ERR(cuEventRecordWithFlags(start, s, 0x8), CUDA_ERROR_INVALID_VALUE);
  // EXTERNAL only while the stream captures
  CU_REQUIRE_ERR(cuEventRecordWithFlags(start, s, CU_EVENT_RECORD_EXTERNAL), CUDA_ERROR_ILLEGAL_STATE);

  CU_REQUIRE(cuEventDestroy(untimed));
  CU_REQUIRE(cuEventDestroy(start));
  CU_REQUIRE(cuEventDestroy(stop));
  CU_REQUIRE(cuStreamDestroy(s));
}

TEST_CASE("streams and events belong to their context", "[gpu_double][stream]") {
  ScopedContext outer;
  CUstream s = nullptr;
  CU_REQUIRE(cuStreamCreate(&s, 0));
  CUevent e = nullptr;
  CU_REQUIRE(cuEventCreate(&e, 0));
  CUcontext other = nullptr;
  CU_REQUIRE(cuCtxCreate(&other, nullptr, 0, 0));
  CUevent foreign = nullptr;
  CU_REQUIRE(cuEventCreate(&foreign, 0));
  CU_REQUIRE_ERR(cuEventRecord(foreign, s), CUDA_ERROR_INVALID_HANDLE);
  // Copies, unlike events, may name a stream of another context (the real driver agrees).
  CUdeviceptr p = 0;
  CU_REQUIRE(cuMemAlloc(&p, 16));
  int v = 5;
  CU_REQUIRE(cuMemcpyHtoDAsync(p, &v, sizeof v, s));
  CU_REQUIRE(cuStreamSynchronize(s));
  CU_REQUIRE(cuCtxDestroy(other));
  CU_REQUIRE(cuEventRecord(e, s));
}

TEST_CASE("an allocation during a global capture is refused unless the thread is relaxed",
          "[gpu_double][stream][capture]") {
  ScopedContext ctx;
  CUstream s = nullptr;
  CU_REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d = 0;
  CUgraph g = nullptr;

  SECTION("a relaxed thread may allocate while its global capture runs") {
    CU_REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    CU_REQUIRE(cuThreadExchangeStreamCaptureMode(&m));
    CHECK(m == CU_STREAM_CAPTURE_MODE_GLOBAL);
    CU_REQUIRE(cuMemAlloc(&d, 4096));
    CU_REQUIRE(cuThreadExchangeStreamCaptureMode(&m));
    CHECK(m == CU_STREAM_CAPTURE_MODE_RELAXED);
    CU_REQUIRE(cuStreamEndCapture(s, &g));
    CHECK(g != nullptr);
    CU_REQUIRE(cuGraphDestroy(g));
    CU_REQUIRE(cuMemFree(d));
  }
  SECTION("in the default mode the allocation is refused and the capture invalidated") {
    CU_REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CU_REQUIRE_ERR(cuMemAlloc(&d, 4096), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CU_REQUIRE_ERR(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(g == nullptr);
  }
  SECTION("a capture begun relaxed does not restrict its thread") {
    CU_REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CU_REQUIRE(cuMemAlloc(&d, 4096));
    CU_REQUIRE(cuStreamEndCapture(s, &g));
    CU_REQUIRE(cuGraphDestroy(g));
    CU_REQUIRE(cuMemFree(d));
  }
  CU_REQUIRE(cuStreamDestroy(s));
}
