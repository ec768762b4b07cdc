// CUDA IPC between processes of one tenant: cuIpcGetMemHandle,
// cuIpcOpenMemHandle, cuIpcCloseMemHandle, cuIpcGetEventHandle,
// cuIpcOpenEventHandle. The guest side is guest/ipc.cc; the registry that
// carries handles between the workers of a tenant is tenant_share.h, kept by
// the daemon and reached over the worker's line (fd_broker.h).
//
// Export: the object must be the guest's own; the worker asks the driver for
// its handle, publishes that handle in the tenant's registry and gives the
// guest only a ticket (slot + random token). Import: the daemon looks the
// ticket up in the registry of this worker's tenant only, so a forged
// ticket, a stale one or one from another tenant is CUDA_ERROR_INVALID_HANDLE
// before any driver call.
//
// Who exported decides how an open is served (the daemon says whether this
// worker's line published the entry):
//  - another worker (process mode: every guest process has its own worker):
//    the driver opens the real handle, and the mapping becomes device memory
//    the guest owns (RangeKind::kIpc), charged to its quota, until it closes
//    it;
//  - this worker, another guest process (one worker for several guest
//    processes: the driver refuses opens in the exporting process): the
//    answer is the allocation itself, counted per opening process; if its
//    owner frees it meanwhile, the real free waits for the last close
//    (RangeKind::kFreed), as the driver keeps memory alive for importers;
//  - this worker, the exporting guest process itself: the driver is asked
//    to open it, and answers what it answers natively (it refuses).
// Events follow the same rules; a sibling's open gets a second guest handle
// of the same driver event, destroyed with the last of its handles.
#include <unistd.h>

#include <cstring>

#include "host-daemon/shared/log.h"
#include "host-daemon/shared/rules.h"
#include "host-daemon/worker/worker_internal.h"
#include "ring/validate.h"

