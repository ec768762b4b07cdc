// See quota.h.
#include "host-daemon/quota.h"

#include <algorithm>

#include "host-daemon/vm_supervisor.h"

namespace ivcuda::host {

bool Charge::grow(std::uint64_t extra) noexcept {
  if (q_ == nullptr || !q_->add(extra)) return false;
  bytes_ += extra;
  return true;
}

void Charge::release() noexcept {
  if (q_ != nullptr && bytes_ != 0) q_->sub(bytes_);
  q_ = nullptr;
  bytes_ = 0;
}

void MemQuota::configure(std::uint64_t limit, VmShared* vm, std::uint32_t slot) noexcept {
  limit_ = limit;
  vm_ = vm;
  slot_ = slot;
}

Charge MemQuota::take(std::uint64_t bytes) noexcept {
  if (!add(bytes)) return Charge{};
  return Charge{this, bytes};
}

bool MemQuota::add(std::uint64_t bytes) noexcept {
  if (vm_ != nullptr) return vm_->mem_charge(slot_, bytes, limit_);
  std::uint64_t cur = own_.load(std::memory_order_relaxed);
  do {
    if (limit_ != 0 && (bytes > limit_ || cur > limit_ - bytes)) return false;
  } while (!own_.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
  return true;
}

void MemQuota::sub(std::uint64_t bytes) noexcept {
  if (vm_ != nullptr)
    vm_->mem_uncharge(slot_, bytes);
  else
    own_.fetch_sub(bytes, std::memory_order_relaxed);
}

std::uint64_t MemQuota::used() const noexcept {
  return vm_ != nullptr ? vm_->mem_used() : own_.load(std::memory_order_relaxed);
}

void MemQuota::view(std::uint64_t* total, std::uint64_t* free) const noexcept {
  if (limit_ == 0) return;
  const std::uint64_t used_now = used();
  const std::uint64_t left = used_now >= limit_ ? 0 : limit_ - used_now;
  *total = std::min(*total, limit_);
  *free = std::min(*free, left);
}

}  // namespace ivcuda::host
