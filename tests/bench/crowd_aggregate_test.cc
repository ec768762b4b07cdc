// ivcuda-bench's crowd aggregate (bench/crowd.h): all the children moved over
// the phase's whole extent, first start to last end, on one clock; never the
// sum of each child's rate over its own window, which overstates whenever the
// windows do not coincide.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "bench/crowd.h"

using ivcuda::bench::aggregate;
using ivcuda::bench::Span;

namespace {
constexpr double kGB = 1e9;
constexpr std::int64_t kSecond = 1000000000;
}  // namespace

TEST_CASE("a crowd served one child after another moves what one child does, not eight times that", "[bench]") {
  // Eight children, each moving 10 GB in its own second, the seconds one after
  // another: each child's own rate is 10 GB/s, their sum 80; together they
  // moved 80 GB in 8 s.
  std::vector<Span> one_after_another;
  for (int k = 0; k < 8; ++k) one_after_another.push_back({10 * kGB, k * kSecond, (k + 1) * kSecond});
  CHECK(aggregate(one_after_another, "GB/s") == Approx(10.0));

  // Windows that coincide: the sum of the rates and the aggregate agree.
  std::vector<Span> together(8, Span{10 * kGB, 0, kSecond});
  CHECK(aggregate(together, "GB/s") == Approx(80.0));

  // Half overlapping: two children of 10 GB in a second each, the second
  // starting half-way through the first: 20 GB in 1.5 s, where their rates sum to 20.
  const std::vector<Span> staggered = {{10 * kGB, 0, kSecond}, {10 * kGB, kSecond / 2, kSecond / 2 + kSecond}};
  CHECK(aggregate(staggered, "GB/s") == Approx(20.0 / 1.5));
}

TEST_CASE("the crowd's first start and last end bound its extent, whichever child they belong to", "[bench]") {
  // A child that starts late and one that ends late.
  const std::vector<Span> spans = {{100, 0, 10}, {100, 5, 10}, {100, 2, 40}};
  CHECK(aggregate(spans, "launches/s") == Approx(300 / 40e-9));
  CHECK(aggregate({}, "GB/s") == 0);
  CHECK(aggregate({{5, 7, 7}}, "GB/s") == 0);  // an empty extent has no rate
}

TEST_CASE("span lines carry what a child moved and when, and are no figure line", "[bench]") {
  const Span s{1073741824.0, 123456789012345, 123456999999999};
  const std::string line = ivcuda::bench::format_span("crowd.dtoh.pinned", "GB/s", s);
  std::string name, unit;
  Span back;
  REQUIRE(ivcuda::bench::parse_span(line, &name, &unit, &back));
  CHECK(name == "crowd.dtoh.pinned");
  CHECK(unit == "GB/s");
  CHECK(back.amount == s.amount);
  CHECK(back.start_ns == s.start_ns);
  CHECK(back.end_ns == s.end_ns);
  CHECK_FALSE(ivcuda::bench::parse_span("crowd.dtoh.pinned GB/s 12.5", &name, &unit, &back));
  CHECK_FALSE(ivcuda::bench::parse_span("span crowd.x GB/s 1 20 10", &name, &unit, &back));  // ends before it starts
  CHECK_FALSE(ivcuda::bench::parse_span("span crowd.x GB/s 1 10", &name, &unit, &back));
}
