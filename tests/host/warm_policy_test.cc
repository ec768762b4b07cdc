// The warm pool's decisions (host-daemon/daemon/warm_policy.h), asked without
// a daemon: how many workers a socket keeps made ahead as guests arrive, which
// entry a guest takes, and which one goes when a recycled worker needs room.
// The processes behind them are tests/process/run_warm_burst_test.sh's and
// run_recycle_test.sh's.
#include "host-daemon/daemon/warm_policy.h"

#include <catch2/catch.hpp>

using ivcuda::host::kArrivalWindow;
using ivcuda::host::kBurstIdle;
using ivcuda::host::coming_for;
using ivcuda::host::make_room;
using ivcuda::host::pick_entry;
using ivcuda::host::pick_ready;
using ivcuda::host::pool_target;
using ivcuda::host::WarmView;
using clk = std::chrono::steady_clock;
using std::chrono::milliseconds;

TEST_CASE("a socket keeps its warm workers, and one more per guest beyond the first in a burst", "[host][warm]") {
  const auto now = clk::now();
  std::deque<clk::time_point> none;
  auto t = pool_target(none, {}, now, 1, 4, 0, 0);
  CHECK(t.fresh == 1);
  CHECK(t.idle);
  std::deque<clk::time_point> one{now - milliseconds(100)};
  t = pool_target(one, {}, now, 1, 4, 0, 0);
  CHECK(t.fresh == 1);  // a guest alone adds nothing
  CHECK_FALSE(t.idle);
  std::deque<clk::time_point> three{now - milliseconds(300), now - milliseconds(200), now - milliseconds(100)};
  CHECK(pool_target(three, {}, now, 1, 4, 0, 0).fresh == 3);
  std::deque<clk::time_point> many;
  for (int i = 0; i < 20; ++i) many.push_back(now - milliseconds(50 * (20 - i)));
  CHECK(pool_target(many, {}, now, 1, 4, 0, 0).fresh == 5);  // --warm-burst bounds the extra ones
  std::deque<clk::time_point> off{now - milliseconds(100), now - milliseconds(50)};
  CHECK(pool_target(off, {}, now, 0, 4, 0, 0).fresh == 0);  // --warm-workers 0: none at all
}

TEST_CASE("recycled entries and serving workers stand in for the extra ones", "[host][warm]") {
  const auto now = clk::now();
  std::deque<clk::time_point> three{now - milliseconds(300), now - milliseconds(200), now - milliseconds(100)};
  CHECK(pool_target(three, {}, now, 1, 4, 1, 0).fresh == 2);
  three = {now - milliseconds(300), now - milliseconds(200), now - milliseconds(100)};
  CHECK(pool_target(three, {}, now, 1, 4, 1, 1).fresh == 1);
  three = {now - milliseconds(300), now - milliseconds(200), now - milliseconds(100)};
  CHECK(pool_target(three, {}, now, 1, 4, 5, 5).fresh == 1);  // never below --warm-workers
}

TEST_CASE("old arrivals leave the window, the latest stays until the socket is idle", "[host][warm]") {
  const auto now = clk::now();
  std::deque<clk::time_point> seen{now - kArrivalWindow - milliseconds(500), now - kArrivalWindow - milliseconds(100)};
  auto t = pool_target(seen, {}, now, 1, 4, 0, 0);
  CHECK(seen.size() == 1);
  CHECK(t.fresh == 1);
  CHECK_FALSE(t.idle);
  std::deque<clk::time_point> quiet{now - kBurstIdle - milliseconds(1)};
  t = pool_target(quiet, {}, now, 1, 4, 0, 0);
  CHECK(t.idle);
  CHECK(quiet.empty());
}

TEST_CASE("a guest takes a ready entry first, its own recycled one before a fresh one, never another user's",
          "[host][warm]") {
  const uid_t me = 1000, other = 1001;
  const WarmView fresh_starting{true, false, std::nullopt}, fresh_ready{true, true, std::nullopt};
  const WarmView mine_ready{true, true, me}, theirs_ready{true, true, other}, closed{false, true, std::nullopt};
  CHECK(pick_entry({fresh_starting, fresh_ready}, me) == 1u);
  CHECK(pick_entry({fresh_ready, mine_ready}, me) == 1u);
  CHECK(pick_entry({theirs_ready, fresh_starting}, me) == 1u);
  CHECK_FALSE(pick_entry({theirs_ready}, me).has_value());
  CHECK_FALSE(pick_entry({closed}, me).has_value());
  CHECK(pick_entry({fresh_starting}, me) == 0u);  // a starting one rather than none
  CHECK(pick_entry({theirs_ready, mine_ready}, other) == 0u);
}

TEST_CASE("a waiting guest takes only a ready entry, and counts the entries on their way that could serve it",
          "[host][warm]") {
  const uid_t me = 1000, other = 1001;
  const WarmView fresh_starting{true, false, std::nullopt}, fresh_ready{true, true, std::nullopt};
  const WarmView mine_starting{true, false, me}, theirs_starting{true, false, other};
  const WarmView mine_ready{true, true, me}, closed_starting{false, false, std::nullopt};
  CHECK_FALSE(pick_ready({fresh_starting, mine_starting}, me).has_value());
  CHECK(pick_ready({mine_starting, fresh_ready}, me) == 1u);
  CHECK(pick_ready({fresh_ready, mine_ready}, me) == 1u);  // its own recycled one first, as pick_entry
  CHECK_FALSE(pick_ready({theirs_starting, mine_ready}, other).has_value());
  CHECK(coming_for({fresh_starting, mine_starting, theirs_starting, closed_starting, fresh_ready}, {me}) == 2u);
  CHECK(coming_for({fresh_starting, mine_starting, theirs_starting}, {me, other}) == 3u);
  CHECK(coming_for({mine_starting}, {other}) == 0u);
  CHECK(coming_for({fresh_starting}, {}) == 0u);
}

TEST_CASE("a full pool makes room with its newest extra fresh entry, else its oldest recycled one", "[host][warm]") {
  const WarmView fresh_ready{true, true, std::nullopt}, fresh_starting{true, false, std::nullopt};
  const WarmView recycled{true, true, 1000u};
  CHECK(make_room({fresh_ready, fresh_ready, fresh_ready}, 1) == 2u);
  CHECK(make_room({fresh_ready, fresh_starting, fresh_ready}, 1) == 1u);  // a starting one first
  CHECK(make_room({fresh_ready, recycled, recycled}, 1) == 1u);            // the socket keeps its warm one
  CHECK_FALSE(make_room({fresh_ready}, 1).has_value());
}

TEST_CASE("a worker that came back from a long guest keeps its socket busy", "[host][warm]") {
  const auto now = clk::now();
  // One guest arrived 40 s ago and ran until now: its worker just came back recycled.
  std::deque<clk::time_point> long_ago{now - std::chrono::seconds(40)};
  auto t = pool_target(long_ago, now - milliseconds(10), now, 1, 4, 1, 0);
  CHECK_FALSE(t.idle);
  // 30 s after it came back, with no guest since, the socket is idle.
  std::deque<clk::time_point> later{now - std::chrono::seconds(70)};
  t = pool_target(later, now - kBurstIdle - milliseconds(1), now, 1, 4, 1, 0);
  CHECK(t.idle);
}
