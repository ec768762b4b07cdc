// CUDA arrays, mipmapped arrays, 3D copies, texture and surface objects of the GPU test
// double. An array is a dense host buffer with its descriptor (arrays.h); copies move its
// rows; texture and surface objects are numbered records that the CPU kernels sample.
// Arrays outlive their context here (the driver frees them with it): nothing in the tests
// depends on that.
//
// Sparse arrays (CUDA_ARRAY3D_SPARSE) and deferred-mapping arrays are emulated minimally, for
// the forwarding path's tests: a sparse array is a grid of 64 KiB tiles of D3D12's standard
// shapes (the double's choice; the driver's are its own), each backed by a tile of a
// cuMemCreate allocation or by nothing; a mipmapped array's levels smaller than a tile form
// its mip tail, a byte range per layer mapped in 64 KiB pieces. A deferred-mapping array is
// backed as a whole. Copies read zeros where nothing is mapped and drop what they would
// write there; the texture kernels do not read such arrays. A mapped tile keeps its memory
// alive, as a VA mapping does.
#include "arrays.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "strays.h"

using namespace ivcuda::gpu_double;

namespace {

struct Mipmap {
  Handle ctx = 0;
  std::vector<Handle> levels;
  unsigned flags = 0;             // CUDA_ARRAY3D_*
  // Sparse: the first level of the mip tail (levels.size(): none), its bytes per layer
  // (a multiple of 64 KiB), and each layer's 64 KiB pieces.
  unsigned miptail_first = 0;
  std::size_t miptail_size = 0;
  std::size_t layers = 1;
  std::vector<TileBacking> tail;
  // Deferred mapping: where each level starts in the backing, its size, the backing.
  std::vector<std::size_t> level_base;
  std::size_t deferred_size = 0;
  TileBacking whole;
};

constexpr std::size_t kMaxTiles = std::size_t{1} << 22;  // tiles of one sparse array

std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }
std::size_t round_tile(std::size_t n) { return ceil_div(n, kTileBytes) * kTileBytes; }
bool layered(const CUDA_ARRAY3D_DESCRIPTOR& d) { return (d.Flags & CUDA_ARRAY3D_LAYERED) != 0; }
bool three_d(const CUDA_ARRAY3D_DESCRIPTOR& d) { return d.Depth != 0 && !layered(d); }
std::size_t slices(const CUDA_ARRAY3D_DESCRIPTOR& d) { return d.Depth == 0 ? 1 : d.Depth; }
std::size_t dense_bytes(const ArrayObj& a) { return a.row_bytes() * a.rows() * slices(a.desc); }

// 64 KiB of elements of `elem` bytes: D3D12's standard tile shapes.
void tile_shape(std::size_t elem, bool is_3d, std::size_t out[3]) {
  static constexpr std::size_t k2d[5][2] = {{256, 256}, {256, 128}, {128, 128}, {128, 64}, {64, 64}};
  static constexpr std::size_t k3d[5][3] = {{64, 32, 32}, {32, 32, 32}, {32, 32, 16}, {32, 16, 16}, {16, 16, 16}};
  const std::size_t i = elem == 1 ? 0 : elem == 2 ? 1 : elem == 4 ? 2 : elem == 8 ? 3 : 4;
  out[0] = is_3d ? k3d[i][0] : k2d[i][0];
  out[1] = is_3d ? k3d[i][1] : k2d[i][1];
  out[2] = is_3d ? k3d[i][2] : 1;
}

void unback(State& s, TileBacking& t) {
  if (t.mem == 0) return;
  const Handle mem = t.mem;
  t = TileBacking{};
  physical_unref(s, mem);
}

void release_backing(State& s, ArrayObj& a) {
  for (TileBacking& t : a.tiles) unback(s, t);
  unback(s, a.whole);
}

// Under the state lock, like everything in State.
std::map<Handle, ArrayObj>& arrays() {
  static std::map<Handle, ArrayObj> m;
  return m;
}
std::map<Handle, Mipmap>& mipmaps() {
  static std::map<Handle, Mipmap> m;
  return m;
}
std::map<unsigned long long, TexObj>& objects() {
  static std::map<unsigned long long, TexObj> m;
  return m;
}
unsigned long long g_next_object = 1;

std::size_t element_bytes(CUarray_format f, unsigned channels) {
  if (channels != 1 && channels != 2 && channels != 4) return 0;
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return channels;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2u * channels;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4u * channels;
    default: return 0;  // formats the double does not emulate
  }
}

