// Stream-ordered memory and memory pools: the devices' default pools, pools
// the guest creates (cuMemPoolCreate), their attributes and access, the
// allocations made from them (cuMemAllocAsync, cuMemAllocFromPoolAsync,
// cuMemFreeAsync), and pools and their pointers shared between the processes
// of a tenant. The guest side is guest/pools.cc.
//
// A pool is a handle of this worker's table: the driver's pool pointers never
// reach the guest, and a handle of another guest (or a destroyed pool) finds
// nothing here. Whatever the driver itself would judge (attribute values,
// access flags, a pool of the wrong device, destroying a default pool) is left
// to the driver, so that the guest hears the driver's own answer. Pools of
// host memory (location HOST, HOST_NUMA) and managed pools are refused with
// CUDA_ERROR_NOT_SUPPORTED: their memory would be the worker's host memory,
// which the guest's CPU cannot reach.
// Allocations from any pool are device memory the guest owns (ranges_) until
// freed, also after their pool is destroyed (the driver keeps them alive).
//
// Sharing (docs/design.md, "Memory pools"). A pool exported as a POSIX fd
// travels as VMM exports do: the driver's fd stays here (and with the
// daemon's broker), the guest gets a token. An exported pointer's 64 bytes of
// CUmemPoolPtrExportData stay in the tenant's registry (ShareKind::kPoolPtr),
// the guest gets a ticket, as for IPC handles. Who exported decides how an
// import is served:
//  - another worker (process mode): the driver imports the pool from the
//    broker's fd and the pointer from the registry's bytes; an imported
//    pointer is device memory the guest owns (RangeKind::kPoolImport) until
//    its importer frees it;
//  - this worker, the exporting guest process itself: the driver is asked,
//    and answers what it answers natively for an import in the exporting
//    process;
//  - this worker, another guest process (a VM, one driver process for all):
//    the pool import is an alias of the exported pool and a pointer import
//    is the allocation itself, counted per importing process; an owner's
//    free waits for the last importer's (RangeKind::kFreed), as IPC does.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "host-daemon/shared/log.h"
#include "host-daemon/shared/rules.h"
#include "host-daemon/worker/worker_internal.h"
#include "ring/validate.h"

