// The GPU test double's side of the library tests: with IVCUDA_DOUBLE_UNKNOWN_KERNELS=skip it
// loads what the toolkit's libraries carry (cubins, SASS-only fatbins, zstd- and
// LZ4-compressed entries) and finds in them the same entries, parameter layouts and globals
// as in the PTX of the same source; launches of kernels it knows still compute. The images
// are the double's own test kernels, built by nvcc in each of those forms.
#include <cuda.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace {

std::string read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

#define CU_OK(expr) REQUIRE((expr) == CUDA_SUCCESS)

// The switch is read once per process: set it before the first call into the double.
struct ForeignContext {
  CUcontext ctx = nullptr;
  ForeignContext() {
    setenv("IVCUDA_DOUBLE_UNKNOWN_KERNELS", "skip", 1);
    CU_OK(cuInit(0));
    CUdevice dev = 0;
    CU_OK(cuDeviceGet(&dev, 0));
    CU_OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU_OK(cuCtxSetCurrent(ctx));
  }
  ~ForeignContext() {
    CUdevice dev = 0;
    if (cuDeviceGet(&dev, 0) == CUDA_SUCCESS) cuDevicePrimaryCtxRelease(dev);
  }
};

using Layout = std::vector<std::pair<size_t, size_t>>;  // (offset, size) per parameter

Layout layout_of(CUmodule m, const char* name) {
  CUfunction f = nullptr;
  CU_OK(cuModuleGetFunction(&f, m, name));
  Layout out;
  for (size_t i = 0;; ++i) {
    size_t off = 0, size = 0;
    if (cuFuncGetParamInfo(f, i, &off, &size) != CUDA_SUCCESS) break;
    out.emplace_back(off, size);
  }
  return out;
}

const char* const kEntries[] = {"ivc_vec_add", "ivc_fill_u32",  "ivc_reduce_sum", "ivc_scale_struct",
                                "ivc_add_const", "ivc_spin_ns", "ivc_fault"};

// Everything a foreign image must agree on with the PTX, and one launch that computes.
void check_like_ptx(const std::string& image) {
  REQUIRE(image.size() > 16);
  const std::string ptx = read_file(IVCUDA_FOREIGN_PTX);
  REQUIRE(!ptx.empty());
  CUmodule ref = nullptr, m = nullptr;
  CU_OK(cuModuleLoadData(&ref, ptx.c_str()));
  CU_OK(cuModuleLoadData(&m, image.data()));
  for (const char* e : kEntries) {
    INFO("entry " << e);
    CHECK(layout_of(m, e) == layout_of(ref, e));
  }
  // The __constant__ keeps its initialiser; the __device__ one starts at zero.
  CUdeviceptr addend = 0, count = 0;
  size_t addend_size = 0, count_size = 0;
  CU_OK(cuModuleGetGlobal(&addend, &addend_size, m, "ivc_const_addend"));
  CU_OK(cuModuleGetGlobal(&count, &count_size, m, "ivc_launch_count"));
  CHECK(addend_size == 4);
  CHECK(count_size == 4);
  float a = 0;
  unsigned c = 1;
  CU_OK(cuMemcpyDtoH(&a, addend, sizeof a));
  CU_OK(cuMemcpyDtoH(&c, count, sizeof c));
  CHECK(a == 1.5f);
  CHECK(c == 0);

  const int n = 1000;
  std::vector<float> x(n), y(n), z(n);
  for (int i = 0; i < n; ++i) {
    x[i] = float(i);
    y[i] = 0.5f * float(i);
  }
  CUdeviceptr dx = 0, dy = 0, dz = 0;
  CU_OK(cuMemAlloc(&dx, n * sizeof(float)));
  CU_OK(cuMemAlloc(&dy, n * sizeof(float)));
  CU_OK(cuMemAlloc(&dz, n * sizeof(float)));
  CU_OK(cuMemcpyHtoD(dx, x.data(), n * sizeof(float)));
  CU_OK(cuMemcpyHtoD(dy, y.data(), n * sizeof(float)));
  CUfunction add = nullptr;
  CU_OK(cuModuleGetFunction(&add, m, "ivc_vec_add"));
  int count_n = n;
  void* args[] = {&dx, &dy, &dz, &count_n};
  CU_OK(cuLaunchKernel(add, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr));
  CU_OK(cuMemcpyDtoH(z.data(), dz, n * sizeof(float)));
  bool ok = true;
  for (int i = 0; i < n; ++i) ok &= z[i] == x[i] + y[i];
  CHECK(ok);
  for (CUdeviceptr p : {dx, dy, dz}) CU_OK(cuMemFree(p));
  CU_OK(cuModuleUnload(m));
  CU_OK(cuModuleUnload(ref));
}

}  // namespace