CUresult make_array(State& s, Handle ctx, const CUDA_ARRAY3D_DESCRIPTOR& d, Handle mipmap, unsigned level,
                    Handle* out) {
  ArrayObj a;
  a.ctx = ctx;
  a.desc = d;
  a.elem = element_bytes(d.Format, d.NumChannels);
  a.mipmap = mipmap;
  a.level = level;
  if (a.elem == 0 || d.Width == 0) return CUDA_ERROR_INVALID_VALUE;
  // A 3D array needs a height; a layered 1D one has none.
  if (d.Depth != 0 && d.Height == 0 && (d.Flags & CUDA_ARRAY3D_LAYERED) == 0) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t limit = std::size_t{1} << 16;
  if (d.Width > limit || d.Height > limit || d.Depth > limit) return CUDA_ERROR_INVALID_VALUE;
  if (!a.dense()) {
    // 2D, 2D layered or 3D, one of the two kinds.
    if ((a.sparse() && a.deferred()) || d.Height == 0) return CUDA_ERROR_INVALID_VALUE;
    if (a.sparse()) {
      tile_shape(a.elem, three_d(d), a.tile);
      a.grid[0] = ceil_div(d.Width, a.tile[0]);
      a.grid[1] = ceil_div(d.Height, a.tile[1]);
      a.grid[2] = ceil_div(slices(d), a.tile[2]);
      if (a.grid[0] * a.grid[1] * a.grid[2] > kMaxTiles) return CUDA_ERROR_OUT_OF_MEMORY;
      a.tiles.assign(a.grid[0] * a.grid[1] * a.grid[2], TileBacking{});
    }
    const Handle h = s.new_handle();
    arrays()[h] = std::move(a);
    *out = h;
    return CUDA_SUCCESS;
  }
  const std::size_t bytes = a.row_bytes() * a.rows() * (d.Depth == 0 ? 1 : d.Depth);
  if (bytes > total_mem()) return CUDA_ERROR_OUT_OF_MEMORY;
  a.data.assign(bytes, 0);
  const Handle h = s.new_handle();
  arrays()[h] = std::move(a);
  *out = h;
  return CUDA_SUCCESS;
}

CUresult destroy_array(State& s, Handle h) {
  auto it = arrays().find(h);
  if (it == arrays().end() || it->second.mipmap != 0) return CUDA_ERROR_INVALID_HANDLE;
  release_backing(s, it->second);  // the driver needs no unmap before a destroy
  arrays().erase(it);
  return CUDA_SUCCESS;
}

// Where the bytes of row (y, z) of a sparse or deferred-mapping array lie from byte x_bytes
// on: the address of the first, and in *n how many of the `want` follow contiguously (in
// one tile). Null: no memory is mapped there.
unsigned char* locate(State& s, const ArrayObj& a, std::size_t xb, std::size_t y, std::size_t z, std::size_t want,
                      std::size_t* n) {
  *n = want;
  const std::size_t dense = (z * a.rows() + y) * a.row_bytes() + xb;  // its place in a dense layout
  if (a.deferred()) {
    const TileBacking* t = &a.whole;
    std::size_t base = 0;
    if (a.mipmap != 0) {
      const Mipmap& m = mipmaps().at(a.mipmap);
      t = &m.whole;
      base = m.level_base.at(a.level);
    }
    return t->mem == 0 ? nullptr : physical_view(s, t->mem) + t->offset + base + dense;
  }
  if (a.in_tail) {
    const Mipmap& m = mipmaps().at(a.mipmap);
    const std::size_t layer = layered(a.desc) ? z : 0;
    const std::size_t pos = a.tail_base + (layered(a.desc) ? y * a.row_bytes() + xb : dense);
    *n = std::min(want, kTileBytes - pos % kTileBytes);
    const TileBacking& t = m.tail.at(layer * (m.miptail_size / kTileBytes) + pos / kTileBytes);
    return t.mem == 0 ? nullptr : physical_view(s, t.mem) + t.offset + pos % kTileBytes;
  }
  const std::size_t x = xb / a.elem, byte = xb % a.elem;
  const std::size_t tx = x / a.tile[0], ty = y / a.tile[1], tz = z / a.tile[2];
  *n = std::min(want, (a.tile[0] - x % a.tile[0]) * a.elem - byte);
  const TileBacking& t = a.tiles.at((tz * a.grid[1] + ty) * a.grid[0] + tx);
  const std::size_t in_tile =
      (((z % a.tile[2]) * a.tile[1] + y % a.tile[1]) * a.tile[0] + x % a.tile[0]) * a.elem + byte;
  return t.mem == 0 ? nullptr : physical_view(s, t.mem) + t.offset + in_tile;
}

void read_row(State& s, const ArrayObj& a, std::size_t xb, std::size_t y, std::size_t z, std::size_t len,
              unsigned char* out) {
  for (std::size_t done = 0, n = 0; done < len; done += n) {
    const unsigned char* p = locate(s, a, xb + done, y, z, len - done, &n);
    if (p == nullptr)
      std::memset(out + done, 0, n);
    else
      std::memcpy(out + done, p, n);
  }
}

