// The registry that carries CUDA IPC and pool-pointer exports between a
// tenant's workers (the daemon keeps one per tenant): tickets match only as
// issued, an exporter's own names reach only its own line, one guest cannot
// take its tenant's room, and what a line or a guest published goes with it.
#include "host-daemon/shared/tenant_share.h"

#include <catch2/catch.hpp>

#include <cstring>

using ivcuda::host::decode_ticket;
using ivcuda::host::encode_ticket;
using ivcuda::host::ShareEntry;
using ivcuda::host::ShareKind;
using ivcuda::host::ShareOwner;
using ivcuda::host::ShareRegistry;
using ivcuda::host::ShareTicket;

namespace {
ShareEntry entry(ShareKind kind, std::uint64_t key) {
  ShareEntry e;
  e.kind = kind;
  e.key = key;
  e.base = key;
  e.size = 4096;
  e.aux = 0xabcull;
  e.payload[0] = std::byte{0x42};
  return e;
}
constexpr ShareOwner kLine1{1, 10}, kLine2{2, 10}, kOtherGuest{3, 20};
}  // namespace

TEST_CASE("a ticket finds its entry only with the right kind, slot and token", "[host][ipc]") {
  ShareRegistry s(8);
  auto t = s.publish(entry(ShareKind::kIpcMem, 0x1000), kLine1);
  REQUIRE(t);
  auto mine = s.lookup(ShareKind::kIpcMem, *t, kLine1.line);
  REQUIRE(mine);
  CHECK(mine->mine);
  CHECK(mine->entry.key == 0x1000);
  CHECK(mine->entry.payload[0] == std::byte{0x42});
  // Another worker learns the driver's handle and the size, none of the exporter's own names.
  auto theirs = s.lookup(ShareKind::kIpcMem, *t, kOtherGuest.line);
  REQUIRE(theirs);
  CHECK_FALSE(theirs->mine);
  CHECK(theirs->entry.payload[0] == std::byte{0x42});
  CHECK(theirs->entry.size == 4096);
  CHECK(theirs->entry.key == 0);
  CHECK(theirs->entry.base == 0);
  CHECK(theirs->entry.aux == 0);
  CHECK_FALSE(s.lookup(ShareKind::kIpcEvent, *t, kLine1.line));
  ShareTicket bad = *t;
  bad.token.w[1] ^= 1;
  CHECK_FALSE(s.lookup(ShareKind::kIpcMem, bad, kLine1.line));
  bad = *t;
  bad.slot = 7;
  CHECK_FALSE(s.lookup(ShareKind::kIpcMem, bad, kLine1.line));
  bad.slot = 1u << 30;  // out of range
  CHECK_FALSE(s.lookup(ShareKind::kIpcMem, bad, kLine1.line));
  // A second registry (another tenant) never held this token.
  ShareRegistry other(8);
  REQUIRE(other.publish(entry(ShareKind::kIpcMem, 0x2000), kLine1));
  CHECK_FALSE(other.lookup(ShareKind::kIpcMem, *t, kLine1.line));
  // Exporting again gives the same ticket; another line's export of the same key is its own.
  auto again = s.publish(entry(ShareKind::kIpcMem, 0x1000), kLine1);
  REQUIRE(again);
  CHECK(again->slot == t->slot);
  auto sibling = s.publish(entry(ShareKind::kIpcMem, 0x1000), kLine2);
  REQUIRE(sibling);
  CHECK(sibling->slot != t->slot);
  // Only the exporting line withdraws it.
  CHECK_FALSE(s.withdraw(ShareKind::kIpcMem, 0x1000, kOtherGuest.line));
  CHECK(s.withdraw(ShareKind::kIpcMem, 0x1000, kLine1.line));
  CHECK_FALSE(s.lookup(ShareKind::kIpcMem, *t, kLine1.line));
  CHECK(s.in_use() == 1);
}

