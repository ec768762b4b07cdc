// ivcuda-bench: each workload natively and through ivcuda in the same run.
//
//   ivcuda-bench --ptx test_kernels.ptx --ivcuda-lib BUILD/lib --socket SOCK --daemon-log LOG
//                [--quick] [--json FILE] [--png FILE] [--native-lib DIR]
//
// The parent runs every workload twice in child processes: once against the
// driver the system provides (or --native-lib), once with ivcuda's
// libcuda.so.1 first on the library path and IVCUDA_SOCKET set. It prints,
// per figure, native, ivcuda and their ratio, and writes the same as JSON
// (nlohmann-json; options through CLI11).
// The children use the Driver API only and link the toolkit's libcuda stub,
// so the binary is the same in both runs. --png draws the JSON with
// bench/plot.py (matplotlib; the python3 that has it, found at configure time).
//
// Page-locked sizes up to 1 GiB need an ivcudad arena of more than that
// (--shm-size 4G); a smaller one drops the sizes that do not fit.
//
// A figure through ivcuda counts only if ivcuda served it: each child checks
// that ivcuda's libcuda.so.1 is (or, natively, is not) the one mapped in it,
// and the parent finds each ivcuda child's hello in ivcudad's log (LOG, where
// the daemon writes it). A child that loaded the machine's driver would give
// ratios of 1 and prove nothing; the run then fails.
#include <cuda.h>
#include <dlfcn.h>
#include <nvml.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "crowd.h"

namespace {

namespace bench = ivcuda::bench;
using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

#define CK(call)                                                             \
  do {                                                                       \
    const CUresult r_ = (call);                                              \
    if (r_ != CUDA_SUCCESS) {                                                \
      const char* n_ = nullptr;                                              \
      cuGetErrorName(r_, &n_);                                               \
      std::fprintf(stderr, "ivcuda-bench: %s -> %s\n", #call, n_ ? n_ : "?"); \
      std::exit(3);                                                          \
    }                                                                        \
  } while (0)

// One figure, printed by a child as "name unit value".
void emit(const std::string& name, const char* unit, double v) { std::printf("%s %s %.6g\n", name.c_str(), unit, v); }

struct Child {
  bool quick = false;
  CUcontext ctx = nullptr;
  CUstream s = nullptr;
  CUfunction spin = nullptr;
  CUfunction fill = nullptr;  // ivc_fill_u32(p, value, n)

  void launch_spin(unsigned long long ns) {
    void* args[] = {&ns};
    CK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr));
  }

  // Idle streams and contexts are answered in ivcuda's guest library when
  // nothing was sent since they were found idle (guest/idle_streams.cc); a
  // completed event's query always crosses, so it is the transport's round
  // trip.
  void null_round_trips() {
    const int n = quick ? 500 : 20000;
    CUevent ev = nullptr;
    CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    CK(cuEventRecord(ev, s));
    CK(cuEventSynchronize(ev));
    std::vector<double> sync, query, event;
    for (int i = 0; i < n; ++i) {
      auto t0 = Clock::now();
      CK(cuCtxSynchronize());
      sync.push_back(us_since(t0));
      t0 = Clock::now();
      CK(cuStreamQuery(s));
      query.push_back(us_since(t0));
      t0 = Clock::now();
      CK(cuEventQuery(ev));
      event.push_back(us_since(t0));
    }
    CK(cuEventDestroy(ev));
    emit("null.ctx_synchronize.median", "us", percentile(sync, 0.5));
    emit("null.ctx_synchronize.p99", "us", percentile(sync, 0.99));
    emit("null.stream_query.median", "us", percentile(query, 0.5));
    emit("null.stream_query.p99", "us", percentile(query, 0.99));
    emit("null.event_query.median", "us", percentile(event, 0.5));
    emit("null.event_query.p99", "us", percentile(event, 0.99));
  }

  void launch_rates() {
    for (unsigned long long ns : {0ull, 10000ull}) {
      const int n = quick ? 200 : (ns == 0 ? 50000 : 5000);
      launch_spin(ns);
      CK(cuStreamSynchronize(s));
      const auto t0 = Clock::now();
      for (int i = 0; i < n; ++i) launch_spin(ns);
      const double submit = us_since(t0);
      CK(cuStreamSynchronize(s));
      const double total = us_since(t0);
      const std::string k = ns == 0 ? "launch.empty" : "launch.10us";
      emit(k + ".rate", "launches/s", n / (total * 1e-6));
      emit(k + ".submit", "us/launch", submit / n);
    }
  }

  // One kernel of a fixed length, launched and waited for: the task time
  // minus the kernel's own length is the per-task cost of the stack.
  void sleep_tasks() {
    const int reps = quick ? 5 : 100;
    for (unsigned long long us : {0ull, 10ull, 100ull, 500ull, 1000ull}) {
      std::vector<double> t;
      for (int i = 0; i < reps; ++i) {
        const auto t0 = Clock::now();
        launch_spin(us * 1000);
        CK(cuStreamSynchronize(s));
        t.push_back(us_since(t0));
      }
      emit("sleep." + std::to_string(us) + "us.task", "us", percentile(t, 0.5));
      emit("sleep." + std::to_string(us) + "us.task_p99", "us", percentile(t, 0.99));
    }
  }

