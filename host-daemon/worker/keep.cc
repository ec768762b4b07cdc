// Contexts kept for the tenant's next guest (--recycle-workers keep;
// docs/design.md "Recycled workers", docs/security.md "Recycled workers").
//
// A recycled worker that resets its contexts costs the GPU a reset and a new
// context per guest, and the driver makes a GPU's contexts one at a time for
// every process on the host (docs/performance.md, "The driver's context
// queue"): back to back, guests wait for that queue. A worker that keeps its
// context puts nothing in it. It keeps it only where it can take back all
// the guest left there:
//   - the guest used only the calls below: plain allocations, modules,
//     functions, streams, events, launches, copies and queries - nothing
//     that leaves state in the context the worker cannot name (pools, graphs,
//     virtual memory, arrays, IPC, peer access, created contexts, ...);
//   - its context is healthy (no sticky error) and its flags, cache
//     configuration and limits are as the worker first made them (a grown
//     stack would leave local memory the scrub does not reach);
//   - no kernel of the guest called device malloc (the heap's blocks are
//     beyond any scrub's reach: keep_reason);
//   - every allocation is zeroed before the driver has it back (while the
//     guest lives, at each free; at the end, all it still holds), and the
//     worker's own kernels (scrub_kernels.cu) zero each SM's shared memory
//     and every thread's local memory.
// Anything else, or any step failing, and the contexts are reset as before.
#include <cuda.h>

#include <string>

#include "host-daemon/worker/worker.h"
#include "host-daemon/worker/worker_internal.h"
#include "host-daemon/shared/log.h"
#include "host-daemon/shared/rules.h"

#if IVCUDA_HAVE_SCRUB_KERNELS
#include "scrub_kernels_ptx.h"  // generated from scrub_kernels.cu (CMakeLists.txt)
#endif

