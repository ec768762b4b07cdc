// cuGetExportTable: the private tables that cudart and the CUDA libraries
// fetch from libcuda.so.1 (reference/cuda13-driver-contract.md, "Export
// tables", and cuda13-libraries-contract.md, section 3). The exported symbol
// itself is defined in export_tables.cc with cuda.h's prototype.
#pragma once

#include <cuda.h>

namespace ivcuda::guest {

// The context `ctx` is being destroyed (cuCtxDestroy), reset
// (cuDevicePrimaryCtxReset) or released for the last time: runs each
// destructor registered for it through the CONTEXT_LOCAL_STORAGE table, once,
// as dtor(ctx, key, value), and forgets its entries. Destructors run on the
// calling thread with no lock of this file held, so they may use the table
// again. cudart's destructor may make driver calls on `ctx`: call this while
// `ctx` is still valid, before its handle can be reused, and without holding
// locks those driver calls need.
void export_tables_context_gone(CUcontext ctx) noexcept;

}  // namespace ivcuda::guest
