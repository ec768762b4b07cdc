// See daemon.h: workers started ahead of their guests (docs/design.md, "Warm
// workers"), and workers that come back recycled for their user's next guest
// ("Recycled workers"). What to keep and whom to give is warm_policy.h's.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "host-daemon/daemon/daemon.h"
#include "host-daemon/daemon/launch.h"
#include "host-daemon/daemon/warm_policy.h"
#include "host-daemon/shared/log.h"

namespace ivcuda::host {

std::vector<WarmView> Daemon::pool_views(std::size_t li) const {
  std::vector<WarmView> v;
  for (const Warm& e : pools_[li]) v.push_back(WarmView{e.handoff.valid(), e.ready, e.tenant_uid});
  return v;
}

// Waiting guests each need an entry on its way (warm_policy.h coming_for);
// one for each that has none starts now (a fork: every waiting guest's
// connection is closed in the child, forget_in_child).
void Daemon::start_for_waiting(std::size_t li) {
  std::vector<uid_t> uids;
  for (const Waiting& w : waiting_[li]) uids.push_back(w.uid);
  std::size_t coming = coming_for(pool_views(li), uids);
  while (coming < uids.size() && start_warm(li)) ++coming;
}

// Starts one warm entry for listener li (its process starts its worker).
// `not_theirs`: a descriptor of the daemon's that the entry's process must
// not keep (a connection accepted and not yet handed over), or -1.
bool Daemon::start_warm(std::size_t li, int not_theirs) {
  Listener& l = listeners_[li];
  Warm e;
  e.listener = li;
  e.id = next_guest_id();
  auto shm = guest_memory(e.id, li);
  if (!shm) return false;
  auto bells = ivshmem::make_doorbells(o_.vectors);
  e.board = new_board(l.mem_limit);
  int sv[2];
  if (!bells || !e.board || ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    IVLOG_ERROR("a warm worker for %s: %s", l.path.c_str(), !bells ? bells.error().what.c_str() : std::strerror(errno));
    return false;
  }
  sys::UniqueFd ours(sv[0]), theirs(sv[1]);
  // Its guest's user is not known yet: the line shares nothing until the
  // guest is handed over (accept_guest).
  auto broker_end = broker_.add_worker(static_cast<std::uint32_t>(e.id), Tenancy::pending());
  if (!broker_end)
    IVLOG_WARN("a warm worker for %s: no fd broker (%s): its guest can import only its own exports", l.path.c_str(),
               broker_end.error().what.c_str());
  const pid_t pid = ::fork();
  if (pid < 0) {
    IVLOG_ERROR("a warm worker for %s: fork: %s", l.path.c_str(), std::strerror(errno));
    broker_.end_guest(static_cast<std::uint32_t>(e.id));
    return false;
  }
  if (pid == 0) {
    ours.reset();
    forget_in_child(e.board.get());
    if (not_theirs >= 0) ::close(not_theirs);
    GuestSetup g;
    g.gpus = &l.gpus;
    g.mem_limit = l.mem_limit;
    g.layout = &layout_;
    g.generation = generation_;
    g.id = e.id;
    g.shm_fd = shm->get();
    g.fds = &*bells;
    g.broker_fd = broker_end ? broker_end->release() : -1;
    g.stats = &e.board->stats();
    g.driver_env = driver_env(l.compute, l.mem_limit, l.gpus);
    g.budget = budget_.get();
    ::_exit(run_warm_entry(o_, g, theirs.get()));
  }
  e.pid = pid;
  e.handoff = std::move(ours);
  e.shm = std::move(*shm);
  e.bells = std::move(*bells);
  IVLOG_DEBUG("warm worker for %s (guest number %lld to be): pid %d", l.path.c_str(), static_cast<long long>(e.id),
              static_cast<int>(pid));
  pools_[li].push_back(std::move(e));
  return true;
}

// Lets a warm entry go: it sees its line close and ends.
void Daemon::let_go_warm(Warm& e) {
  e.handoff.reset();
  warm_let_go_.insert(e.pid);
  broker_.end_guest(static_cast<std::uint32_t>(e.id));
}

// Each socket's pool: its --warm-workers, and while guests arrive faster
// than a worker starts (0.3-0.5 s from nothing on an H200, more when many
// start at once) one more per guest beyond the first of the last 2 s, up to
// --warm-burst more, so that a loop of short programs or a job array finds
// workers made (issue 30). The extra ones go after 30 s without a guest
// (warm_policy.h: none arriving, none coming back).
void Daemon::fill_pools() {
  const auto now = clk::now();
  for (std::size_t li = 0; li < listeners_.size(); ++li) {
    const std::size_t warm = listeners_[li].warm;
    auto& pool = pools_[li];
    if (gpu_drained(listeners_[li].gpus)) {  // ivcudactl drain: no context stays on it
      for (Warm& e : pool)
        if (e.handoff.valid()) let_go_warm(e);
      continue;
    }
    // Recycled workers (one user's) stand in for the extra ones, and so do
    // workers serving a guest now that may come back recycled.
    const std::size_t recycled = static_cast<std::size_t>(
        std::count_if(pool.begin(), pool.end(), [](const Warm& e) { return e.tenant_uid.has_value(); }));
    const std::size_t serving = static_cast<std::size_t>(std::count_if(workers_.begin(), workers_.end(), [&](const auto& w) {
      return w.second.listener == li && w.second.handoff.valid();
    }));
    const PoolTarget target = pool_target(arrivals_[li], returned_[li], now, warm, o_.warm_burst, recycled, serving);
    auto& [until, wait] = warm_backoff_[li];
    while (pool.size() - recycled < target.fresh && now >= until) {
      if (start_warm(li)) continue;
      until = now + wait;
      wait = std::min<std::chrono::seconds>(wait * 2, std::chrono::seconds(60));
    }
    if (target.idle) {
      // The recycled ones first, then the newest extra.
      for (auto it = pool.begin(); it != pool.end();) {
        if (!it->tenant_uid) {
          ++it;
          continue;
        }
        let_go_warm(*it);
        it = pool.erase(it);
      }
      while (pool.size() > warm) {
        let_go_warm(pool.back());
        pool.pop_back();
      }
    }
  }
}

// The entry a guest of `uid` arriving on listener li takes, out of the pool.
// None: with recycling, the guest's worker starts as a warm entry made now
// (it waits for it as for a worker made for it), so that it too can serve
// the user's next guest.
std::optional<Daemon::Warm> Daemon::take_warm(std::size_t li, uid_t uid, int not_theirs) {
  auto& pool = pools_[li];
  std::optional<std::size_t> pick = pick_entry(pool_views(li), uid);
  if (!pick && o_.recycle != "off" && listeners_[li].warm > 0 && start_warm(li, not_theirs)) pick = pool.size() - 1;
  if (!pick) return std::nullopt;
  std::optional<Warm> warm = std::move(pool[*pick]);
  pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(*pick));
  return warm;
}

