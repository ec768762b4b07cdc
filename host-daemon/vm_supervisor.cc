#include "host-daemon/vm_supervisor.h"

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

#include "host-daemon/board.h"
#include "host-daemon/log.h"
#include "host-daemon/rules.h"
#include "ring/ivshmem.h"
#include "ring/spsc_ring.h"
#include "ring/sys.h"

namespace ivcuda::host {

// ------------------------------------------------------------------ VmShared

VmShared* VmShared::create(const ring::Layout& l) {
  const std::uint64_t pages = ring::pool_size(l) / kPage;
  const std::size_t bytes = sizeof(Header) + pages * sizeof(std::uint16_t);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;  // zero-filled: no owners, no slots
  auto* h = new (p) Header{};
  pthread_mutexattr_t a;
  ::pthread_mutexattr_init(&a);
  ::pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  ::pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  ::pthread_mutex_init(&h->pool_mu, &a);
  ::pthread_mutexattr_destroy(&a);
  h->pool_off = ring::pool_off(l);
  h->pages = pages;
  return reinterpret_cast<VmShared*>(p);
}

bool VmShared::lock() noexcept {
  const int rc = ::pthread_mutex_lock(&hdr_()->pool_mu);
  // A worker died holding it: the page owners are updated one store at a
  // time and stay meaningful, so the state is consistent as it is.
  if (rc == EOWNERDEAD) ::pthread_mutex_consistent(&hdr_()->pool_mu);
  return rc == 0 || rc == EOWNERDEAD;
}
void VmShared::unlock() noexcept { ::pthread_mutex_unlock(&hdr_()->pool_mu); }

std::optional<std::uint64_t> VmShared::pool_allocate(std::uint64_t bytes, std::uint32_t s) {
  Header* h = hdr_();
  if (bytes == 0 || s >= kMaxSlots) return std::nullopt;
  const std::uint64_t need = (bytes + kPage - 1) / kPage;
  if (need > h->pages || !lock()) return std::nullopt;
  std::uint16_t* own = page_owner();
  std::optional<std::uint64_t> got;
  for (std::uint64_t i = 0, run = 0; i < h->pages; ++i) {
    run = own[i] == 0 ? run + 1 : 0;
    if (run == need) {
      const std::uint64_t first = i + 1 - need;
      for (std::uint64_t k = first; k <= i; ++k) own[k] = static_cast<std::uint16_t>(s + 1);
      got = h->pool_off + first * kPage;
      break;
    }
  }
  unlock();
  return got;
}

bool VmShared::pool_free(std::uint64_t off, std::uint64_t bytes, std::uint32_t s) {
  Header* h = hdr_();
  if (off < h->pool_off || (off - h->pool_off) % kPage != 0 || bytes == 0) return false;
  const std::uint64_t first = (off - h->pool_off) / kPage, n = (bytes + kPage - 1) / kPage;
  if (first >= h->pages || n > h->pages - first || !lock()) return false;
  std::uint16_t* own = page_owner();
  bool mine = true;
  for (std::uint64_t k = first; k < first + n && mine; ++k) mine = own[k] == s + 1;
  if (mine)
    for (std::uint64_t k = first; k < first + n; ++k) own[k] = 0;
  unlock();
  return mine;
}

std::uint64_t VmShared::pool_release_all(std::uint32_t s) {
  Header* h = hdr_();
  if (!lock()) return 0;
  std::uint16_t* own = page_owner();
  std::uint64_t freed = 0;
  for (std::uint64_t k = 0; k < h->pages; ++k)
    if (own[k] == s + 1) {
      own[k] = 0;
      freed += kPage;
    }
  unlock();
  return freed;
}

// Under the pool's mutex, so that two workers charging at once cannot both
// pass the limit; the counters are atomics so that readers need no lock.
bool VmShared::mem_charge(std::uint32_t s, std::uint64_t bytes, std::uint64_t limit) noexcept {
  if (s >= kMaxSlots || !lock()) return false;
  bool ok = true;
  if (limit != 0) {
    std::uint64_t used = 0;
    for (std::uint32_t i = 0; i < kMaxSlots; ++i) used += slot(i).mem.load(std::memory_order_relaxed);
    ok = bytes <= limit && used <= limit - bytes;
  }
  if (ok) slot(s).mem.fetch_add(bytes, std::memory_order_relaxed);
  unlock();
  return ok;
}

std::uint64_t VmShared::mem_uncharge(std::uint32_t s, std::uint64_t bytes) noexcept {
  if (s >= kMaxSlots || !lock()) return 0;
  std::atomic<std::uint64_t>& m = slot(s).mem;
  const std::uint64_t off = std::min(bytes, m.load(std::memory_order_relaxed));
  m.store(m.load(std::memory_order_relaxed) - off, std::memory_order_relaxed);
  unlock();
  return off;
}

std::uint64_t VmShared::mem_used() noexcept {
  std::uint64_t used = 0;
  for (std::uint32_t i = 0; i < kMaxSlots; ++i) used += slot(i).mem.load(std::memory_order_relaxed);
  return used;
}

std::uint64_t VmShared::mem_release_all(std::uint32_t s) noexcept {
  if (s >= kMaxSlots || !lock()) return 0;
  const std::uint64_t bytes = slot(s).mem.exchange(0, std::memory_order_relaxed);
  unlock();
  return bytes;
}

// ------------------------------------------------------------------ supervisor

namespace {

using clock = std::chrono::steady_clock;

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

