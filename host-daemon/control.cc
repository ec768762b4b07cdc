// See control.h.
#include "host-daemon/control.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "host-daemon/log.h"

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

void ControlServer::serve(const Handler& handler, std::chrono::milliseconds timeout) {
  for (int i = 0; i < 16; ++i) {  // a burst of clients, not more per pass
    sys::UniqueFd conn(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) return;
    nlohmann::json reply;
    std::string line;
    if (!read_line(conn.get(), &line, static_cast<int>(timeout.count()))) continue;  // nothing (in time): hang up
    if (!allowed(conn.get())) {
      ucred cred{};
      socklen_t len = sizeof cred;
      (void)::getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len);
      IVLOG_WARN("control socket: refused uid %u (pid %d): not root, not the daemon's user, not in the control "
                 "group", static_cast<unsigned>(cred.uid), static_cast<int>(cred.pid));
      reply = {{"ok", false}, {"error", "permission denied"}};
    } else {
      try {
        const auto request = nlohmann::json::parse(line);
        if (!request.is_object()) throw std::invalid_argument("a request is a JSON object");
        reply = handler(request);
      } catch (const std::exception& e) {
        reply = {{"ok", false}, {"error", std::string("bad request: ") + e.what()}};
      }
    }
    (void)write_all(conn.get(), reply.dump() + "\n", static_cast<int>(timeout.count()));
  }
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
  if (!write_all(fd.get(), request.dump() + "\n", ms))
    return make_error(EIO, "cannot send the request to " + path);
  std::string line;
  if (!read_line(fd.get(), &line, ms)) return make_error(ETIMEDOUT, "no answer from ivcudad on " + path);
  try {
    auto reply = nlohmann::json::parse(line);
    if (!reply.is_object()) return make_error(EPROTO, "ivcudad's answer is not a JSON object");
    return reply;
  } catch (const std::exception& e) {
    return make_error(EPROTO, std::string("ivcudad's answer is not JSON: ") + e.what());
  }
}

}  // namespace ivcuda::host
