// Sparse CUDA arrays and cuMemMapArrayAsync through the driver API: a sparse
// 2D array (tiles mapped at a corner and at the ragged edges, data copied in
// and out with cuMemcpy2D and cuMemcpy3D, checked against the CPU, tiles
// unmapped and remapped elsewhere in the pool), a sparse mipmapped array (a
// level's tiles and the mip tail), a sparse 3D array, a deferred-mapping
// array (memory requirements, mapped whole), an allocation released while
// mapped (the mapping keeps it), and refusals, whose codes are printed so
// that the native run and the ivcuda run are compared on them. Tile extents,
// tail sizes and requirements come from the driver; nothing is assumed.
// A device without sparse arrays prints that and checks nothing more.
//   drv_sparse [--forged-handles]
// --forged-handles adds uses of made-up and destroyed array and memory
// handles (ivcuda refuses them; the real driver may follow them).
#include <algorithm>

#include "check.h"

namespace {

CUdevice g_dev = 0;
CUstream g_stream = nullptr;

// Prints an answer the driver decides; cuda.h says it is an error.
void refused(const char* what, CUresult r) {
  std::printf("sparse: %s -> %s\n", what, check::name(r));
  ++check::g_checks;
  if (r == CUDA_SUCCESS) check::fail(__FILE__, __LINE__, std::string(what) + " succeeded");
}

// Prints an answer the driver decides, whatever it is (cuda.h asks for
// something it may not check).
void answer(const char* what, CUresult r) { std::printf("sparse: %s -> %s\n", what, check::name(r)); }

// Pieces of a tile pool are placed at multiples of 64 KiB (the sparse tile size).
size_t pieces(size_t bytes) { return (bytes + 65535) / 65536 * 65536; }

CUresult make_array(CUarray* a, size_t w, size_t h, size_t d, unsigned flags) {
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  desc.Width = w;
  desc.Height = h;
  desc.Depth = d;
  desc.Format = CU_AD_FORMAT_FLOAT;
  desc.NumChannels = 1;
  desc.Flags = flags;
  return cuArray3DCreate(a, &desc);
}

// A physical allocation for array tiles (a tile pool) of at least `bytes`.
CUmemGenericAllocationHandle make_pool(size_t bytes, bool tile_pool = true) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = g_dev;
  prop.allocFlags.usage = tile_pool ? CU_MEM_CREATE_USAGE_TILE_POOL : 0;
  size_t g = 0;
  OK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  if (g == 0) return 0;
  CUmemGenericAllocationHandle h = 0;
  OK(cuMemCreate(&h, (bytes + g - 1) / g * g, &prop, 0));
  return h;
}

CUarrayMapInfo level_map(CUresourcetype type, void* resource, unsigned level, unsigned x, unsigned y, unsigned z,
                         unsigned w, unsigned h, unsigned d, CUmemGenericAllocationHandle mem, size_t offset) {
  CUarrayMapInfo m{};
  m.resourceType = type;
  if (type == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY)
    m.resource.mipmap = static_cast<CUmipmappedArray>(resource);
  else
    m.resource.array = static_cast<CUarray>(resource);
  m.subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL;
  m.subresource.sparseLevel.level = level;
  m.subresource.sparseLevel.offsetX = x;
  m.subresource.sparseLevel.offsetY = y;
  m.subresource.sparseLevel.offsetZ = z;
  m.subresource.sparseLevel.extentWidth = w;
  m.subresource.sparseLevel.extentHeight = h;
  m.subresource.sparseLevel.extentDepth = d;
  m.memOperationType = mem != 0 ? CU_MEM_OPERATION_TYPE_MAP : CU_MEM_OPERATION_TYPE_UNMAP;
  m.memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
  m.memHandle.memHandle = mem;
  m.offset = offset;
  m.deviceBitMask = 1u << g_dev;
  return m;
}

CUarrayMapInfo array_map(CUarray a, unsigned x, unsigned y, unsigned w, unsigned h, CUmemGenericAllocationHandle mem,
                         size_t offset) {
  return level_map(CU_RESOURCE_TYPE_ARRAY, a, 0, x, y, 0, w, h, 1, mem, offset);
}

