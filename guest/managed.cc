// Managed memory: cuMemAllocManaged, cuMemAdvise, cuMemPrefetchAsync (and
// the batch forms), cuMemRangeGetAttribute(s), cuStreamAttachMemAsync.
//
// The guest builds it over ordinary device memory, with CUDA's semantics for
// a device without concurrent managed access (the guest reports
// concurrentManagedAccess = 0): the CPU and the GPU take turns. An
// allocation is device memory from the worker (charged to the quota like any
// other) whose address range is also mapped in this process, at the same
// address, from a memfd. The range is cut into blocks, each in one of three
// states:
//   device  the device holds the data; the CPU's view is PROT_NONE;
//   clean   the CPU's view equals the device's (PROT_READ);
//   dirty   the CPU wrote it since (PROT_READ | PROT_WRITE).
// A CPU access to a device block faults; the handler (SIGSEGV, chained to
// whatever handler was there before) synchronises the allocation's context
// and fetches a run of blocks into the view: clean. A write to a clean block
// faults once more and makes it dirty. Before a kernel or graph launch, dirty
// blocks go back to the device and every block the CPU holds becomes device
// again, as CUDA hands all managed memory to the GPU at a launch on such a
// device. Copies and memsets the host performs on managed ranges treat them as
// device memory after the same hand-over for the bytes they touch.
//
// The library never touches the protected view itself: it reads and writes
// blocks through a second, private mapping of the same memfd (the alias), so a
// fault never happens while it holds a lock of its own.
//
// The host sees device memory only: nothing here is a new request, and what
// a guest may touch on the host is what its device allocations allow.
#define __CUDA_API_VERSION_INTERNAL
#include "guest/managed.h"

#include <cuda.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"
#include "guest/family.h"

namespace {

using Range = ivcuda::guest::managed::Range;
constexpr std::uint64_t kPage = 4096;
// Blocks are at least 64 KiB and at most 1024 to an allocation (so that the
// view's protections cut it into a bounded number of mappings); a fault
// fetches up to 2 MiB of device blocks at once.
constexpr std::uint64_t kMinBlock = 64 << 10;
constexpr std::uint64_t kMaxBlocks = 1024;
constexpr std::uint64_t kFetchBytes = 2 << 20;

enum : std::uint8_t { kDevice = 0, kClean = 1, kDirty = 2 };

// cuMemAdvise and cuMemPrefetchAsync's record, per block. Locations are
// CUmemLocation; type 0 (INVALID) is "not set".
struct Advice {
  bool read_mostly = false;
  CUmemLocation preferred{CU_MEM_LOCATION_TYPE_INVALID, 0};
  CUmemLocation last_prefetch{CU_MEM_LOCATION_TYPE_INVALID, 0};
  std::uint64_t accessed_by = 0;  // bit 0: the host, bit d + 1: device d
};

struct Alloc {
  std::uint64_t user = 0;    // the application's pointer, page aligned
  std::uint64_t bytes = 0;   // what it asked for
  std::uint64_t mapped = 0;  // bytes rounded up to pages
  std::uint64_t base = 0, alloc_size = 0;  // the device allocation holding it
  std::uint64_t ctx = 0;
  std::byte* alias = nullptr;
  std::uint64_t block = 0;
  std::vector<std::uint8_t> state;
  std::vector<Advice> advice;
  std::uint64_t host_blocks = 0;  // blocks not in the device state
  unsigned attach = CU_MEM_ATTACH_GLOBAL;
  std::uint64_t attach_stream = 0;

