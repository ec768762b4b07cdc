// See control.h.
#include "host-daemon/daemon/control.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "host-daemon/shared/log.h"
#include "host-daemon/shared/rules.h"

namespace ivcuda::host {

namespace {

constexpr std::size_t kMaxRequest = 64 * 1024;

Result<sockaddr_un> unix_address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof a.sun_path)
    return make_error(ENAMETOOLONG, "control socket path '" + path + "' is empty or too long");
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return a;
}

// Reads up to a newline (or EOF) within `deadline_ms` in total.
bool read_line(int fd, std::string* out, int deadline_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadline_ms);
  char buf[4096];
  while (out->find('\n') == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0 || out->size() > kMaxRequest) return false;
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return !out->empty();
    out->append(buf, static_cast<std::size_t>(n));
  }
  out->resize(out->find('\n'));
  return true;
}

bool write_all(int fd, const std::string& s, int deadline_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadline_ms);
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLOUT, 0};
    (void)::poll(&p, 1, static_cast<int>(left.count()));
  }
  return true;
}

// The supplementary groups of process `pid` (/proc/PID/status, "Groups:").
bool in_groups(pid_t pid, gid_t gid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("Groups:", 0) != 0) continue;
    std::istringstream in(line.substr(7));
    unsigned long g = 0;
    while (in >> g)
      if (static_cast<gid_t>(g) == gid) return true;
    return false;
  }
  return false;
}

}  // namespace

Result<ControlServer> ControlServer::listen(const std::string& path, const std::string& group) {
  ControlServer s;
  s.path_ = path;
  if (!group.empty()) {
    const struct group* g = ::getgrnam(group.c_str());
    if (g == nullptr) return make_error(ENOENT, "--control-group " + group + ": no such group");
    s.gid_ = g->gr_gid;
  }
  IVCUDA_TRY_ASSIGN(const sockaddr_un addr, unix_address(path));
  s.listen_ = sys::UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.listen_.valid()) return make_error(errno, std::string("control socket: ") + std::strerror(errno));
  // A socket file left by a daemon that is gone; anything else is not ours
  // to remove, nor the socket of a daemon that still answers there.
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return make_error(EEXIST, path + " exists and is not a socket");
    sys::UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (probe.valid() && ::connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0)
      return make_error(EADDRINUSE, path + " is the control socket of another ivcudad that runs");
    ::unlink(path.c_str());
  }
  // Created closed (umask 0177), opened to the group only once its owner is right.
  const mode_t old = ::umask(0177);
  const int rc = ::bind(s.listen_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  ::umask(old);
  if (rc != 0) return make_error(errno, "bind " + path + ": " + std::strerror(errno));
  if (s.gid_ != static_cast<gid_t>(-1)) {
    if (::chown(path.c_str(), static_cast<uid_t>(-1), s.gid_) != 0 || ::chmod(path.c_str(), 0660) != 0)
      return make_error(errno, path + ": cannot give it to group " + group + ": " + std::strerror(errno));
  }
  if (::listen(s.listen_.get(), 16) != 0) return make_error(errno, "listen " + path + ": " + std::strerror(errno));
  // One descriptor for the daemon's loop: the socket, its clients, the timer
  // that ends the slow ones.
  s.epoll_ = sys::UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
  s.timer_ = sys::UniqueFd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!s.epoll_.valid() || !s.timer_.valid())
    return make_error(errno, std::string("control socket: epoll/timerfd: ") + std::strerror(errno));
  for (const int fd : {s.listen_.get(), s.timer_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(s.epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0)
      return make_error(errno, std::string("control socket: epoll_ctl: ") + std::strerror(errno));
  }
  return s;
}

bool ControlServer::allowed(int conn) const {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  if (cred.uid == 0 || cred.uid == ::geteuid()) return true;
  if (gid_ == static_cast<gid_t>(-1)) return false;
  return cred.gid == gid_ || in_groups(cred.pid, gid_);
}

void ControlServer::close_in_child() noexcept {
  clients_.clear();
  listen_.reset();
  epoll_.reset();
  timer_.reset();
}

void ControlServer::refuse(int conn) {
  ucred cred{};
  socklen_t len = sizeof cred;
  (void)::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len);
  // One short line into a fresh socket's empty buffer: never waits.
  static const std::string kDenied = nlohmann::json{{"ok", false}, {"error", "permission denied"}}.dump() + "\n";
  (void)::send(conn, kDenied.data(), kDenied.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  // A refused user who connects in a loop must not flood the log either.
  const auto now = Clock::now();
  if (now - refusal_logged_ < std::chrono::seconds(1)) {
    ++refusals_unlogged_;
    return;
  }
  IVLOG_WARN("control socket: refused uid %u (pid %d): not root, not the daemon's user, not in the control group"
             "%s", static_cast<unsigned>(cred.uid), static_cast<int>(cred.pid),
             refusals_unlogged_ == 0 ? "" : (" (and " + std::to_string(refusals_unlogged_) + " more since the last "
                                             "such line)").c_str());
  refusal_logged_ = now;
  refusals_unlogged_ = 0;
}

