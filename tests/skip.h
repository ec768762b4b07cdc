// A test that cannot run on this machine (a tool missing) fails, unless the
// developer asked for skips (IVCUDA_ALLOW_SKIPS=1); then it warns and returns.
// What the README's test command installs must always be there in CI.
#pragma once

#include <cstdlib>
#include <cstring>

// Only the value 1 asks for skips, as in tools/test.sh and tests/lib/verdicts.sh:
// IVCUDA_ALLOW_SKIPS=0 (or "no") is a request for the strict run.
inline bool ivcuda_skips_allowed() {
  const char* v = std::getenv("IVCUDA_ALLOW_SKIPS");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

#define IVCUDA_SKIP(why)                                                                   \
  do {                                                                                     \
    if (!ivcuda_skips_allowed())                                                           \
      FAIL("cannot run here: " << why << " (IVCUDA_ALLOW_SKIPS=1 lets it skip)");           \
    WARN("SKIPPED (IVCUDA_ALLOW_SKIPS): " << why);                                         \
    return;                                                                                \
  } while (0)
