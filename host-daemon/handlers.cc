// The op handlers. Each one works on a private copy of the request (Call),
// validates every handle, address, offset and length against what this
// guest owns, and only then calls the driver.
#include <unistd.h>

#include <cstring>
#include <string>

#include "host-daemon/image_check.h"
#include "host-daemon/log.h"
#include "host-daemon/worker_internal.h"
#include "ring/validate.h"

namespace ivcuda::host {

using namespace ivcuda::proto;

namespace {
constexpr std::uint64_t kStreamLegacy = 0x1;     // CU_STREAM_LEGACY
constexpr std::uint64_t kStreamPerThread = 0x2;  // CU_STREAM_PER_THREAD

// a * b without overflow, or false.
bool mul_ok(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
// Bytes a 2D region of `height` rows of `width` bytes at `pitch` spans.
bool span2d(std::uint64_t pitch, std::uint64_t width, std::uint64_t height, std::uint64_t* out) {
  if (height == 0 || width == 0) {
    *out = 0;
    return true;
  }
  if (width > pitch && height > 1) return false;
  std::uint64_t rows;
  if (!mul_ok(pitch, height - 1, &rows)) return false;
  return !__builtin_add_overflow(rows, width, out);
}
}  // namespace

// ------------------------------------------------------------------ helpers

bool Worker::valid_device(int device) const noexcept {
  return device >= 0 && static_cast<std::size_t>(device) < devices_.size();
}

// Only after valid_device() said yes.
std::size_t Worker::dev_index(int device) const noexcept { return static_cast<std::size_t>(device); }

CUresult Worker::use_ctx(std::uint64_t h, CtxEntry** out) {
  CtxEntry* c = ctxs_.find(h);
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
  *out = s->real;
  return CUDA_SUCCESS;
}

bool Worker::owns_device(std::uint64_t addr, std::uint64_t len) const {
  // Page-locked arena memory is device-accessible too (zero copy).
  if (arena_dev_ != 0 && ring::span_within(addr, len, arena_dev_, l_.arena_size)) return true;
  auto it = ranges_.upper_bound(addr);
  const bool ok = it != ranges_.begin() && ring::span_within(addr, len, std::prev(it)->first, std::prev(it)->second.size);
  if (!ok)  // a guest's bad pointer, for whoever debugs it (debug level only: a guest controls how often)
    IVLOG_DEBUG("guest %u: 0x%llx + %llu is not device memory of this guest", cfg_.guest_id,
                static_cast<unsigned long long>(addr), static_cast<unsigned long long>(len));
  return ok;
}

bool Worker::arena_range(std::uint64_t off, std::uint64_t len) const {
  return off >= l_.arena_off && ring::range_ok(off - l_.arena_off, len, l_.arena_size);
}

void Worker::drop_ctx_objects(std::uint64_t ctx) {
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
  for (auto h : dead) streams_.erase(h);
  dead.clear();
  events_.for_each([&](std::uint64_t h, EventEntry& e) {
    if (e.ctx == ctx) dead.push_back(h);
  });
  for (auto h : dead) events_.erase(h);
  dead.clear();
  graphs_.for_each([&](std::uint64_t h, GraphEntry& g) {
    if (g.ctx == ctx) dead.push_back(h);
  });
  for (auto h : dead) drop_graph(h);  // graphs.cc: their nodes too
  dead.clear();
  execs_.for_each([&](std::uint64_t h, ExecEntry& e) {
    if (e.ctx == ctx) dead.push_back(h);
  });
  for (auto h : dead) execs_.erase(h);
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
  events_.for_each([&](std::uint64_t, EventEntry& e) {
    if (e.ctx == h) cu_.cuEventDestroy(e.real);
  });
  execs_.for_each([&](std::uint64_t, ExecEntry& e) {
    if (e.ctx == h) cu_.cuGraphExecDestroy(e.real);
  });
  graphs_.for_each([&](std::uint64_t, GraphEntry& g) {
    if (g.ctx == h) cu_.cuGraphDestroy(g.real);
  });
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

// Destroys a stream or event: in its own context, and forgotten whatever the
// driver says (a failed destroy leaves nothing the guest could use again).
template <class Table, class Destroy>
CUresult Worker::destroy_in_ctx(Table& table, std::uint64_t handle, Destroy&& destroy) {
  auto* e = table.find(handle);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(e->ctx); st != CUDA_SUCCESS) return st;
  const CUresult st = destroy(*e);
  table.erase(handle);
  return st;
}

// ------------------------------------------------------------------ session

CUresult Worker::on_Hello(Call& c) {
  const auto r = c.req<ReqHello>();
  if (r.proto_version != kProtoVersion) {
    IVLOG_ERROR("guest %u speaks protocol %u, this daemon %u", cfg_.guest_id, r.proto_version,
                kProtoVersion);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  RepHello rep{};
  rep.proto_version = kProtoVersion;
  int v = 0;
  cu_.cuDriverGetVersion(&v);
  rep.driver_version = v;
  rep.device_count = static_cast<std::uint32_t>(devices_.size());
  int lo = 0, hi = 0;
  if (cu_.cuCtxGetStreamPriorityRange(&lo, &hi) == CUDA_SUCCESS) {
    rep.stream_priority_lo = lo;
    rep.stream_priority_hi = hi;
  }
  rep.arena_device_base = arena_dev_ - l_.arena_off;
  rep.generation = cfg_.generation;
  IVLOG_INFO("guest %u: process %u says hello", cfg_.guest_id, r.pid);
  c.set_reply(rep);
  return CUDA_SUCCESS;
}

CUresult Worker::on_Goodbye(Call&) { return CUDA_SUCCESS; }

CUresult Worker::on_Flush(Call&) { return CUDA_SUCCESS; }

CUresult Worker::on_DeviceInfo(Call& c) {
  const auto r = c.req<ReqDevice>();
  if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  const CUdevice d = devices_[dev_index(r.device)];
  RepDeviceInfo rep{};
  rep.primary_ctx = primary_[dev_index(r.device)];
  CUresult st = cu_.cuDeviceGetName(rep.name, sizeof rep.name - 1, d);
  if (st != CUDA_SUCCESS) return st;
  CUuuid u{};
  if ((st = cu_.cuDeviceGetUuid(&u, d)) != CUDA_SUCCESS) return st;
  std::memcpy(rep.uuid, u.bytes, sizeof rep.uuid);
  size_t total = 0;
  if ((st = cu_.cuDeviceTotalMem(&total, d)) != CUDA_SUCCESS) return st;
  rep.total_mem = total;
  for (int a = 1; a < static_cast<int>(kAttrSlots) && a < CU_DEVICE_ATTRIBUTE_MAX; ++a) {
    int v = 0;
    if (cu_.cuDeviceGetAttribute(&v, static_cast<CUdevice_attribute>(a), d) == CUDA_SUCCESS) {
      rep.attrs[a] = v;
      rep.attr_valid[a] = 1;
    }
  }
  c.set_reply(rep);
  return CUDA_SUCCESS;
}

// ------------------------------------------------------------------ contexts

CUresult Worker::on_PrimaryRetain(Call& c) {
  const auto r = c.req<ReqDevice>();
  if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  const auto h = primary_[dev_index(r.device)];
  CtxEntry* e = ctxs_.find(h);
  if (e->guest_refs == 0) {
    CUcontext real = nullptr;
    const CUresult st = cu_.cuDevicePrimaryCtxRetain(&real, devices_[dev_index(r.device)]);
    if (st != CUDA_SUCCESS) return st;
    e->real = real;
  }
  ++e->guest_refs;
  c.set_reply(RepHandle{h});
  return CUDA_SUCCESS;
}

CUresult Worker::on_PrimaryRelease(Call& c) {
  const auto r = c.req<ReqDevice>();
  if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  const auto h = primary_[dev_index(r.device)];
  CtxEntry* e = ctxs_.find(h);
  if (e->guest_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--e->guest_refs == 0) {
    release_primary_objects(*e, h);
    cu_.cuDevicePrimaryCtxRelease(devices_[dev_index(r.device)]);
    if (current_ == e->real && e->real != arena_ctx_) current_ = nullptr;
    if (e->real != arena_ctx_) e->real = nullptr;
  }
  return CUDA_SUCCESS;
}

CUresult Worker::on_PrimaryReset(Call& c) {
  const auto r = c.req<ReqDevice>();
  if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  const auto h = primary_[dev_index(r.device)];
  CtxEntry* e = ctxs_.find(h);
  // Resetting destroys what the guest made in the primary context. The
  // driver context itself is kept when it holds the arena registration: the
  // guest cannot tell the difference, and its page-locked memory stays valid.
  if (e->real != nullptr && e->guest_refs > 0) release_primary_objects(*e, h);
  if (e->real != nullptr) cu_.cuCtxSynchronize();
  return CUDA_SUCCESS;
}

CUresult Worker::on_PrimaryGetState(Call& c) {
  const auto r = c.req<ReqDevice>();
  if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  CtxEntry* e = ctxs_.find(primary_[dev_index(r.device)]);
  RepPrimaryState rep{};
  rep.flags = e->flags;
  rep.active = e->guest_refs > 0 ? 1 : 0;
  c.set_reply(rep);
  return CUDA_SUCCESS;
}

CUresult Worker::on_PrimarySetFlags(Call& c) {
  const auto r = c.req<ReqDeviceFlags>();
  if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  constexpr unsigned kKnown = CU_CTX_SCHED_MASK | CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX;
  if ((r.flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  CtxEntry* e = ctxs_.find(primary_[dev_index(r.device)]);
  const CUresult st = cu_.cuDevicePrimaryCtxSetFlags(devices_[dev_index(r.device)], r.flags);
  if (st == CUDA_SUCCESS) e->flags = r.flags;
  return st;
}

CUresult Worker::on_CtxCreate(Call& c) {
  const auto r = c.req<ReqDeviceFlags>();
  if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  CUcontext real = nullptr;
  const CUresult st = cu_.cuCtxCreate(&real, nullptr, r.flags, devices_[dev_index(r.device)]);
  if (st != CUDA_SUCCESS) return st;
  current_ = real;  // cuCtxCreate made it current on this thread
  CtxEntry e;
  e.real = real;
  e.device = r.device;
  c.set_reply(RepHandle{ctxs_.insert(e)});
  return CUDA_SUCCESS;
}

CUresult Worker::on_CtxDestroy(Call& c) {
  const auto r = c.req<ReqHandle>();
  CtxEntry* e = ctxs_.find(r.handle);
  if (e == nullptr || e->primary || e->real == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  const CUresult st = cu_.cuCtxDestroy(e->real);
  if (st != CUDA_SUCCESS) return st;
  if (current_ == e->real) current_ = nullptr;
  drop_ctx_objects(r.handle);
  ctxs_.erase(r.handle);
  return CUDA_SUCCESS;
}

CUresult Worker::on_CtxSynchronize(Call& c) {
  const auto r = c.req<ReqCtx>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  return cu_.cuCtxSynchronize();
}

// ------------------------------------------------------------------ memory

CUresult Worker::on_MemAlloc(Call& c) {
  const auto r = c.req<ReqMemAlloc>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  RepMemAlloc rep{};
  CUdeviceptr d = 0;
  CUresult st;
  std::uint64_t size;
  if (r.elem_size == 0) {
    if (r.bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    st = cu_.cuMemAlloc(&d, r.bytes);
    size = r.bytes;
  } else {
    size_t pitch = 0;
    st = cu_.cuMemAllocPitch(&d, &pitch, r.width, r.height, r.elem_size);
    rep.pitch = pitch;
    if (st == CUDA_SUCCESS && !mul_ok(pitch, r.height, &size)) return CUDA_ERROR_INVALID_VALUE;
  }
  if (st != CUDA_SUCCESS) return st;
  ranges_[d] = DevRange{size, r.ctx, RangeKind::kAlloc};
  IVLOG_DEBUG("guest %u: allocated 0x%llx + %llu", cfg_.guest_id, static_cast<unsigned long long>(d),
              static_cast<unsigned long long>(size));
  rep.dptr = d;
  c.set_reply(rep);
  return CUDA_SUCCESS;
}

CUresult Worker::on_MemFree(Call& c) {
  const auto r = c.req<ReqPtr>();
  auto it = ranges_.find(r.dptr);
  if (it == ranges_.end() || it->second.kind != RangeKind::kAlloc) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = use_ctx(it->second.ctx); st != CUDA_SUCCESS) return st;
  const CUresult st = cu_.cuMemFree(r.dptr);
  if (st == CUDA_SUCCESS) ranges_.erase(it);
  return st;
}

CUresult Worker::on_MemGetInfo(Call& c) {
  const auto r = c.req<ReqCtx>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  size_t f = 0, t = 0;
  const CUresult st = cu_.cuMemGetInfo(&f, &t);
  c.set_reply(RepMemInfo{f, t});
  return st;
}

CUresult Worker::on_MemGetAddressRange(Call& c) {
  const auto r = c.req<ReqPtr>();
  auto it = ranges_.upper_bound(r.dptr);
  if (it == ranges_.begin()) return CUDA_ERROR_NOT_FOUND;
  --it;
  if (!ring::span_within(r.dptr, 1, it->first, it->second.size)) return CUDA_ERROR_NOT_FOUND;
  c.set_reply(RepRange{it->first, it->second.size});
  return CUDA_SUCCESS;
}

CUresult Worker::on_Memset(Call& c) {
  const auto r = c.req<ReqMemset>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  if (r.elem_size != 1 && r.elem_size != 2 && r.elem_size != 4) return CUDA_ERROR_INVALID_VALUE;
  std::uint64_t row_bytes, extent;
  if (!mul_ok(r.width, r.elem_size, &row_bytes)) return CUDA_ERROR_INVALID_VALUE;
  const bool two_d = r.pitch != 0;
  if (two_d) {
    if (!span2d(r.pitch, row_bytes, r.height, &extent)) return CUDA_ERROR_INVALID_VALUE;
  } else {
    extent = row_bytes;
  }
  if (extent != 0 && !owns_device(r.dptr, extent)) return CUDA_ERROR_INVALID_VALUE;
  CUstream s = nullptr;
  const bool async = (r.flags & kAsync) != 0;
  if (async)
    if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  const auto v8 = static_cast<unsigned char>(r.value);
  const auto v16 = static_cast<unsigned short>(r.value);
  if (!two_d) {
    switch (r.elem_size) {
      case 1: return async ? cu_.cuMemsetD8Async(r.dptr, v8, r.width, s) : cu_.cuMemsetD8(r.dptr, v8, r.width);
      case 2: return async ? cu_.cuMemsetD16Async(r.dptr, v16, r.width, s) : cu_.cuMemsetD16(r.dptr, v16, r.width);
      default: return async ? cu_.cuMemsetD32Async(r.dptr, r.value, r.width, s) : cu_.cuMemsetD32(r.dptr, r.value, r.width);
    }
  }
  switch (r.elem_size) {
    case 1: return async ? cu_.cuMemsetD2D8Async(r.dptr, r.pitch, v8, r.width, r.height, s)
                         : cu_.cuMemsetD2D8(r.dptr, r.pitch, v8, r.width, r.height);
    case 2: return async ? cu_.cuMemsetD2D16Async(r.dptr, r.pitch, v16, r.width, r.height, s)
                         : cu_.cuMemsetD2D16(r.dptr, r.pitch, v16, r.width, r.height);
    default: return async ? cu_.cuMemsetD2D32Async(r.dptr, r.pitch, r.value, r.width, r.height, s)
                          : cu_.cuMemsetD2D32(r.dptr, r.pitch, r.value, r.width, r.height);
  }
}

CUresult Worker::on_MemcpyHtoDInline(Call& c) {
  const auto r = c.req<ReqCopy>();
  const auto data = c.tail<ReqCopy>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  if (data.size() != r.bytes || !owns_device(r.dst, r.bytes)) return CUDA_ERROR_INVALID_VALUE;
  if (r.bytes == 0) return CUDA_SUCCESS;
  if ((r.flags & kAsync) != 0) {
    CUstream s;
    if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
    if (CUresult st = refuse_in_capture(s); st != CUDA_SUCCESS) return st;
    // Pageable source: the driver has staged it when the call returns, so
    // our private copy may be reused right after.
    return cu_.cuMemcpyHtoDAsync(r.dst, data.data(), r.bytes, s);
  }
  return cu_.cuMemcpyHtoD(r.dst, data.data(), r.bytes);
}

// Copies between the arena and the device. A chunk in the channel's own
// staging area is a piece of a pipelined pageable copy: the guest posts
// chunks ahead and reuses (HtoD) or reads (DtoH) one only after the
// channel's staging_done counter says so. The copies below return only when
// the chunk's data has moved (the arena is registered memory, for which the
// synchronous copies are synchronous; kWaitStream waits for the stream), so
// the counter is bumped right after, whatever the outcome: a guest waits on
// it and must never wait forever.
CUresult Worker::on_MemcpyHtoDArena(Call& c) { return arena_copy(c, true); }

CUresult Worker::on_MemcpyDtoHArena(Call& c) { return arena_copy(c, false); }

CUresult Worker::arena_copy(Call& c, bool to_device) {
  const auto r = c.req<ReqCopy>();
  const CUdeviceptr dev = to_device ? r.dst : r.src;
  const bool staged = ring::in_staging(l_, c.ch.index, r.arena_off, r.bytes);
  const CUresult st = [&] {
    if (CUresult e = use_ctx(r.ctx); e != CUDA_SUCCESS) return e;
    if (!arena_range(r.arena_off, r.bytes) || !owns_device(dev, r.bytes)) return CUDA_ERROR_INVALID_VALUE;
    if (r.bytes == 0) return CUDA_SUCCESS;
    void* host = arena_ptr(r.arena_off);
    if ((r.flags & kAsync) != 0) {
      CUstream s;
      if (CUresult e = resolve_stream(r.ctx, r.stream, &s); e != CUDA_SUCCESS) return e;
      if (staged)
        if (CUresult e = refuse_in_capture(s); e != CUDA_SUCCESS) return e;
      const CUresult e = to_device ? cu_.cuMemcpyHtoDAsync(dev, host, r.bytes, s)
                                   : cu_.cuMemcpyDtoHAsync(host, dev, r.bytes, s);
      return e == CUDA_SUCCESS && (r.flags & kWaitStream) != 0 ? cu_.cuStreamSynchronize(s) : e;
    }
    return to_device ? cu_.cuMemcpyHtoD(dev, host, r.bytes) : cu_.cuMemcpyDtoH(host, dev, r.bytes);
  }();
  if (staged) ring::bump_staging_done(bar_.data(), l_, c.ch.index);
  return st;
}

CUresult Worker::on_MemcpyDtoD(Call& c) {
  const auto r = c.req<ReqCopy>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  if (!owns_device(r.src, r.bytes) || !owns_device(r.dst, r.bytes)) return CUDA_ERROR_INVALID_VALUE;
  if (r.bytes == 0) return CUDA_SUCCESS;
  if ((r.flags & kAsync) != 0) {
    CUstream s;
    if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
    return cu_.cuMemcpyDtoDAsync(r.dst, r.src, r.bytes, s);
  }
  return cu_.cuMemcpyDtoD(r.dst, r.src, r.bytes);
}

CUresult Worker::on_Memcpy2D(Call& c) {
  const auto r = c.req<ReqCopy2D>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUDA_MEMCPY2D p{};
  p.WidthInBytes = r.width_bytes;
  p.Height = r.height;
  // Each side: host memory must lie in the arena, device memory in a range
  // this guest owns; the whole 2D footprint is checked, not just its start.
  auto side = [&](std::uint32_t type, std::uint64_t x, std::uint64_t y, std::uint64_t pitch,
                  std::uint64_t dev, std::uint64_t off, CUmemorytype* t, const void** host,
                  CUdeviceptr* d, size_t* px, size_t* py, size_t* pp) -> bool {
    std::uint64_t extent, start;
    if (!span2d(pitch, r.width_bytes, r.height, &extent)) return false;
    if (!mul_ok(y, pitch, &start) || __builtin_add_overflow(start, x, &start)) return false;
    *px = x;
    *py = y;
    *pp = pitch;
    if (type == CU_MEMORYTYPE_HOST) {
      std::uint64_t first;
      if (__builtin_add_overflow(off, start, &first) || !arena_range(first, extent)) return false;
      *t = CU_MEMORYTYPE_HOST;
      *host = arena_ptr(off);
      return true;
    }
    if (type == CU_MEMORYTYPE_DEVICE) {
      std::uint64_t first;
      if (__builtin_add_overflow(dev, start, &first) || (extent != 0 && !owns_device(first, extent)))
        return false;
      *t = CU_MEMORYTYPE_DEVICE;
      *d = dev;
      return true;
    }
    return false;
  };
  const void* src_host = nullptr;
  const void* dst_host = nullptr;
  if (!side(r.src_type, r.src_x_bytes, r.src_y, r.src_pitch, r.src_device, r.src_arena_off,
            &p.srcMemoryType, &src_host, &p.srcDevice, &p.srcXInBytes, &p.srcY, &p.srcPitch) ||
      !side(r.dst_type, r.dst_x_bytes, r.dst_y, r.dst_pitch, r.dst_device, r.dst_arena_off,
            &p.dstMemoryType, &dst_host, &p.dstDevice, &p.dstXInBytes, &p.dstY, &p.dstPitch))
    return CUDA_ERROR_INVALID_VALUE;
  p.srcHost = src_host;
  p.dstHost = const_cast<void*>(dst_host);
  if ((r.flags & kAsync) != 0) {
    CUstream s;
    if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
    if ((r.flags & kWaitStream) != 0)
      if (CUresult st = refuse_in_capture(s); st != CUDA_SUCCESS) return st;
    const CUresult st = cu_.cuMemcpy2DAsync(&p, s);
    return st == CUDA_SUCCESS && (r.flags & kWaitStream) != 0 ? cu_.cuStreamSynchronize(s) : st;
  }
  return r.unaligned ? cu_.cuMemcpy2DUnaligned(&p) : cu_.cuMemcpy2D(&p);
}

CUresult Worker::on_HostAlloc(Call& c) {
  const auto r = c.req<ReqHostAlloc>();
  if (r.bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const auto off = pool_.allocate(r.bytes);
  if (!off) return CUDA_ERROR_OUT_OF_MEMORY;
  c.set_reply(RepHostAlloc{*off, arena_dev_ + (*off - l_.arena_off)});
  return CUDA_SUCCESS;
}

CUresult Worker::on_HostFree(Call& c) {
  const auto r = c.req<ReqArenaOff>();
  return pool_.free(r.arena_off) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// ------------------------------------------------------------------ modules

CUresult Worker::on_ModuleLoad(Call& c) {
  const auto r = c.req<ReqModuleLoad>();
  CtxEntry* ctx = nullptr;
  if (CUresult st = use_ctx(r.ctx, &ctx); st != CUDA_SUCCESS) return st;
  if (r.bytes == 0 || !arena_range(r.arena_off, r.bytes)) return CUDA_ERROR_INVALID_VALUE;
  // Copy the image out before the driver parses it: the guest could change
  // it under the parser otherwise. The NUL keeps a PTX image terminated.
  std::vector<char> image(r.bytes + 1);
  std::memcpy(image.data(), arena_ptr(r.arena_off), r.bytes);
  image[r.bytes] = '\0';
  // The driver takes the image without a length and believes its own size
  // fields: every extent it declares must lie within the copy.
  if (const auto v = check_image(std::as_bytes(std::span(image))); !v.ok) {
    IVLOG_WARN("guest %u: module image of %llu bytes refused: %s", cfg_.guest_id,
               static_cast<unsigned long long>(r.bytes), v.why.c_str());
    return CUDA_ERROR_INVALID_IMAGE;
  }
  CUmodule m = nullptr;
  const CUresult st = cu_.cuModuleLoadData(&m, image.data());
  if (st != CUDA_SUCCESS) return st;
  ModuleEntry e;
  e.real = m;
  e.ctx = r.ctx;
  c.set_reply(RepHandle{modules_.insert(std::move(e))});
  return CUDA_SUCCESS;
}

CUresult Worker::on_ModuleUnload(Call& c) {
  const auto r = c.req<ReqHandle>();
  ModuleEntry* m = modules_.find(r.handle);
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(m->ctx); st != CUDA_SUCCESS) return st;
  const CUresult st = cu_.cuModuleUnload(m->real);
  for (auto& [name, f] : m->functions) funcs_.erase(f);
  for (auto g : m->globals) ranges_.erase(g);
  modules_.erase(r.handle);
  return st;
}

namespace {
// Validates a name sent after a ReqModuleName.
bool read_name(std::span<const std::byte> tail, std::uint32_t len, std::string* out) {
  if (len == 0 || len > kNameMax || tail.size() != len) return false;
  out->assign(reinterpret_cast<const char*>(tail.data()), len);
  return out->find('\0') == std::string::npos;
}
}  // namespace

CUresult Worker::on_ModuleGetFunction(Call& c) {
  const auto r = c.req<ReqModuleName>();
  std::string name;
  if (!read_name(c.tail<ReqModuleName>(), r.name_len, &name)) return CUDA_ERROR_INVALID_VALUE;
  ModuleEntry* m = modules_.find(r.module);
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(m->ctx); st != CUDA_SUCCESS) return st;
  std::uint64_t h;
  if (auto it = m->functions.find(name); it != m->functions.end()) {
    h = it->second;
  } else {
    CUfunction f = nullptr;
    CUresult st = cu_.cuModuleGetFunction(&f, m->real, name.c_str());
    if (st != CUDA_SUCCESS) return st;
    FuncEntry e;
    e.real = f;
    e.module = r.module;
    // The guest packs kernel arguments by these offsets and sizes: CUDA's
    // void** kernelParams carries no sizes of its own.
    // The driver reads kernelParams[i] for every parameter the function
    // has, so the list must be complete: it ends where the driver says
    // "index out of range" (INVALID_VALUE) and nowhere else. A function with
    // more parameters than the protocol carries is refused.
    for (size_t i = 0;; ++i) {
      size_t off = 0, size = 0;
      st = cu_.cuFuncGetParamInfo(f, i, &off, &size);
      if (st == CUDA_ERROR_INVALID_VALUE) break;
      if (st != CUDA_SUCCESS) return st;
      if (i == kMaxParams) {
        IVLOG_WARN("guest %u: kernel %s has more than %u parameters; refused", cfg_.guest_id, name.c_str(),
                   kMaxParams);
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      if (off > kMaxParamBytes || size > kMaxParamBytes - off) return CUDA_ERROR_INVALID_IMAGE;
      e.params.push_back({static_cast<std::uint32_t>(off), static_cast<std::uint32_t>(size)});
      e.param_bytes = std::max(e.param_bytes, static_cast<std::uint32_t>(off + size));
    }
    h = funcs_.insert(std::move(e));
    m = modules_.find(r.module);
    m->functions.emplace(name, h);
  }
  const FuncEntry* f = funcs_.find(h);
  RepFunction rep{};
  rep.function = h;
  rep.param_count = static_cast<std::uint32_t>(f->params.size());
  rep.param_bytes = f->param_bytes;
  c.set_reply(rep);
  c.append(f->params.data(), f->params.size() * sizeof(ParamSlot));
  return CUDA_SUCCESS;
}

CUresult Worker::on_ModuleGetGlobal(Call& c) {
  const auto r = c.req<ReqModuleName>();
  std::string name;
  if (!read_name(c.tail<ReqModuleName>(), r.name_len, &name)) return CUDA_ERROR_INVALID_VALUE;
  ModuleEntry* m = modules_.find(r.module);
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(m->ctx); st != CUDA_SUCCESS) return st;
  CUdeviceptr d = 0;
  size_t bytes = 0;
  const CUresult st = cu_.cuModuleGetGlobal(&d, &bytes, m->real, name.c_str());
  if (st != CUDA_SUCCESS) return st;
  if (ranges_.find(d) == ranges_.end()) {
    ranges_[d] = DevRange{bytes, m->ctx, RangeKind::kGlobal};
    m->globals.push_back(d);
  }
  c.set_reply(RepRange{d, bytes});
  return CUDA_SUCCESS;
}

CUresult Worker::on_FuncGetAttribute(Call& c) {
  const auto r = c.req<ReqFuncAttr>();
  FuncEntry* f = funcs_.find(r.function);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(modules_.find(f->module)->ctx); st != CUDA_SUCCESS) return st;
  int v = 0;
  const CUresult st = cu_.cuFuncGetAttribute(&v, static_cast<CUfunction_attribute>(r.attrib), f->real);
  c.set_reply(RepValue{v});
  return st;
}

CUresult Worker::on_FuncSetAttribute(Call& c) {
  const auto r = c.req<ReqFuncAttr>();
  FuncEntry* f = funcs_.find(r.function);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(modules_.find(f->module)->ctx); st != CUDA_SUCCESS) return st;
  return cu_.cuFuncSetAttribute(f->real, static_cast<CUfunction_attribute>(r.attrib), r.value);
}

CUresult Worker::on_FuncSetCacheConfig(Call& c) {
  const auto r = c.req<ReqFuncCache>();
  FuncEntry* f = funcs_.find(r.function);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(modules_.find(f->module)->ctx); st != CUDA_SUCCESS) return st;
  return cu_.cuFuncSetCacheConfig(f->real, static_cast<CUfunc_cache>(r.config));
}

CUresult Worker::on_Launch(Call& c) { return launch(c, false); }

CUresult Worker::on_LaunchCooperative(Call& c) { return launch(c, true); }

CUresult Worker::launch(Call& c, bool cooperative) {
  return launch_with(c.req<ReqLaunch>(), c.tail<ReqLaunch>(), {}, cooperative);
}

CUresult Worker::on_LaunchEx(Call& c) {
  const auto r = c.req<ReqLaunchEx>();
  const auto tail = c.tail<ReqLaunchEx>();
  if (r.attr_count > kMaxLaunchAttrs || tail.size() < r.attr_count * sizeof(LaunchAttr))
    return CUDA_ERROR_INVALID_VALUE;
  CUlaunchAttribute attrs[kMaxLaunchAttrs] = {};
  for (std::uint32_t i = 0; i < r.attr_count; ++i) {
    LaunchAttr a;
    std::memcpy(&a, tail.data() + i * sizeof(LaunchAttr), sizeof a);
    CUlaunchAttribute& out = attrs[i];
    out.id = static_cast<CUlaunchAttributeID>(a.id);
    // Only attributes whose values are plain numbers: anything naming an
    // object (events, access-policy windows) would need translating.
    switch (a.id) {
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
        out.value.clusterDim.x = a.value[0];
        out.value.clusterDim.y = a.value[1];
        out.value.clusterDim.z = a.value[2];
        break;
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
        out.value.clusterSchedulingPolicyPreference = static_cast<CUclusterSchedulingPolicy>(a.value[0]);
        break;
      case CU_LAUNCH_ATTRIBUTE_COOPERATIVE: out.value.cooperative = static_cast<int>(a.value[0]); break;
      case CU_LAUNCH_ATTRIBUTE_PRIORITY: out.value.priority = static_cast<int>(a.value[0]); break;
      case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
        out.value.programmaticStreamSerializationAllowed = static_cast<int>(a.value[0]);
        break;
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
        out.value.memSyncDomain = static_cast<CUlaunchMemSyncDomain>(a.value[0]);
        break;
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
        out.value.memSyncDomainMap.default_ = static_cast<unsigned char>(a.value[0]);
        out.value.memSyncDomainMap.remote = static_cast<unsigned char>(a.value[1]);
        break;
      case CU_LAUNCH_ATTRIBUTE_IGNORE: break;
      default: return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
  return launch_with(r.launch, tail.subspan(r.attr_count * sizeof(LaunchAttr)),
                     std::span<const CUlaunchAttribute>(attrs, r.attr_count), false);
}

CUresult Worker::launch_with(const ReqLaunch& r, std::span<const std::byte> params,
                             std::span<const CUlaunchAttribute> attrs, bool cooperative) {
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  FuncEntry* f = funcs_.find(r.function);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (r.param_bytes != f->param_bytes || params.size() != f->param_bytes) return CUDA_ERROR_INVALID_VALUE;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  // Offsets were bounded by param_bytes when the function was looked up, and
  // the list holds every parameter the driver will read.
  constexpr std::size_t kOnStack = 64;
  void* on_stack[kOnStack];
  std::vector<void*> on_heap;
  void** argv = on_stack;
  if (f->params.size() > kOnStack) {
    on_heap.resize(f->params.size());
    argv = on_heap.data();
  }
  for (std::size_t i = 0; i < f->params.size(); ++i)
    argv[i] = const_cast<std::byte*>(params.data()) + f->params[i].offset;
  void** args = f->params.empty() ? nullptr : argv;
  if (!attrs.empty()) {
    CUlaunchConfig cfg{};
    cfg.gridDimX = r.grid[0];
    cfg.gridDimY = r.grid[1];
    cfg.gridDimZ = r.grid[2];
    cfg.blockDimX = r.block[0];
    cfg.blockDimY = r.block[1];
    cfg.blockDimZ = r.block[2];
    cfg.sharedMemBytes = r.shared_bytes;
    cfg.hStream = s;
    cfg.attrs = const_cast<CUlaunchAttribute*>(attrs.data());
    cfg.numAttrs = static_cast<unsigned>(attrs.size());
    return cu_.cuLaunchKernelEx(&cfg, f->real, args, nullptr);
  }
  if (cooperative)
    return cu_.cuLaunchCooperativeKernel(f->real, r.grid[0], r.grid[1], r.grid[2], r.block[0], r.block[1],
                                         r.block[2], r.shared_bytes, s, args);
  return cu_.cuLaunchKernel(f->real, r.grid[0], r.grid[1], r.grid[2], r.block[0], r.block[1], r.block[2],
                            r.shared_bytes, s, args, nullptr);
}

CUresult Worker::on_Occupancy(Call& c) {
  const auto r = c.req<ReqOccupancy>();
  FuncEntry* f = funcs_.find(r.function);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(modules_.find(f->module)->ctx); st != CUDA_SUCCESS) return st;
  RepValue rep{};
  CUresult st;
  if (r.kind == kOccMaxActiveBlocks) {
    int n = 0;
    st = cu_.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&n, f->real, r.block_size, r.dynamic_smem, r.flags);
    rep.value = n;
  } else if (r.kind == kOccAvailableDynamicSmem) {
    size_t bytes = 0;
    st = cu_.cuOccupancyAvailableDynamicSMemPerBlock(&bytes, f->real, r.num_blocks, r.block_size);
    rep.value = static_cast<std::int64_t>(bytes);
  } else if (r.kind == kOccMaxPotentialBlockSize) {
    // The guest runs a per-block-size shared-memory callback itself; without
    // one the driver's own search answers.
    int grid = 0, block = 0;
    st = cu_.cuOccupancyMaxPotentialBlockSizeWithFlags(&grid, &block, f->real, nullptr, r.dynamic_smem,
                                                       r.block_size, r.flags);
    rep.value = static_cast<std::int64_t>((static_cast<std::uint64_t>(static_cast<std::uint32_t>(grid)) << 32) |
                                          static_cast<std::uint32_t>(block));
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  c.set_reply(rep);
  return st;
}

CUresult Worker::on_CtxGetLimit(Call& c) {
  const auto r = c.req<ReqLimit>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  size_t v = 0;
  const CUresult st = cu_.cuCtxGetLimit(&v, static_cast<CUlimit>(r.limit));
  c.set_reply(RepValue{static_cast<std::int64_t>(v)});
  return st;
}

CUresult Worker::on_CtxSetLimit(Call& c) {
  const auto r = c.req<ReqLimit>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  return cu_.cuCtxSetLimit(static_cast<CUlimit>(r.limit), r.value);
}

// ------------------------------------------------------------------ streams

CUresult Worker::on_StreamCreate(Call& c) {
  const auto r = c.req<ReqStreamCreate>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s = nullptr;
  const CUresult st = cu_.cuStreamCreateWithPriority(&s, r.flags, r.priority);
  if (st != CUDA_SUCCESS) return st;
  c.set_reply(RepHandle{streams_.insert(StreamEntry{s, r.ctx})});
  return CUDA_SUCCESS;
}

CUresult Worker::on_StreamDestroy(Call& c) {
  return destroy_in_ctx(streams_, c.req<ReqHandle>().handle, [&](StreamEntry& s) { return cu_.cuStreamDestroy(s.real); });
}

CUresult Worker::on_StreamQuery(Call& c) {
  const auto r = c.req<ReqHandle>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.handle, &s); st != CUDA_SUCCESS) return st;
  return cu_.cuStreamQuery(s);
}

CUresult Worker::on_StreamSynchronize(Call& c) {
  const auto r = c.req<ReqHandle>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.handle, &s); st != CUDA_SUCCESS) return st;
  if (streams_.find(r.handle) == nullptr) return cu_.cuStreamSynchronize(s);  // special streams
  // A capturing stream cannot be waited for: the driver's own answer (and
  // its invalidation of the capture) is the one CUDA gives.
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  if (cu_.cuStreamIsCapturing(s, &cs) == CUDA_SUCCESS && cs != CU_STREAM_CAPTURE_STATUS_NONE)
    return cu_.cuStreamSynchronize(s);
  const CUresult st = cu_.cuStreamQuery(s);
  // Done: the synchronise itself returns at once, and unlike a query it
  // makes the driver write out pending device printf output.
  if (st == CUDA_SUCCESS) return cu_.cuStreamSynchronize(s);
  if (st != CUDA_ERROR_NOT_READY) return st;
  // Not done: park the call so that this guest's other channels keep moving.
  return park(c, Op::kStreamSynchronize, r.handle);
}

