// Pageable copies through the staging pipeline, byte for byte.
//
//   staged_copy_test [--errors]
//
// Run through ivcuda with a small --staging-size (run_staged_copy.sh uses
// 64 KiB: four 16 KiB slots), every size below crosses many chunks and slot
// reuses. Odd sizes and odd host/device offsets catch off-by-one chunking;
// guard bytes on both sides of each destination catch overruns; threads that
// outnumber the channels share the overflow channel's staging area; a
// memset / copy / copy sequence in one stream checks stream order. --errors
// adds copies that fail on the host (the staging counter must still advance,
// so later copies work): ivcuda-only, since what a driver returns for a bogus
// device pointer is its own business.
//
// Uses the Driver API only, like tests/programs, so it also runs natively.
#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/programs/check.h"

namespace {

// check.h's counters are plain ints; the threads below keep their own and
// add them up after join.
thread_local int t_checks = 0;
thread_local int t_failures = 0;

void tally(bool ok, int line, const char* what) {
  ++t_checks;
  if (!ok) {
    ++t_failures;
    std::fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, line, what);
  }
}
#define T_EXPECT(cond) tally((cond), __LINE__, "not true: " #cond)
#define T_OK(call)                                                   \
  do {                                                               \
    const CUresult r_ = (call);                                      \
    tally(r_ == CUDA_SUCCESS, __LINE__, #call);                      \
    if (r_ != CUDA_SUCCESS) std::fprintf(stderr, "  -> %d\n", r_);  \
  } while (0)

constexpr unsigned char kGuard = 0xC5;
constexpr std::size_t kGuardBytes = 64;

// One HtoD then DtoH of n bytes between host offset ho and device offset do_
// of `dev`, sync or in stream s; checks the data and both guard zones.
void roundtrip(CUdeviceptr dev, std::size_t dev_size, std::size_t n, std::size_t ho, std::size_t do_, unsigned seed,
               CUstream s, bool async) {
  T_EXPECT(do_ + n + kGuardBytes <= dev_size);
  const auto data = check::random_bytes(n + ho, seed);
  // The device window and its neighbours start as the guard pattern.
  T_OK(cuMemsetD8(dev, kGuard, do_ + n + kGuardBytes));
  if (async) {
    T_OK(cuMemcpyHtoDAsync(dev + do_, data.data() + ho, n, s));
  } else {
    T_OK(cuMemcpyHtoD(dev + do_, data.data() + ho, n));
  }
  std::vector<unsigned char> back(kGuardBytes + n + kGuardBytes + 3, kGuard);
  unsigned char* dst = back.data() + kGuardBytes + (seed % 4);  // odd host destination too
  if (async) {
    T_OK(cuMemcpyDtoHAsync(dst, dev + do_, n, s));
    T_OK(cuStreamSynchronize(s));
  } else {
    T_OK(cuMemcpyDtoH(dst, dev + do_, n));
  }
  const bool same = std::memcmp(dst, data.data() + ho, n) == 0;
  T_EXPECT(same);
  bool guards = true;
  for (const unsigned char* p = back.data(); p < dst; ++p) guards &= *p == kGuard;
  for (const unsigned char* p = dst + n; p < back.data() + back.size(); ++p) guards &= *p == kGuard;
  T_EXPECT(guards);
  // Nothing written on the device outside the window.
  std::vector<unsigned char> around(do_ + n + kGuardBytes);
  T_OK(cuMemcpyDtoH(around.data(), dev, around.size()));
  bool dev_guards = true;
  for (std::size_t i = 0; i < do_; ++i) dev_guards &= around[i] == kGuard;
  for (std::size_t i = do_ + n; i < around.size(); ++i) dev_guards &= around[i] == kGuard;
  T_EXPECT(dev_guards);
  if (!same || !guards || !dev_guards)
    std::fprintf(stderr, "  (n=%zu host+%zu dev+%zu %s)\n", n, ho, do_, async ? "async" : "sync");
}

const std::vector<std::size_t>& sizes() {
  static const std::vector<std::size_t> v = {
      8193,                          // just past the inline limit
      16383, 16384, 16385,           // around one 16 KiB slot
      4 * 16384 - 1, 4 * 16384 + 1,  // around the whole staging area
      5 * 16384 + 4097,              // wraps the slots once
      (1u << 20) + 13,               // 64 chunks, every slot reused many times
      (3u << 20) + 4095,
  };
  return v;
}

void worker(CUcontext ctx, int id, int* checks, int* failures) {
  T_OK(cuCtxSetCurrent(ctx));
  CUstream s;
  T_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const std::size_t dev_size = (4u << 20);
  CUdeviceptr d;
  T_OK(cuMemAlloc(&d, dev_size));
  unsigned seed = 1000u * static_cast<unsigned>(id);
  for (int round = 0; round < 2; ++round)
    for (std::size_t n : sizes()) {
      ++seed;
      roundtrip(d, dev_size, n, seed % 5, (seed / 5) % 9, seed, s, (seed & 1) != 0);
    }
  T_OK(cuMemFree(d));
  T_OK(cuStreamDestroy(s));
  *checks = t_checks;
  *failures = t_failures;
}

}  // namespace

