// What the CUDA 13 runtime and libraries use beyond plain launches: the
// stream-ordered allocator, stream capture and graph replay, cooperative
// launches, device printf, module enumeration, occupancy searches and tensor
// maps. Prints only what a native run prints too (the GPU suite diffs them).
//   drv_graphs --ptx test_kernels.ptx
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>

#include "check.h"

namespace {

std::vector<char> read_file(const char* path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> v((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  v.push_back('\0');
  return v;
}

struct Kernels {
  CUfunction add = nullptr;   // ivc_vec_add(const float*, const float*, float*, int)
  CUfunction fill = nullptr;  // ivc_fill_u32(unsigned*, unsigned, unsigned long long)
  CUfunction print = nullptr;  // ivc_rtf_printf(int, long long, double)
};

bool all_equal(const unsigned* p, size_t n, unsigned v) {
  return std::all_of(p, p + n, [v](unsigned x) { return x == v; });
}

void mempool(CUdevice dev, CUstream s) {
  int supported = 0;
  OK(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev));
  EXPECT(supported == 1);
  CUmemoryPool pool = nullptr, current = nullptr;
  OK(cuDeviceGetDefaultMemPool(&pool, dev));
  OK(cuDeviceGetMemPool(&current, dev));
  EXPECT(pool != nullptr && pool == current);
  OK(cuDeviceSetMemPool(dev, pool));

  cuuint64_t threshold = 64u << 20, got = 0;
  OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
  OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &got));
  EXPECT(got == threshold);
  int reuse = -1;
  OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &reuse));
  EXPECT(reuse == 1);
  reuse = 0;
  OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &reuse));
  reuse = -1;
  OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &reuse));
  EXPECT(reuse == 0);
  reuse = 1;
  OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &reuse));

  // Stream-ordered memory is device memory like any other: memsets, copies and
  // synchronous frees accept it.
  const size_t n = 256 * 1024;
  CUdeviceptr d = 0, d2 = 0;
  OK(cuMemAllocAsync(&d, n * 4, s));
  OK(cuMemAllocFromPoolAsync(&d2, n * 4, pool, s));
  OK(cuMemsetD32Async(d, 0x5a5a5a5a, n, s));
  OK(cuMemcpyDtoDAsync(d2, d, n * 4, s));
  std::vector<unsigned> host(n, 0);
  OK(cuStreamSynchronize(s));
  OK(cuMemcpyDtoH(host.data(), d2, n * 4));
  EXPECT(all_equal(host.data(), n, 0x5a5a5a5au));
  cuuint64_t used = 0;
  OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used));
  EXPECT(used >= 2 * n * 4);
  OK(cuMemFreeAsync(d, s));
  OK(cuMemFree(d2));
  OK(cuStreamSynchronize(s));
  cuuint64_t zero = 0;
  OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
  OK(cuMemPoolTrimTo(pool, 0));
  std::printf("mempool: stream-ordered allocations, attributes, trim\n");
}

