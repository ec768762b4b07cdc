// See launch.h.
#include "host-daemon/daemon/launch.h"

#include <grp.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "host-daemon/daemon/fd_broker.h"
#include "host-daemon/daemon/mps.h"
#include "host-daemon/daemon/plain_file.h"
#include "host-daemon/sandbox/sandbox.h"
#include "host-daemon/shared/log.h"
#include "host-daemon/shared/rules.h"

namespace ivcuda::host {

volatile sig_atomic_t g_stop = 0;
volatile sig_atomic_t g_reload = 0;
GuestWorker* g_worker = nullptr;

namespace {

void on_signal(int) {
  g_stop = 1;
  if (g_worker != nullptr) g_worker->stop();
}

void on_hangup(int) { g_reload = 1; }

}  // namespace

void install_signal_handlers(bool reload) {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  if (reload) {
    struct sigaction sh {};
    sh.sa_handler = on_hangup;
    ::sigaction(SIGHUP, &sh, nullptr);
  }
  ::signal(SIGPIPE, SIG_IGN);
}

std::vector<std::string> driver_env(const Options& o, unsigned compute, std::uint64_t mem_limit,
                                    const std::vector<int>& grant, int gpu_count) {
  if (!o.mps) return {};
  return mps_client_env(o.mps_cfg, compute, mem_limit == 0 ? 0 : mem_limit + o.mps_headroom, grant, gpu_count);
}

WorkerConfig worker_config(const Options& o, const GuestSetup& g) {
  WorkerConfig cfg;
  cfg.guest_id = static_cast<std::uint32_t>(g.id);
  cfg.shm_fd = g.shm_fd;
  cfg.layout = *g.layout;
  cfg.generation = g.generation;
  if (g.fds != nullptr) {
    for (auto& fd : g.fds->host_fds) cfg.host_fds.push_back(fd.get());
    for (auto& fd : g.fds->guest_fds) cfg.guest_fds.push_back(fd.get());
    cfg.conn_fd = g.fds->conn.valid() ? g.fds->conn.get() : -1;
  }
  cfg.driver_path = o.driver;
  cfg.nvml_path = o.nvml == "none" ? std::string() : o.nvml;
  cfg.devices = *g.gpus;
  cfg.mem_limit = g.mem_limit;
  cfg.context_reserve = o.context_reserve;
  cfg.pin_arena_at_start = o.pin_arena == "at-start";
  cfg.limits = o.limits;
  cfg.stats = g.stats;
  cfg.driver_env = g.driver_env;
  cfg.spin = std::chrono::microseconds(o.spin_us);
  cfg.broker_fd = g.broker_fd;
  return cfg;
}

// Each worker is a process of its own, so one record of what was applied per
// process is enough.
void add_sandbox_steps(const Options& o, SupervisorConfig& sc) {
  static sandbox::Applied applied;
  const sandbox::Config* cfg = &o.sandbox;
  sc.before_start = [cfg](const WorkerConfig& wc) {
    return sandbox::before_driver(*cfg, {wc.driver_path, wc.nvml_path}, &applied);
  };
  sc.after_start = [cfg](GuestWorker&) -> Result<void> {
    IVCUDA_TRY(sandbox::after_driver(*cfg, &applied));
    sandbox::self_test_if_asked(applied);
    return {};
  };
}

SupervisorConfig supervisor_config(const Options& o, const GuestSetup& g) {
  SupervisorConfig sc;
  sc.worker = worker_config(o, g);
  sc.peer_pid = g.peer_pid;
  sc.spares = o.vm_spares;
  sc.max_workers = o.max_workers_per_guest;
  sc.budget = g.budget;
  sc.uid_limit = o.max_guests_per_uid;
  sc.running = &g_worker;
  sc.recycle = o.recycle != "off";
  sc.keep_contexts = o.recycle == "keep";
  add_sandbox_steps(o, sc);
  return sc;
}

int run_connection(const Options& o, const GuestSetup& g) {
  // Die with the daemon: a worker must not outlive the process that manages it.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  return run_supervisor(supervisor_config(o, g), &g_stop);
}

int run_warm_entry(const Options& o, const GuestSetup& g, int handoff_fd) {
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  return run_warm_supervisor(supervisor_config(o, g), handoff_fd, &g_stop);
}

pid_t spawn_plain_guest(const Options& o, GuestSetup g, const std::string& path, FdBroker& broker,
                        const std::function<void()>& forget_in_child) {
  // Made here, exclusively, or one an ivcudad made before (plain_file.h).
  gid_t group = static_cast<gid_t>(-1);
  if (!o.socket_group.empty()) {
    const struct group* gr = ::getgrnam(o.socket_group.c_str());
    if (gr == nullptr) {
      IVLOG_ERROR("--socket-group %s: no such group", o.socket_group.c_str());
      return -1;
    }
    group = gr->gr_gid;
  }
  auto plain = open_plain_file(path, o.shm_size, group);
  if (!plain) {
    IVLOG_ERROR("ivshmem-plain file %s; not serving it", plain.error().what.c_str());
    return -1;
  }
  IVLOG_INFO("ivshmem-plain file %s: %s", path.c_str(),
             plain->created ? "made (O_EXCL)" : "an ivcudad's earlier file, served again");
  sys::UniqueFd fd = std::move(plain->fd);
  // QEMU opens this file too: format it as memory others hold.
  if (auto f = format_shared(fd.get(), *g.layout, g.generation, 0, 1, 0); !f) {
    IVLOG_ERROR("ivshmem-plain file %s: %s; not serving it", path.c_str(), f.error().what.c_str());
    return -1;
  }
  // Nobody rings these: ivshmem-plain has no interrupts.
  ivshmem::GuestConnection bells;
  auto host_efd = sys::make_eventfd(true);
  auto guest_efd = sys::make_eventfd(true);
  if (!host_efd || !guest_efd) return -1;
  bells.host_fds.push_back(std::move(*host_efd));
  bells.guest_fds.push_back(std::move(*guest_efd));
  // The file's guest is a tenant of its own; its processes' workers share
  // through the broker.
  auto broker_end = broker.add_worker(static_cast<std::uint32_t>(g.id), Tenancy::own());
  const pid_t pid = ::fork();
  if (pid != 0) {
    if (pid > 0)
      IVLOG_INFO("ivshmem-plain guest %lld on %s; worker pid %d", static_cast<long long>(g.id), path.c_str(),
                 static_cast<int>(pid));
    return pid;
  }
  forget_in_child();
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  g.shm_fd = fd.get();
  g.fds = &bells;
  g.broker_fd = broker_end ? broker_end->release() : -1;
  SupervisorConfig sc = supervisor_config(o, g);
  sc.worker.poll_only = true;
  sc.worker.poll_interval = std::chrono::microseconds(o.poll_us);
  ::_exit(run_supervisor(std::move(sc), &g_stop));
}

std::uint64_t new_generation() {
  std::uint64_t g = 0;
  if (::getrandom(&g, sizeof g, 0) != sizeof g) g = static_cast<std::uint64_t>(::time(nullptr)) ^ ::getpid();
  return g | 1;  // never zero
}

namespace {

// Maps the memory and writes a fresh layout: whatever a previous daemon or
// guest left there is not trusted. Only in a child of format_shared's.
bool format_in_place(int fd, const ring::Layout& layout, std::uint64_t generation, std::uint32_t host_peer,
                     std::uint32_t vectors, std::uint64_t features) {
  auto map = sys::Mapping::map_shared(fd, layout.shm_size);
  if (!map) return false;
  std::memset(map->data(), 0, layout.rings_off + layout.channel_stride * layout.channels);
  return ring::format_bar(map->data(), layout, generation, host_peer, vectors, features).ok();
}

}  // namespace

// Clears and formats memory that others hold too: an ivshmem-plain file that
// QEMU opens, or the memory of an ivshmem-server whose peers all have its fd.
// Such memory can shrink under a mapping, and touching a page past its new
// end (or one its file system has no room for) raises SIGBUS. So the size is
// checked first, and a short-lived child does the touching: a fault costs
// that child, never the daemon that serves every guest. Returns false
// (logged) if the memory is not served.
Result<void> format_shared(int fd, const ring::Layout& layout, std::uint64_t generation,
                                   std::uint32_t host_peer, std::uint32_t vectors, std::uint64_t features) {
  IVCUDA_TRY_ASSIGN(const std::uint64_t size, sys::file_size(fd));
  if (IVCUDA_RULE("shared-memory-size") && size < layout.shm_size)
    return make_error(EINVAL, "the shared memory has " + std::to_string(size) +
                                          " bytes, the layout needs " + std::to_string(layout.shm_size));
  if (!IVCUDA_RULE("format-in-child"))  // the mutant: the daemon touches the memory itself
    return format_in_place(fd, layout, generation, host_peer, vectors, features)
               ? Result<void>{}
               : make_error(EIO, "cannot map the shared memory to format it");
  const pid_t pid = ::fork();
  if (pid < 0) return make_error(errno, std::string("fork: ") + std::strerror(errno));
  if (pid == 0) ::_exit(format_in_place(fd, layout, generation, host_peer, vectors, features) ? 0 : 4);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status))
    return make_error(EFAULT, "formatting the shared memory died of signal " +
                                          std::to_string(WTERMSIG(status)) + " (it shrank meanwhile?)");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return make_error(EIO, "cannot map the shared memory to format it");
  return {};
}


}  // namespace ivcuda::host
