// The ring across a process boundary: a memfd mapped by a parent and a forked
// child at different addresses (the ring holds no pointers, only indices),
// requests one way, responses the other, eventfd doorbells both ways - the
// shape of process mode between the guest library and ivcudad. Each side
// answers late now and then so that the other falls asleep: both doorbells
// are used, and a wait that ends by timeout would be a lost wake-up.
#include <catch2/catch.hpp>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <random>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "ring/spsc_ring.h"
#include "ring/sys.h"
#include "ring/wait.h"

using namespace ivcuda;
using ring::RingStatus;

namespace {

constexpr std::uint32_t kRingBytes = 16 * 1024;
constexpr std::uint32_t kCells = kRingBytes / abi::kCellBytes;
constexpr std::uint32_t kRoundTrips = 20'000;
constexpr std::uint32_t kMaxReqLen = 600;

constexpr std::uint16_t kOpHello = 1;  // child -> parent: its mapping address
constexpr std::uint16_t kOpEcho = 2;   // payload comes back inverted
constexpr std::uint16_t kOpQuit = 3;

// Child exit codes, so the parent can say what went wrong.
enum ChildExit : int {
  kChildOk = 0,
  kChildMapFailed = 10,
  kChildSameAddress = 11,
  kChildCorrupt = 12,
  kChildBadRequest = 13,
  kChildRingStuck = 14,
};

ring::RingView req_ring(std::byte* base) {
  return {reinterpret_cast<abi::RingCtl*>(base), base + sizeof(abi::RingCtl), kCells};
}
ring::RingView cpl_ring(std::byte* base) {
  std::byte* p = base + sizeof(abi::RingCtl) + kRingBytes;
  return {reinterpret_cast<abi::RingCtl*>(p), p + sizeof(abi::RingCtl), kCells};
}

std::byte req_byte(std::uint32_t seq, std::uint32_t i) noexcept {
  return static_cast<std::byte>((seq * 131u + i * 7u) ^ (i >> 8));
}

// An eventfd waiter that counts waits which ended without a ring. The peer
// answers within microseconds, so with a 1 s timeout such a wait is a lost
// wake-up.
class CountingWaiter final : public ring::Waiter {
 public:
  explicit CountingWaiter(int fd) : fd_(fd) {}
  void wait(int timeout_ms) noexcept override {
    if (sys::wait_readable(fd_, timeout_ms))
      sys::eventfd_drain(fd_);
    else
      ++timeouts;
  }
  std::uint64_t timeouts = 0;

