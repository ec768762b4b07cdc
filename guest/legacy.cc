// Older ABI generations and the per-thread-default-stream entry points of
// the forwarded functions. cuGetProcAddress hands these out when a caller
// asks for an older CUDA version, or for the per-thread default stream
// (flag 2, or code built with --default-stream per-thread).
//
// This file sees cuda.h without its renaming macros, so each symbol here is
// defined under its exact exported name and forwards to the current form.
#define __CUDA_API_VERSION_INTERNAL
#include <cuda.h>

#include "guest/internal.h"

using ivcuda::guest::internal::ptsz;

// ---- same ABI as the current generation
CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) { return cuDeviceGetUuid_v2(uuid, dev); }
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }
CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}
CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }
CUresult CUDAAPI cuCtxPopCurrent(CUcontext* pctx) { return cuCtxPopCurrent_v2(pctx); }
CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }
CUresult CUDAAPI cuStreamDestroy(CUstream s) { return cuStreamDestroy_v2(s); }
CUresult CUDAAPI cuEventDestroy(CUevent e) { return cuEventDestroy_v2(e); }
CUresult CUDAAPI cuEventElapsedTime(float* ms, CUevent a, CUevent b) { return cuEventElapsedTime_v2(ms, a, b); }
// cuda.h declares the _v2 form only for callers that see its renaming macros.
extern "C" CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags);
CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr* pdptr, CUipcMemHandle handle, unsigned int flags) {
  return cuIpcOpenMemHandle_v2(pdptr, handle, flags);
}

// ---- cuCtxCreate as programs built with CUDA 12.4 and before call it: with
// no creation parameters (CUDA 2.0 and 3.2 ABIs), and with execution-affinity
// parameters (11.4), which the current form refuses as NOT_SUPPORTED.
extern "C" CUresult CUDAAPI cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags,
                                           CUdevice dev);
CUresult CUDAAPI cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return cuCtxCreate_v4(pctx, nullptr, flags, dev);
}
CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return cuCtxCreate_v4(pctx, nullptr, flags, dev);
}
CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params, int n, unsigned int flags,
                                CUdevice dev) {
  if (n < 0 || (n > 0 && params == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (n == 0) return cuCtxCreate_v4(pctx, nullptr, flags, dev);
  CUctxCreateParams p{};
  p.execAffinityParams = params;
  p.numExecAffinityParams = n;
  return cuCtxCreate_v4(pctx, &p, flags, dev);
}

// ---- per-thread default stream: synchronous calls (_ptds)
CUresult CUDAAPI cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void* h, size_t n) { return cuMemcpyHtoD_v2(d, h, n); }
CUresult CUDAAPI cuMemcpyDtoH_v2_ptds(void* h, CUdeviceptr d, size_t n) { return cuMemcpyDtoH_v2(h, d, n); }
CUresult CUDAAPI cuMemcpyDtoD_v2_ptds(CUdeviceptr a, CUdeviceptr b, size_t n) { return cuMemcpyDtoD_v2(a, b, n); }
CUresult CUDAAPI cuMemcpy_ptds(CUdeviceptr a, CUdeviceptr b, size_t n) { return cuMemcpy(a, b, n); }
CUresult CUDAAPI cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D* p) { return cuMemcpy2D_v2(p); }
CUresult CUDAAPI cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D* p) { return cuMemcpy2DUnaligned_v2(p); }
CUresult CUDAAPI cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n) { return cuMemsetD8_v2(d, v, n); }
CUresult CUDAAPI cuMemsetD16_v2_ptds(CUdeviceptr d, unsigned short v, size_t n) { return cuMemsetD16_v2(d, v, n); }
CUresult CUDAAPI cuMemsetD32_v2_ptds(CUdeviceptr d, unsigned int v, size_t n) { return cuMemsetD32_v2(d, v, n); }
CUresult CUDAAPI cuMemsetD2D8_v2_ptds(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h) {
  return cuMemsetD2D8_v2(d, p, v, w, h);
}
CUresult CUDAAPI cuMemsetD2D16_v2_ptds(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h) {
  return cuMemsetD2D16_v2(d, p, v, w, h);
}
CUresult CUDAAPI cuMemsetD2D32_v2_ptds(CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h) {
  return cuMemsetD2D32_v2(d, p, v, w, h);
}
CUresult CUDAAPI cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D* p) { return cuMemcpy3D_v2(p); }
CUresult CUDAAPI cuMemcpyHtoA_v2_ptds(CUarray a, size_t off, const void* h, size_t n) {
  return cuMemcpyHtoA_v2(a, off, h, n);
}
CUresult CUDAAPI cuMemcpyAtoH_v2_ptds(void* h, CUarray a, size_t off, size_t n) { return cuMemcpyAtoH_v2(h, a, off, n); }
CUresult CUDAAPI cuMemcpyAtoD_v2_ptds(CUdeviceptr d, CUarray a, size_t off, size_t n) {
  return cuMemcpyAtoD_v2(d, a, off, n);
}
CUresult CUDAAPI cuMemcpyDtoA_v2_ptds(CUarray a, size_t off, CUdeviceptr d, size_t n) {
  return cuMemcpyDtoA_v2(a, off, d, n);
}
CUresult CUDAAPI cuMemcpyAtoA_v2_ptds(CUarray a, size_t aoff, CUarray b, size_t boff, size_t n) {
  return cuMemcpyAtoA_v2(a, aoff, b, boff, n);
}