void write_row(State& s, const ArrayObj& a, std::size_t xb, std::size_t y, std::size_t z, std::size_t len,
               const unsigned char* in) {
  for (std::size_t done = 0, n = 0; done < len; done += n)
    if (unsigned char* p = locate(s, a, xb + done, y, z, len - done, &n); p != nullptr) std::memcpy(p, in + done, n);
}

// One side of a 3D copy: the first byte and the distances between rows and slices, or a
// sparse or deferred-mapping array and the corner of the box.
struct Side {
  unsigned char* base = nullptr;
  std::size_t pitch = 0;
  std::size_t slice = 0;
  const ArrayObj* tiled = nullptr;
  std::size_t x = 0, y = 0, z = 0;
};

CUresult side(State& s, CUmemorytype type, const void* host, CUdeviceptr dev, CUarray array, std::size_t x,
              std::size_t y, std::size_t z, std::size_t pitch, std::size_t height, const CUDA_MEMCPY3D& c, Side* out) {
  if (type == CU_MEMORYTYPE_UNIFIED) {
    type = s.find(static_cast<std::uintptr_t>(dev)) != nullptr ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
    host = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(dev));
  }
  if (type == CU_MEMORYTYPE_ARRAY) {
    auto it = arrays().find(reinterpret_cast<Handle>(array));
    if (it == arrays().end()) return CUDA_ERROR_INVALID_VALUE;
    ArrayObj& a = it->second;
    const std::size_t slices = a.desc.Depth == 0 ? 1 : a.desc.Depth;
    if (x > a.row_bytes() || c.WidthInBytes > a.row_bytes() - x || y > a.rows() || c.Height > a.rows() - y ||
        z > slices || c.Depth > slices - z)
      return CUDA_ERROR_INVALID_VALUE;
    if (!a.dense()) {
      *out = Side{nullptr, 0, 0, &a, x, y, z};
      return CUDA_SUCCESS;
    }
    *out = Side{a.at(x, y, z), a.row_bytes(), a.row_bytes() * a.rows()};
    return CUDA_SUCCESS;
  }
  if (type != CU_MEMORYTYPE_HOST && type != CU_MEMORYTYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  if ((c.Height > 1 || c.Depth > 1) && pitch < c.WidthInBytes) return CUDA_ERROR_INVALID_VALUE;
  if (c.Depth > 1 && height < c.Height) return CUDA_ERROR_INVALID_VALUE;
  std::size_t slice = 0, start = 0, span = 0, t = 0;
  if (__builtin_mul_overflow(pitch, height, &slice) || __builtin_mul_overflow(pitch, y, &start) ||
      __builtin_add_overflow(start, x, &start) || __builtin_mul_overflow(slice, z, &t) ||
      __builtin_add_overflow(start, t, &start) || __builtin_mul_overflow(slice, c.Depth - 1, &span) ||
      __builtin_mul_overflow(pitch, c.Height - 1, &t) || __builtin_add_overflow(span, t, &span) ||
      __builtin_add_overflow(span, c.WidthInBytes, &span))
    return CUDA_ERROR_INVALID_VALUE;
  std::uintptr_t base = type == CU_MEMORYTYPE_HOST ? reinterpret_cast<std::uintptr_t>(host)
                                                   : static_cast<std::uintptr_t>(dev);
  if (base == 0 || __builtin_add_overflow(base, start, &base)) return CUDA_ERROR_INVALID_VALUE;
  if (type == CU_MEMORYTYPE_DEVICE)
    if (const CUresult r = check_device_range(s, base, span); r != CUDA_SUCCESS) return r;
  *out = Side{reinterpret_cast<unsigned char*>(base), pitch, slice};
  return CUDA_SUCCESS;
}

CUresult copy_3d(const CUDA_MEMCPY3D* p, const CUstream* stream) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    if (stream != nullptr)
      if (const CUresult r = check_stream(s, *stream); r != CUDA_SUCCESS) return r;
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const CUDA_MEMCPY3D c = *p;
    if (c.WidthInBytes == 0 || c.Height == 0 || c.Depth == 0) return CUDA_SUCCESS;
    Side src, dst;
    if (const CUresult r = side(s, c.srcMemoryType, c.srcHost, c.srcDevice, c.srcArray, c.srcXInBytes, c.srcY,
                                c.srcZ, c.srcPitch, c.srcHeight, c, &src);
        r != CUDA_SUCCESS)
      return r;
    if (const CUresult r = side(s, c.dstMemoryType, c.dstHost, c.dstDevice, c.dstArray, c.dstXInBytes, c.dstY,
                                c.dstZ, c.dstPitch, c.dstHeight, c, &dst);
        r != CUDA_SUCCESS)
      return r;
    std::vector<unsigned char> row(src.tiled != nullptr ? c.WidthInBytes : 0);
    for (std::size_t z = 0; z < c.Depth; ++z)
      for (std::size_t y = 0; y < c.Height; ++y) {
        if (src.tiled == nullptr && dst.tiled == nullptr) {
          std::memmove(dst.base + z * dst.slice + y * dst.pitch, src.base + z * src.slice + y * src.pitch,
                       c.WidthInBytes);
          continue;
        }
        const unsigned char* from = row.data();
        if (src.tiled != nullptr)
          read_row(s, *src.tiled, src.x, src.y + y, src.z + z, c.WidthInBytes, row.data());
        else
          from = src.base + z * src.slice + y * src.pitch;
        if (dst.tiled != nullptr)
          write_row(s, *dst.tiled, dst.x, dst.y + y, dst.z + z, c.WidthInBytes, from);
        else
          std::memmove(dst.base + z * dst.slice + y * dst.pitch, from, c.WidthInBytes);
      }
    return CUDA_SUCCESS;
  });
}

