// The Prometheus endpoint (--metrics-listen ADDR:PORT): GET /metrics answers
// status.h's prometheus_text of the daemon's current snapshot. Served by
// GNU libmicrohttpd driven from the daemon's own poll loop (no thread: the
// daemon forks its workers, and a fork must not race another thread), with
// a few connections at most and a short timeout, so a slow scraper costs the
// daemon nothing.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "ivcuda/result.h"

struct MHD_Daemon;

namespace ivcuda::host {

class MetricsServer {
 public:
  using Render = std::function<std::string()>;
  // `listen`: ADDR:PORT, e.g. 127.0.0.1:9400 or 0.0.0.0:9400 (IPv4), or
  // [::1]:9400 (IPv6). Port 0 picks a free one (port() tells which).
  static Result<std::unique_ptr<MetricsServer>> start(const std::string& listen, Render render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The fd to poll for readability; then call run().
  int fd() const noexcept;
  // Serves what is ready (never blocks).
  void run() noexcept;
  int port() const noexcept { return port_; }
  // In a forked worker: close the listening socket without stopping the
  // server that the daemon still runs.
  void close_in_child() noexcept;

 private:
  MetricsServer() = default;
  MHD_Daemon* d_ = nullptr;
  Render render_;
  int port_ = 0;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
};

}  // namespace ivcuda::host
