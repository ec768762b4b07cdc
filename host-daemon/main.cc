// ivcudad: owns the GPU and serves guests. It listens on a UNIX socket and
// speaks the server side of QEMU's ivshmem protocol, so that stock QEMU's
// ivshmem-doorbell device and local processes ("process mode") connect the
// same way. Every guest gets its own shared memory and its own worker
// process; this parent never touches the GPU.
#include <signal.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <grp.h>
#include <sys/stat.h>
#ifdef IVCUDA_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <memory>
#include <set>
#include <sstream>
#include <vector>

#include "host-daemon/board.h"
#include "host-daemon/control.h"
#include "host-daemon/log.h"
#include "host-daemon/mps.h"
#include "host-daemon/plain_file.h"
#ifdef IVCUDA_HAVE_METRICS
#include "host-daemon/metrics.h"
#endif
#include "host-daemon/rules.h"
#include "host-daemon/sandbox.h"
#include "host-daemon/status.h"
#include "host-daemon/tenant_share.h"
#include "host-daemon/vm_supervisor.h"
#include "host-daemon/worker.h"
#include "ring/ivshmem.h"
#include "ring/layout.h"

namespace {

volatile sig_atomic_t g_stop = 0;
volatile sig_atomic_t g_reload = 0;  // SIGHUP: read the configuration again
constexpr std::size_t kNoListener = static_cast<std::size_t>(-1);
// --join: other peers of the ivshmem-server whose eventfds we keep.
constexpr std::size_t kJoinMaxPeers = 8;
ivcuda::host::Worker* g_worker = nullptr;

void on_hangup(int) { g_reload = 1; }

// The per-uid books of workers (worker_budget.h), made before the daemon
// forks anything, so that every connection's process has them.
ivcuda::host::WorkerBudget* g_budget = nullptr;

void on_signal(int) {
  g_stop = 1;
  if (g_worker != nullptr) g_worker->stop();
}

struct Options {
  std::string socket = "/run/ivcuda/ivcudad.sock";
  std::uint64_t shm_size = 1ull << 30;
  std::string gpus;
  std::size_t vectors = 8;
  std::uint32_t channels = 32;
  std::uint64_t ring_size = 256 * 1024;
  std::uint64_t staging = 8ull << 20;
  std::string driver = "libcuda.so.1";
  std::string nvml = "libnvidia-ml.so.1";
  unsigned spin_us = 200;
  unsigned max_guests = 64;
  unsigned max_guests_per_uid = 16;
  std::string log_level = "info";
  std::vector<std::string> plain_files;
  unsigned poll_us = 500;
  std::string join;
  std::vector<std::string> guest_sockets;  // SOCKET=GPUS
  std::uint32_t share_slots = ivcuda::host::ShareRegistry::kDefaultSlots;           // per tenant
  std::uint32_t share_slots_guest = ivcuda::host::ShareRegistry::kDefaultPerGuest;  // per guest
  std::uint32_t vm_spares = 1;
  std::uint32_t max_workers_per_guest = 8;  // a VM's workers at once, spares included
  unsigned warm_workers = 1;  // per socket: started ahead of the next guest
  unsigned warm_burst = 4;    // --warm-burst: more ahead while guests arrive fast
  std::string huge_pages = "off";  // --huge-pages on|off: guests' memory on 2 MiB pages
  std::uint64_t mem_limit = 0;  // device memory per guest; 0: no limit
  std::uint64_t context_reserve = ivcuda::host::kDefaultContextReserve;  // --context-reserve: per context, charged
  std::string recycle = "on";        // --recycle-workers: a warm worker serves the tenant's next guest too
  std::string pin_arena = "on-use";  // --pin-arena: when a worker page-locks the guest's arena
  ivcuda::host::ObjectLimits limits;     // --object-limits
  std::string socket_group;              // --socket-group: who may connect (QEMU's user)
  std::string socket_mode;               // --socket-mode, octal
  ivcuda::host::sandbox::Config sandbox;  // --sandbox, --user
  std::string sandbox_mode = "on";
  bool print_allowlist = false;
  std::string control_socket = "/run/ivcuda/control.sock";  // ivcudactl's; "" or "none": off
  bool control_socket_given = false;     // on the command line or in the config file
  std::string control_group;             // --control-group: who besides root may use it
  std::string metrics_listen;            // --metrics-listen ADDR:PORT; "": off
  bool mps = false;                      // --mps: workers are MPS clients (host-daemon/mps.h)
  ivcuda::host::MpsConfig mps_cfg;       // --mps-pipe-dir, --mps-log-dir
  unsigned compute = 100;                // --compute-share: % of the SMs per guest under MPS
  std::uint64_t mps_headroom = 2ull << 30;  // --mps-mem-headroom: MPS's memory cap is quota + this
};

// --object-limits KIND=N[,KIND=N...]: how many objects of a kind one guest
// process may hold at once (host-daemon/worker.h, ObjectLimits).
std::string parse_object_limits(const std::string& spec, ivcuda::host::ObjectLimits* out) {
  using L = ivcuda::host::ObjectLimits;
  static const std::pair<const char*, std::uint32_t L::*> kKinds[] = {
      {"contexts", &L::contexts},       {"streams", &L::streams},         {"events", &L::events},
      {"modules", &L::modules},         {"graphs", &L::graphs},           {"graph-nodes", &L::graph_nodes},
      {"graph-execs", &L::graph_execs}, {"arrays", &L::arrays},           {"pools", &L::pools},
      {"mem-handles", &L::mem_handles}, {"user-objects", &L::user_objects}, {"links", &L::links},
      {"green-contexts", &L::green_contexts}, {"resource-descs", &L::resource_descs}, {"resources", &L::resources}};
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    auto kind = std::find_if(std::begin(kKinds), std::end(kKinds), [&](const auto& k) { return key == k.first; });
    if (kind == std::end(kKinds)) {
      std::string known;
      for (const auto& k : kKinds) known += std::string(known.empty() ? "" : ", ") + k.first;
      return "unknown kind '" + key + "' (kinds: " + known + ")";
    }
    char* end = nullptr;
    const std::string value = eq == std::string::npos ? std::string() : item.substr(eq + 1);
    const unsigned long n = std::strtoul(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || n == 0 || n > 0xffffffffu)
      return "'" + item + "': expected " + key + "=N with N from 1 to 4294967295";
    out->*(kind->second) = static_cast<std::uint32_t>(n);
  }
  return {};
}

// Workers a socket keeps started ahead at most (--warm-workers, warm=N).
constexpr unsigned kMaxWarm = 8;

// A --guest-socket entry:
// SOCKET=GPUS[:mem-limit=SIZE][:compute=PCT][:warm=N][:huge-pages=on|off].
// The socket's path holds no ':'. Returns false with *err set.
struct SocketSpec {
  std::string path;
  std::vector<int> gpus;
  std::uint64_t mem_limit = 0;
  unsigned compute = 100;  // % of the SMs under --mps
  unsigned warm = 1;       // workers started ahead (--warm-workers)
  bool huge = false;       // guests' memory on 2 MiB pages (--huge-pages)
};
bool parse_socket_spec(const std::string& spec, std::uint64_t default_limit, unsigned default_compute,
                       unsigned default_warm, bool default_huge, SocketSpec* out, std::string* err);

std::vector<int> parse_gpus(const std::string& s, std::string* err) {
  std::vector<int> out;
  if (s.empty() || s == "all") return out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > 1023) {
      *err = "bad GPU index '" + item + "' in --gpus";
      return {};
    }
    out.push_back(static_cast<int>(v));
  }
  return out;
}

bool parse_socket_spec(const std::string& spec, std::uint64_t default_limit, unsigned default_compute,
                       unsigned default_warm, bool default_huge, SocketSpec* out, std::string* err) {
  std::vector<std::string> parts;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ':')) parts.push_back(item);
  const std::string head = parts.empty() ? std::string() : parts[0];
  const auto eq = head.rfind('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == head.size()) {
    *err = "no SOCKET=GPUS";
    return false;
  }
  out->path = head.substr(0, eq);
  out->gpus = parse_gpus(head.substr(eq + 1), err);
  if (!err->empty()) return false;
  out->mem_limit = default_limit;
  out->compute = default_compute;
  out->warm = default_warm;
  out->huge = default_huge;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const auto kv = parts[i].find('=');
    const std::string key = parts[i].substr(0, kv);
    std::string value = kv == std::string::npos ? std::string() : parts[i].substr(kv + 1);
    if (key == "compute" && !value.empty()) {
      char* end = nullptr;
      const unsigned long pct = std::strtoul(value.c_str(), &end, 10);
      if (*end != '\0' || pct < 1 || pct > 100) {
        *err = "compute: '" + value + "' is not a percentage from 1 to 100";
        return false;
      }
      out->compute = static_cast<unsigned>(pct);
      continue;
    }
    if (key == "warm" && !value.empty()) {
      char* end = nullptr;
      const unsigned long n = std::strtoul(value.c_str(), &end, 10);
      if (*end != '\0' || n > kMaxWarm) {
        *err = "warm: '" + value + "' is not a count from 0 to " + std::to_string(kMaxWarm);
        return false;
      }
      out->warm = static_cast<unsigned>(n);
      continue;
    }
    if (key == "huge-pages" && (value == "on" || value == "off")) {
      out->huge = value == "on";
      continue;
    }
    if (key != "mem-limit" || value.empty()) {
      *err = "unknown setting '" + parts[i] + "'";
      return false;
    }
    // CLI11's size parser, as for --mem-limit: 20G, 512M, 1073741824.
    try {
      if (const std::string bad = CLI::AsSizeValue(false)(value); !bad.empty()) {
        *err = "mem-limit: " + bad;
        return false;
      }
      out->mem_limit = std::stoull(value);
    } catch (const std::exception& e) {
      *err = std::string("mem-limit: ") + e.what();
      return false;
    }
  }
  return true;
}

std::uint64_t new_generation() {
  std::uint64_t g = 0;
  if (::getrandom(&g, sizeof g, 0) != sizeof g) g = static_cast<std::uint64_t>(::time(nullptr)) ^ ::getpid();
  return g | 1;  // never zero
}

// Maps the memory and writes a fresh layout: whatever a previous daemon or
// guest left there is not trusted. Only in a child of format_shared's.
bool format_in_place(int fd, const ivcuda::ring::Layout& layout, std::uint64_t generation, std::uint32_t host_peer,
                     std::uint32_t vectors, std::uint64_t features) {
  auto map = ivcuda::sys::Mapping::map_shared(fd, layout.shm_size);
  if (!map) return false;
  std::memset(map->data(), 0, layout.rings_off + layout.channel_stride * layout.channels);
  return ivcuda::ring::format_bar(map->data(), layout, generation, host_peer, vectors, features).ok();
}

