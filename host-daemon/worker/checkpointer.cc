// The checkpointer's driver side (host-daemon/daemon/suspend.h): the process
// ivcudad forks to call the driver's process checkpointing on its workers
// loads the driver here, as a worker does, and serves the daemon's requests
// one at a time (host-daemon/shared/from_worker.h, "the checkpointer's line").
#include <cuda.h>
#include <dlfcn.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <string>
#include <type_traits>

#include "host-daemon/shared/from_worker.h"
#include "host-daemon/shared/log.h"
#include "host-daemon/shared/to_worker.h"

namespace ivcuda::host {

namespace {

using clk = std::chrono::steady_clock;
double ms_since(clk::time_point t0) { return std::chrono::duration<double, std::milli>(clk::now() - t0).count(); }

// The driver's functions the checkpointer calls, by name (it loads --driver
// as a worker does).
struct DriverCalls {
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*error_name)(CUresult, const char**) = nullptr;
  CUresult (*get_state)(int, CUprocessState*) = nullptr;
  CUresult (*lock)(int, CUcheckpointLockArgs*) = nullptr;
  CUresult (*checkpoint)(int, CUcheckpointCheckpointArgs*) = nullptr;
  CUresult (*restore)(int, CUcheckpointRestoreArgs*) = nullptr;
  CUresult (*unlock)(int, CUcheckpointUnlockArgs*) = nullptr;

  bool load(const std::string& path, std::string* why) {
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* e = ::dlerror();
      *why = e != nullptr ? e : "dlopen failed";
      return false;
    }
    const auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(h, name));
      if (fn == nullptr && why->empty()) *why = std::string("the driver has no ") + name;
    };
    sym(init, "cuInit");
    sym(error_name, "cuGetErrorName");
    sym(get_state, "cuCheckpointProcessGetState");
    sym(lock, "cuCheckpointProcessLock");
    sym(checkpoint, "cuCheckpointProcessCheckpoint");
    sym(restore, "cuCheckpointProcessRestore");
    sym(unlock, "cuCheckpointProcessUnlock");
    return why->empty();
  }
  void name(CUresult r, char (&out)[48]) const {
    const char* n = nullptr;
    if (error_name == nullptr || error_name(r, &n) != CUDA_SUCCESS || n == nullptr) n = "CUDA_ERROR_?";
    std::snprintf(out, sizeof out, "%s", n);
  }
};

// One request, start to end.
CheckpointReply serve(const DriverCalls& d, const CheckpointRequest& q) {
  CheckpointReply r{};
  r.pid = q.pid;
  r.op = q.op;
  r.state = -1;
  r.found = -1;
  CUresult st = CUDA_SUCCESS;
  auto t0 = clk::now();
  if (q.op == CheckpointOp::kSuspend) {
    CUcheckpointLockArgs args{};
    args.timeoutMs = q.timeout_ms;
    st = d.lock(q.pid, &args);
    r.first_ms = ms_since(t0);
    if (st != CUDA_SUCCESS) {
      r.step = CheckpointStep::kLock;
    } else {
      t0 = clk::now();
      st = d.checkpoint(q.pid, nullptr);
      r.second_ms = ms_since(t0);
      if (st != CUDA_SUCCESS) {
        r.step = CheckpointStep::kCheckpoint;
        (void)d.unlock(q.pid, nullptr);  // running again, as before the request
      }
    }
  } else if (q.op == CheckpointOp::kResume) {
    st = d.restore(q.pid, nullptr);
    r.first_ms = ms_since(t0);
    if (st != CUDA_SUCCESS) {
      r.step = CheckpointStep::kRestore;  // still checkpointed: a later resume tries again
    } else {
      t0 = clk::now();
      st = d.unlock(q.pid, nullptr);
      r.second_ms = ms_since(t0);
      if (st != CUDA_SUCCESS) r.step = CheckpointStep::kUnlock;
    }
  } else if (q.op == CheckpointOp::kRecover) {
    CUprocessState s{};
    st = d.get_state(q.pid, &s);
    if (st == CUDA_SUCCESS) r.found = static_cast<std::int32_t>(s);
    if (st == CUDA_SUCCESS && s == CU_PROCESS_STATE_CHECKPOINTED) {
      st = d.restore(q.pid, nullptr);
      r.first_ms = ms_since(t0);
      if (st != CUDA_SUCCESS) r.step = CheckpointStep::kRestore;
      else s = CU_PROCESS_STATE_LOCKED;
    }
    if (st == CUDA_SUCCESS && s == CU_PROCESS_STATE_LOCKED) {
      t0 = clk::now();
      st = d.unlock(q.pid, nullptr);
      r.second_ms = ms_since(t0);
      if (st != CUDA_SUCCESS) r.step = CheckpointStep::kUnlock;
    }
    if (st != CUDA_SUCCESS && r.step == CheckpointStep::kDone) r.step = CheckpointStep::kState;
  } else {
    st = CUDA_ERROR_INVALID_VALUE;
    r.step = CheckpointStep::kLock;
  }
  r.result = static_cast<std::int32_t>(st);
  d.name(st, r.result_name);
  CUprocessState s{};
  if (d.get_state(q.pid, &s) == CUDA_SUCCESS) r.state = static_cast<std::int32_t>(s);
  return r;
}

}  // namespace

[[noreturn]] void run_checkpointer(int fd, const std::string& driver) {
  DriverCalls d;
  std::string why;
  if (!d.load(driver, &why)) {
    IVLOG_ERROR("checkpointer: %s: %s", driver.c_str(), why.c_str());
    ::_exit(2);
  }
  if (const CUresult st = d.init(0); st != CUDA_SUCCESS) {
    char n[48];
    d.name(st, n);
    IVLOG_ERROR("checkpointer: cuInit -> %s", n);
    ::_exit(2);
  }
  for (;;) {
    CheckpointRequest q{};
    const ssize_t n = ::recv(fd, &q, sizeof q, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n != static_cast<ssize_t>(sizeof q)) ::_exit(0);  // the daemon let it go
    const CheckpointReply r = serve(d, q);
    if (::send(fd, &r, sizeof r, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof r)) ::_exit(0);
  }
}

}  // namespace ivcuda::host
