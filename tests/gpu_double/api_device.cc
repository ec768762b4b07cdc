// Initialisation, device queries and error strings of the GPU test double.
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "state.h"

using namespace ivcuda::gpu_double;

namespace {

bool valid_device(const State& s, CUdevice dev) { return dev >= 0 && dev < s.device_count; }

int device_count_from_env() {
  const int n = device_count_env();
  if (n < 0) {
    log("IVCUDA_GPU_DOUBLE_DEVICES=%s is not a count from 0 to %d; using 1", std::getenv("IVCUDA_GPU_DOUBLE_DEVICES"),
        kMaxDevices);
    return 1;
  }
  return n;
}

// PCI location of a device (identity.h): consistent with the attributes below.

int attribute(CUdevice_attribute a, int dev) {
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return kMaxThreadsPerBlock;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return kDefaultSharedPerBlock;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1980000;  // kHz
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 132;
    case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT: return 0;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: return 0;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: return CU_COMPUTEMODE_DEFAULT;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH: return 131072;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH: return 131072;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT: return 65536;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH: return 16384;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT: return 16384;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH: return 16384;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_HEIGHT: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_LAYERS: return 2048;
    case CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return pci_bus(dev);
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: return kPciDevice;
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER: return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 2619000;  // kHz
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return 50 * 1024 * 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 2;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_LAYERS: return 2048;
    case CU_DEVICE_ATTRIBUTE_CAN_TEX2D_GATHER: return 1;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_HEIGHT: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH_ALTERNATE: return 8192;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT_ALTERNATE: return 8192;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH_ALTERNATE: return 32768;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: return kPciDomain;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: return 32;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS: return 2046;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_WIDTH: return 131072;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_HEIGHT: return 65536;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_WIDTH: return 16384;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_HEIGHT: return 16384;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_DEPTH: return 16384;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_LAYERS: return 2048;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_HEIGHT: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_LAYERS: return 2048;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS: return 2046;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LINEAR_WIDTH: return 268435456;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_WIDTH: return 131072;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_HEIGHT: return 65000;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_PITCH: return 2097120;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT: return 32768;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return 0;
    case CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH: return 32768;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return 228 * 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return 65536;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 1;  // device memory is the process's own (api_memory.cc)
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: return 0;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID: return dev;
    case CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: return 2;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: return 0;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: return 0;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1: return 0;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1: return 0;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1: return 0;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_MULTI_DEVICE_LAUNCH: return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return kMaxSharedPerBlockOptin;
    case CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES: return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES: return 0;
    case CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST: return 0;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 1;  // api_vmm.cc
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return 32;
    case CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE: return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE: return 0;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED: return 1;  // api_arrays.cc
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: return 0;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING: return 0;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: return CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: return 1;  // cuLaunchKernelEx takes cluster dimensions
    case CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED: return 1;  // api_arrays.cc
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: return 0;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR: return 0;
    case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT: return 4;
    case CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS: return 0;
    case CU_DEVICE_ATTRIBUTE_NUMA_CONFIG: return CU_DEVICE_NUMA_CONFIG_NONE;
    case CU_DEVICE_ATTRIBUTE_NUMA_ID: return -1;
    case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_MPS_ENABLED: return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: return 0;
    case CU_DEVICE_ATTRIBUTE_D3D12_CIG_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_ALGORITHM_MASK: return 0;
    case CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_MAXIMUM_LENGTH: return 0;
    case CU_DEVICE_ATTRIBUTE_VULKAN_CIG_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID: return 0x233510de;  // vendor 10de, H200-like
    case CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID: return 0x18a610de;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_MEMORY_POOLS_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_MULTINODE_IPC_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_MEMORY_POOLS_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_HOST_ALLOC_DMA_BUF_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_ONLY_PARTIAL_HOST_NATIVE_ATOMIC_SUPPORTED: return 0;
    case CU_DEVICE_ATTRIBUTE_MAX: break;
  }
  return 0;
}

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};

