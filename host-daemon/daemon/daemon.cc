// See daemon.h: the set-up, the loop and the stop.
#include "host-daemon/daemon/daemon.h"

#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef IVCUDA_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "host-daemon/daemon/launch.h"
#include "host-daemon/daemon/mps.h"
#include "host-daemon/shared/log.h"

namespace ivcuda::host {

Daemon::Daemon(Options o, int argc, char** argv, std::vector<int> gpus, ring::Layout layout)
    : o_(std::move(o)),
      argc_(argc),
      argv_(argv),
      gpus_(std::move(gpus)),
      layout_(layout),
      generation_(new_generation()),
      gpu_count_(count_gpus()),
      broker_(FdBroker::Limits{.entries_per_tenant = o_.share_slots, .entries_per_guest = o_.share_slots_guest}) {}

Daemon::~Daemon() = default;

int Daemon::run() {
  if (const int rc = open_listeners(); rc != 0) return rc;
  install_signal_handlers(true);
  IVLOG_INFO("listening on %s (%zu vectors, %llu MiB per guest, driver %s, generation %016llx)", o_.socket.c_str(),
             o_.vectors, static_cast<unsigned long long>(o_.shm_size >> 20), o_.driver.c_str(),
             static_cast<unsigned long long>(generation_));
  pools_.resize(listeners_.size());
  warm_backoff_.assign(listeners_.size(), {clk::time_point{}, std::chrono::seconds(1)});
  arrivals_.resize(listeners_.size());
  returned_.assign(listeners_.size(), clk::time_point{});
  waiting_.resize(listeners_.size());
  over_limit_.resize(listeners_.size());
  huge_short_.assign(listeners_.size(), false);
  budget_ = WorkerBudget::create(o_.max_guests + static_cast<std::uint32_t>(o_.plain_files.size()) + 1);
  if (!budget_) {
    IVLOG_ERROR("cannot map the books of workers per uid: %s", std::strerror(errno));
    return 1;
  }
  if (const int rc = open_operator_side(); rc != 0) return rc;
  if (const int rc = start_plain_guests(); rc != 0) return rc;
#ifdef IVCUDA_HAVE_SYSTEMD
  // Under systemd (Type=notify): ready once every socket accepts guests.
  (void)sd_notifyf(0, "READY=1\nSTATUS=serving on %zu socket(s)", listeners_.size());
#endif
  while (g_stop == 0) {
    reap();
    if (g_reload != 0) {
      g_reload = 0;
      reload_on_signal();
    }
    if (warm_stale_) drop_stale_warm();
    fill_pools();
    tend_guests();
    serve_once();
  }
  stop_all();
  return 0;
}

std::vector<std::string> Daemon::driver_env(unsigned compute, std::uint64_t mem_limit,
                                            const std::vector<int>& grant) const {
  return ivcuda::host::driver_env(o_, compute, mem_limit, grant, gpu_count_);
}

bool Daemon::add_listener(const std::string& path, std::vector<int> grant, std::uint64_t mem_limit,
                          unsigned compute, unsigned warm, bool huge) {
  auto server = ivshmem::IvshmemServer::listen(path, o_.vectors);
  if (!server) {
    IVLOG_ERROR("cannot listen on %s: %s", path.c_str(), server.error().what.c_str());
    return false;
  }
  // Who may connect: the listening socket's group and mode (QEMU runs as
  // its own user; a systemd unit's UMask keeps the socket closed until then).
  if (!o_.socket_group.empty() || !o_.socket_mode.empty()) {
    gid_t gid = static_cast<gid_t>(-1);
    if (!o_.socket_group.empty()) {
      const group* g = ::getgrnam(o_.socket_group.c_str());
      if (g == nullptr) {
        IVLOG_ERROR("--socket-group %s: no such group", o_.socket_group.c_str());
        return false;
      }
      gid = g->gr_gid;
    }
    const mode_t mode = o_.socket_mode.empty() ? 0660 : static_cast<mode_t>(std::stoul(o_.socket_mode, nullptr, 8));
    if (::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0 || ::chmod(path.c_str(), mode) != 0) {
      IVLOG_ERROR("%s: cannot set its group and mode: %s", path.c_str(), std::strerror(errno));
      return false;
    }
  }
  listeners_.push_back(Listener{path, std::move(grant), mem_limit, std::move(*server), compute, warm, huge});
  return true;
}

int Daemon::open_listeners() {
  if (!add_listener(o_.socket, gpus_, o_.mem_limit, o_.compute, o_.warm_workers, o_.huge_pages == "on")) return 1;
  for (const auto& spec : o_.guest_sockets) {
    SocketSpec ss;
    std::string gerr;
    if (!parse_socket_spec(spec, o_.mem_limit, o_.compute, o_.warm_workers, o_.huge_pages == "on", &ss, &gerr)) {
      IVLOG_ERROR("--guest-socket %s: %s; expected SOCKET=GPUS[:mem-limit=SIZE][:compute=PCT][:warm=N][:huge-pages=on|off], "
                  "e.g. /run/ivcuda/vm2.sock=1:mem-limit=20G:compute=50",
                  spec.c_str(), gerr.c_str());
      return 2;
    }
    if (ss.compute != 100 && !o_.mps)
      IVLOG_WARN("--guest-socket %s: compute=%u takes --mps; without it guests time-slice the whole GPU", spec.c_str(),
                 ss.compute);
    if (!add_listener(ss.path, ss.gpus, ss.mem_limit, ss.compute, ss.warm, ss.huge)) return 1;
    std::string grant;
    for (const int g : ss.gpus) grant += (grant.empty() ? "" : ",") + std::to_string(g);
    const std::string quota = ss.mem_limit == 0 ? "no limit" : std::to_string(ss.mem_limit >> 20) + " MiB per guest";
    IVLOG_INFO("listening on %s for guests granted GPU(s) %s, device memory: %s", ss.path.c_str(),
               grant.empty() ? "all" : grant.c_str(), quota.c_str());
  }
  return 0;
}

int Daemon::open_operator_side() {
  if (!o_.control_socket.empty() && o_.control_socket != "none") {
    auto c = ControlServer::listen(o_.control_socket, o_.control_group);
    if (c) {
      control_ = std::move(*c);
      IVLOG_INFO("control socket %s (ivcudactl)", o_.control_socket.c_str());
    } else if (o_.control_socket_given) {
      IVLOG_ERROR("control socket: %s", c.error().what.c_str());
      return 1;
    } else {
      // The default place (/run/ivcuda, which the service unit makes) is not
      // there, or another daemon has it: serve without; --control-socket says where.
      IVLOG_WARN("no control socket (ivcudactl will not reach this daemon): %s; --control-socket PATH sets one",
                 c.error().what.c_str());
    }
  }
  if (!o_.metrics_listen.empty()) {
    auto m = MetricsServer::start(o_.metrics_listen, [this] { return prometheus_text(snapshot()); });
    if (!m) {
      IVLOG_ERROR("%s", m.error().what.c_str());
      return m.error().code == ENOTSUP ? 2 : 1;
    }
    metrics_ = std::move(*m);
    IVLOG_INFO("metrics at http://%s/metrics (port %d)", o_.metrics_listen.c_str(), metrics_->port());
  }
  return 0;
}

// ivshmem-plain guests: a memory file each, formatted here, served by a
// worker that polls. Their ids start above every peer id.
int Daemon::start_plain_guests() {
  for (std::size_t i = 0; i < o_.plain_files.size(); ++i) {
    const std::int64_t id = 0x10000 + static_cast<std::int64_t>(i);
    auto board = new_board(o_.mem_limit);
    if (!board) {
      IVLOG_ERROR("ivshmem-plain file %s: no status board: %s", o_.plain_files[i].c_str(), std::strerror(errno));
      return 1;
    }
    GuestBoard* mine = board.get();
    GuestSetup g;
    g.gpus = &gpus_;
    g.mem_limit = o_.mem_limit;
    g.layout = &layout_;
    g.generation = generation_;
    g.id = id;
    g.stats = &board->stats();
    g.driver_env = driver_env(o_.compute, o_.mem_limit, gpus_);
    g.budget = budget_.get();
    const pid_t pid = spawn_plain_guest(o_, g, o_.plain_files[i], broker_, [&] { forget_in_child(mine); });
    if (pid < 0) return 1;
    budget_->admit(::getuid(), 0).bind(pid);  // the operator's: counted, never refused
    Served s;
    s.id = id;
    s.uid = ::getuid();
    s.socket = o_.plain_files[i];
    s.gpus = gpus_;
    s.compute = o_.mps ? o_.compute : 0;
    s.board = std::move(board);
    workers_[pid] = std::move(s);
  }
  return 0;
}

// Reaps workers: a guest that went away, or a worker that failed.
void Daemon::reap() {
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    if (warm_let_go_.erase(pid) != 0) continue;
    if (checkpointers_let_go_.erase(pid) != 0) continue;  // suspend.cc
    if (checkpointer_ && pid == checkpointer_->pid()) {
      IVLOG_WARN("checkpointer (pid %d) ended (status %d)", static_cast<int>(pid), status);
      checkpointer_->reaped();
      checkpointer_gone();
      continue;
    }
    if (reap_warm(pid, status)) continue;
    budget_->release(pid);
    auto it = workers_.find(pid);
    const long long id = it == workers_.end() ? -1 : it->second.id;
    if (WIFSIGNALED(status))
      IVLOG_WARN("worker for guest %lld died of signal %d; its GPU resources are freed", id, WTERMSIG(status));
    else
      IVLOG_INFO("worker for guest %lld ended (status %d)", id, WEXITSTATUS(status));
    if (it != workers_.end() && it->second.susp.phase != Phase::kNone)
      IVLOG_INFO("guest %lld ended while %s; its worker's memory went with it", id,
                 suspension_state(it->second));
    if (it != workers_.end()) {
      // What it shared is gone with it, also what a worker that crashed
      // could not withdraw itself (fd_broker.h).
      broker_.end_guest(static_cast<std::uint32_t>(id));
      if (it->second.conn && it->second.conn->valid()) ::shutdown(it->second.conn->get(), SHUT_RDWR);
      workers_.erase(it);
    }
  }
}

