// ivcudactl: the operator's tool. It talks to ivcudad over its control
// socket (host-daemon/daemon/control.h):
//   ivcudactl status [--json]   the guests served now
//   ivcudactl evict GUEST       release everything a guest holds; its calls fail from then on
//   ivcudactl reload            read the configuration again (quotas, object limits)
//   ivcudactl suspend GUEST     its device memory into host memory, the GPU given back; its calls wait
//   ivcudactl resume GUEST      back onto the GPU at the same addresses; its calls go on
//   ivcudactl drain GPU         suspend every guest on a GPU, serve none there until undrain
//   ivcudactl undrain GPU       the GPU back in service, its drained guests resumed
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "host-daemon/daemon/control.h"
#include "host-daemon/daemon/status.h"

namespace {

using nlohmann::json;
using ivcuda::host::human_bytes;

std::string duration(double s) {
  char buf[32];
  const auto t = static_cast<long long>(s);
  if (t >= 86400) std::snprintf(buf, sizeof buf, "%lldd%02lldh", t / 86400, t % 86400 / 3600);
  else if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, t % 3600 / 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%llds", t);
  return buf;
}

void print_table(const ivcuda::host::DaemonStatus& st) {
  std::printf("ivcudad %s, pid %d, up %s; %zu guest(s)", st.version.c_str(), static_cast<int>(st.pid),
              duration(st.uptime_s).c_str(), st.guests.size());
  if (st.guests_refused != 0) std::printf(", %llu refused", static_cast<unsigned long long>(st.guests_refused));
  if (st.warm_ready + st.warm_starting != 0)
    std::printf("; warm workers: %u ready, %u starting", st.warm_ready, st.warm_starting);
  for (const int d : st.drained) std::printf("; GPU %d drained", d);
  std::printf("\n");
  if (st.guests.empty()) return;
  std::vector<std::vector<std::string>> rows{{"GUEST", "MODE", "STATE", "SOCKET", "PID", "PEER", "UID", "GPUS",
                                              "SMS", "PROCS", "MEMORY", "CALLS/S", "COPY GB/S", "UPTIME", "LAST ERROR"}};
  for (const auto& g : st.guests) {
    std::string gpus;
    for (const int d : g.gpus) gpus += (gpus.empty() ? "" : ",") + std::to_string(d);
      std::string mem = human_bytes(g.mem_used) + " / " + (g.mem_limit == 0 ? "-" : human_bytes(g.mem_limit));
    if (g.mem_host != 0) mem += " (in host memory)";
    char rate[32], copy[32];
    std::snprintf(rate, sizeof rate, "%.0f", g.calls_per_s);
    std::snprintf(copy, sizeof copy, "%.2f", g.copy_bytes_per_s / 1e9);
    rows.push_back({std::to_string(g.id), g.mode, g.state, g.socket, std::to_string(g.pid),
                    g.peer_pid > 0 ? std::to_string(g.peer_pid) : "-", std::to_string(g.uid),
                    gpus.empty() ? "all" : gpus, g.compute == 0 ? "-" : std::to_string(g.compute) + "%",
                    std::to_string(g.processes), mem, rate, copy, duration(g.uptime_s),
                    g.last_error.empty() ? "-" : g.last_error});
  }
  std::vector<std::size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  for (const auto& r : rows) {
    std::string line;
    for (std::size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
}

// Sends a request; prints the daemon's error and returns nullopt when it failed.
std::optional<json> ask(const std::string& socket, const json& request) {
  auto reply = ivcuda::host::control_request(socket, request);
  if (!reply) {
    std::fprintf(stderr, "ivcudactl: %s\n", reply.error().what.c_str());
    return std::nullopt;
  }
  if (!reply->value("ok", false)) {
    std::fprintf(stderr, "ivcudactl: ivcudad says: %s\n", reply->value("error", std::string("failed")).c_str());
    return std::nullopt;
  }
  return *reply;
}

std::optional<ivcuda::host::DaemonStatus> status(const std::string& socket, json* raw = nullptr) {
  auto r = ask(socket, {{"cmd", "status"}});
  if (!r) return std::nullopt;
  try {
    if (raw != nullptr) *raw = r->at("status");
    return ivcuda::host::status_from_json(r->at("status"));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ivcudactl: ivcudad's status has an unexpected shape (%s): is it another version?\n",
                 e.what());
    return std::nullopt;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ivcudactl - status and control of ivcudad"};
  std::string socket = "/run/ivcuda/control.sock";
  if (const char* env = std::getenv("IVCUDA_CONTROL_SOCKET")) socket = env;
  app.add_option("-s,--socket", socket, "ivcudad's control socket (or $IVCUDA_CONTROL_SOCKET)")->capture_default_str();
  app.require_subcommand(1);
  bool as_json = false;
  auto* st = app.add_subcommand("status", "the guests served now: mode, GPUs, memory, call and copy rates");
  st->add_flag("--json", as_json, "the daemon's snapshot as JSON");
  long long guest = 0;
  double wait_s = 10;
  auto* ev = app.add_subcommand("evict", "release everything a guest holds; its calls fail from then on");
  ev->add_option("GUEST", guest, "the guest's number (ivcudactl status)")->required();
  ev->add_option("--wait", wait_s, "seconds to wait for the release (0: do not wait)")->capture_default_str();
  auto* rl = app.add_subcommand("reload", "read ivcudad's configuration again (quotas, object limits)");
  double susp_wait = 120;
  auto* su = app.add_subcommand("suspend", "move a guest's device memory into host memory and give the GPU back; "
                                           "its calls wait until resume");
  su->add_option("GUEST", guest, "the guest's number (ivcudactl status)")->required();
  su->add_option("--wait", susp_wait, "seconds to wait for it (0: do not wait)")->capture_default_str();
  auto* re = app.add_subcommand("resume", "bring a suspended guest back onto the GPU; its calls go on");
  re->add_option("GUEST", guest, "the guest's number (ivcudactl status)")->required();
  re->add_option("--wait", susp_wait, "seconds to wait for it (0: do not wait)")->capture_default_str();
  int gpu = 0;
  auto* dr = app.add_subcommand("drain", "suspend every guest on a GPU and serve no new one there (a driver or "
                                         "firmware update, another tenant); undrain brings them back");
  dr->add_option("GPU", gpu, "the host GPU's ordinal")->required();
  dr->add_option("--wait", susp_wait, "seconds to wait for them (0: do not wait)")->capture_default_str();
  auto* ud = app.add_subcommand("undrain", "serve on a drained GPU again and resume its drained guests");
  ud->add_option("GPU", gpu, "the host GPU's ordinal")->required();
  ud->add_option("--wait", susp_wait, "seconds to wait for them (0: do not wait)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (st->parsed()) {
    json raw;
    auto s = status(socket, &raw);
    if (!s) return 1;
    if (as_json) std::printf("%s\n", raw.dump(2).c_str());
    else print_table(*s);
    return 0;
  }
  if (ev->parsed()) {
    if (!ask(socket, {{"cmd", "evict"}, {"guest", guest}})) return 1;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
    for (;;) {
      auto s = status(socket);
      if (!s) return 1;
      const auto g = std::find_if(s->guests.begin(), s->guests.end(), [&](const auto& x) { return x.id == guest; });
      if (g == s->guests.end()) {
        std::printf("guest %lld: evicted; its process has ended\n", guest);
        return 0;
      }
      if (g->state == "evicted") {
        std::printf("guest %lld: evicted; it holds no device memory, and its calls fail with "
                    "CUDA_ERROR_DEVICE_UNAVAILABLE\n", guest);
        return 0;
      }
      if (std::chrono::steady_clock::now() >= until) {
        std::printf("guest %lld: still releasing (%s held)\n", guest, human_bytes(g->mem_used).c_str());
        return wait_s == 0 ? 0 : 3;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  // Waits until none of `ids` is in a passing state; prints each one's
  // outcome; 0 when each reached `want`.
  const auto settle = [&](const std::vector<long long>& ids, const std::string& want) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(susp_wait);
    for (;;) {
      auto s = status(socket);
      if (!s) return 1;
      bool passing = false;
      for (const long long id : ids) {
        const auto g = std::find_if(s->guests.begin(), s->guests.end(), [&](const auto& x) { return x.id == id; });
        passing = passing || (g != s->guests.end() && (g->state == "suspending" || g->state == "resuming" ||
                                                        g->state == "recovering"));
      }
      if (passing && susp_wait > 0 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      int rc = 0;
      for (const long long id : ids) {
        const auto g = std::find_if(s->guests.begin(), s->guests.end(), [&](const auto& x) { return x.id == id; });
        if (g == s->guests.end()) {
          std::printf("guest %lld: ended\n", id);
          rc = 3;
        } else if (g->state == want && want == "suspended") {
          std::printf("guest %lld: suspended: %s in host memory, none on the GPU (lock %.0f ms, checkpoint %.0f ms)\n",
                      id, human_bytes(g->mem_host).c_str(), g->suspend_lock_ms, g->suspend_out_ms);
        } else if (g->state == want) {
          std::printf("guest %lld: serving again: %s back on the GPU (restore %.0f ms)\n", id,
                      human_bytes(g->mem_device).c_str(), g->suspend_back_ms);
        } else {
          std::printf("guest %lld: %s%s%s\n", id, g->state.c_str(), g->suspend_note.empty() ? "" : ": ",
                      g->suspend_note.c_str());
          rc = 3;
        }
      }
      return susp_wait == 0 ? 0 : rc;
    }
  };
  if (su->parsed() || re->parsed()) {
    if (!ask(socket, {{"cmd", su->parsed() ? "suspend" : "resume"}, {"guest", guest}})) return 1;
    return settle({guest}, su->parsed() ? "suspended" : "serving");
  }
  if (dr->parsed() || ud->parsed()) {
    auto r = ask(socket, {{"cmd", dr->parsed() ? "drain" : "undrain"}, {"gpu", gpu}});
    if (!r) return 1;
    std::vector<long long> ids;
    for (const auto& id : r->value(dr->parsed() ? "suspending" : "resuming", json::array())) ids.push_back(id.get<long long>());
    for (const auto& n : r->value("not_suspended", json::array()))
      std::printf("guest %lld: not suspended: %s\n", n.value("guest", -1LL), n.value("error", std::string()).c_str());
    std::printf("GPU %d %s; %zu guest(s) %s\n", gpu, dr->parsed() ? "drained" : "in service again", ids.size(),
                dr->parsed() ? "suspending" : "resuming");
    return ids.empty() ? 0 : settle(ids, dr->parsed() ? "suspended" : "serving");
  }
  if (rl->parsed()) {
    auto r = ask(socket, {{"cmd", "reload"}});
    if (!r) return 1;
    const auto& changed = r->value("changed", json::array());
    if (changed.empty()) std::printf("reloaded; nothing changed\n");
    for (const auto& c : changed) std::printf("changed: %s\n", c.get<std::string>().c_str());
    for (const auto& c : r->value("ignored", json::array())) std::printf("ignored: %s\n", c.get<std::string>().c_str());
    return 0;
  }
  return 2;
}