// A warm entry's guest ended cleanly and its worker reset its contexts
// (vm_supervisor.h, 'C'): the entry goes back to its socket's pool for the
// same user's next guest, with new memory and doorbells (the last guest
// may still hold its own), or, when the pool is full or the settings
// changed, lets go and is reaped as any worker.
void Daemon::recycle_served(pid_t pid) {
  auto it = workers_.find(pid);
  if (it == workers_.end()) return;
  Served& s = it->second;
  const std::size_t li = s.listener;
  bool room = li < listeners_.size() && !warm_stale_ && listeners_[li].warm > 0;
  if (room && pools_[li].size() >= listeners_[li].warm + o_.warm_burst) {
    // Full: a worker that has just served is worth more than an extra one
    // made from nothing or than the one recycled longest ago.
    auto& pool = pools_[li];
    const std::optional<std::size_t> victim = make_room(pool_views(li), listeners_[li].warm);
    room = victim.has_value();
    if (room) {
      let_go_warm(pool[*victim]);
      pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(*victim));
    }
  }
  std::optional<sys::UniqueFd> shm;
  Result<ivshmem::GuestConnection> bells = make_error(ENOSPC, "the pool is full");
  if (room) {
    shm = guest_memory(s.id, li);
    if (shm) bells = ivshmem::make_doorbells(o_.vectors);
  }
  bool sent = shm && bells;
  if (sent) {
    std::int64_t k = 0;
    sent = ivshmem::send_msg(s.handoff.get(), k++, shm->get()).ok();
    for (auto& fd : bells->host_fds) sent = sent && ivshmem::send_msg(s.handoff.get(), k++, fd.get()).ok();
    for (auto& fd : bells->guest_fds) sent = sent && ivshmem::send_msg(s.handoff.get(), k++, fd.get()).ok();
  }
  if (!sent) {
    IVLOG_INFO("guest %lld ended cleanly; its worker goes (%s)", static_cast<long long>(s.id),
               room ? "no memory or doorbells for another guest" : "its socket's pool is full");
    s.handoff.reset();  // the entry's process sees it close and ends
    return;
  }
  // Nothing of the guest's stays with the entry: what it shared is
  // withdrawn (its line and tenant stay), its unit of the per-uid budget
  // is back, its connection is closed, its board starts from nothing.
  budget_->release(pid);
  broker_.forget_shares(static_cast<std::uint32_t>(s.id));
  if (s.conn && s.conn->valid()) ::shutdown(s.conn->get(), SHUT_RDWR);
  s.board->stats().reset_for_next_guest();
  Warm e;
  e.pid = pid;
  e.listener = li;
  e.id = s.id;
  e.handoff = std::move(s.handoff);
  e.shm = std::move(*shm);
  e.bells = std::move(*bells);
  e.board = std::move(s.board);
  e.worker_pid = s.worker_pid;
  e.tenant_uid = s.uid;
  IVLOG_INFO("guest %lld ended cleanly; its worker (pid %d) is kept for the next guest of uid %u on %s",
             static_cast<long long>(s.id), static_cast<int>(e.worker_pid), static_cast<unsigned>(s.uid),
             listeners_[li].path.c_str());
  workers_.erase(it);
  pools_[li].push_back(std::move(e));
  returned_[li] = clk::now();
}