// Rates over about a second, and evictions that do not finish.
void Daemon::tend_guests() {
  const auto now = clk::now();
  for (auto& [pid, w] : workers_) {
    const GuestStats& b = w.board->stats();
    if (const double dt = std::chrono::duration<double>(now - w.sample_at).count(); dt >= 1.0) {
      const std::uint64_t calls = b.calls.load(std::memory_order_relaxed);
      const std::uint64_t bytes = b.copy_bytes.load(std::memory_order_relaxed);
      w.calls_per_s = static_cast<double>(calls - w.sample_calls) / dt;
      w.bytes_per_s = static_cast<double>(bytes - w.sample_bytes) / dt;
      w.sample_calls = calls;
      w.sample_bytes = bytes;
      w.sample_at = now;
    }
    // Evicted while suspended: a locked or checkpointed worker can make no
    // driver call to release anything; its process ends, which releases all.
    if (w.evict_deadline != clk::time_point{} && w.susp.phase != Phase::kNone) {
      std::string pids;
      for (const auto& t : w.susp.targets) {
        // A VM's targets are acted on only while still its supervisor's children.
        if (!w.susp.may_act_on(t.pid)) continue;
        ::kill(t.pid, SIGKILL);
        pids += (pids.empty() ? "" : ", ") + std::to_string(t.pid);
      }
      if (w.susp.supervisor != 0)
        IVLOG_WARN("guest %lld: evicted while %s: its workers (pid %s) and its supervisor are killed",
                   static_cast<long long>(w.id), suspension_state(w), pids.empty() ? "none left" : pids.c_str());
      else
        IVLOG_WARN("guest %lld: evicted while %s: its worker (pid %s) is killed", static_cast<long long>(w.id),
                   suspension_state(w), pids.c_str());
      ::kill(pid, SIGKILL);
      w.evict_deadline = {};
      continue;
    }
    if (w.evict_deadline == clk::time_point{}) continue;
    if (b.evicted.load(std::memory_order_acquire) != 0 && b.mem_used.load(std::memory_order_relaxed) == 0) {
      IVLOG_INFO("guest %lld: evicted; it holds nothing on the GPU", static_cast<long long>(w.id));
      w.evict_deadline = {};
    } else if (now > w.evict_deadline) {
      IVLOG_WARN("guest %lld: its workers did not release within 5 s of the eviction; killing them",
                 static_cast<long long>(w.id));
      ::kill(pid, SIGKILL);
      w.evict_deadline = {};
    }
  }
  tend_suspensions();
}

