// The tenant registry that carries CUDA IPC and pool-pointer exports between
// a tenant's workers: tickets match only as issued, entries are per process, a full
// registry says so, and a worker that dies holding the lock or its entries
// leaves a usable registry behind.
#include "host-daemon/tenant_share.h"

#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

using ivcuda::host::decode_ticket;
using ivcuda::host::encode_ticket;
using ivcuda::host::ShareEntry;
using ivcuda::host::ShareKind;
using ivcuda::host::ShareTicket;
using ivcuda::host::TenantShare;

namespace {
ShareEntry entry(ShareKind kind, std::uint64_t key) {
  ShareEntry e;
  e.kind = kind;
  e.key = key;
  e.base = key;
  e.size = 4096;
  e.payload[0] = std::byte{0x42};
  return e;
}
}  // namespace

TEST_CASE("a ticket finds its entry only with the right kind, slot and token", "[host][ipc]") {
  auto share = TenantShare::create(8);
  REQUIRE(share);
  auto& s = **share;
  auto t = s.publish(entry(ShareKind::kIpcMem, 0x1000));
  REQUIRE(t);
  auto e = s.lookup(ShareKind::kIpcMem, *t);
  REQUIRE(e);
  CHECK(e->key == 0x1000);
  CHECK(e->owner_pid == ::getpid());
  CHECK(e->payload[0] == std::byte{0x42});
  CHECK_FALSE(s.lookup(ShareKind::kIpcEvent, *t));
  ShareTicket bad = *t;
  bad.token.w[1] ^= 1;
  CHECK_FALSE(s.lookup(ShareKind::kIpcMem, bad));
  bad = *t;
  bad.slot = 7;
  CHECK_FALSE(s.lookup(ShareKind::kIpcMem, bad));
  bad.slot = 1u << 30;  // out of range
  CHECK_FALSE(s.lookup(ShareKind::kIpcMem, bad));
  // A second registry (another tenant) never held this token.
  auto other = TenantShare::create(8);
  REQUIRE(other);
  REQUIRE((*other)->publish(entry(ShareKind::kIpcMem, 0x2000)));
  CHECK_FALSE((*other)->lookup(ShareKind::kIpcMem, *t));
  // Exporting again finds the same ticket; withdrawing forgets it.
  auto again = s.find_own(ShareKind::kIpcMem, 0x1000);
  REQUIRE(again);
  CHECK(again->slot == t->slot);
  CHECK(s.withdraw(ShareKind::kIpcMem, 0x1000) == 1);
  CHECK_FALSE(s.lookup(ShareKind::kIpcMem, *t));
  CHECK(s.in_use() == 0);
}

TEST_CASE("pool pointer exports are a kind of their own and keep the exporter's pool", "[host][ipc][pools]") {
  auto share = TenantShare::create(8);
  REQUIRE(share);
  auto& s = **share;
  ShareEntry e = entry(ShareKind::kPoolPtr, 0x7000);
  e.aux = 0xfeedull;  // the driver pool the pointer came from
  e.owner_proc = 42;
  for (std::size_t i = 0; i < e.payload.size(); ++i) e.payload[i] = static_cast<std::byte>(i);
  auto t = s.publish(e);
  REQUIRE(t);
  // IPC memory on the same key is another entry, and neither kind's ticket finds the other.
  auto ipc = s.publish(entry(ShareKind::kIpcMem, 0x7000));
  REQUIRE(ipc);
  CHECK_FALSE(s.lookup(ShareKind::kIpcMem, *t));
  CHECK_FALSE(s.lookup(ShareKind::kIpcEvent, *t));
  CHECK_FALSE(s.lookup(ShareKind::kPoolPtr, *ipc));
  auto got = s.lookup(ShareKind::kPoolPtr, *t);
  REQUIRE(got);
  CHECK(got->aux == 0xfeedull);
  CHECK(got->owner_proc == 42);
  CHECK(got->payload == e.payload);
  // The guest's 64 bytes: any byte flipped finds nothing.
  constexpr std::uint32_t kMagic = 0x50435649u;
  std::byte b[64];
  encode_ticket(kMagic, *t, b);
  for (std::size_t i = 0; i < sizeof b; ++i) {
    std::byte bad[64];
    std::memcpy(bad, b, sizeof b);
    bad[i] ^= std::byte{0x01};
    const auto d = decode_ticket(kMagic, bad);
    CHECK_FALSE((d && s.lookup(ShareKind::kPoolPtr, *d)));
  }
  auto again = s.find_own(ShareKind::kPoolPtr, 0x7000);
  REQUIRE(again);
  CHECK(again->slot == t->slot);
  // Withdrawing the pointer leaves the IPC export of the same address alone.
  CHECK(s.withdraw(ShareKind::kPoolPtr, 0x7000) == 1);
  CHECK_FALSE(s.lookup(ShareKind::kPoolPtr, *t));
  CHECK(s.lookup(ShareKind::kIpcMem, *ipc));
}