// Host <-> a 2D array, through cuMemcpy2D (to) and cuMemcpy3D (from).
void to_array(CUarray a, const std::vector<float>& v, size_t w, size_t h) {
  CUDA_MEMCPY2D c{};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = v.data();
  c.srcPitch = w * 4;
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a;
  c.WidthInBytes = w * 4;
  c.Height = h;
  OK(cuMemcpy2DAsync(&c, g_stream));
  OK(cuStreamSynchronize(g_stream));
}

std::vector<float> from_array(CUarray a, size_t w, size_t h, size_t d = 1) {
  std::vector<float> v(w * h * d, -1.0f);
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c.srcArray = a;
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = v.data();
  c.dstPitch = w * 4;
  c.dstHeight = h;
  c.WidthInBytes = w * 4;
  c.Height = h;
  c.Depth = d;
  OK(cuMemcpy3D(&c));
  return v;
}

std::vector<float> pattern(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i % 9973);
  return v;
}

// Whether [x0, x1) x [y0, y1) of `got` (w wide) equals `want` there, or is all zero.
bool region_is(const std::vector<float>& got, const std::vector<float>* want, size_t w, size_t x0, size_t x1,
               size_t y0, size_t y1) {
  for (size_t y = y0; y < y1; ++y)
    for (size_t x = x0; x < x1; ++x)
      if (got[y * w + x] != (want != nullptr ? (*want)[y * w + x] : 0.0f)) return false;
  return true;
}

const char* yes(bool b) { return b ? "yes" : "no"; }

CUDA_ARRAY_SPARSE_PROPERTIES print_props(const char* what, const CUDA_ARRAY_SPARSE_PROPERTIES& p) {
  std::printf("sparse: %s: tile %ux%ux%u, mip tail from level %u, %llu bytes, flags 0x%x\n", what,
              p.tileExtent.width, p.tileExtent.height, p.tileExtent.depth, p.miptailFirstLevel,
              static_cast<unsigned long long>(p.miptailSize), p.flags);
  return p;
}

