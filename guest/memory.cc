// Device memory, copies (1D, 2D, unified addressing; pageable ones pipelined
// through the staging slots) and memsets, page-locked memory in the arena,
// registered memory's entry points, and pointer attributes. The host side is
// host-daemon/worker/memory.cc. Definitions use the plain cuda.h names: its macros
// select the ABI variant a CUDA 13 caller links against (cuMemAlloc ->
// cuMemAlloc_v2). Exceptions never cross this boundary: every body runs
// inside guard().
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "guest/arrays.h"
#include "guest/errors.h"
#include "guest/export_tables.h"
#include "guest/guard.h"
#include "guest/graphs.h"
#include "guest/host_register.h"
#include "guest/internal.h"
#include "guest/managed.h"
#include "guest/runtime.h"
#include "guest/family.h"

using ivcuda::guest::internal::is_device;
using ivcuda::guest::internal::in_device_alloc;

namespace {

// The most bytes a pageable copy carries in its record (HtoD) or its reply
// (DtoH): proto's bound, or a quarter of what a record of this BAR's rings
// may hold, so that small rings still take a few copies at once.
std::uint64_t inline_limit(Runtime* rt) {
  const std::uint64_t record = rt->layout().ring_bytes / 2 - sizeof(ivcuda::abi::RecordHeader);
  return std::min<std::uint64_t>(proto::kInlineCopyMax, record / 4);
}

// A 1D copy request: which fields matter depends on the op (proto.h).
proto::ReqCopy copy_req(std::uint64_t ctx, CUstream s, CUdeviceptr dst, CUdeviceptr src, size_t n, bool async) {
  proto::ReqCopy r{};
  r.ctx = ctx;
  r.stream = h(s);
  r.dst = dst;
  r.src = src;
  r.bytes = n;
  r.flags = async ? proto::kAsync : 0;
  return r;
}

// Pageable copies go through the calling thread's channel staging area, cut
// into a few slots so that the guest's memcpy of one chunk overlaps the
// host's DMA of another. Slot reuse is ordered by the channel's staging_done
// counter (shm_abi.h), which the host bumps as each staged chunk finishes.
constexpr std::uint32_t kStagingSlots = 4;
constexpr std::uint64_t kMinChunk = 4096;

struct Staging {
  std::uint64_t off = 0;    // BAR offset of the area
  std::uint64_t chunk = 0;  // bytes per slot
  std::uint32_t slots = 0;
  std::uint32_t ch = 0;     // channel index (the counter's home)
  bool pipelined = false;   // the host bumps staging_done (ABI minor >= 1)
  bool flush_wait = false;  // the host knows FlushWait (ABI minor >= 4)
  // Chunk number a (ChannelStaging) lies in slot a % slots.
  std::uint64_t slot_off(std::uint64_t a) const { return off + (a % slots) * chunk; }
};

// nullopt when the daemon gave no room for staging (--staging-size too small).
std::optional<Staging> staging_of(Runtime* rt) {
  const auto& l = rt->layout();
  if (l.staging_bytes < kMinChunk) return std::nullopt;
  Staging g;
  g.off = rt->staging_off();
  g.ch = static_cast<std::uint32_t>((g.off - l.arena_off) / l.staging_bytes);
  g.slots = kStagingSlots;
  while (g.slots > 1 && l.staging_bytes / g.slots < kMinChunk) g.slots /= 2;
  // Whole pages per slot: both memcpys and the DMA like aligned chunks.
  g.chunk = l.staging_bytes / g.slots / kMinChunk * kMinChunk;
  const auto minor = ivcuda::ring::load_relaxed(ivcuda::ring::superblock(rt->bar())->abi_minor);
  g.pipelined = minor >= 1;
  g.flush_wait = minor >= 4;
  return g;
}

// Big memcpys into and out of the staging slots, split across a few helper
// threads: one core moves about 10 GB/s between cold pageable memory and the
// arena, the GPU's DMA several times that. The caller copies a share too, so
// a job finishes even if no helper wakes in time. One job at a time; a second
// thread that finds the pool busy copies alone.
class CopyPool {
 public:
  static constexpr std::size_t kMinPart = 256 * 1024;

  // The process's pool, or nullptr when IVCUDA_COPY_THREADS (the number of
  // threads copying, caller included) or the machine says one is enough.
  static CopyPool* get() {
    CopyPool* p = g_pool.load(std::memory_order_acquire);
    if (p != nullptr || g_disabled.load(std::memory_order_relaxed)) return p;
    unsigned ways = default_ways();
    if (const char* e = std::getenv("IVCUDA_COPY_THREADS"); e != nullptr && *e != '\0')
      ways = static_cast<unsigned>(std::clamp(std::atoi(e), 1, 16));
    if (ways <= 1) {
      g_disabled.store(true, std::memory_order_relaxed);
      return nullptr;
    }
    auto* fresh = new CopyPool(ways);
    CopyPool* expect = nullptr;
    if (!g_pool.compare_exchange_strong(expect, fresh, std::memory_order_acq_rel)) {
      delete fresh;  // lost the race; its helpers were never started
      return expect;
    }
    static std::once_flag atfork;
    // A forked child has none of the helpers: it starts a pool of its own.
    std::call_once(atfork, [] { ::pthread_atfork(nullptr, nullptr, [] { g_pool.store(nullptr); }); });
    fresh->start();
    return fresh;
  }

  // Threads copying by default, caller included: half the cores this process
  // may run on, at most four, at least one. The other half is left to the
  // program's own threads and, in process mode, to the worker that DMAs the
  // chunks; four already copy faster than one chunk's DMA takes.
  static unsigned default_ways() {
    cpu_set_t set;
    unsigned cores = 0;
    if (::sched_getaffinity(0, sizeof set, &set) == 0) cores = static_cast<unsigned>(CPU_COUNT(&set));
    if (cores == 0) cores = std::thread::hardware_concurrency();
    return std::clamp(cores / 2, 1u, 4u);
  }

  // memcpy(dst, src, n), in parallel when it is worth it.
  void copy(std::byte* dst, const std::byte* src, std::size_t n) {
    const auto parts = static_cast<unsigned>(std::min<std::size_t>(ways_, n / kMinPart));
    std::unique_lock job(job_mu_, std::try_to_lock);
    if (parts <= 1 || !job.owns_lock()) {
      std::memcpy(dst, src, n);
      return;
    }
    {
      std::lock_guard lk(mu_);
      dst_ = dst;
      src_ = src;
      n_ = n;
      parts_ = parts;
      next_ = 0;
      left_ = parts;
      gen_.fetch_add(1, std::memory_order_relaxed);  // under mu_: the cv predicate sees it
    }
    work_cv_.notify_all();
    work();
    std::unique_lock lk(mu_);
    // Pairs with the helpers' unlock after their part: their writes to dst
    // happen before this returns (and before the chunk is posted).
    done_cv_.wait(lk, [&] { return left_ == 0; });
  }

