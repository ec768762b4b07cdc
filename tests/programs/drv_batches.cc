// Batches of copies (cuMemcpyBatchAsync, cuMemcpy3DBatchAsync), as KV-cache
// swapping uses them:
//   1D   host-to-device, device-to-device and device-to-host copies in one
//        batch under two attribute sets (stream order, during the call);
//        page-locked and pageable host memory; the first
//        ABI's failing index for a copy that runs past its allocation;
//   3D   pointer to pointer with row and layer pitches, pointer to array and
//        back, an array offset;
//   refusals  the legacy stream, no attributes, a first index that is not 0,
//        a bad access order or flag, a zero-size copy, a zero extent, an unknown
//        operand type.
// It prints the answers, which must be the same natively and through ivcuda.
//
//   drv_batches
#include <cuda.h>

#include <numeric>
#include <vector>

#include "check.h"

// The first ABI generation, which reports the failing copy (cuda.h declares
// it only for callers without its renaming macros).
#undef cuMemcpyBatchAsync
extern "C" CUresult CUDAAPI cuMemcpyBatchAsync(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                                               CUmemcpyAttributes* attrs, size_t* idxs, size_t nattrs,
                                               size_t* fail, CUstream s);

namespace {

CUdeviceptr ptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

CUmemcpyAttributes attr(CUmemcpySrcAccessOrder order, unsigned flags = 0) {
  CUmemcpyAttributes a{};
  a.srcAccessOrder = order;
  a.flags = flags;
  return a;
}

void one_d(CUstream s) {
  const size_t n = 1 << 20;  // bytes per block
  CUdeviceptr d0, d1;
  OK(cuMemAlloc(&d0, n));
  OK(cuMemAlloc(&d1, n));
  void* pinned = nullptr;
  const int failed = check::g_failures;
  OK(cuMemAllocHost(&pinned, n));
  if (check::g_failures != failed) return;
  std::vector<unsigned char> a(n), b(n), back(n, 0), back2(n, 0);
  std::iota(a.begin(), a.end(), 0);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(i * 7 + 3);
  std::memcpy(pinned, b.data(), n);
  // Batch 1: a -> d0 (pageable, stream order), pinned -> d1 (during the call).
  CUdeviceptr dsts[] = {d0, d1};
  CUdeviceptr srcs[] = {ptr(a.data()), ptr(pinned)};
  size_t sizes[] = {n, n};
  CUmemcpyAttributes attrs[] = {attr(CU_MEMCPY_SRC_ACCESS_ORDER_STREAM),
                                attr(CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL,
                                     CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE)};
  size_t idxs[] = {0, 1};
  OK(cuMemcpyBatchAsync_v2(dsts, srcs, sizes, 2, attrs, idxs, 2, s));
  std::memset(pinned, 0, n);  // allowed: the call read it already
  // Batch 2: d0 -> d1's second half (device to device), both back to the host.
  CUdeviceptr dsts2[] = {d1 + n / 2, ptr(back.data()), ptr(back2.data())};
  CUdeviceptr srcs2[] = {d0, d0, d1};
  size_t sizes2[] = {n / 2, n, n};
  CUmemcpyAttributes any = attr(CU_MEMCPY_SRC_ACCESS_ORDER_ANY);
  size_t idx0 = 0;
  OK(cuMemcpyBatchAsync_v2(dsts2, srcs2, sizes2, 1, &any, &idx0, 1, s));
  OK(cuStreamSynchronize(s));
  OK(cuMemcpyBatchAsync_v2(dsts2 + 1, srcs2 + 1, sizes2 + 1, 2, &any, &idx0, 1, s));
  OK(cuStreamSynchronize(s));
  EXPECT(back == a);
  std::vector<unsigned char> want(b);
  std::memcpy(want.data() + n / 2, a.data(), n / 2);
  EXPECT(back2 == want);
  // The first ABI: a copy that runs past its allocation, and its index.
  size_t fail = 12345;
  CUdeviceptr bd[] = {d0, d1 + 16};
  CUdeviceptr bs[] = {ptr(a.data()), ptr(a.data())};
  size_t bz[] = {16, n};
  const CUresult r = cuMemcpyBatchAsync(bd, bs, bz, 2, &any, &idx0, 1, &fail, s);
  std::printf("1D: a copy past its allocation -> %s, failing index %s\n", check::name(r),
              fail == 1 ? "1" : fail == ~size_t{0} ? "none" : "other");
  EXPECT(r != CUDA_SUCCESS);
  (void)cuStreamSynchronize(s);
  std::printf("1D: host to device, device to device and back, in batches: %s\n",
              back == a && back2 == want ? "right" : "WRONG");
  OK(cuMemFreeHost(pinned));
  OK(cuMemFree(d0));
  OK(cuMemFree(d1));
}

void three_d(CUstream s) {
  // A 64 x 32 x 4 float box out of a 100 x 40 x 5 host volume into a packed
  // device one, into an array (at offset 2,3,1 of a 80 x 48 x 6 array) and back.
  const size_t W = 100, H = 40, D = 5, w = 64, hgt = 32, d = 4;
  std::vector<float> vol(W * H * D);
  for (size_t i = 0; i < vol.size(); ++i) vol[i] = static_cast<float>(i);
  CUdeviceptr packed;
  OK(cuMemAlloc(&packed, w * hgt * d * 4));
  CUDA_ARRAY3D_DESCRIPTOR ad{};
  ad.Width = 80;
  ad.Height = 48;
  ad.Depth = 6;
  ad.Format = CU_AD_FORMAT_FLOAT;
  ad.NumChannels = 1;
  CUarray arr = nullptr;
  const int failed = check::g_failures;
  OK(cuArray3DCreate(&arr, &ad));
  if (check::g_failures != failed) return;
  CUDA_MEMCPY3D_BATCH_OP op{};
  op.src.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  op.src.op.ptr.ptr = ptr(vol.data());
  op.src.op.ptr.rowLength = W * 4;  // elements of one byte between pointers
  op.src.op.ptr.layerHeight = H;
  op.dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  op.dst.op.ptr.ptr = packed;  // rowLength 0: packed
  op.extent = CUextent3D{w * 4, hgt, d};
  op.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  OK(cuMemcpy3DBatchAsync_v2(1, &op, 0, s));
  // packed -> array at an offset, then array -> host (floats as elements).
  CUDA_MEMCPY3D_BATCH_OP ops[2]{};
  ops[0].src.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  ops[0].src.op.ptr.ptr = packed;
  ops[0].dst.type = CU_MEMCPY_OPERAND_TYPE_ARRAY;
  ops[0].dst.op.array.array = arr;
  ops[0].dst.op.array.offset = CUoffset3D{2, 3, 1};
  ops[0].extent = CUextent3D{w, hgt, d};
  ops[0].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  OK(cuMemcpy3DBatchAsync_v2(1, ops, 0, s));
  std::vector<float> out(w * hgt * d, -1.0f);
  ops[1].src.type = CU_MEMCPY_OPERAND_TYPE_ARRAY;
  ops[1].src.op.array.array = arr;
  ops[1].src.op.array.offset = CUoffset3D{2, 3, 1};
  ops[1].dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  ops[1].dst.op.ptr.ptr = ptr(out.data());
  ops[1].extent = CUextent3D{w, hgt, d};
  ops[1].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  OK(cuMemcpy3DBatchAsync_v2(1, ops + 1, 0, s));
  OK(cuStreamSynchronize(s));
  size_t wrong = 0;
  for (size_t z = 0; z < d; ++z)
    for (size_t y = 0; y < hgt; ++y)
      for (size_t x = 0; x < w; ++x) wrong += out[(z * hgt + y) * w + x] != vol[(z * H + y) * W + x];
  EXPECT(wrong == 0);
  std::printf("3D: a box out of a host volume, through a packed buffer and an array, back: %s\n",
              wrong == 0 ? "right" : "WRONG");
  OK(cuArrayDestroy(arr));
  OK(cuMemFree(packed));
}

void refusals(CUstream s) {
  CUdeviceptr d;
  OK(cuMemAlloc(&d, 4096));
  std::vector<unsigned char> h(4096, 1);
  CUdeviceptr dst = d, src = ptr(h.data());
  size_t size = 4096, zero_size = 0, idx0 = 0, idx1 = 1;
  CUmemcpyAttributes ok = attr(CU_MEMCPY_SRC_ACCESS_ORDER_STREAM);
  CUmemcpyAttributes bad_order = attr(CU_MEMCPY_SRC_ACCESS_ORDER_INVALID);
  CUmemcpyAttributes bad_flag = attr(CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, 0x40);
  const struct {
    const char* what;
    CUresult r;
  } answers[] = {
      {"the legacy stream", cuMemcpyBatchAsync_v2(&dst, &src, &size, 1, &ok, &idx0, 1, CU_STREAM_LEGACY)},
      {"no attributes", cuMemcpyBatchAsync_v2(&dst, &src, &size, 1, &ok, &idx0, 0, s)},
      {"a first index of 1", cuMemcpyBatchAsync_v2(&dst, &src, &size, 1, &ok, &idx1, 1, s)},
      {"an invalid access order", cuMemcpyBatchAsync_v2(&dst, &src, &size, 1, &bad_order, &idx0, 1, s)},
      {"an unknown flag", cuMemcpyBatchAsync_v2(&dst, &src, &size, 1, &bad_flag, &idx0, 1, s)},
      {"no copies", cuMemcpyBatchAsync_v2(&dst, &src, &size, 0, &ok, &idx0, 1, s)},
      {"a zero-size copy", cuMemcpyBatchAsync_v2(&dst, &src, &zero_size, 1, &ok, &idx0, 1, s)},
  };
  for (const auto& a : answers) {
    std::printf("refused 1D batch, %s: %s\n", a.what, check::name(a.r));
    EXPECT(a.r != CUDA_SUCCESS);
  }
  CUDA_MEMCPY3D_BATCH_OP op{};
  op.src.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  op.src.op.ptr.ptr = src;
  op.dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  op.dst.op.ptr.ptr = d;
  op.extent = CUextent3D{64, 0, 1};
  op.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  const CUresult zero = cuMemcpy3DBatchAsync_v2(1, &op, 0, s);
  op.extent = CUextent3D{64, 1, 1};
  op.dst.type = static_cast<CUmemcpy3DOperandType>(7);
  const CUresult type = cuMemcpy3DBatchAsync_v2(1, &op, 0, s);
  op.dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  const CUresult legacy = cuMemcpy3DBatchAsync_v2(1, &op, 0, CU_STREAM_LEGACY);
  std::printf("refused 3D batch: zero extent %s, unknown operand %s, legacy stream %s\n", check::name(zero),
              check::name(type), check::name(legacy));
  EXPECT(zero != CUDA_SUCCESS && type != CUDA_SUCCESS && legacy != CUDA_SUCCESS);
  OK(cuStreamSynchronize(s));
  OK(cuMemFree(d));
}

}  // namespace

int main() {
  OK(cuInit(0));
  CUdevice dev;
  OK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  if (check::g_failures != 0) return check::finish("drv_batches");
  CUstream s;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  one_d(s);
  three_d(s);
  refusals(s);
  OK(cuStreamDestroy(s));
  OK(cuDevicePrimaryCtxRelease(dev));
  return check::finish("drv_batches");
}