CUresult Worker::on_StreamWaitEvent(Call& c) {
  const auto r = c.req<ReqStreamWaitEvent>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  EventEntry* e = events_.find(r.event);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return cu_.cuStreamWaitEvent(s, e->real, r.flags);
}

CUresult Worker::on_StreamGetPriority(Call& c) {
  const auto r = c.req<ReqHandle>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.handle, &s); st != CUDA_SUCCESS) return st;
  int p = 0;
  const CUresult st = cu_.cuStreamGetPriority(s, &p);
  c.set_reply(RepValue{p});
  return st;
}

// ------------------------------------------------------------------ events

CUresult Worker::on_EventCreate(Call& c) {
  const auto r = c.req<ReqEventCreate>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUevent e = nullptr;
  const CUresult st = cu_.cuEventCreate(&e, r.flags);
  if (st != CUDA_SUCCESS) return st;
  c.set_reply(RepHandle{events_.insert(EventEntry{e, r.ctx})});
  return CUDA_SUCCESS;
}

CUresult Worker::on_EventRecord(Call& c) {
  const auto r = c.req<ReqEventRecord>();
  return record_event(r.ctx, r.event, r.stream, CU_EVENT_RECORD_DEFAULT);
}

CUresult Worker::on_EventRecordFlags(Call& c) {
  const auto r = c.req<ReqEventRecordFlags>();
  return record_event(r.ctx, r.event, r.stream, r.flags);
}

