// Where a program's time goes on the wire, for the user and for us:
// IVCUDA_CALL_STATS (1 for stderr, or a path to append to) lists at exit,
// per request kind, how many were sent, how many waited for a reply, and the
// time the calling threads spent in them (median and total of the waited
// ones, from first byte written to reply read). A slow framework run shows
// here whether it makes more round trips than it should or slow ones.
// A second table lists the time the calling threads spent in the library's
// API calls, by function, round trips included (guard.h's ApiScope).
// When the variable is unset, recording is one predictable branch.
#pragma once

#include <cstdint>

#include "ivcuda/proto.h"

namespace ivcuda::guest::call_stats {

// Whether IVCUDA_CALL_STATS is set (read once).
bool enabled() noexcept;
// Counts one request of `op`; `waited` with its round trip in nanoseconds.
void record(proto::Op op, bool waited, std::uint64_t ns) noexcept;

}  // namespace ivcuda::guest::call_stats
