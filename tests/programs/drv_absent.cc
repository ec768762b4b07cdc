// What the driver answers to each function whose feature a guest does not
// have: every export named in a list (one name a line; tests/gpu/run_all.sh
// absent passes the guest library's generated stubs, `nm -D` type W) is called
// with every argument zero - null handles, null pointers, zero sizes and flags -
// in a process that holds a current context, and the answer is printed as
// "NAME CUDA_ERROR_...". The same list answered by ivcuda's stubs must print the
// same (docs/api-coverage.md, "Where the feature is absent").
//
// A call that takes the process down or hangs is said as such ("NAME crash
// SIGSEGV", "NAME timeout"), and the next name goes on in a new process: the
// calls run in a child that reports each answer to the parent before it makes
// the next call. Never in the list: cuMulticast* (never called on the shared
// GPU machines) and the checkpoint calls that act on a process.
//   drv_absent NAMES-FILE
#include <cuda.h>
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

// Every argument zero: integers and pointers in their registers and on the
// stack (x86-64: six in registers, the rest on the stack), enough for the
// longest prototype of cuda.h (cuTensorMapEncodeIm2colWide's 16).
using Any = CUresult (*)(std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t,
                         std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t,
                         std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t, std::uintptr_t,
                         std::uintptr_t);

bool never_called(const std::string& name) {
  return name.rfind("cuMulticast", 0) == 0 || name == "cuCheckpointProcessLock" ||
         name == "cuCheckpointProcessCheckpoint" || name == "cuCheckpointProcessRestore" ||
         name == "cuCheckpointProcessUnlock";
}

// The child: a context, then each name from `first` on, one answer a line on `out`.
[[noreturn]] void answer_from(const std::vector<std::string>& names, std::size_t first, int out) {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) ::_exit(3);
  using Init = CUresult (*)(unsigned);
  using Retain = CUresult (*)(CUcontext*, CUdevice);
  using SetCurrent = CUresult (*)(CUcontext);
  using ErrName = CUresult (*)(CUresult, const char**);
  auto init = reinterpret_cast<Init>(::dlsym(lib, "cuInit"));
  auto retain = reinterpret_cast<Retain>(::dlsym(lib, "cuDevicePrimaryCtxRetain"));
  auto set_current = reinterpret_cast<SetCurrent>(::dlsym(lib, "cuCtxSetCurrent"));
  auto err_name = reinterpret_cast<ErrName>(::dlsym(lib, "cuGetErrorName"));
  CUcontext ctx = nullptr;
  if (init == nullptr || retain == nullptr || set_current == nullptr || err_name == nullptr || init(0) != CUDA_SUCCESS ||
      retain(&ctx, 0) != CUDA_SUCCESS || set_current(ctx) != CUDA_SUCCESS)
    ::_exit(4);
  for (std::size_t i = first; i < names.size(); ++i) {
    std::string line = std::to_string(i) + " " + names[i] + " ";
    if (never_called(names[i])) {
      line += "not-called";
    } else if (void* fn = ::dlsym(lib, names[i].c_str()); fn == nullptr) {
      line += "no-such-export";
    } else {
      ::alarm(5);
      const CUresult st = reinterpret_cast<Any>(fn)(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
      ::alarm(0);
      const char* s = nullptr;
      line += err_name(st, &s) == CUDA_SUCCESS && s != nullptr ? s : ("CUresult " + std::to_string(st));
    }
    line += "\n";
    if (::write(out, line.data(), line.size()) != static_cast<ssize_t>(line.size())) ::_exit(5);
  }
  ::_exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: drv_absent NAMES-FILE\n");
    return 2;
  }
  std::vector<std::string> names;
  std::ifstream in(argv[1]);
  for (std::string n; std::getline(in, n);)
    if (!n.empty() && n[0] != '#') names.push_back(n);
  if (names.empty()) {
    std::fprintf(stderr, "drv_absent: no names in %s\n", argv[1]);
    return 2;
  }
  std::vector<std::string> answers(names.size());
  std::size_t next = 0;
  int children = 0;
  while (next < names.size()) {
    int fds[2];
    if (::pipe(fds) != 0) return 2;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      answer_from(names, next, fds[1]);
    }
    ++children;
    ::close(fds[1]);
    std::string got;
    char buf[4096];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<std::size_t>(n));
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    std::size_t pos = 0, done = next;
    for (std::size_t eol; (eol = got.find('\n', pos)) != std::string::npos; pos = eol + 1) {
      const std::string line = got.substr(pos, eol - pos);
      const std::size_t i = std::stoul(line);
      answers[i] = line.substr(line.find(' ') + 1);
      done = i + 1;
    }
    if (done < names.size()) {  // the child ended before it answered names[done]
      if (WIFEXITED(status) && WEXITSTATUS(status) >= 3 && done == next) {
        std::fprintf(stderr, "drv_absent: no driver or context (exit %d)\n", WEXITSTATUS(status));
        return 1;
      }
      const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      answers[done] = names[done] + (sig == SIGALRM ? " timeout" : " crash " + std::string(sig != 0 ? strsignal(sig) : "exit"));
      ++done;
    }
    next = done;
  }
  for (const auto& a : answers) std::printf("%s\n", a.c_str());
  std::printf("drv_absent: %zu exports asked, %d processes\n", names.size(), children);
  return 0;
}
