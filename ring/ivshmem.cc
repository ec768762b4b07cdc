#include "ring/ivshmem.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <thread>
#include <unistd.h>

#include "host-daemon/shared/rules.h"  // IVCUDA_RULE: host-side rules enforced here (docs/security.md)

namespace ivcuda::ivshmem {
namespace {

using Clock = std::chrono::steady_clock;

// A message carries at most one fd; room for a few more lets us take (and
// close) what a broken sender attached instead of leaving the kernel to
// truncate, so the error names the real count.
constexpr std::size_t kMaxFdsPerRecv = 4;
// A guest that stops reading must not wedge the daemon inside a greeting.
constexpr int kSendTimeoutMs = 5000;

Error sys_error(const std::string& what) {
  const int err = errno;
  return make_error(err, what + ": " + sys::errno_string(err));
}

Error proto_error(const std::string& what) { return make_error(EPROTO, "ivshmem: " + what); }

// poll() timeout until `deadline`, rounded up so that we never wake early
// and spin; -1 for "no deadline".
int ms_until(std::optional<Clock::time_point> deadline) {
  if (!deadline) return -1;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<std::chrono::milliseconds::rep>(left.count(), INT_MAX));
}

Result<sockaddr_un> unix_address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  // Abstract names (leading NUL) are not supported: QEMU's chardev takes a path.
  if (path.empty() || path.find('\0') != std::string::npos)
    return make_error(EINVAL, "ivshmem: invalid socket path");
  if (path.size() >= sizeof a.sun_path)
    return make_error(ENAMETOOLONG, "ivshmem: socket path longer than " +
                                        std::to_string(sizeof a.sun_path - 1) + " bytes: " + path);
  std::memcpy(a.sun_path, path.data(), path.size());
  return a;
}

int unix_connect(int fd, const sockaddr_un& a) {
  int r;
  do {
    r = ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
  } while (r != 0 && errno == EINTR);
  return r;
}

void encode(std::int64_t v, unsigned char (&b)[8]) {
  const auto u = static_cast<std::uint64_t>(v);
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(u >> (8 * i));
}

std::int64_t decode(const unsigned char (&b)[8]) {
  std::uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u |= static_cast<std::uint64_t>(b[i]) << (8 * i);
  return static_cast<std::int64_t>(u);
}

}  // namespace

// ---------------------------------------------------------------------------
// Message primitives.

Result<void> send_msg(int sock, std::int64_t value, int fd) {
  unsigned char bytes[8];
  encode(value, bytes);
  alignas(cmsghdr) unsigned char ctrl[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{bytes, sizeof bytes};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (fd >= 0) {
    mh.msg_control = ctrl;
    mh.msg_controllen = sizeof ctrl;
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  std::size_t sent = 0;
  while (sent < sizeof bytes) {
    iov.iov_base = bytes + sent;
    iov.iov_len = sizeof bytes - sent;
    const ssize_t n = ::sendmsg(sock, &mh, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return make_error(ETIMEDOUT, "ivshmem: send timed out: the peer does not read");
      return sys_error("ivshmem: sendmsg");
    }
    sent += static_cast<std::size_t>(n);
    // The fd travelled with the first byte; the rest must not carry another.
    mh.msg_control = nullptr;
    mh.msg_controllen = 0;
  }
  return {};
}

Result<std::optional<Message>> MessageReader::try_read(int sock) {
  while (have_ < sizeof buf_) {
    // Ask for no more than this message's bytes: an fd is delivered with the
    // first read of the bytes it was sent with, so reading across a message
    // boundary could attach the next message's fd to this one.
    iovec iov{buf_ + have_, sizeof buf_ - have_};
    alignas(cmsghdr) unsigned char ctrl[CMSG_SPACE(sizeof(int) * kMaxFdsPerRecv)];
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctrl;
    mh.msg_controllen = sizeof ctrl;
    const ssize_t n = ::recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return std::optional<Message>{};
      return sys_error("ivshmem: recvmsg");
    }
    // Own every fd that arrived before judging anything, so that each error
    // path below closes them.
    std::vector<sys::UniqueFd> fds;
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        fds.emplace_back(fd);
      }
    }
    if ((mh.msg_flags & MSG_CTRUNC) != 0) {
      have_ = 0;
      fd_.reset();
      return proto_error("message carried more fds than fit (control data truncated)");
    }
    if (n == 0) {
      const std::size_t had = std::exchange(have_, 0);
      fd_.reset();
      if (had == 0) return make_error(ECONNRESET, "ivshmem: peer closed the connection");
      return proto_error("peer closed the connection in the middle of a message (" +
                         std::to_string(had) + " of 8 bytes)");
    }
    if (fds.size() > 1 || (fds.size() == 1 && fd_.valid())) {
      const std::size_t total = fds.size() + (fd_.valid() ? 1 : 0);
      have_ = 0;
      fd_.reset();
      return proto_error("one message carried " + std::to_string(total) + " fds");
    }
    if (fds.size() == 1) fd_ = std::move(fds.front());
    have_ += static_cast<std::size_t>(n);
  }
  Message m;
  m.value = decode(buf_);
  m.fd = std::move(fd_);
  have_ = 0;
  return std::optional<Message>(std::move(m));
}

