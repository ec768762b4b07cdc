// A hostile local user, and a worker that a hostile guest subverted: what the
// host's own surfaces must refuse them (docs/security.md, "Sandbox" and "The
// operator's interfaces"). The sandbox cases fork a child that applies the
// project's own sandbox steps (host-daemon/sandbox/sandbox.h) exactly as a worker
// does, then tries what a subverted worker would; the control-socket cases
// run a daemon and speak to it as another user would.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <liburing.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "host-daemon/sandbox/sandbox.h"
#include "host-daemon/worker/uring_wait.h"
#include "tests/process/raw_guest.h"

using namespace ivcuda;
namespace sandbox = ivcuda::host::sandbox;

namespace {

constexpr uid_t kNobody = 65534;

// What a forked child reports: "key value" lines through a pipe.
struct Report {
  int fd;
  void put(const std::string& key, const std::string& value) const {
    const std::string line = key + " " + value + "\n";
    (void)!::write(fd, line.data(), line.size());
  }
  // The answer of a system call: "ok" or the errno's name.
  void call(const std::string& key, long rc) const { put(key, rc < 0 ? errno_name(errno) : "ok"); }
  static std::string errno_name(int e) {
    switch (e) {
      case EPERM: return "EPERM";
      case EACCES: return "EACCES";
      case ENOTTY: return "ENOTTY";
      case EINVAL: return "EINVAL";
      case ENOSYS: return "ENOSYS";
      case ESRCH: return "ESRCH";
      default: return "errno" + std::to_string(e);
    }
  }
};

struct Answers {
  std::map<std::string, std::string> v;
  int status = -1;
  std::string operator[](const std::string& k) const {
    const auto it = v.find(k);
    return it == v.end() ? "(none)" : it->second;
  }
};

// Forks; the child runs `body` and exits 0; its report comes back.
Answers in_child(const std::function<void(const Report&)>& body) {
  int p[2];
  REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(p[0]);
    body(Report{p[1]});
    ::_exit(0);
  }
  ::close(p[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  ::close(p[0]);
  Answers a;
  ::waitpid(pid, &a.status, 0);
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto sp = line.find(' ');
    if (sp != std::string::npos) a.v[line.substr(0, sp)] = line.substr(sp + 1);
  }
  return a;
}

// The worker's two steps, as vm_supervisor.cc runs them around Worker::create.
// Reports "sandbox ok" or the error.
bool enter_sandbox(const sandbox::Config& cfg, const std::string& driver, const Report& r) {
  sandbox::Applied a;
  if (auto s = sandbox::before_driver(cfg, {driver}, &a); !s) {
    r.put("sandbox", "before_driver: " + s.error().what);
    return false;
  }
  if (auto s = sandbox::after_driver(cfg, &a); !s) {
    r.put("sandbox", "after_driver: " + s.error().what);
    return false;
  }
  r.put("sandbox", "ok");
  r.put("landlock_abi", std::to_string(a.landlock_abi));
  r.put("seccomp", a.seccomp ? "yes" : "no");
  return true;
}

// A process for the worker to aim at: root with every capability, as the
// daemon and QEMU are, or root with none, as another guest's worker is.
struct Victim {
  pid_t pid = -1;
  explicit Victim(bool like_a_worker = false) {
    pid = ::fork();
    if (pid == 0) {
      if (like_a_worker) {
        __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
        __user_cap_data_struct none[2] = {};
        if (::syscall(SYS_capset, &hdr, none) != 0) ::_exit(3);
      }
      for (;;) ::pause();
    }
  }
  ~Victim() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  // The signal that ended it, 0 while it lives.
  int killed_by() const {
    int st = 0;
    return ::waitpid(pid, &st, WNOHANG) == pid && WIFSIGNALED(st) ? WTERMSIG(st) : 0;
  }
};

// A field of /proc/self/status ("CapEff" -> "0000000000000000").
std::string status_field(const std::string& key) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream in(line.substr(key.size() + 1));
      std::string v;
      in >> v;
      return v;
    }
  return "(missing)";
}

