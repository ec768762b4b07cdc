// The warm pool's decisions, apart from its processes so that tests can ask
// them (tests/host/warm_policy_test.cc): how many workers a socket keeps made
// ahead, which entry a guest takes, and which one goes when the pool is full.
// The daemon applies them (warm_pool.cc); docs/design.md, "Warm workers" and
// "Recycled workers", says why each is so.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <deque>
#include <optional>
#include <vector>

namespace ivcuda::host {

// Arrivals closer than this count as one burst; a socket this long without
// a guest - none arriving, none coming back recycled - is idle, and its extra
// and recycled entries go.
inline constexpr auto kArrivalWindow = std::chrono::seconds(2);
inline constexpr auto kBurstIdle = std::chrono::seconds(30);

// What the pool knows of one entry.
struct WarmView {
  bool open = false;            // its line is up (it can take a guest)
  bool ready = false;           // its worker said so
  std::optional<uid_t> tenant;  // recycled: the only user it may serve
};

struct PoolTarget {
  std::size_t fresh = 0;  // entries made from nothing the pool should hold
  bool idle = false;      // no guest for kBurstIdle: let the extra ones go
};

// A socket's target. `arrivals` are its guests' arrival times, oldest first;
// those older than the window are dropped (the latest is kept until the
// socket is idle). `last_return` is when a worker last came back recycled: a
// guest that ran longer than kBurstIdle leaves its socket busy, not idle, and
// its worker is kept for the user's next program. `warm` is its --warm-workers, `burst` --warm-burst;
// `recycled` entries, and `serving` workers that may come back recycled,
// stand in for the extra ones: each worker made from nothing competes with
// them for the driver, which makes contexts one at a time.
PoolTarget pool_target(std::deque<std::chrono::steady_clock::time_point>& arrivals,
                       std::chrono::steady_clock::time_point last_return, std::chrono::steady_clock::time_point now,
                       std::size_t warm, std::size_t burst, std::size_t recycled, std::size_t serving);

// The entry a guest of `uid` takes, or nullopt: never one recycled for
// another user (rule recycle-same-tenant); of the others a ready one first,
// and one recycled for this user before a fresh one (which any user may have).
std::optional<std::size_t> pick_entry(const std::vector<WarmView>& pool, uid_t uid);
// The same among ready entries only.
std::optional<std::size_t> pick_ready(const std::vector<WarmView>& pool, uid_t uid);

// With --wait-for-ready on, a guest that finds no ready entry waits for the
// first one that becomes ready, whichever it is, rather than for the one it
// would take now (off by default: measured slower for bursts): a
// recycled worker resets its contexts and makes a new one while fresh ones
// start, and the driver makes contexts one at a time, so which is ready
// first is not known ahead (issue 30's back-to-back starts). It waits at
// most this long; then it takes an entry as pick_entry says.
inline constexpr auto kWaitForReady = std::chrono::milliseconds(1500);
// Entries on their way that could serve guests of `uids` (open, not ready,
// fresh or recycled for one of them): what the waiting guests wait for.
std::size_t coming_for(const std::vector<WarmView>& pool, const std::vector<uid_t>& uids);

// The entry that makes room for a worker that has just served, when the pool
// holds `cap` entries already: an extra fresh one (a starting one first; the
// socket keeps its `warm` fresh ones), else the one recycled longest ago
// (entries are in the order they came). nullopt: none may go.
std::optional<std::size_t> make_room(const std::vector<WarmView>& pool, std::size_t warm);

}  // namespace ivcuda::host