 private:
  struct WorkerProc {
    pid_t pid = 0;
    sys::UniqueFd kick;    // eventfd the worker sleeps on; we write it
    sys::UniqueFd life;    // write end of a pipe: the worker sees it hang up when we go
    bool reclaim_guest = false;  // its process exited: free the process's channels too
    clock::time_point killed{};
  };

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
  void process_exited(std::int32_t pid);
  void scan_channels();
  void relay_doorbells();
  void keep_spares();
  std::optional<std::uint32_t> slot_for(std::int32_t guest_pid);
  bool start_worker(std::uint32_t s, std::int32_t guest_pid);
  void free_guest_channel(std::uint32_t c);
  void bump_version() { vm_->version().fetch_add(1, std::memory_order_acq_rel); }
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
  std::uint32_t exit_seen_ = 0;
  bool hung_up_ = false;
  clock::time_point spares_paused_until_{};
  std::optional<WarmChild> warm_;
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
  if (GuestStats* b = cfg_.worker.stats)
    b->mode.store(static_cast<std::uint32_t>(cfg_.worker.poll_only ? GuestMode::kPlain : GuestMode::kVm),
                  std::memory_order_relaxed);
  IVLOG_INFO("guest %u: a VM; one worker per guest process (%u kept ready)", guest_id(), cfg_.spares);
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
  if (cfg_.before_start)
    if (auto st = cfg_.before_start(wc); !st) {
      IVLOG_ERROR("guest %u: cannot sandbox the worker: %s", guest_id(), st.error().what.c_str());
      return 2;
    }
  auto w = Worker::create(std::move(wc));
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
    read_exit_notices();
    scan_channels();
    relay_doorbells();
    keep_spares();
    if (GuestStats* b = cfg_.worker.stats) {
      std::uint32_t n = 0;
      for (std::uint32_t s = 0; s < procs_.size(); ++s)
        if (procs_[s].pid > 0 && vm_->slot(s).guest_pid.load() != 0) ++n;
      b->processes.store(n, std::memory_order_relaxed);
    }
    wait_for_events();
  }
}

// ------------------------------------------------------------------ workers

