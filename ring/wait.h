// The wait strategy both sides use: spin briefly on shared memory, then
// announce sleep and block on a notifier until the peer rings.
#pragma once

#include <sched.h>

#include <chrono>
#include <cstdint>

#include "ring/spsc_ring.h"
#include "ring/sys.h"

namespace ivcuda::ring {

// Something a sleeper blocks on: an eventfd in process mode, the UIO device
// in VM mode.
class Waiter {
 public:
  virtual ~Waiter() = default;
  // Blocks until rung or timeout; spurious returns are allowed.
  virtual void wait(int timeout_ms) noexcept = 0;
};

class EventfdDoorbell final : public Doorbell {
 public:
  explicit EventfdDoorbell(int fd) noexcept : fd_(fd) {}
  void ring() noexcept override { sys::eventfd_signal(fd_); }

 private:
  int fd_;
};

class EventfdWaiter final : public Waiter {
 public:
  explicit EventfdWaiter(int fd) noexcept : fd_(fd) {}
  void wait(int timeout_ms) noexcept override {
    if (sys::wait_readable(fd_, timeout_ms)) sys::eventfd_drain(fd_);
  }

 private:
  int fd_;  // non-blocking eventfd
};

struct SpinPolicy {
  std::chrono::nanoseconds spin{std::chrono::microseconds(50)};
  int block_timeout_ms = 100;  // a lost doorbell costs at most this much
  bool yield = false;          // give the core away now and then while spinning...
  std::chrono::nanoseconds yield_after{std::chrono::microseconds(100)};  // ...once this much has passed
};

// Waits until ready() is true. announce(true) must publish the sleeping flag
// and issue the [F1] fence; announce(false) clears it. Returns when ready.
template <class Ready, class Announce>
void spin_then_block(Ready&& ready, Announce&& announce, Waiter& waiter, const SpinPolicy& pol) {
  // ready() may consume what it finds, so it is never called again after it
  // returned true.
  const auto start = std::chrono::steady_clock::now();
  const auto until = start + pol.spin;
  const auto yield_from = start + pol.yield_after;
  unsigned n = 0;
  for (;;) {
    if (ready()) return;
    cpu_relax();
    if ((++n & 63) == 0) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= until) break;
      // A quick answer is caught by pure spinning; a long wait yields.
      if (pol.yield && now >= yield_from) ::sched_yield();
    }
  }
  for (;;) {
    announce(true);
    if (ready()) {  // re-check after the fence: a record may have landed
      announce(false);
      return;
    }
    waiter.wait(pol.block_timeout_ms);
    announce(false);
    if (ready()) return;
  }
}

}  // namespace ivcuda::ring
