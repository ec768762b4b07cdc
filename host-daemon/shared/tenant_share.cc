#include "host-daemon/shared/tenant_share.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "host-daemon/shared/rules.h"

namespace ivcuda::host {

namespace {
bool same_token(const ShareToken& a, const ShareToken& b) {
  // No early exit: how far a guess matched is not told by timing.
  return ((a.w[0] ^ b.w[0]) | (a.w[1] ^ b.w[1])) == 0;
}
}  // namespace

ShareRegistry::ShareRegistry(std::uint32_t slots, std::uint32_t per_guest)
    : slots_(std::clamp<std::uint32_t>(slots, 1, kMaxSlots)), per_guest_(std::max<std::uint32_t>(per_guest, 1)) {}

std::uint32_t ShareRegistry::of_guest(std::uint32_t guest) const {
  auto it = guest_used_.find(guest);
  return it == guest_used_.end() ? 0 : it->second;
}

Result<ShareTicket> ShareRegistry::publish(const ShareEntry& e, ShareOwner owner) {
  if (e.kind == ShareKind::kFree) return make_error(EINVAL, "share registry: no kind");
  const OwnKey k{owner.line, static_cast<std::uint32_t>(e.kind), e.key};
  if (auto it = own_.find(k); it != own_.end()) return ShareTicket{it->second, slot_[it->second].token};
  // One guest's share of the tenant's room: its siblings (other processes of
  // the user or VM) keep theirs.
  if (IVCUDA_RULE("share-guest-caps") && of_guest(owner.guest) >= per_guest_)
    return make_error(ENOSPC, "share registry: the guest's share is used up");
  ShareTicket t;
  if (::getrandom(t.token.w, sizeof t.token.w, 0) != static_cast<ssize_t>(sizeof t.token.w))
    return make_error(errno != 0 ? errno : EIO, "getrandom for a share token failed");
  if (!free_.empty()) {
    t.slot = free_.back();
    free_.pop_back();
  } else if (slot_.size() < slots_ || !IVCUDA_RULE("share-tenant-caps")) {
    t.slot = static_cast<std::uint32_t>(slot_.size());
    slot_.emplace_back();
  } else {
    return make_error(ENOSPC, "share registry: the tenant's slots are used up");
  }
  Slot& s = slot_[t.slot];
  s.e = e;
  s.token = t.token;
  s.owner = owner;
  s.used = true;
  own_[k] = t.slot;
  ++guest_used_[owner.guest];
  ++used_;
  return t;
}

std::optional<ShareFound> ShareRegistry::lookup(ShareKind kind, const ShareTicket& t, std::uint64_t line) const {
  if (kind == ShareKind::kFree || t.slot >= slot_.size()) return std::nullopt;
  const Slot& s = slot_[t.slot];
  if (!s.used) return std::nullopt;
  if (IVCUDA_RULE("share-ticket") && (s.e.kind != kind || !same_token(s.token, t.token))) return std::nullopt;
  ShareFound f{s.e, s.owner.line == line};
  if (!f.mine) f.entry.key = f.entry.base = f.entry.aux = 0;
  return f;
}

void ShareRegistry::release(std::uint32_t i) {
  Slot& s = slot_[i];
  own_.erase(OwnKey{s.owner.line, static_cast<std::uint32_t>(s.e.kind), s.e.key});
  if (auto g = guest_used_.find(s.owner.guest); g != guest_used_.end() && --g->second == 0) guest_used_.erase(g);
  s = Slot{};  // the driver's handle does not linger in a free slot
  free_.push_back(i);
  --used_;
}

bool ShareRegistry::withdraw(ShareKind kind, std::uint64_t key, std::uint64_t line) {
  auto it = own_.find(OwnKey{line, static_cast<std::uint32_t>(kind), key});
  if (it == own_.end()) return false;
  release(it->second);
  return true;
}

unsigned ShareRegistry::drop_line(std::uint64_t line) {
  unsigned n = 0;
  for (std::uint32_t i = 0; i < slot_.size(); ++i)
    if (slot_[i].used && slot_[i].owner.line == line) {
      release(i);
      ++n;
    }
  return n;
}

unsigned ShareRegistry::drop_guest(std::uint32_t guest) {
  unsigned n = 0;
  for (std::uint32_t i = 0; i < slot_.size(); ++i)
    if (slot_[i].used && slot_[i].owner.guest == guest) {
      release(i);
      ++n;
    }
  return n;
}

// ------------------------------------------------------------- guest handles

namespace {
constexpr std::size_t kTicketBytes = 4 + 4 + 16;  // magic, slot, token
}

void encode_ticket(std::uint32_t magic, const ShareTicket& t, std::byte out[64]) noexcept {
  std::memset(out, 0, 64);
  std::memcpy(out, &magic, 4);
  std::memcpy(out + 4, &t.slot, 4);
  std::memcpy(out + 8, t.token.w, 16);
}

std::optional<ShareTicket> decode_ticket(std::uint32_t magic, const std::byte in[64]) noexcept {
  std::uint32_t m = 0;
  std::memcpy(&m, in, 4);
  if (m != magic) return std::nullopt;
  for (std::size_t i = kTicketBytes; i < 64; ++i)
    if (in[i] != std::byte{0}) return std::nullopt;
  ShareTicket t;
  std::memcpy(&t.slot, in + 4, 4);
  std::memcpy(t.token.w, in + 8, 16);
  return t;
}

}  // namespace ivcuda::host
