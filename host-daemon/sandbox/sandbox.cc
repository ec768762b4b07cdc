#include "host-daemon/sandbox/sandbox.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <pwd.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <vector>

#include "host-daemon/shared/log.h"
#include "host-daemon/shared/rules.h"

namespace ivcuda::host::sandbox {

// ------------------------------------------------------------- the allowlist
//
// Every system call a sandboxed worker may make, once: what the worker itself
// does while serving (ring polling, io_uring waits, the fd broker, memfds for
// DOT text and pool probes, device printf's pipe) and what a CUDA user-space
// driver does after its start (ioctls on its device files, memory mappings,
// threads, futexes, clocks, NUMA queries, the lazy load of its PTX compiler).
// Found by tracing the worker under the GPU test double (all process-mode
// test programs) and listed generously for the real driver where a refusal
// would only cost a guest an error; tests/gpu/trace_worker_syscalls.sh
// traces the real driver and prints what this table lacks. Anything else
// answers EPERM (docs/security.md says why not a kill).
constexpr Syscall kAllow[] = {
    // memory
    {"brk", Rule::kAny, "malloc's heap"},
    {"mmap", Rule::kAny, "the driver maps its device files and memory; malloc, thread stacks"},
    {"munmap", Rule::kAny, "the reverse"},
    {"mprotect", Rule::kAny, "thread stack guards; libraries the driver loads late (its PTX compiler)"},
    {"mremap", Rule::kAny, "realloc of large blocks"},
    {"madvise", Rule::kAny, "the C library returns freed memory and stacks"},
    {"mincore", Rule::kAny, "the driver probes residency"},
    {"msync", Rule::kAny, "flushing shared mappings"},
    {"mlock", Rule::kAny, "page-locking (bounded by RLIMIT_MEMLOCK)"},
    {"munlock", Rule::kAny, "the reverse"},
    {"get_mempolicy", Rule::kAny, "the driver asks which NUMA node memory is on"},
    {"set_mempolicy", Rule::kAny, "the driver places its allocations near the GPU"},
    {"mbind", Rule::kAny, "same, per range"},
    {"membarrier", Rule::kAny, "process-wide memory barriers some runtimes use"},
    {"memfd_create", Rule::kAny, "DOT text and pool probes (worker), the driver's shareable memory"},
    // threads and waiting
    {"clone", Rule::kThreadsOnly, "the driver's threads (CLONE_THREAD only: never a new process)"},
    {"clone3", Rule::kEnosys, "its flags are out of a filter's reach: ENOSYS makes the C library use clone"},
    {"futex", Rule::kAny, "locks and condition variables"},
    {"set_robust_list", Rule::kAny, "every new thread"},
    {"rseq", Rule::kAny, "every new thread (glibc 2.35+)"},
    {"exit", Rule::kAny, "a thread ends"},
    {"exit_group", Rule::kAny, "the worker ends"},
    {"sched_yield", Rule::kAny, "spinning waits (the worker's parked synchronise, the driver)"},
    {"sched_getaffinity", Rule::kAny, "CPU counts"},
    {"sched_setaffinity", Rule::kSelfOnly, "the driver places itself (within the worker's cpuset); never another process"},
    {"sched_getparam", Rule::kAny, "thread attributes"},
    {"sched_getscheduler", Rule::kAny, "thread attributes"},
    {"sched_get_priority_min", Rule::kAny, "thread attributes"},
    {"sched_get_priority_max", Rule::kAny, "thread attributes"},
    {"getpriority", Rule::kAny, "thread attributes"},
    {"nanosleep", Rule::kAny, "sleeps"},
    {"clock_nanosleep", Rule::kAny, "sleeps (usleep: ivshmem-plain polling, parked waits)"},
    {"clock_gettime", Rule::kAny, "time, where the vDSO does not answer"},
    {"clock_getres", Rule::kAny, "time"},
    {"gettimeofday", Rule::kAny, "time"},
    {"time", Rule::kAny, "time"},
    {"timerfd_create", Rule::kAny, "the driver's timed waits"},
    {"timerfd_settime", Rule::kAny, "same"},
    {"timerfd_gettime", Rule::kAny, "same"},
    {"poll", Rule::kAny, "waits on descriptors"},
    {"ppoll", Rule::kAny, "same"},
    {"select", Rule::kAny, "same"},
    {"pselect6", Rule::kAny, "same"},
    {"epoll_create1", Rule::kAny, "the driver's event loops"},
    {"epoll_ctl", Rule::kAny, "same"},
    {"epoll_wait", Rule::kAny, "same"},
    {"epoll_pwait", Rule::kAny, "same"},
    {"eventfd2", Rule::kAny, "the driver's wake-ups"},
    {"io_uring_enter", Rule::kAny, "the worker's sleep (a ring restricted to read, poll and timeout)"},
    // signals
    {"rt_sigaction", Rule::kAny, "handlers"},
    {"rt_sigprocmask", Rule::kAny, "masks (every thread start)"},
    {"rt_sigreturn", Rule::kAny, "return from a handler"},
    {"sigaltstack", Rule::kAny, "handler stacks"},
    {"restart_syscall", Rule::kAny, "an interrupted sleep resumes"},
    {"tgkill", Rule::kOwnProcess, "raise() and abort(), to this process's own threads only"},
    // descriptors the worker holds
    {"read", Rule::kAny, "doorbells, device printf's pipe, files the driver opened"},
    {"write", Rule::kAny, "log lines (stderr), doorbells"},
    {"readv", Rule::kAny, "same"},
    {"writev", Rule::kAny, "same"},
    {"pread64", Rule::kAny, "DOT text from its memfd"},
    {"lseek", Rule::kAny, "file offsets"},
    {"close", Rule::kAny, "descriptors"},
    {"dup", Rule::kAny, "descriptors"},
    {"dup3", Rule::kAny, "descriptors"},
    {"dup2", Rule::kAny,
     "the driver's process checkpoint parks its device descriptors on a placeholder and puts the reopened ones back "
     "at their numbers (measured, driver 580)"},
    {"pipe2", Rule::kAny, "the driver's internal pipes"},
    {"fcntl", Rule::kFcntlSome, "descriptor flags, locks, seals; no owner or signal (F_SETOWN would aim SIGIO anywhere)"},
    {"ftruncate", Rule::kAny, "sizing memfds"},
    {"fstat", Rule::kAny, "sizes and types of descriptors"},
    {"newfstatat", Rule::kAny, "same (fstat's form in glibc), and paths Landlock lets it see"},
    {"statx", Rule::kAny, "same"},
    {"stat", Rule::kAny, "the same, through the older call: the driver's restore after a checkpoint looks up its device files"},
    {"getdents64", Rule::kAny, "listing a directory Landlock allows (/proc/self/fd, /dev)"},
    {"ioctl", Rule::kIoctlNoNetTty,
     "the driver's requests to its device files (Landlock decides which files open); none of the socket, "
     "network-device or terminal types, which reach the host's network configuration and ttys"},
    {"sendmsg", Rule::kAny, "the fd broker's line (SCM_RIGHTS) - an existing socket; none can be made"},
    {"recvmsg", Rule::kAny, "same"},
    {"sendto", Rule::kAny, "send() on existing sockets"},
    {"recvfrom", Rule::kAny, "recv() on existing sockets"},
    {"shutdown", Rule::kAny, "existing sockets"},
    {"getsockopt", Rule::kAny, "existing sockets"},
    {"getsockname", Rule::kAny, "existing sockets"},
    {"getpeername", Rule::kAny, "existing sockets"},
    // paths: Landlock limits where (libraries, /dev/nvidia*, /proc/self, /sys)
    {"openat", Rule::kAny, "the driver's device files, /proc and /sys entries, late libraries"},
    {"unlinkat", Rule::kAny, "the driver removes its interprocess-event files in /dev/shm (Landlock: only there)"},
    {"unlink", Rule::kAny, "the same, through the older call"},
    {"mkdir", Rule::kAny,
     "the driver's restore after a checkpoint makes sure /dev/nvidia-caps exists (it does: EEXIST); Landlock "
     "refuses any new directory"},
    {"symlink", Rule::kAny,
     "the driver's restore after a checkpoint tries its /dev/char links; Landlock refuses any new link"},
    {"open", Rule::kAny, "the same, from code built against old C libraries"},
    {"faccessat", Rule::kAny, "existence checks (also the trace mark)"},
    {"faccessat2", Rule::kAny, "same"},
    {"access", Rule::kAny, "same"},
    {"readlink", Rule::kAny, "/proc/self/exe and friends"},
    {"readlinkat", Rule::kAny, "same"},
    {"getcwd", Rule::kAny, "path resolution"},
    // who and where
    {"getpid", Rule::kAny, "this process"},
    {"gettid", Rule::kAny, "this thread"},
    {"getppid", Rule::kAny, "the daemon"},
    {"getuid", Rule::kAny, "identity"},
    {"geteuid", Rule::kAny, "identity"},
    {"getgid", Rule::kAny, "identity"},
    {"getegid", Rule::kAny, "identity"},
    {"getresuid", Rule::kAny, "identity"},
    {"getresgid", Rule::kAny, "identity"},
    {"getgroups", Rule::kAny, "identity"},
    {"uname", Rule::kAny, "the kernel's version"},
    {"sysinfo", Rule::kAny, "memory sizes"},
    {"getrlimit", Rule::kAny, "limits"},
    {"prlimit64", Rule::kReadOwnLimits, "its own limits, read only"},
    {"getrusage", Rule::kAny, "CPU time"},
    {"times", Rule::kAny, "CPU time"},
    {"getrandom", Rule::kAny, "IPC tokens, random mapping addresses"},
    {"getcpu", Rule::kAny, "where a thread runs"},
    {"prctl", Rule::kPrctlSome,
     "thread names, timer slack (Worker::run), dumpable while suspended (Worker::hold_for_suspend), a few queries"},
};

// prctl options a sandboxed worker may use (Rule::kPrctlSome).
constexpr int kPrSetVma = 0x53564d41;  // PR_SET_VMA (Linux 5.17; newer headers)
// PR_SET_DUMPABLE: a worker under --user makes itself reachable by its
// checkpointer (same user) while suspended; it exposes only itself.
constexpr int kPrctlAllowed[] = {PR_SET_NAME,         PR_GET_NAME,     PR_SET_TIMERSLACK,   PR_GET_TIMERSLACK,
                                 PR_GET_DUMPABLE,     PR_SET_DUMPABLE, PR_GET_SECCOMP,      PR_GET_NO_NEW_PRIVS,
                                 PR_GET_PDEATHSIG,    PR_GET_CHILD_SUBREAPER, kPrSetVma};

// Under the test switch only (Config::test_double_ipc): what the GPU test
// double needs beyond a driver.
constexpr Syscall kTestDoubleCalls[] = {
    {"pwrite64", Rule::kAny, "the GPU test double fills its IPC and pool-export memfds"},
};

// Sanitizer builds only, for their runtimes (never a product's workers):
// LeakSanitizer stops the worker's threads at exit from a tracer task that
// shares its memory (clone with CLONE_VM, not CLONE_THREAD), attaches to them
// with ptrace and waits for it; Landlock's scope keeps ptrace inside the
// worker's own domain.
constexpr Syscall kSanitizerCalls[] = {
    {"clone", Rule::kMemorySharing, "LeakSanitizer's tracer (CLONE_VM)"},
    {"ptrace", Rule::kAny, "LeakSanitizer stops the worker's threads"},
    {"wait4", Rule::kAny, "LeakSanitizer waits for its tracer"},
};

// fcntl commands a sandboxed worker may use (Rule::kFcntlSome). Not among
// them: F_SETOWN, F_SETOWN_EX and F_SETSIG (with O_ASYNC they send any signal
// to any process the worker's credentials reach, past the ban on kill), and
// F_SETLEASE and F_NOTIFY (a lease holds other processes' opens of a shared
// file for up to lease-break-time).
constexpr int kFcntlAllowed[] = {F_DUPFD,   F_GETFD,       F_SETFD,     F_GETFL,       F_SETFL,
                                 F_GETLK,   F_SETLK,       F_SETLKW,    F_GETOWN,      F_GETSIG,
                                 F_GETOWN_EX, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW,  F_GETLEASE,
                                 F_DUPFD_CLOEXEC, F_SETPIPE_SZ, F_GETPIPE_SZ, F_ADD_SEALS, F_GET_SEALS};

// ioctl request types (bits 8-15 of the request) a sandboxed worker may not
// use (Rule::kIoctlNoNetTty): 0x89 sockets and network devices (SIOC*: on
// any socket, sock_ioctl hands them to the network stack: interface flags,
// addresses, bridges, routes; FIOSETOWN and SIOCSPGRP set a signal owner),
// 0x8b wireless extensions, 0x54 terminals (TIOCSTI types into a tty the
// worker inherited; FIOASYNC, FIONBIO and FIONREAD live there too, and
// neither the worker nor a driver needs them: fcntl covers the flags).
constexpr std::uint8_t kIoctlTypesRefused[] = {0x54, 0x89, 0x8b};

std::span<const Syscall> allowlist() { return kAllow; }
std::span<const Syscall> test_double_calls() { return kTestDoubleCalls; }
std::span<const Syscall> sanitizer_calls() { return kSanitizerCalls; }

const char* rule_name(Rule r) noexcept {
  switch (r) {
    case Rule::kAny: return "any";
    case Rule::kThreadsOnly: return "CLONE_THREAD only";
    case Rule::kOwnProcess: return "own threads only";
    case Rule::kSelfOnly: return "this process only";
    case Rule::kReadOwnLimits: return "own limits, read only";
    case Rule::kPrctlSome: return "listed options only";
    case Rule::kFcntlSome: return "listed commands only";
    case Rule::kIoctlNoNetTty: return "no socket, network or terminal requests";
    case Rule::kEnosys: return "ENOSYS";
    case Rule::kMemorySharing: return "CLONE_VM only";
  }
  return "?";
}

namespace {

// One argument comparison (libseccomp's SCMP_A* macros are C compound
// literals, which C++ compilers reject under -Wpedantic).
scmp_arg_cmp arg_cmp(unsigned arg, scmp_compare op, scmp_datum_t a, scmp_datum_t b = 0) {
  scmp_arg_cmp c{};
  c.arg = arg;
  c.op = op;
  c.datum_a = a;
  c.datum_b = b;
  return c;
}


// ------------------------------------------------------------------ Landlock
// Constants of the kernel ABI, spelled here so that the build does not depend
// on how new the machine's linux/landlock.h is (Debian 12's knows ABI 2).
constexpr std::uint64_t kFsExecute = 1ull << 0, kFsWriteFile = 1ull << 1, kFsReadFile = 1ull << 2,
                        kFsReadDir = 1ull << 3, kFsRemoveFile = 1ull << 5, kFsMakeReg = 1ull << 8,
                        kFsRefer = 1ull << 13, kFsTruncate = 1ull << 14;
constexpr std::uint64_t kFsAllV1 = (1ull << 13) - 1;  // execute .. make_sym
constexpr std::uint64_t kFsFileRights = kFsExecute | kFsWriteFile | kFsReadFile | kFsTruncate;
constexpr std::uint64_t kNetBindTcp = 1ull << 0, kNetConnectTcp = 1ull << 1;            // ABI 4
constexpr std::uint64_t kScopeAbstractUnix = 1ull << 0, kScopeSignal = 1ull << 1;       // ABI 6
constexpr unsigned kCreateRulesetVersion = 1u << 0;
constexpr int kRulePathBeneath = 1;

struct RulesetAttr {
  std::uint64_t handled_access_fs;
  std::uint64_t handled_access_net;
  std::uint64_t scoped;
};
struct __attribute__((packed)) PathBeneathAttr {
  std::uint64_t allowed_access;
  std::int32_t parent_fd;
};

long ll_create_ruleset(const RulesetAttr* attr, std::size_t size, unsigned flags) {
  return ::syscall(__NR_landlock_create_ruleset, attr, size, flags);
}

std::string errno_name(int e) {
  switch (e) {
    case 0: return "allowed";
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    case ENOSYS: return "ENOSYS";
    default: return std::strerror(e);
  }
}

// Directories of every file mapped into the worker now: its own libraries and
// the driver's, wherever they were found (LD_LIBRARY_PATH, a build tree,
// /usr/local/nvidia/lib64). The driver loads more from its own directory later.
std::set<std::string> mapped_dirs() {
  std::set<std::string> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos || line.find(" (deleted)") != std::string::npos) continue;
    const std::string path = line.substr(slash);
    const auto last = path.rfind('/');
    if (last > 0) out.insert(path.substr(0, last));
  }
  return out;
}

