// Pageable copies through the staging pipeline, byte for byte.
//
//   staged_copy_test [--ptx FILE] [--errors] [--ordering] [--long-mib N]
//
// Run through ivcuda with a small --staging-size (run_staged_copy.sh uses
// 64 KiB: four 16 KiB slots), every size below crosses many chunks and slot
// reuses. Odd sizes and odd host/device offsets catch off-by-one chunking;
// guard bytes on both sides of each destination catch overruns; the sizes
// around 8 KiB cross from copies carried in the record (both ways) to staged
// ones; threads that outnumber the channels share the overflow channel's
// staging area; a memset / copy / copy sequence in one stream checks stream
// order; a long copy (--long-mib, 64 MiB by default) runs the pipeline long:
// thousands of chunks through every slot. --ptx adds copies interleaved with
// kernels and streams, in orders CUDA defines. ivcuda-only checks:
// --errors adds copies that fail on the host (a pageable HtoD is posted, so
// its error comes at the next synchronising call; the staging counter must
// still advance, so later copies work), since what a driver returns for a
// bogus device pointer is its own business; --ordering adds work in a
// non-blocking stream right after a synchronous HtoD, which ivcuda orders
// after the copy and CUDA does not promise to.
//
// Uses the Driver API only, like tests/programs, so it also runs natively.
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
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
      1, 100,
      8191, 8192,                    // the most a record carries (either way)
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

// A kernel launch of one block per 256 threads over n elements.
void launch(CUfunction f, CUstream s, unsigned n, std::vector<void*> args) {
  OK(cuLaunchKernel(f, (n + 255) / 256, 1, 1, 256, 1, 1, 0, s, args.data(), nullptr));
}

std::vector<float> ramp(std::size_t n, float from) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = from + static_cast<float>(i % 100000);
  return v;
}

