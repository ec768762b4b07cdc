// See daemon.h: what the operator asks (ivcudactl status, evict and reload,
// SIGHUP, the metrics endpoint), answered from the daemon's own records and
// the guests' status boards.
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <cstring>
#include <nlohmann/json.hpp>

#include "host-daemon/daemon/daemon.h"
#include "host-daemon/shared/log.h"

namespace ivcuda::host {

using nlohmann::json;

DaemonStatus Daemon::snapshot() const {
  DaemonStatus st;
  st.version = IVCUDA_VERSION;
  st.pid = ::getpid();
  st.uptime_s = std::chrono::duration<double>(clk::now() - started_).count();
  st.guests_refused = refused_;
  st.drained.assign(drained_.begin(), drained_.end());
  for (const auto& pool : pools_)
    for (const Warm& e : pool) ++(e.ready ? st.warm_ready : st.warm_starting);
  for (const auto& [pid, w] : workers_) {
    GuestStatus g;
    const GuestStats& b = w.board->stats();
    g.id = w.id;
    g.socket = w.socket;
    g.mode = mode_name(static_cast<GuestMode>(b.mode.load(std::memory_order_relaxed)));
    g.pid = pid;
    g.peer_pid = w.peer_pid;
    g.uid = w.uid;
    g.gpus = w.gpus;
    g.compute = w.compute;
    g.processes = b.processes.load(std::memory_order_relaxed);
    g.mem_used = b.mem_used.load(std::memory_order_relaxed);
    g.mem_limit = b.mem_limit.load(std::memory_order_relaxed);
    g.calls = b.calls.load(std::memory_order_relaxed);
    g.copy_bytes = b.copy_bytes.load(std::memory_order_relaxed);
    g.errors = b.errors.load(std::memory_order_relaxed);
    const bool evict = b.evict.load(std::memory_order_relaxed) != 0;
    const bool done = b.evicted.load(std::memory_order_acquire) != 0 && g.mem_used == 0;
    g.state = evict ? (done ? "evicted" : "evicting") : suspension_state(w);
    // Suspended: what it holds is in its worker's host memory, not on the GPU
    // (its quota's charge, and its own view, stay as they were).
    if (w.susp.phase == Phase::kSuspended || w.susp.phase == Phase::kResuming) {
      g.mem_host = w.susp.bytes;
      g.mem_device = 0;
    } else {
      g.mem_device = g.mem_used;
    }
    g.suspend_note = w.susp.last;
    g.suspend_lock_ms = w.susp.lock_ms;
    g.suspend_out_ms = w.susp.out_ms;
    g.suspend_back_ms = w.susp.back_ms;
    g.calls_per_s = w.calls_per_s;
    g.copy_bytes_per_s = w.bytes_per_s;
    g.uptime_s = std::chrono::duration<double>(clk::now() - w.started).count();
    g.last_error = b.read_last_error(&g.last_error_time_ns);
    st.guests.push_back(std::move(g));
  }
  return st;
}

// ivcudactl reload, or SIGHUP: the command line and config file are read
// again; quotas change for the guests connected now and to come, object
// limits for workers started from now on. Sockets and GPUs stay as they
// are (a restart changes those).
nlohmann::json Daemon::reload() {
  Options fresh;
  if (const std::string why = parse_options(argc_, argv_, &fresh); !why.empty())
    return {{"ok", false}, {"error", "the configuration does not parse: " + why}};
  std::map<std::string, std::uint64_t> limits{{fresh.socket, fresh.mem_limit}};
  std::map<std::string, unsigned> warm{{fresh.socket, fresh.warm_workers}};
  for (const auto& spec : fresh.guest_sockets) {
    SocketSpec ss;
    std::string why;
    if (!parse_socket_spec(spec, fresh.mem_limit, fresh.compute, fresh.warm_workers, fresh.huge_pages == "on", &ss,
                           &why))
      return {{"ok", false}, {"error", "--guest-socket " + spec + ": " + why}};
    limits[ss.path] = ss.mem_limit;
    warm[ss.path] = ss.warm;
  }
  json changed = json::array();
  for (std::size_t li = 0; li < listeners_.size(); ++li) {
    Listener& l = listeners_[li];
    const auto it = limits.find(l.path);
    if (it == limits.end() || it->second == l.mem_limit) continue;
    changed.push_back(l.path + ": mem-limit " + human_bytes(l.mem_limit) + " -> " +
                      human_bytes(it->second));
    l.mem_limit = it->second;
    for (auto& [pid, w] : workers_)
      if (w.listener == li) w.board->stats().mem_limit.store(l.mem_limit, std::memory_order_relaxed);
  }
  for (Listener& l : listeners_) {
    const auto it = warm.find(l.path);
    if (it == warm.end() || it->second == l.warm) continue;
    changed.push_back(l.path + ": warm workers " + std::to_string(l.warm) + " -> " + std::to_string(it->second));
    l.warm = it->second;
  }
  if (fresh.mem_limit != o_.mem_limit) {
    for (auto& [pid, w] : workers_)  // ivshmem-plain guests take the default quota
      if (w.listener == kNoListener) w.board->stats().mem_limit.store(fresh.mem_limit, std::memory_order_relaxed);
    o_.mem_limit = fresh.mem_limit;
  }
  if (std::memcmp(&fresh.limits, &o_.limits, sizeof o_.limits) != 0) {
    o_.limits = fresh.limits;
    changed.push_back("object limits (for workers started from now on)");
  }
  json ignored = json::array();
  for (const auto& [path, limit] : limits)
    if (std::none_of(listeners_.begin(), listeners_.end(), [&](const Listener& l) { return l.path == path; }))
      ignored.push_back(path + ": a new socket (takes a restart)");
  // Warm workers were started with the old settings: new ones start.
  if (!changed.empty()) warm_stale_ = true;
  IVLOG_INFO("reloaded the configuration: %zu change(s)", changed.size());
  return {{"ok", true}, {"changed", changed}, {"ignored", ignored}};
}

nlohmann::json Daemon::handle_control(const nlohmann::json& req) {
  const std::string cmd = req.value("cmd", "");
  if (cmd == "status") return {{"ok", true}, {"status", to_json(snapshot())}};
  if (cmd == "reload") return reload();
  if (cmd == "evict") {
    if (!req.contains("guest") || !req["guest"].is_number_integer())
      return {{"ok", false}, {"error", "evict needs a guest number (see ivcudactl status)"}};
    const auto id = req["guest"].get<std::int64_t>();
    auto it = std::find_if(workers_.begin(), workers_.end(), [&](const auto& w) { return w.second.id == id; });
    if (it == workers_.end())
      return {{"ok", false}, {"error", "no guest " + std::to_string(id) + " (see ivcudactl status)"}};
    GuestStats& b = it->second.board->stats();
    // One being suspended or suspended makes no driver call to release
    // anything: tend_guests ends its worker (daemon.cc).
    if (b.evict.exchange(1, std::memory_order_acq_rel) == 0) {
      // Its workers see the flag within 100 ms (an idle worker's longest
      // sleep) and release everything; a worker that does not is killed.
      it->second.evict_deadline = clk::now() + std::chrono::seconds(5);
      IVLOG_WARN("guest %lld: evicted by the operator", static_cast<long long>(id));
    }
    return {{"ok", true}, {"state", "evicting"}};
  }
  const auto number = [&](const char* key) -> std::optional<std::int64_t> {
    if (!req.contains(key) || !req[key].is_number_integer()) return std::nullopt;
    return req[key].get<std::int64_t>();
  };
  if (cmd == "suspend" || cmd == "resume") {
    const auto id = number("guest");
    if (!id) return {{"ok", false}, {"error", cmd + " needs a guest number (see ivcudactl status)"}};
    return cmd == "suspend" ? suspend_guest(*id, false) : resume_guest(*id);
  }
  if (cmd == "drain" || cmd == "undrain") {
    const auto gpu = number("gpu");
    if (!gpu || *gpu < 0 || *gpu > 1024) return {{"ok", false}, {"error", cmd + " needs a GPU number"}};
    return cmd == "drain" ? drain_gpu(static_cast<int>(*gpu)) : undrain_gpu(static_cast<int>(*gpu));
  }
  return {{"ok", false},
          {"error", "unknown command '" + cmd + "' (status, evict, reload, suspend, resume, drain, undrain)"}};
}

void Daemon::serve_control() {
  control_->serve([this](const json& req) { return handle_control(req); });
}

void Daemon::reload_on_signal() {
  const json r = reload();
  if (!r.value("ok", false)) IVLOG_ERROR("SIGHUP: %s", r.value("error", std::string()).c_str());
}

}  // namespace ivcuda::host