// Clears and formats memory that others hold too: an ivshmem-plain file that
// QEMU opens, or the memory of an ivshmem-server whose peers all have its fd.
// Such memory can shrink under a mapping, and touching a page past its new
// end (or one its file system has no room for) raises SIGBUS. So the size is
// checked first, and a short-lived child does the touching: a fault costs
// that child, never the daemon that serves every guest. Returns false
// (logged) if the memory is not served.
ivcuda::Result<void> format_shared(int fd, const ivcuda::ring::Layout& layout, std::uint64_t generation,
                                   std::uint32_t host_peer, std::uint32_t vectors, std::uint64_t features) {
  IVCUDA_TRY_ASSIGN(const std::uint64_t size, ivcuda::sys::file_size(fd));
  if (IVCUDA_RULE("shared-memory-size") && size < layout.shm_size)
    return ivcuda::make_error(EINVAL, "the shared memory has " + std::to_string(size) +
                                          " bytes, the layout needs " + std::to_string(layout.shm_size));
  if (!IVCUDA_RULE("format-in-child"))  // the mutant: the daemon touches the memory itself
    return format_in_place(fd, layout, generation, host_peer, vectors, features)
               ? ivcuda::Result<void>{}
               : ivcuda::make_error(EIO, "cannot map the shared memory to format it");
  const pid_t pid = ::fork();
  if (pid < 0) return ivcuda::make_error(errno, std::string("fork: ") + std::strerror(errno));
  if (pid == 0) ::_exit(format_in_place(fd, layout, generation, host_peer, vectors, features) ? 0 : 4);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status))
    return ivcuda::make_error(EFAULT, "formatting the shared memory died of signal " +
                                          std::to_string(WTERMSIG(status)) + " (it shrank meanwhile?)");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return ivcuda::make_error(EIO, "cannot map the shared memory to format it");
  return {};
}

// The sandbox's two steps around each worker's start (host-daemon/sandbox.h):
// the first in the freshly forked worker before the driver loads, the second
// once its driver, contexts and arena are ready. Each worker is a process of
// its own, so one record of what was applied per process is enough.
void sandbox_hooks(const Options& o, ivcuda::host::SupervisorConfig& sc) {
  namespace sandbox = ivcuda::host::sandbox;
  static sandbox::Applied applied;
  const sandbox::Config* cfg = &o.sandbox;
  sc.before_start = [cfg](const ivcuda::host::WorkerConfig& wc) {
    return sandbox::before_driver(*cfg, {wc.driver_path, wc.nvml_path}, &applied);
  };
  sc.after_start = [cfg](ivcuda::host::Worker&) -> ivcuda::Result<void> {
    IVCUDA_TRY(sandbox::after_driver(*cfg, &applied));
    sandbox::self_test_if_asked(applied);
    return {};
  };
}

// One worker in this process, sandboxed, serving until its guest leaves
// (--join: a guest peer of somebody else's server). Returns its exit status.
int serve_one(const Options& o, ivcuda::host::WorkerConfig cfg, long long id) {
  ivcuda::host::SupervisorConfig sc;
  sandbox_hooks(o, sc);
  if (auto st = sc.before_start(cfg); !st) {
    IVLOG_ERROR("guest %lld: cannot sandbox the worker: %s", id, st.error().what.c_str());
    return 2;
  }
  auto w = ivcuda::host::Worker::create(std::move(cfg));
  if (!w) {
    IVLOG_ERROR("guest %lld: cannot start: %s", id, w.error().what.c_str());
    return 2;
  }
  if (auto st = sc.after_start(**w); !st) {
    IVLOG_ERROR("guest %lld: cannot sandbox the worker: %s", id, st.error().what.c_str());
    return 2;
  }
  g_worker = w->get();
  if (g_stop != 0) g_worker->stop();  // a SIGTERM that came while we started
  const int rc = (*w)->run();
  g_worker = nullptr;
  return rc;
}

// What a guest connection's process is given: everything a worker needs,
// and what its supervisor needs beyond that. conn_fd and peer_pid are -1
// for a warm entry (they come with the guest).
struct GuestSetup {
  const std::vector<int>* gpus = nullptr;
  std::uint64_t mem_limit = 0;
  const ivcuda::ring::Layout* layout = nullptr;
  std::uint64_t generation = 0;
  std::int64_t id = 0;
  int shm_fd = -1;
  const ivcuda::ivshmem::GuestConnection* fds = nullptr;  // doorbells (and conn when there)
  int broker_fd = -1;
  pid_t peer_pid = -1;
  ivcuda::host::GuestStats* stats = nullptr;
  std::vector<std::string> driver_env;
};

ivcuda::host::SupervisorConfig supervisor_config(const Options& o, const GuestSetup& g) {
  ivcuda::host::SupervisorConfig sc;
  ivcuda::host::WorkerConfig& cfg = sc.worker;
  cfg.guest_id = static_cast<std::uint32_t>(g.id);
  cfg.shm_fd = g.shm_fd;
  cfg.layout = *g.layout;
  cfg.generation = g.generation;
  for (auto& fd : g.fds->host_fds) cfg.host_fds.push_back(fd.get());
  for (auto& fd : g.fds->guest_fds) cfg.guest_fds.push_back(fd.get());
  cfg.conn_fd = g.fds->conn.valid() ? g.fds->conn.get() : -1;
  cfg.driver_path = o.driver;
  cfg.nvml_path = o.nvml == "none" ? std::string() : o.nvml;
  cfg.devices = *g.gpus;
  cfg.mem_limit = g.mem_limit;
  cfg.context_reserve = o.context_reserve;
  cfg.pin_arena_at_start = o.pin_arena == "at-start";
  cfg.limits = o.limits;
  cfg.stats = g.stats;
  cfg.driver_env = g.driver_env;
  cfg.spin = std::chrono::microseconds(o.spin_us);
  cfg.broker_fd = g.broker_fd;
  sc.peer_pid = g.peer_pid;
  sc.spares = o.vm_spares;
  sc.max_workers = o.max_workers_per_guest;
  sc.budget = g_budget;
  sc.uid_limit = o.max_guests_per_uid;
  sc.running = &g_worker;
  sc.recycle = o.recycle == "on";
  sandbox_hooks(o, sc);
  return sc;
}

// The connection's process: a VM's supervisor with a worker per guest
// process, or, when the peer is the CUDA program itself, its one worker
// (host-daemon/vm_supervisor.h).
int run_worker(const Options& o, const GuestSetup& g) {
  // Die with the daemon: a worker must not outlive the process that manages it.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  return ivcuda::host::run_supervisor(supervisor_config(o, g), &g_stop);
}

// A warm entry's process: the same, started before its guest connects; the
// daemon hands it the guest on handoff_fd (vm_supervisor.h).
int run_warm(const Options& o, const GuestSetup& g, int handoff_fd) {
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  return ivcuda::host::run_warm_supervisor(supervisor_config(o, g), handoff_fd, &g_stop);
}

// Creates and formats an ivshmem-plain memory file and forks its worker.
pid_t spawn_plain_worker(const Options& o, const std::vector<int>& gpus, const ivcuda::ring::Layout& layout,
                         std::uint64_t generation, const std::string& path, std::int64_t id,
                         ivcuda::host::GuestStats* stats, ivcuda::host::FdBroker& broker,
                         const std::function<void()>& forget_in_child, const std::vector<std::string>& driver_env) {
  // Made here, exclusively, or one an ivcudad made before (plain_file.h).
  gid_t group = static_cast<gid_t>(-1);
  if (!o.socket_group.empty()) {
    const struct group* g = ::getgrnam(o.socket_group.c_str());
    if (g == nullptr) {
      IVLOG_ERROR("--socket-group %s: no such group", o.socket_group.c_str());
      return -1;
    }
    group = g->gr_gid;
  }
  auto plain = ivcuda::host::open_plain_file(path, o.shm_size, group);
  if (!plain) {
    IVLOG_ERROR("ivshmem-plain file %s; not serving it", plain.error().what.c_str());
    return -1;
  }
  IVLOG_INFO("ivshmem-plain file %s: %s", path.c_str(),
             plain->created ? "made (O_EXCL)" : "an ivcudad's earlier file, served again");
  ivcuda::sys::UniqueFd fd = std::move(plain->fd);
  // QEMU opens this file too: format it as memory others hold.
  if (auto f = format_shared(fd.get(), layout, generation, 0, 1, 0); !f) {
    IVLOG_ERROR("ivshmem-plain file %s: %s; not serving it", path.c_str(), f.error().what.c_str());
    return -1;
  }
  auto host_efd = ivcuda::sys::make_eventfd(true);
  auto guest_efd = ivcuda::sys::make_eventfd(true);
  if (!host_efd || !guest_efd) return -1;
  // The file's guest is a tenant of its own; its processes' workers share
  // through the broker.
  auto broker_end = broker.add_worker(static_cast<std::uint32_t>(id), ivcuda::host::Tenancy::own());
  const pid_t pid = ::fork();
  if (pid != 0) {
    if (pid > 0) IVLOG_INFO("ivshmem-plain guest %lld on %s; worker pid %d", static_cast<long long>(id), path.c_str(),
                            static_cast<int>(pid));
    return pid;
  }
  forget_in_child();
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  ivcuda::host::SupervisorConfig sc;
  ivcuda::host::WorkerConfig& cfg = sc.worker;
  cfg.guest_id = static_cast<std::uint32_t>(id);
  cfg.shm_fd = fd.get();
  cfg.layout = layout;
  cfg.generation = generation;
  cfg.host_fds.push_back(host_efd->get());    // nobody rings these: no interrupts
  cfg.guest_fds.push_back(guest_efd->get());  // in ivshmem-plain
  cfg.driver_path = o.driver;
  cfg.nvml_path = o.nvml == "none" ? std::string() : o.nvml;
  cfg.devices = gpus;
  cfg.mem_limit = o.mem_limit;
  cfg.context_reserve = o.context_reserve;
  cfg.pin_arena_at_start = o.pin_arena == "at-start";
  cfg.limits = o.limits;
  cfg.stats = stats;
  cfg.driver_env = driver_env;
  cfg.spin = std::chrono::microseconds(o.spin_us);
  cfg.poll_only = true;
  cfg.poll_interval = std::chrono::microseconds(o.poll_us);
  cfg.broker_fd = broker_end ? broker_end->release() : -1;
  sc.spares = o.vm_spares;
  sc.max_workers = o.max_workers_per_guest;
  sc.budget = g_budget;
  sc.uid_limit = o.max_guests_per_uid;
  sc.running = &g_worker;
  sandbox_hooks(o, sc);
  ::_exit(ivcuda::host::run_supervisor(std::move(sc), &g_stop));
}

