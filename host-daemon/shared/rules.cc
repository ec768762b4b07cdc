// Mutation build only (IVCUDA_MUTANTS): which rules IVCUDA_MUTATE removed.
#include "host-daemon/shared/rules.h"

#if defined(IVCUDA_MUTANTS)
#include <cstdlib>
#include <cstring>
#include <string>

namespace ivcuda::host::rules {
namespace {
// Read on first use, before any sandbox (getenv makes no system call).
const std::string& list() {
  static const std::string ids = [] {
    const char* v = std::getenv("IVCUDA_MUTATE");
    return std::string(v != nullptr ? v : "");
  }();
  return ids;
}
}  // namespace

bool enabled(const char* id) noexcept {
  const std::string& ids = list();
  const std::size_t n = std::strlen(id);
  for (std::size_t at = 0; at <= ids.size();) {
    std::size_t end = ids.find(',', at);
    if (end == std::string::npos) end = ids.size();
    if (end - at == n && ids.compare(at, n, id) == 0) return false;
    at = end + 1;
  }
  return true;
}

const char* removed() noexcept { return list().c_str(); }
}  // namespace ivcuda::host::rules
#endif
