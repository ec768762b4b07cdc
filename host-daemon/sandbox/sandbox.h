// The worker's sandbox (docs/security.md, "Sandbox"). A worker parses memory
// that a hostile guest writes; once its driver is open it keeps only what
// serving needs. It is applied in two steps, because Landlock binds only the
// thread that asks for it (and the threads that thread makes later), while the
// driver starts threads of its own in cuInit:
//   before_driver(): in the freshly forked worker, still single-threaded:
//     no_new_privs and the Landlock ruleset (files, TCP, signals, abstract
//     sockets), so that every thread the driver makes inherits them;
//   after_driver(): once the driver is open, its contexts made and the arena
//     registered: the drop to --user and of every capability (the bounding set
//     too), then the seccomp allowlist, installed on every thread at once.
// The daemon itself gets prepare() (the kernel against --sandbox) and
// apply_to_daemon(): no_new_privs only (see there).
#pragma once

#include <sys/types.h>

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ivcuda/result.h"

namespace ivcuda::host::sandbox {

// --sandbox: on (everything below, and Landlock of ABI 6 or later, or no
// serving), degraded (the same with whatever Landlock the kernel has, said
// at every start), audit (degraded, but a system call the allowlist lacks is
// made and the kernel logs it - audit type 1326 in its log - instead of
// failing with EPERM: how to find what a new driver or a new driver feature
// needs; debugging only), off (nothing: debugging only).
enum class Mode { kOn, kDegraded, kAudit, kOff };

// Landlock's ABI 6 (Linux 6.12) scopes signals and abstract UNIX sockets to
// the worker; below it, or without Landlock, --sandbox on does not serve.
constexpr int kLandlockAbiForOn = 6;

struct Config {
  Mode mode = Mode::kOn;
  std::string user;  // --user: empty keeps the daemon's user (its capabilities are dropped all the same)
  uid_t uid = 0;     // resolved by resolve_user()
  gid_t gid = 0;
  // IVCUDA_TEST_DOUBLE_IPC=1 in the daemon's environment, a test switch that
  // no guest reaches and the daemon logs at start: the GPU test double's
  // processes share state the way no driver does - IPC memory through other
  // workers' /proc/PID/fd (which Landlock refuses across domains), filled with
  // pwrite64, and one "GPU" through a ledger file anywhere (which Landlock's
  // rules do not name). So: no Landlock, and those calls allowed
  // (kTestDoubleCalls in sandbox.cc).
  bool test_double_ipc = false;
  bool enabled() const noexcept { return mode != Mode::kOff; }
};

// "on", "degraded", "audit", "off"; false for anything else.
bool parse_mode(const std::string& s, Mode* out);

// In the daemon, before any worker exists: looks --user up. A worker could
// not (the user database may sit behind NSS modules that open files or
// sockets), and a bad name should stop the daemon, not each guest.
Result<void> resolve_user(Config& c);

// In the daemon at start: reads the test switch, and holds the kernel's
// Landlock against the mode (an error for --sandbox on below ABI 6, so that
// such a host stops at start, not at each guest). Logs what it found.
Result<void> prepare(Config& c);

// The daemon: no_new_privs when the sandbox is on. Logs what it did.
void apply_to_daemon(const Config& c);

// Landlock's ABI on this kernel; 0 without it (*why says why).
int landlock_abi(std::string* why);

// What a worker applied, for its one log line.
struct Applied {
  bool no_new_privs = false;
  int landlock_abi = 0;       // 0: no Landlock ruleset in force
  std::string landlock_note;  // why not, when not
  bool capabilities_dropped = false;
  std::string capabilities_note;
  bool seccomp = false;
  bool seccomp_refuses = false;  // false under --sandbox audit: what the filter lacks is made
  std::string seccomp_note;
  std::size_t allowed_syscalls = 0;  // of the product's table (--print-syscall-allowlist)
  std::size_t extra_syscalls = 0;    // the test switch's and the sanitizer runtime's
  // Under --user: the pipes open before the driver (before_driver), so that
  // after_driver gives the user only those the driver made.
  std::vector<std::pair<dev_t, ino_t>> pipes_before;
};

// Step 1, in the worker right after fork: stdin becomes /dev/null (a tty the
// daemon was started from is no worker's), no_new_privs, Landlock. libraries
// are what --driver and --nvml name: they are loaded here (dlopen, nothing
// called) so that their directories and their dependencies' can be allowed
// before the ruleset closes. Fails (the worker does not serve) with --sandbox
// on below Landlock ABI 6.
Result<void> before_driver(const Config& c, const std::vector<std::string>& libraries, Applied* a);

// Step 2, after Worker::create succeeded. Logs one line saying what is in force.
Result<void> after_driver(const Config& c, Applied* a);

// The checkpointer (host-daemon/daemon/suspend.h), right after fork, before
// its driver loads: no_new_privs, an empty bounding set, --user's ids (the
// workers' user: it acts on their processes only), no capabilities. Unless
// the mode is off; Landlock and seccomp are not applied to it (suspend.h
// says why). Logs one line.
Result<void> for_checkpointer(const Config& c);

// The seccomp allowlist: the one table of system calls a sandboxed worker may
// make (sandbox.cc), each with why. Rules narrow some of them further.
enum class Rule {
  kAny,          // any arguments
  kThreadsOnly,  // clone: only with CLONE_THREAD (threads, never processes)
  kOwnProcess,   // tgkill: only to this process's own threads
  kSelfOnly,     // sched_setaffinity: only this process (pid 0 or its own)
  kReadOwnLimits,  // prlimit64: read this process's limits, never set any
  kPrctlSome,    // prctl: only the options listed in sandbox.cc
  kFcntlSome,    // fcntl: only the commands listed in sandbox.cc (no F_SETOWN*, F_SETSIG, leases)
  kIoctlNoNetTty,  // ioctl: no socket/network (0x89xx, 0x8bxx) or terminal (0x54xx) requests
  kEnosys,       // refused with ENOSYS so that the C library falls back (clone3 -> clone)
  kMemorySharing,  // clone: CLONE_VM tasks too (sanitizer builds: LeakSanitizer's tracer)
};
struct Syscall {
  const char* name;
  Rule rule;
  const char* why;
};
std::span<const Syscall> allowlist();
// Allowed on top of it only under the test switch (Config::test_double_ipc),
// and in sanitizer builds for their runtimes: never in a product's workers.
std::span<const Syscall> test_double_calls();
std::span<const Syscall> sanitizer_calls();
const char* rule_name(Rule r) noexcept;

// IVCUDA_SANDBOX_SELFTEST=1 in the daemon's environment (which no guest
// reaches): right after step 2 the worker tries what the sandbox forbids and
// logs each answer ("sandbox self-test: socket(AF_INET) -> EPERM ...").
void self_test_if_asked(const Applied& a);

// IVCUDA_SANDBOX_TRACE_MARK=1 (tests/gpu/trace_worker_syscalls.sh): the worker
// makes a distinctive, harmless system call at each point, which strace shows:
// faccessat(AT_FDCWD, "/ivcuda-sandbox-point/<what>", F_OK).
void trace_mark(const char* what);

}  // namespace ivcuda::host::sandbox