  std::uint64_t blocks() const { return state.size(); }
  std::uint64_t block_off(std::uint64_t b) const { return b * block; }
  std::uint64_t block_len(std::uint64_t b) const { return std::min(block, mapped - b * block); }
  void* view(std::uint64_t b) const { return reinterpret_cast<void*>(user + b * block); }
};

struct Books {
  std::mutex mu;
  std::map<std::uint64_t, std::unique_ptr<Alloc>> allocs;  // by user address; guarded by mu
};
Books& books() {
  static auto* b = new Books;  // never destroyed: faults may come during exit
  return *b;
}
std::atomic<std::uint64_t> g_allocs{0};
std::atomic<std::uint64_t> g_host_blocks{0};

[[noreturn]] void fatal(const char* what, std::uint64_t addr, int err) {
  char line[256];
  const int n = std::snprintf(line, sizeof line, "ivcuda: managed memory at 0x%llx: %s (%s); aborting\n",
                              static_cast<unsigned long long>(addr), what, err != 0 ? std::strerror(err) : "");
  if (n > 0) (void)!::write(2, line, static_cast<std::size_t>(std::min(n, static_cast<int>(sizeof line) - 1)));
  std::abort();
}

void protect(const Alloc& a, std::uint64_t b0, std::uint64_t b1, int prot) {
  if (b0 >= b1) return;
  const std::uint64_t off = a.block_off(b0);
  const std::uint64_t len = std::min(a.mapped, a.block_off(b1)) - off;
  if (::mprotect(reinterpret_cast<void*>(a.user + off), len, prot) != 0)
    fatal("cannot change the CPU's view", a.user + off, errno);
}

// The alloc holding [p, p + n); under books().mu.
Alloc* find_locked(std::uint64_t p, std::uint64_t n = 1) {
  auto& m = books().allocs;
  auto it = m.upper_bound(p);
  if (it == m.begin()) return nullptr;
  --it;
  Alloc* a = it->second.get();
  if (p - a->user >= a->bytes || n > a->bytes - (p - a->user)) return nullptr;
  return a;
}

void set_state(Alloc& a, std::uint64_t b0, std::uint64_t b1, std::uint8_t s) {
  for (std::uint64_t b = b0; b < b1; ++b) {
    const bool was_host = a.state[b] != kDevice, is_host = s != kDevice;
    if (was_host != is_host) {
      a.host_blocks += is_host ? 1 : std::uint64_t(-1);
      g_host_blocks.fetch_add(is_host ? 1 : std::uint64_t(-1), std::memory_order_relaxed);
    }
    a.state[b] = s;
  }
}

// Dirty blocks of [b0, b1) back to the device (from the alias: the view may
// be protected already). Whole runs at once; synchronous copies, which the
// host orders before any later work in the context.
CUresult write_back(Runtime* rt, Alloc& a, std::uint64_t b0, std::uint64_t b1) {
  for (std::uint64_t b = b0; b < b1;) {
    if (a.state[b] != kDirty) {
      ++b;
      continue;
    }
    std::uint64_t e = b;
    while (e < b1 && a.state[e] == kDirty) ++e;
    const std::uint64_t off = a.block_off(b), len = std::min(a.mapped, a.block_off(e)) - off;
    if (CUresult st = ivcuda::guest::internal::copy_to_device(rt, a.ctx, a.user + off, a.alias + off, len);
        st != CUDA_SUCCESS)
      return st;
    b = e;
  }
  return CUDA_SUCCESS;
}

// Blocks [b0, b1) to the device: the CPU's view first (no write may slip in
// while they travel), then what it wrote, except blocks `keep` says are about
// to be overwritten whole.
template <class Keep>
CUresult hand_over(Runtime* rt, Alloc& a, std::uint64_t b0, std::uint64_t b1, Keep&& overwritten) {
  bool any = false;
  for (std::uint64_t b = b0; b < b1; ++b) any = any || a.state[b] != kDevice;
  if (!any) return CUDA_SUCCESS;
  protect(a, b0, b1, PROT_NONE);
  for (std::uint64_t b = b0; b < b1; ++b)
    if (a.state[b] == kDirty && overwritten(b)) a.state[b] = kClean;
  const CUresult st = write_back(rt, a, b0, b1);
  set_state(a, b0, b1, kDevice);
  return st;
}
CUresult hand_over(Runtime* rt, Alloc& a, std::uint64_t b0, std::uint64_t b1) {
  return hand_over(rt, a, b0, b1, [](std::uint64_t) { return false; });
}

// Device blocks from b on (at most kFetchBytes, stopping at the first block
// the CPU holds) into the view, clean. The context is synchronised first: the
// CPU may look only once the GPU is done (CUDA's rule on such a device).
CUresult fetch(Runtime* rt, Alloc& a, std::uint64_t b0, std::uint64_t limit_bytes) {
  std::uint64_t e = b0;
  while (e < a.blocks() && a.state[e] == kDevice && (e == b0 || a.block_off(e + 1) - a.block_off(b0) <= limit_bytes))
    ++e;
  if (e == b0) return CUDA_SUCCESS;
  if (a.attach == CU_MEM_ATTACH_SINGLE && a.attach_stream != 0) {
    if (CUresult st = rt->call<Op::kStreamSynchronize>(proto::ReqHandle{a.ctx, a.attach_stream}); st != CUDA_SUCCESS)
      return st;
  } else if (CUresult st = rt->call<Op::kCtxSynchronize>(proto::ReqCtx{a.ctx}); st != CUDA_SUCCESS) {
    return st;
  }
  const std::uint64_t off = a.block_off(b0), len = std::min(a.mapped, a.block_off(e)) - off;
  if (CUresult st = ivcuda::guest::internal::copy_to_host(rt, a.ctx, a.alias + off, a.user + off, len);
      st != CUDA_SUCCESS)
    return st;
  protect(a, b0, e, PROT_READ);
  set_state(a, b0, e, kClean);
  return CUDA_SUCCESS;
}

// ---- the fault handler

struct sigaction g_previous {};
thread_local bool t_in_fault = false;

// A fault in a managed view: resolved (true), or not ours (false).
bool resolve(void* addr) {
  if (t_in_fault || g_allocs.load(std::memory_order_acquire) == 0) return false;
  Runtime* rt = Runtime::current();
  if (rt == nullptr) return false;
  t_in_fault = true;
  struct Reset {
    ~Reset() { t_in_fault = false; }
  } reset;
  const auto p = reinterpret_cast<std::uint64_t>(addr);
  std::lock_guard lk(books().mu);
  auto& m = books().allocs;
  auto it = m.upper_bound(p);
  if (it == m.begin()) return false;
  --it;
  Alloc& a = *it->second;
  if (p - a.user >= a.mapped) return false;
  const std::uint64_t b = (p - a.user) / a.block;
  switch (a.state[b]) {
    case kDevice:
      if (CUresult st = fetch(rt, a, b, std::max(kFetchBytes, a.block)); st != CUDA_SUCCESS) {
        const char* name = nullptr;
        (void)cuGetErrorName(st, &name);
        char what[128];
        std::snprintf(what, sizeof what, "the CPU touched it and the device's data could not be fetched: %s",
                      name != nullptr ? name : "error");
        fatal(what, p, 0);
      }
      return true;
    case kClean:
      protect(a, b, b + 1, PROT_READ | PROT_WRITE);
      set_state(a, b, b + 1, kDirty);
      return true;
    default:
      return true;  // another thread resolved it meanwhile
  }
}

void on_fault(int sig, siginfo_t* info, void* uc) {
  const int saved = errno;
  if (info != nullptr && info->si_code > 0 && resolve(info->si_addr)) {
    errno = saved;
    return;
  }
  errno = saved;
  // Not ours: whatever handled SIGSEGV before us, or the default action
  // (returning re-runs the access, which then takes it).
  const struct sigaction& prev = g_previous;
  if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
    prev.sa_sigaction(sig, info, uc);
    return;
  }
  if (prev.sa_handler == SIG_IGN || prev.sa_handler == SIG_DFL) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigemptyset(&dfl.sa_mask);
    ::sigaction(SIGSEGV, &dfl, nullptr);
    return;
  }
  prev.sa_handler(sig);
}

