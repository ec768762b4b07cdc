// Host functions in streams (cuLaunchHostFunc, cuStreamAddCallback): each
// runs after all earlier work in its stream and before any later work, and
// cuStreamSynchronize waits for it. What the program prints is deterministic,
// so the GPU machine diffs native and ivcuda output.
//
//   drv_hostfunc [--ptx test_kernels.ptx]   (without --ptx the kernel checks are skipped)
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>

#include "check.h"

namespace {

constexpr unsigned kN = 4096;

// ThreadSanitizer cannot see how the driver orders a host function before the
// synchronize that waits for it (through ivcuda that edge crosses processes;
// natively libcuda is not instrumented). Each function ends with publish() and
// the main thread calls observe() after synchronizing: a real edge, redundant
// with the driver's, that TSan can see.
std::atomic<unsigned> g_published{0};
void publish() { g_published.fetch_add(1, std::memory_order_release); }
void observe() { (void)g_published.load(std::memory_order_acquire); }

std::string read_file(const char* path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// What a host function saw of a page-locked buffer: how many words held the expected value.
struct Seen {
  const unsigned* p = nullptr;
  unsigned want = 0;
  unsigned matches = 0;
};
void count_matches(void* arg) {
  auto* s = static_cast<Seen*>(arg);
  s->matches = 0;
  for (unsigned i = 0; i < kN; ++i) s->matches += s->p[i] == s->want ? 1u : 0u;
  publish();
}

// Writes a pattern into page-locked memory, slowly: later work must still wait for it.
struct Produce {
  unsigned* p = nullptr;
  unsigned base = 0;
};
void produce(void* arg) {
  auto* a = static_cast<Produce*>(arg);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  for (unsigned i = 0; i < kN; ++i) a->p[i] = a->base + i;
  publish();
}

// Functions on several streams append to one log per stream.
struct Log {
  std::mutex mu;
  std::vector<int> order;
};
struct Entry {
  Log* log = nullptr;
  int index = 0;
};
void append(void* arg) {
  auto* e = static_cast<Entry*>(arg);
  std::lock_guard lk(e->log->mu);
  e->log->order.push_back(e->index);
  publish();
}

struct CallbackSeen {
  CUstream stream = nullptr;
  CUresult status = CUDA_ERROR_UNKNOWN;
  int calls = 0;
};
void CUDA_CB on_callback(CUstream s, CUresult status, void* arg) {
  auto* c = static_cast<CallbackSeen*>(arg);
  c->stream = s;
  c->status = status;
  ++c->calls;
  publish();
}

void slow_flag(void* arg) {
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  static_cast<std::atomic<int>*>(arg)->store(1, std::memory_order_release);
  publish();
}

// Earlier work (a memset, then a copy into page-locked memory) is visible to the function.
void reads_earlier_work(CUstream s, unsigned* pinned) {
  CUdeviceptr d = 0;
  OK(cuMemAlloc(&d, kN * sizeof(unsigned)));
  OK(cuMemsetD32Async(d, 0x5eed, kN, s));
  OK(cuMemcpyDtoHAsync(pinned, d, kN * sizeof(unsigned), s));
  Seen seen{pinned, 0x5eed, 0};
  OK(cuLaunchHostFunc(s, count_matches, &seen));
  OK(cuStreamSynchronize(s));
  observe();
  EXPECT(seen.matches == kN);
  std::printf("host func after memset+copy saw %u of %u words\n", seen.matches, kN);
  OK(cuMemFree(d));
}

// The function's writes to page-locked memory are what the later copy moves.
void later_work_waits(CUstream s, unsigned* pinned) {
  CUdeviceptr d = 0;
  OK(cuMemAlloc(&d, kN * sizeof(unsigned)));
  for (unsigned i = 0; i < kN; ++i) pinned[i] = 0;
  Produce prod{pinned, 1000};
  OK(cuLaunchHostFunc(s, produce, &prod));
  OK(cuMemcpyHtoDAsync(d, pinned, kN * sizeof(unsigned), s));
  OK(cuStreamSynchronize(s));
  observe();
  std::vector<unsigned> back(kN, 0);
  OK(cuMemcpyDtoH(back.data(), d, kN * sizeof(unsigned)));
  unsigned good = 0;
  for (unsigned i = 0; i < kN; ++i) good += back[i] == 1000 + i ? 1u : 0u;
  EXPECT(good == kN);
  std::printf("copy after host func moved %u of %u produced words\n", good, kN);
  OK(cuMemFree(d));
}

// A kernel writes page-locked memory the function reads; the function writes
// a word a later kernel increments.
void kernels_around(CUstream s, CUmodule m, unsigned* pinned) {
  CUfunction fill = nullptr, inc = nullptr;
  OK(cuModuleGetFunction(&fill, m, "ivc_fill_u32"));
  OK(cuModuleGetFunction(&inc, m, "ivc_inc_u32"));
  CUdeviceptr dp = 0;
  OK(cuMemHostGetDevicePointer(&dp, pinned, 0));
  unsigned value = 77;
  unsigned long long n = kN;
  void* fill_args[] = {&dp, &value, &n};
  OK(cuLaunchKernel(fill, 4, 1, 1, 128, 1, 1, 0, s, fill_args, nullptr));
  Seen seen{pinned, 77, 0};
  OK(cuLaunchHostFunc(s, count_matches, &seen));
  Produce prod{pinned, 41};  // pinned[0] becomes 41
  OK(cuLaunchHostFunc(s, produce, &prod));
  void* inc_args[] = {&dp};
  OK(cuLaunchKernel(inc, 1, 1, 1, 1, 1, 1, 0, s, inc_args, nullptr));
  OK(cuStreamSynchronize(s));
  observe();
  EXPECT(seen.matches == kN);
  EXPECT(pinned[0] == 42);
  EXPECT(pinned[1] == 42);
  std::printf("host func after kernel saw %u of %u words; kernel after host func made %u\n", seen.matches, kN,
              pinned[0]);
}

// Many functions on two streams, with work between them, run in their stream's order.
void order_on_two_streams(CUstream a, CUstream b) {
  constexpr int kPerStream = 24;
  CUdeviceptr d = 0;
  OK(cuMemAlloc(&d, 2 * kN * sizeof(unsigned)));
  Log log_a, log_b;
  std::vector<Entry> ea(kPerStream), eb(kPerStream);
  for (int i = 0; i < kPerStream; ++i) {
    ea[static_cast<size_t>(i)] = Entry{&log_a, i};
    eb[static_cast<size_t>(i)] = Entry{&log_b, i};
    OK(cuLaunchHostFunc(a, append, &ea[static_cast<size_t>(i)]));
    OK(cuMemsetD32Async(d, static_cast<unsigned>(i), kN, a));
    OK(cuLaunchHostFunc(b, append, &eb[static_cast<size_t>(i)]));
    OK(cuMemsetD32Async(d + kN * sizeof(unsigned), static_cast<unsigned>(i), kN, b));
  }
  OK(cuStreamSynchronize(a));
  observe();
  OK(cuStreamSynchronize(b));
  observe();
  auto in_order = [](const Log& l) {
    if (l.order.size() != static_cast<size_t>(kPerStream)) return false;
    for (int i = 0; i < kPerStream; ++i)
      if (l.order[static_cast<size_t>(i)] != i) return false;
    return true;
  };
  EXPECT(in_order(log_a));
  EXPECT(in_order(log_b));
  std::printf("two streams: %zu and %zu host funcs, %s and %s\n", log_a.order.size(), log_b.order.size(),
              in_order(log_a) ? "in order" : "OUT OF ORDER", in_order(log_b) ? "in order" : "OUT OF ORDER");
  OK(cuMemFree(d));
}

void callbacks(CUstream s) {
  CallbackSeen seen;
  OK(cuStreamAddCallback(s, on_callback, &seen, 0));
  OK(cuStreamSynchronize(s));
  observe();
  EXPECT(seen.calls == 1);
  EXPECT(seen.stream == s);
  EXPECT(seen.status == CUDA_SUCCESS);
  std::printf("stream callback: %d call(s), own stream %s, status %s\n", seen.calls,
              seen.stream == s ? "yes" : "no", check::name(seen.status));
}

// cuStreamSynchronize and cuCtxSynchronize return only after the function has.
void synchronize_waits(CUstream s) {
  std::atomic<int> flag{0};
  OK(cuLaunchHostFunc(s, slow_flag, &flag));
  OK(cuStreamSynchronize(s));
  observe();
  const int after_stream = flag.load(std::memory_order_acquire);
  EXPECT(after_stream == 1);
  std::atomic<int> flag2{0};
  OK(cuLaunchHostFunc(nullptr, slow_flag, &flag2));  // the legacy default stream
  OK(cuCtxSynchronize());
  observe();
  const int after_ctx = flag2.load(std::memory_order_acquire);
  EXPECT(after_ctx == 1);
  std::printf("synchronize waited for the host func: stream %s, context %s\n", after_stream ? "yes" : "no",
              after_ctx ? "yes" : "no");
}

// fork() while a function is pending: the child (which makes no CUDA calls,
// as CUDA requires) exits, and the parent's function still runs exactly once.
void fork_while_pending(CUstream s) {
  std::atomic<int> flag{0};
  OK(cuLaunchHostFunc(s, slow_flag, &flag));
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = -1;
  EXPECT(child > 0 && ::waitpid(child, &status, 0) == child);
  const bool child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  EXPECT(child_ok);
  OK(cuStreamSynchronize(s));
  observe();
  EXPECT(flag.load() == 1);
  std::printf("fork with a host func pending: child %s, parent's func ran %s\n", child_ok ? "ok" : "FAILED",
              flag.load() == 1 ? "once" : "NOT");
}

void bad_arguments(CUstream s) {
  // Printed rather than asserted: the diff against the native run is the check.
  std::printf("cuLaunchHostFunc(null fn): %s\n", check::name(cuLaunchHostFunc(s, nullptr, nullptr)));
  std::printf("cuStreamAddCallback(flags 1): %s\n", check::name(cuStreamAddCallback(s, on_callback, nullptr, 1)));
}

}  // namespace

int main(int argc, char** argv) {
  OK(cuInit(0));
  CUdevice dev = 0;
  OK(cuDeviceGet(&dev, 0));
  CUcontext ctx = nullptr;
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  if (check::g_failures != 0) return check::finish("drv_hostfunc");

  CUstream a = nullptr, b = nullptr;
  OK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  OK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  void* host = nullptr;
  OK(cuMemHostAlloc(&host, kN * sizeof(unsigned), CU_MEMHOSTALLOC_DEVICEMAP));
  auto* pinned = static_cast<unsigned*>(host);

  reads_earlier_work(a, pinned);
  later_work_waits(a, pinned);
  if (const char* ptx = check::arg(argc, argv, "--ptx")) {
    const std::string text = read_file(ptx);
    CUmodule m = nullptr;
    OK(cuModuleLoadData(&m, text.c_str()));
    if (m != nullptr) {
      kernels_around(b, m, pinned);
      OK(cuModuleUnload(m));
    }
  } else {
    std::printf("kernel checks skipped: no --ptx\n");
  }
  order_on_two_streams(a, b);
  callbacks(b);
  synchronize_waits(a);
  fork_while_pending(b);
  bad_arguments(a);

  OK(cuMemFreeHost(host));
  OK(cuStreamDestroy(a));
  OK(cuStreamDestroy(b));
  OK(cuDevicePrimaryCtxRelease(dev));
  return check::finish("drv_hostfunc");
}