TEST_CASE("the 64 bytes a guest holds decode only as they were encoded", "[host][ipc]") {
  ShareTicket t{3, {{0x1122334455667788ull, 0x99aabbccddeeff00ull}}};
  std::byte b[64];
  encode_ticket(0x4d435649u, t, b);
  auto d = decode_ticket(0x4d435649u, b);
  REQUIRE(d);
  CHECK(d->slot == 3);
  CHECK(d->token.w[0] == t.token.w[0]);
  CHECK(d->token.w[1] == t.token.w[1]);
  CHECK_FALSE(decode_ticket(0x45435649u, b));  // another kind's magic
  b[40] = std::byte{1};                         // the tail must stay zero
  CHECK_FALSE(decode_ticket(0x4d435649u, b));
}

TEST_CASE("a full registry refuses, and a worker's entries go with it", "[host][ipc]") {
  auto share = TenantShare::create(4);
  REQUIRE(share);
  auto& s = **share;
  // Entries made by a child process (a worker) are visible here (the daemon).
  const pid_t child = ::fork();
  if (child == 0) {
    for (int i = 0; i < 3; ++i)
      if (!s.publish(entry(ShareKind::kIpcMem, 0x1000 + i))) ::_exit(1);
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(s.in_use() == 3);
  REQUIRE(s.publish(entry(ShareKind::kIpcEvent, 1)));
  auto full = s.publish(entry(ShareKind::kIpcEvent, 2));
  REQUIRE_FALSE(full);
  CHECK(full.error().code == ENOSPC);
  CHECK(s.withdraw(ShareKind::kIpcMem, 0x1000) == 0);  // not this process's entry
  CHECK(s.withdraw_owner(child, 1000) == 3);
  CHECK(s.in_use() == 1);
}

TEST_CASE("a worker that dies holding the registry's lock does not wedge it", "[host][ipc]") {
  auto share = TenantShare::create(4);
  REQUIRE(share);
  auto& s = **share;
  int go[2];
  REQUIRE(::pipe(go) == 0);
  const pid_t child = ::fork();
  if (child == 0) {
    // Stop inside publish while it holds the lock: getrandom runs before the
    // lock, so a stop signal from here lands in the loop of many publishes.
    ::close(go[0]);
    (void)!::write(go[1], "x", 1);
    for (;;) (void)s.publish(entry(ShareKind::kIpcMem, 1)), (void)s.withdraw(ShareKind::kIpcMem, 1);
  }
  ::close(go[1]);
  char c;
  REQUIRE(::read(go[0], &c, 1) == 1);
  ::usleep(20000);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  // Whether or not it died inside, the registry answers.
  CHECK(s.withdraw_owner(child, 1000) >= 0);
  auto t = s.publish(entry(ShareKind::kIpcMem, 2));
  REQUIRE(t);
  CHECK(s.lookup(ShareKind::kIpcMem, *t));
  ::close(go[0]);
}
