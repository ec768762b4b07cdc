// The double's process checkpointing (api_checkpoint.cc), between two
// processes of one ledger, as ivcudad's suspend uses the driver's: a locked
// process's calls fail with CUDA_ERROR_OPERATING_SYSTEM as driver 580's do
// (so a worker makes none then), a checkpointed one's memory is
// free for others, a restore needs it free again, the process's memory and
// pointers are intact after, and the states go only in the driver's order.
// Its own executable: the ledger is read once per process, before any call.
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>

#include <catch2/catch.hpp>
#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace std::chrono_literals;

namespace {

// The ledger file, set before main (and so before the double reads it).
const std::string g_ledger = [] {
  std::string path = "/tmp/ivcuda-ckpt-ledger.XXXXXX";
  const int fd = ::mkstemp(path.data());
  if (fd >= 0) ::close(fd);
  ::setenv("IVCUDA_DOUBLE_LEDGER", path.c_str(), 1);
  return path;
}();

constexpr std::size_t kBytes = std::size_t{512} << 20;

// The target: holds kBytes with a pattern and calls cuMemGetInfo every 2 ms,
// a byte on `beats` after each: 'b' when it succeeded, 'f' when it failed
// with CUDA_ERROR_OPERATING_SYSTEM, 'x' for any other answer; on a byte on
// `cmd` it checks its pattern and exits 0 if intact. With `refuse` (a system
// call's number), all its threads then refuse that call (EPERM), as a
// sandbox's seccomp filter would.
[[noreturn]] void target(int beats, int cmd, long refuse = -1) {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUdeviceptr p = 0;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
      cuMemAlloc(&p, kBytes) != CUDA_SUCCESS || cuMemsetD32(p, 0xabcd1234u, kBytes / 4) != CUDA_SUCCESS)
    ::_exit(2);
  if (refuse >= 0) {
    sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<unsigned>(refuse), 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(std::size(f)), f};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) != 0)
      ::_exit(3);
  }
  for (;;) {
    pollfd f{cmd, POLLIN, 0};
    if (::poll(&f, 1, 2) > 0) break;
    std::size_t free_b = 0, total_b = 0;
    const CUresult r = cuMemGetInfo(&free_b, &total_b);
    (void)!::write(beats, r == CUDA_SUCCESS ? "b" : r == CUDA_ERROR_OPERATING_SYSTEM ? "f" : "x", 1);
  }
  std::vector<unsigned> back(1024);
  bool intact = cuMemcpyDtoH(back.data(), p + kBytes - back.size() * 4, back.size() * 4) == CUDA_SUCCESS;
  for (unsigned w : back) intact = intact && w == 0xabcd1234u;
  ::_exit(intact ? 0 : 1);
}

// Successful calls' beats since the last call (the pipe is non-blocking;
// the others are read and dropped).
int drain(int fd) {
  char buf[4096];
  int n = 0;
  for (ssize_t r; (r = ::read(fd, buf, sizeof buf)) > 0;)
    for (ssize_t i = 0; i < r; ++i) n += buf[i] == 'b' ? 1 : 0;
  return n;
}

