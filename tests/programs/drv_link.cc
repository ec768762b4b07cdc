// The JIT linker (cuLinkCreate / AddData / AddFile / Complete / Destroy), as
// Numba and programs built with -rdc use it: a kernel in one relocatable PTX
// (link_main.cu) calls a function only another input defines (link_lib.cu).
//   linked      both halves added (data and file), linked, loaded, launched:
//               every element CPU-checked; the logs are terminated strings and
//               the wall time a number;
//   unresolved  the kernel's half alone: cuLinkComplete fails, with an error log;
//   bad input   an unknown input type and a null input are INVALID_VALUE; text
//               that is not PTX fails at cuLinkAddData;
//   cubin       (--cubin) the function's half as a relocatable cubin.
// It prints the answers, which must be the same natively and through ivcuda.
//
//   drv_link --dir DIR_WITH_link_main.ptx_link_lib.ptx[_link_lib.cubin] [--cubin]
#include <cmath>
#include <string>
#include <vector>

#include "check.h"

namespace {

std::string g_dir;

struct Logs {
  char info[4096] = {};
  char error[4096] = {};
  float wall = -1.0f;
  CUjit_option opts[5] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER,
                          CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, CU_JIT_WALL_TIME};
  void* vals[5] = {};
  Logs() {
    vals[0] = info;
    vals[1] = reinterpret_cast<void*>(std::uintptr_t{sizeof info});
    vals[2] = error;
    vals[3] = reinterpret_cast<void*>(std::uintptr_t{sizeof error});
  }
  float wall_ms() const {
    float f;
    std::memcpy(&f, &vals[4], sizeof f);
    return f;
  }
};

// Runs the linked kernel over n elements and checks each against the CPU.
void run_linked(const void* image, const char* what) {
  CUmodule mod;
  OK(cuModuleLoadData(&mod, image));
  CUfunction f;
  OK(cuModuleGetFunction(&f, mod, "ivc_link_apply"));
  const int n = 1000;
  std::vector<float> h(n), back(n);
  for (int i = 0; i < n; ++i) h[i] = static_cast<float>(i) * 0.5f - 7.0f;
  CUdeviceptr d;
  OK(cuMemAlloc(&d, n * sizeof(float)));
  OK(cuMemcpyHtoD(d, h.data(), n * sizeof(float)));
  int nn = n;
  void* args[] = {&d, &nn};
  OK(cuLaunchKernel(f, (n + 127) / 128, 1, 1, 128, 1, 1, 0, nullptr, args, nullptr));
  OK(cuMemcpyDtoH(back.data(), d, n * sizeof(float)));
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += back[i] != 2.0f * h[i] + 1.0f;
  ++check::g_checks;
  if (wrong != 0) check::fail(__FILE__, __LINE__, std::to_string(wrong) + " elements wrong");
  std::printf("%s: %d of %d elements right\n", what, n - wrong, n);
  OK(cuMemFree(d));
  OK(cuModuleUnload(mod));
}

void linked() {
  Logs logs;
  CUlinkState s;
  OK(cuLinkCreate(5, logs.opts, logs.vals, &s));
  std::string main_ptx = check::read_file((g_dir + "/link_main.ptx").c_str());
  OK(cuLinkAddData(s, CU_JIT_INPUT_PTX, main_ptx.data(), main_ptx.size() + 1, "link_main.ptx", 0, nullptr,
                   nullptr));
  OK(cuLinkAddFile(s, CU_JIT_INPUT_PTX, (g_dir + "/link_lib.ptx").c_str(), 0, nullptr, nullptr));
  void* cubin = nullptr;
  size_t size = 0;
  OK(cuLinkComplete(s, &cubin, &size));
  EXPECT(cubin != nullptr && size > 0);
  EXPECT(std::strlen(logs.info) < sizeof logs.info && std::strlen(logs.error) == 0);
  const auto info_used = reinterpret_cast<std::uintptr_t>(logs.vals[1]);
  EXPECT(info_used <= sizeof logs.info);
  EXPECT(std::isfinite(logs.wall_ms()) && logs.wall_ms() >= 0.0f);
  std::printf("linked: complete, an image of %s bytes, error log empty\n", size > 0 ? "some" : "no");
  if (cubin != nullptr) run_linked(cubin, "linked");
  OK(cuLinkDestroy(s));
}

