// The worker's sandbox (docs/security.md, "Sandbox"). A worker parses memory
// that a hostile guest writes; once its driver is open it keeps only what
// serving needs. It is applied in two steps, because Landlock binds only the
// thread that asks for it (and the threads that thread makes later), while the
// driver starts threads of its own in cuInit:
//   before_driver(): in the freshly forked worker, still single-threaded:
//     no_new_privs and the Landlock ruleset (files, TCP, signals, abstract
//     sockets), so that every thread the driver makes inherits them;
//   after_driver(): once the driver is open, its contexts made and the arena
//     registered: the drop to --user, then the seccomp allowlist, installed on
//     every thread at once.
// The daemon itself gets apply_to_daemon(): no_new_privs only (see there).
#pragma once

#include <sys/types.h>

#include <span>
#include <string>

#include "ivcuda/result.h"

namespace ivcuda::host::sandbox {

struct Config {
  bool enabled = true;  // --sandbox on|off
  std::string user;     // --user: empty keeps the daemon's user
  uid_t uid = 0;        // resolved by resolve_user()
  gid_t gid = 0;
};

// In the daemon, before any worker exists: looks --user up. A worker could
// not (the user database may sit behind NSS modules that open files or
// sockets), and a bad name should stop the daemon, not each guest.
Result<void> resolve_user(Config& c);

// The daemon: no_new_privs when the sandbox is on. Logs what it did.
void apply_to_daemon(const Config& c);

// What a worker applied, for its one log line.
struct Applied {
  bool no_new_privs = false;
  int landlock_abi = 0;       // 0: no Landlock ruleset in force
  std::string landlock_note;  // why not, when not
  bool seccomp = false;
  std::string seccomp_note;
  std::size_t allowed_syscalls = 0;
};

// Step 1, in the worker right after fork. driver_path is what --driver names:
// it is loaded here (dlopen, nothing called) so that its directory and its
// libraries' directories can be allowed before the ruleset closes.
Result<void> before_driver(const Config& c, const std::string& driver_path, Applied* a);

// Step 2, after Worker::create succeeded. Logs one line saying what is in force.
Result<void> after_driver(const Config& c, Applied* a);

// The seccomp allowlist: the one table of system calls a sandboxed worker may
// make (sandbox.cc), each with why. Rules narrow some of them further.
enum class Rule {
  kAny,          // any arguments
  kThreadsOnly,  // clone: only with CLONE_THREAD (threads, never processes)
  kOwnProcess,   // tgkill: only to this process's own threads
  kReadLimits,   // prlimit64: read limits, never set them
  kPrctlSome,    // prctl: only the options listed in sandbox.cc
  kEnosys,       // refused with ENOSYS so that the C library falls back (clone3 -> clone)
};
struct Syscall {
  const char* name;
  Rule rule;
  const char* why;
};
std::span<const Syscall> allowlist();
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
