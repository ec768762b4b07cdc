#include <catch2/catch.hpp>

#include "ring/arena.h"
#include "ring/validate.h"

using ivcuda::ring::ArenaAllocator;

TEST_CASE("range checks do not overflow", "[validate]") {
  using ivcuda::ring::range_ok;
  CHECK(range_ok(0, 10, 10));
  CHECK_FALSE(range_ok(1, 10, 10));
  CHECK_FALSE(range_ok(~0ull - 4, 10, 100));  // off + len would wrap
  CHECK_FALSE(range_ok(0, ~0ull, 100));
  CHECK(range_ok(100, 0, 100));
  CHECK(ivcuda::ring::span_within(1010, 10, 1000, 20));
  CHECK_FALSE(ivcuda::ring::span_within(990, 10, 1000, 20));
}

TEST_CASE("arena allocations are granule aligned, disjoint and reusable", "[arena]") {
  ArenaAllocator a(1 << 20, 64 * 4096);
  auto x = a.allocate(1);
  auto y = a.allocate(5000);
  REQUIRE(x);
  REQUIRE(y);
  CHECK(*x % 4096 == 0);
  CHECK(*y == *x + 4096);
  CHECK(a.bytes_free() == 61 * 4096);
  CHECK(a.find(*y + 100, 8000)->off == *y);
  CHECK_FALSE(a.find(*y + 100, 9000));  // runs past the block
  CHECK_FALSE(a.free(*y + 1));          // not the start of an allocation
  CHECK(a.free(*x));
  CHECK_FALSE(a.free(*x));  // double free is refused
  CHECK(a.free(*y));
  CHECK(a.bytes_free() == 64 * 4096);
  CHECK(a.allocate(64 * 4096));  // coalesced back into one block
  CHECK_FALSE(a.allocate(1));
}

TEST_CASE("arena refuses what cannot fit", "[arena]") {
  ArenaAllocator a(0, 8 * 4096);
  CHECK_FALSE(a.allocate(0));
  CHECK_FALSE(a.allocate(9 * 4096));
  CHECK_FALSE(a.allocate(~0ull));
}

TEST_CASE("arena lists its live allocations, granule-rounded, in order", "[arena]") {
  ArenaAllocator a(1 << 20, 16 * 4096);
  CHECK(a.allocations().empty());
  const auto x = a.allocate(1), y = a.allocate(3 * 4096 + 1), z = a.allocate(4096);
  REQUIRE(x);
  REQUIRE(y);
  REQUIRE(z);
  REQUIRE(a.free(*y));
  const auto live = a.allocations();
  REQUIRE(live.size() == 2);
  CHECK(live[0].off == *x);
  CHECK(live[0].size == 4096);
  CHECK(live[1].off == *z);
  CHECK(live[1].size == 4096);
}