 private:
  explicit CopyPool(unsigned ways) : ways_(ways) {}
  void start() {
    // Detached and never joined: the pool lives as long as the process, so
    // this library must too (cudart dlopens libcuda; a dlclose would pull
    // the code from under the helpers).
    static const char anchor = 0;
    Dl_info self{};
    if (::dladdr(&anchor, &self) != 0 && self.dli_fname != nullptr)
      (void)::dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
    for (unsigned i = 1; i < ways_; ++i) std::thread([this] { helper(); }).detach();
  }
  void helper() {
    std::uint64_t seen = 0;
    for (;;) {
      // The chunks of one big copy come tens of microseconds apart: spin
      // for the next job a while rather than pay a futex wake-up per chunk.
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
      for (unsigned i = 0; gen_.load(std::memory_order_relaxed) == seen; ++i) {
        if ((i & 63) == 0 && std::chrono::steady_clock::now() > until) {
          std::unique_lock lk(mu_);
          work_cv_.wait(lk, [&] { return gen_.load(std::memory_order_relaxed) != seen; });
          break;
        }
        ivcuda::ring::cpu_relax();
      }
      // The job itself is read under mu_ in work(); gen_ only says "look".
      seen = gen_.load(std::memory_order_relaxed);
      work();
    }
  }
  // Takes parts of the current job until none is left.
  void work() {
    for (;;) {
      std::byte* d;
      const std::byte* s;
      std::size_t len;
      {
        std::lock_guard lk(mu_);
        if (next_ == parts_) return;
        // Parts are whole multiples of 64 bytes from the start, so that
        // neighbouring parts share at most a line when dst is misaligned.
        const std::size_t per = (n_ / parts_ + 63) / 64 * 64;
        const std::size_t begin = std::min(n_, std::size_t{next_} * per);
        len = next_ + 1 == parts_ ? n_ - begin : std::min(per, n_ - begin);
        d = dst_ + begin;
        s = src_ + begin;
        ++next_;
      }
      std::memcpy(d, s, len);
      std::lock_guard lk(mu_);
      if (--left_ == 0) done_cv_.notify_one();
    }
  }

  static inline std::atomic<CopyPool*> g_pool{nullptr};
  static inline std::atomic<bool> g_disabled{false};
  const unsigned ways_;
  std::mutex job_mu_;  // one job at a time
  std::mutex mu_;      // the job below and the helpers' wake-up
  std::condition_variable work_cv_, done_cv_;
  std::atomic<std::uint64_t> gen_{0};  // bumped per job; helpers wait for a new value
  std::byte* dst_ = nullptr;
  const std::byte* src_ = nullptr;
  std::size_t n_ = 0;
  unsigned parts_ = 0, next_ = 0, left_ = 0;
};

void staging_copy(void* dst, const void* src, std::size_t n) {
  if (CopyPool* pool = n >= 2 * CopyPool::kMinPart ? CopyPool::get() : nullptr) {
    pool->copy(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), n);
    return;
  }
  std::memcpy(dst, src, n);
}

// A channel's staged chunks, numbered as the host's staging_done counts
// them: chunk a lies in slot a % slots, and may be written (HtoD) or asked
// for (DtoH) once chunk a - slots is done, i.e. once the counter passed
// a - slots + 1. The numbering runs on across copies, because a pageable HtoD
// returns with its last chunks still in flight (CUDA's returns once the
// source is staged, before the DMA) and the next copy's chunks queue behind
// them. A channel stays with the process that claimed it, so this is kept per
// process; its threads (the overflow channel's) take turns under the mutex.
// The first use in the process starts from the counter's value: a channel a
// VM's earlier process left behind has nothing in flight any more (its worker
// was reaped before the channel was freed).
struct ChannelStaging {
  std::mutex mu;
  bool known = false;
  std::uint64_t posted = 0;  // the counter's value once every chunk posted so far is done
};

ChannelStaging& channel_staging(std::uint32_t ch) {
  static ChannelStaging cs[ivcuda::abi::kMaxChannels];
  return cs[ch % ivcuda::abi::kMaxChannels];
}

// Holds the channel's staging area for the calling thread.
std::unique_lock<std::mutex> hold_staging(Runtime* rt, const Staging& g, ChannelStaging& cs) {
  std::unique_lock lk(cs.mu);
  if (!cs.known) {
    cs.posted = ivcuda::ring::staging_done(rt->bar(), rt->layout(), g.ch);
    cs.known = true;
  }
  return lk;
}

// Whether the counter has reached `target` (free-running: compared by difference).
bool reached(Runtime* rt, const Staging& g, std::uint64_t target) {
  return static_cast<std::int64_t>(ivcuda::ring::staging_done(rt->bar(), rt->layout(), g.ch) - target) >= 0;
}

// Waits until the counter reaches `target`. Spins first (a chunk's DMA takes
// tens of microseconds), then naps; a wait that takes longer (the chunk's
// stream is busy with a long kernel, or the host is gone) becomes a Flush
// round trip: the host answers FlushWait once every chunk the channel posted
// before it is done. It is no synchronising call: errors of posted work stay
// for the next one (whether a wait takes this path depends on timing).
CUresult wait_staged(Runtime* rt, std::uint64_t ctx, const Staging& g, ChannelStaging& cs, std::uint64_t target) {
  const auto t0 = std::chrono::steady_clock::now();
  for (unsigned i = 0;; ++i) {
    if (reached(rt, g, target)) return CUDA_SUCCESS;
    if ((i & 255) != 0) {
      ivcuda::ring::cpu_relax();
      continue;
    }
    const auto waited = std::chrono::steady_clock::now() - t0;
    if (waited > std::chrono::milliseconds(2)) break;
    if (waited > std::chrono::microseconds(200)) ::usleep(20);
  }
  // A host of minor <= 3 has only Flush (which reports posted errors).
  const CUresult st = g.flush_wait ? rt->call<Op::kFlushWait>(proto::ReqCtx{ctx}) : rt->call<Op::kFlush>(proto::ReqCtx{ctx});
  if (st != CUDA_SUCCESS || reached(rt, g, target)) return st;
  // The daemon counted fewer chunks than were posted: start again from its
  // count rather than wait for chunks it will never count.
  cs.posted = ivcuda::ring::staging_done(rt->bar(), rt->layout(), g.ch);
  ivcuda::guest::log_once("staging-counter", "the daemon did not account for a staged copy; failing it");
  return CUDA_ERROR_UNKNOWN;
}

// Makes chunk number a's slot free (see ChannelStaging).
CUresult wait_slot(Runtime* rt, std::uint64_t ctx, const Staging& g, ChannelStaging& cs, std::uint64_t a) {
  return wait_staged(rt, ctx, g, cs, a + 1 - g.slots);
}

// Host-to-device from guest memory: page-locked memory DMAs straight from the
// arena; small pageable copies ride inline; large ones go through the
// channel's staging area chunk by chunk.
// Where [p, p + n) lies in arena memory the host's DMA reaches directly:
// cuMemHostAlloc memory, or memory registered with cuMemHostRegister (whose
// pages were moved onto one contiguous run of arena pages).
std::optional<std::uint64_t> arena_offset_of(Runtime* rt, const void* p, size_t n) {
  if (auto off = rt->pinned_offset(p, n)) return off;
  const auto reg = ivcuda::guest::hostreg::find(rt, p);
  if (!reg || reg->dptr == 0) return std::nullopt;  // dptr 0: shared-mapping memory, staged
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (n > reg->size - (a - reg->base)) return std::nullopt;
  return reg->dptr - rt->hello().arena_device_base;
}

