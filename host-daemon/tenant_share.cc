#include "host-daemon/tenant_share.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "host-daemon/rules.h"

namespace ivcuda::host {

namespace {
constexpr std::uint64_t kRegionMagic = 0x5441524853564931ull;  // "1IVSHRAT"

// A slot as it lies in the shared region. `kind` is written last on publish
// and first on withdraw, so a holder that dies mid-update leaves either a
// free slot or a complete one.
struct Slot {
  std::uint32_t kind;
  std::int32_t owner_pid;
  std::uint32_t owner_guest;
  std::uint32_t owner_proc;
  std::uint64_t token[2];
  std::uint64_t key;
  std::uint64_t base;
  std::uint64_t size;
  std::byte payload[64];
  std::uint64_t aux;
};
static_assert(sizeof(Slot) == 128);

bool same_token(const std::uint64_t a[2], const ShareToken& b) {
  // No early exit: how far a guess matched is not told by timing.
  return ((a[0] ^ b.w[0]) | (a[1] ^ b.w[1])) == 0;
}

ShareEntry to_entry(const Slot& s) {
  ShareEntry e;
  e.kind = static_cast<ShareKind>(s.kind);
  e.owner_pid = s.owner_pid;
  e.owner_guest = s.owner_guest;
  e.owner_proc = s.owner_proc;
  e.key = s.key;
  e.base = s.base;
  e.size = s.size;
  e.aux = s.aux;
  std::memcpy(e.payload.data(), s.payload, sizeof s.payload);
  return e;
}
}  // namespace

// Every worker of the tenant can write the region, so its own header is not
// believed: the slot count each process uses is its private copy.
struct TenantShare::Region {
  std::uint64_t magic;
  std::uint32_t slots;
  std::uint32_t used;
  pthread_mutex_t mu;
  Slot slot[1];  // `slots` of them
};

// Holds the registry's lock. A previous holder that died is forgiven: every
// slot is either free or complete (see Slot).
struct TenantShare::Locked {
  explicit Locked(Region* r, int timeout_ms = -1) : r_(r) {
    int rc;
    if (timeout_ms < 0) {
      rc = pthread_mutex_lock(&r->mu);
    } else {
      timespec until{};
      clock_gettime(CLOCK_REALTIME, &until);
      until.tv_sec += timeout_ms / 1000;
      until.tv_nsec += static_cast<long>(timeout_ms % 1000) * 1000000;
      if (until.tv_nsec >= 1000000000) {
        until.tv_sec += 1;
        until.tv_nsec -= 1000000000;
      }
      rc = pthread_mutex_timedlock(&r->mu, &until);
    }
    if (rc == EOWNERDEAD) {
      pthread_mutex_consistent(&r->mu);
      rc = 0;
    }
    held_ = rc == 0;
  }
  ~Locked() {
    if (held_) pthread_mutex_unlock(&r_->mu);
  }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;
  bool held() const noexcept { return held_; }

