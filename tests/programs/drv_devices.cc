// Lists the devices a program sees: ordinal, UUID, PCI address, name. Used
// to check GPU selection (ivcudad --gpus, CUDA_VISIBLE_DEVICES) against what
// the driver itself reports.
//   drv_devices [--try-ordinal N]   also reports what cuDeviceGet(N) returns
#include <cctype>
#include <string>

#include "check.h"

int main(int argc, char** argv) {
  const CUresult init = cuInit(0);
  if (init != CUDA_SUCCESS) {
    std::printf("cuInit: %s\n", check::name(init));
    return 0;
  }
  int n = 0;
  OK(cuDeviceGetCount(&n));
  std::printf("count %d\n", n);
  for (int i = 0; i < n; ++i) {
    CUdevice d;
    OK(cuDeviceGet(&d, i));
    CUuuid u{};
    OK(cuDeviceGetUuid(&u, d));
    char bus[32] = {};
    OK(cuDeviceGetPCIBusId(bus, sizeof bus, d));
    char name[128] = {};
    OK(cuDeviceGetName(name, sizeof name, d));
    std::printf("device %d GPU-", i);
    for (int b = 0; b < 16; ++b) {
      std::printf("%02x", static_cast<unsigned char>(u.bytes[b]));
      if (b == 3 || b == 5 || b == 7 || b == 9) std::printf("-");
    }
    std::printf(" %s %s\n", bus, name);
    // The bus id maps back to the ordinal, in the driver's accepted spellings.
    CUdevice by_bus = -1;
    OK(cuDeviceGetByPCIBusId(&by_bus, bus));
    EXPECT(by_bus == d);
    std::string upper(bus);
    for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    by_bus = -1;
    OK(cuDeviceGetByPCIBusId(&by_bus, upper.c_str()));
    EXPECT(by_bus == d);
    CUdevprop prop{};
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // old programs still call it
    OK(cuDeviceGetProperties(&prop, d));
#pragma GCC diagnostic pop
    int mt = 0, warp = 0;
    OK(cuDeviceGetAttribute(&mt, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, d));
    OK(cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, d));
    EXPECT(prop.maxThreadsPerBlock == mt && prop.SIMDWidth == warp && prop.maxGridSize[0] > 0);
    // Each device's primary context works.
    CUcontext c;
    OK(cuDevicePrimaryCtxRetain(&c, d));
    OK(cuCtxSetCurrent(c));
    CUdevice back = -1;
    OK(cuCtxGetDevice(&back));
    EXPECT(back == d);
    CUdeviceptr p;
    OK(cuMemAlloc(&p, 1 << 20));
    OK(cuMemFree(p));
    OK(cuDevicePrimaryCtxRelease(d));

    // Atomic operations over the link to the host, and to the next GPU: the driver's bits.
    CUatomicOperation ops[CU_ATOMIC_OPERATION_MAX];
    unsigned caps[CU_ATOMIC_OPERATION_MAX] = {};
    for (int k = 0; k < CU_ATOMIC_OPERATION_MAX; ++k) ops[k] = static_cast<CUatomicOperation>(k);
    OK(cuDeviceGetHostAtomicCapabilities(caps, ops, CU_ATOMIC_OPERATION_MAX, d));
    std::printf("host atomics of device %d:", i);
    for (unsigned bits : caps) std::printf(" %x", bits);
    std::printf("\n");
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuDeviceGetHostAtomicCapabilities(nullptr, ops, 1, d));
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuDeviceGetHostAtomicCapabilities(caps, nullptr, 1, d));
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuDeviceGetHostAtomicCapabilities(caps, ops, 0, d));
    CUatomicOperation unknown;
    const int ninety_nine = 99;
    std::memcpy(&unknown, &ninety_nine, sizeof unknown);
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuDeviceGetHostAtomicCapabilities(caps, &unknown, 1, d));
    EXPECT_RES(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetP2PAtomicCapabilities(caps, ops, 1, d, d));
    if (i + 1 < n) {
      CUdevice next;
      OK(cuDeviceGet(&next, i + 1));
      OK(cuDeviceGetP2PAtomicCapabilities(caps, ops, CU_ATOMIC_OPERATION_MAX, d, next));
      std::printf("peer atomics of device %d to %d:", i, i + 1);
      for (unsigned bits : caps) std::printf(" %x", bits);
      std::printf("\n");
    }
  }
  {
    CUatomicOperation add = CU_ATOMIC_OPERATION_INTEGER_ADD;
    unsigned cap = 0;
    EXPECT_RES(CUDA_ERROR_INVALID_DEVICE, cuDeviceGetHostAtomicCapabilities(&cap, &add, 1, n + 7));
  }
  if (const char* t = check::arg(argc, argv, "--try-ordinal")) {
    CUdevice d;
    std::printf("cuDeviceGet(%s): %s\n", t, check::name(cuDeviceGet(&d, std::atoi(t))));
  }
  CUdevice none = -1;
  std::printf("bus id ffff:ff:1f.0: %s\n", check::name(cuDeviceGetByPCIBusId(&none, "ffff:ff:1f.0")));
  std::printf("bus id \"not-a-bus-id\": %s\n", check::name(cuDeviceGetByPCIBusId(&none, "not-a-bus-id")));
  return check::finish("drv_devices");
}
