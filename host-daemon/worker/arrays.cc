// CUDA arrays, mipmapped arrays, copies with them (cuMemcpy3D and everything
// the guest expresses as one), texture and surface objects, sparse arrays
// (their properties and cuMemMapArrayAsync). The guest side is
// guest/arrays.cc.
//
// Arrays and mipmapped arrays are handles of this worker's tables; a mipmap
// level is an array entry owned by its mipmapped array. A tile mapping names
// arrays and physical allocations by the guest's handles, translated for the
// whole list before the driver sees it; the worker keeps the regions each
// allocation backs and holds a released allocation's last reference until no
// region maps it (see "sparse arrays" below). Every copy is checked
// against what the guest owns before the driver sees it: an array side against
// the array's descriptor (as the driver reported it at creation), a device
// side against the guest's device ranges, a host side against the arena, each
// over the whole 3D footprint. Texture and surface objects are the driver's
// own values, because kernels receive them by value and the GPU interprets
// them; the worker records the ones this guest created and refuses to destroy
// or query any other value (docs/security.md).
#include <algorithm>
#include <cstring>

#include "host-daemon/shared/log.h"
#include "host-daemon/worker/worker_internal.h"
#include "ivcuda/array_codec.h"
#include "ring/validate.h"

namespace ivcuda::host {

using namespace ivcuda::proto;

namespace {

// Bytes of one element, or 0 for formats whose layout is not a plain grid of
// elements (planar YUV, block-compressed): copies with those are refused.
std::uint64_t element_bytes(unsigned format, unsigned channels) {
  switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return channels;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2ull * channels;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      return 4ull * channels;
    case CU_AD_FORMAT_UNORM_INT8X1: case CU_AD_FORMAT_SNORM_INT8X1: return 1;
    case CU_AD_FORMAT_UNORM_INT8X2: case CU_AD_FORMAT_SNORM_INT8X2: return 2;
    case CU_AD_FORMAT_UNORM_INT8X4: case CU_AD_FORMAT_SNORM_INT8X4: return 4;
    case CU_AD_FORMAT_UNORM_INT16X1: case CU_AD_FORMAT_SNORM_INT16X1: return 2;
    case CU_AD_FORMAT_UNORM_INT16X2: case CU_AD_FORMAT_SNORM_INT16X2: return 4;
    case CU_AD_FORMAT_UNORM_INT16X4: case CU_AD_FORMAT_SNORM_INT16X4: return 8;
    case CU_AD_FORMAT_UNORM_INT_101010_2: return 4;
    default:
      return 0;
  }
}

// `len` items from `at` lie inside `count` (0 counts as 1: a 1D array has one row).
bool fits(std::uint64_t at, std::uint64_t len, std::uint64_t count) {
  return ring::range_ok(at, len, count == 0 ? 1 : count);
}

}  // namespace

namespace {
// What an array's elements take, for the quota: every level of a mipmapped
// array (`levels`), each layer of a layered one; the driver's own layout adds
// little beyond it. Sparse and deferred-mapping arrays take none (their memory
// is mapped onto them from cuMemCreate allocations, charged there).
// Saturates instead of overflowing (the driver refuses such an array anyway).
std::uint64_t array_bytes(const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned levels) {
  if ((d.Flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) != 0) return 0;
  const std::uint64_t elem = element_bytes(d.Format, d.NumChannels);
  const bool layered = (d.Flags & CUDA_ARRAY3D_LAYERED) != 0;
  std::uint64_t w = std::max<std::uint64_t>(d.Width, 1), h = std::max<std::uint64_t>(d.Height, 1);
  std::uint64_t z = std::max<std::uint64_t>(d.Depth, 1);
  const std::uint64_t layers = layered ? z : 1;
  if (layered) z = 1;
  constexpr std::uint64_t kHuge = std::uint64_t{1} << 62;
  std::uint64_t total = 0;
  // Past 64 levels every extent is 1 (and the driver refuses such an array):
  // the guest's level count bounds nothing here (found by tests/fuzz: 2^32 levels).
  for (unsigned l = 0; l < std::clamp(levels, 1u, 64u) && total < kHuge; ++l) {
    std::uint64_t n = std::max<std::uint64_t>(elem, 1);
    for (std::uint64_t f : {w, h, z, layers})
      if (__builtin_mul_overflow(n, f, &n)) return kHuge;
    if (__builtin_add_overflow(total, n, &total)) return kHuge;
    w = std::max<std::uint64_t>(w / 2, 1);
    h = std::max<std::uint64_t>(h / 2, 1);
    z = std::max<std::uint64_t>(z / 2, 1);
  }
  return std::min(total, kHuge);
}
}  // namespace

