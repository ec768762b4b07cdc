// One driver context made (or reset) at a time on each GPU, across all of the
// daemon's workers.
//
// The driver makes a GPU's contexts one after another: on an H100 one alone
// took 115-150 ms and four asked for at once 400-480 ms each, all four ready
// together at the end (docs/performance.md, "A guest's start and death"). A
// worker recycled for the next guest and the fresh ones the warm pool starts
// meanwhile all make a context, so a guest waiting for one of them waited for
// all. Taking turns gives the same contexts at the same total rate, the first
// ready after one context's time, the next one context later.
//
// The turns are POSIX record locks, a byte per GPU, on one memory file the
// daemon opens before it forks any worker (every worker inherits it): the
// kernel hands a lock back when its holder dies, so a worker killed while it
// holds a turn costs the others nothing. A turn not had within kMaxWait is
// taken anyway (a worker stuck in the driver must not hold every start up).
// --context-turns off (the default: on an H100 the medians halved but the tails
// grew, docs/performance.md): no file, and Turn waits for nothing.
#pragma once

#include <chrono>

namespace ivcuda::host::context_turns {

inline constexpr std::chrono::milliseconds kMaxWait{3000};

// In the daemon, once, before it forks: opens the file the turns are locks
// on. Returns false (and turns stay off) where no memory file can be made.
bool open_for_workers() noexcept;
// Whether turns are on in this process (the daemon opened the file).
bool enabled() noexcept;

// The turn of GPU `device` (the driver's ordinal), held while the object lives.
class Turn {
 public:
  explicit Turn(int device) noexcept;
  ~Turn();
  Turn(const Turn&) = delete;
  Turn& operator=(const Turn&) = delete;
  // How long the constructor waited for the turn, and whether it got it
  // (false: turns off, or kMaxWait passed).
  std::chrono::milliseconds waited() const noexcept { return waited_; }
  bool held() const noexcept { return held_; }

 private:
  int device_;
  bool held_ = false;
  std::chrono::milliseconds waited_{0};
};

}  // namespace ivcuda::host::context_turns
