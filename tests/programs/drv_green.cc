// Green contexts as PyTorch's and FlashInfer's use them: the device's SMs,
// split into groups, a descriptor, green contexts on two groups, their
// converted contexts current, streams made both ways, a kernel in each green
// context checked on the CPU, events recorded and waited for through a green
// context, the stream-to-context queries, and the ends (destroy; what was
// allocated in a green context afterwards). Prints every answer, which must be
// the same natively and through ivcuda; handles are printed only as relations
// (equal or not), never as values.
//   drv_green --ptx test_kernels.ptx [--forged]
// --forged (ivcuda only, never natively: the driver does not check its
// inputs' internals): a resource with made-up internals, a descriptor of no
// resources, a descriptor and a green context that were never made, all refused.
#include <cuda.h>

#include <vector>

#include "check.h"

namespace {

const char* yes(bool b) { return b ? "yes" : "no"; }

void print_sm(const char* what, CUresult st, const CUdevResource& r) {
  if (st != CUDA_SUCCESS) {
    std::printf("%s: %s\n", what, check::name(st));
    return;
  }
  std::printf("%s: type %d, %u SMs, min partition %u, co-scheduled alignment %u\n", what, static_cast<int>(r.type),
              r.sm.smCount, r.sm.minSmPartitionSize, r.sm.smCoscheduledAlignment);
}

// Fills n words in stream s with v (ivc_fill_u32) and checks them on the CPU.
void fill_and_check(const char* what, CUfunction fill, CUstream s, unsigned v) {
  const unsigned long long n = 1 << 16;
  CUdeviceptr d = 0;
  OK(cuMemAlloc(&d, n * 4));
  void* args[] = {&d, &v, const_cast<unsigned long long*>(&n)};
  OK(cuLaunchKernel(fill, 256, 1, 1, 256, 1, 1, 0, s, args, nullptr));
  OK(cuStreamSynchronize(s));
  std::vector<unsigned> back(n, 0);
  OK(cuMemcpyDtoH(back.data(), d, n * 4));
  unsigned wrong = 0;
  for (unsigned x : back) wrong += x != v ? 1 : 0;
  EXPECT(wrong == 0);
  std::printf("%s: %llu words filled, %u wrong\n", what, n, wrong);
  OK(cuMemFree(d));
}

void forged(CUdevice dev, const CUdevResource& good) {
  CUdevResource bad = good;
  bad._internal_padding[0] ^= 0x5a;
  bad._internal_padding[40] ^= 0xa5;
  CUdevResource out[2];
  unsigned n = 2;
  EXPECT_RES(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, cuDevSmResourceSplitByCount(out, &n, &bad, nullptr, 0, 8));
  CUdevResourceDesc desc = nullptr;
  EXPECT_RES(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, cuDevResourceGenerateDesc(&desc, &bad, 1));
  // (Natively a descriptor of no resources is a segmentation fault in the driver.)
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuDevResourceGenerateDesc(&desc, &bad, 0));
  CUgreenCtx g = nullptr;
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE,
             cuGreenCtxCreate(&g, reinterpret_cast<CUdevResourceDesc>(0x1234), dev, CU_GREEN_CTX_DEFAULT_STREAM));
  CUcontext c = nullptr;
  EXPECT_RES(CUDA_ERROR_INVALID_CONTEXT, cuCtxFromGreenCtx(&c, reinterpret_cast<CUgreenCtx>(0x1234)));
  EXPECT_RES(CUDA_ERROR_INVALID_CONTEXT, cuGreenCtxDestroy(reinterpret_cast<CUgreenCtx>(0x1234)));
  std::printf("forged resources, descriptors and green contexts refused\n");
}

}  // namespace

