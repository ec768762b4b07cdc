// MD2 (RFC 1319) and HMAC-MD2 (RFC 2104 with MD2's 16-byte block).
//
// Nothing here is for security: MD2 is broken. cudart's integrity check
// (guest/export_tables.cc) asks the driver for an HMAC-MD2 answer, so the guest
// library has to compute one locally.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace ivcuda::guest::md2 {

inline constexpr std::size_t kBlockSize = 16;
inline constexpr std::size_t kDigestSize = 16;
using Digest = std::array<std::uint8_t, kDigestSize>;

// Incremental MD2. finish() pads, appends the checksum and returns the digest;
// the object is then reset and can hash a new message.
class Md2 {
 public:
  void update(std::span<const std::uint8_t> data) noexcept;
  [[nodiscard]] Digest finish() noexcept;

 private:
  void absorb(const std::uint8_t* block) noexcept;  // checksum + state
  void mix(const std::uint8_t* block) noexcept;     // state only

  std::array<std::uint8_t, 48> x_{};
  std::array<std::uint8_t, kBlockSize> checksum_{};
  std::uint8_t last_ = 0;  // the checksum's running L (RFC 1319, 3.2)
  std::array<std::uint8_t, kBlockSize> pending_{};
  std::size_t pending_len_ = 0;
};

[[nodiscard]] Digest digest(std::span<const std::uint8_t> data) noexcept;

// HMAC-MD2: H((K ^ opad) || H((K ^ ipad) || msg)), ipad 0x36, opad 0x5c, with
// K the key zero-padded to 16 bytes (or MD2(key) when the key is longer).
[[nodiscard]] Digest hmac(std::span<const std::uint8_t> key, std::span<const std::uint8_t> msg) noexcept;

}  // namespace ivcuda::guest::md2
