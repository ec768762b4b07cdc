// The two doubles together, as a GPU and its NVML are: a context holds device
// memory while it lives (the GPU double charges each one, cuMemGetInfo sees
// it, one that does not fit is refused), and the NVML double lists every
// process holding a context on a device, with its memory, contexts included,
// also a process that allocated nothing, and forgets it when its last
// context goes or the process ends, however it ends. ivcudad's NVML tests
// (nvml_worker_test, run_nvml_test.sh, the VM's pynvml_check.py) rest on this:
// the host's list holds every worker, warm ones included, and the guest must
// see only its own.
//
// The CUDA side runs in child processes (the ledger knows processes by their
// lock on it, which a fork would share); this process asks NVML only.
#include <catch2/catch.hpp>

#include <cuda.h>
#include <nvml.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "identity.h"

namespace {

constexpr unsigned long long kMiB = 1ull << 20;
constexpr unsigned long long kContextMem = 24 * kMiB;  // IVCUDA_GPU_DOUBLE_CONTEXT_MIB below

// One ledger for this process's children, set before the first of them
// starts (the NVML double maps it once).
struct Env {
  std::string ledger = "/tmp/ivcuda-contexts-" + std::to_string(::getpid()) + ".ledger";
  Env() {
    ::unlink(ledger.c_str());
    ::setenv("IVCUDA_DOUBLE_LEDGER", ledger.c_str(), 1);
    ::setenv("IVCUDA_GPU_DOUBLE_DEVICES", "2", 1);
    ::setenv("IVCUDA_GPU_DOUBLE_CONTEXT_MIB", std::to_string(kContextMem / kMiB).c_str(), 1);
    REQUIRE(nvmlInit_v2() == NVML_SUCCESS);
  }
  ~Env() { ::unlink(ledger.c_str()); }
};
void setup() { static Env env; }

// A child that runs its steps one at a time: each step, then a byte to the
// parent, then it waits for the parent's byte. It exits 0 if every step
// returned true, else with the number of the first that did not.
struct Child {
  pid_t pid = -1;
  int to_child = -1, from_child = -1;
  explicit Child(std::vector<std::function<bool()>> steps) {
    int down[2], up[2];
    REQUIRE(::pipe(down) == 0);
    REQUIRE(::pipe(up) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(down[1]);
      ::close(up[0]);
      for (std::size_t i = 0; i < steps.size(); ++i) {
        if (!steps[i]()) ::_exit(static_cast<int>(i + 1));
        char c = 's';
        if (::write(up[1], &c, 1) != 1 || ::read(down[0], &c, 1) != 1) ::_exit(100);
      }
      ::_exit(0);
    }
    ::close(down[0]);
    ::close(up[1]);
    to_child = down[1];
    from_child = up[0];
  }
  // Waits until the child has done its next step; false if it failed or died.
  bool stepped() {
    char c;
    return ::read(from_child, &c, 1) == 1;
  }
  void next() {
    const char c = 'g';
    REQUIRE(::write(to_child, &c, 1) == 1);
  }
  int finish() {
    ::close(to_child);
    ::close(from_child);
    int st = 0;
    ::waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
};

nvmlDevice_t device(unsigned i) {
  nvmlDevice_t d = nullptr;
  REQUIRE(nvmlDeviceGetHandleByIndex_v2(i, &d) == NVML_SUCCESS);
  return d;
}

std::vector<nvmlProcessInfo_t> processes(unsigned dev) {
  std::vector<nvmlProcessInfo_t> v(16);
  unsigned n = static_cast<unsigned>(v.size());
  REQUIRE(nvmlDeviceGetComputeRunningProcesses_v3(device(dev), &n, v.data()) == NVML_SUCCESS);
  v.resize(n);
  return v;
}

unsigned long long used(unsigned dev) {
  nvmlMemory_t m{};
  REQUIRE(nvmlDeviceGetMemoryInfo(device(dev), &m) == NVML_SUCCESS);
  return m.used;
}

// The child's one process entry on `dev` holds `bytes`, and nothing else is there.
void listed_alone(const Child& c, unsigned dev, unsigned long long bytes) {
  const auto p = processes(dev);
  REQUIRE(p.size() == 1);
  CHECK(p[0].pid == static_cast<unsigned>(c.pid));
  CHECK(p[0].usedGpuMemory == bytes);
  CHECK(used(dev) == bytes);
}

std::size_t free_now() {
  std::size_t f = 0, t = 0;
  return cuMemGetInfo(&f, &t) == CUDA_SUCCESS ? f : 0;
}

}  // namespace

TEST_CASE("NVML lists a process for the contexts it holds, with their memory, also when it allocated nothing",
          "[nvml_double]") {
  setup();
  CUdevice dev = 0;
  CUcontext primary = nullptr, created = nullptr;
  CUdeviceptr p = 0;
  std::size_t free_primary = 0;
  Child c({
      [&] { return cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 0) == CUDA_SUCCESS &&
                   cuDevicePrimaryCtxRetain(&primary, dev) == CUDA_SUCCESS &&
                   cuCtxSetCurrent(primary) == CUDA_SUCCESS && (free_primary = free_now()) > 0; },
      // A second context: its memory too, as cuMemGetInfo says.
      [&] { return cuCtxCreate(&created, nullptr, 0, dev) == CUDA_SUCCESS && free_now() == free_primary - kContextMem; },
      [&] { return cuMemAlloc(&p, 8 * kMiB) == CUDA_SUCCESS; },
      // Destroying it frees it and what was allocated in it.
      [&] { return cuCtxDestroy(created) == CUDA_SUCCESS && cuCtxSetCurrent(primary) == CUDA_SUCCESS &&
                   free_now() == free_primary; },
      [&] { return cuDevicePrimaryCtxRelease(dev) == CUDA_SUCCESS; },
  });
  REQUIRE(c.stepped());
  listed_alone(c, 0, kContextMem);
  CHECK(processes(1).empty());  // no context there
  c.next();
  REQUIRE(c.stepped());
  listed_alone(c, 0, 2 * kContextMem);
  c.next();
  REQUIRE(c.stepped());
  listed_alone(c, 0, 2 * kContextMem + 8 * kMiB);
  c.next();
  REQUIRE(c.stepped());
  listed_alone(c, 0, kContextMem);
  c.next();
  REQUIRE(c.stepped());
  CHECK(processes(0).empty());  // its last context released: nothing of it left
  CHECK(used(0) == 0);
  c.next();
  CHECK(c.finish() == 0);
}

