// See quota.h.
#include "host-daemon/worker/quota.h"

#include <algorithm>

#include "host-daemon/shared/from_worker.h"

namespace ivcuda::host {

bool Charge::grow(std::uint64_t extra) noexcept {
  if (q_ == nullptr || !q_->add(extra)) return false;
  bytes_ += extra;
  return true;
}

bool Charge::hold(std::uint64_t extra) noexcept {
  if (q_ == nullptr || !q_->add(extra, false)) return false;
  bytes_ += extra;
  return true;
}

void Charge::shrink(std::uint64_t n) noexcept {
  n = std::min(n, bytes_);
  if (q_ != nullptr && n != 0) q_->sub(n);
  bytes_ -= n;
}

void Charge::absorb(Charge&& o) noexcept {
  if (&o == this || o.q_ == nullptr) return;
  if (q_ == nullptr) q_ = o.q_;
  if (q_ != o.q_) {  // another quota's bytes are not ours to hold
    o.release();
    return;
  }
  bytes_ += std::exchange(o.bytes_, 0);
  o.q_ = nullptr;
}

void Charge::release() noexcept {
  if (q_ != nullptr && bytes_ != 0) q_->sub(bytes_);
  q_ = nullptr;
  bytes_ = 0;
}

void MemQuota::configure(std::uint64_t limit, VmShared* vm, std::uint32_t slot, GuestStats* board) noexcept {
  limit_ = limit;
  vm_ = vm;
  slot_ = slot;
  board_ = board;
}

std::uint64_t MemQuota::limit() const noexcept {
  return board_ != nullptr ? board_->mem_limit.load(std::memory_order_relaxed) : limit_;
}

void MemQuota::close() noexcept {
  if (closed_) return;
  closed_ = true;
  const std::uint64_t held = vm_ != nullptr ? vm_->mem_release_all(slot_) : own_.exchange(0, std::memory_order_relaxed);
  if (board_ != nullptr) board_->mem_used.fetch_sub(held, std::memory_order_relaxed);
}

Charge MemQuota::take(std::uint64_t bytes) noexcept {
  // An empty charge (a record that grows later) is granted past the limit too.
  if (bytes == 0) return closed_ ? Charge{} : Charge{this, 0};
  if (!add(bytes) && !(reclaim_ && reclaim_() && add(bytes))) return Charge{};
  return Charge{this, bytes};
}

bool MemQuota::add(std::uint64_t bytes, bool enforce) noexcept {
  if (closed_) return false;
  const std::uint64_t lim = enforce ? limit() : 0;
  if (vm_ != nullptr) {
    if (!vm_->mem_charge(slot_, bytes, lim)) return false;
  } else {
    std::uint64_t cur = own_.load(std::memory_order_relaxed);
    do {
      if (lim != 0 && (bytes > lim || cur > lim - bytes)) return false;
    } while (!own_.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
  }
  if (board_ != nullptr) board_->mem_used.fetch_add(bytes, std::memory_order_relaxed);
  return true;
}

void MemQuota::sub(std::uint64_t bytes) noexcept {
  if (closed_) return;
  if (vm_ != nullptr)
    bytes = vm_->mem_uncharge(slot_, bytes);
  else
    own_.fetch_sub(bytes, std::memory_order_relaxed);
  if (board_ != nullptr) board_->mem_used.fetch_sub(bytes, std::memory_order_relaxed);
}

std::uint64_t MemQuota::used() const noexcept {
  return vm_ != nullptr ? vm_->mem_used() : own_.load(std::memory_order_relaxed);
}

void MemQuota::view(std::uint64_t* total, std::uint64_t* free) const noexcept {
  const std::uint64_t lim = limit();
  if (lim == 0) return;
  const std::uint64_t used_now = used();
  const std::uint64_t left = used_now >= lim ? 0 : lim - used_now;
  *total = std::min(*total, lim);
  *free = std::min(*free, left);
}

}  // namespace ivcuda::host