CUresult htod_body(Runtime* rt, std::uint64_t ctx, CUdeviceptr dst, const void* src, size_t n, CUstream s,
                   bool async) {
  if (n == 0) return CUDA_SUCCESS;
  if (src == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::ReqCopy r = copy_req(ctx, s, dst, 0, n, async);
  if (auto off = arena_offset_of(rt, src, n)) {
    r.arena_off = *off;
    return async ? rt->post<Op::kMemcpyHtoDArena>(r) : rt->call<Op::kMemcpyHtoDArena>(r);
  }
  // A pageable copy returns once its source is captured, synchronous or not,
  // as CUDA's does: errors of the copy itself surface at the next
  // synchronising call. The host orders it in its stream (the legacy stream
  // for a synchronous one) and later work in the context after it.
  // A destination that runs past the allocation it starts in is refused at
  // once, as the driver does. A synchronous copy to memory outside the
  // guest's books (a mapped range, a module's global, an address that is
  // nothing) waits for the host's answer, as the driver refuses a bad
  // destination at once; it ends with a call (the last chunk).
  const auto where = ivcuda::guest::internal::device_range(rt, dst, n);
  if (where == ivcuda::guest::internal::DevRange::kOverruns) return CUDA_ERROR_INVALID_VALUE;
  const bool answer_now = !async && where != ivcuda::guest::internal::DevRange::kInside;
  if (n <= inline_limit(rt)) {
    const std::span<const std::byte> data(static_cast<const std::byte*>(src), n);
    return answer_now ? rt->call<Op::kMemcpyHtoDInline>(r, data) : rt->post<Op::kMemcpyHtoDInline>(r, data);
  }
  const auto g = staging_of(rt);
  if (!g) {
    return ivcuda::guest::not_supported("the daemon reserved no staging memory; pageable copies fail");
  }
  const auto* p = static_cast<const std::byte*>(src);
  ChannelStaging& cs = channel_staging(g->ch);
  const auto lk = hold_staging(rt, *g, cs);
  // Chunk by chunk into the next slot, once the chunk that was there is
  // done. Every chunk is posted, the last too: when this returns the source
  // may be reused, and the host still DMAs the last few chunks.
  for (std::uint64_t done = 0; done < n;) {
    r.dst = dst + done;
    r.bytes = std::min<std::uint64_t>(g->chunk, n - done);
    if (!g->pipelined) {
      // A daemon that does not count chunks copies each before it answers.
      r.arena_off = g->off;
      staging_copy(rt->bar() + r.arena_off, p + done, r.bytes);
      if (CUresult st = rt->call<Op::kMemcpyHtoDArena>(r); st != CUDA_SUCCESS) return st;
      done += r.bytes;
      continue;
    }
    const std::uint64_t a = cs.posted;
    if (CUresult st = wait_slot(rt, ctx, *g, cs, a); st != CUDA_SUCCESS) return st;
    r.arena_off = g->slot_off(a);
    staging_copy(rt->bar() + r.arena_off, p + done, r.bytes);
    cs.posted = a + 1;  // the host counts it whatever becomes of it
    const bool last = done + r.bytes == n;
    if (CUresult st = answer_now && last ? rt->call<Op::kMemcpyHtoDArena>(r) : rt->post<Op::kMemcpyHtoDArena>(r);
        st != CUDA_SUCCESS)
      return st;
    done += r.bytes;
  }
  return CUDA_SUCCESS;
}

// Device-to-host into guest memory. A small pageable destination gets its
// bytes in the reply; a larger one is filled through the staging slots: the
// host DMAs chunk k + 1 while the guest copies chunk k out. The copy is
// synchronous, as CUDA's is, and an Async one is still ordered in its stream.
CUresult dtoh_body(Runtime* rt, std::uint64_t ctx, void* dst, CUdeviceptr src, size_t n, CUstream s, bool async) {
  if (n == 0) return CUDA_SUCCESS;
  if (dst == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::ReqCopy r = copy_req(ctx, s, 0, src, n, async);
  if (auto off = arena_offset_of(rt, dst, n)) {
    r.arena_off = *off;
    return async ? rt->post<Op::kMemcpyDtoHArena>(r) : rt->call<Op::kMemcpyDtoHArena>(r);
  }
  auto* p = static_cast<std::byte*>(dst);
  if (n <= inline_limit(rt)) {
    thread_local std::vector<std::byte> data;
    proto::RepCopyInline rep{};
    const CUresult st = rt->call<Op::kMemcpyDtoHInline>(r, {}, &rep, &data);
    if (st != CUDA_SUCCESS) return st;
    if (rep.bytes != n || data.size() != n) return CUDA_ERROR_UNKNOWN;
    std::memcpy(p, data.data(), n);
    return CUDA_SUCCESS;
  }
  const auto g = staging_of(rt);
  if (!g) {
    return ivcuda::guest::not_supported("the daemon reserved no staging memory; pageable copies fail");
  }
  const std::uint64_t chunks = (n + g->chunk - 1) / g->chunk;
  ChannelStaging& cs = channel_staging(g->ch);
  const auto lk = hold_staging(rt, *g, cs);
  const std::uint64_t first = cs.posted;  // the number of chunk 0 (ChannelStaging)
  auto request = [&](std::uint64_t k) {
    r.src = src + k * g->chunk;
    r.bytes = std::min<std::uint64_t>(g->chunk, n - k * g->chunk);
    r.arena_off = g->pipelined ? g->slot_off(first + k) : g->off;
  };
  if (chunks == 1 || !g->pipelined) {
    // One round trip per chunk: the reply says the data is in the slot.
    for (std::uint64_t k = 0; k < chunks; ++k) {
      if (g->pipelined)
        if (CUresult st = wait_slot(rt, ctx, *g, cs, first + k); st != CUDA_SUCCESS) return st;
      request(k);
      if (g->pipelined) cs.posted = first + k + 1;
      if (CUresult st = rt->call<Op::kMemcpyDtoHArena>(r); st != CUDA_SUCCESS) return st;
      staging_copy(p + k * g->chunk, rt->bar() + r.arena_off, r.bytes);
    }
    return CUDA_SUCCESS;
  }
  // Requests run `slots` chunks ahead of the guest's memcpy; a slot is asked
  // for again only after its previous chunk was copied out (or, for the
  // first few, once the chunks still in flight before this copy are done).
  std::uint64_t asked = 0;
  auto ask_upto = [&](std::uint64_t end) {
    for (; asked < std::min(end, chunks); ++asked) {
      if (CUresult st = wait_slot(rt, ctx, *g, cs, first + asked); st != CUDA_SUCCESS) return st;
      request(asked);
      cs.posted = first + asked + 1;
      if (CUresult st = rt->post<Op::kMemcpyDtoHArena>(r); st != CUDA_SUCCESS) return st;
    }
    return CUDA_SUCCESS;
  };
  CUresult st = ask_upto(g->slots);
  for (std::uint64_t k = 0; k < chunks && st == CUDA_SUCCESS; ++k) {
    st = wait_staged(rt, ctx, *g, cs, first + k + 1);
    if (st != CUDA_SUCCESS) break;
    const std::uint64_t at = k * g->chunk;
    staging_copy(p + at, rt->bar() + g->slot_off(first + k), std::min<std::uint64_t>(g->chunk, n - at));
    st = ask_upto(k + 1 + g->slots);
  }
  // The data is all here; a chunk that failed left garbage in its slot, so
  // Flush collects the errors of the posted chunks (posted work reports at
  // the next synchronising call, and this copy is one).
  return st == CUDA_SUCCESS ? rt->call<Op::kFlush>(proto::ReqCtx{ctx}) : st;
}

// A synchronous device-to-device copy is asynchronous with respect to the
// host in CUDA ("no host-side synchronization is performed"): between
// allocations the guest knows, it is posted too; its errors come with the
// next synchronising call. Other memory (mapped ranges, imports) keeps the
// round trip, so that what the host refuses is answered at once.
CUresult copy_dtod(Runtime* rt, std::uint64_t ctx, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s,
                   bool async) {
  // Zero bytes are nothing to do, wherever they point (XLA copies its empty
  // buffers, at address 0); the driver does not look at the pointers either.
  if (n == 0) return CUDA_SUCCESS;
  if (ivcuda::guest::managed::any()) {
    if (CUresult st = ivcuda::guest::managed::device_use(rt, src, n, false); st != CUDA_SUCCESS) return st;
    if (CUresult st = ivcuda::guest::managed::device_use(rt, dst, n, true); st != CUDA_SUCCESS) return st;
  }
  const proto::ReqCopy r = copy_req(ctx, s, dst, src, n, async);
  if (async || (n != 0 && in_device_alloc(rt, dst, n) && in_device_alloc(rt, src, n)))
    return rt->post<Op::kMemcpyDtoD>(r);
  return rt->call<Op::kMemcpyDtoD>(r);
}

// Host memory that is managed memory (guest/managed.cc) is device memory to
// a copy: it goes device to device, after the CPU's writes went back.
CUresult copy_htod(Runtime* rt, std::uint64_t ctx, CUdeviceptr dst, const void* src, size_t n, CUstream s,
                   bool async) {
  if (ivcuda::guest::managed::any() && n != 0) {
    if (ivcuda::guest::managed::contains(src, n))
      return copy_dtod(rt, ctx, dst, reinterpret_cast<CUdeviceptr>(src), n, s, async);
    if (CUresult st = ivcuda::guest::managed::device_use(rt, dst, n, true); st != CUDA_SUCCESS) return st;
  }
  return htod_body(rt, ctx, dst, src, n, s, async);
}

CUresult copy_dtoh(Runtime* rt, std::uint64_t ctx, void* dst, CUdeviceptr src, size_t n, CUstream s, bool async) {
  if (ivcuda::guest::managed::any() && n != 0) {
    if (ivcuda::guest::managed::contains(dst, n))
      return copy_dtod(rt, ctx, reinterpret_cast<CUdeviceptr>(dst), src, n, s, async);
    if (CUresult st = ivcuda::guest::managed::device_use(rt, src, n, false); st != CUDA_SUCCESS) return st;
  }
  return dtoh_body(rt, ctx, dst, src, n, s, async);
}

CUresult memset_any(CUdeviceptr d, unsigned value, unsigned elem, size_t pitch, size_t width, size_t height,
                    CUstream s, bool async) {
  NEED_RT();
  NEED_CTX();
  if (async && !known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
  if (width == 0 || height == 0) return CUDA_SUCCESS;  // nothing to set (as copy_dtod)
  proto::ReqMemset r{};
  r.ctx = ctx;
  r.stream = h(s);
  r.dptr = d;
  r.pitch = pitch;
  r.width = width;
  r.height = height;
  r.value = value;
  r.elem_size = elem;
  r.flags = async ? proto::kAsync : 0;
  // The synchronous memsets are asynchronous with respect to the host for
  // device memory (CUDA's API synchronization behaviour): posted when the
  // whole footprint lies in one allocation the guest knows.
  std::uint64_t row = 0, rows = 0, extent = 0;
  const bool sized = !__builtin_mul_overflow(std::uint64_t{width}, std::uint64_t{elem}, &row) &&
                     !__builtin_mul_overflow(std::uint64_t{height > 1 ? height - 1 : 0}, std::uint64_t{pitch}, &rows) &&
                     !__builtin_add_overflow(rows, row, &extent);
  if (sized && width != 0 && height != 0)
    if (CUresult st = ivcuda::guest::managed::device_use(rt, d, extent, true); st != CUDA_SUCCESS) return st;
  if (async || (sized && width != 0 && height != 0 && in_device_alloc(rt, d, extent)))
    return rt->post<Op::kMemset>(r);
  return rt->call<Op::kMemset>(r);
}

// 2D copies: host memory must be in the arena for the host to reach it. A
// pageable side is staged row by row through the staging area, in as many
// bands of rows as it takes.
CUresult copy_2d(const CUDA_MEMCPY2D* p, CUstream s, bool async, bool unaligned) {
  NEED_RT();
  NEED_CTX();
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (async && !known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
  CUDA_MEMCPY2D c = *p;
  auto resolve = [&](CUmemorytype& t, const void* host, CUdeviceptr dev) {
    if (t == CU_MEMORYTYPE_UNIFIED) {
      t = is_device(rt, dev) ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
      return t == CU_MEMORYTYPE_HOST ? reinterpret_cast<const void*>(dev) : host;
    }
    return host;
  };
  const void* src_host = resolve(c.srcMemoryType, c.srcHost, c.srcDevice);
  const void* dst_host = resolve(c.dstMemoryType, c.dstHost, c.dstDevice);
  if (c.srcMemoryType == CU_MEMORYTYPE_ARRAY || c.dstMemoryType == CU_MEMORYTYPE_ARRAY)
    return ivcuda::guest::copy_2d_array(*p, s, async);
  if (c.WidthInBytes == 0 || c.Height == 0) return CUDA_SUCCESS;
  if (ivcuda::guest::managed::any()) {
    // Managed memory on either side is device memory (guest/managed.cc):
    // what the CPU wrote in the footprint goes back first.
    auto as_device = [&](CUmemorytype& t, const void*& host, CUdeviceptr& dev, size_t x, size_t y, size_t pitch,
                         bool writes) {
      const size_t pt = pitch ? pitch : c.WidthInBytes;
      const std::uint64_t span = (y + c.Height - 1) * pt + x + c.WidthInBytes;
      if (t == CU_MEMORYTYPE_HOST && host != nullptr && ivcuda::guest::managed::contains(host, span)) {
        t = CU_MEMORYTYPE_DEVICE;
        dev = reinterpret_cast<CUdeviceptr>(host);
        host = nullptr;
      }
      if (t != CU_MEMORYTYPE_DEVICE) return CUDA_SUCCESS;
      return ivcuda::guest::managed::device_use(rt, dev, span, writes);
    };
    if (CUresult st = as_device(c.srcMemoryType, src_host, c.srcDevice, c.srcXInBytes, c.srcY, c.srcPitch, false);
        st != CUDA_SUCCESS)
      return st;
    if (CUresult st = as_device(c.dstMemoryType, dst_host, c.dstDevice, c.dstXInBytes, c.dstY, c.dstPitch, true);
        st != CUDA_SUCCESS)
      return st;
  }
  proto::ReqCopy2D r{};
  r.ctx = ctx;
  r.stream = h(s);
  r.width_bytes = c.WidthInBytes;
  r.src_type = c.srcMemoryType;
  r.dst_type = c.dstMemoryType;
  r.unaligned = unaligned ? 1 : 0;
  // Bytes from a host base pointer to the end of the copied region.
  auto host_span = [&](size_t x, size_t y, size_t pitch, size_t rows) -> size_t {
    return (y + rows - 1) * pitch + x + c.WidthInBytes;
  };
  const size_t src_pitch = c.srcPitch ? c.srcPitch : c.WidthInBytes;
  const size_t dst_pitch = c.dstPitch ? c.dstPitch : c.WidthInBytes;
  std::optional<std::uint64_t> src_pin, dst_pin;
  if (c.srcMemoryType == CU_MEMORYTYPE_HOST) {
    if (src_host == nullptr) return CUDA_ERROR_INVALID_VALUE;
    src_pin = rt->pinned_offset(src_host, host_span(c.srcXInBytes, c.srcY, src_pitch, c.Height));
  }
  if (c.dstMemoryType == CU_MEMORYTYPE_HOST) {
    if (dst_host == nullptr) return CUDA_ERROR_INVALID_VALUE;
    dst_pin = rt->pinned_offset(dst_host, host_span(c.dstXInBytes, c.dstY, dst_pitch, c.Height));
  }
  const bool src_staged = c.srcMemoryType == CU_MEMORYTYPE_HOST && !src_pin;
  const bool dst_staged = c.dstMemoryType == CU_MEMORYTYPE_HOST && !dst_pin;
  if (!src_staged && !dst_staged) {
    r.src_x_bytes = c.srcXInBytes;
    r.src_y = c.srcY;
    r.src_device = c.srcDevice;
    r.src_pitch = src_pitch;
    r.dst_x_bytes = c.dstXInBytes;
    r.dst_y = c.dstY;
    r.dst_device = c.dstDevice;
    r.dst_pitch = dst_pitch;
    r.height = c.Height;
    // Page-locked sides: the arena offset of the base pointer; the host
    // applies x, y and pitch and checks the whole footprint.
    if (src_pin) r.src_arena_off = *rt->pinned_offset(src_host, 1);
    if (dst_pin) r.dst_arena_off = *rt->pinned_offset(dst_host, 1);
    r.flags = async ? proto::kAsync : 0;
    return async ? rt->post<Op::kMemcpy2D>(r) : rt->call<Op::kMemcpy2D>(r);
  }
  if (src_staged && dst_staged) {
    // Host to host: CUDA allows it; no GPU needed.
    for (size_t y = 0; y < c.Height; ++y)
      std::memcpy(static_cast<char*>(const_cast<void*>(dst_host)) + (c.dstY + y) * dst_pitch + c.dstXInBytes,
                  static_cast<const char*>(src_host) + (c.srcY + y) * src_pitch + c.srcXInBytes, c.WidthInBytes);
    return CUDA_SUCCESS;
  }
  const std::uint64_t stage = rt->staging_off();
  const size_t band = std::max<size_t>(1, rt->staging_size() / c.WidthInBytes);
  if (rt->staging_size() < c.WidthInBytes) return CUDA_ERROR_INVALID_VALUE;
  std::unique_lock<std::mutex> staging_lock;
  if (CUresult st = ivcuda::guest::take_staging(rt, ctx, &staging_lock); st != CUDA_SUCCESS) return st;
  for (size_t y0 = 0; y0 < c.Height; y0 += band) {
    const size_t rows = std::min(band, c.Height - y0);
    r.height = rows;
    r.flags = async ? (proto::kAsync | proto::kWaitStream) : 0;
    // One side of the band: the packed staging rows, or the caller's memory
    // (page-locked arena block or device) with its own x, y and pitch.
    auto side = [&](bool staged, std::optional<std::uint64_t> pin, const void* host, CUdeviceptr dev, size_t x,
                    size_t y, size_t pitch, std::uint64_t& off, std::uint64_t& device, std::uint64_t& rx,
                    std::uint64_t& ry, std::uint64_t& rpitch) {
      if (staged) {
        off = stage;
        rx = 0;
        ry = 0;
        rpitch = c.WidthInBytes;
      } else {
        off = pin ? *rt->pinned_offset(host, 1) : 0;
        device = dev;
        rx = x;
        ry = y + y0;
        rpitch = pitch;
      }
    };
    if (src_staged)
      for (size_t y = 0; y < rows; ++y)
        std::memcpy(rt->bar() + stage + y * c.WidthInBytes,
                    static_cast<const char*>(src_host) + (c.srcY + y0 + y) * src_pitch + c.srcXInBytes,
                    c.WidthInBytes);
    side(src_staged, src_pin, src_host, c.srcDevice, c.srcXInBytes, c.srcY, src_pitch, r.src_arena_off,
         r.src_device, r.src_x_bytes, r.src_y, r.src_pitch);
    side(dst_staged, dst_pin, dst_host, c.dstDevice, c.dstXInBytes, c.dstY, dst_pitch, r.dst_arena_off,
         r.dst_device, r.dst_x_bytes, r.dst_y, r.dst_pitch);
    const CUresult st = rt->call<Op::kMemcpy2D>(r);
    if (st != CUDA_SUCCESS) return st;
    if (dst_staged)
      for (size_t y = 0; y < rows; ++y)
        std::memcpy(static_cast<char*>(const_cast<void*>(dst_host)) + (c.dstY + y0 + y) * dst_pitch + c.dstXInBytes,
                    rt->bar() + stage + y * c.WidthInBytes, c.WidthInBytes);
  }
  return CUDA_SUCCESS;
}

}  // namespace

// The staging area's other users (2D and 3D bands, module images, array map
// lists) take all of it: they wait for the chunks still in flight, which a
// pageable HtoD leaves behind when it returns.
CUresult ivcuda::guest::take_staging(Runtime* rt, std::uint64_t ctx, std::unique_lock<std::mutex>* lk) {
  const auto& l = rt->layout();
  const auto ch = static_cast<std::uint32_t>((rt->staging_off() - l.arena_off) /
                                             std::max<std::uint64_t>(l.staging_bytes, 1));
  ChannelStaging& cs = channel_staging(ch);
  *lk = std::unique_lock(cs.mu);
  const auto g = staging_of(rt);
  if (!g || !g->pipelined || !cs.known) return CUDA_SUCCESS;
  return wait_staged(rt, ctx, *g, cs, cs.posted);
}

// ==================================================================== memory

namespace {
// Allocates device memory through `alloc` and reserves its range in this
// process (see Runtime::reserve_device_range). A range that collides with
// memory this process already uses is held and another is asked for, so that
// device and host pointers stay distinguishable; the held ones are freed
// once a clean range came back.
template <class Alloc>
CUresult alloc_reserved(Runtime* rt, std::uint64_t ctx, Alloc&& alloc, CUdeviceptr* out, std::uint64_t* size) {
  std::vector<CUdeviceptr> held;
  CUresult st = CUDA_SUCCESS;
  for (int attempt = 0; attempt < 8; ++attempt) {
    st = alloc(out, size);
    if (st != CUDA_SUCCESS) break;
    if (rt->reserve_device_range(*out, *size)) break;
    if (attempt == 7) {
      ivcuda::guest::log_once("va-collision",
                              "device memory at 0x%llx overlaps this process's own memory: cuMemcpy with "
                              "unified addressing may take one for the other",
                              static_cast<unsigned long long>(*out));
      break;
    }
    held.push_back(*out);
  }
  for (CUdeviceptr p : held) (void)rt->call<Op::kMemFree>(proto::ReqPtr{ctx, p});
  return st;
}
}  // namespace

CUresult cuMemAlloc(CUdeviceptr* dptr, size_t bytes) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr d = 0;
    std::uint64_t size = 0;
    const CUresult st = alloc_reserved(rt, ctx, [&](CUdeviceptr* out, std::uint64_t* sz) {
      proto::ReqMemAlloc r{};
      r.ctx = ctx;
      r.bytes = bytes;
      proto::RepMemAlloc rep{};
      const CUresult s2 = rt->call<Op::kMemAlloc>(r, {}, &rep);
      *out = rep.dptr;
      *sz = bytes;
      return s2;
    }, &d, &size);
    if (st != CUDA_SUCCESS) return st;
    {
      std::lock_guard lk(rt->books_mu);
      rt->dev_allocs[d] = size;
      rt->ipc_capable.insert(d);
    }
    *dptr = d;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemAllocPitch(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height, unsigned int elem) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (dptr == nullptr || pitch == nullptr || width == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
    if (elem != 4 && elem != 8 && elem != 16) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr d = 0;
    std::uint64_t size = 0, got_pitch = 0;
    const CUresult st = alloc_reserved(rt, ctx, [&](CUdeviceptr* out, std::uint64_t* sz) {
      proto::ReqMemAlloc r{};
      r.ctx = ctx;
      r.width = width;
      r.height = height;
      r.elem_size = elem;
      proto::RepMemAlloc rep{};
      const CUresult s2 = rt->call<Op::kMemAlloc>(r, {}, &rep);
      *out = rep.dptr;
      *sz = rep.pitch * height;
      got_pitch = rep.pitch;
      return s2;
    }, &d, &size);
    if (st != CUDA_SUCCESS) return st;
    {
      std::lock_guard lk(rt->books_mu);
      rt->dev_allocs[d] = size;
      rt->ipc_capable.insert(d);
    }
    *dptr = d;
    *pitch = got_pitch;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemFree(CUdeviceptr dptr) {
  return guard([&] {
    NEED_RT();
    if (dptr == 0) return CUDA_SUCCESS;
    if (CUresult managed; ivcuda::guest::managed::free(rt, dptr, &managed)) return managed;
    if (CUresult imported; ivcuda::guest::internal::free_pool_import(rt, dptr, nullptr, false, &imported))
      return imported;
    const CUresult st = rt->call<Op::kMemFree>(proto::ReqPtr{current_ctx(), dptr});
    if (st == CUDA_SUCCESS) {
      std::uint64_t size = 0;
      {
        std::lock_guard lk(rt->books_mu);
        auto it = rt->dev_allocs.find(dptr);
        if (it != rt->dev_allocs.end()) {
          size = it->second;
          rt->dev_allocs.erase(it);
        }
        rt->ipc_capable.erase(dptr);
      }
      rt->release_device_range(dptr, size);
    }
    return st;
  });
}

namespace {

// cuMemGetInfo answered here, from the worker's memory view (shm_abi.h,
// Superblock line 9), when the answer is the guest's own: under a quota, with
// the device's free memory (as the worker last asked the driver, less than
// 100 ms ago) more than the quota's rest by a sixteenth of the device, the
// worker would answer what is left of the quota (host-daemon/worker/memory.cc,
// on_MemGetInfo). The view changes before the reply of any call that changed
// the charge, so the process's own allocations are in it; what other tenants
// take is what the 100 ms and the margin are for. Also while the worker is
// busy with work queued ahead: nothing waits for it. Process mode only.
bool local_mem_info(Runtime* rt, std::uint64_t* free_b, std::uint64_t* total) {
  if (rt->vm_mode()) return false;
  const auto* sb = ivcuda::ring::superblock(rt->bar());
  const std::uint32_t s1 = ivcuda::ring::load_acquire(sb->mem_view_seq);
  if ((s1 & 1u) != 0) return false;
  const std::uint64_t limit = ivcuda::ring::load_relaxed(sb->mem_limit);
  const std::uint64_t used = ivcuda::ring::load_relaxed(sb->mem_used);
  const std::uint64_t dev_total = ivcuda::ring::load_relaxed(sb->mem_device_total);
  const std::uint64_t dev_free = ivcuda::ring::load_relaxed(sb->mem_device_free);
  const std::uint64_t sampled = ivcuda::ring::load_relaxed(sb->mem_sampled_ns);
  ivcuda::ring::full_fence();  // (TSan builds: see ring/spsc_ring.h)
  if (ivcuda::ring::load_relaxed(sb->mem_view_seq) != s1) return false;
  if (limit == 0 || sampled == 0 || dev_total == 0) return false;
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  const std::uint64_t now = static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
  if (now < sampled || now - sampled > 100'000'000u) return false;
  const std::uint64_t left = used >= limit ? 0 : limit - used;
  if (dev_free < left || dev_free - left < dev_total / 16) return false;
  *total = std::min(dev_total, limit);
  *free_b = left;
  return true;
}

}  // namespace

CUresult cuMemGetInfo(size_t* free_b, size_t* total) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (free_b == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (std::uint64_t f = 0, t = 0; local_mem_info(rt, &f, &t)) {
      *free_b = f;
      *total = t;
      return CUDA_SUCCESS;
    }
    // Not behind the work this process posted: the driver answers at once too.
    proto::RepMemInfo rep{};
    const CUresult st = rt->query<Op::kMemGetInfo>(proto::ReqCtx{ctx}, &rep);
    *free_b = rep.free;
    *total = rep.total;
    return st;
  });
}

CUresult cuMemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr dptr) {
  return guard([&] {
    NEED_RT();
    if (ivcuda::guest::managed::Range m; ivcuda::guest::managed::find(dptr, &m)) {
      if (base != nullptr) *base = m.start;
      if (size != nullptr) *size = m.size;
      return CUDA_SUCCESS;
    }
    proto::RepRange rep{};
    const CUresult st = rt->call<Op::kMemGetAddressRange>(proto::ReqPtr{current_ctx(), dptr}, {}, &rep);
    if (st != CUDA_SUCCESS) return st;
    if (base != nullptr) *base = rep.base;
    if (size != nullptr) *size = rep.size;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemsetD8(CUdeviceptr d, unsigned char v, size_t n) {
  return guard([&] { return memset_any(d, v, 1, 0, n, 1, nullptr, false); });
}
CUresult cuMemsetD16(CUdeviceptr d, unsigned short v, size_t n) {
  return guard([&] { return memset_any(d, v, 2, 0, n, 1, nullptr, false); });
}
CUresult cuMemsetD32(CUdeviceptr d, unsigned int v, size_t n) {
  return guard([&] { return memset_any(d, v, 4, 0, n, 1, nullptr, false); });
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  return guard([&] { return memset_any(d, v, 1, 0, n, 1, s, true); });
}
CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) {
  return guard([&] { return memset_any(d, v, 2, 0, n, 1, s, true); });
}
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) {
  return guard([&] { return memset_any(d, v, 4, 0, n, 1, s, true); });
}
CUresult cuMemsetD2D8(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t hgt) {
  return guard([&] { return memset_any(d, v, 1, pitch, w, hgt, nullptr, false); });
}
CUresult cuMemsetD2D16(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t hgt) {
  return guard([&] { return memset_any(d, v, 2, pitch, w, hgt, nullptr, false); });
}
CUresult cuMemsetD2D32(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t hgt) {
  return guard([&] { return memset_any(d, v, 4, pitch, w, hgt, nullptr, false); });
}
CUresult cuMemsetD2D8Async(CUdeviceptr d, size_t pitch, unsigned char v, size_t w, size_t hgt, CUstream s) {
  return guard([&] { return memset_any(d, v, 1, pitch, w, hgt, s, true); });
}
CUresult cuMemsetD2D16Async(CUdeviceptr d, size_t pitch, unsigned short v, size_t w, size_t hgt, CUstream s) {
  return guard([&] { return memset_any(d, v, 2, pitch, w, hgt, s, true); });
}
CUresult cuMemsetD2D32Async(CUdeviceptr d, size_t pitch, unsigned int v, size_t w, size_t hgt, CUstream s) {
  return guard([&] { return memset_any(d, v, 4, pitch, w, hgt, s, true); });
}

CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t n) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    return copy_htod(rt, ctx, dst, src, n, nullptr, false);
  });
}
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream s) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    return copy_htod(rt, ctx, dst, src, n, s, true);
  });
}
CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    return copy_dtoh(rt, ctx, dst, src, n, nullptr, false);
  });
}
CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream s) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    return copy_dtoh(rt, ctx, dst, src, n, s, true);
  });
}
CUresult cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    return copy_dtod(rt, ctx, dst, src, n, nullptr, false);
  });
}
CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    return copy_dtod(rt, ctx, dst, src, n, s, true);
  });
}

