#include "host-daemon/daemon/vm_supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <optional>

#include "host-daemon/shared/broker_client.h"
#include "host-daemon/shared/from_worker.h"
#include "host-daemon/shared/log.h"
#include "host-daemon/shared/rules.h"
#include "ring/ivshmem.h"
#include "ring/spsc_ring.h"
#include "ring/sys.h"

namespace ivcuda::host {

// ------------------------------------------------------------------ supervisor

namespace {

using clock = std::chrono::steady_clock;

// Worker starts per connection: a burst, then one every kStartEvery. A
// start loads the driver, makes a context on each GPU and registers the
// arena (a second or more on a real GPU); without a bound, forged exit
// notices made a supervisor start and kill workers as fast as it could fork.
constexpr std::uint32_t kStartBurst = 8;
constexpr auto kStartEvery = std::chrono::milliseconds(500);
// A worker asked to let its exited process go (--recycle-workers) answers
// between two records; one that has not within this is inside a call (a long
// kernel, a module load) and is killed, so that nothing the dead process
// queued runs on (rule death-stops-work).
constexpr auto kRecycleAnswer = std::chrono::milliseconds(50);
// Spares beyond --vm-spare-workers (workers recycled after a burst) stay
// while the VM starts processes, and go once it has started none for this
// long, as process mode's recycled workers do (warm_policy.h, kBurstIdle).
constexpr auto kSpareLinger = std::chrono::seconds(30);

// Whether a claim is process `served`'s: the same pid in the same PID
// namespace (a claim that does not say its namespace is a process of the
// namespace "not said").
bool same_process(const GuestProcess& claim, const GuestProcess& served) {
  if (!IVCUDA_RULE("vm-process-pidns")) return claim.pid == served.pid;
  return claim == served;
}

// Whether an exit notice is for process `served`. A notice from a guest
// kernel driver of ABI minor <= 3, or a process whose library did not say
// its namespace, matches by pid alone, as before namespaces were told apart.
bool notice_for(const GuestProcess& notice, const GuestProcess& served) {
  if (notice.pid != served.pid) return false;
  if (!IVCUDA_RULE("vm-process-pidns")) return true;
  return notice.pidns == served.pidns || notice.pidns == 0 || served.pidns == 0;
}

void drain_eventfd(int fd) {
  std::uint64_t v;
  while (fd >= 0 && ::read(fd, &v, sizeof v) == static_cast<ssize_t>(sizeof v)) {
  }
}

void kick_fd(int fd) {
  const std::uint64_t one = 1;
  if (fd >= 0) (void)!::write(fd, &one, sizeof one);
}

class Supervisor {
 public:
  Supervisor(SupervisorConfig cfg, volatile sig_atomic_t* stop) : cfg_(std::move(cfg)), l_(cfg_.worker.layout), stop_(stop) {
    if (cfg_.worker.broker_fd >= 0) broker_ = BrokerClient(std::exchange(cfg_.worker.broker_fd, -1));
  }

  int run();

  // The worker a warm entry started ahead (run_warm_supervisor): its pid and
  // our end of the line that hands it the guest's connection.
  struct WarmChild {
    pid_t pid = 0;
    sys::UniqueFd line;
  };
  void adopt_warm(WarmChild w) { warm_ = std::move(w); }
  // After run(): the worker started ahead, when its guest ended cleanly and
  // it asks for the tenant's next guest (GuestWorker::kRecycled).
  std::optional<WarmChild> take_recycled() { return std::exchange(recycled_, std::nullopt); }

 private:
  struct WorkerProc {
    pid_t pid = 0;
    GuestProcess guest;    // whom it serves ({}: a spare); VmShared's slot is a copy for the worker
    sys::UniqueFd kick;    // eventfd the worker sleeps on; we write it
    sys::UniqueFd life;    // write end of a pipe: the worker sees it hang up when we go
    bool reclaim_guest = false;  // its process exited: free the process's channels too
    bool recycling = false;      // ... and it was asked to let the process go (check_recycles)
    bool going = false;          // a spare let go (keep_spares): never given a process
    bool was_recycled = false;   // a spare that served a process before (for the log)
    clock::time_point killed{};  // when its process's exit was seen
    // Its process's start, for the log: when the process's first channel was
    // claimed, and what served it; logged once the worker serves (note_waits).
    clock::time_point claimed{};
    const char* found = nullptr;
  };
  // What becomes of a claim: served by a worker, tried again on a later
  // pass (no start token yet, or a fork that failed), or refused for good.
  enum class Placed { kServed, kLater, kRefused };
  enum class Start { kOk, kLater, kFull };

  int serve_in_process();
  int serve_by_warm();
  void dismiss_warm();
  bool wait_for_first_channel(std::uint32_t* first);
  bool become_vm();
  void stop_all();  // the warm worker and the VM's workers
  void stop_workers();
  void loop();
  void wait_for_events();
  void reap();
  void finish_slot(std::uint32_t s, int status);
  void read_exit_notices();
  void process_exited(const GuestProcess& who);
  void check_recycles();
  void recycled(std::uint32_t s);
  void note_waits();
  // Takes slot s's channels from its worker; `then(c)` says what becomes of
  // each. Returns how many there were.
  template <class F>
  unsigned take_channels(std::uint32_t s, F then) {
    unsigned n = 0;
    for (std::uint32_t c = 0; c < owner_.size(); ++c) {
      if (owner_[c] != s + 1) continue;
      ++n;
      owner_[c] = 0;
      vm_->owner(c).store(0);
      then(c);
    }
    return n;
  }
  void sync_owners();
  GuestProcess claimant(std::uint32_t c);
  void scan_channels();
  void refuse(std::uint32_t c, std::uint64_t claim, const GuestProcess& who);
  void relay_doorbells();
  void keep_spares();
  Placed place(const GuestProcess& who, clock::time_point claimed, std::uint32_t* slot);
  Start may_start();
  std::uint32_t process_workers() const;
  std::uint32_t dying() const;
  bool take_unit();
  void give_units();
  bool start_worker(std::uint32_t s, const GuestProcess& who);
  void free_guest_channel(std::uint32_t c);
  void bump_version() { vm_->version().fetch_add(1, std::memory_order_acq_rel); }
  // ivcudactl suspend holds the VM (the daemon sets its board's flag).
  bool suspended() const {
    return cfg_.worker.stats != nullptr && cfg_.worker.stats->suspend.load(std::memory_order_acquire) != 0;
  }
  // The VM's device-memory quota (0: none), as `ivcudactl reload` left it.
  std::uint64_t quota() const {
    return cfg_.worker.stats != nullptr ? cfg_.worker.stats->mem_limit.load(std::memory_order_relaxed)
                                        : cfg_.worker.mem_limit;
  }
  // Whether an exited process's worker may stay as a spare: a spare's context
  // is charged to the VM's quota (--context-reserve), so under one only up to
  // --vm-spare-workers (the VM's processes see the quota's room as natively,
  // where an ended process's context is gone); otherwise extras stay until
  // kSpareLinger.
  bool may_keep_spare() const {
    return quota() == 0 || cfg_.worker.context_reserve == 0 || spares() < cfg_.spares;
  }
  // A worker with no process that may take one.
  static bool is_spare(const WorkerProc& p) { return p.pid > 0 && p.guest.pid == 0 && !p.going; }
  std::uint32_t spares() const {
    return static_cast<std::uint32_t>(std::count_if(procs_.begin(), procs_.end(), is_spare));
  }
  abi::Superblock* sb() { return ring::superblock(bar_.data()); }
  std::uint32_t guest_id() const { return cfg_.worker.guest_id; }

