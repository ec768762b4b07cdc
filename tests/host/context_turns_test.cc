// A GPU's turns between workers (host-daemon/shared/context_turns.h): one
// holder at a time per GPU, another GPU's turn is free meanwhile, and a
// holder that dies hands its turn on at once.
#include "host-daemon/shared/context_turns.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

namespace ct = ivcuda::host::context_turns;
using namespace std::chrono_literals;

namespace {
// A child (a worker, as the daemon forks them) that takes GPU `device`'s turn,
// says so on `ready`, and holds it for `hold` (forever if zero).
pid_t holder(int device, std::chrono::milliseconds hold, int ready) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  const ct::Turn turn(device);
  const char c = turn.held() ? 'y' : 'n';
  (void)!::write(ready, &c, 1);
  if (hold == 0ms) {
    for (;;) ::pause();
  }
  std::this_thread::sleep_for(hold);
  ::_exit(0);
}
char await_ready(int fd) {
  char c = 0;
  return ::read(fd, &c, 1) == 1 ? c : 0;
}
}  // namespace

TEST_CASE("workers take a GPU's turns one at a time, and a dead holder's turn is free", "[host][turns]") {
  REQUIRE(ct::open_for_workers());
  REQUIRE(ct::enabled());
  int p[2];
  REQUIRE(::pipe(p) == 0);

  // A holder for 300 ms: GPU 0's turn waits for it, GPU 1's does not.
  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = holder(0, 300ms, p[1]);
  REQUIRE(pid > 0);
  REQUIRE(await_ready(p[0]) == 'y');
  {
    const ct::Turn other(1);
    CHECK(other.held());
    CHECK(other.waited() < 100ms);
  }
  {
    const ct::Turn mine(0);
    CHECK(mine.held());
    CHECK(std::chrono::steady_clock::now() - t0 >= 250ms);  // not before the holder let go
    CHECK(mine.waited() < ct::kMaxWait);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);

  // A holder that never lets go, killed: the turn is free at once.
  pid = holder(0, 0ms, p[1]);
  REQUIRE(pid > 0);
  REQUIRE(await_ready(p[0]) == 'y');
  REQUIRE(::kill(pid, SIGKILL) == 0);
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  {
    const ct::Turn mine(0);
    CHECK(mine.held());
    CHECK(mine.waited() < 100ms);
  }
  ::close(p[0]);
  ::close(p[1]);
}
