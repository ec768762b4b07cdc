// A runtime-API program that knows nothing of ivcuda: built by nvcc with the
// default static cudart and again with -cudart shared, it runs unchanged
// natively and through ivcuda's libcuda.so.1. The kernels are the project's
// test kernels (the GPU test double runs the same names on the CPU).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

struct ivc_scale_params {
  float scale;
  int offset;
  double bias;
};

__constant__ float ivc_const_addend = 1.5f;
__device__ unsigned ivc_launch_count = 0;

extern "C" __global__ void ivc_vec_add(const float* a, const float* b, float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void ivc_scale_struct(ivc_scale_params s, float* data, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = (float)(data[i] * s.scale + s.offset + s.bias);
}

extern "C" __global__ void ivc_add_const(float* data, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] += ivc_const_addend;
  if (i == 0) atomicAdd(&ivc_launch_count, 1u);
}

extern "C" __global__ void ivc_fill_u32(unsigned* p, unsigned value, unsigned long long n) {
  unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = value;
}

static int failures = 0, checks = 0;
#define CK(call)                                                                                   \
  do {                                                                                             \
    ++checks;                                                                                      \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      ++failures;                                                                                  \
      std::fprintf(stderr, "FAIL %s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_)); \
    }                                                                                              \
  } while (0)
#define EXPECT(cond)                                                                \
  do {                                                                              \
    ++checks;                                                                       \
    if (!(cond)) {                                                                  \
      ++failures;                                                                   \
      std::fprintf(stderr, "FAIL %s:%d: not true: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                               \
  } while (0)

int main() {
  int count = 0;
  CK(cudaGetDeviceCount(&count));
  if (count < 1) {
    std::printf("rt_basic: no device (%d checks, %d failed)\n", checks, failures + 1);
    return 1;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device 0: %s, compute %d.%d, %d SMs\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  CK(cudaSetDevice(0));

  const int n = 1 << 16;
  std::vector<float> a(n), b(n), c(n);
  for (int i = 0; i < n; ++i) {
    a[i] = 0.25f * i;
    b[i] = 1000.0f - i;
  }
  float *da, *db, *dc;
  CK(cudaMalloc(&da, n * sizeof(float)));
  CK(cudaMalloc(&db, n * sizeof(float)));
  CK(cudaMalloc(&dc, n * sizeof(float)));
  CK(cudaMemcpy(da, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, b.data(), n * sizeof(float), cudaMemcpyDefault));
  ivc_vec_add<<<(n + 255) / 256, 256>>>(da, db, dc, n);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(c.data(), dc, n * sizeof(float), cudaMemcpyDeviceToHost));
  bool ok = true;
  for (int i = 0; i < n; ++i) ok &= c[i] == a[i] + b[i];
  EXPECT(ok);

  // a struct by value, on a stream, with events around it
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0, s));
  ivc_scale_params sp{3.0f, -2, 0.5};
  ivc_scale_struct<<<(n + 127) / 128, 128, 0, s>>>(sp, da, n);
  CK(cudaEventRecord(e1, s));
  CK(cudaEventSynchronize(e1));
  float ms = -1;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  EXPECT(ms >= 0);
  CK(cudaMemcpyAsync(c.data(), da, n * sizeof(float), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  ok = true;
  for (int i = 0; i < n; ++i) ok &= c[i] == (float)(a[i] * 3.0f - 2 + 0.5);
  EXPECT(ok);

  // __constant__ and __device__ symbols through the runtime's symbol calls
  float addend = 0;
  CK(cudaMemcpyFromSymbol(&addend, ivc_const_addend, sizeof addend));
  EXPECT(addend == 1.5f);
  addend = 4.0f;
  CK(cudaMemcpyToSymbol(ivc_const_addend, &addend, sizeof addend));
  CK(cudaMemcpy(db, a.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  for (int k = 0; k < 2; ++k) ivc_add_const<<<(n + 255) / 256, 256>>>(db, n);
  unsigned launches = 0;
  CK(cudaMemcpyFromSymbol(&launches, ivc_launch_count, sizeof launches));
  EXPECT(launches == 2);
  CK(cudaMemcpy(c.data(), db, n * sizeof(float), cudaMemcpyDeviceToHost));
  ok = true;
  for (int i = 0; i < n; ++i) ok &= c[i] == a[i] + 8.0f;
  EXPECT(ok);

  // page-locked memory: async copies through it
  unsigned* pinned = nullptr;
  CK(cudaMallocHost(&pinned, n * sizeof(unsigned)));
  unsigned long long nn = n;
  ivc_fill_u32<<<64, 256, 0, s>>>(reinterpret_cast<unsigned*>(dc), 0xabcdef01u, nn);
  CK(cudaMemcpyAsync(pinned, dc, n * sizeof(unsigned), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  ok = true;
  for (int i = 0; i < n; ++i) ok &= pinned[i] == 0xabcdef01u;
  EXPECT(ok);
  CK(cudaFreeHost(pinned));

  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, ivc_vec_add));
  EXPECT(fa.maxThreadsPerBlock >= 256);
  size_t free_b = 0, total = 0;
  CK(cudaMemGetInfo(&free_b, &total));
  EXPECT(total > 0 && free_b <= total);

  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaStreamDestroy(s));
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(dc));
  std::printf("rt_basic: %d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
