// libcuda.so.1's side of guest/nvml/query.h: NVML's queries ride the
// calling thread's channel like any driver call.
#include <algorithm>
#include <cstring>
#include <vector>

#include "guest/guard.h"
#include "guest/nvml/query.h"
#include "guest/runtime.h"

extern "C" __attribute__((visibility("default"))) int ivcuda_nvml_query_v1(
    const ivcuda::nvml_wire::ReqNvml* req, ivcuda::nvml_wire::RepNvml* rep, void* out) noexcept {
  using namespace ivcuda;
  return guest::guard([&] {
    if (req == nullptr || rep == nullptr || (out == nullptr && req->out_cap != 0)) return CUDA_ERROR_INVALID_VALUE;
    CUresult st;
    guest::Runtime* rt = guest::Runtime::get(&st);
    if (rt == nullptr) return st;
    std::vector<std::byte> extra;
    *rep = {};
    st = rt->call<proto::Op::kNvml>(*req, {}, rep, &extra);
    if (st != CUDA_SUCCESS) return st;
    // The host says how much it sent; trust neither that nor the record
    // beyond what the caller has room for.
    const std::size_t n = std::min<std::size_t>({extra.size(), rep->out_len, req->out_cap});
    if (n != 0) std::memcpy(out, extra.data(), n);
    rep->out_len = static_cast<std::uint32_t>(n);
    return CUDA_SUCCESS;
  });
}
