// What device memory the driver holds beyond a program's allocations, and
// what a stream capture does with a copy into pageable memory: the figures
// ivcudad's quota charges (host-daemon/worker/contexts.cc, pools.cc; docs/operating.md,
// "Device-memory quotas") and the case its capture rule prevents
// (host-daemon/worker/memory.cc, dtoh_inline). Run natively on an idle GPU
// (tests/gpu/run_all.sh cost); every figure is a cuMemGetInfo difference:
//   context         a created context, then after its first launch
//   limit.*         each limit ivcudad charges, raised, against its formula
//   lmem            a kernel with a 16 KiB stack frame (not charged: the
//                   driver grows local memory at launch)
//   pool.*          a pool's reserve after allocations, frees and syncs
//   capture.*       cuMemcpyDtoHAsync/HtoDAsync with pageable memory in a
//                   capturing stream: refused, or recorded (and written at launch)
// Prints "figure NAME VALUE" lines; exits 0 when every measurement ran.
//   drv_context_cost
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "check.h"

namespace {

constexpr long long kMiB = 1ll << 20;

// The kernels, as PTX the driver compiles at load (checked with ptxas -arch=sm_90).
const char kPtx[] = R"(.version 8.0
.target sm_90
.address_size 64
.extern .func (.param .b64 func_retval0) malloc (.param .b64 malloc_param_0);
.extern .func (.param .b32 func_retval0) vprintf (.param .b64 vprintf_param_0, .param .b64 vprintf_param_1);
.global .align 1 .b8 ivc_cost_fmt[4] = {37, 100, 10, 0};
.visible .entry ivc_cost_empty()
{
	ret;
}
.visible .entry ivc_cost_local(.param .u64 out, .param .u32 idx)
{
	.local .align 8 .b8 frame[16384];
	.reg .b64 %rd<6>;
	.reg .b32 %r<4>;
	ld.param.u64 %rd1, [out];
	ld.param.u32 %r1, [idx];
	and.b32 %r2, %r1, 16383;
	mov.u64 %rd2, frame;
	cvt.u64.u32 %rd3, %r2;
	add.u64 %rd4, %rd2, %rd3;
	st.local.u8 [%rd4], %r1;
	ld.local.u8 %r3, [frame+16383];
	cvta.to.global.u64 %rd5, %rd1;
	st.global.u32 [%rd5], %r3;
	ret;
}
.visible .entry ivc_cost_malloc(.param .u64 out)
{
	.reg .b64 %rd<4>;
	ld.param.u64 %rd1, [out];
	{
	.param .b64 param0;
	st.param.b64 [param0+0], 64;
	.param .b64 retval0;
	call.uni (retval0), malloc, (param0);
	ld.param.b64 %rd2, [retval0+0];
	}
	cvta.to.global.u64 %rd3, %rd1;
	st.global.u64 [%rd3], %rd2;
	ret;
}
.visible .entry ivc_cost_printf(.param .u32 v)
{
	.local .align 8 .b8 args[8];
	.reg .b64 %rd<4>;
	.reg .b32 %r<3>;
	ld.param.u32 %r1, [v];
	st.local.u32 [args], %r1;
	mov.u64 %rd1, ivc_cost_fmt;
	cvta.global.u64 %rd2, %rd1;
	mov.u64 %rd3, args;
	cvta.local.u64 %rd3, %rd3;
	{
	.param .b64 param0;
	st.param.b64 [param0+0], %rd2;
	.param .b64 param1;
	st.param.b64 [param1+0], %rd3;
	.param .b32 retval0;
	call.uni (retval0), vprintf, (param0, param1);
	ld.param.b32 %r2, [retval0+0];
	}
	ret;
}
)";

int g_failed = 0;

// A call whose failure ends a measurement (counted, named, not fatal).
bool ok(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return true;
  std::printf("error: %s -> %s\n", what, check::name(r));
  ++g_failed;
  return false;
}

long long free_bytes() {
  size_t f = 0, t = 0;
  return cuMemGetInfo(&f, &t) == CUDA_SUCCESS ? static_cast<long long>(f) : -1;
}

void figure(const char* name, long long bytes, const char* note = "") {
  std::printf("figure %-34s %10.1f MiB  %s\n", name, static_cast<double>(bytes) / kMiB, note);
}

struct Kernels {
  CUmodule m = nullptr;
  CUfunction empty = nullptr, local = nullptr, malloc_k = nullptr, printf_k = nullptr;
};

