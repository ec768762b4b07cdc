// CUDA arrays, mipmapped arrays, 3D copies, texture and surface objects of the GPU test
// double. An array is a dense host buffer with its descriptor (arrays.h); copies move its
// rows; texture and surface objects are numbered records that the CPU kernels sample.
// Arrays outlive their context here (the driver frees them with it): nothing in the tests
// depends on that.
#include "arrays.h"

#include <algorithm>
#include <cstring>
#include <map>

using namespace ivcuda::gpu_double;

namespace {

struct Mipmap {
  Handle ctx = 0;
  std::vector<Handle> levels;
};

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

CUresult make_array(State& s, Handle ctx, const CUDA_ARRAY3D_DESCRIPTOR& d, Handle mipmap, Handle* out) {
  ArrayObj a;
  a.ctx = ctx;
  a.desc = d;
  a.elem = element_bytes(d.Format, d.NumChannels);
  a.mipmap = mipmap;
  if (a.elem == 0 || d.Width == 0) return CUDA_ERROR_INVALID_VALUE;
  // A 3D array needs a height; a layered 1D one has none.
  if (d.Depth != 0 && d.Height == 0 && (d.Flags & CUDA_ARRAY3D_LAYERED) == 0) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t limit = std::size_t{1} << 16;
  if (d.Width > limit || d.Height > limit || d.Depth > limit) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t bytes = a.row_bytes() * a.rows() * (d.Depth == 0 ? 1 : d.Depth);
  if (bytes > kTotalMem) return CUDA_ERROR_OUT_OF_MEMORY;
  a.data.assign(bytes, 0);
  const Handle h = s.new_handle();
  arrays()[h] = std::move(a);
  *out = h;
  return CUDA_SUCCESS;
}

CUresult destroy_array(Handle h) {
  auto it = arrays().find(h);
  if (it == arrays().end() || it->second.mipmap != 0) return CUDA_ERROR_INVALID_HANDLE;
  arrays().erase(it);
  return CUDA_SUCCESS;
}

// One side of a 3D copy: the first byte and the distances between rows and slices.
struct Side {
  unsigned char* base = nullptr;
  std::size_t pitch = 0;
  std::size_t slice = 0;
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
    for (std::size_t z = 0; z < c.Depth; ++z)
      for (std::size_t y = 0; y < c.Height; ++y)
        std::memmove(dst.base + z * dst.slice + y * dst.pitch, src.base + z * src.slice + y * src.pitch,
                     c.WidthInBytes);
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
}  // namespace ivcuda::gpu_double

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
    const CUresult r = make_array(s, ctx, d3, 0, &h);
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
    const CUresult r = make_array(s, ctx, *d, 0, &h);
    if (r == CUDA_SUCCESS) *out = to_handle<CUarray_st>(h);
    return r;
  });
}

CUresult CUDAAPI cuArrayDestroy(CUarray a) {
  return guarded([&](State&) -> CUresult { return destroy_array(from_handle(a)); });
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
    *req = CUDA_ARRAY_MEMORY_REQUIREMENTS{};
    req->alignment = 65536;
    req->size = (o->data.size() + 65535) / 65536 * 65536;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray* out, const CUDA_ARRAY3D_DESCRIPTOR* d, unsigned levels) {
  return guarded([&](State& s) -> CUresult {
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    if (out == nullptr || d == nullptr || levels == 0) return CUDA_ERROR_INVALID_VALUE;
    const std::size_t largest = std::max({d->Width, d->Height, d->Depth});
    if (levels > 1 && (largest >> (levels - 1)) == 0) return CUDA_ERROR_INVALID_VALUE;
    const Handle m = s.new_handle();
    Mipmap mm{ctx, {}};
    for (unsigned l = 0; l < levels; ++l) {
      CUDA_ARRAY3D_DESCRIPTOR ld = *d;
      auto shrink = [&](std::size_t v) { return v == 0 ? 0 : std::max<std::size_t>(1, v >> l); };
      ld.Width = shrink(d->Width);
      ld.Height = shrink(d->Height);
      if ((d->Flags & CUDA_ARRAY3D_LAYERED) == 0) ld.Depth = shrink(d->Depth);
      Handle h = 0;
      if (const CUresult r = make_array(s, ctx, ld, m, &h); r != CUDA_SUCCESS) {
        for (Handle done : mm.levels) arrays().erase(done);
        return r;
      }
      mm.levels.push_back(h);
    }
    mipmaps()[m] = std::move(mm);
    *out = to_handle<CUmipmappedArray_st>(m);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray m) {
  return guarded([&](State&) -> CUresult {
    auto it = mipmaps().find(from_handle(m));
    if (it == mipmaps().end()) return CUDA_ERROR_INVALID_HANDLE;
    for (Handle l : it->second.levels) arrays().erase(l);
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
    std::size_t bytes = 0;
    for (Handle l : it->second.levels) bytes += arrays().at(l).data.size();
    *req = CUDA_ARRAY_MEMORY_REQUIREMENTS{};
    req->alignment = 65536;
    req->size = (bytes + 65535) / 65536 * 65536;
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