// ---- per-thread default stream: stream-ordered calls (_ptsz)
CUresult CUDAAPI cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D* p, CUstream s) { return cuMemcpy3DAsync_v2(p, ptsz(s)); }
CUresult CUDAAPI cuMemcpyHtoAAsync_v2_ptsz(CUarray a, size_t off, const void* h, size_t n, CUstream s) {
  return cuMemcpyHtoAAsync_v2(a, off, h, n, ptsz(s));
}
CUresult CUDAAPI cuMemcpyAtoHAsync_v2_ptsz(void* h, CUarray a, size_t off, size_t n, CUstream s) {
  return cuMemcpyAtoHAsync_v2(h, a, off, n, ptsz(s));
}
CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void* h, size_t n, CUstream s) {
  return cuMemcpyHtoDAsync_v2(d, h, n, ptsz(s));
}
CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void* h, CUdeviceptr d, size_t n, CUstream s) {
  return cuMemcpyDtoHAsync_v2(h, d, n, ptsz(s));
}
CUresult CUDAAPI cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr a, CUdeviceptr b, size_t n, CUstream s) {
  return cuMemcpyDtoDAsync_v2(a, b, n, ptsz(s));
}
CUresult CUDAAPI cuMemcpyAsync_ptsz(CUdeviceptr a, CUdeviceptr b, size_t n, CUstream s) {
  return cuMemcpyAsync(a, b, n, ptsz(s));
}
CUresult CUDAAPI cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D* p, CUstream s) { return cuMemcpy2DAsync_v2(p, ptsz(s)); }
CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  return cuMemsetD8Async(d, v, n, ptsz(s));
}
CUresult CUDAAPI cuMemsetD16Async_ptsz(CUdeviceptr d, unsigned short v, size_t n, CUstream s) {
  return cuMemsetD16Async(d, v, n, ptsz(s));
}
CUresult CUDAAPI cuMemsetD32Async_ptsz(CUdeviceptr d, unsigned int v, size_t n, CUstream s) {
  return cuMemsetD32Async(d, v, n, ptsz(s));
}
CUresult CUDAAPI cuMemsetD2D8Async_ptsz(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h, CUstream s) {
  return cuMemsetD2D8Async(d, p, v, w, h, ptsz(s));
}
CUresult CUDAAPI cuMemsetD2D16Async_ptsz(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h, CUstream s) {
  return cuMemsetD2D16Async(d, p, v, w, h, ptsz(s));
}
CUresult CUDAAPI cuMemsetD2D32Async_ptsz(CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h, CUstream s) {
  return cuMemsetD2D32Async(d, p, v, w, h, ptsz(s));
}
CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                     unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void** params,
                                     void** extra) {
  return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, ptsz(s), params, extra);
}
CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUlaunchConfig copy = *c;
  copy.hStream = ptsz(copy.hStream);
  return cuLaunchKernelEx(&copy, f, params, extra);
}
CUresult CUDAAPI cuStreamQuery_ptsz(CUstream s) { return cuStreamQuery(ptsz(s)); }
CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(ptsz(s)); }
CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned int flags) {
  return cuStreamWaitEvent(ptsz(s), e, flags);
}
CUresult CUDAAPI cuStreamGetPriority_ptsz(CUstream s, int* p) { return cuStreamGetPriority(ptsz(s), p); }
CUresult CUDAAPI cuEventRecord_ptsz(CUevent e, CUstream s) { return cuEventRecord(e, ptsz(s)); }
CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent e, CUstream s, unsigned int flags) {
  return cuEventRecordWithFlags(e, ptsz(s), flags);
}
CUresult CUDAAPI cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus* st) {
  return cuStreamIsCapturing(ptsz(s), st);
}
CUresult CUDAAPI cuStreamGetCaptureInfo_v3_ptsz(CUstream s, CUstreamCaptureStatus* st, cuuint64_t* id, CUgraph* g,
                                                const CUgraphNode** deps, const CUgraphEdgeData** edges,
                                                size_t* n) {
  return cuStreamGetCaptureInfo_v3(ptsz(s), st, id, g, deps, edges, n);
}
CUresult CUDAAPI cuStreamGetId_ptsz(CUstream s, unsigned long long* id) { return cuStreamGetId(ptsz(s), id); }

