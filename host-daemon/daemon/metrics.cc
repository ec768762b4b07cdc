// See metrics.h.
#include "host-daemon/daemon/metrics.h"

#include <cerrno>

#ifdef IVCUDA_HAVE_METRICS
#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "host-daemon/shared/log.h"

namespace ivcuda::host {

namespace {

// ADDR:PORT -> a bound, listening, non-blocking socket.
Result<int> open_listener(const std::string& listen, int* port) {
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size())
    return make_error(EINVAL, "--metrics-listen '" + listen + "': expected ADDR:PORT, e.g. 127.0.0.1:9400");
  std::string host = listen.substr(0, colon);
  const std::string service = listen.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0)
    return make_error(EINVAL, "--metrics-listen '" + listen + "': " + ::gai_strerror(rc));
  std::string why = "no address";
  int fd = -1;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 16) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) return make_error(EADDRNOTAVAIL, "--metrics-listen " + listen + ": " + why);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0)
    *port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return fd;
}

MHD_Result answer(MHD_Connection* c, unsigned status, const std::string& body, const char* type) {
  MHD_Response* r = MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()),
                                                    MHD_RESPMEM_MUST_COPY);
  if (r == nullptr) return MHD_NO;
  (void)MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  const MHD_Result rc = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return rc;
}

MHD_Result on_request(void* cls, MHD_Connection* c, const char* url, const char* method, const char*,
                      const char*, std::size_t* upload_size, void**) {
  const auto& render = *static_cast<const MetricsServer::Render*>(cls);
  if (std::strcmp(method, MHD_HTTP_METHOD_GET) != 0 && std::strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
    return answer(c, MHD_HTTP_METHOD_NOT_ALLOWED, "GET /metrics\n", "text/plain");
  if (*upload_size != 0) return MHD_NO;  // a GET with a body: not ours
  if (std::strcmp(url, "/metrics") != 0) return answer(c, MHD_HTTP_NOT_FOUND, "see /metrics\n", "text/plain");
  return answer(c, MHD_HTTP_OK, render(), "text/plain; version=0.0.4; charset=utf-8");
}

}  // namespace

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const std::string& listen, Render render) {
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->render_ = std::move(render);
  IVCUDA_TRY_ASSIGN(s->listen_fd_, open_listener(listen, &s->port_));
  // No thread of its own (MHD_USE_EPOLL without an internal polling thread):
  // the daemon's loop polls the epoll fd and calls run().
  s->d_ = MHD_start_daemon(MHD_USE_EPOLL, 0, nullptr, nullptr, &on_request, &s->render_,
                           MHD_OPTION_LISTEN_SOCKET, s->listen_fd_, MHD_OPTION_CONNECTION_LIMIT, 8u,
                           MHD_OPTION_CONNECTION_TIMEOUT, 5u, MHD_OPTION_END);
  if (s->d_ == nullptr) {
    ::close(s->listen_fd_);
    s->listen_fd_ = -1;
    return make_error(EIO, "--metrics-listen " + listen + ": libmicrohttpd would not start");
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(s->d_, MHD_DAEMON_INFO_EPOLL_FD);
  s->epoll_fd_ = info != nullptr ? info->epoll_fd : -1;
  if (s->epoll_fd_ < 0) return make_error(EIO, "libmicrohttpd gave no epoll fd");
  return s;
}

MetricsServer::~MetricsServer() {
  if (d_ != nullptr) MHD_stop_daemon(d_);  // closes the listening socket it was given
}

int MetricsServer::fd() const noexcept { return epoll_fd_; }

void MetricsServer::run() noexcept {
  if (d_ != nullptr) (void)MHD_run(d_);
}

void MetricsServer::close_in_child() noexcept {
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  listen_fd_ = epoll_fd_ = -1;
  d_ = nullptr;  // the daemon's; never stopped from here
}

}  // namespace ivcuda::host

#else  // built without libmicrohttpd (IVCUDA_METRICS=OFF, or AUTO where it is missing)

namespace ivcuda::host {

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const std::string&, Render) {
  return make_error(ENOTSUP, "--metrics-listen: this ivcudad is built without the metrics endpoint (IVCUDA_METRICS=OFF)");
}
MetricsServer::~MetricsServer() = default;
int MetricsServer::fd() const noexcept { return -1; }
void MetricsServer::run() noexcept {}
void MetricsServer::close_in_child() noexcept {}

}  // namespace ivcuda::host

#endif