int main(int argc, char** argv) {
  bool errors = false;
  for (int i = 1; i < argc; ++i) errors |= std::strcmp(argv[i], "--errors") == 0;
  OK(cuInit(0));
  CUdevice dev;
  OK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  CUstream s;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const std::size_t dev_size = 8u << 20;
  CUdeviceptr d;
  OK(cuMemAlloc(&d, dev_size));

  // Every size at several host and device offsets, sync and async.
  unsigned seed = 1;
  for (std::size_t n : sizes())
    for (std::size_t ho : {0u, 1u, 3u, 4095u})
      for (std::size_t dof : {0u, 7u}) {
        ++seed;
        roundtrip(d, dev_size, n, ho, dof, seed, s, (seed & 1) != 0);
      }

  // Stream order: memset, pageable HtoD over it, pageable DtoH, all queued
  // in one stream; the copy must see the memset done and the HtoD after it.
  {
    const std::size_t n = (2u << 20) + 333;
    const auto data = check::random_bytes(n, 77);
    std::vector<unsigned char> back(n, 0);
    OK(cuMemsetD8Async(d, 0xEE, n, s));
    OK(cuMemcpyHtoDAsync(d, data.data(), n, s));
    OK(cuMemsetD8Async(d + n, 0x11, 16, s));
    OK(cuMemcpyDtoHAsync(back.data(), d, n, s));
    OK(cuStreamSynchronize(s));
    EXPECT(back == data);
  }

  // More threads than channels: some share the overflow channel and with it
  // one staging area.
  {
    constexpr int kThreads = 6;
    int checks[kThreads] = {}, failures[kThreads] = {};
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t) ts.emplace_back(worker, ctx, t + 1, &checks[t], &failures[t]);
    for (auto& t : ts) t.join();
    for (int t = 0; t < kThreads; ++t) {
      check::g_checks += checks[t];
      check::g_failures += failures[t];
    }
  }

  if (errors) {
    // A multi-chunk copy whose chunks all fail on the host (a device range
    // nobody allocated), each way: an error comes back (an HtoD is posted,
    // so at the next synchronising call), and the pipeline is intact for the
    // copies after it.
    const std::size_t n = (1u << 20) + 5;
    std::vector<unsigned char> buf(n, 1);
    // Below mmap_min_addr: no allocation of any driver or double lives there.
    const CUdeviceptr bogus = 0x1000;
    OK(cuMemcpyHtoD(bogus, buf.data(), n));
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuCtxSynchronize());
    ++check::g_checks;
    if (cuMemcpyDtoH(buf.data(), bogus, n) == CUDA_SUCCESS) check::fail(__FILE__, __LINE__, "bogus DtoH succeeded");
    (void)cuCtxSynchronize();
    roundtrip(d, dev_size, (2u << 20) + 1, 3, 5, 4242, s, false);
    roundtrip(d, dev_size, (2u << 20) + 1, 1, 2, 4243, s, true);
  }

  OK(cuMemFree(d));
  OK(cuStreamDestroy(s));
  OK(cuDevicePrimaryCtxRelease(dev));
  check::g_checks += t_checks;  // the main thread's roundtrip() checks
  check::g_failures += t_failures;
  return check::finish("staged_copy_test");
}