// Loads the kernels into the current context.
bool load(Kernels* k) {
  return ok(cuModuleLoadData(&k->m, kPtx), "cuModuleLoadData") &&
         ok(cuModuleGetFunction(&k->empty, k->m, "ivc_cost_empty"), "ivc_cost_empty") &&
         ok(cuModuleGetFunction(&k->local, k->m, "ivc_cost_local"), "ivc_cost_local") &&
         ok(cuModuleGetFunction(&k->malloc_k, k->m, "ivc_cost_malloc"), "ivc_cost_malloc") &&
         ok(cuModuleGetFunction(&k->printf_k, k->m, "ivc_cost_printf"), "ivc_cost_printf");
}

bool launch(CUfunction f, void** params, unsigned blocks = 1) {
  return ok(cuLaunchKernel(f, blocks, 1, 1, 32, 1, 1, 0, nullptr, params, nullptr), "cuLaunchKernel") &&
         ok(cuCtxSynchronize(), "cuCtxSynchronize after a launch");
}

// Created contexts, each measured when made and after a module and a first
// launch in it (the driver makes some of a context's memory lazily).
void contexts(CUdevice dev) {
  std::vector<CUcontext> made;
  std::vector<long long> created, launched;
  for (int i = 0; i < 4; ++i) {
    const long long before = free_bytes();
    CUcontext c = nullptr;
    if (!ok(cuCtxCreate(&c, nullptr, 0, dev), "cuCtxCreate")) break;
    made.push_back(c);
    const long long after = free_bytes();
    Kernels k;
    if (!load(&k) || !launch(k.empty, nullptr)) break;
    created.push_back(before - after);
    launched.push_back(before - free_bytes());
  }
  for (std::size_t i = 0; i < created.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "context.%zu.created", i);
    figure(name, created[i]);
    std::snprintf(name, sizeof name, "context.%zu.after_launch", i);
    figure(name, launched[i], "(with a PTX module loaded and one launch)");
  }
  if (!launched.empty()) {
    std::sort(launched.begin(), launched.end());
    figure("context.median", launched[launched.size() / 2], "ivcudad --context-reserve defaults to 664 MiB");
  }
  for (CUcontext c : made) (void)cuCtxDestroy(c);
}

// One limit raised in a context of its own: measured against ivcudad's charge.
void limit(CUdevice dev, CUlimit l, const char* name, std::uint64_t raise, std::uint64_t per_unit,
           CUfunction Kernels::*use, bool with_out) {
  CUcontext c = nullptr;
  if (!ok(cuCtxCreate(&c, nullptr, 0, dev), "cuCtxCreate")) return;
  Kernels k;
  CUdeviceptr out = 0;
  if (load(&k) && ok(cuMemAlloc(&out, 64), "cuMemAlloc") && launch(k.empty, nullptr)) {
    size_t base = 0, took = 0;
    (void)cuCtxGetLimit(&base, l);
    const long long before = free_bytes();
    if (ok(cuCtxSetLimit(l, base + raise), name)) {
      (void)cuCtxGetLimit(&took, l);
      const long long at_set = before - free_bytes();
      void* p_out[] = {&out};
      unsigned v = 7;
      void* p_v[] = {&v};
      (void)launch(k.*use, with_out ? p_out : p_v);
      const long long at_use = before - free_bytes();
      char label[96], note[160];
      std::snprintf(label, sizeof label, "limit.%s.at_set", name);
      std::snprintf(note, sizeof note, "(%zu -> %zu asked, %zu taken; ivcudad charges %.1f MiB)", base,
                    static_cast<size_t>(base + raise), took,
                    static_cast<double>((took > base ? took - base : 0) * per_unit) / kMiB);
      figure(label, at_set, note);
      std::snprintf(label, sizeof label, "limit.%s.after_use", name);
      figure(label, at_use, "(after a launch of a kernel that uses it)");
    }
  }
  (void)cuCtxDestroy(c);
}

void limits(CUdevice dev) {
  int sms = 0, per_sm = 0;
  (void)cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  (void)cuDeviceGetAttribute(&per_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev);
  const std::uint64_t threads = static_cast<std::uint64_t>(sms) * static_cast<std::uint64_t>(per_sm);
  std::printf("device: %d SMs x %d threads = %llu resident threads\n", sms, per_sm,
              static_cast<unsigned long long>(threads));
  limit(dev, CU_LIMIT_STACK_SIZE, "stack_plus_1k", 1024, threads, &Kernels::empty, false);
  limit(dev, CU_LIMIT_STACK_SIZE, "stack_plus_16k", 16384, threads, &Kernels::empty, false);
  limit(dev, CU_LIMIT_MALLOC_HEAP_SIZE, "malloc_heap_plus_256m", 256 * kMiB, 1, &Kernels::malloc_k, true);
  limit(dev, CU_LIMIT_PRINTF_FIFO_SIZE, "printf_fifo_plus_256m", 256 * kMiB, 1, &Kernels::printf_k, false);
  limit(dev, CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, "pending_launches_plus_30720", 30720, 64 << 10,
        &Kernels::empty, false);
}