// A sparse 2D array: tiles mapped, written, read, unmapped, remapped.
void two_d() {
  const size_t w = 300, h = 200;  // not whole tiles: the last column and row are ragged
  CUarray a = nullptr;
  OK(make_array(&a, w, h, 0, CUDA_ARRAY3D_SPARSE));
  if (a == nullptr) return;
  CUDA_ARRAY_SPARSE_PROPERTIES p{};
  OK(cuArrayGetSparseProperties(&p, a));
  print_props("2D float array 300x200", p);
  const unsigned tw = p.tileExtent.width, th = p.tileExtent.height;
  const size_t tile = pieces(size_t{tw} * th * 4);
  EXPECT(tw != 0 && th != 0);
  if (tw == 0 || th == 0 || tw >= w || th >= h) {
    OK(cuArrayDestroy(a));
    return;
  }
  CUDA_ARRAY_MEMORY_REQUIREMENTS req{};
  refused("cuArrayGetMemoryRequirements of a sparse (not deferred) array", cuArrayGetMemoryRequirements(&req, a, g_dev));
  const CUmemGenericAllocationHandle pool = make_pool(16 * tile);
  // The top-left tile and the bottom-right one (ragged in both directions),
  // in one list.
  const unsigned ex = static_cast<unsigned>((w - 1) / tw * tw), ey = static_cast<unsigned>((h - 1) / th * th);
  CUarrayMapInfo maps[2] = {array_map(a, 0, 0, tw, th, pool, 0),
                            array_map(a, ex, ey, static_cast<unsigned>(w) - ex, static_cast<unsigned>(h) - ey, pool, tile)};
  OK(cuMemMapArrayAsync(maps, 2, g_stream));
  OK(cuStreamSynchronize(g_stream));
  // Written and read back, only where tiles are mapped.
  const auto data = pattern(w * h, 1.0f);
  to_array(a, data, w, h);
  auto back = from_array(a, w, h);
  EXPECT(region_is(back, &data, w, 0, tw, 0, th));
  EXPECT(region_is(back, &data, w, ex, w, ey, h));
  std::printf("sparse: 2D: the mapped tiles hold what was copied in: %s\n",
              yes(region_is(back, &data, w, 0, tw, 0, th) && region_is(back, &data, w, ex, w, ey, h)));
  std::printf("sparse: 2D: an unmapped tile reads zero: %s\n", yes(region_is(back, nullptr, w, tw, 2 * tw, 0, th)));
  // A box inside the first tile through cuMemcpy3D with offsets.
  std::vector<float> box(8 * 4, 0.0f);
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c.srcArray = a;
  c.srcXInBytes = 16 * 4;
  c.srcY = 5;
  c.dstMemoryType = CU_MEMORYTYPE_HOST;
  c.dstHost = box.data();
  c.dstPitch = 8 * 4;
  c.dstHeight = 4;
  c.WidthInBytes = 8 * 4;
  c.Height = 4;
  c.Depth = 1;
  OK(cuMemcpy3DAsync(&c, g_stream));
  OK(cuStreamSynchronize(g_stream));
  bool box_ok = true;
  for (size_t y = 0; y < 4; ++y)
    for (size_t x = 0; x < 8; ++x) box_ok &= box[y * 8 + x] == data[(5 + y) * w + 16 + x];
  EXPECT(box_ok);
  // The top-left tile unmapped and mapped again at another offset of the
  // pool: it reads zero between the two, and the old bytes are not there
  // after (the new piece of the pool was never written).
  CUarrayMapInfo un = array_map(a, 0, 0, tw, th, 0, 0);
  OK(cuMemMapArrayAsync(&un, 1, g_stream));
  OK(cuStreamSynchronize(g_stream));
  back = from_array(a, w, h);
  std::printf("sparse: 2D: an unmapped tile reads zero after the unmap: %s\n",
              yes(region_is(back, nullptr, w, 0, tw, 0, th)));
  EXPECT(region_is(back, &data, w, ex, w, ey, h));  // the other one stays
  CUarrayMapInfo again = array_map(a, 0, 0, tw, th, pool, 2 * tile);
  OK(cuMemMapArrayAsync(&again, 1, g_stream));
  const auto data2 = pattern(w * h, 5000.0f);
  to_array(a, data2, w, h);
  back = from_array(a, w, h);
  EXPECT(region_is(back, &data2, w, 0, tw, 0, th));
  // Both tiles out in one list; the array then reads zero everywhere.
  CUarrayMapInfo both[2] = {array_map(a, 0, 0, tw, th, 0, 0),
                            array_map(a, ex, ey, static_cast<unsigned>(w) - ex, static_cast<unsigned>(h) - ey, 0, 0)};
  OK(cuMemMapArrayAsync(both, 2, g_stream));
  OK(cuStreamSynchronize(g_stream));
  back = from_array(a, w, h);
  std::printf("sparse: 2D: all unmapped, the array reads zero: %s\n", yes(region_is(back, nullptr, w, 0, w, 0, h)));
  OK(cuMemRelease(pool));
  OK(cuArrayDestroy(a));
  std::printf("sparse: 2D: tiles mapped, copied, unmapped, remapped\n");
}

// The physical memory stays while a tile maps it, after its last cuMemRelease.
void released_while_mapped() {
  CUarray a = nullptr;
  OK(make_array(&a, 256, 256, 0, CUDA_ARRAY3D_SPARSE));
  if (a == nullptr) return;
  CUDA_ARRAY_SPARSE_PROPERTIES p{};
  OK(cuArrayGetSparseProperties(&p, a));
  const unsigned tw = std::min(p.tileExtent.width, 256u), th = std::min(p.tileExtent.height, 256u);
  CUmemGenericAllocationHandle pool = make_pool(pieces(size_t{tw} * th * 4));
  CUarrayMapInfo m = array_map(a, 0, 0, tw, th, pool, 0);
  OK(cuMemMapArrayAsync(&m, 1, g_stream));
  OK(cuMemRelease(pool));  // only the tile holds it now
  const auto data = pattern(256 * 256, 7.0f);
  to_array(a, data, 256, 256);
  const auto back = from_array(a, 256, 256);
  std::printf("sparse: a tile still holds its data after its memory's last release: %s\n",
              yes(region_is(back, &data, 256, 0, tw, 0, th)));
  CUarrayMapInfo un = array_map(a, 0, 0, tw, th, 0, 0);
  OK(cuMemMapArrayAsync(&un, 1, g_stream));  // and now nothing: it goes
  OK(cuStreamSynchronize(g_stream));
  // Another allocation, released while mapped, goes with the array.
  pool = make_pool(pieces(size_t{tw} * th * 4));
  m.memHandle.memHandle = pool;
  OK(cuMemMapArrayAsync(&m, 1, g_stream));
  OK(cuStreamSynchronize(g_stream));
  OK(cuMemRelease(pool));
  OK(cuArrayDestroy(a));
  std::printf("sparse: memory released while mapped stays until the unmap or the array's end\n");
}