sandbox::Config root_worker() {
  sandbox::Config c;
  return c;
}

}  // namespace

// ---------------------------------------------------------------- capabilities

TEST_CASE("a sandboxed worker holds no capabilities, not even in its bounding set", "[process][hostile]") {
  REQUIRE(::geteuid() == 0);  // what is dropped is root's (CI and the package's daemon run as root)
  Victim daemon_like;
  for (const char* user : {"", "nobody"})
    for (const bool landlock : {true, false}) {
      CAPTURE(user, landlock);
      sandbox::Config cfg = root_worker();
      cfg.user = user;
      REQUIRE(sandbox::resolve_user(cfg));
      // Without Landlock (the test switch stands for a kernel without it)
      // nothing but the missing capabilities keeps a root worker out of the
      // daemon's memory.
      cfg.test_double_ipc = !landlock;
      const Answers a = in_child([&](const Report& r) {
        if (!enter_sandbox(cfg, "libm.so.6", r)) return;
        for (const char* k : {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}) r.put(k, status_field(k));
        r.put("uid", std::to_string(::getuid()));
        const std::string mem = "/proc/" + std::to_string(daemon_like.pid) + "/mem";
        r.call("open_daemon_mem", ::open(mem.c_str(), O_RDWR | O_CLOEXEC));
        r.call("open_init_environ", ::open("/proc/1/environ", O_RDONLY | O_CLOEXEC));
      });
      REQUIRE(a["sandbox"] == "ok");
      CHECK((a["landlock_abi"] != "0") == landlock);
      CHECK(a["uid"] == (*user == '\0' ? "0" : std::to_string(kNobody)));
      for (const char* k : {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}) {
        CAPTURE(k);
        CHECK(a[k] == "0000000000000000");
      }
      CHECK(a["open_daemon_mem"] != "ok");
      CHECK(a["open_init_environ"] != "ok");
    }
}

// ----------------------------------------------------------- the system calls

TEST_CASE("a sandboxed worker cannot configure the network or a terminal through ioctl", "[process][hostile]") {
  const Answers a = in_child([&](const Report& r) {
    int sv[2];
    ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv);  // like its broker line
    const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (!enter_sandbox(root_worker(), "libm.so.6", r)) return;
    ifreq ifr{};
    std::strcpy(ifr.ifr_name, "lo");
    r.call("SIOCGIFFLAGS", ::ioctl(sv[1], SIOCGIFFLAGS, &ifr));
    r.call("SIOCSIFFLAGS", ::ioctl(sv[1], SIOCSIFFLAGS, &ifr));
    winsize ws{};
    r.call("TIOCGWINSZ", ::ioctl(null, TIOCGWINSZ, &ws));
    char c = 'x';
    r.call("TIOCSTI", ::ioctl(null, TIOCSTI, &c));
    // A request of another type reaches the kernel (which knows no such
    // request on /dev/null): the driver's own kind of ioctl still goes through.
    r.call("driver_like", ::ioctl(null, _IOWR('F', 0x2a, int), &ws));
  });
  REQUIRE(a["sandbox"] == "ok");
  CHECK(a["SIOCGIFFLAGS"] == "EPERM");
  CHECK(a["SIOCSIFFLAGS"] == "EPERM");
  CHECK(a["TIOCGWINSZ"] == "EPERM");
  CHECK(a["TIOCSTI"] == "EPERM");
  CHECK(a["driver_like"] == "ENOTTY");
}