struct PathRule {
  std::string path;
  std::uint64_t access;
};

std::vector<PathRule> landlock_rules() {
  constexpr std::uint64_t kRX = kFsExecute | kFsReadFile | kFsReadDir;
  constexpr std::uint64_t kR = kFsReadFile | kFsReadDir;
  constexpr std::uint64_t kRW = kFsReadFile | kFsWriteFile | kFsReadDir;
  std::vector<PathRule> r;
  // Libraries: the system's, the ones mapped now, and LD_LIBRARY_PATH's.
  for (const char* p : {"/usr", "/lib", "/lib64"}) r.push_back({p, kRX});
  for (const auto& d : mapped_dirs()) r.push_back({d, kRX});
  if (const char* llp = std::getenv("LD_LIBRARY_PATH"); llp != nullptr) {
    std::string s = llp;
    for (std::size_t at = 0; at <= s.size();) {
      const auto colon = std::min(s.find(':', at), s.size());
      if (colon > at) r.push_back({s.substr(at, colon - at), kRX});
      at = colon + 1;
    }
  }
  r.push_back({"/etc/ld.so.cache", kR});
  // What the driver reads about itself, the machine and this process. Only
  // this process's /proc entry: other processes' (the daemon's, other
  // guests' workers') stay closed, and Landlock refuses ptrace-like access
  // across domains too.
  for (const char* p : {"/proc/self", "/proc/driver", "/proc/devices", "/proc/modules", "/proc/cpuinfo",
                        "/proc/meminfo", "/proc/stat", "/proc/sys/vm", "/proc/sys/kernel", "/sys"})
    r.push_back({p, kR});
  // The driver names its threads (pthread_setname_np writes
  // /proc/self/task/TID/comm) and fails cuInit with
  // CUDA_ERROR_OPERATING_SYSTEM when it cannot (driver 580 on the H200).
  r.push_back({"/proc/self/task", kR | kFsWriteFile | kFsTruncate});
  // Interprocess events (CU_EVENT_INTERPROCESS): the driver creates, opens
  // and removes /dev/shm/cuda.shm.* files, in the exporting and the importing
  // process. /dev/shm is the host's: see docs/security.md for what that opens.
  r.push_back({"/dev/shm", kR | kFsWriteFile | kFsTruncate | kFsMakeReg | kFsRemoveFile});
  // Devices: the driver's, read-write; a few harmless ones.
  if (DIR* dev = ::opendir("/dev"); dev != nullptr) {
    while (const dirent* e = ::readdir(dev))
      if (std::strncmp(e->d_name, "nvidia", 6) == 0) r.push_back({std::string("/dev/") + e->d_name, kRW});
    ::closedir(dev);
  }
  r.push_back({"/dev/null", kFsReadFile | kFsWriteFile | kFsTruncate});
  for (const char* p : {"/dev/zero", "/dev/urandom", "/dev/random"}) r.push_back({p, kFsReadFile});
  return r;
}

