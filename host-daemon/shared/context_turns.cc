#include "host-daemon/shared/context_turns.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <ctime>

namespace ivcuda::host::context_turns {
namespace {

// One GPU's queue, a cache line of the shared page each.
struct alignas(64) Queue {
  std::atomic<std::uint32_t> next;     // the ticket the next asker takes
  std::atomic<std::uint32_t> serving;  // the ticket whose turn it is
};
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
static_assert(sizeof(Queue) * kMaxGpus <= 4096);

// Set in the daemon before it forks, read in its worker children (copies of
// this process's memory, the page shared).
int g_fd = -1;
Queue* g_queues = nullptr;
bool g_resets_too = true;

// The record-lock bytes: GPU d's door, then its tickets'.
constexpr off_t kSpan = off_t{kTicketBytes} + 1;
off_t door_byte(int d) { return off_t{d} * kSpan; }
off_t ticket_byte(int d, std::uint32_t t) { return off_t{d} * kSpan + 1 + (t % kTicketBytes); }

bool set_lock(off_t at, short type, bool wait) noexcept {
  struct flock l {};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = at;
  l.l_len = 1;
  int rc;
  do {
    rc = ::fcntl(g_fd, wait ? F_SETLKW : F_SETLK, &l);
  } while (rc != 0 && errno == EINTR);
  return rc == 0;
}

// Whether another process holds the byte at `at`.
bool held_elsewhere(off_t at) noexcept {
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  l.l_start = at;
  l.l_len = 1;
  if (::fcntl(g_fd, F_GETLK, &l) != 0) return true;  // cannot tell: take it for alive
  return l.l_type != F_UNLCK;
}

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t seen, std::chrono::microseconds at_most) noexcept {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(at_most.count() / 1000000);
  ts.tv_nsec = static_cast<long>((at_most.count() % 1000000) * 1000);
  // Shared (not FUTEX_PRIVATE): the word is on a page other processes map.
  (void)::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept {
  (void)::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Waits a little for ticket `s`, GPU d's served one, to end; serves the next
// if its holder is gone (or has just served it: which, the door says).
void await_served(int d, Queue& q, std::uint32_t s) noexcept {
  if (held_elsewhere(ticket_byte(d, s))) {
    // Woken when a turn ends; the timeout bounds how late a dead holder is seen.
    futex_wait(q.serving, s, std::chrono::milliseconds(5));
    return;
  }
  (void)set_lock(door_byte(d), F_WRLCK, true);
  std::uint32_t expected = s;
  if (!held_elsewhere(ticket_byte(d, s)) && q.serving.compare_exchange_strong(expected, s + 1))
    futex_wake_all(q.serving);
  (void)set_lock(door_byte(d), F_UNLCK, false);
}

}  // namespace

bool open_for_workers(bool resets_too) noexcept {
  g_resets_too = resets_too;
  if (g_fd >= 0) return true;
  // Not close-on-exec: nothing execs, and the workers are forks.
  const int fd = ::memfd_create("ivcuda-context-turns", 0);
  if (fd < 0) return false;
  if (::ftruncate(fd, 4096) != 0) {
    ::close(fd);
    return false;
  }
  void* page = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (page == MAP_FAILED) {
    ::close(fd);
    return false;
  }
  g_queues = new (page) Queue[kMaxGpus]{};  // a new file's bytes are zero: every queue empty
  g_fd = fd;
  return true;
}

bool enabled() noexcept { return g_fd >= 0; }

Turn::Turn(int device, Work work) noexcept : device_(device) {
  if (g_fd < 0 || device < 0 || device >= kMaxGpus || (work == Work::kReset && !g_resets_too)) return;
  Queue& q = g_queues[device];
  const auto t0 = std::chrono::steady_clock::now();
  // Work made ahead asks only once nobody is queued.
  while (work == Work::kMakeAhead && std::chrono::steady_clock::now() - t0 < kMaxWait) {
    const std::uint32_t s = q.serving.load(std::memory_order_acquire);
    if (q.next.load(std::memory_order_acquire) == s) break;
    await_served(device, q, s);
  }
  // The ticket and its byte together, behind the door.
  if (!set_lock(door_byte(device), F_WRLCK, true)) return;  // no turns to be had: go ahead
  ticket_ = q.next.fetch_add(1, std::memory_order_acq_rel);
  queued_ = set_lock(ticket_byte(device, ticket_), F_WRLCK, false);
  (void)set_lock(door_byte(device), F_UNLCK, false);
  if (!queued_) return;  // its byte is another's (more than kTicketBytes asking): go ahead
  ahead_ = ticket_ - q.serving.load(std::memory_order_acquire);
  const auto queued_at = std::chrono::steady_clock::now();
  for (;;) {
    const std::uint32_t s = q.serving.load(std::memory_order_acquire);
    if (s == ticket_) {
      held_ = true;
      break;
    }
    if (std::chrono::steady_clock::now() - queued_at >= kMaxWait) break;
    await_served(device, q, s);
  }
  waited_ = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
}

Turn::~Turn() {
  if (!queued_) return;
  Queue& q = g_queues[device_];
  // Serve the next (only if this ticket is the one served: one that went
  // ahead after kMaxWait leaves the counter alone, and is passed over when
  // its turn comes, its byte free by then).
  std::uint32_t expected = ticket_;
  if (q.serving.compare_exchange_strong(expected, ticket_ + 1, std::memory_order_acq_rel))
    futex_wake_all(q.serving);
  (void)set_lock(ticket_byte(device_, ticket_), F_UNLCK, false);
}

}  // namespace ivcuda::host::context_turns