  SupervisorConfig cfg_;
  ring::Layout l_;
  volatile sig_atomic_t* stop_;
  BrokerClient broker_;
  sys::Mapping bar_;
  VmShared* vm_ = nullptr;
  sys::UniqueFd notify_;
  std::vector<WorkerProc> procs_ = std::vector<WorkerProc>(VmShared::kMaxSlots);
  // Per channel, the supervisor's own: which slot + 1 serves it (0: none),
  // and the claim it was last given out or refused for (a channel a worker
  // released is not given out again until it is claimed anew).
  std::vector<std::uint32_t> owner_;
  std::vector<std::uint64_t> bound_claim_;
  // Per channel, the claim not yet served and when it was first seen (its
  // process's wait for a worker starts there: note_waits).
  std::vector<std::uint64_t> seen_claim_;
  std::vector<clock::time_point> seen_at_;
  std::uint32_t extra_units_ = 0;  // taken from the per-uid budget (worker_budget.h)
  std::uint32_t tokens_ = kStartBurst;
  clock::time_point tokens_at_ = clock::now();
  std::uint64_t refusals_ = 0;
  const char* refused_why_ = "";
  std::uint32_t exit_seen_ = 0;
  bool hung_up_ = false;
  clock::time_point spares_paused_until_{};
  clock::time_point last_process_ = clock::now();  // when a process last got a worker
  std::optional<WarmChild> warm_;
  std::optional<WarmChild> recycled_;
  std::vector<GuestProcess> held_back_;  // processes told to wait for the resume (logged once each)
};

// Waits for child `pid` to end and returns its exit status as a process's
// (128 + signal when killed). A stop request is passed on to it as SIGTERM.
int wait_child(pid_t pid, volatile sig_atomic_t* stop) {
  bool passed_on = false;
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, 0) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (errno != EINTR) return 2;
    if (*stop != 0 && !passed_on) {
      ::kill(pid, SIGTERM);
      passed_on = true;
    }
  }
}

int Supervisor::run() {
  auto size = sys::file_size(cfg_.worker.shm_fd);
  if (!size || *size < l_.shm_size) {
    IVLOG_ERROR("guest %u: the shared memory is smaller than the layout", guest_id());
    return 2;
  }
  auto m = sys::Mapping::map_shared(cfg_.worker.shm_fd, l_.shm_size);
  if (!m) {
    IVLOG_ERROR("guest %u: %s", guest_id(), m.error().what.c_str());
    return 2;
  }
  bar_ = std::move(*m);
  exit_seen_ = ring::load_acquire(sb()->exit_count);
  std::uint32_t first = 0;
  if (!wait_for_first_channel(&first)) {
    stop_all();
    return 0;
  }
  const auto owner = ring::load_relaxed(ring::channel_desc(bar_.data(), l_, first)->guest_owner);
  if (cfg_.peer_pid > 0 && static_cast<pid_t>(owner >> 32) == cfg_.peer_pid) {
    // A workers started for a VM that turned out to be one process: they go.
    for (auto& p : procs_)
      if (p.pid > 0) ::kill(p.pid, SIGKILL);
    stop_workers();
    return warm_ ? serve_by_warm() : serve_in_process();
  }
  dismiss_warm();
  if (!become_vm()) return 2;
  loop();
  if (hung_up_ && IVCUDA_RULE("death-stops-work")) {
    // The VM is gone (QEMU ended or was killed): its processes' work stops
    // now, as a process's does when it ends (issue 30), rather than after
    // each worker has served out what it had been posted.
    for (auto& p : procs_)
      if (p.pid > 0) ::kill(p.pid, SIGKILL);
  }
  stop_all();
  return 0;
}

bool Supervisor::become_vm() {
  if (vm_ != nullptr) return true;
  vm_ = VmShared::create(l_);
  auto efd = sys::make_eventfd(true);
  if (vm_ == nullptr || !efd) {
    IVLOG_ERROR("guest %u: cannot set up the per-process workers: %s", guest_id(), std::strerror(errno));
    return false;
  }
  notify_ = std::move(*efd);
  owner_.assign(l_.channels, 0);
  bound_claim_.assign(l_.channels, 0);
  seen_claim_.assign(l_.channels, 0);
  seen_at_.assign(l_.channels, clock::time_point{});
  if (GuestStats* b = cfg_.worker.stats)
    b->mode.store(static_cast<std::uint32_t>(cfg_.worker.poll_only ? GuestMode::kPlain : GuestMode::kVm),
                  std::memory_order_relaxed);
  IVLOG_INFO("guest %u: a VM; one worker per guest process (%u kept ready, at most %u at once)", guest_id(),
             cfg_.spares, cfg_.max_workers);
  return true;
}

// The VM went away (or we stop): every worker goes with it.
void Supervisor::stop_all() {
  dismiss_warm();
  stop_workers();
}

void Supervisor::stop_workers() {
  for (auto& p : procs_)
    if (p.pid > 0) ::kill(p.pid, SIGTERM);
  for (std::uint32_t s = 0; s < procs_.size(); ++s)
    if (procs_[s].pid > 0) {
      int status = 0;
      while (::waitpid(procs_[s].pid, &status, 0) < 0 && errno == EINTR) {
      }
      finish_slot(s, status);
    }
}