  // Copies of 4 KiB to 1 GiB (powers of four) each way, from pageable and
  // page-locked memory, and device to device. Repetitions shrink with size
  // so that each point moves a few hundred MiB: the full sweep stays well
  // under a minute per mode on the H200.
  void bandwidth() {
    std::vector<std::size_t> sizes;
    if (quick) {
      sizes = {4096, 1 << 20, 16 << 20};
    } else {
      for (std::size_t n = 4096; n <= (std::size_t{1} << 30); n *= 4) sizes.push_back(n);
    }
    const std::size_t max = sizes.back();
    CUdeviceptr d = 0, d2 = 0;
    CK(cuMemAlloc(&d, max));
    CK(cuMemAlloc(&d2, max));
    std::vector<unsigned char> pageable(max, 1);
    // The largest page-locked block the host grants (ivcuda: the arena).
    void* pinned = nullptr;
    std::size_t pinned_max = max;
    while (cuMemAllocHost(&pinned, pinned_max) != CUDA_SUCCESS) {
      pinned = nullptr;
      if ((pinned_max /= 2) < 4096) break;
    }
    if (pinned == nullptr) pinned_max = 0;
    if (pinned_max < max)
      std::fprintf(stderr, "ivcuda-bench: page-locked copies limited to %zu KiB\n", pinned_max >> 10);
    if (pinned != nullptr) std::memset(pinned, 2, pinned_max);
    // A registered shared mapping (a memfd, as a data loader's shared memory
    // is), page-locked with cuMemHostRegister: through ivcuda its worker
    // registers the same pages of the file (docs/design.md).
    const std::size_t shared_max = std::min<std::size_t>(max, 256u << 20);
    void* shared = nullptr;
    const int mfd = ::memfd_create("ivcuda-bench", MFD_CLOEXEC);
    if (mfd >= 0 && ::ftruncate(mfd, static_cast<off_t>(shared_max)) == 0) {
      shared = ::mmap(nullptr, shared_max, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
      if (shared == MAP_FAILED) shared = nullptr;
    }
    if (shared != nullptr) {
      std::memset(shared, 4, shared_max);
      if (cuMemHostRegister(shared, shared_max, 0) != CUDA_SUCCESS) {
        std::fprintf(stderr, "ivcuda-bench: cuMemHostRegister of a memfd mapping failed; no memfd figures\n");
        ::munmap(shared, shared_max);
        shared = nullptr;
      }
    }
    for (std::size_t n : sizes) {
      const int reps = quick ? 3 : static_cast<int>(std::clamp<std::size_t>((256u << 20) / n, 3, 100));
      const std::string sz = std::to_string(n >> 10) + "KiB";
      auto measure = [&](const std::string& name, auto&& copy) {
        std::vector<double> gbs;
        copy();
        for (int i = 0; i < reps; ++i) {
          const auto t0 = Clock::now();
          copy();
          gbs.push_back(static_cast<double>(n) / (us_since(t0) * 1e3));
        }
        emit(name + "." + sz, "GB/s", percentile(gbs, 0.5));
      };
      measure("htod.pageable", [&] { CK(cuMemcpyHtoD(d, pageable.data(), n)); });
      measure("dtoh.pageable", [&] { CK(cuMemcpyDtoH(pageable.data(), d, n)); });
      if (n <= pinned_max) {
        measure("htod.pinned", [&] {
          CK(cuMemcpyHtoDAsync(d, pinned, n, s));
          CK(cuStreamSynchronize(s));
        });
        measure("dtoh.pinned", [&] {
          CK(cuMemcpyDtoHAsync(pinned, d, n, s));
          CK(cuStreamSynchronize(s));
        });
      }
      if (shared != nullptr && n >= (1u << 20) && n <= shared_max) {
        measure("htod.memfd_registered", [&] {
          CK(cuMemcpyHtoDAsync(d, shared, n, s));
          CK(cuStreamSynchronize(s));
        });
        measure("dtoh.memfd_registered", [&] {
          CK(cuMemcpyDtoHAsync(shared, d, n, s));
          CK(cuStreamSynchronize(s));
        });
      }
      if (n >= (1u << 20)) measure("dtod", [&] {
          CK(cuMemcpyDtoDAsync(d2, d, n, s));
          CK(cuStreamSynchronize(s));
        });
    }
    if (pinned != nullptr) CK(cuMemFreeHost(pinned));
    if (shared != nullptr) {
      CK(cuMemHostUnregister(shared));
      ::munmap(shared, shared_max);
    }
    if (mfd >= 0) ::close(mfd);
    CK(cuMemFree(d));
    CK(cuMemFree(d2));
  }

  // A graph of ten empty kernels (made by stream capture), instantiated once
  // and launched over and over: graphs per second, and kernels per second
  // through graphs (compare with launch.empty.rate).
  void graph_rate() {
    constexpr int kKernels = 10;
    const int n = quick ? 100 : 5000;
    CUgraph g = nullptr;
    CK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (int k = 0; k < kKernels; ++k) launch_spin(0);
    CK(cuStreamEndCapture(s, &g));
    CUgraphExec exec = nullptr;
    CK(cuGraphInstantiate(&exec, g, 0));
    CK(cuGraphLaunch(exec, s));
    CK(cuStreamSynchronize(s));
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) CK(cuGraphLaunch(exec, s));
    CK(cuStreamSynchronize(s));
    const double total = us_since(t0);
    emit("graph10.rate", "graphs/s", n / (total * 1e-6));
    emit("graph10.kernel_rate", "launches/s", n * kKernels / (total * 1e-6));
    CK(cuGraphExecDestroy(exec));
    CK(cuGraphDestroy(g));
  }

  // What an eager framework does per small operation: a kernel, then a
  // scalar read back to the host (PyTorch's .item(), a loss printed each
  // step) - one launch and one synchronous 4-byte copy to pageable memory;
  // and a short chain of ten kernels waited for as a whole.
  void small_ops() {
    const int reps = quick ? 50 : 5000;
    CUdeviceptr d = 0;
    CK(cuMemAlloc(&d, 4));
    CK(cuMemsetD32(d, 7, 1));
    std::vector<double> item, chain;
    for (int i = 0; i < reps; ++i) {
      std::uint32_t v = 0;
      auto t0 = Clock::now();
      launch_spin(0);
      CK(cuMemcpyDtoHAsync(&v, d, sizeof v, s));
      CK(cuStreamSynchronize(s));
      item.push_back(us_since(t0));
      if (v != 7) {
        std::fprintf(stderr, "ivcuda-bench: small_ops read %u, wrote 7\n", v);
        std::exit(3);
      }
      t0 = Clock::now();
      for (int k = 0; k < 10; ++k) launch_spin(0);
      CK(cuStreamSynchronize(s));
      chain.push_back(us_since(t0));
    }
    emit("smallop.kernel_then_item.median", "us", percentile(item, 0.5));
    emit("smallop.kernel_then_item.p99", "us", percentile(item, 0.99));
    emit("smallop.chain10_sync.median", "us", percentile(chain, 0.5));
    CK(cuMemFree(d));
  }

  // Frequent queries frameworks make (JAX asks cuMemGetInfo dozens of times
  // at its start, PyTorch's mem_get_info per call): idle, and with a queue
  // of kernels ahead of the query on the stream.
  void queries() {
    const int n = quick ? 50 : 5000;
    std::vector<double> idle, busy;
    std::size_t free_b = 0, total = 0;
    for (int i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      CK(cuMemGetInfo(&free_b, &total));
      idle.push_back(us_since(t0));
    }
    for (int i = 0; i < n / 10; ++i) {
      for (int k = 0; k < 20; ++k) launch_spin(2000);
      const auto t0 = Clock::now();
      CK(cuMemGetInfo(&free_b, &total));
      busy.push_back(us_since(t0));
      CK(cuStreamSynchronize(s));
    }
    emit("query.mem_get_info.median", "us", percentile(idle, 0.5));
    emit("query.mem_get_info_busy.median", "us", percentile(busy, 0.5));
  }