 private:
  Region* r_;
  bool held_ = false;
};

Result<std::unique_ptr<TenantShare>> TenantShare::create(std::uint32_t slots) {
  if (slots == 0 || slots > (1u << 20)) return make_error(EINVAL, "registry slots out of range");
  const std::size_t bytes = offsetof(Region, slot) + std::size_t{slots} * sizeof(Slot);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return make_error(errno, std::string("tenant registry: mmap: ") + std::strerror(errno));
  auto* r = static_cast<Region*>(p);  // zero-filled: every slot free
  r->magic = kRegionMagic;
  r->slots = slots;
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  const int rc = pthread_mutex_init(&r->mu, &a);
  pthread_mutexattr_destroy(&a);
  if (rc != 0) {
    ::munmap(p, bytes);
    return make_error(rc, std::string("tenant registry: mutex: ") + std::strerror(rc));
  }
  return std::unique_ptr<TenantShare>(new TenantShare(r, bytes, slots));
}

TenantShare::~TenantShare() { unmap(); }

void TenantShare::unmap() noexcept {
  if (r_ != nullptr) ::munmap(r_, bytes_);
  r_ = nullptr;
}

std::uint32_t TenantShare::capacity() const noexcept { return r_ == nullptr ? 0 : slots_; }

std::uint32_t TenantShare::in_use() {
  if (r_ == nullptr) return 0;
  Locked lk(r_);
  return lk.held() ? r_->used : 0;
}

Result<ShareTicket> TenantShare::publish(const ShareEntry& e) {
  if (r_ == nullptr) return make_error(ENODEV, "no tenant registry");
  ShareTicket t;
  // Drawn before the lock: getrandom may block early at boot, never after.
  if (::getrandom(t.token.w, sizeof t.token.w, 0) != static_cast<ssize_t>(sizeof t.token.w))
    return make_error(errno, "getrandom for a share token failed");
  Locked lk(r_);
  if (!lk.held()) return make_error(EDEADLK, "tenant registry lock");
  for (std::uint32_t i = 0; i < slots_; ++i) {
    Slot& s = r_->slot[i];
    if (s.kind != 0) continue;
    s.owner_pid = static_cast<std::int32_t>(::getpid());
    s.owner_guest = e.owner_guest;
    s.owner_proc = e.owner_proc;
    s.token[0] = t.token.w[0];
    s.token[1] = t.token.w[1];
    s.key = e.key;
    s.base = e.base;
    s.size = e.size;
    s.aux = e.aux;
    std::memcpy(s.payload, e.payload.data(), sizeof s.payload);
    __atomic_store_n(&s.kind, static_cast<std::uint32_t>(e.kind), __ATOMIC_RELEASE);
    ++r_->used;
    t.slot = i;
    return t;
  }
  return make_error(ENOSPC, "tenant registry full");
}

std::optional<ShareTicket> TenantShare::find_own(ShareKind kind, std::uint64_t key) {
  if (r_ == nullptr) return std::nullopt;
  const auto me = static_cast<std::int32_t>(::getpid());
  Locked lk(r_);
  if (!lk.held()) return std::nullopt;
  for (std::uint32_t i = 0; i < slots_; ++i) {
    const Slot& s = r_->slot[i];
    if (s.kind == static_cast<std::uint32_t>(kind) && s.owner_pid == me && s.key == key)
      return ShareTicket{i, ShareToken{{s.token[0], s.token[1]}}};
  }
  return std::nullopt;
}

std::optional<ShareEntry> TenantShare::lookup(ShareKind kind, const ShareTicket& t) {
  if (r_ == nullptr || kind == ShareKind::kFree || t.slot >= slots_) return std::nullopt;
  Locked lk(r_);
  if (!lk.held()) return std::nullopt;
  const Slot& s = r_->slot[t.slot];
  if (IVCUDA_RULE("share-ticket") && (s.kind != static_cast<std::uint32_t>(kind) || !same_token(s.token, t.token)))
    return std::nullopt;
  return to_entry(s);
}

unsigned TenantShare::withdraw(ShareKind kind, std::uint64_t key) {
  if (r_ == nullptr) return 0;
  const auto me = static_cast<std::int32_t>(::getpid());
  Locked lk(r_);
  if (!lk.held()) return 0;
  unsigned n = 0;
  for (std::uint32_t i = 0; i < slots_; ++i) {
    Slot& s = r_->slot[i];
    if (s.kind != static_cast<std::uint32_t>(kind) || s.owner_pid != me || s.key != key) continue;
    __atomic_store_n(&s.kind, 0u, __ATOMIC_RELEASE);
    std::memset(&s, 0, sizeof s);
    --r_->used;
    ++n;
  }
  return n;
}

int TenantShare::withdraw_owner(pid_t pid, int timeout_ms) {
  if (r_ == nullptr) return 0;
  Locked lk(r_, timeout_ms);
  if (!lk.held()) return -1;
  int n = 0;
  for (std::uint32_t i = 0; i < slots_; ++i) {
    Slot& s = r_->slot[i];
    if (s.kind == 0 || s.owner_pid != static_cast<std::int32_t>(pid)) continue;
    __atomic_store_n(&s.kind, 0u, __ATOMIC_RELEASE);
    std::memset(&s, 0, sizeof s);
    if (r_->used > 0) --r_->used;
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
