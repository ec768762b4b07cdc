#include "host-daemon/worker/uring_wait.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>

#include "host-daemon/shared/log.h"
#include "host-daemon/shared/rules.h"

namespace ivcuda::host {

namespace {
constexpr std::uint64_t kTagRead = 1;
constexpr std::uint64_t kTagPoll = 2;
constexpr std::uint64_t kTagCancel = 3;
}  // namespace

Result<std::unique_ptr<UringWaiter>> UringWaiter::create(int doorbell_fd, int conn_fd) {
  std::unique_ptr<UringWaiter> w(new UringWaiter());
  w->doorbell_fd_ = doorbell_fd;
  w->conn_fd_ = conn_fd;
  // The ring may do only what the waiter does: read a doorbell, poll the
  // connection, time out. A filter of system calls cannot see the operations
  // a ring performs, so without this a subverted worker could open sockets or
  // files through it (docs/security.md, "Sandbox"). Kernels before 5.10 have
  // no restrictions (they refuse IORING_SETUP_R_DISABLED): no ring at all
  // then, the same waits through poll(2).
  io_uring_params params{};
  params.flags = IORING_SETUP_R_DISABLED;
  int r = io_uring_queue_init_params(8, &w->ring_, &params);
  if (r == -EINVAL && IVCUDA_RULE("uring-restricted-or-poll")) {
    IVLOG_WARN("io_uring: this kernel cannot restrict a ring (no IORING_SETUP_R_DISABLED); the worker waits with "
               "poll(2) instead");
    return w;
  }
  if (r == 0) {
    io_uring_restriction res[4]{};
    const std::uint8_t ops[] = {IORING_OP_READ, IORING_OP_POLL_ADD, IORING_OP_TIMEOUT, IORING_OP_ASYNC_CANCEL};
    for (std::size_t i = 0; i < std::size(ops); ++i) {
      res[i].opcode = IORING_RESTRICTION_SQE_OP;
      res[i].sqe_op = ops[i];
    }
    r = IVCUDA_RULE("worker-sandbox") ? io_uring_register_restrictions(&w->ring_, res, std::size(res)) : 0;
    if (r == 0) r = io_uring_enable_rings(&w->ring_);
    if (r < 0) {
      io_uring_queue_exit(&w->ring_);
      return make_error(-r, std::string("restricting the io_uring: ") + std::strerror(-r));
    }
    w->restricted_ = true;
  } else if (r == -EINVAL) {
    r = io_uring_queue_init(8, &w->ring_, 0);
  }
  if (r < 0) return make_error(-r, std::string("io_uring_queue_init: ") + std::strerror(-r));
  w->ring_ok_ = true;
  w->arm_read();
  if (conn_fd >= 0) w->arm_poll();
  io_uring_submit(&w->ring_);
  return w;
}

UringWaiter::~UringWaiter() {
  if (!ring_ok_) return;
  // Cancel what is still armed and reap it before the ring goes. A ring
  // closed with armed requests kept them, and their memory, for good on the
  // development machine's kernel (6.18): about 18 io_kiocb objects for every
  // worker that ever ended (found by the long fuzz run, which ended by OOM).
  cancel_armed();
  io_uring_queue_exit(&ring_);
}

Result<void> UringWaiter::rebind(int doorbell_fd) noexcept {
  if (ring_ok_) cancel_armed();
  doorbell_fd_ = doorbell_fd;
  conn_fd_ = -1;
  hung_up_ = false;
  if (!ring_ok_) return {};
  if (armed_ != 0) return make_error(EBUSY, "io_uring: an armed request of the last guest did not end");
  arm_read();
  io_uring_submit(&ring_);
  return {};
}

void UringWaiter::cancel_armed() noexcept {
  if (io_uring_sqe* sqe = io_uring_get_sqe(&ring_)) {
    io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
    io_uring_sqe_set_data64(sqe, kTagCancel);
    io_uring_submit(&ring_);
    // The cancel's own completion and one for each request still armed.
    for (unsigned left = armed_ + 1; left > 0; --left) {
      io_uring_cqe* cqe = nullptr;
      __kernel_timespec ts{0, 100 * 1000 * 1000};
      if (io_uring_wait_cqe_timeout(&ring_, &cqe, &ts) != 0) break;
      const std::uint64_t tag = io_uring_cqe_get_data64(cqe);
      if ((tag == kTagRead || tag == kTagPoll) && armed_ > 0) --armed_;
      io_uring_cqe_seen(&ring_, cqe);
    }
  }
}

void UringWaiter::arm_read() noexcept {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) return;
  io_uring_prep_read(sqe, doorbell_fd_, &buf_, sizeof buf_, 0);
  io_uring_sqe_set_data64(sqe, kTagRead);
  ++armed_;
}

void UringWaiter::arm_poll() noexcept {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) return;
  io_uring_prep_poll_add(sqe, conn_fd_, POLLRDHUP | POLLHUP | POLLERR);
  io_uring_sqe_set_data64(sqe, kTagPoll);
  ++armed_;
}

void UringWaiter::watch_connection(int conn_fd) noexcept {
  if (conn_fd_ >= 0 || conn_fd < 0) return;
  conn_fd_ = conn_fd;
  if (!ring_ok_) return;  // poll(2) picks it up at the next wait
  arm_poll();
  io_uring_submit(&ring_);
}

unsigned UringWaiter::wait_poll(int timeout_ms) noexcept {
  unsigned what = hung_up_ ? kHangup : 0;
  pollfd p[2] = {{doorbell_fd_, POLLIN, 0}, {conn_fd_, POLLRDHUP, 0}};
  const nfds_t n = conn_fd_ >= 0 && !hung_up_ ? 2 : 1;
  if (::poll(p, n, timeout_ms > 0 ? timeout_ms : 0) <= 0) return what;
  if ((p[0].revents & POLLIN) != 0) {
    std::uint64_t count = 0;  // an eventfd: readable means the read does not block
    (void)!::read(doorbell_fd_, &count, sizeof count);
    what |= kDoorbell;
  }
  if (n == 2 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
    hung_up_ = true;
    what |= kHangup;
  }
  return what;
}

unsigned UringWaiter::wait(int timeout_ms) noexcept {
  if (!ring_ok_) return wait_poll(timeout_ms);
  unsigned what = hung_up_ ? kHangup : 0;
  io_uring_cqe* cqe = nullptr;
  int r;
  if (timeout_ms > 0) {
    __kernel_timespec ts{};
    ts.tv_sec = timeout_ms / 1000;
    ts.tv_nsec = static_cast<long long>(timeout_ms % 1000) * 1000000;
    r = io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
  } else {
    r = io_uring_peek_cqe(&ring_, &cqe);
  }
  if (r < 0) return what;  // timeout or EINTR: nothing happened
  bool rearm_read = false;
  unsigned head;
  unsigned seen = 0;
  io_uring_for_each_cqe(&ring_, head, cqe) {
    ++seen;
    const std::uint64_t tag = io_uring_cqe_get_data64(cqe);
    if ((tag == kTagRead || tag == kTagPoll) && armed_ > 0) --armed_;
    if (tag == kTagRead) {
      what |= kDoorbell;
      rearm_read = true;
    } else if (tag == kTagPoll) {
      hung_up_ = true;
      what |= kHangup;
    }
  }
  io_uring_cq_advance(&ring_, seen);
  if (rearm_read) {
    arm_read();
    io_uring_submit(&ring_);
  }
  return what;
}

}  // namespace ivcuda::host