int main(int argc, char** argv) {
  const char* ptx_path = check::arg(argc, argv, "--ptx");
  if (ptx_path == nullptr) {
    std::fprintf(stderr, "usage: drv_green --ptx FILE [--forged]\n");
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each answer out before the next call
  OK(cuInit(0));
  CUdevice dev;
  OK(cuDeviceGet(&dev, 0));
  // The primary context active first, as cuda.h advises and PyTorch does.
  CUcontext primary = nullptr;
  OK(cuDevicePrimaryCtxRetain(&primary, dev));
  OK(cuCtxSetCurrent(primary));
  const std::string ptx = check::read_file(ptx_path);
  CUmodule mod = nullptr;
  OK(cuModuleLoadData(&mod, ptx.c_str()));
  CUfunction fill = nullptr;
  OK(cuModuleGetFunction(&fill, mod, "ivc_fill_u32"));
  int sms = 0;
  OK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));

  // The starting sets.
  CUdevResource whole{}, ctx_res{};
  CUresult st = cuDeviceGetDevResource(dev, &whole, CU_DEV_RESOURCE_TYPE_SM);
  print_sm("device resource", st, whole);
  EXPECT(st == CUDA_SUCCESS && static_cast<int>(whole.sm.smCount) == sms);
  print_sm("primary context resource", cuCtxGetDevResource(primary, &ctx_res, CU_DEV_RESOURCE_TYPE_SM), ctx_res);
  CUdevResource none{};
  std::printf("device resource of type INVALID: %s\n",
              check::name(cuDeviceGetDevResource(dev, &none, CU_DEV_RESOURCE_TYPE_INVALID)));
  std::printf("device resource into NULL: %s\n",
              check::name(cuDeviceGetDevResource(dev, nullptr, CU_DEV_RESOURCE_TYPE_SM)));
  if (st != CUDA_SUCCESS) return check::finish("drv_green");

  // Splits: how many, then two groups of 16 SMs and the rest.
  unsigned n = 0;
  OK(cuDevSmResourceSplitByCount(nullptr, &n, &whole, nullptr, 0, 16));
  std::printf("groups of 16 SMs possible: %u\n", n);
  unsigned n8 = 0;
  OK(cuDevSmResourceSplitByCount(nullptr, &n8, &whole, nullptr, 0, 8));
  std::printf("groups of 8 SMs possible: %u\n", n8);
  unsigned n_fine = 0;
  OK(cuDevSmResourceSplitByCount(nullptr, &n_fine, &whole, nullptr, CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING, 2));
  std::printf("groups of 2 SMs possible, co-scheduling ignored: %u\n", n_fine);
  CUdevResource groups[2]{}, rest{};
  unsigned two = 2;
  OK(cuDevSmResourceSplitByCount(groups, &two, &whole, &rest, 0, 16));
  std::printf("split into %u groups\n", two);
  print_sm("  group 0", CUDA_SUCCESS, groups[0]);
  print_sm("  group 1", CUDA_SUCCESS, groups[1]);
  print_sm("  the rest", CUDA_SUCCESS, rest);
  EXPECT(two == 2 && groups[0].sm.smCount >= 16 && groups[0].sm.smCount + groups[1].sm.smCount + rest.sm.smCount ==
                                                       whole.sm.smCount);
  unsigned again = 1;
  CUdevResource sub{};
  std::printf("a group split again: %s\n",
              check::name(cuDevSmResourceSplitByCount(&sub, &again, &groups[0], nullptr, 0, 8)));
  unsigned too_many = 1;
  std::printf("minimum above the SM count: %s\n",
              check::name(cuDevSmResourceSplitByCount(&sub, &too_many, &whole, nullptr, 0, whole.sm.smCount + 8)));

  // Descriptors and green contexts.
  CUdevResourceDesc d0 = nullptr, d1 = nullptr, both = nullptr;
  OK(cuDevResourceGenerateDesc(&d0, &groups[0], 1));
  OK(cuDevResourceGenerateDesc(&d1, &groups[1], 1));
  OK(cuDevResourceGenerateDesc(&both, groups, 2));
  CUgreenCtx g0 = nullptr, g1 = nullptr, gx = nullptr;
  std::printf("green context without the default-stream flag: %s\n", check::name(cuGreenCtxCreate(&gx, d0, dev, 0)));
  OK(cuGreenCtxCreate(&g0, d0, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  OK(cuGreenCtxCreate(&g1, d1, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  CUcontext cur = nullptr;
  OK(cuCtxGetCurrent(&cur));
  std::printf("creating them left the primary context current: %s\n", yes(cur == primary));
  CUdevResource g0_res{};
  st = cuGreenCtxGetDevResource(g0, &g0_res, CU_DEV_RESOURCE_TYPE_SM);
  print_sm("green context 0's resource", st, g0_res);
  EXPECT(st == CUDA_SUCCESS && g0_res.sm.smCount == groups[0].sm.smCount);
  unsigned long long id0 = 0, id1 = 0;
  OK(cuGreenCtxGetId(g0, &id0));
  OK(cuGreenCtxGetId(g1, &id1));
  std::printf("green context ids distinct and non-zero: %s\n", yes(id0 != 0 && id1 != 0 && id0 != id1));
  CUcontext c0 = nullptr, c0b = nullptr, c1 = nullptr;
  OK(cuCtxFromGreenCtx(&c0, g0));
  OK(cuCtxFromGreenCtx(&c0b, g0));
  OK(cuCtxFromGreenCtx(&c1, g1));
  std::printf("converted context: the same each time %s, the primary %s, the other green's %s\n", yes(c0 == c0b),
              yes(c0 == primary), yes(c0 == c1));
  CUdevResource c0_res{};
  print_sm("converted context 0's resource", cuCtxGetDevResource(c0, &c0_res, CU_DEV_RESOURCE_TYPE_SM), c0_res);
  CUdevice cdev = -1;
  OK(cuCtxGetDevice_v2(&cdev, c0));
  std::printf("converted context's device: %d\n", cdev);

  // Streams: made for a green context, and made while its context is current.
  CUstream s0 = nullptr, s1 = nullptr, sx = nullptr, plain = nullptr;
  std::printf("green stream without NON_BLOCKING: %s\n", check::name(cuGreenCtxStreamCreate(&sx, g0, 0, 0)));
  if (sx != nullptr) cuStreamDestroy(sx);
  OK(cuGreenCtxStreamCreate(&s0, g0, CU_STREAM_NON_BLOCKING, 0));
  OK(cuStreamCreate(&plain, CU_STREAM_NON_BLOCKING));
  OK(cuCtxPushCurrent(c1));
  OK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  CUgreenCtx of_null = nullptr;
  OK(cuStreamGetGreenCtx(nullptr, &of_null));
  std::printf("with green context 1's context current, the null stream's green context is it: %s\n",
              yes(of_null == g1));
  CUcontext v2_ctx = nullptr;
  CUgreenCtx v2_green = nullptr;
  OK(cuStreamGetCtx_v2(nullptr, &v2_ctx, &v2_green));
  std::printf("  cuStreamGetCtx_v2 of the null stream: context is the primary %s, green context 1 %s\n",
              yes(v2_ctx == primary), yes(v2_green == g1));
  std::printf("  cuStreamGetCtx_v2 of the per-thread stream: %s\n",
              check::name(cuStreamGetCtx_v2(CU_STREAM_PER_THREAD, &v2_ctx, &v2_green)));
  std::printf("  cuStreamGetGreenCtx of the per-thread stream: %s\n",
              check::name(cuStreamGetGreenCtx(CU_STREAM_PER_THREAD, &of_null)));
  std::printf("  cuStreamGetCtx_v2 of the null stream, no outputs: %s\n",
              check::name(cuStreamGetCtx_v2(nullptr, nullptr, nullptr)));
  unsigned long long id_current = 0;
  const CUresult id_st = cuGreenCtxGetId(nullptr, &id_current);
  std::printf("  cuGreenCtxGetId of no green context: %s, green context 1's id %s\n", check::name(id_st),
              yes(id_current == id1));
  fill_and_check("a kernel on the null stream of green context 1", fill, nullptr, 0x1111u);
  CUdeviceptr kept = 0;  // allocated in green context 1, freed after it is gone
  OK(cuMemAlloc(&kept, 1 << 20));
  OK(cuCtxSynchronize());
  CUcontext popped = nullptr;
  OK(cuCtxPopCurrent(&popped));
  std::printf("popped green context 1's context: %s\n", yes(popped == c1));

  CUgreenCtx sg = nullptr;
  OK(cuStreamGetGreenCtx(s0, &sg));
  std::printf("stream made for green context 0 is green context 0's: %s\n", yes(sg == g0));
  OK(cuStreamGetGreenCtx(s1, &sg));
  std::printf("stream made with green context 1's context current is green context 1's: %s\n", yes(sg == g1));
  OK(cuStreamGetGreenCtx(plain, &sg));
  std::printf("a plain stream's green context is none: %s\n", yes(sg == nullptr));
  CUcontext sc = nullptr;
  OK(cuStreamGetCtx(s0, &sc));
  std::printf("cuStreamGetCtx of green context 0's stream: its converted context %s, the primary %s\n", yes(sc == c0),
              yes(sc == primary));
  OK(cuStreamGetCtx_v2(s0, &v2_ctx, &v2_green));
  std::printf("cuStreamGetCtx_v2 of it: context is the primary %s, converted %s; green context 0 %s\n",
              yes(v2_ctx == primary), yes(v2_ctx == c0), yes(v2_green == g0));
  OK(cuStreamGetCtx_v2(plain, &v2_ctx, &v2_green));
  std::printf("cuStreamGetCtx_v2 of a plain stream: the primary %s, no green context %s\n", yes(v2_ctx == primary),
              yes(v2_green == nullptr));
  CUdevice sdev = -1;
  OK(cuStreamGetDevice(s0, &sdev));
  std::printf("green stream's device: %d\n", sdev);
  unsigned flags = 0;
  OK(cuStreamGetFlags(s0, &flags));
  std::printf("green stream's flags: %u\n", flags);

  // Kernels in both green contexts' streams, from the primary context's module.
  fill_and_check("a kernel in green context 0's stream", fill, s0, 0xabcd0123u);
  fill_and_check("a kernel in green context 1's stream", fill, s1, 0x5555aaaau);

  // Events through green contexts.
  CUevent ev = nullptr;
  OK(cuEventCreate(&ev, CU_EVENT_DEFAULT));
  OK(cuGreenCtxRecordEvent(g0, ev));
  OK(cuGreenCtxWaitEvent(g1, ev));
  OK(cuEventSynchronize(ev));
  std::printf("event recorded through green context 0, waited for through green context 1: %s\n",
              check::name(cuEventQuery(ev)));
  OK(cuEventDestroy(ev));

  std::printf("cuCtxDestroy of a converted context: %s\n", check::name(cuCtxDestroy(c0)));
  if (check::flag(argc, argv, "--forged")) forged(dev, whole);

  // The ends.
  OK(cuStreamDestroy(s0));
  OK(cuStreamDestroy(s1));
  OK(cuStreamDestroy(plain));
  OK(cuGreenCtxDestroy(g0));
  OK(cuGreenCtxDestroy(g1));
  std::printf("memory allocated in green context 1, freed after it: %s\n", check::name(cuMemFree(kept)));
  fill_and_check("the primary context after both green contexts", fill, nullptr, 7u);
  OK(cuModuleUnload(mod));
  OK(cuDevicePrimaryCtxRelease(dev));
  return check::finish("drv_green");
}
