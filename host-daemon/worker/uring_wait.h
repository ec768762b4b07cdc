// How a worker sleeps: io_uring with a read armed on the doorbell eventfd
// and a poll armed on the guest's connection, so one wait covers "the guest
// rang", "the guest went away" and a timeout. The ring is restricted to those
// operations; a kernel that cannot restrict one (before 5.10) gets no ring,
// and the same waits go through poll(2) (docs/security.md,
// `uring-restricted-or-poll`).
#pragma once

#include <liburing.h>

#include <cstdint>
#include <memory>

#include "ivcuda/result.h"

namespace ivcuda::host {

class UringWaiter {
 public:
  static constexpr unsigned kDoorbell = 1;
  static constexpr unsigned kHangup = 2;

  // conn_fd < 0: no connection to watch.
  static Result<std::unique_ptr<UringWaiter>> create(int doorbell_fd, int conn_fd);
  ~UringWaiter();
  UringWaiter(const UringWaiter&) = delete;
  UringWaiter& operator=(const UringWaiter&) = delete;

  // Blocks up to timeout_ms (0: only reap what is ready). Returns kDoorbell
  // and/or kHangup bits for what happened.
  unsigned wait(int timeout_ms) noexcept;
  // Starts watching conn_fd for a hang-up (a waiter made with none).
  void watch_connection(int conn_fd) noexcept;
  // A recycled worker's next guest (worker.h, Worker::successor): what is
  // armed is cancelled, and the waiter reads `doorbell_fd` and watches no
  // connection until watch_connection(). Only io_uring_enter: works inside
  // the sandbox.
  Result<void> rebind(int doorbell_fd) noexcept;
  // Whether the ring is limited to the waiter's operations (read, poll,
  // timeout); false on kernels without io_uring restrictions, which get no
  // ring (uses_poll()).
  bool restricted() const noexcept { return restricted_; }
  bool uses_poll() const noexcept { return !ring_ok_; }

 private:
  UringWaiter() = default;
  unsigned wait_poll(int timeout_ms) noexcept;
  void arm_read() noexcept;
  void arm_poll() noexcept;
  void cancel_armed() noexcept;

  io_uring ring_{};
  bool ring_ok_ = false;
  bool restricted_ = false;
  int doorbell_fd_ = -1;
  int conn_fd_ = -1;
  std::uint64_t buf_ = 0;
  bool hung_up_ = false;
  unsigned armed_ = 0;  // requests submitted and not yet completed
};

}  // namespace ivcuda::host
