// What one process leaves on the GPU must mean nothing to the next, also
// when ivcudad serves both with the same (recycled) worker (docs/design.md,
// "Recycled workers"; tests/process/run_recycle_test.sh):
//   drv_recycle --leave [--mib N] [--ptx P]
//       allocates N MiB (default 64) and small blocks, fills them, frees some,
//       makes a stream, an event, a pool block it frees and page-locked host
//       memory with the same pattern, loads P's module, and prints one line
//       "left K=V ..." (its pid, free memory before it allocated, pointers,
//       handles); then exits without freeing anything;
//   drv_recycle --probe "LINE" [--mib N] [--allow-mib A] [--handles]
//       from the first call: the leaver's device pointer is not this
//       process's; --handles (ivcuda only: natively they are wild pointers)
//       its stream, event, module and function are refused; its N MiB are
//       free again (A MiB may be held by what others started meanwhile);
//       memory this process allocates - device, small blocks, a pool's, and
//       page-locked host memory - holds none of the leaver's pattern.
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "check.h"

namespace {

constexpr std::uint32_t kPattern = 0xA5C3A5C3u;
constexpr std::size_t kSmall = 4096, kSmallCount = 64, kPoolBytes = 16u << 20, kHostBytes = 4u << 20;

bool has(int argc, char** argv, const char* flag) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return true;
  return false;
}

std::size_t count_pattern(const std::uint32_t* p, std::size_t words) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < words; ++i) n += p[i] == kPattern ? 1 : 0;
  return n;
}

std::size_t count_device(CUdeviceptr d, std::size_t bytes) {
  std::vector<std::uint32_t> h(bytes / 4);
  if (cuMemcpyDtoH(h.data(), d, bytes) != CUDA_SUCCESS) return ~std::size_t{0};
  return count_pattern(h.data(), h.size());
}

int leave(std::size_t mib, const char* ptx) {
  CUdevice dev;
  CUcontext ctx;
  OK(cuDeviceGet(&dev, 0));
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  size_t free0 = 0, total = 0;
  OK(cuMemGetInfo(&free0, &total));
  CUdeviceptr big = 0;
  OK(cuMemAlloc(&big, mib << 20));
  OK(cuMemsetD32(big, kPattern, (mib << 20) / 4));
  std::vector<CUdeviceptr> small(kSmallCount);
  for (auto& s : small) {
    OK(cuMemAlloc(&s, kSmall));
    OK(cuMemsetD32(s, kPattern, kSmall / 4));
  }
  for (std::size_t i = 0; i < small.size(); i += 2) OK(cuMemFree(small[i]));  // freed: the context may keep them
  CUstream s = nullptr;
  CUevent e = nullptr;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  OK(cuEventCreate(&e, 0));
  CUdeviceptr pooled = 0;
  OK(cuMemAllocAsync(&pooled, kPoolBytes, s));
  OK(cuMemsetD32Async(pooled, kPattern, kPoolBytes / 4, s));
  OK(cuMemFreeAsync(pooled, s));  // back in the device's pool, which keeps it
  OK(cuEventRecord(e, s));
  void* host = nullptr;
  OK(cuMemHostAlloc(&host, kHostBytes, 0));
  if (host != nullptr) {
    auto* w = static_cast<std::uint32_t*>(host);
    for (std::size_t i = 0; i < kHostBytes / 4; ++i) w[i] = kPattern;
  }
  CUmodule mod = nullptr;
  CUfunction fn = nullptr;
  if (ptx != nullptr) {
    const std::string image = check::read_file(ptx);
    OK(cuModuleLoadData(&mod, image.c_str()));
    if (mod != nullptr) OK(cuModuleGetFunction(&fn, mod, "ivc_spin_ns"));
  }
  OK(cuCtxSynchronize());
  std::printf("left pid=%d free0=%zu dptr=%llx small=%llx stream=%p event=%p module=%p function=%p\n",
              static_cast<int>(::getpid()), free0, static_cast<unsigned long long>(big),
              static_cast<unsigned long long>(small[1]), static_cast<void*>(s), static_cast<void*>(e),
              static_cast<void*>(mod), static_cast<void*>(fn));
  std::fflush(stdout);
  return check::finish("drv_recycle --leave");
}