bool install_handler() {
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    ::sigemptyset(&sa.sa_mask);
    ok = ::sigaction(SIGSEGV, &sa, &g_previous) == 0;
  });
  return ok;
}

// ---- allocations

std::uint64_t round_up(std::uint64_t v, std::uint64_t to) { return (v + to - 1) / to * to; }

std::uint64_t block_size(std::uint64_t mapped) {
  std::uint64_t b = kMinBlock;
  while (b * kMaxBlocks < mapped) b *= 2;
  return b;
}

// Maps the view at `at` and its alias, from one memfd. False when the
// address range is taken in this process.
bool map_views(std::uint64_t at, std::uint64_t len, std::byte** alias, int* err) {
  const int fd = ::memfd_create("ivcuda-managed", MFD_CLOEXEC);
  if (fd < 0) {
    *err = errno;
    return false;
  }
  bool ok = false;
  *err = 0;
  if (::ftruncate(fd, static_cast<off_t>(len)) == 0) {
    void* want = reinterpret_cast<void*>(at);
    void* v = ::mmap(want, len, PROT_READ, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
    if (v == want) {
      void* al = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (al != MAP_FAILED) {
        *alias = static_cast<std::byte*>(al);
        ok = true;
      } else {
        *err = errno;
        ::munmap(v, len);
      }
    } else if (v != MAP_FAILED) {
      ::munmap(v, len);  // an old kernel took the address as a hint
    } else if (errno != EEXIST) {
      *err = errno;
    }
  } else {
    *err = errno;
  }
  ::close(fd);
  return ok;
}

// The device allocation's parts outside the view, reserved like any device
// memory (Runtime::reserve_device_range).
void reserve_slack(Runtime* rt, const Alloc& a, bool release) {
  const std::uint64_t head = a.user - a.base;
  const std::uint64_t tail_at = a.user + a.mapped, tail = a.base + a.alloc_size - tail_at;
  if (release) {
    if (head != 0) rt->release_device_range(a.base, head);
    if (tail != 0) rt->release_device_range(tail_at, tail);
  } else {
    if (head != 0) (void)rt->reserve_device_range(a.base, head);
    if (tail != 0) (void)rt->reserve_device_range(tail_at, tail);
  }
}

// The allocations an operation on `stream` may touch: globally attached
// ones, and those attached to that stream alone.
bool reaches(const Alloc& a, std::uint64_t stream) {
  if (a.attach == CU_MEM_ATTACH_GLOBAL) return true;
  return a.attach == CU_MEM_ATTACH_SINGLE && a.attach_stream == stream;
}

// ---- locations (cuMemAdvise, prefetches, range attributes)

bool is_host(const CUmemLocation& l) {
  return l.type == CU_MEM_LOCATION_TYPE_HOST || l.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
         l.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}

CUresult check_location(Runtime* rt, const CUmemLocation& l) {
  if (l.type == CU_MEM_LOCATION_TYPE_DEVICE)
    return l.id >= 0 && l.id < rt->device_count() && l.id < 63 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
  if (l.type == CU_MEM_LOCATION_TYPE_HOST || l.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT) return CUDA_SUCCESS;
  if (l.type == CU_MEM_LOCATION_TYPE_HOST_NUMA) return l.id >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  return CUDA_ERROR_INVALID_VALUE;
}

CUmemLocation from_device(CUdevice d) {
  if (d == CU_DEVICE_CPU) return CUmemLocation{CU_MEM_LOCATION_TYPE_HOST, 0};
  return CUmemLocation{CU_MEM_LOCATION_TYPE_DEVICE, d};
}

// The legacy int form: a device, CU_DEVICE_CPU, or CU_DEVICE_INVALID.
int legacy_id(const CUmemLocation& l) {
  if (l.type == CU_MEM_LOCATION_TYPE_DEVICE) return l.id;
  if (is_host(l)) return CU_DEVICE_CPU;
  return CU_DEVICE_INVALID;
}

bool same(const CUmemLocation& x, const CUmemLocation& y) { return x.type == y.type && x.id == y.id; }

// The blocks [p, p + n) touches in `a`.
std::pair<std::uint64_t, std::uint64_t> blocks_of(const Alloc& a, std::uint64_t p, std::uint64_t n) {
  const std::uint64_t off = p - a.user;
  return {off / a.block, (off + n + a.block - 1) / a.block};
}

// Moves [p, p + n) of managed memory to `loc`: to a device, the hand-over;
// to the host, once `stream`'s work is done, a fetch of what the device holds.
CUresult prefetch(Runtime* rt, std::uint64_t p, std::uint64_t n, const CUmemLocation& loc, std::uint64_t stream) {
  std::lock_guard lk(books().mu);
  Alloc* a = find_locked(p, n);
  if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto [b0, b1] = blocks_of(*a, p, n);
  for (std::uint64_t b = b0; b < b1; ++b) a->advice[b].last_prefetch = loc;
  if (!is_host(loc)) return hand_over(rt, *a, b0, b1);
  if (stream != 0)
    if (CUresult st = rt->call<Op::kStreamSynchronize>(proto::ReqHandle{a->ctx, stream}); st != CUDA_SUCCESS) return st;
  for (std::uint64_t b = b0; b < b1; ++b)
    if (a->state[b] == kDevice)
      if (CUresult st = fetch(rt, *a, b, a->block_off(b1) - a->block_off(b)); st != CUDA_SUCCESS) return st;
  return CUDA_SUCCESS;
}

CUresult prefetch_entry(CUdeviceptr p, size_t n, const CUmemLocation& loc, unsigned flags, CUstream s) {
  NEED_RT();
  NEED_CTX();
  if (flags != 0 || n == 0) return CUDA_ERROR_INVALID_VALUE;
  if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = check_location(rt, loc); st != CUDA_SUCCESS) return st;
  return prefetch(rt, p, n, loc, h(s));
}

