// The worker's handle tables (host-daemon/worker/handles.h): what a guest is
// given looks like a driver handle (a pointer: its low four bits zero), and
// nothing but the handle the table gave out, still live, finds its object.
#include "host-daemon/worker/handles.h"

#include <catch2/catch.hpp>

#include <set>

using ivcuda::host::HandleTable;
using ivcuda::proto::HandleKind;

TEST_CASE("handles look like pointers and only live ones of their table are found", "[host][handles]") {
  HandleTable<int> streams(HandleKind::kStream);
  std::set<std::uint64_t> given;
  for (int i = 0; i < 100; ++i) {
    const std::uint64_t h = streams.insert(i);
    CHECK(h != 0);
    // PyTorch takes a CUstream with its lowest bit set for a stream id of
    // its own pool ("invalid StreamId"): every handle is 16-byte aligned.
    CHECK((h & 0xf) == 0);
    CHECK(given.insert(h).second);
    REQUIRE(streams.find(h) != nullptr);
    CHECK(*streams.find(h) == i);
  }
  const std::uint64_t h = *given.begin();
  const int v = *streams.find(h);
  // forged: low bits, another slot's index, another generation, another kind
  for (std::uint64_t bit = 1; bit < 16; bit <<= 1) CHECK(streams.find(h | bit) == nullptr);
  CHECK(streams.find(h ^ (std::uint64_t{1} << 32)) == nullptr);
  HandleTable<int> events(HandleKind::kEvent);
  const std::uint64_t e = events.insert(7);
  CHECK(streams.find(e) == nullptr);
  CHECK(events.find(h) == nullptr);
  // stale: erased, and again after its slot was reused
  REQUIRE(streams.erase(h));
  CHECK(streams.find(h) == nullptr);
  CHECK_FALSE(streams.erase(h));
  const std::uint64_t again = streams.insert(v);
  CHECK((again & 0xf) == 0);
  CHECK(again != h);  // the same slot, a new generation
  CHECK(streams.find(h) == nullptr);
  CHECK(streams.find(again) != nullptr);
  // every live handle is visited, as given
  std::set<std::uint64_t> seen;
  streams.for_each([&](std::uint64_t k, int&) { seen.insert(k); });
  CHECK(seen.size() == 100);
  CHECK(seen.count(again) == 1);
}