// --join: we are one peer of somebody else's ivshmem-server. Its memory is
// shared by all its peers, so we serve the first guest that appears, then
// the next one after it left.
int run_join(const Options& o, const std::vector<int>& gpus, std::uint64_t generation,
             const std::vector<std::string>& driver_env) {
  // We serve one guest at a time, so a few peers' eventfds are all we need:
  // peers beyond them cannot run the daemon out of descriptors.
  auto client = ivcuda::ivshmem::ivshmem_connect(o.join, std::chrono::milliseconds(5000), o.vectors, {},
                                                 kJoinMaxPeers);
  if (!client) {
    IVLOG_ERROR("cannot join the ivshmem-server at %s: %s", o.join.c_str(), client.error().what.c_str());
    return 1;
  }
  ivcuda::ring::LayoutParams lp;
  lp.shm_size = client->shm_size();
  lp.channels = o.channels;
  lp.ring_bytes = static_cast<std::uint32_t>(o.ring_size);
  lp.staging_bytes = o.staging;
  auto layout = ivcuda::ring::plan_layout(lp);
  if (!layout) {
    IVLOG_ERROR("the server's %llu MiB of memory do not fit: %s",
                static_cast<unsigned long long>(lp.shm_size >> 20), layout.error().what.c_str());
    return 1;
  }
  const std::int64_t me = client->id();
  std::string refused;  // why the memory is not served now (logged once per reason)
  while (g_stop == 0) {
    // Every peer of that server holds the memory's fd and may have shrunk it
    // (the server seals nothing): check and format it anew before each guest.
    // While it is unusable, look again on every peer change and every second.
    auto f = format_shared(client->shm_fd(), *layout, generation, static_cast<std::uint32_t>(me),
                           static_cast<std::uint32_t>(o.vectors),
                           ivcuda::abi::kFeatDoorbell | ivcuda::abi::kFeatArenaRegistered);
    if (!f) {
      if (f.error().what != refused)
        IVLOG_ERROR("the memory of the ivshmem-server at %s: %s; not serving it until that changes", o.join.c_str(),
                    f.error().what.c_str());
      refused = f.error().what;
      (void)ivcuda::sys::wait_readable(client->socket_fd(), 1000);
      auto ev = client->process_pending();
      if (!ev) {
        IVLOG_ERROR("the ivshmem-server went away: %s", ev.error().what.c_str());
        return 1;
      }
      continue;
    }
    refused.clear();
    IVLOG_INFO("joined %s as peer %lld; waiting for a guest", o.join.c_str(), static_cast<long long>(me));
    std::int64_t guest = -1;
    while (g_stop == 0 && guest < 0) {
      auto ev = client->process_pending();
      if (!ev) {
        IVLOG_ERROR("the ivshmem-server went away: %s", ev.error().what.c_str());
        return 1;
      }
      for (const auto& [id, fds] : client->peers())
        if (id != me && fds.size() >= o.vectors) guest = id;
      if (guest < 0) (void)ivcuda::sys::wait_readable(client->socket_fd(), 200);
    }
    if (guest < 0) break;
    // Each guest of the server is a tenant of its own, served by one worker
    // with no line to a broker: its processes share through that worker's
    // own registry (tenant_share.h).
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      ivcuda::host::WorkerConfig cfg;
      cfg.guest_id = static_cast<std::uint32_t>(guest);
      cfg.shm_fd = client->shm_fd();
      cfg.layout = *layout;
      cfg.generation = generation;
      for (const auto& fd : client->own_eventfds()) cfg.host_fds.push_back(fd.get());
      for (const auto& fd : client->peers().at(guest)) cfg.guest_fds.push_back(fd.get());
      cfg.driver_path = o.driver;
      cfg.nvml_path = o.nvml == "none" ? std::string() : o.nvml;
      cfg.devices = gpus;
      cfg.mem_limit = o.mem_limit;
      cfg.context_reserve = o.context_reserve;
      cfg.pin_arena_at_start = o.pin_arena == "at-start";
      cfg.limits = o.limits;
      cfg.driver_env = driver_env;
      cfg.spin = std::chrono::microseconds(o.spin_us);
      ::_exit(serve_one(o, std::move(cfg), static_cast<long long>(guest)));
    }
    IVLOG_INFO("serving guest peer %lld; worker pid %d", static_cast<long long>(guest), static_cast<int>(pid));
    // The worker serves until the guest leaves the server (or we stop).
    bool left = false, reaped = false;
    int status = 0;
    while (g_stop == 0 && !left) {
      (void)ivcuda::sys::wait_readable(client->socket_fd(), 200);
      auto ev = client->process_pending();
      if (!ev) {
        IVLOG_ERROR("the ivshmem-server went away: %s", ev.error().what.c_str());
        g_stop = 1;
        break;
      }
      left = client->peers().count(guest) == 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) reaped = left = true;
    }
    if (!reaped) {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, &status, 0);
    }
    if (WIFSIGNALED(status))
      IVLOG_WARN("worker for guest peer %lld died of signal %d", static_cast<long long>(guest), WTERMSIG(status));
    IVLOG_INFO("guest peer %lld left; its worker is gone", static_cast<long long>(guest));
  }
  return 0;
}

// The command line and config file. A function, so that a reload reads
// them again into a fresh Options the same way.
void define_options(CLI::App& app, Options& o) {
  app.set_config("--config", "", "read options from an INI/TOML file (keys = long option names)");
  app.add_option("--socket", o.socket, "UNIX socket to listen on (QEMU: -chardev socket,path=...)")
      ->capture_default_str();
  app.add_option("--shm-size", o.shm_size, "shared memory per guest, e.g. 512M, 2G")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--object-limits",
         [&](const std::string& v) {
           if (const std::string bad = parse_object_limits(v, &o.limits); !bad.empty())
             throw CLI::ValidationError("--object-limits", bad);
         },
         "objects one guest process may hold at once, e.g. streams=1000,events=50000 (kinds: contexts, "
         "streams, events, modules, graphs, graph-nodes, graph-execs, arrays, pools, mem-handles, "
         "user-objects; defaults in docs/operating.md)");
  app.add_option("--gpus", o.gpus, "host GPU indices guests may use, e.g. 0,2 (default: all)");
  app.add_option("--vectors", o.vectors, "doorbell vectors per peer (QEMU's ivshmem vectors= must match)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--channels", o.channels, "channels per guest (threads with their own ring)")
      ->check(CLI::Range(2, 256))
      ->capture_default_str();
  app.add_option("--ring-size", o.ring_size, "bytes per ring, a power of two")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--staging-size", o.staging, "staging bytes per channel for pageable copies")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--driver", o.driver, "the CUDA driver library to load")->capture_default_str();
  app.add_option("--nvml", o.nvml,
                 "the NVML library workers load to answer their guests' NVML queries (\"none\": guests' NVML "
                 "answers LIBRARY_NOT_FOUND)")
      ->capture_default_str();
  app.add_option("--spin-us", o.spin_us, "how long a worker polls after the last request before sleeping")
      ->capture_default_str();
  app.add_option("--max-guests", o.max_guests, "guests served at once")->capture_default_str();
  app.add_option("--max-guests-per-uid", o.max_guests_per_uid,
                 "guests served at once for one connecting user id (0: no limit besides --max-guests); "
                 "each guest pins --shm-size of RAM and counts one, and each further worker of a VM that "
                 "serves a process one more (each holds a GPU context)")
      ->capture_default_str();
  app.add_option("--max-workers-per-guest", o.max_workers_per_guest,
                 "worker processes one VM may have at once, spare workers included (a VM's CUDA process gets "
                 "a worker each; each holds a context on every GPU); a process past it is refused")
      ->check(CLI::Range(1u, ivcuda::host::VmShared::kMaxSlots))
      ->capture_default_str();
  app.add_option("--plain-file", o.plain_files,
                 "serve an ivshmem-plain guest through this memory file (QEMU: memory-backend-file, "
                 "share=on, mem-path=FILE, size=--shm-size); repeatable. No interrupts: both sides poll")
      ->take_all();
  app.add_option("--plain-poll-us", o.poll_us, "how often an idle ivshmem-plain worker looks for work")
      ->capture_default_str();
  app.add_option("--join", o.join,
                 "join an existing ivshmem-server at this socket as its host peer, instead of listening; "
                 "it serves one guest at a time (all peers of such a server share one memory)");
  app.add_option("--guest-socket", o.guest_sockets,
                 "SOCKET=GPUS[:mem-limit=SIZE][:compute=PCT][:warm=N]: one more socket, whose guests get only "
                 "these host GPUs (e.g. /run/ivcuda/vm2.sock=1:mem-limit=20G); repeatable. One socket per VM "
                 "gives each VM its own GPUs and quota")
      ->take_all();
  app.add_option("--socket-group", o.socket_group,
                 "group given the sockets, so that its members (QEMU's user) may connect; with it the "
                 "sockets' mode is 0660 unless --socket-mode says otherwise");
  app.add_option("--socket-mode", o.socket_mode, "the sockets' permission bits, octal, e.g. 0660")
      ->check([](const std::string& v) {
        char* end = nullptr;
        const unsigned long m = std::strtoul(v.c_str(), &end, 8);
        return v.empty() || *end != '\0' || m > 0777 ? std::string("an octal mode from 0 to 0777") : std::string();
      });
  app.add_option("--mem-limit", o.mem_limit,
                 "device memory each guest may hold, e.g. 20G (0: no limit); a VM's processes share it, "
                 "and cuMemGetInfo/cuDeviceTotalMem show it as the total")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--context-reserve", o.context_reserve,
                 "device memory charged to a guest's quota for each CUDA context its worker holds for it (the "
                 "one it starts with, created ones, other GPUs' primary ones; 0: none); a guest whose quota "
                 "cannot cover its first context gets CUDA_ERROR_OUT_OF_MEMORY from cuInit")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--pin-arena", o.pin_arena,
                 "when a worker page-locks the guest's arena for the GPU: on-use (a channel's staging when "
                 "it is first served, page-locked allocations when made; a worker made for a guest starts "
                 "in milliseconds) or at-start (all of it, about 0.8 s per GiB, before the guest is served)")
      ->check(CLI::IsMember({"on-use", "at-start"}))
      ->capture_default_str();
  app.add_option("--recycle-workers", o.recycle,
                 "on: a warm worker whose process-mode guest ended with nothing under way resets its contexts "
                 "(the driver frees and scrubs their memory) and waits, with new shared memory and doorbells, "
                 "for the next guest of the same user on the same socket, so that programs run back to back "
                 "do not wait for a driver and context to start (docs/security.md says what is reset)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--share-slots", o.share_slots,
                 "objects (CUDA IPC memory and event handles, pool pointers) one tenant may have exported at "
                 "once (a tenant: a VM, or one user's process-mode programs on one socket)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--share-slots-per-guest", o.share_slots_guest,
                 "of those, what one guest (one VM, one process-mode program) may have exported at once")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--warm-workers", o.warm_workers,
                 "workers kept started per socket for the next guest, so that it finds its driver, context and "
                 "registered memory ready (each holds a context on the socket's first GPU and --shm-size of "
                 "page-locked RAM; per socket: --guest-socket ...:warm=N; 0: none)")
      ->check(CLI::Range(0u, kMaxWarm))
      ->capture_default_str();
  app.add_option("--warm-burst", o.warm_burst,
                 "while guests arrive faster than workers start, each socket with warm workers keeps up to this "
                 "many more started ahead (one more per guest beyond the first in the last 2 s); 30 s without a guest "
                 "lets the extra ones go (each holds a context; 0: never more than --warm-workers)")
      ->check(CLI::Range(0u, kMaxWarm))
      ->capture_default_str();
  app.add_option("--huge-pages", o.huge_pages,
                 "on: each guest's shared memory on 2 MiB huge pages from the host's reserved pool "
                 "(vm.nr_hugepages), 4 KiB pages when too few are free; its registration with the GPU is "
                 "faster. For VM sockets: a process-mode guest on huge pages cannot register its own memory "
                 "zero-copy (cuMemHostRegister then stages). Per socket: --guest-socket ...:huge-pages=on")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--vm-spare-workers", o.vm_spares,
                 "workers kept started per VM for its next CUDA process (each holds a context per GPU)")
      ->check(CLI::Range(0u, 8u))
      ->capture_default_str();
  app.add_option("--sandbox", o.sandbox_mode,
                 "on: each worker runs with no_new_privs, no capabilities, a seccomp allowlist and Landlock "
                 "once its driver is open, and the daemon does not serve on a kernel below Landlock ABI 6; "
                 "degraded: the same with whatever Landlock the kernel has (said at start); off: none of it, "
                 "for debugging only. Also from the environment: IVCUDA_SANDBOX")
      ->check(CLI::IsMember({"on", "degraded", "off"}))
      ->envname("IVCUDA_SANDBOX")
      ->capture_default_str();
  app.add_option("--user", o.sandbox.user,
                 "workers drop to this user once their driver is open (the daemon must run as root; the "
                 "user needs read-write access to /dev/nvidia*)");
  app.add_flag("--print-syscall-allowlist", o.print_allowlist,
               "print the system calls a sandboxed worker may make, with why, and exit");
  app.add_option("--log-level", o.log_level, "error, warn, info or debug")
      ->check(CLI::IsMember({"error", "warn", "info", "debug"}))
      ->capture_default_str();
  app.add_option("--control-socket", o.control_socket,
                 "the operator's socket (ivcudactl status, evict, reload); only root, the daemon's user and "
                 "--control-group may use it; \"none\": no control socket")
      ->capture_default_str();
  app.add_option("--control-group", o.control_group,
                 "group whose members may use the control socket (its mode becomes 0660)");
  app.add_flag("--mps", o.mps,
               "run every worker as a client of NVIDIA MPS (started here, or joined), so guests' kernels share "
               "the GPU side by side with --compute-share of its SMs each (docs/operating.md)");
  app.add_option("--compute-share", o.compute,
                 "with --mps: the percentage of the GPU's SMs one guest may use (per socket: "
                 "--guest-socket ...:compute=N)")
      ->check(CLI::Range(1u, 100u))
      ->capture_default_str();
  app.add_option("--mps-pipe-dir", o.mps_cfg.pipe_dir, "with --mps: the MPS control daemon's pipe directory")
      ->capture_default_str();
  app.add_option("--mps-log-dir", o.mps_cfg.log_dir, "with --mps: the MPS control daemon's log directory")
      ->capture_default_str();
  app.add_option("--mps-mem-headroom", o.mps_headroom,
                 "with --mps and a quota: MPS caps each guest's device memory at its quota plus this (code and "
                 "what a context holds beyond --context-reserve take memory that the quota does not count)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--metrics-listen", o.metrics_listen,
                 "serve Prometheus metrics at http://ADDR:PORT/metrics, e.g. 127.0.0.1:9400 (DCGM-style names)");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"ivcudad - serves CUDA to QEMU guests and local processes over ivshmem"};
  define_options(app, o);
  CLI11_PARSE(app, argc, argv);
  if (o.print_allowlist) {
    for (const auto& s : ivcuda::host::sandbox::allowlist())
      std::printf("%s\t%s\t%s\n", s.name, ivcuda::host::sandbox::rule_name(s.rule), s.why);
    return 0;
  }
  (void)ivcuda::host::sandbox::parse_mode(o.sandbox_mode, &o.sandbox.mode);  // checked by CLI11
  o.control_socket_given = app.get_option("--control-socket")->count() > 0;

  using ivcuda::log::Level;
  ivcuda::log::set_level(o.log_level == "error" ? Level::kError
                         : o.log_level == "warn" ? Level::kWarn
                         : o.log_level == "debug" ? Level::kDebug
                                                  : Level::kInfo);
  // Each guest costs the daemon a few fds, and the fd broker holds exported
  // allocations for tenants: take the whole allowance (poll, never select).
  if (rlimit rl{}; ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &rl);
  }
