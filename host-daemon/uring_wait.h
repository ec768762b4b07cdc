// How a worker sleeps: io_uring with a read armed on the doorbell eventfd
// and a poll armed on the guest's connection, so one wait covers "the guest
// rang", "the guest went away" and a timeout.
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
  // Whether the ring is limited to the waiter's operations (read, poll,
  // timeout); false on kernels without io_uring restrictions.
  bool restricted() const noexcept { return restricted_; }

 private:
  UringWaiter() = default;
  void arm_read() noexcept;
  void arm_poll() noexcept;

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
