// Context-independent loading: libraries loaded before any context exists
// (as the CUDA 13 runtime loads its fatbins), then used in the primary
// context and in a second context, each with its own copy of the globals.
//   drv_library --fatbin test_kernels.fatbin --ptx test_kernels.ptx [--cross-context-only]
// Prints only what native and ivcuda runs must agree on.
#include <algorithm>
#include <fstream>
#include <iterator>

#include <string>

#include "check.h"

namespace {

std::vector<char> read_file(const char* path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::vector<float> run_kernel(CUkernel k, float start, int n) {
  std::vector<float> host(static_cast<size_t>(n), start);
  CUdeviceptr d = 0;
  OK(cuMemAlloc(&d, host.size() * sizeof(float)));
  OK(cuMemcpyHtoD(d, host.data(), host.size() * sizeof(float)));
  void* args[] = {&d, &n};
  // A CUkernel is accepted wherever a CUfunction is: cudart launches so.
  OK(cuLaunchKernel(reinterpret_cast<CUfunction>(k), (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr));
  OK(cuCtxSynchronize());
  OK(cuMemcpyDtoH(host.data(), d, host.size() * sizeof(float)));
  OK(cuMemFree(d));
  return host;
}

std::vector<float> run_add_const(CUlibrary lib, float start, int n) {
  CUkernel k = nullptr;
  OK(cuLibraryGetKernel(&k, lib, "ivc_add_const"));
  return run_kernel(k, start, n);
}

bool all_equal(const std::vector<float>& v, float want) {
  for (float x : v)
    if (x != want) return false;
  return !v.empty();
}

}  // namespace

int main(int argc, char** argv) {
  const char* fatbin = check::arg(argc, argv, "--fatbin");
  const char* ptx = check::arg(argc, argv, "--ptx");
  if (fatbin == nullptr || ptx == nullptr) {
    std::fprintf(stderr, "usage: drv_library --fatbin FILE --ptx FILE\n");
    return 2;
  }
  OK(cuInit(0));
  CUdevice d;
  OK(cuDeviceGet(&d, 0));
  if (check::g_failures != 0) return check::finish("drv_library");
  bool cross_only = false;
  for (int i = 1; i < argc; ++i) cross_only |= std::strcmp(argv[i], "--cross-context-only") == 0;
  if (cross_only) {
    // Only a kernel taken with a context current and launched in another (no
    // kernel taken before a context existed, which would hide a missing
    // resolution): what cuBLAS does across devices.
    CUcontext primary, second;
    OK(cuDevicePrimaryCtxRetain(&primary, d));
    OK(cuCtxSetCurrent(primary));
    CUlibrary lib = nullptr;
    OK(cuLibraryLoadFromFile(&lib, ptx, nullptr, nullptr, 0, nullptr, nullptr, 0));
    CUkernel k = nullptr;
    OK(cuLibraryGetKernel(&k, lib, "ivc_add_const"));
    EXPECT(all_equal(run_kernel(k, 1.0f, 300), 2.5f));
    OK(cuCtxCreate(&second, nullptr, 0, d));
    // First use in this context: the library is loaded here by the launch.
    EXPECT(all_equal(run_kernel(k, 1.0f, 300), 2.5f));
    CUdeviceptr addend = 0;
    size_t bytes = 0;
    OK(cuLibraryGetGlobal(&addend, &bytes, lib, "ivc_const_addend"));
    const float changed = 10.0f;
    OK(cuMemcpyHtoD(addend, &changed, sizeof changed));
    EXPECT(all_equal(run_kernel(k, 1.0f, 300), 11.0f));  // this context's function and globals
    OK(cuCtxDestroy(second));
    OK(cuCtxSetCurrent(primary));
    EXPECT(all_equal(run_kernel(k, 1.0f, 300), 2.5f));
    OK(cuLibraryUnload(lib));
    OK(cuDevicePrimaryCtxRelease(d));
    return check::finish("drv_library --cross-context-only");
  }

  // No context is current: both libraries load all the same. The image is
  // freed at once: without CU_LIBRARY_BINARY_IS_PRESERVED the driver keeps
  // its own copy.
  CUcontext none = nullptr;
  OK(cuCtxGetCurrent(&none));
  EXPECT(none == nullptr);
  CUlibrary lib = nullptr, lib_ptx = nullptr;
  {
    std::vector<char> image = read_file(fatbin);
    EXPECT(!image.empty());
    OK(cuLibraryLoadData(&lib, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
    std::fill(image.begin(), image.end(), '\0');
  }
  OK(cuLibraryLoadFromFile(&lib_ptx, ptx, nullptr, nullptr, 0, nullptr, nullptr, 0));
  // Kernels are context-independent too: cudart takes the kernel of its
  // first launch before it makes the primary context current.
  CUkernel early = nullptr;
  OK(cuLibraryGetKernel(&early, lib, "ivc_vec_add"));

  // The primary context, made current only now.
  CUcontext primary;
  OK(cuDevicePrimaryCtxRetain(&primary, d));
  OK(cuCtxSetCurrent(primary));

  // Kernels, their parameters and launches.
  CUkernel add = nullptr;
  OK(cuLibraryGetKernel(&add, lib, "ivc_vec_add"));
  CUkernel missing = nullptr;
  EXPECT_RES(CUDA_ERROR_NOT_FOUND, cuLibraryGetKernel(&missing, lib, "no_such_kernel"));
  size_t off = 0, size = 0;
  OK(cuKernelGetParamInfo(add, 3, &off, &size));
  EXPECT(off == 24 && size == 4);
  OK(cuKernelGetParamInfo(early, 3, &off, &size));
  EXPECT(off == 24 && size == 4);
  CUlibrary owner = nullptr;
  OK(cuKernelGetLibrary(&owner, add));
  EXPECT(owner == lib);
  OK(cuKernelGetLibrary(&owner, early));
  EXPECT(owner == lib);
  CUfunction add_fn = nullptr;
  OK(cuKernelGetFunction(&add_fn, add));
  int threads = 0;
  OK(cuKernelGetAttribute(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, add, d));
  EXPECT(threads >= 256);
  OK(cuKernelSetCacheConfig(add, CU_FUNC_CACHE_PREFER_SHARED, d));
  unsigned count = 0;
  OK(cuLibraryGetKernelCount(&count, lib));
  EXPECT(count >= 5);
  std::vector<CUkernel> all(count);
  OK(cuLibraryEnumerateKernels(all.data(), count, lib));
  EXPECT(std::find(all.begin(), all.end(), add) != all.end());
  // Every enumerated kernel has its name.
  std::vector<std::string> names;
  for (CUkernel k : all) {
    const char* kn = nullptr;
    OK(cuKernelGetName(&kn, k));
    if (kn != nullptr) names.emplace_back(kn);
  }
  EXPECT(names.size() == all.size() && std::find(names.begin(), names.end(), "ivc_vec_add") != names.end());

  const int n = 1000;
  std::vector<float> a(n), b(n), c(n);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = static_cast<float>(2 * i);
  }
  CUdeviceptr da, db, dc;
  OK(cuMemAlloc(&da, n * 4));
  OK(cuMemAlloc(&db, n * 4));
  OK(cuMemAlloc(&dc, n * 4));
  OK(cuMemcpyHtoD(da, a.data(), n * 4));
  OK(cuMemcpyHtoD(db, b.data(), n * 4));
  int nn = n;
  void* args[] = {&da, &db, &dc, &nn};
  OK(cuLaunchKernel(add_fn, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  OK(cuCtxSynchronize());
  OK(cuMemcpyDtoH(c.data(), dc, n * 4));
  bool good = true;
  for (int i = 0; i < n; ++i) good &= c[i] == static_cast<float>(3 * i);
  EXPECT(good);
  OK(cuMemsetD32(dc, 0, n));
  OK(cuLaunchKernel(reinterpret_cast<CUfunction>(early), (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  OK(cuCtxSynchronize());
  OK(cuMemcpyDtoH(c.data(), dc, n * 4));
  good = true;
  for (int i = 0; i < n; ++i) good &= c[i] == static_cast<float>(3 * i);
  EXPECT(good);
  OK(cuMemFree(da));
  OK(cuMemFree(db));
  OK(cuMemFree(dc));

  // Globals: the __constant__ the kernel adds, from the fatbin and the PTX.
  CUdeviceptr addend = 0;
  size_t bytes = 0;
  OK(cuLibraryGetGlobal(&addend, &bytes, lib, "ivc_const_addend"));
  EXPECT(bytes == sizeof(float));
  float value = 0;
  OK(cuMemcpyDtoH(&value, addend, sizeof value));
  EXPECT(value == 1.5f);
  CUdeviceptr unused = 0;
  EXPECT_RES(CUDA_ERROR_NOT_FOUND, cuLibraryGetGlobal(&unused, &bytes, lib, "no_such_global"));
  EXPECT(all_equal(run_add_const(lib, 1.0f, 300), 2.5f));
  EXPECT(all_equal(run_add_const(lib_ptx, 2.0f, 300), 3.5f));
  CUmodule in_primary = nullptr;
  OK(cuLibraryGetModule(&in_primary, lib));
  CUkernel taken_in_primary = nullptr;
  OK(cuLibraryGetKernel(&taken_in_primary, lib, "ivc_add_const"));

  // A second context loads the library again: its own module, its own
  // copy of the constant.
  CUcontext second;
  OK(cuCtxCreate(&second, nullptr, 0, d));
  CUmodule in_second = nullptr;
  OK(cuLibraryGetModule(&in_second, lib));
  EXPECT(in_second != nullptr && in_second != in_primary);
  CUdeviceptr addend2 = 0;
  OK(cuLibraryGetGlobal(&addend2, &bytes, lib, "ivc_const_addend"));
  const float changed = 10.0f;
  OK(cuMemcpyHtoD(addend2, &changed, sizeof changed));
  EXPECT(all_equal(run_add_const(lib, 1.0f, 300), 11.0f));
  // A CUkernel is context-independent: the one taken in the primary context
  // runs in this one as this context's function (cuBLAS uses one kernel
  // handle in every device's context).
  EXPECT(all_equal(run_kernel(taken_in_primary, 1.0f, 300), 11.0f));
  OK(cuCtxPopCurrent(nullptr));
  OK(cuCtxGetCurrent(&none));
  EXPECT(none == primary);
  EXPECT(all_equal(run_add_const(lib, 1.0f, 300), 2.5f));

  // Unloading frees the library in every context; bad handles are refused.
  OK(cuLibraryUnload(lib));
  OK(cuLibraryUnload(lib_ptx));
  CUkernel k = nullptr;
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuLibraryGetKernel(nullptr, lib_ptx, "ivc_vec_add"));
  EXPECT_RES(CUDA_ERROR_INVALID_HANDLE, cuLibraryGetKernel(&k, nullptr, "ivc_vec_add"));
  EXPECT_RES(CUDA_ERROR_INVALID_HANDLE, cuLibraryUnload(nullptr));
  CUlibrary never = nullptr;
  EXPECT_RES(CUDA_ERROR_FILE_NOT_FOUND,
             cuLibraryLoadFromFile(&never, "/nonexistent/ivcuda.ptx", nullptr, nullptr, 0, nullptr, nullptr, 0));

  OK(cuCtxDestroy(second));
  OK(cuDevicePrimaryCtxRelease(d));
  return check::finish("drv_library");
}
