// ABI generations: the older exported versions that CUDA 13 callers may still resolve, and
// cuGetProcAddress, which picks a generation by the caller's cudaVersion. cuda.h maps the
// plain names to their newest versions, so those macros are undone here; the versioned
// names stay usable because cuda.h's declarations were expanded before the #undef.
#include <cstring>
#include <string_view>

#include "state.h"

#undef cuDeviceGetUuid
#undef cuEventElapsedTime
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuDevicePrimaryCtxSetFlags
#undef cuGetProcAddress

extern "C" {
CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev);
CUresult CUDAAPI cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray, int numParams,
                                unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev);
CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags);
CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                  cuuint64_t flags);
}

CUresult CUDAAPI cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  return cuDeviceGetUuid_v2(uuid, dev);
}

CUresult CUDAAPI cuEventElapsedTime(float* pMilliseconds, CUevent hStart, CUevent hEnd) {
  return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

CUresult CUDAAPI cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return cuCtxCreate_v4(pctx, nullptr, flags, dev);
}

CUresult CUDAAPI cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* paramsArray, int numParams,
                                unsigned int flags, CUdevice dev) {
  CUctxCreateParams params{};
  params.execAffinityParams = paramsArray;
  params.numExecAffinityParams = numParams;
  return cuCtxCreate_v4(pctx, &params, flags, dev);
}

// The first generation differs from _v2 only in what it promised about other users of the
// context, which a test double cannot tell apart.
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
  return cuDevicePrimaryCtxRelease_v2(dev);
}
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }
CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
  return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

