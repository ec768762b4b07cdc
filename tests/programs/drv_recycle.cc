// What one process leaves on the GPU must mean nothing to the next, also
// when ivcudad serves both with the same (recycled) worker (docs/design.md,
// "Recycled workers"; tests/process/run_recycle_test.sh):
//   drv_recycle --leave [--mib N] [--ptx P] [--plain] [--kernels]
//       allocates N MiB (default 64) and small blocks, fills them, frees some,
//       makes a stream, an event, a pool block it frees and page-locked host
//       memory with the same pattern, loads P's module, and prints one line
//       "left K=V ..." (its pid, free memory before it allocated, pointers,
//       handles); then exits without freeing anything. --plain: no pool block
//       and no page-locked memory (what a worker may keep its context after,
//       --recycle-workers keep); --kernels (with --ptx): its kernels also
//       leave the pattern in shared memory and local memory, --heap in the
//       device heap (a kernel that calls malloc: the worker resets the context);
//       --grow-stack: it sets an 8 KiB stack a thread (a kept context's limit
//       changed: the worker must reset it);
//   drv_recycle --probe "LINE" [--mib N] [--allow-mib A] [--handles] [--plain]
//                [--ptx P --kernels]
//       from the first call: the leaver's device pointer is not this
//       process's; --handles (ivcuda only: natively they are wild pointers)
//       its stream, event, module and function are refused; its N MiB are
//       free again (A MiB may be held by what others started meanwhile);
//       memory this process allocates - device, small blocks, a pool's (not
//       with --plain), and page-locked host memory - holds none of the
//       leaver's pattern, nor (--kernels) do shared memory, local memory or
//       the device heap as its kernels find them;
//   drv_recycle --self --ptx P [--mib N]
//       both in one process and one context, and prints how much of the
//       pattern the probe finds: what a context keeps of its own past, which
//       a kept context's scrub must take away (a figure, not a check).
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

// The residue kernels of test_kernels.cu, launched to cover every SM.
struct Residue {
  CUfunction leave[3] = {}, find[3] = {};
  int sms = 0, smem = 0;
  bool ok = false;
};
constexpr const char* kResidueKinds[3] = {"shared", "local", "heap"};

