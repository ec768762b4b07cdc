// CUDA arrays, mipmapped arrays, texture and surface objects, sparse arrays'
// properties and tile mappings, forwarded (the host side and its rules are
// host-daemon/worker/arrays.cc).
//
// A CUarray / CUmipmappedArray here is the host's handle; texture and surface
// objects are the driver's values, which kernels take by value. Every copy
// that involves an array, and every cuMemcpy3D, travels as one 3D copy
// (Op::kMemcpy3D): host memory must be in the arena for the host to reach it,
// so a pageable side is packed into the calling thread's staging area, as
// many slices (or, for big slices, rows) at a time as fit. cuMemMapArrayAsync
// is one synchronous request (Op::kMemMapArrays) with the list's entries as
// the application wrote them, its device bits made the worker's; the host
// translates and checks the handles, for the whole list at once.
#include "guest/arrays.h"

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"
#include "ivcuda/array_codec.h"
#include "guest/family.h"

namespace codec = ivcuda::codec;

namespace {

#define NEED_RT_CTX()                                                   \
  Runtime* rt = nullptr;                                                \
  if (const CUresult st_ = runtime(&rt); st_ != CUDA_SUCCESS) return st_; \
  const std::uint64_t ctx = current_ctx();                              \
  if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT

bool is_device(Runtime* rt, std::uint64_t p) {
  std::lock_guard lk(rt->books_mu);
  auto it = rt->dev_allocs.upper_bound(p);
  if (it == rt->dev_allocs.begin()) return false;
  --it;
  return p - it->first < it->second;
}

// One side of a copy as the caller described it; unified memory resolved.
struct Side {
  CUmemorytype type;
  std::uint64_t x, y, z;
  const void* host = nullptr;
  CUdeviceptr device = 0;
  CUarray array = nullptr;
  std::uint64_t pitch = 0, height = 0;
  std::optional<std::uint64_t> pin;  // host: the base pointer's arena offset, if page-locked throughout

