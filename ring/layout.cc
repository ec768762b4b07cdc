#include "ring/layout.h"

#include <cerrno>
#include <cstring>

#include "ring/validate.h"

namespace ivcuda::ring {

namespace {
constexpr std::uint64_t kPage = 4096;
constexpr std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
constexpr bool pow2(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }
}  // namespace

Result<Layout> plan_layout(const LayoutParams& p) {
  if (p.channels == 0 || p.channels > abi::kMaxChannels)
    return make_error(EINVAL, "channel count must be 1.." + std::to_string(abi::kMaxChannels));
  if (!pow2(p.ring_bytes) || p.ring_bytes < 4 * abi::kCellBytes || p.ring_bytes > (1u << 30))
    return make_error(EINVAL, "ring size must be a power of two between 256 B and 1 GiB");
  if (p.staging_bytes % kPage != 0)
    return make_error(EINVAL, "staging size must be a multiple of 4 KiB");
  Layout l;
  l.shm_size = p.shm_size;
  l.channels = p.channels;
  l.ring_bytes = p.ring_bytes;
  l.staging_bytes = p.staging_bytes;
  l.channel_table_off = sizeof(abi::Superblock);
  l.rings_off = round_up(l.channel_table_off + sizeof(abi::ChannelDesc) * p.channels, kPage);
  l.channel_stride = round_up(abi::channel_rings_bytes(p.ring_bytes), kPage);
  // The arena is page-aligned in the BAR (and 2 MiB aligned when the BAR is
  // big enough, so that huge-page backing can help the GPU registration).
  const std::uint64_t rings_end = l.rings_off + l.channel_stride * p.channels;
  const std::uint64_t align = p.shm_size >= (64ull << 20) ? (2ull << 20) : kPage;
  l.arena_off = round_up(rings_end, align);
  if (l.arena_off >= p.shm_size)
    return make_error(EINVAL, "shared memory too small for " + std::to_string(p.channels) +
                                  " channels of " + std::to_string(p.ring_bytes) + " B rings");
  l.arena_size = (p.shm_size - l.arena_off) / kPage * kPage;
  if (l.arena_size / p.channels < p.staging_bytes || l.arena_size - p.channels * p.staging_bytes < kPage)
    return make_error(EINVAL, "arena too small for the staging areas plus a page-locked pool");
  return l;
}

Result<void> format_bar(std::byte* base, const Layout& l, std::uint64_t generation,
                        std::uint32_t host_peer_id, std::uint32_t host_vectors,
                        std::uint64_t features) {
  auto* sb = superblock(base);
  sb->magic = abi::kMagic;
  sb->abi_major = abi::kAbiMajor;
  sb->abi_minor = abi::kAbiMinor;
  sb->cache_line = abi::kCacheLine;
  sb->features = features;
  sb->shm_size = l.shm_size;
  sb->generation = generation;
  sb->host_peer_id = host_peer_id;
  sb->host_vectors = host_vectors;
  sb->channel_table_off = l.channel_table_off;
  sb->channel_count = l.channels;
  sb->ring_bytes = l.ring_bytes;
  sb->rings_off = l.rings_off;
  sb->channel_stride = l.channel_stride;
  sb->arena_off = l.arena_off;
  sb->arena_size = l.arena_size;
  sb->staging_bytes = l.staging_bytes;
  for (std::uint32_t c = 0; c < l.channels; ++c) {
    auto* d = channel_desc(base, l, c);
    d->staging_off = staging_off(l, c);
    d->staging_size = l.staging_bytes;
  }
  // Pairs with the acquire load in read_layout(): everything above is
  // visible to a guest that sees kHostReady.
  store_release(sb->host_state, abi::kHostReady);
  return {};
}

Result<Layout> read_layout(const std::byte* base, std::uint64_t mapped) {
  if (mapped < sizeof(abi::Superblock)) return make_error(EINVAL, "BAR smaller than a superblock");
  const auto* sbp = reinterpret_cast<const abi::Superblock*>(base);
  if (load_acquire(sbp->host_state) != abi::kHostReady)
    return make_error(EAGAIN, "daemon has not finished formatting the shared memory");
  const auto sb = copy_out<abi::Superblock>(sbp);
  if (sb.magic != abi::kMagic) return make_error(EPROTO, "bad magic: not an ivcuda BAR");
  if (sb.abi_major != abi::kAbiMajor)
    return make_error(EPROTO, "ABI major " + std::to_string(sb.abi_major) + ", this library speaks " +
                                  std::to_string(abi::kAbiMajor));
  if (sb.cache_line != abi::kCacheLine) return make_error(EPROTO, "cache-line size mismatch");
  if (sb.shm_size > mapped) return make_error(EPROTO, "superblock claims more memory than mapped");
  LayoutParams p;
  p.shm_size = sb.shm_size;
  p.channels = sb.channel_count;
  p.ring_bytes = sb.ring_bytes;
  p.staging_bytes = sb.staging_bytes;
  auto planned = plan_layout(p);
  if (!planned) return std::move(planned).error();
  const Layout& l = *planned;
  // The host must have laid it out exactly as plan_layout does.
  if (l.channel_table_off != sb.channel_table_off || l.rings_off != sb.rings_off ||
      l.channel_stride != sb.channel_stride || l.arena_off != sb.arena_off ||
      l.arena_size != sb.arena_size)
    return make_error(EPROTO, "superblock layout does not match this library's ABI");
  return planned;
}

RingView request_ring(std::byte* base, const Layout& l, std::uint32_t ch) noexcept {
  std::byte* p = base + l.rings_off + l.channel_stride * ch;
  return {reinterpret_cast<abi::RingCtl*>(p), p + sizeof(abi::RingCtl), l.ring_bytes / abi::kCellBytes};
}

RingView completion_ring(std::byte* base, const Layout& l, std::uint32_t ch) noexcept {
  std::byte* p = base + l.rings_off + l.channel_stride * ch + sizeof(abi::RingCtl) + l.ring_bytes;
  return {reinterpret_cast<abi::RingCtl*>(p), p + sizeof(abi::RingCtl), l.ring_bytes / abi::kCellBytes};
}

}  // namespace ivcuda::ring