bool Supervisor::start_worker(std::uint32_t s, std::int32_t guest_pid) {
  auto kick = sys::make_eventfd(true);
  int life[2];
  if (!kick || ::pipe2(life, O_CLOEXEC) != 0) {
    IVLOG_ERROR("guest %u: no worker for process %d: %s", guest_id(), guest_pid, std::strerror(errno));
    return false;
  }
  sys::UniqueFd life_r(life[0]), life_w(life[1]);
  sys::UniqueFd line;
  if (broker_.connected()) {
    auto got = broker_.new_line();
    if (got) line = std::move(*got);
    else IVLOG_WARN("guest %u: no fd broker line (%s): process %d can import only its own exports", guest_id(),
                    got.error().what.c_str(), guest_pid);
  }
  auto& slot = vm_->slot(s);
  slot.guest_pid.store(guest_pid);
  slot.ready.store(0);
  const pid_t pid = ::fork();
  if (pid < 0) {
    IVLOG_ERROR("guest %u: fork: %s", guest_id(), std::strerror(errno));
    slot.guest_pid.store(0);
    return false;
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    // Nothing of the other workers', nor the VM's doorbells: the supervisor
    // passes those on.
    for (auto& p : procs_) {
      p.kick.reset();
      p.life.reset();
    }
    life_w.reset();
    bar_ = sys::Mapping{};
    WorkerConfig wc = cfg_.worker;
    for (const int fd : wc.host_fds) ::close(fd);
    if (wc.conn_fd >= 0) ::close(wc.conn_fd);  // the VM's socket is the supervisor's to watch
    wc.host_fds = {kick->get()};
    wc.conn_fd = life_r.get();
    wc.broker_fd = line.valid() ? line.release() : -1;
    wc.vm = vm_;
    wc.vm_slot = s;
    wc.vm_notify_fd = notify_.get();
    if (cfg_.before_start)
      if (auto st = cfg_.before_start(wc); !st) {
        IVLOG_ERROR("guest %u: cannot sandbox a worker: %s", guest_id(), st.error().what.c_str());
        ::_exit(2);
      }
    auto w = Worker::create(std::move(wc));
    if (!w) {
      IVLOG_ERROR("guest %u: a worker cannot start: %s", guest_id(), w.error().what.c_str());
      ::_exit(2);
    }
    if (cfg_.after_start)
      if (auto st = cfg_.after_start(**w); !st) {
        IVLOG_ERROR("guest %u: cannot sandbox a worker: %s", guest_id(), st.error().what.c_str());
        ::_exit(2);
      }
    if (cfg_.running != nullptr) *cfg_.running = w->get();
    slot.ready.store(1);
    if (*stop_ != 0) (*w)->stop();
    ::_exit((*w)->run());
  }
  slot.worker_pid.store(pid);
  procs_[s] = WorkerProc{pid, std::move(*kick), std::move(life_w), false, {}};
  if (guest_pid != 0)
    IVLOG_INFO("guest %u: process %d is served by worker pid %d", guest_id(), guest_pid, static_cast<int>(pid));
  return true;
}

std::optional<std::uint32_t> Supervisor::slot_for(std::int32_t guest_pid) {
  for (std::uint32_t s = 0; s < procs_.size(); ++s)
    if (procs_[s].pid > 0 && vm_->slot(s).guest_pid.load() == guest_pid && !procs_[s].reclaim_guest) return s;
  // A worker started ahead takes the process.
  for (std::uint32_t s = 0; s < procs_.size(); ++s)
    if (procs_[s].pid > 0 && vm_->slot(s).guest_pid.load() == 0) {
      vm_->slot(s).guest_pid.store(guest_pid);
      IVLOG_INFO("guest %u: process %d is served by worker pid %d", guest_id(), guest_pid,
                 static_cast<int>(procs_[s].pid));
      return s;
    }
  for (std::uint32_t s = 0; s < procs_.size(); ++s)
    if (procs_[s].pid == 0) {
      if (start_worker(s, guest_pid)) return s;
      return std::nullopt;
    }
  return std::nullopt;
}

