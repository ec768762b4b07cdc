// Whether, and how fast, the driver's process checkpointing moves a running
// CUDA process's device memory out to its host memory and back (issue 34's
// first question: can ivcudad suspend a guest's worker this way?). The parent
// starts the target - this program again with --child, natively or through
// ivcuda - which fills --mib MiB of device memory with a pattern and keeps
// making small calls from a thread. The parent then locks, checkpoints,
// holds (allocating and freeing the same amount itself meanwhile, as another
// tenant would), restores and unlocks the target with cuCheckpointProcess*,
// reading the GPU's used memory through NVML at each step, and has the
// target check its pattern at the same device address. Through ivcuda the
// process the driver knows is the guest's worker: --daemon-log names
// ivcudad's log, where the worker serving the child is found.
// Prints "figure NAME VALUE" lines; exits 0 when every step succeeded and the
// target found its memory intact.
// --quiet: the target makes no calls while it is locked (its calling thread
// does not run). --flood N: N more threads of the target call back to back,
// without a pause (a guest that floods its worker while suspended). --self: the target checkpoints itself (a thread of its own calls the
// functions on its own pid) and the parent only watches.
//   drv_checkpoint [--mib N] [--hold-ms N] [--self] [--quiet] [--child-lib DIR --daemon-log FILE]
//   drv_checkpoint --child [--mib N] [--quiet] [--flood N]   (the target alone, told "check" on stdin)
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "check.h"