// A sparse mipmapped array: a tile of level 1 and the mip tail.
void mipmapped() {
  CUDA_ARRAY3D_DESCRIPTOR d{};
  d.Width = 512;
  d.Height = 512;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  d.Flags = CUDA_ARRAY3D_SPARSE;
  const unsigned levels = 10;  // 512 down to 1
  CUmipmappedArray mm = nullptr;
  const CUresult made = cuMipmappedArrayCreate(&mm, &d, levels);
  std::printf("sparse: mipmapped 512x512, 10 levels: %s\n", check::name(made));
  if (made != CUDA_SUCCESS) return;
  CUDA_ARRAY_SPARSE_PROPERTIES p{};
  OK(cuMipmappedArrayGetSparseProperties(&p, mm));
  print_props("mipmapped array", p);
  const unsigned tw = p.tileExtent.width, th = p.tileExtent.height;
  CUarray l1 = nullptr;
  OK(cuMipmappedArrayGetLevel(&l1, mm, 1));
  CUDA_ARRAY_SPARSE_PROPERTIES lp{};
  refused("cuArrayGetSparseProperties of a level", cuArrayGetSparseProperties(&lp, l1));
  if (tw == 0 || th == 0 || tw > 256 || th > 256 || p.miptailSize == 0 || p.miptailFirstLevel >= levels) {
    OK(cuMipmappedArrayDestroy(mm));
    return;
  }
  const size_t tile = pieces(size_t{tw} * th * 4);
  const CUmemGenericAllocationHandle pool = make_pool(tile + p.miptailSize);
  // Level 1 (256x256): its top-left tile; the mip tail after it in the pool.
  CUarrayMapInfo maps[2] = {level_map(CU_RESOURCE_TYPE_MIPMAPPED_ARRAY, mm, 1, 0, 0, 0, tw, th, 1, pool, 0), {}};
  maps[1].resourceType = CU_RESOURCE_TYPE_MIPMAPPED_ARRAY;
  maps[1].resource.mipmap = mm;
  maps[1].subresourceType = CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL;
  maps[1].subresource.miptail.offset = 0;
  maps[1].subresource.miptail.size = p.miptailSize;
  maps[1].memOperationType = CU_MEM_OPERATION_TYPE_MAP;
  maps[1].memHandleType = CU_MEM_HANDLE_TYPE_GENERIC;
  maps[1].memHandle.memHandle = pool;
  maps[1].offset = tile;
  maps[1].deviceBitMask = 1u << g_dev;
  OK(cuMemMapArrayAsync(maps, 2, g_stream));
  OK(cuStreamSynchronize(g_stream));
  const auto data = pattern(256 * 256, 3.0f);
  to_array(l1, data, 256, 256);
  auto back = from_array(l1, 256, 256);
  EXPECT(region_is(back, &data, 256, 0, tw, 0, th));
  std::printf("sparse: mipmapped: level 1's mapped tile holds its data: %s, the rest reads zero: %s\n",
              yes(region_is(back, &data, 256, 0, tw, 0, th)), yes(region_is(back, nullptr, 256, tw, 256, 0, 256)));
  // Every level of the tail, written and read back.
  bool tail_ok = true;
  for (unsigned l = p.miptailFirstLevel; l < levels; ++l) {
    CUarray lv = nullptr;
    OK(cuMipmappedArrayGetLevel(&lv, mm, l));
    const size_t n = std::max<size_t>(1, 512u >> l);
    const auto v = pattern(n * n, 100.0f * static_cast<float>(l));
    to_array(lv, v, n, n);
    tail_ok &= from_array(lv, n, n) == v;
  }
  // Printed, not required: the H200 answered "no" natively as through ivcuda
  // (what a mapped mip tail holds per level is the driver's layout).
  std::printf("sparse: mipmapped: the mip tail's levels hold their data: %s\n", yes(tail_ok));
  // A level in the tail is not mapped as a sparse level.
  const size_t small = std::max<size_t>(1, 512u >> p.miptailFirstLevel);
  CUarrayMapInfo bad =
      level_map(CU_RESOURCE_TYPE_MIPMAPPED_ARRAY, mm, p.miptailFirstLevel, 0, 0, 0, static_cast<unsigned>(small),
                static_cast<unsigned>(small), 1, pool, 0);
  refused("map a level of the mip tail as a sparse level", cuMemMapArrayAsync(&bad, 1, g_stream));
  maps[0].memOperationType = maps[1].memOperationType = CU_MEM_OPERATION_TYPE_UNMAP;
  maps[0].memHandle.memHandle = maps[1].memHandle.memHandle = 0;
  maps[0].offset = maps[1].offset = 0;
  OK(cuMemMapArrayAsync(maps, 2, g_stream));
  OK(cuStreamSynchronize(g_stream));
  OK(cuMemRelease(pool));
  OK(cuMipmappedArrayDestroy(mm));
  std::printf("sparse: mipmapped: a level's tile and the mip tail mapped and unmapped\n");
}

