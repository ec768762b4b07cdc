// The real library's side of export_hooks.h: the private export tables ask
// the same questions the public API answers.
#include "guest/export_hooks.h"
#include "guest/graphs.h"
#include "guest/guard.h"
#include "guest/runtime.h"

namespace ivcuda::guest::hooks {

CUresult primary_context(CUdevice dev, CUcontext* out) noexcept {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return guard([&] {
    CUresult st;
    Runtime* rt = Runtime::get(&st);
    if (rt == nullptr) return st;
    const auto* info = rt->device(dev, &st);
    if (info == nullptr) return st;
    *out = reinterpret_cast<CUcontext>(info->primary_ctx);
    return CUDA_SUCCESS;
  });
}

CUresult current_context(CUcontext* out) noexcept { return cuCtxGetCurrent(out); }

CUresult context_id(CUcontext ctx, std::uint64_t* out) noexcept {
  unsigned long long id = 0;
  const CUresult st = cuCtxGetId(ctx, &id);
  if (st == CUDA_SUCCESS) *out = id;
  return st;
}

CUresult stream_id(CUcontext, CUstream stream, std::uint64_t* out) noexcept {
  unsigned long long id = 0;
  const CUresult st = cuStreamGetId(stream, &id);
  if (st == CUDA_SUCCESS) *out = id;
  return st;
}

CUresult driver_version(int* out) noexcept { return cuDriverGetVersion(out); }
CUresult device_count(int* out) noexcept { return cuDeviceGetCount(out); }
CUresult device_uuid(CUdevice dev, CUuuid* out) noexcept { return cuDeviceGetUuid(out, dev); }
CUresult device_attribute(CUdevice dev, CUdevice_attribute attr, int* out) noexcept {
  return cuDeviceGetAttribute(out, attr, dev);
}
CUresult module_functions(CUmodule mod, void (*cb)(void*, CUfunction), void* user) noexcept {
  return for_each_module_function(mod, cb, user);
}

}  // namespace ivcuda::guest::hooks