CUresult check_resource(State& s, const CUDA_RESOURCE_DESC& r, bool surface) {
  switch (r.resType) {
    case CU_RESOURCE_TYPE_ARRAY: {
      auto it = arrays().find(reinterpret_cast<Handle>(r.res.array.hArray));
      if (it == arrays().end()) return CUDA_ERROR_INVALID_HANDLE;
      // Driver 580 makes a surface object over an array without
      // CUDA_ARRAY3D_SURFACE_LDST too (drv_arrays, native on the H200).
      (void)surface;
      return CUDA_SUCCESS;
    }
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY:
      if (surface) return CUDA_ERROR_INVALID_VALUE;
      return mipmaps().count(reinterpret_cast<Handle>(r.res.mipmap.hMipmappedArray)) != 0 ? CUDA_SUCCESS
                                                                                          : CUDA_ERROR_INVALID_HANDLE;
    case CU_RESOURCE_TYPE_LINEAR:
      if (surface || r.res.linear.sizeInBytes == 0) return CUDA_ERROR_INVALID_VALUE;
      return check_device_range(s, r.res.linear.devPtr, r.res.linear.sizeInBytes);
    case CU_RESOURCE_TYPE_PITCH2D: {
      const std::size_t e = element_bytes(r.res.pitch2D.format, r.res.pitch2D.numChannels);
      const auto& q = r.res.pitch2D;
      if (surface || e == 0 || q.height == 0 || q.width * e > q.pitchInBytes) return CUDA_ERROR_INVALID_VALUE;
      return check_device_range(s, q.devPtr, q.pitchInBytes * (q.height - 1) + q.width * e);
    }
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult make_object(unsigned long long* out, const CUDA_RESOURCE_DESC* res, const CUDA_TEXTURE_DESC* tex,
                     const CUDA_RESOURCE_VIEW_DESC* view, bool surface) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    if (out == nullptr || res == nullptr || (!surface && tex == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    if (const CUresult r = check_resource(s, *res, surface); r != CUDA_SUCCESS) return r;
    TexObj o;
    o.ctx = ctx;
    o.surface = surface;
    o.res = *res;
    if (tex != nullptr) o.tex = *tex;
    if (view != nullptr) o.view = *view;
    const unsigned long long v = g_next_object++;
    objects()[v] = o;
    *out = v;
    return CUDA_SUCCESS;
  });
}

template <class F>
CUresult with_object(unsigned long long v, bool surface, F&& f) {
  return guarded([&](State&) -> CUresult {
    auto it = objects().find(v);
    if (it == objects().end() || it->second.surface != surface) return CUDA_ERROR_INVALID_VALUE;
    return f(it);
  });
}

}  // namespace

namespace ivcuda::gpu_double {
ArrayObj* find_array(Handle h) {
  auto it = arrays().find(h);
  return it == arrays().end() ? nullptr : &it->second;
}
const TexObj* find_object(unsigned long long value, bool surface) {
  auto it = objects().find(value);
  return it == objects().end() || it->second.surface != surface ? nullptr : &it->second;
}
void release_context_arrays(State& s, Handle ctx) {
  std::erase_if(objects(), [&](const auto& kv) { return kv.second.ctx == ctx; });
  for (auto it = mipmaps().begin(); it != mipmaps().end();) {
    if (it->second.ctx != ctx) {
      ++it;
      continue;
    }
    for (Handle l : it->second.levels) {
      release_backing(s, arrays().at(l));
      arrays().erase(l);
    }
    for (TileBacking& t : it->second.tail) unback(s, t);
    unback(s, it->second.whole);
    it = mipmaps().erase(it);
  }
  for (auto it = arrays().begin(); it != arrays().end();) {
    if (it->second.ctx != ctx || it->second.mipmap != 0) {
      ++it;
      continue;
    }
    release_backing(s, it->second);
    it = arrays().erase(it);
  }
}
}  // namespace ivcuda::gpu_double

