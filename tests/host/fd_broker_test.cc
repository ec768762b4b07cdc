// The daemon's broker: what a tenant's workers share (deposited fds and the
// registry) travels over their lines, only within the tenant the daemon filed
// each line's guest under; forged tokens, malformed messages, lines that end
// and guests that leave get or keep nothing; caps hold per guest and tenant.
#include "host-daemon/daemon/fd_broker.h"
#include "host-daemon/shared/broker_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <functional>
#include <future>
#include <optional>

#include "ring/sys.h"

using ivcuda::host::BrokerClient;
using ivcuda::host::BrokerToken;
using ivcuda::host::FdBroker;
using ivcuda::host::ShareEntry;
using ivcuda::host::ShareKind;
using ivcuda::host::Tenancy;

namespace {

// Runs a client call on a thread while the daemon side serves it. The thread and its future are
// one instantiation (a std::function), not one per call site: 33 of them made this the slowest
// file of the test build (21 s at -O0, 49 s under the sanitizers).
void serve_during(FdBroker& b, const std::function<void()>& call) {
  auto fut = std::async(std::launch::async, call);
  while (fut.wait_for(std::chrono::milliseconds(0)) != std::future_status::ready) {
    std::vector<pollfd> p;
    for (int fd : b.fds()) p.push_back(pollfd{fd, POLLIN, 0});
    if (::poll(p.data(), p.size(), 10) <= 0) continue;
    for (const auto& x : p)
      if ((x.revents & (POLLIN | POLLHUP)) != 0) b.serve(x.fd);
  }
  fut.get();
}

template <class F>
auto served(FdBroker& b, F&& call) {
  std::optional<decltype(call())> out;
  serve_during(b, [&] { out.emplace(call()); });
  return std::move(*out);
}

// Serves until the daemon has noticed every line that hung up.
void settle(FdBroker& b) {
  for (int i = 0; i < 20; ++i) {
    std::vector<pollfd> p;
    for (int fd : b.fds()) p.push_back(pollfd{fd, POLLIN, 0});
    if (::poll(p.data(), p.size(), 10) <= 0) return;
    for (const auto& x : p)
      if (x.revents != 0) b.serve(x.fd);
  }
}

ino_t inode(int fd) {
  struct stat st {};
  REQUIRE(::fstat(fd, &st) == 0);
  return st.st_ino;
}

BrokerClient line(FdBroker& b, std::uint32_t guest, Tenancy t = Tenancy::own()) {
  auto e = b.add_worker(guest, t);
  REQUIRE(e);
  return BrokerClient(e->release());
}

ShareEntry ipc_entry(std::uint64_t key) {
  ShareEntry e;
  e.kind = ShareKind::kIpcMem;
  e.key = e.base = key;
  e.size = 1 << 16;
  e.payload[0] = std::byte{0x5a};
  return e;
}

}  // namespace