TEST_CASE("a cubin loads with the entries, layouts and globals of its PTX", "[double][foreign]") {
  ForeignContext fc;
  check_like_ptx(read_file(IVCUDA_FOREIGN_CUBIN));
}

TEST_CASE("a SASS-only fatbin with zstd-compressed ELF loads", "[double][foreign]") {
  ForeignContext fc;
  check_like_ptx(read_file(IVCUDA_FOREIGN_SASS_ZSTD));
}

TEST_CASE("fatbins with zstd- and LZ4-compressed PTX load", "[double][foreign]") {
  ForeignContext fc;
  SECTION("zstd") { check_like_ptx(read_file(IVCUDA_FOREIGN_ZSTD)); }
  SECTION("lz4") { check_like_ptx(read_file(IVCUDA_FOREIGN_LZ4)); }
}

TEST_CASE("corrupt foreign images are refused, not trusted", "[double][foreign]") {
  ForeignContext fc;
  CUmodule m = nullptr;
  // A compressed entry whose payload is garbage.
  std::string bad = read_file(IVCUDA_FOREIGN_SASS_ZSTD);
  REQUIRE(bad.size() > 16 + 64 + 8);
  for (size_t i = 16 + 64; i < bad.size(); ++i) bad[i] = static_cast<char>(i * 31);
  CHECK(cuModuleLoadData(&m, bad.data()) == CUDA_ERROR_INVALID_IMAGE);
  // A cubin comes without a length (as the driver, the double trusts its header that far),
  // but a section table claimed beyond any plausible size is refused before it is read.
  std::string elf = read_file(IVCUDA_FOREIGN_CUBIN);
  REQUIRE(elf.size() > 64);
  const std::uint64_t far = std::uint64_t{1} << 40;
  std::memcpy(elf.data() + 0x28, &far, sizeof far);
  CHECK(cuModuleLoadData(&m, elf.data()) == CUDA_ERROR_INVALID_IMAGE);
  // Not an ELF this double can read: 32-bit.
  elf = read_file(IVCUDA_FOREIGN_CUBIN);
  elf[4] = 1;
  CHECK(cuModuleLoadData(&m, elf.data()) == CUDA_ERROR_INVALID_IMAGE);
}

TEST_CASE("kernels without a CPU version launch as no-ops", "[double][foreign]") {
  ForeignContext fc;
  const char ptx[] =
      ".version 8.0\n.target sm_90\n.address_size 64\n"
      ".visible .entry ivc_nobody_knows(.param .u64 p, .param .u32 n)\n{\n ret;\n}\n";
  CUmodule m = nullptr;
  CU_OK(cuModuleLoadData(&m, ptx));
  CUfunction f = nullptr;
  CU_OK(cuModuleGetFunction(&f, m, "ivc_nobody_knows"));
  CUdeviceptr p = 0;
  unsigned n = 4;
  void* args[] = {&p, &n};
  CU_OK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
  CU_OK(cuCtxSynchronize());
  CU_OK(cuModuleUnload(m));
}