namespace {

struct ProcEntry {
  std::string_view name;
  int version;  // the cudaVersion from which this generation answers for `name`
  void* fn;
};

template <class F>
void* fp(F* f) {
  return reinterpret_cast<void*>(f);
}

// Generations the double implements, oldest first per name. A request gets the newest
// entry whose version does not exceed the caller's cudaVersion. The per-thread-stream
// variants (flags = 2) are the same functions: all work runs synchronously anyway.
const ProcEntry kProcs[] = {
    {"cuInit", 2000, fp(cuInit)},
    {"cuDriverGetVersion", 2020, fp(cuDriverGetVersion)},
    {"cuGetProcAddress", 11030, fp(cuGetProcAddress)},
    {"cuGetProcAddress", 12000, fp(cuGetProcAddress_v2)},
    {"cuGetErrorName", 6000, fp(cuGetErrorName)},
    {"cuGetErrorString", 6000, fp(cuGetErrorString)},
    {"cuDeviceGet", 2000, fp(cuDeviceGet)},
    {"cuDeviceGetCount", 2000, fp(cuDeviceGetCount)},
    {"cuDeviceGetName", 2000, fp(cuDeviceGetName)},
    {"cuDeviceGetUuid", 9020, fp(cuDeviceGetUuid)},
    {"cuDeviceGetUuid", 11040, fp(cuDeviceGetUuid_v2)},
    {"cuDeviceTotalMem", 3020, fp(cuDeviceTotalMem_v2)},
    {"cuDeviceGetAttribute", 2000, fp(cuDeviceGetAttribute)},
    {"cuDeviceGetPCIBusId", 4010, fp(cuDeviceGetPCIBusId)},
    {"cuDeviceGetByPCIBusId", 4010, fp(cuDeviceGetByPCIBusId)},
    {"cuDevicePrimaryCtxRetain", 7000, fp(cuDevicePrimaryCtxRetain)},
    {"cuDevicePrimaryCtxRelease", 7000, fp(cuDevicePrimaryCtxRelease)},
    {"cuDevicePrimaryCtxRelease", 11000, fp(cuDevicePrimaryCtxRelease_v2)},
    {"cuDevicePrimaryCtxReset", 7000, fp(cuDevicePrimaryCtxReset)},
    {"cuDevicePrimaryCtxReset", 11000, fp(cuDevicePrimaryCtxReset_v2)},
    {"cuDevicePrimaryCtxSetFlags", 7000, fp(cuDevicePrimaryCtxSetFlags)},
    {"cuDevicePrimaryCtxSetFlags", 11000, fp(cuDevicePrimaryCtxSetFlags_v2)},
    {"cuDevicePrimaryCtxGetState", 7000, fp(cuDevicePrimaryCtxGetState)},
    {"cuCtxCreate", 3020, fp(cuCtxCreate_v2)},
    {"cuCtxCreate", 11040, fp(cuCtxCreate_v3)},
    {"cuCtxCreate", 12050, fp(cuCtxCreate_v4)},
    {"cuCtxDestroy", 4000, fp(cuCtxDestroy_v2)},
    {"cuCtxPushCurrent", 4000, fp(cuCtxPushCurrent_v2)},
    {"cuCtxPopCurrent", 4000, fp(cuCtxPopCurrent_v2)},
    {"cuCtxSetCurrent", 4000, fp(cuCtxSetCurrent)},
    {"cuCtxGetCurrent", 4000, fp(cuCtxGetCurrent)},
    {"cuCtxGetDevice", 2000, fp(cuCtxGetDevice)},
    {"cuCtxGetDevice", 13000, fp(cuCtxGetDevice_v2)},
    {"cuCtxSynchronize", 2000, fp(cuCtxSynchronize)},
    {"cuCtxSynchronize", 13000, fp(cuCtxSynchronize_v2)},
    {"cuCtxGetFlags", 7000, fp(cuCtxGetFlags)},
    {"cuCtxGetApiVersion", 3020, fp(cuCtxGetApiVersion)},
    {"cuCtxGetStreamPriorityRange", 5050, fp(cuCtxGetStreamPriorityRange)},
    {"cuCtxGetId", 12000, fp(cuCtxGetId)},
    {"cuMemGetInfo", 3020, fp(cuMemGetInfo_v2)},
    {"cuMemAlloc", 3020, fp(cuMemAlloc_v2)},
    {"cuMemAllocPitch", 3020, fp(cuMemAllocPitch_v2)},
    {"cuMemFree", 3020, fp(cuMemFree_v2)},
    {"cuMemGetAddressRange", 3020, fp(cuMemGetAddressRange_v2)},
    {"cuMemAllocHost", 3020, fp(cuMemAllocHost_v2)},
    {"cuMemFreeHost", 2000, fp(cuMemFreeHost)},
    {"cuMemHostAlloc", 2020, fp(cuMemHostAlloc)},
    {"cuMemHostGetDevicePointer", 3020, fp(cuMemHostGetDevicePointer_v2)},
    {"cuMemHostGetFlags", 2030, fp(cuMemHostGetFlags)},
    {"cuMemHostRegister", 4000, fp(cuMemHostRegister_v2)},
    {"cuMemHostUnregister", 4000, fp(cuMemHostUnregister)},
    {"cuMemcpy", 4000, fp(cuMemcpy)},
    {"cuMemcpyAsync", 4000, fp(cuMemcpyAsync)},
    {"cuMemcpyHtoD", 3020, fp(cuMemcpyHtoD_v2)},
    {"cuMemcpyDtoH", 3020, fp(cuMemcpyDtoH_v2)},
    {"cuMemcpyDtoD", 3020, fp(cuMemcpyDtoD_v2)},
    {"cuMemcpyHtoDAsync", 3020, fp(cuMemcpyHtoDAsync_v2)},
    {"cuMemcpyDtoHAsync", 3020, fp(cuMemcpyDtoHAsync_v2)},
    {"cuMemcpyDtoDAsync", 3020, fp(cuMemcpyDtoDAsync_v2)},
    {"cuMemcpy2D", 3020, fp(cuMemcpy2D_v2)},
    {"cuMemcpy2DUnaligned", 3020, fp(cuMemcpy2DUnaligned_v2)},
    {"cuMemcpy2DAsync", 3020, fp(cuMemcpy2DAsync_v2)},
    {"cuMemsetD8", 3020, fp(cuMemsetD8_v2)},
    {"cuMemsetD16", 3020, fp(cuMemsetD16_v2)},
    {"cuMemsetD32", 3020, fp(cuMemsetD32_v2)},
    {"cuMemsetD8Async", 3020, fp(cuMemsetD8Async)},
    {"cuMemsetD16Async", 3020, fp(cuMemsetD16Async)},
    {"cuMemsetD32Async", 3020, fp(cuMemsetD32Async)},
    {"cuStreamCreate", 2000, fp(cuStreamCreate)},
    {"cuStreamCreateWithPriority", 5050, fp(cuStreamCreateWithPriority)},
    {"cuStreamGetPriority", 5050, fp(cuStreamGetPriority)},
    {"cuStreamGetFlags", 5050, fp(cuStreamGetFlags)},
    {"cuStreamGetCtx", 9020, fp(cuStreamGetCtx)},
    {"cuStreamGetCtx", 12050, fp(cuStreamGetCtx_v2)},
    {"cuStreamGetId", 12000, fp(cuStreamGetId)},
    {"cuStreamWaitEvent", 3020, fp(cuStreamWaitEvent)},
    {"cuStreamQuery", 2000, fp(cuStreamQuery)},
    {"cuStreamSynchronize", 2000, fp(cuStreamSynchronize)},
    {"cuStreamDestroy", 4000, fp(cuStreamDestroy_v2)},
    {"cuEventCreate", 2000, fp(cuEventCreate)},
    {"cuEventRecord", 2000, fp(cuEventRecord)},
    {"cuEventRecordWithFlags", 11010, fp(cuEventRecordWithFlags)},
    {"cuEventQuery", 2000, fp(cuEventQuery)},
    {"cuEventSynchronize", 2000, fp(cuEventSynchronize)},
    {"cuEventDestroy", 4000, fp(cuEventDestroy_v2)},
    {"cuEventElapsedTime", 2000, fp(cuEventElapsedTime)},
    {"cuEventElapsedTime", 12080, fp(cuEventElapsedTime_v2)},
    {"cuModuleLoadData", 2000, fp(cuModuleLoadData)},
    {"cuModuleLoadDataEx", 2010, fp(cuModuleLoadDataEx)},
    {"cuModuleLoadFatBinary", 2000, fp(cuModuleLoadFatBinary)},
    {"cuModuleUnload", 2000, fp(cuModuleUnload)},
    {"cuModuleGetFunction", 2000, fp(cuModuleGetFunction)},
    {"cuModuleGetGlobal", 3020, fp(cuModuleGetGlobal_v2)},
    {"cuModuleGetLoadingMode", 11070, fp(cuModuleGetLoadingMode)},
    {"cuFuncGetAttribute", 2020, fp(cuFuncGetAttribute)},
    {"cuFuncSetAttribute", 9000, fp(cuFuncSetAttribute)},
    {"cuFuncSetCacheConfig", 3000, fp(cuFuncSetCacheConfig)},
    {"cuFuncGetParamInfo", 12040, fp(cuFuncGetParamInfo)},
    {"cuFuncGetName", 12030, fp(cuFuncGetName)},
    {"cuFuncGetModule", 11000, fp(cuFuncGetModule)},
    {"cuLaunchKernel", 4000, fp(cuLaunchKernel)},
    {"cuLibraryLoadData", 12000, fp(cuLibraryLoadData)},
    {"cuLibraryUnload", 12000, fp(cuLibraryUnload)},
    {"cuLibraryGetKernel", 12000, fp(cuLibraryGetKernel)},
    {"cuLibraryGetModule", 12000, fp(cuLibraryGetModule)},
    {"cuLibraryGetGlobal", 12000, fp(cuLibraryGetGlobal)},
    {"cuLibraryGetKernelCount", 12040, fp(cuLibraryGetKernelCount)},
    {"cuLibraryEnumerateKernels", 12040, fp(cuLibraryEnumerateKernels)},
    {"cuKernelGetFunction", 12000, fp(cuKernelGetFunction)},
    {"cuKernelGetAttribute", 12000, fp(cuKernelGetAttribute)},
    {"cuKernelSetAttribute", 12000, fp(cuKernelSetAttribute)},
    {"cuKernelGetName", 12030, fp(cuKernelGetName)},
    {"cuKernelGetParamInfo", 12040, fp(cuKernelGetParamInfo)},
    {"cuKernelGetLibrary", 12050, fp(cuKernelGetLibrary)},
    {"cuMemGetAllocationGranularity", 10020, fp(cuMemGetAllocationGranularity)},
    {"cuMemAddressReserve", 10020, fp(cuMemAddressReserve)},
    {"cuMemAddressFree", 10020, fp(cuMemAddressFree)},
    {"cuMemCreate", 10020, fp(cuMemCreate)},
    {"cuMemRelease", 10020, fp(cuMemRelease)},
    {"cuMemMap", 10020, fp(cuMemMap)},
    {"cuMemUnmap", 10020, fp(cuMemUnmap)},
    {"cuMemSetAccess", 10020, fp(cuMemSetAccess)},
    {"cuMemGetAccess", 10020, fp(cuMemGetAccess)},
    {"cuMemGetAllocationPropertiesFromHandle", 10020, fp(cuMemGetAllocationPropertiesFromHandle)},
    {"cuMemRetainAllocationHandle", 11000, fp(cuMemRetainAllocationHandle)},
    {"cuMemExportToShareableHandle", 10020, fp(cuMemExportToShareableHandle)},
    {"cuMemImportFromShareableHandle", 10020, fp(cuMemImportFromShareableHandle)},
    // Green contexts (api_green.cc): the versions at which the H200's driver (580.159.04) first
    // answers each name (tests/api/data/real_driver_answers.txt).
    {"cuDeviceGetDevResource", 12040, fp(cuDeviceGetDevResource)},
    {"cuCtxGetDevResource", 12040, fp(cuCtxGetDevResource)},
    {"cuGreenCtxGetDevResource", 12040, fp(cuGreenCtxGetDevResource)},
    {"cuDevSmResourceSplitByCount", 12040, fp(cuDevSmResourceSplitByCount)},
    {"cuDevResourceGenerateDesc", 12040, fp(cuDevResourceGenerateDesc)},
    {"cuGreenCtxCreate", 12040, fp(cuGreenCtxCreate)},
    {"cuGreenCtxDestroy", 12040, fp(cuGreenCtxDestroy)},
    {"cuCtxFromGreenCtx", 12040, fp(cuCtxFromGreenCtx)},
    {"cuGreenCtxRecordEvent", 12040, fp(cuGreenCtxRecordEvent)},
    {"cuGreenCtxWaitEvent", 12040, fp(cuGreenCtxWaitEvent)},
    {"cuStreamGetGreenCtx", 12040, fp(cuStreamGetGreenCtx)},
    {"cuGreenCtxStreamCreate", 12050, fp(cuGreenCtxStreamCreate)},
    {"cuGreenCtxGetId", 12090, fp(cuGreenCtxGetId)},
};

}  // namespace

CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                     cuuint64_t flags,
                                     CUdriverProcAddressQueryResult* symbolStatus) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  constexpr cuuint64_t kKnownFlags =
      CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  if ((flags & ~kKnownFlags) != 0) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  const std::string_view name(symbol);
  bool known = false;
  for (const ProcEntry& e : kProcs) {
    if (e.name != name) continue;
    known = true;
    if (e.version <= cudaVersion) *pfn = e.fn;  // entries ascend: the last match is newest
  }
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
  if (*pfn == nullptr)
    status =
        known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  if (symbolStatus != nullptr) *symbolStatus = status;
  return *pfn != nullptr ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                  cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, nullptr);
}
