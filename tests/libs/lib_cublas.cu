// cuBLAS through the guest libcuda.so.1: SGEMM (plain and strided-batched) on a stream,
// checked against a CPU reference. Inputs are small integers, so every product and sum is
// exact in fp32 (and in TF32) and the comparison is exact.
#include <cublas_v2.h>

#include <vector>

#include "lib_check.h"

static const char* blas_name(cublasStatus_t s) { return cublasGetStatusName(s); }
#define BLAS(call) LC_STATUS(call, CUBLAS_STATUS_SUCCESS, blas_name)

static const char kName[] = "lib_cublas";

int main(int argc, char** argv) {
  libcheck::parse_args(argc, argv, kName);
  const int m = 96, n = 80, k = 64, batch = 3;
  const float alpha = 1.5f, beta = -0.5f;
  // Column-major, as cuBLAS takes them.
  std::vector<float> a(size_t(m) * k * batch), b(size_t(k) * n * batch), c(size_t(m) * n * batch);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(int(i * 7 % 9) - 4);
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(int(i * 5 % 7) - 3);
  for (size_t i = 0; i < c.size(); ++i) c[i] = float(int(i % 11) - 5);
  std::vector<float> want(c.size());
  for (int p = 0; p < batch; ++p)
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float acc = 0;
        for (int q = 0; q < k; ++q) acc += a[size_t(p) * m * k + size_t(q) * m + i] * b[size_t(p) * k * n + size_t(j) * k + q];
        const size_t at = size_t(p) * m * n + size_t(j) * m + i;
        want[at] = alpha * acc + beta * c[at];
      }

  cublasHandle_t h = nullptr;
  BLAS(cublasCreate(&h));
  REQUIRE_OK(kName);
  int version = 0;
  BLAS(cublasGetVersion(h, &version));
  EXPECT(version >= 130000);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  BLAS(cublasSetStream(h, s));

  float *da, *db, *dc;
  CK(cudaMalloc(&da, a.size() * sizeof(float)));
  CK(cudaMalloc(&db, b.size() * sizeof(float)));
  CK(cudaMalloc(&dc, c.size() * sizeof(float)));
  REQUIRE_OK(kName);
  BLAS(cublasSetMatrix(m, k * batch, sizeof(float), a.data(), m, da, m));
  BLAS(cublasSetVector(int(b.size()), sizeof(float), b.data(), 1, db, 1));
  CK(cudaMemcpyAsync(dc, c.data(), c.size() * sizeof(float), cudaMemcpyHostToDevice, s));

  // The inputs as the device holds them.
  std::vector<float> back(a.size());
  BLAS(cublasGetMatrix(m, k * batch, sizeof(float), da, m, back.data(), m));
  EXPECT(libcheck::same_bytes(back.data(), a.data(), a.size() * sizeof(float)));

  // First matrix of the batch alone, then all of them strided.
  BLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, da, m, db, k, &beta, dc, m));
  std::vector<float> got(c.size());
  CK(cudaMemcpyAsync(got.data(), dc, size_t(m) * n * sizeof(float), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  EXPECT_RESULT(libcheck::same_bytes(got.data(), want.data(), size_t(m) * n * sizeof(float)));

  CK(cudaMemcpyAsync(dc, c.data(), c.size() * sizeof(float), cudaMemcpyHostToDevice, s));
  BLAS(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, da, m, (long long)m * k, db, k,
                                 (long long)k * n, &beta, dc, m, (long long)m * n, batch));
  CK(cudaMemcpyAsync(got.data(), dc, c.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  EXPECT_RESULT(libcheck::same_bytes(got.data(), want.data(), c.size() * sizeof(float)));

  // GEMM reads A and B only: they must come back unchanged.
  std::vector<float> b_back(b.size());
  BLAS(cublasGetVector(int(b.size()), sizeof(float), db, 1, b_back.data(), 1));
  EXPECT(libcheck::same_bytes(b_back.data(), b.data(), b.size() * sizeof(float)));

  // A level-1 call with a host-side result: sum |a_i| of the first column, exact.
  float asum = -1;
  BLAS(cublasSasum(h, m, da, 1, &asum));
  float want_asum = 0;
  for (int i = 0; i < m; ++i) want_asum += a[i] < 0 ? -a[i] : a[i];
  EXPECT_RESULT(asum == want_asum);

  BLAS(cublasDestroy(h));
  CK(cudaStreamDestroy(s));
  CK(cudaFree(da));
  CK(cudaFree(db));
  CK(cudaFree(dc));
  std::printf("sgemm %dx%dx%d and strided batch of %d: %s\n", m, n, k, batch,
              libcheck::flow_only ? "not compared" : (libcheck::failed ? "checked, mismatches" : "exact"));
  return libcheck::finish(kName);
}
