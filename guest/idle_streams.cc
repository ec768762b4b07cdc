// Streams and contexts known to be idle, answered in the guest (issue 31).
//
// A stream the host has found idle stays idle until this process puts work
// in it: nothing else can (another process's work lives in its own streams,
// and a stream waiting on another process's event waits only for what was
// recorded before the wait was queued). So when the host has answered
// cuStreamQuery or cuStreamSynchronize with SUCCESS, asking again before any
// request that could add work has been sent gets the same answer - and the
// library gives it without a round trip. PyTorch's .item() (a small read
// back, then cudaStreamSynchronize) and a program polling an idle stream are
// the cases this serves.
//
// The book is one counter, the work epoch: every request that may leave work
// behind on the GPU moves it once it is in the ring, and so does every call
// that fails (a sticky error must reach the next caller). A request that
// finds a stream or context idle books it under the epoch read before the
// request was sent; the booking holds while the epoch has not moved. The
// requests that leave no work are a short list below; every other request
// moves the epoch, so a request missing from the list costs a round trip,
// never a wrong answer.
//
// What counts as found idle: cuStreamQuery / cuStreamSynchronize that
// succeeded (that stream), cuCtxSynchronize that succeeded (every stream of
// that context), and a small read back into pageable memory made in a stream
// (its reply comes after everything queued in the stream before it: the
// worker copies only once the stream has reached the copy). Captures take
// the long way: while one may be under way nothing is answered here.
// IVCUDA_IDLE_ANSWERS=off sends every query.
#include <cuda.h>
#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "guest/graphs.h"
#include "guest/runtime.h"

namespace ivcuda::guest {

namespace {

// A fork child answers nothing here: the books are its parent's.
std::atomic<bool> g_forked{false};

bool idle_answers_on() {
  static const bool on = [] {
    const bool want = switched_on("IVCUDA_IDLE_ANSWERS");
    if (want) ::pthread_atfork(nullptr, nullptr, [] { g_forked.store(true, std::memory_order_relaxed); });
    return want;
  }();
  return on && !g_forked.load(std::memory_order_relaxed);
}

// Requests whose work, if any, is over when their reply comes: the queries
// and synchronisations, and reads the worker answers from memory. Everything
// else may leave work queued on the GPU.
bool leaves_no_work(proto::Op op) {
  using proto::Op;
  switch (op) {
    case Op::kStreamQuery:
    case Op::kStreamSynchronize:
    case Op::kCtxSynchronize:
    case Op::kEventQuery:
    case Op::kEventSynchronize:
    case Op::kEventElapsedTime:
    case Op::kMemcpyDtoHInline:  // its reply carries the copied bytes
    case Op::kMemGetInfo:
    case Op::kMemGetAddressRange:
    case Op::kFuncGetAttribute:
    case Op::kDeviceInfo:
    case Op::kPrimaryGetState:
    case Op::kOccupancy:
    case Op::kOccupancyCluster:
    case Op::kStreamGetPriority:
    case Op::kCtxGetLimit:
    case Op::kPeerQuery:
    case Op::kMemGranularity:
    case Op::kMemGetAccess:
    case Op::kMemGetProperties:
    case Op::kStreamCaptureInfo:
    case Op::kNvml:
    case Op::kFlush:
    case Op::kFlushWait:
      return true;
    default:
      return false;
  }
}

bool is_default_stream(std::uint64_t s) {
  return s == 0 || s == reinterpret_cast<std::uint64_t>(CU_STREAM_LEGACY) ||
         s == reinterpret_cast<std::uint64_t>(CU_STREAM_PER_THREAD);
}

}  // namespace

// True when `op` (a stream query or synchronise, a context synchronise) is
// known to succeed: the host found the same stream or context idle under
// `epoch`, the current one.
bool Runtime::answer_idle(proto::Op op, const void* req, std::size_t req_size, std::uint64_t epoch) {
  if (!idle_answers_on()) return false;
  if (op != proto::Op::kStreamQuery && op != proto::Op::kStreamSynchronize && op != proto::Op::kCtxSynchronize)
    return false;
  // A capture turns some of these into errors, and its own bookkeeping is
  // the host's.
  if (any_capture()) return false;
  std::uint64_t ctx = 0;
  std::uint64_t stream = 0;
  bool whole_ctx = op == proto::Op::kCtxSynchronize;
  if (whole_ctx) {
    proto::ReqCtx r{};
    if (!read_request(req, req_size, &r)) return false;
    ctx = r.ctx;
  } else {
    proto::ReqHandle r{};
    if (!read_request(req, req_size, &r)) return false;
    ctx = r.ctx;
    stream = r.handle;
  }
  // The context a stream belongs to, for a context found idle: a default
  // stream is the calling context's, any other is booked with its own.
  std::uint64_t owner = ctx;
  if (!whole_ctx && !is_default_stream(stream)) {
    std::lock_guard lk(books_mu);
    const auto it = streams.find(stream);
    owner = it == streams.end() ? 0 : it->second;
  }
  std::lock_guard lk(idle_mu_);
  if (idle_epoch_ != epoch) return false;
  if (owner != 0 && idle_ctxs_.count(owner) != 0) return true;
  return !whole_ctx && idle_streams_.count({ctx, stream_key(stream)}) != 0;
}

void Runtime::note_idle(proto::Op op, const void* req, std::size_t req_size, std::uint64_t epoch) {
  std::uint64_t ctx = 0;
  std::uint64_t stream = 0;
  bool whole_ctx = false;
  switch (op) {
    case proto::Op::kStreamQuery:
    case proto::Op::kStreamSynchronize: {
      proto::ReqHandle r{};
      if (!read_request(req, req_size, &r)) return;
      ctx = r.ctx;
      stream = r.handle;
      break;
    }
    case proto::Op::kCtxSynchronize: {
      proto::ReqCtx r{};
      if (!read_request(req, req_size, &r)) return;
      ctx = r.ctx;
      whole_ctx = true;
      break;
    }
    case proto::Op::kMemcpyDtoHInline: {
      proto::ReqCopy r{};
      if (!read_request(req, req_size, &r) || (r.flags & proto::kAsync) == 0) return;
      ctx = r.ctx;
      stream = r.stream;
      break;
    }
    default:
      return;
  }
  std::lock_guard lk(idle_mu_);
  // Only a finding under the current epoch is worth booking; the books of an
  // older epoch are stale as a whole.
  if (epoch != work_epoch_.load(std::memory_order_acquire)) return;
  if (epoch != idle_epoch_) {
    idle_streams_.clear();
    idle_ctxs_.clear();
    idle_epoch_ = epoch;
  }
  if (whole_ctx)
    idle_ctxs_.insert(ctx);
  else
    idle_streams_.insert({ctx, stream_key(stream)});
}

// After a request: the epoch moves past anything that may have left work
// (once the request is in the ring: a booking made under the old epoch is
// stale from then on) and past any failure; a success that found something
// idle is booked.
void Runtime::note_after_call(proto::Op op, const void* req, std::size_t req_size, std::uint64_t epoch,
                              CUresult st) {
  if (!idle_answers_on()) return;
  if ((st != CUDA_SUCCESS && st != CUDA_ERROR_NOT_READY) || !leaves_no_work(op)) {
    work_epoch_.fetch_add(1, std::memory_order_acq_rel);
    return;
  }
  if (st == CUDA_SUCCESS && !any_capture()) note_idle(op, req, req_size, epoch);
}

}  // namespace ivcuda::guest