#if defined(IVCUDA_MUTANTS)
  if (*ivcuda::host::rules::removed() != '\0')
    IVLOG_WARN("mutation build: rule(s) %s removed for this run (IVCUDA_MUTATE; tests/mutations)",
               ivcuda::host::rules::removed());
#endif
  if (auto u = ivcuda::host::sandbox::resolve_user(o.sandbox); !u) {
    IVLOG_ERROR("%s", u.error().what.c_str());
    return 2;
  }
  if (auto k = ivcuda::host::sandbox::prepare(o.sandbox); !k) {
    IVLOG_ERROR("%s", k.error().what.c_str());
    return 2;
  }
  ivcuda::host::sandbox::apply_to_daemon(o.sandbox);
  std::string err;
  const std::vector<int> gpus = parse_gpus(o.gpus, &err);
  if (!err.empty()) {
    IVLOG_ERROR("%s", err.c_str());
    return 2;
  }
  ivcuda::ring::LayoutParams lp;
  lp.shm_size = o.shm_size;
  lp.channels = o.channels;
  lp.ring_bytes = static_cast<std::uint32_t>(o.ring_size);
  lp.staging_bytes = o.staging;
  if (o.ring_size > (1u << 30)) {
    IVLOG_ERROR("--ring-size too large");
    return 2;
  }
  auto layout = ivcuda::ring::plan_layout(lp);
  if (!layout) {
    IVLOG_ERROR("bad memory layout: %s", layout.error().what.c_str());
    return 2;
  }
  // --mps: one MPS control daemon for every worker; each worker's driver
  // loads as its client, with its guest's share of the SMs and memory.
  std::optional<ivcuda::host::MpsControl> mps;
  if (o.mps) {
    auto m = ivcuda::host::MpsControl::start_or_join(o.mps_cfg);
    if (!m) {
      IVLOG_ERROR("--mps: %s", m.error().what.c_str());
      return 1;
    }
    mps = std::move(*m);
  }
  const int gpu_count = ivcuda::host::count_gpus();
  auto driver_env = [&](unsigned compute, std::uint64_t mem_limit, const std::vector<int>& grant) {
    if (!o.mps) return std::vector<std::string>{};
    return ivcuda::host::mps_client_env(o.mps_cfg, compute, mem_limit == 0 ? 0 : mem_limit + o.mps_headroom, grant,
                                        gpu_count);
  };
  if (!o.join.empty()) {
    struct sigaction sj {};
    sj.sa_handler = on_signal;
    ::sigaction(SIGINT, &sj, nullptr);
    ::sigaction(SIGTERM, &sj, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
    return run_join(o, gpus, new_generation(), driver_env(o.compute, o.mem_limit, gpus));
  }
  // Listeners: --socket with --gpus, then each --guest-socket with its own.
  struct Listener {
    std::string path;
    std::vector<int> gpus;
    std::uint64_t mem_limit;
    ivcuda::ivshmem::IvshmemServer server;
    unsigned compute = 100;                // % of the SMs under --mps
    unsigned warm = 1;                     // workers kept started ahead
    bool huge = false;                     // guests' memory on 2 MiB pages
  };
  std::vector<Listener> listeners;
  auto add_listener = [&](const std::string& path, std::vector<int> grant, std::uint64_t mem_limit,
                          unsigned compute, unsigned warm, bool huge) {
    auto server = ivcuda::ivshmem::IvshmemServer::listen(path, o.vectors);
    if (!server) {
      IVLOG_ERROR("cannot listen on %s: %s", path.c_str(), server.error().what.c_str());
      return false;
    }
    // Who may connect: the listening socket's group and mode (QEMU runs as
    // its own user; a systemd unit's UMask keeps the socket closed until then).
    if (!o.socket_group.empty() || !o.socket_mode.empty()) {
      gid_t gid = static_cast<gid_t>(-1);
      if (!o.socket_group.empty()) {
        const group* g = ::getgrnam(o.socket_group.c_str());
        if (g == nullptr) {
          IVLOG_ERROR("--socket-group %s: no such group", o.socket_group.c_str());
          return false;
        }
        gid = g->gr_gid;
      }
      const mode_t mode = o.socket_mode.empty() ? 0660 : static_cast<mode_t>(std::stoul(o.socket_mode, nullptr, 8));
      if (::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0 || ::chmod(path.c_str(), mode) != 0) {
        IVLOG_ERROR("%s: cannot set its group and mode: %s", path.c_str(), std::strerror(errno));
        return false;
      }
    }
    listeners.push_back(
        Listener{path, std::move(grant), mem_limit, std::move(*server), compute, warm, huge});
    return true;
  };
  if (!add_listener(o.socket, gpus, o.mem_limit, o.compute, o.warm_workers, o.huge_pages == "on")) return 1;
  for (const auto& spec : o.guest_sockets) {
    SocketSpec ss;
    std::string gerr;
    if (!parse_socket_spec(spec, o.mem_limit, o.compute, o.warm_workers, o.huge_pages == "on", &ss, &gerr)) {
      IVLOG_ERROR("--guest-socket %s: %s; expected SOCKET=GPUS[:mem-limit=SIZE][:compute=PCT][:warm=N][:huge-pages=on|off], e.g. "
                  "/run/ivcuda/vm2.sock=1:mem-limit=20G:compute=50", spec.c_str(), gerr.c_str());
      return 2;
    }
    if (ss.compute != 100 && !o.mps)
      IVLOG_WARN("--guest-socket %s: compute=%u takes --mps; without it guests time-slice the whole GPU", spec.c_str(),
                 ss.compute);
    if (!add_listener(ss.path, ss.gpus, ss.mem_limit, ss.compute, ss.warm, ss.huge)) return 1;
    std::string grant;
    for (const int g : ss.gpus) grant += (grant.empty() ? "" : ",") + std::to_string(g);
    const std::string quota = ss.mem_limit == 0 ? "no limit" : std::to_string(ss.mem_limit >> 20) + " MiB per guest";
    IVLOG_INFO("listening on %s for guests granted GPU(s) %s, device memory: %s", ss.path.c_str(),
               grant.empty() ? "all" : grant.c_str(), quota.c_str());
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  struct sigaction sh {};
  sh.sa_handler = on_hangup;
  ::sigaction(SIGHUP, &sh, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  const std::uint64_t generation = new_generation();
  IVLOG_INFO("listening on %s (%zu vectors, %llu MiB per guest, driver %s, generation %016llx)",
             o.socket.c_str(), o.vectors, static_cast<unsigned long long>(o.shm_size >> 20), o.driver.c_str(),
             static_cast<unsigned long long>(generation));

  using ivcuda::host::GuestBoard;
  using ivcuda::host::GuestMode;
  using ivcuda::host::GuestStats;
  using nlohmann::json;
  using clk = std::chrono::steady_clock;
  const auto daemon_started = clk::now();
  std::uint64_t refused = 0;  // connections turned away (limits)

  struct Served {
    std::int64_t id = 0;
    uid_t uid = 0;        // the connecting process's (SO_PEERCRED); plain files: the daemon's
    pid_t peer_pid = 0;   // the connecting process; 0 for plain files
    std::string socket;   // the listener's path, or the ivshmem-plain file
    std::vector<int> gpus;
    unsigned compute = 0;  // % of the SMs under --mps; 0: no MPS
    std::size_t listener = kNoListener;  // index into listeners; kNoListener: a plain file
    // A copy of the guest's connection: when the worker has ended, the
    // daemon hangs up on the guest itself. A worker that died may leave its
    // own reference behind for a while (its io_uring's armed poll is torn
    // down asynchronously), and a process-mode guest learns of the end only
    // from the hang-up.
    std::shared_ptr<ivcuda::sys::UniqueFd> conn;
    std::unique_ptr<GuestBoard> board;  // what its workers report (board.h)
    // Served by a warm entry: our end of the entry's line, on which its
    // process says that the worker ended cleanly and may be recycled
    // ('C', vm_supervisor.h), and that worker's pid.
    ivcuda::sys::UniqueFd handoff;
    pid_t worker_pid = 0;
    clk::time_point started = clk::now();
    clk::time_point evict_deadline{};   // evicting: its process is killed after this
    // The last sampling window, for calls/s and copy bytes/s.
    clk::time_point sample_at = clk::now();
    std::uint64_t sample_calls = 0, sample_bytes = 0;
    double calls_per_s = 0, bytes_per_s = 0;
  };
  std::map<pid_t, Served> workers;  // pid -> guest
  // Warm entries (docs/design.md, "Warm workers"): per socket, connection
  // processes started ahead of their guest, with the guest's memory,
  // doorbells and status board made and a worker that has loaded the driver,
  // retained a context and registered the memory. A guest that connects
  // takes one, and another starts in the background.
  struct Warm {
    pid_t pid = 0;
    std::size_t listener = 0;
    std::int64_t id = 0;                      // the guest number it will have
    ivcuda::sys::UniqueFd handoff;            // our end of its line (vm_supervisor.h)
    ivcuda::sys::UniqueFd shm;
    ivcuda::ivshmem::GuestConnection bells;   // its doorbells, for the greeting
    std::unique_ptr<GuestBoard> board;
    bool ready = false;                       // its worker said so
    pid_t worker_pid = 0;                     // that worker (the entry's process's child)
    // A recycled worker (--recycle-workers): it served a guest of this
    // user, and serves only that user's guests (docs/security.md).
    std::optional<uid_t> tenant_uid;
  };
  std::vector<std::vector<Warm>> pools(listeners.size());
  // After a warm entry failed, the socket's next one waits (1 s, doubling to a minute).
  std::vector<std::pair<clk::time_point, std::chrono::seconds>> warm_backoff(
      listeners.size(), {clk::time_point{}, std::chrono::seconds(1)});
  std::set<pid_t> warm_let_go;  // entries told to go, not reaped yet
  // Guests' arrivals per socket, for the pool's growth: the last 2 s, and the latest.
  constexpr auto kArrivalWindow = std::chrono::seconds(2);
  constexpr auto kBurstIdle = std::chrono::seconds(30);
  std::vector<std::deque<clk::time_point>> arrivals(listeners.size());
  bool warm_stale = false;      // a reload changed what they were started with
  auto budget = ivcuda::host::WorkerBudget::create(o.max_guests + static_cast<std::uint32_t>(o.plain_files.size()) + 1);
  if (!budget) {
    IVLOG_ERROR("cannot map the books of workers per uid: %s", std::strerror(errno));
    return 1;
  }
  g_budget = budget.get();
  // Guest numbers are the daemon's, across its sockets (each socket's
  // ivshmem server would count from 1): logs, status and evict use them.
  std::int64_t last_id = 0;
  auto next_guest_id = [&] {
    for (std::int64_t tries = 0; tries < ivcuda::ivshmem::kMaxPeerId; ++tries) {
      last_id = last_id >= ivcuda::ivshmem::kMaxPeerId ? 1 : last_id + 1;
      const auto taken = [&](const auto& w) { return w.second.id == last_id; };
      const auto warm_taken = [&](const std::vector<Warm>& p) {
        return std::any_of(p.begin(), p.end(), [&](const Warm& e) { return e.id == last_id; });
      };
      if (std::none_of(workers.begin(), workers.end(), taken) && std::none_of(pools.begin(), pools.end(), warm_taken))
        break;
    }
    return last_id;
  };

  // The operator's side: the control socket and the metrics endpoint.
  std::optional<ivcuda::host::ControlServer> control;
  if (!o.control_socket.empty() && o.control_socket != "none") {
    auto c = ivcuda::host::ControlServer::listen(o.control_socket, o.control_group);
    if (c) {
      control = std::move(*c);
      IVLOG_INFO("control socket %s (ivcudactl)", o.control_socket.c_str());
    } else if (o.control_socket_given) {
      IVLOG_ERROR("control socket: %s", c.error().what.c_str());
      return 1;
    } else {
      // The default place (/run/ivcuda, which the service unit makes) is not
      // there, or another daemon has it: serve without; --control-socket says where.
      IVLOG_WARN("no control socket (ivcudactl will not reach this daemon): %s; --control-socket PATH sets one",
                 c.error().what.c_str());
    }
  }
  auto snapshot = [&] {
    ivcuda::host::DaemonStatus st;
    st.version = IVCUDA_VERSION;
    st.pid = ::getpid();
    st.uptime_s = std::chrono::duration<double>(clk::now() - daemon_started).count();
    st.guests_refused = refused;
    for (const auto& pool : pools)
      for (const Warm& e : pool) ++(e.ready ? st.warm_ready : st.warm_starting);
    for (const auto& [pid, w] : workers) {
      ivcuda::host::GuestStatus g;
      const GuestStats& b = w.board->stats();
      g.id = w.id;
      g.socket = w.socket;
      g.mode = ivcuda::host::mode_name(static_cast<GuestMode>(b.mode.load(std::memory_order_relaxed)));
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
      g.state = !evict ? "serving" : done ? "evicted" : "evicting";
      g.calls_per_s = w.calls_per_s;
      g.copy_bytes_per_s = w.bytes_per_s;
      g.uptime_s = std::chrono::duration<double>(clk::now() - w.started).count();
      g.last_error = b.read_last_error(&g.last_error_time_ns);
      st.guests.push_back(std::move(g));
    }
    return st;
  };
#ifdef IVCUDA_HAVE_METRICS
  std::unique_ptr<ivcuda::host::MetricsServer> metrics;
  if (!o.metrics_listen.empty()) {
    auto m = ivcuda::host::MetricsServer::start(o.metrics_listen,
                                                [&] { return ivcuda::host::prometheus_text(snapshot()); });
    if (!m) {
      IVLOG_ERROR("%s", m.error().what.c_str());
      return 1;
    }
    metrics = std::move(*m);
    IVLOG_INFO("metrics at http://%s/metrics (port %d)", o.metrics_listen.c_str(), metrics->port());
  }
#else
  struct NoMetrics {
    int fd() const { return -1; }
    void run() {}
    void close_in_child() {}
  };
  std::unique_ptr<NoMetrics> metrics;
  if (!o.metrics_listen.empty()) {
    IVLOG_ERROR("--metrics-listen: this ivcudad is built without the metrics endpoint (IVCUDA_METRICS=OFF)");
    return 2;
  }
#endif

  // ivcudactl reload, or SIGHUP: the command line and config file are read
  // again; quotas change for the guests connected now and to come, object
  // limits for workers started from now on. Sockets and GPUs stay as they
  // are (a restart changes those).
  auto reload = [&]() -> json {
    Options fresh;
    CLI::App again{"ivcudad"};
    define_options(again, fresh);
    try {
      again.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      return {{"ok", false}, {"error", std::string("the configuration does not parse: ") + e.what()}};
    }
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
    for (std::size_t li = 0; li < listeners.size(); ++li) {
      Listener& l = listeners[li];
      const auto it = limits.find(l.path);
      if (it == limits.end() || it->second == l.mem_limit) continue;
      changed.push_back(l.path + ": mem-limit " + ivcuda::host::human_bytes(l.mem_limit) + " -> " +
                        ivcuda::host::human_bytes(it->second));
      l.mem_limit = it->second;
      for (auto& [pid, w] : workers)
        if (w.listener == li) w.board->stats().mem_limit.store(l.mem_limit, std::memory_order_relaxed);
    }
    for (Listener& l : listeners) {
      const auto it = warm.find(l.path);
      if (it == warm.end() || it->second == l.warm) continue;
      changed.push_back(l.path + ": warm workers " + std::to_string(l.warm) + " -> " + std::to_string(it->second));
      l.warm = it->second;
    }
    if (fresh.mem_limit != o.mem_limit) {
      for (auto& [pid, w] : workers)  // ivshmem-plain guests take the default quota
        if (w.listener == kNoListener) w.board->stats().mem_limit.store(fresh.mem_limit, std::memory_order_relaxed);
      o.mem_limit = fresh.mem_limit;
    }
    if (std::memcmp(&fresh.limits, &o.limits, sizeof o.limits) != 0) {
      o.limits = fresh.limits;
      changed.push_back("object limits (for workers started from now on)");
    }
    json ignored = json::array();
    for (const auto& [path, limit] : limits)
      if (std::none_of(listeners.begin(), listeners.end(), [&](const Listener& l) { return l.path == path; }))
        ignored.push_back(path + ": a new socket (takes a restart)");
    // Warm workers were started with the old settings: new ones start.
    if (!changed.empty()) warm_stale = true;
    IVLOG_INFO("reloaded the configuration: %zu change(s)", changed.size());
    return {{"ok", true}, {"changed", changed}, {"ignored", ignored}};
  };
  auto handle_control = [&](const json& req) -> json {
    const std::string cmd = req.value("cmd", "");
    if (cmd == "status") return {{"ok", true}, {"status", ivcuda::host::to_json(snapshot())}};
    if (cmd == "reload") return reload();
    if (cmd == "evict") {
      if (!req.contains("guest") || !req["guest"].is_number_integer())
        return {{"ok", false}, {"error", "evict needs a guest number (see ivcudactl status)"}};
      const auto id = req["guest"].get<std::int64_t>();
      auto it = std::find_if(workers.begin(), workers.end(), [&](const auto& w) { return w.second.id == id; });
      if (it == workers.end())
        return {{"ok", false}, {"error", "no guest " + std::to_string(id) + " (see ivcudactl status)"}};
      GuestStats& b = it->second.board->stats();
      if (b.evict.exchange(1, std::memory_order_acq_rel) == 0) {
        // Its workers see the flag within 100 ms (an idle worker's longest
        // sleep) and release everything; a worker that does not is killed.
        it->second.evict_deadline = clk::now() + std::chrono::seconds(5);
        IVLOG_WARN("guest %lld: evicted by the operator", static_cast<long long>(id));
      }
      return {{"ok", true}, {"state", "evicting"}};
    }
    return {{"ok", false}, {"error", "unknown command '" + cmd + "' (status, evict, reload)"}};
  };

  // What the workers of one tenant share travels through here (fd_broker.h:
  // a VM, a plain file or one user's programs on one socket is a tenant).
  ivcuda::host::FdBroker::Limits share_limits;
  share_limits.entries_per_tenant = o.share_slots;
  share_limits.entries_per_guest = o.share_slots_guest;
  ivcuda::host::FdBroker broker(share_limits);
  // What a forked guest process must not keep of the daemon's: the other
  // listeners, the operator's sockets, other guests' connections and boards.
  auto forget_in_child = [&](const GuestBoard* mine) {
    for (const auto& other : listeners) ::close(other.server.listen_fd());
    broker.close_in_child();
    if (control) control->close_in_child();
    if (metrics) metrics->close_in_child();
    for (auto& [other_pid, other] : workers) {
      if (other.conn) other.conn->reset();  // other guests' connections are not this one's
      other.handoff.reset();
      if (other.board.get() != mine) other.board->unmap_in_child();
    }
    // Nor the memory, doorbells or boards of guests to come.
    for (auto& pool : pools)
      for (Warm& e : pool) {
        e.handoff.reset();
        e.shm.reset();
        e.bells = {};
        e.board->unmap_in_child();
      }
  };
  auto new_board = [&](std::uint64_t mem_limit) {
    auto b = GuestBoard::create();
    if (b) b->stats().mem_limit.store(mem_limit, std::memory_order_relaxed);
    return b;
  };
  // A guest's own memory, formatted: nobody else can map it. On 2 MiB pages
  // when the socket asks and the host's pool has them (mapping it here takes
  // them from the pool, or fails), else on 4 KiB pages.
  std::vector<bool> huge_short(listeners.size(), false);  // said once per socket
  auto guest_memory = [&](std::int64_t id, std::size_t li) -> std::optional<ivcuda::sys::UniqueFd> {
    std::uint64_t features = ivcuda::abi::kFeatDoorbell | ivcuda::abi::kFeatArenaRegistered;
    std::optional<ivcuda::sys::UniqueFd> shm;
    std::optional<ivcuda::sys::Mapping> map;
    if (listeners[li].huge) {
      auto h = ivcuda::sys::make_huge_memfd("ivcuda-guest", o.shm_size);
      auto m = h ? ivcuda::sys::Mapping::map_shared(h->get(), o.shm_size)
                 : ivcuda::Result<ivcuda::sys::Mapping>(ivcuda::make_error(h.error().code, h.error().what));
      if (m) {
        shm = std::move(*h);
        map = std::move(*m);
        features |= ivcuda::abi::kFeatHugePages;
        IVLOG_INFO("guest %lld: its memory is on 2 MiB huge pages", static_cast<long long>(id));
        if (huge_short[li]) IVLOG_INFO("%s: guests' memory is on huge pages again", listeners[li].path.c_str());
        huge_short[li] = false;
      } else if (!huge_short[li]) {
        huge_short[li] = true;
        IVLOG_WARN("%s: no %llu MiB of 2 MiB huge pages for guest %lld (%s; vm.nr_hugepages reserves them): "
                   "4 KiB pages until there are",
                   listeners[li].path.c_str(), static_cast<unsigned long long>(o.shm_size >> 20),
                   static_cast<long long>(id), m.error().what.c_str());
      }
    }
    if (!shm) {
      auto s = ivcuda::sys::make_memfd("ivcuda-guest", o.shm_size);
      if (!s) {
        IVLOG_ERROR("guest %lld: %s", static_cast<long long>(id), s.error().what.c_str());
        return std::nullopt;
      }
      auto m = ivcuda::sys::Mapping::map_shared(s->get(), o.shm_size);
      if (!m) {
        IVLOG_ERROR("guest %lld: %s", static_cast<long long>(id), m.error().what.c_str());
        return std::nullopt;
      }
      shm = std::move(*s);
      map = std::move(*m);
    }
    (void)ivcuda::ring::format_bar(map->data(), *layout, generation,
                                   static_cast<std::uint32_t>(ivcuda::ivshmem::kHostPeerId),
                                   static_cast<std::uint32_t>(o.vectors), features);
    return std::move(*shm);
  };

  // Starts one warm entry for listener li (its process starts its worker).
  // `not_theirs`: a descriptor of the daemon's that the entry's process must
  // not keep (a connection accepted and not yet handed over), or -1.
  auto start_warm = [&](std::size_t li, int not_theirs = -1) -> bool {
    Listener& l = listeners[li];
    Warm e;
    e.listener = li;
    e.id = next_guest_id();
    auto shm = guest_memory(e.id, li);
    if (!shm) return false;
    auto bells = ivcuda::ivshmem::make_doorbells(o.vectors);
    e.board = new_board(l.mem_limit);
    int sv[2];
    if (!bells || !e.board || ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
      IVLOG_ERROR("a warm worker for %s: %s", l.path.c_str(),
                  !bells ? bells.error().what.c_str() : std::strerror(errno));
      return false;
    }
    ivcuda::sys::UniqueFd ours(sv[0]), theirs(sv[1]);
    // Its guest's user is not known yet: the line shares nothing until the
    // guest is handed over (admit, below).
    auto broker_end = broker.add_worker(static_cast<std::uint32_t>(e.id), ivcuda::host::Tenancy::pending());
    if (!broker_end)
      IVLOG_WARN("a warm worker for %s: no fd broker (%s): its guest can import only its own exports",
                 l.path.c_str(), broker_end.error().what.c_str());
    const pid_t pid = ::fork();
    if (pid < 0) {
      IVLOG_ERROR("a warm worker for %s: fork: %s", l.path.c_str(), std::strerror(errno));
      broker.end_guest(static_cast<std::uint32_t>(e.id));
      return false;
    }
    if (pid == 0) {
      ours.reset();
      forget_in_child(e.board.get());
      if (not_theirs >= 0) ::close(not_theirs);
      GuestSetup g;
      g.gpus = &l.gpus;
      g.mem_limit = l.mem_limit;
      g.layout = &*layout;
      g.generation = generation;
      g.id = e.id;
      g.shm_fd = shm->get();
      g.fds = &*bells;
      g.broker_fd = broker_end ? broker_end->release() : -1;
      g.stats = &e.board->stats();
      g.driver_env = driver_env(l.compute, l.mem_limit, l.gpus);
      ::_exit(run_warm(o, g, theirs.get()));
    }
    e.pid = pid;
    e.handoff = std::move(ours);
    e.shm = std::move(*shm);
    e.bells = std::move(*bells);
    IVLOG_DEBUG("warm worker for %s (guest number %lld to be): pid %d", l.path.c_str(), static_cast<long long>(e.id),
                static_cast<int>(pid));
    pools[li].push_back(std::move(e));
    return true;
  };
  // Lets a warm entry go: it sees its line close and ends.
  auto let_go_warm = [&](Warm& e) {
    e.handoff.reset();
    warm_let_go.insert(e.pid);
    broker.end_guest(static_cast<std::uint32_t>(e.id));
  };
  // Each socket's pool: its --warm-workers, and while guests arrive faster
  // than a worker starts (0.3-0.5 s from nothing on an H200, more when many
  // start at once) one more per guest beyond the first of the last 2 s, up to --warm-burst
  // more, so that a loop of short programs or a job array finds workers made
  // (issue 30). The extra ones go after 30 s without a guest.
  auto fill_pools = [&] {
    const auto now = clk::now();
    for (std::size_t li = 0; li < listeners.size(); ++li) {
      auto& seen = arrivals[li];
      const bool idle = seen.empty() || now - seen.back() >= kBurstIdle;
      while (!seen.empty() && now - seen.front() > kArrivalWindow && (seen.size() > 1 || idle)) seen.pop_front();
      // Arrivals in the window beyond the first: a guest alone adds nothing.
      std::size_t recent = 0;
      for (const auto t : seen) recent += now - t <= kArrivalWindow ? 1 : 0;
      const std::size_t extra = recent > 1 ? std::min<std::size_t>(recent - 1, o.warm_burst) : 0;
      const std::size_t warm = listeners[li].warm;
      // Recycled workers (one user's) stand in for the extra ones: while
      // they come back as fast as guests arrive, no more are made from nothing.
      auto& pool = pools[li];
      const std::size_t recycled = static_cast<std::size_t>(
          std::count_if(pool.begin(), pool.end(), [](const Warm& e) { return e.tenant_uid.has_value(); }));
      // So do workers serving a guest now that may come back recycled: every
      // worker made from nothing competes with them for the driver (a
      // context takes 0.15 s alone on an H200, 0.5 s and more when several
      // are made at once: the driver makes them one at a time).
      const std::size_t serving = static_cast<std::size_t>(std::count_if(
          workers.begin(), workers.end(), [&](const auto& w) { return w.second.listener == li && w.second.handoff.valid(); }));
      const std::size_t cover = recycled + serving;
      const std::size_t target = warm == 0 ? 0 : warm + (extra > cover ? extra - cover : 0);
      auto& [until, wait] = warm_backoff[li];
      while (pool.size() - recycled < target && now >= until) {
        if (start_warm(li)) continue;
        until = now + wait;
        wait = std::min<std::chrono::seconds>(wait * 2, std::chrono::seconds(60));
      }
      if (idle) {
        // The recycled ones first, then the newest extra.
        for (auto it = pool.begin(); it != pool.end();) {
          if (!it->tenant_uid) {
            ++it;
            continue;
          }
          let_go_warm(*it);
          it = pool.erase(it);
        }
        while (pool.size() > warm) {
          let_go_warm(pool.back());
          pool.pop_back();
        }
      }
    }
  };

  // A warm entry's guest ended cleanly and its worker reset its contexts
  // (vm_supervisor.h, 'C'): the entry goes back to its socket's pool for the
  // same user's next guest, with new memory and doorbells (the last guest
  // may still hold its own), or, when the pool is full or the settings
  // changed, lets go and is reaped as any worker.
  auto recycle_served = [&](pid_t pid) {
    auto it = workers.find(pid);
    if (it == workers.end()) return;
    Served& s = it->second;
    const std::size_t li = s.listener;
    bool room = li < listeners.size() && !warm_stale && listeners[li].warm > 0;
    if (room && pools[li].size() >= listeners[li].warm + o.warm_burst) {
      // Full: a worker that has just served is worth more than an extra
      // one made from nothing (the newest, a starting one first; the socket
      // keeps its --warm-workers of those) or than the one recycled longest
      // ago (entries are in the order they came).
      auto& pool = pools[li];
      const std::size_t fresh = static_cast<std::size_t>(
          std::count_if(pool.begin(), pool.end(), [](const Warm& e) { return !e.tenant_uid; }));
      auto victim = pool.end();
      if (fresh > listeners[li].warm) {
        for (auto e = pool.begin(); e != pool.end(); ++e)
          if (!e->tenant_uid && (victim == pool.end() || !e->ready || victim->ready)) victim = e;
      } else {
        victim = std::find_if(pool.begin(), pool.end(), [](const Warm& e) { return e.tenant_uid.has_value(); });
      }
      room = victim != pool.end();
      if (room) {
        let_go_warm(*victim);
        pool.erase(victim);
      }
    }
    std::optional<ivcuda::sys::UniqueFd> shm;
    ivcuda::Result<ivcuda::ivshmem::GuestConnection> bells = ivcuda::make_error(ENOSPC, "the pool is full");
    if (room) {
      shm = guest_memory(s.id, li);
      if (shm) bells = ivcuda::ivshmem::make_doorbells(o.vectors);
    }
    bool sent = shm && bells;
    if (sent) {
      std::int64_t k = 0;
      sent = ivcuda::ivshmem::send_msg(s.handoff.get(), k++, shm->get()).ok();
      for (auto& fd : bells->host_fds) sent = sent && ivcuda::ivshmem::send_msg(s.handoff.get(), k++, fd.get()).ok();
      for (auto& fd : bells->guest_fds) sent = sent && ivcuda::ivshmem::send_msg(s.handoff.get(), k++, fd.get()).ok();
    }
    if (!sent) {
      IVLOG_INFO("guest %lld ended cleanly; its worker goes (%s)", static_cast<long long>(s.id),
                 room ? "no memory or doorbells for another guest" : "its socket's pool is full");
      s.handoff.reset();  // the entry's process sees it close and ends
      return;
    }
    // Nothing of the guest's stays with the entry: what it shared is
    // withdrawn (its line and tenant stay), its unit of the per-uid budget
    // is back, its connection is closed, its board starts from nothing.
    budget->release(pid);
    broker.forget_shares(static_cast<std::uint32_t>(s.id));
    if (s.conn && s.conn->valid()) ::shutdown(s.conn->get(), SHUT_RDWR);
    s.board->stats().reset_for_next_guest();
    Warm e;
    e.pid = pid;
    e.listener = li;
    e.id = s.id;
    e.handoff = std::move(s.handoff);
    e.shm = std::move(*shm);
    e.bells = std::move(*bells);
    e.board = std::move(s.board);
    e.worker_pid = s.worker_pid;
    e.tenant_uid = s.uid;
    IVLOG_INFO("guest %lld ended cleanly; its worker (pid %d) is kept for the next guest of uid %u on %s",
               static_cast<long long>(s.id), static_cast<int>(e.worker_pid), static_cast<unsigned>(s.uid),
               listeners[li].path.c_str());
    workers.erase(it);
    pools[li].push_back(std::move(e));
  };

  // ivshmem-plain guests: a memory file each, formatted here, served by a
  // worker that polls. Their ids start above every peer id.
  for (std::size_t i = 0; i < o.plain_files.size(); ++i) {
    const std::int64_t id = 0x10000 + static_cast<std::int64_t>(i);
    auto board = new_board(o.mem_limit);
    if (!board) {
      IVLOG_ERROR("ivshmem-plain file %s: no status board: %s", o.plain_files[i].c_str(), std::strerror(errno));
      return 1;
    }
    GuestBoard* mine = board.get();
    const pid_t pid = spawn_plain_worker(o, gpus, *layout, generation, o.plain_files[i], id, &board->stats(),
                                         broker, [&] { forget_in_child(mine); },
                                         driver_env(o.compute, o.mem_limit, gpus));
    if (pid < 0) return 1;
    budget->admit(::getuid(), 0).bind(pid);  // the operator's: counted, never refused
    Served s;
    s.id = id;
    s.uid = ::getuid();
    s.socket = o.plain_files[i];
    s.gpus = gpus;
    s.compute = o.mps ? o.compute : 0;
    s.board = std::move(board);
    workers[pid] = std::move(s);
  }
#ifdef IVCUDA_HAVE_SYSTEMD
  // Under systemd (Type=notify): ready once every socket accepts guests.
  (void)sd_notifyf(0, "READY=1\nSTATUS=serving on %zu socket(s)", listeners.size());
#endif
  while (g_stop == 0) {
    // Reap workers: a guest that went away, or a worker that failed.
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      if (warm_let_go.erase(pid) != 0) continue;
      bool was_warm = false;
      for (std::size_t li = 0; li < pools.size() && !was_warm; ++li) {
        auto w = std::find_if(pools[li].begin(), pools[li].end(), [&](const Warm& e) { return e.pid == pid; });
        if (w == pools[li].end()) continue;
        was_warm = true;
        if (w->tenant_uid) {  // a recycled one: it served a guest; no back-off
          IVLOG_INFO("a recycled worker for %s ended (%s %d)", listeners[li].path.c_str(),
                     WIFSIGNALED(status) ? "signal" : "status",
                     WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
          broker.end_guest(static_cast<std::uint32_t>(w->id));
          pools[li].erase(w);
          continue;
        }
        auto& [until, wait] = warm_backoff[li];
        IVLOG_WARN("a warm worker for %s ended before a guest came (%s %d); the next one starts in %lld s",
                   listeners[li].path.c_str(), WIFSIGNALED(status) ? "signal" : "status",
                   WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status), static_cast<long long>(wait.count()));
        until = clk::now() + wait;
        wait = std::min<std::chrono::seconds>(wait * 2, std::chrono::seconds(60));
        broker.end_guest(static_cast<std::uint32_t>(w->id));
        pools[li].erase(w);
      }
      if (was_warm) continue;
      budget->release(pid);
      auto it = workers.find(pid);
      const long long id = it == workers.end() ? -1 : it->second.id;
      if (WIFSIGNALED(status))
        IVLOG_WARN("worker for guest %lld died of signal %d; its GPU resources are freed", id, WTERMSIG(status));
      else
        IVLOG_INFO("worker for guest %lld ended (status %d)", id, WEXITSTATUS(status));
      if (it != workers.end()) {
        // What it shared is gone with it, also what a worker that crashed
        // could not withdraw itself (fd_broker.h).
        broker.end_guest(static_cast<std::uint32_t>(id));
        if (it->second.conn && it->second.conn->valid()) ::shutdown(it->second.conn->get(), SHUT_RDWR);
        workers.erase(it);
      }
    }
    if (g_reload != 0) {
      g_reload = 0;
      const json r = reload();
      if (!r.value("ok", false)) IVLOG_ERROR("SIGHUP: %s", r.value("error", std::string()).c_str());
    }
    if (warm_stale) {
      warm_stale = false;
      for (auto& pool : pools) {
        for (Warm& e : pool) let_go_warm(e);
        pool.clear();
      }
      // Nor does a worker started with the old settings come back recycled:
      // its entry's process finds the line closed and ends with its guest.
      for (auto& [pid, w] : workers) w.handoff.reset();
    }
    fill_pools();
    // Rates over about a second, and evictions that do not finish.
    const auto now = clk::now();
    for (auto& [pid, w] : workers) {
      const GuestStats& b = w.board->stats();
      if (const double dt = std::chrono::duration<double>(now - w.sample_at).count(); dt >= 1.0) {
        const std::uint64_t calls = b.calls.load(std::memory_order_relaxed);
        const std::uint64_t bytes = b.copy_bytes.load(std::memory_order_relaxed);
        w.calls_per_s = static_cast<double>(calls - w.sample_calls) / dt;
        w.bytes_per_s = static_cast<double>(bytes - w.sample_bytes) / dt;
        w.sample_calls = calls;
        w.sample_bytes = bytes;
        w.sample_at = now;
      }
      if (w.evict_deadline == clk::time_point{}) continue;
      if (b.evicted.load(std::memory_order_acquire) != 0 && b.mem_used.load(std::memory_order_relaxed) == 0) {
        IVLOG_INFO("guest %lld: evicted; it holds nothing on the GPU", static_cast<long long>(w.id));
        w.evict_deadline = {};
      } else if (now > w.evict_deadline) {
        IVLOG_WARN("guest %lld: its workers did not release within 5 s of the eviction; killing them",
                   static_cast<long long>(w.id));
        ::kill(pid, SIGKILL);
        w.evict_deadline = {};
      }
    }
    std::vector<pollfd> pfds;
    for (const auto& l : listeners) pfds.push_back(pollfd{l.server.listen_fd(), POLLIN, 0});
    const std::size_t control_at = pfds.size();
    if (control) pfds.push_back(pollfd{control->fd(), POLLIN, 0});
    const std::size_t metrics_at = pfds.size();
    if (metrics) pfds.push_back(pollfd{metrics->fd(), POLLIN, 0});
    const std::size_t broker_at = pfds.size();
    for (const int fd : broker.fds()) pfds.push_back(pollfd{fd, POLLIN, 0});
    const std::size_t served_at = pfds.size();
    std::vector<pid_t> served_polled;
    for (auto& [pid, w] : workers)
      if (w.handoff.valid()) {
        pfds.push_back(pollfd{w.handoff.get(), POLLIN, 0});
        served_polled.push_back(pid);
      }
    const std::size_t warm_at = pfds.size();
    std::vector<Warm*> warm_polled;
    for (auto& pool : pools)
      for (Warm& e : pool)
        if (e.handoff.valid()) {
          pfds.push_back(pollfd{e.handoff.get(), POLLIN, 0});
          warm_polled.push_back(&e);
        }
    const int ready = ::poll(pfds.data(), pfds.size(), 200);
    if (metrics) metrics->run();  // also times out idle scrapers
    if (ready <= 0) continue;
    if (control && (pfds[control_at].revents & POLLIN) != 0) control->serve(handle_control);
    (void)metrics_at;
    for (std::size_t i = broker_at; i < served_at; ++i)
      if ((pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) broker.serve(pfds[i].fd);
    // A served warm entry's line: its worker ended cleanly ('C'), or the
    // entry's process is ending (it is reaped then).
    std::vector<pid_t> to_recycle;
    for (std::size_t i = served_at; i < warm_at; ++i) {
      if (pfds[i].revents == 0) continue;
      Served& w = workers[served_polled[i - served_at]];
      char msg[1 + sizeof(std::int32_t)] = {};
      const ssize_t n = ::read(w.handoff.get(), msg, sizeof msg);
      if (n == static_cast<ssize_t>(sizeof msg) && msg[0] == 'C') to_recycle.push_back(served_polled[i - served_at]);
      else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) w.handoff.reset();
    }
    // A warm entry's line: its worker is ready, or the entry is ending (it is
    // reaped then); before any accept below moves entries around.
    for (std::size_t i = warm_at; i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      Warm& e = *warm_polled[i - warm_at];
      char msg[1 + sizeof(std::int32_t)] = {};
      const ssize_t n = ::read(e.handoff.get(), msg, sizeof msg);
      if (n == static_cast<ssize_t>(sizeof msg) && msg[0] == 'R') {
        std::int32_t wpid = 0;
        std::memcpy(&wpid, msg + 1, sizeof wpid);
        e.worker_pid = wpid;
        e.ready = true;
        if (e.tenant_uid)  // a recycled worker, reset for its user's next guest: from now it is offered
          IVLOG_INFO("worker pid %d is ready for the next guest of uid %u", static_cast<int>(wpid),
                     static_cast<unsigned>(*e.tenant_uid));
        warm_backoff[e.listener].second = std::chrono::seconds(1);  // it works again
      } else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        e.handoff.reset();  // ending: no guest goes to it
      }
    }
    for (const pid_t pid : to_recycle) recycle_served(pid);
    for (std::size_t li = 0; li < listeners.size(); ++li) {
      if ((pfds[li].revents & POLLIN) == 0) continue;
      Listener& l = listeners[li];
      auto pending = l.server.accept(0);
      if (!pending) {
        if (pending.error().code != ETIMEDOUT && pending.error().code != EINTR)
          IVLOG_WARN("accept on %s: %s", l.path.c_str(), pending.error().what.c_str());
        continue;
      }
      if (workers.size() >= o.max_guests) {
        IVLOG_WARN("refusing a guest: %u guests already served", o.max_guests);
        ++refused;
        continue;  // closing the connection tells the peer
      }
      // Every guest pins --shm-size of RAM before it proves anything: one
      // local user must not take all of it.
      ucred cred{};
      socklen_t cred_len = sizeof cred;
      if (::getsockopt(pending->conn.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) {
        IVLOG_WARN("refusing a guest on %s: SO_PEERCRED: %s", l.path.c_str(), std::strerror(errno));
        continue;
      }
      auto unit = budget->admit(cred.uid, IVCUDA_RULE("guests-per-uid") ? o.max_guests_per_uid : 0);
      if (!unit) {
        IVLOG_WARN("refusing a guest of uid %u (pid %d): its guests and their workers count %u already "
                   "(--max-guests-per-uid %u)", static_cast<unsigned>(cred.uid), static_cast<int>(cred.pid),
                   budget->used(cred.uid), o.max_guests_per_uid);
        ++refused;
        continue;
      }
      arrivals[li].push_back(clk::now());
      // A warm entry when one is there (a ready one first); else all of it now.
      std::optional<Warm> warm;
      {
        // Never one recycled for another user (rule recycle-same-tenant); of
        // the others a ready one first, and one recycled for this user
        // before a fresh one (which any user may have).
        auto& pool = pools[li];
        const uid_t uid = cred.uid;
        const auto usable = [&](const Warm& e) {
          return e.handoff.valid() && (!e.tenant_uid || *e.tenant_uid == uid || !IVCUDA_RULE("recycle-same-tenant"));
        };
        auto pick = pool.end();
        for (const bool made : {true, false})
          for (const bool own : {true, false})
            if (pick == pool.end())
              pick = std::find_if(pool.begin(), pool.end(), [&](const Warm& e) {
                return usable(e) && (!made || e.ready) && e.tenant_uid.has_value() == own;
              });
        // None: with recycling, the guest's worker starts as a warm entry
        // made now (it waits for it as for a worker made for it), so that it
        // too can serve the user's next guest.
        if (pick == pool.end() && o.recycle == "on" && l.warm > 0 && start_warm(li, pending->conn.get()))
          pick = std::prev(pool.end());
        if (pick != pool.end()) {
          warm = std::move(*pick);
          pool.erase(pick);
        }
      }
      pending->peer_id = warm ? warm->id : next_guest_id();
      const long long id = pending->peer_id;
      std::optional<ivcuda::sys::UniqueFd> shm;
      if (warm) shm = std::move(warm->shm);
      else shm = guest_memory(id, li);
      if (!shm) continue;
      auto board = warm ? std::move(warm->board) : new_board(l.mem_limit);
      if (!board) {
        IVLOG_ERROR("guest %lld: no status board: %s", id, std::strerror(errno));
        continue;
      }
      auto conn = warm ? l.server.greet(std::move(*pending), shm->get(), std::move(warm->bells))
                       : l.server.greet(std::move(*pending), shm->get());
      if (!conn) {
        IVLOG_WARN("guest %lld: greeting failed: %s", id, conn.error().what.c_str());
        if (warm) let_go_warm(*warm);
        continue;
      }
      pid_t pid = -1;
      // Its tenant: its user on this socket, or (a VM) its connection (fd_broker.h).
      const auto tenancy = ivcuda::host::Tenancy::user(static_cast<std::uint32_t>(li), cred.uid);
      if (warm) {
        // The entry's process takes the guest from here (vm_supervisor.h);
        // its line shares from now on, as this guest's.
        broker.admit(static_cast<std::uint32_t>(id), tenancy);
        if (auto st = ivcuda::ivshmem::send_msg(warm->handoff.get(), cred.pid, conn->conn.get()); !st) {
          IVLOG_ERROR("guest %lld: cannot hand it to its warm worker: %s", id, st.error().what.c_str());
          ::kill(warm->pid, SIGKILL);
          let_go_warm(*warm);
          continue;
        }
        pid = warm->pid;
      } else {
        auto broker_end = broker.add_worker(static_cast<std::uint32_t>(id), tenancy);
        if (!broker_end)
          IVLOG_WARN("guest %lld: no fd broker (%s): it can import only its own exports", id,
                     broker_end.error().what.c_str());
        pid = ::fork();
        if (pid < 0) {
          IVLOG_ERROR("guest %lld: fork: %s", id, std::strerror(errno));
          broker.end_guest(static_cast<std::uint32_t>(id));
          continue;
        }
        if (pid == 0) {
          forget_in_child(board.get());
          GuestSetup g;
          g.gpus = &l.gpus;
          g.mem_limit = l.mem_limit;
          g.layout = &*layout;
          g.generation = generation;
          g.id = id;
          g.shm_fd = shm->get();
          g.fds = &*conn;
          g.broker_fd = broker_end ? broker_end->release() : -1;
          g.peer_pid = cred.pid;
          g.stats = &board->stats();
          g.driver_env = driver_env(l.compute, l.mem_limit, l.gpus);
          ::_exit(run_worker(o, g));
        }
      }
      unit.bind(pid);
      Served s;
      s.id = id;
      s.uid = cred.uid;
      s.peer_pid = cred.pid;
      s.socket = l.path;
      s.gpus = l.gpus;
      s.compute = o.mps ? l.compute : 0;
      s.listener = li;
      s.conn = std::make_shared<ivcuda::sys::UniqueFd>(::fcntl(conn->conn.get(), F_DUPFD_CLOEXEC, 0));
      s.board = std::move(board);
      if (warm) {
        s.handoff = std::move(warm->handoff);
        s.worker_pid = warm->worker_pid;
      }
      workers[pid] = std::move(s);
      // A warm entry's process names its worker once it hands the guest over
      // ("guest N: worker pid W", vm_supervisor.cc).
      if (warm)
        IVLOG_INFO("guest %lld (uid %u) connected on %s; a warm entry (%s), its process pid %d", id,
                   static_cast<unsigned>(cred.uid), l.path.c_str(), warm->ready ? "ready" : "still starting",
                   static_cast<int>(pid));
      else
        IVLOG_INFO("guest %lld (uid %u) connected on %s; worker pid %d", id, static_cast<unsigned>(cred.uid),
                   l.path.c_str(), static_cast<int>(pid));
      // The next warm entry starts at the top of the loop, once this guest's
      // memory and connection are out of scope here: a fork now would hand
      // them to it.
    }
    // The parent keeps nothing of the guest's: when the worker ends, the
    // guest's connection closes with it.
  }
  IVLOG_INFO("stopping: %zu worker(s)", workers.size());
#ifdef IVCUDA_HAVE_SYSTEMD
  (void)sd_notify(0, "STOPPING=1");
#endif
  for (auto& pool : pools)
    for (Warm& e : pool) {
      ::kill(e.pid, SIGTERM);
      ::waitpid(e.pid, nullptr, 0);
    }
  for (auto& [pid, id] : workers) ::kill(pid, SIGTERM);
  for (auto& [pid, id] : workers) {
    ::waitpid(pid, nullptr, 0);
    // As when a worker is reaped: a dead worker's io_uring may keep the
    // connection open for a while, and the guest must learn now that its
    // host is gone.
    if (id.conn && id.conn->valid()) ::shutdown(id.conn->get(), SHUT_RDWR);
  }
  if (control) ::unlink(control->path().c_str());
  return 0;
}
