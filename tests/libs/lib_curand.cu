// cuRAND's host API through the guest libcuda.so.1: a Philox generator filling device
// memory with uniform and normal numbers; the moments are checked (mean, variance, range)
// and so is determinism (one seed, same numbers; another seed, different ones).
#include <curand.h>

#include <cmath>
#include <vector>

#include "lib_check.h"

static const char* rand_name(curandStatus_t s) {
  static char buf[32];
  std::snprintf(buf, sizeof buf, "curandStatus %d", int(s));
  return buf;
}
#define RAND(call) LC_STATUS(call, CURAND_STATUS_SUCCESS, rand_name)

static const char kName[] = "lib_curand";
static const size_t kN = size_t(1) << 20;

// Fills device memory from a fresh generator with `seed`.
static void generate(unsigned long long seed, float* d, bool normal, cudaStream_t s) {
  curandGenerator_t g = nullptr;
  RAND(curandCreateGenerator(&g, CURAND_RNG_PSEUDO_PHILOX4_32_10));
  if (g == nullptr) return;
  RAND(curandSetStream(g, s));
  RAND(curandSetPseudoRandomGeneratorSeed(g, seed));
  if (normal)
    RAND(curandGenerateNormal(g, d, kN, 0.0f, 1.0f));
  else
    RAND(curandGenerateUniform(g, d, kN));
  RAND(curandDestroyGenerator(g));
}

int main(int argc, char** argv) {
  libcheck::parse_args(argc, argv, kName);
  int version = 0;
  RAND(curandGetVersion(&version));
  EXPECT(version >= 10000);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *d1 = nullptr, *d2 = nullptr;
  CK(cudaMalloc(&d1, kN * sizeof(float)));
  CK(cudaMalloc(&d2, kN * sizeof(float)));
  REQUIRE_OK(kName);
  // A known pattern first: what the generator does not overwrite shows as the pattern, and
  // the copy itself must round-trip.
  std::vector<float> pattern(kN), a(kN), b(kN);
  for (size_t i = 0; i < kN; ++i) pattern[i] = -float(i % 1000) - 1.0f;
  CK(cudaMemcpy(d1, pattern.data(), kN * sizeof(float), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(a.data(), d1, kN * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT(libcheck::same_bytes(a.data(), pattern.data(), kN * sizeof(float)));

  generate(1234, d1, false, s);
  CK(cudaMemcpyAsync(a.data(), d1, kN * sizeof(float), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  double sum = 0, sq = 0, lo = 2, hi = -1;
  for (float v : a) {
    sum += v;
    sq += double(v) * v;
    lo = std::fmin(lo, v);
    hi = std::fmax(hi, v);
  }
  const double mean = sum / kN, var = sq / kN - mean * mean;
  // Uniform (0, 1]: mean 1/2, variance 1/12; 2^20 samples put both within ~1e-3.
  EXPECT_RESULT(std::fabs(mean - 0.5) < 0.005);
  EXPECT_RESULT(std::fabs(var - 1.0 / 12) < 0.005);
  EXPECT_RESULT(lo > 0.0 && hi <= 1.0);

  generate(1234, d2, false, s);
  CK(cudaMemcpyAsync(b.data(), d2, kN * sizeof(float), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  EXPECT_RESULT(libcheck::same_bytes(a.data(), b.data(), kN * sizeof(float)));  // same seed
  generate(4321, d2, false, s);
  CK(cudaMemcpyAsync(b.data(), d2, kN * sizeof(float), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  EXPECT_RESULT(!libcheck::same_bytes(a.data(), b.data(), kN * sizeof(float)));  // another seed

  generate(99, d1, true, s);
  CK(cudaMemcpyAsync(a.data(), d1, kN * sizeof(float), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  sum = sq = 0;
  double cube = 0;
  for (float v : a) {
    sum += v;
    sq += double(v) * v;
    cube += double(v) * v * v;
  }
  const double nmean = sum / kN, nvar = sq / kN - nmean * nmean, skew = cube / kN;
  EXPECT_RESULT(std::fabs(nmean) < 0.01);
  EXPECT_RESULT(std::fabs(nvar - 1.0) < 0.01);
  EXPECT_RESULT(std::fabs(skew) < 0.02);
  if (libcheck::flow_only)  // no kernel ran: the pattern is still there
    EXPECT(libcheck::same_bytes(a.data(), pattern.data(), kN * sizeof(float)));

  CK(cudaFree(d1));
  CK(cudaFree(d2));
  CK(cudaStreamDestroy(s));
  std::printf("philox uniform and normal, %zu samples: %s\n", kN,
              libcheck::flow_only ? "not compared" : (libcheck::failed ? "checked, mismatches" : "moments and determinism as expected"));
  return libcheck::finish(kName);
}