Result<Message> MessageReader::read(int sock, Clock::time_point deadline) {
  for (;;) {
    IVCUDA_TRY_ASSIGN(std::optional<Message> m, try_read(sock));
    if (m) return std::move(*m);
    const int ms = ms_until(deadline);
    if (ms == 0) return make_error(ETIMEDOUT, "ivshmem: timed out waiting for a message");
    pollfd p{sock, POLLIN, 0};
    if (::poll(&p, 1, ms) < 0 && errno != EINTR) return sys_error("ivshmem: poll");
  }
}

Result<Message> recv_msg(int sock, std::chrono::milliseconds timeout) {
  MessageReader r;
  return r.read(sock, Clock::now() + timeout);
}

// ---------------------------------------------------------------------------
// Client side.

Result<std::optional<PeerEvent>> IvshmemClient::apply(Message m) {
  if (m.value == kShmMessage) {
    if (!m.fd.valid()) return proto_error("shared-memory message (-1) carries no fd");
    if (shm_.valid()) return proto_error("server sent a second shared-memory fd");
    IVCUDA_TRY_ASSIGN(const std::uint64_t size, sys::file_size(m.fd.get()));
    if (size == 0) return proto_error("shared memory has size 0");
    shm_ = std::move(m.fd);
    shm_size_ = size;
    return std::optional<PeerEvent>{};
  }
  if (m.value < 0 || m.value > kMaxPeerId)
    return proto_error("invalid peer id " + std::to_string(m.value));
  if (!m.fd.valid()) {
    if (m.value == id_) return proto_error("server announced our own id as gone");
    // An unknown peer leaving is harmless: QEMU ignores it as well.
    peers_.erase(m.value);
    return std::optional<PeerEvent>(PeerEvent{m.value, std::nullopt});
  }
  if (IVCUDA_RULE("peer-eventfd-cap") && m.value != id_ && peers_.count(m.value) == 0 && peers_.size() >= max_peers_) {
    ++ignored_;  // m.fd closes here: a peer beyond the bound stays unknown
    return std::optional<PeerEvent>{};
  }
  std::vector<sys::UniqueFd>& fds = m.value == id_ ? own_ : peers_[m.value];
  const std::size_t limit = m.value == id_ ? vectors_ : kMaxVectors;
  if (fds.size() >= limit)
    return proto_error("more than " + std::to_string(limit) + " eventfds for peer " +
                       std::to_string(m.value) + (m.value == id_ ? " (our own vectors)" : ""));
  fds.push_back(std::move(m.fd));
  return std::optional<PeerEvent>(PeerEvent{m.value, fds.size() - 1});
}

Result<std::vector<PeerEvent>> IvshmemClient::process_pending() {
  if (!sock_.valid()) return make_error(EBADF, "ivshmem: client is not connected");
  std::vector<PeerEvent> events;
  for (;;) {
    IVCUDA_TRY_ASSIGN(std::optional<Message> m, reader_.try_read(sock_.get()));
    if (!m) return events;
    IVCUDA_TRY_ASSIGN(std::optional<PeerEvent> e, apply(std::move(*m)));
    if (e) events.push_back(*e);
  }
}

