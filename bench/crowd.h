// The crowd's figures (ivcuda-bench's 8procs.crowd.*): what eight processes
// move together, each doing the same phase at once.
//
// Each child times its own window of a phase on CLOCK_MONOTONIC (one clock
// for every process of the machine) and reports what it moved in it as a span
// line. The aggregate is everything moved over the phase's whole extent,
// from the first child's start to the last child's end. The sum of the
// children's own rates, which ivcuda-bench reported before, is that only
// when the windows coincide; when they do not (a child that starts late, or
// one served after another) it overstates, up to as many times as there are
// children: eight processes' page-locked DtoH read 108.8 GB/s so natively on
// the H200, twice what its one PCIe Gen5 x16 link carries.
#pragma once

#include <time.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace ivcuda::bench {

// Phases a crowd goes through, each behind a barrier of its own: launches,
// then page-locked HtoD and DtoH, then pageable HtoD and DtoH.
inline constexpr int kCrowdPhases = 5;

// What one child did in one phase: `amount` (bytes, or launches) between
// start_ns and end_ns on CLOCK_MONOTONIC.
struct Span {
  double amount = 0;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
};

inline std::int64_t monotonic_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<std::int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// "span NAME UNIT AMOUNT START_NS END_NS": a line no figure line ("NAME UNIT
// VALUE") can be taken for.
inline std::string format_span(const std::string& name, const std::string& unit, const Span& s) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "span %s %s %.17g %" PRId64 " %" PRId64, name.c_str(), unit.c_str(), s.amount,
                s.start_ns, s.end_ns);
  return buf;
}

inline bool parse_span(const std::string& line, std::string* name, std::string* unit, Span* s) {
  char n[256], u[64];
  long long a = 0, b = 0;
  double amount = 0;
  if (std::sscanf(line.c_str(), "span %255s %63s %lf %lld %lld", n, u, &amount, &a, &b) != 5) return false;
  if (b < a || amount < 0) return false;
  *name = n;
  *unit = u;
  *s = {amount, a, b};
  return true;
}

// All that the spans moved over their whole extent, in `unit`: GB/s (amounts
// in bytes) or anything per second. 0 for no spans or an empty extent.
inline double aggregate(const std::vector<Span>& spans, const std::string& unit) {
  if (spans.empty()) return 0;
  double total = 0;
  std::int64_t first = spans.front().start_ns, last = spans.front().end_ns;
  for (const Span& s : spans) {
    total += s.amount;
    first = std::min(first, s.start_ns);
    last = std::max(last, s.end_ns);
  }
  if (last <= first) return 0;
  const double per_second = total / (static_cast<double>(last - first) * 1e-9);
  return unit == "GB/s" ? per_second * 1e-9 : per_second;
}

}  // namespace ivcuda::bench