CUresult Worker::record_event(std::uint64_t ctx, std::uint64_t event, std::uint64_t stream, unsigned flags) {
  if (CUresult st = use_ctx(ctx); st != CUDA_SUCCESS) return st;
  EventEntry* e = events_.find(event);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUstream s;
  if (CUresult st = resolve_stream(ctx, stream, &s); st != CUDA_SUCCESS) return st;
  // The flags are plain values; the driver judges them (EXTERNAL only while
  // the stream captures).
  return flags == CU_EVENT_RECORD_DEFAULT ? cu_.cuEventRecord(e->real, s) : cu_.cuEventRecordWithFlags(e->real, s, flags);
}

CUresult Worker::on_EventQuery(Call& c) {
  const auto r = c.req<ReqHandle>();
  EventEntry* e = events_.find(r.handle);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(e->ctx); st != CUDA_SUCCESS) return st;
  return cu_.cuEventQuery(e->real);
}

CUresult Worker::on_EventSynchronize(Call& c) {
  const auto r = c.req<ReqHandle>();
  EventEntry* e = events_.find(r.handle);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(e->ctx); st != CUDA_SUCCESS) return st;
  const CUresult st = cu_.cuEventQuery(e->real);
  if (st == CUDA_SUCCESS) return cu_.cuEventSynchronize(e->real);  // flushes device printf, as above
  if (st != CUDA_ERROR_NOT_READY) return st;
  return park(c, Op::kEventSynchronize, r.handle);
}

