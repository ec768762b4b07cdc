// Modules from PTX and fatbins, parameter layout, globals, and the CPU test kernels.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "test_support.h"

using namespace ivcuda::gpu_double::test;

namespace {

struct Param {
  size_t offset, size;
};

std::vector<Param> params_of(CUfunction f) {
  std::vector<Param> out;
  for (size_t i = 0;; ++i) {
    Param p{};
    const CUresult r = cuFuncGetParamInfo(f, i, &p.offset, &p.size);
    if (r == CUDA_ERROR_INVALID_VALUE) break;
    CU_REQUIRE(r);
    out.push_back(p);
  }
  return out;
}

bool operator==(const Param& a, const Param& b) { return a.offset == b.offset && a.size == b.size; }

CUmodule load_kernels(const std::string& image) {
  CUmodule m = nullptr;
  CU_REQUIRE(cuModuleLoadData(&m, image.c_str()));
  return m;
}

CUfunction get(CUmodule m, const char* name) {
  CUfunction f = nullptr;
  CU_REQUIRE(cuModuleGetFunction(&f, m, name));
  return f;
}

// A 1D launch of f with the given arguments.
CUresult launch(CUfunction f, unsigned grid, unsigned block, std::vector<void*> args,
                CUstream s = nullptr) {
  return cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, s, args.data(), nullptr);
}

struct ScaleParams {
  float scale;
  int offset;
  double bias;
};

}  // namespace

TEST_CASE("PTX entries expose their parameters as the launch ABI lays them out",
          "[gpu_double][module]") {
  ScopedContext ctx;
  const std::string ptx = kernels_ptx();
  REQUIRE_KERNELS(ptx);
  CUmodule m = load_kernels(ptx);
  CHECK(params_of(get(m, "ivc_vec_add")) == std::vector<Param>{{0, 8}, {8, 8}, {16, 8}, {24, 4}});
  CHECK(params_of(get(m, "ivc_fill_u32")) == std::vector<Param>{{0, 8}, {8, 4}, {16, 8}});
  CHECK(params_of(get(m, "ivc_reduce_sum")) == std::vector<Param>{{0, 8}, {8, 8}, {16, 4}});
  // The by-value struct is 16 bytes aligned to 8; what follows starts after it.
  CHECK(params_of(get(m, "ivc_scale_struct")) == std::vector<Param>{{0, 16}, {16, 8}, {24, 4}});
  CHECK(params_of(get(m, "ivc_add_const")) == std::vector<Param>{{0, 8}, {8, 4}});
  CHECK(params_of(get(m, "ivc_spin_ns")) == std::vector<Param>{{0, 8}});
  CHECK(params_of(get(m, "ivc_fault")) == std::vector<Param>{{0, 8}});

  CUfunction f = nullptr;
  CU_REQUIRE_ERR(cuModuleGetFunction(&f, m, "ivc_missing"), CUDA_ERROR_NOT_FOUND);
  CU_REQUIRE_ERR(cuModuleGetFunction(&f, m, nullptr), CUDA_ERROR_INVALID_VALUE);
  size_t off = 0;
  CU_REQUIRE_ERR(cuFuncGetParamInfo(get(m, "ivc_fault"), 1, &off, nullptr),
                 CUDA_ERROR_INVALID_VALUE);
  const char* name = nullptr;
  CU_REQUIRE(cuFuncGetName(&name, get(m, "ivc_fault")));
  CHECK(std::string(name) == "ivc_fault");
  // A cache preference is accepted for every CUfunc_cache value.
  CU_REQUIRE(cuFuncSetCacheConfig(get(m, "ivc_fault"), CU_FUNC_CACHE_PREFER_SHARED));
  CU_REQUIRE(cuFuncSetCacheConfig(get(m, "ivc_fault"), CU_FUNC_CACHE_PREFER_EQUAL));
  CU_REQUIRE(cuModuleUnload(m));
}