// A child killed and reaped if the test ends early (a failed REQUIRE), so
// that none is left waiting on a lock nobody will lift.
struct Child {
  pid_t pid;
  ~Child() {
    if (pid > 0 && ::waitpid(pid, nullptr, WNOHANG) == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  // Its exit status once it ends by itself; -1 if it did not exit.
  int wait() {
    int status = 0;
    const pid_t p = std::exchange(pid, -1);
    if (::waitpid(p, &status, 0) != p || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
  }
};

std::size_t free_now() {
  std::size_t free_b = 0, total_b = 0;
  REQUIRE(cuMemGetInfo(&free_b, &total_b) == CUDA_SUCCESS);
  return free_b;
}

std::string read_ptx() {
  std::string out;
  if (FILE* f = std::fopen(IVCUDA_TEST_KERNELS_PTX, "rb")) {
    char buf[65536];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    std::fclose(f);
  }
  return out;
}

CUprocessState state_of(pid_t pid) {
  CUprocessState s{};
  REQUIRE(cuCheckpointProcessGetState(pid, &s) == CUDA_SUCCESS);
  return s;
}

}  // namespace

TEST_CASE("a process locked, checkpointed, restored and unlocked by another: its calls fail meanwhile as the "
          "driver's do, its memory is others' meanwhile and intact after",
          "[gpu_double][checkpoint]") {
  int beats[2], cmd[2];
  REQUIRE(::pipe(beats) == 0);
  REQUIRE(::pipe(cmd) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) target(beats[1], cmd[0]);
  Child child{pid};
  ::fcntl(beats[0], F_SETFL, O_NONBLOCK);
  int first = 0;
  for (int i = 0; i < 500 && first == 0; ++i) {  // it runs (its 512 MiB written first)
    std::this_thread::sleep_for(10ms);
    first = drain(beats[0]);
  }
  REQUIRE(first > 0);

  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  REQUIRE(cuDeviceGet(&dev, 0) == CUDA_SUCCESS);
  REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
  CHECK(state_of(pid) == CU_PROCESS_STATE_RUNNING);
  // Out of order: refused, nothing changes.
  CHECK(cuCheckpointProcessCheckpoint(pid, nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  CHECK(cuCheckpointProcessUnlock(pid, nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  CHECK(cuCheckpointProcessRestore(pid, nullptr) == CUDA_ERROR_ILLEGAL_STATE);
  const std::size_t free_running = free_now();

  CUcheckpointLockArgs lock{};
  lock.timeoutMs = 2000;
  REQUIRE(cuCheckpointProcessLock(pid, &lock) == CUDA_SUCCESS);
  CHECK(state_of(pid) == CU_PROCESS_STATE_LOCKED);
  CHECK(cuCheckpointProcessLock(pid, &lock) == CUDA_ERROR_ILLEGAL_STATE);
  (void)drain(beats[0]);
  std::this_thread::sleep_for(200ms);
  {
    char got[4096];
    const ssize_t n = ::read(beats[0], got, sizeof got);
    REQUIRE(n > 0);  // it goes on calling
    CHECK(std::string(got, static_cast<std::size_t>(n)).find_first_not_of('f') == std::string::npos);  // each fails
  }

  REQUIRE(cuCheckpointProcessCheckpoint(pid, nullptr) == CUDA_SUCCESS);
  CHECK(state_of(pid) == CU_PROCESS_STATE_CHECKPOINTED);
  CHECK(free_now() >= free_running + kBytes);  // its memory left the device
  // Another process takes that memory: the restore cannot fit, and leaves it checkpointed.
  CUdeviceptr mine = 0;
  REQUIRE(cuMemAlloc(&mine, free_now() - (std::size_t{64} << 20)) == CUDA_SUCCESS);
  CHECK(cuCheckpointProcessRestore(pid, nullptr) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(state_of(pid) == CU_PROCESS_STATE_CHECKPOINTED);
  REQUIRE(cuMemFree(mine) == CUDA_SUCCESS);
  CHECK(drain(beats[0]) == 0);  // no call succeeded meanwhile

  REQUIRE(cuCheckpointProcessRestore(pid, nullptr) == CUDA_SUCCESS);
  CHECK(state_of(pid) == CU_PROCESS_STATE_LOCKED);
  CHECK(free_now() == free_running);  // its memory is back on the device
  REQUIRE(cuCheckpointProcessUnlock(pid, nullptr) == CUDA_SUCCESS);
  CHECK(state_of(pid) == CU_PROCESS_STATE_RUNNING);
  (void)drain(beats[0]);
  std::this_thread::sleep_for(200ms);
  {
    char got[4096];
    const ssize_t n = ::read(beats[0], got, sizeof got);
    REQUIRE(n > 0);
    CHECK(std::string(got, static_cast<std::size_t>(n)).find_first_not_of('b') == std::string::npos);  // each succeeds
  }

  (void)!::write(cmd[1], "x", 1);
  CHECK(child.wait() == 0);  // its pattern intact at its address
  // A process gone is no process the driver knows.
  CUprocessState s{};
  CHECK(cuCheckpointProcessGetState(pid, &s) == CUDA_ERROR_INVALID_VALUE);
  (void)cuDevicePrimaryCtxRelease(dev);
  ::unlink(g_ledger.c_str());
}

TEST_CASE("a lock waits for the calls under way, and one not had in time leaves the process running",
          "[gpu_double][checkpoint]") {
  int ready[2], go[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe(go) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // A kernel that keeps its stream busy 800 ms, and a synchronise on it.
    char c = 0;
    ::setenv("IVCUDA_GPU_DOUBLE_KERNEL_US", "800000", 1);
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    CUmodule mod = nullptr;
    CUfunction fn = nullptr;
    CUdeviceptr p = 0;
    const std::string ptx = read_ptx();
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
        cuModuleLoadData(&mod, ptx.c_str()) != CUDA_SUCCESS ||
        cuModuleGetFunction(&fn, mod, "ivc_add_const") != CUDA_SUCCESS || cuMemAlloc(&p, 1024) != CUDA_SUCCESS)
      ::_exit(2);
    int n = 256;
    void* params[] = {&p, &n};
    if (cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr) != CUDA_SUCCESS) ::_exit(3);
    (void)!::write(ready[1], "r", 1);
    if (cuCtxSynchronize() != CUDA_SUCCESS) ::_exit(4);
    // Alive until told, then one more call.
    if (::read(go[0], &c, 1) != 1) ::_exit(5);
    ::_exit(cuCtxSynchronize() == CUDA_SUCCESS ? 0 : 6);
  }
  Child child{pid};
  ::close(ready[1]);
  ::close(go[0]);
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  std::this_thread::sleep_for(200ms);  // it is in its synchronise by now (800 ms)
  // Its synchronise is under way: a lock with 200 ms to spare is not had,
  // and the process is left running.
  CUcheckpointLockArgs lock{};
  lock.timeoutMs = 200;
  CHECK(cuCheckpointProcessLock(pid, &lock) == CUDA_ERROR_NOT_READY);
  CHECK(std::chrono::steady_clock::now() - t0 >= 400ms);
  CHECK(state_of(pid) == CU_PROCESS_STATE_RUNNING);
  // Without a timeout it waits for the synchronise to end.
  lock.timeoutMs = 0;
  REQUIRE(cuCheckpointProcessLock(pid, &lock) == CUDA_SUCCESS);
  CHECK(std::chrono::steady_clock::now() - t0 >= 600ms);
  CHECK(state_of(pid) == CU_PROCESS_STATE_LOCKED);
  REQUIRE(cuCheckpointProcessUnlock(pid, nullptr) == CUDA_SUCCESS);
  // Bad arguments and processes that are not another CUDA process are refused.
  CUcheckpointLockArgs bad{};
  bad.reserved0 = 1;
  CHECK(cuCheckpointProcessLock(pid, &bad) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuCheckpointProcessLock(::getpid(), &lock) == CUDA_ERROR_INVALID_VALUE);
  CUprocessState s{};
  CHECK(cuCheckpointProcessGetState(pid, nullptr) == CUDA_ERROR_INVALID_VALUE);
  (void)!::write(go[1], "g", 1);
  CHECK(child.wait() == 0);
  CHECK(cuCheckpointProcessGetState(pid, &s) == CUDA_ERROR_INVALID_VALUE);
}

// The driver does part of a checkpoint and of a restore inside the process
// (driver 580: dup2 for the checkpoint; stat, mkdir, symlink for the
// restore), and so does the double, from a thread of the process's: a
// process whose seccomp filter refuses one of them is not checkpointed (or
// not restored), and says so with CUDA_ERROR_OPERATING_SYSTEM, left as it was.
TEST_CASE("a process whose filter refuses the driver's calls inside it is not checkpointed, or not restored",
          "[gpu_double][checkpoint]") {
  const auto [refused, part] = GENERATE(std::make_pair(long{SYS_dup2}, "checkpoint"),
                                        std::make_pair(long{SYS_stat}, "restore"),
                                        std::make_pair(long{SYS_symlink}, "restore"));
  INFO("refused: system call " << refused << ", in the " << part);
  int beats[2], cmd[2];
  REQUIRE(::pipe(beats) == 0);
  REQUIRE(::pipe(cmd) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) target(beats[1], cmd[0], refused);
  Child child{pid};
  ::fcntl(beats[0], F_SETFL, O_NONBLOCK);
  int first = 0;
  for (int i = 0; i < 500 && first == 0; ++i) {
    std::this_thread::sleep_for(10ms);
    first = drain(beats[0]);
  }
  REQUIRE(first > 0);
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUcheckpointLockArgs lock{};
  lock.timeoutMs = 2000;
  REQUIRE(cuCheckpointProcessLock(pid, &lock) == CUDA_SUCCESS);
  if (std::string(part) == "checkpoint") {
    CHECK(cuCheckpointProcessCheckpoint(pid, nullptr) == CUDA_ERROR_OPERATING_SYSTEM);
    CHECK(state_of(pid) == CU_PROCESS_STATE_LOCKED);  // as driver 580 left its sandboxed worker
  } else {
    REQUIRE(cuCheckpointProcessCheckpoint(pid, nullptr) == CUDA_SUCCESS);
    CHECK(cuCheckpointProcessRestore(pid, nullptr) == CUDA_ERROR_OPERATING_SYSTEM);
    CHECK(state_of(pid) == CU_PROCESS_STATE_CHECKPOINTED);
    ::kill(pid, SIGKILL);  // it cannot come back
    return;
  }
  REQUIRE(cuCheckpointProcessUnlock(pid, nullptr) == CUDA_SUCCESS);
  (void)!::write(cmd[1], "x", 1);
  CHECK(child.wait() == 0);  // it serves on, intact
}
