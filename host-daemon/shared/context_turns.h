// One driver context made (or reset) at a time on each GPU, across all of the
// daemon's workers, in the order the workers asked.
//
// The driver makes a GPU's contexts one after another: on an H100 one alone
// took 115-150 ms and four asked for at once 400-480 ms each, all four ready
// together at the end (docs/performance.md, "A guest's start and death"). A
// worker recycled for the next guest and the fresh ones the warm pool starts
// meanwhile all make a context, so a guest waiting for one of them waited for
// all. Taking turns gives the same contexts at the same total rate, the first
// ready after one context's time, the next one context later - as long as
// the turns go in order: a first version, a lock each worker polled, let late
// askers in before early ones and lengthened every tail (docs/performance.md,
// "Contexts in turns").
//
// So the turns are tickets: a GPU's queue is two counters on a page of a
// memory file the daemon maps before it forks any worker (every worker
// inherits it), the next ticket and the one being served. A worker takes a
// ticket, waits (a futex on the counter) until it is served, and on leaving
// serves the next. Liveness comes from POSIX record locks on the same file, a
// byte per ticket, held from the ticket's taking to its end: the kernel drops
// them when a process dies, so a waiter that finds the served ticket's byte
// free knows its holder is gone and serves the next itself. Taking a ticket
// and locking its byte happen under a third lock, the queue's door, which is
// also what a waiter takes before it passes a ticket over, so that a ticket
// just taken is never mistaken for a dead one. A turn not had within kMaxWait
// is taken anyway (a worker stuck in the driver must not hold every start
// up); it still holds its byte, so those after it wait for it.
//
// One turn per process at a time: record locks are a process's, so a second
// turn asked for in a process that holds one would take the first for dead.
// --context-turns off: no file, and Turn waits for nothing; made: only the
// making of contexts takes turns, a reset goes as it comes.
#pragma once

#include <chrono>
#include <cstdint>

namespace ivcuda::host::context_turns {

inline constexpr std::chrono::milliseconds kMaxWait{3000};
// GPUs with a queue (a driver ordinal beyond it takes no turns), and tickets
// of one GPU alive at once (each names a byte; the daemon serves far fewer
// guests at a time).
inline constexpr int kMaxGpus = 64;
inline constexpr std::uint32_t kTicketBytes = 1u << 16;

// What a turn is for. kMakeAhead: a context nobody waits for yet (a recycled
// worker's, made for the tenant's next guest), which lets every worker
// already queued go first - a burst's new workers, whose guests wait, before
// the workers its first guests leave behind (at most kMaxWait).
enum class Work { kMake, kMakeAhead, kReset };

// In the daemon, once, before it forks: makes and maps the file the queues
// live in; `resets_too`: resets take turns as well. Returns false (and turns
// stay off) where it cannot.
bool open_for_workers(bool resets_too = true) noexcept;
// Whether turns are on in this process (the daemon opened the file).
bool enabled() noexcept;

// The turn of GPU `device` (the driver's ordinal) for `work`, held while the
// object lives.
class Turn {
 public:
  explicit Turn(int device, Work work = Work::kMake) noexcept;
  ~Turn();
  Turn(const Turn&) = delete;
  Turn& operator=(const Turn&) = delete;
  // How long the constructor waited for the turn, and whether it got it in
  // order (false: turns off, or kMaxWait passed).
  std::chrono::milliseconds waited() const noexcept { return waited_; }
  bool held() const noexcept { return held_; }
  // Tickets served before this one since it was taken (0: the queue was empty).
  std::uint32_t ahead() const noexcept { return ahead_; }

 private:
  int device_;
  bool queued_ = false;
  bool held_ = false;
  std::uint32_t ticket_ = 0;
  std::uint32_t ahead_ = 0;
  std::chrono::milliseconds waited_{0};
};

}  // namespace ivcuda::host::context_turns
