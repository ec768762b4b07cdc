// Per-guest handle tables. The guest only ever sees opaque 64-bit handles:
//   bits 56..63 kind, 32..55 generation, 4..31 slot index, 0..3 zero.
// The low bits are zero as in the driver's own handles (pointers to its
// objects): programs read them as pointers and tell them apart from small
// tagged values by those bits - PyTorch takes a CUstream with its lowest bit
// set for one of its own pool's stream ids, not an external stream.
// A handle is valid only if its kind matches, its slot is live and the
// generations agree, so a stale or forged handle is refused rather than
// aliasing another object. Generations start at a random value per table,
// so a handle one worker issued is refused by another (a process of a VM
// that got another process's handle values finds nothing with them).
#pragma once

#include <sys/random.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "ivcuda/proto.h"

namespace ivcuda::host {

inline constexpr unsigned kHandleAlignBits = 4;
inline constexpr std::uint32_t kMaxHandleSlots = 1u << (32 - kHandleAlignBits);
constexpr std::uint64_t make_handle(proto::HandleKind k, std::uint32_t gen, std::uint32_t idx) {
  return (std::uint64_t{static_cast<std::uint8_t>(k)} << 56) |
         (std::uint64_t{gen & 0xffffffu} << 32) | (std::uint64_t{idx} << kHandleAlignBits);
}
constexpr bool handle_slot(std::uint64_t h, std::uint32_t* idx) {
  if ((h & ((1u << kHandleAlignBits) - 1)) != 0) return false;
  *idx = static_cast<std::uint32_t>(h) >> kHandleAlignBits;
  return true;
}
constexpr proto::HandleKind handle_kind(std::uint64_t h) {
  return static_cast<proto::HandleKind>(h >> 56);
}

template <class T>
class HandleTable {
 public:
  explicit HandleTable(proto::HandleKind kind) : kind_(kind) {
    if (::getrandom(&gen_seed_, sizeof gen_seed_, 0) != sizeof gen_seed_) gen_seed_ = 0;
  }

  std::uint64_t insert(T value) {
    std::uint32_t idx;
    if (!free_.empty()) {
      idx = free_.back();
      free_.pop_back();
    } else {
      // The quota's object limits (quota.h) stop a guest long before.
      if (slots_.size() >= kMaxHandleSlots) return 0;
      idx = static_cast<std::uint32_t>(slots_.size());
      slots_.push_back({});
      slots_.back().gen = (gen_seed_ + idx * 0x9e3779b1u) & 0xffffffu;
    }
    Slot& s = slots_[idx];
    s.gen = (s.gen + 1) & 0xffffffu;
    if (s.gen == 0) s.gen = 1;
    s.value = std::move(value);
    ++live_;
    return make_handle(kind_, s.gen, idx);
  }

  T* find(std::uint64_t h) {
    if (handle_kind(h) != kind_) return nullptr;
    std::uint32_t idx = 0;
    if (!handle_slot(h, &idx) || idx >= slots_.size()) return nullptr;
    Slot& s = slots_[idx];
    if (!s.value || s.gen != ((h >> 32) & 0xffffffu)) return nullptr;
    return &*s.value;
  }

  bool erase(std::uint64_t h) {
    if (find(h) == nullptr) return false;
    const auto idx = static_cast<std::uint32_t>(h) >> kHandleAlignBits;
    slots_[idx].value.reset();
    free_.push_back(idx);
    --live_;
    return true;
  }

  // Calls f(handle, value&) for each live entry; f may not insert or erase.
  template <class F>
  void for_each(F&& f) {
    for (std::uint32_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].value) f(make_handle(kind_, slots_[i].gen, i), *slots_[i].value);
  }

  std::size_t size() const noexcept { return live_; }

 private:
  struct Slot {
    std::uint32_t gen = 0;
    std::optional<T> value;
  };
  proto::HandleKind kind_;
  std::uint32_t gen_seed_ = 0;
  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_;
  std::size_t live_ = 0;
};

}  // namespace ivcuda::host
