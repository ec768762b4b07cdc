// Green contexts: SM resources and their splits, descriptors, green contexts over the primary
// context, their converted contexts and streams. These run against the real driver too
// (real_driver_check.sh), except where tagged [double_only].
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "test_support.h"

using namespace ivcuda::gpu_double::test;

namespace {

CUdevResource device_sms(CUdevice dev = 0) {
  CUdevResource r{};
  CU_REQUIRE(cuDeviceGetDevResource(dev, &r, CU_DEV_RESOURCE_TYPE_SM));
  return r;
}

// Splits `input` into up to `n` groups of at least min_count SMs; the groups made, then the
// remainder, last.
std::vector<CUdevResource> split(const CUdevResource& input, unsigned n, unsigned min_count, unsigned flags = 0) {
  std::vector<CUdevResource> out(n + 1);
  unsigned made = n;
  CU_REQUIRE(cuDevSmResourceSplitByCount(out.data(), &made, &input, &out[n], flags, min_count));
  REQUIRE(made <= n);
  out[made] = out[n];
  out.resize(made + 1);
  return out;
}

CUdevResourceDesc desc_of(std::vector<CUdevResource> resources) {
  CUdevResourceDesc d = nullptr;
  CU_REQUIRE(cuDevResourceGenerateDesc(&d, resources.data(), static_cast<unsigned>(resources.size())));
  return d;
}

// A green context of `groups` groups of `sms` SMs of device 0.
CUgreenCtx make_green(unsigned groups, unsigned sms) {
  auto parts = split(device_sms(), groups, sms);
  REQUIRE(parts.size() == groups + 1);
  parts.pop_back();
  CUgreenCtx g = nullptr;
  CU_REQUIRE(cuGreenCtxCreate(&g, desc_of(parts), 0, CU_GREEN_CTX_DEFAULT_STREAM));
  REQUIRE(g != nullptr);
  return g;
}

CUcontext converted(CUgreenCtx g) {
  CUcontext c = nullptr;
  CU_REQUIRE(cuCtxFromGreenCtx(&c, g));
  return c;
}

CUcontext current() {
  CUcontext c = reinterpret_cast<CUcontext>(0x1);
  CU_REQUIRE(cuCtxGetCurrent(&c));
  return c;
}

bool primary_active() {
  unsigned flags = 0;
  int active = -1;
  CU_REQUIRE(cuDevicePrimaryCtxGetState(0, &flags, &active));
  return active != 0;
}

unsigned sm_count(const CUdevResource& r) {
  CHECK(r.type == CU_DEV_RESOURCE_TYPE_SM);
  return r.sm.smCount;
}

}  // namespace

