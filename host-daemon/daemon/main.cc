// ivcudad: owns the GPU and serves guests. It listens on a UNIX socket and
// speaks the server side of QEMU's ivshmem protocol, so that stock QEMU's
// ivshmem-doorbell device and local processes ("process mode") connect the
// same way. Every guest gets its own shared memory and its own worker
// process; this parent never touches the GPU.
//
// main() reads the options, prepares the sandbox and the memory layout, and
// hands over to the listening daemon (daemon.h) or, with --join, to one
// peer of somebody else's ivshmem-server (launch.h).
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "host-daemon/daemon/daemon.h"
#include "host-daemon/daemon/launch.h"
#include "host-daemon/daemon/mps.h"
#include "host-daemon/daemon/options.h"
#include "host-daemon/sandbox/sandbox.h"
#include "host-daemon/shared/context_turns.h"
#include "host-daemon/shared/log.h"
#include "host-daemon/shared/rules.h"
#include "ring/layout.h"

namespace {

using namespace ivcuda::host;

// Every descriptor above stderr that ivcudad was started with. Workers are
// forked, never executed, so close-on-exec protects nothing here: a pipe or
// file its starter leaked (a tool shell's fd 251, say) would live on in the
// daemon, each connection's process and warm entry, and every worker, whose
// seccomp filter lets read and write through on any descriptor it holds.
// Nothing is meant to arrive this way: the service unit uses no socket
// activation (no LISTEN_FDS), and every path the options name (--socket,
// --join, --driver, --config, --plain-file) is opened by name. False, errno
// set, when they cannot be closed.
bool close_inherited_descriptors() {
  if (::close_range(3, ~0U, 0) == 0) return true;
  // Before Linux 5.9 (ENOSYS), or where a container's filter refuses the
  // call: the same from the list of what is open.
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return false;
  std::vector<int> fds;
  while (const dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && fd > 2 && fd != ::dirfd(d)) fds.push_back(static_cast<int>(fd));
  }
  ::closedir(d);
  for (const int fd : fds) ::close(fd);
  return true;
}

void set_log_level(const std::string& level) {
  using ivcuda::log::Level;
  ivcuda::log::set_level(level == "error"  ? Level::kError
                         : level == "warn"  ? Level::kWarn
                         : level == "debug" ? Level::kDebug
                                            : Level::kInfo);
}

// Each guest costs the daemon a few fds, and the fd broker holds exported
// allocations for tenants: take the whole allowance (poll, never select).
void raise_fd_limit() {
  if (rlimit rl{}; ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &rl);
  }
}

// The daemon's own part of the sandbox (host-daemon/sandbox/sandbox.h): the
// workers' user, the kernel's Landlock, and what the daemon gives up itself.
bool prepare_sandbox(Options& o) {
  if (auto u = sandbox::resolve_user(o.sandbox); !u) {
    IVLOG_ERROR("%s", u.error().what.c_str());
    return false;
  }
  if (auto k = sandbox::prepare(o.sandbox); !k) {
    IVLOG_ERROR("%s", k.error().what.c_str());
    return false;
  }
  sandbox::apply_to_daemon(o.sandbox);
  return true;
}

std::optional<ivcuda::ring::Layout> plan(const Options& o) {
  if (o.ring_size > (1u << 30)) {
    IVLOG_ERROR("--ring-size too large");
    return std::nullopt;
  }
  ivcuda::ring::LayoutParams lp;
  lp.shm_size = o.shm_size;
  lp.channels = o.channels;
  lp.ring_bytes = static_cast<std::uint32_t>(o.ring_size);
  lp.staging_bytes = o.staging;
  auto layout = ivcuda::ring::plan_layout(lp);
  if (!layout) {
    IVLOG_ERROR("bad memory layout: %s", layout.error().what.c_str());
    return std::nullopt;
  }
  return *layout;
}

}  // namespace

int main(int argc, char** argv) {
  // First of all, while nothing of ours is open (a later close would take
  // ours too); the log writes to stderr only.
  if (IVCUDA_RULE("daemon-closes-inherited-fds") && !close_inherited_descriptors()) {
    IVLOG_ERROR("cannot close the descriptors ivcudad was started with (close_range, /proc/self/fd): %s",
                std::strerror(errno));
    return 2;
  }
  Options o;
  if (const auto done = parse_command_line(argc, argv, &o)) return *done;
  if (o.print_allowlist) {
    for (const auto& s : sandbox::allowlist()) std::printf("%s\t%s\t%s\n", s.name, sandbox::rule_name(s.rule), s.why);
    return 0;
  }
  (void)sandbox::parse_mode(o.sandbox_mode, &o.sandbox.mode);  // checked by CLI11
  set_log_level(o.log_level);
  raise_fd_limit();
#if defined(IVCUDA_MUTANTS)
  if (*rules::removed() != '\0')
    IVLOG_WARN("mutation build: rule(s) %s removed for this run (IVCUDA_MUTATE; tests/mutations)", rules::removed());
#endif
  if (!prepare_sandbox(o)) return 2;
  std::string err;
  std::vector<int> gpus = parse_gpus(o.gpus, &err);
  if (!err.empty()) {
    IVLOG_ERROR("%s", err.c_str());
    return 2;
  }
  const auto layout = plan(o);
  if (!layout) return 2;
  // Before any worker is forked: they inherit the file their turns are on.
  if (o.context_turns != "off" && !context_turns::open_for_workers(o.context_turns == "on"))
    IVLOG_WARN("--context-turns %s: no memory file for the turns (%s); workers make contexts as they come",
               o.context_turns.c_str(), std::strerror(errno));
  // --mps: one MPS control daemon for every worker (the daemon asks it for
  // each worker's environment: Daemon::driver_env).
  std::optional<MpsControl> mps;
  if (o.mps) {
    auto m = MpsControl::start_or_join(o.mps_cfg);
    if (!m) {
      IVLOG_ERROR("--mps: %s", m.error().what.c_str());
      return 1;
    }
    mps = std::move(*m);
  }
  if (!o.join.empty()) {
    install_signal_handlers(false);
    return run_join(o, gpus, new_generation(), driver_env(o, o.compute, o.mem_limit, gpus, count_gpus()));
  }
  Daemon daemon(std::move(o), argc, argv, std::move(gpus), *layout);
  return daemon.run();
}
