// The real driver, loaded with dlopen so that ivcudad builds and starts on
// machines without one. Each entry is the symbol cuda.h's macros select for
// a CUDA 13 caller (cuMemAlloc -> cuMemAlloc_v2, cuCtxCreate -> cuCtxCreate_v4,
// cuStreamBeginCapture -> _v2, cuStreamGetCaptureInfo -> _v3, cuGraphInstantiate ->
// cuGraphInstantiateWithFlags, cuStreamWriteValue32/cuStreamWaitValue32 -> _v2, cuIpcOpenMemHandle -> _v2,
// the graph calls with edge data and cuGraphAddKernelNode and friends -> _v2).
#pragma once

#include <cuda.h>

#include <string>

#include "ivcuda/result.h"

namespace ivcuda::host {

#define IVCUDA_DRIVER_FUNCTIONS(X)                                                              \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuDeviceGetCount) X(cuDeviceGet)        \
  X(cuDeviceGetName) X(cuDeviceGetUuid) X(cuDeviceTotalMem) X(cuDeviceGetAttribute) X(cuDeviceGetPCIBusId) \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuDevicePrimaryCtxReset)         \
  X(cuDevicePrimaryCtxGetState) X(cuDevicePrimaryCtxSetFlags) X(cuCtxCreate) X(cuCtxDestroy)  \
  X(cuCtxSetCurrent) X(cuCtxSynchronize) X(cuCtxGetStreamPriorityRange) X(cuMemAlloc)         \
  X(cuMemAllocPitch) X(cuMemFree) X(cuMemGetInfo) X(cuMemGetAddressRange) X(cuMemsetD8)      \
  X(cuMemsetD16) X(cuMemsetD32) X(cuMemsetD8Async) X(cuMemsetD16Async) X(cuMemsetD32Async)   \
  X(cuMemsetD2D8) X(cuMemsetD2D16) X(cuMemsetD2D32) X(cuMemsetD2D8Async)                      \
  X(cuMemsetD2D16Async) X(cuMemsetD2D32Async) X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoD) \
  X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyDtoDAsync) X(cuMemcpy2D)                \
  X(cuMemcpy2DUnaligned) X(cuMemcpy2DAsync) X(cuMemHostRegister) X(cuMemHostUnregister)      \
  X(cuMemHostGetDevicePointer) X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)   \
  X(cuModuleGetGlobal) X(cuFuncGetParamInfo) X(cuFuncGetAttribute) X(cuFuncSetAttribute)      \
  X(cuLaunchKernel) X(cuStreamCreate) X(cuStreamCreateWithPriority) X(cuStreamDestroy)        \
  X(cuStreamQuery) X(cuStreamSynchronize) X(cuStreamWaitEvent) X(cuStreamGetPriority)         \
  X(cuEventCreate) X(cuEventRecord) X(cuEventRecordWithFlags) X(cuEventQuery)                \
  X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventDestroy)                               \
  X(cuThreadExchangeStreamCaptureMode) X(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags) \
  X(cuOccupancyAvailableDynamicSMemPerBlock) X(cuCtxGetLimit) X(cuCtxSetLimit)                \
  X(cuDeviceGetDefaultMemPool) X(cuDeviceGetMemPool) X(cuDeviceSetMemPool) X(cuMemAllocAsync) \
  X(cuMemAllocFromPoolAsync) X(cuMemFreeAsync) X(cuMemPoolSetAttribute)                       \
  X(cuMemPoolGetAttribute) X(cuMemPoolTrimTo) X(cuLaunchCooperativeKernel)                    \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuStreamIsCapturing)                        \
  X(cuStreamGetCaptureInfo) X(cuGraphCreate) X(cuGraphGetNodes) X(cuGraphInstantiate)         \
  X(cuGraphLaunch) X(cuGraphUpload) X(cuGraphExecDestroy) X(cuGraphDestroy)                   \
  X(cuModuleGetFunctionCount) X(cuModuleEnumerateFunctions) X(cuFuncGetName)                  \
  X(cuOccupancyMaxPotentialBlockSizeWithFlags) X(cuOccupancyMaxActiveClusters) X(cuOccupancyMaxPotentialClusterSize) \
  X(cuTensorMapEncodeTiled) X(cuTensorMapEncodeIm2col) X(cuTensorMapEncodeIm2colWide) X(cuTensorMapReplaceAddress) \
  X(cuDeviceGetTexture1DLinearMaxWidth) X(cuLaunchKernelEx) X(cuDeviceCanAccessPeer) X(cuDeviceGetP2PAttribute)            \
  X(cuDeviceGetHostAtomicCapabilities) X(cuDeviceGetP2PAtomicCapabilities)                     \
  X(cuCtxEnablePeerAccess) X(cuCtxDisablePeerAccess) X(cuMemcpyPeer) X(cuMemcpyPeerAsync)       \
  X(cuStreamWriteValue32) X(cuStreamWaitValue32) X(cuStreamWriteValue64) X(cuStreamWaitValue64) X(cuStreamBatchMemOp) X(cuStreamGetAttribute) X(cuStreamSetAttribute) X(cuStreamCopyAttributes) X(cuCtxGetFlags) X(cuCtxSetFlags) X(cuCtxGetCacheConfig) X(cuCtxSetCacheConfig) X(cuCtxResetPersistingL2Cache) X(cuCtxRecordEvent) X(cuCtxWaitEvent) X(cuFuncIsLoaded) X(cuFuncLoad) X(cuMemGetAllocationGranularity)             \
  X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap)       \
  X(cuMemUnmap) X(cuMemSetAccess) X(cuMemGetAccess) X(cuMemGetAllocationPropertiesFromHandle) \
  X(cuMemRetainAllocationHandle) X(cuFuncSetCacheConfig) X(cuMemExportToShareableHandle)     \
  X(cuMemImportFromShareableHandle) \
  X(cuArrayCreate) X(cuArray3DCreate) X(cuArrayDestroy) X(cuArrayGetDescriptor)              \
  X(cuArray3DGetDescriptor) X(cuArrayGetMemoryRequirements) X(cuMipmappedArrayCreate)        \
  X(cuMipmappedArrayDestroy) X(cuMipmappedArrayGetLevel) X(cuMipmappedArrayGetMemoryRequirements) \
  X(cuArrayGetSparseProperties) X(cuMipmappedArrayGetSparseProperties) X(cuMemMapArrayAsync)  \
  X(cuMemcpy3D) X(cuMemcpy3DAsync) X(cuTexObjectCreate) X(cuTexObjectDestroy)                 \
  X(cuTexObjectGetResourceDesc) X(cuTexObjectGetTextureDesc) X(cuTexObjectGetResourceViewDesc) \
  X(cuSurfObjectCreate) X(cuSurfObjectDestroy) X(cuSurfObjectGetResourceDesc)                 \
  X(cuMemPoolCreate) X(cuMemPoolDestroy) \
  X(cuMemPoolSetAccess) X(cuMemPoolGetAccess) X(cuMemPoolExportToShareableHandle)              \
  X(cuMemPoolExportPointer) X(cuMemPoolImportFromShareableHandle) X(cuMemPoolImportPointer)   \
  X(cuPointerGetAttribute)                                                                     \
  X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle) X(cuIpcGetEventHandle)    \
  X(cuIpcOpenEventHandle) \
  X(cuGraphAddKernelNode)             \
  X(cuGraphAddMemcpyNode) X(cuGraphAddMemsetNode) X(cuGraphAddEmptyNode) X(cuGraphAddChildGraphNode) \
  X(cuGraphAddEventRecordNode) X(cuGraphAddEventWaitNode) X(cuGraphKernelNodeGetParams)       \
  X(cuGraphKernelNodeSetParams) X(cuGraphMemcpyNodeGetParams) X(cuGraphMemcpyNodeSetParams)   \
  X(cuGraphMemsetNodeGetParams) X(cuGraphMemsetNodeSetParams) X(cuGraphEventRecordNodeGetEvent) \
  X(cuGraphEventRecordNodeSetEvent) X(cuGraphEventWaitNodeGetEvent) X(cuGraphEventWaitNodeSetEvent) \
  X(cuGraphExecKernelNodeSetParams) X(cuGraphExecMemcpyNodeSetParams)                         \
  X(cuGraphExecMemsetNodeSetParams) X(cuGraphExecChildGraphNodeSetParams)                     \
  X(cuGraphExecEventRecordNodeSetEvent) X(cuGraphExecEventWaitNodeSetEvent) X(cuGraphGetRootNodes) \
  X(cuGraphGetEdges) X(cuGraphNodeGetDependencies) X(cuGraphNodeGetDependentNodes)           \
  X(cuGraphNodeGetType) X(cuGraphDestroyNode) X(cuGraphClone) X(cuGraphNodeFindInClone)      \
  X(cuGraphExecGetFlags) X(cuGraphExecUpdate) X(cuGraphNodeSetEnabled) X(cuGraphNodeGetEnabled) \
  X(cuGraphChildGraphNodeGetGraph) X(cuGraphAddDependencies) X(cuGraphRemoveDependencies) \
  X(cuGraphAddHostNode) X(cuGraphHostNodeGetParams) X(cuGraphHostNodeSetParams) X(cuGraphExecHostNodeSetParams) \
  X(cuStreamBeginCaptureToGraph) X(cuStreamUpdateCaptureDependencies) \
  X(cuGraphAddMemAllocNode) X(cuGraphAddMemFreeNode) X(cuGraphMemAllocNodeGetParams) X(cuGraphMemFreeNodeGetParams) \
  X(cuGraphAddNode) X(cuGraphConditionalHandleCreate) \
  X(cuUserObjectCreate) X(cuUserObjectRetain) X(cuUserObjectRelease) X(cuGraphRetainUserObject) X(cuGraphReleaseUserObject) \
  X(cuGraphDebugDotPrint) X(cuGraphKernelNodeGetAttribute) X(cuGraphKernelNodeSetAttribute) \
  X(cuGraphKernelNodeCopyAttributes) X(cuDeviceGraphMemTrim) X(cuDeviceGetGraphMemAttribute)       \
  X(cuDeviceSetGraphMemAttribute) X(cuLinkCreate) X(cuLinkAddData) X(cuLinkComplete) X(cuLinkDestroy) \
  X(cuDeviceGetDevResource) X(cuCtxGetDevResource) X(cuGreenCtxGetDevResource)                     \
  X(cuDevSmResourceSplitByCount) X(cuDevResourceGenerateDesc) X(cuGreenCtxCreate) X(cuGreenCtxDestroy) \
  X(cuCtxFromGreenCtx) X(cuGreenCtxStreamCreate) X(cuGreenCtxRecordEvent) X(cuGreenCtxWaitEvent)

struct DriverApi {
#define IVCUDA_DRIVER_MEMBER(f) decltype(&::f) f = nullptr;
  IVCUDA_DRIVER_FUNCTIONS(IVCUDA_DRIVER_MEMBER)
#undef IVCUDA_DRIVER_MEMBER
  void* handle = nullptr;
  std::string path;
};

// Loads every function or fails naming the first missing symbol.
Result<DriverApi> load_driver(const std::string& path);

}  // namespace ivcuda::host
