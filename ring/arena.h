// Allocator for the bulk-data arena. Its state lives in the host's private
// memory: the guest only ever receives offsets, and every offset it sends
// back is checked against this map.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace ivcuda::ring {

class ArenaAllocator {
 public:
  // Manages [base, base + size); offsets returned are absolute BAR offsets.
  ArenaAllocator(std::uint64_t base, std::uint64_t size, std::uint64_t granule = 4096);

  // First fit, granule-aligned. nullopt when nothing fits.
  [[nodiscard]] std::optional<std::uint64_t> allocate(std::uint64_t bytes);
  // Records [off, off + bytes) (granule-rounded) as allocated, when all of
  // it is free: for a pool whose space another party hands out.
  [[nodiscard]] bool take(std::uint64_t off, std::uint64_t bytes);
  // Frees the allocation that starts at off. False if off starts none.
  [[nodiscard]] bool free(std::uint64_t off);
  // The allocation containing [off, off + len), as {start, size}.
  struct Block {
    std::uint64_t off;
    std::uint64_t size;
  };
  [[nodiscard]] std::optional<Block> find(std::uint64_t off, std::uint64_t len) const;

  std::uint64_t bytes_free() const noexcept { return free_bytes_; }
  std::uint64_t base() const noexcept { return base_; }
  std::uint64_t size() const noexcept { return size_; }
  std::size_t live_allocations() const noexcept { return used_.size(); }
  // Every allocation, by offset.
  std::vector<Block> allocations() const;
  void reset();

 private:
  std::uint64_t base_, size_, granule_, free_bytes_;
  std::map<std::uint64_t, std::uint64_t> free_;  // start -> size, coalesced
  std::map<std::uint64_t, std::uint64_t> used_;  // start -> size
};

}  // namespace ivcuda::ring