// Applies the ruleset for Landlock ABI `abi` (> 0); returns it.
Result<int> apply_landlock(int abi) {
  RulesetAttr attr{};
  attr.handled_access_fs = kFsAllV1 | (abi >= 2 ? kFsRefer : 0) | (abi >= 3 ? kFsTruncate : 0);
  std::size_t size = sizeof attr.handled_access_fs;
  if (abi >= 4) {
    attr.handled_access_net = kNetBindTcp | kNetConnectTcp;  // no rule: no TCP at all
    size = offsetof(RulesetAttr, scoped);
  }
  if (abi >= 6) {
    attr.scoped = kScopeAbstractUnix | kScopeSignal;  // nothing outside the worker
    size = sizeof attr;
  }
  const int rs = static_cast<int>(ll_create_ruleset(&attr, size, 0));
  if (rs < 0) return make_error(errno, std::string("landlock_create_ruleset: ") + std::strerror(errno));
  for (const auto& rule : landlock_rules()) {
    const int fd = ::open(rule.path.c_str(), O_PATH | O_CLOEXEC);
    if (fd < 0) continue;  // not on this machine
    struct stat st {};
    PathBeneathAttr pb{};
    pb.allowed_access = rule.access & attr.handled_access_fs;
    if (::fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) pb.allowed_access &= kFsFileRights;
    pb.parent_fd = fd;
    if (::syscall(__NR_landlock_add_rule, rs, kRulePathBeneath, &pb, 0) != 0)
      IVLOG_WARN("sandbox: Landlock rule for %s: %s", rule.path.c_str(), std::strerror(errno));
    else
      IVLOG_DEBUG("sandbox: landlock rule %s access 0x%llx", rule.path.c_str(),
                  static_cast<unsigned long long>(pb.allowed_access));
    ::close(fd);
  }
  const long r = ::syscall(__NR_landlock_restrict_self, rs, 0);
  const int e = errno;
  ::close(rs);
  if (r != 0) return make_error(e, std::string("landlock_restrict_self: ") + std::strerror(e));
  return static_cast<int>(abi);
}