CUresult Worker::on_ArrayCreate(Call& c) {
  const auto r = c.req<ReqArrayCreate>();
  CtxEntry* ctx = nullptr;
  if (CUresult st = use_ctx(r.ctx, &ctx); st != CUDA_SUCCESS) return st;
  CUDA_ARRAY3D_DESCRIPTOR d;
  if (!codec::array_desc_from_wire(r.desc, &d, checked_enum)) return CUDA_ERROR_INVALID_VALUE;
  if (full(arrays_, cfg_.limits.arrays, "array") || full(mipmaps_, cfg_.limits.arrays, "mipmapped array"))
    return CUDA_ERROR_OUT_OF_MEMORY;
  // A 2D array has no depth, whatever the request says.
  CUDA_ARRAY3D_DESCRIPTOR sized = d;
  if (r.kind == kArrayCreate2D) sized.Depth = 0, sized.Flags = 0;
  Charge charge = quota_.take(array_bytes(sized, r.kind == kArrayCreateMipmap ? r.levels : 1));
  if (!charge) return CUDA_ERROR_OUT_OF_MEMORY;
  if (r.kind == kArrayCreateMipmap) {
    CUmipmappedArray m = nullptr;
    const CUresult st = cu_.cuMipmappedArrayCreate(&m, &d, r.levels);
    if (st != CUDA_SUCCESS) return st;
    c.set_reply(RepHandle{mipmaps_.insert(MipmapEntry{m, r.ctx, {}, r.desc.flags, std::move(charge)})});
    return CUDA_SUCCESS;
  }
  CUarray a = nullptr;
  CUresult st;
  if (r.kind == kArrayCreate2D) {
    CUDA_ARRAY_DESCRIPTOR d2{};
    d2.Width = d.Width;
    d2.Height = d.Height;
    d2.Format = d.Format;
    d2.NumChannels = d.NumChannels;
    st = cu_.cuArrayCreate(&a, &d2);
  } else if (r.kind == kArrayCreate3D) {
    st = cu_.cuArray3DCreate(&a, &d);
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (st != CUDA_SUCCESS) return st;
  // The driver's own view of the array is what copies are checked against.
  ArrayEntry e{a, r.ctx, {}, 0, r.kind == kArrayCreate3D ? r.desc.flags : 0u, std::move(charge)};
  if (cu_.cuArray3DGetDescriptor(&e.desc, a) != CUDA_SUCCESS) {
    cu_.cuArrayDestroy(a);
    return CUDA_ERROR_UNKNOWN;
  }
  c.set_reply(RepHandle{arrays_.insert(std::move(e))});
  return CUDA_SUCCESS;
}

CUresult Worker::on_ArrayDestroy(Call& c) {
  const auto r = c.req<ReqArrayQuery>();
  if (r.kind == kDestroyMipmap) {
    MipmapEntry* m = mipmaps_.find(r.array);
    if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (CUresult st = use_ctx(m->ctx); st != CUDA_SUCCESS) return st;
    std::vector<std::uint64_t> levels;
    for (auto& [level, h] : m->levels) {
      arrays_.erase(h);
      levels.push_back(h);
    }
    const CUresult st = cu_.cuMipmappedArrayDestroy(m->real);
    mipmaps_.erase(r.array);
    // Its tiles went with it (the driver needs no unmap first). If it did not
    // go, what it maps stays held for good.
    if (st == CUDA_SUCCESS) {
      drop_tile_maps(r.array);
      for (const auto h : levels) drop_tile_maps(h);
    }
    return st;
  }
  ArrayEntry* a = arrays_.find(r.array);
  // A level belongs to its mipmapped array: destroying it alone would leave
  // the mipmapped array holding freed memory.
  if (a == nullptr || a->mipmap != 0) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(a->ctx); st != CUDA_SUCCESS) return st;
  const CUresult st = cu_.cuArrayDestroy(a->real);
  // An array the driver would not destroy (ARRAY_IS_MAPPED, CONTEXT_IS_DESTROYED...) stays
  // usable, as it does there.
  if (st == CUDA_SUCCESS) {
    arrays_.erase(r.array);
    drop_tile_maps(r.array);
  }
  return st;
}