void graphs(const Kernels& k, CUstream s) {
  const size_t n = 64 * 1024;
  unsigned* in = nullptr;
  unsigned* out = nullptr;
  OK(cuMemAllocHost(reinterpret_cast<void**>(&in), n * 4));
  OK(cuMemAllocHost(reinterpret_cast<void**>(&out), n * 4));
  CUdeviceptr da = 0, db = 0;
  OK(cuMemAlloc(&da, n * 4));
  OK(cuMemAlloc(&db, n * 4));
  if (in == nullptr || out == nullptr) return;

  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  OK(cuStreamIsCapturing(s, &st));
  EXPECT(st == CU_STREAM_CAPTURE_STATUS_NONE);
  OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(cuStreamIsCapturing(s, &st));
  EXPECT(st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  cuuint64_t id = 0;
  OK(cuStreamGetCaptureInfo(s, &st, &id, nullptr, nullptr, nullptr, nullptr));
  EXPECT(st == CU_STREAM_CAPTURE_STATUS_ACTIVE && id != 0);
  // Page-locked copies, a memset and a kernel: each becomes one node that reads
  // its memory when the graph runs, not when it was captured.
  OK(cuMemcpyHtoDAsync(da, in, n * 4, s));
  OK(cuMemsetD32Async(db, 1, n, s));
  unsigned v = 9;
  unsigned long long count = n / 2;
  void* args[] = {&db, &v, &count};
  OK(cuLaunchKernel(k.fill, 64, 1, 1, 256, 1, 1, 0, s, args, nullptr));
  OK(cuMemcpyDtoHAsync(out, da, n * 4, s));
  CUgraph g = nullptr;
  OK(cuStreamEndCapture(s, &g));
  OK(cuStreamIsCapturing(s, &st));
  EXPECT(st == CU_STREAM_CAPTURE_STATUS_NONE);
  size_t nodes = 0;
  OK(cuGraphGetNodes(g, nullptr, &nodes));
  std::printf("graphs: captured %zu nodes\n", nodes);

  CUgraphExec e = nullptr;
  OK(cuGraphInstantiate(&e, g, 0));
  OK(cuGraphUpload(e, s));
  for (unsigned round = 1; round <= 2; ++round) {
    std::fill(in, in + n, 1000 * round);
    std::fill(out, out + n, 0u);
    OK(cuGraphLaunch(e, s));
    OK(cuStreamSynchronize(s));
    EXPECT(all_equal(out, n, 1000 * round));
  }
  std::vector<unsigned> host(n);
  OK(cuMemcpyDtoH(host.data(), db, n * 4));
  EXPECT(all_equal(host.data(), n / 2, 9) && all_equal(host.data() + n / 2, n / 2, 1));
  OK(cuGraphExecDestroy(e));
  OK(cuGraphDestroy(g));

  // Waiting for a capturing stream is illegal and spoils the capture.
  OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  OK(cuMemsetD32Async(db, 2, n, s));
  EXPECT_RES(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuStreamSynchronize(s));
  OK(cuStreamIsCapturing(s, &st));
  EXPECT(st == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  g = reinterpret_cast<CUgraph>(1);
  EXPECT_RES(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cuStreamEndCapture(s, &g));
  EXPECT(g == nullptr);
  OK(cuStreamSynchronize(s));

  // An empty graph, and the thread's capture mode round trip.
  CUgraph empty = nullptr;
  OK(cuGraphCreate(&empty, 0));
  OK(cuGraphGetNodes(empty, nullptr, &nodes));
  EXPECT(nodes == 0);
  OK(cuGraphDestroy(empty));
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  OK(cuThreadExchangeStreamCaptureMode(&mode));
  EXPECT(mode == CU_STREAM_CAPTURE_MODE_GLOBAL);
  OK(cuThreadExchangeStreamCaptureMode(&mode));
  EXPECT(mode == CU_STREAM_CAPTURE_MODE_RELAXED);

  OK(cuMemFree(da));
  OK(cuMemFree(db));
  OK(cuMemFreeHost(in));
  OK(cuMemFreeHost(out));
  std::printf("graphs: capture, replay twice, invalidation\n");
}

void cooperative(const Kernels& k, CUdevice dev, CUstream s) {
  int coop = 0;
  OK(cuDeviceGetAttribute(&coop, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, dev));
  EXPECT(coop == 1);
  const int n = 4096;
  std::vector<float> a(n), b(n), c(n);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = 0.5f;
  }
  CUdeviceptr da, db, dc;
  OK(cuMemAlloc(&da, n * 4));
  OK(cuMemAlloc(&db, n * 4));
  OK(cuMemAlloc(&dc, n * 4));
  OK(cuMemcpyHtoD(da, a.data(), n * 4));
  OK(cuMemcpyHtoD(db, b.data(), n * 4));
  int nn = n;
  void* args[] = {&da, &db, &dc, &nn};
  OK(cuLaunchCooperativeKernel(k.add, n / 256, 1, 1, 256, 1, 1, 0, s, args));
  OK(cuStreamSynchronize(s));
  OK(cuMemcpyDtoH(c.data(), dc, n * 4));
  bool good = true;
  for (int i = 0; i < n; ++i) good &= c[i] == a[i] + b[i];
  EXPECT(good);

  // The same through cuLaunchKernelEx and its attribute.
  OK(cuMemsetD32(dc, 0, n));
  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
  attr.value.cooperative = 1;
  CUlaunchConfig cfg{};
  cfg.gridDimX = n / 256;
  cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = 256;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.hStream = s;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  OK(cuLaunchKernelEx(&cfg, k.add, args, nullptr));
  OK(cuStreamSynchronize(s));
  OK(cuMemcpyDtoH(c.data(), dc, n * 4));
  good = true;
  for (int i = 0; i < n; ++i) good &= c[i] == a[i] + b[i];
  EXPECT(good);

  // Thread-block clusters, a scheduling preference and a launch priority:
  // attributes the host must launch with (cuBLASLt uses clusters on Hopper).
  int clusters = 0;
  OK(cuDeviceGetAttribute(&clusters, CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, dev));
  if (clusters == 1) {
    OK(cuMemsetD32(dc, 0, n));
    CUlaunchAttribute ex[3] = {};
    ex[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    ex[0].value.clusterDim.x = 2;
    ex[0].value.clusterDim.y = 1;
    ex[0].value.clusterDim.z = 1;
    ex[1].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    ex[1].value.clusterSchedulingPolicyPreference = CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
    ex[2].id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
    ex[2].value.priority = 0;
    cfg.attrs = ex;
    cfg.numAttrs = 3;
    OK(cuLaunchKernelEx(&cfg, k.add, args, nullptr));
    OK(cuStreamSynchronize(s));
    OK(cuMemcpyDtoH(c.data(), dc, n * 4));
    good = true;
    for (int i = 0; i < n; ++i) good &= c[i] == a[i] + b[i];
    EXPECT(good);
    std::printf("clusters: a launch in clusters of 2 %s\n", good ? "verified" : "WRONG");
  }

  // More blocks than can be resident at once. ivcuda posts launches, so the
  // error may also come from the next synchronising call.
  const CUresult launch = cuLaunchCooperativeKernel(k.add, 1u << 20, 1, 1, 1024, 1, 1, 0, s, args);
  const CUresult sync = cuStreamSynchronize(s);
  EXPECT(launch == CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE || sync == CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
  OK(cuStreamSynchronize(s));
  OK(cuMemFree(da));
  OK(cuMemFree(db));
  OK(cuMemFree(dc));
  std::printf("cooperative: cuLaunchCooperativeKernel, cuLaunchKernelEx, too large\n");
}

void device_printf(const Kernels& k) {
  std::printf("printf: before the launch\n");
  std::fflush(stdout);
  int lines = 3;
  long long big = 1ll << 40;
  double x = 0.5;
  void* args[] = {&lines, &big, &x};
  OK(cuLaunchKernel(k.print, 2, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
  OK(cuCtxSynchronize());
  std::fflush(stdout);
  std::printf("printf: after the synchronisation\n");
}

std::vector<CUfunction> g_seen;
void remember(void*, CUfunction f) { g_seen.push_back(f); }

void modules(const Kernels& k, CUmodule m) {
  unsigned count = 0;
  OK(cuModuleGetFunctionCount(&count, m));
  EXPECT(count >= 3);
  std::vector<CUfunction> fs(count);
  OK(cuModuleEnumerateFunctions(fs.data(), count, m));
  EXPECT(std::find(fs.begin(), fs.end(), k.add) != fs.end());
  EXPECT(std::find(fs.begin(), fs.end(), k.fill) != fs.end());
  // What cuFFT does, through the driver's export table (UUID in memory order).
  const CUuuid id = {{'\x6e', '\x16', '\x3f', '\xbe', '\xb9', '\x58', '\x44', '\x4d', '\x83', '\x5c', '\xe1',
                      '\x82', '\xaf', '\xf1', '\x99', '\x1e'}};
  const void* table = nullptr;
  if (cuGetExportTable(&table, &id) == CUDA_SUCCESS && table != nullptr) {
    using Enumerate = CUresult (*)(CUcontext, CUmodule, void (*)(void*, CUfunction), void*);
    const auto* slots = static_cast<const void* const*>(table);
    EXPECT(reinterpret_cast<std::uintptr_t>(slots[0]) > 0x37);
    auto fn = reinterpret_cast<Enumerate>(const_cast<void*>(slots[7]));
    g_seen.clear();
    CUcontext ctx = nullptr;
    OK(cuCtxGetCurrent(&ctx));
    // What it returns is not checked: ivcuda answers 1, which cuFFT reads as
    // "enumerated", while driver 580 on the H200 answered this call (context
    // given, no user data) with another value. The callbacks are what count.
    (void)fn(ctx, m, remember, nullptr);
    EXPECT(g_seen.size() == count);
    // The handles the callback saw launch like any other.
    EXPECT(std::find(g_seen.begin(), g_seen.end(), k.add) != g_seen.end());
  } else {
    EXPECT(false);
  }
  std::printf("modules: %s enumerated\n", count == g_seen.size() ? "every kernel" : "not every kernel");
}

size_t smem_per_block(int block) { return static_cast<size_t>(block) * 4; }

void occupancy(const Kernels& k, CUdeviceptr dmem) {
  int grid = 0, block = 0;
  OK(cuOccupancyMaxPotentialBlockSize(&grid, &block, k.add, nullptr, 0, 0));
  EXPECT(block > 0 && block % 32 == 0 && grid > 0);
  int per_sm = 0;
  OK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k.add, block, 0));
  EXPECT(per_sm >= 1);
  OK(cuOccupancyMaxPotentialBlockSizeWithFlags(&grid, &block, k.add, smem_per_block, 0, 512, CU_OCCUPANCY_DEFAULT));
  EXPECT(block > 0 && block <= 512 && grid > 0);

  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attr.value.clusterDim.x = 2;
  attr.value.clusterDim.y = 1;
  attr.value.clusterDim.z = 1;
  CUlaunchConfig cfg{};
  cfg.gridDimX = 16;
  cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = 128;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  OK(cuOccupancyMaxActiveClusters(&clusters, k.add, &cfg));
  EXPECT(clusters >= 1);

  // A 64 x 64 float tensor, 32 x 32 tiles.
  CUtensorMap map{};
  const cuuint64_t dims[2] = {64, 64};
  const cuuint64_t strides[1] = {64 * 4};
  const cuuint32_t box[2] = {32, 32};
  const cuuint32_t elem[2] = {1, 1};
  OK(cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, reinterpret_cast<void*>(dmem), dims, strides,
                            box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  EXPECT(std::any_of(std::begin(map.opaque), std::end(map.opaque), [](cuuint64_t w) { return w != 0; }));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE,
             cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 0, reinterpret_cast<void*>(dmem), dims,
                                    strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                    CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  int cluster_size = 0;
  OK(cuOccupancyMaxPotentialClusterSize(&cluster_size, k.add, &cfg));
  std::printf("largest cluster for 16 x 128 threads: %d\n", cluster_size);

  // The same tensor at another address: the descriptor with its address replaced is the
  // one encoded there.
  CUtensorMap moved = map, direct{};
  OK(cuTensorMapReplaceAddress(&moved, reinterpret_cast<void*>(dmem + 256)));
  OK(cuTensorMapEncodeTiled(&direct, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, reinterpret_cast<void*>(dmem + 256), dims,
                            strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  std::printf("a replaced address gives the descriptor encoded there: %s\n",
              std::memcmp(&moved, &direct, sizeof moved) == 0 ? "yes" : "no");

  // An NHWC tensor of 1 x 8 x 8 x 16 floats as im2col: 16 channels a pixel, 32 pixels a column.
  const cuuint64_t nhwc[4] = {16, 8, 8, 1};
  const cuuint64_t nhwc_strides[3] = {16 * 4, 16 * 4 * 8, 16 * 4 * 8 * 8};
  const int lower[2] = {-1, -1}, upper[2] = {-1, -1};
  const cuuint32_t ones[4] = {1, 1, 1, 1};
  CUtensorMap col{};
  OK(cuTensorMapEncodeIm2col(&col, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, reinterpret_cast<void*>(dmem), nhwc,
                             nhwc_strides, lower, upper, 16, 32, ones, CU_TENSOR_MAP_INTERLEAVE_NONE,
                             CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  EXPECT(std::any_of(std::begin(col.opaque), std::end(col.opaque), [](cuuint64_t w) { return w != 0; }));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE,
             cuTensorMapEncodeIm2col(&col, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, reinterpret_cast<void*>(dmem), nhwc,
                                     nhwc_strides, lower, upper, 0, 32, ones, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                     CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  // The wide form is for compute capability 10.0 and up: what this GPU answers is printed.
  std::printf("im2col wide: %s\n",
              check::name(cuTensorMapEncodeIm2colWide(
                  &col, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, reinterpret_cast<void*>(dmem), nhwc, nhwc_strides, -1, -1,
                  16, 32, ones, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_IM2COL_WIDE_MODE_W,
                  CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)));

  // The widest 1D texture over linear memory, by format and channels.
  CUdevice dev = 0;
  OK(cuCtxGetDevice(&dev));
  std::size_t w1 = 0, w4 = 0;
  OK(cuDeviceGetTexture1DLinearMaxWidth(&w1, CU_AD_FORMAT_UNSIGNED_INT8, 1, dev));
  OK(cuDeviceGetTexture1DLinearMaxWidth(&w4, CU_AD_FORMAT_FLOAT, 4, dev));
  std::printf("1D linear texture widths: u8 x1 %zu, float x4 %zu\n", w1, w4);
  std::printf("occupancy: block-size searches, clusters, tensor maps\n");
}

}  // namespace

// cuEventRecordWithFlags (PyTorch records every event through it): the
// default flag records as cuEventRecord does; EXTERNAL makes an event-record
// node while the stream captures. What the driver answers for the other cases
// is printed, so the native run and the ivcuda run are compared on it.
void event_flags(const Kernels& k, CUstream s) {
  CUevent ev = nullptr;
  OK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  if (ev == nullptr) return;
  OK(cuEventRecordWithFlags(ev, s, CU_EVENT_RECORD_DEFAULT));
  OK(cuEventSynchronize(ev));
  std::printf("events: record with flags 0x8: %s\n", check::name(cuEventRecordWithFlags(ev, s, 0x8)));
  std::printf("events: record EXTERNAL outside a capture: %s\n",
              check::name(cuEventRecordWithFlags(ev, s, CU_EVENT_RECORD_EXTERNAL)));
  OK(cuStreamSynchronize(s));
  CUdeviceptr d = 0;
  OK(cuMemAlloc(&d, 1024 * 4));
  unsigned v = 5;
  unsigned long long count = 1024;
  void* args[] = {&d, &v, &count};
  OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(cuLaunchKernel(k.fill, 4, 1, 1, 256, 1, 1, 0, s, args, nullptr));
  OK(cuEventRecordWithFlags(ev, s, CU_EVENT_RECORD_EXTERNAL));
  OK(cuLaunchKernel(k.fill, 4, 1, 1, 256, 1, 1, 0, s, args, nullptr));
  CUgraph g = nullptr;
  OK(cuStreamEndCapture(s, &g));
  size_t nodes = 0;
  OK(cuGraphGetNodes(g, nullptr, &nodes));
  std::printf("events: a capture with an EXTERNAL record has %zu nodes\n", nodes);
  CUgraphExec e = nullptr;
  OK(cuGraphInstantiate(&e, g, 0));
  OK(cuGraphLaunch(e, s));
  OK(cuStreamSynchronize(s));
  OK(cuEventQuery(ev));
  std::vector<unsigned> host(1024);
  OK(cuMemcpyDtoH(host.data(), d, host.size() * 4));
  EXPECT(all_equal(host.data(), host.size(), 5));
  OK(cuGraphExecDestroy(e));
  OK(cuGraphDestroy(g));
  OK(cuMemFree(d));
  OK(cuEventDestroy(ev));
}

// Capture modes per thread: while a global capture runs, a thread that turned
// relaxed may allocate (PyTorch's allocator does so inside torch.cuda.graph);
// in the default mode the driver refuses the allocation and the capture is
// invalidated. The refusal is printed, so that native and ivcuda runs agree.
void capture_modes(const Kernels& k, CUstream s) {
  OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  OK(cuThreadExchangeStreamCaptureMode(&m));
  EXPECT(m == CU_STREAM_CAPTURE_MODE_GLOBAL);
  CUdeviceptr d = 0;
  OK(cuMemAlloc(&d, 1024 * 4));  // allowed: this thread is relaxed
  m = CU_STREAM_CAPTURE_MODE_GLOBAL;
  OK(cuThreadExchangeStreamCaptureMode(&m));
  EXPECT(m == CU_STREAM_CAPTURE_MODE_RELAXED);
  unsigned v = 3;
  unsigned long long count = 1024;
  void* args[] = {&d, &v, &count};
  OK(cuLaunchKernel(k.fill, 4, 1, 1, 256, 1, 1, 0, s, args, nullptr));
  CUgraph g = nullptr;
  OK(cuStreamEndCapture(s, &g));
  CUgraphExec e = nullptr;
  OK(cuGraphInstantiate(&e, g, 0));
  OK(cuGraphLaunch(e, s));
  OK(cuStreamSynchronize(s));
  std::vector<unsigned> host(1024);
  OK(cuMemcpyDtoH(host.data(), d, host.size() * 4));
  EXPECT(all_equal(host.data(), host.size(), 3));
  OK(cuGraphExecDestroy(e));
  OK(cuGraphDestroy(g));
  // The same allocation in the default (global) mode.
  OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUdeviceptr d2 = 0;
  const CUresult r = cuMemAlloc(&d2, 4096);
  std::printf("capture modes: cuMemAlloc during a global capture: %s\n", check::name(r));
  g = nullptr;
  std::printf("capture modes: then cuStreamEndCapture: %s\n", check::name(cuStreamEndCapture(s, &g)));
  if (g != nullptr) OK(cuGraphDestroy(g));
  if (r == CUDA_SUCCESS) OK(cuMemFree(d2));
  OK(cuMemFree(d));
}

int main(int argc, char** argv) {
  const char* ptx = check::arg(argc, argv, "--ptx");
  if (ptx == nullptr) {
    std::fprintf(stderr, "usage: drv_graphs --ptx FILE\n");
    return 2;
  }
  OK(cuInit(0));
  CUdevice dev;
  OK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  if (check::g_failures != 0) return check::finish("drv_graphs");
  auto text = read_file(ptx);
  CUmodule m;
  OK(cuModuleLoadData(&m, text.data()));
  Kernels k;
  OK(cuModuleGetFunction(&k.add, m, "ivc_vec_add"));
  OK(cuModuleGetFunction(&k.fill, m, "ivc_fill_u32"));
  OK(cuModuleGetFunction(&k.print, m, "ivc_rtf_printf"));
  if (check::g_failures != 0) return check::finish("drv_graphs");
  CUstream s;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

  mempool(dev, s);
  graphs(k, s);
  event_flags(k, s);
  capture_modes(k, s);
  cooperative(k, dev, s);
  device_printf(k);
  modules(k, m);
  CUdeviceptr dmem;
  OK(cuMemAlloc(&dmem, 64 * 64 * 4));
  occupancy(k, dmem);
  OK(cuMemFree(dmem));

  OK(cuStreamDestroy(s));
  OK(cuModuleUnload(m));
  OK(cuDevicePrimaryCtxRelease(dev));
  return check::finish("drv_graphs");
}
