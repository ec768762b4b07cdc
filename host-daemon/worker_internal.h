// Worker internals shared by worker.cc (the loop) and handlers.cc (the ops).
#pragma once

#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "host-daemon/worker.h"

namespace ivcuda::host {

// Host nodes and user objects of a guest that went away stop waiting for it
// (graphs.cc), so that destroying its contexts does not wait for ever.
void abandon_host_nodes() noexcept;

// A channel as the worker sees it. Indices and records are private copies;
// the guest-written ChannelDesc is read once at attach.
struct Worker::Channel {
  std::uint32_t index = 0;
  ring::Consumer req;
  ring::Producer cpl;
  std::unique_ptr<ring::EventfdDoorbell> bell;
  bool dead = false;
  // The capture mode of the guest thread on this channel
  // (cuThreadExchangeStreamCaptureMode): the worker's thread takes it on
  // before it serves the channel's requests.
  CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  struct Parked {
    bool active = false;
    proto::Op op = proto::Op::kInvalid;
    std::uint64_t handle = 0;
    abi::RecordHeader hdr{};
  } parked;
};

struct Worker::Call {
  Channel& ch;
  const ring::Record& rec;
  std::vector<std::byte>& out;
  bool parked = false;

  template <class T>
  T req() const {
    T v;
    std::memcpy(&v, rec.payload.data(), sizeof v);  // size checked by dispatch
    return v;
  }
  template <class T>
  std::span<const std::byte> tail() const {
    return rec.payload.subspan(sizeof(T));
  }
  template <class T>
  void set_reply(const T& v) {
    out.resize(sizeof v);
    std::memcpy(out.data(), &v, sizeof v);
  }
  void append(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  }
};

}  // namespace ivcuda::host
