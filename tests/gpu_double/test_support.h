// Helpers shared by the GPU test double's tests (which link the double directly).
#pragma once

#include <cuda.h>

#include <catch2/catch.hpp>
#include <string>

namespace ivcuda::gpu_double::test {

std::string error_name(CUresult r);

// True when the driver under test is the double (these tests also run against a real
// driver, to check that the double answers as it does).
bool on_double();

// Initialises the driver once and makes a fresh context current for one test; destroys it
// (and with it everything the test allocated) afterwards.
class ScopedContext {
 public:
  ScopedContext();
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  CUcontext get() const { return ctx_; }

 private:
  CUcontext ctx_ = nullptr;
};

// The test kernels built from test_kernels.cu at build time; empty when nvcc was missing.
std::string read_file(const char* path);
std::string kernels_ptx();
std::string kernels_fatbin();

}  // namespace ivcuda::gpu_double::test

#define CU_REQUIRE(expr)                                                         \
  do {                                                                           \
    const CUresult cu_require_r_ = (expr);                                       \
    INFO(#expr " -> " << ::ivcuda::gpu_double::test::error_name(cu_require_r_)); \
    REQUIRE(cu_require_r_ == CUDA_SUCCESS);                                      \
  } while (0)

#define CU_REQUIRE_ERR(expr, want)                                               \
  do {                                                                           \
    const CUresult cu_require_r_ = (expr);                                       \
    INFO(#expr " -> " << ::ivcuda::gpu_double::test::error_name(cu_require_r_)); \
    REQUIRE(cu_require_r_ == (want));                                            \
  } while (0)

// Skips (visibly) a test that needs the nvcc-built kernels when they were not built.
#define REQUIRE_KERNELS(text)                                                \
  do {                                                                       \
    if ((text).empty()) {                                                    \
      WARN("SKIP: test kernels were not built (no nvcc at configure time)"); \
      return;                                                                \
    }                                                                        \
  } while (0)