// Process mode with a worker started ahead: it gets the guest's connection
// and serves; this process waits for it and ends with it.
int Supervisor::serve_by_warm() {
  bar_ = sys::Mapping{};
  if (GuestStats* b = cfg_.worker.stats) {
    b->mode.store(static_cast<std::uint32_t>(GuestMode::kProcess), std::memory_order_relaxed);
    b->processes.store(1, std::memory_order_relaxed);
  }
  WarmChild w = std::move(*warm_);
  warm_.reset();
  IVLOG_INFO("guest %u: worker pid %d (started ahead)", guest_id(), static_cast<int>(w.pid));
  if (auto st = ivshmem::send_msg(w.line.get(), cfg_.peer_pid, cfg_.worker.conn_fd); !st) {
    IVLOG_ERROR("guest %u: cannot hand the connection to its worker: %s", guest_id(), st.error().what.c_str());
    ::kill(w.pid, SIGKILL);
    (void)wait_child(w.pid, stop_);
    return 2;
  }
  // Until it ends, or says its guest ended with nothing under way ('C': it
  // reset its contexts and waits for the tenant's next guest).
  while (*stop_ == 0) {
    pollfd p{w.line.get(), POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    char c = 0;
    const ssize_t n = ::read(w.line.get(), &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n == 1 && c == 'C') {
      recycled_ = std::move(w);
      return 0;
    }
    if (n != 1) break;  // it ended
    // 'R': ready. If it became ready after its guest came, the daemon has not
    // heard its pid yet (it suspends that process, not this one).
    if (c == 'R' && cfg_.daemon_line >= 0) {
      char msg[1 + sizeof(std::int32_t)] = {'R'};
      const auto wpid = static_cast<std::int32_t>(w.pid);
      std::memcpy(msg + 1, &wpid, sizeof wpid);
      (void)!::write(cfg_.daemon_line, msg, sizeof msg);
    }
  }
  // A stop that came while we polled: wait_child passes on only one that
  // interrupts its own wait.
  if (*stop_ != 0) ::kill(w.pid, SIGTERM);
  return wait_child(w.pid, stop_);
}

// The worker started ahead is not needed (a VM, or we stop): it goes.
void Supervisor::dismiss_warm() {
  if (!warm_) return;
  // It holds nothing of a guest's: no need to let it wind down (it may be
  // in the middle of registering the arena).
  warm_->line.reset();
  ::kill(warm_->pid, SIGKILL);
  (void)wait_child(warm_->pid, stop_);
  warm_.reset();
}

// Process mode: the peer is the CUDA program itself, one process; its
// worker runs right here, on the connection's own doorbells.
int Supervisor::serve_in_process() {
  bar_ = sys::Mapping{};
  WorkerConfig wc = std::move(cfg_.worker);
  if (wc.stats != nullptr) {
    wc.stats->mode.store(static_cast<std::uint32_t>(GuestMode::kProcess), std::memory_order_relaxed);
    wc.stats->processes.store(1, std::memory_order_relaxed);
  }
  if (broker_.connected()) wc.broker_fd = broker_.release();
  // This process becomes the worker: the daemon's books are not a worker's.
  if (IVCUDA_RULE("worker-no-budget-books") && cfg_.budget != nullptr) cfg_.budget->unmap_in_child();
  if (cfg_.before_start)
    if (auto st = cfg_.before_start(wc); !st) {
      IVLOG_ERROR("guest %u: cannot sandbox the worker: %s", guest_id(), st.error().what.c_str());
      return 2;
    }
  auto w = ::ivcuda::host::start_worker(std::move(wc));
  if (!w) {
    IVLOG_ERROR("guest %u: cannot start: %s", guest_id(), w.error().what.c_str());
    return 2;
  }
  if (cfg_.after_start)
    if (auto st = cfg_.after_start(**w); !st) {
      IVLOG_ERROR("guest %u: cannot sandbox the worker: %s", guest_id(), st.error().what.c_str());
      return 2;
    }
  if (cfg_.running != nullptr) *cfg_.running = w->get();
  if (*stop_ != 0) (*w)->stop();  // a SIGTERM that came while we started
  const int rc = (*w)->run();
  if (cfg_.running != nullptr) *cfg_.running = nullptr;
  return rc;
}

// A CUDA program connecting in process mode claims a channel within
// milliseconds; a VM's connection waits for its first CUDA process. A
// connection still quiet after kVmAfter is taken for a VM, and its spare
// workers start, so that the VM's first process finds one ready.
bool Supervisor::wait_for_first_channel(std::uint32_t* first) {
  constexpr auto kVmAfter = std::chrono::milliseconds(500);
  const auto since = clock::now();
  while (*stop_ == 0) {
    if (vm_ == nullptr && clock::now() - since > kVmAfter) {
      dismiss_warm();  // the spares fork from this process: no driver may be loaded here
      if (become_vm()) keep_spares();
    }
    if (vm_ != nullptr) reap();
    for (std::uint32_t c = 0; c < l_.channels; ++c)
      if (ring::load_acquire(sb()->active_mask[c / 64]) >> (c % 64) & 1) {
        *first = c;
        return true;
      }
    wait_for_events();
    if (hung_up_) return false;
  }
  return false;
}

void Supervisor::wait_for_events() {
  pollfd p[3];
  nfds_t n = 0;
  const int bell = cfg_.worker.poll_only || cfg_.worker.host_fds.empty() ? -1 : cfg_.worker.host_fds[0];
  if (bell >= 0) p[n++] = pollfd{bell, POLLIN, 0};
  if (notify_.valid()) p[n++] = pollfd{notify_.get(), POLLIN, 0};
  const nfds_t conn_at = n;
  if (cfg_.worker.conn_fd >= 0) p[n++] = pollfd{cfg_.worker.conn_fd, POLLRDHUP, 0};
  // The guest cannot ring in ivshmem-plain: look every 5 ms there.
  const int timeout_ms = bell >= 0 ? 20 : 5;
  if (::poll(p, n, timeout_ms) > 0) {
    if (conn_at < n && (p[conn_at].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) hung_up_ = true;
  }
  drain_eventfd(bell);
  drain_eventfd(notify_.get());
  // A guest cannot see the daemon's socket; this tells it we live.
  ring::store_relaxed(sb()->host_heartbeat, ring::load_relaxed(sb()->host_heartbeat) + 1);
}

void Supervisor::loop() {
  while (*stop_ == 0 && !hung_up_) {
    reap();
    sync_owners();
    read_exit_notices();
    check_recycles();
    scan_channels();
    note_waits();
    relay_doorbells();
    keep_spares();
    if (GuestStats* b = cfg_.worker.stats) b->processes.store(process_workers(), std::memory_order_relaxed);
    wait_for_events();
  }
}

// ------------------------------------------------------------------ workers

bool Supervisor::start_worker(std::uint32_t s, const GuestProcess& who) {
  auto kick = sys::make_eventfd(true);
  int life[2];
  if (!kick || ::pipe2(life, O_CLOEXEC) != 0) {
    IVLOG_ERROR("guest %u: no worker for process %d: %s", guest_id(), who.pid, std::strerror(errno));
    return false;
  }
  sys::UniqueFd life_r(life[0]), life_w(life[1]);
  sys::UniqueFd line;
  if (broker_.connected()) {
    auto got = broker_.new_line();
    if (got) line = std::move(*got);
    else IVLOG_WARN("guest %u: no fd broker line (%s): process %d can import only its own exports", guest_id(),
                    got.error().what.c_str(), who.pid);
  }
  auto& slot = vm_->slot(s);
  slot.guest_pid.store(who.pid);
  slot.guest_pidns.store(who.pidns);
  slot.ready.store(0);
  slot.recycle.store(VmShared::kRecycleNone);
  const pid_t pid = ::fork();
  if (pid < 0) {
    IVLOG_ERROR("guest %u: fork: %s", guest_id(), std::strerror(errno));
    slot.guest_pid.store(0);
    slot.guest_pidns.store(0);
    return false;
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    // Nothing of the other workers', nor the VM's doorbells: the supervisor
    // passes those on. Nor the supervisor's own broker line, whose answers
    // (the other workers' new lines) are the supervisor's, nor the daemon's
    // books of workers per uid: this worker has the line made for it.
    for (auto& p : procs_) {
      p.kick.reset();
      p.life.reset();
    }
    life_w.reset();
    bar_ = sys::Mapping{};
    if (IVCUDA_RULE("vm-worker-own-broker-line")) broker_ = BrokerClient{};
    if (IVCUDA_RULE("worker-no-budget-books") && cfg_.budget != nullptr) cfg_.budget->unmap_in_child();
    WorkerConfig wc = cfg_.worker;
    for (const int fd : wc.host_fds) ::close(fd);
    if (wc.conn_fd >= 0) ::close(wc.conn_fd);  // the VM's socket is the supervisor's to watch
    wc.host_fds = {kick->get()};
    wc.conn_fd = life_r.get();
    wc.broker_fd = line.valid() ? line.release() : -1;
    wc.vm = vm_;
    wc.vm_slot = s;
    wc.vm_notify_fd = notify_.get();
    // Its process's end with nothing under way makes it the VM's spare
    // (check_recycles), its context kept where it can be scrubbed.
    wc.vm_recycle = cfg_.recycle;
    wc.keep_contexts = cfg_.recycle && cfg_.keep_contexts;
    const NextGuest same{wc.shm_fd, wc.host_fds, wc.guest_fds};
    if (cfg_.before_start)
      if (auto st = cfg_.before_start(wc); !st) {
        IVLOG_ERROR("guest %u: cannot sandbox a worker: %s", guest_id(), st.error().what.c_str());
        ::_exit(2);
      }
    auto w = ::ivcuda::host::start_worker(std::move(wc));
    if (!w) {
      IVLOG_ERROR("guest %u: a worker cannot start: %s", guest_id(), w.error().what.c_str());
      ::_exit(2);
    }
    if (cfg_.after_start)
      if (auto st = cfg_.after_start(**w); !st) {
        IVLOG_ERROR("guest %u: cannot sandbox a worker: %s", guest_id(), st.error().what.c_str());
        ::_exit(2);
      }
    std::unique_ptr<GuestWorker> worker = std::move(*w);
    for (;;) {
      if (cfg_.running != nullptr) *cfg_.running = worker.get();
      slot.ready.store(1);
      if (*stop_ != 0) worker->stop();
      const int rc = worker->run();
      if (cfg_.running != nullptr) *cfg_.running = nullptr;
      if (rc != GuestWorker::kRecycled) ::_exit(rc);
      // Its process exited with nothing under way: the process's objects go
      // (scrubbed or reset, as a recycled process-mode worker's), the same BAR
      // and doorbells stay, and it serves again once the supervisor has freed
      // the process's channels (VmShared::kRecycleNone).
      auto fresh = worker->successor(same);
      worker.reset();
      if (!fresh) {
        IVLOG_ERROR("guest %u: a worker cannot serve on after its process: %s", guest_id(),
                    fresh.error().what.c_str());
        ::_exit(2);
      }
      worker = std::move(*fresh);
      while (slot.recycle.load(std::memory_order_acquire) != VmShared::kRecycleNone) {
        pollfd gone{life_r.get(), POLLRDHUP, 0};
        if (*stop_ != 0 || ::poll(&gone, 1, 1) > 0) ::_exit(0);  // the supervisor went, or we stop
      }
      worker->attach_connection(life_r.get());
    }
  }
  slot.worker_pid.store(pid);
  procs_[s] = WorkerProc{pid, who, std::move(*kick), std::move(life_w), false, {}};
  if (who.pid != 0)
    IVLOG_INFO("guest %u: process %d (pid namespace %u) is served by worker pid %d", guest_id(), who.pid, who.pidns,
               static_cast<int>(pid));
  return true;
}

std::uint32_t Supervisor::dying() const {
  return static_cast<std::uint32_t>(
      std::count_if(procs_.begin(), procs_.end(), [](const WorkerProc& p) { return p.pid > 0 && p.reclaim_guest; }));
}

std::uint32_t Supervisor::process_workers() const {
  return static_cast<std::uint32_t>(
      std::count_if(procs_.begin(), procs_.end(), [](const WorkerProc& p) { return p.pid > 0 && p.guest.pid != 0; }));
}

// Whether another worker may start now: at most --max-workers-per-guest at
// once, spares included, and no faster than the start tokens come. A
// worker killed for its process's exit but not reaped yet still counts; the
// claim waits for it rather than be refused.
Supervisor::Start Supervisor::may_start() {
  const auto live = static_cast<std::uint32_t>(
      std::count_if(procs_.begin(), procs_.end(), [](const WorkerProc& p) { return p.pid > 0; }));
  if (live >= VmShared::kMaxSlots) return Start::kFull;
  if (IVCUDA_RULE("vm-workers-per-guest") && live >= cfg_.max_workers)
    return live - dying() >= cfg_.max_workers ? Start::kFull : Start::kLater;
  const auto now = clock::now();
  if (tokens_ >= kStartBurst) {
    tokens_at_ = now;
  } else if (const auto n = (now - tokens_at_) / kStartEvery; n > 0) {
    tokens_ = static_cast<std::uint32_t>(std::min<std::int64_t>(kStartBurst, tokens_ + n));
    tokens_at_ += n * kStartEvery;
  }
  if (!IVCUDA_RULE("vm-worker-start-rate")) return Start::kOk;
  if (tokens_ == 0) return Start::kLater;
  --tokens_;
  return Start::kOk;
}

// A VM's first worker that serves a process is the connection's own unit
// of its uid's budget, which the daemon took when it admitted the
// connection; every further one takes a unit (worker_budget.h).
bool Supervisor::take_unit() {
  if (process_workers() == 0 || cfg_.budget == nullptr || cfg_.uid_limit == 0) return true;
  if (!IVCUDA_RULE("vm-workers-uid-budget")) return true;
  if (!cfg_.budget->take(cfg_.uid_limit)) return false;
  ++extra_units_;
  return true;
}

// After a worker that served a process is gone: back to one unit per
// process beyond the first.
void Supervisor::give_units() {
  const std::uint32_t p = process_workers();
  while (extra_units_ > (p > 0 ? p - 1 : 0)) {
    cfg_.budget->give();
    --extra_units_;
  }
}

// The worker for process `who`: its own, a spare, or a new one.
Supervisor::Placed Supervisor::place(const GuestProcess& who, clock::time_point claimed, std::uint32_t* slot) {
  for (std::uint32_t s = 0; s < procs_.size(); ++s)
    if (procs_[s].pid > 0 && !procs_[s].reclaim_guest && same_process(who, procs_[s].guest)) {
      *slot = s;
      return Placed::kServed;
    }
  // While the VM is suspended its workers are locked or checkpointed, and
  // a new one would take the GPU the suspension gave back: a new process
  // waits for the resume (its channel's claim is tried again each pass).
  if (suspended()) {
    if (std::find(held_back_.begin(), held_back_.end(), who) == held_back_.end()) {
      held_back_.push_back(who);
      IVLOG_INFO("guest %u: process %d (pid namespace %u) waits for the VM's resume for a worker", guest_id(),
                 who.pid, who.pidns);
    }
    return Placed::kLater;
  }
  held_back_.clear();
  std::uint32_t spare = VmShared::kMaxSlots, free = VmShared::kMaxSlots;
  for (std::uint32_t s = 0; s < procs_.size(); ++s) {
    if (is_spare(procs_[s]) && spare == VmShared::kMaxSlots) spare = s;
    if (procs_[s].pid == 0 && free == VmShared::kMaxSlots) free = s;
  }
  if (spare == VmShared::kMaxSlots) {
    // A worker letting an exited process go is a spare within kRecycleAnswer
    // (or killed then): cheaper to wait for than a new one.
    if (std::any_of(procs_.begin(), procs_.end(), [](const WorkerProc& p) { return p.pid > 0 && p.recycling; }))
      return Placed::kLater;
    refused_why_ = "the VM has all the workers it may have (--max-workers-per-guest)";
    if (free == VmShared::kMaxSlots) return Placed::kRefused;
    switch (may_start()) {
      case Start::kFull: return Placed::kRefused;
      case Start::kLater: return Placed::kLater;
      case Start::kOk: break;
    }
  }
  refused_why_ = "its user id has all the workers it may have (--max-guests-per-uid)";
  if (!take_unit()) return dying() != 0 ? Placed::kLater : Placed::kRefused;  // a unit comes back with it
  last_process_ = clock::now();
  if (spare != VmShared::kMaxSlots) {
    // A worker started ahead (or recycled) takes the process.
    WorkerProc& p = procs_[spare];
    p.guest = who;
    p.claimed = claimed;
    p.found = p.was_recycled ? "a recycled spare" : "a spare started ahead";
    p.was_recycled = false;
    vm_->slot(spare).guest_pid.store(who.pid);
    vm_->slot(spare).guest_pidns.store(who.pidns);
    IVLOG_INFO("guest %u: process %d (pid namespace %u) is served by worker pid %d", guest_id(), who.pid, who.pidns,
               static_cast<int>(p.pid));
    *slot = spare;
    return Placed::kServed;
  }
  if (!start_worker(free, who)) {
    give_units();
    return Placed::kLater;
  }
  procs_[free].claimed = claimed;
  procs_[free].found = "a worker started for it";
  *slot = free;
  return Placed::kServed;
}

void Supervisor::keep_spares() {
  if (clock::now() < spares_paused_until_ || suspended()) return;
  std::uint32_t have = spares();
  if (have > cfg_.spares && clock::now() - last_process_ >= kSpareLinger) {
    // The VM has started no process for a while: recycled spares beyond the
    // ones asked for go, with the GPU memory their contexts hold.
    for (WorkerProc& p : procs_) {
      if (have <= cfg_.spares) break;
      if (p.pid <= 0 || p.guest.pid != 0 || p.going) continue;
      p.going = true;
      ::kill(p.pid, SIGTERM);
      --have;
    }
  }
  for (std::uint32_t s = 0; s < procs_.size() && have < cfg_.spares; ++s) {
    if (procs_[s].pid != 0) continue;
    if (may_start() != Start::kOk) return;  // at the bound, or no token: processes come first
    if (start_worker(s, GuestProcess{})) ++have;
  }
}

void Supervisor::reap() {
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (std::uint32_t s = 0; s < procs_.size(); ++s)
      if (procs_[s].pid == pid) finish_slot(s, status);
  }
}

// A worker ended. If its process exited, the process's channels are freed
// for the VM's other processes; if the worker died under a live process,
// that process's channels report the loss and are not given out again until
// the process lets them go.
void Supervisor::finish_slot(std::uint32_t s, int status) {
  WorkerProc& p = procs_[s];
  auto& slot = vm_->slot(s);
  const GuestProcess guest = p.guest;
  const unsigned channels = take_channels(s, [&](std::uint32_t c) {
    if (p.reclaim_guest) free_guest_channel(c);
    else ring::store_release(ring::channel_desc(bar_.data(), l_, c)->host_lost, abi::kHostLostDied);
  });
  const std::uint64_t pinned = vm_->pool_held(s);
  vm_->retire_slot(s);  // what it held of the pool is free now
  // The worker's process is gone, and with it every byte of device memory it
  // held: what was charged for them returns to the VM's quota.
  const std::uint64_t charged = vm_->mem_release_all(s);
  if (cfg_.worker.stats != nullptr) cfg_.worker.stats->mem_used.fetch_sub(charged, std::memory_order_relaxed);
  if (p.reclaim_guest) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - p.killed).count();
    IVLOG_INFO("guest %u: process %d exited; reclaimed its worker pid %d in %lld ms (%u channel(s), %llu KiB "
               "page-locked, %llu KiB of device memory)", guest_id(), guest.pid, static_cast<int>(p.pid),
               static_cast<long long>(ms), channels, static_cast<unsigned long long>(pinned >> 10),
               static_cast<unsigned long long>(charged >> 10));
  } else if (p.going) {
    IVLOG_INFO("guest %u: a spare worker (pid %d) beyond the %u kept ready ended: no process came for %lld s",
               guest_id(), static_cast<int>(p.pid), cfg_.spares,
               static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(kSpareLinger).count()));
  } else if (guest.pid == 0 && hung_up_) {
    IVLOG_INFO("guest %u: the VM's spare worker pid %d ended with the VM", guest_id(), static_cast<int>(p.pid));
  } else if (WIFSIGNALED(status)) {
    IVLOG_WARN("guest %u: the worker of process %d (pid %d) died of signal %d; that process's calls fail, the "
               "VM's other processes are unaffected", guest_id(), guest.pid, static_cast<int>(p.pid),
               WTERMSIG(status));
  } else if (guest.pid == 0 && WEXITSTATUS(status) != 0) {
    // A worker that cannot start will not start a moment later either.
    IVLOG_ERROR("guest %u: a worker failed to start (status %d); retrying in 5 s", guest_id(), WEXITSTATUS(status));
    spares_paused_until_ = clock::now() + std::chrono::seconds(5);
  } else {
    IVLOG_INFO("guest %u: process %d is done; its worker pid %d ended", guest_id(), guest.pid,
               static_cast<int>(p.pid));
  }
  slot.guest_pid.store(0);
  slot.guest_pidns.store(0);
  slot.worker_pid.store(0);
  slot.ready.store(0);
  slot.recycle.store(VmShared::kRecycleNone);
  p = WorkerProc{};
  give_units();
  bump_version();
}

