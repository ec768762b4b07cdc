// Two containers of one VM whose CUDA processes have the same pid (each is
// process 1 of its own PID namespace) are two processes to ivcudad, each
// with a worker of its own: one's exit must not end the other's work
// (docs/security.md, "Workers per VM"). Run in the guest, each under
// `unshare --pid --fork`:
//   drv_pidns --hold READY GO
//       makes a context, fills 1 MiB of device memory, writes READY, waits
//       (up to 60 s) until the file GO exists, then checks that its context
//       and memory still work: 20 rounds of copies with known contents;
//   drv_pidns
//       makes a context, does one round, and exits.
// Both print their pid: 1 in a fresh namespace.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "check.h"

namespace {

constexpr size_t kBytes = 1 << 20;

void round_trip(CUdeviceptr d, unsigned char v) {
  std::vector<unsigned char> in(kBytes, v), out(kBytes, 0);
  OK(cuMemcpyHtoD(d, in.data(), kBytes));
  OK(cuMemcpyDtoH(out.data(), d, kBytes));
  EXPECT(out == in);
}

bool exists(const char* path) {
  struct stat st {};
  return ::stat(path, &st) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* ready = check::arg(argc, argv, "--hold");
  const char* go = ready != nullptr && argc > 3 ? argv[3] : nullptr;
  std::printf("drv_pidns: pid %d\n", static_cast<int>(::getpid()));
  std::fflush(stdout);
  OK(cuInit(0));
  CUdevice dev = 0;
  OK(cuDeviceGet(&dev, 0));
  CUcontext ctx = nullptr;
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  CUdeviceptr d = 0;
  OK(cuMemAlloc(&d, kBytes));
  round_trip(d, 1);
  if (ready == nullptr) return check::finish("drv_pidns");
  if (FILE* f = std::fopen(ready, "w")) std::fclose(f);
  for (int i = 0; i < 600 && (go == nullptr || !exists(go)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT(go != nullptr && exists(go));
  for (int i = 0; i < 20; ++i) round_trip(d, static_cast<unsigned char>(i + 2));
  OK(cuMemFree(d));
  OK(cuDevicePrimaryCtxRelease(dev));
  return check::finish("drv_pidns --hold");
}
