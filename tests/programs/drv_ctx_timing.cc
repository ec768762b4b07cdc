// How long the driver takes to make, reset and tear down contexts, alone and
// beside each other in other processes: the figures behind ivcudad's worker
// pool (docs/design.md, "Contexts in turns"; issue 30). Each process is a
// child that starts the driver, prepares (a context holding 1 GiB, for the
// reset and exit actions), says it is ready, and on the parent's word does its
// action and says how long it took; the parent never starts the driver (a
// child forked after cuInit could not use it). Every scenario runs --rounds
// times; each line gives the median and the range in ms:
//   retain             cuDevicePrimaryCtxRetain alone
//   retain x4          four at once, each
//   retain | reset     one while another process resets a context of 1 GiB
//   retain | exit      one while another process holding 1 GiB exits
//   reset              cuDevicePrimaryCtxReset of a context of 1 GiB, alone
//   recycle            reset, then retain again, in one process (the second retain)
//   init, init x4      cuInit alone and four at once
//   retain | init x4   one while four other processes start the driver
//   nvml               NVML's start (nvmlInit_v2), where libnvidia-ml.so.1 loads and starts
//   retain | nvml      one while another process starts NVML
// Exits 0 when every child did what it was asked.
//   drv_ctx_timing [--rounds N] [--mib N]
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "check.h"

