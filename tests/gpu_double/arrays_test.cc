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

namespace {

CUmemGenericAllocationHandle tile_pool(size_t bytes, unsigned char usage = CU_MEM_CREATE_USAGE_TILE_POOL) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.allocFlags.usage = usage;
  CUmemGenericAllocationHandle h = 0;
  CU_REQUIRE(cuMemCreate(&h, bytes, &prop, 0));
  return h;
}

CUarrayMapInfo tile_map(CUarray a, unsigned x, unsigned y, unsigned w, unsigned h, CUmemGenericAllocationHandle mem,
                        size_t offset) {
  CUarrayMapInfo m{};
  m.resourceType = CU_RESOURCE_TYPE_ARRAY;
  m.resource.array = a;
  m.subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL;
  m.subresource.sparseLevel.offsetX = x;
  m.subresource.sparseLevel.offsetY = y;
  m.subresource.sparseLevel.extentWidth = w;
  m.subresource.sparseLevel.extentHeight = h;
  m.subresource.sparseLevel.extentDepth = 1;
  m.memOperationType = mem != 0 ? CU_MEM_OPERATION_TYPE_MAP : CU_MEM_OPERATION_TYPE_UNMAP;
  m.memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
  m.memHandle.memHandle = mem;
  m.offset = offset;
  m.deviceBitMask = 1;
  return m;
}

// Host <-> a whole 2D float array.
void put(CUarray a, const std::vector<float>& v, size_t w, size_t h) {
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = v.data();
  c.srcPitch = w * 4;
  c.srcHeight = h;
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a;
  c.WidthInBytes = w * 4;
  c.Height = h;
  c.Depth = 1;
  CU_REQUIRE(cuMemcpy3D(&c));
}

std::vector<float> get(CUarray a, size_t w, size_t h) {
  std::vector<float> v(w * h, -1.0f);
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c.srcArray = a;
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = v.data();
  c.dstPitch = w * 4;
  c.dstHeight = h;
  c.WidthInBytes = w * 4;
  c.Height = h;
  c.Depth = 1;
  CU_REQUIRE(cuMemcpy3D(&c));
  return v;
}

size_t used_memory() {
  size_t free = 0, total = 0;
  CU_REQUIRE(cuMemGetInfo(&free, &total));
  return total - free;
}

}  // namespace

