// Runtime-API features beyond rt_basic, in sections that run and report on their own:
// parameter packing of many kinds, __constant__/__device__ symbols, streams and events,
// page-locked, mapped and managed memory, stream-ordered allocation, a captured graph replayed,
// a cooperative launch with a grid-wide barrier, and device printf. Built by nvcc with the
// default static cudart and with -cudart shared; it knows nothing of ivcuda.
//
//   rt_features [--only a,b] [--skip a,b] [--list]
// Every result is checked against a CPU reference; stdout is deterministic (the GPU suite
// diffs a native run against a run through ivcuda); details of a failure go to stderr.
// Exit status 0 only when every section that ran passed.
//
// The kernels are extern "C" so that the GPU test double finds its CPU versions by name
// (tests/gpu_double/kernels.cc); their values are small integers and dyadic fractions so
// that results are exact whatever the compiler contracts into FMAs.
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace cg = cooperative_groups;

struct ivc_rtf_mixed {  // padding after c and s: 32 bytes, 8-aligned
  char c;
  double d;
  short s;
  float f[3];
};
struct ivc_rtf_arr {  // an array by value
  int v[7];
};

__constant__ float ivc_rtf_coef[4] = {1.0f, 2.0f, 3.0f, 4.0f};
__device__ int ivc_rtf_offset = 7;
__device__ float ivc_rtf_table[64];
__device__ unsigned ivc_rtf_hits = 0;

// Parameters in an order that needs padding between most of them.
extern "C" __global__ void ivc_rtf_params(ivc_rtf_mixed m, char c, ivc_rtf_arr a, const double* in,
                                          short sh, double* out, long long s64, unsigned char uc,
                                          unsigned long long u64, float f, double d, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    out[i] = in[i] * d + f + (double)s64 + (double)(u64 & 0xffffu) + c + sh + uc + m.c + m.d + m.s +
             m.f[i % 3] + a.v[i % 7];
}

extern "C" __global__ void ivc_rtf_symbols(float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = ivc_rtf_table[i % 64] * ivc_rtf_coef[i % 4] + ivc_rtf_offset;
  if (i == 0) atomicAdd(&ivc_rtf_hits, 1u);
}

extern "C" __global__ void ivc_rtf_axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void ivc_rtf_iota(int* p, int base, int step, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = base + i * step;
}

extern "C" __global__ void ivc_rtf_twice_plus(int* p, int k, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = 2 * p[i] + k;
}

// Two phases that only a grid-wide barrier keeps apart: phase 2 reads what other blocks wrote.
extern "C" __global__ void ivc_rtf_coop(int* a, int* b, int n) {
  cg::grid_group g = cg::this_grid();
  for (unsigned long long i = g.thread_rank(); i < (unsigned long long)n; i += g.size())
    a[i] = (int)i * 3 + 1;
  g.sync();
  for (unsigned long long i = g.thread_rank(); i < (unsigned long long)n; i += g.size())
    b[i] = a[n - 1 - (int)i] + a[((int)i + 1) % n];
}

#define IVC_RTF_PRINTF_FORMAT "ivc printf %d/%d: %lld %u 0x%x %.3f %c\n"
// One thread prints, so the lines' order is defined.
extern "C" __global__ void ivc_rtf_printf(int lines, long long big, double x) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  for (int k = 0; k < lines; ++k)
    printf(IVC_RTF_PRINTF_FORMAT, k, lines, big + k, (unsigned)k * 7u, k * 255, x * k, 'a' + k);
}

// ---------------------------------------------------------------------------------------

static int g_checks = 0, g_failed = 0;

#define CK(call)                                                                               \
  do {                                                                                         \
    ++g_checks;                                                                                \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                   \
      ++g_failed;                                                                              \
      std::fprintf(stderr, "FAIL %s:%d: %s -> %s\n", __FILE__, __LINE__, #call,                \
                   cudaGetErrorName(e_));                                                      \
    }                                                                                          \
  } while (0)
