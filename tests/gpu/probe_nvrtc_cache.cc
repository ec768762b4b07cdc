// A probe for the GPU machine (not a test, not product code): how NVRTC uses the
// compile-cache export table the real driver hands out (UUID da9151d3..., see
// ../shared/reference/cuda13-libraries-contract.md), which ivcuda refuses today.
// It takes the driver's table, puts a logging forwarder in each function slot,
// then compiles kernels with NVRTC: one source twice, another once, to CUBIN
// and to PTX. Each slot call prints its six integer arguments, the first
// bytes behind any that look like pointers before and after the call, and the
// return value.
//   g++ -O1 -std=c++20 probe_nvrtc_cache.cc -I/usr/local/cuda/include
//       -L/usr/local/cuda/lib64 -lnvrtc -ldl -o probe && ./probe
#include <cuda.h>
#include <dlfcn.h>
#include <nvrtc.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace {

using u64 = std::uint64_t;
using Fn = u64 (*)(u64, u64, u64, u64, u64, u64);
Fn g_orig[8];
int g_depth = 0;

// Up to n bytes at p, read without faulting (another address space's rules).
bool peek(u64 p, unsigned char* out, size_t n) {
  if (p < 0x10000) return false;
  iovec local{out, n}, remote{reinterpret_cast<void*>(p), n};
  return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(n);
}

void dump(const char* when, int i, u64 v) {
  unsigned char b[48];
  if (!peek(v, b, sizeof b)) return;
  std::printf("      %s arg%d @%#llx:", when, i, static_cast<unsigned long long>(v));
  for (unsigned char c : b) std::printf(" %02x", c);
  std::printf("  |");
  for (unsigned char c : b) std::putchar(c >= 32 && c < 127 ? c : '.');
  std::printf("|\n");
}

template <int K>
u64 forward(u64 a, u64 b, u64 c, u64 d, u64 e, u64 f) {
  const u64 args[6] = {a, b, c, d, e, f};
  std::printf("  slot %d called (depth %d): %#llx %#llx %#llx %#llx %#llx %#llx\n", K, g_depth,
              (unsigned long long)a, (unsigned long long)b, (unsigned long long)c, (unsigned long long)d,
              (unsigned long long)e, (unsigned long long)f);
  for (int i = 0; i < 6; ++i) dump("before", i, args[i]);
  std::fflush(stdout);
  ++g_depth;
  const u64 r = g_orig[K](a, b, c, d, e, f);
  --g_depth;
  std::printf("  slot %d returned %#llx\n", K, (unsigned long long)r);
  for (int i = 0; i < 6; ++i) dump("after", i, args[i]);
  std::fflush(stdout);
  return r;
}

Fn g_forwarders[8] = {nullptr, forward<1>, forward<2>, forward<3>, forward<4>, forward<5>, forward<6>, forward<7>};

void compile(const char* what, const char* src, bool cubin) {
  nvrtcProgram p;
  if (nvrtcCreateProgram(&p, src, "probe.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS) return;
  const char* opts_cubin[] = {"-arch=sm_90"};
  const char* opts_ptx[] = {"-arch=compute_90"};
  std::printf("== compile %s (%s)\n", what, cubin ? "cubin" : "ptx");
  std::fflush(stdout);
  const nvrtcResult r = nvrtcCompileProgram(p, 1, cubin ? opts_cubin : opts_ptx);
  size_t n = 0;
  if (cubin)
    nvrtcGetCUBINSize(p, &n);
  else
    nvrtcGetPTXSize(p, &n);
  std::printf("== %s: %s, %zu bytes of %s\n", what, nvrtcGetErrorString(r), n, cubin ? "cubin" : "ptx");
  nvrtcDestroyProgram(&p);
}

}  // namespace

int main() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) return 1;
  auto init = reinterpret_cast<CUresult (*)(unsigned)>(dlsym(lib, "cuInit"));
  auto get = reinterpret_cast<CUresult (*)(const void**, const CUuuid*)>(dlsym(lib, "cuGetExportTable"));
  if (init == nullptr || get == nullptr || init(0) != CUDA_SUCCESS) return 1;
  const unsigned char id[16] = {0xda, 0x91, 0x51, 0xd3, 0x3a, 0xe6, 0xcc, 0x41,
                                0xa5, 0xc0, 0x4f, 0x26, 0xd5, 0x33, 0xe3, 0x28};
  CUuuid uuid;
  std::memcpy(uuid.bytes, id, 16);
  const void* table = nullptr;
  const CUresult st = get(&table, &uuid);
  std::printf("cuGetExportTable(nvrtc cache) -> %d, table %p\n", static_cast<int>(st), table);
  if (st != CUDA_SUCCESS || table == nullptr) return 1;
  auto* slots = const_cast<u64*>(static_cast<const u64*>(table));
  std::printf("slot 0 (size): %#llx\n", (unsigned long long)slots[0]);
  const size_t n = slots[0] / 8 < 8 ? slots[0] / 8 : 8;
  const long page = sysconf(_SC_PAGESIZE);
  const auto start = reinterpret_cast<std::uintptr_t>(slots) & ~static_cast<std::uintptr_t>(page - 1);
  if (mprotect(reinterpret_cast<void*>(start), static_cast<size_t>(page) * 2, PROT_READ | PROT_WRITE) != 0) {
    std::printf("mprotect failed\n");
    return 1;
  }
  for (size_t k = 1; k < n; ++k) {
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(slots[k]), &info);
    std::printf("slot %zu: %#llx (%s+%#lx)\n", k, (unsigned long long)slots[k],
                info.dli_fname ? info.dli_fname : "?",
                info.dli_fbase ? static_cast<unsigned long>(slots[k] - reinterpret_cast<u64>(info.dli_fbase)) : 0ul);
    g_orig[k] = reinterpret_cast<Fn>(slots[k]);
    slots[k] = reinterpret_cast<u64>(g_forwarders[k]);
  }
  const char* a = "extern \"C\" __global__ void k(float* p) { p[threadIdx.x] *= 2.0f; }";
  const char* b = "extern \"C\" __global__ void k2(int* p, int v) { p[threadIdx.x] += v; }";
  compile("A", a, true);
  compile("A again", a, true);
  compile("B", b, true);
  compile("A as PTX", a, false);
  compile("A as PTX again", a, false);
  std::printf("done\n");
  return 0;
}
