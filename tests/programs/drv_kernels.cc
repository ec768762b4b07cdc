// Modules, kernels, streams and events: PTX JIT-compiled at load, a fatbin,
// kernels with pointer, 32/64-bit scalar and struct parameters, __constant__
// and __device__ symbols, and results checked against the CPU.
//   drv_kernels --ptx test_kernels.ptx [--fatbin test_kernels.fatbin]
#include <cmath>
#include <cstddef>
#include <fstream>
#include <iterator>
#include <string>

#include "check.h"

namespace {

struct ScaleParams {
  float scale;
  int offset;
  double bias;
};

std::vector<char> read_file(const char* path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> v((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  v.push_back('\0');
  return v;
}

void kernels(CUmodule m) {
  CUfunction add, fill, reduce, scale, addc;
  OK(cuModuleGetFunction(&add, m, "ivc_vec_add"));
  OK(cuModuleGetFunction(&fill, m, "ivc_fill_u32"));
  OK(cuModuleGetFunction(&reduce, m, "ivc_reduce_sum"));
  OK(cuModuleGetFunction(&scale, m, "ivc_scale_struct"));
  OK(cuModuleGetFunction(&addc, m, "ivc_add_const"));
  CUfunction none;
  EXPECT_RES(CUDA_ERROR_NOT_FOUND, cuModuleGetFunction(&none, m, "no_such_kernel"));
  // A function's name, module and loading state (cudaFuncGetName, lazy loading).
  const char* fname = nullptr;
  OK(cuFuncGetName(&fname, scale));
  EXPECT(fname != nullptr && std::string(fname) == "ivc_scale_struct");
  CUmodule fmod = nullptr;
  OK(cuFuncGetModule(&fmod, add));
  EXPECT(fmod == m);
  OK(cuFuncLoad(add));
  CUfunctionLoadingState loaded = CU_FUNCTION_LOADING_STATE_UNLOADED;
  OK(cuFuncIsLoaded(&loaded, add));
  std::printf("function %s: loaded after cuFuncLoad %d\n", fname != nullptr ? fname : "?",
              loaded == CU_FUNCTION_LOADING_STATE_LOADED);

  size_t off = 0, size = 0;
  OK(cuFuncGetParamInfo(scale, 0, &off, &size));
  EXPECT(off == 0 && size == sizeof(ScaleParams));
  OK(cuFuncGetParamInfo(scale, 1, &off, &size));
  EXPECT(off == 16 && size == 8);
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuFuncGetParamInfo(scale, 3, &off, &size));
  int threads = 0;
  OK(cuFuncGetAttribute(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, add));
  EXPECT(threads >= 256);
  // The attributes a function keeps for its life, five times each (cudaFuncGetAttributes asks
  // them at every call): the same answer every time (through ivcuda, one round trip each).
  for (int a = CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK; a <= CU_FUNC_ATTRIBUTE_CACHE_MODE_CA; ++a) {
    int first = -1;
    OK(cuFuncGetAttribute(&first, static_cast<CUfunction_attribute>(a), reduce));
    for (int i = 0; i < 4; ++i) {
      int again = -2;
      OK(cuFuncGetAttribute(&again, static_cast<CUfunction_attribute>(a), reduce));
      EXPECT(again == first);
    }
  }
  OK(cuFuncSetAttribute(add, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024));
  OK(cuFuncSetCacheConfig(add, CU_FUNC_CACHE_PREFER_SHARED));  // XLA sets it on every kernel
  OK(cuFuncSetCacheConfig(add, CU_FUNC_CACHE_PREFER_NONE));
  // Occupancy: more threads per block never fit more blocks per SM.
  int blocks128 = 0, blocks1024 = 0;
  OK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks128, add, 128, 0));
  OK(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks1024, add, 1024, 0, CU_OCCUPANCY_DEFAULT));
  EXPECT(blocks128 >= blocks1024 && blocks1024 >= 1);
  size_t dyn = 0;
  OK(cuOccupancyAvailableDynamicSMemPerBlock(&dyn, reduce, 1, 1024));
  EXPECT(dyn > 0);

  const int n = 100000;
  std::vector<float> a(n), b(n), c(n);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i) * 0.5f;
    b[i] = static_cast<float>(n - i);
  }
  CUdeviceptr da, db, dc, dsum;
  OK(cuMemAlloc(&da, n * 4));
  OK(cuMemAlloc(&db, n * 4));
  OK(cuMemAlloc(&dc, n * 4));
  OK(cuMemAlloc(&dsum, 4));
  OK(cuMemcpyHtoD(da, a.data(), n * 4));
  OK(cuMemcpyHtoD(db, b.data(), n * 4));
  CUstream s;
  OK(cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, 0));
  int nn = n;
  void* args[] = {&da, &db, &dc, &nn};
  OK(cuLaunchKernel(add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, s, args, nullptr));
  OK(cuStreamSynchronize(s));
  OK(cuMemcpyDtoH(c.data(), dc, n * 4));
  bool good = true;
  for (int i = 0; i < n; ++i) good &= c[i] == a[i] + b[i];
  EXPECT(good);

  // the same launch with the argument buffer passed through `extra`
  struct {
    CUdeviceptr a, b, c;
    int n;
  } packed{db, da, dc, n};
  size_t packed_size = offsetof(decltype(packed), n) + sizeof(int);  // the kernel's parameter bytes
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &packed_size,
                   CU_LAUNCH_PARAM_END};
  OK(cuMemsetD32(dc, 0, n));
  OK(cuLaunchKernel(add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, nullptr, extra));
  OK(cuCtxSynchronize());
  OK(cuMemcpyDtoH(c.data(), dc, n * 4));
  good = true;
  for (int i = 0; i < n; ++i) good &= c[i] == a[i] + b[i];
  EXPECT(good);

  // NCCL's pattern: a 4 KiB argument struct of which `extra` passes only the
  // head the kernel reads (the driver takes a shorter buffer; a longer one
  // it refuses).
  {
    CUfunction head;
    OK(cuModuleGetFunction(&head, m, "ivc_head_args"));
    struct {
      CUdeviceptr out;
      unsigned count;
      unsigned vals[1023];
    } big{};
    big.out = dc;
    big.count = 3;
    big.vals[0] = 7;
    big.vals[1] = 8;
    big.vals[2] = 9;
    size_t used = offsetof(decltype(big), vals) + 3 * sizeof(unsigned);
    void* hx[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &big, CU_LAUNCH_PARAM_BUFFER_SIZE, &used, CU_LAUNCH_PARAM_END};
    OK(cuMemsetD32(dc, 0, 4));
    OK(cuLaunchKernel(head, 1, 1, 1, 32, 1, 1, 0, s, nullptr, hx));
    // the same through cuLaunchKernelEx, as NCCL launches
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
    attr.value.priority = 0;
    CUlaunchConfig cfg{};
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 32;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = s;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    big.vals[2] = 10;
    OK(cuLaunchKernelEx(&cfg, head, nullptr, hx));
    unsigned got[4] = {};
    OK(cuMemcpyDtoHAsync(got, dc, sizeof got, s));
    OK(cuStreamSynchronize(s));
    EXPECT(got[0] == 7 && got[1] == 8 && got[2] == 10 && got[3] == 0);
    size_t longer = sizeof big + 8;
    void* lx[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &big, CU_LAUNCH_PARAM_BUFFER_SIZE, &longer, CU_LAUNCH_PARAM_END};
    EXPECT_RES(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, cuLaunchKernel(head, 1, 1, 1, 32, 1, 1, 0, s, nullptr, lx));
    void* both_args[] = {&dc, &big};
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuLaunchKernel(head, 1, 1, 1, 32, 1, 1, 0, s, both_args, hx));
  }

  // 64-bit scalar parameter
  unsigned v = 0xc0ffee;
  unsigned long long count = n;
  void* fargs[] = {&dc, &v, &count};
  OK(cuLaunchKernel(fill, 64, 1, 1, 128, 1, 1, 0, s, fargs, nullptr));
  std::vector<unsigned> u(n);
  OK(cuMemcpyDtoHAsync(u.data(), dc, n * 4, s));
  OK(cuStreamSynchronize(s));
  EXPECT(u == std::vector<unsigned>(n, 0xc0ffee));

  // reduction, one block
  void* rargs[] = {&da, &dsum, &nn};
  OK(cuLaunchKernel(reduce, 1, 1, 1, 1024, 1, 1, 0, s, rargs, nullptr));
  float sum = 0;
  OK(cuMemcpyDtoHAsync(&sum, dsum, 4, s));
  OK(cuStreamSynchronize(s));
  double ref = 0;
  for (float x : a) ref += x;
  EXPECT(std::fabs(sum - ref) / ref < 1e-4);

  // a struct by value
  ScaleParams sp{2.0f, 3, 0.25};
  void* sargs[] = {&sp, &da, &nn};
  OK(cuLaunchKernel(scale, (n + 127) / 128, 1, 1, 128, 1, 1, 0, s, sargs, nullptr));
  OK(cuStreamSynchronize(s));
  OK(cuMemcpyDtoH(c.data(), da, n * 4));
  good = true;
  for (int i = 0; i < n; ++i) good &= c[i] == static_cast<float>(a[i] * 2.0f + 3 + 0.25);
  EXPECT(good);

  // __constant__ and __device__ symbols
  CUdeviceptr kaddend, kcount;
  size_t ksize = 0, csize = 0;
  OK(cuModuleGetGlobal(&kaddend, &ksize, m, "ivc_const_addend"));
  OK(cuModuleGetGlobal(&kcount, &csize, m, "ivc_launch_count"));
  EXPECT(ksize == 4 && csize == 4);
  float addend = 0;
  OK(cuMemcpyDtoH(&addend, kaddend, 4));
  EXPECT(addend == 1.5f);
  addend = 10.0f;
  OK(cuMemcpyHtoD(kaddend, &addend, 4));
  OK(cuMemcpyHtoD(db, a.data(), n * 4));
  void* cargs[] = {&db, &nn};
  for (int k = 0; k < 3; ++k) OK(cuLaunchKernel(addc, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, cargs, nullptr));
  unsigned launches = 0;
  OK(cuMemcpyDtoH(&launches, kcount, 4));
  EXPECT(launches == 3);
  OK(cuMemcpyDtoH(c.data(), db, n * 4));
  good = true;
  for (int i = 0; i < n; ++i) good &= c[i] == a[i] + 30.0f;
  EXPECT(good);

  // streams and events
  CUevent e0, e1, e2;
  OK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
  OK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
  OK(cuEventCreate(&e2, CU_EVENT_DISABLE_TIMING));
  CUstream s2;
  OK(cuStreamCreate(&s2, 0));
  int prio = -100, lo = 0, hi = 0;
  OK(cuCtxGetStreamPriorityRange(&lo, &hi));
  OK(cuStreamGetPriority(s, &prio));
  EXPECT(prio >= hi && prio <= lo);
  OK(cuEventRecord(e0, s));
  OK(cuLaunchKernel(fill, 64, 1, 1, 128, 1, 1, 0, s, fargs, nullptr));
  OK(cuEventRecord(e1, s));
  OK(cuStreamWaitEvent(s2, e1, 0));
  OK(cuMemcpyDtoDAsync(db, dc, n * 4, s2));
  OK(cuEventRecord(e2, s2));
  OK(cuEventSynchronize(e2));
  OK(cuEventQuery(e2));
  OK(cuStreamQuery(s2));
  float ms = -1;
  OK(cuEventElapsedTime(&ms, e0, e1));
  EXPECT(ms >= 0);
  EXPECT_RES(CUDA_ERROR_INVALID_HANDLE, cuEventElapsedTime(&ms, e0, e2));
  OK(cuMemcpyDtoH(u.data(), db, n * 4));
  EXPECT(u == std::vector<unsigned>(n, 0xc0ffee));
  OK(cuEventDestroy(e0));
  OK(cuEventDestroy(e1));
  OK(cuEventDestroy(e2));

  // Stream attributes and a stream's device (cudaStreamGetDevice).
  CUdevice sdev = -1;
  OK(cuStreamGetDevice(s, &sdev));
  EXPECT(sdev == 0);
  CUstreamAttrValue av{};
  OK(cuStreamGetAttribute(s, CU_LAUNCH_ATTRIBUTE_PRIORITY, &av));
  EXPECT(av.priority == 0);
  av = CUstreamAttrValue{};
  av.syncPolicy = CU_SYNC_POLICY_BLOCKING_SYNC;
  OK(cuStreamSetAttribute(s, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &av));
  av = CUstreamAttrValue{};
  av.accessPolicyWindow.base_ptr = reinterpret_cast<void*>(da);
  av.accessPolicyWindow.num_bytes = 4096;
  av.accessPolicyWindow.hitRatio = 0.5f;
  av.accessPolicyWindow.hitProp = CU_ACCESS_PROPERTY_PERSISTING;
  av.accessPolicyWindow.missProp = CU_ACCESS_PROPERTY_STREAMING;
  OK(cuStreamSetAttribute(s, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &av));
  OK(cuStreamCopyAttributes(s2, s));
  av = CUstreamAttrValue{};
  OK(cuStreamGetAttribute(s2, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, &av));
  const int policy = static_cast<int>(av.syncPolicy);
  av = CUstreamAttrValue{};
  OK(cuStreamGetAttribute(s2, CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, &av));
  std::printf("stream attributes copied: sync policy %d, window %zu bytes at the allocation %d, hit ratio %.2f\n",
              policy, av.accessPolicyWindow.num_bytes,
              reinterpret_cast<CUdeviceptr>(av.accessPolicyWindow.base_ptr) == da, av.accessPolicyWindow.hitRatio);
  EXPECT(policy == CU_SYNC_POLICY_BLOCKING_SYNC && av.accessPolicyWindow.num_bytes == 4096);
  OK(cuLaunchKernel(add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, s2, args, nullptr));  // runs under the window
  OK(cuStreamSynchronize(s2));

  OK(cuStreamDestroy(s2));
  OK(cuStreamDestroy(s));
  for (CUdeviceptr p : {da, db, dc, dsum}) OK(cuMemFree(p));
}

}  // namespace

