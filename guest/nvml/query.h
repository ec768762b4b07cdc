// The one private entry point between the guest's libnvidia-ml.so.1 and its
// libcuda.so.1. NVML speaks through the process's own connection (the worker
// that answers is the one serving this process, so memory and processes are
// this tenant's view), and there must be exactly one copy of the transport
// in a process: libcuda.so.1 owns it and exports this function; the NVML
// library finds it with dlsym at nvmlInit and answers
// NVML_ERROR_DRIVER_NOT_LOADED when libcuda.so.1 is not ivcuda's.
//
// The name carries the ABI's version: a change to the signature or to the
// wire structs' meaning gets a new name, never a new meaning for this one.
#pragma once

#include <cstdint>

#include "ivcuda/nvml_wire.h"

// Sends `*req` (proto::Op::kNvml) and waits for the reply: `*rep` gets the
// worker's answer, `out` (req->out_cap bytes; may be null when out_cap is 0)
// the bytes after it, and rep->out_len is set to what was copied there
// (never more than out_cap). Connects to ivcudad on first use, as cuInit
// does: a program may use NVML without ever calling cuInit. Returns the
// transport's CUresult (CUDA_SUCCESS when a reply came; then rep->ret is
// NVML's answer).
extern "C" int ivcuda_nvml_query_v1(const ivcuda::nvml_wire::ReqNvml* req, ivcuda::nvml_wire::RepNvml* rep,
                                    void* out) noexcept;

namespace ivcuda::nvml {
inline constexpr const char* kQuerySymbol = "ivcuda_nvml_query_v1";
using QueryFn = int (*)(const nvml_wire::ReqNvml*, nvml_wire::RepNvml*, void*) noexcept;
}  // namespace ivcuda::nvml
