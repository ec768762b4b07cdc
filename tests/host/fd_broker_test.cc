// The daemon's fd broker: a tenant's workers pass exported fds by token;
// other tenants, forged tokens and malformed messages get nothing.
#include "host-daemon/fd_broker.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <future>

#include "ring/sys.h"

using ivcuda::host::BrokerClient;
using ivcuda::host::BrokerToken;
using ivcuda::host::FdBroker;

namespace {

// Runs a client call on a thread while the daemon side serves it.
template <class F>
auto served(FdBroker& b, F&& call) {
  auto fut = std::async(std::launch::async, std::forward<F>(call));
  while (fut.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready) {
    std::vector<pollfd> p;
    for (int fd : b.fds()) p.push_back(pollfd{fd, POLLIN, 0});
    if (::poll(p.data(), p.size(), 10) <= 0) continue;
    for (const auto& x : p)
      if ((x.revents & (POLLIN | POLLHUP)) != 0) b.serve(x.fd);
  }
  return fut.get();
}

ino_t inode(int fd) {
  struct stat st {};
  REQUIRE(::fstat(fd, &st) == 0);
  return st.st_ino;
}

}  // namespace

TEST_CASE("fd broker: a tenant's worker fetches what another deposited, other tenants and forged tokens get nothing") {
  FdBroker b;
  auto e1 = b.add_worker(1), e2 = b.add_worker(1), e3 = b.add_worker(2);
  REQUIRE(e1);
  REQUIRE(e2);
  REQUIRE(e3);
  BrokerClient w1(e1->release()), w2(e2->release()), other(e3->release());
  auto mem = ivcuda::sys::make_memfd("broker-test", 4096);
  REQUIRE(mem);
  auto tok = ivcuda::host::new_broker_token();
  REQUIRE(tok);
  REQUIRE(served(b, [&] { return w1.deposit(*tok, mem->get(), 4096); }));
  CHECK(b.deposits(1) == 1);
  CHECK(b.deposits(2) == 0);

  auto got = served(b, [&] { return w2.fetch(*tok); });
  REQUIRE(got);
  CHECK(inode(got->first.get()) == inode(mem->get()));
  CHECK(got->second == 4096);
  auto again = served(b, [&] { return w1.fetch(*tok); });  // the exporter itself, and twice
  REQUIRE(again);

  auto foreign = served(b, [&] { return other.fetch(*tok); });
  REQUIRE_FALSE(foreign);
  CHECK(foreign.error().code == ENOENT);
  BrokerToken forged = *tok;
  forged[7] ^= 1;
  auto f = served(b, [&] { return w2.fetch(forged); });
  REQUIRE_FALSE(f);
  CHECK(f.error().code == ENOENT);
  // A token deposited twice is refused, and the first deposit stays.
  auto dup = served(b, [&] { return w2.deposit(*tok, mem->get(), 1); });
  REQUIRE_FALSE(dup);
  CHECK(dup.error().code == EEXIST);
  CHECK(served(b, [&] { return w2.fetch(*tok); })->second == 4096);
}

TEST_CASE("fd broker: a malformed message drops that worker only, a tenant without workers loses its deposits") {
  FdBroker b;
  auto e1 = b.add_worker(7), e2 = b.add_worker(7);
  REQUIRE(e1);
  REQUIRE(e2);
  ivcuda::sys::UniqueFd raw(e1->release());
  BrokerClient w2(e2->release());
  auto mem = ivcuda::sys::make_memfd("broker-test", 4096);
  REQUIRE(mem);
  auto tok = ivcuda::host::new_broker_token();
  REQUIRE(tok);
  REQUIRE(served(b, [&] { return w2.deposit(*tok, mem->get(), 8192); }));
  const char junk[5] = {1, 2, 3, 4, 5};
  REQUIRE(::send(raw.get(), junk, sizeof junk, 0) == 5);
  std::vector<pollfd> p;
  for (int fd : b.fds()) p.push_back(pollfd{fd, POLLIN, 0});
  REQUIRE(::poll(p.data(), p.size(), 1000) >= 1);
  for (const auto& x : p)
    if ((x.revents & POLLIN) != 0) b.serve(x.fd);
  CHECK(b.fds().size() == 1);
  char c;
  CHECK(::recv(raw.get(), &c, 1, MSG_DONTWAIT) == 0);  // the daemon hung up on it
  CHECK(served(b, [&] { return w2.fetch(*tok); }));
  w2 = BrokerClient{};  // the last worker of tenant 7 goes
  for (int i = 0; i < 100 && !b.fds().empty(); ++i) {
    for (int fd : b.fds()) b.serve(fd);
  }
  CHECK(b.fds().empty());
  CHECK(b.deposits(7) == 0);
}