CUresult Worker::on_EventElapsedTime(Call& c) {
  const auto r = c.req<ReqEventElapsed>();
  EventEntry* a = events_.find(r.start);
  EventEntry* b = events_.find(r.end);
  if (a == nullptr || b == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(a->ctx); st != CUDA_SUCCESS) return st;
  float ms = 0;
  const CUresult st = cu_.cuEventElapsedTime(&ms, a->real, b->real);
  c.set_reply(RepElapsed{ms, 0});
  return st;
}

CUresult Worker::on_EventDestroy(Call& c) {
  return destroy_in_ctx(events_, c.req<ReqHandle>().handle, [&](EventEntry& e) { return cu_.cuEventDestroy(e.real); });
}

// ------------------------------------------------------------------ memory pools

std::uint64_t Worker::pool_handle(CUmemoryPool real, int device) {
  std::uint64_t found = 0;
  pools_.for_each([&](std::uint64_t h, PoolEntry& p) {
    if (p.real == real) found = h;
  });
  return found != 0 ? found : pools_.insert(PoolEntry{real, device});
}

CUresult Worker::on_MemPool(Call& c) {
  const auto r = c.req<ReqMemPool>();
  if (r.ctx != 0)
    if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  RepValue rep{};
  CUresult st = CUDA_SUCCESS;
  switch (r.kind) {
    case kPoolGetDefault:
    case kPoolGetCurrent: {
      if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
      const CUdevice d = devices_[dev_index(r.device)];
      CUmemoryPool p = nullptr;
      st = r.kind == kPoolGetDefault ? cu_.cuDeviceGetDefaultMemPool(&p, d) : cu_.cuDeviceGetMemPool(&p, d);
      if (st != CUDA_SUCCESS) return st;
      rep.value = static_cast<std::int64_t>(pool_handle(p, r.device));
      break;
    }
    case kPoolSetCurrent: {
      if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
      PoolEntry* p = pools_.find(r.pool);
      if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
      st = cu_.cuDeviceSetMemPool(devices_[dev_index(r.device)], p->real);
      break;
    }
    case kPoolSetAttr:
    case kPoolGetAttr: {
      PoolEntry* p = pools_.find(r.pool);
      if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
      const auto attr = static_cast<CUmemPool_attribute>(r.attr);
      // The value's type depends on the attribute: the first three are ints.
      const bool is_int = attr == CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES ||
                          attr == CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC ||
                          attr == CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
      const bool is_u64 = attr >= CU_MEMPOOL_ATTR_RELEASE_THRESHOLD && attr <= CU_MEMPOOL_ATTR_USED_MEM_HIGH;
      if (!is_int && !is_u64) return CUDA_ERROR_INVALID_VALUE;
      int iv = static_cast<int>(r.value);
      cuuint64_t uv = r.value;
      void* v = is_int ? static_cast<void*>(&iv) : static_cast<void*>(&uv);
      if (r.kind == kPoolSetAttr) {
        st = cu_.cuMemPoolSetAttribute(p->real, attr, v);
      } else {
        st = cu_.cuMemPoolGetAttribute(p->real, attr, v);
        rep.value = is_int ? iv : static_cast<std::int64_t>(uv);
      }
      break;
    }
    case kPoolTrim: {
      PoolEntry* p = pools_.find(r.pool);
      if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
      st = cu_.cuMemPoolTrimTo(p->real, r.value);
      break;
    }
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  c.set_reply(rep);
  return st;
}

CUresult Worker::on_MemAllocAsync(Call& c) {
  const auto r = c.req<ReqMemAllocAsync>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  if (r.bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  CUdeviceptr d = 0;
  CUresult st;
  if (r.pool != 0) {
    PoolEntry* p = pools_.find(r.pool);
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    st = cu_.cuMemAllocFromPoolAsync(&d, r.bytes, p->real, s);
  } else {
    st = cu_.cuMemAllocAsync(&d, r.bytes, s);
  }
  if (st != CUDA_SUCCESS) return st;
  // The guest's memory like any allocation: device-pointer checks accept it,
  // cuMemFree may free it and it is freed when the guest goes away.
  ranges_[d] = DevRange{r.bytes, r.ctx, RangeKind::kAlloc};
  c.set_reply(RepMemAlloc{d, 0});
  return CUDA_SUCCESS;
}

CUresult Worker::on_MemFreeAsync(Call& c) {
  const auto r = c.req<ReqFreeAsync>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  auto it = ranges_.find(r.dptr);
  if (it == ranges_.end() || it->second.kind != RangeKind::kAlloc) return CUDA_ERROR_INVALID_VALUE;
  const CUresult st = cu_.cuMemFreeAsync(r.dptr, s);
  // Work queued before the free may still use the memory; nothing the guest
  // sends from now on may.
  if (st == CUDA_SUCCESS) ranges_.erase(it);
  return st;
}

// ------------------------------------------------------------------ module enumeration

CUresult Worker::on_ModuleEnumerate(Call& c) {
  const auto r = c.req<ReqHandle>();
  ModuleEntry* m = modules_.find(r.handle);
  if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(m->ctx); st != CUDA_SUCCESS) return st;
  unsigned n = 0;
  CUresult st = cu_.cuModuleGetFunctionCount(&n, m->real);
  if (st != CUDA_SUCCESS) return st;
  std::vector<CUfunction> fs(n);
  if (n != 0 && (st = cu_.cuModuleEnumerateFunctions(fs.data(), n, m->real)) != CUDA_SUCCESS) return st;
  // Names, not handles: the guest looks each one up by name, which also
  // teaches it the function's parameter layout.
  c.set_reply(RepValue{n});
  const std::size_t room = c.ch.cpl.max_payload();
  for (CUfunction f : fs) {
    const char* name = nullptr;
    if ((st = cu_.cuFuncGetName(&name, f)) != CUDA_SUCCESS) return st;
    const std::size_t len = name != nullptr ? std::strlen(name) : 0;
    if (len == 0 || len > kNameMax) return CUDA_ERROR_NOT_SUPPORTED;
    if (c.out.size() + sizeof(std::uint32_t) + len > room) {
      IVLOG_WARN("guest %u: module has too many kernel names for one reply", cfg_.guest_id);
      return CUDA_ERROR_NOT_SUPPORTED;
    }
    const auto len32 = static_cast<std::uint32_t>(len);
    c.append(&len32, sizeof len32);
    c.append(name, len);
  }
  return CUDA_SUCCESS;
}

// ------------------------------------------------------------------ occupancy and tensor maps

CUresult Worker::on_OccupancyCluster(Call& c) {
  const auto r = c.req<ReqOccCluster>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  FuncEntry* f = funcs_.find(r.function);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  CUlaunchAttribute attrs[2]{};
  CUlaunchConfig cfg{};
  cfg.gridDimX = r.grid[0];
  cfg.gridDimY = r.grid[1];
  cfg.gridDimZ = r.grid[2];
  cfg.blockDimX = r.block[0];
  cfg.blockDimY = r.block[1];
  cfg.blockDimZ = r.block[2];
  cfg.sharedMemBytes = r.shared_bytes;
  cfg.hStream = s;
  cfg.attrs = attrs;
  if (r.cluster[0] != 0 || r.cluster[1] != 0 || r.cluster[2] != 0) {
    attrs[cfg.numAttrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[cfg.numAttrs].value.clusterDim.x = r.cluster[0];
    attrs[cfg.numAttrs].value.clusterDim.y = r.cluster[1];
    attrs[cfg.numAttrs].value.clusterDim.z = r.cluster[2];
    ++cfg.numAttrs;
  }
  if (r.policy != 0) {
    attrs[cfg.numAttrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    attrs[cfg.numAttrs].value.clusterSchedulingPolicyPreference = static_cast<CUclusterSchedulingPolicy>(r.policy);
    ++cfg.numAttrs;
  }
  int n = 0;
  const CUresult st = cu_.cuOccupancyMaxActiveClusters(&n, f->real, &cfg);
  c.set_reply(RepValue{n});
  return st;
}

CUresult Worker::on_TensorMapEncodeTiled(Call& c) {
  const auto r = c.req<ReqTensorMap>();
  if (r.ctx != 0)
    if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  // The descriptor is plain data the guest gets back: the driver validates
  // the layout; only the array bounds are ours to check.
  if (r.rank == 0 || r.rank > kTensorMaxRank) return CUDA_ERROR_INVALID_VALUE;
  CUtensorMap map{};
  const CUresult st = cu_.cuTensorMapEncodeTiled(
      &map, static_cast<CUtensorMapDataType>(r.data_type), r.rank, reinterpret_cast<void*>(r.global_address),
      r.global_dim, r.global_strides, r.box_dim, r.element_strides, static_cast<CUtensorMapInterleave>(r.interleave),
      static_cast<CUtensorMapSwizzle>(r.swizzle), static_cast<CUtensorMapL2promotion>(r.l2_promotion),
      static_cast<CUtensorMapFloatOOBfill>(r.oob_fill));
  if (st != CUDA_SUCCESS) return st;
  RepTensorMap rep{};
  static_assert(sizeof map == sizeof rep);
  std::memcpy(&rep, &map, sizeof rep);
  c.set_reply(rep);
  return CUDA_SUCCESS;
}

// -------------------------------------------------------------------- peers
// Guest ordinals map to the GPUs this guest was granted; a peer is only ever
// another of those.

CUresult Worker::on_PeerQuery(Call& c) {
  const auto r = c.req<ReqPeerQuery>();
  if (!valid_device(r.device) || !valid_device(r.peer)) return CUDA_ERROR_INVALID_DEVICE;
  const CUdevice a = devices_[dev_index(r.device)];
  const CUdevice b = devices_[dev_index(r.peer)];
  int v = 0;
  const CUresult st =
      r.attrib == 0 ? cu_.cuDeviceCanAccessPeer(&v, a, b)
                    : cu_.cuDeviceGetP2PAttribute(&v, static_cast<CUdevice_P2PAttribute>(r.attrib - 1), a, b);
  if (st != CUDA_SUCCESS) return st;
  c.set_reply(RepValue{v});
  return CUDA_SUCCESS;
}

CUresult Worker::on_PeerAccess(Call& c) {
  const auto r = c.req<ReqPeerAccess>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  const CtxEntry* peer = ctxs_.find(r.peer_ctx);
  if (peer == nullptr || peer->real == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  return r.enable != 0 ? cu_.cuCtxEnablePeerAccess(peer->real, r.flags) : cu_.cuCtxDisablePeerAccess(peer->real);
}

CUresult Worker::on_MemcpyPeer(Call& c) {
  const auto r = c.req<ReqCopyPeer>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  // A null context is the driver's to judge (with unified addressing it
  // accepts one); any other must be this guest's.
  CUcontext real[2] = {nullptr, nullptr};
  const std::uint64_t named[2] = {r.dst_ctx, r.src_ctx};
  for (int i = 0; i < 2; ++i) {
    if (named[i] == 0) continue;
    const CtxEntry* e = ctxs_.find(named[i]);
    if (e == nullptr || e->real == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    real[i] = e->real;
  }
  if (r.bytes == 0) return CUDA_SUCCESS;
  if (!owns_device(r.src, r.bytes) || !owns_device(r.dst, r.bytes)) return CUDA_ERROR_INVALID_VALUE;
  if ((r.flags & kAsync) != 0) {
    CUstream s;
    if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
    return cu_.cuMemcpyPeerAsync(r.dst, real[0], r.src, real[1], r.bytes, s);
  }
  return cu_.cuMemcpyPeer(r.dst, real[0], r.src, real[1], r.bytes);
}


// ------------------------------------------------------------ host functions

// cuLaunchHostFunc / cuStreamAddCallback (docs/design.md, "Host functions").
// The guest's function runs in the guest; the stream only has to tell it when
// the earlier work is done and hold later work until it returns. Two stream
// memory operations on arena words do both on the GPU: no host thread waits.
CUresult Worker::on_HostFunc(Call& c) {
  const auto r = c.req<ReqHostFunc>();
  constexpr std::uint64_t kWord = sizeof(std::uint32_t);
  // Both words must be aligned and inside this guest's own arena alias: the
  // GPU would otherwise store to, or spin on, memory the guest does not own.
  const auto in_arena = [&](std::uint64_t d) {
    return arena_dev_ != 0 && d % kWord == 0 && ring::span_within(d, kWord, arena_dev_, l_.arena_size);
  };
  if (!in_arena(r.reached) || !in_arena(r.done) || r.seq == 0 || r.seq >= kHostFuncFailed)
    return CUDA_ERROR_INVALID_VALUE;
  // From here on the guest's dispatcher watches `reached`: tell it when the
  // pair never gets enqueued, else it would keep the call pending for ever.
  // (arena_range() holds: in_arena() checked the same span.)
  const auto fail = [&](CUresult st) {
    auto* w = reinterpret_cast<std::uint32_t*>(arena_ptr(l_.arena_off + (r.reached - arena_dev_)));
    ring::store_release(*w, r.seq | kHostFuncFailed);  // pairs with load_acquire in guest/hostfunc.cc
    return st;
  };
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return fail(st);
  CUstream s;
  if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return fail(st);
  // A captured pair would be replayed with a stale seq: the guest's function
  // would run once and later replays would not wait for it.
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  if (CUresult st = cu_.cuStreamIsCapturing(s, &cs); st != CUDA_SUCCESS) return fail(st);
  if (cs != CU_STREAM_CAPTURE_STATUS_NONE) return fail(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  if (CUresult st = cu_.cuStreamWriteValue32(s, r.reached, r.seq, 0); st != CUDA_SUCCESS) return fail(st);
  // The write is queued: the guest will run the function once the stream gets
  // there, so a failing wait only loses the ordering of later work.
  return cu_.cuStreamWaitValue32(s, r.done, r.seq, CU_STREAM_WAIT_VALUE_GEQ);
}

}  // namespace ivcuda::host
