#include "host-daemon/shared/context_turns.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

namespace ivcuda::host::context_turns {
namespace {
// The memory file's descriptor: set in the daemon before it forks, read in
// its worker children (a copy of this process's memory).
int g_fd = -1;

bool lock(int device, short type, bool wait) noexcept {
  struct flock l {};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = device;
  l.l_len = 1;
  int rc;
  do {
    rc = ::fcntl(g_fd, wait ? F_SETLKW : F_SETLK, &l);
  } while (rc != 0 && errno == EINTR && wait);
  return rc == 0;
}
}  // namespace

bool open_for_workers() noexcept {
  if (g_fd >= 0) return true;
  // Not close-on-exec: nothing execs, and the workers are forks. Record locks
  // need no bytes behind them.
  const int fd = ::memfd_create("ivcuda-context-turns", 0);
  if (fd < 0) return false;
  g_fd = fd;
  return true;
}

bool enabled() noexcept { return g_fd >= 0; }

Turn::Turn(int device) noexcept : device_(device) {
  if (g_fd < 0 || device < 0) return;
  const auto t0 = std::chrono::steady_clock::now();
  // Polled rather than F_SETLKW, so that the wait has an end: a turn comes
  // within one context's time, and the 1 ms between polls is under 1 % of it.
  for (;;) {
    if (lock(device, F_WRLCK, false)) {
      held_ = true;
      break;
    }
    if (errno != EACCES && errno != EAGAIN) break;  // no turns to be had: go ahead
    if (std::chrono::steady_clock::now() - t0 >= kMaxWait) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  waited_ = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
}

Turn::~Turn() {
  if (held_) (void)lock(device_, F_UNLCK, false);
}

}  // namespace ivcuda::host::context_turns