TEST_CASE("parameter layout follows .align and array sizes", "[gpu_double][module]") {
  ScopedContext ctx;
  const char* ptx = R"(
.version 9.0
.target sm_90
.address_size 64
// a comment with .entry fake( inside
.visible .entry layout(
	.param .u8 layout_param_0,
	.param .align 16 .b8 layout_param_1[20],
	.param .u16 layout_param_2,
	.param .u64 .ptr .global .align 4 layout_param_3,
	.param .f32 layout_param_4
)
{
	ret;
}
.visible .entry noparams()
{
	ret;
}
)";
  CUmodule m = nullptr;
  CU_REQUIRE(cuModuleLoadData(&m, ptx));
  CUfunction f = get(m, "layout");
  CHECK(params_of(f) == std::vector<Param>{{0, 1}, {16, 20}, {36, 2}, {40, 8}, {48, 4}});
  CHECK(params_of(get(m, "noparams")).empty());
  CUfunction fake = nullptr;
  CU_REQUIRE_ERR(cuModuleGetFunction(&fake, m, "fake"), CUDA_ERROR_NOT_FOUND);
  CU_REQUIRE(cuModuleUnload(m));
}

TEST_CASE("module globals come from .global and .const with their initialisers",
          "[gpu_double][module]") {
  ScopedContext ctx;
  const char* ptx = R"(
.version 9.0
.target sm_90
.address_size 64
.global .align 4 .b8 tbl[4] = {1, 2, 3, 254};
.const .align 8 .f64 one = 0d3FF0000000000000;
.global .align 4 .s32 neg = -2;
.global .align 4 .u32 arr[] = {7, 8};
.global .align 8 .u64 zeroes[3];
.const .align 4 .f32 half = 0f3F000000;
.extern .global .align 4 .u32 elsewhere;
)";
  CUmodule m = nullptr;
  CU_REQUIRE(cuModuleLoadData(&m, ptx));
  auto global = [&](const char* name, size_t want_size) {
    CUdeviceptr p = 0;
    size_t size = 0;
    CU_REQUIRE(cuModuleGetGlobal(&p, &size, m, name));
    CHECK(size == want_size);
    std::vector<unsigned char> bytes(size);
    CU_REQUIRE(cuMemcpyDtoH(bytes.data(), p, size));
    return bytes;
  };
  CHECK(global("tbl", 4) == std::vector<unsigned char>{1, 2, 3, 254});
  const auto one = global("one", 8);
  double d = 0;
  std::memcpy(&d, one.data(), 8);
  CHECK(d == 1.0);
  const auto neg = global("neg", 4);
  int32_t n = 0;
  std::memcpy(&n, neg.data(), 4);
  CHECK(n == -2);
  const auto arr = global("arr", 8);
  uint32_t a[2];
  std::memcpy(a, arr.data(), 8);
  CHECK(a[0] == 7);
  CHECK(a[1] == 8);
  CHECK(global("zeroes", 24) == std::vector<unsigned char>(24, 0));
  const auto half = global("half", 4);
  float h = 0;
  std::memcpy(&h, half.data(), 4);
  CHECK(h == 0.5f);

  CUdeviceptr p = 0;
  CU_REQUIRE(cuModuleGetGlobal(&p, nullptr, m, "elsewhere"));  // as the real driver does
  CU_REQUIRE_ERR(cuModuleGetGlobal(&p, nullptr, m, "nowhere"), CUDA_ERROR_NOT_FOUND);
  CU_REQUIRE_ERR(cuModuleGetGlobal(&p, nullptr, m, nullptr), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuModuleGetGlobal(&p, nullptr, m, "neg"));
  CU_REQUIRE(cuModuleUnload(m));
  CUdeviceptr base = 0;
  CU_REQUIRE_ERR(cuMemGetAddressRange(&base, nullptr, p), CUDA_ERROR_NOT_FOUND);
}