std::map<std::string, std::string> parse(const std::string& line) {
  std::map<std::string, std::string> kv;
  std::istringstream in(line);
  std::string word;
  while (in >> word)
    if (const auto eq = word.find('='); eq != std::string::npos) kv[word.substr(0, eq)] = word.substr(eq + 1);
  return kv;
}

template <class T>
T as_handle(const std::string& hex) {
  return reinterpret_cast<T>(static_cast<std::uintptr_t>(std::stoull(hex, nullptr, 16)));
}

int probe(const std::string& line, std::size_t mib, std::size_t allow_mib, bool handles) {
  auto kv = parse(line);
  EXPECT(kv.count("dptr") == 1 && kv.count("free0") == 1);
  if (kv.count("dptr") != 1 || kv.count("free0") != 1) return check::finish("drv_recycle --probe");
  CUdevice dev;
  CUcontext ctx;
  OK(cuDeviceGet(&dev, 0));
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  // Before this process allocates anything, the leaver's addresses are not its own.
  std::uint32_t word = 0;
  const auto dptr = static_cast<CUdeviceptr>(std::stoull(kv["dptr"], nullptr, 16));
  const auto small = static_cast<CUdeviceptr>(std::stoull(kv["small"], nullptr, 16));
  EXPECT(cuMemcpyDtoH(&word, dptr, sizeof word) != CUDA_SUCCESS);
  EXPECT(cuMemcpyDtoH(&word, small, sizeof word) != CUDA_SUCCESS);
  if (handles) {
    EXPECT(cuStreamQuery(as_handle<CUstream>(kv["stream"])) != CUDA_SUCCESS);
    EXPECT(cuEventQuery(as_handle<CUevent>(kv["event"])) != CUDA_SUCCESS);
    if (kv["module"] != "(nil)" && kv["module"] != "0") {
      CUfunction f = nullptr;
      EXPECT(cuModuleGetFunction(&f, as_handle<CUmodule>(kv["module"]), "ivc_spin_ns") != CUDA_SUCCESS);
      int regs = 0;
      EXPECT(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, as_handle<CUfunction>(kv["function"])) !=
             CUDA_SUCCESS);
    }
  }
  // Its memory is free again.
  size_t free_now = 0, total = 0;
  OK(cuMemGetInfo(&free_now, &total));
  const std::size_t free0 = std::stoull(kv["free0"]);
  std::printf("free: %zu MiB when the leaver started, %zu MiB now (%zu MiB allowed for others)\n", free0 >> 20,
              free_now >> 20, allow_mib);
  EXPECT(free_now + (allow_mib << 20) >= free0);
  // Nothing it allocates holds the leaver's pattern.
  std::size_t found = 0;
  CUdeviceptr big = 0;
  OK(cuMemAlloc(&big, mib << 20));
  if (big != 0) found += count_device(big, mib << 20);
  std::vector<CUdeviceptr> blocks(kSmallCount);
  for (auto& b : blocks) {
    OK(cuMemAlloc(&b, kSmall));
    if (b != 0) found += count_device(b, kSmall);
  }
  CUstream s = nullptr;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr pooled = 0;
  OK(cuMemAllocAsync(&pooled, kPoolBytes, s));
  OK(cuStreamSynchronize(s));
  if (pooled != 0) found += count_device(pooled, kPoolBytes);
  for (int k = 0; k < 4; ++k) {
    void* host = nullptr;
    OK(cuMemHostAlloc(&host, kHostBytes, 0));
    if (host != nullptr) found += count_pattern(static_cast<const std::uint32_t*>(host), kHostBytes / 4);
  }
  std::printf("the leaver's pattern in this process's new memory: %zu words\n", found);
  EXPECT(found == 0);
  return check::finish("drv_recycle --probe");
}

}  // namespace

int main(int argc, char** argv) {
  OK(cuInit(0));
  const char* m = check::arg(argc, argv, "--mib");
  const std::size_t mib = m != nullptr ? std::stoull(m) : 64;
  if (has(argc, argv, "--leave")) return leave(mib, check::arg(argc, argv, "--ptx"));
  if (const char* line = check::arg(argc, argv, "--probe")) {
    const char* a = check::arg(argc, argv, "--allow-mib");
    return probe(line, mib, a != nullptr ? std::stoull(a) : 0, has(argc, argv, "--handles"));
  }
  std::fprintf(stderr, "usage: drv_recycle --leave [--mib N] [--ptx P] | --probe LINE [--mib N] [--allow-mib A] [--handles]\n");
  return 2;
}