#define EXPECT(cond)                                                                    \
  do {                                                                                  \
    ++g_checks;                                                                         \
    if (!(cond)) {                                                                      \
      ++g_failed;                                                                       \
      std::fprintf(stderr, "FAIL %s:%d: not true: %s\n", __FILE__, __LINE__, #cond);   \
    }                                                                                   \
  } while (0)
// Stops a section whose later steps would only fail for the same reason.
#define CK_OR_STOP(call)            \
  do {                              \
    const int before_ = g_failed;   \
    CK(call);                       \
    if (g_failed != before_) return; \
  } while (0)

// Index of the first element where got and want differ, or -1.
template <class T>
static long first_mismatch(const T* got, const T* want, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) return static_cast<long>(i);
  return -1;
}
#define EXPECT_SAME(got, want, n)                                                            \
  do {                                                                                       \
    const long at_ = first_mismatch(got, want, n);                                           \
    ++g_checks;                                                                              \
    if (at_ >= 0) {                                                                          \
      ++g_failed;                                                                            \
      std::fprintf(stderr, "FAIL %s:%d: %s differs from %s at element %ld\n", __FILE__,      \
                   __LINE__, #got, #want, at_);                                              \
    }                                                                                        \
  } while (0)

static unsigned blocks_for(int n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// A kernel launch as the process's first call that needs a context: cudart creates the
// context and loads its modules inside the launch. Meaningful only as the first section run.
static void section_launch_first() {
  const int n = 777;
  int* d = nullptr;
  ivc_rtf_iota<<<4, 64>>>(d, 1, 1, 0);  // n = 0: touches nothing
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  CK_OR_STOP(cudaMalloc(&d, n * sizeof(int)));
  ivc_rtf_iota<<<2, 128>>>(d, 9, -4, n);
  std::vector<int> out(n), want(n);
  CK(cudaMemcpy(out.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) want[i] = 9 - 4 * i;
  EXPECT_SAME(out.data(), want.data(), n);
  CK(cudaFree(d));
}

static void section_params() {
  const int n = 3000;
  ivc_rtf_mixed m{};
  m.c = 3;
  m.d = 2.5;
  m.s = -2;
  m.f[0] = 0.5f;
  m.f[1] = 0.25f;
  m.f[2] = 0.125f;
  ivc_rtf_arr a{};
  for (int k = 0; k < 7; ++k) a.v[k] = (k + 1) * 10;
  const char c = -7;
  const short sh = -300;
  const long long s64 = -(1LL << 40);
  const unsigned char uc = 200;
  const unsigned long long u64 = 0xfedcba9876543210ull;
  const float f = 1.25f;
  const double d = 0.5;
  std::vector<double> in(n), out(n, -1.0), want(n);
  for (int i = 0; i < n; ++i) {
    in[i] = i;
    want[i] = in[i] * d + f + (double)s64 + (double)(u64 & 0xffffu) + c + sh + uc + m.c + m.d + m.s +
              m.f[i % 3] + a.v[i % 7];
  }
  double *din = nullptr, *dout = nullptr;
  CK_OR_STOP(cudaMalloc(&din, n * sizeof(double)));
  CK_OR_STOP(cudaMalloc(&dout, n * sizeof(double)));
  CK(cudaMemcpy(din, in.data(), n * sizeof(double), cudaMemcpyHostToDevice));
  ivc_rtf_params<<<blocks_for(n, 128), 128>>>(m, c, a, din, sh, dout, s64, uc, u64, f, d, n);
  CK(cudaGetLastError());
  CK(cudaMemcpy(out.data(), dout, n * sizeof(double), cudaMemcpyDeviceToHost));
  EXPECT_SAME(out.data(), want.data(), n);

  // The same launch through cudaLaunchKernel with an explicit argument array.
  int n_half = n / 2;
  void* args[] = {&m, (void*)&c, &a, &din, (void*)&sh, &dout, (void*)&s64, (void*)&uc, (void*)&u64,
                  (void*)&f, (void*)&d, &n_half};
  CK(cudaMemset(dout, 0, n * sizeof(double)));
  CK(cudaLaunchKernel((const void*)ivc_rtf_params, dim3(blocks_for(n_half, 64)), dim3(64), args, 0,
                      nullptr));
  CK(cudaMemcpy(out.data(), dout, n * sizeof(double), cudaMemcpyDeviceToHost));
  EXPECT_SAME(out.data(), want.data(), static_cast<size_t>(n_half));
  bool rest_zero = true;
  for (int i = n_half; i < n; ++i) rest_zero &= out[i] == 0.0;
  EXPECT(rest_zero);
  CK(cudaFree(din));
  CK(cudaFree(dout));
}

static void section_symbols() {
  float coef[4] = {};
  CK(cudaMemcpyFromSymbol(coef, ivc_rtf_coef, sizeof coef));
  EXPECT(coef[0] == 1.0f && coef[1] == 2.0f && coef[2] == 3.0f && coef[3] == 4.0f);
  int offset = 0;
  CK(cudaMemcpyFromSymbol(&offset, ivc_rtf_offset, sizeof offset));
  EXPECT(offset == 7);

  const float new_coef[3] = {0.5f, 1.5f, 2.0f};
  CK(cudaMemcpyToSymbol(ivc_rtf_coef, new_coef, sizeof new_coef));
  const float last = -1.0f;  // through the offset argument
  CK(cudaMemcpyToSymbol(ivc_rtf_coef, &last, sizeof last, 3 * sizeof(float)));
  const int new_offset = -3;
  CK(cudaMemcpyToSymbol(ivc_rtf_offset, &new_offset, sizeof new_offset));

  void* table = nullptr;
  size_t table_size = 0;
  CK_OR_STOP(cudaGetSymbolAddress(&table, ivc_rtf_table));
  CK(cudaGetSymbolSize(&table_size, ivc_rtf_table));
  EXPECT(table_size == 64 * sizeof(float));
  float host_table[64];
  for (int k = 0; k < 64; ++k) host_table[k] = static_cast<float>(k - 20);
  CK(cudaMemcpy(table, host_table, sizeof host_table, cudaMemcpyHostToDevice));

  const int n = 1000;
  float* dout = nullptr;
  CK_OR_STOP(cudaMalloc(&dout, n * sizeof(float)));
  cudaStream_t s;
  CK_OR_STOP(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ivc_rtf_symbols<<<blocks_for(n, 256), 256, 0, s>>>(dout, n);
  ivc_rtf_symbols<<<blocks_for(n, 256), 256, 0, s>>>(dout, n);
  CK(cudaGetLastError());
  unsigned hits = 0;
  CK(cudaMemcpyFromSymbolAsync(&hits, ivc_rtf_hits, sizeof hits, 0, cudaMemcpyDeviceToHost, s));
  std::vector<float> out(n), want(n);
  CK(cudaMemcpyAsync(out.data(), dout, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  const float all_coef[4] = {0.5f, 1.5f, 2.0f, -1.0f};
  for (int i = 0; i < n; ++i) want[i] = host_table[i % 64] * all_coef[i % 4] + new_offset;
  EXPECT_SAME(out.data(), want.data(), n);
  EXPECT(hits == 2);
  const unsigned zero = 0;
  CK(cudaMemcpyToSymbolAsync(ivc_rtf_hits, &zero, sizeof zero, 0, cudaMemcpyHostToDevice, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpyFromSymbol(&hits, ivc_rtf_hits, sizeof hits));
  EXPECT(hits == 0);
  CK(cudaStreamDestroy(s));
  CK(cudaFree(dout));
}

static void section_streams_events() {
  int least = 0, greatest = 0;
  CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  EXPECT(greatest <= least);
  cudaStream_t s1, s2;
  CK_OR_STOP(cudaStreamCreateWithPriority(&s1, cudaStreamNonBlocking, greatest));
  CK_OR_STOP(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  int prio = 1;
  CK(cudaStreamGetPriority(s1, &prio));
  EXPECT(prio == greatest);
  unsigned flags = 0;
  CK(cudaStreamGetFlags(s2, &flags));
  EXPECT(flags == cudaStreamNonBlocking);

  cudaEvent_t start, stop, handoff;
  CK_OR_STOP(cudaEventCreate(&start));
  CK_OR_STOP(cudaEventCreateWithFlags(&stop, cudaEventBlockingSync));
  CK_OR_STOP(cudaEventCreateWithFlags(&handoff, cudaEventDisableTiming));

  const int n = 1 << 15;
  std::vector<float> x(n), y(n), z(n), out(n), want(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 97);
    y[i] = static_cast<float>(i % 13) - 6.0f;
    z[i] = 1.0f;
  }
  float *dx, *dy, *dz;
  CK_OR_STOP(cudaMalloc(&dx, n * sizeof(float)));
  CK_OR_STOP(cudaMalloc(&dy, n * sizeof(float)));
  CK_OR_STOP(cudaMalloc(&dz, n * sizeof(float)));
  CK(cudaEventRecord(start, s1));
  CK(cudaMemcpyAsync(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice, s1));
  CK(cudaMemcpyAsync(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice, s1));
  ivc_rtf_axpy<<<blocks_for(n, 256), 256, 0, s1>>>(2.0f, dx, dy, n);  // y = 2x + y
  CK(cudaEventRecord(handoff, s1));
  CK(cudaMemcpyAsync(dz, z.data(), n * sizeof(float), cudaMemcpyHostToDevice, s2));
  CK(cudaStreamWaitEvent(s2, handoff, 0));
  ivc_rtf_axpy<<<blocks_for(n, 256), 256, 0, s2>>>(3.0f, dy, dz, n);  // z = 3y + z
  CK(cudaEventRecord(stop, s2));
  CK(cudaGetLastError());
  CK(cudaEventSynchronize(stop));
  CK(cudaEventQuery(stop));
  CK(cudaStreamQuery(s2));
  float ms = -1.0f;
  CK(cudaEventElapsedTime(&ms, start, stop));
  EXPECT(ms >= 0.0f);
  EXPECT(cudaEventElapsedTime(&ms, start, handoff) == cudaErrorInvalidResourceHandle);
  CK(cudaMemcpyAsync(out.data(), dz, n * sizeof(float), cudaMemcpyDeviceToHost, s2));
  CK(cudaStreamSynchronize(s2));
  for (int i = 0; i < n; ++i) want[i] = 3.0f * (2.0f * x[i] + y[i]) + z[i];
  EXPECT_SAME(out.data(), want.data(), n);

  // The legacy default stream orders against blocking streams.
  cudaStream_t blocking;
  CK_OR_STOP(cudaStreamCreate(&blocking));
  ivc_rtf_axpy<<<blocks_for(n, 256), 256, 0, blocking>>>(-1.0f, dx, dz, n);  // z -= x
  CK(cudaMemcpy(out.data(), dz, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) want[i] -= x[i];
  EXPECT_SAME(out.data(), want.data(), n);
  CK(cudaStreamDestroy(blocking));

  for (cudaEvent_t e : {start, stop, handoff}) CK(cudaEventDestroy(e));
  CK(cudaStreamDestroy(s1));
  CK(cudaStreamDestroy(s2));
  for (float* p : {dx, dy, dz}) CK(cudaFree(p));
}

static void host_func_bump(void* counter) { ++*static_cast<int*>(counter); }

static void section_host_func() {
  cudaStream_t s;
  CK_OR_STOP(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int counter = 0;
  int* d = nullptr;
  CK_OR_STOP(cudaMalloc(&d, 256 * sizeof(int)));
  ivc_rtf_iota<<<1, 64, 0, s>>>(d, 0, 1, 256);
  CK(cudaLaunchHostFunc(s, host_func_bump, &counter));
  CK(cudaLaunchHostFunc(s, host_func_bump, &counter));
  CK(cudaStreamSynchronize(s));
  EXPECT(counter == 2);
  CK(cudaFree(d));
  CK(cudaStreamDestroy(s));
}

static void section_pinned() {
  const int n = 1 << 16;
  int *a = nullptr, *b = nullptr;
  CK_OR_STOP(cudaMallocHost(&a, n * sizeof(int)));
  CK_OR_STOP(cudaHostAlloc(&b, n * sizeof(int), cudaHostAllocPortable));
  unsigned flags = 0;
  CK(cudaHostGetFlags(&flags, b));
  EXPECT((flags & cudaHostAllocMapped) != 0);  // the driver reports DEVICEMAP, never PORTABLE
  cudaPointerAttributes attr{};
  CK(cudaPointerGetAttributes(&attr, a));
  EXPECT(attr.type == cudaMemoryTypeHost);

  std::vector<int> pageable(n), want(n);
  CK(cudaHostRegister(pageable.data(), n * sizeof(int), cudaHostRegisterDefault));

  int* d = nullptr;
  CK_OR_STOP(cudaMalloc(&d, n * sizeof(int)));
  cudaStream_t s;
  CK_OR_STOP(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ivc_rtf_iota<<<64, 256, 0, s>>>(d, -1000, 3, n);
  CK(cudaMemcpyAsync(a, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  for (int i = 0; i < n; ++i) want[i] = -1000 + 3 * i;
  EXPECT_SAME(a, want.data(), n);

  for (int i = 0; i < n; ++i) b[i] = i ^ 0x5a5a;
  CK(cudaMemcpyAsync(d, b, n * sizeof(int), cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(pageable.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  EXPECT_SAME(pageable.data(), b, n);

  CK(cudaHostUnregister(pageable.data()));
  CK(cudaStreamDestroy(s));
  CK(cudaFree(d));
  CK(cudaFreeHost(a));
  CK(cudaFreeHost(b));
}

// Mapped (zero-copy) host memory: the kernel writes the host's pages directly.
static void section_mapped() {
  const int n = 4096;
  int* h = nullptr;
  CK_OR_STOP(cudaHostAlloc(&h, n * sizeof(int), cudaHostAllocMapped));
  int* dview = nullptr;
  CK_OR_STOP(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dview), h, 0));
  ivc_rtf_iota<<<8, 128>>>(dview, 5, 2, n);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<int> want(n);
  for (int i = 0; i < n; ++i) want[i] = 5 + 2 * i;
  EXPECT_SAME(h, want.data(), n);
  CK(cudaFreeHost(h));
}

// Managed memory as CUDA's tutorials use it: cudaMallocManaged, the CPU fills it, kernels
// update it, the CPU reads it after a synchronisation; prefetches, advice, attributes, and
// memory attached to one stream.
static void section_managed() {
  int supported = 0;
  CK(cudaDeviceGetAttribute(&supported, cudaDevAttrManagedMemory, 0));
  EXPECT(supported == 1);
  const int n = 3 << 18;  // 3 MiB of floats
  float *x = nullptr, *y = nullptr;
  CK_OR_STOP(cudaMallocManaged(&x, n * sizeof(float)));
  CK_OR_STOP(cudaMallocManaged(&y, n * sizeof(float)));
  std::vector<float> want(n);
  for (int i = 0; i < n; ++i) {
    x[i] = 0.5f * static_cast<float>(i % 512);
    y[i] = 2.0f;
    want[i] = 3.0f * x[i] + 2.0f;
  }
  ivc_rtf_axpy<<<(n + 255) / 256, 256>>>(3.0f, x, y, n);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  EXPECT_SAME(y, want.data(), n);
  for (int i = 0; i < n; i += 5003) {
    y[i] = 1.0f;
    want[i] = 1.0f;
  }
  for (int i = 0; i < n; ++i) want[i] += x[i];
  ivc_rtf_axpy<<<(n + 255) / 256, 256>>>(1.0f, x, y, n);
  CK(cudaDeviceSynchronize());
  EXPECT_SAME(y, want.data(), n);

  std::vector<float> back(n);
  CK(cudaMemcpy(back.data(), y, n * sizeof(float), cudaMemcpyDefault));
  EXPECT_SAME(back.data(), want.data(), n);
  CK(cudaMemset(x, 0, n * sizeof(float)));
  CK(cudaDeviceSynchronize());
  std::vector<float> zeros(n, 0.0f);
  EXPECT_SAME(x, zeros.data(), n);

  cudaPointerAttributes attr{};
  CK(cudaPointerGetAttributes(&attr, y + 10));
  EXPECT(attr.type == cudaMemoryTypeManaged);
  EXPECT(attr.devicePointer == y + 10 && attr.hostPointer == y + 10);

  cudaMemLocation gpu{};
  gpu.type = cudaMemLocationTypeDevice;
  gpu.id = 0;
  cudaMemLocation cpu{};
  cpu.type = cudaMemLocationTypeHost;
  CK(cudaMemAdvise(x, n * sizeof(float), cudaMemAdviseSetReadMostly, gpu));
  int read_mostly = 0;
  CK(cudaMemRangeGetAttribute(&read_mostly, sizeof read_mostly, cudaMemRangeAttributeReadMostly, x,
                              n * sizeof(float)));
  EXPECT(read_mostly == 1);
  cudaStream_t s;
  CK_OR_STOP(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int i = 0; i < n; ++i) x[i] = 1.0f;
  CK(cudaMemPrefetchAsync(x, n * sizeof(float), gpu, 0, s));
  CK(cudaMemPrefetchAsync(y, n * sizeof(float), gpu, 0, s));
  ivc_rtf_axpy<<<(n + 255) / 256, 256, 0, s>>>(-1.0f, x, y, n);
  CK(cudaMemPrefetchAsync(y, n * sizeof(float), cpu, 0, s));
  CK(cudaStreamSynchronize(s));
  for (int i = 0; i < n; ++i) want[i] -= 1.0f;
  EXPECT_SAME(y, want.data(), n);

  // Attached to the host, then to one stream: its kernels, then the CPU once that stream is done.
  int* z = nullptr;
  CK_OR_STOP(cudaMallocManaged(&z, 4096 * sizeof(int), cudaMemAttachHost));
  for (int i = 0; i < 4096; ++i) z[i] = i;
  CK(cudaStreamAttachMemAsync(s, z, 0, cudaMemAttachSingle));
  ivc_rtf_twice_plus<<<16, 256, 0, s>>>(z, 5, 4096);
  CK(cudaStreamSynchronize(s));
  std::vector<int> zwant(4096);
  for (int i = 0; i < 4096; ++i) zwant[i] = 2 * i + 5;
  EXPECT_SAME(z, zwant.data(), 4096);

  CK(cudaStreamDestroy(s));
  CK(cudaFree(z));
  CK(cudaFree(x));
  CK(cudaFree(y));
}

static void section_mempool() {
  int device = 0;
  CK(cudaGetDevice(&device));
  int supported = 0;
  CK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, device));
  if (!supported) {
    ++g_failed;
    std::fprintf(stderr, "FAIL: the device reports no memory-pool support\n");
    return;
  }
  cudaMemPool_t pool;
  CK_OR_STOP(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t threshold = 64u << 20;
  CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  uint64_t got = 0;
  CK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &got));
  EXPECT(got == threshold);

  cudaStream_t s;
  CK_OR_STOP(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int n = 100000;
  std::vector<int> out(n), want(n);
  for (int round = 0; round < 3; ++round) {
    int *p = nullptr, *q = nullptr;
    CK_OR_STOP(cudaMallocAsync(&p, n * sizeof(int), s));
    CK_OR_STOP(cudaMallocAsync(reinterpret_cast<void**>(&q), n * sizeof(int), pool, s));
    CK(cudaMemsetAsync(q, 0, n * sizeof(int), s));
    ivc_rtf_iota<<<32, 256, 0, s>>>(p, round * 100, round + 1, n);
    CK(cudaMemcpyAsync(q, p, n * sizeof(int), cudaMemcpyDeviceToDevice, s));
    CK(cudaFreeAsync(p, s));
    CK(cudaMemcpyAsync(out.data(), q, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CK(cudaFreeAsync(q, s));
    CK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; ++i) want[i] = round * 100 + (round + 1) * i;
    EXPECT_SAME(out.data(), want.data(), n);
  }
  CK(cudaMemPoolTrimTo(pool, 0));
  CK(cudaStreamDestroy(s));
}

// NCCL's pools: one per communicator (pinned, on the device, no handle type,
// never released) and a capped one for small objects; allocations from them
// on a stream, freed, then the pools destroyed after a synchronize.
static void section_mempool_created() {
  int device = 0;
  CK(cudaGetDevice(&device));
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool, capped;
  CK_OR_STOP(cudaMemPoolCreate(&pool, &props));
  props.maxSize = 32u << 20;
  CK_OR_STOP(cudaMemPoolCreate(&capped, &props));
  uint64_t threshold = ~uint64_t{0};
  CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  cudaStream_t s;
  CK_OR_STOP(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int n = 50000;
  std::vector<int> out(n), want(n);
  int *p = nullptr, *q = nullptr;
  CK_OR_STOP(cudaMallocAsync(&p, n * sizeof(int), pool, s));
  CK_OR_STOP(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&q), n * sizeof(int), capped, s));
  CK(cudaMemsetAsync(q, 0, n * sizeof(int), s));
  ivc_rtf_iota<<<32, 256, 0, s>>>(p, 7, 3, n);
  CK(cudaMemcpyAsync(q, p, n * sizeof(int), cudaMemcpyDeviceToDevice, s));
  CK(cudaMemcpyAsync(out.data(), q, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CK(cudaFreeAsync(p, s));
  CK(cudaFreeAsync(q, s));
  CK(cudaStreamSynchronize(s));
  for (int i = 0; i < n; ++i) want[i] = 7 + 3 * i;
  EXPECT_SAME(out.data(), want.data(), n);
  CK(cudaMemPoolDestroy(capped));
  CK(cudaMemPoolDestroy(pool));
  CK(cudaStreamDestroy(s));
}

static void section_graph() {
  const int n = 5000;
  int *in = nullptr, *out = nullptr, *d = nullptr;
  CK_OR_STOP(cudaMallocHost(&in, n * sizeof(int)));
  CK_OR_STOP(cudaMallocHost(&out, n * sizeof(int)));
  CK_OR_STOP(cudaMalloc(&d, n * sizeof(int)));
  cudaStream_t s;
  CK_OR_STOP(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  cudaGraph_t graph = nullptr;
  CK_OR_STOP(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CK(cudaStreamIsCapturing(s, &status));
  EXPECT(status == cudaStreamCaptureStatusActive);
  CK(cudaMemcpyAsync(d, in, n * sizeof(int), cudaMemcpyHostToDevice, s));
  ivc_rtf_twice_plus<<<blocks_for(n, 256), 256, 0, s>>>(d, 5, n);
  ivc_rtf_twice_plus<<<blocks_for(n, 256), 256, 0, s>>>(d, -1, n);
  CK(cudaMemcpyAsync(out, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
  CK_OR_STOP(cudaStreamEndCapture(s, &graph));
  CK(cudaStreamIsCapturing(s, &status));
  EXPECT(status == cudaStreamCaptureStatusNone);
  size_t nodes = 0;
  CK(cudaGraphGetNodes(graph, nullptr, &nodes));
  EXPECT(nodes == 4);

  cudaGraphExec_t exec = nullptr;
  CK_OR_STOP(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<int> want(n);
  for (int replay = 0; replay < 5; ++replay) {
    for (int i = 0; i < n; ++i) in[i] = i * (replay + 1) - 77;
    CK(cudaGraphLaunch(exec, s));
    CK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; ++i) want[i] = 2 * (2 * in[i] + 5) - 1;
    EXPECT_SAME(out, want.data(), n);
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(s));
  CK(cudaFree(d));
  CK(cudaFreeHost(in));
  CK(cudaFreeHost(out));
}

static void section_cooperative() {
  int device = 0;
  CK(cudaGetDevice(&device));
  int coop = 0, sms = 0;
  CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, device));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  if (!coop) {
    ++g_failed;
    std::fprintf(stderr, "FAIL: the device reports no cooperative-launch support\n");
    return;
  }
  const int threads = 128;
  int per_sm = 0;
  CK_OR_STOP(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, ivc_rtf_coop, threads, 0));
  EXPECT(per_sm >= 1);
  // Fewer threads than elements: each thread handles several on both sides of the barrier.
  int n = 50000;
  unsigned blocks = static_cast<unsigned>(sms > 0 ? sms : 1) * 2;
  if (per_sm * sms < static_cast<int>(blocks)) blocks = static_cast<unsigned>(per_sm * sms);
  if (blocks == 0) blocks = 1;
  int *a = nullptr, *b = nullptr;
  CK_OR_STOP(cudaMalloc(&a, n * sizeof(int)));
  CK_OR_STOP(cudaMalloc(&b, n * sizeof(int)));
  void* args[] = {&a, &b, &n};
  CK(cudaLaunchCooperativeKernel((const void*)ivc_rtf_coop, dim3(blocks), dim3(threads), args, 0,
                                 nullptr));
  CK(cudaDeviceSynchronize());
  std::vector<int> out(n), want(n);
  CK(cudaMemcpy(out.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost));
  auto phase1 = [](int i) { return i * 3 + 1; };
  for (int i = 0; i < n; ++i) want[i] = phase1(n - 1 - i) + phase1((i + 1) % n);
  EXPECT_SAME(out.data(), want.data(), n);
  CK(cudaFree(a));
  CK(cudaFree(b));
}

// Device printf reaches the program's own stdout at the synchronisation: fd 1 is pointed at a
// file around the launch, so the program sees exactly what was written there, in what order.
static void section_printf() {
  const int lines = 6;
  const long long big = 1LL << 42;
  const double x = 1.25;
  std::string want = "host line before the launch\n";
  char line[160];
  for (int k = 0; k < lines; ++k) {
    std::snprintf(line, sizeof line, IVC_RTF_PRINTF_FORMAT, k, lines, big + k, (unsigned)k * 7u,
                  k * 255, x * k, 'a' + k);
    want += line;
  }
  want += "host line after the synchronisation\n";

  CK(cudaFree(nullptr));  // the context exists before stdout is redirected
  char path[] = "/tmp/ivc_rtf_printf.XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) {
    ++g_failed;
    std::fprintf(stderr, "FAIL: mkstemp\n");
    return;
  }
  unlink(path);
  std::fflush(stdout);
  const int saved = dup(1);
  dup2(fd, 1);
  std::printf("host line before the launch\n");
  std::fflush(stdout);
  ivc_rtf_printf<<<2, 32>>>(lines, big, x);
  const cudaError_t launch = cudaGetLastError();
  const cudaError_t sync = cudaDeviceSynchronize();
  std::printf("host line after the synchronisation\n");
  std::fflush(stdout);
  dup2(saved, 1);
  close(saved);

  std::string got;
  char buf[4096];
  ssize_t k;
  lseek(fd, 0, SEEK_SET);
  while ((k = read(fd, buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(k));
  close(fd);
  CK(launch);
  CK(sync);
  ++g_checks;
  if (got != want) {
    ++g_failed;
    std::fprintf(stderr, "FAIL: device printf output differs; expected:\n%sgot:\n%s", want.c_str(),
                 got.c_str());
  }
  std::fputs(got.c_str(), stdout);
}

struct Section {
  const char* name;
  void (*run)();
};
static const Section kSections[] = {
    {"launch_first", section_launch_first}, {"params", section_params},   {"symbols", section_symbols},         {"streams", section_streams_events},
    {"host_func", section_host_func}, {"pinned", section_pinned},       {"mapped", section_mapped},
    {"mempool", section_mempool}, {"mempool_created", section_mempool_created}, {"graph", section_graph},             {"cooperative", section_cooperative},
    {"printf", section_printf}, {"managed", section_managed},
};

static bool listed(const std::string& list, const char* name) {
  return ("," + list + ",").find("," + std::string(name) + ",") != std::string::npos;
}

int main(int argc, char** argv) {
  std::string only, skip;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--skip" && i + 1 < argc) {
      skip = argv[++i];
    } else if (a == "--list") {
      for (const Section& s : kSections) std::printf("%s\n", s.name);
      return 0;
    } else {
      std::fprintf(stderr, "usage: %s [--only a,b] [--skip a,b] [--list]\n", argv[0]);
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
    std::printf("rt_features: no device\n");
    return 1;
  }
  int ran = 0, failed_sections = 0;
  for (const Section& s : kSections) {
    if ((!only.empty() && !listed(only, s.name)) || listed(skip, s.name)) continue;
    (void)cudaGetLastError();  // a previous section's non-sticky error is not this one's
    const int checks0 = g_checks, failed0 = g_failed;
    s.run();
    const int checks = g_checks - checks0, failed = g_failed - failed0;
    ++ran;
    if (failed == 0) {
      std::printf("section %s: ok (%d checks)\n", s.name, checks);
    } else {
      ++failed_sections;
      std::printf("section %s: FAILED (%d of %d checks)\n", s.name, failed, checks);
    }
    std::fflush(stdout);
  }
  std::printf("rt_features: %d sections, %d failed\n", ran, failed_sections);
  return failed_sections == 0 ? 0 : 1;
}