Result<void> IvshmemClient::notify(std::int64_t peer, std::size_t vector) const {
  const std::vector<sys::UniqueFd>* fds = &own_;
  if (peer != id_) {
    const auto it = peers_.find(peer);
    if (it == peers_.end()) return make_error(ENOENT, "ivshmem: no peer " + std::to_string(peer));
    fds = &it->second;
  }
  if (vector >= fds->size())
    return make_error(ERANGE, "ivshmem: peer " + std::to_string(peer) + " has no vector " +
                                  std::to_string(vector));
  sys::eventfd_signal((*fds)[vector].get());
  return {};
}

Result<IvshmemClient> ivshmem_client_handshake(sys::UniqueFd sock, std::size_t vectors,
                                               std::chrono::milliseconds timeout, const VectorsOf& vectors_of,
                                               std::size_t max_peers) {
  if (vectors > kMaxVectors)
    return make_error(EINVAL, "ivshmem: at most " + std::to_string(kMaxVectors) + " vectors");
  const auto deadline = Clock::now() + timeout;
  IvshmemClient c;
  c.sock_ = std::move(sock);
  c.vectors_ = vectors;
  c.max_peers_ = max_peers;

  IVCUDA_TRY_ASSIGN(Message version, c.reader_.read(c.sock_.get(), deadline));
  if (version.value != kProtocolVersion)
    return proto_error("server speaks protocol version " + std::to_string(version.value) +
                       ", expected " + std::to_string(kProtocolVersion));
  if (version.fd.valid()) return proto_error("version message carries an fd");

  IVCUDA_TRY_ASSIGN(Message own, c.reader_.read(c.sock_.get(), deadline));
  if (own.fd.valid()) return proto_error("own-id message carries an fd");
  if (own.value < 0 || own.value > kMaxPeerId)
    return proto_error("invalid own id " + std::to_string(own.value));
  c.id_ = own.value;

  // QEMU accepts the remaining messages in any order, so do we.
  while (!c.greeting_complete()) {
    auto m = c.reader_.read(c.sock_.get(), deadline);
    if (!m.ok()) {
      if (m.error().code != ETIMEDOUT) return std::move(m).error();
      return make_error(ETIMEDOUT, "ivshmem: greeting incomplete after " +
                                       std::to_string(timeout.count()) + " ms: " +
                                       (c.shm_.valid() ? "" : "no shared memory, ") +
                                       std::to_string(c.own_.size()) + " of " +
                                       std::to_string(vectors) + " own eventfds");
    }
    IVCUDA_TRY(c.apply(std::move(m).value()));
    if (vectors == 0 && c.vectors_ == 0 && c.shm_.valid()) {
      if (!vectors_of) return make_error(EINVAL, "ivshmem: vectors 0 needs a way to learn them");
      IVCUDA_TRY_ASSIGN(const std::size_t n, vectors_of(c.shm_.get()));
      if (n == 0 || n > kMaxVectors)
        return proto_error("the shared memory announces " + std::to_string(n) + " vectors");
      c.vectors_ = n;
      vectors = n;
    }
  }
  // The greeting arrives in one burst: take what is already queued now, so a
  // mismatch such as surplus own eventfds fails here and not at some later call.
  IVCUDA_TRY(c.process_pending());
  return c;
}

Result<IvshmemClient> ivshmem_connect(const std::string& path, std::chrono::milliseconds timeout,
                                      std::size_t vectors, const VectorsOf& vectors_of, std::size_t max_peers) {
  const auto deadline = Clock::now() + timeout;
  IVCUDA_TRY_ASSIGN(const sockaddr_un addr, unix_address(path));
  sys::UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!sock.valid()) return sys_error("ivshmem: socket");
  // A non-blocking connect to a UNIX socket fails with EAGAIN while the
  // server's backlog is full, instead of blocking with no bound.
  while (unix_connect(sock.get(), addr) != 0) {
    if (errno != EAGAIN) return sys_error("ivshmem: connect to " + path);
    if (ms_until(deadline) == 0)
      return make_error(ETIMEDOUT, "ivshmem: server at " + path + " accepts no connections");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return ivshmem_client_handshake(std::move(sock), vectors,
                                  std::max(left, std::chrono::milliseconds(0)), vectors_of, max_peers);
}