TEST_CASE("images that are not PTX with sm_90-compatible text are refused",
          "[gpu_double][module]") {
  ScopedContext ctx;
  CUmodule m = nullptr;
  CU_REQUIRE_ERR(cuModuleLoadData(&m, "hello, world"), CUDA_ERROR_INVALID_IMAGE);
  CU_REQUIRE_ERR(cuModuleLoadData(&m, ""), CUDA_ERROR_INVALID_IMAGE);
  CU_REQUIRE_ERR(cuModuleLoadData(&m, nullptr), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuModuleLoadData(nullptr, "x"), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuModuleLoadData(&m, ".version 9.0\n.target sm_100\n"), CUDA_ERROR_INVALID_PTX);
  CU_REQUIRE_ERR(cuModuleLoadData(&m, ".version 9.0\n.target sm_90\n.entry broken( .param"),
                 CUDA_ERROR_INVALID_PTX);
  CU_REQUIRE_ERR(cuModuleLoadData(&m, ".version 9.0\n.target sm_90\n.entry x() {"),
                 CUDA_ERROR_INVALID_PTX);

  // The documented JIT outputs are honoured: an error log explains the refusal.
  char error_log[256] = "unchanged";
  char info_log[64] = "unchanged";
  CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_INFO_LOG_BUFFER,  CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                         CU_JIT_WALL_TIME,        CU_JIT_OPTIMIZATION_LEVEL};
  void* vals[] = {error_log, reinterpret_cast<void*>(uintptr_t{sizeof error_log}),
                  info_log,  reinterpret_cast<void*>(uintptr_t{sizeof info_log}),
                  nullptr,   reinterpret_cast<void*>(uintptr_t{3})};
  CU_REQUIRE_ERR(cuModuleLoadDataEx(&m, "garbage", 6, opts, vals), CUDA_ERROR_INVALID_IMAGE);
  if (!on_double()) return;  // what a real JIT logs was not checked
  CHECK(std::string(error_log).find("test double") != std::string::npos);
  CHECK(std::string(info_log).empty());
  CHECK(reinterpret_cast<uintptr_t>(vals[1]) == std::strlen(error_log) + 1);
  CHECK(reinterpret_cast<uintptr_t>(vals[3]) == 0);
  CU_REQUIRE_ERR(cuModuleLoadDataEx(&m, "garbage", 1, nullptr, vals), CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("fatbins with uncompressed PTX load, others are refused",
          "[gpu_double][double_only][module]") {
  ScopedContext ctx;
  const std::string fatbin = kernels_fatbin();
  REQUIRE_KERNELS(fatbin);
  uint32_t magic = 0;
  std::memcpy(&magic, fatbin.data(), 4);
  REQUIRE(magic == 0xBA55ED50u);

  CUmodule m = nullptr;
  CU_REQUIRE(cuModuleLoadFatBinary(&m, fatbin.data()));
  CHECK(params_of(get(m, "ivc_scale_struct")) == std::vector<Param>{{0, 16}, {16, 8}, {24, 4}});
  CU_REQUIRE(cuModuleUnload(m));

  // SASS cannot run on the double (a real driver would load a good cubin).
  const unsigned char elf[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
  CU_REQUIRE_ERR(cuModuleLoadData(&m, elf), CUDA_ERROR_NO_BINARY_FOR_GPU);

  // The wrapper nvcc registers with cudart: magic, version, pointer to the fatbin.
  struct {
    uint32_t magic;
    uint32_t version;
    const void* data;
    const void* unused;
  } wrapper{0x466243B1u, 1, fatbin.data(), nullptr};
  CU_REQUIRE(cuModuleLoadData(&m, &wrapper));
  CUfunction f = get(m, "ivc_vec_add");
  CHECK(params_of(f).size() == 4);
  CU_REQUIRE(cuModuleUnload(m));

  // The same fatbin with its PTX marked compressed, and with a size that overruns.
  std::string compressed = fatbin;
  const size_t flags_at = 16 + 0x28;
  compressed[flags_at + 1] = static_cast<char>(compressed[flags_at + 1] | 0x80);
  CU_REQUIRE_ERR(cuModuleLoadData(&m, compressed.data()), CUDA_ERROR_NO_BINARY_FOR_GPU);
  std::string overrun = fatbin;
  const uint64_t huge = 1u << 20;
  std::memcpy(overrun.data() + 16 + 8, &huge, 8);
  CU_REQUIRE_ERR(cuModuleLoadData(&m, overrun.data()), CUDA_ERROR_INVALID_IMAGE);
}

TEST_CASE("the CPU kernels compute what the CUDA kernels compute", "[gpu_double][module][kernel]") {
  ScopedContext ctx;
  const std::string ptx = kernels_ptx();
  REQUIRE_KERNELS(ptx);
  CUmodule m = load_kernels(ptx);
  constexpr int kN = 1000;
  std::vector<float> a(kN), b(kN), c(kN, -1.0f);
  for (int i = 0; i < kN; ++i) {
    a[i] = static_cast<float>(i) * 0.5f;
    b[i] = static_cast<float>(kN - i);
  }
  CUdeviceptr da = 0, db = 0, dc = 0;
  CU_REQUIRE(cuMemAlloc(&da, kN * sizeof(float)));
  CU_REQUIRE(cuMemAlloc(&db, kN * sizeof(float)));
  CU_REQUIRE(cuMemAlloc(&dc, kN * sizeof(float)));
  CU_REQUIRE(cuMemcpyHtoD(da, a.data(), kN * sizeof(float)));
  CU_REQUIRE(cuMemcpyHtoD(db, b.data(), kN * sizeof(float)));
  CU_REQUIRE(cuMemcpyHtoD(dc, c.data(), kN * sizeof(float)));
  int n = kN;

  SECTION("ivc_vec_add, with a grid that covers everything and one that does not") {
    CU_REQUIRE(launch(get(m, "ivc_vec_add"), 4, 256, {&da, &db, &dc, &n}));
    CU_REQUIRE(cuMemcpyDtoH(c.data(), dc, kN * sizeof(float)));
    for (int i = 0; i < kN; ++i) REQUIRE(c[i] == a[i] + b[i]);
    // 2 x 128 threads reach only the first 256 elements, as on a GPU.
    CU_REQUIRE(cuMemsetD32(dc, 0, kN));
    CU_REQUIRE(launch(get(m, "ivc_vec_add"), 2, 128, {&da, &db, &dc, &n}));
    CU_REQUIRE(cuMemcpyDtoH(c.data(), dc, kN * sizeof(float)));
    CHECK(c[255] == a[255] + b[255]);
    CHECK(c[256] == 0.0f);
  }
  SECTION("ivc_fill_u32 fills all n with a grid-stride loop") {
    unsigned value = 0xC0FFEE;
    unsigned long long count = kN - 1;
    CU_REQUIRE(launch(get(m, "ivc_fill_u32"), 1, 32, {&dc, &value, &count}));
    std::vector<unsigned> u(kN);
    CU_REQUIRE(cuMemcpyDtoH(u.data(), dc, kN * sizeof(unsigned)));
    for (int i = 0; i < kN - 1; ++i) REQUIRE(u[i] == 0xC0FFEEu);
    unsigned last_want = 0;
    std::memcpy(&last_want, &c[kN - 1], sizeof last_want);
    CHECK(u[kN - 1] == last_want);
  }
  SECTION("ivc_reduce_sum") {
    std::vector<float> ones(kN);
    for (int i = 0; i < kN; ++i) ones[i] = static_cast<float>(i + 1);
    CU_REQUIRE(cuMemcpyHtoD(da, ones.data(), kN * sizeof(float)));
    CU_REQUIRE(launch(get(m, "ivc_reduce_sum"), 1, 256, {&da, &db, &n}));
    float sum = 0;
    CU_REQUIRE(cuMemcpyDtoH(&sum, db, sizeof sum));
    CHECK(sum == 500500.0f);  // exact in float
  }
  SECTION("ivc_scale_struct takes its struct by value") {
    ScaleParams sp{2.0f, 3, 0.25};
    CU_REQUIRE(launch(get(m, "ivc_scale_struct"), 8, 128, {&sp, &da, &n}));
    std::vector<float> out(kN);
    CU_REQUIRE(cuMemcpyDtoH(out.data(), da, kN * sizeof(float)));
    for (int i = 0; i < kN; ++i) REQUIRE(out[i] == static_cast<float>(a[i] * 2.0f + 3.0f + 0.25));
  }
  SECTION("ivc_add_const reads a __constant__ and counts launches in a __device__") {
    CUdeviceptr addend = 0, count = 0;
    size_t addend_size = 0, count_size = 0;
    CU_REQUIRE(cuModuleGetGlobal(&addend, &addend_size, m, "ivc_const_addend"));
    CU_REQUIRE(cuModuleGetGlobal(&count, &count_size, m, "ivc_launch_count"));
    CHECK(addend_size == 4);
    CHECK(count_size == 4);
    float initial = 0;
    CU_REQUIRE(cuMemcpyDtoH(&initial, addend, 4));
    CHECK(initial == 1.5f);  // the initialiser in test_kernels.cu

    CU_REQUIRE(launch(get(m, "ivc_add_const"), 4, 256, {&da, &n}));
    const float two = 2.0f;
    CU_REQUIRE(cuMemcpyHtoD(addend, &two, 4));
    CU_REQUIRE(launch(get(m, "ivc_add_const"), 4, 256, {&da, &n}));
    std::vector<float> out(kN);
    CU_REQUIRE(cuMemcpyDtoH(out.data(), da, kN * sizeof(float)));
    for (int i = 0; i < kN; ++i) REQUIRE(out[i] == a[i] + 1.5f + 2.0f);
    unsigned launches = 0;
    CU_REQUIRE(cuMemcpyDtoH(&launches, count, 4));
    CHECK(launches == 2);
  }
  SECTION("ivc_spin_ns takes device time that events measure") {
    CUevent start = nullptr, stop = nullptr;
    CU_REQUIRE(cuEventCreate(&start, 0));
    CU_REQUIRE(cuEventCreate(&stop, 0));
    unsigned long long ns = 5'000'000;
    CU_REQUIRE(cuEventRecord(start, nullptr));
    CU_REQUIRE(launch(get(m, "ivc_spin_ns"), 1, 1, {&ns}));
    CU_REQUIRE(cuEventRecord(stop, nullptr));
    CU_REQUIRE(cuEventSynchronize(stop));
    float ms = 0;
    CU_REQUIRE(cuEventElapsedTime(&ms, start, stop));
    CHECK(ms >= 4.9f);
  }
  SECTION("parameters can come through the extra buffer") {
    // Packed at the offsets the driver reports, exactly as long as the parameters.
    unsigned char packed[28];
    std::memcpy(packed + 0, &da, 8);
    std::memcpy(packed + 8, &db, 8);
    std::memcpy(packed + 16, &dc, 8);
    std::memcpy(packed + 24, &n, 4);
    size_t size = sizeof packed;
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    CU_REQUIRE(
        cuLaunchKernel(get(m, "ivc_vec_add"), 4, 1, 1, 256, 1, 1, 0, nullptr, nullptr, extra));
    CU_REQUIRE(cuMemcpyDtoH(c.data(), dc, kN * sizeof(float)));
    for (int i = 0; i < kN; ++i) REQUIRE(c[i] == a[i] + b[i]);
    size = sizeof packed + 4;  // longer than the parameters: refused as the driver does
    CU_REQUIRE_ERR(
        cuLaunchKernel(get(m, "ivc_vec_add"), 4, 1, 1, 256, 1, 1, 0, nullptr, nullptr, extra),
        CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
  }
  CU_REQUIRE(cuModuleUnload(m));
}

TEST_CASE("launches are checked against device limits and the stream", "[gpu_double][module]") {
  ScopedContext ctx;
  const std::string ptx = kernels_ptx();
  REQUIRE_KERNELS(ptx);
  CUmodule m = load_kernels(ptx);
  CUfunction f = get(m, "ivc_fill_u32");
  CUdeviceptr p = 0;
  CU_REQUIRE(cuMemAlloc(&p, 64));
  unsigned value = 1;
  unsigned long long n = 16;
  void* args[] = {&p, &value, &n};
  auto go = [&](unsigned gx, unsigned bx, unsigned by, unsigned bz, unsigned shared,
                CUstream s = nullptr) {
    return cuLaunchKernel(f, gx, 1, 1, bx, by, bz, shared, s, args, nullptr);
  };
  CU_REQUIRE(go(1, 1024, 1, 1, 0));
  CU_REQUIRE_ERR(go(1, 1025, 1, 1, 0), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(go(1, 32, 32, 2, 0), CUDA_ERROR_INVALID_VALUE);  // 2048 threads
  CU_REQUIRE_ERR(go(1, 1, 1, 65, 0), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(go(0, 32, 1, 1, 0), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuLaunchKernel(f, 1, 65536, 1, 32, 1, 1, 0, nullptr, args, nullptr),
                 CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr),
                 CUDA_ERROR_INVALID_VALUE);
  // A stream of another context: refused for launches (copies accept it).
  CUcontext other = nullptr;
  CU_REQUIRE(cuCtxCreate(&other, nullptr, 0, 0));
  CUstream foreign = nullptr;
  CU_REQUIRE(cuStreamCreate(&foreign, 0));
  CU_REQUIRE(cuCtxPopCurrent(nullptr));
  CU_REQUIRE_ERR(go(1, 32, 1, 1, 0, foreign), CUDA_ERROR_INVALID_HANDLE);
  CU_REQUIRE(cuCtxDestroy(other));

  // Dynamic shared memory: 48 KiB unless the function opts in to more.
  CU_REQUIRE(go(1, 32, 1, 1, 48 * 1024));
  CU_REQUIRE_ERR(go(1, 32, 1, 1, 64 * 1024), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 64 * 1024));
  CU_REQUIRE(go(1, 32, 1, 1, 64 * 1024));
  CU_REQUIRE_ERR(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1 << 20),
                 CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_NUM_REGS, 8), CUDA_ERROR_INVALID_VALUE);

  int v = 0;
  CU_REQUIRE(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f));
  CHECK(v == 1024);
  CU_REQUIRE(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f));
  CHECK(v == 64 * 1024);
  CU_REQUIRE(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_NUM_REGS, f));
  CHECK(v > 0);
  CU_REQUIRE(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, get(m, "ivc_reduce_sum")));
  CHECK(v == 1024 * 4);  // its __shared__ float partial[1024]
  CU_REQUIRE(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_PTX_VERSION, f));
  CHECK(v == 90);
  CU_REQUIRE_ERR(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX, f), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuModuleUnload(m));
}