TEST_CASE("the double's sparse arrays are 64 KiB tiles backed by tile pool memory and read zero where unmapped",
          "[gpu_double][double_only][arrays]") {
  ScopedContext ctx;
  int supported = 0;
  CU_REQUIRE(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED, 0));
  CHECK(supported == 1);
  CUarray a = make(300, 200, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SPARSE);
  CUDA_ARRAY_SPARSE_PROPERTIES p{};
  CU_REQUIRE(cuArrayGetSparseProperties(&p, a));
  CHECK((p.tileExtent.width == 128 && p.tileExtent.height == 128 && p.tileExtent.depth == 1));
  CHECK((p.miptailSize == 0 && p.flags == 0));
  CUDA_ARRAY_MEMORY_REQUIREMENTS req{};
  CU_REQUIRE_ERR(cuArrayGetMemoryRequirements(&req, a, 0), CUDA_ERROR_INVALID_VALUE);  // not deferred
  const size_t g = size_t{2} << 20;
  const size_t before = used_memory();
  CUmemGenericAllocationHandle pool = tile_pool(g);
  // The first tile and the ragged bottom-right one (44x72 elements), in one list.
  CUarrayMapInfo maps[2] = {tile_map(a, 0, 0, 128, 128, pool, 0), tile_map(a, 256, 128, 44, 72, pool, 65536)};
  CU_REQUIRE(cuMemMapArrayAsync(maps, 2, nullptr));
  std::vector<float> data(300 * 200);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i + 1);
  put(a, data, 300, 200);
  auto back = get(a, 300, 200);
  bool as_mapped = true;
  for (size_t y = 0; y < 200; ++y)
    for (size_t x = 0; x < 300; ++x) {
      const bool mapped = (x < 128 && y < 128) || (x >= 256 && y >= 128);
      as_mapped &= back[y * 300 + x] == (mapped ? data[y * 300 + x] : 0.0f);
    }
  CHECK(as_mapped);
  // The tile's bytes are the pool's: a second array mapped onto the same piece sees them.
  CUarray alias = make(128, 128, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SPARSE);
  CUarrayMapInfo am = tile_map(alias, 0, 0, 128, 128, pool, 0);
  CU_REQUIRE(cuMemMapArrayAsync(&am, 1, nullptr));
  const auto seen = get(alias, 128, 128);
  CHECK(seen[5 * 128 + 7] == data[5 * 300 + 7]);
  CU_REQUIRE(cuArrayDestroy(alias));  // no unmap needed
  // Refusals, each for the whole list: nothing of the good first entry is mapped.
  CUarray plain = make(256, 256, 0, CU_AD_FORMAT_FLOAT, 1);
  CUmemGenericAllocationHandle not_tiles = tile_pool(g, 0);
  auto refused = [&](auto change, CUresult want) {
    CUarrayMapInfo list[2] = {tile_map(a, 128, 0, 128, 128, pool, 2 * 65536), tile_map(a, 0, 128, 128, 72, pool, 0)};
    change(list[1]);
    CU_REQUIRE_ERR(cuMemMapArrayAsync(list, 2, nullptr), want);
  };
  refused([&](CUarrayMapInfo& m) { m.resource.array = plain; }, CUDA_ERROR_INVALID_VALUE);
  refused([&](CUarrayMapInfo& m) { m.resource.array = nullptr; }, CUDA_ERROR_INVALID_HANDLE);
  refused([&](CUarrayMapInfo& m) { m.memHandle.memHandle = not_tiles; }, CUDA_ERROR_INVALID_VALUE);
  refused([&](CUarrayMapInfo& m) { m.offset = 4096; }, CUDA_ERROR_INVALID_VALUE);
  refused([&](CUarrayMapInfo& m) { m.offset = g; }, CUDA_ERROR_INVALID_VALUE);
  refused([&](CUarrayMapInfo& m) { m.subresource.sparseLevel.offsetX = 64; }, CUDA_ERROR_INVALID_VALUE);
  refused([&](CUarrayMapInfo& m) { m.subresource.sparseLevel.extentWidth = 100; }, CUDA_ERROR_INVALID_VALUE);
  refused([&](CUarrayMapInfo& m) { m.subresource.sparseLevel.extentDepth = 2; }, CUDA_ERROR_INVALID_VALUE);
  refused([&](CUarrayMapInfo& m) { m.deviceBitMask = 2; }, CUDA_ERROR_INVALID_VALUE);
  refused([&](CUarrayMapInfo& m) { m.flags = 1; }, CUDA_ERROR_INVALID_VALUE);
  refused([&](CUarrayMapInfo& m) { m.memOperationType = CU_MEM_OPERATION_TYPE_UNMAP; }, CUDA_ERROR_INVALID_VALUE);
  refused([&](CUarrayMapInfo& m) { m.subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL; },
          CUDA_ERROR_INVALID_VALUE);
  back = get(a, 300, 200);
  CHECK(back[10 * 300 + 200] == 0.0f);
  // Released while mapped: the tiles keep the memory; it goes with the last unmap.
  CU_REQUIRE(cuMemRelease(pool));
  CHECK(used_memory() == before + 2 * g);  // and not_tiles
  CHECK(get(a, 300, 200)[3] == data[3]);
  CUarrayMapInfo un[2] = {tile_map(a, 0, 0, 128, 128, 0, 0), tile_map(a, 256, 128, 44, 72, 0, 0)};
  CU_REQUIRE(cuMemMapArrayAsync(&un[0], 1, nullptr));
  CHECK(used_memory() == before + 2 * g);
  CU_REQUIRE(cuMemMapArrayAsync(&un[1], 1, nullptr));
  CHECK(used_memory() == before + g);
  back = get(a, 300, 200);
  CHECK(std::all_of(back.begin(), back.end(), [](float v) { return v == 0.0f; }));
  CU_REQUIRE(cuMemRelease(not_tiles));
  CU_REQUIRE(cuArrayDestroy(plain));
  CU_REQUIRE(cuArrayDestroy(a));
}

