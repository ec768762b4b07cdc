// Host functions (cuLaunchHostFunc): the function runs in the guest. The guest
// side, and how the call reaches it, is guest/hostfunc.cc.
#include "host-daemon/worker/worker_internal.h"
#include "ring/validate.h"

namespace ivcuda::host {

using namespace ivcuda::proto;
using namespace detail;

// cuLaunchHostFunc / cuStreamAddCallback (docs/design.md, "Host functions").
// The guest's function runs in the guest; the stream only has to tell it when
// the earlier work is done and hold later work until it returns. Two stream
// memory operations on arena words do both on the GPU: no host thread waits.
CUresult Worker::on_HostFunc(Call& c) {
  const auto r = c.req<ReqHostFunc>();
  constexpr std::uint64_t kWord = sizeof(std::uint32_t);
  // Both words must be aligned and inside this guest's own arena alias: the
  // GPU would otherwise store to, or spin on, memory the guest does not own.
  const auto in_arena = [&](std::uint64_t d) {
    return arena_dev_ != 0 && d % kWord == 0 && ring::span_within(d, kWord, arena_dev_, l_.arena_size);
  };
  if (!in_arena(r.reached) || !in_arena(r.done) || r.seq == 0 || r.seq >= kHostFuncFailed)
    return CUDA_ERROR_INVALID_VALUE;
  // From here on the guest's dispatcher watches `reached`: tell it when the
  // pair never gets enqueued, else it would keep the call pending for ever.
  // (arena_range() holds: in_arena() checked the same span.)
  const auto fail = [&](CUresult st) {
    auto* w = reinterpret_cast<std::uint32_t*>(arena_ptr(l_.arena_off + (r.reached - arena_dev_)));
    ring::store_release(*w, r.seq | kHostFuncFailed);  // pairs with load_acquire in guest/hostfunc.cc
    return st;
  };
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return fail(st);
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return fail(st);
  // A captured pair would be replayed with a stale seq: the guest's function
  // would run once and later replays would not wait for it.
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  if (CUresult st = cu_.cuStreamIsCapturing(s, &cs); st != CUDA_SUCCESS) return fail(st);
  if (cs != CU_STREAM_CAPTURE_STATUS_NONE) return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  if (CUresult st = cu_.cuStreamWriteValue32(s, r.reached, r.seq, 0); st != CUDA_SUCCESS) return fail(st);
  // The write is queued: the guest will run the function once the stream gets
  // there, so a failing wait only loses the ordering of later work.
  return cu_.cuStreamWaitValue32(s, r.done, r.seq, CU_STREAM_WAIT_VALUE_GEQ);
}

}  // namespace ivcuda::host