TEST_CASE("pool pointer exports are a kind of their own and keep the exporter's pool", "[host][ipc][pools]") {
  ShareRegistry s(8);
  ShareEntry e = entry(ShareKind::kPoolPtr, 0x7000);
  e.aux = 0xfeedull;  // the driver pool the pointer came from
  e.owner_proc = 42;
  for (std::size_t i = 0; i < e.payload.size(); ++i) e.payload[i] = static_cast<std::byte>(i);
  auto t = s.publish(e, kLine1);
  REQUIRE(t);
  // IPC memory on the same key is another entry, and neither kind's ticket finds the other.
  auto ipc = s.publish(entry(ShareKind::kIpcMem, 0x7000), kLine1);
  REQUIRE(ipc);
  CHECK_FALSE(s.lookup(ShareKind::kIpcMem, *t, kLine1.line));
  CHECK_FALSE(s.lookup(ShareKind::kIpcEvent, *t, kLine1.line));
  CHECK_FALSE(s.lookup(ShareKind::kPoolPtr, *ipc, kLine1.line));
  auto got = s.lookup(ShareKind::kPoolPtr, *t, kLine1.line);
  REQUIRE(got);
  CHECK(got->entry.aux == 0xfeedull);
  CHECK(got->entry.owner_proc == 42);
  CHECK(got->entry.payload == e.payload);
  // The guest's 64 bytes: any byte flipped finds nothing.
  constexpr std::uint32_t kMagic = 0x50435649u;
  std::byte b[64];
  encode_ticket(kMagic, *t, b);
  for (std::size_t i = 0; i < sizeof b; ++i) {
    std::byte bad[64];
    std::memcpy(bad, b, sizeof b);
    bad[i] ^= std::byte{0x01};
    const auto d = decode_ticket(kMagic, bad);
    CHECK_FALSE((d && s.lookup(ShareKind::kPoolPtr, *d, kLine1.line)));
  }
  // Withdrawing the pointer leaves the IPC export of the same address alone.
  CHECK(s.withdraw(ShareKind::kPoolPtr, 0x7000, kLine1.line));
  CHECK_FALSE(s.lookup(ShareKind::kPoolPtr, *t, kLine1.line));
  CHECK(s.lookup(ShareKind::kIpcMem, *ipc, kLine1.line));
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

TEST_CASE("one guest holds at most its share of a tenant's registry, a tenant at most its slots", "[host][ipc]") {
  ShareRegistry s(8, 3);
  for (std::uint32_t guest : {1u, 2u}) {
    for (std::uint64_t k = 0; k < 3; ++k)
      REQUIRE(s.publish(entry(ShareKind::kIpcEvent, k), ShareOwner{guest, guest}));
    auto over = s.publish(entry(ShareKind::kIpcEvent, 99), ShareOwner{guest, guest});
    REQUIRE_FALSE(over);
    CHECK(over.error().code == ENOSPC);
    CHECK(s.of_guest(guest) == 3);
  }
  REQUIRE(s.publish(entry(ShareKind::kIpcEvent, 0), ShareOwner{3, 3}));
  REQUIRE(s.publish(entry(ShareKind::kIpcEvent, 1), ShareOwner{3, 3}));
  auto full = s.publish(entry(ShareKind::kIpcEvent, 2), ShareOwner{3, 3});
  REQUIRE_FALSE(full);
  CHECK(full.error().code == ENOSPC);
  CHECK(s.in_use() == 8);
}

TEST_CASE("what a line or a guest published goes when it ends, and a reused slot's old tickets find nothing",
          "[host][ipc]") {
  ShareRegistry s(4);
  auto a = s.publish(entry(ShareKind::kIpcMem, 1), kLine1);
  auto b = s.publish(entry(ShareKind::kIpcMem, 2), kLine2);
  auto c = s.publish(entry(ShareKind::kIpcMem, 3), kOtherGuest);
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(c);
  CHECK(s.drop_line(kLine1.line) == 1);  // its worker ended
  CHECK_FALSE(s.lookup(ShareKind::kIpcMem, *a, kLine2.line));
  CHECK(s.lookup(ShareKind::kIpcMem, *b, kLine2.line));
  CHECK(s.drop_guest(kLine2.guest) == 1);  // its connection ended
  CHECK_FALSE(s.lookup(ShareKind::kIpcMem, *b, kOtherGuest.line));
  CHECK(s.lookup(ShareKind::kIpcMem, *c, kOtherGuest.line));
  CHECK(s.of_guest(kLine1.guest) == 0);
  // The freed slots are used again, under fresh tokens.
  auto d = s.publish(entry(ShareKind::kIpcMem, 4), kOtherGuest);
  REQUIRE(d);
  CHECK((d->slot == a->slot || d->slot == b->slot));
  CHECK_FALSE(s.lookup(ShareKind::kIpcMem, *a, kOtherGuest.line));
  CHECK_FALSE(s.lookup(ShareKind::kIpcMem, *b, kOtherGuest.line));
  CHECK(s.in_use() == 2);
}