// ---------------------------------------------------------------------------
// Server side.

Result<GuestConnection> make_doorbells(std::size_t vectors) {
  if (vectors == 0 || vectors > kMaxVectors)
    return make_error(EINVAL, "ivshmem: vectors must be 1.." + std::to_string(kMaxVectors));
  GuestConnection g;
  for (std::size_t i = 0; i < vectors; ++i) {
    IVCUDA_TRY_ASSIGN(sys::UniqueFd h, sys::make_eventfd(true));
    IVCUDA_TRY_ASSIGN(sys::UniqueFd v, sys::make_eventfd(true));
    g.host_fds.push_back(std::move(h));
    g.guest_fds.push_back(std::move(v));
  }
  return g;
}

Result<GuestConnection> send_greeting(sys::UniqueFd conn, std::int64_t peer_id, int shm_fd,
                                      std::size_t vectors) {
  IVCUDA_TRY_ASSIGN(GuestConnection g, make_doorbells(vectors));
  return send_greeting(std::move(conn), peer_id, shm_fd, std::move(g));
}

Result<GuestConnection> send_greeting(sys::UniqueFd conn, std::int64_t peer_id, int shm_fd,
                                      GuestConnection g) {
  if (peer_id == kHostPeerId || peer_id < 0 || peer_id > kMaxPeerId)
    return make_error(EINVAL, "ivshmem: invalid guest peer id " + std::to_string(peer_id));
  if (g.host_fds.empty() || g.host_fds.size() > kMaxVectors || g.guest_fds.size() != g.host_fds.size())
    return make_error(EINVAL, "ivshmem: vectors must be 1.." + std::to_string(kMaxVectors) + " each way");
  if (shm_fd < 0) return make_error(EBADF, "ivshmem: no shared-memory fd to send");

  const timeval tv{kSendTimeoutMs / 1000, (kSendTimeoutMs % 1000) * 1000};
  if (::setsockopt(conn.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0)
    return sys_error("ivshmem: SO_SNDTIMEO");

  g.peer_id = peer_id;
  const int c = conn.get();
  IVCUDA_TRY(send_msg(c, kProtocolVersion));
  IVCUDA_TRY(send_msg(c, peer_id));
  IVCUDA_TRY(send_msg(c, kShmMessage, shm_fd));
  for (const sys::UniqueFd& fd : g.host_fds) IVCUDA_TRY(send_msg(c, kHostPeerId, fd.get()));
  for (const sys::UniqueFd& fd : g.guest_fds) IVCUDA_TRY(send_msg(c, peer_id, fd.get()));
  g.conn = std::move(conn);
  return g;
}

bool connection_closed(int conn, int timeout_ms) noexcept {
  pollfd p{conn, POLLIN | POLLRDHUP, 0};
  const int r = ::poll(&p, 1, timeout_ms);
  // EINTR is a spurious wake-up; POLLNVAL (not a descriptor) reports as closed.
  return r > 0 && p.revents != 0;
}

Result<IvshmemServer> IvshmemServer::listen(const std::string& path, std::size_t vectors) {
  if (vectors == 0 || vectors > kMaxVectors)
    return make_error(EINVAL, "ivshmem: vectors must be 1.." + std::to_string(kMaxVectors));
  IVCUDA_TRY_ASSIGN(const sockaddr_un addr, unix_address(path));

  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return make_error(EEXIST, "ivshmem: " + path + " exists and is not a socket; not replacing it");
    // A socket file outlives its server. Only a connection attempt tells a
    // stale one (refused) from a live one.
    sys::UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!probe.valid()) return sys_error("ivshmem: socket");
    if (unix_connect(probe.get(), addr) == 0 || errno == EAGAIN)
      return make_error(EADDRINUSE, "ivshmem: a live server is listening on " + path);
    if (errno != ECONNREFUSED) return sys_error("ivshmem: probing " + path);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      return sys_error("ivshmem: removing stale socket " + path);
  } else if (errno != ENOENT) {
    return sys_error("ivshmem: lstat " + path);
  }

  IvshmemServer s;
  s.vectors_ = vectors;
  // Non-blocking so that accept() after poll() cannot hang on a connection
  // that was withdrawn in between.
  s.listen_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.listen_.valid()) return sys_error("ivshmem: socket");
  // Bound under a temporary name and renamed into place once listening: the
  // path appears only when connections to it are accepted (a client that
  // waits for the file, as QEMU's users and our tests do, is never refused).
  // A path too long for a suffix is bound directly, as it was before.
  std::string temp = path + "." + std::to_string(::getpid());
  auto temp_addr = unix_address(temp);
  if (!temp_addr) {
    temp = path;
    temp_addr = addr;
  }
  ::unlink(temp.c_str());
  if (::bind(s.listen_.get(), reinterpret_cast<const sockaddr*>(&*temp_addr), sizeof *temp_addr) != 0)
    return sys_error("ivshmem: bind " + temp);
  if (::listen(s.listen_.get(), SOMAXCONN) != 0 || (temp != path && ::rename(temp.c_str(), path.c_str()) != 0)) {
    const Error e = sys_error("ivshmem: listen on " + path);
    ::unlink(temp.c_str());
    return e;
  }
  s.path_ = path;
  if (::stat(path.c_str(), &st) != 0) return sys_error("ivshmem: stat " + path);
  s.dev_ = st.st_dev;
  s.ino_ = st.st_ino;
  return s;
}

