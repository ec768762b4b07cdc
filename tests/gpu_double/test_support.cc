#include "test_support.h"

#include <fstream>
#include <sstream>

namespace ivcuda::gpu_double::test {

std::string error_name(CUresult r) {
  const char* name = nullptr;
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS || name == nullptr)
    return "CUresult " + std::to_string(static_cast<int>(r));
  return name;
}

bool on_double() {
  char name[64] = {};
  return cuDeviceGetName(name, sizeof name, 0) == CUDA_SUCCESS &&
         std::string(name) == "ivcuda GPU test double";
}

ScopedContext::ScopedContext() {
  CU_REQUIRE(cuInit(0));
  CU_REQUIRE(cuCtxCreate(&ctx_, nullptr, 0, 0));
}

ScopedContext::~ScopedContext() {
  if (ctx_ != nullptr) cuCtxDestroy(ctx_);
}

std::string read_file(const char* path) {
  if (path == nullptr || *path == '\0') return {};
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string kernels_ptx() { return read_file(IVCUDA_TEST_KERNELS_PTX); }
std::string kernels_fatbin() { return read_file(IVCUDA_TEST_KERNELS_FATBIN); }

}  // namespace ivcuda::gpu_double::test