struct Daemon::PollSet {
  std::vector<pollfd> fds;
  std::size_t control_at = 0, broker_at = 0, served_at = 0, warm_at = 0;
  int checkpointer_at = -1;
  std::vector<pid_t> served;  // whose handoff line is at served_at + i
  std::vector<Warm*> warm;    // whose handoff line is at warm_at + i
};

// One poll of everything the daemon listens to, then what it found: the
// control socket, the metrics, the broker's lines, the warm entries' lines,
// then new guests.
void Daemon::serve_once() {
  PollSet p;
  for (const auto& l : listeners_) p.fds.push_back(pollfd{l.server.listen_fd(), POLLIN, 0});
  p.control_at = p.fds.size();
  if (control_) p.fds.push_back(pollfd{control_->fd(), POLLIN, 0});
  if (metrics_) p.fds.push_back(pollfd{metrics_->fd(), POLLIN, 0});
  if (checkpointer_ && checkpoint_busy_) {
    p.checkpointer_at = static_cast<int>(p.fds.size());
    p.fds.push_back(pollfd{checkpointer_->fd(), POLLIN, 0});
  }
  p.broker_at = p.fds.size();
  for (const int fd : broker_.fds()) p.fds.push_back(pollfd{fd, POLLIN, 0});
  p.served_at = p.fds.size();
  for (auto& [pid, w] : workers_)
    if (w.handoff.valid()) {
      p.fds.push_back(pollfd{w.handoff.get(), POLLIN, 0});
      p.served.push_back(pid);
    }
  p.warm_at = p.fds.size();
  for (auto& pool : pools_)
    for (Warm& e : pool)
      if (e.handoff.valid()) {
        p.fds.push_back(pollfd{e.handoff.get(), POLLIN, 0});
        p.warm.push_back(&e);
      }
  const int ready = ::poll(p.fds.data(), p.fds.size(), 200);
  if (metrics_) metrics_->run();  // also times out idle scrapers
  if (ready <= 0) {
    serve_waiting();  // those waiting longer than kWaitForReady
    return;
  }
  if (control_ && (p.fds[p.control_at].revents & POLLIN) != 0) serve_control();
  if (p.checkpointer_at >= 0 && p.fds[static_cast<std::size_t>(p.checkpointer_at)].revents != 0) serve_checkpointer();
  for (std::size_t i = p.broker_at; i < p.served_at; ++i)
    if ((p.fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) broker_.serve(p.fds[i].fd);
  // A served warm entry's line: its worker ended cleanly ('C'), or the
  // entry's process is ending (it is reaped then).
  std::vector<pid_t> to_recycle;
  for (std::size_t i = p.served_at; i < p.warm_at; ++i)
    if (p.fds[i].revents != 0) read_served_line(p.served[i - p.served_at], &to_recycle);
  // A warm entry's line: its worker is ready, or the entry is ending (it is
  // reaped then); before any accept below moves entries around.
  for (std::size_t i = p.warm_at; i < p.fds.size(); ++i)
    if (p.fds[i].revents != 0) read_warm_line(*p.warm[i - p.warm_at]);
  for (const pid_t pid : to_recycle) recycle_served(pid);
  serve_waiting();
  for (std::size_t li = 0; li < listeners_.size(); ++li)
    if ((p.fds[li].revents & POLLIN) != 0) accept_guest(li);
  // The parent keeps nothing of the guest's: when the worker ends, the
  // guest's connection closes with it.
}

void Daemon::stop_all() {
  IVLOG_INFO("stopping: %zu worker(s)", workers_.size());
#ifdef IVCUDA_HAVE_SYSTEMD
  (void)sd_notify(0, "STOPPING=1");
#endif
  for (auto& pool : pools_)
    for (Warm& e : pool) {
      ::kill(e.pid, SIGTERM);
      ::waitpid(e.pid, nullptr, 0);
    }
  for (auto& [pid, w] : workers_) ::kill(pid, SIGTERM);
  for (auto& [pid, w] : workers_) {
    ::waitpid(pid, nullptr, 0);
    // As when a worker is reaped: a dead worker's io_uring may keep the
    // connection open for a while, and the guest must learn now that its
    // host is gone.
    if (w.conn && w.conn->valid()) ::shutdown(w.conn->get(), SHUT_RDWR);
  }
  if (control_) ::unlink(control_->path().c_str());
}

}  // namespace ivcuda::host