  char* at(std::uint64_t yy, std::uint64_t zz) const {
    return static_cast<char*>(const_cast<void*>(host)) + x + pitch * (y + yy) + pitch * height * (z + zz);
  }
};

CUresult make_side(Runtime* rt, CUmemorytype type, std::uint64_t x, std::uint64_t y, std::uint64_t z,
                   const void* host, CUdeviceptr dev, CUarray array, std::uint64_t pitch, std::uint64_t height,
                   const CUDA_MEMCPY3D& c, Side* out) {
  *out = Side{type, x, y, z, host, dev, array, pitch, height, std::nullopt};
  if (type == CU_MEMORYTYPE_UNIFIED) {
    if (is_device(rt, dev)) {
      out->type = CU_MEMORYTYPE_DEVICE;
    } else {
      out->type = CU_MEMORYTYPE_HOST;
      out->host = reinterpret_cast<const void*>(dev);
    }
  }
  switch (out->type) {
    case CU_MEMORYTYPE_HOST: {
      if (out->host == nullptr) return CUDA_ERROR_INVALID_VALUE;
      // Overlapping rows or slices: the host refuses them for page-locked
      // memory, so pageable memory gets the same answer.
      if ((c.Height > 1 || c.Depth > 1) && pitch < c.WidthInBytes) return CUDA_ERROR_INVALID_VALUE;
      if (c.Depth > 1 && height < c.Height) return CUDA_ERROR_INVALID_VALUE;
      // Bytes from the base pointer to the end of the region.
      const std::uint64_t end = x + pitch * y + pitch * height * z + pitch * height * (c.Depth - 1) +
                                pitch * (c.Height - 1) + c.WidthInBytes;
      if (rt->pinned_offset(out->host, end)) out->pin = rt->pinned_offset(out->host, 1);
      return CUDA_SUCCESS;
    }
    case CU_MEMORYTYPE_DEVICE:
      return CUDA_SUCCESS;
    case CU_MEMORYTYPE_ARRAY:
      return array == nullptr ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// The wire form of a side, `dy`/`dz` rows/slices into the region.
proto::CopySide wire(const Side& s, std::uint64_t dy, std::uint64_t dz) {
  proto::CopySide w{};
  w.type = static_cast<std::uint32_t>(s.type);
  w.x_bytes = s.x;
  w.y = s.y + dy;
  w.z = s.z + dz;
  w.device = s.device;
  w.arena_off = s.pin.value_or(0);
  w.array = h(s.array);
  w.pitch = s.pitch;
  w.height = s.height;
  return w;
}

// A packed staging side of `rows` rows per slice.
proto::CopySide staged(std::uint64_t off, std::uint64_t width, std::uint64_t rows) {
  proto::CopySide w{};
  w.type = CU_MEMORYTYPE_HOST;
  w.arena_off = off;
  w.pitch = width;
  w.height = rows;
  return w;
}

CUresult copy_3d(const CUDA_MEMCPY3D& c, CUstream s, bool async) {
  NEED_RT_CTX();
  if (async && !known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
  Side src, dst;
  if (CUresult st = make_side(rt, c.srcMemoryType, c.srcXInBytes, c.srcY, c.srcZ, c.srcHost, c.srcDevice, c.srcArray,
                              c.srcPitch, c.srcHeight, c, &src);
      st != CUDA_SUCCESS)
    return st;
  if (CUresult st = make_side(rt, c.dstMemoryType, c.dstXInBytes, c.dstY, c.dstZ, c.dstHost, c.dstDevice, c.dstArray,
                              c.dstPitch, c.dstHeight, c, &dst);
      st != CUDA_SUCCESS)
    return st;
  if (c.WidthInBytes == 0 || c.Height == 0 || c.Depth == 0) return CUDA_SUCCESS;
  const std::uint64_t w = c.WidthInBytes;
  const bool src_staged = src.type == CU_MEMORYTYPE_HOST && !src.pin;
  const bool dst_staged = dst.type == CU_MEMORYTYPE_HOST && !dst.pin;
  if (src_staged && dst_staged) {  // host to host: no GPU needed
    if ((c.Height > 1 || c.Depth > 1) && (src.pitch < w || dst.pitch < w)) return CUDA_ERROR_INVALID_VALUE;
    for (std::uint64_t z = 0; z < c.Depth; ++z)
      for (std::uint64_t y = 0; y < c.Height; ++y) std::memmove(dst.at(y, z), src.at(y, z), w);
    return CUDA_SUCCESS;
  }
  proto::ReqCopy3D r{};
  r.ctx = ctx;
  r.stream = h(s);
  r.width_bytes = w;
  if (!src_staged && !dst_staged) {
    r.src = wire(src, 0, 0);
    r.dst = wire(dst, 0, 0);
    r.height = c.Height;
    r.depth = c.Depth;
    r.flags = async ? proto::kAsync : 0;
    return async ? rt->post<Op::kMemcpy3D>(r) : rt->call<Op::kMemcpy3D>(r);
  }
  // One side pageable: bands of whole slices when a slice fits the staging
  // area, else bands of rows of one slice.
  const std::uint64_t room = rt->staging_size();
  if (room < w) return CUDA_ERROR_INVALID_VALUE;
  const std::uint64_t stage = rt->staging_off();
  std::unique_lock<std::mutex> staging_lock;
  if (CUresult st = ivcuda::guest::take_staging(rt, ctx, &staging_lock); st != CUDA_SUCCESS) return st;
  const std::uint64_t slice = w * c.Height;
  const bool by_slices = slice <= room;
  const std::uint64_t band = by_slices ? room / slice : room / w;
  r.flags = async ? (proto::kAsync | proto::kWaitStream) : 0;
  Side& host = src_staged ? src : dst;
  for (std::uint64_t z0 = 0; z0 < c.Depth; z0 += by_slices ? band : 1) {
    const std::uint64_t nz = by_slices ? std::min(band, c.Depth - z0) : 1;
    for (std::uint64_t y0 = 0; y0 < c.Height; y0 += by_slices ? c.Height : band) {
      const std::uint64_t ny = by_slices ? c.Height : std::min(band, c.Height - y0);
      std::byte* buf = rt->bar() + stage;
      if (src_staged)
        for (std::uint64_t z = 0; z < nz; ++z)
          for (std::uint64_t y = 0; y < ny; ++y)
            std::memcpy(buf + (z * ny + y) * w, host.at(y0 + y, z0 + z), w);
      r.src = src_staged ? staged(stage, w, ny) : wire(src, y0, z0);
      r.dst = dst_staged ? staged(stage, w, ny) : wire(dst, y0, z0);
      r.height = ny;
      r.depth = nz;
      if (CUresult st = rt->call<Op::kMemcpy3D>(r); st != CUDA_SUCCESS) return st;
      if (dst_staged)
        for (std::uint64_t z = 0; z < nz; ++z)
          for (std::uint64_t y = 0; y < ny; ++y)
            std::memcpy(host.at(y0 + y, z0 + z), buf + (z * ny + y) * w, w);
    }
  }
  return CUDA_SUCCESS;
}

// The 1D copies with arrays (HtoA, AtoH, ...): a byte range of the array's
// first row.
CUresult copy_1d(CUmemorytype st, CUmemorytype dt, const void* src_host, CUdeviceptr src_dev, CUarray src_arr,
                 std::uint64_t src_off, void* dst_host, CUdeviceptr dst_dev, CUarray dst_arr, std::uint64_t dst_off,
                 std::uint64_t bytes, CUstream s, bool async) {
  CUDA_MEMCPY3D c{};
  c.srcMemoryType = st;
  c.srcXInBytes = st == CU_MEMORYTYPE_ARRAY ? src_off : 0;
  c.srcHost = src_host;
  c.srcDevice = src_dev;
  c.srcArray = src_arr;
  c.dstMemoryType = dt;
  c.dstXInBytes = dt == CU_MEMORYTYPE_ARRAY ? dst_off : 0;
  c.dstHost = dst_host;
  c.dstDevice = dst_dev;
  c.dstArray = dst_arr;
  c.srcPitch = c.dstPitch = bytes;
  c.srcHeight = c.dstHeight = 1;
  c.WidthInBytes = bytes;
  c.Height = 1;
  c.Depth = 1;
  return copy_3d(c, s, async);
}

CUresult create(std::uint64_t* out, const proto::ArrayDesc& d, std::uint32_t kind, std::uint32_t levels) {
  NEED_RT_CTX();
  proto::ReqArrayCreate r{};
  r.ctx = ctx;
  r.desc = d;
  r.kind = kind;
  r.levels = levels;
  proto::RepHandle rep{};
  const CUresult st = rt->call<Op::kArrayCreate>(r, {}, &rep);
  if (st == CUDA_SUCCESS) *out = rep.handle;
  return st;
}

CUresult query(std::uint64_t handle, std::uint32_t kind, int device, proto::RepArrayQuery* rep) {
  NEED_RT_CTX();
  proto::ReqArrayQuery r{};
  r.ctx = ctx;
  r.array = handle;
  r.kind = kind;
  r.device = device;
  return rt->call<Op::kArrayQuery>(r, {}, rep);
}

CUresult destroy(std::uint64_t handle, std::uint32_t kind) {
  Runtime* rt = nullptr;
  if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
  proto::ReqArrayQuery r{};
  r.ctx = current_ctx();
  r.array = handle;
  r.kind = kind;
  return rt->call<Op::kArrayDestroy>(r);
}

CUresult mem_requirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* req, std::uint64_t handle, CUdevice dev,
                          std::uint32_t kind) {
  Runtime* rt = nullptr;
  if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
  if (req == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const int w = rt->to_worker(dev);
  if (w < 0) return CUDA_ERROR_INVALID_DEVICE;
  proto::RepArrayQuery rep{};
  const CUresult st = query(handle, kind, w, &rep);
  if (st == CUDA_SUCCESS) {
    *req = CUDA_ARRAY_MEMORY_REQUIREMENTS{};
    req->size = rep.size;
    req->alignment = rep.alignment;
  }
  return st;
}

CUresult sparse_properties(CUDA_ARRAY_SPARSE_PROPERTIES* out, std::uint64_t handle, std::uint32_t kind) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::RepArrayQuery rep{};
  const CUresult st = query(handle, kind, 0, &rep);
  if (st == CUDA_SUCCESS) *out = codec::sparse_from_wire(rep);
  return st;
}

// An enumerator field as the application stored it: any number, which is
// not always a valid load of the enum type.
template <class E>
std::uint32_t raw(const E& e) {
  static_assert(sizeof(E) == sizeof(std::uint32_t));
  std::uint32_t v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

// cuMemMapArrayAsync: the entries with the application's handles (which are
// the host's) and its device ordinals made the worker's. The host checks the
// handles and answers for the whole list. A list too long for one record
// goes through the arena: the calling thread's staging area, or a temporary
// block of it.
CUresult map_arrays(CUarrayMapInfo* list, unsigned count, CUstream s) {
  NEED_RT_CTX();
  if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
  if ((list == nullptr && count != 0) || count > proto::kMaxArrayMaps) return CUDA_ERROR_INVALID_VALUE;
  std::vector<proto::ArrayMapEntry> wire(count);
  for (unsigned i = 0; i < count; ++i) {
    const CUarrayMapInfo& m = list[i];
    proto::ArrayMapEntry& w = wire[i];
    w.resource_type = raw(m.resourceType);
    w.resource = w.resource_type == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY ? h(m.resource.mipmap) : h(m.resource.array);
    w.subresource_type = raw(m.subresourceType);
    static_assert(sizeof m.subresource == sizeof w.subresource);
    std::memcpy(w.subresource, &m.subresource, sizeof w.subresource);
    w.op = raw(m.memOperationType);
    w.mem_handle_type = raw(m.memHandleType);
    w.mem_handle = m.memHandle.memHandle;
    w.offset = m.offset;
    w.flags = m.flags;
    w.reserved[0] = m.reserved[0];
    w.reserved[1] = m.reserved[1];
    // Device ordinals: the application's bits become the worker's. A bit
    // naming no device it has is no device at all.
    for (unsigned bit = 0; bit < 32; ++bit) {
      if ((m.deviceBitMask >> bit & 1u) == 0) continue;
      const int wd = rt->to_worker(static_cast<int>(bit));
      if (wd < 0 || wd >= 32) return CUDA_ERROR_INVALID_VALUE;
      w.device_mask |= 1u << wd;
    }
  }
  proto::ReqMapArrays r{};
  r.ctx = ctx;
  r.stream = h(s);
  r.count = count;
  r.flags = list == nullptr ? proto::kMapListNull : 0;
  const auto bytes = std::as_bytes(std::span(wire));
  if (bytes.size() <= rt->layout().ring_bytes / 4) return rt->call<Op::kMemMapArrays>(r, bytes);
  r.flags |= proto::kMapListInArena;
  if (bytes.size() <= rt->staging_size()) {
    std::unique_lock<std::mutex> staging_lock;
    if (CUresult st = ivcuda::guest::take_staging(rt, ctx, &staging_lock); st != CUDA_SUCCESS) return st;
    r.arena_off = rt->staging_off();
    std::memcpy(rt->bar() + r.arena_off, bytes.data(), bytes.size());
    return rt->call<Op::kMemMapArrays>(r);
  }
  proto::RepHostAlloc a{};
  if (const CUresult st = rt->call<Op::kHostAlloc>(proto::ReqHostAlloc{bytes.size(), 0, 0}, {}, &a);
      st != CUDA_SUCCESS)
    return st;
  r.arena_off = a.arena_off;
  std::memcpy(rt->bar() + r.arena_off, bytes.data(), bytes.size());
  const CUresult st = rt->call<Op::kMemMapArrays>(r);
  (void)rt->call<Op::kHostFree>(proto::ReqArenaOff{a.arena_off});
  return st;
}

// ---- texture and surface objects
// An array's or mipmapped array's handle is the host's already.
CUresult res_to_wire(const CUDA_RESOURCE_DESC& d, proto::ResDesc* w) {
  std::uint64_t handle = 0;
  if (d.resType == CU_RESOURCE_TYPE_ARRAY) handle = h(d.res.array.hArray);
  if (d.resType == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY) handle = h(d.res.mipmap.hMipmappedArray);
  return codec::resource_to_wire(d, handle, w) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

void res_from_wire(const proto::ResDesc& w, CUDA_RESOURCE_DESC* d) {
  (void)codec::resource_from_wire(w, d, codec::trusted_enum, [](const proto::ResDesc& r, CUDA_RESOURCE_DESC* out) {
    if (out->resType == CU_RESOURCE_TYPE_ARRAY)
      out->res.array.hArray = reinterpret_cast<CUarray>(r.handle);
    else
      out->res.mipmap.hMipmappedArray = reinterpret_cast<CUmipmappedArray>(r.handle);
    return CUDA_SUCCESS;
  });
}

CUresult obj_create(std::uint64_t* out, const CUDA_RESOURCE_DESC* res, const CUDA_TEXTURE_DESC* tex,
                    const CUDA_RESOURCE_VIEW_DESC* view, bool surface) {
  NEED_RT_CTX();
  if (out == nullptr || res == nullptr || (!surface && tex == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  proto::ReqTexCreate r{};
  r.ctx = ctx;
  if (CUresult st = res_to_wire(*res, &r.res); st != CUDA_SUCCESS) return st;
  r.flags = surface ? proto::kTexSurface : 0;
  if (tex != nullptr && !surface) r.tex = codec::texture_desc_to_wire(*tex);
  if (view != nullptr && !surface) {
    r.flags |= proto::kTexHasView;
    r.view = codec::view_desc_to_wire(*view);
  }
  proto::RepHandle rep{};
  const CUresult st = rt->call<Op::kTexCreate>(r, {}, &rep);
  if (st == CUDA_SUCCESS) *out = rep.handle;
  return st;
}

CUresult obj_call(Op op, std::uint64_t obj, bool surface, std::uint32_t q, proto::RepTexInfo* rep) {
  Runtime* rt = nullptr;
  if (const CUresult st = runtime(&rt); st != CUDA_SUCCESS) return st;
  proto::ReqTexObject r{};
  r.ctx = current_ctx();
  r.object = obj;
  r.flags = surface ? proto::kTexSurface : 0;
  r.query = q;
  if (op == Op::kTexDestroy) return rt->call<Op::kTexDestroy>(r);
  return rt->call<Op::kTexQuery>(r, {}, rep);
}

}  // namespace

namespace ivcuda::guest {
CUresult copy_2d_array(const CUDA_MEMCPY2D& c, CUstream s, bool async) {
  CUDA_MEMCPY3D d{};
  d.srcXInBytes = c.srcXInBytes;
  d.srcY = c.srcY;
  d.srcMemoryType = c.srcMemoryType;
  d.srcHost = c.srcHost;
  d.srcDevice = c.srcDevice;
  d.srcArray = c.srcArray;
  d.srcPitch = c.srcPitch ? c.srcPitch : c.WidthInBytes;  // as copy_2d reads a zero pitch
  d.srcHeight = c.srcY + c.Height;  // a 2D copy has no slices: the least the driver accepts
  d.dstXInBytes = c.dstXInBytes;
  d.dstY = c.dstY;
  d.dstMemoryType = c.dstMemoryType;
  d.dstHost = c.dstHost;
  d.dstDevice = c.dstDevice;
  d.dstArray = c.dstArray;
  d.dstPitch = c.dstPitch ? c.dstPitch : c.WidthInBytes;
  d.dstHeight = c.dstY + c.Height;
  d.WidthInBytes = c.WidthInBytes;
  d.Height = c.Height;
  d.Depth = 1;
  return copy_3d(d, s, async);
}
}  // namespace ivcuda::guest

// ---- arrays
CUresult cuArrayCreate(CUarray* out, const CUDA_ARRAY_DESCRIPTOR* d) {
  return guard([&] {
    if (out == nullptr || d == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::uint64_t hdl = 0;
    const CUresult st = create(&hdl, codec::array_desc_to_wire(*d), proto::kArrayCreate2D, 0);
    if (st == CUDA_SUCCESS) *out = reinterpret_cast<CUarray>(hdl);
    return st;
  });
}

CUresult cuArray3DCreate(CUarray* out, const CUDA_ARRAY3D_DESCRIPTOR* d) {
  return guard([&] {
    if (out == nullptr || d == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::uint64_t hdl = 0;
    const CUresult st = create(&hdl, codec::array_desc_to_wire(*d), proto::kArrayCreate3D, 0);
    if (st == CUDA_SUCCESS) *out = reinterpret_cast<CUarray>(hdl);
    return st;
  });
}

CUresult cuArrayDestroy(CUarray a) {
  return guard([&] { return destroy(h(a), proto::kDestroyArray); });
}

CUresult cuArrayGetDescriptor(CUDA_ARRAY_DESCRIPTOR* out, CUarray a) {
  return guard([&] {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::RepArrayQuery rep{};
    const CUresult st = query(h(a), proto::kArrayQuery2D, 0, &rep);
    if (st == CUDA_SUCCESS) (void)codec::array_desc_from_wire(rep.desc, out, codec::trusted_enum);
    return st;
  });
}

CUresult cuArray3DGetDescriptor(CUDA_ARRAY3D_DESCRIPTOR* out, CUarray a) {
  return guard([&] {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::RepArrayQuery rep{};
    const CUresult st = query(h(a), proto::kArrayQuery3D, 0, &rep);
    if (st == CUDA_SUCCESS) (void)codec::array_desc_from_wire(rep.desc, out, codec::trusted_enum);
    return st;
  });
}

CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* req, CUarray a, CUdevice dev) {
  return guard([&] { return mem_requirements(req, h(a), dev, proto::kArrayQueryMemReq); });
}

CUresult cuArrayGetSparseProperties(CUDA_ARRAY_SPARSE_PROPERTIES* out, CUarray a) {
  return guard([&] { return sparse_properties(out, h(a), proto::kArrayQuerySparse); });
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray* out, const CUDA_ARRAY3D_DESCRIPTOR* d, unsigned int levels) {
  return guard([&] {
    if (out == nullptr || d == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::uint64_t hdl = 0;
    const CUresult st = create(&hdl, codec::array_desc_to_wire(*d), proto::kArrayCreateMipmap, levels);
    if (st == CUDA_SUCCESS) *out = reinterpret_cast<CUmipmappedArray>(hdl);
    return st;
  });
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) {
  return guard([&] { return destroy(h(m), proto::kDestroyMipmap); });
}

CUresult cuMipmappedArrayGetLevel(CUarray* out, CUmipmappedArray m, unsigned int level) {
  return guard([&] {
    NEED_RT_CTX();
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::RepHandle rep{};
    const CUresult st = rt->call<Op::kMipmapLevel>(proto::ReqMipmapLevel{ctx, h(m), level, 0}, {}, &rep);
    if (st == CUDA_SUCCESS) *out = reinterpret_cast<CUarray>(rep.handle);
    return st;
  });
}

CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* req, CUmipmappedArray m,
                                               CUdevice dev) {
  return guard([&] { return mem_requirements(req, h(m), dev, proto::kArrayQueryMipmapMemReq); });
}

CUresult cuMipmappedArrayGetSparseProperties(CUDA_ARRAY_SPARSE_PROPERTIES* out, CUmipmappedArray m) {
  return guard([&] { return sparse_properties(out, h(m), proto::kArrayQueryMipmapSparse); });
}

// ---- sparse array mappings
CUresult cuMemMapArrayAsync(CUarrayMapInfo* list, unsigned int count, CUstream s) {
  return guard([&] { return map_arrays(list, count, s); });
}

// cuda.h declares the _ptsz form only for per-thread-default-stream builds.
extern "C" CUresult cuMemMapArrayAsync_ptsz(CUarrayMapInfo* list, unsigned int count, CUstream s) {
  return guard([&] { return map_arrays(list, count, ptsz(s)); });
}

// ---- copies
CUresult cuMemcpy3D(const CUDA_MEMCPY3D* p) {
  return guard([&] { return p == nullptr ? CUDA_ERROR_INVALID_VALUE : copy_3d(*p, nullptr, false); });
}

CUresult cuMemcpy3DAsync(const CUDA_MEMCPY3D* p, CUstream s) {
  return guard([&] { return p == nullptr ? CUDA_ERROR_INVALID_VALUE : copy_3d(*p, s, true); });
}

CUresult cuMemcpyHtoA(CUarray dst, size_t off, const void* src, size_t n) {
  return guard([&] {
    return copy_1d(CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_ARRAY, src, 0, nullptr, 0, nullptr, 0, dst, off, n, nullptr,
                   false);
  });
}

CUresult cuMemcpyHtoAAsync(CUarray dst, size_t off, const void* src, size_t n, CUstream s) {
  return guard([&] {
    return copy_1d(CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_ARRAY, src, 0, nullptr, 0, nullptr, 0, dst, off, n, s, true);
  });
}

CUresult cuMemcpyAtoH(void* dst, CUarray src, size_t off, size_t n) {
  return guard([&] {
    return copy_1d(CU_MEMORYTYPE_ARRAY, CU_MEMORYTYPE_HOST, nullptr, 0, src, off, dst, 0, nullptr, 0, n, nullptr,
                   false);
  });
}

CUresult cuMemcpyAtoHAsync(void* dst, CUarray src, size_t off, size_t n, CUstream s) {
  return guard([&] {
    return copy_1d(CU_MEMORYTYPE_ARRAY, CU_MEMORYTYPE_HOST, nullptr, 0, src, off, dst, 0, nullptr, 0, n, s, true);
  });
}

CUresult cuMemcpyAtoD(CUdeviceptr dst, CUarray src, size_t off, size_t n) {
  return guard([&] {
    return copy_1d(CU_MEMORYTYPE_ARRAY, CU_MEMORYTYPE_DEVICE, nullptr, 0, src, off, nullptr, dst, nullptr, 0, n,
                   nullptr, false);
  });
}

CUresult cuMemcpyDtoA(CUarray dst, size_t off, CUdeviceptr src, size_t n) {
  return guard([&] {
    return copy_1d(CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_ARRAY, nullptr, src, nullptr, 0, nullptr, 0, dst, off, n,
                   nullptr, false);
  });
}

CUresult cuMemcpyAtoA(CUarray dst, size_t dst_off, CUarray src, size_t src_off, size_t n) {
  return guard([&] {
    return copy_1d(CU_MEMORYTYPE_ARRAY, CU_MEMORYTYPE_ARRAY, nullptr, 0, src, src_off, nullptr, 0, dst, dst_off, n,
                   nullptr, false);
  });
}

// ---- texture and surface objects
CUresult cuTexObjectCreate(CUtexObject* out, const CUDA_RESOURCE_DESC* res, const CUDA_TEXTURE_DESC* tex,
                           const CUDA_RESOURCE_VIEW_DESC* view) {
  return guard([&] {
    std::uint64_t v = 0;
    const CUresult st = obj_create(&v, res, tex, view, false);
    if (st == CUDA_SUCCESS) *out = v;
    return st;
  });
}

CUresult cuTexObjectDestroy(CUtexObject t) {
  return guard([&] { return obj_call(Op::kTexDestroy, t, false, 0, nullptr); });
}

CUresult cuTexObjectGetResourceDesc(CUDA_RESOURCE_DESC* out, CUtexObject t) {
  return guard([&] {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::RepTexInfo rep{};
    const CUresult st = obj_call(Op::kTexQuery, t, false, proto::kTexQueryResource, &rep);
    if (st == CUDA_SUCCESS) res_from_wire(rep.res, out);
    return st;
  });
}

CUresult cuTexObjectGetTextureDesc(CUDA_TEXTURE_DESC* out, CUtexObject t) {
  return guard([&] {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::RepTexInfo rep{};
    const CUresult st = obj_call(Op::kTexQuery, t, false, proto::kTexQueryTexture, &rep);
    if (st == CUDA_SUCCESS) (void)codec::texture_desc_from_wire(rep.tex, out, codec::trusted_enum);
    return st;
  });
}

CUresult cuTexObjectGetResourceViewDesc(CUDA_RESOURCE_VIEW_DESC* out, CUtexObject t) {
  return guard([&] {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::RepTexInfo rep{};
    const CUresult st = obj_call(Op::kTexQuery, t, false, proto::kTexQueryView, &rep);
    if (st == CUDA_SUCCESS) (void)codec::view_desc_from_wire(rep.view, out, codec::trusted_enum);
    return st;
  });
}

CUresult cuSurfObjectCreate(CUsurfObject* out, const CUDA_RESOURCE_DESC* res) {
  return guard([&] {
    std::uint64_t v = 0;
    const CUresult st = obj_create(&v, res, nullptr, nullptr, true);
    if (st == CUDA_SUCCESS) *out = v;
    return st;
  });
}

CUresult cuSurfObjectDestroy(CUsurfObject s) {
  return guard([&] { return obj_call(Op::kTexDestroy, s, true, 0, nullptr); });
}

CUresult cuSurfObjectGetResourceDesc(CUDA_RESOURCE_DESC* out, CUsurfObject s) {
  return guard([&] {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    proto::RepTexInfo rep{};
    const CUresult st = obj_call(Op::kTexQuery, s, true, proto::kTexQueryResource, &rep);
    if (st == CUDA_SUCCESS) res_from_wire(rep.res, out);
    return st;
  });
}
