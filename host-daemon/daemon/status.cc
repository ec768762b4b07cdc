// See status.h.
#include "host-daemon/daemon/status.h"

#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ivcuda::host {

using nlohmann::json;

json to_json(const DaemonStatus& s) {
  json guests = json::array();
  for (const auto& g : s.guests) {
    guests.push_back({{"id", g.id},
                      {"socket", g.socket},
                      {"mode", g.mode},
                      {"state", g.state},
                      {"pid", g.pid},
                      {"peer_pid", g.peer_pid},
                      {"uid", g.uid},
                      {"gpus", g.gpus},
                      {"compute_percent", g.compute},
                      {"processes", g.processes},
                      {"mem_used_bytes", g.mem_used},
                      {"mem_limit_bytes", g.mem_limit},
                      {"mem_device_bytes", g.mem_device},
                      {"mem_host_bytes", g.mem_host},
                      {"suspend", {{"last", g.suspend_note},
                                   {"lock_ms", g.suspend_lock_ms},
                                   {"checkpoint_ms", g.suspend_out_ms},
                                   {"restore_ms", g.suspend_back_ms}}},
                      {"calls", g.calls},
                      {"copy_bytes", g.copy_bytes},
                      {"errors", g.errors},
                      {"calls_per_s", g.calls_per_s},
                      {"copy_bytes_per_s", g.copy_bytes_per_s},
                      {"uptime_s", g.uptime_s},
                      {"last_error", g.last_error},
                      {"last_error_time_ns", g.last_error_time_ns}});
  }
  return {{"version", s.version},
          {"pid", s.pid},
          {"uptime_s", s.uptime_s},
          {"guests_refused", s.guests_refused},
          {"warm_workers", {{"ready", s.warm_ready}, {"starting", s.warm_starting}}},
          {"drained_gpus", s.drained},
          {"guests", guests}};
}

DaemonStatus status_from_json(const json& j) {
  DaemonStatus s;
  s.version = j.at("version").get<std::string>();
  s.pid = j.at("pid").get<pid_t>();
  s.uptime_s = j.at("uptime_s").get<double>();
  s.guests_refused = j.at("guests_refused").get<std::uint64_t>();
  if (j.contains("warm_workers")) {  // daemons before the warm workers had none
    s.warm_ready = j["warm_workers"].at("ready").get<std::uint32_t>();
    s.warm_starting = j["warm_workers"].at("starting").get<std::uint32_t>();
  }
  if (j.contains("drained_gpus")) s.drained = j["drained_gpus"].get<std::vector<int>>();
  for (const auto& x : j.at("guests")) {
    GuestStatus g;
    g.id = x.at("id").get<std::int64_t>();
    g.socket = x.at("socket").get<std::string>();
    g.mode = x.at("mode").get<std::string>();
    g.state = x.at("state").get<std::string>();
    g.pid = x.at("pid").get<pid_t>();
    g.peer_pid = x.at("peer_pid").get<pid_t>();
    g.uid = x.at("uid").get<uid_t>();
    g.gpus = x.at("gpus").get<std::vector<int>>();
    g.compute = x.at("compute_percent").get<unsigned>();
    g.processes = x.at("processes").get<std::uint32_t>();
    g.mem_used = x.at("mem_used_bytes").get<std::uint64_t>();
    g.mem_limit = x.at("mem_limit_bytes").get<std::uint64_t>();
    if (x.contains("mem_device_bytes")) {  // daemons before suspend had neither
      g.mem_device = x.at("mem_device_bytes").get<std::uint64_t>();
      g.mem_host = x.at("mem_host_bytes").get<std::uint64_t>();
      const auto& sp = x.at("suspend");
      g.suspend_note = sp.at("last").get<std::string>();
      g.suspend_lock_ms = sp.at("lock_ms").get<double>();
      g.suspend_out_ms = sp.at("checkpoint_ms").get<double>();
      g.suspend_back_ms = sp.at("restore_ms").get<double>();
    }
    g.calls = x.at("calls").get<std::uint64_t>();
    g.copy_bytes = x.at("copy_bytes").get<std::uint64_t>();
    g.errors = x.at("errors").get<std::uint64_t>();
    g.calls_per_s = x.at("calls_per_s").get<double>();
    g.copy_bytes_per_s = x.at("copy_bytes_per_s").get<double>();
    g.uptime_s = x.at("uptime_s").get<double>();
    g.last_error = x.at("last_error").get<std::string>();
    g.last_error_time_ns = x.at("last_error_time_ns").get<std::uint64_t>();
    s.guests.push_back(std::move(g));
  }
  return s;
}

