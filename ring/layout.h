// The BAR layout: the host formats it, the guest reads and checks it, both
// find channels, rings and the arena through it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ivcuda/result.h"
#include "ivcuda/shm_abi.h"
#include "ring/spsc_ring.h"

namespace ivcuda::ring {

struct LayoutParams {
  std::uint64_t shm_size = 0;
  std::uint32_t channels = 32;
  std::uint32_t ring_bytes = 256 * 1024;       // per ring, power of two
  std::uint64_t staging_bytes = 8ull << 20;    // per channel, from the arena
};

// The layout as both sides use it (private, validated copy).
struct Layout {
  std::uint64_t shm_size = 0;
  std::uint32_t channels = 0;
  std::uint32_t ring_bytes = 0;
  std::uint64_t channel_table_off = 0;
  std::uint64_t rings_off = 0;
  std::uint64_t channel_stride = 0;
  std::uint64_t arena_off = 0;
  std::uint64_t arena_size = 0;
  std::uint64_t staging_bytes = 0;
};

// Computes the layout for params, or explains why it does not fit.
Result<Layout> plan_layout(const LayoutParams& p);

// Host: writes superblock and channel table into zeroed memory at base; the
// state word becomes kHostReady last (release). Staging offsets are assigned
// per channel from the start of the arena.
Result<void> format_bar(std::byte* base, const Layout& l, std::uint64_t generation,
                        std::uint32_t host_peer_id, std::uint32_t host_vectors,
                        std::uint64_t features);

// Guest: checks the superblock of a mapped BAR of `mapped` bytes and returns
// the layout it describes. Fails on a wrong magic, ABI major, or a layout
// that does not fit the mapping.
Result<Layout> read_layout(const std::byte* base, std::uint64_t mapped);

inline abi::Superblock* superblock(std::byte* base) noexcept {
  return reinterpret_cast<abi::Superblock*>(base);
}
inline abi::ChannelDesc* channel_desc(std::byte* base, const Layout& l, std::uint32_t ch) noexcept {
  return reinterpret_cast<abi::ChannelDesc*>(base + l.channel_table_off) + ch;
}
RingView request_ring(std::byte* base, const Layout& l, std::uint32_t ch) noexcept;
RingView completion_ring(std::byte* base, const Layout& l, std::uint32_t ch) noexcept;

// The staging area of a channel as the host assigned it.
inline std::uint64_t staging_off(const Layout& l, std::uint32_t ch) noexcept {
  return l.arena_off + std::uint64_t{ch} * l.staging_bytes;
}
// Is [off, off + len) inside channel ch's staging area? Overflow-safe.
inline bool in_staging(const Layout& l, std::uint32_t ch, std::uint64_t off, std::uint64_t len) noexcept {
  const std::uint64_t base = staging_off(l, ch);
  return ch < l.channels && off >= base && len <= l.staging_bytes && off - base <= l.staging_bytes - len;
}

// The staged-copy completion counter (ChannelDesc::staging_done).
// Host: bumps it once per staged chunk, after the chunk's copy finished; the
// release pairs with the guest's acquire in staging_done(), which makes the
// DMA'd data (DtoH) visible to the guest's memcpy out of the chunk, and orders
// the guest's next write into the chunk (HtoD) after the DMA that read it.
inline void bump_staging_done(std::byte* base, const Layout& l, std::uint32_t ch) noexcept {
  auto* d = channel_desc(base, l, ch);
  // Only the host writes the counter, so a plain read-modify-write suffices;
  // a guest that scribbles on it only confuses its own copies.
  store_release(d->staging_done, load_relaxed(d->staging_done) + 1);
}
// Guest: how many staged chunks of channel ch the host has finished.
inline std::uint64_t staging_done(std::byte* base, const Layout& l, std::uint32_t ch) noexcept {
  return load_acquire(channel_desc(base, l, ch)->staging_done);  // pairs with bump_staging_done()
}

// Arena bytes after all staging areas: the pool for page-locked memory.
inline std::uint64_t pool_off(const Layout& l) noexcept {
  return l.arena_off + std::uint64_t{l.channels} * l.staging_bytes;
}
inline std::uint64_t pool_size(const Layout& l) noexcept {
  return l.arena_size - std::uint64_t{l.channels} * l.staging_bytes;
}

}  // namespace ivcuda::ring
