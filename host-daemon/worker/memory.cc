// Device memory, copies and memsets, page-locked (arena) memory: every
// address and length is checked against what the guest owns (owns_device,
// arena_range) before the driver sees it. The guest side is guest/memory.cc.
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <ctime>

#include "host-daemon/shared/log.h"
#include "host-daemon/shared/rules.h"
#include "host-daemon/shared/from_worker.h"
#include "host-daemon/worker/worker_internal.h"
#include "ring/validate.h"

namespace ivcuda::host {

using namespace ivcuda::proto;
using namespace detail;

CUresult Worker::on_MemAlloc(Call& c) {
  const auto r = c.req<ReqMemAlloc>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  RepMemAlloc rep{};
  CUdeviceptr d = 0;
  CUresult st = CUDA_SUCCESS;
  std::uint64_t size = 0;
  Charge charge;
  if (r.elem_size == 0) {
    if (r.bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    // Charged before the driver sees it: past the quota, nothing is allocated.
    if (!(charge = quota_.take(r.bytes))) return CUDA_ERROR_OUT_OF_MEMORY;
    st = cu_.cuMemAlloc(&d, r.bytes);
    size = r.bytes;
  } else {
    // A pitch allocation: its rows at least, then the padding the driver chose.
    std::uint64_t rows = 0;
    if (!mul_ok(r.width, r.height, &rows)) return CUDA_ERROR_INVALID_VALUE;
    if (!(charge = quota_.take(rows))) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t pitch = 0;
    st = cu_.cuMemAllocPitch(&d, &pitch, r.width, r.height, r.elem_size);
    rep.pitch = pitch;
    if (st == CUDA_SUCCESS && !mul_ok(pitch, r.height, &size)) return CUDA_ERROR_INVALID_VALUE;
    if (st == CUDA_SUCCESS && size > rows && !charge.grow(size - rows)) {
      cu_.cuMemFree(d);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  if (st != CUDA_SUCCESS) return st;
  ranges_[d] = DevRange{size, r.ctx, RangeKind::kAlloc, 0, std::move(charge)};
  IVLOG_DEBUG("guest %u: allocated 0x%llx + %llu", cfg_.guest_id, static_cast<unsigned long long>(d),
              static_cast<unsigned long long>(size));
  rep.dptr = d;
  c.set_reply(rep);
  return CUDA_SUCCESS;
}

CUresult Worker::on_MemFree(Call& c) {
  const auto r = c.req<ReqPtr>();
  auto it = ranges_.find(r.dptr);
  if (it == ranges_.end() || it->second.kind != RangeKind::kAlloc) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = use_ctx(it->second.ctx); st != CUDA_SUCCESS) return st;
  // Both hooks withdraw what was exported; either may keep it for a sibling
  // process (freed at the last IPC close or pool-import free). Both run.
  const bool ipc_done = ipc_on_free(r.dptr);
  const bool pool_done = pool_on_free(r.dptr, it->second.size);
  if (!ipc_done || !pool_done) return CUDA_SUCCESS;
  // A context the tenant's next guest may have (keep.cc): the bytes are
  // zeroed before the driver has them back, once the guest's work that
  // might still use them is done (cudaFree waits for it too).
  if (cfg_.keep_contexts && keepable_) {
    if (const CUresult st = cu_.cuCtxSynchronize(); st != CUDA_SUCCESS) return st;
    if (const CUresult st = scrub_range(r.dptr, it->second.size); st != CUDA_SUCCESS) unkeep("zeroing a freed allocation failed");
  }
  const CUresult st = cu_.cuMemFree(r.dptr);
  if (st == CUDA_SUCCESS) {
    pool_freed(it->second);  // a stream-ordered allocation's memory stays its pool's (pools.cc)
    ranges_.erase(it);
  }
  return st;
}

CUresult Worker::on_MemGetInfo(Call& c) {
  const auto r = c.req<ReqCtx>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  reap_mem_releases();  // what sparse arrays no longer map counts as free (arrays.cc)
  settle_pools(true);   // what pools gave back since (pools.cc)
  size_t f = 0, t = 0;
  const CUresult st = cu_.cuMemGetInfo(&f, &t);
  // Under a quota the tenant's view: the quota as the total, what is left of
  // it as free (never more than the device has), so that frameworks that size
  // themselves from these figures stay inside it.
  std::uint64_t total = t, free = f;
  if (st == CUDA_SUCCESS) {
    publish_mem_view(&total, &free);  // before the view narrows them
    quota_.view(&total, &free);
  }
  c.set_reply(RepMemInfo{free, total});
  return st;
}

// The superblock's memory view (shm_abi.h, line 9), from which the guest
// library answers cuMemGetInfo itself under a quota while the device has
// ample room beyond it (guest/memory.cc). Written after every request that
// changed the guest's charge, before its reply, and with the device's figures
// at each cuMemGetInfo the guest still sends; unusable (no sample) while pools
// or sparse releases could change the figures. Process mode only: a VM's
// processes share one quota and one superblock, but not one worker.
void Worker::publish_mem_view(const std::uint64_t* device_total, const std::uint64_t* device_free) {
  if (cfg_.vm != nullptr) return;
  auto* sb = ring::superblock(bar_.data());
  // The sequence is kept privately (the guest can write the line too).
  ring::store_relaxed(sb->mem_view_seq, ++view_seq_);  // odd: being written
  ring::full_fence();  // (TSan builds: see ring/spsc_ring.h)
  view_limit_ = quota_.limit();
  view_used_ = quota_.used();
  view_usable_ = mem_view_usable();
  ring::store_relaxed(sb->mem_limit, view_limit_);
  ring::store_relaxed(sb->mem_used, view_used_);
  if (!view_usable_) {
    ring::store_relaxed(sb->mem_sampled_ns, std::uint64_t{0});  // the guest asks
  } else if (device_total != nullptr && device_free != nullptr) {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    ring::store_relaxed(sb->mem_device_total, *device_total);
    ring::store_relaxed(sb->mem_device_free, *device_free);
    ring::store_relaxed(sb->mem_sampled_ns,
                        static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec));
  }
  ring::store_release(sb->mem_view_seq, ++view_seq_);  // even: done
}

CUresult Worker::on_MemGetAddressRange(Call& c) {
  const auto r = c.req<ReqPtr>();
  auto it = ranges_.upper_bound(r.dptr);
  if (it == ranges_.begin()) return CUDA_ERROR_NOT_FOUND;
  --it;
  if (!ring::span_within(r.dptr, 1, it->first, it->second.size)) return CUDA_ERROR_NOT_FOUND;
  c.set_reply(RepRange{it->first, it->second.size});
  return CUDA_SUCCESS;
}

CUresult Worker::on_Memset(Call& c) {
  const auto r = c.req<ReqMemset>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  if (r.elem_size != 1 && r.elem_size != 2 && r.elem_size != 4) return CUDA_ERROR_INVALID_VALUE;
  std::uint64_t row_bytes, extent;
  if (!mul_ok(r.width, r.elem_size, &row_bytes)) return CUDA_ERROR_INVALID_VALUE;
  const bool two_d = r.pitch != 0;
  if (two_d) {
    if (!span2d(r.pitch, row_bytes, r.height, &extent)) return CUDA_ERROR_INVALID_VALUE;
  } else {
    extent = row_bytes;
  }
  CUstream s = nullptr;
  const bool async = (r.flags & kAsync) != 0;
  if (async)
    if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  // Into a capture, a placeholder range is recorded, as the driver records it.
  if (extent != 0 && !owns_device(r.dptr, extent) &&
      !(async && placeholder_range(r.dptr, extent) && capturing(s)))
    return CUDA_ERROR_INVALID_VALUE;
  const auto v8 = static_cast<unsigned char>(r.value);
  const auto v16 = static_cast<unsigned short>(r.value);
  if (!two_d) {
    switch (r.elem_size) {
      case 1: return async ? cu_.cuMemsetD8Async(r.dptr, v8, r.width, s) : cu_.cuMemsetD8(r.dptr, v8, r.width);
      case 2: return async ? cu_.cuMemsetD16Async(r.dptr, v16, r.width, s) : cu_.cuMemsetD16(r.dptr, v16, r.width);
      default: return async ? cu_.cuMemsetD32Async(r.dptr, r.value, r.width, s) : cu_.cuMemsetD32(r.dptr, r.value, r.width);
    }
  }
  switch (r.elem_size) {
    case 1: return async ? cu_.cuMemsetD2D8Async(r.dptr, r.pitch, v8, r.width, r.height, s)
                         : cu_.cuMemsetD2D8(r.dptr, r.pitch, v8, r.width, r.height);
    case 2: return async ? cu_.cuMemsetD2D16Async(r.dptr, r.pitch, v16, r.width, r.height, s)
                         : cu_.cuMemsetD2D16(r.dptr, r.pitch, v16, r.width, r.height);
    default: return async ? cu_.cuMemsetD2D32Async(r.dptr, r.pitch, r.value, r.width, r.height, s)
                          : cu_.cuMemsetD2D32(r.dptr, r.pitch, r.value, r.width, r.height);
  }
}

CUresult Worker::on_MemcpyHtoDInline(Call& c) {
  const auto r = c.req<ReqCopy>();
  const auto data = c.tail<ReqCopy>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  if (data.size() != r.bytes || !owns_device(r.dst, r.bytes)) return CUDA_ERROR_INVALID_VALUE;
  if (r.bytes == 0) return CUDA_SUCCESS;
  // Pageable source either way: the driver has staged it when the call
  // returns, so our private copy may be reused right after.
  if ((r.flags & kAsync) != 0) {
    CUstream s;
    if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
    if (CUresult st = refuse_in_capture(s); st != CUDA_SUCCESS) return st;
    return cu_.cuMemcpyHtoDAsync(r.dst, data.data(), r.bytes, s);
  }
  // A synchronous copy the guest waits for (a destination outside its
  // books): the driver's own synchronous copy, which answers a bad one at
  // once as a native program sees it.
  if ((c.rec.hdr.flags & abi::kRecNeedsReply) != 0) return cu_.cuMemcpyHtoD(r.dst, data.data(), r.bytes);
  // A synchronous copy is posted: CUDA's returns once a pageable source is
  // staged, before the DMA. It goes where the driver puts a synchronous
  // copy, the legacy stream, and later work in the context's other streams
  // is ordered after it (order_after_copies).
  const CUresult st = cu_.cuMemcpyHtoDAsync(r.dst, data.data(), r.bytes, CU_STREAM_LEGACY);
  if (st == CUDA_SUCCESS) track_copy(c.ch, r.ctx, CU_STREAM_LEGACY, false, true);
  return st;
}

// Copies between the arena and the device. From and to page-locked memory
// they are the driver's own copies; a range in the channel's own staging
// area is a chunk of a pipelined pageable copy (staged_copy).
CUresult Worker::on_MemcpyHtoDArena(Call& c) { return arena_copy(c, true); }

CUresult Worker::on_MemcpyDtoHArena(Call& c) { return arena_copy(c, false); }

CUresult Worker::arena_copy(Call& c, bool to_device) {
  const auto r = c.req<ReqCopy>();
  if (ring::in_staging(l_, c.ch.index, r.arena_off, r.bytes)) return staged_copy(c, r, to_device);
  const CUdeviceptr dev = to_device ? r.dst : r.src;
  if (CUresult e = use_ctx(r.ctx); e != CUDA_SUCCESS) return e;
  if (!host_range(r.arena_off, r.bytes) || !owns_device(dev, r.bytes)) return CUDA_ERROR_INVALID_VALUE;
  if (r.bytes == 0) return CUDA_SUCCESS;
  void* host = arena_ptr(r.arena_off);
  if ((r.flags & kAsync) != 0) {
    CUstream s;
    if (CUresult e = resolve_stream(r.ctx, r.stream, &s); e != CUDA_SUCCESS) return e;
    const CUresult e = to_device ? cu_.cuMemcpyHtoDAsync(dev, host, r.bytes, s)
                                 : cu_.cuMemcpyDtoHAsync(host, dev, r.bytes, s);
    return e == CUDA_SUCCESS && (r.flags & kWaitStream) != 0 ? cu_.cuStreamSynchronize(s) : e;
  }
  return to_device ? cu_.cuMemcpyHtoD(dev, host, r.bytes) : cu_.cuMemcpyDtoH(host, dev, r.bytes);
}

// ---------------------------------------------------------- posted copies
//
// A staged chunk's DMA is issued asynchronously, in the guest's stream
// (...Async) or, for a synchronous copy, in the legacy stream, where the
// driver puts its own synchronous copies. An event recorded behind it joins
// the channel's queue of copies in flight (Channel::copies), which the loop
// polls (reap_copies): staging_done is bumped as chunks leave the front, in
// the order the guest posted them, whether they succeeded or not - the guest
// reuses (HtoD) or reads (DtoH) a slot only once the counter says so, and
// must never wait forever. A chunk the host refuses, or whose copy fails
// when issued, still takes its place in the queue. Errors found when a
// chunk completes are posted errors: the next synchronising call reports
// them. A call on the channel that must come after its copies (the last
// chunk of a copy sent as a call, Flush, DtoHInline) is parked until the
// queue is empty. The worker never waits for a chunk itself, so the DMA
// engine has the next chunk queued while the guest fills or drains another
// slot; a chunk behind a long kernel in its stream waits there, as it would
// natively.

namespace {
// More copies in flight on one channel than a guest that waits for its
// slots can post: beyond it the worker waits for the oldest, so that a
// guest ignoring staging_done cannot make it hold events without bound.
constexpr std::size_t kMaxCopiesInFlight = 64;
// Events kept per context for the next chunks.
constexpr std::size_t kSpareEvents = 8;
}  // namespace

CUresult Worker::staged_copy(Call& c, const ReqCopy& r, bool to_device) {
  const CUdeviceptr dev = to_device ? r.dst : r.src;
  const bool async = (r.flags & kAsync) != 0;
  CUstream s = CU_STREAM_LEGACY;
  std::uint64_t event_ctx = r.ctx;  // an event is recorded in a stream of its own context
  const CUresult st = [&] {
    if (CUresult e = use_ctx(r.ctx); e != CUDA_SUCCESS) return e;
    if (!owns_device(dev, r.bytes)) return CUDA_ERROR_INVALID_VALUE;  // the staging area is arena
    if (r.bytes == 0) return CUDA_SUCCESS;
    if (async) {
      if (CUresult e = resolve_stream(r.ctx, r.stream, &s); e != CUDA_SUCCESS) return e;
      if (CUresult e = refuse_in_capture(s); e != CUDA_SUCCESS) return e;
      if (const StreamEntry* e = streams_.find(r.stream)) event_ctx = e->ctx;
    }
    void* host = arena_ptr(r.arena_off);
    return to_device ? cu_.cuMemcpyHtoDAsync(dev, host, r.bytes, s) : cu_.cuMemcpyDtoHAsync(host, dev, r.bytes, s);
  }();
  if (st != CUDA_SUCCESS || r.bytes == 0) {
    finished_copy(c.ch, true);
    return st;
  }
  track_copy(c.ch, event_ctx, s, true, to_device && !async);
  return (c.rec.hdr.flags & abi::kRecNeedsReply) != 0 ? park_on_copies(c) : CUDA_SUCCESS;
}

// A copy just issued in `s`: its event joins the channel's queue. `fence`:
// a synchronous HtoD, which the context's streams are ordered after.
void Worker::track_copy(Channel& ch, std::uint64_t ctx, CUstream s, bool counted, bool fence) {
  if (ch.copies.size() >= kMaxCopiesInFlight) wait_copies(ch, kMaxCopiesInFlight - 1);
  Channel::InFlight f{nullptr, ctx, s, counted};
  // Marks in a row in one stream share an event: recorded again, it stands
  // behind the newer copy, and so behind both.
  const bool again = !counted && !ch.copies.empty() && !ch.copies.back().counted &&
                     ch.copies.back().ctx == ctx && ch.copies.back().stream == s &&
                     ch.copies.back().done != nullptr;
  CUevent ev = again ? ch.copies.back().done : nullptr;
  if (ev == nullptr && use_ctx(ctx) == CUDA_SUCCESS) ev = copy_event(ctx);
  if (ev != nullptr && cu_.cuEventRecord(ev, s) == CUDA_SUCCESS) {
    if (fence) {
      CopyCtx& cc = copy_ctxs_[ctx];
      cc.fence = ev;
      cc.fence_seq = ++copy_fences_;
    }
    if (again) return;
    f.done = ev;
  } else {
    // Nothing to poll: this copy, at least, is waited for here.
    if (ev != nullptr) {
      if (again) ch.copies.back().done = nullptr;
      release_copy_event(ctx, ev, true);
    }
    post_error(cu_.cuStreamSynchronize(s), "staged copy");
  }
  ch.copies.push_back(f);
}

// A chunk that is over when issued (refused, failed, or empty) still counts
// in its turn.
void Worker::finished_copy(Channel& ch, bool counted) {
  if (ch.copies.empty()) {
    if (counted) ring::bump_staging_done(bar_.data(), l_, ch.index);
    return;
  }
  ch.copies.push_back(Channel::InFlight{nullptr, 0, nullptr, counted});
}

// An event for a copy in `ctx`, which is current.
CUevent Worker::copy_event(std::uint64_t ctx) {
  CopyCtx& cc = copy_ctxs_[ctx];
  if (!cc.spare.empty()) {
    CUevent ev = cc.spare.back();
    cc.spare.pop_back();
    return ev;
  }
  CUevent ev = nullptr;
  return cu_.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS ? ev : nullptr;
}

void Worker::release_copy_event(std::uint64_t ctx, CUevent ev, bool broken) {
  auto it = copy_ctxs_.find(ctx);
  if (it != copy_ctxs_.end() && it->second.fence == ev) it->second.fence = nullptr;
  if (!broken && it != copy_ctxs_.end() && it->second.spare.size() < kSpareEvents) {
    it->second.spare.push_back(ev);
    return;
  }
  (void)cu_.cuEventDestroy(ev);
}

// Takes finished copies off the front of the queue. Returns how many.
int Worker::reap_copies(Channel& ch) {
  int n = 0;
  while (!ch.copies.empty()) {
    Channel::InFlight& f = ch.copies.front();
    if (f.done != nullptr) {
      const CUresult st = cu_.cuEventQuery(f.done);
      if (st == CUDA_ERROR_NOT_READY) break;
      post_error(st, "staged copy");
      release_copy_event(f.ctx, f.done, st != CUDA_SUCCESS);
    }
    if (f.counted) ring::bump_staging_done(bar_.data(), l_, ch.index);
    ch.copies.pop_front();
    ++n;
  }
  return n;
}

// Before a reply that reports posted errors: copies that finished meanwhile
// report theirs now, not at some later call.
void Worker::reap_all_copies() {
  for (auto& chp : channels_)
    if (chp && !chp->copies.empty()) reap_copies(*chp);
}

// Waits here until at most `keep` copies of the channel are in flight.
void Worker::wait_copies(Channel& ch, std::size_t keep) {
  while (ch.copies.size() > keep) {
    Channel::InFlight& f = ch.copies.front();
    if (f.done != nullptr) {
      const CUresult st = cu_.cuEventSynchronize(f.done);
      post_error(st, "staged copy");
      release_copy_event(f.ctx, f.done, st != CUDA_SUCCESS);
      f.done = nullptr;
    }
    reap_copies(ch);
  }
}

// A context is about to go (its own destroy, the primary's last release or
// reset): its copies are waited for and its events destroyed while it
// lives. The entries stay in their queues, done, and are counted in turn.
void Worker::settle_copies(std::uint64_t ctx) {
  settle_host_polls(ctx);  // host_polls.cc: their events are the context's spare ones
  for (auto& chp : channels_) {
    if (!chp) continue;
    for (Channel::InFlight& f : chp->copies) {
      if (f.ctx != ctx || f.done == nullptr) continue;
      post_error(cu_.cuEventSynchronize(f.done), "staged copy");
      (void)cu_.cuEventDestroy(f.done);
      f.done = nullptr;
    }
  }
  auto it = copy_ctxs_.find(ctx);
  if (it == copy_ctxs_.end()) return;
  for (CUevent ev : it->second.spare) (void)cu_.cuEventDestroy(ev);
  free_landings(it->second);  // their copies are over: the events above were waited for
  copy_ctxs_.erase(it);
}

void Worker::settle_copies_before(Op op, const Call& c) {
  std::uint64_t ctx = 0;
  if (op == Op::kCtxDestroy) {
    ctx = c.req<ReqHandle>().handle;
  } else if (op == Op::kPrimaryRelease || op == Op::kPrimaryReset) {
    const auto r = c.req<ReqDevice>();
    if (!valid_device(r.device)) return;
    ctx = primary_[dev_index(r.device)];
  } else {
    return;
  }
  settle_copies(ctx);
}

// The worker ends or the guest is evicted: its contexts go next, and with
// them whatever is in flight. The counter still moves for every chunk.
void Worker::abandon_copies() noexcept {
  abandon_host_polls();  // host_polls.cc
  for (auto& chp : channels_) {
    if (!chp) continue;
    for (Channel::InFlight& f : chp->copies) {
      if (f.done != nullptr) (void)cu_.cuEventDestroy(f.done);
      if (f.counted) ring::bump_staging_done(bar_.data(), l_, chp->index);
    }
    chp->copies.clear();
  }
  for (auto& [ctx, cc] : copy_ctxs_) {
    for (CUevent ev : cc.spare) (void)cu_.cuEventDestroy(ev);
    free_landings(cc);
  }
  copy_ctxs_.clear();
}

// Work the guest puts in one of its streams (resolve_stream) comes after the
// synchronous HtoDs the stream's context posted before it. The legacy
// stream orders the blocking streams after them already; a non-blocking one
// waits for the event behind the newest, once per copy, as if the copy had
// returned only with its data on the device. Captures take no outside
// event: a capturing stream is left alone (a copy is never a node of its
// graph).
void Worker::order_after_copies(StreamEntry& s) {
  if (copy_ctxs_.empty()) return;
  auto it = copy_ctxs_.find(s.ctx);
  if (it == copy_ctxs_.end() || it->second.fence == nullptr || s.copy_fence == it->second.fence_seq) return;
  s.copy_fence = it->second.fence_seq;
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  if (cu_.cuStreamIsCapturing(s.real, &cs) != CUDA_SUCCESS || cs != CU_STREAM_CAPTURE_STATUS_NONE) return;
  post_error(cu_.cuStreamWaitEvent(s.real, it->second.fence, 0), "ordering after a copy");
}

CUresult Worker::park_on_copies(Call& c) {
  if (c.ch.copies.empty()) return CUDA_SUCCESS;
  return park(c, static_cast<Op>(c.rec.hdr.op), 0);
}

// A parked copy op, once the channel's copies are done: its reply (poll_parked).
bool Worker::poll_copy_park(Channel& ch) {
  if (!ch.copies.empty()) return false;
  auto& p = ch.parked;
  p.active = false;
  parked_since_ = {};
  std::vector<std::byte> body;
  CUresult st = CUDA_SUCCESS;
  if (p.op == Op::kMemcpyDtoHInline) {
    st = p.landed ? landed_body(p.copy, ch.index, &body) : dtoh_inline(p.copy, ch.cpl.max_payload(), &body);
    p.landed = false;
  }
  reap_all_copies();
  // A FlushWait (a guest waiting for its staged chunks) is no synchronising
  // call, parked or not: posted errors stay for the next one.
  if (st == CUDA_SUCCESS && pending_ != CUDA_SUCCESS && p.op != Op::kFlushWait) {
    st = pending_;
    pending_ = CUDA_SUCCESS;
  }
  drain_console();
  ring::Record rec;
  rec.hdr = p.hdr;
  reply(ch, rec, st, body);
  return true;
}

// A small pageable DtoH comes back in the reply record. From a stream with
// nothing in flight the worker copies at once into its own memory. Behind
// work in flight (a kernel, then its result read back: PyTorch's .item()),
// the copy is queued in the stream at once, into a page-locked landing place
// of the worker's, with an event behind it; the call is parked until the
// event, and the reply is made from the landing place. The DMA then follows
// the kernel on the GPU as a native copy does, instead of being issued only
// once the worker has seen the kernel end. Without a landing place the call
// is parked until the stream has reached it and the copy is made then, with
// everything checked again (dtoh_inline): another guest thread may have
// freed the memory or the stream meanwhile, or begun capturing the stream.
CUresult Worker::on_MemcpyDtoHInline(Call& c) {
  const auto r = c.req<ReqCopy>();
  if ((c.rec.hdr.flags & abi::kRecNeedsReply) == 0) return CUDA_ERROR_INVALID_VALUE;  // it is all in the reply
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  const std::uint32_t room = c.ch.cpl.max_payload();
  if (r.bytes > kInlineCopyMax || room < sizeof(RepCopyInline) || r.bytes > room - sizeof(RepCopyInline) ||
      (r.bytes != 0 && !owns_device(r.src, r.bytes)))
    return CUDA_ERROR_INVALID_VALUE;
  CUstream s = CU_STREAM_LEGACY;
  std::uint64_t event_ctx = r.ctx;
  if ((r.flags & kAsync) != 0) {
    if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
    if (CUresult st = refuse_in_capture(s); st != CUDA_SUCCESS) return st;
    if (const StreamEntry* e = streams_.find(r.stream)) event_ctx = e->ctx;
  }
  if (r.bytes != 0) {
    // A stream with nothing in flight (the common case: a value read back
    // after a synchronise) is copied from at once; recording an event and
    // parking on it cost more than the copy (2x native at 4 KiB on the H200).
    reap_copies(c.ch);
    const bool copies_ahead = !c.ch.copies.empty();
    if (copies_ahead || cu_.cuStreamQuery(s) != CUDA_SUCCESS) {
      // With staged copies of the channel still in flight the copy waits for
      // them first (the slow way): they need not be in its stream. So does a
      // copy in another context's stream, whose event that context's
      // teardown would not wait for before the landing place is freed.
      void* land = copies_ahead || event_ctx != r.ctx ? nullptr : landing_for(c.ch, r.ctx);
      if (land != nullptr) {
        if (const CUresult st = cu_.cuMemcpyDtoHAsync(land, r.src, r.bytes, s); st != CUDA_SUCCESS) {
          copy_ctxs_[r.ctx].landings[c.ch.index].busy = false;
          return st;
        }
        track_copy(c.ch, event_ctx, s, false, false);
        reap_copies(c.ch);
        if (c.ch.copies.empty()) return landed_body(r, c.ch.index, &c.out);
        c.ch.parked.copy = r;
        c.ch.parked.landed = true;
        return park_on_copies(c);
      }
      track_copy(c.ch, event_ctx, s, false, false);
      reap_copies(c.ch);
      if (!c.ch.copies.empty()) {
        c.ch.parked.copy = r;
        c.ch.parked.landed = false;
        return park_on_copies(c);
      }
    }
  }
  return dtoh_inline(r, room, &c.out);
}

void* Worker::landing_for(Channel& ch, std::uint64_t ctx) {
  CopyCtx& cc = copy_ctxs_[ctx];
  CopyCtx::Landing& l = cc.landings[ch.index];
  if (l.busy) {
    cc.retired.push_back(l.buf);
    l = {};
  }
  if (l.buf == nullptr) {
    // The worker's own pages, registered as its arena is (the same driver
    // path, which its sandbox allows).
    void* p = ::mmap(nullptr, kInlineCopyMax, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    if (cu_.cuMemHostRegister(p, kInlineCopyMax, CU_MEMHOSTREGISTER_PORTABLE) != CUDA_SUCCESS) {
      ::munmap(p, kInlineCopyMax);
      return nullptr;
    }
    l.buf = p;
  }
  l.busy = true;
  return l.buf;
}

CUresult Worker::landed_body(const ReqCopy& r, std::uint32_t channel, std::vector<std::byte>* body) {
  body->clear();
  const auto it = copy_ctxs_.find(r.ctx);
  if (it == copy_ctxs_.end()) return CUDA_ERROR_CONTEXT_IS_DESTROYED;  // settled meanwhile
  const auto l = it->second.landings.find(channel);
  if (l == it->second.landings.end() || l->second.buf == nullptr || !l->second.busy)
    return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  l->second.busy = false;
  body->resize(sizeof(RepCopyInline) + r.bytes);
  const RepCopyInline rep{r.bytes};
  std::memcpy(body->data(), &rep, sizeof rep);
  std::memcpy(body->data() + sizeof rep, l->second.buf, r.bytes);
  return CUDA_SUCCESS;
}

void Worker::free_landings(CopyCtx& cc) noexcept {
  const auto drop = [&](void* b) {
    (void)cu_.cuMemHostUnregister(b);
    ::munmap(b, kInlineCopyMax);
  };
  for (auto& [channel, l] : cc.landings)
    if (l.buf != nullptr) drop(l.buf);
  for (void* b : cc.retired) drop(b);
  cc.landings.clear();
  cc.retired.clear();
}

CUresult Worker::dtoh_inline(const ReqCopy& r, std::size_t room, std::vector<std::byte>* body) {
  body->clear();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  if (r.bytes > room - sizeof(RepCopyInline) || (r.bytes != 0 && !owns_device(r.src, r.bytes)))
    return CUDA_ERROR_INVALID_VALUE;
  body->resize(sizeof(RepCopyInline) + r.bytes);
  const RepCopyInline rep{r.bytes};
  std::memcpy(body->data(), &rep, sizeof rep);
  if (r.bytes == 0) return CUDA_SUCCESS;
  std::byte* data = body->data() + sizeof rep;
  CUresult st;
  if ((r.flags & kAsync) != 0) {
    CUstream s;
    st = resolve_stream(r.ctx, r.stream, &s);
    // `data` is the worker's own heap, freed after the reply: the copy must
    // never become a graph node. A parked copy was checked when it arrived,
    // but another guest thread may have begun capturing the stream since, so
    // the stream is asked again here, right before the copy. Nothing else
    // can begin a capture in between: every driver call of this worker is
    // made on this one thread.
    if (st == CUDA_SUCCESS && IVCUDA_RULE("parked-copy-capture")) st = refuse_in_capture(s);
    // Into pageable memory the driver returns once the copy is done.
    if (st == CUDA_SUCCESS) st = cu_.cuMemcpyDtoHAsync(data, r.src, r.bytes, s);
  } else {
    st = cu_.cuMemcpyDtoH(data, r.src, r.bytes);
  }
  if (st != CUDA_SUCCESS) body->clear();
  return st;
}

CUresult Worker::on_MemcpyDtoD(Call& c) {
  const auto r = c.req<ReqCopy>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  if (!owns_device(r.src, r.bytes) || !owns_device(r.dst, r.bytes)) return CUDA_ERROR_INVALID_VALUE;
  if (r.bytes == 0) return CUDA_SUCCESS;
  if ((r.flags & kAsync) != 0) {
    CUstream s;
    if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
    return cu_.cuMemcpyDtoDAsync(r.dst, r.src, r.bytes, s);
  }
  return cu_.cuMemcpyDtoD(r.dst, r.src, r.bytes);
}

CUresult Worker::on_Memcpy2D(Call& c) {
  const auto r = c.req<ReqCopy2D>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUDA_MEMCPY2D p{};
  p.WidthInBytes = r.width_bytes;
  p.Height = r.height;
  // Each side: host memory must lie in the arena, device memory in a range
  // this guest owns; the whole 2D footprint is checked, not just its start.
  auto side = [&](std::uint32_t type, std::uint64_t x, std::uint64_t y, std::uint64_t pitch,
                  std::uint64_t dev, std::uint64_t off, CUmemorytype* t, const void** host,
                  CUdeviceptr* d, size_t* px, size_t* py, size_t* pp) -> bool {
    std::uint64_t extent, start;
    if (!span2d(pitch, r.width_bytes, r.height, &extent)) return false;
    if (!mul_ok(y, pitch, &start) || __builtin_add_overflow(start, x, &start)) return false;
    *px = x;
    *py = y;
    *pp = pitch;
    if (type == CU_MEMORYTYPE_HOST) {
      std::uint64_t first;
      if (__builtin_add_overflow(off, start, &first) || !host_range(first, extent)) return false;
      *t = CU_MEMORYTYPE_HOST;
      *host = arena_ptr(off);
      return true;
    }
    if (type == CU_MEMORYTYPE_DEVICE) {
      std::uint64_t first;
      if (__builtin_add_overflow(dev, start, &first) || (extent != 0 && !owns_device(first, extent)))
        return false;
      *t = CU_MEMORYTYPE_DEVICE;
      *d = dev;
      return true;
    }
    return false;
  };
  const void* src_host = nullptr;
  const void* dst_host = nullptr;
  if (!side(r.src_type, r.src_x_bytes, r.src_y, r.src_pitch, r.src_device, r.src_arena_off,
            &p.srcMemoryType, &src_host, &p.srcDevice, &p.srcXInBytes, &p.srcY, &p.srcPitch) ||
      !side(r.dst_type, r.dst_x_bytes, r.dst_y, r.dst_pitch, r.dst_device, r.dst_arena_off,
            &p.dstMemoryType, &dst_host, &p.dstDevice, &p.dstXInBytes, &p.dstY, &p.dstPitch))
    return CUDA_ERROR_INVALID_VALUE;
  p.srcHost = src_host;
  p.dstHost = const_cast<void*>(dst_host);
  if ((r.flags & kAsync) != 0) {
    CUstream s;
    if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
    if ((r.flags & kWaitStream) != 0)
      if (CUresult st = refuse_in_capture(s); st != CUDA_SUCCESS) return st;
    const CUresult st = cu_.cuMemcpy2DAsync(&p, s);
    return st == CUDA_SUCCESS && (r.flags & kWaitStream) != 0 ? cu_.cuStreamSynchronize(s) : st;
  }
  return r.unaligned ? cu_.cuMemcpy2DUnaligned(&p) : cu_.cuMemcpy2D(&p);
}

CUresult Worker::on_HostAlloc(Call& c) {
  const auto r = c.req<ReqHostAlloc>();
  if (r.bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const std::optional<std::uint64_t> off = [&]() -> std::optional<std::uint64_t> {
    if (cfg_.vm == nullptr) return pool_.allocate(r.bytes);
    // The VM's processes share the pool: the pages come from the VM's
    // books, and this worker's own map remembers what it holds.
    const auto at = cfg_.vm->pool_allocate(r.bytes, cfg_.vm_slot);
    if (at && !pool_.take(*at, r.bytes)) {
      (void)cfg_.vm->pool_free(*at, r.bytes, cfg_.vm_slot);
      return std::nullopt;
    }
    return at;
  }();
  if (!off) return CUDA_ERROR_OUT_OF_MEMORY;
  // Page-locked as the native cuMemHostAlloc pins it: now (worker.cc
  // pin_arena); the pool's granule-rounded block, which no other overlaps.
  const auto b = pool_.find(*off, 1);
  if (const CUresult st = pin_arena(*off, b ? b->size : r.bytes); st != CUDA_SUCCESS) {
    (void)pool_.free(*off);
    if (cfg_.vm != nullptr) (void)cfg_.vm->pool_free(*off, r.bytes, cfg_.vm_slot);
    return st == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED ? CUDA_ERROR_OUT_OF_MEMORY : st;
  }
  c.set_reply(RepHostAlloc{*off, arena_dev_ + (*off - l_.arena_off)});
  return CUDA_SUCCESS;
}

CUresult Worker::on_HostFree(Call& c) {
  const auto r = c.req<ReqArenaOff>();
  const auto b = pool_.find(r.arena_off, 1);
  if (!b || b->off != r.arena_off) return CUDA_ERROR_INVALID_VALUE;
  unpin_arena(r.arena_off);
  if (!pool_.free(r.arena_off)) return CUDA_ERROR_INVALID_VALUE;
  if (cfg_.vm != nullptr) (void)cfg_.vm->pool_free(b->off, b->size, cfg_.vm_slot);
  return CUDA_SUCCESS;
}

}  // namespace ivcuda::host