namespace ivcuda::host {

namespace {

using proto::Op;

// The calls whose effects the scrub takes back. Every other call makes the
// guest's contexts the driver's to reset.
bool scrubbable(Op op) {
  switch (op) {
    case Op::kHello:
    case Op::kDeviceInfo:
    case Op::kPrimaryRetain:
    case Op::kPrimaryRelease:
    case Op::kPrimaryGetState:
    case Op::kPrimarySetFlags:  // the flags are compared at the end
    case Op::kCtxSynchronize:
    case Op::kCtxGetLimit:
    case Op::kCtxSetLimit:      // the limits are compared at the end
    case Op::kCtxMisc:          // flags and cache configuration compared at the end
    case Op::kMemAlloc:
    case Op::kMemFree:
    case Op::kMemGetInfo:
    case Op::kMemGetAddressRange:
    case Op::kMemGranularity:
    case Op::kMemset:
    case Op::kMemcpyHtoDInline:
    case Op::kMemcpyHtoDArena:
    case Op::kMemcpyDtoHArena:
    case Op::kMemcpyDtoHInline:
    case Op::kMemcpyDtoD:
    case Op::kMemcpy2D:
    case Op::kHostAlloc:        // the arena's pages: the next guest has its own
    case Op::kHostFree:
    case Op::kModuleLoad:
    case Op::kModuleUnload:
    case Op::kModuleGetFunction:
    case Op::kModuleGetGlobal:
    case Op::kModuleEnumerate:
    case Op::kFuncGetAttribute:
    case Op::kFuncSetAttribute:
    case Op::kFuncSetCacheConfig:
    case Op::kFuncMisc:
    case Op::kLink:             // the linkers hold host memory only (destroy_links)
    case Op::kLaunch:
    case Op::kLaunchEx:
    case Op::kLaunchCooperative:
    case Op::kOccupancy:
    case Op::kOccupancyCluster:
    case Op::kOccupancyClusterSize:
    case Op::kStreamCreate:
    case Op::kStreamDestroy:
    case Op::kStreamQuery:
    case Op::kStreamSynchronize:
    case Op::kStreamWaitEvent:
    case Op::kStreamGetPriority:
    case Op::kStreamCaptureInfo:  // a query (frameworks ask before every allocation)
    case Op::kEventCreate:
    case Op::kEventRecord:
    case Op::kEventRecordFlags:
    case Op::kEventQuery:
    case Op::kEventSynchronize:
    case Op::kEventElapsedTime:
    case Op::kEventDestroy:
    case Op::kCaptureMode:      // the worker thread's mode, carried over anyway
    case Op::kPeerQuery:
    case Op::kTensorMapEncodeTiled:
    case Op::kTensorMapEncodeIm2col:
    case Op::kTensorMapReplaceAddress:
    case Op::kTexture1DLinearMaxWidth:
    case Op::kNvml:
    case Op::kFlush:
    case Op::kFlushWait:
    case Op::kGoodbye:
    case Op::kStageTrace:
      return true;
    default:
      return false;
  }
}

constexpr CUlimit kLimits[] = {CU_LIMIT_STACK_SIZE,
                               CU_LIMIT_PRINTF_FIFO_SIZE,
                               CU_LIMIT_MALLOC_HEAP_SIZE,
                               CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH,
                               CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT,
                               CU_LIMIT_MAX_L2_FETCH_GRANULARITY,
                               CU_LIMIT_PERSISTING_L2_CACHE_SIZE};

}  // namespace

void Worker::note_op(Op op) noexcept {
  if (keepable_ && IVCUDA_RULE("recycle-keep-only-scrubbable") && !scrubbable(op))
    unkeep(proto::op_name(static_cast<std::uint16_t>(op)));
}

void Worker::unkeep(const char* why) noexcept {
  if (!keepable_) return;
  keepable_ = false;
  unkept_why_ = why;
}

void Worker::record_keep_baseline() noexcept {
  static_assert(std::size(kLimits) == std::size(KeptContext{}.limits));
  kept_.baseline = false;
  if (!cfg_.keep_contexts || arena_ctx_ == nullptr || cu_.cuCtxSetCurrent(arena_ctx_) != CUDA_SUCCESS) return;
  current_ = arena_ctx_;
  if (cu_.cuCtxGetFlags(&kept_.flags) != CUDA_SUCCESS || cu_.cuCtxGetCacheConfig(&kept_.cache) != CUDA_SUCCESS)
    return;
  for (std::size_t i = 0; i < std::size(kLimits); ++i)
    if (cu_.cuCtxGetLimit(&kept_.limits[i], kLimits[i]) != CUDA_SUCCESS) kept_.limits[i] = ~std::size_t{0};
  kept_.baseline = true;
}

const char* Worker::keep_reason() {
  if (!keepable_) return unkept_why_;
  if (!IVCUDA_RULE("recycle-keep-only-scrubbable")) return nullptr;
  if (!kept_.baseline || arena_ctx_ == nullptr) return "no record of the context as first made";
  const char* why = nullptr;
  ctxs_.for_each([&](std::uint64_t, CtxEntry& c) {
    if (why == nullptr && c.real != nullptr && (!c.primary || c.real != arena_ctx_))
      why = "a context other than the first GPU's primary one";
  });
  if (why != nullptr) return why;
  for (std::size_t d = 1; d < devices_.size(); ++d) {
    unsigned flags = 0;
    int active = 0;
    if (cu_.cuDevicePrimaryCtxGetState(devices_[d], &flags, &active) != CUDA_SUCCESS || active != 0)
      return "another GPU's context";
  }
  if (cu_.cuCtxSetCurrent(arena_ctx_) != CUDA_SUCCESS) return "its context cannot be made current";
  current_ = arena_ctx_;
  if (cu_.cuCtxSynchronize() != CUDA_SUCCESS) return "an error in its context";
  unsigned flags = 0;
  CUfunc_cache cache = CU_FUNC_CACHE_PREFER_NONE;
  if (cu_.cuCtxGetFlags(&flags) != CUDA_SUCCESS || flags != kept_.flags) return "its context's flags";
  if (cu_.cuCtxGetCacheConfig(&cache) != CUDA_SUCCESS || cache != kept_.cache) return "its cache configuration";
  for (std::size_t i = 0; i < std::size(kLimits); ++i) {
    std::size_t v = 0;
    if (cu_.cuCtxGetLimit(&v, kLimits[i]) != CUDA_SUCCESS) v = ~std::size_t{0};
    if (v != kept_.limits[i]) {
      keep_why_ = "a context limit (set, or grown by a kernel): limit " + std::to_string(static_cast<int>(kLimits[i])) +
                  " " + std::to_string(kept_.limits[i]) + " -> " + std::to_string(v);
      return keep_why_.c_str();
    }
  }
  for (const auto& [addr, r] : ranges_)
    if (r.kind != RangeKind::kAlloc && r.kind != RangeKind::kGlobal) return "memory other than plain allocations";
  // The device heap: the driver refuses a new heap size once a kernel that
  // calls malloc has run in the context (and the worker's own kernels do
  // not), so a refusal says a guest's kernel may have left blocks there. No
  // kernel can reach every block the heap hands out (measured on an H100:
  // one block of threads taking all it could left 12,278 of 261,632 words
  // of another kernel's freed blocks behind), so such a context is reset.
  if (cu_.cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, kept_.limits[2]) != CUDA_SUCCESS)
    return "the device heap (a kernel called malloc)";
  return nullptr;
}