// A kernel's own stack frame: the driver grows local memory for it at launch.
void lmem(CUdevice dev) {
  CUcontext c = nullptr;
  if (!ok(cuCtxCreate(&c, nullptr, 0, dev), "cuCtxCreate")) return;
  Kernels k;
  CUdeviceptr out = 0;
  if (load(&k) && ok(cuMemAlloc(&out, 64), "cuMemAlloc") && launch(k.empty, nullptr)) {
    int local = 0;
    (void)cuFuncGetAttribute(&local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, k.local);
    const long long before = free_bytes();
    unsigned idx = 5;
    void* params[] = {&out, &idx};
    if (launch(k.local, params, 264)) {
      char note[96];
      std::snprintf(note, sizeof note, "(%d bytes of local memory per thread; not charged by ivcudad)", local);
      figure("lmem.kernel_16k_frame", before - free_bytes(), note);
    }
  }
  (void)cuCtxDestroy(c);
}

void pool_attrs(CUmemoryPool p, const char* when) {
  cuuint64_t reserved = 0, used = 0;
  (void)cuMemPoolGetAttribute(p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
  (void)cuMemPoolGetAttribute(p, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
  std::printf("pool %-44s reserved %8.1f MiB, used %8.1f MiB\n", when, static_cast<double>(reserved) / kMiB,
              static_cast<double>(used) / kMiB);
}

// A pool's reserve: what it keeps beyond its allocations, after frees with
// and without a synchronisation, at release threshold 0 and at the maximum.
void pools(CUdevice dev) {
  CUcontext c = nullptr;
  if (!ok(cuCtxCreate(&c, nullptr, 0, dev), "cuCtxCreate")) return;
  CUstream s = nullptr;
  CUmemoryPool pool = nullptr;
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = dev;
  if (ok(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate") && ok(cuMemPoolCreate(&pool, &props), "pool")) {
    const long long base = free_bytes();
    CUdeviceptr a = 0;
    if (ok(cuMemAllocFromPoolAsync(&a, 2 * kMiB, pool, s), "2 MiB") && ok(cuStreamSynchronize(s), "sync")) {
      pool_attrs(pool, "after a 2 MiB allocation");
      figure("pool.after_2mib_alloc", base - free_bytes(), "(ivcudad charges 2 MiB and reserved - used)");
      (void)cuMemFreeAsync(a, s);
      pool_attrs(pool, "right after its cuMemFreeAsync (no sync)");
      figure("pool.after_free_no_sync", base - free_bytes());
      (void)cuStreamSynchronize(s);
      pool_attrs(pool, "after a sync, threshold 0");
      figure("pool.after_free_sync_threshold0", base - free_bytes());
    }
    cuuint64_t most = ~0ull;
    (void)cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &most);
    if (ok(cuMemAllocFromPoolAsync(&a, 256 * kMiB, pool, s), "256 MiB") && ok(cuMemFreeAsync(a, s), "free") &&
        ok(cuStreamSynchronize(s), "sync")) {
      pool_attrs(pool, "256 MiB freed and synced, threshold max");
      figure("pool.kept_threshold_max", base - free_bytes(), "(the reserve ivcudad keeps charged)");
      (void)cuMemPoolTrimTo(pool, 0);
      pool_attrs(pool, "after cuMemPoolTrimTo(0)");
      figure("pool.after_trim", base - free_bytes());
    }
    (void)cuMemPoolDestroy(pool);
  }
  if (s != nullptr) (void)cuStreamDestroy(s);
  (void)cuCtxDestroy(c);
}

// A copy between the device and pageable memory in a capturing stream: does
// driver 580 refuse it, or record a node that names the host buffer (which
// ivcudad's worker must then never let happen with its own memory)?
void capture_copy(CUstream s, CUdeviceptr d, bool dtoh) {
  std::vector<unsigned char> host(8192, 0);
  const char* tag = dtoh ? "capture.dtoh_pageable" : "capture.htod_pageable";
  if (!ok(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture")) return;
  const CUresult copy = dtoh ? cuMemcpyDtoHAsync(host.data(), d, host.size(), s)
                             : cuMemcpyHtoDAsync(d, host.data(), host.size(), s);
  CUgraph g = nullptr;
  const CUresult end = cuStreamEndCapture(s, &g);
  size_t nodes = 0;
  if (end == CUDA_SUCCESS && g != nullptr) (void)cuGraphGetNodes(g, nullptr, &nodes);
  std::printf("%s: copy -> %s, end capture -> %s, %zu node(s)\n", tag, check::name(copy), check::name(end), nodes);
  if (end != CUDA_SUCCESS || g == nullptr || nodes == 0) {
    std::printf("figure %s recorded 0 (refused or not a node)\n", tag);
    if (g != nullptr) (void)cuGraphDestroy(g);
    return;
  }
  std::printf("figure %s recorded 1 (the node names the host buffer)\n", tag);
  if (!dtoh) {
    (void)cuGraphDestroy(g);
    return;
  }
  // The buffer still lives here: a launch shows whether the node writes it.
  CUgraphExec exec = nullptr;
  if (ok(cuGraphInstantiate(&exec, g, 0), "cuGraphInstantiate") && ok(cuGraphLaunch(exec, s), "cuGraphLaunch") &&
      ok(cuStreamSynchronize(s), "sync")) {
    const bool written = std::all_of(host.begin(), host.end(), [](unsigned char b) { return b == 0x41; });
    std::printf("figure %s_launch_writes %d\n", tag, written ? 1 : 0);
  }
  if (exec != nullptr) (void)cuGraphExecDestroy(exec);
  (void)cuGraphDestroy(g);
}

// What the worker's capture checks rely on: the legacy stream's state during
// another stream's global capture, and a synchronous copy then.
void capture_probes(CUstream s, CUdeviceptr d) {
  if (!ok(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture global")) return;
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult legacy = cuStreamIsCapturing(CU_STREAM_LEGACY, &cs);
  unsigned char b[16];
  const CUresult sync_copy = cuMemcpyDtoH(b, d, sizeof b);
  CUstreamCaptureStatus after = CU_STREAM_CAPTURE_STATUS_NONE;
  (void)cuStreamIsCapturing(s, &after);
  CUgraph g = nullptr;
  const CUresult end = cuStreamEndCapture(s, &g);
  if (g != nullptr) (void)cuGraphDestroy(g);
  std::printf("capture.probe: during a global capture cuStreamIsCapturing(legacy) -> %s (status %d), cuMemcpyDtoH "
              "-> %s, the capture then %s, end -> %s\n",
              check::name(legacy), static_cast<int>(cs), check::name(sync_copy),
              after == CU_STREAM_CAPTURE_STATUS_ACTIVE ? "active" : "invalidated", check::name(end));
}

void capture(CUdevice dev) {
  CUcontext c = nullptr;
  if (!ok(cuCtxCreate(&c, nullptr, 0, dev), "cuCtxCreate")) return;
  CUstream s = nullptr;
  CUdeviceptr d = 0;
  if (ok(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate") && ok(cuMemAlloc(&d, 8192), "cuMemAlloc") &&
      ok(cuMemsetD8(d, 0x41, 8192), "cuMemsetD8")) {
    capture_copy(s, d, true);
    capture_copy(s, d, false);
    capture_probes(s, d);
  }
  if (s != nullptr) (void)cuStreamDestroy(s);
  (void)cuCtxDestroy(c);
}

}  // namespace

int main() {
  if (!ok(cuInit(0), "cuInit")) return 1;
  CUdevice dev = 0;
  CUcontext primary = nullptr;
  if (!ok(cuDeviceGet(&dev, 0), "cuDeviceGet") || !ok(cuDevicePrimaryCtxRetain(&primary, dev), "primary") ||
      !ok(cuCtxSetCurrent(primary), "cuCtxSetCurrent"))
    return 1;
  char name[128] = {};
  (void)cuDeviceGetName(name, sizeof name - 1, dev);
  int version = 0;
  (void)cuDriverGetVersion(&version);
  size_t f = 0, t = 0;
  (void)cuMemGetInfo(&f, &t);
  std::printf("%s, driver %d: %.1f MiB total, %.1f MiB free with the primary context\n", name, version,
              static_cast<double>(t) / kMiB, static_cast<double>(f) / kMiB);
  contexts(dev);
  limits(dev);
  lmem(dev);
  pools(dev);
  capture(dev);
  (void)cuCtxSetCurrent(primary);
  (void)cuDevicePrimaryCtxRelease(dev);
  std::printf("drv_context_cost: %d measurement(s) failed\n", g_failed);
  return g_failed == 0 ? 0 : 1;
}
