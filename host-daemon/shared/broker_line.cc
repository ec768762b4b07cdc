// See from_worker.h, "the broker line".
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "host-daemon/shared/from_worker.h"
#include "host-daemon/shared/tenant_share.h"

namespace ivcuda::host {

Result<BrokerToken> new_broker_token() {
  BrokerToken t{};
  if (::getrandom(t.data(), t.size(), 0) != static_cast<ssize_t>(t.size()))
    return make_error(errno != 0 ? errno : EIO, "getrandom");
  return t;
}

namespace broker_line {

Result<void> send_packet(int sock, const void* p, std::size_t n, int fd, int flags) {
  iovec iov{const_cast<void*>(p), n};
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
  ssize_t sent;
  do {
    sent = ::sendmsg(sock, &h, MSG_NOSIGNAL | flags);
  } while (sent < 0 && errno == EINTR);
  if (sent != static_cast<ssize_t>(n)) return make_error(sent < 0 ? errno : EPROTO, "fd broker: sendmsg");
  return {};
}

Result<std::pair<std::size_t, sys::UniqueFd>> recv_packet(int sock, void* buf, std::size_t cap) {
  iovec iov{buf, cap};
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
  if (n < 0) return make_error(errno == EAGAIN ? ETIMEDOUT : errno, "fd broker: recvmsg");
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
  if (n < 4 || got.size() > 1 || (h.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0)
    return make_error(EPROTO, "fd broker: malformed message");
  sys::UniqueFd fd = got.empty() ? sys::UniqueFd{} : std::move(got[0]);
  return std::pair<std::size_t, sys::UniqueFd>{static_cast<std::size_t>(n), std::move(fd)};
}

bool valid_kind(std::uint32_t k) {
  return k == static_cast<std::uint32_t>(ShareKind::kIpcMem) || k == static_cast<std::uint32_t>(ShareKind::kIpcEvent) ||
         k == static_cast<std::uint32_t>(ShareKind::kPoolPtr);
}

}  // namespace broker_line

}  // namespace ivcuda::host
