// Peer access and per-GPU work from several threads. With two or more GPUs
// it copies between devices; with one it uses two contexts of that device
// (cuMemcpyPeer between contexts of one device is valid CUDA). What the
// program prints is deterministic, so the GPU machine diffs native and
// ivcuda output; link answers come from the host's driver either way.
#include <cstdint>
#include <thread>

#include "check.h"

namespace {

void print_links(int n) {
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      int can = -1;
      const CUresult r = cuDeviceCanAccessPeer(&can, i, j);
      int supported = -1;
      const CUresult a = cuDeviceGetP2PAttribute(&supported, CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED, i, j);
      std::printf("link %d->%d canAccessPeer %s %d access_supported %s %d\n", i, j, check::name(r),
                  r == CUDA_SUCCESS ? can : -1, check::name(a), a == CUDA_SUCCESS ? supported : -1);
    }
  int v = 0;
  EXPECT_RES(CUDA_ERROR_INVALID_DEVICE, cuDeviceCanAccessPeer(&v, 0, n));
  EXPECT_RES(CUDA_ERROR_INVALID_DEVICE, cuDeviceCanAccessPeer(&v, -1, 0));
  EXPECT(cuDeviceCanAccessPeer(nullptr, 0, 0) != CUDA_SUCCESS);
}

// Copies `bytes` from ctx a to ctx b, synchronously and on a stream, and
// checks them byte for byte.
void peer_copies(CUcontext a, CUcontext b, size_t bytes) {
  const auto src = check::random_bytes(bytes, 7);
  CUdeviceptr da = 0, db = 0;
  OK(cuCtxSetCurrent(b));
  OK(cuMemAlloc(&db, bytes));
  OK(cuMemsetD8(db, 0, bytes));
  OK(cuCtxSetCurrent(a));
  OK(cuMemAlloc(&da, bytes));
  OK(cuMemcpyHtoD(da, src.data(), bytes));
  OK(cuMemcpyPeer(db, b, da, a, bytes / 2));
  CUstream s;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  OK(cuMemcpyPeerAsync(db + bytes / 2, b, da + bytes / 2, a, bytes - bytes / 2, s));
  OK(cuStreamSynchronize(s));
  OK(cuMemcpyPeer(db, b, da, a, 0));  // nothing to copy: fine whatever happens
  std::vector<unsigned char> back(bytes, 0);
  OK(cuCtxSetCurrent(b));
  OK(cuMemcpyDtoH(back.data(), db, bytes));
  EXPECT(back == src);
  // A range the program does not own. A null context is accepted: with
  // unified addressing the pointers say where the memory is (driver 580).
  OK(cuCtxSetCurrent(a));
  EXPECT(cuMemcpyPeer(db, b, da + bytes, a, bytes) != CUDA_SUCCESS);
  OK(cuMemcpyPeer(db, nullptr, da, a, 16));
  OK(cuStreamDestroy(s));
  OK(cuMemFree(da));
  OK(cuCtxSetCurrent(b));
  OK(cuMemFree(db));
  std::printf("peer copy of %zu bytes: %s\n", bytes, back == src ? "verified" : "WRONG");
}

// Enabling access from a to b, as the real driver rules: once, then
// "already enabled"; disabling once, then "not enabled".
void peer_access(CUcontext a, CUcontext b, bool distinct_devices) {
  OK(cuCtxSetCurrent(a));
  const CUresult first = cuCtxEnablePeerAccess(b, 0);
  std::printf("enable peer access: %s\n", check::name(first));
  if (distinct_devices && first == CUDA_SUCCESS) {
    EXPECT_RES(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, cuCtxEnablePeerAccess(b, 0));
    OK(cuCtxDisablePeerAccess(b));
    EXPECT_RES(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, cuCtxDisablePeerAccess(b));
  } else if (!distinct_devices) {
    EXPECT(first != CUDA_SUCCESS);  // a device is not its own peer
  }
  EXPECT(cuCtxEnablePeerAccess(nullptr, 0) != CUDA_SUCCESS);
}

// One thread per (context, stream): each moves its own data through its own
// stream; every byte is checked.
void threads_on_contexts(CUcontext a, CUcontext b) {
  constexpr int kThreads = 4;
  constexpr size_t kBytes = 3 << 20;
  std::vector<int> ok(kThreads, 0);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      if (cuCtxSetCurrent(t % 2 == 0 ? a : b) != CUDA_SUCCESS) return;
      CUstream s;
      if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return;
      const auto src = check::random_bytes(kBytes, 100 + static_cast<unsigned>(t));
      std::vector<unsigned char> back(kBytes, 0);
      CUdeviceptr d1 = 0, d2 = 0;
      bool good = cuMemAlloc(&d1, kBytes) == CUDA_SUCCESS && cuMemAlloc(&d2, kBytes) == CUDA_SUCCESS;
      for (int round = 0; good && round < 5; ++round) {
        good = cuMemcpyHtoDAsync(d1, src.data(), kBytes, s) == CUDA_SUCCESS &&
               cuMemcpyDtoDAsync(d2, d1, kBytes, s) == CUDA_SUCCESS &&
               cuMemcpyDtoHAsync(back.data(), d2, kBytes, s) == CUDA_SUCCESS &&
               cuStreamSynchronize(s) == CUDA_SUCCESS && back == src;
        back.assign(kBytes, 0);
      }
      cuMemFree(d1);
      cuMemFree(d2);
      cuStreamDestroy(s);
      ok[static_cast<size_t>(t)] = good ? 1 : 0;
    });
  for (auto& th : ts) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ++check::g_checks;
    if (ok[static_cast<size_t>(t)] == 0) check::fail(__FILE__, __LINE__, "thread " + std::to_string(t));
  }
  std::printf("%d threads on 2 contexts: done\n", kThreads);
}

}  // namespace

int main() {
  const CUresult init = cuInit(0);
  if (init != CUDA_SUCCESS) {
    std::printf("cuInit: %s\n", check::name(init));
    return 1;
  }
  int n = 0;
  OK(cuDeviceGetCount(&n));
  if (n < 1) return check::finish("drv_peer");
  std::printf("devices %s\n", n >= 2 ? "2 or more" : "1");
  print_links(n);
  CUdevice d0, d1;
  OK(cuDeviceGet(&d0, 0));
  OK(cuDeviceGet(&d1, n >= 2 ? 1 : 0));
  CUcontext a, b;
  OK(cuDevicePrimaryCtxRetain(&a, d0));
  if (n >= 2) {
    OK(cuDevicePrimaryCtxRetain(&b, d1));
  } else {
    OK(cuCtxCreate(&b, nullptr, 0, d0));
  }
  peer_access(a, b, n >= 2);
  peer_copies(a, b, (8 << 20) + 123);
  threads_on_contexts(a, b);
  OK(cuCtxSetCurrent(nullptr));
  OK(cuDevicePrimaryCtxRelease(d0));
  if (n >= 2) {
    OK(cuDevicePrimaryCtxRelease(d1));
  } else {
    OK(cuCtxDestroy(b));
  }
  return check::finish("drv_peer");
}
