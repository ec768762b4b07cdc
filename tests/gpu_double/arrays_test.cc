// CUDA arrays, 3D copies, texture and surface objects of the double, and the texture test
// kernels that read and write them.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "test_support.h"

using namespace ivcuda::gpu_double::test;

namespace {

CUarray make(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch, unsigned flags = 0) {
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  desc.Width = w;
  desc.Height = h;
  desc.Depth = d;
  desc.Format = f;
  desc.NumChannels = ch;
  desc.Flags = flags;
  CUarray a = nullptr;
  CU_REQUIRE(cuArray3DCreate(&a, &desc));
  return a;
}

}  // namespace

TEST_CASE("the double's arrays keep their descriptor and copy boxes in and out", "[gpu_double][double_only][arrays]") {
  ScopedContext ctx;
  CUarray a = make(8, 4, 3, CU_AD_FORMAT_UNSIGNED_INT16, 2);
  CUDA_ARRAY3D_DESCRIPTOR d{};
  CU_REQUIRE(cuArray3DGetDescriptor(&d, a));
  CHECK((d.Width == 8 && d.Height == 4 && d.Depth == 3 && d.NumChannels == 2));
  std::vector<unsigned char> in(8 * 4 * 4 * 3), out(in.size(), 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 7 + 1);
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = in.data();
  c.srcPitch = 32;
  c.srcHeight = 4;
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a;
  c.WidthInBytes = 32;
  c.Height = 4;
  c.Depth = 3;
  CU_REQUIRE(cuMemcpy3D(&c));
  // A 2x2x2-element box from (1, 1, 1) back.
  CUDA_MEMCPY3D b{};
  b.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  b.srcArray = a;
  b.srcXInBytes = 4;
  b.srcY = 1;
  b.srcZ = 1;
  b.dstMemoryType = CU_MEMORYTYPE_HOST;
  b.dstHost = out.data();
  b.dstPitch = 8;
  b.dstHeight = 2;
  b.WidthInBytes = 8;
  b.Height = 2;
  b.Depth = 2;
  CU_REQUIRE(cuMemcpy3D(&b));
  for (size_t z = 0; z < 2; ++z)
    for (size_t y = 0; y < 2; ++y)
      for (size_t x = 0; x < 8; ++x)
        CHECK(out[(z * 2 + y) * 8 + x] == in[((1 + z) * 4 + 1 + y) * 32 + 4 + x]);
  b.srcZ = 2;  // one slice too many
  CU_REQUIRE_ERR(cuMemcpy3D(&b), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuArrayDestroy(a));
  CU_REQUIRE_ERR(cuArrayDestroy(a), CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("the double's texture test kernel samples with clamping, the surface kernel writes",
          "[gpu_double][double_only][arrays]") {
  const std::string ptx = kernels_ptx();
  REQUIRE_KERNELS(ptx);
  ScopedContext ctx;
  CUmodule m = nullptr;
  CU_REQUIRE(cuModuleLoadData(&m, ptx.c_str()));
  CUfunction rd = nullptr, wr = nullptr;
  CU_REQUIRE(cuModuleGetFunction(&rd, m, "ivc_tex2d_read"));
  CU_REQUIRE(cuModuleGetFunction(&wr, m, "ivc_surf2d_write"));
  int w = 5, h = 3;
  CUarray a = make(5, 3, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SURFACE_LDST);
  CUDA_RESOURCE_DESC res{};
  res.resType = CU_RESOURCE_TYPE_ARRAY;
  res.res.array.hArray = a;
  CUsurfObject s = 0;
  CU_REQUIRE(cuSurfObjectCreate(&s, &res));
  float base = 1.0f;
  unsigned long long sv = s;
  void* wp[] = {&sv, &w, &h, &base};
  CU_REQUIRE(cuLaunchKernel(wr, 1, 1, 1, 8, 4, 1, 0, nullptr, wp, nullptr));
  CUDA_TEXTURE_DESC td{};
  td.addressMode[0] = td.addressMode[1] = CU_TR_ADDRESS_MODE_CLAMP;
  td.filterMode = CU_TR_FILTER_MODE_POINT;
  CUtexObject t = 0;
  CU_REQUIRE(cuTexObjectCreate(&t, &res, &td, nullptr));
  CUdeviceptr out = 0;
  CU_REQUIRE(cuMemAlloc(&out, 5 * 3 * 4));
  int dx = 2, dy = -1;
  unsigned long long tv = t;
  void* rp[] = {&tv, &out, &w, &h, &dx, &dy};
  CU_REQUIRE(cuLaunchKernel(rd, 1, 1, 1, 8, 4, 1, 0, nullptr, rp, nullptr));
  std::vector<float> got(15);
  CU_REQUIRE(cuMemcpyDtoH(got.data(), out, 60));
  for (int y = 0; y < 3; ++y)
    for (int x = 0; x < 5; ++x) {
      const int u = std::min(std::max(x + dx, 0), 4), v = std::min(std::max(y + dy, 0), 2);
      CHECK(got[static_cast<size_t>(y * 5 + x)] == 1.0f + static_cast<float>(u) + 1000.0f * static_cast<float>(v));
    }
  CU_REQUIRE_ERR(cuTexObjectDestroy(s), CUDA_ERROR_INVALID_VALUE);  // a surface is no texture
  CU_REQUIRE(cuTexObjectDestroy(t));
  CU_REQUIRE(cuSurfObjectDestroy(s));
  CU_REQUIRE_ERR(cuSurfObjectDestroy(s), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuMemFree(out));
  CU_REQUIRE(cuArrayDestroy(a));
  CU_REQUIRE(cuModuleUnload(m));
}
