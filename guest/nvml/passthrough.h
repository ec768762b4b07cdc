// The guest's side of the pass-through queries (tools/nvml_passthrough.txt):
// each generated definition (nvml_passthrough.cc, from the function's
// prototype in nvml.h) builds one Passthrough in the order of its parameters
// and runs it. The wire form is in include/ivcuda/nvml_wire.h; the worker's
// side, host-daemon/worker/nvml_passthrough.cc, takes the arguments in the same order.
//
// What the caller gets is what NVIDIA's library gives: the host NVML's code,
// and the outputs written only on success (a list's count also on
// NVML_ERROR_INSUFFICIENT_SIZE, as NVML's lists say how much room they need).
// A null output, a null count or text buffer answer NVML_ERROR_INVALID_ARGUMENT
// here, as NVML does, without a round trip.
#pragma once

#include <nvml.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "guest/nvml/internal.h"

namespace ivcuda::nvml {

class Passthrough {
 public:
  Passthrough(std::uint32_t row, const char* name) noexcept : row_(row), name_(name) {}

  void device(nvmlDevice_t d) noexcept {
    unsigned i = 0;
    fail(check_device(d, &i));
    device_ = static_cast<int>(i);
  }

  // A by-value argument: one slot, two for a 64-bit one.
  template <class T>
  void in(T v) noexcept {
    static_assert(std::is_integral_v<T> || std::is_enum_v<T>, "a pass-through input is a number");
    const auto u = static_cast<std::uint64_t>(v);
    slot(static_cast<std::uint32_t>(u));
    if constexpr (sizeof(T) > 4) slot(static_cast<std::uint32_t>(u >> 32));
  }

  // One value out. A versioned struct sends its version (and `words` - 1 more
  // of its leading 32-bit words, where the caller fills them in).
  template <class T>
  void out(T* p, unsigned words = 1) noexcept {
    if (p == nullptr) return fail(NVML_ERROR_INVALID_ARGUMENT);
    std::size_t copy = sizeof(T);
    if constexpr (requires { p->version; }) {
      static_assert(offsetof(T, version) == 0, "NVML's versioned structs start with their version");
      std::uint32_t w[8] = {};
      std::memcpy(w, p, std::min<std::size_t>(sizeof w, std::min<std::size_t>(sizeof(T), 4u * words)));
      for (unsigned k = 0; k < words && k < 8; ++k) slot(w[k]);
      // The caller's struct may be an older, smaller version: never more than it says.
      const std::size_t said = p->version & 0xFFFFFFu;
      if (said != 0 && said < copy) copy = said;
    }
    add(p, sizeof(T), copy, Kind::kValue);
  }

  // A list whose capacity is *count (in) and entry count *count (out).
  template <class T>
  void items(T* p, unsigned* count) noexcept {
    if (count == nullptr) return fail(NVML_ERROR_INVALID_ARGUMENT);
    list(p, *count, sizeof(T));
    count_ = count;
  }
  // A list of `size` entries (a by-value size).
  template <class T>
  void items_sized(T* p, unsigned size) noexcept {
    list(p, size, sizeof(T));
    fixed_list_ = true;
  }
  // A second list sharing the first one's count.
  template <class T>
  void more_items(T* p) noexcept {
    if (items_null_) return;
    const std::uint32_t n = nvml_wire::passthrough_items(list_n_, used_, sizeof(T));
    list_n_ = n;
    add(p, n * sizeof(T), n * sizeof(T), Kind::kList, sizeof(T));
  }
  // A text buffer of `length` bytes.
  void text(char* buf, unsigned length) noexcept {
    if (buf == nullptr) return fail(NVML_ERROR_INVALID_ARGUMENT);
    slot(length);
    const unsigned n = length < nvml_wire::kPassthroughMaxText ? length : nvml_wire::kPassthroughMaxText;
    add(buf, n, n, Kind::kText);
  }
  // A buffer of `size` bytes (a size in bytes, not entries), all of it coming back.
  void raw(void* p, unsigned size) noexcept {
    if (p == nullptr) return fail(NVML_ERROR_INVALID_ARGUMENT);
    slot(size);
    const std::size_t room = nvml_wire::kPassthroughMaxBody - used_;
    const std::size_t n = size < room ? size : room;
    add(p, n, n, Kind::kValue);
  }
  // A text buffer whose size nvml.h fixes.
  void chars(char* buf, unsigned n) noexcept {
    if (buf == nullptr) return fail(NVML_ERROR_INVALID_ARGUMENT);
    add(buf, n, n, Kind::kText);
  }

  nvmlReturn_t run() noexcept;

 private:
  enum class Kind { kValue, kList, kText };
  struct Section {
    void* dst;
    std::size_t bytes;  // on the wire
    std::size_t copy;   // into dst
    Kind kind;
    std::size_t elem;
  };

  void fail(nvmlReturn_t r) noexcept {
    if (err_ == NVML_SUCCESS) err_ = r;
  }
  void slot(std::uint32_t v) noexcept {
    if (nslots_ == nvml_wire::kPassthroughSlots) return fail(NVML_ERROR_UNKNOWN);  // the generator's to prevent
    slots_[nslots_++] = v;
  }
  void list(void* p, unsigned asked, std::size_t elem) noexcept {
    asked &= ~nvml_wire::kPassthroughNullItems;
    slot(asked | (p == nullptr ? nvml_wire::kPassthroughNullItems : 0));
    items_null_ = p == nullptr;
    if (items_null_) return;
    list_n_ = nvml_wire::passthrough_items(asked, used_, elem);
    add(p, list_n_ * elem, list_n_ * elem, Kind::kList, elem);
  }
  void add(void* dst, std::size_t bytes, std::size_t copy, Kind k, std::size_t elem = 0) noexcept {
    if (nsections_ == kMaxSections || used_ + bytes > nvml_wire::kPassthroughMaxBody) return fail(NVML_ERROR_UNKNOWN);
    sections_[nsections_++] = {dst, bytes, copy, k, elem};
    used_ += bytes;
  }

  static constexpr unsigned kMaxSections = 8;
  std::uint32_t row_;
  const char* name_;
  int device_ = nvml_wire::kNoDevice;
  nvmlReturn_t err_ = NVML_SUCCESS;
  std::uint32_t slots_[nvml_wire::kPassthroughSlots] = {};
  unsigned nslots_ = 0;
  Section sections_[kMaxSections] = {};
  unsigned nsections_ = 0;
  std::size_t used_ = 0;
  unsigned* count_ = nullptr;  // a list's in/out count
  bool fixed_list_ = false;    // a list of a by-value size: all of it comes back
  bool items_null_ = false;
  std::uint32_t list_n_ = 0;   // the list's capacity as sent
};

}  // namespace ivcuda::nvml
