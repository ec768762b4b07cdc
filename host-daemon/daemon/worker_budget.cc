// See worker_budget.h.
#include "host-daemon/daemon/worker_budget.h"

#include <sys/mman.h>
#include <unistd.h>

#include <new>

#include "ring/sys.h"

namespace ivcuda::host {

static_assert(std::atomic<std::uint32_t>::is_always_lock_free);  // shared between processes

std::unique_ptr<WorkerBudget> WorkerBudget::create(std::uint32_t entries) {
  if (entries == 0) entries = 1;
  // A named memfd rather than anonymous memory: /proc/PID/maps then says
  // which processes have the books (tests check that no worker does).
  auto fd = sys::make_memfd("ivcuda-budget", entries * sizeof(Entry));
  if (!fd) return nullptr;
  void* p = ::mmap(nullptr, entries * sizeof(Entry), PROT_READ | PROT_WRITE, MAP_SHARED, fd->get(), 0);
  if (p == MAP_FAILED) return nullptr;
  auto* e = static_cast<Entry*>(p);
  for (std::uint32_t i = 0; i < entries; ++i) new (&e[i]) Entry{};
  return std::unique_ptr<WorkerBudget>(new WorkerBudget(e, entries));
}

WorkerBudget::~WorkerBudget() {
  if (e_ != nullptr) ::munmap(e_, n_ * sizeof(Entry));
}

void WorkerBudget::unmap_in_child() noexcept {
  if (e_ != nullptr) ::munmap(e_, n_ * sizeof(Entry));
  e_ = nullptr;
  n_ = 0;
}

unsigned WorkerBudget::used(uid_t uid) const noexcept {
  unsigned n = 0;
  for (std::uint32_t i = 0; i < n_; ++i) {
    const Entry& x = e_[i];
    if (x.state.load() != kFree && x.uid.load() == uid) n += 1 + x.extra.load();
  }
  return n;
}

WorkerBudget::Ticket WorkerBudget::admit(uid_t uid, unsigned limit) noexcept {
  // Only the daemon's one thread hands out entries.
  for (std::uint32_t i = 0; i < n_; ++i) {
    Entry& x = e_[i];
    if (x.state.load() != kFree) continue;
    x.uid.store(uid);
    x.pid.store(0);
    x.extra.store(0);
    x.state.store(kAdmitted);  // added: now look
    if (limit != 0 && used(uid) > limit) {
      x.state.store(kFree);
      return {};
    }
    return Ticket(this, i);
  }
  return {};
}

WorkerBudget::Ticket::~Ticket() {
  if (b_ != nullptr) b_->e_[i_].state.store(kFree);
}

void WorkerBudget::Ticket::bind(pid_t pid) noexcept {
  if (b_ == nullptr) return;
  Entry& x = b_->e_[i_];
  x.pid.store(pid);
  x.state.store(kBound);
  b_ = nullptr;
}

void WorkerBudget::release(pid_t pid) noexcept {
  for (std::uint32_t i = 0; i < n_; ++i)
    if (e_[i].state.load() == kBound && e_[i].pid.load() == pid) e_[i].state.store(kFree);
}

WorkerBudget::Entry* WorkerBudget::mine() noexcept {
  const pid_t self = ::getpid();
  for (std::uint32_t i = 0; i < n_; ++i)
    if (e_[i].state.load() == kBound && e_[i].pid.load() == self) return &e_[i];
  return nullptr;
}

bool WorkerBudget::take(unsigned limit) noexcept {
  Entry* x = mine();
  if (x == nullptr) return false;
  x->extra.fetch_add(1);  // added: now look
  if (limit != 0 && used(x->uid.load()) > limit) {
    x->extra.fetch_sub(1);
    return false;
  }
  return true;
}

void WorkerBudget::give() noexcept {
  Entry* x = mine();
  if (x == nullptr) return;
  std::uint32_t cur = x->extra.load();
  while (cur != 0 && !x->extra.compare_exchange_weak(cur, cur - 1)) {
  }
}

}  // namespace ivcuda::host
