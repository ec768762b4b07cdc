// See mps.h.
#include "host-daemon/daemon/mps.h"

#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "host-daemon/shared/log.h"

extern char** environ;

namespace ivcuda::host {

namespace {

Result<void> make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
    return make_error(errno, "mkdir " + path + ": " + std::strerror(errno));
  return {};
}

// Runs `control` with the MPS directories in its environment, `input` on its
// stdin; returns its stdout and exit status.
Result<std::pair<std::string, int>> run_control(const MpsConfig& cfg, const std::vector<std::string>& args,
                                                const std::string& input) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return make_error(errno, "pipe");
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    return make_error(errno, "pipe");
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  std::vector<std::string> env{"CUDA_MPS_PIPE_DIRECTORY=" + cfg.pipe_dir, "CUDA_MPS_LOG_DIRECTORY=" + cfg.log_dir,
                               "PATH=/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/nvidia/bin"};
  std::vector<char*> envp, argv{const_cast<char*>(cfg.control.c_str())};
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, cfg.control.c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(in[0]);
  ::close(out[1]);
  if (rc != 0) {
    ::close(in[1]);
    ::close(out[0]);
    return make_error(rc, cfg.control + ": " + std::strerror(rc) + " (is the NVIDIA driver's MPS installed?)");
  }
  if (!input.empty()) (void)!::write(in[1], input.data(), input.size());
  ::close(in[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return std::make_pair(text, WIFEXITED(status) ? WEXITSTATUS(status) : 128);
}

}  // namespace

Result<MpsControl> MpsControl::start_or_join(const MpsConfig& cfg) {
  MpsControl m;
  m.cfg_ = cfg;
  IVCUDA_TRY(make_dir(cfg.pipe_dir));
  IVCUDA_TRY(make_dir(cfg.log_dir));
  // A control daemon that answers there already: join it.
  if (auto r = m.command("get_server_list"); r) {
    IVLOG_INFO("MPS: joined the control daemon at %s", cfg.pipe_dir.c_str());
    return m;
  }
  IVCUDA_TRY_ASSIGN(const auto started, run_control(cfg, {"-d"}, ""));
  if (started.second != 0)
    return make_error(EIO, cfg.control + " -d failed (exit " + std::to_string(started.second) + "): " +
                               started.first);
  m.started_ = true;
  // It forks into the background; wait until it answers.
  for (int i = 0; i < 100; ++i) {
    if (m.command("get_server_list")) {
      IVLOG_INFO("MPS: started a control daemon (pipes %s, logs %s)", cfg.pipe_dir.c_str(), cfg.log_dir.c_str());
      return m;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  m.stop();
  return make_error(ETIMEDOUT, "the MPS control daemon did not answer at " + cfg.pipe_dir + " (see " + cfg.log_dir +
                                   "/control.log)");
}

MpsControl::MpsControl(MpsControl&& o) noexcept : cfg_(std::move(o.cfg_)), started_(std::exchange(o.started_, false)) {}

MpsControl& MpsControl::operator=(MpsControl&& o) noexcept {
  if (this != &o) {
    stop();
    cfg_ = std::move(o.cfg_);
    started_ = std::exchange(o.started_, false);
  }
  return *this;
}

MpsControl::~MpsControl() { stop(); }

Result<std::string> MpsControl::command(const std::string& cmd) const {
  // The client needs the control pipe; without it, it would wait.
  struct stat st {};
  if (::stat((cfg_.pipe_dir + "/control").c_str(), &st) != 0)
    return make_error(ENOENT, "no MPS control daemon at " + cfg_.pipe_dir);
  IVCUDA_TRY_ASSIGN(const auto r, run_control(cfg_, {}, cmd + "\n"));
  if (r.second != 0) return make_error(EIO, "MPS control: '" + cmd + "' failed: " + r.first);
  return r.first;
}

void MpsControl::stop() noexcept {
  if (!started_) return;
  started_ = false;
  if (auto r = command("quit"); !r) IVLOG_WARN("MPS: could not stop the control daemon: %s", r.error().what.c_str());
  else IVLOG_INFO("MPS: stopped the control daemon");
}

int count_gpus() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/driver/nvidia/gpus")) {
    while (const dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n;
}

std::vector<std::string> mps_client_env(const MpsConfig& cfg, unsigned percent, std::uint64_t limit_bytes,
                                        const std::vector<int>& devices, int device_count) {
  std::vector<std::string> env{"CUDA_MPS_PIPE_DIRECTORY=" + cfg.pipe_dir, "CUDA_MPS_LOG_DIRECTORY=" + cfg.log_dir};
  if (percent > 0 && percent < 100) env.push_back("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=" + std::to_string(percent));
  if (limit_bytes != 0) {
    std::vector<int> devs = devices;
    if (devs.empty())
      for (int d = 0; d < device_count; ++d) devs.push_back(d);
    if (devs.empty()) {
      IVLOG_WARN("MPS: no GPUs listed in /proc/driver/nvidia/gpus; guests' memory is not pinned by MPS");
      return env;
    }
    std::string spec;
    const std::uint64_t mib = (limit_bytes + (1u << 20) - 1) >> 20;
    for (const int d : devs) spec += (spec.empty() ? "" : ",") + std::to_string(d) + "=" + std::to_string(mib) + "M";
    env.push_back("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=" + spec);
  }
  return env;
}

}  // namespace ivcuda::host
