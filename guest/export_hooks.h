// What the export tables (guest/export_tables.cc) need from the rest of the
// guest library. The real library implements these next to the driver
// functions they mirror; tests/api/export_hooks_fake.cc stands in for them so
// that the tables can be tested without a daemon.
//
// Each hook answers exactly what the named driver function would answer to
// this process, never throws, and may be called from any thread, before cuInit
// too (then it fails the way that driver function fails). The tables call them
// without holding any lock of their own.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace ivcuda::guest::hooks {

// The handle cuDevicePrimaryCtxRetain(out, dev) would return, without
// retaining the context and without making it current: cudart calls
// cuCtxSetCurrent with it before it retains. CUDA_ERROR_INVALID_DEVICE for a
// device that does not exist.
CUresult primary_context(CUdevice dev, CUcontext* out) noexcept;

// As cuCtxGetCurrent: the calling thread's current context, nullptr (with
// CUDA_SUCCESS) when it has none.
CUresult current_context(CUcontext* out) noexcept;

// As cuCtxGetId: `ctx` nullptr means the calling thread's current context.
CUresult context_id(CUcontext ctx, std::uint64_t* out) noexcept;

// As cuStreamGetId for `stream` as used in `ctx` (nullptr = current):
// nullptr is the context's NULL stream, CU_STREAM_LEGACY and
// CU_STREAM_PER_THREAD are accepted. Distinct streams must get distinct ids
// (cuBLAS keys its per-stream workspaces on them).
CUresult stream_id(CUcontext ctx, CUstream stream, std::uint64_t* out) noexcept;

// Exactly the value cuDriverGetVersion reports at the time of the call
// (cudart hashes it into the integrity check and compares with its own call).
CUresult driver_version(int* out) noexcept;

// As cuDeviceGetCount. The integrity check hashes devices 0..count-1, using
// the ordinal as the CUdevice (what cuDeviceGet hands out in this library).
CUresult device_count(int* out) noexcept;

// As cuDeviceGetUuid.
CUresult device_uuid(CUdevice dev, CUuuid* out) noexcept;

// As cuDeviceGetAttribute (the tables ask for PCI_DOMAIN_ID, PCI_BUS_ID and
// PCI_DEVICE_ID only).
CUresult device_attribute(CUdevice dev, CUdevice_attribute attr, int* out) noexcept;

// As cuModuleEnumerateFunctions, calling cb(user, f) for each kernel of `mod`
// with the handle cuModuleGetFunction would give for it. cb runs in the
// calling thread, after the host answered.
CUresult module_functions(CUmodule mod, void (*cb)(void* user, CUfunction f), void* user) noexcept;

}  // namespace ivcuda::guest::hooks
