// See daemon.h: a guest's arrival - admission, its memory, its process.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "host-daemon/daemon/daemon.h"
#include "host-daemon/daemon/launch.h"
#include "host-daemon/shared/log.h"
#include "host-daemon/shared/rules.h"

namespace ivcuda::host {
namespace {
// Whether a guest not greeted yet has hung up (it waits no longer).
bool hung_up(int conn) {
  pollfd p{conn, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}
}  // namespace

std::int64_t Daemon::next_guest_id() {
  for (std::int64_t tries = 0; tries < ivshmem::kMaxPeerId; ++tries) {
    last_id_ = last_id_ >= ivshmem::kMaxPeerId ? 1 : last_id_ + 1;
    const auto taken = [&](const auto& w) { return w.second.id == last_id_; };
    const auto warm_taken = [&](const std::vector<Warm>& p) {
      return std::any_of(p.begin(), p.end(), [&](const Warm& e) { return e.id == last_id_; });
    };
    if (std::none_of(workers_.begin(), workers_.end(), taken) && std::none_of(pools_.begin(), pools_.end(), warm_taken))
      break;
  }
  return last_id_;
}

// What a forked guest process must not keep of the daemon's: the other
// listeners, the operator's sockets, other guests' connections and boards.
void Daemon::forget_in_child(const GuestBoard* mine) {
  for (const auto& other : listeners_) ::close(other.server.listen_fd());
  broker_.close_in_child();
  if (control_) control_->close_in_child();
  if (metrics_) metrics_->close_in_child();
  for (auto& [other_pid, other] : workers_) {
    if (other.conn) other.conn->reset();  // other guests' connections are not this one's
    other.handoff.reset();
    if (other.board.get() != mine) other.board->unmap_in_child();
  }
  for (auto& q : waiting_)
    for (Waiting& w : q) w.pending.conn.reset();  // guests waiting for a worker are not this one's
  for (auto& q : over_limit_)
    for (OverLimit& w : q) w.pending.conn.reset();  // nor those waiting for their user's turn
  // Nor the memory, doorbells or boards of guests to come.
  for (auto& pool : pools_)
    for (Warm& e : pool) {
      e.handoff.reset();
      e.shm.reset();
      e.bells = {};
      e.board->unmap_in_child();
    }
}

std::unique_ptr<GuestBoard> Daemon::new_board(std::uint64_t mem_limit) {
  auto b = GuestBoard::create();
  if (b) b->stats().mem_limit.store(mem_limit, std::memory_order_relaxed);
  return b;
}

// A guest's own memory, formatted: nobody else can map it. On 2 MiB pages
// when the socket asks and the host's pool has them (mapping it here takes
// them from the pool, or fails), else on 4 KiB pages.
std::optional<sys::UniqueFd> Daemon::guest_memory(std::int64_t id, std::size_t li) {
  std::uint64_t features = abi::kFeatDoorbell | abi::kFeatArenaRegistered;
  std::optional<sys::UniqueFd> shm;
  std::optional<sys::Mapping> map;
  if (listeners_[li].huge) {
    auto h = sys::make_huge_memfd("ivcuda-guest", o_.shm_size);
    auto m = h ? sys::Mapping::map_shared(h->get(), o_.shm_size)
               : Result<sys::Mapping>(make_error(h.error().code, h.error().what));
    if (m) {
      shm = std::move(*h);
      map = std::move(*m);
      features |= abi::kFeatHugePages;
      IVLOG_INFO("guest %lld: its memory is on 2 MiB huge pages", static_cast<long long>(id));
      if (huge_short_[li]) IVLOG_INFO("%s: guests' memory is on huge pages again", listeners_[li].path.c_str());
      huge_short_[li] = false;
    } else if (!huge_short_[li]) {
      huge_short_[li] = true;
      IVLOG_WARN("%s: no %llu MiB of 2 MiB huge pages for guest %lld (%s; vm.nr_hugepages reserves them): "
                 "4 KiB pages until there are",
                 listeners_[li].path.c_str(), static_cast<unsigned long long>(o_.shm_size >> 20),
                 static_cast<long long>(id), m.error().what.c_str());
    }
  }
  if (!shm) {
    auto s = sys::make_memfd("ivcuda-guest", o_.shm_size);
    if (!s) {
      IVLOG_ERROR("guest %lld: %s", static_cast<long long>(id), s.error().what.c_str());
      return std::nullopt;
    }
    auto m = sys::Mapping::map_shared(s->get(), o_.shm_size);
    if (!m) {
      IVLOG_ERROR("guest %lld: %s", static_cast<long long>(id), m.error().what.c_str());
      return std::nullopt;
    }
    shm = std::move(*s);
    map = std::move(*m);
  }
  (void)ring::format_bar(map->data(), layout_, generation_, static_cast<std::uint32_t>(ivshmem::kHostPeerId),
                         static_cast<std::uint32_t>(o_.vectors), features);
  return std::move(*shm);
}

// A connection on listener li: admitted under the limits, greeted with its
// memory and doorbells, and handed to a warm entry's process or to a process
// forked for it.
void Daemon::accept_guest(std::size_t li) {
  Listener& l = listeners_[li];
  auto pending = l.server.accept(0);
  if (!pending) {
    if (pending.error().code != ETIMEDOUT && pending.error().code != EINTR)
      IVLOG_WARN("accept on %s: %s", l.path.c_str(), pending.error().what.c_str());
    return;
  }
  if (gpu_drained(l.gpus)) {
    IVLOG_WARN("refusing a guest on %s: its GPU is drained (ivcudactl undrain brings it back)", l.path.c_str());
    ++refused_;
    return;
  }
  if (workers_.size() + waiting_count() >= o_.max_guests) {
    IVLOG_WARN("refusing a guest: %u guests already served", o_.max_guests);
    ++refused_;
    return;  // closing the connection tells the peer
  }
  // Every guest pins --shm-size of RAM before it proves anything: one
  // local user must not take all of it.
  ucred cred{};
  socklen_t cred_len = sizeof cred;
  if (::getsockopt(pending->conn.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) {
    IVLOG_WARN("refusing a guest on %s: SO_PEERCRED: %s", l.path.c_str(), std::strerror(errno));
    return;
  }
  auto unit = budget_->admit(cred.uid, IVCUDA_RULE("guests-per-uid") ? o_.max_guests_per_uid : 0);
  if (!unit) {
    // Its user's guests may end soon: it waits for one (kOverLimitWait), unless
    // as many of the user's wait already.
    const unsigned cap = o_.max_guests_per_uid != 0 ? o_.max_guests_per_uid : o_.max_guests;
    if (over_limit_count(cred.uid) < cap) {
      IVLOG_INFO("a guest of uid %u (pid %d) waits: its guests and their workers count %u already "
                 "(--max-guests-per-uid %u); it is served when one ends, or turned away in %lld s",
                 static_cast<unsigned>(cred.uid), static_cast<int>(cred.pid), budget_->used(cred.uid),
                 o_.max_guests_per_uid, static_cast<long long>(kOverLimitWait.count()));
      over_limit_[li].push_back(OverLimit{std::move(*pending), cred.uid, cred.pid, clk::now()});
      return;
    }
    IVLOG_WARN("refusing a guest of uid %u (pid %d): its guests and their workers count %u already "
               "(--max-guests-per-uid %u), and %zu more wait",
               static_cast<unsigned>(cred.uid), static_cast<int>(cred.pid), budget_->used(cred.uid),
               o_.max_guests_per_uid, over_limit_count(cred.uid));
    ++refused_;
    return;
  }
  place_guest(li, std::move(*pending), cred.uid, cred.pid, std::move(unit), clk::now());
}

void Daemon::place_guest(std::size_t li, ivshmem::PendingGuest pending, uid_t uid, pid_t pid,
                         WorkerBudget::Ticket unit, clk::time_point arrived) {
  Listener& l = listeners_[li];
  // The pool's arrival times stay in order (warm_policy.h): one that waited
  // for its user's turn counts when it is placed, not when it came.
  arrivals_[li].push_back(clk::now());
  // No ready entry for it (or others waiting before it): it waits for the
  // first one that becomes ready (warm_policy.h, kWaitForReady).
  if (o_.recycle != "off" && o_.wait_for_ready == "on" && l.warm > 0 &&
      (!waiting_[li].empty() || !pick_ready(pool_views(li), uid))) {
    IVLOG_INFO("a guest of uid %u (pid %d) on %s waits for the first worker ready for it",
               static_cast<unsigned>(uid), static_cast<int>(pid), l.path.c_str());
    waiting_[li].push_back(Waiting{std::move(pending), uid, pid, std::move(unit), arrived});
    start_for_waiting(li);
    return;
  }
  // A warm entry when one is there (a ready one first); else all of it now.
  std::optional<Warm> warm = take_warm(li, uid, pending.conn.get());
  serve_guest(li, std::move(pending), uid, pid, std::move(unit), std::move(warm), arrived);
}

std::size_t Daemon::over_limit_count(uid_t uid) const {
  std::size_t n = 0;
  for (const auto& q : over_limit_)
    n += static_cast<std::size_t>(std::count_if(q.begin(), q.end(), [&](const OverLimit& w) { return w.uid == uid; }));
  return n;
}

void Daemon::admit_over_limit() {
  for (std::size_t li = 0; li < over_limit_.size(); ++li) {
    auto& q = over_limit_[li];
    for (auto it = q.begin(); it != q.end();) {
      if (hung_up(it->pending.conn.get())) {
        IVLOG_INFO("a guest of uid %u (pid %d) left while it waited for its user's turn",
                   static_cast<unsigned>(it->uid), static_cast<int>(it->pid));
        it = q.erase(it);
        continue;
      }
      auto unit = budget_->admit(it->uid, IVCUDA_RULE("guests-per-uid") ? o_.max_guests_per_uid : 0);
      const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(clk::now() - it->since);
      if (!unit) {
        if (clk::now() - it->since < kOverLimitWait) {
          ++it;
          continue;
        }
        IVLOG_WARN("refusing a guest of uid %u (pid %d): none of its user's %u guests ended in %lld ms "
                   "(--max-guests-per-uid %u)",
                   static_cast<unsigned>(it->uid), static_cast<int>(it->pid), budget_->used(it->uid),
                   static_cast<long long>(waited.count()), o_.max_guests_per_uid);
        ++refused_;
        it = q.erase(it);  // closing the connection tells the peer
        continue;
      }
      IVLOG_INFO("a guest of uid %u (pid %d) is admitted after waiting %lld ms for its user's turn",
                 static_cast<unsigned>(it->uid), static_cast<int>(it->pid), static_cast<long long>(waited.count()));
      OverLimit w = std::move(*it);
      it = q.erase(it);
      place_guest(li, std::move(w.pending), w.uid, w.pid, std::move(unit), w.since);
    }
  }
}

std::size_t Daemon::waiting_count() const {
  std::size_t n = 0;
  for (const auto& q : waiting_) n += q.size();
  return n;
}

void Daemon::serve_waiting() {
  admit_over_limit();
  for (std::size_t li = 0; li < waiting_.size(); ++li) {
    auto& q = waiting_[li];
    for (auto it = q.begin(); it != q.end();) {
      if (hung_up(it->pending.conn.get())) {
        IVLOG_INFO("a guest of uid %u (pid %d) on %s left before a worker was ready for it",
                   static_cast<unsigned>(it->uid), static_cast<int>(it->pid), listeners_[li].path.c_str());
        it = q.erase(it);  // its unit of the per-uid budget goes back with its ticket
        continue;
      }
      // A ready entry now (take_warm takes a ready one first), or any once it has waited long enough.
      if (!pick_ready(pool_views(li), it->uid) && clk::now() - it->since < kWaitForReady) {
        ++it;
        continue;
      }
      Waiting w = std::move(*it);
      it = q.erase(it);
      std::optional<Warm> warm = take_warm(li, w.uid, w.pending.conn.get());
      serve_guest(li, std::move(w.pending), w.uid, w.pid, std::move(w.unit), std::move(warm), w.since);
    }
  }
}

void Daemon::serve_guest(std::size_t li, ivshmem::PendingGuest pending, uid_t uid, pid_t peer_pid,
                         WorkerBudget::Ticket unit, std::optional<Warm> warm, clk::time_point arrived) {
  Listener& l = listeners_[li];
  pending.peer_id = warm ? warm->id : next_guest_id();
  const long long id = pending.peer_id;
  std::optional<sys::UniqueFd> shm;
  if (warm) shm = std::move(warm->shm);
  else shm = guest_memory(id, li);
  if (!shm) return;
  auto board = warm ? std::move(warm->board) : new_board(l.mem_limit);
  if (!board) {
    IVLOG_ERROR("guest %lld: no status board: %s", id, std::strerror(errno));
    return;
  }
  auto conn = warm ? l.server.greet(std::move(pending), shm->get(), std::move(warm->bells))
                   : l.server.greet(std::move(pending), shm->get());
  if (!conn) {
    IVLOG_WARN("guest %lld: greeting failed: %s", id, conn.error().what.c_str());
    if (warm) let_go_warm(*warm);
    return;
  }
  pid_t pid = -1;
  // Its tenant: its user on this socket, or (a VM) its connection (fd_broker.h).
  const auto tenancy = Tenancy::user(static_cast<std::uint32_t>(li), uid);
  if (warm) {
    // The entry's process takes the guest from here (vm_supervisor.h);
    // its line shares from now on, as this guest's.
    broker_.admit(static_cast<std::uint32_t>(id), tenancy);
    if (auto st = ivshmem::send_msg(warm->handoff.get(), peer_pid, conn->conn.get()); !st) {
      IVLOG_ERROR("guest %lld: cannot hand it to its warm worker: %s", id, st.error().what.c_str());
      ::kill(warm->pid, SIGKILL);
      let_go_warm(*warm);
      return;
    }
    pid = warm->pid;
  } else {
    auto broker_end = broker_.add_worker(static_cast<std::uint32_t>(id), tenancy);
    if (!broker_end)
      IVLOG_WARN("guest %lld: no fd broker (%s): it can import only its own exports", id,
                 broker_end.error().what.c_str());
    pid = ::fork();
    if (pid < 0) {
      IVLOG_ERROR("guest %lld: fork: %s", id, std::strerror(errno));
      broker_.end_guest(static_cast<std::uint32_t>(id));
      return;
    }
    if (pid == 0) {
      forget_in_child(board.get());
      GuestSetup g;
      g.gpus = &l.gpus;
      g.mem_limit = l.mem_limit;
      g.layout = &layout_;
      g.generation = generation_;
      g.id = id;
      g.shm_fd = shm->get();
      g.fds = &*conn;
      g.broker_fd = broker_end ? broker_end->release() : -1;
      g.peer_pid = peer_pid;
      g.stats = &board->stats();
      g.driver_env = driver_env(l.compute, l.mem_limit, l.gpus);
      g.budget = budget_.get();
      ::_exit(run_connection(o_, g));
    }
  }
  unit.bind(pid);
  Served s;
  s.id = id;
  s.uid = uid;
  s.peer_pid = peer_pid;
  s.socket = l.path;
  s.gpus = l.gpus;
  s.compute = o_.mps ? l.compute : 0;
  s.listener = li;
  s.conn = std::make_shared<sys::UniqueFd>(::fcntl(conn->conn.get(), F_DUPFD_CLOEXEC, 0));
  s.board = std::move(board);
  if (warm) {
    s.handoff = std::move(warm->handoff);
    s.by_warm = true;
    s.worker_pid = warm->worker_pid;
  }
  workers_[pid] = std::move(s);
  // A warm entry's process names its worker once it hands the guest over
  // ("guest N: worker pid W", vm_supervisor.cc).
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(clk::now() - arrived).count();
  if (warm)
    IVLOG_INFO("guest %lld (uid %u) connected on %s; a warm entry (%s), its process pid %d; waited %lld ms", id,
               static_cast<unsigned>(uid), l.path.c_str(), warm->ready ? "ready" : "still starting",
               static_cast<int>(pid), static_cast<long long>(waited));
  else
    IVLOG_INFO("guest %lld (uid %u) connected on %s; worker pid %d", id, static_cast<unsigned>(uid),
               l.path.c_str(), static_cast<int>(pid));
  // The next warm entry starts at the top of the loop, once this guest's
  // memory and connection are out of scope here: a fork now would hand
  // them to it.
}

}  // namespace ivcuda::host