void Supervisor::keep_spares() {
  if (clock::now() < spares_paused_until_) return;
  std::uint32_t have = 0;
  for (std::uint32_t s = 0; s < procs_.size(); ++s)
    if (procs_[s].pid > 0 && vm_->slot(s).guest_pid.load() == 0) ++have;
  for (std::uint32_t s = 0; s < procs_.size() && have < cfg_.spares; ++s)
    if (procs_[s].pid == 0 && start_worker(s, 0)) ++have;
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
  const std::int32_t guest_pid = slot.guest_pid.load();
  unsigned channels = 0;
  for (std::uint32_t c = 0; c < l_.channels; ++c) {
    if (vm_->owner(c).load() != s + 1) continue;
    ++channels;
    vm_->owner(c).store(0);
    if (p.reclaim_guest) free_guest_channel(c);
    else ring::store_release(ring::channel_desc(bar_.data(), l_, c)->host_lost, std::uint64_t{1});
  }
  const std::uint64_t pinned = vm_->pool_release_all(s);
  // The worker's process is gone, and with it every byte of device memory it
  // held: what was charged for them returns to the VM's quota.
  const std::uint64_t charged = vm_->mem_release_all(s);
  if (cfg_.worker.stats != nullptr) cfg_.worker.stats->mem_used.fetch_sub(charged, std::memory_order_relaxed);
  if (p.reclaim_guest) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - p.killed).count();
    IVLOG_INFO("guest %u: process %d exited; reclaimed its worker pid %d in %lld ms (%u channel(s), %llu KiB "
               "page-locked, %llu KiB of device memory)", guest_id(), guest_pid, static_cast<int>(p.pid),
               static_cast<long long>(ms), channels, static_cast<unsigned long long>(pinned >> 10),
               static_cast<unsigned long long>(charged >> 10));
  } else if (WIFSIGNALED(status)) {
    IVLOG_WARN("guest %u: the worker of process %d (pid %d) died of signal %d; that process's calls fail, the "
               "VM's other processes are unaffected", guest_id(), guest_pid, static_cast<int>(p.pid),
               WTERMSIG(status));
  } else if (guest_pid == 0 && WEXITSTATUS(status) != 0) {
    // A worker that cannot start will not start a moment later either.
    IVLOG_ERROR("guest %u: a worker failed to start (status %d); retrying in 5 s", guest_id(), WEXITSTATUS(status));
    spares_paused_until_ = clock::now() + std::chrono::seconds(5);
  } else {
    IVLOG_INFO("guest %u: process %d is done; its worker pid %d ended", guest_id(), guest_pid,
               static_cast<int>(p.pid));
  }
  slot.guest_pid.store(0);
  slot.worker_pid.store(0);
  slot.ready.store(0);
  p = WorkerProc{};
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
  for (; exit_seen_ != count; ++exit_seen_)
    process_exited(static_cast<std::int32_t>(ring::load_relaxed(sb()->exit_pid[exit_seen_ % abi::kExitSlots])));
}

// The guest's kernel driver saw process `pid` exit with the device open.
// Its worker is killed at once (the driver frees the GPU memory of a process
// that ends) and the rest is reclaimed when it has been reaped.
void Supervisor::process_exited(std::int32_t pid) {
  if (pid <= 0 || !IVCUDA_RULE("reclaim-on-exit")) return;
  for (std::uint32_t s = 0; s < procs_.size(); ++s) {
    WorkerProc& p = procs_[s];
    if (p.pid <= 0 || vm_->slot(s).guest_pid.load() != pid || p.reclaim_guest) continue;
    p.reclaim_guest = true;
    p.killed = clock::now();
    ::kill(p.pid, SIGKILL);
  }
  // Channels the process claimed but that no worker took yet.
  for (std::uint32_t c = 0; c < l_.channels; ++c) {
    if (vm_->owner(c).load() != 0) continue;
    if (!(ring::load_acquire(sb()->active_mask[c / 64]) >> (c % 64) & 1)) continue;
    if (static_cast<std::int32_t>(ring::load_relaxed(ring::channel_desc(bar_.data(), l_, c)->guest_owner) >> 32) ==
        pid)
      free_guest_channel(c);
  }
}