// ------------------------------------------------------------------- seccomp

// The sanitizer this file is built with: g++ defines __SANITIZE_ADDRESS__ and __SANITIZE_THREAD__,
// clang 16 (the asan preset's) answers only __has_feature.
#if defined(__has_feature)
#define IVCUDA_HAS_FEATURE(x) __has_feature(x)
#else
#define IVCUDA_HAS_FEATURE(x) 0
#endif
#if defined(__SANITIZE_THREAD__) || IVCUDA_HAS_FEATURE(thread_sanitizer)
constexpr const char* kNoSeccompNote =
    "a ThreadSanitizer build (its runtime's needs under a filter are not worked out)";
#else
constexpr const char* kNoSeccompNote = nullptr;
#endif
#if defined(__SANITIZE_ADDRESS__) || IVCUDA_HAS_FEATURE(address_sanitizer)
constexpr bool kSanitizerRuntime = true;
#else
constexpr bool kSanitizerRuntime = false;
#endif

// Masks and values over an ioctl request's type (bits 8-15) that together
// match every type but the refused ones: a filter can only allow, so the
// complement is covered by prefixes of the type's bits, at most 8 per refused
// type. Only the low 32 bits are looked at, as the kernel does (its `cmd` is
// an unsigned int).
void cover_types(std::uint32_t prefix, int len, std::vector<std::pair<std::uint32_t, std::uint32_t>>* out) {
  bool hit = false;
  for (const std::uint8_t t : kIoctlTypesRefused) hit = hit || (static_cast<std::uint32_t>(t) >> (8 - len)) == prefix;
  const std::uint32_t mask = ((0xffu << (8 - len)) & 0xffu) << 8;
  if (!hit) {
    out->push_back({mask, prefix << (8 - len) << 8});
  } else if (len < 8) {
    cover_types(prefix << 1, len + 1, out);
    cover_types((prefix << 1) | 1, len + 1, out);
  }
}

