// Work that may be polling page-locked host memory, and the posted requests
// that must reach the GPU before the CPU's next store (issue 31).
//
// A posted request returns as soon as it is in the ring; the worker submits
// it a few microseconds later. That is invisible to a program, except to one
// whose GPU work waits for a plain CPU store to page-locked memory: NVBench's
// blocking kernel spins on a registered flag while the benchmark queues an
// event, the measured kernel and another event behind it, and then stores to
// the flag. Natively all three are queued on the GPU before the store; through
// a worker that has not yet taken them they would start after it, and the
// worker's submission time would land between the two events.
//
// So the library notes work that may poll host memory - a kernel with a
// pointer into page-locked memory among its parameters, a stream wait on
// such memory - and, until that work is known to be over, every posted
// request waits until the worker has taken it (abi::kRecReportTaken). The
// work is known to be over once its stream has been synchronised or found
// idle, its context synchronised, or an event recorded behind it completed.
// Work in a graph is not looked at. IVCUDA_HOST_POLLS=off turns the waiting off.
#include <cuda.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>

#include "guest/runtime.h"
#include "ring/layout.h"

namespace ivcuda::guest {

namespace {

bool host_polls_on() {
  static const bool on = switched_on("IVCUDA_HOST_POLLS");
  return on;
}

}  // namespace

bool Runtime::maps_page_locked(std::uint64_t v) const noexcept {
  // A device alias of the arena (cuMemHostGetDevicePointer), or the guest's
  // own address of it (the BAR mapping, or the alias that makes page-locked
  // pointers their own device pointers).
  const std::uint64_t base = hello_.arena_device_base;
  if (base != 0 && v - (base + layout_.arena_off) < layout_.arena_size) return true;
  return in_bar(static_cast<std::uintptr_t>(v), 1);
}

bool Runtime::any_page_locked_word(std::span<const std::byte> params) const noexcept {
  if (!host_polls_on()) return false;
  // Pointer parameters are 8-byte aligned in the packed buffer; a pointer in
  // a by-value struct is too.
  for (std::size_t off = 0; off + sizeof(std::uint64_t) <= params.size(); off += sizeof(std::uint64_t)) {
    std::uint64_t v;
    std::memcpy(&v, params.data() + off, sizeof v);
    if (v != 0 && maps_page_locked(v)) return true;
  }
  return false;
}

bool Runtime::wants_host_polls() noexcept { return host_polls_on(); }

void Runtime::note_host_polled(std::uint32_t channel, std::uint64_t ctx, std::uint64_t stream) {
  std::lock_guard lk(polls_mu_);
  auto [it, fresh] = polled_channels_.try_emplace(channel);
  if (fresh) it->second.base = ring::load_acquire(ring::channel_desc(base_, layout_, channel)->host_polls_done);
  ++it->second.marked;
  polled_[{ctx, stream_key(stream)}] = ++poll_generation_;
  polled_count_.store(polled_.size(), std::memory_order_release);
}

// True once the host has said that all the work this process marked is
// over: then nothing can be polling, whatever was synchronised or not.
// (A host of ABI minor <= 4 never says so: the synchronisations above end
// the waiting there.)
bool Runtime::host_polls_over() noexcept {
  std::lock_guard lk(polls_mu_);
  if (polled_.empty()) return true;
  for (const auto& [channel, pc] : polled_channels_) {
    const std::uint64_t done = ring::load_acquire(ring::channel_desc(base_, layout_, channel)->host_polls_done);
    if (done - pc.base < pc.marked) return false;
  }
  polled_.clear();
  polled_events_.clear();
  polled_count_.store(0, std::memory_order_release);
  return true;
}

// After a call that returned CUDA_SUCCESS, while host_polled(): what it says
// about the polling work's end.
void Runtime::settle_host_polls(proto::Op op, const void* req, std::size_t req_size) {
  std::lock_guard lk(polls_mu_);
  const auto publish = [&] {
    if (polled_.empty()) polled_events_.clear();
    polled_count_.store(polled_.size(), std::memory_order_release);
  };
  switch (op) {
    case proto::Op::kEventRecord:
    case proto::Op::kEventRecordFlags: {
      proto::ReqEventRecord r{};
      if (!read_request(req, req_size, &r)) return;
      const auto key = std::make_pair(r.ctx, stream_key(r.stream));
      if (const auto it = polled_.find(key); it != polled_.end())
        polled_events_[r.event] = PolledEvent{key, poll_generation_};
      else
        polled_events_.erase(r.event);  // re-recorded behind no polling work
      return;
    }
    case proto::Op::kStreamSynchronize:
    case proto::Op::kStreamQuery: {  // SUCCESS: the stream is idle
      proto::ReqHandle r{};
      if (!read_request(req, req_size, &r)) return;
      polled_.erase({r.ctx, stream_key(r.handle)});
      publish();
      return;
    }
    case proto::Op::kEventSynchronize:
    case proto::Op::kEventQuery: {
      proto::ReqHandle r{};
      if (!read_request(req, req_size, &r)) return;
      const auto e = polled_events_.find(r.handle);
      if (e == polled_events_.end()) return;
      const auto it = polled_.find(e->second.stream);
      // Only work queued before the record is over.
      if (it != polled_.end() && it->second <= e->second.generation) polled_.erase(it);
      polled_events_.erase(e);
      publish();
      return;
    }
    case proto::Op::kEventDestroy: {
      proto::ReqHandle r{};
      if (read_request(req, req_size, &r)) polled_events_.erase(r.handle);
      return;
    }
    case proto::Op::kCtxSynchronize: {
      proto::ReqCtx r{};
      if (!read_request(req, req_size, &r)) return;
      for (auto it = polled_.begin(); it != polled_.end();)
        it = it->first.first == r.ctx ? polled_.erase(it) : std::next(it);
      publish();
      return;
    }
    default:
      return;
  }
}

}  // namespace ivcuda::guest