TEST_CASE("fd broker: a tenant's worker fetches what another deposited, other tenants and forged tokens get nothing") {
  FdBroker b;
  BrokerClient w1 = line(b, 1), w2 = line(b, 1), other = line(b, 2);  // guest 1 has two workers
  auto mem = ivcuda::sys::make_memfd("broker-test", 4096);
  REQUIRE(mem);
  auto tok = ivcuda::host::new_broker_token();
  REQUIRE(tok);
  REQUIRE(served(b, [&] { return w1.deposit(*tok, mem->get(), 4096); }));
  CHECK(b.deposits_of(1) == 1);
  CHECK(b.deposits_of(2) == 0);

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

TEST_CASE("fd broker: processes of one user on one socket share, other users, sockets and VMs never") {
  FdBroker b;
  const auto alice = Tenancy::user(0, 1000);
  BrokerClient a1 = line(b, 1, alice), a2 = line(b, 2, alice);
  BrokerClient bob = line(b, 3, Tenancy::user(0, 2000));
  BrokerClient alice_elsewhere = line(b, 4, Tenancy::user(1, 1000));
  BrokerClient vm = line(b, 5, alice);  // QEMU run by the same user: its supervisor asks a line first
  auto vm_worker = served(b, [&] { return vm.new_line(); });
  REQUIRE(vm_worker);
  BrokerClient vm_process(vm_worker->release());

  auto mem = ivcuda::sys::make_memfd("broker-test", 4096);
  REQUIRE(mem);
  auto tok = ivcuda::host::new_broker_token();
  REQUIRE(tok);
  REQUIRE(served(b, [&] { return a1.deposit(*tok, mem->get(), 4096); }));
  auto ticket = served(b, [&] { return a1.publish(ipc_entry(0x1000)); });
  REQUIRE(ticket);

  CHECK(served(b, [&] { return a2.fetch(*tok); }));
  auto seen = served(b, [&] { return a2.lookup(ShareKind::kIpcMem, *ticket); });
  REQUIRE(seen);
  CHECK_FALSE(seen->mine);
  CHECK(seen->entry.payload[0] == std::byte{0x5a});
  CHECK(seen->entry.base == 0);  // the exporter's address is not told to another worker
  auto own = served(b, [&] { return a1.lookup(ShareKind::kIpcMem, *ticket); });
  REQUIRE(own);
  CHECK(own->mine);
  CHECK(own->entry.base == 0x1000);
  for (BrokerClient* stranger : {&bob, &alice_elsewhere, &vm_process}) {
    auto f = served(b, [&] { return stranger->fetch(*tok); });
    REQUIRE_FALSE(f);
    CHECK(f.error().code == ENOENT);
    auto l = served(b, [&] { return stranger->lookup(ShareKind::kIpcMem, *ticket); });
    REQUIRE_FALSE(l);
    CHECK(l.error().code == ENOENT);
  }
  // The VM's own processes share among themselves.
  auto vm_ticket = served(b, [&] { return vm_process.publish(ipc_entry(0x2000)); });
  REQUIRE(vm_ticket);
  CHECK(served(b, [&] { return vm.lookup(ShareKind::kIpcMem, *vm_ticket); }));
  CHECK_FALSE(served(b, [&] { return a1.lookup(ShareKind::kIpcMem, *vm_ticket); }));
}

TEST_CASE("fd broker: a warm worker's line shares nothing until its guest is admitted") {
  FdBroker b;
  BrokerClient owner = line(b, 1, Tenancy::user(0, 1000));
  BrokerClient warm = line(b, 9, Tenancy::pending());
  auto mem = ivcuda::sys::make_memfd("broker-test", 4096);
  REQUIRE(mem);
  auto tok = ivcuda::host::new_broker_token();
  REQUIRE(tok);
  REQUIRE(served(b, [&] { return owner.deposit(*tok, mem->get(), 4096); }));
  auto early = served(b, [&] { return warm.fetch(*tok); });
  REQUIRE_FALSE(early);
  CHECK(early.error().code == EACCES);
  auto pub = served(b, [&] { return warm.publish(ipc_entry(1)); });
  REQUIRE_FALSE(pub);
  CHECK(pub.error().code == EACCES);
  b.admit(9, Tenancy::user(0, 1000));  // its guest came: the same user
  CHECK(served(b, [&] { return warm.fetch(*tok); }));
  b.admit(9, Tenancy::user(0, 2000));  // decided already: a second admission changes nothing
  CHECK(served(b, [&] { return warm.fetch(*tok); }));
}

TEST_CASE("fd broker: a malformed message drops that line only, and what a line or a guest shared goes with it") {
  FdBroker b;
  auto e1 = b.add_worker(7);
  REQUIRE(e1);
  ivcuda::sys::UniqueFd raw(e1->release());
  BrokerClient w2 = line(b, 7), w3 = line(b, 7), later = line(b, 7);
  auto mem = ivcuda::sys::make_memfd("broker-test", 4096);
  REQUIRE(mem);
  auto tok = ivcuda::host::new_broker_token();
  auto tok3 = ivcuda::host::new_broker_token();
  REQUIRE(tok);
  REQUIRE(tok3);
  REQUIRE(served(b, [&] { return w2.deposit(*tok, mem->get(), 8192); }));
  REQUIRE(served(b, [&] { return w3.deposit(*tok3, mem->get(), 8192); }));
  auto ticket = served(b, [&] { return w2.publish(ipc_entry(0x1000)); });
  REQUIRE(ticket);
  const char junk[5] = {1, 2, 3, 4, 5};
  REQUIRE(::send(raw.get(), junk, sizeof junk, 0) == 5);
  settle(b);
  CHECK(b.fds().size() == 3);
  char c;
  CHECK(::recv(raw.get(), &c, 1, MSG_DONTWAIT) == 0);  // the daemon hung up on it
  CHECK(served(b, [&] { return later.fetch(*tok); }));
  // w2's worker ends: its deposit and its entry go; w3's stay.
  w2 = BrokerClient{};
  settle(b);
  CHECK_FALSE(served(b, [&] { return later.fetch(*tok); }));
  CHECK_FALSE(served(b, [&] { return later.lookup(ShareKind::kIpcMem, *ticket); }));
  CHECK(served(b, [&] { return later.fetch(*tok3); }));
  CHECK(b.deposits_of(7) == 1);
  // The guest's connection ends: its lines close and nothing of it stays.
  b.end_guest(7);
  CHECK(b.fds().empty());
  CHECK(b.deposits_of(7) == 0);
  BrokerClient next = line(b, 8);  // a later guest
  CHECK_FALSE(served(b, [&] { return next.fetch(*tok3); }));
}

TEST_CASE("fd broker: deposits are capped per guest, per tenant and in all") {
  ivcuda::host::BrokerLimits lim;
  lim.deposits_per_guest = 2;
  lim.deposits_per_tenant = 3;
  lim.deposits = 4;
  FdBroker b(lim);
  const auto alice = Tenancy::user(0, 1000);
  BrokerClient a1 = line(b, 1, alice), a2 = line(b, 2, alice), bob = line(b, 3, Tenancy::user(0, 2000));
  auto mem = ivcuda::sys::make_memfd("broker-test", 4096);
  REQUIRE(mem);
  auto deposit = [&](BrokerClient& w) {
    auto t = ivcuda::host::new_broker_token();
    REQUIRE(t);
    auto r = served(b, [&] { return w.deposit(*t, mem->get(), 4096); });
    return r ? 0 : r.error().code;
  };
  CHECK(deposit(a1) == 0);
  CHECK(deposit(a1) == 0);
  CHECK(deposit(a1) == ENOSPC);  // the guest's cap
  CHECK(deposit(a2) == 0);       // its sibling still has room
  CHECK(deposit(a2) == ENOSPC);  // the tenant's cap
  CHECK(deposit(bob) == 0);
  CHECK(deposit(bob) == ENOSPC);  // the daemon's
}