  // Managed memory as tutorials use it (cudaMallocManaged): the CPU writes a
  // 64 MiB array (16 MiB with --quick), a kernel rewrites it, the CPU reads it all - one turn
  // each way (ivcuda: the CPU's writes go back before the launch, its reads
  // fault the device's data in; guest/managed.cc). Also the CPU's first
  // touch of new managed memory, and the same kernel on memory the CPU
  // leaves alone (the launch's cost once nothing is on the CPU's side).
  void managed() {
    const std::size_t n = (quick ? std::size_t{4} : std::size_t{16}) << 20;  // u32 elements
    const int reps = quick ? 2 : 10;
    CUdeviceptr m = 0;
    auto t0 = Clock::now();
    CK(cuMemAllocManaged(&m, n * 4, CU_MEM_ATTACH_GLOBAL));
    emit("managed.alloc", "us", us_since(t0));
    auto* p = reinterpret_cast<std::uint32_t*>(m);
    t0 = Clock::now();
    for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::uint32_t>(i);
    emit("managed.first_touch", "GB/s", static_cast<double>(n * 4) / (us_since(t0) * 1e3));
    auto launch_fill = [&](std::uint32_t v) {
      unsigned long long count = n;
      void* args[] = {&m, &v, &count};
      CK(cuLaunchKernel(fill, 1024, 1, 1, 256, 1, 1, 0, s, args, nullptr));
    };
    std::vector<double> turn, write, read, kernel_only;
    for (int r = 0; r < reps; ++r) {
      const auto t1 = Clock::now();
      for (std::size_t i = 0; i < n; i += 1024) p[i] = static_cast<std::uint32_t>(r);  // a word per 4 KiB
      write.push_back(us_since(t1));
      launch_fill(static_cast<std::uint32_t>(r) + 1);
      CK(cuStreamSynchronize(s));
      std::uint64_t sum = 0;
      const auto t3 = Clock::now();
      for (std::size_t i = 0; i < n; ++i) sum += p[i];
      read.push_back(us_since(t3));
      turn.push_back(us_since(t1));
      if (sum != static_cast<std::uint64_t>(r + 1) * n) {
        std::fprintf(stderr, "ivcuda-bench: managed read back %llu, expected %llu\n",
                     static_cast<unsigned long long>(sum), static_cast<unsigned long long>(r + 1) * n);
        std::exit(3);
      }
    }
    for (int r = 0; r < reps; ++r) {
      const auto t1 = Clock::now();
      launch_fill(7);
      CK(cuStreamSynchronize(s));
      kernel_only.push_back(us_since(t1));
    }
    emit("managed.turn", "us", percentile(turn, 0.5));
    emit("managed.cpu_scattered_writes", "us", percentile(write, 0.5));
    emit("managed.cpu_read_after_kernel", "GB/s", static_cast<double>(n * 4) / (percentile(read, 0.5) * 1e3));
    emit("managed.kernel_untouched", "us", percentile(kernel_only, 0.5));
    CK(cuMemFree(m));
  }

  // Copies to and from memory mapped with the virtual memory API
  // (cuMemCreate + cuMemMap), which XLA and PyTorch's expandable segments
  // allocate from: each must move at the rate of cuMemAlloc memory (the
  // htod/dtoh/dtod figures of bandwidth()).
  void vmm_bandwidth() {
    const std::vector<std::size_t> sizes =
        quick ? std::vector<std::size_t>{1 << 20} : std::vector<std::size_t>{1 << 20, 16 << 20, 256 << 20};
    const std::size_t max = sizes.back();
    CUdevice dev;
    CK(cuCtxGetDevice(&dev));
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    std::size_t gran = 0;
    CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    const std::size_t bytes = (max + gran - 1) / gran * gran;
    CUdeviceptr va = 0, va2 = 0;
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    CK(cuMemAddressReserve(&va, bytes, 0, 0, 0));
    CK(cuMemAddressReserve(&va2, bytes, 0, 0, 0));
    CK(cuMemCreate(&h, bytes, &prop, 0));
    CK(cuMemCreate(&h2, bytes, &prop, 0));
    CK(cuMemMap(va, bytes, 0, h, 0));
    CK(cuMemMap(va2, bytes, 0, h2, 0));
    CUmemAccessDesc acc{};
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemSetAccess(va, bytes, &acc, 1));
    CK(cuMemSetAccess(va2, bytes, &acc, 1));
    void* pinned = nullptr;
    CK(cuMemAllocHost(&pinned, max));
    std::memset(pinned, 5, max);
    for (std::size_t n : sizes) {
      const int reps = quick ? 3 : static_cast<int>(std::clamp<std::size_t>((256u << 20) / n, 3, 100));
      const std::string sz = std::to_string(n >> 10) + "KiB";
      auto measure = [&](const std::string& name, auto&& copy) {
        std::vector<double> gbs;
        copy();
        for (int i = 0; i < reps; ++i) {
          const auto t0 = Clock::now();
          copy();
          gbs.push_back(static_cast<double>(n) / (us_since(t0) * 1e3));
        }
        emit(name + "." + sz, "GB/s", percentile(gbs, 0.5));
      };
      measure("vmm.htod.pinned", [&] {
        CK(cuMemcpyHtoDAsync(va, pinned, n, s));
        CK(cuStreamSynchronize(s));
      });
      measure("vmm.dtoh.pinned", [&] {
        CK(cuMemcpyDtoHAsync(pinned, va, n, s));
        CK(cuStreamSynchronize(s));
      });
      measure("vmm.dtod", [&] {
        CK(cuMemcpyDtoDAsync(va2, va, n, s));
        CK(cuStreamSynchronize(s));
      });
    }
    CK(cuMemFreeHost(pinned));
    CK(cuMemUnmap(va, bytes));
    CK(cuMemUnmap(va2, bytes));
    CK(cuMemRelease(h));
    CK(cuMemRelease(h2));
    CK(cuMemAddressFree(va, bytes));
    CK(cuMemAddressFree(va2, bytes));
  }

  // One of eight processes at once: launches, then copies each way, each
  // phase behind a barrier (the parent lets all eight into it together). A
  // child reports what it moved in its own window of the phase, on
  // CLOCK_MONOTONIC; the parent's aggregate is all of it over the phase's
  // whole extent (bench/crowd.h).
  template <class Gate>
  void crowd(const Gate& gate) {
    const int n = quick ? 200 : 20000;
    const std::size_t bytes = quick ? (4u << 20) : (256u << 20);
    const int reps = 4;
    CUdeviceptr d = 0;
    CK(cuMemAlloc(&d, bytes));
    void* pinned = nullptr;
    CK(cuMemAllocHost(&pinned, bytes));
    std::memset(pinned, 3, bytes);
    std::vector<unsigned char> pageable(bytes, 4);
    int next = 0;
    auto phase = [&](const char* name, const char* unit, double amount, auto&& work) {
      gate.pass(next++);
      bench::Span sp;
      sp.amount = amount;
      sp.start_ns = bench::monotonic_ns();
      work();
      CK(cuStreamSynchronize(s));
      sp.end_ns = bench::monotonic_ns();
      std::printf("%s\n", bench::format_span(name, unit, sp).c_str());
    };
    const double moved = reps * static_cast<double>(bytes);
    phase("crowd.launch.rate", "launches/s", n, [&] {
      for (int i = 0; i < n; ++i) launch_spin(0);
    });
    auto copies = [&](auto&& copy) {
      return [&, copy] {
        for (int i = 0; i < reps; ++i) copy();
      };
    };
    phase("crowd.htod.pinned", "GB/s", moved, copies([&] { CK(cuMemcpyHtoDAsync(d, pinned, bytes, s)); }));
    phase("crowd.dtoh.pinned", "GB/s", moved, copies([&] { CK(cuMemcpyDtoHAsync(pinned, d, bytes, s)); }));
    phase("crowd.htod.pageable", "GB/s", moved, copies([&] { CK(cuMemcpyHtoD(d, pageable.data(), bytes)); }));
    phase("crowd.dtoh.pageable", "GB/s", moved, copies([&] { CK(cuMemcpyDtoH(pageable.data(), d, bytes)); }));
    if (next != bench::kCrowdPhases) {
      std::fprintf(stderr, "ivcuda-bench: the crowd ran %d phases, its barriers are for %d\n", next, bench::kCrowdPhases);
      std::exit(3);
    }
    CK(cuMemFreeHost(pinned));
    CK(cuMemFree(d));
  }
};