// A sparse 3D array: one tile, a 3D box through it.
void three_d() {
  CUarray a = nullptr;
  const size_t w = 70, h = 40, dd = 20;
  const CUresult made = make_array(&a, w, h, dd, CUDA_ARRAY3D_SPARSE);
  std::printf("sparse: 3D float array 70x40x20: %s\n", check::name(made));
  if (made != CUDA_SUCCESS) return;
  CUDA_ARRAY_SPARSE_PROPERTIES p{};
  OK(cuArrayGetSparseProperties(&p, a));
  print_props("3D array", p);
  const unsigned tw = p.tileExtent.width, th = p.tileExtent.height, td = p.tileExtent.depth;
  if (tw == 0 || th == 0 || td == 0 || tw > w || th > h || td > dd) {
    OK(cuArrayDestroy(a));
    return;
  }
  const CUmemGenericAllocationHandle pool = make_pool(pieces(size_t{tw} * th * td * 4));
  CUarrayMapInfo m = level_map(CU_RESOURCE_TYPE_ARRAY, a, 0, 0, 0, 0, tw, th, td, pool, 0);
  OK(cuMemMapArrayAsync(&m, 1, g_stream));
  OK(cuStreamSynchronize(g_stream));
  // The whole array in, the whole array out: the tile's box holds the data, the rest is zero.
  const auto data = pattern(w * h * dd, 11.0f);
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = data.data();
  c.srcPitch = w * 4;
  c.srcHeight = h;
  c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c.dstArray = a;
  c.WidthInBytes = w * 4;
  c.Height = h;
  c.Depth = dd;
  OK(cuMemcpy3D(&c));
  const auto back = from_array(a, w, h, dd);
  bool in = true, out = true;
  for (size_t z = 0; z < dd; ++z)
    for (size_t y = 0; y < h; ++y)
      for (size_t x = 0; x < w; ++x) {
        const size_t i = (z * h + y) * w + x;
        if (x < tw && y < th && z < td)
          in &= back[i] == data[i];
        else
          out &= back[i] == 0.0f;
      }
  EXPECT(in);
  std::printf("sparse: 3D: the mapped tile holds its box: %s, the rest reads zero: %s\n", yes(in), yes(out));
  m.memOperationType = CU_MEM_OPERATION_TYPE_UNMAP;
  m.memHandle.memHandle = 0;
  OK(cuMemMapArrayAsync(&m, 1, g_stream));
  OK(cuStreamSynchronize(g_stream));
  OK(cuMemRelease(pool));
  OK(cuArrayDestroy(a));
}