// One row of the table as filter rules. rc of libseccomp (0 or -errno).
int add_rule(scmp_filter_ctx ctx, int nr, Rule rule, scmp_datum_t self) {
  auto allow = [&](std::initializer_list<scmp_arg_cmp> cmps) {
    return ::seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, nr, static_cast<unsigned>(cmps.size()), cmps.begin());
  };
  int rc = 0;
  switch (rule) {
    case Rule::kAny: return allow({});
    case Rule::kThreadsOnly: return allow({arg_cmp(0, SCMP_CMP_MASKED_EQ, CLONE_THREAD, CLONE_THREAD)});
    case Rule::kMemorySharing: return allow({arg_cmp(0, SCMP_CMP_MASKED_EQ, CLONE_VM, CLONE_VM)});
    case Rule::kOwnProcess: return allow({arg_cmp(0, SCMP_CMP_EQ, self)});
    case Rule::kSelfOnly:
      if (!IVCUDA_RULE("worker-affinity-self-only")) return allow({});
      for (const scmp_datum_t pid : {scmp_datum_t{0}, self})
        if (rc == 0) rc = allow({arg_cmp(0, SCMP_CMP_EQ, pid)});
      return rc;
    case Rule::kReadOwnLimits:
      if (!IVCUDA_RULE("worker-prlimit-self-only")) return allow({arg_cmp(2, SCMP_CMP_EQ, 0)});
      for (const scmp_datum_t pid : {scmp_datum_t{0}, self})
        if (rc == 0) rc = allow({arg_cmp(0, SCMP_CMP_EQ, pid), arg_cmp(2, SCMP_CMP_EQ, 0)});
      return rc;
    case Rule::kPrctlSome:
      for (const int opt : kPrctlAllowed)
        if (rc == 0) rc = allow({arg_cmp(0, SCMP_CMP_EQ, static_cast<scmp_datum_t>(opt))});
      // LeakSanitizer makes the worker traceable by its own tracer at exit.
      // (PR_SET_DUMPABLE, which it also uses, every worker has.)
      if (kSanitizerRuntime && rc == 0) rc = allow({arg_cmp(0, SCMP_CMP_EQ, scmp_datum_t{PR_SET_PTRACER})});
      return rc;
    case Rule::kFcntlSome:
      if (!IVCUDA_RULE("worker-fcntl-no-signals")) return allow({});
      for (const int cmd : kFcntlAllowed)
        if (rc == 0) rc = allow({arg_cmp(1, SCMP_CMP_EQ, static_cast<scmp_datum_t>(cmd))});
      return rc;
    case Rule::kIoctlNoNetTty: {
      if (!IVCUDA_RULE("worker-ioctl-no-net-tty")) return allow({});
      std::vector<std::pair<std::uint32_t, std::uint32_t>> cover;
      cover_types(0, 0, &cover);
      for (const auto& [mask, value] : cover)
        if (rc == 0) rc = allow({arg_cmp(1, SCMP_CMP_MASKED_EQ, mask, value)});
      return rc;
    }
    case Rule::kEnosys: return ::seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), nr, 0);
  }
  return -EINVAL;
}

// Returns how many calls of the product's table it allows; *extra: how many
// more the test switch or the sanitizer runtime added.
Result<std::size_t> apply_seccomp(const Config& c, std::size_t* extra) {
  // --sandbox audit: what the allowlist lacks is made, and logged by the kernel.
  scmp_filter_ctx ctx = ::seccomp_init(c.mode == Mode::kAudit ? SCMP_ACT_LOG : SCMP_ACT_ERRNO(EPERM));
  if (ctx == nullptr) return make_error(ENOMEM, "seccomp_init failed");
  struct Release {
    scmp_filter_ctx c;
    ~Release() { ::seccomp_release(c); }
  } release{ctx};
  // Every thread the driver started gets the filter too (and no_new_privs).
  if (int rc = ::seccomp_attr_set(ctx, SCMP_FLTATR_CTL_TSYNC, 1); rc != 0)
    return make_error(-rc, std::string("seccomp TSYNC: ") + std::strerror(-rc));
  std::size_t n = 0;
  *extra = 0;
  const auto self = static_cast<scmp_datum_t>(::getpid());
  std::vector<std::span<const Syscall>> tables = {kAllow};
  if (c.test_double_ipc) tables.push_back(kTestDoubleCalls);
  if (kSanitizerRuntime) tables.push_back(kSanitizerCalls);
  for (const auto table : tables)
    for (const Syscall& s : table) {
      std::size_t& count = table.data() == std::data(kAllow) ? n : *extra;
      const int nr = ::seccomp_syscall_resolve_name(s.name);
      if (nr == __NR_SCMP_ERROR) {
        IVLOG_DEBUG("sandbox: %s is no system call here", s.name);
        continue;
      }
      if (const int rc = add_rule(ctx, nr, s.rule, self); rc != 0)
        return make_error(-rc, std::string("seccomp rule for ") + s.name + ": " + std::strerror(-rc));
      if (s.rule != Rule::kEnosys) ++count;
    }
  if (int rc = ::seccomp_load(ctx); rc != 0)
    return make_error(-rc, std::string("seccomp_load: ") + std::strerror(-rc));
  return n;
}

