// A test that cannot run on this machine (a tool missing) fails, unless the
// developer asked for skips (IVCUDA_ALLOW_SKIPS=1); then it warns and returns.
// What the README's test command installs must always be there in CI.
#pragma once

#include <cstdlib>

#define IVCUDA_SKIP(why)                                                                   \
  do {                                                                                     \
    if (std::getenv("IVCUDA_ALLOW_SKIPS") == nullptr)                                      \
      FAIL("cannot run here: " << why << " (IVCUDA_ALLOW_SKIPS=1 lets it skip)");           \
    WARN("SKIPPED (IVCUDA_ALLOW_SKIPS): " << why);                                         \
    return;                                                                                \
  } while (0)
