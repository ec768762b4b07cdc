#include "guest/stage_trace.h"

#include <unistd.h>
#include <x86intrin.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "guest/report_sink.h"
#include "guest/runtime.h"

namespace ivcuda::guest::stage_trace {
namespace {

// The guest's five stamps of one call: begin, wrote, posted, replied, end.
struct Stamps {
  std::uint64_t t[5] = {};
};
thread_local Stamps t_call;

// Per op, the stages of the first kMaxSamples calls (cycles): a benchmark's
// steady loop is well inside that, and memory stays bounded.
constexpr std::size_t kMaxSamples = 1u << 18;
constexpr std::size_t kOps = static_cast<std::size_t>(proto::Op::kCount);
using Sample = std::array<std::uint32_t, 4>;  // before, write+publish, wait (from wrote), after

struct Table {
  std::mutex mu;
  std::vector<Sample> samples[kOps];
  std::uint64_t tsc0 = 0;
  std::chrono::steady_clock::time_point clock0;
};
// Never destroyed: calls keep coming from atexit handlers.
Table& table() {
  static auto* t = new Table;
  return *t;
}

const char* target() noexcept {
  static const char* where = report_target("IVCUDA_TRACE_STAGES");
  return where;
}

std::uint32_t clamp32(std::uint64_t v) noexcept { return v > UINT32_MAX ? UINT32_MAX : static_cast<std::uint32_t>(v); }

std::uint64_t median(std::vector<std::uint32_t>& v) {
  if (v.empty()) return 0;
  auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end());
  return *mid;
}

// Nanoseconds per counter tick, from the counter and the clock since the
// first traced call (at least 20 ms of it).
double ns_per_tick() {
  Table& t = table();
  auto elapsed = std::chrono::steady_clock::now() - t.clock0;
  if (elapsed < std::chrono::milliseconds(20)) {
    ::usleep(static_cast<useconds_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                         std::chrono::milliseconds(20) - elapsed)
                                         .count()));
    elapsed = std::chrono::steady_clock::now() - t.clock0;
  }
  const std::uint64_t ticks = __rdtsc() - t.tsc0;
  return ticks == 0 ? 0.0
                    : static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count()) /
                          static_cast<double>(ticks);
}