// ------------------------------------------------------------- capabilities
//
// Three system calls, written out: libcap would be a dependency for them.
// The bounding set goes first (dropping from it needs CAP_SETPCAP, which the
// drop to --user takes away), so that not even an execve could give a
// capability back; then the permitted, effective, inheritable and ambient
// sets. A root worker without --user keeps uid 0 but no capability: it cannot
// configure the network, trace or signal other users' processes, or open the
// daemon's /proc/PID/mem (the kernel wants the tracer's capabilities to cover
// the target's).

// Empties the bounding set; *note says why not where it cannot (a daemon that
// is not root has no CAP_SETPCAP, and no capability to bound).
Result<void> drop_bounding_set(std::string* note) {
  for (int cap = 0;; ++cap) {
    const int in = ::prctl(PR_CAPBSET_READ, cap, 0, 0, 0);
    if (in < 0) break;  // EINVAL: past the kernel's last capability
    if (in == 0) continue;
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0) continue;
    if (errno == EPERM && ::geteuid() != 0) {
      *note = "bounding set kept: no CAP_SETPCAP (the daemon is not root)";
      return {};
    }
    return make_error(errno, "dropping capability " + std::to_string(cap) + " from the bounding set: " +
                                 std::strerror(errno));
  }
  return {};
}

Result<void> drop_capabilities() {
  (void)::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct none[2] = {};
  if (::syscall(SYS_capset, &hdr, none) != 0)
    return make_error(errno, std::string("capset: ") + std::strerror(errno));
  __user_cap_data_struct now[2] = {};
  if (::syscall(SYS_capget, &hdr, now) != 0) return make_error(errno, std::string("capget: ") + std::strerror(errno));
  for (const auto& d : now)
    if (d.effective != 0 || d.permitted != 0 || d.inheritable != 0)
      return make_error(EPERM, "capabilities are still held after capset");
  return {};
}

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

const char* mode_name(Mode m) {
  return m == Mode::kOn ? "on" : m == Mode::kDegraded ? "degraded" : m == Mode::kAudit ? "audit" : "off";
}

// Why the mode does not serve with Landlock ABI `abi`, or "" when it does.
std::string landlock_refusal(const Config& c, int abi, const std::string& why_none) {
  if (!IVCUDA_RULE("sandbox-landlock-6") || c.mode != Mode::kOn || c.test_double_ipc || abi >= kLandlockAbiForOn)
    return "";
  const std::string have = abi > 0 ? "Landlock ABI " + std::to_string(abi) : "no Landlock (" + why_none + ")";
  return "--sandbox on needs Landlock ABI " + std::to_string(kLandlockAbiForOn) +
         " (Linux 6.12: signals and abstract sockets scoped to the worker); this kernel has " + have +
         ". --sandbox degraded serves without it (docs/security.md, \"Sandbox\")";
}

}  // namespace

// ------------------------------------------------------------------- steps

bool parse_mode(const std::string& s, Mode* out) {
  if (s == "on") *out = Mode::kOn;
  else if (s == "degraded") *out = Mode::kDegraded;
  else if (s == "audit") *out = Mode::kAudit;
  else if (s == "off") *out = Mode::kOff;
  else return false;
  return true;
}

int landlock_abi(std::string* why) {
  const long abi = ll_create_ruleset(nullptr, 0, kCreateRulesetVersion);
  if (abi > 0) return static_cast<int>(abi);
  *why = errno == ENOSYS ? "the kernel has no Landlock"
         : errno == EOPNOTSUPP ? "Landlock is disabled in this kernel (boot lsm=)"
                               : std::string("landlock_create_ruleset: ") + std::strerror(errno);
  return 0;
}

Result<void> resolve_user(Config& c) {
  if (c.user.empty()) return {};
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  const int rc = ::getpwnam_r(c.user.c_str(), &pw, buf.data(), buf.size(), &found);
  if (found == nullptr)
    return make_error(rc != 0 ? rc : ENOENT, "--user " + c.user + ": " + (rc != 0 ? std::strerror(rc) : "no such user"));
  c.uid = pw.pw_uid;
  c.gid = pw.pw_gid;
  if (::geteuid() != 0 && c.uid != ::geteuid())
    return make_error(EPERM, "--user " + c.user + ": the daemon runs as uid " + std::to_string(::geteuid()) +
                                 ", only root can make workers another user");
  return {};
}

Result<void> prepare(Config& c) {
  c.test_double_ipc = env_is("IVCUDA_TEST_DOUBLE_IPC", "1");
  if (!c.enabled()) return {};
  if (c.test_double_ipc)
    IVLOG_WARN("TEST SWITCH IVCUDA_TEST_DOUBLE_IPC=1: workers run without Landlock and may pwrite64, for the GPU "
               "test double's IPC; never set it where real guests are served");
  std::string why;
  const int abi = landlock_abi(&why);
  if (const std::string refusal = landlock_refusal(c, abi, why); !refusal.empty()) return make_error(EPERM, refusal);
  if (c.mode == Mode::kAudit)
    IVLOG_WARN("SANDBOX AUDIT (--sandbox audit): a worker's system call outside the allowlist is made and logged by "
               "the kernel (audit type 1326, with Landlock's denials, in its log) instead of refused; use this only "
               "to find what a driver needs");
  if (c.mode == Mode::kDegraded)
    IVLOG_WARN("SANDBOX DEGRADED (--sandbox degraded): %s; workers keep the rest of their sandbox",
               abi >= kLandlockAbiForOn ? ("Landlock ABI " + std::to_string(abi) + " would allow on").c_str()
               : abi > 0 ? ("Landlock ABI " + std::to_string(abi) + ": no signal or abstract-socket scope").c_str()
                         : ("no Landlock: " + why + "; files are limited only by the workers' user").c_str());
  if (c.user.empty() && ::geteuid() == 0)
    IVLOG_INFO("sandbox: workers keep uid 0 without --user, with no capability (packaging/ivcudad.toml names a user)");
  return {};
}