TEST_CASE("a sandboxed worker cannot aim signals through file ownership (F_SETOWN, F_SETSIG)",
          "[process][hostile]") {
  for (const bool landlock : {true, false}) {
    CAPTURE(landlock);
    Victim v;
    sandbox::Config cfg = root_worker();
    cfg.test_double_ipc = !landlock;  // below Landlock ABI 6 nothing else would stop the signal
    const Answers a = in_child([&](const Report& r) {
      if (!enter_sandbox(cfg, "libm.so.6", r)) return;
      int p[2];
      ::pipe2(p, O_NONBLOCK | O_CLOEXEC);
      r.call("F_SETOWN", ::fcntl(p[0], F_SETOWN, v.pid));
      f_owner_ex owner{F_OWNER_PID, v.pid};
      r.call("F_SETOWN_EX", ::fcntl(p[0], F_SETOWN_EX, &owner));
      r.call("F_SETSIG", ::fcntl(p[0], F_SETSIG, SIGKILL));
      r.call("F_SETFL_ASYNC", ::fcntl(p[0], F_SETFL, O_ASYNC | O_NONBLOCK));
      (void)!::write(p[1], "x", 1);  // would send the signal, had the owner been set
      // What the worker and the driver use stays.
      r.call("F_GETFL", ::fcntl(p[0], F_GETFL));
      r.call("F_SETFD", ::fcntl(p[0], F_SETFD, FD_CLOEXEC));
      r.call("F_DUPFD_CLOEXEC", ::fcntl(p[0], F_DUPFD_CLOEXEC, 0));
      const int m = ::memfd_create("ivcuda-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      r.call("F_ADD_SEALS", ::fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK));
      r.call("F_GET_SEALS", ::fcntl(m, F_GET_SEALS));
      ::usleep(100 * 1000);
    });
    REQUIRE(a["sandbox"] == "ok");
    CHECK(a["F_SETOWN"] == "EPERM");
    CHECK(a["F_SETOWN_EX"] == "EPERM");
    CHECK(a["F_SETSIG"] == "EPERM");
    for (const char* k : {"F_SETFL_ASYNC", "F_GETFL", "F_SETFD", "F_DUPFD_CLOEXEC", "F_ADD_SEALS", "F_GET_SEALS"}) {
      CAPTURE(k);
      CHECK(a[k] == "ok");
    }
    ::usleep(50 * 1000);
    CHECK(v.killed_by() == 0);
  }
}

TEST_CASE("a sandboxed worker sets CPU affinity and reads limits of itself only", "[process][hostile]") {
  // Another worker: as the same user and with no more capabilities than this
  // one, the kernel's own checks let it through.
  Victim v(true);
  const Answers a = in_child([&](const Report& r) {
    if (!enter_sandbox(root_worker(), "libm.so.6", r)) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    r.call("affinity_other", ::sched_setaffinity(v.pid, sizeof set, &set));
    cpu_set_t mine;
    CPU_ZERO(&mine);
    ::sched_getaffinity(0, sizeof mine, &mine);
    r.call("affinity_self_0", ::sched_setaffinity(0, sizeof mine, &mine));
    r.call("affinity_self_pid", ::sched_setaffinity(::getpid(), sizeof mine, &mine));
    rlimit old{};
    r.call("prlimit_other_read", ::syscall(SYS_prlimit64, v.pid, RLIMIT_NOFILE, nullptr, &old));
    r.call("prlimit_self_read", ::syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, nullptr, &old));
    r.call("prlimit_self_pid_read", ::syscall(SYS_prlimit64, ::getpid(), RLIMIT_NOFILE, nullptr, &old));
    r.call("prlimit_self_set", ::syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, &old, nullptr));
    r.call("getrlimit", ::getrlimit(RLIMIT_NOFILE, &old));
  });
  REQUIRE(a["sandbox"] == "ok");
  CHECK(a["affinity_other"] == "EPERM");
  CHECK(a["affinity_self_0"] == "ok");
  CHECK(a["affinity_self_pid"] == "ok");
  CHECK(a["prlimit_other_read"] == "EPERM");
  CHECK(a["prlimit_self_read"] == "ok");
  CHECK(a["prlimit_self_pid_read"] == "ok");
  CHECK(a["prlimit_self_set"] == "EPERM");
  CHECK(a["getrlimit"] == "ok");
  cpu_set_t got;
  CPU_ZERO(&got);
  REQUIRE(::sched_getaffinity(v.pid, sizeof got, &got) == 0);
  CHECK((CPU_COUNT(&got) > 1 || std::thread::hardware_concurrency() == 1));
}

