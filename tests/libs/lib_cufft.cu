// cuFFT through the guest libcuda.so.1 (cuFFT calls the driver API itself, with no cudart
// inside): a 1D complex-to-complex forward and inverse transform, and a real-to-complex
// transform, checked against a CPU DFT in double precision within fp32 tolerances.
#include <cufft.h>

#include <cmath>
#include <complex>
#include <vector>

#include "lib_check.h"

static const char* fft_name(cufftResult r) {
  static char buf[32];
  std::snprintf(buf, sizeof buf, "cufftResult %d", int(r));
  return buf;
}
#define FFT(call) LC_STATUS(call, CUFFT_SUCCESS, fft_name)

static const char kName[] = "lib_cufft";

// Largest |got - want| relative to the largest |want|.
static double rel_error(const cufftComplex* got, const std::vector<std::complex<double>>& want) {
  double worst = 0, scale = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    const std::complex<double> g(got[i].x, got[i].y);
    worst = std::fmax(worst, std::abs(g - want[i]));
    scale = std::fmax(scale, std::abs(want[i]));
  }
  return worst / scale;
}

static std::vector<std::complex<double>> dft(const std::vector<std::complex<double>>& x, int sign) {
  const size_t n = x.size();
  std::vector<std::complex<double>> out(n);
  const double pi = std::acos(-1.0);
  for (size_t k = 0; k < n; ++k) {
    std::complex<double> acc = 0;
    for (size_t j = 0; j < n; ++j) acc += x[j] * std::polar(1.0, sign * 2 * pi * double(j * k % n) / double(n));
    out[k] = acc;
  }
  return out;
}

int main(int argc, char** argv) {
  libcheck::parse_args(argc, argv, kName);
  const int n = 256;
  const double tol = 1e-5;
  int version = 0;
  FFT(cufftGetVersion(&version));
  EXPECT(version >= 11000);

  std::vector<cufftComplex> x(n);
  std::vector<std::complex<double>> xd(n);
  for (int i = 0; i < n; ++i) {
    x[i].x = float(std::sin(0.1 * i) + 0.25 * (i % 5));
    x[i].y = float(std::cos(0.37 * i) - 0.5);
    xd[i] = {x[i].x, x[i].y};
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cufftComplex *din = nullptr, *dout = nullptr;
  CK(cudaMalloc(&din, n * sizeof(cufftComplex)));
  CK(cudaMalloc(&dout, n * sizeof(cufftComplex)));
  REQUIRE_OK(kName);
  CK(cudaMemcpy(din, x.data(), n * sizeof(cufftComplex), cudaMemcpyHostToDevice));
  std::vector<cufftComplex> back(n), fwd(n), inv(n);
  CK(cudaMemcpy(back.data(), din, n * sizeof(cufftComplex), cudaMemcpyDeviceToHost));
  EXPECT(libcheck::same_bytes(back.data(), x.data(), n * sizeof(cufftComplex)));

  cufftHandle plan;
  FFT(cufftPlan1d(&plan, n, CUFFT_C2C, 1));
  REQUIRE_OK(kName);
  FFT(cufftSetStream(plan, s));
  size_t work = 0;
  FFT(cufftGetSize(plan, &work));
  FFT(cufftExecC2C(plan, din, dout, CUFFT_FORWARD));
  CK(cudaMemcpyAsync(fwd.data(), dout, n * sizeof(cufftComplex), cudaMemcpyDeviceToHost, s));
  FFT(cufftExecC2C(plan, dout, dout, CUFFT_INVERSE));  // in place
  CK(cudaMemcpyAsync(inv.data(), dout, n * sizeof(cufftComplex), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  EXPECT_RESULT(rel_error(fwd.data(), dft(xd, -1)) < tol);
  std::vector<std::complex<double>> scaled(n);
  for (int i = 0; i < n; ++i) scaled[i] = xd[i] * double(n);  // cuFFT does not normalise
  EXPECT_RESULT(rel_error(inv.data(), scaled) < tol);
  // An out-of-place C2C leaves its input alone.
  CK(cudaMemcpy(back.data(), din, n * sizeof(cufftComplex), cudaMemcpyDeviceToHost));
  EXPECT(libcheck::same_bytes(back.data(), x.data(), n * sizeof(cufftComplex)));
  FFT(cufftDestroy(plan));

  // Real to complex: n reals in, n/2 + 1 complex out (Hermitian half).
  std::vector<float> r(n);
  std::vector<std::complex<double>> rd(n);
  for (int i = 0; i < n; ++i) rd[i] = r[i] = float((i * 37 % 23) - 11) / 8.0f;
  float* dr = nullptr;
  CK(cudaMalloc(&dr, n * sizeof(float)));
  CK(cudaMemcpy(dr, r.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  std::vector<float> r_back(n);
  CK(cudaMemcpy(r_back.data(), dr, n * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT(libcheck::same_bytes(r_back.data(), r.data(), n * sizeof(float)));
  cufftHandle rplan;
  FFT(cufftPlan1d(&rplan, n, CUFFT_R2C, 1));
  FFT(cufftExecR2C(rplan, dr, dout));
  std::vector<cufftComplex> half(n / 2 + 1);
  CK(cudaMemcpy(half.data(), dout, half.size() * sizeof(cufftComplex), cudaMemcpyDeviceToHost));
  std::vector<std::complex<double>> want = dft(rd, -1);
  want.resize(n / 2 + 1);
  EXPECT_RESULT(rel_error(half.data(), want) < tol);
  FFT(cufftDestroy(rplan));

  CK(cudaFree(din));
  CK(cudaFree(dout));
  CK(cudaFree(dr));
  CK(cudaStreamDestroy(s));
  std::printf("c2c forward+inverse and r2c, n=%d: %s\n", n,
              libcheck::flow_only ? "not compared" : (libcheck::failed ? "checked, mismatches" : "within 1e-5 of a double DFT"));
  return libcheck::finish(kName);
}