CUresult Worker::load_scrub_kernels() noexcept {
  if (kept_.module != nullptr) return CUDA_SUCCESS;
#if IVCUDA_HAVE_SCRUB_KERNELS
  CUresult st = cu_.cuModuleLoadData(&kept_.module, kScrubKernelsPtx);
  if (st != CUDA_SUCCESS) {
    kept_.module = nullptr;
    return st;
  }
  if ((st = cu_.cuModuleGetFunction(&kept_.shared, kept_.module, "ivcuda_scrub_shared")) != CUDA_SUCCESS ||
      (st = cu_.cuModuleGetFunction(&kept_.local, kept_.module, "ivcuda_scrub_local")) != CUDA_SUCCESS ||
      (st = cu_.cuStreamCreate(&kept_.stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) {
    (void)cu_.cuModuleUnload(kept_.module);
    kept_.module = nullptr;  // the baseline stays: the next try loads them again
    return st;
  }
  return CUDA_SUCCESS;
#else
  return CUDA_ERROR_NOT_SUPPORTED;  // built without nvcc: no scrub kernels, contexts are reset
#endif
}

CUresult Worker::scrub_range(CUdeviceptr d, std::uint64_t bytes) noexcept {
  if (bytes == 0) return CUDA_SUCCESS;
  if (const CUresult st = load_scrub_kernels(); st != CUDA_SUCCESS) return st;
  if (!IVCUDA_RULE("recycle-keep-scrub")) return CUDA_SUCCESS;
  if (const CUresult st = cu_.cuMemsetD8Async(d, 0, bytes, kept_.stream); st != CUDA_SUCCESS) return st;
  return cu_.cuStreamSynchronize(kept_.stream);
}

bool Worker::scrub_for_next_guest() noexcept {
  if (cu_.cuCtxSetCurrent(arena_ctx_) != CUDA_SUCCESS || load_scrub_kernels() != CUDA_SUCCESS) return false;
  current_ = arena_ctx_;
  bool ok = true;
  const auto step = [&](CUresult st) { ok = ok && st == CUDA_SUCCESS; };
  streams_.for_each([&](std::uint64_t, StreamEntry& e) {
    if (e.real != nullptr) step(cu_.cuStreamDestroy(e.real));
    e.real = nullptr;
  });
  events_.for_each([&](std::uint64_t, EventEntry& e) {
    if (e.real != nullptr) step(cu_.cuEventDestroy(e.real));
    e.real = nullptr;
  });
  // The guest's memory, zeroed, then the driver's again; the globals it
  // named zeroed before their modules go.
  for (auto& [addr, r] : ranges_) {
    step(scrub_range(addr, r.size));
    if (r.kind == RangeKind::kAlloc) step(cu_.cuMemFree(addr));
  }
  ranges_.clear();
  modules_.for_each([&](std::uint64_t, ModuleEntry& m) {
    if (m.real != nullptr) step(cu_.cuModuleUnload(m.real));
    m.real = nullptr;
  });
  if (!ok || !IVCUDA_RULE("recycle-keep-scrub")) return ok;
  // What kernels leave on the GPU outside allocations: each SM's shared
  // memory and every thread slot's local memory (the stack, up to the limit
  // the context was made with; the device heap: keep_reason).
  int sms = 0, smem = 0, threads_per_sm = 0;
  step(cu_.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, devices_[0]));
  step(cu_.cuDeviceGetAttribute(&smem, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, devices_[0]));
  step(cu_.cuDeviceGetAttribute(&threads_per_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, devices_[0]));
  if (!ok || sms <= 0 || smem <= 0 || threads_per_sm <= 0) return false;
  const auto blocks = static_cast<unsigned>(sms);
  unsigned smem_words = static_cast<unsigned>(smem) / 4;
  step(cu_.cuFuncSetAttribute(kept_.shared, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem));
  void* shared_args[] = {&smem_words};
  step(cu_.cuLaunchKernel(kept_.shared, 2 * blocks, 1, 1, 1024, 1, 1, static_cast<unsigned>(smem), kept_.stream,
                          shared_args, nullptr));
  unsigned local_words = static_cast<unsigned>(kept_.limits[0] / 4);
  void* local_args[] = {&local_words};
  const unsigned waves = 2 * ((static_cast<unsigned>(threads_per_sm) + 1023) / 1024);
  step(cu_.cuLaunchKernel(kept_.local, waves * blocks, 1, 1, 1024, 1, 1, 0, kept_.stream, local_args, nullptr));
  step(cu_.cuStreamSynchronize(kept_.stream));
  // The scrub's own frame may have grown the stack the first time: that is
  // the context's baseline from now on (nothing of a guest ran since the
  // comparison in keep_reason).
  if (ok) {
    const std::size_t before = kept_.limits[0];
    if (cu_.cuCtxGetLimit(&kept_.limits[0], CU_LIMIT_STACK_SIZE) != CUDA_SUCCESS) return false;
    if (kept_.limits[0] != before)
      IVLOG_INFO("guest %u: the scrub's kernels set the stack to %zu bytes a thread (was %zu)", cfg_.guest_id,
                 kept_.limits[0], before);
  }
  return ok;
}

}  // namespace ivcuda::host
