// How the guest library takes its reply out of a completion ring. The host
// writes that ring, and a broken or hostile host must not be able to drive
// the guest into undefined behaviour: everything here works on the private
// copy ring::Consumer made and checks every length against it. Kept apart
// from runtime.cc (which waits, and writes the console text) so that
// tests/fuzz/reply_fuzz can run exactly this code.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "ivcuda/proto.h"
#include "ring/spsc_ring.h"

namespace ivcuda::guest {

// A reply flagged kReplyConsole ends with device printf output and its u32
// length. Splits it off: `console` is that output, the result the reply
// proper. A length that does not fit drops the length word and keeps the rest.
inline std::span<const std::byte> split_console(std::span<const std::byte> payload,
                                                std::span<const std::byte>* console) noexcept {
  *console = {};
  std::uint32_t n = 0;
  if (payload.size() < sizeof n) return payload;
  std::memcpy(&n, payload.data() + payload.size() - sizeof n, sizeof n);
  if (n > payload.size() - sizeof n) return payload.first(payload.size() - sizeof n);
  const std::size_t body = payload.size() - sizeof n - n;
  *console = payload.subspan(body, n);
  return payload.first(body);
}

enum class ReplyTake { kEmpty, kCorrupt, kGot };

// Takes the reply to request `seq` from `cpl`: replies for other requests (a
// thread that died while waiting) are dropped on the way. kGot: `*result` is
// its status, `rep` (rep_size bytes) holds the start of its payload,
// zero-filled past what came, `extra` (if given) the rest, and `*console`
// the device printf output it carried (valid until the next poll of `cpl`).
inline ReplyTake take_reply(ring::Consumer& cpl, std::uint32_t seq, void* rep, std::size_t rep_size,
                            std::vector<std::byte>* extra, CUresult* result,
                            std::span<const std::byte>* console) noexcept {
  *console = {};
  ring::Record rec;
  for (;;) {
    const auto rs = cpl.poll(&rec);
    if (rs == ring::RingStatus::kEmpty) return ReplyTake::kEmpty;
    if (rs == ring::RingStatus::kCorrupt) return ReplyTake::kCorrupt;
    if (rec.hdr.seq != seq) {
      cpl.consume();
      continue;
    }
    *result = static_cast<CUresult>(rec.hdr.status);
    if ((rec.hdr.flags & proto::kReplyConsole) != 0) rec.payload = split_console(rec.payload, console);
    if (rep != nullptr) {
      std::memset(rep, 0, rep_size);
      std::memcpy(rep, rec.payload.data(), std::min(rep_size, rec.payload.size()));
    }
    if (extra != nullptr) {
      extra->clear();
      if (rec.payload.size() > rep_size)
        extra->assign(rec.payload.begin() + static_cast<std::ptrdiff_t>(rep_size), rec.payload.end());
    }
    cpl.consume();
    cpl.publish_head();
    return ReplyTake::kGot;
  }
}

}  // namespace ivcuda::guest