namespace {

// One backing a map or unmap entry changes: the tile (or piece, or whole array) and what it
// is to be (mem 0: nothing).
struct MapStep {
  TileBacking* slot = nullptr;
  TileBacking to;
};

// The device whose queue `stream` is.
CUresult stream_device(State& s, CUstream stream, int* out) {
  if (const CUresult r = check_stream(s, stream); r != CUDA_SUCCESS) return r;
  Handle ctx = 0;
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) {
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
  } else {
    ctx = s.streams.at(from_handle(stream)).ctx;
  }
  *out = s.contexts.at(ctx).device;
  return CUDA_SUCCESS;
}

// Appends `n` consecutive 64 KiB pieces of the mapped memory, from `offset` on, or checks
// that an unmap names no memory.
CUresult back_with(const PhysicalMem* mem, std::size_t offset, const std::vector<TileBacking*>& slots, Handle h,
                   std::vector<MapStep>* steps) {
  if (mem != nullptr) {
    std::size_t bytes = 0, end = 0;
    if (__builtin_mul_overflow(slots.size(), kTileBytes, &bytes) || __builtin_add_overflow(offset, bytes, &end) ||
        end > mem->size)
      return CUDA_ERROR_INVALID_VALUE;
  }
  for (std::size_t i = 0; i < slots.size(); ++i)
    steps->push_back(MapStep{slots[i], mem != nullptr ? TileBacking{h, offset + i * kTileBytes} : TileBacking{}});
  return CUDA_SUCCESS;
}