// Copies between kernels and streams, in orders CUDA defines: a synchronous
// copy is ordered with the legacy stream, which waits for the blocking
// streams' work and which their later work waits for; an Async one with its
// own stream. n bytes per buffer: carried in the record, or staged.
void interleave(CUmodule m, std::size_t bytes) {
  CUfunction add, fill, spin;
  OK(cuModuleGetFunction(&add, m, "ivc_vec_add"));
  OK(cuModuleGetFunction(&fill, m, "ivc_fill_u32"));
  OK(cuModuleGetFunction(&spin, m, "ivc_spin_ns"));
  const auto n = static_cast<unsigned>(bytes / 4);
  CUstream blocking, nb;
  OK(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
  OK(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
  CUdeviceptr da, db, dc;
  OK(cuMemAlloc(&da, bytes));
  OK(cuMemAlloc(&db, bytes));
  OK(cuMemAlloc(&dc, bytes));
  int in = static_cast<int>(n);
  auto sum_ok = [&](const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c) {
    for (unsigned i = 0; i < n; ++i)
      if (c[i] != a[i] + b[i]) return false;
    return true;
  };
  {
    // Synchronous copies, a kernel in a blocking stream, a synchronous copy back.
    const auto a = ramp(n, 1), b = ramp(n, 1000);
    std::vector<float> c(n, -1);
    OK(cuMemcpyHtoD(da, a.data(), bytes));
    OK(cuMemcpyHtoD(db, b.data(), bytes));
    launch(add, blocking, n, {&da, &db, &dc, &in});
    OK(cuMemcpyDtoH(c.data(), dc, bytes));
    EXPECT(sum_ok(a, b, c));
  }
  {
    // The same in the legacy stream, an input overwritten by a synchronous
    // copy right after the kernel that reads it: the kernel saw the first
    // contents, the copy back sees the second.
    const auto a = ramp(n, 7), b = ramp(n, 70), a2 = ramp(n, 9);
    std::vector<float> c(n, -1), back(n, -1);
    OK(cuMemcpyHtoD(da, a.data(), bytes));
    OK(cuMemcpyHtoD(db, b.data(), bytes));
    launch(add, nullptr, n, {&da, &db, &dc, &in});
    OK(cuMemcpyHtoD(da, a2.data(), bytes));
    OK(cuMemcpyDtoH(c.data(), dc, bytes));
    EXPECT(sum_ok(a, b, c));
    OK(cuMemcpyDtoH(back.data(), da, bytes));
    EXPECT(back == a2);
  }
  {
    // A busy blocking stream: the synchronous copy waits for its kernel
    // (2 ms) and the kernel's output is not overwritten before it ran.
    unsigned long long ns = 2000000;
    unsigned value = 0x5eed5eedu;
    unsigned long long cnt = n;
    launch(spin, blocking, 1, {&ns});
    launch(fill, blocking, n, {&dc, &value, &cnt});
    const auto a = ramp(n, 3);
    OK(cuMemcpyHtoD(da, a.data(), bytes));
    std::vector<unsigned> filled(n, 0);
    OK(cuMemcpyDtoH(filled.data(), dc, bytes));
    bool all = true;
    for (unsigned v : filled) all &= v == value;
    EXPECT(all);
    std::vector<float> back(n, -1);
    OK(cuMemcpyDtoH(back.data(), da, bytes));
    EXPECT(back == a);
  }
  {
    // Async copies in one non-blocking stream around a kernel there, with
    // synchronous copies of other buffers in between.
    const auto a = ramp(n, 11), b = ramp(n, 1100), other = ramp(n, 5);
    std::vector<float> c(n, -1), other_back(n, -1);
    OK(cuMemcpyHtoDAsync(da, a.data(), bytes, nb));
    OK(cuMemcpyHtoDAsync(db, b.data(), bytes, nb));
    OK(cuMemcpyHtoD(dc, other.data(), bytes));
    OK(cuMemcpyDtoH(other_back.data(), dc, bytes));
    EXPECT(other_back == other);
    launch(add, nb, n, {&da, &db, &dc, &in});
    OK(cuMemcpyDtoHAsync(c.data(), dc, bytes, nb));
    OK(cuStreamSynchronize(nb));
    EXPECT(sum_ok(a, b, c));
  }
  OK(cuMemFree(da));
  OK(cuMemFree(db));
  OK(cuMemFree(dc));
  OK(cuStreamDestroy(blocking));
  OK(cuStreamDestroy(nb));
}

// ivcuda-only: work in a non-blocking stream right after a synchronous
// pageable HtoD sees the copied data (CUDA's copy may still be in its DMA
// when it returns, and a non-blocking stream does not wait for the legacy
// one). Also from another thread that the first one hands the buffer to.
void ordering(CUmodule m, CUcontext ctx, std::size_t bytes) {
  CUfunction add;
  OK(cuModuleGetFunction(&add, m, "ivc_vec_add"));
  const auto n = static_cast<unsigned>(bytes / 4);
  int in = static_cast<int>(n);
  CUstream nb;
  OK(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
  CUdeviceptr da, db, dc;
  OK(cuMemAlloc(&da, bytes));
  OK(cuMemAlloc(&db, bytes));
  OK(cuMemAlloc(&dc, bytes));
  for (int round = 0; round < 3; ++round) {
    const auto a = ramp(n, static_cast<float>(round)), b = ramp(n, 500);
    std::vector<float> c(n, -1);
    OK(cuMemcpyHtoD(da, a.data(), bytes));
    OK(cuMemcpyHtoD(db, b.data(), bytes));
    auto use = [&] {
      launch(add, nb, n, {&da, &db, &dc, &in});
      OK(cuMemcpyDtoHAsync(c.data(), dc, bytes, nb));
      OK(cuStreamSynchronize(nb));
    };
    if (round == 2) {
      // check.h's counters: this thread is joined before anyone reads them.
      std::thread t([&] {
        OK(cuCtxSetCurrent(ctx));
        use();
      });
      t.join();
    } else {
      use();
    }
    bool same = true;
    for (unsigned i = 0; i < n; ++i) same &= c[i] == a[i] + b[i];
    EXPECT(same);
  }
  OK(cuMemFree(da));
  OK(cuMemFree(db));
  OK(cuMemFree(dc));
  OK(cuStreamDestroy(nb));
}

}  // namespace

int main(int argc, char** argv) {
  const bool errors = check::flag(argc, argv, "--errors");
  const bool order = check::flag(argc, argv, "--ordering");
  const char* ptx = check::arg(argc, argv, "--ptx");
  const char* long_mib = check::arg(argc, argv, "--long-mib");
  const std::size_t long_bytes = (long_mib != nullptr ? std::strtoul(long_mib, nullptr, 10) : 64u) << 20;
  if (long_bytes == 0) {
    std::fprintf(stderr, "staged_copy_test: --long-mib wants a size of at least 1\n");
    return 2;
  }
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

  // A destination that runs past the allocation it starts in is refused at
  // once, carried in the record or staged, synchronous or not.
  for (std::size_t n : {std::size_t{200}, std::size_t{100000}}) {
    const std::vector<unsigned char> buf(n, 3);
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD(d + dev_size - n / 2, buf.data(), n));
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoDAsync(d + dev_size - n / 2, buf.data(), n, s));
  }
  OK(cuCtxSynchronize());

  // Long: --long-mib each way, synchronous and in a stream.
  {
    const std::size_t n = long_bytes;
    CUdeviceptr big;
    OK(cuMemAlloc(&big, n + kGuardBytes + 16));
    roundtrip(big, n + kGuardBytes + 16, n, 0, 0, 64, s, false);
    roundtrip(big, n + kGuardBytes + 16, n, 1, 8, 65, s, true);
    OK(cuMemFree(big));
  }

  if (ptx != nullptr) {
    const std::string text = check::read_file(ptx);
    CUmodule m;
    OK(cuModuleLoadData(&m, text.c_str()));
    for (std::size_t bytes : {std::size_t{4096}, std::size_t{8192}, (std::size_t{3} << 20) + 4})
      interleave(m, bytes);
    if (order)
      for (std::size_t bytes : {std::size_t{8192}, (std::size_t{3} << 20) + 4}) ordering(m, ctx, bytes);
    OK(cuModuleUnload(m));
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
    // Copies whose chunks all fail on the host (a device range nobody
    // allocated), each way, carried in the record and staged: a synchronous
    // HtoD to memory outside the guest's books waits for the host's answer,
    // as the driver refuses it at once; an Async one is posted, so its error
    // comes at the next synchronising call (once); a DtoH reports its own.
    // The pipeline is intact for the copies after them.
    // Below mmap_min_addr: no allocation of any driver or double lives there.
    const CUdeviceptr bogus = 0x1000;
    for (std::size_t n : {std::size_t{64}, (std::size_t{1} << 20) + 5}) {
      std::vector<unsigned char> buf(n, 1);
      EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD(bogus, buf.data(), n));
      OK(cuCtxSynchronize());
      OK(cuMemcpyHtoDAsync(bogus, buf.data(), n, s));
      EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuStreamSynchronize(s));
      OK(cuStreamSynchronize(s));
      // Staged chunks after it (in the same slots) still work.
      roundtrip(d, dev_size, (1u << 20) + 7, 2, 3, 4240 + static_cast<unsigned>(n % 7), s, false);
      // A good copy right after a failed posted one: the first synchronising
      // call reports the failure.
      OK(cuMemcpyHtoDAsync(bogus, buf.data(), n, s));
      OK(cuMemcpyHtoD(d, buf.data(), n));
      std::vector<unsigned char> back(n, 0);
      EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH(back.data(), d, n));
      OK(cuMemcpyDtoH(back.data(), d, n));
      EXPECT(back == buf);
      EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH(buf.data(), bogus, n));
      EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoHAsync(buf.data(), bogus, n, s));
      OK(cuCtxSynchronize());
    }
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
