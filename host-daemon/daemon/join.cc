// --join (launch.h): ivcudad as one peer of somebody else's ivshmem-server.
#include <sys/prctl.h>
#include <sys/wait.h>

#include <chrono>

#include "host-daemon/daemon/launch.h"
#include "host-daemon/shared/log.h"
#include "ring/ivshmem.h"
#include "ring/sys.h"

namespace ivcuda::host {

namespace {

// The ivshmem-server's other peers whose eventfds we keep.
constexpr std::size_t kJoinMaxPeers = 8;

// One worker in this process, sandboxed, serving until its guest leaves.
// Returns its exit status.
int serve_one(const Options& o, WorkerConfig cfg, long long id) {
  SupervisorConfig sc;
  add_sandbox_steps(o, sc);
  if (auto st = sc.before_start(cfg); !st) {
    IVLOG_ERROR("guest %lld: cannot sandbox the worker: %s", id, st.error().what.c_str());
    return 2;
  }
  auto w = start_worker(std::move(cfg));
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

}  // namespace

// --join: we are one peer of somebody else's ivshmem-server. Its memory is
// shared by all its peers, so we serve the first guest that appears, then
// the next one after it left.
int run_join(const Options& o, const std::vector<int>& gpus, std::uint64_t generation,
             const std::vector<std::string>& driver_env) {
  // We serve one guest at a time, so a few peers' eventfds are all we need:
  // peers beyond them cannot run the daemon out of descriptors.
  auto client = ivshmem::ivshmem_connect(o.join, std::chrono::milliseconds(5000), o.vectors, {},
                                                 kJoinMaxPeers);
  if (!client) {
    IVLOG_ERROR("cannot join the ivshmem-server at %s: %s", o.join.c_str(), client.error().what.c_str());
    return 1;
  }
  ring::LayoutParams lp;
  lp.shm_size = client->shm_size();
  lp.channels = o.channels;
  lp.ring_bytes = static_cast<std::uint32_t>(o.ring_size);
  lp.staging_bytes = o.staging;
  auto layout = ring::plan_layout(lp);
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
                           abi::kFeatDoorbell | abi::kFeatArenaRegistered);
    if (!f) {
      if (f.error().what != refused)
        IVLOG_ERROR("the memory of the ivshmem-server at %s: %s; not serving it until that changes", o.join.c_str(),
                    f.error().what.c_str());
      refused = f.error().what;
      (void)sys::wait_readable(client->socket_fd(), 1000);
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
      if (guest < 0) (void)sys::wait_readable(client->socket_fd(), 200);
    }
    if (guest < 0) break;
    // Each guest of the server is a tenant of its own, served by one worker
    // with no line to a broker: its processes share through that worker's
    // own registry (tenant_share.h).
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      GuestSetup g;
      g.gpus = &gpus;
      g.mem_limit = o.mem_limit;
      g.layout = &*layout;
      g.generation = generation;
      g.id = guest;
      g.shm_fd = client->shm_fd();
      g.driver_env = driver_env;
      WorkerConfig cfg = worker_config(o, g);
      for (const auto& fd : client->own_eventfds()) cfg.host_fds.push_back(fd.get());
      for (const auto& fd : client->peers().at(guest)) cfg.guest_fds.push_back(fd.get());
      ::_exit(serve_one(o, std::move(cfg), static_cast<long long>(guest)));
    }
    IVLOG_INFO("serving guest peer %lld; worker pid %d", static_cast<long long>(guest), static_cast<int>(pid));
    // The worker serves until the guest leaves the server (or we stop).
    bool left = false, reaped = false;
    int status = 0;
    while (g_stop == 0 && !left) {
      (void)sys::wait_readable(client->socket_fd(), 200);
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

}  // namespace ivcuda::host