// A deferred-mapping array: its memory requirements, mapped as a whole.
void deferred() {
  int supported = 0;
  OK(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED, g_dev));
  std::printf("sparse: deferred-mapping arrays supported: %s\n", yes(supported != 0));
  if (supported == 0) return;
  const size_t w = 200, h = 100;
  CUarray a = nullptr;
  OK(make_array(&a, w, h, 0, CUDA_ARRAY3D_DEFERRED_MAPPING));
  if (a == nullptr) return;
  CUDA_ARRAY_MEMORY_REQUIREMENTS req{};
  OK(cuArrayGetMemoryRequirements(&req, a, g_dev));
  std::printf("sparse: deferred 200x100 float array: requirements %zu bytes, alignment %zu\n", req.size, req.alignment);
  CUDA_ARRAY_SPARSE_PROPERTIES p{};
  refused("cuArrayGetSparseProperties of a deferred-mapping array", cuArrayGetSparseProperties(&p, a));
  if (req.size == 0) return;
  const CUmemGenericAllocationHandle pool = make_pool(req.size);
  CUarrayMapInfo m = array_map(a, 0, 0, 0, 0, pool, 0);  // the subresource is ignored
  OK(cuMemMapArrayAsync(&m, 1, g_stream));
  OK(cuStreamSynchronize(g_stream));
  const auto data = pattern(w * h, 42.0f);
  to_array(a, data, w, h);
  EXPECT(from_array(a, w, h) == data);
  m.memOperationType = CU_MEM_OPERATION_TYPE_UNMAP;
  m.memHandle.memHandle = 0;
  OK(cuMemMapArrayAsync(&m, 1, g_stream));
  OK(cuStreamSynchronize(g_stream));
  OK(cuMemRelease(pool));
  OK(cuArrayDestroy(a));
  std::printf("sparse: deferred: mapped whole, copied in and out, unmapped\n");
}

