// Work a guest marked as polling page-locked memory (abi::kRecHostPolled;
// guest/host_polls.cc): a kernel with a pointer into page-locked memory, a
// stream wait on such memory. While it may still run, the guest library has
// each posted call wait until the worker has taken it; the worker tells it
// when the work is over, so that posted calls stop waiting at once rather than
// at the guest's next synchronisation (NVBench's batch measurement launches
// most of its batch after the blocking kernel has been released).
//
// An event recorded behind the work is polled from the request loop; its end
// (or any failure: the work did not run, the context went) bumps the
// channel's host_polls_done. A guest can mark any record: only launches and
// stream memory operations are looked at, at most kMaxHostPolls per channel
// are followed, and the rest are reported over at once - which costs the
// guest only its own waiting.
#include <atomic>
#include <cstring>

#include "host-daemon/worker/worker.h"
#include "host-daemon/worker/worker_internal.h"

namespace ivcuda::host {

using proto::Op;

// An increment, not a store of a count of the worker's own: a VM's channel
// passes from process to process (and worker to worker), and each guest
// process counts from the value it found.
void Worker::host_poll_over(Channel& ch) {
  std::atomic_ref<std::uint64_t>(ring::channel_desc(bar_.data(), l_, ch.index)->host_polls_done)
      .fetch_add(1, std::memory_order_release);
}

void Worker::track_host_poll(Channel& ch, const ring::Record& rec, CUresult st) {
  std::uint64_t ctx = 0, stream = 0;
  if (st != CUDA_SUCCESS) {  // it did not run (a truncated request among them)
    host_poll_over(ch);
    return;
  }
  switch (static_cast<Op>(rec.hdr.op)) {
    case Op::kLaunch:
    case Op::kLaunchCooperative:
    case Op::kLaunchEx: {  // ReqLaunchEx begins with its ReqLaunch
      proto::ReqLaunch r;
      std::memcpy(&r, rec.payload.data(), sizeof r);  // size checked by dispatch
      ctx = r.ctx;
      stream = r.stream;
      break;
    }
    case Op::kStreamMemOps: {
      proto::ReqStreamMemOps r;
      std::memcpy(&r, rec.payload.data(), sizeof r);
      ctx = r.ctx;
      stream = r.stream;
      break;
    }
    default:
      host_poll_over(ch);
      return;
  }
  CUstream s = nullptr;
  if (ch.polls.size() >= kMaxHostPolls || resolve_stream(ctx, stream, &s) != CUDA_SUCCESS ||
      use_ctx(ctx) != CUDA_SUCCESS) {
    host_poll_over(ch);
    return;
  }
  CUevent ev = copy_event(ctx);  // memory.cc's spare events of the context
  if (ev == nullptr || cu_.cuEventRecord(ev, s) != CUDA_SUCCESS) {
    if (ev != nullptr) release_copy_event(ctx, ev, true);
    host_poll_over(ch);
    return;
  }
  ch.polls.push_back(Channel::HostPoll{ev, ctx});
}

int Worker::reap_host_polls(Channel& ch) {
  int n = 0;
  for (auto it = ch.polls.begin(); it != ch.polls.end();) {
    const CUresult st = cu_.cuEventQuery(it->done);
    if (st == CUDA_ERROR_NOT_READY) {
      ++it;
      continue;
    }
    release_copy_event(it->ctx, it->done, st != CUDA_SUCCESS);
    it = ch.polls.erase(it);
    host_poll_over(ch);
    ++n;
  }
  return n;
}

// The context goes: its events with it. The work may never end (a kernel
// waiting for a store that will not come), so it is not waited for.
void Worker::settle_host_polls(std::uint64_t ctx) {
  for (auto& chp : channels_) {
    if (!chp) continue;
    for (auto it = chp->polls.begin(); it != chp->polls.end();) {
      if (it->ctx != ctx) {
        ++it;
        continue;
      }
      (void)cu_.cuEventDestroy(it->done);
      it = chp->polls.erase(it);
      host_poll_over(*chp);
    }
  }
}

void Worker::abandon_host_polls() noexcept {
  for (auto& chp : channels_) {
    if (!chp) continue;
    for (const auto& p : chp->polls) {
      (void)cu_.cuEventDestroy(p.done);
      host_poll_over(*chp);
    }
    chp->polls.clear();
  }
}

}  // namespace ivcuda::host