namespace {
// cuMemcpy with unified addressing: each side is device memory this process
// allocated, or host memory.
CUresult copy_unified(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, bool async) {
  NEED_RT();
  NEED_CTX();
  if (async && !known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
  const bool dd = is_device(rt, dst), sd = is_device(rt, src);
  if (dd && sd) return copy_dtod(rt, ctx, dst, src, n, s, async);
  if (dd) return copy_htod(rt, ctx, dst, reinterpret_cast<const void*>(src), n, s, async);
  if (sd) return copy_dtoh(rt, ctx, reinterpret_cast<void*>(dst), src, n, s, async);
  if (n != 0) std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}
}  // namespace

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return guard([&] { return copy_unified(dst, src, n, nullptr, false); });
}
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  return guard([&] { return copy_unified(dst, src, n, s, true); });
}
CUresult cuMemcpy2D(const CUDA_MEMCPY2D* p) {
  return guard([&] { return copy_2d(p, nullptr, false, false); });
}
CUresult cuMemcpy2DUnaligned(const CUDA_MEMCPY2D* p) {
  return guard([&] { return copy_2d(p, nullptr, false, true); });
}
CUresult cuMemcpy2DAsync(const CUDA_MEMCPY2D* p, CUstream s) {
  return guard([&] { return copy_2d(p, s, true, false); });
}

