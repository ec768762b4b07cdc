// Minimal logging: one line per event to stderr, prefixed with who speaks.
#pragma once

#include <cstdarg>
#include <cstdio>

namespace ivcuda::log {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void set_level(Level l) noexcept;
bool enabled(Level l) noexcept;
// printf-style; the prefix names the process ("ivcudad", "worker g3").
void write(Level l, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));
void set_prefix(const char* prefix) noexcept;

}  // namespace ivcuda::log

#define IVLOG_ERROR(...) ::ivcuda::log::write(::ivcuda::log::Level::kError, __VA_ARGS__)
#define IVLOG_WARN(...) ::ivcuda::log::write(::ivcuda::log::Level::kWarn, __VA_ARGS__)
#define IVLOG_INFO(...) ::ivcuda::log::write(::ivcuda::log::Level::kInfo, __VA_ARGS__)
#define IVLOG_DEBUG(...)                                              \
  do {                                                                \
    if (::ivcuda::log::enabled(::ivcuda::log::Level::kDebug))         \
      ::ivcuda::log::write(::ivcuda::log::Level::kDebug, __VA_ARGS__); \
  } while (0)
