// A hostile VM (host-daemon/daemon/vm_supervisor.h): a guest that claims channels
// under invented pids and forges its kernel driver's exit notices, and a
// subverted worker that writes into the memory it shares with its
// unsandboxed supervisor. The supervisor must bound the VM's workers and
// their start rate, count them in the user's budget, tell processes of
// different PID namespaces apart, keep to its own copies of what workers can
// write, and give each worker only what is its own (issue 28, items 3, 8, 9).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/process/raw_guest.h"
#include "tests/skip.h"

using namespace ivcuda;
using namespace ivcuda::testing;
using proto::Op;

namespace {

bool wait_for(const std::function<bool()>& pred, int ms = 5000) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// Alive and not a zombie.
bool running(pid_t p) {
  std::ifstream f("/proc/" + std::to_string(p) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return false;
  const auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

proto::ReqHello hello(pid_t pid, std::uint32_t pidns = 0) {
  return proto::ReqHello{proto::kProtoVersion, static_cast<std::uint32_t>(pid), 0, pidns, {}};
}

// A call's CUresult as a number: one that got no reply in time is -1
// (RawGuest::send), which is no CUresult.
template <class T>
int rc(RawGuest& g, std::uint32_t c, Op op, const T& req, std::vector<std::byte>* out = nullptr) {
  return static_cast<int>(g.call(c, op, req, out));
}

// Claims channel c for process (pidns, pid) as the guest library does: the
// namespace before the claim that publishes it.
// (host_lost is the host's to write; cleared here only so that the test
// sees what the host says of this claim.)
void claim(RawGuest& g, std::uint32_t c, pid_t pid, std::uint32_t pidns = 0) {
  auto* d = ring::channel_desc(g.bar.data(), g.l, c);
  d->guest_pidns = pidns;
  ring::store_release(d->host_lost, std::uint64_t{0});
  g.open(c, pid);
}

std::uint64_t host_lost(RawGuest& g, std::uint32_t c) {
  return ring::load_acquire(ring::channel_desc(g.bar.data(), g.l, c)->host_lost);
}

// What the guest's kernel driver writes when a process exits (the guest
// can write it as well).
void exit_notice(RawGuest& g, pid_t pid, std::uint32_t pidns = 0) {
  auto* sb = ring::superblock(g.bar.data());
  const std::uint32_t n = sb->exit_count;
  sb->exit_pid[n % abi::kExitSlots] = static_cast<std::uint32_t>(pid);
  sb->exit_pidns[n % abi::kExitSlots] = pidns;
  std::atomic_ref<std::uint32_t>(sb->exit_count).store(n + 1, std::memory_order_release);
  (void)g.client.notify(0, abi::kHostVector);
}

// The connection's supervisor (the daemon's one child: no warm workers).
pid_t supervisor(const Daemon& d) {
  pid_t sup = 0;
  wait_for([&] {
    const auto c = d.workers();
    sup = c.size() == 1 ? c[0] : 0;
    return sup != 0;
  });
  return sup;
}

std::set<std::string> sockets(pid_t p) {
  std::set<std::string> out;
  for (int fd = 0; fd < 4096; ++fd) {
    char t[128];
    const std::string link = "/proc/" + std::to_string(p) + "/fd/" + std::to_string(fd);
    const ssize_t len = ::readlink(link.c_str(), t, sizeof t - 1);
    if (len <= 0) continue;
    t[len] = '\0';
    if (std::strncmp(t, "socket:", 7) == 0) out.insert(t);
  }
  return out;
}

bool maps_contain(pid_t p, const std::string& what) {
  std::ifstream f("/proc/" + std::to_string(p) + "/maps");
  for (std::string line; std::getline(f, line);)
    if (line.find(what) != std::string::npos) return true;
  return false;
}

// The memory a VM's supervisor shares with its workers, in worker w: the
// shared mapping named ivcuda-vm, or (before it had a name) the anonymous
// shared mapping that holds the pool's offset and page count near its start.
struct Range {
  std::uint64_t lo = 0, hi = 0;
};
Range vm_shared_in(pid_t w, std::uint64_t pool_off, std::uint64_t pages) {
  const int mem = ::open(("/proc/" + std::to_string(w) + "/mem").c_str(), O_RDONLY | O_CLOEXEC);
  std::ifstream f("/proc/" + std::to_string(w) + "/maps");
  Range found;
  for (std::string line; std::getline(f, line) && found.hi == 0;) {
    if (line.find("rw-s") == std::string::npos) continue;
    const bool named = line.find("memfd:ivcuda-vm") != std::string::npos;
    if (!named && line.find("/dev/zero") == std::string::npos) continue;
    Range r;
    r.lo = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
    r.hi = std::stoull(line.substr(line.find('-') + 1), nullptr, 16);
    std::uint64_t head[64] = {};
    const bool geometry = mem >= 0 && ::pread(mem, head, sizeof head, static_cast<off_t>(r.lo)) == sizeof head &&
                          std::adjacent_find(std::begin(head), std::end(head), [&](std::uint64_t x, std::uint64_t y) {
                            return x == pool_off && y == pages;
                          }) != std::end(head);
    if (named || geometry) found = r;
  }
  if (mem >= 0) ::close(mem);
  return found;
}


// One request on the daemon's control socket, and its answer (JSON); null
// when the daemon did not answer within 5 s.
nlohmann::json control(const std::string& path, const std::string& request) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  std::string got;
  const std::string line = request + "\n";
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0 &&
      ::send(fd, line.data(), line.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(line.size())) {
    char buf[4096];
    for (pollfd p{fd, POLLIN, 0}; got.find('\n') == std::string::npos && ::poll(&p, 1, 5000) == 1;) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return nlohmann::json::parse(got, nullptr, false);
}

// The VM's entry in the daemon's status (null when it has none).
nlohmann::json vm_entry(const std::string& ctl) {
  const auto j = control(ctl, R"({"cmd":"status"})");
  if (j.is_object() && j.contains("status"))
    for (const auto& g : j["status"]["guests"])
      if (g.value("mode", std::string()).rfind("vm", 0) == 0) return g;
  return nullptr;
}

// A process of this test's, sleeping, with pid `want` if it can be had
// (/proc/sys/kernel/ns_last_pid, as root); its pid either way. The cases
// that call it are tagged [pid-reuse], which CTest runs alone, and a process
// that took `want` first (between the write and the fork) is waited out for
// up to 5 s.
pid_t sleeper_with_pid(pid_t want) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (int attempt = 0; attempt < 200 && std::chrono::steady_clock::now() < until; ++attempt) {
    while (::kill(want, 0) == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    {
      std::ofstream last("/proc/sys/kernel/ns_last_pid");
      last << want - 1;
    }
    const pid_t p = ::fork();
    if (p == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      for (;;) ::pause();
    }
    if (p == want || p < 0) return p;
    ::kill(p, SIGKILL);
    ::waitpid(p, nullptr, 0);
  }
  return -1;
}

// Kills worker `w` (its supervisor reaps it) and gives its pid to a
// sleeping process of the test's: that process's pid (ended again and -1
// when it could not get that one).
pid_t end_and_take_pid(pid_t w) {
  ::kill(w, SIGKILL);
  REQUIRE(wait_for([&] { return ::kill(w, 0) != 0; }));
  const pid_t other = sleeper_with_pid(w);
  if (other == w || other < 0) return other;
  ::kill(other, SIGKILL);
  ::waitpid(other, nullptr, 0);
  return -1;
}

// The GPU test double models checkpointing across its processes through a
// ledger file; `delay_ms` (or null): how long each checkpoint takes.
std::string with_ledger(const std::string& path, const char* delay_ms) {
  std::ofstream(path).close();
  ::setenv("IVCUDA_DOUBLE_LEDGER", path.c_str(), 1);
  if (delay_ms != nullptr) ::setenv("IVCUDA_GPU_DOUBLE_CHECKPOINT_DELAY_MS", delay_ms, 1);
  return path;
}

// A VM of two processes, each served by a worker of its own, on a daemon
// with a control socket; then asked to suspend. The workers run without the
// sandbox: --sandbox on needs a newer Landlock than CI's kernel has
// (run_suspend_test.sh suspends a sandboxed worker in process mode).
struct SuspendingVm {
  const std::string tag;
  const std::string ctl = tag + ".ctl";
  const std::string ledger;
  Daemon d;
  RawGuest g;
  pid_t sup = 0;
  std::vector<pid_t> workers;  // ascending: the daemon asks about them in this order
  long long id = -1;
  SuspendingVm(const std::string& name, const char* checkpoint_delay_ms)
      : tag("/tmp/ivcuda-hostile-vm-" + std::to_string(::getpid()) + "-" + name),
        ledger(with_ledger(tag + ".ledger", checkpoint_delay_ms)),
        d({"--vm-spare-workers", "0", "--sandbox", "off", "--control-socket", ctl}, "-" + name),
        g(d.sock) {
    ::unsetenv("IVCUDA_GPU_DOUBLE_CHECKPOINT_DELAY_MS");
    REQUIRE(d.alive());
    REQUIRE(wait_for([&] { return ::access(ctl.c_str(), F_OK) == 0; }));
    const pid_t base = ::getpid() + 300000;
    claim(g, 0, base);
    REQUIRE(rc(g, 0, Op::kHello, hello(base)) == CUDA_SUCCESS);
    claim(g, 1, base + 1);
    REQUIRE(rc(g, 1, Op::kHello, hello(base + 1)) == CUDA_SUCCESS);
    sup = supervisor(d);
    REQUIRE(sup != 0);
    REQUIRE(wait_for([&] { return Daemon::children_of(sup).size() == 2; }));
    workers = Daemon::children_of(sup);
    const nlohmann::json vm = vm_entry(ctl);
    REQUIRE(vm.is_object());
    id = vm["id"].get<long long>();
    const auto asked = control(ctl, R"({"cmd":"suspend","guest":)" + std::to_string(id) + "}");
    INFO("suspend: " << asked.dump());
    REQUIRE(asked.value("ok", false));
  }
  ~SuspendingVm() {
    ::unlink(ctl.c_str());
    ::unsetenv("IVCUDA_DOUBLE_LEDGER");
    ::unlink(ledger.c_str());
  }
  // Its entry in the daemon's status, once it says `state` (null if not within `ms`).
  nlohmann::json when(const std::string& state, int ms) {
    nlohmann::json vm;
    wait_for([&] { vm = vm_entry(ctl); return vm.is_object() && vm["state"] == state; }, ms);
    return vm.is_object() && vm["state"] == state ? vm : nlohmann::json();
  }
};
}  // namespace

TEST_CASE("a VM gets at most --max-workers-per-guest workers and the processes past it are refused", "[process][hostile]") {
  // (Workers end with their processes here: a recycled one would stay, as the VM's spare.)
  Daemon d({"--max-workers-per-guest", "2", "--vm-spare-workers", "0", "--max-guests-per-uid", "0",
            "--recycle-workers", "off"}, "-bound");
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  const pid_t base = ::getpid() + 300000;  // the guest's pids, not the host's
  claim(g, 0, base);
  REQUIRE(rc(g, 0, Op::kHello, hello(base)) == CUDA_SUCCESS);
  claim(g, 1, base + 1);
  REQUIRE(rc(g, 1, Op::kHello, hello(base + 1)) == CUDA_SUCCESS);
  const pid_t sup = supervisor(d);
  REQUIRE(sup != 0);
  // Claims under ever new pids, as fast as the guest likes: each is refused
  // (the guest sees its channel lost), and no worker starts.
  for (int i = 0; i < 12; ++i) {
    const std::uint32_t c = 2 + static_cast<std::uint32_t>(i % 2);
    claim(g, c, base + 10 + i);
    INFO("claim " << i << " on channel " << c);
    REQUIRE(wait_for([&] { return host_lost(g, c) == abi::kHostLostRefused; }, 3000));
  }
  CHECK(Daemon::children_of(sup).size() == 2);
  // One process exits: its worker goes, and the next process gets one.
  exit_notice(g, base);
  CHECK(wait_for([&] { return Daemon::children_of(sup).size() == 1; }));
  claim(g, 2, base + 100);
  CHECK(rc(g, 2, Op::kHello, hello(base + 100)) == CUDA_SUCCESS);
  CHECK(host_lost(g, 2) == 0);
  CHECK(Daemon::children_of(sup).size() == 2);
  CHECK(rc(g, 1, Op::kHello, hello(base + 1)) == CUDA_SUCCESS);
  CHECK(d.alive());
}

TEST_CASE("a VM's worker starts are rate-limited however fast it forges exit notices", "[process][hostile]") {
  // Each exit ends its worker (recycled ones start nothing: "a VM's exited
  // process's worker serves its next process ...").
  Daemon d({"--vm-spare-workers", "0", "--recycle-workers", "off"}, "-rate");
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  // Claim, be served by a fresh worker, "exit", again (the audit's churn:
  // 345 workers in 10 s).
  constexpr int kSeconds = 4;
  int started = 0;
  pid_t pid = ::getpid() + 400000;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(kSeconds);
  while (std::chrono::steady_clock::now() < until) {
    ++pid;
    claim(g, 0, pid);
    if (rc(g, 0, Op::kHello, hello(pid)) != CUDA_SUCCESS) continue;
    ++started;
    exit_notice(g, pid);
    // The channel is the guest's to claim again once the host freed it.
    (void)wait_for([&] { return (ring::load_acquire(ring::superblock(g.bar.data())->active_mask[0]) & 1) == 0; }, 2000);
  }
  // A burst of 8, then one each 500 ms; the guest is slowed down, not stopped.
  INFO(started << " workers started in " << kSeconds << " s");
  CHECK(started >= 8);
  CHECK(started <= 8 + 2 * kSeconds + 2);
  CHECK(d.alive());
}

TEST_CASE("a VM's workers beyond its first count in its user's --max-guests-per-uid", "[process][hostile]") {
  Daemon d({"--max-guests-per-uid", "3", "--vm-spare-workers", "0", "--recycle-workers", "off"}, "-uid");
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  const pid_t base = ::getpid() + 500000;
  for (std::uint32_t c = 0; c < 3; ++c) {
    claim(g, c, base + static_cast<pid_t>(c));
    REQUIRE(rc(g, c, Op::kHello, hello(base + static_cast<pid_t>(c))) == CUDA_SUCCESS);
  }
  const pid_t sup = supervisor(d);
  REQUIRE(sup != 0);
  // The fourth process would be the user's fourth worker.
  claim(g, 3, base + 3);
  CHECK(wait_for([&] { return host_lost(g, 3) == abi::kHostLostRefused; }, 3000));
  CHECK(Daemon::children_of(sup).size() == 3);
  // ...and so would the user's next connection.
  auto connect = [&] { return ivshmem::ivshmem_connect(d.sock, std::chrono::milliseconds(2000), 8); };
  CHECK_FALSE(connect().ok());
  // One process exits: its unit returns, and the user may connect again.
  exit_notice(g, base + 2);
  CHECK(wait_for([&] { return Daemon::children_of(sup).size() == 2; }));
  bool admitted = false;
  for (int i = 0; i < 50 && !admitted; ++i) {
    admitted = connect().ok();
    if (!admitted) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK(admitted);
  CHECK(d.alive());
}

TEST_CASE("processes of a VM with one pid in two PID namespaces get a worker each and one's exit leaves the other's",
          "[process][hostile]") {
  Daemon d({"--vm-spare-workers", "0", "--recycle-workers", "off"}, "-pidns");
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  // Two containers' first processes: pid 1 each (the namespaces are the
  // inode numbers of their /proc/1/ns/pid; any two differ).
  const std::uint32_t ns_a = 4026532001u, ns_b = 4026532002u;
  std::vector<std::byte> out;
  claim(g, 0, 1, ns_a);
  REQUIRE(rc(g, 0, Op::kHello, hello(1, ns_a)) == CUDA_SUCCESS);
  REQUIRE(rc(g, 0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  claim(g, 1, 1, ns_b);
  REQUIRE(rc(g, 1, Op::kHello, hello(1, ns_b)) == CUDA_SUCCESS);
  REQUIRE(rc(g, 1, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  const auto ctx_b = RawGuest::as<proto::RepHandle>(out).handle;
  const pid_t sup = supervisor(d);
  REQUIRE(sup != 0);
  CHECK(Daemon::children_of(sup).size() == 2);
  // The other container's process 1 on this one's channel is somebody else.
  CHECK(rc(g, 1, Op::kHello, hello(1, ns_a)) == CUDA_ERROR_NOT_PERMITTED);
  // The first container's process 1 exits: its worker goes, the other's stays.
  exit_notice(g, 1, ns_a);
  CHECK(wait_for([&] { return Daemon::children_of(sup).size() == 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(Daemon::children_of(sup).size() == 1);
  CHECK(host_lost(g, 1) == 0);
  CHECK(rc(g, 1, Op::kCtxSynchronize, proto::ReqCtx{ctx_b}) == CUDA_SUCCESS);
  CHECK(rc(g, 1, Op::kMemAlloc, proto::ReqMemAlloc{ctx_b, 4096, 0, 0, 0, 0}) == CUDA_SUCCESS);
  CHECK(d.alive());
}

TEST_CASE("a VM's worker holds the broker line made for it and neither its supervisor's nor the daemon's books",
          "[process][hostile]") {
  Daemon d({"--vm-spare-workers", "1"}, "-line");
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  const pid_t base = ::getpid() + 600000;
  claim(g, 0, base);
  REQUIRE(rc(g, 0, Op::kHello, hello(base)) == CUDA_SUCCESS);
  claim(g, 1, base + 1);
  REQUIRE(rc(g, 1, Op::kHello, hello(base + 1)) == CUDA_SUCCESS);
  const pid_t sup = supervisor(d);
  REQUIRE(sup != 0);
  REQUIRE(wait_for([&] { return Daemon::children_of(sup).size() == 3; }));  // two processes and a spare
  // A worker just forked holds all its supervisor held until it let go, and
  // a supervisor holds the line for the worker it is about to fork: give
  // them the moment it takes, and compare with what the supervisor holds then.
  std::set<std::string> sup_socks;
  (void)wait_for([&] {
    sup_socks = sockets(sup);
    for (const pid_t w : Daemon::children_of(sup))
      for (const auto& s : sockets(w))
        if (sup_socks.count(s) != 0) return false;
    return true;
  }, 3000);
  CHECK(maps_contain(sup, "memfd:ivcuda-budget"));  // the supervisor has them: the check below can see them
  std::set<std::string> lines;
  for (const pid_t w : Daemon::children_of(sup)) {
    INFO("worker " << w);
    const auto mine = sockets(w);
    CHECK_FALSE(mine.empty());  // its own line
    for (const auto& s : mine) {
      INFO("socket " << s);
      CHECK(sup_socks.count(s) == 0);
      CHECK(lines.insert(s).second);  // and nobody else's
    }
    CHECK_FALSE(maps_contain(w, "memfd:ivcuda-budget"));
  }
  CHECK(d.alive());
}

TEST_CASE("a process's page-locked pages are free for the VM's next process once its worker is gone",
          "[process][hostile]") {
  // Its worker ends, or lets the process go and stays as the VM's spare.
  const std::string recycle = GENERATE(as<std::string>{}, "off", "keep");
  INFO("--recycle-workers " << recycle);
  Daemon d({"--vm-spare-workers", "0", "--recycle-workers", recycle}, "-pool");
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  const pid_t base = ::getpid() + 700000;
  const std::uint64_t most = ring::pool_size(g.l) - (1u << 20);
  std::vector<std::byte> out;
  claim(g, 0, base);
  REQUIRE(rc(g, 0, Op::kHello, hello(base)) == CUDA_SUCCESS);
  REQUIRE(rc(g, 0, Op::kHostAlloc, proto::ReqHostAlloc{most, 0, 0}, &out) == CUDA_SUCCESS);
  claim(g, 1, base + 1);
  REQUIRE(rc(g, 1, Op::kHello, hello(base + 1)) == CUDA_SUCCESS);
  CHECK(rc(g, 1, Op::kHostAlloc, proto::ReqHostAlloc{most, 0, 0}) == CUDA_ERROR_OUT_OF_MEMORY);
  const pid_t sup = supervisor(d);
  REQUIRE(sup != 0);
  const auto workers = Daemon::children_of(sup);
  REQUIRE(workers.size() == 2);
  exit_notice(g, base);
  if (recycle == "off") REQUIRE(wait_for([&] { return Daemon::children_of(sup).size() == 1; }));
  CHECK(wait_for([&] { return rc(g, 1, Op::kHostAlloc, proto::ReqHostAlloc{most, 0, 0}) == CUDA_SUCCESS; }, 2000));
  if (recycle != "off") CHECK(Daemon::children_of(sup) == workers);  // nobody ended
  CHECK(d.alive());
}

// --recycle-workers (the default, keep): a VM's process that ends with
// nothing under way leaves its worker as the VM's spare, which serves the
// VM's next process with none of the last one's objects, handles or bytes
// (issue 30: a VM's back-to-back processes pay no worker start).
TEST_CASE("a VM's exited process's worker serves its next processes, which find nothing of the last one's",
          "[process][hostile]") {
  const std::string ctl = "/tmp/ivcuda-hostile-vm-" + std::to_string(::getpid()) + "-recycle.ctl";
  Daemon d({"--vm-spare-workers", "0", "--control-socket", ctl}, "-recycle");
  REQUIRE(d.alive());
  REQUIRE(wait_for([&] { return ::access(ctl.c_str(), F_OK) == 0; }));
  RawGuest g(d.sock);
  const pid_t a = ::getpid() + 800000;
  std::vector<std::byte> out;
  claim(g, 0, a);
  REQUIRE(rc(g, 0, Op::kHello, hello(a)) == CUDA_SUCCESS);
  REQUIRE(rc(g, 0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  const auto ctx_a = RawGuest::as<proto::RepHandle>(out).handle;
  constexpr std::uint64_t kBytes = 8192;
  REQUIRE(rc(g, 0, Op::kMemAlloc, proto::ReqMemAlloc{ctx_a, kBytes, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
  const auto ptr_a = RawGuest::as<proto::RepMemAlloc>(out).dptr;
  REQUIRE(rc(g, 0, Op::kMemset, proto::ReqMemset{ctx_a, 0, ptr_a, 0, kBytes, 1, 0xa5, 1, 0, 0}) == CUDA_SUCCESS);
  REQUIRE(rc(g, 0, Op::kStreamCreate, proto::ReqStreamCreate{ctx_a, 0, 0}, &out) == CUDA_SUCCESS);
  const auto stream_a = RawGuest::as<proto::RepHandle>(out).handle;
  const pid_t sup = supervisor(d);
  REQUIRE(sup != 0);
  const auto workers = Daemon::children_of(sup);
  REQUIRE(workers.size() == 1);
  const auto channel_free = [&] {
    return (ring::load_acquire(ring::superblock(g.bar.data())->active_mask[0]) & 1) == 0;
  };

  // a is killed (no goodbye): the host frees its channel, the worker stays.
  exit_notice(g, a);
  REQUIRE(wait_for(channel_free, 2000));
  const pid_t b = a + 1;
  claim(g, 0, b);  // the VM's next process, on the same channel
  REQUIRE(rc(g, 0, Op::kHello, hello(b)) == CUDA_SUCCESS);
  CHECK(Daemon::children_of(sup) == workers);  // served by the same worker
  REQUIRE(rc(g, 0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  const auto ctx_b = RawGuest::as<proto::RepHandle>(out).handle;
  // a's handles and pointer mean nothing to b...
  CHECK(rc(g, 0, Op::kMemAlloc, proto::ReqMemAlloc{ctx_a, 4096, 0, 0, 0, 0}) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(rc(g, 0, Op::kStreamSynchronize, proto::ReqHandle{ctx_b, stream_a}) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(rc(g, 0, Op::kMemGetAddressRange, proto::ReqPtr{ctx_b, ptr_a}) != CUDA_SUCCESS);
  // ...and no byte of a's pattern is in b's memory.
  REQUIRE(rc(g, 0, Op::kMemAlloc, proto::ReqMemAlloc{ctx_b, kBytes, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
  const auto ptr_b = RawGuest::as<proto::RepMemAlloc>(out).dptr;
  REQUIRE(rc(g, 0, Op::kMemcpyDtoHInline, proto::ReqCopy{ctx_b, 0, 0, ptr_b, kBytes, 0, 0, 0}, &out) ==
          CUDA_SUCCESS);
  REQUIRE(out.size() == sizeof(proto::RepCopyInline) + kBytes);
  CHECK(std::count(out.begin() + sizeof(proto::RepCopyInline), out.end(), std::byte{0xa5}) == 0);

  // b says goodbye on its last channel (a clean exit): the worker lets it go
  // on its own and the VM serves no process. Twenty processes after it, one
  // after another, each the same worker's.
  REQUIRE(rc(g, 0, Op::kGoodbye, proto::ReqCtx{0}) == CUDA_SUCCESS);
  CHECK(wait_for([&] {
    const auto vm = vm_entry(ctl);
    return vm.is_object() && vm.value("processes", 1u) == 0;
  }));
  for (pid_t p = b + 1; p <= b + 20; ++p) {
    INFO("process " << p - b);
    claim(g, 0, p);
    REQUIRE(rc(g, 0, Op::kHello, hello(p)) == CUDA_SUCCESS);
    REQUIRE(rc(g, 0, Op::kMemAlloc, proto::ReqMemAlloc{ctx_b, 4096, 0, 0, 0, 0}) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK(Daemon::children_of(sup) == workers);
    exit_notice(g, p);
    REQUIRE(wait_for(channel_free, 2000));
  }
  CHECK(d.alive());
  ::unlink(ctl.c_str());
}

// What a dead process posted must not run (rule death-stops-work): a worker
// inside a long call when its process exits cannot answer, and is killed
// rather than left to finish the call and serve on.
TEST_CASE("a VM's process that exits while its worker is inside a long call loses the worker at once",
          "[process][hostile]") {
  // The double's contexts take 1.5 s to make: the worker's first one too.
  ::setenv("IVCUDA_GPU_DOUBLE_CONTEXT_DELAY_MS", "1500", 1);
  Daemon d({"--vm-spare-workers", "0"}, "-recycle-busy");
  ::unsetenv("IVCUDA_GPU_DOUBLE_CONTEXT_DELAY_MS");
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  const pid_t a = ::getpid() + 810000;
  claim(g, 0, a);
  REQUIRE(rc(g, 0, Op::kHello, hello(a)) == CUDA_SUCCESS);
  const pid_t sup = supervisor(d);
  REQUIRE(sup != 0);
  const auto workers = Daemon::children_of(sup);
  REQUIRE(workers.size() == 1);
  g.post(0, Op::kCtxCreate, proto::ReqDeviceFlags{0, 0});  // 1.5 s in the driver
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto killed = std::chrono::steady_clock::now();
  exit_notice(g, a);
  CHECK(wait_for([&] { return !running(workers[0]); }, 1000));
  INFO("worker gone after " << std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now() - killed).count() << " ms");
  CHECK(!running(workers[0]));
  // The VM's next process gets a worker of its own.
  claim(g, 1, a + 1);
  CHECK(rc(g, 1, Op::kHello, hello(a + 1)) == CUDA_SUCCESS);
  CHECK(d.alive());
}

// The audit's two attacks on the supervisor through VmShared (it read the
// pool's page count there and walked that many pages, and took the pool's
// lock there with no way out), and plain garbage over all of it. The
// supervisor must survive and go on serving the VM: a new process gets a
// worker, whose page-locked allocation works.
TEST_CASE("a subverted worker's writes to the VM's shared memory neither crash nor stall the supervisor",
          "[process][hostile]") {
  enum class Attack { kGeometry, kLock, kGarbage };
  Attack attack = Attack::kGarbage;
  SECTION("the pool's page count") { attack = Attack::kGeometry; }
  SECTION("the pool's lock held by a live process") { attack = Attack::kLock; }
  SECTION("garbage over all of it") { attack = Attack::kGarbage; }

  Daemon d({"--vm-spare-workers", "0"}, "-vmshared");
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  const pid_t a = ::getpid() + 800000, b = a + 1, c = a + 2;
  std::vector<std::byte> out;
  claim(g, 0, a);
  REQUIRE(rc(g, 0, Op::kHello, hello(a)) == CUDA_SUCCESS);
  claim(g, 1, b);
  REQUIRE(rc(g, 1, Op::kHello, hello(b)) == CUDA_SUCCESS);
  REQUIRE(rc(g, 1, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  const auto ctx_b = RawGuest::as<proto::RepHandle>(out).handle;
  const pid_t sup = supervisor(d);
  REQUIRE(sup != 0);
  const auto workers = Daemon::children_of(sup);
  REQUIRE(workers.size() == 2);
  const pid_t w = workers[0];

  // Code running in worker w, played by this test through /proc/w/mem.
  const int mem = ::open(("/proc/" + std::to_string(w) + "/mem").c_str(), O_RDWR | O_CLOEXEC);
  if (mem < 0) IVCUDA_SKIP("cannot open /proc/" << w << "/mem: " << std::strerror(errno));
  const std::uint64_t pool_off = ring::pool_off(g.l), pages = ring::pool_size(g.l) / 4096;
  const Range vm = vm_shared_in(w, pool_off, pages);
  REQUIRE(vm.hi > vm.lo);
  std::vector<std::uint64_t> words((vm.hi - vm.lo) / 8);
  REQUIRE(::pread(mem, words.data(), words.size() * 8, static_cast<off_t>(vm.lo)) ==
          static_cast<ssize_t>(words.size() * 8));
  // Where the pool's offset and page count are in the shared memory, if they are.
  std::size_t geometry = 0;
  for (std::size_t i = 0; i + 1 < std::min<std::size_t>(words.size(), 512); ++i)
    if (words[i] == pool_off && words[i + 1] == pages) geometry = i;
  auto put = [&](std::size_t word, std::uint64_t v) {
    REQUIRE(::pwrite(mem, &v, 8, static_cast<off_t>(vm.lo + word * 8)) == 8);
  };
  switch (attack) {
    case Attack::kGeometry:
      if (geometry != 0) put(geometry + 1, std::uint64_t{1} << 40);
      break;
    case Attack::kLock:
      // A process-shared mutex right in front of them: its lock word and
      // owner say a live thread (worker b's) holds it.
      if (geometry >= 5) {
        const auto tid = static_cast<std::uint64_t>(static_cast<std::uint32_t>(workers[1]));
        put(geometry - 5, tid);             // __lock, __count
        put(geometry - 4, tid | (1ull << 32));  // __owner, __nusers
      }
      break;
    case Attack::kGarbage:
      words.assign(words.size(), ~std::uint64_t{0});
      REQUIRE(::pwrite(mem, words.data(), words.size() * 8, static_cast<off_t>(vm.lo)) ==
              static_cast<ssize_t>(words.size() * 8));
      // Work for b's worker, so that the supervisor passes the doorbell on.
      g.post(1, Op::kCtxSynchronize, proto::ReqCtx{ctx_b});
      break;
  }
  ::close(mem);
  ::kill(w, SIGKILL);  // the subverted worker dies: the supervisor reclaims its slot
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CHECK(running(sup));
  // The supervisor still serves the VM: a new process gets a worker, and
  // page-locked memory from the pool.
  claim(g, 2, c);
  CHECK(rc(g, 2, Op::kHello, hello(c)) == CUDA_SUCCESS);
  CHECK(rc(g, 2, Op::kHostAlloc, proto::ReqHostAlloc{1 << 20, 0, 0}, &out) == CUDA_SUCCESS);
  CHECK(running(sup));
  CHECK(d.alive());
}

// docs/security.md, suspend-live-child: the daemon acts on a suspended VM's
// workers (checkpointer requests, kills) only while each is still its
// supervisor's live child. Here one of them ends while the VM is suspended,
// and another process of the host gets its pid; evicting the VM then kills
// the VM's remaining worker, and must leave that process alone.
TEST_CASE("a suspended VM's ended worker's pid, taken by another process, is never acted on",
          "[process][hostile][pid-reuse]") {
  SuspendingVm v("reuse", nullptr);
  const auto& workers = v.workers;
  const std::string& ctl = v.ctl;
  const auto id = v.id;
  REQUIRE(v.when("suspended", 15000).is_object());

  // The first worker ends; its supervisor reaps it, and the pid is free.
  const pid_t gone = workers[0];
  const pid_t other = end_and_take_pid(gone);
  if (other != gone) IVCUDA_SKIP("could not start a process with pid " << gone << " (ns_last_pid needs root)");
  // Evicting a suspended VM kills its workers: the one left, not the pid's new owner.
  const auto evicted = control(ctl, R"({"cmd":"evict","guest":)" + std::to_string(id) + "}");
  INFO("evict: " << evicted.dump());
  CHECK(evicted.value("ok", false));
  CHECK(wait_for([&] { return !running(workers[1]); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(running(other));
  CHECK(::waitpid(other, nullptr, WNOHANG) == 0);
  ::kill(other, SIGKILL);
  ::waitpid(other, nullptr, 0);
  CHECK(v.d.alive());
}

// The same rule where it matters most: a request waits in the daemon's
// queue while the checkpointer works on another worker (seconds, for GiBs),
// and its worker ends meanwhile and its pid goes to another process. The
// request is dropped as it would go, and the VM is suspended without it.
TEST_CASE("a VM's worker that ends while its checkpoint request waits is skipped as the request would go, and the VM "
          "suspends without it",
          "[process][hostile][pid-reuse]") {
  SuspendingVm v("queued", "1500");  // each checkpoint takes 1.5 s
  const auto& workers = v.workers;
  Daemon& d = v.d;
  // The checkpointer starts once both workers hold their calls and both
  // requests are queued; the first takes 1.5 s.
  const auto checkpointer = [&] {
    for (const pid_t c : Daemon::children_of(d.pid)) {
      std::ifstream comm("/proc/" + std::to_string(c) + "/comm");
      std::string name;
      if (std::getline(comm, name) && name == "ivcuda-ckpt") return c;
    }
    return pid_t{0};
  };
  REQUIRE(wait_for([&] { return checkpointer() != 0; }));
  const pid_t gone = workers[1];
  const pid_t other = end_and_take_pid(gone);
  if (other != gone) IVCUDA_SKIP("could not start a process with pid " << gone << " (ns_last_pid needs root)");
  const nlohmann::json vm = v.when("suspended", 15000);
  INFO("the VM: " << vm_entry(v.ctl).dump());
  REQUIRE(vm.is_object());
  CHECK(vm.contains("suspend"));
  CHECK(vm["suspend"].value("last", std::string()) == "suspended");
  CHECK(running(other));
  ::kill(other, SIGKILL);
  ::waitpid(other, nullptr, 0);
  CHECK(d.alive());
}