CUresult Worker::on_ArrayQuery(Call& c) {
  const auto r = c.req<ReqArrayQuery>();
  RepArrayQuery rep{};
  // Memory requirements and sparse properties: of the kind of handle the
  // guest named, as the driver would read it.
  if (r.kind == kArrayQueryMipmapMemReq || r.kind == kArrayQueryMipmapSparse) {
    MipmapEntry* m = mipmaps_.find(r.array);
    if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (CUresult st = use_ctx(m->ctx); st != CUDA_SUCCESS) return st;
    CUresult st;
    if (r.kind == kArrayQueryMipmapMemReq) {
      if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
      CUDA_ARRAY_MEMORY_REQUIREMENTS req{};
      st = cu_.cuMipmappedArrayGetMemoryRequirements(&req, m->real, devices_[dev_index(r.device)]);
      rep.size = req.size;
      rep.alignment = req.alignment;
    } else {
      CUDA_ARRAY_SPARSE_PROPERTIES p{};
      st = cu_.cuMipmappedArrayGetSparseProperties(&p, m->real);
      rep = codec::sparse_to_wire(p);
    }
    c.set_reply(rep);
    return st;
  }
  ArrayEntry* a = arrays_.find(r.array);
  if (a == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(a->ctx); st != CUDA_SUCCESS) return st;
  CUresult st;
  if (r.kind == kArrayQuery2D) {
    CUDA_ARRAY_DESCRIPTOR d{};
    st = cu_.cuArrayGetDescriptor(&d, a->real);
    rep.desc = codec::array_desc_to_wire(d);
  } else if (r.kind == kArrayQuery3D) {
    CUDA_ARRAY3D_DESCRIPTOR d{};
    st = cu_.cuArray3DGetDescriptor(&d, a->real);
    rep.desc = codec::array_desc_to_wire(d);
  } else if (r.kind == kArrayQueryMemReq) {
    if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
    CUDA_ARRAY_MEMORY_REQUIREMENTS req{};
    st = cu_.cuArrayGetMemoryRequirements(&req, a->real, devices_[dev_index(r.device)]);
    rep.size = req.size;
    rep.alignment = req.alignment;
  } else if (r.kind == kArrayQuerySparse) {
    CUDA_ARRAY_SPARSE_PROPERTIES p{};
    st = cu_.cuArrayGetSparseProperties(&p, a->real);
    rep = codec::sparse_to_wire(p);
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  c.set_reply(rep);
  return st;
}

CUresult Worker::on_MipmapLevel(Call& c) {
  const auto r = c.req<ReqMipmapLevel>();
  MipmapEntry* m = mipmaps_.find(r.mipmap);
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (auto it = m->levels.find(r.level); it != m->levels.end()) {
    c.set_reply(RepHandle{it->second});
    return CUDA_SUCCESS;
  }
  if (CUresult st = use_ctx(m->ctx); st != CUDA_SUCCESS) return st;
  CUarray a = nullptr;
  CUresult st = cu_.cuMipmappedArrayGetLevel(&a, m->real, r.level);
  if (st != CUDA_SUCCESS) return st;
  ArrayEntry e{a, m->ctx, {}, r.mipmap};
  if (st = cu_.cuArray3DGetDescriptor(&e.desc, a); st != CUDA_SUCCESS) return st;
  const std::uint64_t h = arrays_.insert(std::move(e));  // its memory is the mipmap's charge
  m->levels[r.level] = h;
  c.set_reply(RepHandle{h});
  return CUDA_SUCCESS;
}

// One side of a 3D copy, checked over its whole footprint. Array sides:
// against the array's extent. Host (arena) and device sides: from
// (x, y, z) in a layout of `pitch` bytes per row and `height` rows per slice,
// the bytes up to the last one the copy touches.
CUresult Worker::copy_side(const CopySide& s, const ReqCopy3D& r, CUmemorytype* type, const void** host,
                           CUdeviceptr* dev, CUarray* array) {
  if (s.type == CU_MEMORYTYPE_ARRAY) {
    ArrayEntry* a = arrays_.find(s.array);
    if (a == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    const std::uint64_t elem = element_bytes(a->desc.Format, a->desc.NumChannels);
    if (elem == 0) return CUDA_ERROR_NOT_SUPPORTED;
    std::uint64_t row;
    if (__builtin_mul_overflow(std::uint64_t{a->desc.Width}, elem, &row)) return CUDA_ERROR_INVALID_VALUE;
    if (!fits(s.x_bytes, r.width_bytes, row) || !fits(s.y, r.height, a->desc.Height) ||
        !fits(s.z, r.depth, a->desc.Depth))
      return CUDA_ERROR_INVALID_VALUE;
    *type = CU_MEMORYTYPE_ARRAY;
    *array = a->real;
    return CUDA_SUCCESS;
  }
  if (s.type != CU_MEMORYTYPE_HOST && s.type != CU_MEMORYTYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  // Overlapping rows or slices would make the footprint below wrong; the
  // driver refuses such layouts too.
  if ((r.height > 1 || r.depth > 1) && s.pitch < r.width_bytes) return CUDA_ERROR_INVALID_VALUE;
  if (r.depth > 1 && s.height < r.height) return CUDA_ERROR_INVALID_VALUE;
  std::uint64_t slice, start, extent, t;
  if (__builtin_mul_overflow(s.pitch, s.height, &slice)) return CUDA_ERROR_INVALID_VALUE;
  // start = x + pitch * y + slice * z
  if (__builtin_mul_overflow(s.pitch, s.y, &start) || __builtin_add_overflow(start, s.x_bytes, &start) ||
      __builtin_mul_overflow(slice, s.z, &t) || __builtin_add_overflow(start, t, &start))
    return CUDA_ERROR_INVALID_VALUE;
  // extent = slice * (depth - 1) + pitch * (height - 1) + width
  if (__builtin_mul_overflow(slice, r.depth - 1, &extent) || __builtin_mul_overflow(s.pitch, r.height - 1, &t) ||
      __builtin_add_overflow(extent, t, &extent) || __builtin_add_overflow(extent, r.width_bytes, &extent))
    return CUDA_ERROR_INVALID_VALUE;
  std::uint64_t first;
  if (s.type == CU_MEMORYTYPE_HOST) {
    if (__builtin_add_overflow(s.arena_off, start, &first) || !host_range(first, extent))
      return CUDA_ERROR_INVALID_VALUE;
    *type = CU_MEMORYTYPE_HOST;
    *host = arena_ptr(s.arena_off);
    return CUDA_SUCCESS;
  }
  if (__builtin_add_overflow(s.device, start, &first) || !owns_device(first, extent)) return CUDA_ERROR_INVALID_VALUE;
  *type = CU_MEMORYTYPE_DEVICE;
  *dev = s.device;
  return CUDA_SUCCESS;
}

CUresult Worker::on_Memcpy3D(Call& c) {
  const auto r = c.req<ReqCopy3D>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  if (r.width_bytes == 0 || r.height == 0 || r.depth == 0) return CUDA_SUCCESS;
  CUDA_MEMCPY3D p{};
  const void* src_host = nullptr;
  const void* dst_host = nullptr;
  if (CUresult st = copy_side(r.src, r, &p.srcMemoryType, &src_host, &p.srcDevice, &p.srcArray); st != CUDA_SUCCESS)
    return st;
  if (CUresult st = copy_side(r.dst, r, &p.dstMemoryType, &dst_host, &p.dstDevice, &p.dstArray); st != CUDA_SUCCESS)
    return st;
  p.srcXInBytes = r.src.x_bytes;
  p.srcY = r.src.y;
  p.srcZ = r.src.z;
  p.srcHost = src_host;
  p.srcPitch = r.src.type == CU_MEMORYTYPE_ARRAY ? 0 : r.src.pitch;
  p.srcHeight = r.src.type == CU_MEMORYTYPE_ARRAY ? 0 : r.src.height;
  p.dstXInBytes = r.dst.x_bytes;
  p.dstY = r.dst.y;
  p.dstZ = r.dst.z;
  p.dstHost = const_cast<void*>(dst_host);
  p.dstPitch = r.dst.type == CU_MEMORYTYPE_ARRAY ? 0 : r.dst.pitch;
  p.dstHeight = r.dst.type == CU_MEMORYTYPE_ARRAY ? 0 : r.dst.height;
  p.WidthInBytes = r.width_bytes;
  p.Height = r.height;
  p.Depth = r.depth;
  if ((r.flags & kAsync) != 0) {
    CUstream s;
    if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
    if ((r.flags & kWaitStream) != 0)
      if (CUresult st = refuse_in_capture(s); st != CUDA_SUCCESS) return st;
    const CUresult st = cu_.cuMemcpy3DAsync(&p, s);
    return st == CUDA_SUCCESS && (r.flags & kWaitStream) != 0 ? cu_.cuStreamSynchronize(s) : st;
  }
  return cu_.cuMemcpy3D(&p);
}

// ---- sparse arrays: cuMemMapArrayAsync
//
// Each entry's array or mipmapped array and physical allocation are the
// guest's handles, translated here; a list with one the guest does not own
// is refused whole before the driver sees any of it. The driver judges the
// rest (tile alignment, levels, layers, the tile pool usage, the device).
//
// The worker keeps the regions each allocation backs. CUDA does not promise
// (for arrays, as it does for cuMemMap) that a mapped tile keeps its memory
// alive, and freed device memory could reach another process; so a guest's
// last cuMemRelease of an allocation that arrays still map leaves the
// driver's reference with the worker, which releases it once the stream has
// passed the unmap that ended the last region (or at once when the array is
// destroyed). When the driver refuses a list it may still have applied a part
// of it: then the maps count as made and the unmaps as not, which keeps a
// reference too long rather than too short.

namespace {

constexpr std::size_t kMaxTileBoxes = std::size_t{1} << 20;  // regions one worker keeps

bool empty_box(const TileBox& b) {
  return b.lo[0] >= b.hi[0] || b.lo[1] >= b.hi[1] || b.lo[2] >= b.hi[2];
}

bool overlap(const TileBox& a, const TileBox& b) {
  for (int d = 0; d < 3; ++d)
    if (a.hi[d] <= b.lo[d] || b.hi[d] <= a.lo[d]) return false;
  return true;
}

// Appends what of `a` lies outside `cut`: at most six boxes.
void subtract(const TileBox& a, const TileBox& cut, std::vector<TileBox>* out) {
  if (!overlap(a, cut)) {
    out->push_back(a);
    return;
  }
  TileBox rest = a;
  for (int d = 0; d < 3; ++d) {
    if (rest.lo[d] < cut.lo[d]) {
      TileBox piece = rest;
      piece.hi[d] = cut.lo[d];
      out->push_back(piece);
      rest.lo[d] = cut.lo[d];
    }
    if (rest.hi[d] > cut.hi[d]) {
      TileBox piece = rest;
      piece.lo[d] = cut.hi[d];
      out->push_back(piece);
      rest.hi[d] = cut.hi[d];
    }
  }
}

std::uint64_t sat_add(std::uint64_t a, std::uint64_t b) { return a + b < a ? ~0ull : a + b; }

// An enumerator field set to the guest's number, whichever it is (the driver
// judges it; a cast could make a value the enum type cannot hold).
template <class E>
void set_enum(E* field, std::uint32_t v) {
  static_assert(sizeof(E) == sizeof v);
  std::memcpy(field, &v, sizeof v);
}

}  // namespace

CUresult Worker::map_entry(const ArrayMapEntry& w, CUarrayMapInfo* out, std::vector<TileOp>* ops) {
  *out = CUarrayMapInfo{};
  set_enum(&out->resourceType, w.resource_type);
  unsigned flags = 0;
  // A null handle reaches the driver as one (its answer is the driver's);
  // any other must be this guest's.
  if (w.resource_type == CU_RESOURCE_TYPE_ARRAY) {
    if (w.resource != 0) {
      ArrayEntry* a = arrays_.find(w.resource);
      if (a == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      out->resource.array = a->real;
      flags = a->flags;
    }
  } else if (w.resource_type == CU_RESOURCE_TYPE_MIPMAPPED_ARRAY) {
    if (w.resource != 0) {
      MipmapEntry* m = mipmaps_.find(w.resource);
      if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      out->resource.mipmap = m->real;
      flags = m->flags;
    }
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (w.op != CU_MEM_OPERATION_TYPE_MAP && w.op != CU_MEM_OPERATION_TYPE_UNMAP) return CUDA_ERROR_INVALID_VALUE;
  // Mapping a null memory handle crashes the H200's driver (580): refused
  // here with the answer the driver gives other unusable handles.
  if (IVCUDA_RULE("memops-own-memory") && w.op == CU_MEM_OPERATION_TYPE_MAP && w.mem_handle == 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (w.mem_handle != 0) {
    MemHandleEntry* e = guest_mem(w.mem_handle);
    if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    // An offset outside the allocation names no memory of it; refused here
    // rather than trusting the driver with it (it crashes on a null handle).
    if (IVCUDA_RULE("memops-own-memory") && w.op == CU_MEM_OPERATION_TYPE_MAP && w.offset >= e->size)
      return CUDA_ERROR_INVALID_VALUE;
    out->memHandle.memHandle = e->real;
  }
  set_enum(&out->subresourceType, w.subresource_type);
  static_assert(sizeof out->subresource == sizeof w.subresource);
  std::memcpy(&out->subresource, w.subresource, sizeof w.subresource);
  set_enum(&out->memOperationType, w.op);
  set_enum(&out->memHandleType, w.mem_handle_type);
  out->offset = w.offset;
  out->flags = w.flags;
  out->reserved[0] = w.reserved[0];
  out->reserved[1] = w.reserved[1];
  // The devices: bits of the worker's ordinals become bits of the driver's.
  std::vector<std::uint32_t> devices;
  for (std::uint32_t bit = 0; bit < 32; ++bit) {
    if ((w.device_mask >> bit & 1u) == 0) continue;
    if (!valid_device(static_cast<int>(bit))) return CUDA_ERROR_INVALID_VALUE;
    const auto real = static_cast<unsigned>(devices_[dev_index(static_cast<int>(bit))]);
    if (real >= 32) return CUDA_ERROR_INVALID_VALUE;
    out->deviceBitMask |= 1u << real;
    devices.push_back(bit);
  }
  if (devices.empty()) devices.push_back(kTileAnyDevice);  // the driver refuses it; kept apart if not
  // What it does to the regions.
  TileOp op;
  op.key.resource = w.resource;
  op.unmap = w.op == CU_MEM_OPERATION_TYPE_UNMAP;
  op.box.mem = op.unmap ? 0 : w.mem_handle;
  if ((flags & CUDA_ARRAY3D_DEFERRED_MAPPING) != 0) {
    // The subresource is ignored: the whole array maps.
    op.key.part = kTilePartWhole;
    op.box.hi[0] = op.box.hi[1] = op.box.hi[2] = 1;
  } else if (w.subresource_type == CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_SPARSE_LEVEL) {
    const auto& l = out->subresource.sparseLevel;
    op.key.part = l.level;
    op.key.layer = l.layer;
    const std::uint64_t lo[3] = {l.offsetX, l.offsetY, l.offsetZ};
    const std::uint64_t ext[3] = {l.extentWidth, l.extentHeight, l.extentDepth};
    for (int d = 0; d < 3; ++d) {
      op.box.lo[d] = lo[d];
      op.box.hi[d] = lo[d] + ext[d];
    }
  } else if (w.subresource_type == CU_ARRAY_SPARSE_SUBRESOURCE_TYPE_MIPTAIL) {
    const auto& t = out->subresource.miptail;
    op.key.part = kTilePartMiptail;
    op.key.layer = t.layer;
    op.box.lo[0] = t.offset;
    op.box.hi[0] = sat_add(t.offset, t.size);
    op.box.hi[1] = op.box.hi[2] = 1;
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (w.resource == 0 || empty_box(op.box)) return CUDA_SUCCESS;  // maps nothing the worker must keep
  for (const std::uint32_t d : devices) {
    op.key.device = d;
    ops->push_back(op);
  }
  return CUDA_SUCCESS;
}

TileMaps Worker::plan_tiles(const std::vector<TileOp>& ops, bool applied) const {
  TileMaps planned;
  for (const TileOp& op : ops) {
    auto [it, fresh] = planned.try_emplace(op.key);
    if (fresh)
      if (auto cur = tile_maps_.find(op.key); cur != tile_maps_.end()) it->second = cur->second;
    auto& boxes = it->second;
    if (applied) {
      std::vector<TileBox> rest;
      rest.reserve(boxes.size());
      for (const TileBox& b : boxes) subtract(b, op.box, &rest);
      boxes.swap(rest);
    }
    if (!op.unmap && op.box.mem != 0) boxes.push_back(op.box);
  }
  return planned;
}

void Worker::commit_tiles(TileMaps& planned, std::uint64_t ctx, CUstream s) {
  std::map<std::uint64_t, std::int64_t> delta;  // allocation -> regions gained
  for (auto& [key, boxes] : planned) {
    if (auto cur = tile_maps_.find(key); cur != tile_maps_.end()) {
      for (const TileBox& b : cur->second) --delta[b.mem];
      tile_boxes_ -= cur->second.size();
      tile_maps_.erase(cur);
    }
    for (const TileBox& b : boxes) ++delta[b.mem];
    tile_boxes_ += boxes.size();
    if (!boxes.empty()) tile_maps_.emplace(key, std::move(boxes));
  }
  for (const auto& [h, d] : delta) {
    MemHandleEntry* e = mem_handles_.find(h);
    if (e == nullptr || d == 0) continue;
    e->tile_maps = static_cast<std::uint64_t>(static_cast<std::int64_t>(e->tile_maps) + d);
    if (e->tile_maps == 0 && e->held) release_held(h, ctx, s);
  }
}

void Worker::drop_tile_maps(std::uint64_t resource) {
  std::map<std::uint64_t, std::uint64_t> lost;
  auto it = tile_maps_.lower_bound(TileKey{resource, 0, 0, 0});
  while (it != tile_maps_.end() && it->first.resource == resource) {
    for (const TileBox& b : it->second) ++lost[b.mem];
    tile_boxes_ -= it->second.size();
    it = tile_maps_.erase(it);
  }
  for (const auto& [h, n] : lost) {
    MemHandleEntry* e = mem_handles_.find(h);
    if (e == nullptr) continue;
    e->tile_maps -= std::min(e->tile_maps, n);
    if (e->tile_maps == 0 && e->held) release_held(h, 0, nullptr);
  }
}

// The driver reference the worker held for `handle`'s regions: released
// once the work queued on `s` so far has run (an event of the current
// context, `ctx`, says when), or at once (ctx 0: the array is gone).
void Worker::release_held(std::uint64_t handle, std::uint64_t ctx, CUstream s) {
  MemHandleEntry* e = mem_handles_.find(handle);
  if (e == nullptr || !e->held) return;
  const CUmemGenericAllocationHandle real = e->real;
  e->held = false;
  if (e->refs == 0) mem_handles_.erase(handle);
  CUevent done = nullptr;
  if (ctx != 0) {
    if (cu_.cuEventCreate(&done, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
      done = nullptr;
    } else if (cu_.cuEventRecord(done, s) != CUDA_SUCCESS) {
      cu_.cuEventDestroy(done);
      done = nullptr;
    }
    if (done == nullptr) (void)cu_.cuStreamSynchronize(s);  // no event: wait here instead
  }
  if (done == nullptr) {
    cu_.cuMemRelease(real);
    return;
  }
  pending_releases_.push_back(PendingRelease{done, ctx, real});
}

void Worker::reap_mem_releases() {
  std::erase_if(pending_releases_, [&](const PendingRelease& p) {
    if (cu_.cuEventQuery(p.done) == CUDA_ERROR_NOT_READY) return false;
    cu_.cuEventDestroy(p.done);
    cu_.cuMemRelease(p.real);
    return true;
  });
}

CUresult Worker::on_MemMapArrays(Call& c) {
  const auto r = c.req<ReqMapArrays>();
  reap_mem_releases();
  if (r.count > kMaxArrayMaps || (r.flags & ~(kMapListInArena | kMapListNull)) != 0 ||
      ((r.flags & kMapListNull) != 0 && r.count != 0))
    return CUDA_ERROR_INVALID_VALUE;
  // The entries, copied before anything reads them (the arena stays writable by the guest).
  const std::size_t bytes = std::size_t{r.count} * sizeof(ArrayMapEntry);
  std::vector<ArrayMapEntry> wire(r.count);
  const auto tail = c.tail<ReqMapArrays>();
  if ((r.flags & kMapListInArena) != 0) {
    if (!tail.empty() || !arena_range(r.arena_off, bytes)) return CUDA_ERROR_INVALID_VALUE;
    if (bytes != 0) std::memcpy(wire.data(), arena_ptr(r.arena_off), bytes);
  } else {
    if (tail.size() != bytes) return CUDA_ERROR_INVALID_VALUE;
    if (bytes != 0) std::memcpy(wire.data(), tail.data(), bytes);
  }
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  // Every entry translated before the driver sees the list.
  std::vector<CUarrayMapInfo> info(std::max<std::size_t>(r.count, 1));
  std::vector<TileOp> ops;
  std::size_t maps = 0;
  for (std::uint32_t i = 0; i < r.count; ++i)
    if (CUresult st = map_entry(wire[i], &info[i], &ops); st != CUDA_SUCCESS) return st;
  for (const TileOp& op : ops) maps += op.unmap ? 0 : 1;
  TileMaps planned = plan_tiles(ops, true);
  std::size_t after = tile_boxes_;
  for (const auto& [key, boxes] : planned) {
    if (auto cur = tile_maps_.find(key); cur != tile_maps_.end()) after -= cur->second.size();
    after += boxes.size();
  }
  if (after > kMaxTileBoxes || tile_boxes_ + maps > kMaxTileBoxes) return CUDA_ERROR_OUT_OF_MEMORY;
  const CUresult st =
      cu_.cuMemMapArrayAsync((r.flags & kMapListNull) != 0 ? nullptr : info.data(), r.count, s);
  if (st != CUDA_SUCCESS) {
    if (maps != 0) {
      TileMaps kept = plan_tiles(ops, false);
      commit_tiles(kept, r.ctx, s);
    }
    return st;
  }
  commit_tiles(planned, r.ctx, s);
  return CUDA_SUCCESS;
}

// A guest's resource descriptor in the driver's terms: its handles resolved,
// its device memory checked to be the guest's over the whole extent.
CUresult Worker::resource_from_wire(const ResDesc& w, CUDA_RESOURCE_DESC* out, std::uint64_t* handle) {
  *handle = 0;
  if (w.type == CU_RESOURCE_TYPE_LINEAR && (w.size_bytes == 0 || !owns_device(w.dptr, w.size_bytes)))
    return CUDA_ERROR_INVALID_VALUE;
  if (w.type == CU_RESOURCE_TYPE_PITCH2D) {
    const std::uint64_t elem = element_bytes(w.format, w.channels);
    std::uint64_t row, extent;
    if (elem == 0 || w.height == 0 || __builtin_mul_overflow(w.width, elem, &row) || row > w.pitch ||
        __builtin_mul_overflow(w.pitch, w.height - 1, &extent) || __builtin_add_overflow(extent, row, &extent) ||
        !owns_device(w.dptr, extent))
      return CUDA_ERROR_INVALID_VALUE;
  }
  const auto array = [&](const ResDesc& r, CUDA_RESOURCE_DESC* d) {
    if (r.type == CU_RESOURCE_TYPE_ARRAY) {
      ArrayEntry* a = arrays_.find(r.handle);
      if (a == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      d->res.array.hArray = a->real;
    } else {
      MipmapEntry* m = mipmaps_.find(r.handle);
      if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      d->res.mipmap.hMipmappedArray = m->real;
    }
    *handle = r.handle;
    return CUDA_SUCCESS;
  };
  return codec::resource_from_wire(w, out, checked_enum, array);
}

CUresult Worker::on_TexCreate(Call& c) {
  const auto r = c.req<ReqTexCreate>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUDA_RESOURCE_DESC res;
  std::uint64_t handle = 0;
  if (CUresult st = resource_from_wire(r.res, &res, &handle); st != CUDA_SUCCESS) return st;
  const bool surface = (r.flags & kTexSurface) != 0;
  std::uint64_t obj = 0;
  CUresult st;
  if (surface) {
    CUsurfObject s = 0;
    st = cu_.cuSurfObjectCreate(&s, &res);
    obj = s;
  } else {
    CUDA_TEXTURE_DESC t;
    CUDA_RESOURCE_VIEW_DESC v;
    if (!codec::texture_desc_from_wire(r.tex, &t, checked_enum) || !codec::view_desc_from_wire(r.view, &v, checked_enum))
      return CUDA_ERROR_INVALID_VALUE;
    CUtexObject t_obj = 0;
    st = cu_.cuTexObjectCreate(&t_obj, &res, &t, (r.flags & kTexHasView) != 0 ? &v : nullptr);
    obj = t_obj;
  }
  if (st != CUDA_SUCCESS) return st;
  tex_objects_[obj] = TexEntry{r.ctx, surface, handle};
  c.set_reply(RepHandle{obj});
  return CUDA_SUCCESS;
}

CUresult Worker::on_TexDestroy(Call& c) {
  const auto r = c.req<ReqTexObject>();
  auto it = tex_objects_.find(r.object);
  const bool surface = (r.flags & kTexSurface) != 0;
  // Destroying an object that is not there succeeds on driver 580 (H200):
  // the same answer, and the driver never sees a value we did not hand out.
  if (it == tex_objects_.end() || it->second.surface != surface) return CUDA_SUCCESS;
  if (CUresult st = use_ctx(it->second.ctx); st != CUDA_SUCCESS) return st;
  const CUresult st = surface ? cu_.cuSurfObjectDestroy(r.object) : cu_.cuTexObjectDestroy(r.object);
  tex_objects_.erase(it);
  return st;
}

CUresult Worker::on_TexQuery(Call& c) {
  const auto r = c.req<ReqTexObject>();
  auto it = tex_objects_.find(r.object);
  const bool surface = (r.flags & kTexSurface) != 0;
  if (it == tex_objects_.end() || it->second.surface != surface) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = use_ctx(it->second.ctx); st != CUDA_SUCCESS) return st;
  RepTexInfo rep{};
  CUresult st = CUDA_ERROR_INVALID_VALUE;
  if (r.query == kTexQueryResource) {
    CUDA_RESOURCE_DESC res{};
    st = surface ? cu_.cuSurfObjectGetResourceDesc(&res, r.object) : cu_.cuTexObjectGetResourceDesc(&res, r.object);
    // An array as the guest's handle, never the driver's.
    (void)codec::resource_to_wire(res, it->second.resource, &rep.res);
  } else if (r.query == kTexQueryTexture && !surface) {
    CUDA_TEXTURE_DESC t{};
    st = cu_.cuTexObjectGetTextureDesc(&t, r.object);
    rep.tex = codec::texture_desc_to_wire(t);
  } else if (r.query == kTexQueryView && !surface) {
    CUDA_RESOURCE_VIEW_DESC v{};
    st = cu_.cuTexObjectGetResourceViewDesc(&v, r.object);
    rep.view = codec::view_desc_to_wire(v);
  }
  c.set_reply(rep);
  return st;
}

// A context's arrays and objects die with it. `destroy`: the driver's context
// lives on (a primary context released by the guest), so free them there too.
void Worker::release_ctx_arrays(std::uint64_t ctx, bool destroy) {
  // Memory waiting for an event of this context: the context's work is done
  // (or waited for here), and its events go with it.
  std::erase_if(pending_releases_, [&](const PendingRelease& p) {
    if (p.ctx != ctx) return false;
    if (destroy) {
      cu_.cuEventSynchronize(p.done);
      cu_.cuEventDestroy(p.done);
    }
    cu_.cuMemRelease(p.real);
    return true;
  });
  for (auto it = tex_objects_.begin(); it != tex_objects_.end();) {
    if (it->second.ctx != ctx) {
      ++it;
      continue;
    }
    if (destroy) it->second.surface ? cu_.cuSurfObjectDestroy(it->first) : cu_.cuTexObjectDestroy(it->first);
    it = tex_objects_.erase(it);
  }
  std::vector<std::uint64_t> dead;
  arrays_.for_each([&](std::uint64_t h, ArrayEntry& a) {
    if (a.ctx != ctx) return;
    if (destroy && a.mipmap == 0) cu_.cuArrayDestroy(a.real);
    dead.push_back(h);
  });
  for (auto h : dead) {
    arrays_.erase(h);
    drop_tile_maps(h);
  }
  dead.clear();
  mipmaps_.for_each([&](std::uint64_t h, MipmapEntry& m) {
    if (m.ctx != ctx) return;
    if (destroy) cu_.cuMipmappedArrayDestroy(m.real);
    dead.push_back(h);
  });
  for (auto h : dead) {
    mipmaps_.erase(h);
    drop_tile_maps(h);
  }
}

}  // namespace ivcuda::host