// Channel c's process is gone and so is its worker: nothing else writes the
// channel now. What the process left unread or unserved is dropped, and the
// channel is free for the VM's next process.
void Supervisor::free_guest_channel(std::uint32_t c) {
  const auto req = ring::request_ring(bar_.data(), l_, c);
  ring::store_release(req.ctl->head, ring::load_acquire(req.ctl->tail));
  auto* d = ring::channel_desc(bar_.data(), l_, c);
  std::atomic_ref<std::uint64_t>(sb()->active_mask[c / 64]).fetch_and(~(1ull << (c % 64)), std::memory_order_acq_rel);
  std::atomic_ref<std::uint32_t>(d->guest_state).store(abi::kChanFree, std::memory_order_release);
}

// ------------------------------------------------------------------ the guest

void Supervisor::read_exit_notices() {
  const std::uint32_t count = ring::load_acquire(sb()->exit_count);
  if (IVCUDA_RULE("vm-hints-bounded") && count - exit_seen_ > abi::kExitSlots) {
    IVLOG_WARN("guest %u: %u process exits were reported faster than read; their workers stay until the VM's "
               "processes release their channels", guest_id(), count - exit_seen_ - abi::kExitSlots);
    exit_seen_ = count - abi::kExitSlots;
  }
  // Both read after the count (acquire): the driver wrote them before.
  for (; exit_seen_ != count; ++exit_seen_) {
    const std::uint32_t i = exit_seen_ % abi::kExitSlots;
    process_exited(GuestProcess{static_cast<std::int32_t>(ring::load_relaxed(sb()->exit_pid[i])),
                                ring::load_relaxed(sb()->exit_pidns[i])});
  }
}