namespace {

// A label value as the exposition format wants it: \, " and newline escaped.
std::string label(const std::string& v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string gpu_list(const std::vector<int>& gpus) {
  if (gpus.empty()) return "all";
  std::string s;
  for (const int g : gpus) s += (s.empty() ? "" : ",") + std::to_string(g);
  return s;
}

}  // namespace

std::string prometheus_text(const DaemonStatus& s) {
  std::ostringstream o;
  o.precision(17);
  struct Metric {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const GuestStatus&);
  };
  static const Metric kGuest[] = {
      {"IVCUDA_FI_GUEST_FB_USED", "gauge", "Device memory charged to the guest's quota (in MiB).",
       [](const GuestStatus& g) { return static_cast<double>(g.mem_used) / 1048576.0; }},
      {"IVCUDA_FI_GUEST_FB_QUOTA", "gauge", "The guest's device-memory quota (in MiB; 0: none).",
       [](const GuestStatus& g) { return static_cast<double>(g.mem_limit) / 1048576.0; }},
      {"IVCUDA_FI_GUEST_CALLS_TOTAL", "counter", "CUDA calls the guest's workers handled.",
       [](const GuestStatus& g) { return static_cast<double>(g.calls); }},
      {"IVCUDA_FI_GUEST_ERRORS_TOTAL", "counter", "Calls that answered an error.",
       [](const GuestStatus& g) { return static_cast<double>(g.errors); }},
      {"IVCUDA_FI_GUEST_COPY_BYTES_TOTAL", "counter", "Bytes copied between host and device memory.",
       [](const GuestStatus& g) { return static_cast<double>(g.copy_bytes); }},
      {"IVCUDA_FI_GUEST_COMPUTE_SHARE", "gauge", "Percentage of the SMs the guest may use under MPS (0: no MPS).",
       [](const GuestStatus& g) { return static_cast<double>(g.compute); }},
      {"IVCUDA_FI_GUEST_PROCESSES", "gauge", "Guest processes served now.",
       [](const GuestStatus& g) { return static_cast<double>(g.processes); }},
      {"IVCUDA_FI_GUEST_EVICTED", "gauge", "1 once the operator evicted the guest.",
       [](const GuestStatus& g) { return g.state == "evicting" || g.state == "evicted" ? 1.0 : 0.0; }},
      {"IVCUDA_FI_GUEST_SUSPENDED", "gauge", "1 while the guest is suspended (ivcudactl suspend), being suspended or resumed.",
       [](const GuestStatus& g) {
         return g.state == "suspended" || g.state == "suspending" || g.state == "resuming" ? 1.0 : 0.0;
       }},
      {"IVCUDA_FI_GUEST_FB_DEVICE", "gauge", "Of the guest's charged memory, what is on the GPU now (in MiB).",
       [](const GuestStatus& g) { return static_cast<double>(g.mem_device) / 1048576.0; }},
      {"IVCUDA_FI_GUEST_FB_HOST", "gauge", "Of the guest's charged memory, what a suspension moved to host memory (in MiB).",
       [](const GuestStatus& g) { return static_cast<double>(g.mem_host) / 1048576.0; }},
      {"IVCUDA_FI_GUEST_UPTIME", "gauge", "Seconds since the guest connected.",
       [](const GuestStatus& g) { return g.uptime_s; }},
  };
  o << "# HELP IVCUDA_FI_DAEMON_GUESTS Guests served now.\n# TYPE IVCUDA_FI_DAEMON_GUESTS gauge\n"
    << "IVCUDA_FI_DAEMON_GUESTS " << s.guests.size() << "\n";
  o << "# HELP IVCUDA_FI_DAEMON_GUESTS_REFUSED_TOTAL Connections refused (guest limits).\n"
    << "# TYPE IVCUDA_FI_DAEMON_GUESTS_REFUSED_TOTAL counter\n"
    << "IVCUDA_FI_DAEMON_GUESTS_REFUSED_TOTAL " << s.guests_refused << "\n";
  o << "# HELP IVCUDA_FI_DAEMON_WARM_WORKERS Workers started ahead of the next guest, by state.\n"
    << "# TYPE IVCUDA_FI_DAEMON_WARM_WORKERS gauge\n"
    << "IVCUDA_FI_DAEMON_WARM_WORKERS{state=\"ready\"} " << s.warm_ready << "\n"
    << "IVCUDA_FI_DAEMON_WARM_WORKERS{state=\"starting\"} " << s.warm_starting << "\n";
  o << "# HELP IVCUDA_FI_DAEMON_UPTIME Seconds since ivcudad started.\n# TYPE IVCUDA_FI_DAEMON_UPTIME gauge\n"
    << "IVCUDA_FI_DAEMON_UPTIME " << s.uptime_s << "\n";
  for (const auto& m : kGuest) {
    o << "# HELP " << m.name << ' ' << m.help << "\n# TYPE " << m.name << ' ' << m.type << "\n";
    for (const auto& g : s.guests)
      o << m.name << "{guest=\"" << g.id << "\",socket=\"" << label(g.socket) << "\",mode=\"" << g.mode
        << "\",gpus=\"" << gpu_list(g.gpus) << "\",pid=\"" << g.pid << "\"} " << m.value(g) << "\n";
  }
  return o.str();
}

std::string human_bytes(std::uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0 || v >= 100 || v == static_cast<double>(static_cast<std::uint64_t>(v)))
    std::snprintf(buf, sizeof buf, "%.0f %s", v, kUnits[u]);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

}  // namespace ivcuda::host
