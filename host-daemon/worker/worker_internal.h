// Worker internals shared by worker.cc (the loop), worker_common.cc and the API family files (the ops).
#pragma once

#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "cuda_enum_ranges.h"
#include "host-daemon/shared/rules.h"  // IVCUDA_RULE at the handlers' checks (docs/security.md)
#include "host-daemon/worker/worker.h"

namespace ivcuda::host {

// Host nodes and user objects of a guest that went away stop waiting for it
// (graph_build.cc), so that destroying its contexts does not wait for ever.
void abandon_host_nodes() noexcept;
// A recycled worker's next guest (its contexts were reset: no host node of
// the last guest's is left): host nodes wait for their guest again.
void revive_host_nodes() noexcept;
// The driver may have written device printf output to the worker's console
// pipe (worker.cc, drain_console): set before each op that is a flush point
// and by the host-node callback (the driver flushes before it on its own
// thread), so that the pipe is read only when something can be there.
void note_console_output() noexcept;

// A channel as the worker sees it. Indices and records are private copies;
// the guest-written ChannelDesc is read once at attach.
// A guest's number as a CUDA enum, or false. An enum's range is the values of
// the smallest bit-field that holds its enumerators ([dcl.enum]; CUfunc_cache's
// is 0..3, CUarray_format's 0..0x7fffffff for its *_MAX member): a cast
// outside it is undefined behaviour (found by tests/fuzz). The ranges are
// generated from cuda.h (tools/gen_enum_ranges.py); inside one the driver
// itself answers values it does not know.
template <class E>
bool wire_enum(std::uint64_t v, E* out) {
  if (IVCUDA_RULE("enum-range") && v > EnumRange<E>::limit) return false;
  *out = static_cast<E>(v);
  return true;
}
// wire_enum as the codecs take it (ivcuda/graph_codec.h, array_codec.h).
inline constexpr auto checked_enum = [](std::uint64_t v, auto* out) { return wire_enum(v, out); };

struct Worker::Channel {
  std::uint32_t index = 0;
  ring::Consumer req;
  ring::Producer cpl;
  std::unique_ptr<ring::EventfdDoorbell> bell;
  bool dead = false;
  bool detach = false;  // a VM process's goodbye: the channel goes once answered
  // The capture mode of the guest thread on this channel
  // (cuThreadExchangeStreamCaptureMode): the worker's thread takes it on
  // before it serves the channel's requests.
  CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  // A call that waits: a stream or event synchronise (poll_parked),
  // or a copy op answered once `copies` is empty (memory.cc; `copy` is
  // DtoHInline's request, made once the stream got there).
  struct Parked {
    bool active = false;
    proto::Op op = proto::Op::kInvalid;
    std::uint64_t handle = 0;
    abi::RecordHeader hdr{};
    proto::ReqCopy copy{};
    bool landed = false;  // a DtoHInline whose bytes are copied to the channel's landing place
  } parked;
  // Copies the worker issued for this channel and has not seen finish, in
  // the order the guest posted them: staged chunks (counted: staging_done
  // is bumped as each leaves the front, so it always counts a prefix of the
  // channel's chunks) and marks behind other copies a call waits for.
  struct InFlight {
    CUevent done = nullptr;    // recorded behind the copy; null: done (or refused) already
    std::uint64_t ctx = 0;     // the guest context `done` belongs to
    CUstream stream = nullptr;  // where `done` was recorded
    bool counted = false;
  };
  std::deque<InFlight> copies;
  // Work the guest marked kRecHostPolled, until it is over (host_polls.cc):
  // an event recorded behind each.
  struct HostPoll {
    CUevent done = nullptr;
    std::uint64_t ctx = 0;
  };
  std::vector<HostPoll> polls;
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


namespace detail {
constexpr std::uint64_t kStreamLegacy = 0x1;     // CU_STREAM_LEGACY
constexpr std::uint64_t kStreamPerThread = 0x2;  // CU_STREAM_PER_THREAD

// a * b without overflow, or false.
inline bool mul_ok(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
// Bytes a 2D region of `height` rows of `width` bytes at `pitch` spans.
inline bool span2d(std::uint64_t pitch, std::uint64_t width, std::uint64_t height, std::uint64_t* out) {
  if (height == 0 || width == 0) {
    *out = 0;
    return true;
  }
  if (width > pitch && height > 1) return false;
  std::uint64_t rows;
  if (!mul_ok(pitch, height - 1, &rows)) return false;
  return !__builtin_add_overflow(rows, width, out);
}
}  // namespace detail

// Destroys a stream or event: in its own context, and forgotten whatever the
// driver says (a failed destroy leaves nothing the guest could use again).
template <class Table, class Destroy>
CUresult Worker::destroy_in_ctx(Table& table, std::uint64_t handle, Destroy&& destroy) {
  auto* e = table.find(handle);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(e->ctx); st != CUDA_SUCCESS) return st;
  const CUresult st = destroy(*e);
  table.erase(handle);
  return st;
}

}  // namespace ivcuda::host
