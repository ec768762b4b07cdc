// The ABI's field offsets are asserted at compile time in shm_abi.h; these
// tests prove the layout planner produces what both sides agree on.
#include <catch2/catch.hpp>

#include <vector>

#include "ring/layout.h"

using namespace ivcuda;

TEST_CASE("a planned layout fits the shared memory and keeps regions apart", "[abi]") {
  ring::LayoutParams p;
  p.shm_size = 512ull << 20;
  auto l = ring::plan_layout(p);
  REQUIRE(l);
  CHECK(l->channel_table_off == sizeof(abi::Superblock));
  CHECK(l->rings_off >= l->channel_table_off + sizeof(abi::ChannelDesc) * l->channels);
  CHECK(l->rings_off % 4096 == 0);
  CHECK(l->arena_off >= l->rings_off + l->channel_stride * l->channels);
  CHECK(l->arena_off % (2u << 20) == 0);
  CHECK(l->arena_off + l->arena_size <= p.shm_size);
  CHECK(ring::pool_size(*l) > 0);
}

TEST_CASE("layouts that cannot fit are refused with a reason", "[abi]") {
  ring::LayoutParams p;
  p.shm_size = 1 << 20;
  auto l = ring::plan_layout(p);
  REQUIRE_FALSE(l);
  CHECK_FALSE(l.error().what.empty());
  p.shm_size = 512ull << 20;
  p.ring_bytes = 3000;
  CHECK_FALSE(ring::plan_layout(p));
  p.ring_bytes = 4096;
  p.channels = 0;
  CHECK_FALSE(ring::plan_layout(p));
  p.channels = abi::kMaxChannels + 1;
  CHECK_FALSE(ring::plan_layout(p));
}

TEST_CASE("the guest reads back exactly what the host formatted", "[abi]") {
  ring::LayoutParams p;
  p.shm_size = 64ull << 20;
  p.channels = 4;
  p.ring_bytes = 64 * 1024;
  p.staging_bytes = 1 << 20;
  auto l = ring::plan_layout(p);
  REQUIRE(l);
  std::vector<std::byte> bar(p.shm_size);
  CHECK_FALSE(ring::read_layout(bar.data(), bar.size()));  // not ready yet
  REQUIRE(ring::format_bar(bar.data(), *l, 42, 0, 1, abi::kFeatDoorbell));
  auto g = ring::read_layout(bar.data(), bar.size());
  REQUIRE(g);
  CHECK(g->arena_off == l->arena_off);
  CHECK(g->channels == 4);
  CHECK(ring::channel_desc(bar.data(), *g, 3)->staging_off == ring::staging_off(*g, 3));

  SECTION("a wrong magic is refused") {
    ring::superblock(bar.data())->magic ^= 1;
    CHECK_FALSE(ring::read_layout(bar.data(), bar.size()));
  }
  SECTION("another ABI major is refused") {
    ring::superblock(bar.data())->abi_major = abi::kAbiMajor + 1;
    CHECK_FALSE(ring::read_layout(bar.data(), bar.size()));
  }
  SECTION("a superblock larger than the mapping is refused") {
    CHECK_FALSE(ring::read_layout(bar.data(), bar.size() / 2));
  }
  SECTION("offsets that disagree with the planner are refused") {
    ring::superblock(bar.data())->arena_off += 4096;
    CHECK_FALSE(ring::read_layout(bar.data(), bar.size()));
  }
}