#define IVC_ERR(code, text) \
  { code, #code, text }
constexpr ErrorText kErrors[] = {
    IVC_ERR(CUDA_SUCCESS, "no error"),
    IVC_ERR(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    IVC_ERR(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    IVC_ERR(CUDA_ERROR_NOT_INITIALIZED, "initialization error: cuInit has not been called"),
    IVC_ERR(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    IVC_ERR(CUDA_ERROR_PROFILER_DISABLED, "profiler disabled"),
    IVC_ERR(CUDA_ERROR_PROFILER_NOT_INITIALIZED, "profiler not initialized"),
    IVC_ERR(CUDA_ERROR_PROFILER_ALREADY_STARTED, "profiler already started"),
    IVC_ERR(CUDA_ERROR_PROFILER_ALREADY_STOPPED, "profiler already stopped"),
    IVC_ERR(CUDA_ERROR_STUB_LIBRARY, "stub library loaded instead of a driver"),
    IVC_ERR(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, "call requires a newer driver"),
    IVC_ERR(CUDA_ERROR_DEVICE_UNAVAILABLE, "device unavailable"),
    IVC_ERR(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device"),
    IVC_ERR(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    IVC_ERR(CUDA_ERROR_DEVICE_NOT_LICENSED, "device not licensed"),
    IVC_ERR(CUDA_ERROR_INVALID_IMAGE, "invalid module image"),
    IVC_ERR(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    IVC_ERR(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current"),
    IVC_ERR(CUDA_ERROR_MAP_FAILED, "map failed"),
    IVC_ERR(CUDA_ERROR_UNMAP_FAILED, "unmap failed"),
    IVC_ERR(CUDA_ERROR_ARRAY_IS_MAPPED, "array is mapped"),
    IVC_ERR(CUDA_ERROR_ALREADY_MAPPED, "already mapped"),
    IVC_ERR(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image usable on this device"),
    IVC_ERR(CUDA_ERROR_ALREADY_ACQUIRED, "already acquired"),
    IVC_ERR(CUDA_ERROR_NOT_MAPPED, "not mapped"),
    IVC_ERR(CUDA_ERROR_NOT_MAPPED_AS_ARRAY, "not mapped as array"),
    IVC_ERR(CUDA_ERROR_NOT_MAPPED_AS_POINTER, "not mapped as pointer"),
    IVC_ERR(CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error"),
    IVC_ERR(CUDA_ERROR_UNSUPPORTED_LIMIT, "limit not supported"),
    IVC_ERR(CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "context already in use"),
    IVC_ERR(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access unsupported"),
    IVC_ERR(CUDA_ERROR_INVALID_PTX, "invalid PTX"),
    IVC_ERR(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, "invalid graphics context"),
    IVC_ERR(CUDA_ERROR_NVLINK_UNCORRECTABLE, "uncorrectable NVLink error"),
    IVC_ERR(CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "PTX JIT compiler not found"),
    IVC_ERR(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "unsupported PTX version"),
    IVC_ERR(CUDA_ERROR_JIT_COMPILATION_DISABLED, "JIT compilation disabled"),
    IVC_ERR(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "execution affinity not supported"),
    IVC_ERR(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, "device-side synchronization not supported"),
    IVC_ERR(CUDA_ERROR_CONTAINED, "contained error"),
    IVC_ERR(CUDA_ERROR_INVALID_SOURCE, "invalid source"),
    IVC_ERR(CUDA_ERROR_FILE_NOT_FOUND, "file not found"),
    IVC_ERR(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "shared object symbol not found"),
    IVC_ERR(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "shared object initialization failed"),
    IVC_ERR(CUDA_ERROR_OPERATING_SYSTEM, "operating system call failed"),
    IVC_ERR(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    IVC_ERR(CUDA_ERROR_ILLEGAL_STATE, "illegal state"),
    IVC_ERR(CUDA_ERROR_LOSSY_QUERY, "lossy query"),
    IVC_ERR(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    IVC_ERR(CUDA_ERROR_NOT_READY, "device not ready"),
    IVC_ERR(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    IVC_ERR(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch"),
    IVC_ERR(CUDA_ERROR_LAUNCH_TIMEOUT, "launch timed out"),
    IVC_ERR(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, "launch uses incompatible texturing"),
    IVC_ERR(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access already enabled"),
    IVC_ERR(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access not enabled"),
    IVC_ERR(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "primary context active"),
    IVC_ERR(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    IVC_ERR(CUDA_ERROR_ASSERT, "device-side assert triggered"),
    IVC_ERR(CUDA_ERROR_TOO_MANY_PEERS, "too many peers"),
    IVC_ERR(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "host memory already registered"),
    IVC_ERR(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "host memory not registered"),
    IVC_ERR(CUDA_ERROR_HARDWARE_STACK_ERROR, "hardware stack error"),
    IVC_ERR(CUDA_ERROR_ILLEGAL_INSTRUCTION, "illegal instruction"),
    IVC_ERR(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address"),
    IVC_ERR(CUDA_ERROR_INVALID_ADDRESS_SPACE, "invalid address space"),
    IVC_ERR(CUDA_ERROR_INVALID_PC, "invalid program counter"),
    IVC_ERR(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    IVC_ERR(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "cooperative launch too large"),
    IVC_ERR(CUDA_ERROR_TENSOR_MEMORY_LEAK, "tensor memory leak"),
    IVC_ERR(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    IVC_ERR(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    IVC_ERR(CUDA_ERROR_SYSTEM_NOT_READY, "system not ready"),
    IVC_ERR(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "system driver mismatch"),
    IVC_ERR(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, "compatibility mode not supported"),
    IVC_ERR(CUDA_ERROR_MPS_CONNECTION_FAILED, "MPS connection failed"),
    IVC_ERR(CUDA_ERROR_MPS_RPC_FAILURE, "MPS RPC failure"),
    IVC_ERR(CUDA_ERROR_MPS_SERVER_NOT_READY, "MPS server not ready"),
    IVC_ERR(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, "MPS client limit reached"),
    IVC_ERR(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, "MPS connection limit reached"),
    IVC_ERR(CUDA_ERROR_MPS_CLIENT_TERMINATED, "MPS client terminated"),
    IVC_ERR(CUDA_ERROR_CDP_NOT_SUPPORTED, "dynamic parallelism not supported"),
    IVC_ERR(CUDA_ERROR_CDP_VERSION_MISMATCH, "dynamic parallelism version mismatch"),
    IVC_ERR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted while capturing"),
    IVC_ERR(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "stream capture invalidated"),
    IVC_ERR(CUDA_ERROR_STREAM_CAPTURE_MERGE, "stream capture merge not permitted"),
    IVC_ERR(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "stream capture unmatched"),
    IVC_ERR(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "stream capture unjoined"),
    IVC_ERR(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "stream capture isolation violated"),
    IVC_ERR(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "implicit stream in capture"),
    IVC_ERR(CUDA_ERROR_CAPTURED_EVENT, "operation not permitted on a captured event"),
    IVC_ERR(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "stream capture on the wrong thread"),
    IVC_ERR(CUDA_ERROR_TIMEOUT, "wait timed out"),
    IVC_ERR(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, "graph update failed"),
    IVC_ERR(CUDA_ERROR_EXTERNAL_DEVICE, "external device error"),
    IVC_ERR(CUDA_ERROR_INVALID_CLUSTER_SIZE, "invalid cluster size"),
    IVC_ERR(CUDA_ERROR_FUNCTION_NOT_LOADED, "function not loaded"),
    IVC_ERR(CUDA_ERROR_INVALID_RESOURCE_TYPE, "invalid resource type"),
    IVC_ERR(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, "invalid resource configuration"),
    IVC_ERR(CUDA_ERROR_KEY_ROTATION, "key rotation error"),
    IVC_ERR(CUDA_ERROR_UNKNOWN, "unknown error"),
};
#undef IVC_ERR

const ErrorText* find_error(CUresult r) {
  for (const auto& e : kErrors)
    if (e.code == r) return &e;
  return nullptr;
}

}  // namespace

CUresult CUDAAPI cuGetErrorName(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = find_error(error);
  *pStr = e != nullptr ? e->name : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = find_error(error);
  *pStr = e != nullptr ? e->text : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuInit(unsigned int Flags) {
  return guarded(
      [&](State& s) -> CUresult {
        if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
        if (!s.initialized) {
          s.device_count = device_count_from_env();
          s.used.assign(static_cast<std::size_t>(s.device_count), 0);
          s.held_contexts.assign(static_cast<std::size_t>(s.device_count), 0);
          s.fault.assign(static_cast<std::size_t>(s.device_count), CUDA_SUCCESS);
          for (int d = 0; d < s.device_count; ++d) {
            const Handle h = s.new_handle();
            s.contexts[h] =
                Context{.device = d, .flags = 0, .primary = true, .refs = 0, .active = false};
            s.primary.push_back(h);
          }
          s.initialized = true;
          record_mps_environment();
        } else if (fuzzing()) {
          // The fuzz harness starts a worker per input, each standing for a
          // worker process of its own: a sticky fault (which on a GPU only a
          // new process recovers from) must not outlive the input that made it.
          s.fault.assign(static_cast<std::size_t>(s.device_count), CUDA_SUCCESS);
        }
        return s.device_count == 0 ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
      },
      /*needs_init=*/false);
}

CUresult CUDAAPI cuDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = kDriverVersion;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int* count) {
  return guarded([&](State& s) -> CUresult {
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *count = s.device_count;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGet(CUdevice* device, int ordinal) {
  return guarded([&](State& s) -> CUresult {
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetName(char* name, int len, CUdevice dev) {
  return guarded([&](State& s) -> CUresult {
    if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::snprintf(name, static_cast<std::size_t>(len), "%s", kDeviceName);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  return guarded([&](State& s) -> CUresult {
    if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    unsigned char b[16];
    device_uuid(dev, b);  // identity.h
    std::memcpy(uuid->bytes, b, sizeof b);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  return guarded([&](State& s) -> CUresult {
    if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = total_mem();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetAttribute(int* pi, CUdevice_attribute attrib, CUdevice dev) {
  return guarded([&](State& s) -> CUresult {
    if (pi == nullptr || attrib < 1 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
      return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    *pi = attribute(attrib, dev);
    return CUDA_SUCCESS;
  });
}

// A 1D texture over linear memory: at most 2^28 elements, and 2^32 bytes.
CUresult CUDAAPI cuDeviceGetTexture1DLinearMaxWidth(size_t* maxWidthInElements, CUarray_format format,
                                                    unsigned numChannels, CUdevice dev) {
  return guarded([&](State& s) -> CUresult {
    if (maxWidthInElements == nullptr || (numChannels != 1 && numChannels != 2 && numChannels != 4))
      return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::size_t bytes = 0;
    switch (format) {
      case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: bytes = 1; break;
      case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: bytes = 2; break;
      case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: bytes = 4; break;
      default: return CUDA_ERROR_INVALID_VALUE;
    }
    *maxWidthInElements = std::min<std::size_t>(std::size_t{1} << 28, (std::size_t{1} << 32) / (bytes * numChannels));
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetPCIBusId(char* pciBusId, int len, CUdevice dev) {
  return guarded([&](State& s) -> CUresult {
    if (pciBusId == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    std::snprintf(pciBusId, static_cast<std::size_t>(len), "%04x:%02x:%02x.0", kPciDomain,
                  pci_bus(dev), kPciDevice);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuDeviceGetByPCIBusId(CUdevice* dev, const char* pciBusId) {
  return guarded([&](State& s) -> CUresult {
    if (dev == nullptr || pciBusId == nullptr) return CUDA_ERROR_INVALID_VALUE;
    unsigned domain = 0, bus = 0, device = 0;
    // Both [domain]:bus:device.function forms are accepted, as by the real driver.
    if (std::sscanf(pciBusId, "%x:%x:%x", &domain, &bus, &device) != 3) {
      domain = 0;
      if (std::sscanf(pciBusId, "%x:%x", &bus, &device) != 2) return CUDA_ERROR_INVALID_VALUE;
    }
    for (int d = 0; d < s.device_count; ++d) {
      if (domain == kPciDomain && bus == static_cast<unsigned>(pci_bus(d)) &&
          device == kPciDevice) {
        *dev = d;
        return CUDA_SUCCESS;
      }
    }
    return CUDA_ERROR_INVALID_DEVICE;
  });
}

// The deprecated property block, from the same attributes.
CUresult CUDAAPI cuDeviceGetProperties(CUdevprop* prop, CUdevice dev) {
  return guarded([&](State& s) -> CUresult {
    if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    const auto a = [&](CUdevice_attribute x) { return attribute(x, dev); };
    *prop = CUdevprop{};
    prop->maxThreadsPerBlock = a(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    prop->maxThreadsDim[0] = a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X);
    prop->maxThreadsDim[1] = a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y);
    prop->maxThreadsDim[2] = a(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z);
    prop->maxGridSize[0] = a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
    prop->maxGridSize[1] = a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y);
    prop->maxGridSize[2] = a(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z);
    prop->sharedMemPerBlock = a(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
    prop->totalConstantMemory = a(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY);
    prop->SIMDWidth = a(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
    prop->memPitch = a(CU_DEVICE_ATTRIBUTE_MAX_PITCH);
    prop->regsPerBlock = a(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
    prop->clockRate = a(CU_DEVICE_ATTRIBUTE_CLOCK_RATE);
    prop->textureAlign = a(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT);
    return CUDA_SUCCESS;
  });
}