TEST_CASE("a device's SM resource is its multiprocessors, in groups of 8", "[gpu_double][green]") {
  CU_REQUIRE(cuInit(0));
  int sms = 0;
  CU_REQUIRE(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
  const CUdevResource r = device_sms();
  CHECK(r.type == CU_DEV_RESOURCE_TYPE_SM);
  CHECK(r.sm.smCount == static_cast<unsigned>(sms));
  CHECK(r.sm.minSmPartitionSize == 8);
  CHECK(r.sm.smCoscheduledAlignment == 8);
  if (on_double()) CHECK(sms == 132);

  CUdevResource out{};
  CU_REQUIRE_ERR(cuDeviceGetDevResource(0, &out, CU_DEV_RESOURCE_TYPE_INVALID), CUDA_ERROR_INVALID_RESOURCE_TYPE);
  CU_REQUIRE_ERR(cuDeviceGetDevResource(0, nullptr, CU_DEV_RESOURCE_TYPE_SM), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuDeviceGetDevResource(42, &out, CU_DEV_RESOURCE_TYPE_SM), CUDA_ERROR_INVALID_DEVICE);

  // A created context and the primary context have the whole device.
  ScopedContext ctx;
  CU_REQUIRE(cuCtxGetDevResource(ctx.get(), &out, CU_DEV_RESOURCE_TYPE_SM));
  CHECK(sm_count(out) == static_cast<unsigned>(sms));
  CUcontext primary = nullptr;
  CU_REQUIRE(cuDevicePrimaryCtxRetain(&primary, 0));
  CU_REQUIRE(cuCtxGetDevResource(primary, &out, CU_DEV_RESOURCE_TYPE_SM));
  CHECK(sm_count(out) == static_cast<unsigned>(sms));
  CU_REQUIRE_ERR(cuCtxGetDevResource(primary, &out, CU_DEV_RESOURCE_TYPE_INVALID), CUDA_ERROR_INVALID_RESOURCE_TYPE);
  CU_REQUIRE_ERR(cuCtxGetDevResource(primary, nullptr, CU_DEV_RESOURCE_TYPE_SM), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuDevicePrimaryCtxRelease(0));
}

TEST_CASE("an SM split makes groups of the rounded-up size and a remainder", "[gpu_double][green]") {
  CU_REQUIRE(cuInit(0));
  const CUdevResource all = device_sms();
  const unsigned total = all.sm.smCount;
  unsigned n = 0;
  // Counting only: groups of minCount rounded up to 8, at least 8 (the H200 makes 15 such
  // groups of its 132 SMs, the double 16).
  CU_REQUIRE(cuDevSmResourceSplitByCount(nullptr, &n, &all, nullptr, 0, 0));
  CHECK(n >= total / 8 - 1);
  CHECK(n <= total / 8);
  CU_REQUIRE(cuDevSmResourceSplitByCount(nullptr, &n, &all, nullptr, 0, 16));
  CHECK(n == total / 16);
  CU_REQUIRE(cuDevSmResourceSplitByCount(nullptr, &n, &all, nullptr, 0, 9));
  CHECK(n == total / 16);

  SECTION("as many groups as asked for, the rest in the remainder") {
    const auto parts = split(all, 3, 16);
    REQUIRE(parts.size() == 4);
    for (int i = 0; i < 3; ++i) CHECK(sm_count(parts[i]) == 16);
    CHECK(sm_count(parts[3]) == total - 48);
  }
  SECTION("outputs of a split are not split again") {
    const auto parts = split(all, 2, 32);
    CU_REQUIRE_ERR(cuDevSmResourceSplitByCount(nullptr, &n, &parts[0], nullptr, 0, 8),
                   CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  }
  SECTION("refusals") {
    // Not both flags at once (so the H200's driver answers).
    CU_REQUIRE_ERR(cuDevSmResourceSplitByCount(nullptr, &n, &all, nullptr,
                                               CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING |
                                                   CU_DEV_SM_RESOURCE_SPLIT_MAX_POTENTIAL_CLUSTER_SIZE,
                                               8),
                   CUDA_ERROR_INVALID_VALUE);
    // An array of no groups.
    CUdevResource group{};
    n = 0;
    CU_REQUIRE_ERR(cuDevSmResourceSplitByCount(&group, &n, &all, nullptr, 0, 8), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuDevSmResourceSplitByCount(nullptr, &n, &all, nullptr, 0, total + 1),
                   CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  }
}

// What the H200 has not been asked (so [double_only] until it is).
TEST_CASE("SM splits: fewer groups than asked, no remainder, refusals", "[gpu_double][green][double_only]") {
  CU_REQUIRE(cuInit(0));
  const CUdevResource all = device_sms();
  const unsigned total = all.sm.smCount;
  unsigned n = 0;
  SECTION("no more groups than fit") {
    const auto parts = split(all, 100, 64);
    REQUIRE(parts.size() == 3);
    CHECK(sm_count(parts[0]) == 64);
    CHECK(sm_count(parts[1]) == 64);
    CHECK(sm_count(parts[2]) == total - 128);
  }
  SECTION("the remainder may be left out") {
    CUdevResource group{};
    n = 1;
    CU_REQUIRE(cuDevSmResourceSplitByCount(&group, &n, &all, nullptr, 0, 24));
    CHECK(n == 1);
    CHECK(sm_count(group) == 24);
  }
  SECTION("a remainder is not split again") {
    const auto parts = split(all, 2, 32);
    CU_REQUIRE_ERR(cuDevSmResourceSplitByCount(nullptr, &n, &parts[2], nullptr, 0, 8),
                   CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  }
  SECTION("refusals") {
    CU_REQUIRE_ERR(cuDevSmResourceSplitByCount(nullptr, nullptr, &all, nullptr, 0, 8), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuDevSmResourceSplitByCount(nullptr, &n, nullptr, nullptr, 0, 8), CUDA_ERROR_INVALID_VALUE);
    CU_REQUIRE_ERR(cuDevSmResourceSplitByCount(nullptr, &n, &all, nullptr, 0x4, 8), CUDA_ERROR_INVALID_VALUE);
    CUdevResource untyped = all;
    untyped.type = CU_DEV_RESOURCE_TYPE_INVALID;
    CU_REQUIRE_ERR(cuDevSmResourceSplitByCount(nullptr, &n, &untyped, nullptr, 0, 8),
                   CUDA_ERROR_INVALID_RESOURCE_TYPE);
  }
}


TEST_CASE("the double's split granularity and its own resources", "[gpu_double][green][double_only]") {
  CU_REQUIRE(cuInit(0));
  const CUdevResource all = device_sms();
  unsigned n = 0;
  // Ignoring co-scheduling: groups of 2, a multiple of 2.
  constexpr unsigned kIgnore = CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING;
  CU_REQUIRE(cuDevSmResourceSplitByCount(nullptr, &n, &all, nullptr, kIgnore, 0));
  CHECK(n == 66);
  CU_REQUIRE(cuDevSmResourceSplitByCount(nullptr, &n, &all, nullptr, kIgnore, 3));
  CHECK(n == 33);
  CU_REQUIRE(cuDevSmResourceSplitByCount(nullptr, &n, &all, nullptr, 0, 0));
  CHECK(n == 16);  // the H200: 15
  const auto fine = split(all, 5, 5, CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING);
  REQUIRE(fine.size() == 6);
  CHECK(sm_count(fine[0]) == 6);
  CHECK(fine[0].sm.minSmPartitionSize == 2);
  CHECK(fine[0].sm.smCoscheduledAlignment == 2);
  CHECK(sm_count(fine[5]) == 132 - 30);
  CHECK(fine[5].sm.minSmPartitionSize == 2);
  // Groups and the remainder carry the granularity used (the H200's driver leaves both 0).
  const auto coarse = split(all, 2, 16, CU_DEV_SM_RESOURCE_SPLIT_MAX_POTENTIAL_CLUSTER_SIZE);
  CHECK(coarse[0].sm.minSmPartitionSize == 8);
  CHECK(coarse[0].sm.smCoscheduledAlignment == 8);
  CHECK(coarse[2].sm.smCoscheduledAlignment == 8);
  // A whole device's worth rounds up past it: no group (the H200 makes one of 132).
  CU_REQUIRE(cuDevSmResourceSplitByCount(nullptr, &n, &all, nullptr, 0, 132));
  CHECK(n == 0);
  // Every group taken: a remainder of 4, and one of none.
  auto parts = split(all, 16, 8);
  REQUIRE(parts.size() == 17);
  CHECK(sm_count(parts[16]) == 4);
  parts = split(all, 2, 64);
  CHECK(sm_count(parts[2]) == 4);
  CUdevResource group[1];
  CUdevResource rest{};
  n = 1;
  CU_REQUIRE(cuDevSmResourceSplitByCount(group, &n, &all, &rest, 0, 132));
  CHECK(n == 0);
  CHECK(sm_count(rest) == 132);

  // Resources the double did not make, or that were edited, are refused where they are inputs.
  CUdevResource forged{};
  forged.type = CU_DEV_RESOURCE_TYPE_SM;
  forged.sm.smCount = 132;
  CU_REQUIRE_ERR(cuDevSmResourceSplitByCount(nullptr, &n, &forged, nullptr, 0, 8),
                 CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  CUdevResourceDesc d = nullptr;
  CU_REQUIRE_ERR(cuDevResourceGenerateDesc(&d, &forged, 1), CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  CUdevResource edited = all;
  edited.sm.smCount = 64;
  CU_REQUIRE_ERR(cuDevSmResourceSplitByCount(nullptr, &n, &edited, nullptr, 0, 8),
                 CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  edited = all;
  edited._internal_padding[91] ^= 1;
  CU_REQUIRE_ERR(cuDevResourceGenerateDesc(&d, &edited, 1), CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  // A group named twice in one descriptor is taken (as on the H200), counted twice.
  parts = split(all, 2, 64);
  std::vector<CUdevResource> twice{parts[0], parts[0]};
  d = desc_of(twice);
  CUgreenCtx g = nullptr;
  CU_REQUIRE(cuGreenCtxCreate(&g, d, 0, CU_GREEN_CTX_DEFAULT_STREAM));
  CUdevResource r{};
  CU_REQUIRE(cuGreenCtxGetDevResource(g, &r, CU_DEV_RESOURCE_TYPE_SM));
  CHECK(sm_count(r) == 128);
  CU_REQUIRE(cuGreenCtxDestroy(g));
  // A remainder of no SMs (type SM here; the H200's is of type INVALID) is no descriptor alone.
  parts = split(all, 2, 66, CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING);
  REQUIRE(parts.size() == 3);
  CHECK(sm_count(parts[2]) == 0);
  CU_REQUIRE_ERR(cuDevResourceGenerateDesc(&d, &parts[2], 1), CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  CU_REQUIRE(cuDevResourceGenerateDesc(&d, parts.data(), 3));  // with the groups it is no harm

  CU_REQUIRE_ERR(cuDevResourceGenerateDesc(nullptr, parts.data(), 1), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuDevResourceGenerateDesc(&d, nullptr, 1), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuDevResourceGenerateDesc(&d, parts.data(), 0), CUDA_ERROR_INVALID_VALUE);

  // Outputs of different splits, or a split's output with an unsplit resource, make no
  // descriptor: cuda.h's rule, which the H200's driver (580) does not enforce.
  const auto a = split(all, 3, 16);
  const auto b = split(all, 3, 16);
  std::vector<CUdevResource> v{a[0], b[1]};
  CU_REQUIRE_ERR(cuDevResourceGenerateDesc(&d, v.data(), 2), CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  v = {all, a[0]};
  CU_REQUIRE_ERR(cuDevResourceGenerateDesc(&d, v.data(), 2), CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
}

TEST_CASE("a descriptor holds one resource or outputs of one split", "[gpu_double][green]") {
  CU_REQUIRE(cuInit(0));
  const CUdevResource all = device_sms();
  const auto parts = split(all, 3, 16);
  CUdevResourceDesc d = nullptr;
  std::vector<CUdevResource> v{all};
  CU_REQUIRE(cuDevResourceGenerateDesc(&d, v.data(), 1));
  CHECK(d != nullptr);
  v = {parts[1]};
  CU_REQUIRE(cuDevResourceGenerateDesc(&d, v.data(), 1));
  v = {parts[0], parts[1], parts[2]};
  CU_REQUIRE(cuDevResourceGenerateDesc(&d, v.data(), 3));
  v = {parts[0], parts[3]};  // a group and the remainder
  CU_REQUIRE(cuDevResourceGenerateDesc(&d, v.data(), 2));

  v = {parts[0]};
  v[0].type = CU_DEV_RESOURCE_TYPE_INVALID;
  CU_REQUIRE_ERR(cuDevResourceGenerateDesc(&d, v.data(), 1), CUDA_ERROR_INVALID_RESOURCE_TYPE);
}

TEST_CASE("a green context has its SMs and holds the primary context", "[gpu_double][green]") {
  CU_REQUIRE(cuInit(0));
  const bool was_active = primary_active();
  const CUcontext before = current();
  auto parts = split(device_sms(), 2, 16);
  parts.pop_back();
  const CUdevResourceDesc d = desc_of(parts);

  CUgreenCtx g = nullptr;
  CU_REQUIRE_ERR(cuGreenCtxCreate(nullptr, d, 0, CU_GREEN_CTX_DEFAULT_STREAM), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuGreenCtxCreate(&g, d, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuGreenCtxCreate(&g, d, 0, CU_GREEN_CTX_DEFAULT_STREAM | 0x2), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuGreenCtxCreate(&g, d, 42, CU_GREEN_CTX_DEFAULT_STREAM), CUDA_ERROR_INVALID_DEVICE);

  CU_REQUIRE(cuGreenCtxCreate(&g, d, 0, CU_GREEN_CTX_DEFAULT_STREAM));
  CHECK(primary_active());
  CHECK(current() == before);  // nothing became current

  CUdevResource r{};
  CU_REQUIRE(cuGreenCtxGetDevResource(g, &r, CU_DEV_RESOURCE_TYPE_SM));
  CHECK(sm_count(r) == 32);
  CU_REQUIRE_ERR(cuGreenCtxGetDevResource(g, &r, CU_DEV_RESOURCE_TYPE_INVALID), CUDA_ERROR_INVALID_RESOURCE_TYPE);
  CU_REQUIRE_ERR(cuGreenCtxGetDevResource(g, nullptr, CU_DEV_RESOURCE_TYPE_SM), CUDA_ERROR_INVALID_VALUE);
  // Its resource splits again.
  CU_REQUIRE(cuGreenCtxGetDevResource(g, &r, CU_DEV_RESOURCE_TYPE_SM));
  unsigned n = 0;
  CU_REQUIRE(cuDevSmResourceSplitByCount(nullptr, &n, &r, nullptr, 0, 8));
  CHECK(n >= 1);
  CHECK(n <= 4);
  if (on_double()) CHECK(n == 4);

  // One converted context, the same every time, with the green context's SMs.
  const CUcontext c = converted(g);
  CHECK(c != nullptr);
  CHECK(converted(g) == c);
  CU_REQUIRE_ERR(cuCtxFromGreenCtx(nullptr, g), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuCtxGetDevResource(c, &r, CU_DEV_RESOURCE_TYPE_SM));
  CHECK(sm_count(r) == 32);
  // The primary context keeps the whole device.
  CUcontext primary = nullptr;
  CU_REQUIRE(cuDevicePrimaryCtxRetain(&primary, 0));
  CHECK(primary != c);
  CU_REQUIRE(cuCtxGetDevResource(primary, &r, CU_DEV_RESOURCE_TYPE_SM));
  CHECK(sm_count(r) == device_sms().sm.smCount);
  CU_REQUIRE(cuDevicePrimaryCtxRelease(0));

  // Ids: non-zero, one per green context.
  CUgreenCtx g2 = make_green(1, 8);
  unsigned long long id1 = 0, id2 = 0;
  CU_REQUIRE(cuGreenCtxGetId(g, &id1));
  CU_REQUIRE(cuGreenCtxGetId(g2, &id2));
  CHECK(id1 != 0);
  CHECK(id2 != 0);
  CHECK(id1 != id2);
  CU_REQUIRE(cuGreenCtxGetId(g, &id2));
  CHECK(id1 == id2);
  CU_REQUIRE_ERR(cuGreenCtxGetId(g, nullptr), CUDA_ERROR_INVALID_VALUE);
  CHECK(converted(g2) != c);

  CU_REQUIRE(cuGreenCtxDestroy(g2));
  CU_REQUIRE(cuGreenCtxDestroy(g));
  CHECK(primary_active() == was_active);  // the green contexts' retains are released
}

TEST_CASE("a converted context works as the primary context with the green context's SMs", "[gpu_double][green]") {
  CU_REQUIRE(cuInit(0));
  CUcontext primary = nullptr;
  CU_REQUIRE(cuDevicePrimaryCtxRetain(&primary, 0));  // so that its memory outlives the green context
  CUgreenCtx g = make_green(1, 16);
  const CUcontext c = converted(g);

  CU_REQUIRE(cuCtxPushCurrent(c));
  CHECK(current() == c);
  CUdevice dev = -1;
  CU_REQUIRE(cuCtxGetDevice(&dev));
  CHECK(dev == 0);
  CU_REQUIRE(cuCtxGetDevice_v2(&dev, c));
  CHECK(dev == 0);
  CU_REQUIRE(cuCtxSynchronize());
  CU_REQUIRE(cuCtxSynchronize_v2(c));
  unsigned long long ctx_id = 0, current_id = 0;
  CU_REQUIRE(cuCtxGetId(c, &ctx_id));
  CHECK(ctx_id != 0);
  CU_REQUIRE(cuCtxGetId(nullptr, &current_id));
  CHECK(current_id == ctx_id);
  unsigned long long green_id = 0, want = 0;
  CU_REQUIRE(cuGreenCtxGetId(nullptr, &green_id));  // the current one
  CU_REQUIRE(cuGreenCtxGetId(g, &want));
  CHECK(green_id == want);
  CUdevResource r{};
  CU_REQUIRE(cuCtxGetDevResource(c, &r, CU_DEV_RESOURCE_TYPE_SM));
  CHECK(sm_count(r) == 16);
  CU_REQUIRE_ERR(cuCtxDestroy(c), CUDA_ERROR_INVALID_CONTEXT);

  // Special streams follow the current context.
  CUgreenCtx seen = nullptr;
  CUcontext owner = nullptr;
  CU_REQUIRE(cuStreamGetGreenCtx(nullptr, &seen));
  CHECK(seen == g);
  CU_REQUIRE(cuStreamGetGreenCtx(CU_STREAM_LEGACY, &seen));
  CHECK(seen == g);
  CU_REQUIRE(cuStreamGetCtx(nullptr, &owner));
  CHECK(owner == c);
  seen = nullptr;
  CU_REQUIRE(cuStreamGetCtx_v2(nullptr, &owner, &seen));
  CHECK(owner == primary);
  CHECK(seen == g);
  CU_REQUIRE_ERR(cuStreamGetCtx_v2(CU_STREAM_PER_THREAD, &owner, &seen), CUDA_ERROR_INVALID_HANDLE);
  // Either output may be left out.
  seen = nullptr;
  CU_REQUIRE(cuStreamGetCtx_v2(nullptr, nullptr, &seen));
  CHECK(seen == g);
  owner = nullptr;
  CU_REQUIRE(cuStreamGetCtx_v2(nullptr, &owner, nullptr));
  CHECK(owner == primary);

  // A stream made here is the green context's.
  CUstream s = nullptr;
  CU_REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CU_REQUIRE(cuStreamGetGreenCtx(s, &seen));
  CHECK(seen == g);
  CU_REQUIRE(cuStreamGetCtx(s, &owner));
  CHECK(owner == c);
  seen = nullptr;
  CU_REQUIRE(cuStreamGetCtx_v2(s, &owner, &seen));
  CHECK(owner == primary);
  CHECK(seen == g);

  // Memory, modules, launches and events.
  constexpr unsigned kN = 256;
  CUdeviceptr p = 0;
  CU_REQUIRE(cuMemAlloc(&p, kN * sizeof(unsigned)));
  CU_REQUIRE(cuMemsetD32Async(p, 7, kN, s));
  const std::string ptx = kernels_ptx();
  if (!ptx.empty()) {
    CUmodule m = nullptr;
    CU_REQUIRE(cuModuleLoadData(&m, ptx.c_str()));
    CUfunction f = nullptr;
    CU_REQUIRE(cuModuleGetFunction(&f, m, "ivc_fill_u32"));
    unsigned value = 0xC0FFEE;
    unsigned long long count = kN - 1;
    void* args[] = {&p, &value, &count};
    CU_REQUIRE(cuLaunchKernel(f, 2, 1, 1, 64, 1, 1, 0, s, args, nullptr));
    CU_REQUIRE(cuStreamSynchronize(s));
    std::vector<unsigned> back(kN);
    CU_REQUIRE(cuMemcpyDtoH(back.data(), p, kN * sizeof(unsigned)));
    CHECK(back[0] == 0xC0FFEEu);
    CHECK(back[kN - 2] == 0xC0FFEEu);
    CHECK(back[kN - 1] == 7u);
    CU_REQUIRE(cuModuleUnload(m));
  } else {
    WARN("SKIP: the launch part (test kernels were not built)");
  }
  CUevent e = nullptr;
  CU_REQUIRE(cuEventCreate(&e, 0));
  CU_REQUIRE(cuEventRecord(e, s));
  CU_REQUIRE(cuEventSynchronize(e));
  CU_REQUIRE(cuGreenCtxRecordEvent(g, e));
  CU_REQUIRE(cuEventSynchronize(e));
  CU_REQUIRE(cuGreenCtxWaitEvent(g, e));
  CU_REQUIRE(cuStreamWaitEvent(s, e, 0));
  CU_REQUIRE(cuStreamDestroy(s));
  CU_REQUIRE(cuEventDestroy(e));

  CUcontext popped = nullptr;
  CU_REQUIRE(cuCtxPopCurrent(&popped));
  CHECK(popped == c);

  // cuCtxSetCurrent takes it too.
  CU_REQUIRE(cuCtxPushCurrent(primary));
  CU_REQUIRE(cuCtxSetCurrent(c));
  CHECK(current() == c);
  CU_REQUIRE(cuCtxSetCurrent(primary));

  // The memory is the primary context's: it outlives the green context.
  CU_REQUIRE(cuGreenCtxDestroy(g));
  CUdeviceptr base = 0;
  size_t size = 0;
  CU_REQUIRE(cuMemGetAddressRange(&base, &size, p));
  CHECK(base == p);
  unsigned first = 0;
  CU_REQUIRE(cuMemcpyDtoH(&first, p, sizeof first));
  CHECK(first == (ptx.empty() ? 7u : 0xC0FFEEu));
  CU_REQUIRE(cuMemFree(p));
  CU_REQUIRE(cuCtxPopCurrent(nullptr));
  CU_REQUIRE(cuDevicePrimaryCtxRelease(0));
}

TEST_CASE("cuGreenCtxStreamCreate makes a stream of the green context whatever is current",
          "[gpu_double][green]") {
  ScopedContext ctx;
  CUgreenCtx g = make_green(1, 8);
  const CUcontext c = converted(g);
  CUstream s = nullptr;
  CU_REQUIRE_ERR(cuGreenCtxStreamCreate(&s, g, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuGreenCtxStreamCreate(&s, g, CU_STREAM_NON_BLOCKING | 0x2, 0), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE_ERR(cuGreenCtxStreamCreate(nullptr, g, CU_STREAM_NON_BLOCKING, 0), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuGreenCtxStreamCreate(&s, g, CU_STREAM_NON_BLOCKING, -100));
  int prio = 1;
  CU_REQUIRE(cuStreamGetPriority(s, &prio));
  CHECK(prio == -5);
  unsigned flags = 0;
  CU_REQUIRE(cuStreamGetFlags(s, &flags));
  CHECK(flags == CU_STREAM_NON_BLOCKING);

  CUcontext owner = nullptr;
  CUgreenCtx seen = nullptr;
  CU_REQUIRE(cuStreamGetCtx(s, &owner));
  CHECK(owner == c);
  CU_REQUIRE(cuStreamGetGreenCtx(s, &seen));
  CHECK(seen == g);
  CU_REQUIRE_ERR(cuStreamGetGreenCtx(s, nullptr), CUDA_ERROR_INVALID_VALUE);
  CUcontext primary = nullptr;
  CU_REQUIRE(cuDevicePrimaryCtxRetain(&primary, 0));
  CU_REQUIRE(cuStreamGetCtx_v2(s, &owner, &seen));
  CHECK(owner == primary);
  CHECK(seen == g);
  CU_REQUIRE(cuDevicePrimaryCtxRelease(0));
  CU_REQUIRE(cuStreamQuery(s));
  CU_REQUIRE(cuStreamSynchronize(s));

  // A plain context's streams, and the special streams under it, have no green context.
  CUstream plain = nullptr;
  CU_REQUIRE(cuStreamCreate(&plain, 0));
  seen = reinterpret_cast<CUgreenCtx>(0x1);
  CU_REQUIRE(cuStreamGetGreenCtx(plain, &seen));
  CHECK(seen == nullptr);
  seen = reinterpret_cast<CUgreenCtx>(0x1);
  CU_REQUIRE(cuStreamGetCtx_v2(plain, &owner, &seen));
  CHECK(owner == ctx.get());
  CHECK(seen == nullptr);
  seen = reinterpret_cast<CUgreenCtx>(0x1);
  CU_REQUIRE(cuStreamGetGreenCtx(nullptr, &seen));
  CHECK(seen == nullptr);
  seen = reinterpret_cast<CUgreenCtx>(0x1);
  CU_REQUIRE(cuStreamGetCtx_v2(CU_STREAM_PER_THREAD, &owner, &seen));
  CHECK(owner == ctx.get());
  CHECK(seen == nullptr);
  CU_REQUIRE(cuStreamDestroy(plain));

  // On a thread with no context current the special streams have nobody, but a green
  // context's stream still answers.
  CUresult none_green = CUDA_SUCCESS, none_v2 = CUDA_SUCCESS, none_ctx = CUDA_SUCCESS, green_of_s = CUDA_ERROR_UNKNOWN;
  CUgreenCtx seen_there = nullptr;
  std::thread([&] {
    CUgreenCtx any = nullptr;
    CUcontext any_ctx = nullptr;
    none_green = cuStreamGetGreenCtx(nullptr, &any);
    none_v2 = cuStreamGetCtx_v2(nullptr, &any_ctx, &any);
    none_ctx = cuStreamGetCtx(nullptr, &any_ctx);
    green_of_s = cuStreamGetGreenCtx(s, &seen_there);
  }).join();
  CHECK(none_green == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(none_v2 == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(none_ctx == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(green_of_s == CUDA_SUCCESS);
  CHECK(seen_there == g);

  CU_REQUIRE(cuStreamDestroy(s));
  CU_REQUIRE(cuGreenCtxDestroy(g));
}

TEST_CASE("a green context's events", "[gpu_double][green]") {
  CU_REQUIRE(cuInit(0));
  CUgreenCtx g = make_green(1, 8);
  const CUcontext c = converted(g);
  CUcontext primary = nullptr;
  CU_REQUIRE(cuDevicePrimaryCtxRetain(&primary, 0));
  CU_REQUIRE(cuCtxPushCurrent(primary));
  CUevent e = nullptr;
  CU_REQUIRE(cuEventCreate(&e, 0));  // the primary context's
  CU_REQUIRE(cuGreenCtxRecordEvent(g, e));
  CU_REQUIRE(cuEventSynchronize(e));
  CU_REQUIRE(cuEventQuery(e));
  CU_REQUIRE(cuGreenCtxWaitEvent(g, e));

  // An event of another context: recorded only by its own, waited for by anyone.
  CUcontext other = nullptr;
  CU_REQUIRE(cuCtxCreate(&other, nullptr, 0, 0));
  CUevent foreign = nullptr;
  CU_REQUIRE(cuEventCreate(&foreign, 0));
  CU_REQUIRE(cuEventRecord(foreign, nullptr));
  CU_REQUIRE_ERR(cuGreenCtxRecordEvent(g, foreign), CUDA_ERROR_INVALID_HANDLE);
  CU_REQUIRE(cuGreenCtxWaitEvent(g, foreign));
  CU_REQUIRE(cuEventDestroy(foreign));
  CU_REQUIRE(cuCtxDestroy(other));

  // Not while one of its streams captures: the capture is over.
  CUstream s = nullptr;
  CU_REQUIRE(cuGreenCtxStreamCreate(&s, g, CU_STREAM_NON_BLOCKING, 0));
  CU_REQUIRE(cuCtxPushCurrent(c));
  CU_REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CU_REQUIRE_ERR(cuGreenCtxRecordEvent(g, e), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph graph = nullptr;
  CU_REQUIRE_ERR(cuStreamEndCapture(s, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CU_REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CU_REQUIRE_ERR(cuGreenCtxWaitEvent(g, e), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CU_REQUIRE_ERR(cuStreamEndCapture(s, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CU_REQUIRE(cuCtxPopCurrent(nullptr));
  CU_REQUIRE(cuStreamDestroy(s));

  CU_REQUIRE(cuEventDestroy(e));
  CU_REQUIRE(cuCtxPopCurrent(nullptr));
  CU_REQUIRE(cuGreenCtxDestroy(g));
  CU_REQUIRE(cuDevicePrimaryCtxRelease(0));
}

TEST_CASE("a destroyed green context leaves its streams and memory behind", "[gpu_double][green][double_only]") {
  CU_REQUIRE(cuInit(0));
  const bool was_active = primary_active();
  CUgreenCtx g = make_green(1, 8);
  const CUcontext c = converted(g);
  CU_REQUIRE(cuCtxPushCurrent(c));
  CUstream s = nullptr, made_here = nullptr;
  CU_REQUIRE(cuGreenCtxStreamCreate(&s, g, CU_STREAM_NON_BLOCKING, 0));
  CU_REQUIRE(cuStreamCreate(&made_here, 0));
  CUdeviceptr p = 0;
  CU_REQUIRE(cuMemAlloc(&p, 64));
  CU_REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));

  CU_REQUIRE(cuGreenCtxDestroy(g));
  CHECK(primary_active() == was_active);  // its retain is released

  // Still current, but gone.
  CHECK(current() == c);
  CUdeviceptr q = 0;
  CU_REQUIRE_ERR(cuMemAlloc(&q, 64), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CU_REQUIRE_ERR(cuCtxSynchronize(), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CUdevice dev = -1;
  CU_REQUIRE(cuCtxGetDevice(&dev));  // as on the H200
  CHECK(dev == 0);
  CUgreenCtx seen = nullptr;
  CU_REQUIRE_ERR(cuStreamGetGreenCtx(nullptr, &seen), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  unsigned long long id = 0;
  CU_REQUIRE_ERR(cuGreenCtxGetId(nullptr, &id), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CUcontext popped = nullptr;
  CU_REQUIRE(cuCtxPopCurrent(&popped));
  CHECK(popped == c);

  // The handles are invalid.
  CUcontext again = nullptr;
  CU_REQUIRE_ERR(cuCtxFromGreenCtx(&again, g), CUDA_ERROR_INVALID_CONTEXT);
  CU_REQUIRE_ERR(cuGreenCtxGetId(g, &id), CUDA_ERROR_INVALID_CONTEXT);
  CU_REQUIRE_ERR(cuGreenCtxDestroy(g), CUDA_ERROR_INVALID_CONTEXT);
  CU_REQUIRE_ERR(cuCtxSetCurrent(c), CUDA_ERROR_INVALID_CONTEXT);
  CU_REQUIRE_ERR(cuCtxPushCurrent(c), CUDA_ERROR_INVALID_CONTEXT);
  CU_REQUIRE_ERR(cuCtxSynchronize_v2(c), CUDA_ERROR_INVALID_CONTEXT);
  CU_REQUIRE_ERR(cuCtxGetDevice_v2(&dev, c), CUDA_ERROR_INVALID_CONTEXT);
  CUdevResource r{};
  CU_REQUIRE_ERR(cuCtxGetDevResource(c, &r, CU_DEV_RESOURCE_TYPE_SM), CUDA_ERROR_INVALID_CONTEXT);
  CU_REQUIRE_ERR(cuGreenCtxGetDevResource(g, &r, CU_DEV_RESOURCE_TYPE_SM), CUDA_ERROR_INVALID_CONTEXT);

  // Its streams answer CONTEXT_IS_DESTROYED, except to cuStreamDestroy.
  ScopedContext plain;
  CU_REQUIRE_ERR(cuStreamQuery(s), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CU_REQUIRE_ERR(cuStreamSynchronize(made_here), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CUcontext owner = nullptr;
  CU_REQUIRE_ERR(cuStreamGetCtx(s, &owner), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CU_REQUIRE_ERR(cuStreamGetCtx_v2(s, &owner, &seen), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CU_REQUIRE_ERR(cuStreamGetGreenCtx(made_here, &seen), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CU_REQUIRE_ERR(cuMemsetD8Async(p, 0, 64, s), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CUgraph graph = nullptr;
  CU_REQUIRE_ERR(cuStreamEndCapture(s, &graph), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CU_REQUIRE(cuStreamDestroy(s));
  CU_REQUIRE(cuStreamDestroy(made_here));
  CU_REQUIRE_ERR(cuStreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);

  if (!was_active) {
    // The green context held the primary context's last retain: its memory went with it.
    CUdeviceptr base = 0;
    CU_REQUIRE_ERR(cuMemGetAddressRange(&base, nullptr, p), CUDA_ERROR_NOT_FOUND);
  }
}

TEST_CASE("memory allocated in a green context is the primary context's", "[gpu_double][green][double_only]") {
  CU_REQUIRE(cuInit(0));
  CUcontext primary = nullptr;
  CU_REQUIRE(cuDevicePrimaryCtxRetain(&primary, 0));
  CUgreenCtx g = make_green(1, 8);
  CU_REQUIRE(cuCtxPushCurrent(converted(g)));
  CUdeviceptr p = 0;
  CU_REQUIRE(cuMemAlloc(&p, 64));
  CU_REQUIRE(cuCtxPopCurrent(nullptr));
  CU_REQUIRE(cuGreenCtxDestroy(g));
  CU_REQUIRE(cuCtxPushCurrent(primary));
  CUdeviceptr base = 0;
  CU_REQUIRE(cuMemGetAddressRange(&base, nullptr, p));
  // The primary context's reset frees it.
  CU_REQUIRE(cuDevicePrimaryCtxReset(0));
  CU_REQUIRE(cuDevicePrimaryCtxRetain(&primary, 0));
  CU_REQUIRE_ERR(cuMemGetAddressRange(&base, nullptr, p), CUDA_ERROR_NOT_FOUND);
  CU_REQUIRE(cuDevicePrimaryCtxRelease(0));
  CU_REQUIRE(cuDevicePrimaryCtxRelease(0));
  CU_REQUIRE(cuCtxPopCurrent(nullptr));
}

// The H200's driver (580) answers INVALID_HANDLE for CU_STREAM_PER_THREAD to all three queries
// while a converted context is current; the double answers as for the other special streams,
// except in cuStreamGetCtx_v2, where cuda.h documents the refusal.
TEST_CASE("the per-thread stream under a converted context", "[gpu_double][green][double_only]") {
  CU_REQUIRE(cuInit(0));
  CUgreenCtx g = make_green(1, 8);
  const CUcontext c = converted(g);
  CU_REQUIRE(cuCtxPushCurrent(c));
  CUgreenCtx seen = nullptr;
  CU_REQUIRE(cuStreamGetGreenCtx(CU_STREAM_PER_THREAD, &seen));
  CHECK(seen == g);
  CUcontext owner = nullptr;
  CU_REQUIRE(cuStreamGetCtx(CU_STREAM_PER_THREAD, &owner));
  CHECK(owner == c);
  CU_REQUIRE_ERR(cuStreamGetCtx_v2(CU_STREAM_PER_THREAD, &owner, &seen), CUDA_ERROR_INVALID_HANDLE);
  CU_REQUIRE(cuCtxPopCurrent(nullptr));
  CU_REQUIRE(cuGreenCtxDestroy(g));
}

TEST_CASE("made-up and null green-context handles are refused", "[gpu_double][green][double_only]") {
  CU_REQUIRE(cuInit(0));
  const auto bogus = reinterpret_cast<CUgreenCtx>(0x12345);
  CUdevResource r{};
  CUcontext c = nullptr;
  CUstream s = nullptr;
  unsigned long long id = 0;
  for (CUgreenCtx g : {bogus, static_cast<CUgreenCtx>(nullptr)}) {
    CU_REQUIRE_ERR(cuGreenCtxGetDevResource(g, &r, CU_DEV_RESOURCE_TYPE_SM), CUDA_ERROR_INVALID_CONTEXT);
    CU_REQUIRE_ERR(cuCtxFromGreenCtx(&c, g), CUDA_ERROR_INVALID_CONTEXT);
    CU_REQUIRE_ERR(cuGreenCtxStreamCreate(&s, g, CU_STREAM_NON_BLOCKING, 0), CUDA_ERROR_INVALID_CONTEXT);
    CU_REQUIRE_ERR(cuGreenCtxDestroy(g), CUDA_ERROR_INVALID_CONTEXT);
    CU_REQUIRE_ERR(cuGreenCtxGetId(g, &id), CUDA_ERROR_INVALID_CONTEXT);
  }
  CU_REQUIRE_ERR(cuCtxGetDevResource(reinterpret_cast<CUcontext>(0x12345), &r, CU_DEV_RESOURCE_TYPE_SM),
                 CUDA_ERROR_INVALID_CONTEXT);
  CU_REQUIRE_ERR(cuCtxGetDevResource(nullptr, &r, CU_DEV_RESOURCE_TYPE_SM), CUDA_ERROR_INVALID_CONTEXT);
  CUgreenCtx made = nullptr;
  CU_REQUIRE_ERR(cuGreenCtxCreate(&made, reinterpret_cast<CUdevResourceDesc>(0x12345), 0, CU_GREEN_CTX_DEFAULT_STREAM),
                 CUDA_ERROR_INVALID_VALUE);
  // The H200's driver (580) makes a green context of a NULL descriptor; the double does not.
  CU_REQUIRE_ERR(cuGreenCtxCreate(&made, nullptr, 0, CU_GREEN_CTX_DEFAULT_STREAM), CUDA_ERROR_INVALID_VALUE);

  ScopedContext ctx;
  CUevent e = nullptr;
  CU_REQUIRE(cuEventCreate(&e, 0));
  CU_REQUIRE_ERR(cuGreenCtxRecordEvent(bogus, e), CUDA_ERROR_INVALID_CONTEXT);
  CU_REQUIRE_ERR(cuGreenCtxWaitEvent(bogus, e), CUDA_ERROR_INVALID_CONTEXT);
  CUgreenCtx g = make_green(1, 8);
  CU_REQUIRE_ERR(cuGreenCtxRecordEvent(g, reinterpret_cast<CUevent>(0x12345)), CUDA_ERROR_INVALID_HANDLE);
  CU_REQUIRE_ERR(cuGreenCtxWaitEvent(g, nullptr), CUDA_ERROR_INVALID_HANDLE);
  // A plain context current: no green context to name with NULL.
  CU_REQUIRE_ERR(cuGreenCtxGetId(nullptr, &id), CUDA_ERROR_INVALID_CONTEXT);
  CU_REQUIRE_ERR(cuStreamGetGreenCtx(reinterpret_cast<CUstream>(0x12345), &made), CUDA_ERROR_INVALID_HANDLE);
  CU_REQUIRE(cuGreenCtxDestroy(g));
  CU_REQUIRE(cuEventDestroy(e));
}

TEST_CASE("cuGetProcAddress answers green-context functions from their CUDA versions",
          "[gpu_double][green][double_only]") {
  CU_REQUIRE(cuInit(0));
  void* fn = nullptr;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
  CU_REQUIRE_ERR(cuGetProcAddress("cuGreenCtxCreate", &fn, 12030, 0, &st), CUDA_ERROR_NOT_FOUND);
  CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  CU_REQUIRE(cuGetProcAddress("cuGreenCtxCreate", &fn, 12040, 0, &st));
  CHECK(fn == reinterpret_cast<void*>(&cuGreenCtxCreate));
  CU_REQUIRE_ERR(cuGetProcAddress("cuGreenCtxStreamCreate", &fn, 12040, 0, &st), CUDA_ERROR_NOT_FOUND);
  CU_REQUIRE(cuGetProcAddress("cuGreenCtxStreamCreate", &fn, 12050, 0, &st));
  CU_REQUIRE_ERR(cuGetProcAddress("cuGreenCtxGetId", &fn, 12080, 0, &st), CUDA_ERROR_NOT_FOUND);
  CU_REQUIRE(cuGetProcAddress("cuGreenCtxGetId", &fn, 12090, 0, &st));
  CU_REQUIRE(cuGetProcAddress("cuStreamGetCtx", &fn, 12040, 0, &st));
  CHECK(fn == reinterpret_cast<void*>(&cuStreamGetCtx));
  CU_REQUIRE(cuGetProcAddress("cuStreamGetCtx", &fn, 13000, 0, &st));
  CHECK(fn == reinterpret_cast<void*>(&cuStreamGetCtx_v2));
  CU_REQUIRE(cuGetProcAddress("cuCtxGetId", &fn, 12000, 0, &st));
}

// IVCUDA_GPU_DOUBLE_KERNEL_US and IVCUDA_GPU_DOUBLE_DEVICES are read once per process: the
// case below runs this binary again with them set, for the hidden case after it.
TEST_CASE("a green context's event waits for its streams' kernels", "[gpu_double][green][double_only]") {
  REQUIRE_KERNELS(kernels_ptx());
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("IVCUDA_GPU_DOUBLE_KERNEL_US", "200000", 1);
    setenv("IVCUDA_GPU_DOUBLE_DEVICES", "2", 1);
    execl("/proc/self/exe", "gpu_double_test", "-w", "NoTests", "green contexts with busy kernels on two devices",
          static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  int status = 0;
  REQUIRE(pid > 0);
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("green contexts with busy kernels on two devices", "[.][gpu_double][green][double_only]") {
  if (std::getenv("IVCUDA_GPU_DOUBLE_KERNEL_US") == nullptr) {
    WARN("SKIP: run by the case above, with IVCUDA_GPU_DOUBLE_KERNEL_US set");
    return;
  }
  CU_REQUIRE(cuInit(0));
  // A descriptor of device 1 makes no green context on device 0.
  auto other = split(device_sms(1), 1, 8);
  other.pop_back();
  const CUdevResourceDesc d1 = desc_of(other);
  CUgreenCtx g = nullptr;
  CU_REQUIRE_ERR(cuGreenCtxCreate(&g, d1, 0, CU_GREEN_CTX_DEFAULT_STREAM), CUDA_ERROR_INVALID_VALUE);
  CU_REQUIRE(cuGreenCtxCreate(&g, d1, 1, CU_GREEN_CTX_DEFAULT_STREAM));
  CUdevice dev = -1;
  CU_REQUIRE(cuCtxGetDevice_v2(&dev, converted(g)));
  CHECK(dev == 1);
  std::vector<CUdevResource> mixed{split(device_sms(0), 1, 8)[0], other[0]};
  CUdevResourceDesc d = nullptr;
  CU_REQUIRE_ERR(cuDevResourceGenerateDesc(&d, mixed.data(), 2), CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  CU_REQUIRE(cuGreenCtxDestroy(g));

  // A kernel keeps its green stream busy; the green context's event completes after it.
  g = make_green(1, 8);
  CU_REQUIRE(cuCtxPushCurrent(converted(g)));
  CUstream idle = nullptr, busy = nullptr;
  CU_REQUIRE(cuGreenCtxStreamCreate(&idle, g, CU_STREAM_NON_BLOCKING, 0));
  CU_REQUIRE(cuStreamCreate(&busy, CU_STREAM_NON_BLOCKING));
  const std::string ptx = kernels_ptx();
  CUmodule m = nullptr;
  CU_REQUIRE(cuModuleLoadData(&m, ptx.c_str()));
  CUfunction f = nullptr;
  CU_REQUIRE(cuModuleGetFunction(&f, m, "ivc_spin_ns"));
  unsigned long long ns = 0;
  void* args[] = {&ns};
  CUevent e = nullptr;
  CU_REQUIRE(cuEventCreate(&e, 0));
  const auto start = std::chrono::steady_clock::now();
  CU_REQUIRE(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, busy, args, nullptr));
  CU_REQUIRE(cuGreenCtxRecordEvent(g, e));
  CU_REQUIRE_ERR(cuEventQuery(e), CUDA_ERROR_NOT_READY);
  CU_REQUIRE(cuStreamQuery(idle));
  CU_REQUIRE(cuEventSynchronize(e));
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(150));
  CU_REQUIRE(cuEventDestroy(e));
  CU_REQUIRE(cuModuleUnload(m));
  CU_REQUIRE(cuStreamDestroy(busy));
  CU_REQUIRE(cuStreamDestroy(idle));
  CU_REQUIRE(cuCtxPopCurrent(nullptr));
  CU_REQUIRE(cuGreenCtxDestroy(g));
}
