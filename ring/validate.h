// Helpers every host-side reader of guest-writable memory uses.
//
// The rule: copy once out of shared memory, then decide on the copy. Never
// read a guest-writable field twice and act on both reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <type_traits>

namespace ivcuda::ring {

// [off, off + len) lies within [0, size). Written so that nothing overflows:
// `off + len <= size` would wrap for a hostile off near 2^64.
constexpr bool range_ok(std::uint64_t off, std::uint64_t len, std::uint64_t size) noexcept {
  return len <= size && off <= size - len;
}

// [addr, addr + len) lies within [base, base + size).
constexpr bool span_within(std::uint64_t addr, std::uint64_t len, std::uint64_t base,
                           std::uint64_t size) noexcept {
  return addr >= base && range_ok(addr - base, len, size);
}

// Copies a T out of shared memory. T must be trivially copyable so that any
// bit pattern is a valid object; fields are validated after the copy.
template <class T>
T copy_out(const void* shared) noexcept {
  static_assert(std::is_trivially_copyable_v<T>);
  T v;
  std::memcpy(&v, shared, sizeof v);
  return v;
}

// Reads a fixed-size request struct from the front of a record payload that
// has already been copied out of the ring. Returns nullopt if too short.
template <class T>
std::optional<T> read_struct(std::span<const std::byte> payload) noexcept {
  static_assert(std::is_trivially_copyable_v<T>);
  if (payload.size() < sizeof(T)) return std::nullopt;
  T v;
  std::memcpy(&v, payload.data(), sizeof v);
  return v;
}

}  // namespace ivcuda::ring