 private:
  int fd_;
};

// Waits for a record on c: spins briefly, then sleeps on the eventfd.
template <class Extra>
bool wait_for_record(ring::Consumer& c, ring::Waiter& w, Extra&& give_up) {
  ring::SpinPolicy pol;
  pol.spin = std::chrono::microseconds(5);
  pol.block_timeout_ms = 1000;
  bool stop = false;
  ring::spin_then_block([&] { return c.has_data() || c.corrupt() || (stop = give_up()); },
                        [&](bool on) {
                          if (on)
                            c.prepare_sleep();
                          else
                            c.end_sleep();
                        },
                        w, pol);
  return !stop;
}

// Waits until the producer has room, re-reading the consumer's head.
template <class Extra>
std::byte* reserve_wait(ring::Producer& p, const abi::RecordHeader& h, Extra&& give_up) {
  for (;;) {
    RingStatus st;
    if (std::byte* d = p.reserve(h, &st)) return d;
    if (st != RingStatus::kFull || give_up()) return nullptr;
    std::this_thread::yield();
  }
}

// The responder. Never returns; never touches the parent's mapping.
[[noreturn]] void child_main(int memfd, std::size_t size, sys::Mapping parents, int req_fd,
                             int cpl_fd) {
  // A dead or stuck parent must not leave this process behind.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  ::alarm(60);
  auto mine = sys::Mapping::map_shared(memfd, size);
  if (!mine) ::_exit(kChildMapFailed);
  if (mine->data() == parents.data()) ::_exit(kChildSameAddress);
  const std::uint64_t parent_addr = reinterpret_cast<std::uintptr_t>(parents.data());
  // From here on only our own mapping exists in this process: a stray use of
  // the parent's address would fault.
  parents.reset();

  ring::Consumer req(req_ring(mine->data()));
  ring::EventfdDoorbell bell(cpl_fd);
  ring::Producer cpl(cpl_ring(mine->data()), &bell);
  CountingWaiter waiter(req_fd);
  std::uint64_t rings = 0;
  auto never = [] { return false; };

  {
    abi::RecordHeader h{};
    h.op = kOpHello;
    h.len = 16;
    std::byte* d = reserve_wait(cpl, h, never);
    if (d == nullptr) ::_exit(kChildCorrupt);
    const std::uint64_t addrs[2] = {reinterpret_cast<std::uintptr_t>(mine->data()), parent_addr};
    std::memcpy(d, addrs, sizeof addrs);
    cpl.commit();
    cpl.publish();
  }

  ring::Record rec;
  for (;;) {
    const RingStatus st = req.poll(&rec);
    if (st == RingStatus::kCorrupt) ::_exit(kChildCorrupt);
    if (st == RingStatus::kEmpty) {
      // Responses first: the parent may be waiting for them to send more.
      if (cpl.publish()) ++rings;
      req.publish_head();
      wait_for_record(req, waiter, never);
      continue;
    }
    abi::RecordHeader h{};
    h.op = rec.hdr.op;
    h.seq = rec.hdr.seq;
    h.len = rec.hdr.op == kOpEcho ? rec.hdr.len : 0;
    h.status = static_cast<std::int32_t>(rec.hdr.seq * 3u);
    // Now and then answer late, so that the parent falls asleep and this
    // side's doorbell is needed.
    if (rec.hdr.seq % 1000 == 500) ::usleep(300);
    if (rec.hdr.op == kOpEcho) {
      for (std::uint32_t i = 0; i < rec.hdr.len; ++i)
        if (rec.payload[i] != req_byte(rec.hdr.seq, i)) ::_exit(kChildBadRequest);
    } else if (rec.hdr.op != kOpQuit) {
      ::_exit(kChildBadRequest);
    }
    const bool quit = rec.hdr.op == kOpQuit;
    const std::uint64_t stats[2] = {rings, waiter.timeouts};
    if (quit) h.len = sizeof stats;
    std::byte* d = reserve_wait(cpl, h, never);
    if (d == nullptr) ::_exit(kChildCorrupt);
    if (quit)
      std::memcpy(d, stats, sizeof stats);
    else
      for (std::uint32_t i = 0; i < h.len; ++i) d[i] = ~rec.payload[i];
    cpl.commit();
    req.consume();
    if (quit) {
      cpl.publish();
      req.publish_head();
      // Wait until the parent took the last response; then our pages can go.
      for (int i = 0; i < 60'000 && !cpl.drained(); ++i) ::usleep(1000);
      ::_exit(cpl.drained() ? kChildOk : kChildRingStuck);
    }
  }
}

}  // namespace

TEST_CASE("parent and child exchange records through a memfd mapped at different addresses",
          "[ring][xproc][slow]") {
  const std::size_t size = abi::channel_rings_bytes(kRingBytes);
  auto memfd = sys::make_memfd("ivcuda-xproc-test", size);
  REQUIRE(memfd);
  auto req_efd = sys::make_eventfd(true);
  auto cpl_efd = sys::make_eventfd(true);
  REQUIRE(req_efd);
  REQUIRE(cpl_efd);
  auto map = sys::Mapping::map_shared(memfd->get(), size);
  REQUIRE(map);

  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) child_main(memfd->get(), size, std::move(*map), req_efd->get(), cpl_efd->get());

  // Give up when the child hangs, or died: peeked every few milliseconds
  // (without reaping it) so that the spin loops stay free of system calls.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  auto next_peek = std::chrono::steady_clock::now();
  auto late = [&] {
    const auto now = std::chrono::steady_clock::now();
    if (now < next_peek) return false;
    next_peek = now + std::chrono::milliseconds(5);
    siginfo_t info{};
    const bool died = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                      info.si_pid == pid;
    return died || now > deadline;
  };
  ring::EventfdDoorbell bell(req_efd->get());
  ring::Producer req(req_ring(map->data()), &bell);
  ring::Consumer cpl(cpl_ring(map->data()));
  CountingWaiter waiter(cpl_efd->get());

