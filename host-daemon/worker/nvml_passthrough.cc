// The worker's side of NVML's pass-through queries (tools/nvml_passthrough.txt;
// the wire form in include/ivcuda/nvml_wire.h): the guest's arguments taken in
// the order of the function's parameters, the host's NVML asked on the granted
// GPU, the outputs' bytes sent back one section after another. The call of
// each row is generated (nvml_passthrough_host.inc) from nvml.h's prototype,
// as the guest's definition is; this file holds what every row shares.
//
// What a hostile request can do: name a row outside the list (INVALID_ARGUMENT),
// a device outside the grant (nvml.cc checks that first), ask for lists and
// texts larger than kPassthroughMaxBody (clamped, as the guest's library
// clamps them), or pass NVML a version or enum value it does not know. An enum
// argument becomes the C++ enum only inside the enum's range (the bit-field of
// its enumerators, generated from nvml.h: nvml_enum_ranges.h); past it the
// answer is INVALID_ARGUMENT, as NVML gives for a value it does not know, and
// inside it NVML answers for itself. A versioned struct never claims more bytes
// than nvml.h's: ARGUMENT_VERSION_MISMATCH, before NVML writes any.
#include <cstring>
#include <type_traits>
#include <vector>

#include "host-daemon/worker/nvml_api.h"
#include "nvml_enum_ranges.h"

namespace ivcuda::host {
namespace {

class PassthroughCall {
 public:
  PassthroughCall(std::uint64_t arg0, std::uint64_t arg1, std::uint32_t cap)
      : slots_{static_cast<std::uint32_t>(arg0), static_cast<std::uint32_t>(arg0 >> 32),
               static_cast<std::uint32_t>(arg1), static_cast<std::uint32_t>(arg1 >> 32)},
        room_(cap < nvml_wire::kPassthroughMaxBody ? cap : nvml_wire::kPassthroughMaxBody) {}

  template <class T>
  T in() {
    std::uint64_t v = pop();
    if constexpr (sizeof(T) > 4) v |= static_cast<std::uint64_t>(pop()) << 32;
    if constexpr (std::is_enum_v<T>) {
      if (v > EnumRange<T>::limit) {  // no value of T: what NVML answers for one it does not know
        fail(NVML_ERROR_INVALID_ARGUMENT);
        return T{};
      }
    }
    return static_cast<T>(v);
  }

  // One value out; a versioned struct gets the guest's leading `words`.
  template <class T>
  T* out(unsigned words = 1) {
    auto* p = reinterpret_cast<T*>(section(sizeof(T)));
    if constexpr (requires { p->version; }) {
      std::uint32_t w[8] = {};
      for (unsigned k = 0; k < words && k < 8; ++k) w[k] = pop();
      if ((w[0] & 0xFFFFFFu) > sizeof(T)) fail(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
      if (p != nullptr) std::memcpy(p, w, std::min<std::size_t>(sizeof(T), 4u * std::min(words, 8u)));
    }
    return p;
  }

  // A list's capacity (and whether the guest passed no array).
  std::uint32_t capacity() {
    const std::uint32_t v = pop();
    null_items_ = (v & nvml_wire::kPassthroughNullItems) != 0;
    return v & ~nvml_wire::kPassthroughNullItems;
  }
  // The list's section, `n` clamped as the guest clamps it; null where the guest passed none.
  template <class T, class N>
  T* items(N& n, bool /*first*/) {
    if (null_items_) return nullptr;
    n = static_cast<N>(nvml_wire::passthrough_items(static_cast<std::uint32_t>(n), used(), sizeof(T)));
    return reinterpret_cast<T*>(section(static_cast<std::size_t>(n) * sizeof(T)));
  }

  std::uint32_t text_length() {
    const std::uint32_t n = pop();
    return n < nvml_wire::kPassthroughMaxText ? n : nvml_wire::kPassthroughMaxText;
  }
  char* text(std::size_t n) { return reinterpret_cast<char*>(section(n)); }
  // A buffer's size in bytes, clamped as the guest clamps it (to the room left).
  std::uint32_t raw_length() {
    const std::uint32_t n = pop();
    const std::size_t room = nvml_wire::kPassthroughMaxBody - std::min<std::size_t>(used(), nvml_wire::kPassthroughMaxBody);
    return n < room ? n : static_cast<std::uint32_t>(room);
  }

  int error() const { return err_; }
  void set_count(std::uint64_t n) { count_ = n; }
  std::uint64_t count() const { return count_; }

  void finish(std::vector<std::byte>* out) const {
    out->clear();
    for (const auto& s : sections_) out->insert(out->end(), s.begin(), s.end());
  }

 private:
  std::uint32_t pop() {
    if (next_ == nvml_wire::kPassthroughSlots) {
      fail(NVML_ERROR_INVALID_ARGUMENT);
      return 0;
    }
    return slots_[next_++];
  }
  void fail(int e) {
    if (err_ == NVML_SUCCESS) err_ = e;
  }
  std::size_t used() const {
    std::size_t n = 0;
    for (const auto& s : sections_) n += s.size();
    return n;
  }
  std::byte* section(std::size_t bytes) {
    if (used() + bytes > room_) {  // more than the guest takes: not a request its library makes
      fail(NVML_ERROR_INVALID_ARGUMENT);
      return nullptr;
    }
    sections_.emplace_back(bytes, std::byte{0});
    return sections_.back().data();
  }

  std::uint32_t slots_[nvml_wire::kPassthroughSlots];
  unsigned next_ = 0;
  std::size_t room_;
  std::vector<std::vector<std::byte>> sections_;
  bool null_items_ = false;
  int err_ = NVML_SUCCESS;
  std::uint64_t count_ = 0;
};

#define IVCUDA_NVML_PASSTHROUGH_CALLS
#include "nvml_passthrough_host.inc"
#undef IVCUDA_NVML_PASSTHROUGH_CALLS

}  // namespace

int nvml_passthrough_kind(std::uint32_t fn) {
  if (fn < nvml_wire::kPassthroughBase || fn - nvml_wire::kPassthroughBase >= kPassthroughRows) return -1;
  return passthrough_kind(fn - nvml_wire::kPassthroughBase);
}

int nvml_passthrough(const NvmlApi& a, std::uint32_t fn, nvmlDevice_t h, std::uint64_t arg0, std::uint64_t arg1,
                     std::uint32_t cap, std::uint64_t* count, std::vector<std::byte>* out) {
  if (nvml_passthrough_kind(fn) < 0) return NVML_ERROR_INVALID_ARGUMENT;
  PassthroughCall p(arg0, arg1, cap);
  const int st = passthrough_call(a, fn - nvml_wire::kPassthroughBase, h, p);
  *count = p.count();
  if (st == NVML_SUCCESS) p.finish(out);
  return st;
}

}  // namespace ivcuda::host