// ---- the JIT linker's first generation (the same arguments; guest/link.cc)
extern "C" CUresult CUDAAPI cuLinkCreate_v2(unsigned int n, CUjit_option* opts, void** vals, CUlinkState* out);
extern "C" CUresult CUDAAPI cuLinkAddData_v2(CUlinkState s, CUjitInputType type, void* data, size_t size,
                                             const char* name, unsigned int n, CUjit_option* opts, void** vals);
extern "C" CUresult CUDAAPI cuLinkAddFile_v2(CUlinkState s, CUjitInputType type, const char* path, unsigned int n,
                                             CUjit_option* opts, void** vals);
CUresult CUDAAPI cuLinkCreate(unsigned int n, CUjit_option* opts, void** vals, CUlinkState* out) {
  return cuLinkCreate_v2(n, opts, vals, out);
}
CUresult CUDAAPI cuLinkAddData(CUlinkState s, CUjitInputType type, void* data, size_t size, const char* name,
                               unsigned int n, CUjit_option* opts, void** vals) {
  return cuLinkAddData_v2(s, type, data, size, name, n, opts, vals);
}
CUresult CUDAAPI cuLinkAddFile(CUlinkState s, CUjitInputType type, const char* path, unsigned int n,
                               CUjit_option* opts, void** vals) {
  return cuLinkAddFile_v2(s, type, path, n, opts, vals);
}


// ---- as the driver answers them. The first generation of the stream memory
// operations (CUDA 8.0 to 11.6) answers CUDA_ERROR_NOT_SUPPORTED unless the
// driver was loaded with its module option, which no usual install sets:
// measured with real arguments (drv_memops on the H200) and zero ones
// (drv_absent on the H100). cuda.h declares only the _v2 forms.
#define IVCUDA_REFUSED_MEMOP(name, value_type)                                             \
  extern "C" CUresult CUDAAPI name(CUstream, CUdeviceptr, value_type, unsigned int) {     \
    return CUDA_ERROR_NOT_SUPPORTED;                                                       \
  }
IVCUDA_REFUSED_MEMOP(cuStreamWaitValue32, cuuint32_t)
IVCUDA_REFUSED_MEMOP(cuStreamWaitValue32_ptsz, cuuint32_t)
IVCUDA_REFUSED_MEMOP(cuStreamWaitValue64, cuuint64_t)
IVCUDA_REFUSED_MEMOP(cuStreamWaitValue64_ptsz, cuuint64_t)
IVCUDA_REFUSED_MEMOP(cuStreamWriteValue32, cuuint32_t)
IVCUDA_REFUSED_MEMOP(cuStreamWriteValue32_ptsz, cuuint32_t)
IVCUDA_REFUSED_MEMOP(cuStreamWriteValue64, cuuint64_t)
IVCUDA_REFUSED_MEMOP(cuStreamWriteValue64_ptsz, cuuint64_t)
#undef IVCUDA_REFUSED_MEMOP
extern "C" CUresult CUDAAPI cuStreamBatchMemOp(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
extern "C" CUresult CUDAAPI cuStreamBatchMemOp_ptsz(CUstream, unsigned int, CUstreamBatchMemOpParams*, unsigned int) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
