// The operator's line to ivcudad: a UNIX socket of its own (never a guest's
// socket), opened only by root, the daemon's own user, or members of a
// configured group (--control-group). The socket file's owner and mode keep
// everybody else out; the daemon also checks each client's credentials
// (SO_PEERCRED, and its groups), so a socket file left with a wider mode
// does not open it.
//
// Protocol: one JSON object per line each way; the client sends one request
// and the daemon answers and closes.
//   {"cmd":"status"}             -> {"ok":true,"status":{...}}  (status.h)
//   {"cmd":"evict","guest":N}    -> {"ok":true,"state":"evicting"}
//   {"cmd":"reload"}             -> {"ok":true,"changed":[...]}
//   anything else                -> {"ok":false,"error":"..."}
// ivcudactl (host-daemon/ivcudactl.cc) speaks it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "ivcuda/result.h"
#include "ring/sys.h"

namespace ivcuda::host {

class ControlServer {
 public:
  // Answers a request from a client that may use the socket.
  using Handler = std::function<nlohmann::json(const nlohmann::json& request)>;

  // Listens on `path` (replacing a stale socket file), owned by `group`
  // (empty: the daemon's group) with `mode` (0660 with a group, else 0600).
  static Result<ControlServer> listen(const std::string& path, const std::string& group);
  ControlServer() = default;

  int fd() const noexcept { return listen_.get(); }
  const std::string& path() const noexcept { return path_; }
  // Accepts and serves the clients waiting now; a client gets `timeout` to
  // send its request, so a stuck client cannot hold the daemon up for long.
  void serve(const Handler& handler, std::chrono::milliseconds timeout = std::chrono::milliseconds(500));
  void close_in_child() noexcept { listen_.reset(); }

 private:
  bool allowed(int conn) const;
  sys::UniqueFd listen_;
  std::string path_;
  gid_t gid_ = static_cast<gid_t>(-1);  // the control group; -1: none
};

// The client side (ivcudactl): sends `request`, returns the reply. Errors
// say what went wrong in words (no daemon, no permission, a bad reply).
Result<nlohmann::json> control_request(const std::string& path, const nlohmann::json& request,
                                       std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));

}  // namespace ivcuda::host