// Discarded ranges need not keep their data: the CPU's view goes (its writes
// too), and the next access on either side sees whatever the device holds.
CUresult discard(Runtime* rt, std::uint64_t p, std::uint64_t n) {
  std::lock_guard lk(books().mu);
  Alloc* a = find_locked(p, n);
  if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto [b0, b1] = blocks_of(*a, p, n);
  // Only whole blocks lose their data; a block the range covers in part
  // keeps what the CPU wrote elsewhere in it.
  const std::uint64_t lo = p, hi = p + n;
  return hand_over(rt, *a, b0, b1, [&](std::uint64_t b) {
    return a->user + a->block_off(b) >= lo && a->user + a->block_off(b) + a->block_len(b) <= hi;
  });
}

CUresult batch(CUdeviceptr* dptrs, size_t* sizes, size_t count, CUmemLocation* locs, size_t* loc_idxs,
               size_t nlocs, unsigned long long flags, CUstream s, bool discard_first) {
  NEED_RT();
  NEED_CTX();
  if (flags != 0 || count == 0 || dptrs == nullptr || sizes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (locs != nullptr || nlocs != 0) {
    if (locs == nullptr || loc_idxs == nullptr || nlocs == 0 || nlocs > count || loc_idxs[0] != 0)
      return CUDA_ERROR_INVALID_VALUE;
    for (size_t k = 0; k < nlocs; ++k) {
      if (k > 0 && loc_idxs[k] <= loc_idxs[k - 1]) return CUDA_ERROR_INVALID_VALUE;
      if (loc_idxs[k] >= count) return CUDA_ERROR_INVALID_VALUE;
      if (CUresult st = check_location(rt, locs[k]); st != CUDA_SUCCESS) return st;
    }
  }
  if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
  for (size_t i = 0; i < count; ++i) {
    if (sizes[i] == 0) return CUDA_ERROR_INVALID_VALUE;
    Range r;
    if (!ivcuda::guest::managed::find(dptrs[i], &r) || sizes[i] > r.start + r.size - dptrs[i])
      return CUDA_ERROR_INVALID_VALUE;
  }
  size_t li = 0;
  for (size_t i = 0; i < count; ++i) {
    if (discard_first || locs == nullptr)
      if (CUresult st = discard(rt, dptrs[i], sizes[i]); st != CUDA_SUCCESS) return st;
    if (locs == nullptr) continue;
    while (li + 1 < nlocs && loc_idxs[li + 1] <= i) ++li;
    if (CUresult st = prefetch(rt, dptrs[i], sizes[i], locs[li], h(s)); st != CUDA_SUCCESS) return st;
  }
  return CUDA_SUCCESS;
}

}  // namespace