Residue residue_kernels(CUmodule mod, CUdevice dev) {
  Residue r;
  for (int k = 0; k < 3; ++k) {
    const std::string kind = kResidueKinds[k];
    OK(cuModuleGetFunction(&r.leave[k], mod, ("ivc_leave_" + kind).c_str()));
    OK(cuModuleGetFunction(&r.find[k], mod, ("ivc_find_" + kind).c_str()));
  }
  OK(cuDeviceGetAttribute(&r.sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  OK(cuDeviceGetAttribute(&r.smem, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev));
  r.ok = r.leave[2] != nullptr && r.find[2] != nullptr && r.sms > 0 && r.smem > 0;
  if (r.ok) {
    OK(cuFuncSetAttribute(r.leave[0], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, r.smem));
    OK(cuFuncSetAttribute(r.find[0], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, r.smem));
  }
  return r;
}

// Launches kind k's kernel (leave, or find into *found) over every SM.
void launch_residue(const Residue& r, int k, bool leave, CUdeviceptr found) {
  unsigned pattern = kPattern;
  void* leave_args[] = {&pattern};
  void* find_args[] = {&pattern, &found};
  const unsigned grid = k == 2 ? 1u : static_cast<unsigned>(r.sms) * (k == 0 ? 2u : 4u);
  const unsigned smem = k == 0 ? static_cast<unsigned>(r.smem) : 0u;
  OK(cuLaunchKernel(leave ? r.leave[k] : r.find[k], grid, 1, 1, k == 2 ? 1u : 1024u, 1, 1, smem, nullptr,
                    leave ? leave_args : find_args, nullptr));
}

// What the find kernels count of the pattern, by kind.
std::vector<unsigned> find_residue(const Residue& r) {
  std::vector<unsigned> n(3, 0);
  CUdeviceptr found = 0;
  OK(cuMemAlloc(&found, sizeof(unsigned)));
  if (found == 0) return n;
  for (int k = 0; k < 3; ++k) {
    OK(cuMemsetD32(found, 0, 1));
    launch_residue(r, k, false, found);
    OK(cuCtxSynchronize());
    OK(cuMemcpyDtoH(&n[static_cast<std::size_t>(k)], found, sizeof(unsigned)));
  }
  OK(cuMemFree(found));
  return n;
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

int leave(std::size_t mib, const char* ptx, bool plain, bool kernels, bool heap, bool grow_stack) {
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
  if (!plain) {
    CUdeviceptr pooled = 0;
    OK(cuMemAllocAsync(&pooled, kPoolBytes, s));
    OK(cuMemsetD32Async(pooled, kPattern, kPoolBytes / 4, s));
    OK(cuMemFreeAsync(pooled, s));  // back in the device's pool, which keeps it
  }
  OK(cuEventRecord(e, s));
  if (!plain) {
    void* host = nullptr;
    OK(cuMemHostAlloc(&host, kHostBytes, 0));
    if (host != nullptr) {
      auto* w = static_cast<std::uint32_t*>(host);
      for (std::size_t i = 0; i < kHostBytes / 4; ++i) w[i] = kPattern;
    }
  }
  CUmodule mod = nullptr;
  CUfunction fn = nullptr;
  if (ptx != nullptr) {
    const std::string image = check::read_file(ptx);
    OK(cuModuleLoadData(&mod, image.c_str()));
    if (mod != nullptr) OK(cuModuleGetFunction(&fn, mod, "ivc_spin_ns"));
    if (mod != nullptr && (kernels || heap)) {
      const Residue r = residue_kernels(mod, dev);
      if (r.ok)
        for (int k = 0; k < 3; ++k)
          if (k == 2 ? heap : kernels) launch_residue(r, k, true, 0);
    }
  }
  if (grow_stack) OK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 8192));  // more local memory than a context starts with
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

int probe(const std::string& line, std::size_t mib, std::size_t allow_mib, bool handles, bool plain, const char* ptx) {
  std::printf("probe pid=%d\n", static_cast<int>(::getpid()));  // whoever served it can be found
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
  if (!plain) {
    CUstream s = nullptr;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr pooled = 0;
    OK(cuMemAllocAsync(&pooled, kPoolBytes, s));
    OK(cuStreamSynchronize(s));
    if (pooled != 0) found += count_device(pooled, kPoolBytes);
  }
  if (ptx != nullptr) {
    const std::string image = check::read_file(ptx);
    CUmodule mod = nullptr;
    OK(cuModuleLoadData(&mod, image.c_str()));
    const Residue r = mod != nullptr ? residue_kernels(mod, dev) : Residue{};
    if (r.ok) {
      const std::vector<unsigned> n = find_residue(r);
      std::printf("the leaver's pattern as this process's kernels find it: shared %u, local %u, heap %u words\n",
                  n[0], n[1], n[2]);
      found += n[0] + n[1] + n[2];
    }
  }
  for (int k = 0; k < 4; ++k) {
    void* host = nullptr;
    OK(cuMemHostAlloc(&host, kHostBytes, 0));
    if (host != nullptr) found += count_pattern(static_cast<const std::uint32_t*>(host), kHostBytes / 4);
  }
  std::printf("the leaver's pattern in this process's new memory: %zu words\n", found);
  EXPECT(found == 0);
  return check::finish("drv_recycle --probe");
}

// Leaver and probe in one context: how much of its own past a context shows.
int self(std::size_t mib, const char* ptx) {
  CUdevice dev;
  CUcontext ctx;
  OK(cuDeviceGet(&dev, 0));
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  const std::string image = check::read_file(ptx);
  CUmodule mod = nullptr;
  OK(cuModuleLoadData(&mod, image.c_str()));
  const Residue r = mod != nullptr ? residue_kernels(mod, dev) : Residue{};
  if (!r.ok) return check::finish("drv_recycle --self");
  std::vector<CUdeviceptr> small(kSmallCount);
  for (auto& b : small) {
    OK(cuMemAlloc(&b, kSmall));
    OK(cuMemsetD32(b, kPattern, kSmall / 4));
  }
  CUdeviceptr big = 0;
  OK(cuMemAlloc(&big, mib << 20));
  OK(cuMemsetD32(big, kPattern, (mib << 20) / 4));
  const auto limits = [] {
    std::string out;
    for (const CUlimit l : {CU_LIMIT_STACK_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE, CU_LIMIT_MALLOC_HEAP_SIZE,
                            CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT,
                            CU_LIMIT_MAX_L2_FETCH_GRANULARITY, CU_LIMIT_PERSISTING_L2_CACHE_SIZE}) {
      size_t v = 0;
      out += cuCtxGetLimit(&v, l) == CUDA_SUCCESS ? std::to_string(v) + " " : "- ";
    }
    return out;
  };
  std::printf("limits after the module's load: %s\n", limits().c_str());
  for (int k = 0; k < 3; ++k) {
    launch_residue(r, k, true, 0);
    OK(cuCtxSynchronize());
    std::printf("limits after ivc_leave_%s: %s\n", kResidueKinds[k], limits().c_str());
  }
  for (auto b : small) OK(cuMemFree(b));
  OK(cuMemFree(big));
  std::size_t in_small = 0, in_big = 0;
  for (auto& b : small) {
    OK(cuMemAlloc(&b, kSmall));
    if (b != 0) in_small += count_device(b, kSmall);
  }
  OK(cuMemAlloc(&big, mib << 20));
  if (big != 0) in_big = count_device(big, mib << 20);
  const std::vector<unsigned> n = find_residue(r);
  std::printf("one context's own past: small blocks %zu of %zu words, %zu MiB block %zu of %zu words, shared %u, "
              "local %u, heap %u words\n",
              in_small, kSmallCount * kSmall / 4, mib, in_big, (mib << 20) / 4, n[0], n[1], n[2]);
  return check::finish("drv_recycle --self");
}

}  // namespace

int main(int argc, char** argv) {
  OK(cuInit(0));
  const char* m = check::arg(argc, argv, "--mib");
  const std::size_t mib = m != nullptr ? std::stoull(m) : 64;
  const char* ptx = check::arg(argc, argv, "--ptx");
  const bool plain = has(argc, argv, "--plain"), kernels = has(argc, argv, "--kernels");
  if (has(argc, argv, "--leave"))
    return leave(mib, ptx, plain, kernels, has(argc, argv, "--heap"), has(argc, argv, "--grow-stack"));
  if (const char* line = check::arg(argc, argv, "--probe")) {
    const char* a = check::arg(argc, argv, "--allow-mib");
    return probe(line, mib, a != nullptr ? std::stoull(a) : 0, has(argc, argv, "--handles"), plain,
                 kernels ? ptx : nullptr);
  }
  if (has(argc, argv, "--self") && ptx != nullptr) return self(mib, ptx);
  std::fprintf(stderr, "usage: drv_recycle --leave [--mib N] [--ptx P] [--plain] [--kernels] [--heap] [--grow-stack] | --probe LINE [--mib N] "
                       "[--allow-mib A] [--handles] [--plain] [--ptx P --kernels] | --self --ptx P [--mib N]\n");
  return 2;
}
