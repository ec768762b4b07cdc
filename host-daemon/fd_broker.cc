#include "host-daemon/fd_broker.h"

#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ivcuda::host {

namespace {

enum : std::uint32_t { kDeposit = 1, kFetch = 2, kNewLine = 3 };

// One message each way; a deposit request and a successful fetch answer
// carry one fd.
struct Msg {
  std::uint32_t op = 0;
  std::uint32_t status = 0;  // answers: 0 or an errno value
  BrokerToken token{};
  std::uint64_t value = 0;
};
static_assert(sizeof(Msg) == 32);

Result<void> send_msg(int sock, const Msg& m, int fd, int flags) {
  iovec iov{const_cast<Msg*>(&m), sizeof m};
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    h.msg_control = ctl;
    h.msg_controllen = sizeof ctl;
    cmsghdr* c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &h, MSG_NOSIGNAL | flags);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof m)) return make_error(n < 0 ? errno : EPROTO, "fd broker: sendmsg");
  return {};
}

// Receives one message and the fd it carries, if any (-1). A message of the
// wrong size, or with more than one fd or other control data, is EPROTO
// (any fds that came with it are closed).
Result<std::pair<Msg, sys::UniqueFd>> recv_msg(int sock) {
  Msg m;
  iovec iov{&m, sizeof m};
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * 4)] = {};
  h.msg_control = ctl;
  h.msg_controllen = sizeof ctl;
  ssize_t n;
  do {
    n = ::recvmsg(sock, &h, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n == 0) return make_error(ECONNRESET, "fd broker: peer hung up");
  if (n < 0) return make_error(errno, "fd broker: recvmsg");
  std::vector<sys::UniqueFd> got;
  for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      got.emplace_back(fd);
    }
  }
  if (n != static_cast<ssize_t>(sizeof m) || got.size() > 1 || (h.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0)
    return make_error(EPROTO, "fd broker: malformed message");
  sys::UniqueFd fd = got.empty() ? sys::UniqueFd{} : std::move(got[0]);
  return std::pair<Msg, sys::UniqueFd>{m, std::move(fd)};
}

}  // namespace

Result<BrokerToken> new_broker_token() {
  BrokerToken t{};
  if (::getrandom(t.data(), t.size(), 0) != static_cast<ssize_t>(t.size()))
    return make_error(errno != 0 ? errno : EIO, "getrandom");
  return t;
}

Result<void> BrokerClient::deposit(const BrokerToken& token, int fd, std::uint64_t value) {
  if (!fd_.valid()) return make_error(ENOTCONN, "fd broker: not connected");
  Msg m;
  m.op = kDeposit;
  m.token = token;
  m.value = value;
  IVCUDA_TRY(send_msg(fd_.get(), m, fd, 0));
  IVCUDA_TRY_ASSIGN(auto ans, recv_msg(fd_.get()));
  if (ans.first.status != 0) return make_error(static_cast<int>(ans.first.status), "fd broker: deposit refused");
  return {};
}

Result<std::pair<sys::UniqueFd, std::uint64_t>> BrokerClient::fetch(const BrokerToken& token) {
  if (!fd_.valid()) return make_error(ENOTCONN, "fd broker: not connected");
  Msg m;
  m.op = kFetch;
  m.token = token;
  IVCUDA_TRY(send_msg(fd_.get(), m, -1, 0));
  IVCUDA_TRY_ASSIGN(auto ans, recv_msg(fd_.get()));
  if (ans.first.status != 0) return make_error(static_cast<int>(ans.first.status), "fd broker: no such deposit");
  if (!ans.second.valid()) return make_error(EPROTO, "fd broker: answer without an fd");
  return std::pair<sys::UniqueFd, std::uint64_t>{std::move(ans.second), ans.first.value};
}

Result<sys::UniqueFd> BrokerClient::new_line() {
  if (!fd_.valid()) return make_error(ENOTCONN, "fd broker: not connected");
  Msg m;
  m.op = kNewLine;
  IVCUDA_TRY(send_msg(fd_.get(), m, -1, 0));
  IVCUDA_TRY_ASSIGN(auto ans, recv_msg(fd_.get()));
  if (ans.first.status != 0) return make_error(static_cast<int>(ans.first.status), "fd broker: no new line");
  if (!ans.second.valid()) return make_error(EPROTO, "fd broker: answer without an fd");
  return std::move(ans.second);
}

Result<sys::UniqueFd> FdBroker::add_worker(std::uint32_t tenant) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    return make_error(errno, "fd broker: socketpair");
  ends_[sv[0]] = {sys::UniqueFd(sv[0]), tenant};
  ++tenants_[tenant].workers;
  return sys::UniqueFd(sv[1]);
}

std::vector<int> FdBroker::fds() const {
  std::vector<int> v;
  for (const auto& [fd, e] : ends_) v.push_back(fd);
  return v;
}

std::size_t FdBroker::deposits(std::uint32_t tenant) const {
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second.by_token.size();
}

void FdBroker::close_in_child() noexcept {
  for (auto& [fd, e] : ends_) e.first.reset();
  ends_.clear();
  tenants_.clear();
  total_ = 0;
}

void FdBroker::drop(int fd) {
  auto it = ends_.find(fd);
  if (it == ends_.end()) return;
  const std::uint32_t tenant = it->second.second;
  ends_.erase(it);
  auto t = tenants_.find(tenant);
  if (t != tenants_.end() && --t->second.workers == 0) {
    total_ -= t->second.by_token.size();
    tenants_.erase(t);
  }
}

void FdBroker::serve(int fd) {
  auto end = ends_.find(fd);
  if (end == ends_.end()) return;
  auto got = recv_msg(fd);
  if (!got) {  // hung up, or not speaking the protocol: it gets nothing more
    drop(fd);
    return;
  }
  auto& [m, passed] = *got;
  Tenant& t = tenants_[end->second.second];
  Msg ans;
  ans.op = m.op;
  int give = -1;
  sys::UniqueFd line;  // kNewLine: the new line's far end, sent with the answer
  if (m.op == kNewLine && !passed.valid()) {
    // A VM's supervisor asks one line per worker it starts, for the same
    // tenant. Lines are bounded per tenant: each costs the daemon an fd.
    if (t.workers >= kMaxLinesPerTenant) {
      ans.status = EMFILE;
    } else if (auto far = add_worker(end->second.second); far) {
      line = std::move(*far);
      give = line.get();
    } else {
      ans.status = static_cast<std::uint32_t>(far.error().code);
    }
  } else if (m.op == kDeposit && passed.valid()) {
    if (t.by_token.count(m.token) != 0) {
      ans.status = EEXIST;
    } else if (total_ >= kMaxDeposits && t.order.empty()) {
      ans.status = ENOSPC;
    } else {
      if (t.by_token.size() >= kMaxDepositsPerTenant || total_ >= kMaxDeposits) {
        t.by_token.erase(t.order.front());
        t.order.pop_front();
        --total_;
      }
      t.by_token[m.token] = Deposit{std::move(passed), m.value};
      t.order.push_back(m.token);
      ++total_;
    }
  } else if (m.op == kFetch && !passed.valid()) {
    auto d = t.by_token.find(m.token);
    if (d == t.by_token.end()) {
      ans.status = ENOENT;
    } else {
      give = d->second.fd.get();
      ans.value = d->second.value;
    }
  } else {
    drop(fd);
    return;
  }
  // The daemon never waits on a worker: one that does not read its answer
  // loses its line.
  if (!send_msg(fd, ans, give, MSG_DONTWAIT)) drop(fd);
}

}  // namespace ivcuda::host