// A library destructor runs after the program's atexit handlers.
[[gnu::destructor]] void report() noexcept {
  const char* where = target();
  if (where == nullptr) return;
  try {
    Table& t = table();
    {
      std::lock_guard lk(t.mu);
      if (t.tsc0 == 0) return;
    }
    std::vector<proto::StageRow> host(kOps);
    Runtime* rt = Runtime::current();
    bool have_host = false;
    if (rt != nullptr) {
      proto::RepStageTrace rep{};
      std::vector<std::byte> extra;
      if (rt->call<proto::Op::kStageTrace>(proto::ReqCtx{0}, {}, &rep, &extra) == CUDA_SUCCESS) {
        const std::size_t n = std::min<std::size_t>(rep.rows, extra.size() / sizeof(proto::StageRow));
        for (std::size_t i = 0; i < n; ++i) {
          proto::StageRow r;
          std::memcpy(&r, extra.data() + i * sizeof r, sizeof r);
          if (r.op < kOps) host[r.op] = r;
        }
        have_host = true;
      }
    }
    // The question above is itself traced (end() takes the lock): the lock
    // is taken only now.
    std::lock_guard lk(t.mu);
    const double k = ns_per_tick();
    const bool same_clock = rt != nullptr && !rt->vm_mode();
    const ReportSink sink(where);
    FILE* out = sink.get();
    if (out == nullptr) return;
    std::fprintf(out,
                 "ivcuda: process %d: round trips by stage (IVCUDA_TRACE_STAGES; medians in ns; %s)\n"
                 "ivcuda:   guest: before = the call's own work before it writes the record, write = writing and "
                 "publishing it, wait = publishing to the reply seen, after = the reply to the return\n"
                 "ivcuda:   worker: in = the guest's write to the worker taking the record, dispatch, handler "
                 "(the driver's call), reply = publishing the reply; back = what the wait leaves to the reply's "
                 "way back\n",
                 static_cast<int>(::getpid()),
                 !have_host    ? "the worker gave no figures"
                 : same_clock ? "guest and worker read one time-stamp counter"
                              : "in a VM: the guest's counter is not the host's, so `in` and `back` are left out");
    std::fprintf(out, "ivcuda: %-22s %9s %7s %7s %7s %7s | %7s %8s %8s %7s %7s\n", "request", "calls", "before",
                 "write", "wait", "after", "in", "dispatch", "handler", "reply", "back");
    for (std::size_t op = 0; op < kOps; ++op) {
      auto& s = t.samples[op];
      if (s.empty()) continue;
      std::vector<std::uint32_t> col(s.size());
      std::uint64_t med[4];
      for (int c = 0; c < 4; ++c) {
        for (std::size_t i = 0; i < s.size(); ++i) col[i] = s[i][static_cast<std::size_t>(c)];
        med[c] = static_cast<std::uint64_t>(static_cast<double>(median(col)) * k);
      }
      const proto::StageRow& h = host[op];
      std::fprintf(out, "ivcuda: %-22s %9zu %7llu %7llu %7llu %7llu |", proto::op_name(static_cast<std::uint16_t>(op)),
                   s.size(), static_cast<unsigned long long>(med[0]), static_cast<unsigned long long>(med[1]),
                   static_cast<unsigned long long>(med[2] - std::min(med[2], med[1])),
                   static_cast<unsigned long long>(med[3]));
      if (h.count == 0) {
        std::fprintf(out, " %7s %8s %8s %7s %7s\n", "-", "-", "-", "-", "-");
        continue;
      }
      // The wait is measured from the write stamp here (as `in` is), so that
      // what is left for the way back subtracts like from like.
      const long long back = static_cast<long long>(med[2]) - h.in_ns - static_cast<long long>(h.dispatch_ns) -
                             static_cast<long long>(h.handler_ns) - static_cast<long long>(h.reply_ns);
      if (same_clock)
        std::fprintf(out, " %7d %8u %8u %7u %7lld\n", h.in_ns, h.dispatch_ns, h.handler_ns, h.reply_ns, back);
      else
        std::fprintf(out, " %7s %8u %8u %7u %7s\n", "-", h.dispatch_ns, h.handler_ns, h.reply_ns, "-");
    }
  } catch (...) {
  }
}

}  // namespace

bool enabled() noexcept { return target() != nullptr; }

void begin() noexcept { t_call.t[0] = __rdtsc(); }

std::uint32_t wrote() noexcept {
  t_call.t[1] = __rdtsc();
  return static_cast<std::uint32_t>(t_call.t[1]);
}

void posted() noexcept { t_call.t[2] = __rdtsc(); }

void replied() noexcept { t_call.t[3] = __rdtsc(); }

void end(proto::Op op) noexcept {
  const auto i = static_cast<std::size_t>(op);
  Stamps& c = t_call;
  if (i >= kOps || c.t[3] == 0 || c.t[1] == 0) {
    c = Stamps{};
    return;
  }
  c.t[4] = __rdtsc();
  const Sample s{clamp32(c.t[1] - c.t[0]), clamp32(c.t[2] - c.t[1]), clamp32(c.t[3] - c.t[1]),
                 clamp32(c.t[4] - c.t[3])};
  c = Stamps{};
  try {
    Table& t = table();
    std::lock_guard lk(t.mu);
    if (t.tsc0 == 0) {
      t.tsc0 = __rdtsc();
      t.clock0 = std::chrono::steady_clock::now();
    }
    if (t.samples[i].size() < kMaxSamples) t.samples[i].push_back(s);
  } catch (...) {
  }
}

}  // namespace ivcuda::guest::stage_trace