int main(int argc, char** argv) {
  const char* ptx = check::arg(argc, argv, "--ptx");
  const char* fatbin = check::arg(argc, argv, "--fatbin");
  if (ptx == nullptr) {
    std::fprintf(stderr, "usage: drv_kernels --ptx FILE [--fatbin FILE]\n");
    return 2;
  }
  OK(cuInit(0));
  CUdevice d;
  OK(cuDeviceGet(&d, 0));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, d));
  OK(cuCtxSetCurrent(ctx));
  if (check::g_failures != 0) return check::finish("drv_kernels");

  // cuModuleLoad from a file: PTX, compiled by the driver at load.
  CUmodule m1;
  OK(cuModuleLoad(&m1, ptx));
  kernels(m1);
  OK(cuModuleUnload(m1));
  // cuModuleLoadData and cuModuleLoadDataEx from memory.
  auto text = read_file(ptx);
  CUmodule m2;
  OK(cuModuleLoadData(&m2, text.data()));
  CUfunction f;
  OK(cuModuleGetFunction(&f, m2, "ivc_vec_add"));
  OK(cuModuleUnload(m2));
  CUjit_option opts[] = {CU_JIT_OPTIMIZATION_LEVEL};
  void* vals[] = {reinterpret_cast<void*>(static_cast<uintptr_t>(3))};
  CUmodule m3;
  OK(cuModuleLoadDataEx(&m3, text.data(), 1, opts, vals));
  kernels(m3);
  OK(cuModuleUnload(m3));
  if (fatbin != nullptr) {
    auto fb = read_file(fatbin);
    CUmodule m4;
    OK(cuModuleLoadFatBinary(&m4, fb.data()));
    kernels(m4);
    OK(cuModuleUnload(m4));
  }
  OK(cuDevicePrimaryCtxRelease(d));
  return check::finish("drv_kernels");
}