// The guest's kernel driver saw process `who` exit with the device open.
// Its worker is killed at once (the driver frees the GPU memory of a process
// that ends) and the rest is reclaimed when it has been reaped.
void Supervisor::process_exited(const GuestProcess& who) {
  if (who.pid <= 0 || !IVCUDA_RULE("reclaim-on-exit")) return;
  for (std::uint32_t s = 0; s < procs_.size(); ++s) {
    WorkerProc& p = procs_[s];
    if (p.pid <= 0 || p.guest.pid == 0 || p.reclaim_guest || !notice_for(who, p.guest)) continue;
    p.reclaim_guest = true;
    p.killed = clock::now();
    // With --recycle-workers the worker is asked to let the process go and
    // serve the VM's next one (a new worker costs a driver start and a
    // context); a suspended VM's worker is locked and cannot answer.
    if (cfg_.recycle && !suspended() && may_keep_spare()) {
      // (Unless it is letting the process go already: its last goodbye.)
      std::uint32_t none = VmShared::kRecycleNone;
      (void)vm_->slot(s).recycle.compare_exchange_strong(none, VmShared::kRecycleAsked, std::memory_order_acq_rel);
      p.recycling = true;
      kick_fd(p.kick.get());
      continue;
    }
    ::kill(p.pid, SIGKILL);
  }
  // Channels the process claimed but that no worker took (yet, or ever).
  for (std::uint32_t c = 0; c < owner_.size(); ++c) {
    if (owner_[c] != 0) continue;
    if (!(ring::load_acquire(sb()->active_mask[c / 64]) >> (c % 64) & 1)) continue;
    if (notice_for(who, claimant(c))) free_guest_channel(c);
  }
}

