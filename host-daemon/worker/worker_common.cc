// What every API family's handlers share: device and context checks, stream
// resolution, ownership of device ranges and arena spans, and the teardown
// of a context's objects. The handlers themselves live in one file per API
// family, named as on the guest side: contexts.cc, memory.cc, modules.cc,
// launch.cc, streams.cc, events.cc, pools.cc, vmm.cc, ipc.cc, arrays.cc,
// graph_build.cc, graph_edit.cc, graph_exec.cc, peer.cc, hostfunc.cc. Each
// works on a private copy of the request (Call), validates every handle,
// address, offset and length against what this guest owns, and only then
// calls the driver.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "host-daemon/worker/image_check.h"
#include "host-daemon/shared/log.h"
#include "host-daemon/worker/worker_internal.h"
#include "ring/validate.h"

namespace ivcuda::host {

using namespace ivcuda::proto;
using namespace detail;

// ------------------------------------------------------------------ helpers

bool Worker::valid_device(int device) const noexcept {
  return device >= 0 && static_cast<std::size_t>(device) < devices_.size();
}

// Only after valid_device() said yes.
std::size_t Worker::dev_index(int device) const noexcept { return static_cast<std::size_t>(device); }

CUresult Worker::use_ctx(std::uint64_t h, CtxEntry** out) {
  CtxEntry* c = ctxs_.find(h);
  // A destroyed green context's converted context: what the guest made in
  // it is the device's primary context's, where the driver keeps it (green.cc).
  if (c != nullptr && c->real == nullptr && c->green != 0) c = ctxs_.find(primary_[dev_index(c->device)]);
  if (c == nullptr || c->real == nullptr || (c->primary && c->guest_refs == 0))
    return CUDA_ERROR_INVALID_CONTEXT;
  if (current_ != c->real) {
    const CUresult st = cu_.cuCtxSetCurrent(c->real);
    if (st != CUDA_SUCCESS) return st;
    current_ = c->real;
  }
  if (out != nullptr) *out = c;
  return CUDA_SUCCESS;
}

CUresult Worker::resolve_stream(std::uint64_t ctx, std::uint64_t h, CUstream* out) {
  if (h == 0 || h == kStreamLegacy || h == kStreamPerThread) {
    *out = reinterpret_cast<CUstream>(h);
    return CUDA_SUCCESS;
  }
  StreamEntry* s = streams_.find(h);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // A stream of another context is legal in CUDA only where it says so;
  // the driver checks that. We only check it is this guest's.
  (void)ctx;
  order_after_copies(*s);  // memory.cc: after the synchronous copies posted before
  *out = s->real;
  return CUDA_SUCCESS;
}

// XLA records command buffers with placeholder buffers at small addresses (a
// memset at 0x80 into a capturing stream) and updates them before they run;
// the driver records such work without looking at the address. The worker
// records it too, as long as the range holds nothing of its own: the low
// gigabyte, reserved here before the driver loads (so neither the driver's
// device ranges nor any host mapping can land there).
void Worker::reserve_null_region() noexcept {
  constexpr std::uint64_t kEnd = std::uint64_t{1} << 30;
  for (std::uint64_t lo : {std::uint64_t{64} << 10, std::uint64_t{1} << 20, std::uint64_t{16} << 20}) {
    void* want = reinterpret_cast<void*>(lo);
    void* got = ::mmap(want, kEnd - lo, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
                       -1, 0);
    if (got == want) {
      null_end_ = kEnd;
      return;
    }
    if (got != MAP_FAILED) ::munmap(got, kEnd - lo);  // an old kernel took it as a hint
    if (got != MAP_FAILED || errno != EPERM) break;   // EPERM: below the kernel's lowest address; try higher
  }
  IVLOG_INFO("guest %u: the low gigabyte could not be reserved: work at placeholder addresses is refused",
             cfg_.guest_id);
}

bool Worker::placeholder_range(std::uint64_t addr, std::uint64_t len) const noexcept {
  std::uint64_t end = 0;
  return null_end_ != 0 && len != 0 && !__builtin_add_overflow(addr, len, &end) && end <= null_end_;
}

bool Worker::capturing(CUstream s) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  return cu_.cuStreamIsCapturing(s, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

bool Worker::owns_device(std::uint64_t addr, std::uint64_t len) const {
  if (!IVCUDA_RULE("device-range")) return true;
  // Page-locked arena memory is device-accessible too (zero copy).
  if (arena_dev_ != 0 && ring::span_within(addr, len, arena_dev_, l_.arena_size)) return true;
  if (shared_device(addr, len)) return true;  // a registered shared mapping (host_register.cc)
  auto it = ranges_.upper_bound(addr);
  bool ok = it != ranges_.begin() && ring::span_within(addr, len, std::prev(it)->first, std::prev(it)->second.size);
  if (!ok && it != ranges_.begin()) ok = spans_mappings(std::prev(it), addr, len);
  if (!ok && ::ivcuda::log::enabled(::ivcuda::log::Level::kDebug)) {
    // A guest's bad pointer, for whoever debugs it (debug level only: a guest controls how
    // often), with the guest's range below it and the one above.
    const auto below = it != ranges_.begin() ? std::prev(it) : ranges_.end();
    IVLOG_DEBUG("guest %u: 0x%llx + %llu is not device memory of this guest (below: 0x%llx + %llu kind %d; "
                "above: 0x%llx)",
                cfg_.guest_id, static_cast<unsigned long long>(addr), static_cast<unsigned long long>(len),
                below != ranges_.end() ? static_cast<unsigned long long>(below->first) : 0ull,
                below != ranges_.end() ? static_cast<unsigned long long>(below->second.size) : 0ull,
                below != ranges_.end() ? static_cast<int>(below->second.kind) : -1,
                it != ranges_.end() ? static_cast<unsigned long long>(it->first) : 0ull);
  }
  return ok;
}

// VMM mappings back to back are one stretch of device memory for the driver
// (a buffer grown chunk by chunk, as XLA's and PyTorch's expandable
// allocators grow theirs): a span may run from one of the guest's mappings
// into the next, never through a hole or into memory of another kind. The
// walk is bounded; a span over more mappings than that is refused.
bool Worker::spans_mappings(std::map<std::uint64_t, DevRange>::const_iterator first, std::uint64_t addr,
                            std::uint64_t len) const {
  constexpr int kMaxMappings = 4096;
  std::uint64_t end = 0;
  if (first->second.kind != RangeKind::kMapped || addr < first->first ||
      __builtin_add_overflow(first->first, first->second.size, &end) || addr >= end)
    return false;
  std::uint64_t want = 0;
  if (__builtin_add_overflow(addr, len, &want)) return false;
  auto next = std::next(first);
  for (int k = 0; k < kMaxMappings && next != ranges_.end(); ++k, ++next) {
    if (next->first != end || next->second.kind != RangeKind::kMapped) return false;
    if (__builtin_add_overflow(end, next->second.size, &end)) return false;
    if (end >= want) return true;
  }
  return false;
}

bool Worker::arena_range(std::uint64_t off, std::uint64_t len) const {
  if (!IVCUDA_RULE("arena-range")) return true;
  return off >= l_.arena_off && ring::range_ok(off - l_.arena_off, len, l_.arena_size);
}

// ------------------------------------------------------------------ sharing

// The driver's fd never leaves the host: the guest gets the token, which this
// worker honours from its own exports and the daemon only in its tenant.
CUresult Worker::share_fd(sys::UniqueFd fd, std::uint64_t value, std::shared_ptr<Charge> charge, BrokerToken* token,
                          Export** out) {
  // Refused past the cap rather than dropping an older export: a token the
  // guest holds keeps working as long as its exporter lives.
  if (exports_.size() >= kMaxExports) return CUDA_ERROR_OUT_OF_MEMORY;
  auto t = new_broker_token();
  if (!t) return CUDA_ERROR_OPERATING_SYSTEM;
  if (broker_.connected()) {
    if (auto dep = broker_.deposit(*t, fd.get(), value); !dep) {
      if (dep.error().code == ENOSPC) return CUDA_ERROR_OUT_OF_MEMORY;  // the guest's or tenant's cap
      IVLOG_WARN("guest %u: export not shared with the tenant's other workers: %s", cfg_.guest_id,
                 dep.error().what.c_str());
    }
  }
  *token = *t;
  Export& e = exports_[*t];
  e = Export{std::move(fd), value};
  e.charge = std::move(charge);
  if (out != nullptr) *out = &e;
  return CUDA_SUCCESS;
}

int Worker::shared_fd(const BrokerToken& token, Export** own, sys::UniqueFd* fetched, std::uint64_t* value) {
  *own = nullptr;
  if (auto it = exports_.find(token); it != exports_.end()) {
    *own = &it->second;
    *value = it->second.value;
    return it->second.fd.get();
  }
  if (!broker_.connected()) return -1;
  auto got = broker_.fetch(token);
  if (!got) return -1;
  *fetched = std::move(got->first);
  *value = got->second;
  return fetched->get();
}

Result<ShareTicket> Worker::share_publish(const ShareEntry& e) {
  if (!broker_.connected()) return local_share_.publish(e, ShareOwner{1, 0});
  return broker_.publish(e);
}

std::optional<ShareFound> Worker::share_lookup(ShareKind kind, const ShareTicket& t) {
  if (!broker_.connected()) return local_share_.lookup(kind, t, 1);
  auto f = broker_.lookup(kind, t);
  if (!f) return std::nullopt;
  return *f;
}

void Worker::share_withdraw(ShareKind kind, std::uint64_t key) {
  if (!broker_.connected()) {
    (void)local_share_.withdraw(kind, key, 1);
    return;
  }
  // A line that failed meanwhile took the entry with it (the daemon drops
  // what a line published when it closes).
  (void)broker_.withdraw(kind, key);
}

// ------------------------------------------------------------------ teardown

void Worker::drop_ctx_objects(std::uint64_t ctx) {
  pool_drop_ctx(ctx, false);
  ipc_drop_ctx(ctx, false);
  std::vector<std::uint64_t> dead;
  modules_.for_each([&](std::uint64_t h, ModuleEntry& m) {
    if (m.ctx == ctx) dead.push_back(h);
  });
  for (auto h : dead) {
    ModuleEntry* m = modules_.find(h);
    for (auto& [name, f] : m->functions) funcs_.erase(f);
    for (auto g : m->globals) ranges_.erase(g);
    modules_.erase(h);
  }
  dead.clear();
  streams_.for_each([&](std::uint64_t h, StreamEntry& s) {
    if (s.ctx == ctx) dead.push_back(h);
  });
  for (auto h : dead) {
    captures_.erase(streams_.find(h)->real);
    streams_.erase(h);
  }
  dead.clear();
  events_.for_each([&](std::uint64_t h, EventEntry& e) {
    if (e.ctx == ctx) dead.push_back(h);
  });
  for (auto h : dead) events_.erase(h);
  dead.clear();
  graphs_.for_each([&](std::uint64_t h, GraphEntry& g) {
    if (g.ctx == ctx) dead.push_back(h);
  });
  for (auto h : dead) drop_graph(h);  // graph_build.cc: their nodes too
  dead.clear();
  execs_.for_each([&](std::uint64_t h, ExecEntry& e) {
    if (e.ctx == ctx) dead.push_back(h);
  });
  for (auto h : dead) execs_.erase(h);
  release_ctx_arrays(ctx, false);
  for (auto it = ranges_.begin(); it != ranges_.end();)
    it = it->second.ctx == ctx ? ranges_.erase(it) : std::next(it);
}

// Frees what the guest made in a primary context whose last guest reference
// went away. The driver's primary context may live on (the arena holds it).
CUresult Worker::release_primary_objects(CtxEntry& c, std::uint64_t h) {
  if (current_ != c.real) {
    cu_.cuCtxSetCurrent(c.real);
    current_ = c.real;
  }
  pool_drop_ctx(h, true);
  ipc_drop_ctx(h, true);
  std::vector<std::uint64_t> allocs;
  for (auto& [addr, r] : ranges_)
    if (r.ctx == h && r.kind == RangeKind::kAlloc) allocs.push_back(addr);
  for (auto a : allocs) cu_.cuMemFree(a);
  modules_.for_each([&](std::uint64_t, ModuleEntry& m) {
    if (m.ctx == h) cu_.cuModuleUnload(m.real);
  });
  streams_.for_each([&](std::uint64_t, StreamEntry& s) {
    if (s.ctx == h) cu_.cuStreamDestroy(s.real);
  });
  events_.for_each([&](std::uint64_t eh, EventEntry& e) {
    if (e.ctx == h && ipc_on_event_destroy(eh, e.real)) cu_.cuEventDestroy(e.real);
  });
  execs_.for_each([&](std::uint64_t, ExecEntry& e) {
    if (e.ctx == h) cu_.cuGraphExecDestroy(e.real);
  });
  graphs_.for_each([&](std::uint64_t, GraphEntry& g) {
    if (g.ctx == h) cu_.cuGraphDestroy(g.real);
  });
  release_ctx_arrays(h, true);
  drop_ctx_objects(h);
  return CUDA_SUCCESS;
}

CUresult Worker::park(Call& c, Op op, std::uint64_t handle) {
  c.parked = true;
  c.ch.parked.active = true;
  c.ch.parked.op = op;
  c.ch.parked.handle = handle;
  return CUDA_SUCCESS;
}

}  // namespace ivcuda::host
