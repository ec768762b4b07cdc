// The per-uid budget of worker processes (--max-guests-per-uid).
//
// Every worker holds a GPU context per device (hundreds of MiB each on an
// H200; charged to a quota only where the guest has one) and pins the
// guest's memory. One connecting user id may therefore have at most
// --max-guests-per-uid of them at once: each connection counts one (its
// first worker, or the one worker of a process-mode guest), and a VM's
// every further worker that serves a guest process counts one more. Spare workers a VM keeps ready for its next
// process do not count here; --vm-spare-workers and --max-workers-per-guest
// bound them per connection (docs/security.md, "Workers per VM").
//
// The daemon admits connections and a VM's supervisor (another process)
// asks for its further workers, so the books are a table in memory the
// daemon maps MAP_SHARED before it forks anything: one entry per
// connection, written by the daemon (who: its process and uid) and by that
// connection's supervisor (how many further workers it holds). No worker
// ever has it mapped: a supervisor unmaps it in every worker it forks,
// before the worker reads anything a guest wrote. Both sides count by
// "add, then look, then take back if over": with sequentially consistent
// atomics, of two that add at once at least one sees the other, so the
// budget is never passed (at worst both back off and try again later).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

namespace ivcuda::host {

class WorkerBudget {
 public:
  struct Entry {
    std::atomic<std::uint32_t> state;  // daemon: kFree, kAdmitted (pid not known yet), kBound
    std::atomic<std::uint32_t> uid;    // daemon
    std::atomic<std::int32_t> pid;     // daemon: the connection's process
    std::atomic<std::uint32_t> extra;  // supervisor: workers beyond the connection's first
  };

  // The table for `entries` connections at once; nullptr when mmap fails.
  static std::unique_ptr<WorkerBudget> create(std::uint32_t entries);
  ~WorkerBudget();
  WorkerBudget(const WorkerBudget&) = delete;
  WorkerBudget& operator=(const WorkerBudget&) = delete;

  // Daemon. A connection of `uid` takes its one unit: a ticket that gives it
  // back when destroyed unless bind() gave it a process, or an empty ticket
  // when the uid's units would pass `limit` (0: no limit) or the table is full.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(WorkerBudget* b, std::uint32_t i) : b_(b), i_(i) {}
    Ticket(Ticket&& o) noexcept : b_(std::exchange(o.b_, nullptr)), i_(o.i_) {}
    Ticket& operator=(Ticket&&) = delete;
    ~Ticket();
    explicit operator bool() const noexcept { return b_ != nullptr; }
    // The connection's process is `pid`: its entry lives until release(pid).
    void bind(pid_t pid) noexcept;

   private:
    WorkerBudget* b_ = nullptr;
    std::uint32_t i_ = 0;
  };
  Ticket admit(uid_t uid, unsigned limit) noexcept;
  // The connection's process `pid` was reaped: its units return.
  void release(pid_t pid) noexcept;
  // Units the uid holds now.
  unsigned used(uid_t uid) const noexcept;

  // Supervisor (the connection's process, identified by getpid()). One more
  // worker for this connection, unless its uid's units would pass `limit`
  // (0: no limit) or the daemon has not bound this process yet.
  bool take(unsigned limit) noexcept;
  // Gives one back (never more than this connection took).
  void give() noexcept;

  // In a forked worker: drop the mapping without touching it.
  void unmap_in_child() noexcept;

 private:
  WorkerBudget(Entry* e, std::uint32_t n) : e_(e), n_(n) {}
  static constexpr std::uint32_t kFree = 0, kAdmitted = 1, kBound = 2;
  Entry* mine() noexcept;
  Entry* e_;
  std::uint32_t n_;
};

}  // namespace ivcuda::host