// A crowd child's side of the per-phase barriers: at phase k it says so on
// ready[k] and waits until the parent closes go[k] (which it does once every
// child said so). Each fd is closed once used, so that a child that dies
// shows as a short count at the parent instead of a wait forever.
struct PhaseGates {
  std::vector<int> ready, go;
  void pass(int k) const {
    if (k < 0 || static_cast<std::size_t>(k) >= ready.size()) return;  // not in a crowd
    const char c = 'r';
    if (::write(ready[static_cast<std::size_t>(k)], &c, 1) != 1) std::exit(5);
    ::close(ready[static_cast<std::size_t>(k)]);
    char b;
    while (::read(go[static_cast<std::size_t>(k)], &b, 1) > 0) {
    }
    ::close(go[static_cast<std::size_t>(k)]);
  }
  // "--gate R0,G0,R1,G1,...", as CrowdBarrier::arg() writes it.
  static PhaseGates parse(const std::string& arg) {
    PhaseGates g;
    std::size_t pos = 0;
    while (pos < arg.size()) {
      const int r = std::atoi(arg.c_str() + pos);
      const std::size_t comma = arg.find(',', pos);
      if (comma == std::string::npos) return {};
      g.ready.push_back(r);
      g.go.push_back(std::atoi(arg.c_str() + comma + 1));
      const std::size_t next = arg.find(',', comma + 1);
      pos = next == std::string::npos ? arg.size() : next + 1;
    }
    return g;
  }
};

// The parent's side: a ready and a go pipe per phase, made before the
// children are forked.
struct CrowdBarrier {
  struct Phase {
    int ready[2] = {-1, -1};
    int go[2] = {-1, -1};
  };
  std::vector<Phase> phases;
  explicit CrowdBarrier(int n) : phases(static_cast<std::size_t>(n)) {
    for (Phase& p : phases)
      if (::pipe(p.ready) != 0 || ::pipe(p.go) != 0) std::exit(4);
  }
  std::string arg() const {
    std::string a;
    for (const Phase& p : phases)
      a += (a.empty() ? "" : ",") + std::to_string(p.ready[1]) + "," + std::to_string(p.go[0]);
    return a;
  }
  // In a child, before its exec: the parent's ends are not its own.
  void close_parent_ends() const {
    for (const Phase& p : phases) {
      ::close(p.ready[0]);
      ::close(p.go[1]);
    }
  }
  // In the parent once every child is forked.
  void close_child_ends() const {
    for (const Phase& p : phases) {
      ::close(p.ready[1]);
      ::close(p.go[0]);
    }
  }
  // Lets `count` children through each phase once all of them are at it.
  // False when one never arrived (it died): the remaining phases then open
  // at once, so that no child waits forever for it.
  bool run(int count) const {
    bool all = true;
    for (const Phase& p : phases) {
      int arrived = 0;
      char b;
      while (all && arrived < count && ::read(p.ready[0], &b, 1) == 1) ++arrived;
      all = all && arrived == count;
      ::close(p.ready[0]);
      ::close(p.go[1]);
    }
    return all;
  }
};

// The crowd's figures from its children's outputs: for each phase, every
// child's span, and all they moved over the phase's whole extent
// (bench/crowd.h). Exits when a child did not report a phase.
std::map<std::string, std::pair<std::string, double>> crowd_figures(const std::vector<std::string>& texts) {
  std::map<std::string, std::pair<std::string, std::vector<bench::Span>>> spans;
  for (const std::string& text : texts) {
    std::size_t pos = 0;
    while (pos < text.size()) {
      const std::size_t eol = text.find('\n', pos);
      const std::string line = text.substr(pos, eol - pos);
      pos = eol == std::string::npos ? text.size() : eol + 1;
      std::string name, unit;
      bench::Span sp;
      if (!bench::parse_span(line, &name, &unit, &sp)) continue;
      auto& slot = spans[name];
      slot.first = unit;
      slot.second.push_back(sp);
    }
  }
  std::map<std::string, std::pair<std::string, double>> out;
  for (const auto& [name, s] : spans) {
    if (s.second.size() != texts.size()) {
      std::fprintf(stderr, "ivcuda-bench: %zu of %zu crowd children reported %s\n", s.second.size(), texts.size(),
                   name.c_str());
      std::exit(2);
    }
    out[name] = {s.first, bench::aggregate(s.second, s.first)};
  }
  if (out.size() != static_cast<std::size_t>(bench::kCrowdPhases)) {
    std::fprintf(stderr, "ivcuda-bench: the crowd reported %zu phases, not %d\n", out.size(), bench::kCrowdPhases);
    std::exit(2);
  }
  return out;
}

// A program's start as a user sees it: the driver, a context, a buffer, one
// value there and back. It writes one line when the value is back; the
// parent times that line's arrival and the exit from its fork.
int run_startup_child() {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx = nullptr;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CUdeviceptr d = 0;
  CK(cuMemAlloc(&d, 4));
  const std::uint32_t in = 42;
  std::uint32_t out = 0;
  CK(cuMemcpyHtoD(d, &in, sizeof in));
  CK(cuMemcpyDtoH(&out, d, sizeof out));
  std::printf("first-result %u\n", out);
  std::fflush(stdout);
  CK(cuMemFree(d));
  CK(cuDevicePrimaryCtxRelease(dev));
  return out == in ? 0 : 3;
}

// A program that dies with work under way (issue 30): it holds
// kDeathAlloc of device memory and, by `kase`, nothing more (idle), a
// stream of 1 ms kernels posted (queued: the launch queue is full, a thread
// keeps posting), or one long kernel running (kernel). It says "ready" once
// that is so and waits to be SIGKILLed; the parent times the memory's return.
constexpr std::size_t kDeathAlloc = std::size_t{2} << 30;
int run_death_child(const std::string& ptx, const std::string& kase, bool quick) {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx = nullptr;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CUdeviceptr d = 0;
  CK(cuMemAlloc(&d, kDeathAlloc));
  CK(cuMemsetD8(d, 0x5a, kDeathAlloc));
  CK(cuCtxSynchronize());
  CUmodule m;
  CUfunction spin;
  std::ifstream file(ptx, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  CK(cuModuleLoadData(&m, text.c_str()));
  CK(cuModuleGetFunction(&spin, m, "ivc_spin_ns"));
  CUstream s;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  if (kase == "queued") {
    const int launches = quick ? 1000 : 10000;
    std::thread([=] {
      (void)cuCtxSetCurrent(ctx);
      std::uint64_t ns = 1'000'000;
      void* args[] = {&ns};
      for (int i = 0; i < launches; ++i) (void)cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr);
    }).detach();
  } else if (kase == "kernel") {
    std::uint64_t ns = quick ? 200'000'000 : 2'000'000'000;
    void* args[] = {&ns};
    CK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, args, nullptr));
  } else if (kase != "idle") {
    std::fprintf(stderr, "ivcuda-bench: no death case %s\n", kase.c_str());
    return 2;
  }
  // The launches under way; and ivcudad's next warm worker (whose context
  // the parent must not take for this one's) made meanwhile.
  std::this_thread::sleep_for(std::chrono::milliseconds(quick ? 300 : 1500));
  std::printf("ready\n");
  std::fflush(stdout);
  for (;;) ::pause();
}

