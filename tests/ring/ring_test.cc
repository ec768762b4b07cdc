#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "ring/spsc_ring.h"

using namespace ivcuda;
using ring::RingStatus;

namespace {
struct TestRing {
  explicit TestRing(std::uint32_t cells) : mem(sizeof(abi::RingCtl) + cells * abi::kCellBytes) {
    view = {reinterpret_cast<abi::RingCtl*>(mem.data()), mem.data() + sizeof(abi::RingCtl), cells};
  }
  std::vector<std::byte> mem;
  ring::RingView view;
};

struct CountingBell final : ring::Doorbell {
  int rings = 0;
  void ring() noexcept override { ++rings; }
};

bool put(ring::Producer& p, std::uint32_t seq, std::uint32_t len, std::byte fill = std::byte{0x5a}) {
  abi::RecordHeader h{};
  h.len = len;
  h.op = 7;
  h.seq = seq;
  RingStatus st;
  std::byte* d = p.reserve(h, &st);
  if (d == nullptr) return false;
  std::memset(d, static_cast<int>(fill), len);
  p.commit();
  return true;
}
}  // namespace

TEST_CASE("an empty ring polls empty", "[ring]") {
  TestRing r(16);
  ring::Consumer c(r.view);
  ring::Record rec;
  CHECK(c.poll(&rec) == RingStatus::kEmpty);
}

TEST_CASE("records are invisible until published, then arrive in order", "[ring]") {
  TestRing r(64);
  CountingBell bell;
  ring::Producer p(r.view, &bell);
  ring::Consumer c(r.view);
  ring::Record rec;
  REQUIRE(put(p, 1, 10));
  REQUIRE(put(p, 2, 200));
  CHECK(c.poll(&rec) == RingStatus::kEmpty);
  p.publish();
  CHECK(bell.rings == 0);  // consumer never announced sleep
  REQUIRE(c.poll(&rec) == RingStatus::kOk);
  CHECK(rec.hdr.seq == 1);
  CHECK(rec.payload.size() == 10);
  // Polling again without consume returns the same record.
  REQUIRE(c.poll(&rec) == RingStatus::kOk);
  CHECK(rec.hdr.seq == 1);
  c.consume();
  REQUIRE(c.poll(&rec) == RingStatus::kOk);
  CHECK(rec.hdr.seq == 2);
  CHECK(rec.payload.size() == 200);
  CHECK(rec.payload[199] == std::byte{0x5a});
  c.consume();
  CHECK(c.poll(&rec) == RingStatus::kEmpty);
}

TEST_CASE("a full ring refuses records until the consumer publishes its head", "[ring]") {
  TestRing r(8);  // 8 cells; records of 48 bytes take one cell each
  ring::Producer p(r.view, nullptr);
  ring::Consumer c(r.view);
  int n = 0;
  while (put(p, static_cast<std::uint32_t>(n), 48)) ++n;
  CHECK(n == 8);
  abi::RecordHeader h{};
  h.len = 48;
  RingStatus st;
  CHECK(p.reserve(h, &st) == nullptr);
  CHECK(st == RingStatus::kFull);
  p.publish();
  ring::Record rec;
  REQUIRE(c.poll(&rec) == RingStatus::kOk);
  c.consume();
  CHECK_FALSE(put(p, 99, 48));  // consumed but head not yet published
  c.publish_head();
  CHECK(put(p, 99, 48));
}

TEST_CASE("records that would cross the end wrap behind a pad", "[ring]") {
  TestRing r(8);
  ring::Producer p(r.view, nullptr);
  ring::Consumer c(r.view);
  ring::Record rec;
  for (std::uint32_t round = 0; round < 50; ++round) {
    // 3-cell records in an 8-cell ring: every third one wraps.
    REQUIRE(put(p, round, 150, std::byte(round)));
    p.publish();
    REQUIRE(c.poll(&rec) == RingStatus::kOk);
    CHECK(rec.hdr.seq == round);
    CHECK(rec.payload.size() == 150);
    CHECK(rec.payload[0] == std::byte(round));
    CHECK(rec.payload[149] == std::byte(round));
    c.consume();
    c.publish_head();
  }
}

TEST_CASE("records larger than half the ring are refused", "[ring]") {
  TestRing r(8);
  ring::Producer p(r.view, nullptr);
  abi::RecordHeader h{};
  h.len = p.max_payload() + 1;
  RingStatus st;
  CHECK(p.reserve(h, &st) == nullptr);
  CHECK(st == RingStatus::kTooBig);
  h.len = p.max_payload();
  CHECK(p.reserve(h, &st) != nullptr);
}

TEST_CASE("a batch is published with one store and one doorbell", "[ring]") {
  TestRing r(64);
  CountingBell bell;
  ring::Producer p(r.view, &bell);
  ring::Consumer c(r.view);
  REQUIRE(c.prepare_sleep());  // consumer announces sleep on an empty ring
  for (std::uint32_t i = 0; i < 10; ++i) REQUIRE(put(p, i, 32));
  CHECK(r.view.ctl->tail == 0);
  CHECK(p.publish());
  CHECK(bell.rings == 1);
  CHECK(r.view.ctl->tail == 10);
  CHECK_FALSE(p.publish());  // nothing new: no store, no ring
  c.end_sleep();
  REQUIRE(put(p, 10, 32));
  p.publish();
  CHECK(bell.rings == 1);  // consumer is awake: suppressed
}

TEST_CASE("prepare_sleep refuses to sleep on a ring with data", "[ring]") {
  TestRing r(16);
  ring::Producer p(r.view, nullptr);
  ring::Consumer c(r.view);
  REQUIRE(put(p, 0, 8));
  p.publish();
  CHECK_FALSE(c.prepare_sleep());
  CHECK(r.view.ctl->consumer_sleeping == 0);
}