// ==================================================================== hooks

namespace ivcuda::guest::managed {

bool any() noexcept { return g_allocs.load(std::memory_order_relaxed) != 0; }

CUresult before_launch(Runtime* rt, std::uint64_t stream) {
  if (g_host_blocks.load(std::memory_order_relaxed) == 0) return CUDA_SUCCESS;
  // A launch into a capturing stream only records a node: the graph's
  // launch hands the memory over.
  if (stream != 0) {
    CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
    if (cuStreamIsCapturing(reinterpret_cast<CUstream>(stream), &cap) == CUDA_SUCCESS &&
        cap != CU_STREAM_CAPTURE_STATUS_NONE)
      return CUDA_SUCCESS;
  }
  std::lock_guard lk(books().mu);
  for (auto& [at, a] : books().allocs) {
    if (a->host_blocks == 0 || !reaches(*a, stream)) continue;
    if (CUresult st = hand_over(rt, *a, 0, a->blocks()); st != CUDA_SUCCESS) return st;
  }
  return CUDA_SUCCESS;
}

CUresult device_use(Runtime* rt, std::uint64_t p, std::uint64_t n, bool writes) {
  if (!any() || n == 0 || p + n < p) return CUDA_SUCCESS;
  std::lock_guard lk(books().mu);
  auto& m = books().allocs;
  auto it = m.upper_bound(p);
  if (it != m.begin()) --it;
  for (; it != m.end() && it->first < p + n; ++it) {
    Alloc& a = *it->second;
    if (a.user + a.mapped <= p || a.host_blocks == 0) continue;
    const std::uint64_t lo = std::max(p, a.user), hi = std::min(p + n, a.user + a.mapped);
    const std::uint64_t b0 = (lo - a.user) / a.block, b1 = (hi - a.user + a.block - 1) / a.block;
    if (writes) {
      // A block the write covers whole need not go back first.
      auto covered = [&](std::uint64_t b) {
        return a.user + a.block_off(b) >= lo && a.user + a.block_off(b) + a.block_len(b) <= hi;
      };
      if (CUresult st = hand_over(rt, a, b0, b1, covered); st != CUDA_SUCCESS) return st;
      continue;
    }
    // A read: what the CPU wrote goes back, and its blocks stay with the
    // CPU, clean.
    bool dirty = false;
    for (std::uint64_t b = b0; b < b1; ++b) dirty = dirty || a.state[b] == kDirty;
    if (!dirty) continue;
    for (std::uint64_t b = b0; b < b1; ++b)
      if (a.state[b] == kDirty) protect(a, b, b + 1, PROT_READ);
    const CUresult st = write_back(rt, a, b0, b1);
    for (std::uint64_t b = b0; b < b1; ++b)
      if (a.state[b] == kDirty) a.state[b] = kClean;
    if (st != CUDA_SUCCESS) return st;
  }
  return CUDA_SUCCESS;
}

bool contains(const void* p, std::uint64_t n) noexcept {
  if (!any() || p == nullptr) return false;
  std::lock_guard lk(books().mu);
  return find_locked(reinterpret_cast<std::uint64_t>(p), n) != nullptr;
}

bool find(std::uint64_t p, Range* out) {
  if (!any()) return false;
  std::lock_guard lk(books().mu);
  const Alloc* a = find_locked(p);
  if (a == nullptr) return false;
  out->start = a->user;
  out->size = a->bytes;
  out->ctx = a->ctx;
  return true;
}

bool free(Runtime* rt, std::uint64_t p, CUresult* st) {
  if (!any()) return false;
  std::unique_ptr<Alloc> a;
  {
    std::lock_guard lk(books().mu);
    Alloc* in = find_locked(p);
    if (in == nullptr) return false;
    if (in->user != p) {
      *st = CUDA_ERROR_INVALID_VALUE;  // not the start of an allocation
      return true;
    }
    auto it = books().allocs.find(p);
    a = std::move(it->second);
    books().allocs.erase(it);
    g_host_blocks.fetch_sub(a->host_blocks, std::memory_order_relaxed);
    g_allocs.fetch_sub(1, std::memory_order_release);
  }
  ::munmap(reinterpret_cast<void*>(a->user), a->mapped);
  ::munmap(a->alias, a->mapped);
  reserve_slack(rt, *a, true);
  {
    std::lock_guard lk(rt->books_mu);
    rt->dev_allocs.erase(a->base);
  }
  *st = rt->call<Op::kMemFree>(proto::ReqPtr{a->ctx, a->base});
  return true;
}

void device_attributes(proto::RepDeviceInfo* info) noexcept {
  auto set = [&](CUdevice_attribute at, int v) {
    const auto i = static_cast<std::size_t>(at);
    if (i >= proto::kAttrSlots) return;
    info->attrs[i] = v;
    info->attr_valid[i] = 1;
  };
  set(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1);
  set(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0);
  set(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 0);
  set(CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES, 0);
  set(CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST, 0);
}

}  // namespace ivcuda::guest::managed