int run_child(const std::string& ptx, const std::string& what, bool quick, const PhaseGates& gate, int settle_ms) {
  if (what == "startup") return run_startup_child();
  if (what.rfind("death-", 0) == 0) return run_death_child(ptx, what.substr(6), quick);
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  Child c;
  c.quick = quick;
  CK(cuDevicePrimaryCtxRetain(&c.ctx, dev));
  CK(cuCtxSetCurrent(c.ctx));
  CK(cuStreamCreate(&c.s, CU_STREAM_NON_BLOCKING));
  std::string text;
  if (FILE* f = std::fopen(ptx.c_str(), "rb")) {
    char buf[65536];
    std::size_t got;
    while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, got);
    std::fclose(f);
  }
  CUmodule m;
  CK(cuModuleLoadData(&m, text.c_str()));
  CK(cuModuleGetFunction(&c.spin, m, "ivc_spin_ns"));
  CK(cuModuleGetFunction(&c.fill, m, "ivc_fill_u32"));
  // Connected: ivcudad now starts the next warm worker, whose arena
  // registration (seconds for GiBs) would share the machine with the first
  // figures. They are taken once it is done, natively too for the same
  // conditions (the start-up figures cover the start itself).
  ::usleep(static_cast<useconds_t>(settle_ms) * 1000);
  if (what == "crowd") {
    c.crowd(gate);
  } else if (what == "managed") {
    c.managed();
  } else {
    c.null_round_trips();
    c.launch_rates();
    c.sleep_tasks();
    c.graph_rate();
    c.small_ops();
    c.queries();
    c.bandwidth();
    c.vmm_bandwidth();
    c.managed();
  }
  std::fflush(stdout);
  CK(cuModuleUnload(m));
  CK(cuStreamDestroy(c.s));
  CK(cuDevicePrimaryCtxRelease(dev));
  return 0;
}

struct Mode {
  std::string name;
  std::string lib_path;  // LD_LIBRARY_PATH for the child; empty: inherit
  std::string socket;    // IVCUDA_SOCKET, or empty
  std::string daemon_log;  // ivcudad's log, which must show each child's hello; empty: native
  std::string ivcuda_lib;  // where ivcuda's libcuda.so.1 is, which the child must (not) have mapped
};

// --- The proof that ivcuda served a run -------------------------------------
// The children learn which libcuda.so.1 they must (ivcuda) or must not (native)
// have mapped from this variable, "ivcuda:PATH" or "native:PATH", PATH being
// ivcuda's library with its links resolved, as /proc/self/maps names it.
constexpr const char* kLibcudaCheck = "IVCUDA_BENCH_LIBCUDA";

std::string resolved(const std::string& path) {
  char buf[4096];
  return ::realpath(path.c_str(), buf) != nullptr ? std::string(buf) : path;
}

// Sets what the children of `mode` check (before they are forked).
void expect_libcuda(const Mode& mode) {
  const std::string what = mode.daemon_log.empty() ? "native:" : "ivcuda:";
  ::setenv(kLibcudaCheck, (what + resolved(mode.ivcuda_lib + "/libcuda.so.1")).c_str(), 1);
}

// In a child: 0 when ivcuda's libcuda.so.1 is mapped here exactly when it must be.
int check_libcuda() {
  const char* want = std::getenv(kLibcudaCheck);
  if (want == nullptr) return 0;  // a child started by hand (the VM test's --child runs)
  const std::string w = want;
  const bool ivcuda = w.rfind("ivcuda:", 0) == 0;
  const std::string path = w.substr(w.find(':') + 1);
  std::ifstream maps("/proc/self/maps");
  bool mapped = false;
  for (std::string line; std::getline(maps, line);) {
    const auto at = line.find('/');
    if (at != std::string::npos && line.compare(at, std::string::npos, path) == 0) mapped = true;
  }
  if (mapped == ivcuda) return 0;
  std::fprintf(stderr, "ivcuda-bench: this %s child %s %s\n", ivcuda ? "ivcuda" : "native",
               ivcuda ? "has not mapped ivcuda's" : "has mapped ivcuda's", path.c_str());
  return 6;
}

// Where the daemon's log ends now: hellos past it are of children started after.
std::uintmax_t log_mark(const Mode& mode) {
  struct stat st{};
  return !mode.daemon_log.empty() && ::stat(mode.daemon_log.c_str(), &st) == 0 ? static_cast<std::uintmax_t>(st.st_size)
                                                                              : 0;
}

// Whether the log, past `mark`, has the worker's line for a served hello of `pid`
// ("... info: guest G: process PID says hello (parent Q)", host-daemon/worker/contexts.cc).
bool served(const Mode& mode, std::uintmax_t mark, pid_t pid) {
  if (mode.daemon_log.empty()) return true;
  std::ifstream log(mode.daemon_log);
  log.seekg(static_cast<std::streamoff>(mark));
  const std::string said = ": process " + std::to_string(pid) + " says hello (parent ";
  for (std::string line; std::getline(log, line);) {
    const auto at = line.find(said);
    if (at != std::string::npos && line.find(" info: guest ") != std::string::npos && line.back() == ')') return true;
  }
  std::fprintf(stderr, "ivcuda-bench: ivcudad's log %s shows no hello from the %s child %d: not served by ivcuda\n",
               mode.daemon_log.c_str(), mode.name.c_str(), static_cast<int>(pid));
  return false;
}

// Forks this program as a child of `mode` (argv[0] is `self`), its stdout
// on the pipe whose read end comes back in *out.
pid_t spawn_child(const char* self, const Mode& mode, std::vector<const char*> argv, int* out) {
  int fds[2];
  if (::pipe(fds) != 0) std::exit(4);
  argv.insert(argv.begin(), self);
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    ::close(fds[1]);
    if (!mode.lib_path.empty()) ::setenv("LD_LIBRARY_PATH", mode.lib_path.c_str(), 1);
    if (!mode.socket.empty()) ::setenv("IVCUDA_SOCKET", mode.socket.c_str(), 1);
    ::execv(self, const_cast<char* const*>(argv.data()));
    ::_exit(127);
  }
  ::close(fds[1]);
  *out = fds[0];
  return pid;
}

