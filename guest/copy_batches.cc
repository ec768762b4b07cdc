// Batches of copies (CUDA 12.8+): cuMemcpyBatchAsync and cuMemcpy3DBatchAsync,
// both ABI generations (the first reports the failing copy's index) and their
// per-thread-stream forms. PyTorch and LLM servers move KV-cache blocks with
// them. A batch is checked as the driver checks it, then issued as the
// stream-ordered copies it stands for (guest/memory.cc, guest/arrays.cc): the
// host sees ordinary copies with their ordinary rules.
#define __CUDA_API_VERSION_INTERNAL
#include <cuda.h>

#include <cstdint>
#include <cstring>

#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"
#include "guest/family.h"

namespace {

constexpr size_t kNoIndex = ~size_t{0};

// The legacy NULL stream is refused: a batch runs in a stream of its own
// ordering (the per-thread one is fine).
bool batch_stream(CUstream s) { return s != nullptr && s != CU_STREAM_LEGACY; }

bool valid_order(CUmemcpySrcAccessOrder o) {
  return o == CU_MEMCPY_SRC_ACCESS_ORDER_STREAM || o == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL ||
         o == CU_MEMCPY_SRC_ACCESS_ORDER_ANY;
}
bool valid_flags(unsigned f) { return (f & ~unsigned{CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE}) == 0; }

// Page-locked memory is read by the host's DMA after the call returns; a
// source the caller may reuse at once (DURING_API_CALL) therefore waits for
// the stream before the call returns. Pageable sources are captured anyway.
bool read_later(Runtime* rt, CUdeviceptr src) {
  return rt->pinned_offset(reinterpret_cast<const void*>(src), 1).has_value();
}

CUresult batch(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count, CUmemcpyAttributes* attrs,
               size_t* idxs, size_t nattrs, size_t* fail, CUstream s) {
  NEED_RT();
  if (fail != nullptr) *fail = kNoIndex;
  if (count == 0 || dsts == nullptr || srcs == nullptr || sizes == nullptr || attrs == nullptr ||
      idxs == nullptr || nattrs == 0 || nattrs > count || idxs[0] != 0)
    return CUDA_ERROR_INVALID_VALUE;
  for (size_t k = 0; k < nattrs; ++k) {
    if ((k > 0 && idxs[k] <= idxs[k - 1]) || idxs[k] >= count) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_order(attrs[k].srcAccessOrder) || !valid_flags(attrs[k].flags)) return CUDA_ERROR_INVALID_VALUE;
  }
  if (!batch_stream(s)) return CUDA_ERROR_INVALID_VALUE;
  if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
  bool wait = false;
  size_t k = 0;
  for (size_t i = 0; i < count; ++i) {
    while (k + 1 < nattrs && idxs[k + 1] <= i) ++k;
    if (sizes[i] == 0) {  // the driver refuses a zero-size copy in a batch (measured on the H200)
      if (fail != nullptr) *fail = i;
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (CUresult st = cuMemcpyAsync(dsts[i], srcs[i], sizes[i], s); st != CUDA_SUCCESS) {
      if (fail != nullptr) *fail = i;
      return st;
    }
    wait = wait || (attrs[k].srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL && read_later(rt, srcs[i]));
  }
  return wait ? cuStreamSynchronize(s) : CUDA_SUCCESS;
}

// The bytes of one element of an array (its format's size times channels).
CUresult element_bytes(CUarray a, size_t* out) {
  CUDA_ARRAY3D_DESCRIPTOR d{};
  if (CUresult st = cuArray3DGetDescriptor_v2(&d, a); st != CUDA_SUCCESS) return st;
  size_t b = 0;
  switch (d.Format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: b = 1; break;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: b = 2; break;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: b = 4; break;
    default: return CUDA_ERROR_INVALID_VALUE;  // block-compressed and packed formats: not by element
  }
  *out = b * d.NumChannels;
  return CUDA_SUCCESS;
}

// One side of a 3D batch copy as cuMemcpy3D's fields.
struct Side {
  CUmemorytype type{};
  CUdeviceptr ptr = 0;
  CUarray array = nullptr;
  size_t x = 0, y = 0, z = 0, pitch = 0, height = 0;
};

CUresult side(const CUmemcpy3DOperand& o, const CUextent3D& e, size_t elem, Side* s) {
  if (o.type == CU_MEMCPY_OPERAND_TYPE_POINTER) {
    const auto& p = o.op.ptr;
    if ((p.rowLength != 0 && p.rowLength < e.width) || (p.layerHeight != 0 && p.layerHeight < e.height))
      return CUDA_ERROR_INVALID_VALUE;
    s->type = CU_MEMORYTYPE_UNIFIED;
    s->ptr = p.ptr;
    s->pitch = (p.rowLength != 0 ? p.rowLength : e.width) * elem;
    s->height = p.layerHeight != 0 ? p.layerHeight : e.height;
    return CUDA_SUCCESS;
  }
  if (o.type == CU_MEMCPY_OPERAND_TYPE_ARRAY) {
    if (o.op.array.array == nullptr) return CUDA_ERROR_INVALID_VALUE;
    s->type = CU_MEMORYTYPE_ARRAY;
    s->array = o.op.array.array;
    s->x = o.op.array.offset.x * elem;
    s->y = o.op.array.offset.y;
    s->z = o.op.array.offset.z;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult batch_3d(size_t n, CUDA_MEMCPY3D_BATCH_OP* ops, size_t* fail, unsigned long long flags, CUstream s) {
  NEED_RT();
  if (fail != nullptr) *fail = kNoIndex;
  if (n == 0 || ops == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!batch_stream(s)) return CUDA_ERROR_INVALID_VALUE;
  if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
  bool wait = false;
  for (size_t i = 0; i < n; ++i) {
    const CUDA_MEMCPY3D_BATCH_OP& op = ops[i];
    auto refuse = [&](CUresult st) {
      if (fail != nullptr) *fail = i;
      return st;
    };
    if (!valid_order(op.srcAccessOrder) || !valid_flags(op.flags) || op.extent.width == 0 || op.extent.height == 0 ||
        op.extent.depth == 0)
      return refuse(CUDA_ERROR_INVALID_VALUE);
    // Element size: 1 between pointers, the array's otherwise (two arrays must agree).
    size_t elem = 1, other = 0;
    const bool src_array = op.src.type == CU_MEMCPY_OPERAND_TYPE_ARRAY;
    const bool dst_array = op.dst.type == CU_MEMCPY_OPERAND_TYPE_ARRAY;
    if (src_array && op.src.op.array.array != nullptr)
      if (CUresult st = element_bytes(op.src.op.array.array, &elem); st != CUDA_SUCCESS) return refuse(st);
    if (dst_array && op.dst.op.array.array != nullptr) {
      if (CUresult st = element_bytes(op.dst.op.array.array, &other); st != CUDA_SUCCESS) return refuse(st);
      if (src_array && other != elem) return refuse(CUDA_ERROR_INVALID_VALUE);
      elem = other;
    }
    Side a, b;
    if (CUresult st = side(op.src, op.extent, elem, &a); st != CUDA_SUCCESS) return refuse(st);
    if (CUresult st = side(op.dst, op.extent, elem, &b); st != CUDA_SUCCESS) return refuse(st);
    CUDA_MEMCPY3D c{};
    c.srcMemoryType = a.type;
    c.srcDevice = a.ptr;
    c.srcArray = a.array;
    c.srcXInBytes = a.x;
    c.srcY = a.y;
    c.srcZ = a.z;
    c.srcPitch = a.pitch;
    c.srcHeight = a.height;
    c.dstMemoryType = b.type;
    c.dstDevice = b.ptr;
    c.dstArray = b.array;
    c.dstXInBytes = b.x;
    c.dstY = b.y;
    c.dstZ = b.z;
    c.dstPitch = b.pitch;
    c.dstHeight = b.height;
    c.WidthInBytes = op.extent.width * elem;
    c.Height = op.extent.height;
    c.Depth = op.extent.depth;
    if (CUresult st = cuMemcpy3DAsync_v2(&c, s); st != CUDA_SUCCESS) return refuse(st);
    wait = wait || (op.srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL && !src_array &&
                    read_later(rt, a.ptr));
  }
  return wait ? cuStreamSynchronize(s) : CUDA_SUCCESS;
}

}  // namespace

CUresult CUDAAPI cuMemcpyBatchAsync_v2(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                                       CUmemcpyAttributes* attrs, size_t* idxs, size_t nattrs, CUstream s) {
  return guard([&] { return batch(dsts, srcs, sizes, count, attrs, idxs, nattrs, nullptr, s); });
}
extern "C" CUresult CUDAAPI cuMemcpyBatchAsync_v2_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes,
                                                      size_t count, CUmemcpyAttributes* attrs, size_t* idxs,
                                                      size_t nattrs, CUstream s) {
  return guard([&] { return batch(dsts, srcs, sizes, count, attrs, idxs, nattrs, nullptr, ptsz(s)); });
}
CUresult CUDAAPI cuMemcpyBatchAsync(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                                    CUmemcpyAttributes* attrs, size_t* idxs, size_t nattrs, size_t* fail,
                                    CUstream s) {
  return guard([&] { return batch(dsts, srcs, sizes, count, attrs, idxs, nattrs, fail, s); });
}
CUresult CUDAAPI cuMemcpyBatchAsync_ptsz(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                                         CUmemcpyAttributes* attrs, size_t* idxs, size_t nattrs, size_t* fail,
                                         CUstream s) {
  return guard([&] { return batch(dsts, srcs, sizes, count, attrs, idxs, nattrs, fail, ptsz(s)); });
}

CUresult CUDAAPI cuMemcpy3DBatchAsync_v2(size_t n, CUDA_MEMCPY3D_BATCH_OP* ops, unsigned long long flags,
                                         CUstream s) {
  return guard([&] { return batch_3d(n, ops, nullptr, flags, s); });
}
extern "C" CUresult CUDAAPI cuMemcpy3DBatchAsync_v2_ptsz(size_t n, CUDA_MEMCPY3D_BATCH_OP* ops,
                                                        unsigned long long flags, CUstream s) {
  return guard([&] { return batch_3d(n, ops, nullptr, flags, ptsz(s)); });
}
CUresult CUDAAPI cuMemcpy3DBatchAsync(size_t n, CUDA_MEMCPY3D_BATCH_OP* ops, size_t* fail, unsigned long long flags,
                                      CUstream s) {
  return guard([&] { return batch_3d(n, ops, fail, flags, s); });
}
CUresult CUDAAPI cuMemcpy3DBatchAsync_ptsz(size_t n, CUDA_MEMCPY3D_BATCH_OP* ops, size_t* fail,
                                           unsigned long long flags, CUstream s) {
  return guard([&] { return batch_3d(n, ops, fail, flags, ptsz(s)); });
}