void unresolved() {
  Logs logs;
  CUlinkState s;
  OK(cuLinkCreate(5, logs.opts, logs.vals, &s));
  OK(cuLinkAddFile(s, CU_JIT_INPUT_PTX, (g_dir + "/link_main.ptx").c_str(), 0, nullptr, nullptr));
  void* cubin = nullptr;
  size_t size = 0;
  const CUresult r = cuLinkComplete(s, &cubin, &size);
  ++check::g_checks;
  if (r == CUDA_SUCCESS) check::fail(__FILE__, __LINE__, "an unresolved function linked");
  EXPECT(std::strstr(logs.error, "ivc_link_twice") != nullptr);
  std::printf("unresolved: cuLinkComplete answers %s; the error log names the function: %s\n", check::name(r),
              std::strstr(logs.error, "ivc_link_twice") != nullptr ? "yes" : "no");
  OK(cuLinkDestroy(s));
}

void bad_input() {
  CUlinkState s;
  OK(cuLinkCreate(0, nullptr, nullptr, &s));
  char text[] = "this is not PTX";
  const CUresult type = cuLinkAddData(s, static_cast<CUjitInputType>(99), text, sizeof text, "x", 0, nullptr, nullptr);
  const CUresult null = cuLinkAddData(s, CU_JIT_INPUT_PTX, nullptr, 16, "x", 0, nullptr, nullptr);
  const CUresult junk = cuLinkAddData(s, CU_JIT_INPUT_PTX, text, sizeof text, "junk", 0, nullptr, nullptr);
  const CUresult file = cuLinkAddFile(s, CU_JIT_INPUT_PTX, "/nonexistent/ivcuda.ptx", 0, nullptr, nullptr);
  EXPECT(type == CUDA_ERROR_INVALID_VALUE && null == CUDA_ERROR_INVALID_VALUE);
  EXPECT(junk != CUDA_SUCCESS && file != CUDA_SUCCESS);
  std::printf("bad input: unknown type %s, null data %s, not PTX %s, no such file %s\n", check::name(type),
              check::name(null), check::name(junk), check::name(file));
  OK(cuLinkDestroy(s));
}

void cubin_input() {
  Logs logs;
  CUlinkState s;
  OK(cuLinkCreate(5, logs.opts, logs.vals, &s));
  OK(cuLinkAddFile(s, CU_JIT_INPUT_PTX, (g_dir + "/link_main.ptx").c_str(), 0, nullptr, nullptr));
  const std::string lib = check::read_file((g_dir + "/link_lib.cubin").c_str());
  OK(cuLinkAddData(s, CU_JIT_INPUT_CUBIN, const_cast<char*>(lib.data()), lib.size(), "link_lib.cubin", 0, nullptr,
                   nullptr));
  void* cubin = nullptr;
  size_t size = 0;
  OK(cuLinkComplete(s, &cubin, &size));
  if (cubin != nullptr) run_linked(cubin, "cubin");
  OK(cuLinkDestroy(s));
}

}  // namespace

int main(int argc, char** argv) {
  const char* dir = check::arg(argc, argv, "--dir");
  if (dir == nullptr) {
    std::fprintf(stderr, "usage: drv_link --dir DIR [--cubin]\n");
    return 2;
  }
  g_dir = dir;
  OK(cuInit(0));
  CUdevice dev;
  OK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  linked();
  unresolved();
  bad_input();
  if (check::flag(argc, argv, "--cubin")) cubin_input();
  OK(cuDevicePrimaryCtxRelease(dev));
  return check::finish("drv_link");
}
