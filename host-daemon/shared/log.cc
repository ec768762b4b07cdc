#include "host-daemon/shared/log.h"

#include <atomic>
#include <cstring>
#include <ctime>

namespace ivcuda::log {
namespace {
std::atomic<int> g_level{static_cast<int>(Level::kInfo)};
char g_prefix[64] = "ivcudad";
const char* const kNames[] = {"error", "warn", "info", "debug"};
}  // namespace

void set_level(Level l) noexcept { g_level.store(static_cast<int>(l)); }
bool enabled(Level l) noexcept { return static_cast<int>(l) <= g_level.load(std::memory_order_relaxed); }
void set_prefix(const char* prefix) noexcept {
  std::strncpy(g_prefix, prefix, sizeof g_prefix - 1);
  g_prefix[sizeof g_prefix - 1] = '\0';
}

void write(Level l, const char* fmt, ...) noexcept {
  if (!enabled(l)) return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  tm t{};
  ::gmtime_r(&ts.tv_sec, &t);
  // One fprintf per line so that lines from several processes do not mix.
  std::fprintf(stderr, "%02d:%02d:%02d.%03ld %s %s: %s\n", t.tm_hour, t.tm_min, t.tm_sec,
               ts.tv_nsec / 1000000, g_prefix, kNames[static_cast<int>(l)], msg);
}

}  // namespace ivcuda::log