void apply_to_daemon(const Config& c) {
  if (!c.enabled()) {
    IVLOG_WARN("SANDBOX OFF (--sandbox off): workers keep every privilege of the daemon and may make any "
               "system call; use this only to debug");
    return;
  }
  // Nothing the daemon runs may gain privileges (it executes nothing itself;
  // its workers inherit this). It keeps root, when started as root, to make
  // workers drop to --user: docs/security.md, "Sandbox".
  if (IVCUDA_RULE("worker-sandbox") && ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
    IVLOG_WARN("sandbox: no_new_privs on the daemon: %s", std::strerror(errno));
}

namespace {

// Each open pipe's (device, inode), from /proc/self/fd, and its descriptor
// in fds; false (errno set) when the list cannot be read: the caller fails
// rather than take every pipe for the driver's.
bool open_pipes(std::vector<std::pair<dev_t, ino_t>>* out, std::vector<int>* fds) {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return false;
  while (const dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    struct stat st {};
    if (end == e->d_name || *end != '\0' || fd == ::dirfd(d) || ::fstat(static_cast<int>(fd), &st) != 0 ||
        !S_ISFIFO(st.st_mode))
      continue;
    out->emplace_back(st.st_dev, st.st_ino);
    if (fds != nullptr) fds->push_back(static_cast<int>(fd));
  }
  ::closedir(d);
  return true;
}

// The driver's own pipes, made by its cuInit while the worker was root, are
// root's with mode 0600; driver 580's checkpoint reopens them from the
// calling process as /proc/PID/fd/N, which a checkpointer running as --user
// may then not (traced on an H100: EACCES, the lock fails). So those the
// driver made become the user's before the drop, which needs CAP_CHOWN; the
// pipes the worker had before (the daemon's) stay as they are.
Result<void> give_driver_pipes(const Config& c, const Applied& a) {
  std::vector<int> fds;
  std::vector<std::pair<dev_t, ino_t>> now;
  if (!open_pipes(&now, &fds))
    return make_error(errno, std::string("listing the worker's pipes after its driver: ") + std::strerror(errno));
  for (std::size_t i = 0; i < now.size(); ++i) {
    if (IVCUDA_RULE("user-driver-pipes-only") &&
        std::find(a.pipes_before.begin(), a.pipes_before.end(), now[i]) != a.pipes_before.end())
      continue;
    if (::fchown(fds[i], c.uid, c.gid) != 0)
      return make_error(errno, "giving the driver's pipe (fd " + std::to_string(fds[i]) + ") to --user " + c.user +
                                   ": " + std::strerror(errno));
  }
  return {};
}

}  // namespace

Result<void> before_driver(const Config& c, const std::vector<std::string>& libraries, Applied* a) {
  trace_mark("worker-start");
  if (!c.enabled() || !IVCUDA_RULE("worker-sandbox")) return {};
  // A terminal the daemon was started from must not be the worker's: what a
  // worker could type into it (TIOCSTI) would run as whoever owns the shell.
  if (IVCUDA_RULE("worker-stdin-null")) {
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null < 0 || ::dup2(null, STDIN_FILENO) < 0)
      return make_error(errno, std::string("stdin from /dev/null: ") + std::strerror(errno));
    if (null != STDIN_FILENO) ::close(null);
  }
  if (!c.user.empty() && !open_pipes(&a->pipes_before, nullptr))
    return make_error(errno, std::string("listing the worker's pipes before its driver: ") + std::strerror(errno));
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
    return make_error(errno, std::string("no_new_privs: ") + std::strerror(errno));
  a->no_new_privs = true;
  // Loaded (not started) now, so that their directories and their
  // dependencies' are known; Worker::create's dlopen finds them loaded.
  for (const std::string& lib : libraries)
    if (!lib.empty()) (void)::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (c.test_double_ipc) {
    a->landlock_note = "test switch IVCUDA_TEST_DOUBLE_IPC=1 (the GPU test double's IPC reads other workers' "
                       "/proc/PID/fd, its ledger lies anywhere)";
    return {};
  }
  // Asked again here: a worker must not serve with less than its mode allows,
  // whatever the daemon found at start.
  const int abi = landlock_abi(&a->landlock_note);
  if (const std::string refusal = landlock_refusal(c, abi, a->landlock_note); !refusal.empty())
    return make_error(EPERM, refusal);
  if (abi == 0) return {};  // degraded: said in the log line
  IVCUDA_TRY_ASSIGN(a->landlock_abi, apply_landlock(abi));
  return {};
}