TEST_CASE("a primary context reset gives its memory back, and a process that ends leaves NVML's list", "[nvml_double]") {
  setup();
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  Child c({
      [&] { return cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&dev, 1) == CUDA_SUCCESS &&
                   cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS; },
      [&] { return cuDevicePrimaryCtxReset(dev) == CUDA_SUCCESS; },
      [&] { return cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS; },  // active again (the count stays 2)
      [&] {
        ::pause();  // SIGKILLed here
        return false;
      },
  });
  REQUIRE(c.stepped());
  listed_alone(c, 1, kContextMem);
  CHECK(processes(0).empty());
  c.next();
  REQUIRE(c.stepped());
  CHECK(processes(1).empty());
  c.next();
  REQUIRE(c.stepped());
  listed_alone(c, 1, kContextMem);
  c.next();
  ::kill(c.pid, SIGKILL);
  CHECK(c.finish() == 128 + SIGKILL);
  CHECK(processes(1).empty());
  CHECK(used(1) == 0);
}

TEST_CASE("a context that does not fit in the device's memory is refused", "[nvml_double]") {
  setup();
  CUdevice dev = 0;
  CUcontext ctx = nullptr, more = nullptr;
  CUdeviceptr p = 0;
  Child c({
      [&] {
        if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
            cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
          return false;
        // All but less than a context's worth.
        return cuMemAlloc(&p, free_now() - kContextMem / 2) == CUDA_SUCCESS &&
               cuCtxCreate(&more, nullptr, 0, dev) == CUDA_ERROR_OUT_OF_MEMORY;
      },
      [&] { return cuMemFree(p) == CUDA_SUCCESS && cuCtxCreate(&more, nullptr, 0, dev) == CUDA_SUCCESS; },
  });
  REQUIRE(c.stepped());
  c.next();
  REQUIRE(c.stepped());
  listed_alone(c, 0, 2 * kContextMem);
  c.next();
  CHECK(c.finish() == 0);
}