IvshmemServer& IvshmemServer::operator=(IvshmemServer&& o) noexcept {
  if (this != &o) {
    unlink_if_ours();
    listen_ = std::move(o.listen_);
    path_ = std::move(o.path_);
    dev_ = o.dev_;
    ino_ = o.ino_;
    vectors_ = o.vectors_;
    next_id_ = o.next_id_;
  }
  return *this;
}

IvshmemServer::~IvshmemServer() { unlink_if_ours(); }

void IvshmemServer::unlink_if_ours() noexcept {
  if (!listen_.valid() || path_.empty()) return;
  // Another server may have replaced a file we once bound; leave theirs alone.
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_)
    ::unlink(path_.c_str());
}

Result<PendingGuest> IvshmemServer::accept(int timeout_ms) {
  std::optional<Clock::time_point> deadline;
  if (timeout_ms >= 0) deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    sys::UniqueFd c(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (c.valid()) {
      PendingGuest g{std::move(c), next_id_};
      // Guests never see each other's ids, so wrapping around (and reusing
      // an id still in use) is harmless; it only keeps ids within 16 bits.
      next_id_ = next_id_ == kMaxPeerId ? kHostPeerId + 1 : next_id_ + 1;
      return g;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return sys_error("ivshmem: accept");
    const int ms = ms_until(deadline);
    if (deadline && ms == 0) return make_error(ETIMEDOUT, "ivshmem: no connection on " + path_);
    pollfd p{listen_.get(), POLLIN, 0};
    if (::poll(&p, 1, ms) < 0 && errno != EINTR) return sys_error("ivshmem: poll");
  }
}

Result<GuestConnection> IvshmemServer::greet(PendingGuest guest, int shm_fd) const {
  return send_greeting(std::move(guest.conn), guest.peer_id, shm_fd, vectors_);
}

Result<GuestConnection> IvshmemServer::greet(PendingGuest guest, int shm_fd, GuestConnection doorbells) const {
  if (doorbells.host_fds.size() != vectors_)
    return make_error(EINVAL, "ivshmem: " + std::to_string(doorbells.host_fds.size()) +
                                  " eventfds made ahead for a server of " + std::to_string(vectors_) + " vectors");
  return send_greeting(std::move(guest.conn), guest.peer_id, shm_fd, std::move(doorbells));
}

}  // namespace ivcuda::ivshmem
