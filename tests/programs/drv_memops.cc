// Stream memory operations (cuStreamWaitValue32/64, cuStreamWriteValue32/64,
// cuStreamBatchMemOp), as NCCL's proxies and PyTorch's symmetric memory use
// them: writes and waits on device memory and on page-locked memory's device
// alias, a stream held by a wait until the CPU writes the word, a batch, and
// what the driver answers for bad arguments (printed, so that the native and
// ivcuda runs are compared line by line).
//   drv_memops
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <thread>

#include "check.h"

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // what came before a crash stays in the log
  OK(cuInit(0));
  CUdevice dev;
  OK(cuDeviceGet(&dev, 0));
  CUcontext ctx = nullptr;
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  int ops = 0, ops64 = 0;
  OK(cuDeviceGetAttribute(&ops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, dev));
  OK(cuDeviceGetAttribute(&ops64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev));
  std::printf("attributes: wait NOR %d, 64-bit %d\n", ops, ops64);
  CUstream s, t;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  OK(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING));
  CUdeviceptr d = 0;
  OK(cuMemAlloc(&d, 256));
  OK(cuMemsetD8(d, 0, 256));
  // A memset of device memory may return before it is done (CUDA's API
  // synchronization behaviour), and the non-blocking streams below do not
  // wait for the legacy stream it ran in: without this the writes below race
  // it (seen through ivcuda on the H200, where the first two were zeroed).
  OK(cuCtxSynchronize());

  // Single operations in one stream: each wait is satisfied by the write before it.
  OK(cuStreamWriteValue32(s, d, 0x1234u, 0));
  OK(cuStreamWaitValue32(s, d, 0x1234u, CU_STREAM_WAIT_VALUE_EQ));
  OK(cuStreamWriteValue64(s, d + 8, 0x1122334455667788ull, CU_STREAM_WRITE_VALUE_DEFAULT));
  OK(cuStreamWaitValue64(s, d + 8, 0x1122334455667700ull, CU_STREAM_WAIT_VALUE_GEQ));
  OK(cuStreamWriteValue32(CU_STREAM_PER_THREAD, d + 4, 42u, 0));
  OK(cuStreamSynchronize(CU_STREAM_PER_THREAD));
  // The first generation, as a program built for CUDA 11.6 resolves it: the driver answers
  // NOT_SUPPORTED unless its module enables stream memory operations (measured on the H200,
  // 2026-12-03), and ivcuda answers the same.
  {
    using Write32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
    void* fn = nullptr;
    CUdriverProcAddressQueryResult found{};
    OK(cuGetProcAddress("cuStreamWriteValue32", &fn, 11060, CU_GET_PROC_ADDRESS_DEFAULT, &found));
    EXPECT(fn != nullptr && found == CU_GET_PROC_ADDRESS_SUCCESS);
    if (fn != nullptr)
      std::printf("first generation cuStreamWriteValue32 -> %s\n",
                  check::name(reinterpret_cast<Write32>(fn)(s, d + 32, 0xabcdu, 0)));
  }

  // A batch: two writes, a wait on the first, a barrier.
  CUstreamBatchMemOpParams b[4] = {};
  b[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  b[0].writeValue.address = d + 16;
  b[0].writeValue.value = 7;
  b[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  b[1].writeValue.address = d + 24;
  b[1].writeValue.value64 = 0xfedcba9876543210ull;
  b[2].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  b[2].waitValue.address = d + 16;
  b[2].waitValue.value = 7;
  b[2].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  b[3].memoryBarrier.operation = CU_STREAM_MEM_OP_BARRIER;
  b[3].memoryBarrier.flags = CU_STREAM_MEMORY_BARRIER_TYPE_GPU;
  OK(cuStreamBatchMemOp(s, 4, b, 0));
  OK(cuStreamSynchronize(s));
  std::uint32_t w32[8] = {};
  OK(cuMemcpyDtoH(w32, d, sizeof w32));
  std::uint64_t w64a = 0, w64b = 0;
  OK(cuMemcpyDtoH(&w64a, d + 8, 8));
  OK(cuMemcpyDtoH(&w64b, d + 24, 8));
  std::printf("written: 0x%x %u 0x%" PRIx64 " %u 0x%" PRIx64 "\n", w32[0], w32[1], w64a, w32[4], w64b);
  EXPECT(w32[0] == 0x1234u && w32[1] == 42u && w64a == 0x1122334455667788ull && w32[4] == 7 &&
         w64b == 0xfedcba9876543210ull);

  // Page-locked memory's device alias: the GPU writes a word the CPU reads,
  // and a stream waits until the CPU writes one.
  void* host = nullptr;
  OK(cuMemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
  auto* words = static_cast<volatile std::uint32_t*>(host);
  words[0] = 0;
  words[1] = 0;
  CUdeviceptr hd = 0;
  OK(cuMemHostGetDevicePointer(&hd, host, 0));
  OK(cuStreamWriteValue32(t, hd, 0xabcdu, 0));
  OK(cuStreamSynchronize(t));
  std::printf("GPU wrote page-locked word: 0x%x\n", words[0]);
  EXPECT(words[0] == 0xabcdu);
  // No call between the wait and the CPU's write needs the stream's worker:
  // the held write's target is read from the CPU too.
  words[2] = 0;
  OK(cuStreamWaitValue32(t, hd + 4, 5, CU_STREAM_WAIT_VALUE_GEQ));
  OK(cuStreamWriteValue32(t, hd + 8, 99, 0));  // held until the wait is satisfied
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::uint32_t early = words[2];
  words[1] = 5;
  OK(cuStreamSynchronize(t));
  const std::uint32_t late = words[2];
  std::printf("held by the wait: before the CPU's write %u, after %u\n", early, late);
  EXPECT(early == 0 && late == 99);

  // Bad arguments: the driver's answers.
  std::uint32_t on_stack = 0;
  std::printf("write to a host stack address: %s\n",
              check::name(cuStreamWriteValue32(s, reinterpret_cast<CUdeviceptr>(&on_stack), 1, 0)));
  std::printf("wait on address 0x10: %s\n", check::name(cuStreamWaitValue32(s, 0x10, 1, 0)));
  std::printf("batch of 0: %s\n", check::name(cuStreamBatchMemOp(s, 0, b, 0)));
  OK(cuStreamSynchronize(s));

  OK(cuMemFreeHost(host));
  OK(cuMemFree(d));
  OK(cuStreamDestroy(s));
  OK(cuStreamDestroy(t));
  OK(cuDevicePrimaryCtxRelease(dev));
  return check::finish("drv_memops");
}