TEST_CASE("a sandboxed worker's stdin is /dev/null, whatever the daemon's was", "[process][hostile]") {
  const Answers a = in_child([&](const Report& r) {
    int p[2];
    ::pipe(p);  // stands for a terminal the daemon was started from
    ::dup2(p[0], 0);
    if (!enter_sandbox(root_worker(), "libm.so.6", r)) return;
    char target[256] = {};
    const ssize_t n = ::readlink("/proc/self/fd/0", target, sizeof target - 1);
    r.put("stdin", n > 0 ? std::string(target, static_cast<std::size_t>(n)) : "(unreadable)");
  });
  REQUIRE(a["sandbox"] == "ok");
  CHECK(a["stdin"] == "/dev/null");
}

// ------------------------------------------------------------------- Landlock

namespace {

// Stands in for an older kernel: answers some system calls of the calling
// thread (and the threads it starts) in place of the kernel, through
// seccomp's user notification. `answer` gets the call's arguments and
// returns {true, value} to answer (value < 0: that errno) or {false, 0} to
// let the kernel run it.
class FakeKernel {
 public:
  using Answer = std::function<std::pair<bool, long>(const seccomp_data&)>;
  FakeKernel(int nr, Answer answer) : answer_(std::move(answer)) {
    thread_ = std::thread([this] { serve(); });
    ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    ctx_ = ::seccomp_init(SCMP_ACT_ALLOW);
    ::seccomp_rule_add(ctx_, SCMP_ACT_NOTIFY, nr, 0);
    ok_ = ::seccomp_load(ctx_) == 0;
    fd_.store(ok_ ? ::seccomp_notify_fd(ctx_) : -2);
  }
  ~FakeKernel() {
    stop_.store(true);
    thread_.join();
    ::seccomp_release(ctx_);
  }
  bool ok() const { return ok_; }