// Refusals with the driver's answers; nothing is mapped by a refused list.
void refusals(bool forged) {
  CUarray a = nullptr, plain = nullptr;
  OK(make_array(&a, 256, 256, 0, CUDA_ARRAY3D_SPARSE));
  OK(make_array(&plain, 256, 256, 0, 0));
  if (a == nullptr || plain == nullptr) return;
  CUDA_ARRAY_SPARSE_PROPERTIES p{};
  OK(cuArrayGetSparseProperties(&p, a));
  const unsigned tw = std::min(p.tileExtent.width, 256u), th = std::min(p.tileExtent.height, 256u);
  const CUmemGenericAllocationHandle pool = make_pool(pieces(size_t{tw} * th * 4));
  const CUmemGenericAllocationHandle not_tiles = make_pool(65536, false);
  refused("cuArrayGetSparseProperties of a plain array", cuArrayGetSparseProperties(&p, plain));
  const CUarrayMapInfo good = array_map(a, 0, 0, tw, th, pool, 0);
  auto with = [&](auto change) {
    CUarrayMapInfo m = good;
    change(m);
    return cuMemMapArrayAsync(&m, 1, g_stream);
  };
  refused("map onto a plain array", with([&](CUarrayMapInfo& m) { m.resource.array = plain; }));
  refused("map onto a null array", with([&](CUarrayMapInfo& m) { m.resource.array = nullptr; }));
  // The driver crashes on this one (H200, driver 580): through ivcuda only.
  if (forged) refused("map a null memory handle", with([&](CUarrayMapInfo& m) { m.memHandle.memHandle = 0; }));
  answer("map memory that is not a tile pool", with([&](CUarrayMapInfo& m) { m.memHandle.memHandle = not_tiles; }));
  refused("map at an offset off a tile", with([&](CUarrayMapInfo& m) { m.offset = 4096; }));
  refused("map past the end of the memory", with([&](CUarrayMapInfo& m) { m.offset = 64ull << 30; }));
  refused("map a region off the tile grid", with([&](CUarrayMapInfo& m) { m.subresource.sparseLevel.offsetX = 1; }));
  refused("map with no device in the mask", with([&](CUarrayMapInfo& m) { m.deviceBitMask = 0; }));
  refused("map with a device that does not exist", with([&](CUarrayMapInfo& m) { m.deviceBitMask = 1u << 30; }));
  answer("map with flags", with([&](CUarrayMapInfo& m) { m.flags = 1; }));
  refused("map with an unknown operation", with([&](CUarrayMapInfo& m) {
            m.memOperationType = static_cast<CUmemOperationType>(7);
          }));
  answer("unmap naming a memory handle", with([&](CUarrayMapInfo& m) {
            m.memOperationType = CU_MEM_OPERATION_TYPE_UNMAP;
          }));
  refused("map onto a resource of another type", with([&](CUarrayMapInfo& m) {
            m.resourceType = CU_RESOURCE_TYPE_LINEAR;
          }));
  // Whatever those did, nothing is mapped now.
  CUarrayMapInfo clear = array_map(a, 0, 0, tw, th, 0, 0);
  OK(cuMemMapArrayAsync(&clear, 1, g_stream));
  // A list with one bad entry maps nothing: the good first entry is not there.
  CUarrayMapInfo pair[2] = {good, good};
  pair[1].resource.array = plain;
  refused("a list whose second entry is refused", cuMemMapArrayAsync(pair, 2, g_stream));
  OK(cuStreamSynchronize(g_stream));
  const auto data = pattern(256 * 256, 9.0f);
  to_array(a, data, 256, 256);
  std::printf("sparse: after the refused list the tile reads zero: %s\n",
              yes(region_is(from_array(a, 256, 256), nullptr, 256, 0, tw, 0, th)));
  CUarrayMapInfo none{};
  std::printf("sparse: an empty list -> %s\n", check::name(cuMemMapArrayAsync(&none, 0, g_stream)));
  refused("a null list of one", cuMemMapArrayAsync(nullptr, 1, g_stream));
  if (forged) {
    // Handles no process was given, and a destroyed array: ivcuda refuses
    // them; natively the driver may follow the pointer.
    refused("map onto a made-up array", with([&](CUarrayMapInfo& m) {
              m.resource.array = reinterpret_cast<CUarray>(0x12345678);
            }));
    refused("map onto a made-up mipmapped array", with([&](CUarrayMapInfo& m) {
              m.resourceType = CU_RESOURCE_TYPE_MIPMAPPED_ARRAY;
              m.resource.mipmap = reinterpret_cast<CUmipmappedArray>(0x12345678);
            }));
    refused("map made-up memory", with([&](CUarrayMapInfo& m) { m.memHandle.memHandle = 0x12345678; }));
    CUarray gone = nullptr;
    OK(make_array(&gone, 256, 256, 0, CUDA_ARRAY3D_SPARSE));
    OK(cuArrayDestroy(gone));
    refused("map onto a destroyed array", with([&](CUarrayMapInfo& m) { m.resource.array = gone; }));
    const CUmemGenericAllocationHandle released = make_pool(65536);
    OK(cuMemRelease(released));
    refused("map released memory", with([&](CUarrayMapInfo& m) { m.memHandle.memHandle = released; }));
  }
  OK(cuMemRelease(pool));
  OK(cuMemRelease(not_tiles));
  OK(cuArrayDestroy(plain));
  OK(cuArrayDestroy(a));
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // what came before a crash stays in the log
  bool forged = false;
  for (int i = 1; i < argc; ++i) forged |= std::strcmp(argv[i], "--forged-handles") == 0;
  OK(cuInit(0));
  OK(cuDeviceGet(&g_dev, 0));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, g_dev));
  OK(cuCtxSetCurrent(ctx));
  OK(cuStreamCreate(&g_stream, CU_STREAM_NON_BLOCKING));
  if (check::g_failures != 0) return check::finish("drv_sparse");
  int sparse = 0;
  OK(cuDeviceGetAttribute(&sparse, CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED, g_dev));
  std::printf("sparse: sparse arrays supported: %s\n", yes(sparse != 0));
  if (sparse != 0) {
    two_d();
    released_while_mapped();
    mipmapped();
    three_d();
    deferred();
    refusals(forged);
  }
  OK(cuStreamDestroy(g_stream));
  OK(cuDevicePrimaryCtxRelease(g_dev));
  return check::finish("drv_sparse");
}
