// Round-trip latency of the cheapest driver calls: cuEventQuery of a
// completed event costs a full request/reply through ivcuda's transport
// (natively, a driver call); an idle stream's query and an idle context's
// synchronise are answered in ivcuda's guest library once the host has found
// them idle and nothing was sent since (guest/idle_streams.cc). Two
// patterns:
//   back-to-back  the next call follows at once, so the daemon is still
//                 polling its rings (its --spin-us window): the spin path;
//   --gap-us G    a pause before every call, longer than the daemon's poll
//                 window, so it has gone to sleep and each request must ring
//                 its doorbell first: the doorbell path.
// usage: drv_roundtrip [--rounds N] [--gap-us G]   (defaults 1000 and 1000)
#include <algorithm>
#include <chrono>
#include <thread>

#include "check.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Stats {
  double median_us, p99_us, min_us;
};

Stats summarize(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  const size_t n = us.size();
  // Nearest rank: p99 of 1000 samples is the 990th.
  const size_t r99 = (n * 99 + 99) / 100;
  return {us[n / 2], us[std::min(n, std::max<size_t>(r99, 1)) - 1], us.front()};
}

template <class Call>
void measure(const char* what, const char* pattern, int rounds, int gap_us, Call&& call) {
  std::vector<double> us;
  us.reserve(static_cast<size_t>(rounds));
  int failed = 0;
  for (int i = 0; i < rounds; ++i) {
    if (gap_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
    const auto t0 = Clock::now();
    const CUresult r = call();
    const auto t1 = Clock::now();
    failed += r != CUDA_SUCCESS;
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  ++check::g_checks;
  if (failed != 0) check::fail(__FILE__, __LINE__, std::string(what) + ": " + std::to_string(failed) + " calls failed");
  const Stats s = summarize(std::move(us));
  std::printf("roundtrip %-17s %-20s n=%d median %.2f us  p99 %.2f us  min %.2f us\n", what, pattern, rounds,
              s.median_us, s.p99_us, s.min_us);
}

}  // namespace

int main(int argc, char** argv) {
  const char* r = check::arg(argc, argv, "--rounds");
  const char* g = check::arg(argc, argv, "--gap-us");
  const int rounds = r != nullptr ? std::atoi(r) : 1000;
  const int gap_us = g != nullptr ? std::atoi(g) : 1000;
  if (rounds < 1 || rounds > 10000000 || gap_us < 1 || gap_us > 1000000) {
    std::fprintf(stderr, "usage: drv_roundtrip [--rounds 1..10000000] [--gap-us 1..1000000]\n");
    return 2;
  }
  OK(cuInit(0));
  CUdevice d;
  OK(cuDeviceGet(&d, 0));
  CUcontext ctx = nullptr;
  OK(cuDevicePrimaryCtxRetain(&ctx, d));
  OK(cuCtxSetCurrent(ctx));
  CUstream s = nullptr;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUevent ev = nullptr;
  OK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  OK(cuEventRecord(ev, s));
  OK(cuEventSynchronize(ev));
  if (check::g_failures != 0) return check::finish("drv_roundtrip");

  // Warm-up: first-call costs (lazy set-up on either side) are not latency.
  for (int i = 0; i < 100; ++i) {
    OK(cuEventQuery(ev));
    OK(cuStreamQuery(s));
    OK(cuCtxSynchronize());
  }
  const std::string gap = "gap " + std::to_string(gap_us) + " us";
  measure("cuEventQuery", "back-to-back", rounds, 0, [&] { return cuEventQuery(ev); });
  measure("cuStreamQuery", "back-to-back", rounds, 0, [&] { return cuStreamQuery(s); });
  measure("cuCtxSynchronize", "back-to-back", rounds, 0, [] { return cuCtxSynchronize(); });
  measure("cuEventQuery", gap.c_str(), rounds, gap_us, [&] { return cuEventQuery(ev); });
  measure("cuStreamQuery", gap.c_str(), rounds, gap_us, [&] { return cuStreamQuery(s); });
  measure("cuCtxSynchronize", gap.c_str(), rounds, gap_us, [] { return cuCtxSynchronize(); });

  OK(cuEventDestroy(ev));
  OK(cuStreamDestroy(s));
  OK(cuDevicePrimaryCtxRelease(d));
  return check::finish("drv_roundtrip");
}
