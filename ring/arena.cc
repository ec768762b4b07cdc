#include "ring/arena.h"

#include "ring/validate.h"

namespace ivcuda::ring {

ArenaAllocator::ArenaAllocator(std::uint64_t base, std::uint64_t size, std::uint64_t granule)
    : base_(base), size_(size / granule * granule), granule_(granule), free_bytes_(0) {
  reset();
}

void ArenaAllocator::reset() {
  free_.clear();
  used_.clear();
  free_bytes_ = size_;
  if (size_ != 0) free_.emplace(base_, size_);
}

std::vector<ArenaAllocator::Block> ArenaAllocator::allocations() const {
  std::vector<Block> out;
  out.reserve(used_.size());
  for (const auto& [off, size] : used_) out.push_back(Block{off, size});
  return out;
}

std::optional<std::uint64_t> ArenaAllocator::allocate(std::uint64_t bytes) {
  if (bytes == 0 || bytes > size_) return std::nullopt;
  const std::uint64_t need = (bytes + granule_ - 1) / granule_ * granule_;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const std::uint64_t off = it->first;
    const std::uint64_t rest = it->second - need;
    free_.erase(it);
    if (rest != 0) free_.emplace(off + need, rest);
    used_.emplace(off, need);
    free_bytes_ -= need;
    return off;
  }
  return std::nullopt;
}

bool ArenaAllocator::take(std::uint64_t off, std::uint64_t bytes) {
  if (bytes == 0 || off < base_ || (off - base_) % granule_ != 0) return false;
  const std::uint64_t need = (bytes + granule_ - 1) / granule_ * granule_;
  auto it = free_.upper_bound(off);
  if (it == free_.begin()) return false;
  --it;
  const std::uint64_t start = it->first, len = it->second;
  if (!span_within(off, need, start, len)) return false;
  free_.erase(it);
  if (off > start) free_.emplace(start, off - start);
  if (off + need < start + len) free_.emplace(off + need, start + len - off - need);
  used_.emplace(off, need);
  free_bytes_ -= need;
  return true;
}

bool ArenaAllocator::free(std::uint64_t off) {
  auto u = used_.find(off);
  if (u == used_.end()) return false;
  std::uint64_t start = u->first, len = u->second;
  used_.erase(u);
  free_bytes_ += len;
  auto next = free_.lower_bound(start);
  if (next != free_.end() && start + len == next->first) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      prev->second += len;
      return true;
    }
  }
  free_.emplace(start, len);
  return true;
}

std::optional<ArenaAllocator::Block> ArenaAllocator::find(std::uint64_t off, std::uint64_t len) const {
  auto it = used_.upper_bound(off);
  if (it == used_.begin()) return std::nullopt;
  --it;
  if (!span_within(off, len, it->first, it->second)) return std::nullopt;
  return Block{it->first, it->second};
}

}  // namespace ivcuda::ring