// Workers letting their process go: asked to (process_exited), or on their
// own when the process said goodbye on its last channel. One that answered is
// the VM's spare once the process's channels are dealt with; one asked that
// has not answered in kRecycleAnswer is busy with the dead process's work and
// is killed. A worker that ended instead is reclaimed when reaped.
void Supervisor::check_recycles() {
  for (std::uint32_t s = 0; s < procs_.size(); ++s) {
    WorkerProc& p = procs_[s];
    if (p.pid <= 0 || p.guest.pid == 0) continue;
    if (vm_->slot(s).recycle.load(std::memory_order_acquire) == VmShared::kRecycling) {
      recycled(s);
    } else if (p.recycling && clock::now() - p.killed >= kRecycleAnswer && IVCUDA_RULE("death-stops-work")) {
      p.recycling = false;
      ::kill(p.pid, SIGKILL);
    }
  }
}

// Slot s's worker stopped serving its process and lets go of what the
// process held: the worker becomes a spare, and is told to serve on once the
// process's channels are dealt with. An exited process's are freed (what it
// left in them is dropped). A process that said goodbye on its last channel
// and lives on may have claimed another since, which the worker never served:
// that one goes to whichever worker takes the process next (scan_channels).
void Supervisor::recycled(std::uint32_t s) {
  WorkerProc& p = procs_[s];
  const unsigned channels = take_channels(s, [&](std::uint32_t c) {
    if (p.recycling) free_guest_channel(c);
    else bound_claim_[c] = 0;  // placed anew
  });
  const bool keep = may_keep_spare();  // (before it counts as one)
  const char* then = keep ? "is the VM's spare" : "ends (the VM's quota holds the spares it keeps)";
  if (p.recycling) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - p.killed).count();
    IVLOG_INFO("guest %u: process %d exited; its worker pid %d let it go in %lld ms (%u channel(s)) and %s",
               guest_id(), p.guest.pid, static_cast<int>(p.pid), static_cast<long long>(ms), channels, then);
  } else {
    IVLOG_INFO("guest %u: process %d is done; its worker pid %d %s", guest_id(), p.guest.pid,
               static_cast<int>(p.pid), then);
  }
  p.guest = GuestProcess{};
  p.reclaim_guest = false;
  p.recycling = false;
  p.was_recycled = true;
  p.found = nullptr;
  auto& slot = vm_->slot(s);
  slot.guest_pid.store(0);
  slot.guest_pidns.store(0);
  slot.ready.store(0);
  give_units();
  bump_version();
  if (!keep) {
    p.going = true;
    ::kill(p.pid, SIGTERM);  // it ends where it waits for the word below
  }
  slot.recycle.store(VmShared::kRecycleNone, std::memory_order_release);
  kick_fd(p.kick.get());
}

// A process's start as the host sees it: from its first claim to a worker
// that serves it (VmShared::Slot::ready, the worker's word: for the log
// only), and what served it. A start's whole cost to the guest is this wait
// and the hello's round trip.
void Supervisor::note_waits() {
  for (std::uint32_t s = 0; s < procs_.size(); ++s) {
    WorkerProc& p = procs_[s];
    if (p.pid <= 0 || p.guest.pid == 0 || p.found == nullptr || vm_->slot(s).ready.load() != 1) continue;
    const auto ms = std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - p.claimed).count() / 1e3;
    IVLOG_INFO("guest %u: process %d waited %.1f ms for its worker pid %d (%s)", guest_id(), p.guest.pid, ms,
               static_cast<int>(p.pid), p.found);
    p.found = nullptr;
  }
}

// Workers write the shared owners one way only: a worker that lets a
// channel go (its process said goodbye on it) sets it to 0. Whatever else
// one wrote there is put back, so that the other workers see the truth;
// the supervisor itself acts only on its own copy.
void Supervisor::sync_owners() {
  bool changed = false;
  for (std::uint32_t c = 0; c < owner_.size(); ++c) {
    const std::uint32_t shared = vm_->owner(c).load();
    if (shared == owner_[c]) continue;
    // (Without the rule, the mutant takes whatever a worker wrote there.)
    if (shared == 0 || !IVCUDA_RULE("vm-supervisor-private-state")) owner_[c] = shared;
    else vm_->owner(c).store(owner_[c]);
    changed = true;
  }
  if (changed) bump_version();
}

