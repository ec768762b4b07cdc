#include "host-daemon/daemon/fd_broker.h"

#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "host-daemon/shared/rules.h"

namespace ivcuda::host {

using namespace broker_line;

Result<sys::UniqueFd> FdBroker::make_line(std::uint32_t guest) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    return make_error(errno, "fd broker: socketpair");
  sys::UniqueFd ours(sv[0]), theirs(sv[1]);
  // The worker's waits for an answer end (set here: a sandboxed worker
  // need not be allowed setsockopt).
  const timeval limit{static_cast<time_t>(kAnswerTimeout.count()), 0};
  if (::setsockopt(theirs.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit) != 0 ||
      ::setsockopt(theirs.get(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit) != 0)
    return make_error(errno, "fd broker: setsockopt");
  const int key = ours.get();
  lines_[key] = Line{std::move(ours), next_line_++, guest};
  ++guests_[guest].lines;
  return theirs;
}

Result<sys::UniqueFd> FdBroker::add_worker(std::uint32_t guest, Tenancy t) {
  if (auto [g, fresh] = guests_.try_emplace(guest); fresh) g->second.tenancy = t;
  return make_line(guest);
}

void FdBroker::admit(std::uint32_t guest, Tenancy t) {
  Guest& g = guests_[guest];
  if (g.tenancy.kind == Tenancy::Kind::kPending && !g.tenant) g.tenancy = t;
}

std::vector<int> FdBroker::fds() const {
  std::vector<int> v;
  for (const auto& [fd, l] : lines_) v.push_back(fd);
  return v;
}

std::size_t FdBroker::deposits_of(std::uint32_t guest) const {
  auto it = guests_.find(guest);
  return it == guests_.end() ? 0 : it->second.deposits;
}

std::size_t FdBroker::entries_of(std::uint32_t guest) const {
  auto g = guests_.find(guest);
  if (g == guests_.end() || !g->second.tenant) return 0;
  auto t = tenants_.find(*g->second.tenant);
  return t == tenants_.end() ? 0 : t->second.registry.of_guest(guest);
}

void FdBroker::close_in_child() noexcept {
  lines_.clear();
  tenants_.clear();  // other tenants' deposited fds are not the child's either
  guests_.clear();
  total_deposits_ = 0;
}

// The guest's tenant, filed at its first request that needs one (see
// fd_broker.h); null while it may share nothing yet.
FdBroker::Tenant* FdBroker::tenant_of(std::uint32_t guest, bool asks_line) {
  auto g = guests_.find(guest);
  if (g == guests_.end()) return nullptr;
  if (!g->second.tenant) {
    const Tenancy& how = g->second.tenancy;
    TenantKey k{1, guest, 0};  // the connection
    if (how.kind == Tenancy::Kind::kPending && IVCUDA_RULE("share-pending-line")) return nullptr;
    // A guest asking a line for another process's worker is a VM: never
    // filed with its user's process-mode programs.
    if (how.kind == Tenancy::Kind::kUser && !(asks_line && IVCUDA_RULE("share-vm-connection")))
      k = TenantKey{2, how.socket, how.uid};
    if (!IVCUDA_RULE("share-tenant")) k = TenantKey{3, 0, 0};  // removed: one tenant for all, as a socket was
    g->second.tenant = k;
    auto t = tenants_.find(k);
    if (t == tenants_.end())
      t = tenants_.emplace(k, Tenant{ShareRegistry(lim_.entries_per_tenant, lim_.entries_per_guest), {}, 0}).first;
    ++t->second.guests;
  }
  return &tenants_.at(*g->second.tenant);
}

void FdBroker::forget_deposits(Tenant& t, bool (*match)(const Deposit&, std::uint64_t), std::uint64_t what) {
  for (auto it = t.deposits.begin(); it != t.deposits.end();) {
    if (!match(it->second, what)) {
      ++it;
      continue;
    }
    if (auto g = guests_.find(it->second.guest); g != guests_.end() && g->second.deposits > 0) --g->second.deposits;
    --total_deposits_;
    it = t.deposits.erase(it);
  }
}

void FdBroker::drop(int fd) {
  auto it = lines_.find(fd);
  if (it == lines_.end()) return;
  const Line line = std::move(it->second);
  lines_.erase(it);
  auto g = guests_.find(line.guest);
  if (g == guests_.end()) return;
  if (g->second.lines > 0) --g->second.lines;
  if (!g->second.tenant || !IVCUDA_RULE("share-owner-end")) return;
  // Its worker ended: what it shared goes (its charges went with it).
  Tenant& t = tenants_.at(*g->second.tenant);
  forget_deposits(t, [](const Deposit& d, std::uint64_t l) { return d.line == l; }, line.id);
  (void)t.registry.drop_line(line.id);
}

void FdBroker::end_guest(std::uint32_t guest) {
  auto g = guests_.find(guest);
  if (g == guests_.end()) return;
  for (auto it = lines_.begin(); it != lines_.end();)
    it = it->second.guest == guest ? lines_.erase(it) : std::next(it);
  if (g->second.tenant && IVCUDA_RULE("share-owner-end")) {
    if (auto t = tenants_.find(*g->second.tenant); t != tenants_.end()) {
      forget_deposits(t->second, [](const Deposit& d, std::uint64_t gid) { return d.guest == gid; }, guest);
      (void)t->second.registry.drop_guest(guest);
      if (--t->second.guests == 0) tenants_.erase(t);
    }
  }
  guests_.erase(g);
}

void FdBroker::forget_shares(std::uint32_t guest) {
  auto g = guests_.find(guest);
  // The same rule as drop and end_guest: a recycled worker's guest ended too.
  if (g == guests_.end() || !g->second.tenant || !IVCUDA_RULE("share-owner-end")) return;
  if (auto t = tenants_.find(*g->second.tenant); t != tenants_.end()) {
    forget_deposits(t->second, [](const Deposit& d, std::uint64_t gid) { return d.guest == gid; }, guest);
    (void)t->second.registry.drop_guest(guest);
  }
}

void FdBroker::serve(int fd) {
  auto it = lines_.find(fd);
  if (it == lines_.end()) return;
  alignas(8) std::byte buf[kMaxMsg];
  auto got = recv_packet(fd, buf, sizeof buf);
  // Hung up, or not speaking the protocol: it gets nothing more.
  if (!got) return drop(fd);
  std::uint32_t op = 0;
  std::memcpy(&op, buf, sizeof op);
  const bool ok = op == kDeposit || op == kFetch || op == kNewLine
                      ? serve_fds(it->second, buf, got->first, std::move(got->second))
                      : !got->second.valid() && serve_share(it->second, buf, got->first);
  if (!ok) drop(fd);
}

bool FdBroker::serve_fds(Line& line, const void* msg, std::size_t n, sys::UniqueFd passed) {
  if (n != sizeof(Msg)) return false;
  Msg m;
  std::memcpy(&m, msg, sizeof m);
  if ((m.op == kDeposit) != passed.valid()) return false;  // exactly the deposit carries an fd
  Msg ans;
  ans.op = m.op;
  int give = -1;
  sys::UniqueFd far;  // kNewLine: the new line's far end, sent with the answer
  Tenant* t = tenant_of(line.guest, m.op == kNewLine);
  Guest& g = guests_.at(line.guest);
  if (t == nullptr) {
    ans.status = EACCES;
  } else if (m.op == kNewLine) {
    if (g.lines >= lim_.lines_per_guest) {
      ans.status = EMFILE;
    } else if (auto l = make_line(line.guest); l) {
      far = std::move(*l);
      give = far.get();
    } else {
      ans.status = static_cast<std::uint32_t>(l.error().code);
    }
  } else if (m.op == kDeposit) {
    if (t->deposits.count(m.token) != 0) {
      ans.status = EEXIST;
    } else if (IVCUDA_RULE("share-guest-caps") && g.deposits >= lim_.deposits_per_guest) {
      ans.status = ENOSPC;
    } else if (IVCUDA_RULE("share-tenant-caps") &&
               (t->deposits.size() >= lim_.deposits_per_tenant || total_deposits_ >= lim_.deposits)) {
      ans.status = ENOSPC;
    } else {
      t->deposits[m.token] = Deposit{std::move(passed), m.value, line.id, line.guest};
      ++g.deposits;
      ++total_deposits_;
    }
  } else {
    auto d = t->deposits.find(m.token);
    if (d == t->deposits.end()) {
      ans.status = ENOENT;
    } else {
      give = d->second.fd.get();
      ans.value = d->second.value;
    }
  }
  // The daemon never waits on a worker: one that does not read its answer
  // loses its line.
  return send_packet(line.fd.get(), &ans, sizeof ans, give, MSG_DONTWAIT).ok();
}

bool FdBroker::serve_share(Line& line, const void* msg, std::size_t n) {
  if (n != sizeof(ShareMsg)) return false;
  ShareMsg m;
  std::memcpy(&m, msg, sizeof m);
  if (m.op != kPublish && m.op != kLookup && m.op != kWithdraw) return false;
  ShareMsg ans;
  ans.op = m.op;
  Tenant* t = tenant_of(line.guest, false);
  const auto kind = static_cast<ShareKind>(m.kind);
  if (t == nullptr) {
    ans.status = EACCES;
  } else if (!valid_kind(m.kind)) {
    ans.status = EINVAL;
  } else if (m.op == kPublish) {
    ShareEntry e;
    e.kind = kind;
    e.owner_proc = m.owner_proc;
    e.key = m.key;
    e.base = m.base;
    e.size = m.size;
    e.aux = m.aux;
    std::memcpy(e.payload.data(), m.payload, sizeof m.payload);
    if (auto tk = t->registry.publish(e, ShareOwner{line.id, line.guest}); tk) {
      ans.slot = tk->slot;
      ans.token[0] = tk->token.w[0];
      ans.token[1] = tk->token.w[1];
    } else {
      ans.status = static_cast<std::uint32_t>(tk.error().code);
    }
  } else if (m.op == kLookup) {
    const ShareTicket tk{m.slot, ShareToken{{m.token[0], m.token[1]}}};
    if (auto f = t->registry.lookup(kind, tk, line.id); f) {
      ans.kind = m.kind;
      ans.owner_proc = f->entry.owner_proc;
      ans.mine = f->mine ? 1 : 0;
      ans.key = f->entry.key;
      ans.base = f->entry.base;
      ans.size = f->entry.size;
      ans.aux = f->entry.aux;
      std::memcpy(ans.payload, f->entry.payload.data(), sizeof ans.payload);
    } else {
      ans.status = ENOENT;
    }
  } else {
    ans.slot = t->registry.withdraw(kind, m.key, line.id) ? 1 : 0;
  }
  return send_packet(line.fd.get(), &ans, sizeof ans, -1, MSG_DONTWAIT).ok();
}

}  // namespace ivcuda::host
