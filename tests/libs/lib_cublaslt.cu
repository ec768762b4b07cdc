// cuBLASLt through the guest libcuda.so.1: a half-precision GEMM (fp16 in and out, fp32
// compute) with cublasLtMatmul and a heuristic's algorithm, checked against a CPU
// reference. Inputs are small integers: every product, sum and the fp16 result are exact.
#include <cublasLt.h>
#include <cuda_fp16.h>

#include <vector>

#include "lib_check.h"

static const char* blas_name(cublasStatus_t s) { return cublasLtGetStatusName(s); }
#define BLAS(call) LC_STATUS(call, CUBLAS_STATUS_SUCCESS, blas_name)

static const char kName[] = "lib_cublaslt";

int main(int argc, char** argv) {
  libcheck::parse_args(argc, argv, kName);
  const int m = 128, n = 64, k = 64;
  const float alpha = 2.0f, beta = 1.0f;
  std::vector<__half> a(size_t(m) * k), b(size_t(k) * n), c(size_t(m) * n), want(c.size());
  std::vector<float> af(a.size()), bf(b.size()), cf(c.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = __float2half(af[i] = float(int(i * 3 % 5) - 2));
  for (size_t i = 0; i < b.size(); ++i) b[i] = __float2half(bf[i] = float(int(i * 7 % 5) - 2));
  for (size_t i = 0; i < c.size(); ++i) c[i] = __float2half(cf[i] = float(int(i % 9) - 4));
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      float acc = 0;
      for (int q = 0; q < k; ++q) acc += af[size_t(q) * m + i] * bf[size_t(j) * k + q];
      want[size_t(j) * m + i] = __float2half(alpha * acc + beta * cf[size_t(j) * m + i]);
    }

  cublasLtHandle_t lt = nullptr;
  BLAS(cublasLtCreate(&lt));
  REQUIRE_OK(kName);
  EXPECT(cublasLtGetVersion() >= 130000);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  __half *da, *db, *dc, *dd;
  void* workspace = nullptr;
  const size_t workspace_bytes = 4u << 20;
  CK(cudaMalloc(&da, a.size() * sizeof(__half)));
  CK(cudaMalloc(&db, b.size() * sizeof(__half)));
  CK(cudaMalloc(&dc, c.size() * sizeof(__half)));
  CK(cudaMalloc(&dd, c.size() * sizeof(__half)));
  CK(cudaMalloc(&workspace, workspace_bytes));
  REQUIRE_OK(kName);
  CK(cudaMemcpyAsync(da, a.data(), a.size() * sizeof(__half), cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(db, b.data(), b.size() * sizeof(__half), cudaMemcpyHostToDevice, s));
  CK(cudaMemcpyAsync(dc, c.data(), c.size() * sizeof(__half), cudaMemcpyHostToDevice, s));
  CK(cudaMemsetAsync(dd, 0, c.size() * sizeof(__half), s));

  cublasLtMatmulDesc_t op = nullptr;
  BLAS(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t no_trans = CUBLAS_OP_N;
  BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &no_trans, sizeof no_trans));
  BLAS(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof no_trans));
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, m, k, m));
  BLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, k, n, k));
  BLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16F, m, n, m));
  cublasLtMatmulPreference_t pref = nullptr;
  BLAS(cublasLtMatmulPreferenceCreate(&pref));
  BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                            sizeof workspace_bytes));
  cublasLtMatmulHeuristicResult_t heur[4] = {};
  int found = 0;
  BLAS(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 4, heur, &found));
  EXPECT(found >= 1);
  REQUIRE_OK(kName);
  BLAS(cublasLtMatmul(lt, op, &alpha, da, la, db, lb, &beta, dc, lc, dd, lc, &heur[0].algo, workspace,
                      workspace_bytes, s));
  std::vector<__half> got(c.size()), got2(c.size()), c_back(c.size());
  CK(cudaMemcpyAsync(got.data(), dd, got.size() * sizeof(__half), cudaMemcpyDeviceToHost, s));
  // Once more in place (C = alpha*A*B + beta*C) and without an algorithm: cuBLASLt picks one.
  BLAS(cublasLtMatmul(lt, op, &alpha, da, la, db, lb, &beta, dc, lc, dc, lc, nullptr, workspace,
                      workspace_bytes, s));
  CK(cudaMemcpyAsync(got2.data(), dc, got2.size() * sizeof(__half), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  EXPECT_RESULT(libcheck::same_bytes(got.data(), want.data(), want.size() * sizeof(__half)));
  EXPECT_RESULT(libcheck::same_bytes(got2.data(), want.data(), want.size() * sizeof(__half)));

  std::vector<__half> a_back(a.size());
  CK(cudaMemcpy(a_back.data(), da, a.size() * sizeof(__half), cudaMemcpyDeviceToHost));
  EXPECT(libcheck::same_bytes(a_back.data(), a.data(), a.size() * sizeof(__half)));
  if (libcheck::flow_only) {  // nothing ran on the device: C is still the input
    EXPECT(libcheck::same_bytes(got2.data(), c.data(), c.size() * sizeof(__half)));
  }

  BLAS(cublasLtMatmulPreferenceDestroy(pref));
  BLAS(cublasLtMatrixLayoutDestroy(la));
  BLAS(cublasLtMatrixLayoutDestroy(lb));
  BLAS(cublasLtMatrixLayoutDestroy(lc));
  BLAS(cublasLtMatmulDescDestroy(op));
  BLAS(cublasLtDestroy(lt));
  for (void* p : {(void*)da, (void*)db, (void*)dc, (void*)dd, workspace}) CK(cudaFree(p));
  CK(cudaStreamDestroy(s));
  std::printf("hgemm %dx%dx%d (fp16 in/out, fp32 compute) with cublasLtMatmul: %s\n", m, n, k,
              libcheck::flow_only ? "not compared" : (libcheck::failed ? "checked, mismatches" : "exact"));
  return libcheck::finish(kName);
}