// The process a channel's claim names. Read after the mask bit (acquire):
// the guest wrote them before it.
GuestProcess Supervisor::claimant(std::uint32_t c) {
  const auto* d = ring::channel_desc(bar_.data(), l_, c);
  return GuestProcess{static_cast<std::int32_t>(ring::load_relaxed(d->guest_owner) >> 32),
                      ring::load_relaxed(d->guest_pidns)};
}

// Gives newly claimed channels to their process's worker, and takes back
// channels the guest freed without saying goodbye.
void Supervisor::scan_channels() {
  bool changed = false;
  for (std::uint32_t c = 0; c < owner_.size(); ++c) {
    const bool active = ring::load_acquire(sb()->active_mask[c / 64]) >> (c % 64) & 1;
    auto* d = ring::channel_desc(bar_.data(), l_, c);
    if (!active) {
      if (owner_[c] != 0) {
        owner_[c] = 0;
        vm_->owner(c).store(0);
        changed = true;
      }
      continue;
    }
    const std::uint64_t claim = ring::load_relaxed(d->guest_claim);
    if (claim == bound_claim_[c]) continue;  // served or refused, or released and not claimed anew
    const GuestProcess who = claimant(c);
    if (who.pid <= 0) continue;
    if (seen_claim_[c] != claim) {
      seen_claim_[c] = claim;
      seen_at_[c] = clock::now();
    }
    std::uint32_t s = 0;
    const Placed placed = place(who, seen_at_[c], &s);
    if (placed == Placed::kLater) continue;
    if (placed == Placed::kRefused) {
      if (owner_[c] != 0) changed = true;
      refuse(c, claim, who);
      continue;
    }
    ring::store_release(d->host_lost, std::uint64_t{0});
    bound_claim_[c] = claim;
    owner_[c] = s + 1;
    vm_->owner(c).store(s + 1);
    changed = true;
    kick_fd(procs_[s].kick.get());
  }
  if (changed) bump_version();
}

// No worker for the claim's process: the channel is nobody's, and the
// guest stops waiting on it (its library answers CUDA_ERROR_DEVICE_UNAVAILABLE).
// Said in the log for the first claims and every thousandth after: a guest
// can claim as often as it likes.
void Supervisor::refuse(std::uint32_t c, std::uint64_t claim, const GuestProcess& who) {
  bound_claim_[c] = claim;
  owner_[c] = 0;
  vm_->owner(c).store(0);
  ring::store_release(ring::channel_desc(bar_.data(), l_, c)->host_lost, abi::kHostLostRefused);
  if (refusals_++ % 1000 < 10)
    IVLOG_WARN("guest %u: no worker for process %d (pid namespace %u): %s; %u serve processes now (%llu refused)",
               guest_id(), who.pid, who.pidns, refused_why_, process_workers(),
               static_cast<unsigned long long>(refusals_));
}

// The guest rings the VM's one host vector; the worker that has work waits
// on an eventfd of its own.
void Supervisor::relay_doorbells() {
  bool kick[VmShared::kMaxSlots] = {};
  for (std::uint32_t c = 0; c < owner_.size(); ++c) {
    const std::uint32_t owner = owner_[c];  // <= kMaxSlots: the supervisor's own
    if (owner == 0) continue;
    const auto req = ring::request_ring(bar_.data(), l_, c);
    if (ring::load_acquire(req.ctl->tail) != ring::load_relaxed(req.ctl->head)) kick[owner - 1] = true;
  }
  for (std::uint32_t s = 0; s < procs_.size(); ++s)
    if (kick[s]) kick_fd(procs_[s].kick.get());
}

}  // namespace

int run_supervisor(SupervisorConfig cfg, volatile sig_atomic_t* stop_flag) {
  Supervisor sup(std::move(cfg), stop_flag);
  return sup.run();
}

namespace {

// The warm entry's worker: everything a guest would wait for, then the wait
// for the guest's connection (run_warm_supervisor).
int warm_worker_main(const SupervisorConfig& cfg, int line, volatile sig_atomic_t* stop) {
  const std::uint32_t id = cfg.worker.guest_id;
  WorkerConfig wc = cfg.worker;
  wc.defer_connection = true;
  wc.conn_fd = -1;
  wc.recyclable = cfg.recycle;
  wc.keep_contexts = cfg.recycle && cfg.keep_contexts;
  if (IVCUDA_RULE("worker-no-budget-books") && cfg.budget != nullptr) cfg.budget->unmap_in_child();
  if (cfg.before_start)
    if (auto st = cfg.before_start(wc); !st) {
      IVLOG_ERROR("warm worker g%u: cannot sandbox the worker: %s", id, st.error().what.c_str());
      return 2;
    }
  // The guest's memory and doorbells, ours to close when a recycled worker
  // goes on to the next guest's.
  NextGuest mine{wc.shm_fd, wc.host_fds, wc.guest_fds};
  auto w = ::ivcuda::host::start_worker(std::move(wc));
  if (!w) {
    IVLOG_ERROR("warm worker g%u: cannot start: %s", id, w.error().what.c_str());
    return 2;
  }
  if (cfg.after_start)
    if (auto st = cfg.after_start(**w); !st) {
      IVLOG_ERROR("warm worker g%u: cannot sandbox the worker: %s", id, st.error().what.c_str());
      return 2;
    }
  std::unique_ptr<GuestWorker> worker = std::move(*w);
  ivshmem::MessageReader reader;
  for (;;) {
    if (cfg.running != nullptr) *cfg.running = worker.get();
    const char ready = 'R';
    if (::write(line, &ready, 1) != 1) return 0;  // the entry is gone already
    int conn = -1;
    while (conn < 0) {
      if (*stop != 0) return 0;
      auto m = reader.read(line, clock::now() + std::chrono::milliseconds(200));
      if (!m) {
        if (m.error().code == ETIMEDOUT || m.error().code == EINTR) continue;
        return 0;  // let go before a guest came (a VM, a reload, the daemon stopping)
      }
      if (!m->fd.valid()) {
        IVLOG_ERROR("warm worker g%u: the hand-over carried no connection", id);
        return 2;
      }
      conn = m->fd.release();
      worker->attach_connection(conn);
      IVLOG_INFO("guest %u: served by a worker started ahead (peer pid %lld)", id, static_cast<long long>(m->value));
    }
    if (*stop != 0) worker->stop();
    const int rc = worker->run();
    if (rc != GuestWorker::kRecycled) {
      if (cfg.running != nullptr) *cfg.running = nullptr;
      return rc;
    }
    // The guest ended with nothing under way and the worker let go of all
    // of it: it asks for the tenant's next guest, whose own memory and
    // doorbells come back (1 + 2N messages: the memory, then the host's and
    // the guest's eventfds).
    if (cfg.running != nullptr) *cfg.running = nullptr;
    ::close(conn);
    const char clean = 'C';
    if (::write(line, &clean, 1) != 1) return 0;
    // The daemon makes the next guest's memory meanwhile; the last guest's
    // memory on the GPU is back as soon as the contexts are reset.
    worker->release_for_recycle();
    NextGuest next;
    const std::size_t vectors = mine.host_fds.size();
    std::vector<sys::UniqueFd> got;
    while (got.size() < 1 + 2 * vectors) {
      if (*stop != 0) return 0;
      auto m = reader.read(line, clock::now() + std::chrono::milliseconds(200));
      if (!m) {
        if (m.error().code == ETIMEDOUT || m.error().code == EINTR) continue;
        return 0;  // let go
      }
      if (!m->fd.valid() || m->value != static_cast<std::int64_t>(got.size())) {
        IVLOG_ERROR("warm worker g%u: the next guest's memory and doorbells came out of order", id);
        return 2;
      }
      got.push_back(std::move(m->fd));
    }
    next.shm_fd = got[0].release();
    for (std::size_t v = 0; v < vectors; ++v) next.host_fds.push_back(got[1 + v].release());
    for (std::size_t v = 0; v < vectors; ++v) next.guest_fds.push_back(got[1 + vectors + v].release());
    auto fresh = worker->successor(next);
    worker.reset();  // the last guest's BAR is unmapped with it
    if (!fresh) {
      IVLOG_ERROR("warm worker g%u: cannot start for the next guest: %s", id, fresh.error().what.c_str());
      return 2;
    }
    worker = std::move(*fresh);
    ::close(mine.shm_fd);
    for (const int fd : mine.host_fds) ::close(fd);
    for (const int fd : mine.guest_fds) ::close(fd);
    mine = std::move(next);
  }
}

}  // namespace

