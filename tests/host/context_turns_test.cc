// A GPU's turns between workers (host-daemon/shared/context_turns.h): one
// holder at a time per GPU, another GPU's turn is free meanwhile, a holder
// that dies hands its turn on at once, turns go in the order they were asked
// for, a waiter that dies neither lets those behind it in early nor holds
// them up, and a context made ahead lets those queued after it go first.
#include "host-daemon/shared/context_turns.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

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

TEST_CASE("a GPU's turns go in the order they were asked for", "[host][turns]") {
  REQUIRE(ct::open_for_workers());
  int p[2];
  REQUIRE(::pipe(p) == 0);
  std::vector<pid_t> kids;
  {
    // This process holds GPU 2's turn while five workers ask for it, 40 ms
    // apart; a polled lock would hand it on in any order.
    const ct::Turn mine(2);
    REQUIRE(mine.held());
    for (char i = 0; i < 5; ++i) {
      const pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        {
          const ct::Turn turn(2);
          const char c = static_cast<char>(turn.held() ? '0' + i : 'x');
          (void)!::write(p[1], &c, 1);
          std::this_thread::sleep_for(5ms);
        }  // served the next on the way out
        ::_exit(0);
      }
      kids.push_back(pid);
      std::this_thread::sleep_for(40ms);
    }
  }
  std::string order;
  for (int i = 0; i < 5; ++i) order += await_ready(p[0]);
  CHECK(order == "01234");
  for (pid_t pid : kids) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
  }
  // All served: the next asker waits for nobody.
  const ct::Turn after(2);
  CHECK(after.held());
  CHECK(after.ahead() == 0);
  CHECK(after.waited() < 100ms);
  ::close(p[0]);
  ::close(p[1]);
}

TEST_CASE("a waiter that dies lets nobody in before the holder is done", "[host][turns]") {
  REQUIRE(ct::open_for_workers());
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t holding = holder(3, 400ms, p[1]);
  REQUIRE(holding > 0);
  REQUIRE(await_ready(p[0]) == 'y');
  // A second worker queues behind it and is killed while it waits.
  const pid_t waiting = ::fork();
  REQUIRE(waiting >= 0);
  if (waiting == 0) {
    const ct::Turn turn(3);
    ::_exit(0);
  }
  std::this_thread::sleep_for(50ms);
  std::thread killer([waiting] {
    std::this_thread::sleep_for(100ms);
    ::kill(waiting, SIGKILL);
  });
  {
    const ct::Turn mine(3);
    CHECK(mine.held());
    CHECK(mine.ahead() == 2);
    const auto at = std::chrono::steady_clock::now() - t0;
    CHECK(at >= 350ms);  // not before the holder let go
    CHECK(at < 1500ms);  // and soon after it did, the dead waiter passed over
  }
  killer.join();
  int status = 0;
  REQUIRE(::waitpid(waiting, &status, 0) == waiting);
  CHECK(WIFSIGNALED(status));
  REQUIRE(::waitpid(holding, &status, 0) == holding);
  ::close(p[0]);
  ::close(p[1]);
}

TEST_CASE("a context made ahead lets a worker that asked after it go first", "[host][turns]") {
  REQUIRE(ct::open_for_workers());
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t holding = holder(4, 300ms, p[1]);
  REQUIRE(holding > 0);
  REQUIRE(await_ready(p[0]) == 'y');
  // A worker a guest waits for asks 60 ms after this process asks for a
  // context made ahead, and holds its turn 100 ms.
  const pid_t urgent = ::fork();
  REQUIRE(urgent >= 0);
  if (urgent == 0) {
    std::this_thread::sleep_for(60ms);
    {
      const ct::Turn turn(4);
      const char c = turn.held() ? 'u' : 'x';
      (void)!::write(p[1], &c, 1);
      std::this_thread::sleep_for(100ms);
    }
    ::_exit(0);
  }
  {
    const ct::Turn mine(4, ct::Work::kMakeAhead);
    CHECK(mine.held());
    CHECK(mine.ahead() == 0);  // it asked once nobody was queued
    CHECK(std::chrono::steady_clock::now() - t0 >= 380ms);  // after the holder and the urgent one
    CHECK(await_ready(p[0]) == 'u');  // which had its turn already
  }
  int status = 0;
  REQUIRE(::waitpid(urgent, &status, 0) == urgent);
  REQUIRE(::waitpid(holding, &status, 0) == holding);
  ::close(p[0]);
  ::close(p[1]);
}
