// The operator's line to ivcudad: a UNIX socket of its own (never a guest's
// socket), opened only by root, the daemon's own user, or members of a
// configured group (--control-group). The socket file's owner and mode keep
// everybody else out; the daemon also checks each client's credentials
// (SO_PEERCRED, and its groups) as it accepts it, before reading a byte, so a
// socket file left with a wider mode does not open it, and a refused user is
// answered and dropped at once (docs/security.md, `control-creds-at-accept`).
// It runs in the daemon's one loop and never waits there: clients are read
// and answered as their bytes come, each within its time, at most
// kMaxClients at once.
//
// Protocol: one JSON object per line each way; the client sends one request
// and the daemon answers and closes.
//   {"cmd":"status"}             -> {"ok":true,"status":{...}}  (status.h)
//   {"cmd":"evict","guest":N}    -> {"ok":true,"state":"evicting"}
//   {"cmd":"reload"}             -> {"ok":true,"changed":[...]}
//   {"cmd":"suspend","guest":N}  -> {"ok":true,"state":"suspending"}  (suspend.h; status says when done)
//   {"cmd":"resume","guest":N}   -> {"ok":true,"state":"resuming"}
//   {"cmd":"drain","gpu":G}      -> {"ok":true,"suspending":[N...],"not_suspended":[...]}
//   {"cmd":"undrain","gpu":G}    -> {"ok":true,"resuming":[N...]}
//   anything else                -> {"ok":false,"error":"..."}
// ivcudactl (host-daemon/daemon/ivcudactl.cc) speaks it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ivcuda/result.h"
#include "ring/sys.h"

namespace ivcuda::host {

class ControlServer {
 public:
  // Answers a request from a client that may use the socket.
  using Handler = std::function<nlohmann::json(const nlohmann::json& request)>;
  static constexpr std::size_t kMaxClients = 16;  // allowed clients being served at once

  // Listens on `path` (replacing a stale socket file), owned by `group`
  // (empty: the daemon's group) with `mode` (0660 with a group, else 0600).
  static Result<ControlServer> listen(const std::string& path, const std::string& group);
  ControlServer() = default;

  // What the daemon polls (POLLIN): readable when a client connects, sends,
  // can take more of its answer, or runs out of time.
  int fd() const noexcept { return epoll_.get(); }
  const std::string& path() const noexcept { return path_; }
  // Does what can be done now, without waiting: accepts, reads, answers
  // complete requests, sends, drops clients past `timeout` (for sending the
  // request, and again for taking the answer).
  void serve(const Handler& handler, std::chrono::milliseconds timeout = std::chrono::milliseconds(500));
  void close_in_child() noexcept;

 private:
  using Clock = std::chrono::steady_clock;
  struct Client {
    sys::UniqueFd fd;
    std::string in;    // the request so far
    std::string out;   // the answer, once there is one
    std::size_t sent = 0;
    Clock::time_point deadline;
  };
  bool allowed(int conn) const;
  void accept_new(std::chrono::milliseconds timeout);
  void refuse(int conn);
  // Reads or writes what it can; false when the client is done with.
  bool step(Client& c, const Handler& handler, std::chrono::milliseconds timeout);
  void watch(const Client& c, bool op_add) noexcept;
  void arm_timer() noexcept;

  sys::UniqueFd listen_, epoll_, timer_;
  std::vector<Client> clients_;
  std::string path_;
  gid_t gid_ = static_cast<gid_t>(-1);  // the control group; -1: none
  Clock::time_point refusal_logged_{};   // refusals are logged once a second at most
  unsigned refusals_unlogged_ = 0;
};

// The client side (ivcudactl): sends `request`, returns the reply. Errors
// say what went wrong in words (no daemon, no permission, a bad reply).
Result<nlohmann::json> control_request(const std::string& path, const nlohmann::json& request,
                                       std::chrono::milliseconds timeout = std::chrono::milliseconds(5000));

}  // namespace ivcuda::host
