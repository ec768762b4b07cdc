// NVRTC through the guest libcuda.so.1: a kernel compiled at run time to PTX and to a CUBIN
// for the device's architecture, each loaded with cuModuleLoadData (driver API), launched
// with cuLaunchKernel and checked against a CPU reference, with a __device__ counter read
// through cuModuleGetGlobal; then both compiled again, which must give the same images (NVRTC
// may take them from libcuda's compile cache, guest/compile_cache.h). The kernel's name is one the GPU test double has a CPU version
// of (tests/gpu_double/kernels.cc), so CI checks its results too; a flow-only run changes
// nothing here.
#include <cuda.h>
#include <nvrtc.h>

#include <string>
#include <vector>

#include "lib_check.h"

static const char* drv_name(CUresult r) {
  const char* s = nullptr;
  return cuGetErrorName(r, &s) == CUDA_SUCCESS && s != nullptr ? s : "CUresult ?";
}
#define DRV(call) LC_STATUS(call, CUDA_SUCCESS, drv_name)
#define RTC(call) LC_STATUS(call, NVRTC_SUCCESS, nvrtcGetErrorString)

static const char kName[] = "lib_nvrtc";

static const char kSource[] = R"(
__device__ unsigned ivc_rtc_calls;
extern "C" __global__ void ivc_rtc_axpb(const float* x, float* y, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + b;
  if (i == 0) atomicAdd(&ivc_rtc_calls, 1u);
}
)";

// Compiles kSource for `arch` ("compute_90" gives PTX, "sm_90" a CUBIN).
static std::vector<char> compile(const std::string& arch, bool cubin) {
  nvrtcProgram prog = nullptr;
  RTC(nvrtcCreateProgram(&prog, kSource, "ivc_rtc.cu", 0, nullptr, nullptr));
  if (prog == nullptr) return {};
  const std::string opt = "--gpu-architecture=" + arch;
  const char* opts[] = {opt.c_str(), "--std=c++17"};
  const nvrtcResult r = nvrtcCompileProgram(prog, 2, opts);
  ++libcheck::checks;
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    nvrtcGetProgramLog(prog, log.data());
    libcheck::fail(__FILE__, __LINE__, "nvrtcCompileProgram: " + std::string(nvrtcGetErrorString(r)) + "\n" + log);
  }
  std::vector<char> out;
  size_t n = 0;
  if (cubin) {
    RTC(nvrtcGetCUBINSize(prog, &n));
    out.resize(n);
    if (n != 0) RTC(nvrtcGetCUBIN(prog, out.data()));
  } else {
    RTC(nvrtcGetPTXSize(prog, &n));
    out.resize(n);
    if (n != 0) RTC(nvrtcGetPTX(prog, out.data()));
  }
  RTC(nvrtcDestroyProgram(&prog));
  return out;
}

// Loads an image, runs the kernel twice on x and checks y and the launch counter.
static void run_image(const std::vector<char>& image, const char* what) {
  const int failed_before = libcheck::failed;
  const int n = 3000;
  CUmodule mod = nullptr;
  DRV(cuModuleLoadData(&mod, image.data()));
  if (mod == nullptr) return;
  CUfunction f = nullptr;
  DRV(cuModuleGetFunction(&f, mod, "ivc_rtc_axpb"));
  CUdeviceptr calls = 0;
  size_t calls_size = 0;
  DRV(cuModuleGetGlobal(&calls, &calls_size, mod, "ivc_rtc_calls"));
  EXPECT(calls_size == sizeof(unsigned));
  size_t off = 1, size = 0;
  DRV(cuFuncGetParamInfo(f, 2, &off, &size));
  EXPECT(off == 16 && size == 4);
  std::vector<float> x(n), y(n), want(n);
  for (int i = 0; i < n; ++i) x[i] = float(i % 100) - 50.0f;
  float a = 2.5f, b = -1.0f;
  for (int i = 0; i < n; ++i) want[i] = a * x[i] + b;
  CUdeviceptr dx = 0, dy = 0;
  DRV(cuMemAlloc(&dx, n * sizeof(float)));
  DRV(cuMemAlloc(&dy, n * sizeof(float)));
  if (f != nullptr && dx != 0 && dy != 0) {
    DRV(cuMemcpyHtoD(dx, x.data(), n * sizeof(float)));
    int count = n;
    void* args[] = {&dx, &dy, &a, &b, &count};
    for (int k = 0; k < 2; ++k) DRV(cuLaunchKernel(f, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr));
    DRV(cuCtxSynchronize());
    DRV(cuMemcpyDtoH(y.data(), dy, n * sizeof(float)));
    EXPECT(libcheck::same_bytes(y.data(), want.data(), n * sizeof(float)));
    unsigned launches = 0;
    if (calls != 0) DRV(cuMemcpyDtoH(&launches, calls, sizeof launches));
    EXPECT(launches == 2);
  }
  if (dx != 0) DRV(cuMemFree(dx));
  if (dy != 0) DRV(cuMemFree(dy));
  DRV(cuModuleUnload(mod));
  std::printf("%s: %s\n", what, libcheck::failed == failed_before ? "ok" : "FAILED");
}

int main(int argc, char** argv) {
  libcheck::parse_args(argc, argv, kName);
  int major = 0, minor = 0;
  RTC(nvrtcVersion(&major, &minor));
  EXPECT(major >= 13);
  // The runtime makes the primary context current; the driver API works in it.
  CK(cudaFree(nullptr));
  CUcontext ctx = nullptr;
  DRV(cuCtxGetCurrent(&ctx));
  EXPECT(ctx != nullptr);
  CUdevice dev = 0;
  DRV(cuCtxGetDevice(&dev));
  int cc_major = 0, cc_minor = 0;
  DRV(cuDeviceGetAttribute(&cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  DRV(cuDeviceGetAttribute(&cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  REQUIRE_OK(kName);
  const std::string cc = std::to_string(cc_major * 10 + cc_minor);

  const std::vector<char> ptx = compile("compute_" + cc, false);
  EXPECT(ptx.size() > 1 && std::string(ptx.data()).find(".entry ivc_rtc_axpb") != std::string::npos);
  if (ptx.size() > 1) run_image(ptx, "PTX, JIT-compiled by the driver");
  const std::vector<char> cubin = compile("sm_" + cc, true);
  EXPECT(cubin.size() > 4 && cubin[0] == 0x7f && cubin[1] == 'E');
  if (cubin.size() > 4) run_image(cubin, "CUBIN for the device's architecture");
  // The same program again (libraries such as cuDNN compile the same kernels over and over):
  // NVRTC may take it from libcuda's compile cache; the images are the same either way.
  const std::vector<char> ptx2 = compile("compute_" + cc, false);
  const std::vector<char> cubin2 = compile("sm_" + cc, true);
  EXPECT(ptx2 == ptx);
  EXPECT(cubin2 == cubin);
  if (cubin2.size() > 4) run_image(cubin2, "the same CUBIN compiled again");
  return libcheck::finish(kName);
}