// ====================================================== page-locked memory

CUresult cuMemHostAlloc(void** pp, size_t bytes, unsigned int flags) {
  return guard([&] {
    NEED_RT();
    if (pp == nullptr) return CUDA_ERROR_INVALID_VALUE;
    constexpr unsigned kKnown = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
    if ((flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
    // Arena memory is what every flag asks for already: the daemon registered
    // it PORTABLE and DEVICEMAP, so any context and kernel can reach it.
    // WRITECOMBINED only tunes CPU caching, which the BAR mapping decides;
    // it is kept for cuMemHostGetFlags. The real driver hands out empty
    // allocations, so an empty one gets a page of its own.
    const size_t want = std::max<size_t>(bytes, 1);
    proto::RepHostAlloc rep{};
    const CUresult st = rt->call<Op::kHostAlloc>(proto::ReqHostAlloc{want, flags, 0}, {}, &rep);
    if (st != CUDA_SUCCESS) return st;
    void* p = rt->pinned_base() + rep.arena_off;
    rt->add_pinned(p, ivcuda::guest::PinnedBlock{rep.arena_off, want, flags});
    *pp = p;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemAllocHost(void** pp, size_t bytes) {
  return cuMemHostAlloc(pp, bytes, 0);
}

CUresult cuMemFreeHost(void* p) {
  return guard([&] {
    NEED_RT();
    auto b = rt->take_pinned(p);
    if (!b) return CUDA_ERROR_INVALID_VALUE;
    return rt->call<Op::kHostFree>(proto::ReqArenaOff{b->arena_off});
  });
}

// Registered memory is moved onto the arena (guest/host_register.cc), so
// the GPU and the guest CPU share its pages.
CUresult cuMemHostRegister(void* p, size_t bytes, unsigned int flags) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    return ivcuda::guest::hostreg::register_range(rt, ctx, p, bytes, flags);
  });
}

CUresult cuMemHostUnregister(void* p) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    (void)ctx;
    return ivcuda::guest::hostreg::unregister_range(rt, p);
  });
}