TEST_CASE("the double's sparse mipmapped arrays have a mip tail per layer and deferred-mapping arrays map whole",
          "[gpu_double][double_only][arrays]") {
  ScopedContext ctx;
  CUDA_ARRAY3D_DESCRIPTOR d{};
  d.Width = 512;
  d.Height = 512;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  d.Flags = CUDA_ARRAY3D_SPARSE;
  CUmipmappedArray mm = nullptr;
  CU_REQUIRE(cuMipmappedArrayCreate(&mm, &d, 10));
  CUDA_ARRAY_SPARSE_PROPERTIES p{};
  CU_REQUIRE(cuMipmappedArrayGetSparseProperties(&p, mm));
  // Levels 3 (64x64) to 9 (1x1) are smaller than a 128x128 tile: 5461 floats, one tile.
  CHECK((p.miptailFirstLevel == 3 && p.miptailSize == 65536));
  CUarray l4 = nullptr;
  CU_REQUIRE(cuMipmappedArrayGetLevel(&l4, mm, 4));
  CU_REQUIRE_ERR(cuArrayGetSparseProperties(&p, l4), CUDA_ERROR_INVALID_VALUE);
  CUmemGenericAllocationHandle pool = tile_pool(size_t{2} << 20);
  CUarrayMapInfo tail{};
  tail.resourceType = CU_RESOURCE_TYPE_MIPMAPPED_ARRAY;
  tail.resource.mipmap = mm;
  tail.subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL;
  tail.subresource.miptail.size = 65536;
  tail.memOperationType = CU_MEM_OPERATION_TYPE_MAP;
  tail.memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
  tail.memHandle.memHandle = pool;
  tail.deviceBitMask = 1;
  CU_REQUIRE(cuMemMapArrayAsync(&tail, 1, nullptr));
  std::vector<float> v(32 * 32);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) + 0.5f;
  put(l4, v, 32, 32);  // level 4 lies 16 KiB into the tail
  CHECK(get(l4, 32, 32) == v);
  tail.subresource.miptail.offset = 65536;  // past the tail
  CU_REQUIRE_ERR(cuMemMapArrayAsync(&tail, 1, nullptr), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuMipmappedArrayDestroy(mm));
  CU_REQUIRE(cuMemRelease(pool));

  // Deferred mapping: requirements, then the whole array onto one piece.
  CUarray a = make(200, 100, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_DEFERRED_MAPPING);
  CUDA_ARRAY_MEMORY_REQUIREMENTS req{};
  CU_REQUIRE(cuArrayGetMemoryRequirements(&req, a, 0));
  CHECK((req.size == 131072 && req.alignment == 65536));
  CU_REQUIRE_ERR(cuArrayGetSparseProperties(&p, a), CUDA_ERROR_INVALID_VALUE);
  pool = tile_pool(size_t{2} << 20);
  CUarrayMapInfo whole = tile_map(a, 0, 0, 0, 0, pool, 65536);  // the subresource is ignored
  CU_REQUIRE(cuMemMapArrayAsync(&whole, 1, nullptr));
  std::vector<float> data(200 * 100);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i) * 2.0f;
  put(a, data, 200, 100);
  CHECK(get(a, 200, 100) == data);
  whole.offset = (size_t{2} << 20) - 65536;  // the array does not fit there
  CU_REQUIRE_ERR(cuMemMapArrayAsync(&whole, 1, nullptr), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuArrayDestroy(a));
  CU_REQUIRE(cuMemRelease(pool));
}
