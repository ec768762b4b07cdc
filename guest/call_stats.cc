#include "guest/call_stats.h"
#include "guest/compile_cache.h"
#include "guest/guard.h"
#include "guest/report_sink.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ivcuda::guest::call_stats {
namespace {

// Round trips go into log-linear buckets: 8 per power of two of
// nanoseconds, so a median read back from them is within about 9%.
constexpr unsigned kSub = 8;
constexpr unsigned kBuckets = 64 * kSub;

unsigned bucket_of(std::uint64_t ns) noexcept {
  if (ns < kSub) return static_cast<unsigned>(ns);
  const unsigned top = 63 - static_cast<unsigned>(std::countl_zero(ns));  // >= 3
  const auto frac = static_cast<unsigned>((ns >> (top - 3)) & (kSub - 1));
  return top * kSub + frac;
}
// The smallest round trip that falls into bucket b.
std::uint64_t bucket_floor(unsigned b) noexcept {
  if (b < kSub) return b;
  const unsigned top = b / kSub;
  return (std::uint64_t{kSub} | (b % kSub)) << (top - 3);
}

struct PerOp {
  std::atomic<std::uint64_t> sent{0};
  std::atomic<std::uint64_t> waited{0};
  std::atomic<std::uint64_t> total_ns{0};
  std::array<std::atomic<std::uint32_t>, kBuckets> hist{};
};

constexpr std::size_t kOps = static_cast<std::size_t>(proto::Op::kCount);

// Never destroyed: calls keep coming from atexit handlers.
PerOp* table() {
  static auto* t = new PerOp[kOps];
  return t;
}

const char* target() noexcept {
  static const char* where = report_target("IVCUDA_CALL_STATS");
  return where;
}

std::uint64_t median_ns(const PerOp& p) noexcept {
  const std::uint64_t n = p.waited.load(std::memory_order_relaxed);
  if (n == 0) return 0;
  std::uint64_t seen = 0;
  for (unsigned b = 0; b < kBuckets; ++b) {
    seen += p.hist[b].load(std::memory_order_relaxed);
    if (2 * seen >= n) return bucket_floor(b);
  }
  return 0;
}

// API calls by function (ApiScope): an open-addressed table keyed by the
// function's name as std::source_location gives it (one static string per
// call site), filled without locks.
constexpr std::size_t kApiSlots = 2048;
struct ApiSlot {
  std::atomic<const char*> function{nullptr};
  std::atomic<std::uint64_t> calls{0};
  std::atomic<std::uint64_t> total_ns{0};
};
ApiSlot* api_table() {
  static auto* t = new ApiSlot[kApiSlots];
  return t;
}
thread_local unsigned t_api_depth = 0;  // outermost calls only: one API call may make another

std::uint64_t now_ns() noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

void record_api(const char* function, std::uint64_t ns) noexcept {
  const auto start = static_cast<std::size_t>(std::hash<const void*>{}(function) % kApiSlots);
  for (std::size_t k = 0; k < kApiSlots; ++k) {
    ApiSlot& slot = api_table()[(start + k) % kApiSlots];
    const char* have = slot.function.load(std::memory_order_acquire);
    if (have == nullptr) {
      if (!slot.function.compare_exchange_strong(have, function, std::memory_order_acq_rel) && have != function)
        continue;
    } else if (have != function) {
      continue;
    }
    slot.calls.fetch_add(1, std::memory_order_relaxed);
    slot.total_ns.fetch_add(ns, std::memory_order_relaxed);
    return;
  }
}

// "CUresult cuMemcpyDtoH_v2(void*, CUdeviceptr, size_t)" -> "cuMemcpyDtoH_v2".
std::string short_name(const char* pretty) {
  std::string s(pretty);
  const std::size_t paren = s.find('(');
  if (paren != std::string::npos) s.resize(paren);
  const std::size_t space = s.rfind(' ');
  if (space != std::string::npos) s.erase(0, space + 1);
  return s;
}

std::uint64_t g_start_ns = now_ns();  // the library's load, about the process's start

// A library destructor runs after the program's atexit handlers, so the
// table covers the calls those make too.
[[gnu::destructor]] void report() noexcept {
  const char* where = target();
  if (where == nullptr) return;
  try {
    std::vector<std::size_t> ops;
    for (std::size_t i = 0; i < kOps; ++i)
      if (table()[i].sent.load(std::memory_order_relaxed) != 0) ops.push_back(i);
    // Where the time went first.
    std::sort(ops.begin(), ops.end(), [](std::size_t a, std::size_t b) {
      return table()[a].total_ns.load(std::memory_order_relaxed) > table()[b].total_ns.load(std::memory_order_relaxed);
    });
    const ReportSink sink(where);
    FILE* out = sink.get();
    if (out == nullptr) return;
    std::fprintf(out, "ivcuda: process %d: requests by kind (waited = round trips; times are the callers')\n",
                 static_cast<int>(::getpid()));
    std::fprintf(out, "ivcuda: %-24s %10s %10s %12s %12s\n", "request", "sent", "waited", "median us", "total ms");
    for (const std::size_t i : ops) {
      const PerOp& p = table()[i];
      std::fprintf(out, "ivcuda: %-24s %10llu %10llu %12.1f %12.2f\n", proto::op_name(static_cast<std::uint16_t>(i)),
                   static_cast<unsigned long long>(p.sent.load(std::memory_order_relaxed)),
                   static_cast<unsigned long long>(p.waited.load(std::memory_order_relaxed)),
                   static_cast<double>(median_ns(p)) / 1e3,
                   static_cast<double>(p.total_ns.load(std::memory_order_relaxed)) / 1e6);
    }
    // Where the calling threads spent their time in the library, round trips
    // included, by API function.
    std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> by_name;  // calls, ns
    std::uint64_t inside_ns = 0;
    for (std::size_t i = 0; i < kApiSlots; ++i) {
      const ApiSlot& slot = api_table()[i];
      const char* f = slot.function.load(std::memory_order_acquire);
      if (f == nullptr) continue;
      auto& [calls, ns] = by_name[short_name(f)];
      calls += slot.calls.load(std::memory_order_relaxed);
      ns += slot.total_ns.load(std::memory_order_relaxed);
      inside_ns += slot.total_ns.load(std::memory_order_relaxed);
    }
    std::vector<std::pair<std::string, std::pair<std::uint64_t, std::uint64_t>>> rows(by_name.begin(), by_name.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
    std::fprintf(out,
                 "ivcuda: process %d: %.3f s since the library loaded, %.3f s of it in API calls (outermost, "
                 "all threads), by function\n",
                 static_cast<int>(::getpid()), static_cast<double>(now_ns() - g_start_ns) / 1e9,
                 static_cast<double>(inside_ns) / 1e9);
    std::fprintf(out, "ivcuda: %-36s %10s %12s %12s\n", "function", "calls", "mean us", "total ms");
    for (const auto& [name, v] : rows)
      std::fprintf(out, "ivcuda: %-36s %10llu %12.2f %12.2f\n", name.c_str(), static_cast<unsigned long long>(v.first),
                   v.first == 0 ? 0.0 : static_cast<double>(v.second) / 1e3 / static_cast<double>(v.first),
                   static_cast<double>(v.second) / 1e6);
    const auto cc = compile_cache::counts();
    std::fprintf(out,
                 "ivcuda: process %d: compile cache (NVRTC, nvJitLink): %llu lookups, %llu hits, %llu bytes stored, "
                 "%llu hits from the cache directory\n",
                 static_cast<int>(::getpid()), static_cast<unsigned long long>(cc.lookups),
                 static_cast<unsigned long long>(cc.hits), static_cast<unsigned long long>(cc.stored_bytes),
                 static_cast<unsigned long long>(cc.disk_hits));
  } catch (...) {
  }
}

}  // namespace

bool enabled() noexcept { return target() != nullptr; }

ApiScope::ApiScope(const char* function) noexcept : function_(function) {
  if (t_api_depth++ == 0) start_ns_ = now_ns();
}

ApiScope::~ApiScope() {
  if (--t_api_depth == 0) record_api(function_, now_ns() - start_ns_);
}

void record(proto::Op op, bool waited, std::uint64_t ns) noexcept {
  const auto i = static_cast<std::size_t>(op);
  if (i >= kOps) return;
  PerOp& p = table()[i];
  p.sent.fetch_add(1, std::memory_order_relaxed);
  if (!waited) return;
  p.waited.fetch_add(1, std::memory_order_relaxed);
  p.total_ns.fetch_add(ns, std::memory_order_relaxed);
  p.hist[bucket_of(ns)].fetch_add(1, std::memory_order_relaxed);
}

}  // namespace ivcuda::guest::call_stats