// Start-up (run_startup_child), `runs` times, `gap_ms` apart so that
// ivcudad's pool of warm workers refills between starts as it would between
// a user's runs: medians of the time from fork to the first result and to
// the exit, in ms.
std::map<std::string, std::pair<std::string, double>> run_startups(const char* self, const Mode& mode, int runs,
                                                                   int gap_ms) {
  std::vector<double> first, exit_ms;
  for (int r = 0; r < runs; ++r) {
    ::usleep(static_cast<useconds_t>(gap_ms) * 1000);
    const std::uintmax_t mark = log_mark(mode);
    expect_libcuda(mode);
    int fd = -1;
    const auto t0 = Clock::now();
    const pid_t pid = spawn_child(self, mode, {"--child", "startup"}, &fd);
    std::string text;
    char buf[256];
    ssize_t n;
    double t_first = -1;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) {
      text.append(buf, static_cast<std::size_t>(n));
      if (t_first < 0 && text.find('\n') != std::string::npos) t_first = us_since(t0) / 1e3;
    }
    ::close(fd);
    int status = 0;
    ::waitpid(pid, &status, 0);
    const double t_exit = us_since(t0) / 1e3;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || text.rfind("first-result 42", 0) != 0) {
      std::fprintf(stderr, "ivcuda-bench: the %s start-up run failed (status %d)\n", mode.name.c_str(), status);
      std::exit(2);
    }
    if (!served(mode, mark, pid)) std::exit(2);
    first.push_back(t_first);
    exit_ms.push_back(t_exit);
  }
  return {{"startup.first_result", {"ms", percentile(first, 0.5)}},
          {"startup.first_result_max", {"ms", percentile(first, 1.0)}},
          {"startup.exit", {"ms", percentile(exit_ms, 0.5)}}};
}

// --- Start-up patterns (issue 30) -----------------------------------------
// One start-up child under way: forked at t0, its first line on fd.
struct Start {
  pid_t pid = -1;
  int fd = -1;
  Clock::time_point t0;
  double first_ms = -1;
  std::string text;
};

Start fork_startup(const char* self, const Mode& mode) {
  Start st;
  st.t0 = Clock::now();
  st.pid = spawn_child(self, mode, {"--child", "startup"}, &st.fd);
  return st;
}

// Reads every child's output until it ends (poll: each first line is timed
// when it comes, whichever child it is), then reaps them. A start that
// failed (ivcudad refused it: --max-guests-per-uid) counts in *failed and
// has no time; one that ran unserved ends the bench. `forking` forks the
// next ones meanwhile (a spread), returning false once it has none left.
template <class Fork>
std::vector<double> collect_starts(const Mode& mode, std::uintmax_t mark, std::vector<Start>& kids, Fork&& forking,
                                   int* failed) {
  bool more = true;
  for (;;) {
    if (more) more = forking(kids);
    std::vector<pollfd> p;
    std::vector<std::size_t> who;
    for (std::size_t i = 0; i < kids.size(); ++i)
      if (kids[i].fd >= 0) {
        p.push_back({kids[i].fd, POLLIN, 0});
        who.push_back(i);
      }
    if (p.empty() && !more) break;
    if (::poll(p.data(), p.size(), more ? 1 : 1000) < 0 && errno != EINTR) std::exit(4);
    for (std::size_t j = 0; j < p.size(); ++j) {
      if (p[j].revents == 0) continue;
      Start& k = kids[who[j]];
      char buf[256];
      const ssize_t n = ::read(k.fd, buf, sizeof buf);
      if (n > 0) {
        k.text.append(buf, static_cast<std::size_t>(n));
        if (k.first_ms < 0 && k.text.find('\n') != std::string::npos) k.first_ms = us_since(k.t0) / 1e3;
      } else {
        ::close(k.fd);
        k.fd = -1;
      }
    }
  }
  std::vector<double> first;
  for (Start& k : kids) {
    int status = 0;
    ::waitpid(k.pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || k.text.rfind("first-result 42", 0) != 0) {
      std::fprintf(stderr, "ivcuda-bench: a %s start-up run failed (status %d)\n", mode.name.c_str(), status);
      ++*failed;
      continue;
    }
    if (!served(mode, mark, k.pid)) std::exit(2);
    first.push_back(k.first_ms);
  }
  return first;
}

void add_spread(std::map<std::string, std::pair<std::string, double>>& out, const std::string& name,
                const std::vector<double>& ms, int failed) {
  out[name + ".first_result"] = {"ms", percentile(ms, 0.5)};
  out[name + ".first_result_p90"] = {"ms", percentile(ms, 0.9)};
  out[name + ".first_result_max"] = {"ms", percentile(ms, 1.0)};
  out[name + ".failed"] = {"starts", failed};
}

// The arrival patterns of a test suite, a job array and a shell loop:
// back-to-back (each start when the last one ended), a burst (all at once)
// and a spread (evenly over a few seconds). Time from fork to the first
// result, per start: median, 90th percentile and maximum.
std::map<std::string, std::pair<std::string, double>> run_start_patterns(const char* self, const Mode& mode,
                                                                         bool quick) {
  std::map<std::string, std::pair<std::string, double>> out;
  expect_libcuda(mode);
  const int b2b = quick ? 5 : 20, burst = quick ? 4 : 8, spread = quick ? 8 : 64;
  const double spread_s = quick ? 1.0 : 10.0;
  const auto none = [](std::vector<Start>&) { return false; };
  std::vector<double> ms;
  int failed = 0;
  // Idle before each pattern. Through ivcuda before a burst and a spread
  // long enough for ivcudad's pool to be back to --warm-workers (what
  // arrivals added goes after 30 s without one): each pattern is measured
  // as it finds a daemon that has been idle, not one the last pattern grew.
  const bool ivcuda = !mode.daemon_log.empty();
  const useconds_t gap = quick ? 300'000 : 3'000'000;
  const useconds_t idle = quick || !ivcuda ? gap : 32'000'000;
  ::usleep(gap);
  for (int r = 0; r < b2b; ++r) {
    const std::uintmax_t mark = log_mark(mode);
    std::vector<Start> one{fork_startup(self, mode)};
    for (const double t : collect_starts(mode, mark, one, none, &failed)) ms.push_back(t);
  }
  add_spread(out, "startup.b2b" + std::to_string(b2b), ms, failed);
  ::usleep(idle);
  {
    const std::uintmax_t mark = log_mark(mode);
    std::vector<Start> kids;
    failed = 0;
    for (int k = 0; k < burst; ++k) kids.push_back(fork_startup(self, mode));
    ms = collect_starts(mode, mark, kids, none, &failed);
    add_spread(out, "startup.burst" + std::to_string(burst), ms, failed);
  }
  ::usleep(idle);
  {
    const std::uintmax_t mark = log_mark(mode);
    std::vector<Start> kids;
    failed = 0;
    const auto t0 = Clock::now();
    int forked = 0;
    const auto forking = [&](std::vector<Start>& k) {
      while (forked < spread && us_since(t0) >= spread_s * 1e6 * forked / spread) {
        k.push_back(fork_startup(self, mode));
        ++forked;
      }
      return forked < spread;
    };
    ms = collect_starts(mode, mark, kids, forking, &failed);
    add_spread(out, "startup.spread" + std::to_string(spread), ms, failed);
  }
  return out;
}