TEST_CASE("a kernel without a CPU version is refused, naming the double",
          "[gpu_double][double_only][module]") {
  ScopedContext ctx;
  CUmodule m = nullptr;
  CU_REQUIRE(cuModuleLoadData(&m,
                              ".version 9.0\n.target sm_90\n.address_size 64\n"
                              ".visible .entry mystery(.param .u32 p)\n{\n ret;\n}\n"));
  unsigned x = 0;
  CU_REQUIRE_ERR(launch(get(m, "mystery"), 1, 1, {&x}), CUDA_ERROR_NOT_SUPPORTED);
  CU_REQUIRE(cuModuleUnload(m));
}

// A fault poisons the device for the rest of the process (the real driver then refuses even
// cuCtxCreate), so each faulting scenario runs in a child process of its own. The child
// reports the first step that went wrong through its exit status.
namespace {

class Steps {
 public:
  void expect(CUresult got, CUresult want) {
    ++step_;
    if (got == want) return;
    std::fprintf(stderr, "step %d: got %s, want %s\n", step_, error_name(got).c_str(),
                 error_name(want).c_str());
    std::_Exit(step_);
  }

 private:
  int step_ = 0;
};

template <class Body>
int in_child(Body body) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    body();
    std::_Exit(0);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("a kernel touching memory outside every allocation poisons the device",
          "[gpu_double][module][kernel]") {
  const std::string ptx = kernels_ptx();
  REQUIRE_KERNELS(ptx);
  const int failed_step = in_child([&] {
    Steps s;
    CUcontext ctx = nullptr, other = nullptr;
    CUmodule m = nullptr;
    CUfunction fault = nullptr;
    CUdeviceptr good = 0, wild = 0x10, p = 0;
    int v = 0;
    s.expect(cuInit(0), CUDA_SUCCESS);
    s.expect(cuCtxCreate(&ctx, nullptr, 0, 0), CUDA_SUCCESS);
    s.expect(cuModuleLoadData(&m, ptx.c_str()), CUDA_SUCCESS);
    s.expect(cuModuleGetFunction(&fault, m, "ivc_fault"), CUDA_SUCCESS);
    s.expect(cuMemAlloc(&good, sizeof(int)), CUDA_SUCCESS);
    void* good_args[] = {&good};
    void* wild_args[] = {&wild};
    s.expect(cuLaunchKernel(fault, 1, 1, 1, 1, 1, 1, 0, nullptr, good_args, nullptr), CUDA_SUCCESS);
    s.expect(cuMemcpyDtoH(&v, good, sizeof v), CUDA_SUCCESS);
    s.expect(v == 42 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN, CUDA_SUCCESS);
    s.expect(cuCtxSynchronize(), CUDA_SUCCESS);
    // Asynchronous: the launch itself succeeds; the fault surfaces at the next sync and
    // sticks.
    s.expect(cuLaunchKernel(fault, 1, 1, 1, 1, 1, 1, 0, nullptr, wild_args, nullptr), CUDA_SUCCESS);
    s.expect(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    s.expect(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    s.expect(cuStreamSynchronize(nullptr), CUDA_ERROR_ILLEGAL_ADDRESS);
    s.expect(cuMemAlloc(&p, 16), CUDA_ERROR_ILLEGAL_ADDRESS);
    s.expect(cuMemcpyDtoH(&v, good, sizeof v), CUDA_ERROR_ILLEGAL_ADDRESS);
    s.expect(cuLaunchKernel(fault, 1, 1, 1, 1, 1, 1, 0, nullptr, good_args, nullptr),
             CUDA_ERROR_ILLEGAL_ADDRESS);
    s.expect(cuCtxCreate(&other, nullptr, 0, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
  });
  CHECK(failed_step == 0);
}

TEST_CASE("a misaligned access faults too", "[gpu_double][module][kernel]") {
  const std::string ptx = kernels_ptx();
  REQUIRE_KERNELS(ptx);
  const int failed_step = in_child([&] {
    Steps s;
    CUcontext ctx = nullptr;
    CUmodule m = nullptr;
    CUfunction fault = nullptr;
    CUdeviceptr p = 0;
    s.expect(cuInit(0), CUDA_SUCCESS);
    s.expect(cuCtxCreate(&ctx, nullptr, 0, 0), CUDA_SUCCESS);
    s.expect(cuModuleLoadData(&m, ptx.c_str()), CUDA_SUCCESS);
    s.expect(cuModuleGetFunction(&fault, m, "ivc_fault"), CUDA_SUCCESS);
    s.expect(cuMemAlloc(&p, 16), CUDA_SUCCESS);
    CUdeviceptr odd = p + 1;
    void* args[] = {&odd};
    s.expect(cuLaunchKernel(fault, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr), CUDA_SUCCESS);
    s.expect(cuCtxSynchronize(), CUDA_ERROR_MISALIGNED_ADDRESS);
    s.expect(cuMemFree(p), CUDA_ERROR_MISALIGNED_ADDRESS);
  });
  CHECK(failed_step == 0);
}
