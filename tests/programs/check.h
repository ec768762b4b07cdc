// Tiny harness for the driver-API test programs. They run unchanged natively
// (real libcuda.so.1) and through ivcuda (LD_LIBRARY_PATH or LD_PRELOAD), so
// they depend on nothing of the project: only cuda.h and libcuda.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace check {

inline int g_failures = 0;
inline int g_checks = 0;

inline const char* name(CUresult r) {
  const char* s = nullptr;
  if (cuGetErrorName(r, &s) != CUDA_SUCCESS || s == nullptr) return "?";
  return s;
}

inline void fail(const char* file, int line, const std::string& what) {
  ++g_failures;
  std::fprintf(stderr, "FAIL %s:%d: %s\n", file, line, what.c_str());
}

// n bytes of a seeded pseudo-random pattern, eight bytes a draw: drawn a byte at a time, under
// ThreadSanitizer the copy tests spent a quarter of their time here.
inline std::vector<unsigned char> random_bytes(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  std::mt19937_64 g(seed);
  for (size_t i = 0; i < n; i += sizeof(std::uint64_t)) {
    const std::uint64_t w = g();
    std::memcpy(v.data() + i, &w, std::min(sizeof w, n - i));
  }
  return v;
}

inline int finish(const char* prog) {
  std::printf("%s: %d checks, %d failed\n", prog, g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

// A whole file (a PTX image), NUL-terminated as cuModuleLoadData wants text.
inline std::string read_file(const char* path) {
  std::string s;
  if (FILE* f = std::fopen(path, "rb")) {
    char buf[65536];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
    std::fclose(f);
  }
  return s;
}

// Reads argv for "--name value".
inline const char* arg(int argc, char** argv, const char* name) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return nullptr;
}

// Whether argv holds "--name".
inline bool flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

}  // namespace check

// The call must return exactly `want`.
#define EXPECT_RES(want, call)                                                                     \
  do {                                                                                             \
    ++check::g_checks;                                                                             \
    const CUresult r_ = (call);                                                                    \
    if (r_ != (want))                                                                              \
      check::fail(__FILE__, __LINE__,                                                              \
                  std::string(#call) + " -> " + check::name(r_) + ", expected " + check::name(want)); \
  } while (0)
#define OK(call) EXPECT_RES(CUDA_SUCCESS, call)
#define EXPECT(cond)                                                          \
  do {                                                                        \
    ++check::g_checks;                                                        \
    if (!(cond)) check::fail(__FILE__, __LINE__, std::string("not true: ") + #cond); \
  } while (0)