// --- Death with work under way (issue 30) ------------------------------------
// Device memory in use on GPU 0, read through NVML (the host's; in CI the
// NVML test double over the GPU double's ledger), from this process, which is
// no CUDA program.
class DeviceMemory {
 public:
  explicit DeviceMemory(const std::string& lib) {
    h_ = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h_ == nullptr) return;
    auto init = reinterpret_cast<nvmlReturn_t (*)()>(::dlsym(h_, "nvmlInit_v2"));
    auto get = reinterpret_cast<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>(::dlsym(h_, "nvmlDeviceGetHandleByIndex_v2"));
    info_ = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*)>(::dlsym(h_, "nvmlDeviceGetMemoryInfo"));
    ok_ = init != nullptr && get != nullptr && info_ != nullptr && init() == NVML_SUCCESS && get(0, &dev_) == NVML_SUCCESS;
  }
  bool ok() const { return ok_; }
  // Bytes in use; exits the bench when NVML fails.
  std::uint64_t used() const {
    nvmlMemory_t m{};
    if (info_(dev_, &m) != NVML_SUCCESS) {
      std::fprintf(stderr, "ivcuda-bench: nvmlDeviceGetMemoryInfo failed\n");
      std::exit(4);
    }
    return m.used;
  }

 private:
  void* h_ = nullptr;
  nvmlDevice_t dev_{};
  nvmlReturn_t (*info_)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  bool ok_ = false;
};

