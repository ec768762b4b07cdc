// Shared by the library test programs: result checks that count and report, and the
// flow-only mode.
//
// Flow-only mode (--flow-only or IVCUDA_TEST_FLOW_ONLY=1) is for the GPU test double in CI,
// which cannot run a library's SASS kernels (it skips them): every API call must still
// succeed and every input must round-trip byte for byte, but what the library's kernels
// compute is not compared. Output is deterministic either way (the GPU suite diffs a native
// run against a run through ivcuda); failure details go to stderr.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace libcheck {

inline int checks = 0, failed = 0;
inline bool flow_only = false;

inline void parse_args(int argc, char** argv, const char* name) {
  const char* env = std::getenv("IVCUDA_TEST_FLOW_ONLY");
  flow_only = env != nullptr && std::strcmp(env, "0") != 0 && *env != '\0';
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--flow-only") == 0) {
      flow_only = true;
    } else {
      std::fprintf(stderr, "usage: %s [--flow-only]\n", name);
      std::exit(2);
    }
  }
  if (flow_only) std::printf("%s: flow-only mode: library results are not compared\n", name);
}

inline void fail(const char* file, int line, const std::string& what) {
  ++failed;
  std::fprintf(stderr, "FAIL %s:%d: %s\n", file, line, what.c_str());
}

// Byte-for-byte equality of n bytes.
inline bool same_bytes(const void* a, const void* b, size_t n) { return std::memcmp(a, b, n) == 0; }

inline int finish(const char* name) {
  std::printf("%s: %d checks, %d failed\n", name, checks, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace libcheck

#define LC_STATUS(call, ok_value, name_of)                                                 \
  do {                                                                                     \
    ++libcheck::checks;                                                                    \
    const auto s_ = (call);                                                                \
    if (s_ != (ok_value))                                                                  \
      libcheck::fail(__FILE__, __LINE__, std::string(#call) + " -> " + name_of(s_));       \
  } while (0)
#define CK(call) LC_STATUS(call, cudaSuccess, cudaGetErrorName)
#define EXPECT(cond)                                                           \
  do {                                                                         \
    ++libcheck::checks;                                                        \
    if (!(cond)) libcheck::fail(__FILE__, __LINE__, "not true: " #cond);       \
  } while (0)
// A numeric check of what a library computed: skipped in flow-only mode.
#define EXPECT_RESULT(cond)                      \
  do {                                           \
    if (!libcheck::flow_only) EXPECT(cond);      \
  } while (0)
// Stops main early when a step failed that everything after depends on.
#define REQUIRE_OK(name)                                          \
  do {                                                            \
    if (libcheck::failed != 0) return libcheck::finish(name);     \
  } while (0)
