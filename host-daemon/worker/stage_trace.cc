// The worker's half of IVCUDA_TRACE_STAGES (guest/stage_trace.h): the stages
// of each record the guest marked kRecTraceStages, timed in handle() with the
// time-stamp counter, and their medians per op for the guest's StageTrace
// question. Only the guest's own records are timed, and what it learns is
// how long its own calls took here, which it could time from outside; the
// books are bounded whatever the guest marks.
#include <x86intrin.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <vector>

#include "host-daemon/worker/worker_internal.h"

namespace ivcuda::host {

using namespace ivcuda::proto;

struct Worker::StageBooks {
  // Per op: in (signed, the guest's stamp to ours), dispatch, handler,
  // reply, in counter ticks.
  using Sample = std::array<std::uint32_t, 4>;
  std::vector<Sample> samples[static_cast<std::size_t>(Op::kCount)];
  std::size_t total = 0;
  std::uint64_t tsc0 = 0;
  std::chrono::steady_clock::time_point clock0;
};

namespace {
// 16 bytes a sample: at most 16 MiB of books per guest process.
constexpr std::size_t kMaxSamples = 1u << 20;

std::uint32_t ticks32(std::uint64_t a, std::uint64_t b) noexcept {
  const std::uint64_t d = b - a;
  return d > UINT32_MAX ? UINT32_MAX : static_cast<std::uint32_t>(d);
}
}  // namespace

void Worker::note_stages(const ring::Record& rec, const std::uint64_t (&t)[4]) noexcept {
  try {
    if (!stage_books_) {
      stage_books_ = std::make_shared<StageBooks>();
      stage_books_->tsc0 = t[0];
      stage_books_->clock0 = std::chrono::steady_clock::now();
    }
    StageBooks& b = *stage_books_;
    if (rec.hdr.op >= static_cast<std::uint16_t>(Op::kCount) || b.total >= kMaxSamples) return;
    // The guest's stamp is the low half of its counter: the difference is
    // meaningful modulo 2^32 (process mode reads one counter).
    const std::uint32_t in = static_cast<std::uint32_t>(t[0]) - static_cast<std::uint32_t>(rec.hdr.status);
    b.samples[rec.hdr.op].push_back({in, ticks32(t[0], t[1]), ticks32(t[1], t[2]), ticks32(t[2], t[3])});
    ++b.total;
  } catch (...) {
    // Out of memory: the trace has what it has.
  }
}

CUresult Worker::on_StageTrace(Call& c) {
  RepStageTrace rep{};
  std::vector<StageRow> rows;
  if (stage_books_) {
    StageBooks& b = *stage_books_;
    const auto elapsed = std::chrono::steady_clock::now() - b.clock0;
    const std::uint64_t ticks = __rdtsc() - b.tsc0;
    const double ns_per_tick =
        ticks == 0 ? 0.0
                   : static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count()) /
                         static_cast<double>(ticks);
    std::vector<std::int64_t> col;
    for (std::size_t op = 0; op < std::size(b.samples); ++op) {
      const auto& s = b.samples[op];
      if (s.empty()) continue;
      StageRow r{};
      r.op = static_cast<std::uint16_t>(op);
      r.count = static_cast<std::uint32_t>(s.size());
      std::int64_t med[4];
      for (std::size_t k = 0; k < 4; ++k) {
        col.clear();
        for (const auto& v : s)
          col.push_back(k == 0 ? std::int64_t{static_cast<std::int32_t>(v[0])} : std::int64_t{v[k]});
        auto mid = col.begin() + static_cast<std::ptrdiff_t>(col.size() / 2);
        std::nth_element(col.begin(), mid, col.end());
        med[k] = static_cast<std::int64_t>(static_cast<double>(*mid) * ns_per_tick);
      }
      r.in_ns = static_cast<std::int32_t>(std::clamp<std::int64_t>(med[0], INT32_MIN, INT32_MAX));
      r.dispatch_ns = static_cast<std::uint32_t>(std::clamp<std::int64_t>(med[1], 0, UINT32_MAX));
      r.handler_ns = static_cast<std::uint32_t>(std::clamp<std::int64_t>(med[2], 0, UINT32_MAX));
      r.reply_ns = static_cast<std::uint32_t>(std::clamp<std::int64_t>(med[3], 0, UINT32_MAX));
      rows.push_back(r);
    }
  }
  rep.rows = static_cast<std::uint32_t>(rows.size());
  c.set_reply(rep);
  c.append(rows.data(), rows.size() * sizeof(StageRow));
  return CUDA_SUCCESS;
}

}  // namespace ivcuda::host