 private:
  void serve() {
    while (fd_.load() == -1) std::this_thread::yield();
    const int fd = fd_.load();
    seccomp_notif* req = nullptr;
    seccomp_notif_resp* resp = nullptr;
    if (fd < 0 || ::seccomp_notify_alloc(&req, &resp) != 0) return;
    while (!stop_.load()) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      std::memset(req, 0, sizeof *req);
      if (::seccomp_notify_receive(fd, req) != 0) continue;
      const auto [answered, value] = answer_(req->data);
      std::memset(resp, 0, sizeof *resp);
      resp->id = req->id;
      if (!answered) {
        resp->flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
      } else if (value < 0) {
        resp->error = static_cast<std::int32_t>(value);
      } else {
        resp->val = value;
      }
      (void)::seccomp_notify_respond(fd, resp);
    }
    ::seccomp_notify_free(req, resp);
  }
  Answer answer_;
  scmp_filter_ctx ctx_ = nullptr;
  bool ok_ = false;
  std::atomic<int> fd_{-1};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

namespace {

// Answers Landlock's version query with `abi` (0: no Landlock, ENOSYS).
FakeKernel::Answer landlock_of(int abi) {
  return [abi](const seccomp_data& d) {
    if (abi == 0) return std::pair<bool, long>{true, -ENOSYS};
    return d.args[2] == 1 /* LANDLOCK_CREATE_RULESET_VERSION */ ? std::pair<bool, long>{true, abi}
                                                               : std::pair<bool, long>{false, 0};
  };
}

// Runs ivcudad (the daemon's own stderr into `log`) under a kernel without
// Landlock: a seccomp filter answers landlock_create_ruleset with ENOSYS.
pid_t daemon_without_landlock(const std::vector<std::string>& extra, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  ::unsetenv("IVCUDA_TEST_DOUBLE_IPC");
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ::dup2(fd, 2);
  ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  scmp_filter_ctx ctx = ::seccomp_init(SCMP_ACT_ALLOW);
  ::seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), __NR_landlock_create_ruleset, 0);
  if (::seccomp_load(ctx) != 0) ::_exit(126);
  std::vector<std::string> args = {IVCUDAD_PATH, "--driver", GPU_DOUBLE_PATH, "--shm-size", "256M", "--channels",
                                   "4", "--staging-size", "4M", "--warm-workers", "0", "--control-socket", "none"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(IVCUDAD_PATH, argv.data());
  ::_exit(127);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("a worker under --sandbox on serves only with Landlock ABI 6 or later, under degraded with less",
          "[process][hostile]") {
  for (const int abi : {0, 4, 5, 6}) {
    for (const auto mode : {sandbox::Mode::kOn, sandbox::Mode::kDegraded}) {
      CAPTURE(abi, mode == sandbox::Mode::kOn ? "on" : "degraded");
      const Answers a = in_child([&](const Report& r) {
        ::unsetenv("IVCUDA_TEST_DOUBLE_IPC");  // prepare() reads it: this case is about the kernel alone
        FakeKernel older(__NR_landlock_create_ruleset, landlock_of(abi));
        if (!older.ok()) return r.put("sandbox", "no user notification here");
        sandbox::Config cfg;
        cfg.mode = mode;
        if (auto p = sandbox::prepare(cfg); !p) r.put("prepare", p.error().what);
        enter_sandbox(cfg, "libm.so.6", r);
      });
      const bool serves = mode == sandbox::Mode::kDegraded || abi >= sandbox::kLandlockAbiForOn;
      if (serves) {
        CHECK(a["prepare"] == "(none)");
        CHECK(a["sandbox"] == "ok");
        CHECK(a["landlock_abi"] == std::to_string(abi));
      } else {
        CHECK(a["prepare"].find("--sandbox on needs Landlock ABI 6") != std::string::npos);
        CHECK(a["sandbox"].find("--sandbox on needs Landlock ABI 6") != std::string::npos);
      }
    }
  }
}

TEST_CASE("ivcudad --sandbox on stops at start on a kernel without Landlock, and degraded serves",
          "[process][hostile]") {
  const std::string base = "/tmp/ivcuda-hostile-local-" + std::to_string(::getpid());
  SECTION("on") {
    const std::string sock = base + "-on.sock", log = base + "-on.log";
    const pid_t pid = daemon_without_landlock({"--socket", sock, "--sandbox", "on"}, log);
    int st = 0;
    for (int i = 0; i < 300 && ::waitpid(pid, &st, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!WIFEXITED(st)) ::kill(pid, SIGKILL), ::waitpid(pid, &st, 0);
    INFO(read_file(log));
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 2);
    CHECK(read_file(log).find("--sandbox on needs Landlock ABI 6") != std::string::npos);
    CHECK(::access(sock.c_str(), F_OK) != 0);  // it never listened
    ::unlink(log.c_str());
  }
  SECTION("degraded") {
    const std::string sock = base + "-degraded.sock", log = base + "-degraded.log";
    ::unlink(sock.c_str());
    const pid_t pid = daemon_without_landlock({"--socket", sock, "--sandbox", "degraded"}, log);
    for (int i = 0; i < 300 && ::access(sock.c_str(), F_OK) != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    {
      testing::RawGuest g(sock);
      g.open(0);
      proto::ReqHello hello{proto::kProtoVersion, 1, 0, 0, {}};
      std::vector<std::byte> out;
      CHECK(g.call(0, proto::Op::kHello, hello, &out) == CUDA_SUCCESS);
    }
    ::kill(pid, SIGTERM);
    ::waitpid(pid, nullptr, 0);
    const std::string text = read_file(log);
    INFO(text);
    CHECK(text.find("SANDBOX DEGRADED (--sandbox degraded): no Landlock") != std::string::npos);
    CHECK(text.find("sandbox degraded: no_new_privs yes, landlock no (the kernel has no Landlock)") !=
          std::string::npos);
    ::unlink(log.c_str());
  }
}

TEST_CASE("the GPU test double gets Landlock like any driver, unless the explicit test switch is set",
          "[process][hostile]") {
  for (const bool test_switch : {false, true}) {
    CAPTURE(test_switch);
    const Answers a = in_child([&](const Report& r) {
      sandbox::Config cfg;
      cfg.test_double_ipc = test_switch;
      sandbox::Applied applied;
      if (auto b = sandbox::before_driver(cfg, {GPU_DOUBLE_PATH}, &applied); !b) return r.put("sandbox", b.error().what);
      r.put("sandbox", "ok");
      r.put("landlock_abi", std::to_string(applied.landlock_abi));
      r.put("note", applied.landlock_note);
      r.call("open_etc", ::open("/etc/hostname", O_RDONLY | O_CLOEXEC));
    });
    REQUIRE(a["sandbox"] == "ok");
    if (test_switch) {
      CHECK(a["landlock_abi"] == "0");
      CHECK(a["note"].find("test switch IVCUDA_TEST_DOUBLE_IPC=1") != std::string::npos);
    } else {
      CHECK(a["landlock_abi"] != "0");
      CHECK(a["open_etc"] == "EACCES");
    }
  }
}

// ------------------------------------------------------------------- io_uring

namespace {

// How many io_uring instances this process holds.
int io_urings_held() {
  int n = 0;
  for (int fd = 0; fd < 1024; ++fd) {
    char target[128] = {};
    const std::string link = "/proc/self/fd/" + std::to_string(fd);
    const ssize_t len = ::readlink(link.c_str(), target, sizeof target - 1);
    if (len > 0 && std::strstr(target, "io_uring") != nullptr) ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("a worker's io_uring is restricted, or the worker waits without one", "[process][hostile]") {
  SECTION("this kernel: a restricted ring") {
    const Answers a = in_child([&](const Report& r) {
      const int bell = ::eventfd(0, EFD_CLOEXEC);
      auto w = host::UringWaiter::create(bell, -1);
      r.put("created", w ? "yes" : w.error().what);
      if (!w) return;
      r.put("restricted", (*w)->restricted() ? "yes" : "no");
      r.put("rings", std::to_string(io_urings_held()));
    });
    CHECK(a["created"] == "yes");
    CHECK(a["restricted"] == "yes");
    CHECK(a["rings"] == "1");
  }
  SECTION("a kernel without ring restrictions (5.1-5.9): no ring at all, and the waits still work") {
    const Answers a = in_child([&](const Report& r) {
      // Such a kernel refuses IORING_SETUP_R_DISABLED with EINVAL.
      FakeKernel old_kernel(__NR_io_uring_setup, [](const seccomp_data& d) {
        const auto* params = reinterpret_cast<const io_uring_params*>(d.args[1]);
        return (params->flags & IORING_SETUP_R_DISABLED) != 0 ? std::pair<bool, long>{true, -EINVAL}
                                                               : std::pair<bool, long>{false, 0};
      });
      if (!old_kernel.ok()) {
        r.put("created", "no user notification here");
        return;
      }
      const int bell = ::eventfd(0, EFD_CLOEXEC);
      int sv[2];
      ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
      auto w = host::UringWaiter::create(bell, sv[0]);
      r.put("created", w ? "yes" : w.error().what);
      if (!w) return;
      r.put("rings", std::to_string(io_urings_held()));
      r.put("idle", std::to_string((*w)->wait(20)));
      const std::uint64_t one = 1;
      (void)!::write(bell, &one, sizeof one);
      r.put("rang", std::to_string((*w)->wait(1000)));
      r.put("quiet_again", std::to_string((*w)->wait(20)));
      ::close(sv[1]);
      r.put("hangup", std::to_string((*w)->wait(1000)));
    });
    CHECK(a["created"] == "yes");
    CHECK(a["rings"] == "0");
    CHECK(a["idle"] == "0");
    CHECK(a["rang"] == std::to_string(host::UringWaiter::kDoorbell));
    CHECK(a["quiet_again"] == "0");
    CHECK(a["hangup"] == std::to_string(host::UringWaiter::kHangup));
  }
}

// ---------------------------------------------------------- the control socket

namespace {

// Connects to a UNIX socket; -1 if it cannot.
int connect_unix(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// How long the daemon takes to greet a new guest on its socket (the first
// message of the ivshmem protocol), in milliseconds.
long greeting_ms(const std::string& sock) {
  const auto t0 = std::chrono::steady_clock::now();
  const int fd = connect_unix(sock);
  if (fd < 0) return -1;
  std::uint64_t version = 0;
  pollfd p{fd, POLLIN, 0};
  const bool got = ::poll(&p, 1, 30000) == 1 && ::recv(fd, &version, sizeof version, 0) > 0;
  ::close(fd);
  if (!got) return -1;
  return static_cast<long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());
}

// Waits until the daemon has put its control socket there.
void wait_for(const std::string& path) {
  for (int i = 0; i < 300 && ::access(path.c_str(), F_OK) != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

// Keeps 16 connections to `path` open and silent, reconnecting those the
// daemon hangs up on, until killed.
[[noreturn]] void silent_crowd(const std::string& path, bool as_nobody) {
  if (as_nobody && (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0)) ::_exit(3);
  std::vector<int> fds;
  for (;;) {
    for (auto it = fds.begin(); it != fds.end();) {
      char c;
      const ssize_t n = ::recv(*it, &c, 1, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) {
        ::close(*it);
        it = fds.erase(it);
      } else {
        ++it;
      }
    }
    while (fds.size() < 16) {
      const int fd = connect_unix(path);
      if (fd < 0) break;
      fds.push_back(fd);
    }
    ::usleep(20 * 1000);
  }
}

}  // namespace

TEST_CASE("the control socket answers a refused user at once, before it sends anything", "[process][hostile]") {
  const std::string ctl = "/tmp/ivcuda-hostile-local-" + std::to_string(::getpid()) + "-ctl.sock";
  testing::Daemon d({"--control-socket", ctl}, "-local-ctl");
  REQUIRE(d.alive());
  wait_for(ctl);
  REQUIRE(::chmod(ctl.c_str(), 0666) == 0);  // a mode widened by mistake: the daemon's own check must hold
  const Answers a = in_child([&](const Report& r) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) {
      r.put("client", "cannot become nobody");
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const int fd = connect_unix(ctl);
    if (fd < 0) {
      r.put("client", "cannot connect");
      return;
    }
    // Sends nothing: a refused user must not hold the daemon for a moment.
    std::string got;
    char buf[512];
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 3000) != 1) break;
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
    }
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    r.put("client", "ok");
    r.put("reply", got.substr(0, got.find('\n')));
    r.put("ms", std::to_string(ms.count()));
  });
  REQUIRE(a["client"] == "ok");
  CHECK(a["reply"].find("permission denied") != std::string::npos);
  CHECK(std::stol(a["ms"]) < 400);  // the daemon waited 500 ms for a request before it looked
  ::unlink(ctl.c_str());
}

TEST_CASE("silent control clients never stall the daemon's loop", "[process][hostile]") {
  const std::string ctl = "/tmp/ivcuda-hostile-local-" + std::to_string(::getpid()) + "-stall.sock";
  testing::Daemon d({"--control-socket", ctl}, "-local-stall");
  REQUIRE(d.alive());
  wait_for(ctl);
  REQUIRE(::chmod(ctl.c_str(), 0666) == 0);
  const long idle = greeting_ms(d.sock);
  REQUIRE(idle >= 0);
  // Silent clients, refused ones (nobody) and allowed ones (root), kept
  // connected and reconnected as the daemon hangs up on them.
  std::vector<pid_t> crowds;
  for (const bool nobody : {true, false}) {
    const pid_t p = ::fork();
    if (p == 0) silent_crowd(ctl, nobody);
    crowds.push_back(p);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  std::vector<long> busy;
  for (int i = 0; i < 3; ++i) busy.push_back(greeting_ms(d.sock));
  for (const pid_t p : crowds) {
    ::kill(p, SIGKILL);
    ::waitpid(p, nullptr, 0);
  }
  INFO("greeting: idle " << idle << " ms; with 32 silent control clients " << busy[0] << ", " << busy[1] << ", "
                         << busy[2] << " ms");
  for (const long ms : busy) {
    CHECK(ms >= 0);
    CHECK(ms < 1000);  // one silent client held the loop for 500 ms, sixteen for 8 s
  }
  CHECK(d.alive());
  ::unlink(ctl.c_str());
}
