// See from_worker.h, "the VM's shared page".
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <new>

#include "host-daemon/shared/from_worker.h"
#include "ring/sys.h"

namespace ivcuda::host {

VmShared* VmShared::create(const ring::Layout& l) {
  const std::uint64_t pages = ring::pool_size(l) / kPage;
  const std::size_t bytes = sizeof(Header) + pages * sizeof(std::uint32_t);
  // A named memfd rather than anonymous memory: /proc/PID/maps then says
  // what the mapping is.
  auto fd = sys::make_memfd("ivcuda-vm", bytes);
  if (!fd) {
    errno = fd.error().code;
    return nullptr;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd->get(), 0);
  if (p == MAP_FAILED) return nullptr;  // zero-filled: no owners, no slots, epoch 0 everywhere
  auto* vm = new (std::nothrow) VmShared();
  if (vm == nullptr) {
    ::munmap(p, bytes);
    errno = ENOMEM;
    return nullptr;
  }
  vm->hdr_ = new (p) Header{};
  vm->page_owner_ = reinterpret_cast<std::atomic<std::uint32_t>*>(static_cast<std::byte*>(p) + sizeof(Header));
  vm->pool_off_ = ring::pool_off(l);
  vm->pages_ = pages;
  return vm;
}

static_assert(sizeof(VmShared::Slot) % alignof(std::uint64_t) == 0);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free && std::atomic<std::uint64_t>::is_always_lock_free);

// A page is free when nobody tagged it, when its tag names no slot (a
// worker scribbled), or when the tag's epoch is not the slot's any more
// (its worker is gone). A worker's own slot's epoch is the one it forked
// with; the others' are read from the shared slots, where only the
// supervisor writes them (a worker that lies there frees or withholds pages
// of its own VM, nothing else).
bool VmShared::is_free(std::uint32_t owner) const noexcept {
  const std::uint32_t s1 = owner & ((1u << kSlotBits) - 1);
  if (owner == 0 || s1 == 0 || s1 > kMaxSlots) return true;
  const std::uint32_t epoch = hdr_->slots[s1 - 1].epoch.load(std::memory_order_acquire);
  return (owner >> kSlotBits) != (epoch & ((1u << (32 - kSlotBits)) - 1));
}

std::optional<std::uint64_t> VmShared::pool_allocate(std::uint64_t bytes, std::uint32_t s) {
  if (bytes == 0 || s >= kMaxSlots) return std::nullopt;
  const std::uint64_t need = (bytes + kPage - 1) / kPage;
  if (need > pages_) return std::nullopt;
  const std::uint32_t mine = tag(s, epoch_[s]);
  // First fit over the pages seen free, then each claimed by CAS; a page
  // another worker took meanwhile gives back those already claimed and the
  // search goes on past it.
  for (std::uint64_t i = 0, run = 0; i < pages_; ++i) {
    run = is_free(page_owner_[i].load(std::memory_order_acquire)) ? run + 1 : 0;
    if (run != need) continue;
    const std::uint64_t first = i + 1 - need;
    std::uint64_t k = first;
    for (; k <= i; ++k) {
      std::uint32_t cur = page_owner_[k].load(std::memory_order_acquire);
      if (!is_free(cur) || !page_owner_[k].compare_exchange_strong(cur, mine, std::memory_order_acq_rel)) break;
    }
    if (k > i) return pool_off_ + first * kPage;
    for (std::uint64_t u = first; u < k; ++u) page_owner_[u].store(0, std::memory_order_release);
    run = 0;
  }
  return std::nullopt;
}

bool VmShared::pool_free(std::uint64_t off, std::uint64_t bytes, std::uint32_t s) {
  if (s >= kMaxSlots || off < pool_off_ || (off - pool_off_) % kPage != 0 || bytes == 0) return false;
  const std::uint64_t first = (off - pool_off_) / kPage, n = (bytes + kPage - 1) / kPage;
  if (first >= pages_ || n > pages_ - first) return false;
  const std::uint32_t mine = tag(s, epoch_[s]);
  for (std::uint64_t k = first; k < first + n; ++k)
    if (page_owner_[k].load(std::memory_order_acquire) != mine) return false;
  // Ours: no other worker claims a page that is not free.
  for (std::uint64_t k = first; k < first + n; ++k) page_owner_[k].store(0, std::memory_order_release);
  return true;
}

std::uint64_t VmShared::pool_held(std::uint32_t s) const noexcept {
  if (s >= kMaxSlots) return 0;
  const std::uint32_t t = tag(s, epoch_[s]);
  std::uint64_t held = 0;
  for (std::uint64_t k = 0; k < pages_; ++k)
    if (page_owner_[k].load(std::memory_order_relaxed) == t) held += kPage;
  return held;
}

void VmShared::retire_slot(std::uint32_t s) noexcept {
  if (s >= kMaxSlots) return;
  epoch_[s] = (epoch_[s] + 1) & ((1u << (32 - kSlotBits)) - 1);
  hdr_->slots[s].epoch.store(epoch_[s], std::memory_order_release);
}

// The VM's total is one counter, so that two workers charging at once
// cannot both pass the limit; the slots' counters say whose the bytes are,
// so that a reaped worker's bytes return to the VM.
bool VmShared::mem_charge(std::uint32_t s, std::uint64_t bytes, std::uint64_t limit) noexcept {
  if (s >= kMaxSlots) return false;
  std::atomic<std::uint64_t>& total = hdr_->mem_total;
  std::uint64_t cur = total.load(std::memory_order_relaxed);
  do {
    if (limit != 0 && (bytes > limit || cur > limit - bytes)) return false;
  } while (!total.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
  slot(s).mem.fetch_add(bytes, std::memory_order_relaxed);
  return true;
}

std::uint64_t VmShared::mem_uncharge(std::uint32_t s, std::uint64_t bytes) noexcept {
  if (s >= kMaxSlots) return 0;
  std::atomic<std::uint64_t>& m = slot(s).mem;
  std::uint64_t cur = m.load(std::memory_order_relaxed), off = 0;
  do {
    off = std::min(bytes, cur);
  } while (!m.compare_exchange_weak(cur, cur - off, std::memory_order_relaxed));
  hdr_->mem_total.fetch_sub(off, std::memory_order_relaxed);
  return off;
}

std::uint64_t VmShared::mem_used() noexcept { return hdr_->mem_total.load(std::memory_order_relaxed); }

std::uint64_t VmShared::mem_release_all(std::uint32_t s) noexcept {
  if (s >= kMaxSlots) return 0;
  const std::uint64_t bytes = slot(s).mem.exchange(0, std::memory_order_relaxed);
  // A worker may have written anything into its counter: the total never
  // goes below zero for it.
  std::uint64_t cur = hdr_->mem_total.load(std::memory_order_relaxed);
  while (!hdr_->mem_total.compare_exchange_weak(cur, cur - std::min(cur, bytes), std::memory_order_relaxed)) {
  }
  return bytes;
}

}  // namespace ivcuda::host