CUresult cuMemHostGetDevicePointer(CUdeviceptr* d, void* p, unsigned int flags) {
  return guard([&] {
    NEED_RT();
    if (d == nullptr || p == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (auto reg = ivcuda::guest::hostreg::find(rt, p)) {
      // Registered memory of a shared mapping the worker could not page-lock
      // (a VM's process) stays in the guest's own pages, which the GPU cannot
      // reach: the driver's answer for memory it cannot map.
      if (reg->dptr == 0) {
        ivcuda::guest::log_once("hostreg-shared-devptr",
                                "cuMemHostGetDevicePointer: this registered shared mapping has no device address "
                                "under ivcuda (a VM's process, or no descriptor of its file: docs/design.md)");
        return CUDA_ERROR_INVALID_VALUE;
      }
      *d = reg->dptr;
      return CUDA_SUCCESS;
    }
    auto off = rt->pinned_offset(p, 1);
    if (!off) return CUDA_ERROR_INVALID_VALUE;
    *d = rt->hello().arena_device_base + *off;
    return CUDA_SUCCESS;
  });
}

CUresult cuMemHostGetFlags(unsigned int* flags, void* p) {
  return guard([&] {
    NEED_RT();
    if (flags == nullptr || p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // As driver 580 answers on the H200: the flags asked for plus DEVICEMAP
    // (unified addressing maps all page-locked memory); registered memory
    // answers too, with its registration flags.
    if (auto b = rt->pinned_block(p)) {
      *flags = b->flags | CU_MEMHOSTALLOC_DEVICEMAP;
      return CUDA_SUCCESS;
    }
    if (auto reg = ivcuda::guest::hostreg::find(rt, p)) {
      *flags = reg->flags | CU_MEMHOSTALLOC_DEVICEMAP;
      return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
  });
}

namespace {

// What the guest knows of a pointer, for cuPointerGetAttribute(s).
struct PtrInfo {
  unsigned type = 0;  // CUmemorytype; 0: not a CUDA pointer
  std::uint64_t ctx = 0;
  std::uint64_t dptr = 0;
  void* host = nullptr;
  std::uint64_t start = 0, size = 0;  // the allocation or registration
  bool read_only = false;
  bool managed = false;
};

PtrInfo describe(Runtime* rt, std::uint64_t p) {
  PtrInfo i;
  void* hp = reinterpret_cast<void*>(p);
  if (ivcuda::guest::managed::Range m; ivcuda::guest::managed::find(p, &m)) {
    // Managed memory: device memory the host may address too.
    i.type = CU_MEMORYTYPE_DEVICE;
    i.ctx = m.ctx;
    i.dptr = p;
    i.host = hp;
    i.start = m.start;
    i.size = m.size;
    i.managed = true;
    return i;
  }
  if (auto reg = ivcuda::guest::hostreg::find(rt, hp)) {
    i.type = CU_MEMORYTYPE_HOST;
    i.ctx = reg->ctx;
    i.dptr = reg->dptr;
    i.host = hp;
    i.start = reg->base;
    i.size = reg->size;
    i.read_only = (reg->flags & CU_MEMHOSTREGISTER_READ_ONLY) != 0;
    return i;
  }
  if (auto b = rt->pinned_block(hp)) {
    i.type = CU_MEMORYTYPE_HOST;
    i.ctx = current_ctx();
    i.dptr = rt->hello().arena_device_base + *rt->pinned_offset(hp, 1);
    i.host = hp;
    i.start = h(rt->pinned_base() + b->arena_off);
    i.size = b->size;
    return i;
  }
  std::lock_guard lk(rt->books_mu);
  auto it = rt->dev_allocs.upper_bound(p);
  if (it == rt->dev_allocs.begin()) return i;
  --it;
  if (p - it->first >= it->second) return i;
  i.type = CU_MEMORYTYPE_DEVICE;
  i.ctx = current_ctx();
  i.dptr = p;
  i.start = it->first;
  i.size = it->second;
  return i;
}

template <class T>
void put(void* data, T v) {
  std::memcpy(data, &v, sizeof v);
}

// One attribute of a described pointer. `strict`: cuPointerGetAttribute,
// which fails where cuPointerGetAttributes answers a null value.
CUresult pointer_attribute(Runtime* rt, const PtrInfo& i, CUpointer_attribute a, void* data, bool strict) {
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (i.type == 0 && strict) return CUDA_ERROR_INVALID_VALUE;
  const bool known = i.type != 0;
  switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      put(data, reinterpret_cast<CUcontext>(i.ctx));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      put(data, i.type);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      // Registered memory of a shared mapping has no device alias (as above).
      if (i.type == CU_MEMORYTYPE_HOST && i.dptr == 0 && strict) return CUDA_ERROR_INVALID_VALUE;
      put(data, static_cast<CUdeviceptr>(i.dptr));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (i.host == nullptr && strict) return CUDA_ERROR_INVALID_VALUE;  // device memory has no host alias
      put(data, i.host);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_MAPPED:
      put(data, static_cast<unsigned>(known ? 1 : 0));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: {
      // cuMemAlloc memory is what cuIpcGetMemHandle exports (guest/ipc.cc).
      std::lock_guard lk(rt->books_mu);
      put(data, static_cast<unsigned>(i.type == CU_MEMORYTYPE_DEVICE && rt->ipc_capable.count(i.start) != 0));
      return CUDA_SUCCESS;
    }
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      put(data, static_cast<unsigned>(i.managed ? 1 : 0));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
      put(data, 0u);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
      put(data, reinterpret_cast<void*>(i.start));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
      put(data, static_cast<size_t>(i.size));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
      put(data, static_cast<unsigned long long>(i.start));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: {
      int dev = -1;
      if (known) {
        std::lock_guard lk(rt->books_mu);
        auto it = rt->ctx_device.find(i.ctx);
        dev = it == rt->ctx_device.end() ? 0 : it->second;
      }
      put(data, dev);
      return CUDA_SUCCESS;
    }
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      put(data, static_cast<CUdeviceptr>(i.start));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      put(data, static_cast<size_t>(i.size));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
      put(data, static_cast<unsigned>(!known ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE
                                      : i.read_only ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ
                                                    : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      put(data, static_cast<CUmemoryPool>(nullptr));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      put(data, 0ull);
      return CUDA_SUCCESS;
    default:
      return ivcuda::guest::not_supported("cuPointerGetAttribute: attribute %d is not supported", static_cast<int>(a));
  }
}

}  // namespace

CUresult cuPointerGetAttribute(void* data, CUpointer_attribute a, CUdeviceptr p) {
  return guard([&] {
    NEED_RT();
    return pointer_attribute(rt, describe(rt, p), a, data, true);
  });
}

CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute* attrs, void** data, CUdeviceptr p) {
  return guard([&] {
    NEED_RT();
    if (n != 0 && (attrs == nullptr || data == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    const PtrInfo info = describe(rt, p);
    for (unsigned k = 0; k < n; ++k)
      if (const CUresult st = pointer_attribute(rt, info, attrs[k], data[k], false); st != CUDA_SUCCESS) return st;
    return CUDA_SUCCESS;
  });
}

// Synchronous copies that leave managed memory's books alone: managed.cc
// moves its blocks with them (their guest side is its private alias).
CUresult ivcuda::guest::internal::copy_to_device(Runtime* rt, std::uint64_t ctx, CUdeviceptr dst, const void* src,
                                                 std::size_t n) {
  return htod_body(rt, ctx, dst, src, n, nullptr, false);
}
CUresult ivcuda::guest::internal::copy_to_host(Runtime* rt, std::uint64_t ctx, void* dst, CUdeviceptr src,
                                               std::size_t n) {
  return dtoh_body(rt, ctx, dst, src, n, nullptr, false);
}