// Gives newly claimed channels to their process's worker, and takes back
// channels the guest freed without saying goodbye.
void Supervisor::scan_channels() {
  bool changed = false;
  for (std::uint32_t c = 0; c < l_.channels; ++c) {
    const bool active = ring::load_acquire(sb()->active_mask[c / 64]) >> (c % 64) & 1;
    const std::uint32_t owner = vm_->owner(c).load();
    auto* d = ring::channel_desc(bar_.data(), l_, c);
    if (!active) {
      if (owner != 0) {
        vm_->owner(c).store(0);
        changed = true;
      }
      continue;
    }
    // Both read after the mask bit (acquire): the guest wrote them before.
    const std::uint64_t claim = ring::load_relaxed(d->guest_claim);
    if (claim == vm_->bound_claim(c).load()) continue;  // served, or released and not claimed anew
    const auto pid = static_cast<std::int32_t>(ring::load_relaxed(d->guest_owner) >> 32);
    if (pid <= 0) continue;
    const auto s = slot_for(pid);
    if (!s) {
      IVLOG_WARN("guest %u: no worker for process %d (all %u in use)", guest_id(), pid, VmShared::kMaxSlots);
      continue;
    }
    ring::store_release(d->host_lost, std::uint64_t{0});
    vm_->bound_claim(c).store(claim);
    vm_->owner(c).store(*s + 1);
    changed = true;
    kick_fd(procs_[*s].kick.get());
  }
  if (changed) bump_version();
}

// The guest rings the VM's one host vector; the worker that has work waits
// on an eventfd of its own.
void Supervisor::relay_doorbells() {
  bool kick[VmShared::kMaxSlots] = {};
  for (std::uint32_t c = 0; c < l_.channels; ++c) {
    const std::uint32_t owner = vm_->owner(c).load();
    if (owner == 0 || owner > VmShared::kMaxSlots) continue;
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
  if (cfg.before_start)
    if (auto st = cfg.before_start(wc); !st) {
      IVLOG_ERROR("warm worker g%u: cannot sandbox the worker: %s", id, st.error().what.c_str());
      return 2;
    }
  auto w = Worker::create(std::move(wc));
  if (!w) {
    IVLOG_ERROR("warm worker g%u: cannot start: %s", id, w.error().what.c_str());
    return 2;
  }
  if (cfg.after_start)
    if (auto st = cfg.after_start(**w); !st) {
      IVLOG_ERROR("warm worker g%u: cannot sandbox the worker: %s", id, st.error().what.c_str());
      return 2;
    }
  if (cfg.running != nullptr) *cfg.running = w->get();
  const char ready = 'R';
  if (::write(line, &ready, 1) != 1) return 0;  // the entry is gone already
  ivshmem::MessageReader reader;
  for (;;) {
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
    const int conn = m->fd.release();
    (*w)->attach_connection(conn);
    IVLOG_INFO("guest %u: served by a worker started ahead (peer pid %lld)", id, static_cast<long long>(m->value));
    break;
  }
  if (*stop != 0) (*w)->stop();
  const int rc = (*w)->run();
  if (cfg.running != nullptr) *cfg.running = nullptr;
  return rc;
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
    ::kill(pid, SIGKILL);
    (void)wait_child(pid, stop_flag);
    return rc;
  };
  // Until the guest comes: the worker's readiness goes on to the daemon; a
  // worker that fails takes the entry with it.
  ivshmem::MessageReader reader;
  while (*stop_flag == 0) {
    pollfd p[2] = {{handoff_fd, POLLIN, 0}, {child.line.get(), POLLIN, 0}};
    if (::poll(p, 2, 200) <= 0) continue;
    if (p[1].revents != 0) {
      char c = 0;
      if (::read(child.line.get(), &c, 1) == 1) {
        // 'R' and the worker's pid, for the daemon's log and tests.
        char msg[1 + sizeof(std::int32_t)] = {c};
        const auto wpid = static_cast<std::int32_t>(pid);
        std::memcpy(msg + 1, &wpid, sizeof wpid);
        (void)!::write(handoff_fd, msg, sizeof msg);
      } else {
        const int rc = wait_child(pid, stop_flag);
        IVLOG_WARN("warm worker g%u: ended before its guest came (status %d)", id, rc);
        return 2;
      }
    }
    if (p[0].revents == 0) continue;
    auto m = reader.read(handoff_fd, clock::now() + std::chrono::milliseconds(1000));
    if (!m || !m->fd.valid()) return let_go(0);  // the daemon let the entry go
    cfg.peer_pid = static_cast<pid_t>(m->value);
    cfg.worker.conn_fd = m->fd.release();
    ::close(handoff_fd);
    Supervisor sup(std::move(cfg), stop_flag);
    sup.adopt_warm(std::move(child));
    return sup.run();
  }
  return let_go(0);
}

}  // namespace ivcuda::host