// ==================================================================== API

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned int flags) {
  return guard([&] {
    NEED_RT();
    NEED_CTX();
    if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
    if (bytes > (std::uint64_t{1} << 48)) return CUDA_ERROR_OUT_OF_MEMORY;
    if (!install_handler()) return CUDA_ERROR_OPERATING_SYSTEM;
    auto a = std::make_unique<Alloc>();
    a->bytes = bytes;
    a->mapped = round_up(bytes, kPage);
    a->alloc_size = a->mapped + kPage;  // room for a page-aligned start
    a->ctx = ctx;
    a->attach = flags;
    // Device memory whose page-aligned part is free in this process too; a
    // range that collides is held while another is asked for (as cuMemAlloc
    // does), then given back.
    std::vector<std::uint64_t> held;
    CUresult st = CUDA_ERROR_OUT_OF_MEMORY;
    for (int attempt = 0; attempt < 8; ++attempt) {
      proto::ReqMemAlloc r{};
      r.ctx = ctx;
      r.bytes = a->alloc_size;
      proto::RepMemAlloc rep{};
      st = rt->call<Op::kMemAlloc>(r, {}, &rep);
      if (st != CUDA_SUCCESS) break;
      a->base = rep.dptr;
      a->user = round_up(rep.dptr, kPage);
      int err = 0;
      if (map_views(a->user, a->mapped, &a->alias, &err)) break;
      held.push_back(rep.dptr);
      st = CUDA_ERROR_OUT_OF_MEMORY;
      if (err != 0) break;  // not a collision: mapping fails for another reason
    }
    for (std::uint64_t p : held) (void)rt->call<Op::kMemFree>(proto::ReqPtr{ctx, p});
    if (st != CUDA_SUCCESS || a->alias == nullptr) {
      if (st == CUDA_SUCCESS) st = CUDA_ERROR_OUT_OF_MEMORY;
      return st;
    }
    // The view starts as zeros, and so does the device's copy: both sides
    // agree from the start (CUDA leaves the memory uncleared; agreeing costs
    // one memset). Synchronous: a kernel on any stream may come next.
    proto::ReqMemset z{};
    z.ctx = ctx;
    z.dptr = a->user;
    z.width = a->mapped;
    z.height = 1;
    z.value = 0;
    z.elem_size = 1;
    st = rt->call<Op::kMemset>(z);
    if (st == CUDA_SUCCESS) st = rt->call<Op::kCtxSynchronize>(proto::ReqCtx{ctx});
    if (st != CUDA_SUCCESS) {
      ::munmap(reinterpret_cast<void*>(a->user), a->mapped);
      ::munmap(a->alias, a->mapped);
      (void)rt->call<Op::kMemFree>(proto::ReqPtr{ctx, a->base});
      return st;
    }
    a->block = block_size(a->mapped);
    const std::uint64_t nblocks = (a->mapped + a->block - 1) / a->block;
    a->state.assign(nblocks, kClean);
    a->advice.assign(nblocks, Advice{});
    a->host_blocks = nblocks;
    reserve_slack(rt, *a, false);
    {
      std::lock_guard lk(rt->books_mu);
      rt->dev_allocs[a->base] = a->alloc_size;
    }
    *dptr = a->user;
    std::lock_guard lk(books().mu);
    g_host_blocks.fetch_add(nblocks, std::memory_order_relaxed);
    books().allocs[a->user] = std::move(a);
    g_allocs.fetch_add(1, std::memory_order_release);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemAdvise_v2(CUdeviceptr p, size_t n, CUmem_advise advice, CUmemLocation loc) {
  return guard([&] {
    NEED_RT();
    if (n == 0) return CUDA_ERROR_INVALID_VALUE;
    const int raw = ivcuda::guest::internal::raw_enum(advice);
    if (raw < CU_MEM_ADVISE_SET_READ_MOSTLY || raw > CU_MEM_ADVISE_UNSET_ACCESSED_BY) return CUDA_ERROR_INVALID_VALUE;
    const bool needs_loc = raw != CU_MEM_ADVISE_SET_READ_MOSTLY && raw != CU_MEM_ADVISE_UNSET_READ_MOSTLY;
    if (needs_loc)
      if (CUresult st = check_location(rt, loc); st != CUDA_SUCCESS) return st;
    std::lock_guard lk(books().mu);
    Alloc* a = find_locked(p, n);
    if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto [b0, b1] = blocks_of(*a, p, n);
    const std::uint64_t bit = loc.type == CU_MEM_LOCATION_TYPE_DEVICE ? std::uint64_t{1} << (loc.id + 1) : 1;
    for (std::uint64_t b = b0; b < b1; ++b) {
      Advice& ad = a->advice[b];
      switch (advice) {
        case CU_MEM_ADVISE_SET_READ_MOSTLY: ad.read_mostly = true; break;
        case CU_MEM_ADVISE_UNSET_READ_MOSTLY: ad.read_mostly = false; break;
        case CU_MEM_ADVISE_SET_PREFERRED_LOCATION: ad.preferred = loc; break;
        case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION: ad.preferred = CUmemLocation{CU_MEM_LOCATION_TYPE_INVALID, 0}; break;
        case CU_MEM_ADVISE_SET_ACCESSED_BY: ad.accessed_by |= bit; break;
        case CU_MEM_ADVISE_UNSET_ACCESSED_BY: ad.accessed_by &= ~bit; break;
        default: break;
      }
    }
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemAdvise(CUdeviceptr p, size_t n, CUmem_advise advice, CUdevice dev) {
  return cuMemAdvise_v2(p, n, advice, from_device(dev));
}

CUresult CUDAAPI cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned int flags, CUstream s) {
  return guard([&] { return prefetch_entry(p, n, loc, flags, s); });
}
extern "C" CUresult CUDAAPI cuMemPrefetchAsync_v2_ptsz(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned int flags,
                                                      CUstream s) {
  return guard([&] { return prefetch_entry(p, n, loc, flags, ptsz(s)); });
}
CUresult CUDAAPI cuMemPrefetchAsync(CUdeviceptr p, size_t n, CUdevice dev, CUstream s) {
  return guard([&] { return prefetch_entry(p, n, from_device(dev), 0, s); });
}
CUresult CUDAAPI cuMemPrefetchAsync_ptsz(CUdeviceptr p, size_t n, CUdevice dev, CUstream s) {
  return guard([&] { return prefetch_entry(p, n, from_device(dev), 0, ptsz(s)); });
}

CUresult CUDAAPI cuMemPrefetchBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count, CUmemLocation* locs,
                                         size_t* loc_idxs, size_t nlocs, unsigned long long flags, CUstream s) {
  return guard([&] {
    if (locs == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return batch(dptrs, sizes, count, locs, loc_idxs, nlocs, flags, s, false);
  });
}
extern "C" CUresult CUDAAPI cuMemPrefetchBatchAsync_ptsz(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                                        CUmemLocation* locs, size_t* loc_idxs, size_t nlocs,
                                                        unsigned long long flags, CUstream s) {
  return cuMemPrefetchBatchAsync(dptrs, sizes, count, locs, loc_idxs, nlocs, flags, ptsz(s));
}
CUresult CUDAAPI cuMemDiscardBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count, unsigned long long flags,
                                        CUstream s) {
  return guard([&] { return batch(dptrs, sizes, count, nullptr, nullptr, 0, flags, s, true); });
}
extern "C" CUresult CUDAAPI cuMemDiscardBatchAsync_ptsz(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                                       unsigned long long flags, CUstream s) {
  return cuMemDiscardBatchAsync(dptrs, sizes, count, flags, ptsz(s));
}
CUresult CUDAAPI cuMemDiscardAndPrefetchBatchAsync(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                                   CUmemLocation* locs, size_t* loc_idxs, size_t nlocs,
                                                   unsigned long long flags, CUstream s) {
  return guard([&] {
    if (locs == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return batch(dptrs, sizes, count, locs, loc_idxs, nlocs, flags, s, true);
  });
}
extern "C" CUresult CUDAAPI cuMemDiscardAndPrefetchBatchAsync_ptsz(CUdeviceptr* dptrs, size_t* sizes, size_t count,
                                                                  CUmemLocation* locs, size_t* loc_idxs, size_t nlocs,
                                                                  unsigned long long flags, CUstream s) {
  return cuMemDiscardAndPrefetchBatchAsync(dptrs, sizes, count, locs, loc_idxs, nlocs, flags, ptsz(s));
}

namespace {

// One range attribute over blocks [b0, b1) of `a`: a value all of them share,
// else the attribute's "none".
CUresult range_attribute(const Alloc& a, std::uint64_t b0, std::uint64_t b1, CUmem_range_attribute attr, void* data,
                         size_t size) {
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto put_int = [&](int v) {
    if (size != sizeof(int)) return CUDA_ERROR_INVALID_VALUE;
    std::memcpy(data, &v, sizeof v);
    return CUDA_SUCCESS;
  };
  // The location every block agrees on, else INVALID.
  auto common = [&](auto pick) {
    CUmemLocation l = pick(a.advice[b0]);
    for (std::uint64_t b = b0 + 1; b < b1; ++b)
      if (!same(pick(a.advice[b]), l)) return CUmemLocation{CU_MEM_LOCATION_TYPE_INVALID, 0};
    return l;
  };
  auto preferred = [](const Advice& ad) { return ad.preferred; };
  auto prefetched = [](const Advice& ad) { return ad.last_prefetch; };
  switch (attr) {
    case CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY: {
      bool all = true;
      for (std::uint64_t b = b0; b < b1; ++b) all = all && a.advice[b].read_mostly;
      return put_int(all ? 1 : 0);
    }
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION: return put_int(legacy_id(common(preferred)));
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION: return put_int(legacy_id(common(prefetched)));
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE: return put_int(static_cast<int>(common(preferred).type));
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID: {
      const CUmemLocation l = common(preferred);
      return put_int(l.type == CU_MEM_LOCATION_TYPE_DEVICE || l.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ? l.id
                                                                                                       : CU_DEVICE_INVALID);
    }
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE: return put_int(static_cast<int>(common(prefetched).type));
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID: {
      const CUmemLocation l = common(prefetched);
      return put_int(l.type == CU_MEM_LOCATION_TYPE_DEVICE || l.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ? l.id
                                                                                                       : CU_DEVICE_INVALID);
    }
    case CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY: {
      if (size == 0 || size % sizeof(int) != 0) return CUDA_ERROR_INVALID_VALUE;
      std::uint64_t mask = ~std::uint64_t{0};
      for (std::uint64_t b = b0; b < b1; ++b) mask &= a.advice[b].accessed_by;
      std::vector<int> out(size / sizeof(int), CU_DEVICE_INVALID);
      std::size_t k = 0;
      if ((mask & 1) != 0 && k < out.size()) out[k++] = CU_DEVICE_CPU;
      for (int d = 0; d < 63 && k < out.size(); ++d)
        if ((mask & (std::uint64_t{1} << (d + 1))) != 0) out[k++] = d;
      std::memcpy(data, out.data(), size);
      return CUDA_SUCCESS;
    }
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

}  // namespace

CUresult CUDAAPI cuMemRangeGetAttributes(void** data, size_t* sizes, CUmem_range_attribute* attrs, size_t n,
                                         CUdeviceptr p, size_t count) {
  return guard([&] {
    NEED_RT();
    if (n == 0 || data == nullptr || sizes == nullptr || attrs == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard lk(books().mu);
    const Alloc* a = find_locked(p, count);
    if (a == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const auto [b0, b1] = blocks_of(*a, p, count);
    for (size_t i = 0; i < n; ++i)
      if (CUresult st = range_attribute(*a, b0, b1, attrs[i], data[i], sizes[i]); st != CUDA_SUCCESS) return st;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuMemRangeGetAttribute(void* data, size_t size, CUmem_range_attribute attr, CUdeviceptr p,
                                        size_t count) {
  return cuMemRangeGetAttributes(&data, &size, &attr, 1, p, count);
}

namespace {
CUresult attach(CUstream s, CUdeviceptr p, size_t length, unsigned flags) {
  NEED_RT();
  NEED_CTX();
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST && flags != CU_MEM_ATTACH_SINGLE)
    return CUDA_ERROR_INVALID_VALUE;
  if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
  const std::uint64_t stream = h(s);
  // Attaching singly to the null stream (a virtual global one) is refused.
  if (flags == CU_MEM_ATTACH_SINGLE && (stream == 0 || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD))
    return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lk(books().mu);
  Alloc* a = find_locked(p);
  if (a == nullptr || a->user != p || (length != 0 && length != a->bytes)) return CUDA_ERROR_INVALID_VALUE;
  // Memory leaving the GPU's reach entirely or in part: nothing changes
  // until the CPU next touches it (it then waits for the GPU as before).
  a->attach = flags;
  a->attach_stream = flags == CU_MEM_ATTACH_SINGLE ? stream : 0;
  return CUDA_SUCCESS;
}
}  // namespace

CUresult CUDAAPI cuStreamAttachMemAsync(CUstream s, CUdeviceptr p, size_t length, unsigned int flags) {
  return guard([&] { return attach(s, p, length, flags); });
}
extern "C" CUresult CUDAAPI cuStreamAttachMemAsync_ptsz(CUstream s, CUdeviceptr p, size_t length, unsigned int flags) {
  return guard([&] { return attach(ptsz(s), p, length, flags); });
}