namespace ivcuda::host {

using namespace ivcuda::proto;

namespace {
constexpr std::uint32_t kMemMagic = 0x4d435649u;    // "IVCM"
constexpr std::uint32_t kEventMagic = 0x45435649u;  // "IVCE"
}  // namespace

// ------------------------------------------------------------------ memory

CUresult Worker::on_IpcGetMemHandle(Call& c) {
  const auto r = c.req<ReqIpcGet>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  if (r.object == 0) {  // names nothing: the driver's own answer for it
    CUipcMemHandle unused{};
    return cu_.cuIpcGetMemHandle(&unused, 0);
  }
  auto it = ranges_.upper_bound(r.object);
  if (it == ranges_.begin()) return CUDA_ERROR_INVALID_VALUE;
  --it;
  // Memory the guest owns and has not freed; which kinds the driver can
  // export is the driver's to say.
  if (IVCUDA_RULE("ipc-export-own") &&
      (!ring::span_within(r.object, 1, it->first, it->second.size) || it->second.kind == RangeKind::kFreed))
    return CUDA_ERROR_INVALID_VALUE;
  const std::uint64_t base = it->first, size = it->second.size;
  // Asked in the allocation's own context (mappings belong to none).
  if (it->second.ctx != 0 && it->second.ctx != r.ctx)
    if (CUresult st = use_ctx(it->second.ctx); st != CUDA_SUCCESS) return st;
  CUipcMemHandle real{};
  const CUresult st = cu_.cuIpcGetMemHandle(&real, r.object);
  if (st != CUDA_SUCCESS) return st;
  RepIpcHandle rep{};
  ShareEntry e;
  e.kind = ShareKind::kIpcMem;
  e.owner_proc = r.proc;
  e.key = base;
  e.base = base;
  e.size = size;
  static_assert(sizeof real == 64);
  std::memcpy(e.payload.data(), &real, sizeof real);
  // Exported before: the same ticket (the registry keeps one per object).
  auto ticket = share_publish(e);
  if (!ticket) {
    IVLOG_DEBUG("guest %u: cannot export 0x%llx: %s", cfg_.guest_id, static_cast<unsigned long long>(base),
                ticket.error().what.c_str());
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  ipc_exported_mem_.insert(base);
  encode_ticket(kMemMagic, *ticket, reinterpret_cast<std::byte*>(rep.bytes));
  c.set_reply(rep);
  return CUDA_SUCCESS;
}

CUresult Worker::on_IpcOpenMemHandle(Call& c) {
  const auto r = c.req<ReqIpcOpen>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  const auto ticket = decode_ticket(kMemMagic, reinterpret_cast<const std::byte*>(r.handle));
  if (!ticket) return CUDA_ERROR_INVALID_HANDLE;
  const auto found = share_lookup(ShareKind::kIpcMem, *ticket);
  if (!found) return CUDA_ERROR_INVALID_HANDLE;
  const ShareEntry* e = &found->entry;
  CUipcMemHandle real{};
  std::memcpy(&real, e->payload.data(), sizeof real);
  if (found->mine) {
    if (e->owner_proc == r.proc) {
      // The exporting process itself: the driver's own answer.
      CUdeviceptr d = 0;
      const CUresult st = cu_.cuIpcOpenMemHandle(&d, real, r.flags);
      if (st != CUDA_SUCCESS) return st;
      (void)cu_.cuIpcCloseMemHandle(d);  // a driver that allowed it: not what CUDA documents
      return CUDA_ERROR_INVALID_CONTEXT;
    }
    if ((r.flags & ~static_cast<std::uint32_t>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    auto it = ranges_.find(e->base);
    if (it == ranges_.end() || it->second.kind != RangeKind::kAlloc) return CUDA_ERROR_INVALID_HANDLE;
    IpcOpen& o = ipc_opens_[e->base];
    o.own = true;
    ++o.opens[r.proc];
    c.set_reply(RepRange{e->base, it->second.size});
    return CUDA_SUCCESS;
  }
  // Another worker's memory. While it is open this guest holds a reference
  // that keeps it alive (its exporter may free it and leave meanwhile), so
  // it counts against this guest's quota too (docs/design.md, "Tenants
  // and what they share").
  Charge charge;
  if (IVCUDA_RULE("import-charged")) {
    charge = quota_.take(e->size);
    if (!charge) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  CUdeviceptr d = 0;
  CUresult st = cu_.cuIpcOpenMemHandle(&d, real, r.flags);
  if (st != CUDA_SUCCESS) return st;
  // The mapping's extent as the driver sees it; the exporter's size if it
  // will not say.
  CUdeviceptr mb = 0;
  size_t ms = 0;
  std::uint64_t size = e->size;
  if (cu_.cuMemGetAddressRange(&mb, &ms, d) == CUDA_SUCCESS && mb <= d && ms > d - mb) size = ms - (d - mb);
  IpcOpen& o = ipc_opens_[d];
  if (o.opens.empty()) {
    // Charged for what the driver maps, not only for what the exporter said.
    if (charge && size > charge.bytes() && !charge.grow(size - charge.bytes())) {
      (void)cu_.cuIpcCloseMemHandle(d);
      ipc_opens_.erase(d);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ranges_[d] = DevRange{size, r.ctx, RangeKind::kIpc, 0, std::move(charge)};
  }
  ++o.opens[r.proc];
  c.set_reply(RepRange{d, ranges_[d].size});
  return CUDA_SUCCESS;
}

CUresult Worker::on_IpcCloseMemHandle(Call& c) {
  const auto r = c.req<ReqIpcClose>();
  auto it = ipc_opens_.find(r.dptr);
  const bool opened_here = it != ipc_opens_.end() && it->second.opens.count(r.proc) != 0;
  if (!opened_here) {
    // Not opened by this process. Another process's opening is not this
    // one's to close. Anything else is no IPC mapping of this worker (those
    // are all in ipc_opens_), so the driver can only refuse it, and says how.
    if (it != ipc_opens_.end()) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
    return cu_.cuIpcCloseMemHandle(r.dptr);
  }
  auto range = ranges_.find(r.dptr);
  if (range == ranges_.end()) return CUDA_ERROR_INVALID_VALUE;  // books disagree: refuse, keep them
  if (CUresult st = use_ctx(range->second.ctx); st != CUDA_SUCCESS) return st;
  CUresult st = CUDA_SUCCESS;
  if (!it->second.own) st = cu_.cuIpcCloseMemHandle(r.dptr);  // the driver counts each open
  if (st != CUDA_SUCCESS) return st;
  auto mine = it->second.opens.find(r.proc);
  if (--mine->second == 0) it->second.opens.erase(mine);
  if (!it->second.opens.empty()) return CUDA_SUCCESS;
  const bool own = it->second.own;
  ipc_opens_.erase(it);
  if (!own) {
    // Exported onwards from here? Not after it is gone.
    if (ipc_exported_mem_.erase(r.dptr) != 0) share_withdraw(ShareKind::kIpcMem, r.dptr);
    ranges_.erase(range);
  } else if (range->second.kind == RangeKind::kFreed && !pool_holds(r.dptr)) {
    st = cu_.cuMemFree(r.dptr);  // its owner freed it before: now it goes
    ranges_.erase(range);
  }
  return st;
}

bool Worker::ipc_holds(std::uint64_t base) const {
  auto it = ipc_opens_.find(base);
  return it != ipc_opens_.end() && it->second.own;
}

bool Worker::ipc_on_free(std::uint64_t base) {
  if (ipc_exported_mem_.erase(base) != 0) share_withdraw(ShareKind::kIpcMem, base);
  auto it = ipc_opens_.find(base);
  if (it == ipc_opens_.end() || !it->second.own) return true;
  auto range = ranges_.find(base);
  if (range != ranges_.end()) range->second.kind = RangeKind::kFreed;
  return false;
}

// ------------------------------------------------------------------ events

CUresult Worker::on_IpcGetEventHandle(Call& c) {
  const auto r = c.req<ReqIpcGet>();
  EventEntry* ev = events_.find(r.object);
  if (ev == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult st = use_ctx(ev->ctx); st != CUDA_SUCCESS) return st;
  CUipcEventHandle real{};
  const CUresult st = cu_.cuIpcGetEventHandle(&real, ev->real);
  if (st != CUDA_SUCCESS) return st;
  ShareEntry e;
  e.kind = ShareKind::kIpcEvent;
  e.owner_proc = r.proc;
  e.key = r.object;
  static_assert(sizeof real == 64);
  std::memcpy(e.payload.data(), &real, sizeof real);
  auto ticket = share_publish(e);
  if (!ticket) return CUDA_ERROR_OUT_OF_MEMORY;
  ipc_exported_events_.insert(r.object);
  RepIpcHandle rep{};
  encode_ticket(kEventMagic, *ticket, reinterpret_cast<std::byte*>(rep.bytes));
  c.set_reply(rep);
  return CUDA_SUCCESS;
}

CUresult Worker::on_IpcOpenEventHandle(Call& c) {
  const auto r = c.req<ReqIpcOpen>();
  if (CUresult st = use_ctx(r.ctx); st != CUDA_SUCCESS) return st;
  const auto ticket = decode_ticket(kEventMagic, reinterpret_cast<const std::byte*>(r.handle));
  if (!ticket) return CUDA_ERROR_INVALID_HANDLE;
  const auto found = share_lookup(ShareKind::kIpcEvent, *ticket);
  if (!found) return CUDA_ERROR_INVALID_HANDLE;
  const ShareEntry* e = &found->entry;
  CUipcEventHandle real{};
  std::memcpy(&real, e->payload.data(), sizeof real);
  if (found->mine) {
    if (e->owner_proc == r.proc) {
      CUevent ev = nullptr;
      const CUresult st = cu_.cuIpcOpenEventHandle(&ev, real);
      if (st != CUDA_SUCCESS) return st;
      (void)cu_.cuEventDestroy(ev);
      return CUDA_ERROR_INVALID_CONTEXT;
    }
    const EventEntry* src = events_.find(e->key);
    if (src == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    const EventEntry copy = *src;  // insert may move the table
    unsigned& names = ipc_event_names_[copy.real];
    names = names == 0 ? 2 : names + 1;
    c.set_reply(RepHandle{events_.insert(copy)});
    return CUDA_SUCCESS;
  }
  CUevent ev = nullptr;
  const CUresult st = cu_.cuIpcOpenEventHandle(&ev, real);
  if (st != CUDA_SUCCESS) return st;
  c.set_reply(RepHandle{events_.insert(EventEntry{ev, r.ctx})});
  return CUDA_SUCCESS;
}

bool Worker::ipc_on_event_destroy(std::uint64_t handle, CUevent real) {
  if (ipc_exported_events_.erase(handle) != 0) share_withdraw(ShareKind::kIpcEvent, handle);
  auto it = ipc_event_names_.find(real);
  if (it == ipc_event_names_.end()) return true;
  if (--it->second <= 1) ipc_event_names_.erase(it);  // one name left: it destroys for real
  return false;
}

// ------------------------------------------------------------------ teardown

void Worker::ipc_drop_ctx(std::uint64_t ctx, bool close_in_driver) {
  std::vector<std::uint64_t> gone;
  for (auto& [addr, r] : ranges_) {
    if (r.ctx != ctx) continue;
    if (ipc_exported_mem_.erase(addr) != 0) share_withdraw(ShareKind::kIpcMem, addr);
    auto o = ipc_opens_.find(addr);
    if (close_in_driver && r.kind == RangeKind::kIpc && o != ipc_opens_.end())
      for (const auto& [proc, n] : o->second.opens)
        for (unsigned i = 0; i < n; ++i) (void)cu_.cuIpcCloseMemHandle(addr);
    if (close_in_driver && r.kind == RangeKind::kFreed) (void)cu_.cuMemFree(addr);
    if (o != ipc_opens_.end()) ipc_opens_.erase(o);
    if (r.kind == RangeKind::kIpc || r.kind == RangeKind::kFreed) gone.push_back(addr);
  }
  for (auto a : gone) ranges_.erase(a);
  std::vector<std::pair<std::uint64_t, CUevent>> events;
  events_.for_each([&](std::uint64_t h, EventEntry& e) {
    if (e.ctx == ctx) events.emplace_back(h, e.real);
  });
  for (const auto& [h, real] : events) {
    if (ipc_exported_events_.erase(h) != 0) share_withdraw(ShareKind::kIpcEvent, h);
    if (!close_in_driver) ipc_event_names_.erase(real);  // the driver destroyed them with the context
  }
}

}  // namespace ivcuda::host
