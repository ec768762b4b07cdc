// See warm_policy.h.
#include "host-daemon/daemon/warm_policy.h"

#include <algorithm>

#include "host-daemon/shared/rules.h"

namespace ivcuda::host {

PoolTarget pool_target(std::deque<std::chrono::steady_clock::time_point>& arrivals,
                       std::chrono::steady_clock::time_point last_return, std::chrono::steady_clock::time_point now,
                       std::size_t warm, std::size_t burst, std::size_t recycled, std::size_t serving) {
  PoolTarget t;
  t.idle = (arrivals.empty() || now - arrivals.back() >= kBurstIdle) && now - last_return >= kBurstIdle;
  while (!arrivals.empty() && now - arrivals.front() > kArrivalWindow && (arrivals.size() > 1 || t.idle))
    arrivals.pop_front();
  // Arrivals in the window beyond the first: a guest alone adds nothing.
  std::size_t recent = 0;
  for (const auto a : arrivals) recent += now - a <= kArrivalWindow ? 1 : 0;
  const std::size_t extra = recent > 1 ? std::min(recent - 1, burst) : 0;
  const std::size_t cover = recycled + serving;
  t.fresh = warm == 0 ? 0 : warm + (extra > cover ? extra - cover : 0);
  return t;
}

namespace {
bool usable(const WarmView& e, uid_t uid) {
  return e.open && (!e.tenant || *e.tenant == uid || !IVCUDA_RULE("recycle-same-tenant"));
}
std::optional<std::size_t> pick(const std::vector<WarmView>& pool, uid_t uid, bool made) {
  for (const bool own : {true, false})
    for (std::size_t i = 0; i < pool.size(); ++i)
      if (usable(pool[i], uid) && (!made || pool[i].ready) && pool[i].tenant.has_value() == own) return i;
  return std::nullopt;
}
}  // namespace

std::optional<std::size_t> pick_entry(const std::vector<WarmView>& pool, uid_t uid) {
  if (auto i = pick(pool, uid, true)) return i;
  return pick(pool, uid, false);
}

std::optional<std::size_t> pick_ready(const std::vector<WarmView>& pool, uid_t uid) { return pick(pool, uid, true); }

std::size_t coming_for(const std::vector<WarmView>& pool, const std::vector<uid_t>& uids) {
  return static_cast<std::size_t>(std::count_if(pool.begin(), pool.end(), [&](const WarmView& e) {
    return !e.ready && std::any_of(uids.begin(), uids.end(), [&](uid_t u) { return usable(e, u); });
  }));
}

std::optional<std::size_t> make_room(const std::vector<WarmView>& pool, std::size_t warm) {
  const std::size_t fresh =
      static_cast<std::size_t>(std::count_if(pool.begin(), pool.end(), [](const WarmView& e) { return !e.tenant; }));
  std::optional<std::size_t> victim;
  if (fresh > warm) {
    // The newest extra one, a starting one before a ready one.
    for (std::size_t i = 0; i < pool.size(); ++i)
      if (!pool[i].tenant && (!victim || !pool[i].ready || pool[*victim].ready)) victim = i;
    return victim;
  }
  for (std::size_t i = 0; i < pool.size(); ++i)
    if (pool[i].tenant) return i;
  return std::nullopt;
}

}  // namespace ivcuda::host
