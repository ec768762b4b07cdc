// Virtual memory management: address reservations, physical allocations and
// their mappings (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess,
// ...), the API XLA's allocator, PyTorch's expandable segments and NCCL use.
// The guest side is guest/vmm.cc.
//
// The guest owns what it reserved and created here, nothing else: a map must
// lie inside one of its reservations and not overlap another mapping, an
// unmap must cover whole mappings, and a mapped range becomes device memory
// the guest owns (ranges_, kind kMapped) for copies and launches until it is
// unmapped. Physical allocations are handles of this worker's table; the
// driver's own handle values never reach the guest. Device ordinals in
// locations are the guest's and are translated both ways.
#include <unistd.h>

#include <cstring>

#include "host-daemon/shared/log.h"
#include "host-daemon/shared/rules.h"
#include "host-daemon/worker/worker_internal.h"
#include "ring/validate.h"

namespace ivcuda::host {

using namespace ivcuda::proto;

namespace {
// Locations the worker can translate: devices, and the host (for the
// host-memory VMM of newer drivers) as the driver numbers it.
bool location_ok(std::uint32_t type) {
  return type == CU_MEM_LOCATION_TYPE_DEVICE || type == CU_MEM_LOCATION_TYPE_HOST ||
         type == CU_MEM_LOCATION_TYPE_HOST_NUMA || type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}
}  // namespace

CUresult Worker::to_driver_location(std::uint32_t type, std::int32_t id, CUmemLocation* out) const {
  if (!location_ok(type) || !wire_enum(type, &out->type)) return CUDA_ERROR_INVALID_VALUE;
  out->id = id;
  if (type == CU_MEM_LOCATION_TYPE_DEVICE) {
    if (!valid_device(id)) return CUDA_ERROR_INVALID_DEVICE;
    out->id = static_cast<int>(devices_[dev_index(id)]);
  }
  return CUDA_SUCCESS;
}

CUresult Worker::to_driver_prop(const MemProp& p, CUmemAllocationProp* out) const {
  *out = CUmemAllocationProp{};
  if (!wire_enum(p.type, &out->type) || !wire_enum(p.handle_types, &out->requestedHandleTypes))
    return CUDA_ERROR_INVALID_VALUE;
  if (CUresult st = to_driver_location(p.loc_type, p.loc_id, &out->location); st != CUDA_SUCCESS) return st;
  out->allocFlags.compressionType = p.compression;
  out->allocFlags.gpuDirectRDMACapable = p.rdma;
  out->allocFlags.usage = p.usage;
  return CUDA_SUCCESS;
}

CUresult Worker::on_MemGranularity(Call& c) {
  const auto r = c.req<ReqMemGranularity>();
  CUmemAllocationProp prop;
  if (CUresult st = to_driver_prop(r.prop, &prop); st != CUDA_SUCCESS) return st;
  CUmemAllocationGranularity_flags option;
  if (!wire_enum(r.option, &option)) return CUDA_ERROR_INVALID_VALUE;
  size_t g = 0;
  const CUresult st = cu_.cuMemGetAllocationGranularity(&g, &prop, option);
  c.set_reply(RepValue{static_cast<std::int64_t>(g)});
  return st;
}

CUresult Worker::on_MemAddressReserve(Call& c) {
  const auto r = c.req<ReqMemAddressReserve>();
  if (r.size == 0) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr p = 0;
  const CUresult st = cu_.cuMemAddressReserve(&p, r.size, r.alignment, r.addr, r.flags);
  if (st != CUDA_SUCCESS) return st;
  reservations_[p] = r.size;
  c.set_reply(RepRange{p, r.size});
  return CUDA_SUCCESS;
}

CUresult Worker::on_MemAddressFree(Call& c) {
  const auto r = c.req<ReqMemRange>();
  auto it = reservations_.find(r.ptr);
  if (it == reservations_.end() || it->second != r.size) return CUDA_ERROR_INVALID_VALUE;
  // The guest's view of the range must not outlive it: unmap first.
  for (const auto& [addr, m] : mappings_)
    if (ring::span_within(addr, m.size, r.ptr, r.size)) return CUDA_ERROR_INVALID_VALUE;
  const CUresult st = cu_.cuMemAddressFree(r.ptr, r.size);
  if (st == CUDA_SUCCESS) reservations_.erase(it);
  return st;
}

CUresult Worker::on_MemCreate(Call& c) {
  const auto r = c.req<ReqMemCreate>();
  reap_mem_releases();  // memory arrays no longer map goes back first
  CUmemAllocationProp prop;
  if (CUresult st = to_driver_prop(r.prop, &prop); st != CUDA_SUCCESS) return st;
  if (full(mem_handles_, cfg_.limits.mem_handles, "memory handle")) return CUDA_ERROR_OUT_OF_MEMORY;
  Charge charge = quota_.take(r.size);
  if (!charge) return CUDA_ERROR_OUT_OF_MEMORY;
  CUmemGenericAllocationHandle h = 0;
  const CUresult st = cu_.cuMemCreate(&h, r.size, &prop, r.flags);
  if (st != CUDA_SUCCESS) return st;
  MemHandleEntry e{h, r.size};
  e.charge = std::make_shared<Charge>(std::move(charge));
  c.set_reply(RepHandle{mem_handles_.insert(std::move(e))});
  return CUDA_SUCCESS;
}

CUresult Worker::on_MemRelease(Call& c) {
  const auto r = c.req<ReqHandle>();
  reap_mem_releases();
  MemHandleEntry* e = guest_mem(r.handle);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // The last reference while sparse arrays map the allocation: the worker
  // keeps it until they no longer do (arrays.cc).
  if (e->refs == 1 && e->tile_maps > 0 && !e->held) {
    e->refs = 0;
    e->held = true;
    return CUDA_SUCCESS;
  }
  // A mapping holds the driver's allocation alive on its own, as CUDA
  // defines it: releasing the handle leaves mapped memory usable.
  const CUresult st = cu_.cuMemRelease(e->real);
  if (st == CUDA_SUCCESS && --e->refs == 0 && !e->held) mem_handles_.erase(r.handle);
  return st;
}

CUresult Worker::on_MemMap(Call& c) {
  const auto r = c.req<ReqMemMap>();
  if (r.size == 0) return CUDA_ERROR_INVALID_VALUE;
  MemHandleEntry* e = guest_mem(r.handle);
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // Inside one reservation of this guest, over no other mapping.
  auto res = reservations_.upper_bound(r.ptr);
  if (res == reservations_.begin()) return CUDA_ERROR_INVALID_VALUE;
  --res;
  if (IVCUDA_RULE("vmm-own-ranges") && !ring::span_within(r.ptr, r.size, res->first, res->second))
    return CUDA_ERROR_INVALID_VALUE;
  if (IVCUDA_RULE("vmm-own-ranges") && !ring::range_ok(r.offset, r.size, e->size)) return CUDA_ERROR_INVALID_VALUE;
  auto next = mappings_.lower_bound(r.ptr);
  if (next != mappings_.end() && next->first - r.ptr < r.size) return CUDA_ERROR_INVALID_VALUE;
  if (next != mappings_.begin()) {
    auto prev = std::prev(next);
    if (r.ptr - prev->first < prev->second.size) return CUDA_ERROR_INVALID_VALUE;
  }
  const CUresult st = cu_.cuMemMap(r.ptr, r.size, r.offset, e->real, r.flags);
  if (st != CUDA_SUCCESS) return st;
  mappings_[r.ptr] = MappingEntry{r.size, r.handle, e->charge};
  ranges_[r.ptr] = DevRange{r.size, 0, RangeKind::kMapped};
  return CUDA_SUCCESS;
}

CUresult Worker::on_MemUnmap(Call& c) {
  const auto r = c.req<ReqMemRange>();
  if (r.size == 0 || r.ptr + r.size < r.ptr) return CUDA_ERROR_INVALID_VALUE;
  // Every mapping the range touches must lie wholly inside it (the driver
  // allows unmapped gaps between them); at least one must.
  std::vector<std::uint64_t> covered;
  auto it = mappings_.upper_bound(r.ptr);
  if (it != mappings_.begin()) --it;
  for (; it != mappings_.end() && it->first < r.ptr + r.size; ++it) {
    if (it->first + it->second.size <= r.ptr) continue;  // ends before the range
    if (!ring::span_within(it->first, it->second.size, r.ptr, r.size)) return CUDA_ERROR_INVALID_VALUE;
    covered.push_back(it->first);
  }
  if (covered.empty()) return CUDA_ERROR_INVALID_VALUE;
  const CUresult st = cu_.cuMemUnmap(r.ptr, r.size);
  if (st != CUDA_SUCCESS) return st;
  for (auto a : covered) {
    mappings_.erase(a);
    ranges_.erase(a);
  }
  return CUDA_SUCCESS;
}

bool Worker::fully_mapped(std::uint64_t ptr, std::uint64_t size) const {
  if (size == 0 || ptr + size < ptr) return false;
  std::uint64_t at = ptr;
  auto it = mappings_.upper_bound(ptr);
  if (it == mappings_.begin()) return false;
  --it;
  for (; it != mappings_.end() && at < ptr + size; ++it) {
    if (!ring::span_within(at, 1, it->first, it->second.size)) return false;
    at = it->first + it->second.size;
  }
  return at >= ptr + size;
}

CUresult Worker::on_MemSetAccess(Call& c) {
  const auto r = c.req<ReqMemSetAccess>();
  const auto tail = c.tail<ReqMemSetAccess>();
  if (r.count == 0 || r.count > kMaxDevices || tail.size() != r.count * sizeof(MemAccess))
    return CUDA_ERROR_INVALID_VALUE;
  if (!fully_mapped(r.ptr, r.size)) return CUDA_ERROR_INVALID_VALUE;
  CUmemAccessDesc desc[kMaxDevices];
  for (std::uint32_t i = 0; i < r.count; ++i) {
    MemAccess a;
    std::memcpy(&a, tail.data() + i * sizeof a, sizeof a);
    if (CUresult st = to_driver_location(a.loc_type, a.loc_id, &desc[i].location); st != CUDA_SUCCESS) return st;
    if (!wire_enum(a.flags, &desc[i].flags)) return CUDA_ERROR_INVALID_VALUE;
  }
  return cu_.cuMemSetAccess(r.ptr, r.size, desc, r.count);
}

CUresult Worker::on_MemGetAccess(Call& c) {
  const auto r = c.req<ReqMemGetAccess>();
  if (!fully_mapped(r.ptr, 1)) return CUDA_ERROR_INVALID_VALUE;
  CUmemLocation loc{};
  if (CUresult st = to_driver_location(r.loc_type, r.loc_id, &loc); st != CUDA_SUCCESS) return st;
  unsigned long long flags = 0;
  const CUresult st = cu_.cuMemGetAccess(&flags, &loc, r.ptr);
  c.set_reply(RepValue{static_cast<std::int64_t>(flags)});
  return st;
}

CUresult Worker::on_MemGetProperties(Call& c) {
  const auto r = c.req<ReqHandle>();
  MemHandleEntry* e = guest_mem(r.handle);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUmemAllocationProp prop{};
  const CUresult st = cu_.cuMemGetAllocationPropertiesFromHandle(&prop, e->real);
  if (st != CUDA_SUCCESS) return st;
  RepMemProp rep{};
  rep.prop.type = prop.type;
  rep.prop.handle_types = prop.requestedHandleTypes;
  rep.prop.loc_type = prop.location.type;
  rep.prop.loc_id = prop.location.id;
  if (prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    rep.prop.loc_id = -1;  // the guest's ordinal of that device
    for (std::size_t i = 0; i < devices_.size(); ++i)
      if (static_cast<int>(devices_[i]) == prop.location.id) rep.prop.loc_id = static_cast<std::int32_t>(i);
  }
  rep.prop.compression = prop.allocFlags.compressionType;
  rep.prop.rdma = prop.allocFlags.gpuDirectRDMACapable;
  rep.prop.usage = prop.allocFlags.usage;
  c.set_reply(rep);
  return CUDA_SUCCESS;
}

std::uint64_t Worker::adopt_mem_handle(CUmemGenericAllocationHandle real, std::uint64_t size,
                                       std::shared_ptr<Charge> charge) {
  std::uint64_t found = 0;
  mem_handles_.for_each([&](std::uint64_t h, MemHandleEntry& e) {
    if (e.real == real && found == 0) {  // also one only sparse arrays still map (refs 0)
      ++e.refs;
      found = h;
    }
  });
  if (found != 0) return found;
  MemHandleEntry e{real, size};
  e.charge = std::move(charge);
  return mem_handles_.insert(std::move(e));
}

CUresult Worker::on_MemRetainHandle(Call& c) {
  const auto r = c.req<ReqPtr>();
  auto it = mappings_.upper_bound(r.dptr);
  if (it == mappings_.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  if (!ring::span_within(r.dptr, 1, it->first, it->second.size)) return CUDA_ERROR_INVALID_VALUE;
  CUmemGenericAllocationHandle h = 0;
  const CUresult st = cu_.cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(r.dptr));
  if (st != CUDA_SUCCESS) return st;
  // The driver counts one more reference, released through this new handle;
  // it keeps the memory, and so its charge, after the mapping goes.
  c.set_reply(RepHandle{adopt_mem_handle(h, it->second.size, it->second.charge)});
  return CUDA_SUCCESS;
}

// Sharing an allocation with another process of the tenant. The driver's
// fd stays on the host: this worker keeps it (and leaves a dup with the
// daemon for the tenant's other workers, fd_broker.h) under a random token,
// and the guest gets the token. Only POSIX file descriptors can travel so;
// the other handle types get the driver's own answer when it refuses them,
// and NOT_SUPPORTED when it would hand out something the guest cannot carry.
// An exported fd is a reference to the memory (cuMemRelease frees nothing
// while one is open), so the export keeps the allocation's charge: released
// or not, exported memory counts against the exporter until it ends (the
// host cannot see the guest close its copy of the fd).
CUresult Worker::on_MemExportShareable(Call& c) {
  const auto r = c.req<ReqMemExport>();
  MemHandleEntry* e = guest_mem(r.handle);
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (r.handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    // Asked only for its verdict: a handle of another type never leaves.
    alignas(8) unsigned char scratch[64] = {};
    CUmemAllocationHandleType type;
    if (!wire_enum(r.handle_type, &type)) return CUDA_ERROR_INVALID_VALUE;
    const CUresult st = cu_.cuMemExportToShareableHandle(scratch, e->real, type, r.flags);
    return st != CUDA_SUCCESS ? st : CUDA_ERROR_NOT_SUPPORTED;
  }
  int fd = -1;
  const CUresult st = cu_.cuMemExportToShareableHandle(&fd, e->real, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, r.flags);
  if (st != CUDA_SUCCESS) return st;
  BrokerToken token;
  std::shared_ptr<Charge> charge = IVCUDA_RULE("export-charged") ? e->charge : nullptr;
  if (CUresult sst = share_fd(sys::UniqueFd(fd), e->size, std::move(charge), &token); sst != CUDA_SUCCESS) return sst;
  RepShareToken rep{};
  std::memcpy(rep.token, token.data(), sizeof rep.token);
  c.set_reply(rep);
  return CUDA_SUCCESS;
}

CUresult Worker::on_MemImportShareable(Call& c) {
  const auto r = c.req<ReqMemImport>();
  if (r.handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  BrokerToken token;
  std::memcpy(token.data(), r.token, token.size());
  Export* own = nullptr;
  sys::UniqueFd fetched;
  std::uint64_t size = 0;
  const int fd = shared_fd(token, &own, &fetched, &size);
  // A forged token, or one of another tenant, is what the driver calls an
  // fd that is no exported memory.
  if (fd < 0) return CUDA_ERROR_UNKNOWN;
  // The imported handle is a reference of this guest's that keeps the memory
  // alive whatever its exporter does, so it counts against this guest too;
  // one of this worker's own exports is already charged here.
  std::shared_ptr<Charge> charge = own != nullptr ? own->charge : nullptr;
  if (own == nullptr && IVCUDA_RULE("import-charged")) {
    Charge ch = quota_.take(size);
    if (!ch) return CUDA_ERROR_OUT_OF_MEMORY;
    charge = std::make_shared<Charge>(std::move(ch));
  }
  CUmemGenericAllocationHandle h = 0;
  const CUresult st = cu_.cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (st != CUDA_SUCCESS) return st;
  c.set_reply(RepHandle{adopt_mem_handle(h, size, std::move(charge))});
  return CUDA_SUCCESS;
}

void Worker::release_vmm() noexcept {
  // The driver's VMM calls want a context; the worker's own primary serves.
  if (arena_ctx_ != nullptr) (void)cu_.cuCtxSetCurrent(arena_ctx_);
  for (const auto& [addr, m] : mappings_) (void)cu_.cuMemUnmap(addr, m.size);
  for (const auto& [addr, m] : mappings_) ranges_.erase(addr);
  mappings_.clear();
  // References kept for sparse arrays (their events die with the contexts).
  for (const PendingRelease& p : pending_releases_) (void)cu_.cuMemRelease(p.real);
  pending_releases_.clear();
  std::vector<std::uint64_t> handles;
  mem_handles_.for_each([&](std::uint64_t h, MemHandleEntry& e) {
    for (std::uint32_t i = 0; i < e.refs + (e.held ? 1u : 0u); ++i) (void)cu_.cuMemRelease(e.real);
    handles.push_back(h);
  });
  for (std::uint64_t h : handles) mem_handles_.erase(h);
  for (const auto& [base, size] : reservations_) (void)cu_.cuMemAddressFree(base, size);
  reservations_.clear();
}

}  // namespace ivcuda::host