namespace {

using clk = std::chrono::steady_clock;
double ms_since(clk::time_point t0) { return std::chrono::duration<double, std::milli>(clk::now() - t0).count(); }

constexpr unsigned kPattern = 0x5eed0000u;

std::string read_line(FILE* f) {
  char buf[512];
  if (std::fgets(buf, sizeof buf, f) == nullptr) return {};
  std::string s(buf);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

const char* state_name(CUprocessState s) {
  switch (s) {
    case CU_PROCESS_STATE_RUNNING: return "running";
    case CU_PROCESS_STATE_LOCKED: return "locked";
    case CU_PROCESS_STATE_CHECKPOINTED: return "checkpointed";
    case CU_PROCESS_STATE_FAILED: return "failed";
  }
  return "?";
}

// --- The target -------------------------------------------------------------

int child_main(size_t mib, bool quiet, int flood) {
  CUcontext ctx = nullptr;
  CUdeviceptr p = 0;
  CUresult st = cuInit(0);
  CUdevice dev = 0;
  if (st == CUDA_SUCCESS) st = cuDeviceGet(&dev, 0);
  if (st == CUDA_SUCCESS) st = cuDevicePrimaryCtxRetain(&ctx, dev);
  if (st == CUDA_SUCCESS) st = cuCtxSetCurrent(ctx);
  if (st == CUDA_SUCCESS) st = cuMemAlloc(&p, mib << 20);
  if (st == CUDA_SUCCESS) st = cuMemsetD32(p, kPattern, (mib << 20) / 4);
  if (st == CUDA_SUCCESS) st = cuCtxSynchronize();
  if (st != CUDA_SUCCESS) {
    std::printf("failed %s\n", check::name(st));
    return 1;
  }
  // Small calls all along, as a running program makes: while the process is
  // locked they should wait, not fail.
  std::atomic<bool> stop{false};
  std::atomic<double> longest{0};
  std::atomic<int> failures{0};
  std::thread caller([&] {
    (void)cuCtxSetCurrent(ctx);
    while (!quiet && !stop.load()) {
      const auto t0 = clk::now();
      size_t free_b = 0, total_b = 0;
      if (cuMemGetInfo(&free_b, &total_b) != CUDA_SUCCESS || cuCtxSynchronize() != CUDA_SUCCESS) ++failures;
      const double ms = ms_since(t0);
      if (ms > longest.load()) longest.store(ms);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  std::atomic<long long> flood_calls{0};
  std::vector<std::thread> flooders;
  for (int i = 0; i < flood; ++i)
    flooders.emplace_back([&] {
      (void)cuCtxSetCurrent(ctx);
      while (!stop.load()) {
        size_t free_b = 0, total_b = 0;
        if (cuMemGetInfo(&free_b, &total_b) != CUDA_SUCCESS || cuCtxSynchronize() != CUDA_SUCCESS) ++failures;
        ++flood_calls;
      }
    });
  std::printf("ready %d 0x%llx\n", static_cast<int>(::getpid()), static_cast<unsigned long long>(p));
  std::fflush(stdout);
  std::string cmd = read_line(stdin);  // "check" once restored, or "self"
  if (cmd == "self") {
    // The process checkpoints itself from this thread while the caller
    // thread goes on calling: "checkpointed ..." once its memory is out,
    // then "restored ..." when the parent says "restore".
    const int self = static_cast<int>(::getpid());
    std::string said;
    const auto step = [&](const char* name, CUresult r, clk::time_point t0) {
      CUprocessState s{};
      const CUresult gs = cuCheckpointProcessGetState(self, &s);
      char buf[160];
      std::snprintf(buf, sizeof buf, " %s_ms %.1f %s %s", name, ms_since(t0), check::name(r),
                    gs == CUDA_SUCCESS ? state_name(s) : check::name(gs));
      said += buf;
      return r == CUDA_SUCCESS;
    };
    CUcheckpointLockArgs lock_args{};
    lock_args.timeoutMs = 10000;
    auto t0 = clk::now();
    bool fine = step("lock", cuCheckpointProcessLock(self, &lock_args), t0);
    t0 = clk::now();
    fine = fine && step("checkpoint", cuCheckpointProcessCheckpoint(self, nullptr), t0);
    std::printf("checkpointed%s\n", said.c_str());
    std::fflush(stdout);
    said.clear();
    cmd = read_line(stdin);
    t0 = clk::now();
    if (fine) fine = step("restore", cuCheckpointProcessRestore(self, nullptr), t0);
    t0 = clk::now();
    CUprocessState s{};
    if (cuCheckpointProcessGetState(self, &s) == CUDA_SUCCESS && s == CU_PROCESS_STATE_LOCKED)
      (void)step("unlock", cuCheckpointProcessUnlock(self, nullptr), t0);
    std::printf("restored%s\n", said.c_str());
    std::fflush(stdout);
    cmd = read_line(stdin);
  }
  stop.store(true);
  caller.join();
  for (auto& t : flooders) t.join();
  // The pattern at the start, the middle and the end, at the same address.
  bool intact = cmd == "check";
  const size_t words = (mib << 20) / 4;
  for (size_t at : {size_t{0}, words / 2, words - 1024}) {
    std::vector<unsigned> got(1024);
    if (cuMemcpyDtoH(got.data(), p + at * 4, got.size() * 4) != CUDA_SUCCESS) intact = false;
    for (unsigned w : got) intact = intact && w == kPattern;
  }
  CUdeviceptr q = 0;
  const bool more = cuMemAlloc(&q, 1 << 20) == CUDA_SUCCESS && cuMemFree(q) == CUDA_SUCCESS;
  std::printf("checked intact=%d alloc=%d longest_call_ms=%.1f failed_calls=%d flood_calls=%lld\n", intact ? 1 : 0,
              more ? 1 : 0, longest.load(), failures.load(), flood_calls.load());
  std::fflush(stdout);
  return intact && more && failures.load() == 0 ? 0 : 1;
}

// --- The parent -------------------------------------------------------------

// The GPU's used memory in MiB, through the host's NVML (-1 without it).
struct Nvml {
  void* h = nullptr;
  int (*get_handle)(unsigned, void**) = nullptr;
  int (*mem_info)(void*, unsigned long long[3]) = nullptr;
  void* dev = nullptr;
  Nvml() {
    h = ::dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (h == nullptr) return;
    auto* init = reinterpret_cast<int (*)()>(::dlsym(h, "nvmlInit_v2"));
    get_handle = reinterpret_cast<int (*)(unsigned, void**)>(::dlsym(h, "nvmlDeviceGetHandleByIndex_v2"));
    mem_info = reinterpret_cast<int (*)(void*, unsigned long long[3])>(::dlsym(h, "nvmlDeviceGetMemoryInfo"));
    if (init == nullptr || get_handle == nullptr || mem_info == nullptr || init() != 0 || get_handle(0, &dev) != 0)
      dev = nullptr;
  }
  long long used_mib() const {
    unsigned long long m[3] = {0, 0, 0};  // total, free, used
    if (dev == nullptr || mem_info(dev, m) != 0) return -1;
    return static_cast<long long>(m[2] >> 20);
  }
};

// The worker serving guest process `pid`, from ivcudad's log: "guest G:
// process PID says hello" and "guest G: worker pid W".
int worker_of(const char* log, int pid) {
  for (int tries = 0; tries < 50; ++tries) {
    std::ifstream in(log);
    std::string line, guest;
    const std::string hello = "process " + std::to_string(pid) + " says hello";
    std::vector<std::string> lines;
    while (std::getline(in, line)) lines.push_back(line);
    for (const auto& l : lines) {
      const auto at = l.find(hello);
      const auto g = l.find("guest ");
      if (at != std::string::npos && g != std::string::npos) guest = l.substr(g, l.find(':', g) - g);
    }
    if (!guest.empty()) {
      const std::string key = guest + ": worker pid ";
      int worker = -1;  // the last one started for that guest number
      for (const auto& l : lines)
        if (const auto at = l.find(key); at != std::string::npos) worker = std::atoi(l.c_str() + at + key.size());
      if (worker > 0) return worker;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  const char* m = check::arg(argc, argv, "--mib");
  const size_t mib = m != nullptr ? std::strtoull(m, nullptr, 10) : 1024;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--child") == 0) {
      const char* f = check::arg(argc, argv, "--flood");
      return child_main(mib, check::flag(argc, argv, "--quiet"), f != nullptr ? std::atoi(f) : 0);
    }
  const char* h = check::arg(argc, argv, "--hold-ms");
  const int hold_ms = h != nullptr ? std::atoi(h) : 2000;
  const char* child_lib = check::arg(argc, argv, "--child-lib");
  const char* daemon_log = check::arg(argc, argv, "--daemon-log");
  const bool self = check::flag(argc, argv, "--self");    // the target checkpoints itself; this process watches
  const bool quiet = check::flag(argc, argv, "--quiet");  // the target makes no calls of its own while locked

  // The target, started before this process starts the driver.
  int to_child[2], from_child[2];
  if (::pipe(to_child) != 0 || ::pipe(from_child) != 0) return 2;
  const pid_t child = ::fork();
  if (child == 0) {
    ::dup2(to_child[0], 0);
    ::dup2(from_child[1], 1);
    ::close(to_child[1]);
    ::close(from_child[0]);
    if (child_lib != nullptr) ::setenv("LD_LIBRARY_PATH", child_lib, 1);
    const std::string mib_s = std::to_string(mib);
    ::execl("/proc/self/exe", argv[0], "--child", "--mib", mib_s.c_str(), quiet ? "--quiet" : nullptr,
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  FILE* in = ::fdopen(from_child[0], "r");
  FILE* out = ::fdopen(to_child[1], "w");
  const std::string ready = read_line(in);
  int child_pid = 0;
  unsigned long long addr = 0;
  if (std::sscanf(ready.c_str(), "ready %d 0x%llx", &child_pid, &addr) != 2) {
    std::fprintf(stderr, "drv_checkpoint: the target did not start: '%s'\n", ready.c_str());
    return 1;
  }
  const int target = daemon_log != nullptr ? worker_of(daemon_log, child_pid) : child_pid;
  std::printf("figure target_pid %d (%s)\n", target, daemon_log != nullptr ? "the guest's worker" : "the process");
  if (target <= 0) {
    std::fprintf(stderr, "drv_checkpoint: no worker found for process %d in %s\n", child_pid, daemon_log);
    return 1;
  }

  CUdevice dev = 0;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS) {
    std::fprintf(stderr, "drv_checkpoint: no driver here\n");
    return 1;
  }
  const Nvml nvml;
  const long long before = nvml.used_mib();
  CUprocessState state{};
  bool ok = true;
  const auto step = [&](const char* name, CUresult st, CUprocessState want, double ms) {
    CUprocessState s{};
    const CUresult gs = cuCheckpointProcessGetState(target, &s);
    std::printf("figure %s_ms %.1f (%s; state %s)\n", name, ms, check::name(st),
                gs == CUDA_SUCCESS ? state_name(s) : check::name(gs));
    if (st != CUDA_SUCCESS || gs != CUDA_SUCCESS || s != want) ok = false;
  };
  // Another tenant takes the memory the target gave back, and frees it.
  const auto take_memory = [&] {
    long long seen = -1;
    CUcontext ctx = nullptr;
    CUdeviceptr p = 0;
    if (cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS && cuCtxSetCurrent(ctx) == CUDA_SUCCESS &&
        cuMemAlloc(&p, mib << 20) == CUDA_SUCCESS) {
      (void)cuMemsetD8(p, 0xee, mib << 20);
      (void)cuCtxSynchronize();
      seen = nvml.used_mib();
      (void)cuMemFree(p);
    }
    (void)cuDevicePrimaryCtxRelease(dev);
    return seen;
  };
  const auto check_target = [&](bool steps_ok, long long during, long long others) {
    const long long after = nvml.used_mib();
    std::printf("figure used_mib before %lld, checkpointed %lld, another tenant's %zu MiB meanwhile %lld, after %lld\n",
                before, during, mib, others, after);
    std::fprintf(out, "check\n");
    std::fflush(out);
    const std::string checked = read_line(in);
    std::printf("figure target %s (device address 0x%llx)\n", checked.c_str(), addr);
    int status = 0;
    ::waitpid(child, &status, 0);
    const bool target_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    std::printf("drv_checkpoint: %zu MiB, %s, %s, the target %s\n", mib, self ? "by itself" : "by another process",
                steps_ok ? "every step succeeded" : "a step FAILED",
                target_ok ? "found its memory intact" : "did NOT find its memory intact");
    return steps_ok && target_ok ? 0 : 1;
  };
  if (self) {
    std::fprintf(out, "self\n");
    std::fflush(out);
    const std::string out_line = read_line(in);
    std::printf("figure self %s\n", out_line.c_str());
    const bool steps_ok = out_line.find("checkpoint_ms") != std::string::npos &&
                          out_line.find("CUDA_SUCCESS checkpointed") != std::string::npos;
    const long long during = nvml.used_mib();
    const long long others = steps_ok ? take_memory() : -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
    std::fprintf(out, "restore\n");
    std::fflush(out);
    const std::string back = read_line(in);
    std::printf("figure self %s\n", back.c_str());
    return check_target(steps_ok && back.find("unlock_ms") != std::string::npos &&
                            back.find("CUDA_SUCCESS running") != std::string::npos,
                        during, others);
  }
  CUcheckpointLockArgs lock_args{};
  lock_args.timeoutMs = 10000;
  auto t0 = clk::now();
  CUresult st = cuCheckpointProcessLock(target, &lock_args);
  step("lock", st, CU_PROCESS_STATE_LOCKED, ms_since(t0));
  long long during = -1, others = -1;
  if (ok) {
    t0 = clk::now();
    st = cuCheckpointProcessCheckpoint(target, nullptr);
    step("checkpoint", st, CU_PROCESS_STATE_CHECKPOINTED, ms_since(t0));
    during = nvml.used_mib();
    others = take_memory();
    std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
  }
  if (ok) {
    t0 = clk::now();
    st = cuCheckpointProcessRestore(target, nullptr);
    step("restore", st, CU_PROCESS_STATE_LOCKED, ms_since(t0));
  }
  (void)cuCheckpointProcessGetState(target, &state);
  if (state == CU_PROCESS_STATE_LOCKED) {
    t0 = clk::now();
    st = cuCheckpointProcessUnlock(target, nullptr);
    step("unlock", st, CU_PROCESS_STATE_RUNNING, ms_since(t0));
  }
  return check_target(ok, during, others);
}
