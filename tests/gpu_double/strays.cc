#include "strays.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ivcuda::gpu_double {
namespace {

bool env_is_1(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// Opened when the library is loaded: ivcudad loads its driver before it
// sandboxes the worker, and a sandbox may refuse to open files later.
int open_strays() {
  const char* path = std::getenv("IVCUDA_GPU_DOUBLE_STRAYS");
  if (path == nullptr || *path == '\0') return -1;
  return ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
}

const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash != nullptr ? slash + 1 : path;
}

const bool g_hmm = env_is_1("IVCUDA_GPU_DOUBLE_HMM");
const int g_strays_fd = open_strays();

}  // namespace

bool hmm() { return g_hmm; }

bool mapped(std::uintptr_t p, std::size_t n) {
  std::uintptr_t end = 0;
  if (__builtin_add_overflow(p, std::max<std::size_t>(n, 1), &end)) return false;
  // Readable and writable pages only: a GPU under HMM faults on the others
  // (a reservation's PROT_NONE), and the double would crash instead.
  std::FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) return false;
  std::uintptr_t covered = p;  // [p, covered) lies in rw mappings so far
  char line[4096];
  while (covered < end && std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long long lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line, "%llx-%llx %4s", &lo, &hi, perms) != 3) continue;
    // The lines are sorted by address: one that starts past the covered
    // prefix leaves a hole.
    if (lo > covered) break;
    if (hi > covered) {
      if (perms[0] != 'r' || perms[1] != 'w') break;
      covered = static_cast<std::uintptr_t>(hi);
    }
  }
  std::fclose(maps);
  return covered >= end;
}

void note_stray(std::uintptr_t p, std::size_t n, const char* file, unsigned line) {
  if (g_strays_fd < 0) return;
  char text[512];
  const int len = std::snprintf(text, sizeof text, "pid %d: 0x%llx + %llu at %s:%u\n", static_cast<int>(::getpid()),
                                static_cast<unsigned long long>(p), static_cast<unsigned long long>(n),
                                base_name(file), line);
  // One write per line: O_APPEND keeps the lines of several workers whole.
  if (len > 0) (void)!::write(g_strays_fd, text, std::min<std::size_t>(static_cast<std::size_t>(len), sizeof text - 1));
}

}  // namespace ivcuda::gpu_double