namespace {

using clk = std::chrono::steady_clock;

enum class Action { kRetain, kReset, kExit, kRecycle, kInit, kNvml };

double ms_since(clk::time_point t0) {
  return std::chrono::duration<double, std::milli>(clk::now() - t0).count();
}

struct Child {
  pid_t pid = -1;
  int go = -1;    // the parent writes a byte: act
  int said = -1;  // the child writes "<init ms> <action ms>"
};

bool write_all(int fd, const std::string& s) { return ::write(fd, s.data(), s.size()) == static_cast<ssize_t>(s.size()); }

// In the child: start the driver, prepare, wait for the word, act, report.
[[noreturn]] void child_main(Action a, size_t mib, int go, int said) {
  auto t0 = clk::now();
  // The driver's start is the action itself for kInit; NVML's needs none.
  CUresult st = a == Action::kInit || a == Action::kNvml ? CUDA_SUCCESS : cuInit(0);
  const double init_ms = ms_since(t0);
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUdeviceptr p = 0;
  if (st == CUDA_SUCCESS && a != Action::kInit && a != Action::kNvml) st = cuDeviceGet(&dev, 0);
  if (st == CUDA_SUCCESS && a != Action::kRetain && a != Action::kInit && a != Action::kNvml) {
    st = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (st == CUDA_SUCCESS) st = cuCtxSetCurrent(ctx);
    if (st == CUDA_SUCCESS) st = cuMemAlloc(&p, mib << 20);
    if (st == CUDA_SUCCESS) st = cuMemsetD8(p, 0x5a, mib << 20);
    if (st == CUDA_SUCCESS) st = cuCtxSynchronize();
  }
  if (st != CUDA_SUCCESS) {
    std::fprintf(stderr, "drv_ctx_timing: a child could not prepare: %s\n", check::name(st));
    ::_exit(2);
  }
  (void)write_all(said, "ready\n");
  char c = 0;
  if (::read(go, &c, 1) != 1) ::_exit(3);
  if (a == Action::kExit) ::_exit(0);
  t0 = clk::now();
  switch (a) {
    case Action::kRetain:
      st = cuDevicePrimaryCtxRetain(&ctx, dev);
      break;
    case Action::kReset:
      st = cuDevicePrimaryCtxReset(dev);
      break;
    case Action::kRecycle:
      st = cuDevicePrimaryCtxReset(dev);
      t0 = clk::now();  // the second retain alone
      if (st == CUDA_SUCCESS) st = cuDevicePrimaryCtxRetain(&ctx, dev);
      break;
    case Action::kInit:
      st = cuInit(0);
      break;
    case Action::kNvml: {
      void* h = ::dlopen("libnvidia-ml.so.1", RTLD_NOW);
      auto* init = h != nullptr ? reinterpret_cast<int (*)()>(::dlsym(h, "nvmlInit_v2")) : nullptr;
      if (init == nullptr || init() != 0) {
        // No NVML behind the library (CI's GPU double): nothing to time.
        (void)write_all(said, "-1 -2\n");
        while (::read(go, &c, 1) > 0) {
        }
        ::_exit(0);
      }
      break;
    }
    case Action::kExit:
      break;
  }
  const double act_ms = ms_since(t0);
  if (st != CUDA_SUCCESS) {
    std::fprintf(stderr, "drv_ctx_timing: a child's action failed: %s\n", check::name(st));
    ::_exit(4);
  }
  char line[96];
  std::snprintf(line, sizeof line, "%.3f %.3f\n", init_ms, act_ms);
  (void)write_all(said, line);
  // Hold what it made until the parent is done with the scenario.
  while (::read(go, &c, 1) > 0) {
  }
  ::_exit(0);
}

// The parent's ends of the children alive: a child closes its copies, or
// an earlier child would never see its word's pipe close.
std::vector<int> g_parent_ends;

Child spawn(Action a, size_t mib) {
  int go[2], said[2];
  if (::pipe(go) != 0 || ::pipe(said) != 0) std::exit(1);
  const pid_t pid = ::fork();
  if (pid < 0) std::exit(1);
  if (pid == 0) {
    for (int fd : g_parent_ends) ::close(fd);
    ::close(go[1]);
    ::close(said[0]);
    child_main(a, mib, go[0], said[1]);
  }
  ::close(go[0]);
  ::close(said[1]);
  g_parent_ends.push_back(go[1]);
  g_parent_ends.push_back(said[0]);
  return Child{pid, go[1], said[0]};
}

std::string read_line(int fd) {
  std::string s;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') s += c;
  return s;
}

int g_bad = 0;

// One round: the children made, all ready, the word given to all at once;
// returns each child's "init act" pair (act -1 for an exit).
std::vector<std::pair<double, double>> round(const std::vector<Action>& acts, size_t mib) {
  std::vector<Child> kids;
  for (Action a : acts) kids.push_back(spawn(a, mib));
  for (auto& k : kids)
    if (read_line(k.said) != "ready") ++g_bad;
  for (auto& k : kids) (void)write_all(k.go, "g");
  std::vector<std::pair<double, double>> out;
  for (size_t i = 0; i < kids.size(); ++i) {
    double init = -1, act = -1;
    if (acts[i] != Action::kExit && std::sscanf(read_line(kids[i].said).c_str(), "%lf %lf", &init, &act) != 2) ++g_bad;
    out.emplace_back(init, act);
  }
  for (auto& k : kids) {
    ::close(k.go);
    int status = 0;
    ::waitpid(k.pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++g_bad;
    ::close(k.said);
  }
  g_parent_ends.clear();
  ::usleep(300 * 1000);  // the driver's teardown of this round, out of the next one's way
  return out;
}

void report(const char* what, std::vector<double> v) {
  if (v.empty()) return;
  std::sort(v.begin(), v.end());
  std::printf("%-22s median %8.1f ms   range %8.1f - %8.1f   (%zu samples)\n", what, v[v.size() / 2], v.front(), v.back(),
              v.size());
}

}  // namespace

int main(int argc, char** argv) {
  const char* r = check::arg(argc, argv, "--rounds");
  const char* m = check::arg(argc, argv, "--mib");
  const int rounds = r != nullptr ? std::atoi(r) : 5;
  const size_t mib = m != nullptr ? std::strtoull(m, nullptr, 10) : 1024;
  std::map<std::string, std::vector<double>> fig;
  const std::vector<std::string> order = {"init",  "init x4",         "retain",     "retain x4",
                                          "reset", "retain | reset",  "reset | retain", "retain | exit",
                                          "recycle (2nd retain)", "retain | init x4", "nvml", "retain | nvml"};
  // NVML's scenarios only where its library loads (the GPU machine; not CI's).
  void* nvml = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (nvml == nullptr) nvml = ::dlopen("libnvidia-ml.so.1", RTLD_LAZY);
  bool has_nvml = nvml != nullptr;
  if (nvml != nullptr) ::dlclose(nvml);
  for (int i = 0; i < rounds; ++i) {
    auto one = round({Action::kRetain}, mib);
    fig["init"].push_back(one[0].first);
    fig["retain"].push_back(one[0].second);
    auto four = round({Action::kRetain, Action::kRetain, Action::kRetain, Action::kRetain}, mib);
    for (auto& [init, act] : four) {
      fig["init x4"].push_back(init);
      fig["retain x4"].push_back(act);
    }
    fig["reset"].push_back(round({Action::kReset}, mib)[0].second);
    auto rr = round({Action::kRetain, Action::kReset}, mib);
    fig["retain | reset"].push_back(rr[0].second);
    fig["reset | retain"].push_back(rr[1].second);
    fig["retain | exit"].push_back(round({Action::kRetain, Action::kExit}, mib)[0].second);
    fig["recycle (2nd retain)"].push_back(round({Action::kRecycle}, mib)[0].second);
    fig["retain | init x4"].push_back(
        round({Action::kRetain, Action::kInit, Action::kInit, Action::kInit, Action::kInit}, mib)[0].second);
    if (has_nvml) {
      const double nvml_ms = round({Action::kNvml}, mib)[0].second;
      has_nvml = nvml_ms >= 0;  // -2: the library loads, NVML does not start
      if (has_nvml) {
        fig["nvml"].push_back(nvml_ms);
        fig["retain | nvml"].push_back(round({Action::kRetain, Action::kNvml}, mib)[0].second);
      }
    }
  }
  for (const auto& k : order) report(k.c_str(), fig[k]);
  std::printf("drv_ctx_timing: %d rounds, %d failures\n", rounds, g_bad);
  return g_bad == 0 ? 0 : 1;
}