  // Returns the next response, or nullptr (timeout or corruption).
  ring::Record rec;
  auto next_response = [&]() -> const ring::Record* {
    for (;;) {
      const RingStatus st = cpl.poll(&rec);
      if (st == RingStatus::kOk) return &rec;
      if (st == RingStatus::kCorrupt) return nullptr;
      cpl.publish_head();
      if (!wait_for_record(cpl, waiter, late)) return nullptr;
    }
  };

  bool ok = true;
  const ring::Record* r = next_response();
  REQUIRE(r != nullptr);
  REQUIRE(r->hdr.op == kOpHello);
  REQUIRE(r->payload.size() == 16);
  std::uint64_t addrs[2];
  std::memcpy(addrs, r->payload.data(), sizeof addrs);
  CHECK(addrs[1] == reinterpret_cast<std::uintptr_t>(map->data()));
  CHECK(addrs[0] != reinterpret_cast<std::uintptr_t>(map->data()));
  cpl.consume();

  std::mt19937 rng(12345);
  std::uint32_t sent = 0;
  std::uint32_t rings = 0;
  while (ok && sent < kRoundTrips) {
    // A small pipeline: up to 8 requests per publish, then all their answers.
    const std::uint32_t batch = std::min<std::uint32_t>(1 + rng() % 8, kRoundTrips - sent);
    for (std::uint32_t i = 0; i < batch; ++i) {
      abi::RecordHeader h{};
      h.op = kOpEcho;
      h.seq = sent + i;
      h.len = rng() % (kMaxReqLen + 1);
      std::byte* d = reserve_wait(req, h, late);
      if (d == nullptr) {
        ok = false;
        break;
      }
      for (std::uint32_t j = 0; j < h.len; ++j) d[j] = req_byte(h.seq, j);
      req.commit();
    }
    if (!ok) break;
    if (req.publish()) ++rings;
    for (std::uint32_t i = 0; i < batch; ++i) {
      r = next_response();
      if (r == nullptr) {
        ok = false;
        break;
      }
      const std::uint32_t seq = sent + i;
      bool good = r->hdr.op == kOpEcho && r->hdr.seq == seq &&
                  r->hdr.status == static_cast<std::int32_t>(seq * 3u);
      for (std::uint32_t j = 0; good && j < r->payload.size(); ++j)
        good = r->payload[j] == ~req_byte(seq, j);
      if (!good) {
        FAIL_CHECK("bad response to request " << seq << ": op " << r->hdr.op << " seq "
                                              << r->hdr.seq << " len " << r->hdr.len);
        ok = false;
        break;
      }
      cpl.consume();
    }
    sent += batch;
    // Now and then let the child fall asleep, so the doorbell path runs.
    if (sent % 1000 < batch) std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  CHECK(ok);
  CHECK(sent == kRoundTrips);
  CHECK(rings > 0);

  if (ok) {
    abi::RecordHeader h{};
    h.op = kOpQuit;
    h.seq = sent;
    REQUIRE(reserve_wait(req, h, late) != nullptr);
    req.commit();
    req.publish();
    r = next_response();
    REQUIRE(r != nullptr);
    REQUIRE(r->hdr.op == kOpQuit);
    REQUIRE(r->payload.size() == 16);
    std::uint64_t child[2];  // doorbells the child rang, its waits that timed out
    std::memcpy(child, r->payload.data(), sizeof child);
    CAPTURE(child[0], child[1], waiter.timeouts);
    CHECK(child[0] > 0);
    CHECK(child[1] == 0);          // no wake-up lost either way
    CHECK(waiter.timeouts == 0);
    cpl.consume();
    cpl.publish_head();
  } else {
    ::kill(pid, SIGKILL);
  }

  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  INFO("child wait status " << status);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == kChildOk);
}
