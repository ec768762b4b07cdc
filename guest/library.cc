// Context-independent loading (cuLibrary*, cuKernel*) and the launch and
// capture queries the CUDA runtime and libraries make, on top of the
// forwarded module and launch calls.
//
// A library is a module loaded in the current context and a kernel is that
// module's function: the handles are the module's and function's. That is
// exactly right for programs that use one context per device, which is what
// the CUDA runtime does (it works in primary contexts); a library used from a
// second context is not loaded there again (docs/design.md, limitations).
#include <cuda.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "guest/guard.h"
#include "guest/runtime.h"

using ivcuda::guest::guard;
using ivcuda::guest::Runtime;

namespace {

std::uint64_t h(const void* p) { return reinterpret_cast<std::uint64_t>(p); }

}  // namespace

CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // The same switch as the real driver's; with either mode, ivcuda loads a
  // library when it is asked to.
  const char* env = std::getenv("CUDA_MODULE_LOADING");
  *mode = env != nullptr && std::strcmp(env, "EAGER") == 0 ? CU_MODULE_EAGER_LOADING : CU_MODULE_LAZY_LOADING;
  return CUDA_SUCCESS;
}

CUresult cuLibraryLoadData(CUlibrary* lib, const void* code, CUjit_option*, void**, unsigned int, CUlibraryOption*,
                           void**, unsigned int) {
  // JIT and library options (BINARY_IS_PRESERVED from cudart) change nothing
  // here: the image is copied to the host at load.
  if (lib == nullptr || code == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUmodule m = nullptr;
  const CUresult st = cuModuleLoadData(&m, code);
  if (st == CUDA_SUCCESS) *lib = reinterpret_cast<CUlibrary>(m);
  return st;
}

CUresult cuLibraryLoadFromFile(CUlibrary* lib, const char* path, CUjit_option*, void**, unsigned int,
                               CUlibraryOption*, void**, unsigned int) {
  if (lib == nullptr || path == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUmodule m = nullptr;
  const CUresult st = cuModuleLoad(&m, path);
  if (st == CUDA_SUCCESS) *lib = reinterpret_cast<CUlibrary>(m);
  return st;
}

CUresult cuLibraryUnload(CUlibrary lib) { return cuModuleUnload(reinterpret_cast<CUmodule>(lib)); }

CUresult cuLibraryGetModule(CUmodule* mod, CUlibrary lib) {
  if (mod == nullptr || lib == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *mod = reinterpret_cast<CUmodule>(lib);
  return CUDA_SUCCESS;
}

CUresult cuLibraryGetKernel(CUkernel* k, CUlibrary lib, const char* name) {
  if (k == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUfunction f = nullptr;
  const CUresult st = cuModuleGetFunction(&f, reinterpret_cast<CUmodule>(lib), name);
  if (st == CUDA_SUCCESS) *k = reinterpret_cast<CUkernel>(f);
  return st;
}

CUresult cuLibraryGetGlobal(CUdeviceptr* dptr, size_t* bytes, CUlibrary lib, const char* name) {
  return cuModuleGetGlobal(dptr, bytes, reinterpret_cast<CUmodule>(lib), name);
}

CUresult cuKernelGetFunction(CUfunction* f, CUkernel k) {
  if (f == nullptr || k == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *f = reinterpret_cast<CUfunction>(k);
  return CUDA_SUCCESS;
}

CUresult cuKernelGetAttribute(int* v, CUfunction_attribute a, CUkernel k, CUdevice) {
  return cuFuncGetAttribute(v, a, reinterpret_cast<CUfunction>(k));
}

CUresult cuKernelSetAttribute(CUfunction_attribute a, int v, CUkernel k, CUdevice) {
  return cuFuncSetAttribute(reinterpret_cast<CUfunction>(k), a, v);
}

CUresult cuKernelGetParamInfo(CUkernel k, size_t index, size_t* offset, size_t* size) {
  return cuFuncGetParamInfo(reinterpret_cast<CUfunction>(k), index, offset, size);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
  return guard([&] {
    if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < c->numAttrs; ++i) {
      const CUlaunchAttribute& a = c->attrs[i];
      // Attributes that change nothing about a plain launch are accepted;
      // the others (clusters, cooperative, programmatic launches) need the
      // host to launch with them, which is not forwarded yet.
      const bool benign = a.id == CU_LAUNCH_ATTRIBUTE_IGNORE ||
                          (a.id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && a.value.cooperative == 0) ||
                          a.id == CU_LAUNCH_ATTRIBUTE_PRIORITY;
      if (!benign) {
        ivcuda::guest::log_once("launchex", "cuLaunchKernelEx: launch attribute %d is not supported yet",
                                static_cast<int>(a.id));
        return CUDA_ERROR_NOT_SUPPORTED;
      }
    }
    return cuLaunchKernel(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                          c->sharedMemBytes, c->hStream, params, extra);
  });
}

// Stream capture is not forwarded (cuStreamBeginCapture answers
// NOT_SUPPORTED), so no stream is ever capturing; cuBLAS asks before every
// GEMM.
CUresult cuStreamIsCapturing(CUstream, CUstreamCaptureStatus* status) {
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetCaptureInfo(CUstream, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
                                const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* ndeps) {
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (id != nullptr) *id = 0;
  if (graph != nullptr) *graph = nullptr;
  if (deps != nullptr) *deps = nullptr;
  if (edges != nullptr) *edges = nullptr;
  if (ndeps != nullptr) *ndeps = 0;
  return CUDA_SUCCESS;
}

// Ids: the handles are unique for the life of the process on the host, so
// they serve as ids (CUDA only promises uniqueness).
CUresult cuCtxGetId(CUcontext ctx, unsigned long long* id) {
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::uint64_t c = ctx != nullptr ? h(ctx) : ivcuda::guest::current_ctx();
  if (c == 0) return CUDA_ERROR_INVALID_CONTEXT;
  *id = c;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetId(CUstream s, unsigned long long* id) {
  if (id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *id = h(s);
  return CUDA_SUCCESS;
}

// ---- occupancy and limits: answered by the host's driver

namespace {
CUresult occupancy(const ivcuda::proto::ReqOccupancy& r, std::int64_t* out) {
  return guard([&] {
    Runtime* rt = Runtime::current();
    if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult st;
    ivcuda::proto::RepValue rep{};
    st = rt->call<ivcuda::proto::Op::kOccupancy>(r, {}, &rep);
    if (st == CUDA_SUCCESS) *out = rep.value;
    return st;
  });
}
}  // namespace

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* n, CUfunction f, int block, size_t smem,
                                                              unsigned int flags) {
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ivcuda::proto::ReqOccupancy r{};
  r.ctx = ivcuda::guest::current_ctx();
  r.function = h(f);
  r.dynamic_smem = smem;
  r.block_size = block;
  r.flags = flags;
  r.kind = ivcuda::proto::kOccMaxActiveBlocks;
  std::int64_t v = 0;
  const CUresult st = occupancy(r, &v);
  if (st == CUDA_SUCCESS) *n = static_cast<int>(v);
  return st;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction f, int block, size_t smem) {
  return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n, f, block, smem, 0);
}

CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t* bytes, CUfunction f, int blocks, int block) {
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  ivcuda::proto::ReqOccupancy r{};
  r.ctx = ivcuda::guest::current_ctx();
  r.function = h(f);
  r.block_size = block;
  r.num_blocks = blocks;
  r.kind = ivcuda::proto::kOccAvailableDynamicSmem;
  std::int64_t v = 0;
  const CUresult st = occupancy(r, &v);
  if (st == CUDA_SUCCESS) *bytes = static_cast<size_t>(v);
  return st;
}

CUresult cuCtxGetLimit(size_t* value, CUlimit limit) {
  return guard([&] {
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Runtime* rt = Runtime::current();
    if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult st;
    const std::uint64_t ctx = ivcuda::guest::current_ctx();
    if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
    ivcuda::proto::RepValue rep{};
    st = rt->call<ivcuda::proto::Op::kCtxGetLimit>(ivcuda::proto::ReqLimit{ctx, 0, static_cast<std::int32_t>(limit), 0},
                                                  {}, &rep);
    if (st == CUDA_SUCCESS) *value = static_cast<size_t>(rep.value);
    return st;
  });
}

CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  return guard([&] {
    Runtime* rt = Runtime::current();
    if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    const std::uint64_t ctx = ivcuda::guest::current_ctx();
    if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
    return rt->call<ivcuda::proto::Op::kCtxSetLimit>(
        ivcuda::proto::ReqLimit{ctx, value, static_cast<std::int32_t>(limit), 0});
  });
}