// For each case of run_death_child, `runs` times: the time from SIGKILL to
// the child's memory back (in use at most what it was when the child was
// ready, less its allocation), in ms; 10 s when it does not come back.
std::map<std::string, std::pair<std::string, double>> run_deaths(const char* self, const Mode& mode,
                                                                 const std::string& ptx, const DeviceMemory& mem,
                                                                 bool quick) {
  std::map<std::string, std::pair<std::string, double>> out;
  expect_libcuda(mode);
  const int runs = quick ? 1 : 2;
  for (const char* kase : {"idle", "queued", "kernel"}) {
    std::vector<double> ms;
    for (int r = 0; r < runs; ++r) {
      const std::uintmax_t mark = log_mark(mode);
      const std::string what = std::string("death-") + kase;
      std::vector<const char*> args = {"--child", what.c_str(), "--ptx", ptx.c_str()};
      if (quick) args.push_back("--quick");
      int fd = -1;
      const pid_t pid = spawn_child(self, mode, args, &fd);
      std::string text;
      char buf[256];
      ssize_t n;
      while (text.find('\n') == std::string::npos && (n = ::read(fd, buf, sizeof buf)) > 0)
        text.append(buf, static_cast<std::size_t>(n));
      if (text.rfind("ready", 0) != 0) {
        int status = 0;
        ::waitpid(pid, &status, 0);
        std::fprintf(stderr, "ivcuda-bench: the %s %s child did not get ready (status %d)\n", mode.name.c_str(), kase,
                     status);
        std::exit(2);
      }
      if (!served(mode, mark, pid)) std::exit(2);
      const std::uint64_t held = mem.used();
      const std::uint64_t back = held - std::min<std::uint64_t>(held, kDeathAlloc);
      const auto t0 = Clock::now();
      ::kill(pid, SIGKILL);
      double t = 10'000;
      while (us_since(t0) < 10e6) {
        if (mem.used() <= back) {
          t = us_since(t0) / 1e3;
          break;
        }
        ::usleep(200);
      }
      ::waitpid(pid, nullptr, 0);
      ::close(fd);
      ms.push_back(t);
      ::usleep(quick ? 200'000 : 1'000'000);  // the daemon's refill, between runs
    }
    out[std::string("death.") + kase + ".memory_back"] = {"ms", percentile(ms, 0.5)};
    out[std::string("death.") + kase + ".memory_back_max"] = {"ms", percentile(ms, 1.0)};
  }
  return out;
}

// Runs `count` children at once in `mode`; returns their figures (a crowd's:
// crowd_figures).
std::map<std::string, std::pair<std::string, double>> run_children(const char* self, const Mode& mode,
                                                                   const std::string& ptx, const char* what,
                                                                   int count, bool quick, int settle_ms) {
  std::vector<std::pair<pid_t, int>> kids;
  const std::uintmax_t mark = log_mark(mode);
  expect_libcuda(mode);
  const bool crowd = std::string(what) == "crowd";
  const CrowdBarrier barrier(crowd ? bench::kCrowdPhases : 0);
  const std::string gate = barrier.arg();
  for (int k = 0; k < count; ++k) {
    int fds[2];
    if (::pipe(fds) != 0) std::exit(4);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::dup2(fds[1], 1);
      ::close(fds[0]);
      ::close(fds[1]);
      barrier.close_parent_ends();
      if (!mode.lib_path.empty()) ::setenv("LD_LIBRARY_PATH", mode.lib_path.c_str(), 1);
      if (!mode.socket.empty()) ::setenv("IVCUDA_SOCKET", mode.socket.c_str(), 1);
      const std::string settle = std::to_string(settle_ms);
      std::vector<const char*> argv = {self, "--child", what, "--ptx", ptx.c_str(), "--settle-ms", settle.c_str()};
      if (crowd) argv.insert(argv.end(), {"--gate", gate.c_str()});
      if (quick) argv.push_back("--quick");
      argv.push_back(nullptr);
      ::execv(self, const_cast<char* const*>(argv.data()));
      ::_exit(127);
    }
    ::close(fds[1]);
    kids.push_back({pid, fds[0]});
  }
  barrier.close_child_ends();
  // A child that dies early shows as a short count here and as a failed run below.
  if (crowd && !barrier.run(count)) std::fprintf(stderr, "ivcuda-bench: a %s crowd child did not reach a phase\n", mode.name.c_str());
  std::map<std::string, std::pair<std::string, double>> out;
  std::vector<std::string> texts;
  for (auto& [pid, fd] : kids) {
    std::string text;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
    ::close(fd);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "ivcuda-bench: the %s run failed (status %d)\n", mode.name.c_str(), status);
      std::exit(2);
    }
    if (!served(mode, mark, pid)) std::exit(2);
    std::size_t pos = 0;
    while (pos < text.size()) {
      const std::size_t eol = text.find('\n', pos);
      const std::string line = text.substr(pos, eol - pos);
      pos = eol == std::string::npos ? text.size() : eol + 1;
      char name[256], unit[64];
      double v;
      if (std::sscanf(line.c_str(), "%255s %63s %lf", name, unit, &v) == 3) {
        auto& slot = out[name];
        slot.first = unit;
        slot.second += v;
      }
    }
    texts.push_back(std::move(text));
  }
  if (crowd)
    for (auto& [k, v] : crowd_figures(texts)) out[k] = v;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string ptx, lib, sock, json, png, native_lib, child, gate, daemon_log, nvml_lib = "libnvidia-ml.so.1";
  bool quick = false;
  int startup_runs = 0, startup_gap_ms = 3000;
  std::vector<std::string> only;
  int settle_ms = -1;
  CLI::App app{"ivcuda-bench: each workload natively and through ivcuda in the same run"};
  app.add_option("--ptx", ptx, "the test kernels' PTX (build/tests/gpu_double/test_kernels.ptx)");
  app.add_option("--ivcuda-lib", lib, "directory holding ivcuda's libcuda.so.1");
  app.add_option("--socket", sock, "ivcudad's socket");
  app.add_option("--daemon-log", daemon_log, "ivcudad's log, which must show each ivcuda child's hello");
  app.add_flag("--quick", quick, "fewer sizes and repetitions (a smoke run)");
  app.add_option("--json", json, "also write the figures as JSON here");
  app.add_option("--png", png, "also draw the JSON as a PNG here (bench/plot.py)");
  app.add_option("--native-lib", native_lib, "directory of the native libcuda.so.1 (default: the system's)");
  app.add_option("--only", only,
                 "run only these parts: solo (one process's figures), startup (after idle), starts (back-to-back, "
                 "burst, spread), crowd (8 processes), death (SIGKILL with work under way to memory back; only "
                 "when named), managed (solo's managed-memory figures alone; only when named)")
      ->delimiter(',')
      ->check(CLI::IsMember({"solo", "startup", "starts", "crowd", "death", "managed"}));
  app.add_option("--nvml-lib", nvml_lib, "the NVML the death part reads device memory with")->capture_default_str();
  app.add_option("--settle-ms", settle_ms,
                 "pause after connecting, before measuring (default 4000, --quick 0): ivcudad's next warm "
                 "worker starts meanwhile");
  app.add_option("--startup-runs", startup_runs, "program starts timed per mode (default: 7, --quick: 3)");
  app.add_option("--startup-gap-ms", startup_gap_ms,
                 "pause before each start, so that ivcudad's warm workers refill as between a user's runs")
      ->capture_default_str();
  // The parent starts itself as each workload's child with these.
  app.add_option("--child", child)->group("");
  app.add_option("--gate", gate)->group("");
  CLI11_PARSE(app, argc, argv);
  if (startup_runs == 0) startup_runs = quick ? 3 : 7;
  if (settle_ms < 0) settle_ms = quick ? 0 : 4000;
  if (!child.empty()) {
    if (const int rc = check_libcuda(); rc != 0) return rc;
    return run_child(ptx, child, quick, PhaseGates::parse(gate), settle_ms);
  }
  if (!png.empty() && json.empty()) {
    std::fprintf(stderr, "ivcuda-bench: --png draws the JSON: give --json too\n");
    return 2;
  }
  const auto named = [&](const char* p) { return std::find(only.begin(), only.end(), p) != only.end(); };
  const bool kernels = only.empty() || named("solo") || named("crowd") || named("death") || named("managed");
  if ((kernels && ptx.empty()) || lib.empty() || sock.empty() || daemon_log.empty()) {
    std::fprintf(stderr,
                 "ivcuda-bench: --ivcuda-lib, --socket, --daemon-log and (but for --only startup,starts) --ptx are "
                 "required\n");
    return 2;
  }
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return 2;
  self[n] = '\0';
  const Mode native{"native", native_lib, "", "", lib};
  const Mode ivc{"ivcuda", lib, sock, daemon_log, lib};
  const int crowd = 8;
  const auto part = [&](const char* p) { return only.empty() || std::find(only.begin(), only.end(), p) != only.end(); };
  std::map<std::string, std::pair<std::string, double>> nat, ivr;
  if (part("solo")) {
    nat = run_children(self, native, ptx, "solo", 1, quick, settle_ms);
    ivr = run_children(self, ivc, ptx, "solo", 1, quick, settle_ms);
  }
  if (!only.empty() && part("managed")) {
    for (auto& [k, v] : run_children(self, native, ptx, "managed", 1, quick, settle_ms)) nat[k] = v;
    for (auto& [k, v] : run_children(self, ivc, ptx, "managed", 1, quick, settle_ms)) ivr[k] = v;
  }
  if (part("startup")) {
    for (auto& [k, v] : run_startups(self, native, startup_runs, startup_gap_ms)) nat[k] = v;
    for (auto& [k, v] : run_startups(self, ivc, startup_runs, startup_gap_ms)) ivr[k] = v;
  }
  if (part("starts")) {
    for (auto& [k, v] : run_start_patterns(self, native, quick)) nat[k] = v;
    for (auto& [k, v] : run_start_patterns(self, ivc, quick)) ivr[k] = v;
  }
  if (named("death")) {
    const DeviceMemory mem(nvml_lib);
    if (!mem.ok()) {
      std::fprintf(stderr, "ivcuda-bench: the death part reads device memory through NVML: cannot use %s\n",
                   nvml_lib.c_str());
      return 2;
    }
    for (auto& [k, v] : run_deaths(self, native, ptx, mem, quick)) nat[k] = v;
    for (auto& [k, v] : run_deaths(self, ivc, ptx, mem, quick)) ivr[k] = v;
  }
  if (part("crowd")) {
    for (auto& [k, v] : run_children(self, native, ptx, "crowd", crowd, quick, settle_ms)) nat["8procs." + k] = v;
    for (auto& [k, v] : run_children(self, ivc, ptx, "crowd", crowd, quick, settle_ms)) ivr["8procs." + k] = v;
  }

  std::printf("%-34s %-11s %14s %14s %9s\n", "figure", "unit", "native", "ivcuda", "ratio");
  for (const auto& [k, v] : nat) {
    const auto it = ivr.find(k);
    if (it == ivr.end()) continue;
    const double ratio = v.second != 0 ? it->second.second / v.second : 0;
    std::printf("%-34s %-11s %14.4g %14.4g %9.3f\n", k.c_str(), v.first.c_str(), v.second, it->second.second, ratio);
  }
  // Derived figures: what a task costs through ivcuda on top of native.
  std::vector<std::pair<std::string, double>> derived;
  std::printf("\nsleep-kernel overhead per task (ivcuda - native, median):\n");
  for (const char* d : {"0", "10", "100", "500", "1000"}) {
    const std::string k = std::string("sleep.") + d + "us.task";
    if (nat.count(k) == 0 || ivr.count(k) == 0) continue;
    const double o = ivr[k].second - nat[k].second;
    std::printf("  %5s us kernel: %+.2f us\n", d, o);
    derived.push_back({std::string("sleep.") + d + "us.overhead", o});
  }
  if (!json.empty()) {
    nlohmann::json doc{{"quick", quick}, {"figures", nlohmann::json::array()}, {"derived", nlohmann::json::array()}};
    for (const auto& [k, v] : nat) {
      const auto it = ivr.find(k);
      if (it == ivr.end()) continue;
      doc["figures"].push_back({{"name", k}, {"unit", v.first}, {"native", v.second}, {"ivcuda", it->second.second}});
    }
    for (const auto& [k, v] : derived) doc["derived"].push_back({{"name", k}, {"unit", "us"}, {"value", v}});
    std::ofstream f(json);
    f << doc.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "ivcuda-bench: cannot write %s: %s\n", json.c_str(), std::strerror(errno));
      return 1;
    }
  }
  if (!png.empty()) {
    // IVCUDA_BENCH_PLOT overrides where the script lives (a moved tree).
    const char* script = std::getenv("IVCUDA_BENCH_PLOT");
    const std::string cmd = std::string(IVCUDA_BENCH_PYTHON) + " '" + (script != nullptr ? script : IVCUDA_BENCH_PLOT) + "' '" +
                            json + "' '" + png + "'";
    if (std::system(cmd.c_str()) != 0) {
      std::fprintf(stderr, "ivcuda-bench: plotting failed: %s\n", cmd.c_str());
      return 1;
    }
  }
  return 0;
}