Result<void> after_driver(const Config& c, Applied* a) {
  trace_mark("sandbox");
  if (!c.enabled()) {
    IVLOG_WARN("sandbox OFF: no seccomp, no Landlock, no_new_privs not set, uid %u, capabilities kept",
               static_cast<unsigned>(::getuid()));
    return {};
  }
  const bool drop_caps = IVCUDA_RULE("worker-no-capabilities");
  if (drop_caps) IVCUDA_TRY(drop_bounding_set(&a->capabilities_note));
  if (!c.user.empty() && IVCUDA_RULE("worker-sandbox")) {
    IVCUDA_TRY(give_driver_pipes(c, *a));
    const gid_t groups[] = {c.gid};
    if (::setgroups(1, groups) != 0 || ::setgid(c.gid) != 0 || ::setuid(c.uid) != 0)
      return make_error(errno, "dropping to --user " + c.user + ": " + std::strerror(errno));
    uid_t ru, eu, su;
    gid_t rg, eg, sg;
    if (::getresuid(&ru, &eu, &su) != 0 || ::getresgid(&rg, &eg, &sg) != 0 || ru != c.uid || eu != c.uid ||
        su != c.uid || rg != c.gid || eg != c.gid || sg != c.gid || (c.uid != 0 && ::setuid(0) == 0))
      return make_error(EPERM, "dropping to --user " + c.user + " did not take");
    // A change of credentials clears the parent-death signal: set it again.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  }
  if (drop_caps) {
    IVCUDA_TRY(drop_capabilities());
    a->capabilities_dropped = true;
  }
  if (kNoSeccompNote != nullptr) {
    a->seccomp_note = kNoSeccompNote;
  } else {
    IVCUDA_TRY_ASSIGN(a->allowed_syscalls, apply_seccomp(c, &a->extra_syscalls));
    a->seccomp = true;
    a->seccomp_refuses = c.mode != Mode::kAudit;
  }
  const std::string ll = a->landlock_abi > 0 ? "yes (ABI " + std::to_string(a->landlock_abi) + ")"
                                             : "no (" + a->landlock_note + ")";
  const std::string more = a->extra_syscalls == 0 ? ""
                           : "; " + std::to_string(a->extra_syscalls) + " more for " +
                                 (c.test_double_ipc ? "the test switch" : "") +
                                 (c.test_double_ipc && kSanitizerRuntime ? " and " : "") +
                                 (kSanitizerRuntime ? "the sanitizer runtime" : "");
  const std::string sc = a->seccomp ? "yes (" + std::to_string(a->allowed_syscalls) +
                                          " system calls allowed, others " +
                                          (c.mode == Mode::kAudit ? "logged" : "EPERM") + more + ")"
                                    : "no (" + a->seccomp_note + ")";
  const std::string caps = !a->capabilities_dropped ? "kept"
                           : a->capabilities_note.empty() ? "none (bounding set empty)"
                                                          : "none (" + a->capabilities_note + ")";
  IVLOG_INFO("sandbox %s: no_new_privs %s, landlock %s, seccomp %s, capabilities %s, uid %u gid %u",
             mode_name(c.mode), a->no_new_privs ? "yes" : "no", ll.c_str(), sc.c_str(), caps.c_str(),
             static_cast<unsigned>(::getuid()), static_cast<unsigned>(::getgid()));
  return {};
}

Result<void> for_checkpointer(const Config& c) {
  if (!c.enabled()) {
    IVLOG_WARN("checkpointer: sandbox OFF: uid %u, capabilities kept", static_cast<unsigned>(::getuid()));
    return {};
  }
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
    return make_error(errno, std::string("no_new_privs: ") + std::strerror(errno));
  std::string note;
  IVCUDA_TRY(drop_bounding_set(&note));
  if (!c.user.empty()) {
    const gid_t groups[] = {c.gid};
    if (::setgroups(1, groups) != 0 || ::setgid(c.gid) != 0 || ::setuid(c.uid) != 0)
      return make_error(errno, "dropping to --user " + c.user + ": " + std::strerror(errno));
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // cleared by the change of credentials
  }
  IVCUDA_TRY(drop_capabilities());
  IVLOG_INFO("checkpointer: no_new_privs yes, capabilities none%s, uid %u gid %u",
             note.empty() ? "" : (" (" + note + ")").c_str(), static_cast<unsigned>(::getuid()),
             static_cast<unsigned>(::getgid()));
  return {};
}

void self_test_if_asked(const Applied& a) {
  if (!env_is("IVCUDA_SANDBOX_SELFTEST", "1")) return;
  auto result = [](long r) { return errno_name(r < 0 ? errno : 0); };
  errno = 0;
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const std::string sock = result(s);
  if (s >= 0) ::close(s);
  // Without a filter that refuses (a sanitizer build, --sandbox audit) execve
  // would succeed and replace the worker, and fork would copy it: those two
  // are only tried where seccomp refuses.
  std::string exec = "not tried (no seccomp)", fork = "not tried (no seccomp)";
  if (a.seccomp && !a.seccomp_refuses) exec = fork = "not tried (--sandbox audit)";
  if (a.seccomp && a.seccomp_refuses) {
    char* const argv[] = {const_cast<char*>("/bin/true"), nullptr};
    char* const envp[] = {nullptr};
    exec = result(::syscall(SYS_execve, "/bin/true", argv, envp));
    const long f = ::syscall(SYS_fork);
    if (f == 0) ::_exit(0);
    if (f > 0) ::waitpid(static_cast<pid_t>(f), nullptr, 0);
    fork = result(f);
  }
  const std::string kill = result(::kill(::getppid(), 0));
  const int fd = ::open("/etc/hostname", O_RDONLY | O_CLOEXEC);
  const std::string open = result(fd);
  if (fd >= 0) ::close(fd);
  // Aimed at the daemon, undone at once where it was allowed.
  int p[2] = {-1, -1};
  std::string setown = "not tried", net = "not tried";
  if (::pipe2(p, O_CLOEXEC) == 0) {
    setown = result(::fcntl(p[0], F_SETOWN, ::getppid()));
    ifreq ifr{};
    std::strcpy(ifr.ifr_name, "lo");
    net = result(::ioctl(p[0], SIOCGIFFLAGS, &ifr));
    ::close(p[0]);
    ::close(p[1]);
  }
  IVLOG_INFO("sandbox self-test: socket(AF_INET) -> %s, execve -> %s, fork -> %s, kill(daemon) -> %s, "
             "open /etc/hostname -> %s, fcntl F_SETOWN(daemon) -> %s, ioctl SIOCGIFFLAGS -> %s",
             sock.c_str(), exec.c_str(), fork.c_str(), kill.c_str(), open.c_str(), setown.c_str(), net.c_str());
}

void trace_mark(const char* what) {
  if (!env_is("IVCUDA_SANDBOX_TRACE_MARK", "1")) return;
  const std::string path = std::string("/ivcuda-sandbox-point/") + what;
  (void)::syscall(SYS_faccessat, AT_FDCWD, path.c_str(), F_OK);
}

}  // namespace ivcuda::host::sandbox