void ControlServer::accept_new(std::chrono::milliseconds timeout) {
  for (int i = 0; i < 64; ++i) {  // a burst, not more per pass
    sys::UniqueFd conn(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!conn.valid()) return;
    // Who it is, before a byte of it is read: a refused user gets its answer
    // now and never a place among the clients being served.
    if (IVCUDA_RULE("control-creds-at-accept") && !allowed(conn.get())) {
      refuse(conn.get());
      continue;
    }
    if (clients_.size() >= kMaxClients) {
      static const std::string kBusy = nlohmann::json{{"ok", false}, {"error", "busy, try again"}}.dump() + "\n";
      (void)::send(conn.get(), kBusy.data(), kBusy.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      continue;
    }
    clients_.push_back(Client{std::move(conn), {}, {}, 0, Clock::now() + timeout});
    watch(clients_.back(), true);
  }
}

void ControlServer::watch(const Client& c, bool op_add) noexcept {
  epoll_event ev{};
  ev.events = c.out.empty() ? EPOLLIN : EPOLLOUT;
  ev.data.fd = c.fd.get();
  (void)::epoll_ctl(epoll_.get(), op_add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c.fd.get(), &ev);
}

bool ControlServer::step(Client& c, const Handler& handler, std::chrono::milliseconds timeout) {
  if (c.out.empty()) {
    char buf[4096];
    bool eof = false;
    for (;;) {
      const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        c.in.append(buf, static_cast<std::size_t>(n));
        if (c.in.size() > kMaxRequest || c.in.find('\n') != std::string::npos) break;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN) break;
      eof = true;  // closed (or failed): what came is the request, if anything did
      break;
    }
    const auto nl = c.in.find('\n');
    const bool complete = nl != std::string::npos || (eof && !c.in.empty());
    const bool too_long = nl == std::string::npos && c.in.size() > kMaxRequest;
    if (!complete && !too_long) return !eof;  // more to come, or gone without a word
    nlohmann::json reply;
    if (too_long) {
      reply = {{"ok", false}, {"error", "bad request: longer than 64 KiB"}};
    } else {
      try {
        const auto request = nlohmann::json::parse(c.in.substr(0, nl));
        if (!request.is_object()) throw std::invalid_argument("a request is a JSON object");
        reply = handler(request);
      } catch (const std::exception& e) {
        reply = {{"ok", false}, {"error", std::string("bad request: ") + e.what()}};
      }
    }
    c.out = reply.dump() + "\n";
    c.deadline = Clock::now() + timeout;  // as long again to take the answer
    watch(c, false);
  }
  while (c.sent < c.out.size()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      c.sent += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return n < 0 && errno == EAGAIN;  // the rest when it takes more
    }
  }
  return false;  // answered
}

void ControlServer::arm_timer() noexcept {
  itimerspec t{};
  if (!clients_.empty()) {
    auto first = clients_.front().deadline;
    for (const auto& c : clients_) first = std::min(first, c.deadline);
    const auto left = std::max(std::chrono::nanoseconds(1), first - Clock::now());
    t.it_value.tv_sec = static_cast<time_t>(left.count() / 1000000000);
    t.it_value.tv_nsec = static_cast<long>(left.count() % 1000000000);
  }
  (void)::timerfd_settime(timer_.get(), 0, &t, nullptr);  // all zero: disarmed
}

void ControlServer::serve(const Handler& handler, std::chrono::milliseconds timeout) {
  if (!epoll_.valid()) return;
  std::uint64_t expirations = 0;
  (void)!::read(timer_.get(), &expirations, sizeof expirations);
  accept_new(timeout);
  const auto now = Clock::now();
  for (auto it = clients_.begin(); it != clients_.end();) {
    // Closing the descriptor takes it out of the epoll set too.
    if (now >= it->deadline || !step(*it, handler, timeout))
      it = clients_.erase(it);
    else
      ++it;
  }
  arm_timer();
}

Result<nlohmann::json> control_request(const std::string& path, const nlohmann::json& request,
                                       std::chrono::milliseconds timeout) {
  IVCUDA_TRY_ASSIGN(const sockaddr_un addr, unix_address(path));
  sys::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return make_error(errno, std::string("socket: ") + std::strerror(errno));
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    const int e = errno;
    std::string why = std::strerror(e);
    if (e == ENOENT || e == ECONNREFUSED) why += " (is ivcudad running with --control-socket " + path + "?)";
    if (e == EACCES || e == EPERM) why += " (root, the daemon's user or the control group only)";
    return make_error(e, "cannot connect to " + path + ": " + why);
  }
  const int ms = static_cast<int>(timeout.count());
  // A refused client is answered and dropped before its request is read, so
  // sending may fail where the answer is waiting: read it all the same.
  const bool sent = write_all(fd.get(), request.dump() + "\n", ms);
  std::string line;
  if (!read_line(fd.get(), &line, ms))
    return sent ? make_error(ETIMEDOUT, "no answer from ivcudad on " + path)
                : make_error(EIO, "cannot send the request to " + path);
  try {
    auto reply = nlohmann::json::parse(line);
    if (!reply.is_object()) return make_error(EPROTO, "ivcudad's answer is not a JSON object");
    return reply;
  } catch (const std::exception& e) {
    return make_error(EPROTO, std::string("ivcudad's answer is not JSON: ") + e.what());
  }
}

}  // namespace ivcuda::host