// A warm entry's process that ended: false when pid is none.
bool Daemon::reap_warm(pid_t pid, int status) {
  for (std::size_t li = 0; li < pools_.size(); ++li) {
    auto w = std::find_if(pools_[li].begin(), pools_[li].end(), [&](const Warm& e) { return e.pid == pid; });
    if (w == pools_[li].end()) continue;
    if (w->tenant_uid) {  // a recycled one: it served a guest; no back-off
      IVLOG_INFO("a recycled worker for %s ended (%s %d)", listeners_[li].path.c_str(),
                 WIFSIGNALED(status) ? "signal" : "status", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
      broker_.end_guest(static_cast<std::uint32_t>(w->id));
      pools_[li].erase(w);
      return true;
    }
    auto& [until, wait] = warm_backoff_[li];
    IVLOG_WARN("a warm worker for %s ended before a guest came (%s %d); the next one starts in %lld s",
               listeners_[li].path.c_str(), WIFSIGNALED(status) ? "signal" : "status",
               WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), static_cast<long long>(wait.count()));
    until = clk::now() + wait;
    wait = std::min<std::chrono::seconds>(wait * 2, std::chrono::seconds(60));
    broker_.end_guest(static_cast<std::uint32_t>(w->id));
    pools_[li].erase(w);
    return true;
  }
  return false;
}

// A served warm entry's line: its worker ended cleanly ('C'), or the entry's
// process is ending (it is reaped then). The message is one byte and a pid:
// all the daemon takes from it is whether the first byte says 'C'.
void Daemon::read_served_line(pid_t pid, std::vector<pid_t>* to_recycle) {
  Served& w = workers_[pid];
  char msg[1 + sizeof(std::int32_t)] = {};
  const ssize_t n = ::read(w.handoff.get(), msg, sizeof msg);
  if (n == static_cast<ssize_t>(sizeof msg) && msg[0] == 'C') {
    to_recycle->push_back(pid);
  } else if (n == static_cast<ssize_t>(sizeof msg) && msg[0] == 'R') {
    // Its worker was still starting when the guest came: now it is known.
    std::int32_t wpid = 0;
    std::memcpy(&wpid, msg + 1, sizeof wpid);
    if (wpid > 0) w.worker_pid = wpid;
    IVLOG_INFO("guest %lld: worker pid %d is ready", static_cast<long long>(w.id), static_cast<int>(wpid));
  } else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) w.handoff.reset();
}

// A warm entry's line: its worker is ready ('R' and its pid), or the entry
// is ending (it is reaped then).
void Daemon::read_warm_line(Warm& e) {
  char msg[1 + sizeof(std::int32_t)] = {};
  const ssize_t n = ::read(e.handoff.get(), msg, sizeof msg);
  if (n == static_cast<ssize_t>(sizeof msg) && msg[0] == 'R') {
    std::int32_t wpid = 0;
    std::memcpy(&wpid, msg + 1, sizeof wpid);
    e.worker_pid = wpid;
    e.ready = true;
    if (e.tenant_uid)  // a recycled worker, reset for its user's next guest: from now it is offered
      IVLOG_INFO("worker pid %d is ready for the next guest of uid %u", static_cast<int>(wpid),
                 static_cast<unsigned>(*e.tenant_uid));
    warm_backoff_[e.listener].second = std::chrono::seconds(1);  // it works again
  } else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
    e.handoff.reset();  // ending: no guest goes to it
  }
}

// A reload changed what the entries were started with: they go, and new ones
// start with the new settings.
void Daemon::drop_stale_warm() {
  warm_stale_ = false;
  for (auto& pool : pools_) {
    for (Warm& e : pool) let_go_warm(e);
    pool.clear();
  }
  // Nor does a worker started with the old settings come back recycled:
  // its entry's process finds the line closed and ends with its guest.
  for (auto& [pid, w] : workers_) w.handoff.reset();
}

}  // namespace ivcuda::host
