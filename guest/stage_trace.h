// Where a round trip's time goes, stage by stage: IVCUDA_TRACE_STAGES (1 for
// stderr, or a path to append to) times every call that waits for a reply in
// the calling thread - before the record is written, writing and publishing
// it, waiting for the reply, after the reply - and marks its record
// kRecTraceStages, so that the worker times the same call's stages on its
// side: the record reaching it, its dispatch, the handler (the driver's own
// call) and the reply. At exit the library asks the worker for its figures
// (proto StageTrace) and prints one table of medians per request kind.
//
// The guest's stages are read from the CPU's time-stamp counter, which in
// process mode is the one the worker reads, so "to the worker" is measured
// across the two processes. In a VM the guest's counter is offset from the
// host's: that column is left out there.
//
// Tracing costs each traced call a lock, a sample kept and nine counter
// reads on both sides (0.2-0.5 us a round trip on the H100 host: the stages
// are for comparing, not for the absolute round trip); when the variable is
// unset, it is one predictable branch.
#pragma once

#include <cstdint>

#include "ivcuda/proto.h"

namespace ivcuda::guest::stage_trace {

// Whether IVCUDA_TRACE_STAGES is set (read once).
bool enabled() noexcept;

// The calling thread's current call, in order. wrote() returns the low 32
// bits of the stamp for the record's header.
void begin() noexcept;
std::uint32_t wrote() noexcept;
void posted() noexcept;
void replied() noexcept;
// The call returns: its stages are kept under `op` (only where the reply came).
void end(proto::Op op) noexcept;

}  // namespace ivcuda::guest::stage_trace