// An enumerator field read as an integer: a caller's out-of-range value is not a valid load
// of the enum.
template <class E>
unsigned raw(const E& e) {
  static_assert(sizeof(E) == sizeof(unsigned));
  unsigned v = 0;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

// What one CUarrayMapInfo changes, checked as the driver documents it (cuda.h).
CUresult plan_map(State& s, const CUarrayMapInfo& m, int device, std::vector<MapStep>* steps) {
  const unsigned op = raw(m.memOperationType), type = raw(m.resourceType), sub = raw(m.subresourceType);
  if (m.flags != 0 || m.reserved[0] != 0 || m.reserved[1] != 0 || raw(m.memHandleType) != CU_MEM_HANDLE_TYPE_GENERIC)
    return CUDA_ERROR_INVALID_VALUE;
  if (op != CU_MEM_OPERATION_TYPE_MAP && op != CU_MEM_OPERATION_TYPE_UNMAP) return CUDA_ERROR_INVALID_VALUE;
  // Exactly the stream's device.
  if (m.deviceBitMask != 1u << device) return CUDA_ERROR_INVALID_VALUE;
  ArrayObj* a = nullptr;
  Mipmap* mm = nullptr;
  if (type == CU_RESOURCE_TYPE_ARRAY) {
    a = find_array(from_handle(m.resource.array));
    if (a == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (a->mipmap != 0 || a->dense()) return CUDA_ERROR_INVALID_VALUE;
  } else if (type == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY) {
    auto it = mipmaps().find(from_handle(m.resource.mipmap));
    if (it == mipmaps().end()) return CUDA_ERROR_INVALID_HANDLE;
    mm = &it->second;
    if ((mm->flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) == 0) return CUDA_ERROR_INVALID_VALUE;
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const PhysicalMem* mem = nullptr;
  const Handle h = static_cast<Handle>(m.memHandle.memHandle);
  if (op == CU_MEM_OPERATION_TYPE_MAP) {
    // Tile pool memory of the stream's device, at a whole tile.
    mem = held_physical(s, m.memHandle.memHandle);
    // What the H200's driver crashes on: no memory, or none at that offset.
    if (mem == nullptr ? h == 0 : m.offset >= mem->size) note_stray(h, m.offset, __FILE__, __LINE__);
    if (mem == nullptr || (mem->prop.allocFlags.usage & CU_MEM_CREATE_USAGE_TILE_POOL) == 0 ||
        mem->prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || mem->prop.location.id != device ||
        m.offset % kTileBytes != 0)
      return CUDA_ERROR_INVALID_VALUE;
  } else if (m.memHandle.memHandle != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const bool deferred = a != nullptr ? a->deferred() : (mm->flags & CUDA_ARRAY3D_DEFERRED_MAPPING) != 0;
  if (deferred) {
    // The subresource is ignored: the array maps as a whole.
    TileBacking* slot = a != nullptr ? &a->whole : &mm->whole;
    const std::size_t bytes = a != nullptr ? round_tile(dense_bytes(*a)) : mm->deferred_size;
    std::size_t end = 0;
    if (mem != nullptr && (__builtin_add_overflow(m.offset, bytes, &end) || end > mem->size))
      return CUDA_ERROR_INVALID_VALUE;
    steps->push_back(MapStep{slot, mem != nullptr ? TileBacking{h, m.offset} : TileBacking{}});
    return CUDA_SUCCESS;
  }
  std::vector<TileBacking*> slots;
  if (sub == CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL) {
    const auto& l = m.subresource.sparseLevel;
    ArrayObj* lv = a;
    if (mm != nullptr) {
      if (l.level >= mm->levels.size()) return CUDA_ERROR_INVALID_VALUE;
      lv = &arrays().at(mm->levels[l.level]);
      if (lv->in_tail) return CUDA_ERROR_INVALID_VALUE;  // the mip tail maps as such
    } else if (l.level != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const CUDA_ARRAY3D_DESCRIPTOR& d = lv->desc;
    if (layered(d) ? l.layer >= slices(d) : l.layer != 0) return CUDA_ERROR_INVALID_VALUE;
    if (!three_d(d) && (l.offsetZ != 0 || l.extentDepth != 1)) return CUDA_ERROR_INVALID_VALUE;
    // Offsets on tile boundaries; extents whole tiles or up to the level's edge.
    const std::size_t dim[3] = {d.Width, lv->rows(), three_d(d) ? d.Depth : 1};
    const std::size_t off[3] = {l.offsetX, l.offsetY, l.offsetZ};
    const std::size_t ext[3] = {l.extentWidth, l.extentHeight, l.extentDepth};
    std::size_t first[3], last[3];
    for (int i = 0; i < 3; ++i) {
      if (ext[i] == 0 || off[i] % lv->tile[i] != 0 || off[i] > dim[i] || ext[i] > dim[i] - off[i] ||
          (ext[i] % lv->tile[i] != 0 && off[i] + ext[i] != dim[i]))
        return CUDA_ERROR_INVALID_VALUE;
      first[i] = off[i] / lv->tile[i];
      last[i] = ceil_div(off[i] + ext[i], lv->tile[i]);
    }
    if (layered(d)) first[2] = l.layer, last[2] = l.layer + 1;  // a layer is a slice of tiles
    for (std::size_t tz = first[2]; tz < last[2]; ++tz)
      for (std::size_t ty = first[1]; ty < last[1]; ++ty)
        for (std::size_t tx = first[0]; tx < last[0]; ++tx)
          slots.push_back(&lv->tiles.at((tz * lv->grid[1] + ty) * lv->grid[0] + tx));
  } else if (sub == CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL) {
    const auto& t = m.subresource.miptail;
    // Only a mipmapped array has a mip tail here; one per layer.
    if (mm == nullptr || mm->miptail_size == 0 || t.layer >= mm->layers) return CUDA_ERROR_INVALID_VALUE;
    if (t.size == 0 || t.offset % kTileBytes != 0 || t.size % kTileBytes != 0 || t.offset > mm->miptail_size ||
        t.size > mm->miptail_size - t.offset)
      return CUDA_ERROR_INVALID_VALUE;
    const std::size_t per_layer = mm->miptail_size / kTileBytes;
    for (std::size_t i = t.offset / kTileBytes; i < (t.offset + t.size) / kTileBytes; ++i)
      slots.push_back(&mm->tail.at(t.layer * per_layer + i));
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return back_with(mem, m.offset, slots, h, steps);
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuArrayCreate_v2(CUarray* out, const CUDA_ARRAY_DESCRIPTOR* d) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    if (out == nullptr || d == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d3{};
    d3.Width = d->Width;
    d3.Height = d->Height;
    d3.Format = d->Format;
    d3.NumChannels = d->NumChannels;
    Handle h = 0;
    const CUresult r = make_array(s, ctx, d3, 0, 0, &h);
    if (r == CUDA_SUCCESS) *out = to_handle<CUarray_st>(h);
    return r;
  });
}

CUresult CUDAAPI cuArray3DCreate_v2(CUarray* out, const CUDA_ARRAY3D_DESCRIPTOR* d) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    if (out == nullptr || d == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Handle h = 0;
    const CUresult r = make_array(s, ctx, *d, 0, 0, &h);
    if (r == CUDA_SUCCESS) *out = to_handle<CUarray_st>(h);
    return r;
  });
}

CUresult CUDAAPI cuArrayDestroy(CUarray a) {
  return guarded([&](State& s) -> CUresult { return destroy_array(s, from_handle(a)); });
}

CUresult CUDAAPI cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR* out, CUarray a) {
  return guarded([&](State&) -> CUresult {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const ArrayObj* o = find_array(from_handle(a));
    if (o == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    *out = CUDA_ARRAY_DESCRIPTOR{o->desc.Width, o->desc.Height, o->desc.Format, o->desc.NumChannels};
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR* out, CUarray a) {
  return guarded([&](State&) -> CUresult {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const ArrayObj* o = find_array(from_handle(a));
    if (o == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    *out = o->desc;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* req, CUarray a, CUdevice dev) {
  return guarded([&](State& s) -> CUresult {
    if (req == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= s.device_count) return CUDA_ERROR_INVALID_DEVICE;
    const ArrayObj* o = find_array(from_handle(a));
    if (o == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    // Only a deferred-mapping array has requirements (cuda.h: INVALID_VALUE otherwise).
    if (!o->deferred() || o->mipmap != 0) return CUDA_ERROR_INVALID_VALUE;
    *req = CUDA_ARRAY_MEMORY_REQUIREMENTS{};
    req->alignment = kTileBytes;
    req->size = round_tile(dense_bytes(*o));
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuArrayGetSparseProperties(CUDA_ARRAY_SPARSE_PROPERTIES* out, CUarray a) {
  return guarded([&](State&) -> CUresult {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const ArrayObj* o = find_array(from_handle(a));
    if (o == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    // A level answers for its mipmapped array only (cuda.h).
    if (!o->sparse() || o->mipmap != 0) return CUDA_ERROR_INVALID_VALUE;
    *out = CUDA_ARRAY_SPARSE_PROPERTIES{};
    out->tileExtent.width = static_cast<unsigned>(o->tile[0]);
    out->tileExtent.height = static_cast<unsigned>(o->tile[1]);
    out->tileExtent.depth = static_cast<unsigned>(o->tile[2]);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray* out, const CUDA_ARRAY3D_DESCRIPTOR* d, unsigned levels) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    if (out == nullptr || d == nullptr || levels == 0) return CUDA_ERROR_INVALID_VALUE;
    const std::size_t largest = std::max({d->Width, d->Height, d->Depth});
    if (levels > 1 && (levels - 1 >= 64 || (largest >> (levels - 1)) == 0)) return CUDA_ERROR_INVALID_VALUE;
    const Handle m = s.new_handle();
    Mipmap mm;
    mm.ctx = ctx;
    mm.flags = d->Flags;
    for (unsigned l = 0; l < levels; ++l) {
      CUDA_ARRAY3D_DESCRIPTOR ld = *d;
      auto shrink = [&](std::size_t v) { return v == 0 ? 0 : std::max<std::size_t>(1, v >> l); };
      ld.Width = shrink(d->Width);
      ld.Height = shrink(d->Height);
      if ((d->Flags & CUDA_ARRAY3D_LAYERED) == 0) ld.Depth = shrink(d->Depth);
      Handle h = 0;
      if (const CUresult r = make_array(s, ctx, ld, m, l, &h); r != CUDA_SUCCESS) {
        for (Handle done : mm.levels) arrays().erase(done);
        return r;
      }
      mm.levels.push_back(h);
    }
    mm.miptail_first = levels;
    mm.layers = layered(*d) ? slices(*d) : 1;
    if ((d->Flags & CUDA_ARRAY3D_SPARSE) != 0) {
      // The mip tail: every level from the first that is smaller than a tile in some
      // dimension, packed level after level in each layer's tail.
      std::size_t tail = 0;
      for (unsigned l = 0; l < levels; ++l) {
        ArrayObj& a = arrays().at(mm.levels[l]);
        const bool small = a.desc.Width < a.tile[0] || a.rows() < a.tile[1] ||
                           (three_d(a.desc) && a.desc.Depth < a.tile[2]);
        if (small && mm.miptail_first == levels) mm.miptail_first = l;
        if (mm.miptail_first != levels) {
          a.in_tail = true;
          a.tiles.clear();
          a.tail_base = tail;
          tail += a.row_bytes() * a.rows() * (three_d(a.desc) ? a.desc.Depth : 1);
        }
      }
      mm.miptail_size = round_tile(tail);
      mm.tail.assign(mm.layers * (mm.miptail_size / kTileBytes), TileBacking{});
    }
    if ((d->Flags & CUDA_ARRAY3D_DEFERRED_MAPPING) != 0)
      for (Handle l : mm.levels) {
        mm.level_base.push_back(mm.deferred_size);
        mm.deferred_size += round_tile(dense_bytes(arrays().at(l)));
      }
    mipmaps()[m] = std::move(mm);
    *out = to_handle<CUmipmappedArray_st>(m);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray m) {
  return guarded([&](State& s) -> CUresult {
    auto it = mipmaps().find(from_handle(m));
    if (it == mipmaps().end()) return CUDA_ERROR_INVALID_HANDLE;
    for (Handle l : it->second.levels) {
      release_backing(s, arrays().at(l));
      arrays().erase(l);
    }
    for (TileBacking& t : it->second.tail) unback(s, t);
    unback(s, it->second.whole);
    mipmaps().erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMipmappedArrayGetLevel(CUarray* out, CUmipmappedArray m, unsigned level) {
  return guarded([&](State&) -> CUresult {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto it = mipmaps().find(from_handle(m));
    if (it == mipmaps().end()) return CUDA_ERROR_INVALID_HANDLE;
    if (level >= it->second.levels.size()) return CUDA_ERROR_INVALID_VALUE;
    *out = to_handle<CUarray_st>(it->second.levels[level]);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* req, CUmipmappedArray m,
                                                       CUdevice dev) {
  return guarded([&](State& s) -> CUresult {
    if (req == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= s.device_count) return CUDA_ERROR_INVALID_DEVICE;
    auto it = mipmaps().find(from_handle(m));
    if (it == mipmaps().end()) return CUDA_ERROR_INVALID_HANDLE;
    if ((it->second.flags & CUDA_ARRAY3D_DEFERRED_MAPPING) == 0) return CUDA_ERROR_INVALID_VALUE;
    *req = CUDA_ARRAY_MEMORY_REQUIREMENTS{};
    req->alignment = kTileBytes;
    req->size = it->second.deferred_size;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMipmappedArrayGetSparseProperties(CUDA_ARRAY_SPARSE_PROPERTIES* out, CUmipmappedArray m) {
  return guarded([&](State&) -> CUresult {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto it = mipmaps().find(from_handle(m));
    if (it == mipmaps().end()) return CUDA_ERROR_INVALID_HANDLE;
    const Mipmap& mm = it->second;
    if ((mm.flags & CUDA_ARRAY3D_SPARSE) == 0) return CUDA_ERROR_INVALID_VALUE;
    const ArrayObj& top = arrays().at(mm.levels.at(0));
    *out = CUDA_ARRAY_SPARSE_PROPERTIES{};
    out->tileExtent.width = static_cast<unsigned>(top.tile[0]);
    out->tileExtent.height = static_cast<unsigned>(top.tile[1]);
    out->tileExtent.depth = static_cast<unsigned>(top.tile[2]);
    out->miptailFirstLevel = mm.miptail_size != 0 ? mm.miptail_first : 0;
    out->miptailSize = mm.miptail_size;  // per layer: no CU_ARRAY_SPARSE_PROPERTIES_SINGLE_MIPTAIL
    return CUDA_SUCCESS;
  });
}

// Every entry is checked before any is applied. Work runs at once here, so the mapping
// holds from the call on, as it would once the stream reached it.
CUresult CUDAAPI cuMemMapArrayAsync(CUarrayMapInfo* list, unsigned int count, CUstream stream) {
  return guarded([&](State& s) -> CUresult {
    int device = 0;
    if (const CUresult r = stream_device(s, stream, &device); r != CUDA_SUCCESS) return r;
    if (list == nullptr && count != 0) return CUDA_ERROR_INVALID_VALUE;
    // Not work a graph can hold.
    if (s.captures.contains(from_handle(stream))) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    std::vector<MapStep> steps;
    for (unsigned i = 0; i < count; ++i)
      if (const CUresult r = plan_map(s, list[i], device, &steps); r != CUDA_SUCCESS) return r;
    for (const MapStep& st : steps) {
      if (st.to.mem != 0) physical_ref(s, st.to.mem);  // before the old one goes: it may be the same
      unback(s, *st.slot);
      *st.slot = st.to;
    }
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemcpy3D_v2(const CUDA_MEMCPY3D* p) { return copy_3d(p, nullptr); }

CUresult CUDAAPI cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D* p, CUstream stream) {
  if (p != nullptr) {
    const CUDA_MEMCPY3D c = *p;
    CUresult r = CUDA_SUCCESS;
    if (capture_call(stream, [=]() -> CUresult { return cuMemcpy3DAsync_v2(&c, stream); }, &r)) return r;
  }
  return copy_3d(p, &stream);
}

CUresult CUDAAPI cuTexObjectCreate(CUtexObject* out, const CUDA_RESOURCE_DESC* res, const CUDA_TEXTURE_DESC* tex,
                                   const CUDA_RESOURCE_VIEW_DESC* view) {
  return make_object(out, res, tex, view, false);
}

CUresult CUDAAPI cuTexObjectDestroy(CUtexObject t) {
  return with_object(t, false, [](auto it) {
    objects().erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuTexObjectGetResourceDesc(CUDA_RESOURCE_DESC* out, CUtexObject t) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return with_object(t, false, [&](auto it) {
    *out = it->second.res;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuTexObjectGetTextureDesc(CUDA_TEXTURE_DESC* out, CUtexObject t) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return with_object(t, false, [&](auto it) {
    *out = it->second.tex;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuTexObjectGetResourceViewDesc(CUDA_RESOURCE_VIEW_DESC* out, CUtexObject t) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return with_object(t, false, [&](auto it) {
    *out = it->second.view;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuSurfObjectCreate(CUsurfObject* out, const CUDA_RESOURCE_DESC* res) {
  return make_object(out, res, nullptr, nullptr, true);
}

CUresult CUDAAPI cuSurfObjectDestroy(CUsurfObject v) {
  return with_object(v, true, [](auto it) {
    objects().erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuSurfObjectGetResourceDesc(CUDA_RESOURCE_DESC* out, CUsurfObject v) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return with_object(v, true, [&](auto it) {
    *out = it->second.res;
    return CUDA_SUCCESS;
  });
}

}  // extern "C"