int run_warm_supervisor(SupervisorConfig cfg, int handoff_fd, volatile sig_atomic_t* stop_flag) {
  const std::uint32_t id = cfg.worker.guest_id;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    IVLOG_ERROR("warm worker g%u: socketpair: %s", id, std::strerror(errno));
    return 2;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    IVLOG_ERROR("warm worker g%u: fork: %s", id, std::strerror(errno));
    return 2;
  }
  if (pid == 0) {
    // Killed outright with us: the daemon's SIGKILL of an evicted guest's
    // process must reach the worker that holds the GPU.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::close(sv[0]);
    ::close(handoff_fd);
    ::_exit(warm_worker_main(cfg, sv[1], stop_flag));
  }
  ::close(sv[1]);
  Supervisor::WarmChild child{pid, sys::UniqueFd(sv[0])};
  auto let_go = [&](int rc) {
    child.line.reset();
    ::kill(child.pid, SIGKILL);
    (void)wait_child(child.pid, stop_flag);
    return rc;
  };
  ivshmem::MessageReader reader;
  // Once per guest: a recycled worker (GuestWorker::kRecycled) comes back here.
  for (;;) {
    // Until the guest comes: the worker's readiness goes on to the daemon; a
    // worker that fails takes the entry with it.
    std::optional<ivshmem::Message> handed;
    while (*stop_flag == 0 && !handed) {
      pollfd p[2] = {{handoff_fd, POLLIN, 0}, {child.line.get(), POLLIN, 0}};
      if (::poll(p, 2, 200) <= 0) continue;
      if (p[1].revents != 0) {
        char c = 0;
        if (::read(child.line.get(), &c, 1) == 1) {
          // 'R' and the worker's pid, for the daemon's log and tests.
          char msg[1 + sizeof(std::int32_t)] = {c};
          const auto wpid = static_cast<std::int32_t>(child.pid);
          std::memcpy(msg + 1, &wpid, sizeof wpid);
          (void)!::write(handoff_fd, msg, sizeof msg);
        } else {
          const int rc = wait_child(child.pid, stop_flag);
          IVLOG_WARN("warm worker g%u: ended before its guest came (status %d)", id, rc);
          return 2;
        }
      }
      if (p[0].revents == 0) continue;
      auto m = reader.read(handoff_fd, clock::now() + std::chrono::milliseconds(1000));
      if (!m || !m->fd.valid()) return let_go(0);  // the daemon let the entry go
      handed = std::move(*m);
    }
    if (!handed) return let_go(0);
    SupervisorConfig c = cfg;
    c.peer_pid = static_cast<pid_t>(handed->value);
    const int conn = handed->fd.release();
    c.worker.conn_fd = conn;
    c.worker.broker_fd = cfg.worker.broker_fd >= 0 ? ::fcntl(cfg.worker.broker_fd, F_DUPFD_CLOEXEC, 0) : -1;
    c.daemon_line = handoff_fd;
    std::optional<Supervisor::WarmChild> back;
    int rc = 0;
    {
      Supervisor sup(std::move(c), stop_flag);
      sup.adopt_warm(std::move(child));
      rc = sup.run();
      back = sup.take_recycled();
    }
    ::close(conn);
    if (!back) return rc;
    child = std::move(*back);
    // The daemon makes the next guest's memory and doorbells (a guest that
    // is gone may still hold the last ones: nothing of theirs is reused) and
    // this process passes them on: 1 + 2N messages, as to the worker.
    char msg[1 + sizeof(std::int32_t)] = {'C'};
    const auto wpid = static_cast<std::int32_t>(child.pid);
    std::memcpy(msg + 1, &wpid, sizeof wpid);
    if (::write(handoff_fd, msg, sizeof msg) != static_cast<ssize_t>(sizeof msg)) return let_go(0);
    const std::size_t vectors = cfg.worker.host_fds.size();
    std::vector<sys::UniqueFd> got;
    while (got.size() < 1 + 2 * vectors && *stop_flag == 0) {
      auto m = reader.read(handoff_fd, clock::now() + std::chrono::milliseconds(1000));
      if (!m && (m.error().code == ETIMEDOUT || m.error().code == EINTR)) continue;
      if (!m || !m->fd.valid() || m->value != static_cast<std::int64_t>(got.size())) return let_go(0);
      if (auto st = ivshmem::send_msg(child.line.get(), m->value, m->fd.get()); !st) return let_go(2);
      got.push_back(std::move(m->fd));
    }
    if (got.size() < 1 + 2 * vectors) return let_go(0);
    // From now on this process's copies are the next guest's.
    ::close(cfg.worker.shm_fd);
    for (const int fd : cfg.worker.host_fds) ::close(fd);
    for (const int fd : cfg.worker.guest_fds) ::close(fd);
    cfg.worker.shm_fd = got[0].release();
    for (std::size_t v = 0; v < vectors; ++v) cfg.worker.host_fds[v] = got[1 + v].release();
    for (std::size_t v = 0; v < vectors; ++v) cfg.worker.guest_fds[v] = got[1 + vectors + v].release();
  }
}

}  // namespace ivcuda::host
