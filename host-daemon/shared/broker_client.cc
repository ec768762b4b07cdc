// See broker_client.h.
#include "host-daemon/shared/broker_client.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <cerrno>
#include <cstring>

namespace ivcuda::host {

using namespace broker_line;

template <class M>
Result<M> BrokerClient::ask(const M& m, int fd_out, sys::UniqueFd* fd_in) {
  if (!fd_.valid()) return make_error(ENOTCONN, "fd broker: not connected");
  if (auto st = send_packet(fd_.get(), &m, sizeof m, fd_out, 0); !st) {
    fd_.reset();
    return make_error(st.error().code, st.error().what);
  }
  alignas(8) std::byte buf[kMaxMsg];
  auto got = recv_packet(fd_.get(), buf, sizeof buf);
  M ans;
  if (got && got->first == sizeof ans) std::memcpy(&ans, buf, sizeof ans);
  if (!got || got->first != sizeof ans || ans.op != m.op) {
    fd_.reset();
    return make_error(got ? EPROTO : got.error().code, "fd broker: no answer");
  }
  if (fd_in != nullptr) *fd_in = std::move(got->second);
  return ans;
}

Result<void> BrokerClient::deposit(const BrokerToken& token, int fd, std::uint64_t value) {
  Msg m;
  m.op = kDeposit;
  m.token = token;
  m.value = value;
  IVCUDA_TRY_ASSIGN(const Msg ans, ask(m, fd, nullptr));
  if (ans.status != 0) return make_error(static_cast<int>(ans.status), "fd broker: deposit refused");
  return {};
}

Result<std::pair<sys::UniqueFd, std::uint64_t>> BrokerClient::fetch(const BrokerToken& token) {
  Msg m;
  m.op = kFetch;
  m.token = token;
  sys::UniqueFd fd;
  IVCUDA_TRY_ASSIGN(const Msg ans, ask(m, -1, &fd));
  if (ans.status != 0) return make_error(static_cast<int>(ans.status), "fd broker: no such deposit");
  if (!fd.valid()) return make_error(EPROTO, "fd broker: answer without an fd");
  return std::pair<sys::UniqueFd, std::uint64_t>{std::move(fd), ans.value};
}

Result<sys::UniqueFd> BrokerClient::new_line() {
  Msg m;
  m.op = kNewLine;
  sys::UniqueFd fd;
  IVCUDA_TRY_ASSIGN(const Msg ans, ask(m, -1, &fd));
  if (ans.status != 0) return make_error(static_cast<int>(ans.status), "fd broker: no new line");
  if (!fd.valid()) return make_error(EPROTO, "fd broker: answer without an fd");
  return fd;
}

Result<ShareTicket> BrokerClient::publish(const ShareEntry& e) {
  ShareMsg m;
  m.op = kPublish;
  m.kind = static_cast<std::uint32_t>(e.kind);
  m.owner_proc = e.owner_proc;
  m.key = e.key;
  m.base = e.base;
  m.size = e.size;
  m.aux = e.aux;
  std::memcpy(m.payload, e.payload.data(), sizeof m.payload);
  IVCUDA_TRY_ASSIGN(const ShareMsg ans, ask(m, -1, nullptr));
  if (ans.status != 0) return make_error(static_cast<int>(ans.status), "share registry: not published");
  return ShareTicket{ans.slot, ShareToken{{ans.token[0], ans.token[1]}}};
}

Result<ShareFound> BrokerClient::lookup(ShareKind kind, const ShareTicket& t) {
  ShareMsg m;
  m.op = kLookup;
  m.kind = static_cast<std::uint32_t>(kind);
  m.slot = t.slot;
  m.token[0] = t.token.w[0];
  m.token[1] = t.token.w[1];
  IVCUDA_TRY_ASSIGN(const ShareMsg ans, ask(m, -1, nullptr));
  if (ans.status != 0) return make_error(static_cast<int>(ans.status), "share registry: no such entry");
  ShareFound f;
  f.entry.kind = kind;
  f.entry.owner_proc = ans.owner_proc;
  f.entry.key = ans.key;
  f.entry.base = ans.base;
  f.entry.size = ans.size;
  f.entry.aux = ans.aux;
  std::memcpy(f.entry.payload.data(), ans.payload, sizeof ans.payload);
  f.mine = ans.mine != 0;
  return f;
}

Result<void> BrokerClient::withdraw(ShareKind kind, std::uint64_t key) {
  ShareMsg m;
  m.op = kWithdraw;
  m.kind = static_cast<std::uint32_t>(kind);
  m.key = key;
  IVCUDA_TRY_ASSIGN(const ShareMsg ans, ask(m, -1, nullptr));
  if (ans.status != 0) return make_error(static_cast<int>(ans.status), "share registry: withdraw refused");
  return {};
}

}  // namespace ivcuda::host