namespace ivcuda::host {

using namespace ivcuda::proto;

namespace {
constexpr std::uint32_t kPoolPtrMagic = 0x50435649u;  // "IVCP"
constexpr auto kFd = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}  // namespace

std::uint64_t Worker::pool_handle(CUmemoryPool real, int device) {
  std::uint64_t found = 0;
  pools_.for_each([&](std::uint64_t h, PoolEntry& p) {
    if (p.real == real && !p.alias) found = h;
  });
  return found != 0 ? found : pools_.insert(PoolEntry{real, device});
}

// A guest location in the driver's numbering. A device the guest may not use
// becomes an ordinal the driver has no device for, so that the driver answers
// a bad ordinal as it answers one on bare metal.
CUresult Worker::pool_location(std::uint32_t type, std::int32_t id, CUmemLocation* out) {
  if (!wire_enum(type, &out->type)) return CUDA_ERROR_INVALID_VALUE;
  out->id = id;
  if (type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_SUCCESS;
  if (valid_device(id)) {
    out->id = static_cast<int>(devices_[dev_index(id)]);
    return CUDA_SUCCESS;
  }
  int count = 0;
  if (CUresult st = cu_.cuDeviceGetCount(&count); st != CUDA_SUCCESS) return st;
  out->id = count;
  return CUDA_SUCCESS;
}

void Worker::destroy_created_pools() noexcept {
  pools_.for_each([&](std::uint64_t, PoolEntry& p) {
    if ((p.created || p.imported) && !p.alias && p.real != nullptr) (void)cu_.cuMemPoolDestroy(p.real);
    p.real = nullptr;
  });
  pool_names_.clear();
  pool_reserves_.clear();
}

// ------------------------------------------------------------------ reserves
//
// A pool keeps memory it got from the driver after the allocations in it are
// freed: up to its release threshold across synchronisations, and all of it
// until the next one. Natively that memory is used device memory (cuMemGetInfo
// does not count it free). Here it stays charged to the guest's quota, as
// RESERVED_MEM_CURRENT - USED_MEM_CURRENT of the pool (the driver's own
// figures), so that neither a high threshold nor frees without a
// synchronisation, times the pools a guest may create, hold memory the quota
// does not see (issue 28). A freed allocation's charge moves to its pool's
// reserve at once, and comes back to the quota when the driver says the pool
// gave the memory back. Before a charge is refused, the pools' unused memory
// is given back (cuMemPoolTrimTo), which costs the guest only the time to get
// it again.

void Worker::settle_pool(CUmemoryPool pool, bool may_shrink) {
  if (pool == nullptr || !IVCUDA_RULE("pool-reserve-charged")) return;
  const auto held = [&](std::uint64_t* out) {
    cuuint64_t reserved = 0, used = 0;
    if (cu_.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != CUDA_SUCCESS ||
        cu_.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) != CUDA_SUCCESS)
      return false;
    *out = reserved > used ? reserved - used : 0;
    return true;
  };
  std::uint64_t want = 0;
  if (!held(&want)) return;
  Charge& ch = pool_reserves_[pool];
  if (!ch) ch = quota_.take(0);
  if (want > ch.bytes() && !ch.grow(want - ch.bytes())) {
    // More than the quota covers: the pool keeps only what it must (memory
    // a pending free or a running kernel still uses), and that is charged
    // past the limit, so that the guest's next charges are refused.
    (void)cu_.cuMemPoolTrimTo(pool, 0);
    if (!held(&want)) want = ch.bytes();
    if (want > ch.bytes()) (void)ch.hold(want - ch.bytes());
  }
  if (may_shrink && want < ch.bytes()) ch.shrink(ch.bytes() - want);
}

// A stream-ordered allocation was just freed (cuMemFreeAsync or cuMemFree):
// its memory is its pool's now.
void Worker::pool_freed(DevRange& r) {
  if (r.from_pool == nullptr || !IVCUDA_RULE("pool-reserve-charged")) return;
  auto it = pool_reserves_.find(r.from_pool);
  if (it == pool_reserves_.end()) return;  // a pool that is gone took it along
  it->second.absorb(std::move(r.charge));
  settle_pool(r.from_pool, false);
}

// Every pool the guest allocated from: after a context's end freed its
// allocations into them (may_shrink false), or for the guest's view.
void Worker::settle_pools(bool may_shrink) {
  for (auto& [pool, ch] : pool_reserves_) settle_pool(pool, may_shrink);
}

// Before a charge is refused: every pool gives back what it keeps unused.
bool Worker::reclaim_pool_reserves() {
  bool freed = false;
  for (auto& [pool, ch] : pool_reserves_) {
    if (ch.bytes() == 0) continue;
    const std::uint64_t before = ch.bytes();
    (void)cu_.cuMemPoolTrimTo(pool, 0);
    settle_pool(pool, true);
    freed |= ch.bytes() < before;
  }
  return freed;
}

// A destroyed pool's memory goes with its last allocation; nothing of it is
// queried again (the driver's handle is gone).
void Worker::drop_pool_reserve(CUmemoryPool pool) {
  pool_reserves_.erase(pool);
  for (auto& [addr, r] : ranges_)
    if (r.from_pool == pool) r.from_pool = nullptr;
}

CUresult Worker::destroy_pool(std::uint64_t handle) {
  PoolEntry* p = pools_.find(handle);
  const CUmemoryPool real = p->real;
  auto names = pool_names_.find(real);
  if (names == pool_names_.end()) {  // a default pool: the driver refuses it itself
    const CUresult st = cu_.cuMemPoolDestroy(real);
    if (st == CUDA_SUCCESS) pools_.erase(handle);
    return st;
  }
  if (names->second > 1) {
    // Another handle of this worker still names the pool (an alias a sibling
    // process imported, or the pool it aliases): only this handle goes. The
    // device stops allocating from it, as from a destroyed pool.
    if (p->created && valid_device(p->device)) {
      const CUdevice d = devices_[dev_index(p->device)];
      CUmemoryPool cur = nullptr, def = nullptr;
      if (cu_.cuDeviceGetMemPool(&cur, d) == CUDA_SUCCESS && cur == real &&
          cu_.cuDeviceGetDefaultMemPool(&def, d) == CUDA_SUCCESS)
        (void)cu_.cuDeviceSetMemPool(d, def);
    }
    --names->second;
    pools_.erase(handle);
    return CUDA_SUCCESS;
  }
  const CUresult st = cu_.cuMemPoolDestroy(real);
  if (st != CUDA_SUCCESS) return st;
  pool_names_.erase(names);
  pools_.erase(handle);
  pool_forget(real);
  drop_pool_reserve(real);
  return CUDA_SUCCESS;
}

void Worker::pool_forget(CUmemoryPool real) {
  for (auto it = pool_ptr_exports_.begin(); it != pool_ptr_exports_.end();) {
    if (it->second != real) {
      ++it;
      continue;
    }
    share_withdraw(ShareKind::kPoolPtr, it->first);
    it = pool_ptr_exports_.erase(it);
  }
  // An fd already exported stays the driver's to judge; no alias can follow.
  for (auto& [token, e] : exports_)
    if (e.pool == real) e.pool = nullptr;
}

CUresult Worker::on_MemPoolCreate(Call& c) {
  const auto r = c.req<ReqMemPoolCreate>();
  // The driver wants both zero; the guest's pointer means nothing here.
  if (r.win32_attrs != 0 || r.reserved_set != 0) return CUDA_ERROR_INVALID_VALUE;
  if (r.alloc_type == CU_MEM_ALLOCATION_TYPE_MANAGED || r.loc_type == CU_MEM_LOCATION_TYPE_HOST ||
      r.loc_type == CU_MEM_LOCATION_TYPE_HOST_NUMA) {
    if (errors_logged_++ < 100)
      IVLOG_INFO("guest %u: memory pools of host or managed memory are not supported", cfg_.guest_id);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  CUmemPoolProps props{};
  if (!wire_enum(r.alloc_type, &props.allocType) || !wire_enum(r.handle_types, &props.handleTypes))
    return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = pool_location(r.loc_type, r.loc_id, &props.location); st != CUDA_SUCCESS) return st;
  props.maxSize = r.max_size;
  props.usage = r.usage;
  if (full(pools_, cfg_.limits.pools, "memory pool")) return CUDA_ERROR_OUT_OF_MEMORY;
  CUmemoryPool real = nullptr;
  const CUresult st = cu_.cuMemPoolCreate(&real, &props);
  if (st != CUDA_SUCCESS) return st;
  PoolEntry e{real, r.loc_id};
  e.created = true;
  e.handle_types = r.handle_types;
  c.set_reply(RepHandle{pools_.insert(e)});
  ++pool_names_[real];
  return CUDA_SUCCESS;
}

CUresult Worker::on_MemPoolSetAccess(Call& c) {
  const auto r = c.req<ReqMemPoolSetAccess>();
  const auto tail = c.tail<ReqMemPoolSetAccess>();
  if (r.count > kMaxDevices || tail.size() != r.count * sizeof(MemAccess)) return CUDA_ERROR_INVALID_VALUE;
  PoolEntry* p = pools_.find(r.pool);
  if (p == nullptr || p->real == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUmemAccessDesc desc[kMaxDevices] = {};
  for (std::uint32_t i = 0; i < r.count; ++i) {
    MemAccess a;
    std::memcpy(&a, tail.data() + i * sizeof a, sizeof a);
    if (CUresult st = pool_location(a.loc_type, a.loc_id, &desc[i].location); st != CUDA_SUCCESS) return st;
    if (!wire_enum(a.flags, &desc[i].flags)) return CUDA_ERROR_INVALID_VALUE;
  }
  return cu_.cuMemPoolSetAccess(p->real, r.count != 0 ? desc : nullptr, r.count);
}

CUresult Worker::on_MemPool(Call& c) {
  const auto r = c.req<ReqMemPool>();
  if (r.ctx != 0)
    if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  RepValue rep{};
  CUresult st = CUDA_SUCCESS;
  // Every kind but the device queries names a pool (the device is checked
  // first where there is one).
  if (r.kind == kPoolSetCurrent && !valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
  PoolEntry* p = nullptr;
  if (r.kind != kPoolGetDefault && r.kind != kPoolGetCurrent) {
    p = pools_.find(r.pool);
    if (p == nullptr || p->real == nullptr) return CUDA_ERROR_INVALID_VALUE;
  }
  switch (r.kind) {
    case kPoolGetDefault:
    case kPoolGetCurrent: {
      if (!valid_device(r.device)) return CUDA_ERROR_INVALID_DEVICE;
      const CUdevice d = devices_[dev_index(r.device)];
      CUmemoryPool got = nullptr;
      st = r.kind == kPoolGetDefault ? cu_.cuDeviceGetDefaultMemPool(&got, d) : cu_.cuDeviceGetMemPool(&got, d);
      if (st != CUDA_SUCCESS) return st;
      rep.value = static_cast<std::int64_t>(pool_handle(got, r.device));
      break;
    }
    case kPoolSetCurrent:
      // An alias names this worker's own pool, which the driver would take;
      // an imported pool it refuses, and so is this one.
      if (p->alias) return CUDA_ERROR_INVALID_VALUE;
      st = cu_.cuDeviceSetMemPool(devices_[dev_index(r.device)], p->real);
      break;
    case kPoolSetAttr:
    case kPoolGetAttr: {
      CUmemPool_attribute attr;
      if (!wire_enum(r.attr, &attr)) return CUDA_ERROR_INVALID_VALUE;
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
        // A threshold keeps freed memory across synchronisations.
        if (st == CUDA_SUCCESS && attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD && pool_reserves_.contains(p->real))
          settle_pool(p->real, true);
      } else {
        st = cu_.cuMemPoolGetAttribute(p->real, attr, v);
        rep.value = is_int ? iv : static_cast<std::int64_t>(uv);
      }
      break;
    }
    case kPoolTrim:
      st = cu_.cuMemPoolTrimTo(p->real, r.value);
      if (st == CUDA_SUCCESS && pool_reserves_.contains(p->real)) settle_pool(p->real, true);
      break;
    case kPoolDestroy:
      // The driver refuses a default pool itself. Allocations still out stay
      // valid (and the guest's) until freed; the handle dies now.
      st = destroy_pool(r.pool);
      break;
    case kPoolGetAccess: {
      CUmemLocation loc{};
      if ((st = pool_location(static_cast<std::uint32_t>(r.attr), r.device, &loc)) != CUDA_SUCCESS) return st;
      CUmemAccess_flags flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
      st = cu_.cuMemPoolGetAccess(&flags, p->real, &loc);
      rep.value = static_cast<std::int64_t>(flags);
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
  Charge charge = quota_.take(r.bytes);
  if (!charge) return CUDA_ERROR_OUT_OF_MEMORY;
  CUmemoryPool from = nullptr;
  if (r.pool != 0) {
    PoolEntry* p = pools_.find(r.pool);
    // An imported pool hands out nothing: the driver refuses one, and an
    // alias (whose driver pool is this worker's own) is refused alike.
    if (p == nullptr || p->real == nullptr || p->alias) return CUDA_ERROR_INVALID_VALUE;
    st = cu_.cuMemAllocFromPoolAsync(&d, r.bytes, p->real, s);
    from = p->real;
  } else {
    st = cu_.cuMemAllocAsync(&d, r.bytes, s);
    if (st == CUDA_SUCCESS &&
        cu_.cuPointerGetAttribute(&from, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, d) != CUDA_SUCCESS)
      from = nullptr;
  }
  if (st != CUDA_SUCCESS) return st;
  // The guest's memory like any allocation: device-pointer checks accept it,
  // cuMemFree may free it and it is freed when the guest goes away.
  DevRange& range = ranges_[d] = DevRange{r.bytes, r.ctx, RangeKind::kAlloc, r.pool, std::move(charge)};
  range.from_pool = from;
  settle_pool(from, true);  // what the pool got beyond it (or reused of its reserve)
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
  // Both hooks withdraw what was exported; either may keep it for a sibling
  // process (freed at the last IPC close or pool-import free). Both run.
  const bool ipc_done = ipc_on_free(r.dptr);
  const bool pool_done = pool_on_free(r.dptr, it->second.size);
  if (!ipc_done || !pool_done) return CUDA_SUCCESS;
  const CUresult st = cu_.cuMemFreeAsync(r.dptr, s);
  // Work queued before the free may still use the memory; nothing the guest
  // sends from now on may.
  if (st == CUDA_SUCCESS) {
    pool_freed(it->second);
    ranges_.erase(it);
  }
  return st;
}

// ------------------------------------------------------------------ sharing

// A pool made with the fd handle type exports as a token the guest wraps in
// a sealed memfd (guest/vmm.cc); other handle types get the driver's verdict,
// and NOT_SUPPORTED where it would hand out what no guest can hold.
CUresult Worker::on_MemPoolExport(Call& c) {
  const auto r = c.req<ReqPoolExport>();
  PoolEntry* p = pools_.find(r.pool);
  if (p == nullptr || p->real == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // An alias names this worker's own pool, which the driver would export
  // again; an imported pool is not for export (what the driver says to a
  // pool it imported itself is its own answer).
  if (p->alias) return CUDA_ERROR_INVALID_VALUE;
  if (r.handle_type != kFd) {
    alignas(8) unsigned char scratch[64] = {};
    CUmemAllocationHandleType type;
    if (!wire_enum(r.handle_type, &type)) return CUDA_ERROR_INVALID_VALUE;
    const CUresult st = cu_.cuMemPoolExportToShareableHandle(scratch, p->real, type, r.flags);
    return st != CUDA_SUCCESS ? st : CUDA_ERROR_NOT_SUPPORTED;
  }
  int fd = -1;
  const CUresult st = cu_.cuMemPoolExportToShareableHandle(&fd, p->real, kFd, r.flags);
  if (st != CUDA_SUCCESS) return st;
  sys::UniqueFd owned(fd);
  RepShareToken rep{};
  // One token per pool: exported again, the guest gets another fd of it.
  for (const auto& [token, e] : exports_)
    if (e.pool == p->real) {
      std::memcpy(rep.token, token.data(), sizeof rep.token);
      c.set_reply(rep);
      return CUDA_SUCCESS;
    }
  BrokerToken token;
  Export* e = nullptr;
  // A pool's fd holds no memory of its own (its allocations are charged
  // one by one): no charge travels with it.
  if (CUresult sst = share_fd(std::move(owned), 0, nullptr, &token, &e); sst != CUDA_SUCCESS) return sst;
  e->pool = p->real;
  e->proc = r.proc;
  std::memcpy(rep.token, token.data(), sizeof rep.token);
  c.set_reply(rep);
  return CUDA_SUCCESS;
}

// Asked with an fd that is certainly no exported pool (an empty memfd): a
// forged token, another tenant's, or an fd that held no token at all gets the
// driver's own words for it.
CUresult Worker::not_an_exported_pool(unsigned long long flags) {
  sys::UniqueFd fd(::memfd_create("ivcuda-not-a-pool", MFD_CLOEXEC));
  if (!fd.valid()) return CUDA_ERROR_INVALID_VALUE;
  CUmemoryPool got = nullptr;
  const CUresult st = cu_.cuMemPoolImportFromShareableHandle(
      &got, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd.get())), kFd, flags);
  if (st == CUDA_SUCCESS) {  // not what any driver does; nothing of it reaches the guest
    (void)cu_.cuMemPoolDestroy(got);
    return CUDA_ERROR_INVALID_VALUE;
  }
  return st;
}

CUresult Worker::on_MemPoolImport(Call& c) {
  const auto r = c.req<ReqPoolImport>();
  if (r.handle_type != kFd) return CUDA_ERROR_INVALID_VALUE;
  Export* own = nullptr;
  sys::UniqueFd fetched;
  std::uint64_t value = 0;
  int fd = -1;
  if (r.no_token == 0) {
    BrokerToken token;
    std::memcpy(token.data(), r.token, token.size());
    fd = shared_fd(token, &own, &fetched, &value);
  }
  if (fd < 0) return not_an_exported_pool(r.flags);
  PoolEntry e{};
  e.imported = true;
  e.handle_types = kFd;
  if (own != nullptr && own->pool != nullptr && own->proc != r.proc) {
    // A sibling guest process of this worker: the exporter's pool itself.
    if (r.flags != 0) return CUDA_ERROR_INVALID_VALUE;  // "must be 0"
    e.real = own->pool;
    e.alias = true;
    pools_.for_each([&](std::uint64_t, PoolEntry& q) {
      if (q.real == own->pool && !q.alias) e.device = q.device;
    });
  } else {
    // Another worker's pool, or an import in the exporting process itself:
    // the driver's.
    const CUresult st = cu_.cuMemPoolImportFromShareableHandle(
        &e.real, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)), kFd, r.flags);
    if (st != CUDA_SUCCESS) return st;
    e.device = -1;
  }
  ++pool_names_[e.real];
  c.set_reply(RepHandle{pools_.insert(e)});
  return CUDA_SUCCESS;
}

// The allocation must be the guest's (a stream-ordered or cuMemAlloc
// allocation; which of them export is the driver's to say); the driver's
// export data stays in the registry.
CUresult Worker::on_MemPoolExportPtr(Call& c) {
  const auto r = c.req<ReqPoolPtr>();
  auto it = ranges_.upper_bound(r.dptr);
  if (it == ranges_.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  if (IVCUDA_RULE("pool-ticket") &&
      (!ring::span_within(r.dptr, 1, it->first, it->second.size) || it->second.kind != RangeKind::kAlloc))
    return CUDA_ERROR_INVALID_VALUE;
  const std::uint64_t base = it->first, size = it->second.size;
  if (it->second.ctx != 0)
    if (CUresult st = use_ctx(it->second.ctx); st != CUDA_SUCCESS) return st;
  CUmemPoolPtrExportData data{};
  const CUresult st = cu_.cuMemPoolExportPointer(&data, r.dptr);
  if (st != CUDA_SUCCESS) return st;
  // Its pool, for imports through an alias (which must name that pool).
  CUmemoryPool from = nullptr;
  if (cu_.cuPointerGetAttribute(&from, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, r.dptr) != CUDA_SUCCESS) from = nullptr;
  ShareEntry e;
  e.kind = ShareKind::kPoolPtr;
  e.owner_proc = r.proc;
  e.key = r.dptr;
  e.base = r.dptr;
  e.size = size - (r.dptr - base);
  e.aux = reinterpret_cast<std::uint64_t>(from);
  static_assert(sizeof data == 64);
  std::memcpy(e.payload.data(), &data, sizeof data);
  // Exported before: the same ticket (the registry keeps one per pointer).
  auto ticket = share_publish(e);
  if (!ticket) {
    IVLOG_DEBUG("guest %u: cannot export pool pointer 0x%llx: %s", cfg_.guest_id,
                static_cast<unsigned long long>(r.dptr), ticket.error().what.c_str());
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (pool_ptr_exports_.count(r.dptr) == 0) pool_ptr_exports_[r.dptr] = from;
  RepIpcHandle rep{};
  encode_ticket(kPoolPtrMagic, *ticket, reinterpret_cast<std::byte*>(rep.bytes));
  c.set_reply(rep);
  return CUDA_SUCCESS;
}

// Only into an imported pool, and only a ticket of this tenant's registry
// that matches exactly: anything else is INVALID_VALUE (the driver's answer
// for export data that is not of the pool) before the driver is called.
CUresult Worker::on_MemPoolImportPtr(Call& c) {
  const auto r = c.req<ReqPoolPtrImport>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  const PoolEntry* p = pools_.find(r.pool);
  if (p == nullptr || p->real == nullptr || (IVCUDA_RULE("pool-ticket") && !p->imported))
    return CUDA_ERROR_INVALID_VALUE;
  const auto ticket = decode_ticket(kPoolPtrMagic, reinterpret_cast<const std::byte*>(r.data));
  if (!ticket) return CUDA_ERROR_INVALID_VALUE;
  const auto found = share_lookup(ShareKind::kPoolPtr, *ticket);
  if (!found) return CUDA_ERROR_INVALID_VALUE;
  const ShareEntry* e = &found->entry;
  if (p->alias) {
    // A sibling process imports this worker's own allocation: the allocation
    // itself, if it came from the very pool the alias names.
    if (!found->mine || e->aux != reinterpret_cast<std::uint64_t>(p->real) || e->owner_proc == r.proc)
      return CUDA_ERROR_INVALID_VALUE;
    auto it = ranges_.upper_bound(e->base);
    if (it == ranges_.begin()) return CUDA_ERROR_INVALID_VALUE;
    --it;
    if (!ring::span_within(e->base, 1, it->first, it->second.size) || it->second.kind != RangeKind::kAlloc)
      return CUDA_ERROR_INVALID_VALUE;
    PoolImport& imp = pool_imports_[e->base];
    imp.own = true;
    ++imp.by[r.proc];
    // The extent from this worker's books, not from what an exporter told
    // the registry.
    c.set_reply(RepRange{e->base, it->second.size - (e->base - it->first)});
    return CUDA_SUCCESS;
  }
  CUmemPoolPtrExportData data{};
  std::memcpy(&data, e->payload.data(), sizeof data);
  // Another process's allocation: while imported, this guest holds a
  // reference that keeps it alive, so it counts against this guest's quota
  // too (docs/design.md, "Tenants and what they share").
  Charge charge;
  if (IVCUDA_RULE("import-charged")) {
    charge = quota_.take(e->size);
    if (!charge) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  CUdeviceptr d = 0;
  const CUresult st = cu_.cuMemPoolImportPointer(&d, p->real, &data);
  if (st != CUDA_SUCCESS) return st;
  // An address this guest already owns (what a driver might answer in the
  // exporting process): the memory itself, as for an alias.
  auto at = ranges_.upper_bound(d);
  if (at != ranges_.begin() && ring::span_within(d, 1, std::prev(at)->first, std::prev(at)->second.size) &&
      std::prev(at)->second.kind != RangeKind::kPoolImport) {
    PoolImport& imp = pool_imports_[d];
    imp.own = true;
    ++imp.by[r.proc];
    c.set_reply(RepRange{d, std::prev(at)->second.size - (d - std::prev(at)->first)});
    return CUDA_SUCCESS;
  }
  // The mapping's extent as the driver sees it; the exporter's size if it
  // will not say.
  CUdeviceptr mb = 0;
  size_t ms = 0;
  std::uint64_t size = e->size;
  if (cu_.cuMemGetAddressRange(&mb, &ms, d) == CUDA_SUCCESS && mb <= d && ms > d - mb) size = ms - (d - mb);
  PoolImport& imp = pool_imports_[d];
  if (imp.by.empty()) {
    // Charged for what the driver maps, not only for what the exporter said.
    if (charge && size > charge.bytes() && !charge.grow(size - charge.bytes())) {
      (void)cu_.cuMemFree(d);
      pool_imports_.erase(d);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ranges_[d] = DevRange{size, r.ctx, RangeKind::kPoolImport, r.pool, std::move(charge)};
  }
  ++imp.by[r.proc];
  c.set_reply(RepRange{d, ranges_[d].size});
  return CUDA_SUCCESS;
}

// A guest process frees what it imported (cuMemFree, cuMemFreeAsync): the
// driver frees the import with the last free of the worker's importers; an
// allocation of this worker's own stays its owner's.
CUresult Worker::on_MemPoolPtrFree(Call& c) {
  const auto r = c.req<ReqPoolPtrFree>();
  auto it = pool_imports_.find(r.dptr);
  if (it == pool_imports_.end()) return CUDA_ERROR_INVALID_VALUE;
  auto mine = it->second.by.find(r.proc);
  if (mine == it->second.by.end()) return CUDA_ERROR_INVALID_VALUE;  // not imported by this process
  auto range = ranges_.find(r.dptr);
  if (range == ranges_.end()) return CUDA_ERROR_INVALID_VALUE;  // books disagree: refuse, keep them
  if (CUresult st = use_ctx(range->second.ctx); st != CUDA_SUCCESS) return st;
  CUstream s = nullptr;
  if (r.async != 0)
    if (CUresult st = resolve_stream(r.ctx, r.stream, &s); st != CUDA_SUCCESS) return st;
  const bool last = it->second.by.size() == 1 && mine->second == 1;
  CUresult st = CUDA_SUCCESS;
  if (last && !it->second.own) {
    st = r.async != 0 ? cu_.cuMemFreeAsync(r.dptr, s) : cu_.cuMemFree(r.dptr);
    if (st != CUDA_SUCCESS) return st;
  }
  if (--mine->second == 0) it->second.by.erase(mine);
  if (!last) return CUDA_SUCCESS;
  const bool own = it->second.own;
  pool_imports_.erase(it);
  if (!own) {
    (void)ipc_on_free(r.dptr);  // exported onwards through IPC? Not after it is gone
    ranges_.erase(range);
  } else if (range->second.kind == RangeKind::kFreed && !ipc_holds(r.dptr)) {
    st = cu_.cuMemFree(r.dptr);  // its owner freed it before: now it goes
    ranges_.erase(range);
  }
  return st;
}

bool Worker::pool_holds(std::uint64_t base) const {
  auto it = pool_imports_.find(base);
  return it != pool_imports_.end() && it->second.own;
}

bool Worker::pool_on_free(std::uint64_t base, std::uint64_t size) {
  // What was exported of it cannot be imported any more.
  for (auto it = pool_ptr_exports_.lower_bound(base); it != pool_ptr_exports_.end() && it->first - base < size;) {
    share_withdraw(ShareKind::kPoolPtr, it->first);
    it = pool_ptr_exports_.erase(it);
  }
  if (!pool_holds(base)) return true;
  auto range = ranges_.find(base);
  if (range != ranges_.end()) range->second.kind = RangeKind::kFreed;
  return false;
}

void Worker::pool_drop_ctx(std::uint64_t ctx, bool close_in_driver) {
  auto in_ctx = [&](std::uint64_t addr) {
    auto it = ranges_.upper_bound(addr);
    return it != ranges_.begin() && ring::span_within(addr, 1, std::prev(it)->first, std::prev(it)->second.size) &&
           std::prev(it)->second.ctx == ctx;
  };
  for (auto it = pool_ptr_exports_.begin(); it != pool_ptr_exports_.end();) {
    if (!in_ctx(it->first)) {
      ++it;
      continue;
    }
    share_withdraw(ShareKind::kPoolPtr, it->first);
    it = pool_ptr_exports_.erase(it);
  }
  // Imports end with their context (kFreed allocations are ipc_drop_ctx's to free).
  for (auto it = pool_imports_.begin(); it != pool_imports_.end();) {
    if (!in_ctx(it->first)) {
      ++it;
      continue;
    }
    if (close_in_driver && !it->second.own) (void)cu_.cuMemFree(it->first);
    if (!it->second.own) ranges_.erase(it->first);
    it = pool_imports_.erase(it);
  }
}

}  // namespace ivcuda::host
