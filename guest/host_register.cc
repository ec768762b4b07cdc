#include "guest/host_register.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace ivcuda::guest::hostreg {
namespace {

namespace proto = ivcuda::proto;
using proto::Op;

// The arena allocator's granule and the guest's page size must agree: an
// arena page replaces exactly one guest page.
constexpr std::uintptr_t kPage = 4096;

// ---------------------------------------------------------------- parking
//
// Moving a page means copying it and then mapping the copy in its place. A
// store into the page between the two is lost, and the page holding a
// registered stack variable also holds the caller's own frames: every call
// the caller makes writes return addresses there. So the caller does no
// work during the move: it sleeps in FUTEX_WAIT with every signal blocked
// (a handler would run on its stack) while a helper thread moves the pages,
// and the helper starts only once /proc shows the caller asleep in exactly
// that futex. The helper's part allocates nothing: malloc could write
// chunk headers inside a heap page being moved.

struct Park {
  std::uint32_t word = 0;  // futex word: 0 while the caller must stay asleep
  pid_t tid = 0;           // the caller
  int (*work)(void*) = nullptr;
  void* arg = nullptr;
  int result = 0;
};
// Static, so it never lies in a page being moved (a heap or stack object
// might); the registry's mutex serialises its users.
Park g_park;

// The word is read with a builtin rather than through an atomic_ref: once
// woken, the caller must touch no stack memory before its acquire load, or
// ThreadSanitizer (which cannot see the futex) takes the helper's remap of
// that stack page for a race.
std::uint32_t park_word_acquire() { return __atomic_load_n(&g_park.word, __ATOMIC_ACQUIRE); }

// Reads a small /proc file into buf (NUL-terminated); false if unreadable.
bool read_proc(const char* path, char* buf, std::size_t size) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const ssize_t n = ::read(fd, buf, size - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  return true;
}

// Whether thread `tid` sleeps in FUTEX_WAIT on `word`: its state is S and its
// current system call is futex with `word` as first argument. Where the
// syscall file cannot be read (kernels without it, non-dumpable processes)
// the state alone has to do: between creating the helper and its futex the
// caller has nothing else to sleep in.
bool asleep_in_futex(pid_t tid, const void* word) {
  char path[64], buf[512];
  std::snprintf(path, sizeof path, "/proc/self/task/%d/stat", static_cast<int>(tid));
  if (!read_proc(path, buf, sizeof buf)) return false;
  const char* paren = std::strrchr(buf, ')');  // the command name may hold anything
  if (paren == nullptr || paren[1] != ' ' || paren[2] != 'S') return false;
  std::snprintf(path, sizeof path, "/proc/self/task/%d/syscall", static_cast<int>(tid));
  if (!read_proc(path, buf, sizeof buf)) return true;
  char* end = nullptr;
  const long nr = std::strtol(buf, &end, 10);
  if (end == buf || nr != SYS_futex) return false;
  const unsigned long long arg0 = std::strtoull(end, nullptr, 16);
  return arg0 == reinterpret_cast<std::uintptr_t>(word);
}

void* helper_main(void*) {
  int result = ETIMEDOUT;
  // A parked caller shows up within microseconds; give up after 10 s (the
  // caller is then released unharmed: nothing has been moved).
  for (int i = 0; i < 200'000; ++i) {
    if (asleep_in_futex(g_park.tid, &g_park.word)) {
      result = g_park.work(g_park.arg);
      break;
    }
    const timespec nap{0, 50'000};
    ::nanosleep(&nap, nullptr);
  }
  g_park.result = result;
  __atomic_store_n(&g_park.word, 1, __ATOMIC_RELEASE);  // pairs with park_word_acquire()
  ::syscall(SYS_futex, &g_park.word, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  return nullptr;
}

// Runs work(arg) on a helper thread while the calling thread is parked.
// Returns work's result (0 or an errno value) or why it could not run.
int run_parked(int (*work)(void*), void* arg) {
  g_park.word = 0;
  g_park.tid = static_cast<pid_t>(::syscall(SYS_gettid));
  g_park.work = work;
  g_park.arg = arg;
  g_park.result = 0;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);  // the helper inherits the full mask too
  pthread_t helper;
  const int rc = pthread_create(&helper, nullptr, helper_main, nullptr);
  if (rc != 0) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return rc;
  }
  while (park_word_acquire() == 0)
    ::syscall(SYS_futex, &g_park.word, FUTEX_WAIT_PRIVATE, 0, nullptr, nullptr, 0);
  pthread_join(helper, nullptr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return g_park.result;
}

// ------------------------------------------------------------ page moves

constexpr int kRw = PROT_READ | PROT_WRITE;

// Re-applies each page's original protection after a move (moves map RW).
int restore_prots(std::uintptr_t va, const std::vector<int>& prots) {
  for (std::size_t i = 0; i < prots.size(); ++i)
    if (prots[i] != kRw && ::mprotect(reinterpret_cast<void*>(va + i * kPage), kPage, prots[i]) != 0) return errno;
  return 0;
}

// Copies whole pages. The source pages hold more than the registered range:
// heap redzones and other objects' bytes that a sanitizer would flag for an
// ordinary memcpy. Volatile loads keep the compiler from making this a
// (sanitizer-intercepted) memcpy call again.
__attribute__((no_sanitize("address", "thread"))) void copy_pages(void* dst, std::uintptr_t src, std::size_t len) {
  auto* d = static_cast<std::uint64_t*>(dst);
  const auto* s = reinterpret_cast<const volatile std::uint64_t*>(src);
  for (std::size_t i = 0; i < len / sizeof *d; ++i) d[i] = s[i];
}

struct Move {
  Runtime* rt = nullptr;
  std::uintptr_t va = 0;
  std::uint64_t arena_off = 0;
  std::size_t len = 0;
  void* scratch = nullptr;     // unregister: the private pages prepared to take over
  const std::vector<int>* prots = nullptr;
};

// A move either happens or leaves everything as it was: once the new pages
// are in place, failing to narrow a page's protection again (mprotect can
// run out of mappings) leaves that page more permissive, not broken.
int move_in(void* a) {
  const auto& m = *static_cast<const Move*>(a);
  copy_pages(m.rt->bar() + m.arena_off, m.va, m.len);
  if (const int e = m.rt->map_arena_at(reinterpret_cast<void*>(m.va), m.arena_off, m.len); e != 0) return e;
  (void)restore_prots(m.va, *m.prots);
  return 0;
}

int move_out(void* a) {
  const auto& m = *static_cast<const Move*>(a);
  copy_pages(m.scratch, m.va, m.len);
  if (::mremap(m.scratch, m.len, m.len, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(m.va)) == MAP_FAILED)
    return errno;
  (void)restore_prots(m.va, *m.prots);
  return 0;
}

// The protection of each page of [lo, hi) from /proc/self/maps, and whether
// the range lies in shared mappings (memfds, files, /dev/shm). Fails
// (INVALID_VALUE) if part of the range is unmapped or unreadable, and
// (NOT_SUPPORTED) for a range that is part shared and part private.
CUresult page_prots(std::uintptr_t lo, std::uintptr_t hi, std::vector<int>* out, bool* shared) {
  std::ifstream maps("/proc/self/maps");
  if (!maps) return CUDA_ERROR_NOT_SUPPORTED;
  out->assign((hi - lo) / kPage, -1);
  std::string line;
  bool any_shared = false, any_private = false;
  while (std::getline(maps, line)) {
    unsigned long long s = 0, e = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%llx-%llx %7s", &s, &e, perms) != 3) continue;
    if (e <= lo || s >= hi) continue;
    (perms[3] == 's' ? any_shared : any_private) = true;
    const int prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
                     (perms[2] == 'x' ? PROT_EXEC : 0);
    for (std::uintptr_t p = std::max<std::uintptr_t>(s, lo); p < std::min<std::uintptr_t>(e, hi); p += kPage)
      (*out)[(p - lo) / kPage] = prot;
  }
  for (int prot : *out)
    if (prot < 0 || (prot & PROT_READ) == 0) return CUDA_ERROR_INVALID_VALUE;
  if (any_shared && any_private)
    return not_supported("cuMemHostRegister: a range of both shared and private memory is not supported");
  *shared = any_shared;
  return CUDA_SUCCESS;
}

// Whether every page of [lo, hi) still lies in a shared mapping, as the
// moved pages do; false once the program unmapped or replaced them.
bool still_moved(std::uintptr_t lo, std::uintptr_t hi) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  std::uintptr_t covered = lo;  // /proc/self/maps is sorted by address
  while (covered < hi && std::getline(maps, line)) {
    unsigned long long s = 0, e = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%llx-%llx %7s", &s, &e, perms) != 3 || e <= covered) continue;
    if (s > covered || perms[3] != 's') return false;
    covered = static_cast<std::uintptr_t>(e);
  }
  return covered >= hi;
}

// ------------------------------------------------------- shared mappings
//
// Memory of a shared mapping stays where it is. In process mode the worker
// maps the same pages of the file behind it and page-locks them
// (host-daemon/worker/host_register.cc): the guest sends the file over its
// connection, the worker answers where the pages are (a BAR offset past the
// BAR, so copies name them as they name the arena) and their device alias.
// Where that cannot be (a VM's process, whose mappings the host cannot
// reach; a file this process holds no descriptor or path of; a worker that
// refuses), the registration is kept in the guest only and copies stage it.

// The file behind [lo, hi) if one shared mapping of a file holds all of it:
// an fd for it (owned: `own`, else one of the program's), the range's offset in it.
struct Backing {
  int fd = -1;
  bool own = false;
  std::uint64_t file_off = 0;
};

// An fd of the file with device `dev` and inode `ino`, open for writing if `write`.
int reopen_checked(const char* path, bool write, dev_t dev, ino_t ino) {
  const int fd = ::open(path, (write ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != dev || st.st_ino != ino) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::optional<Backing> backing_of(std::uintptr_t lo, std::uintptr_t hi, bool write) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  unsigned long long s = 0, e = 0, off = 0, ino = 0;
  unsigned maj = 0, min = 0;
  char perms[8] = {};
  bool found = false;
  while (std::getline(maps, line)) {
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %x:%x %llu", &s, &e, perms, &off, &maj, &min, &ino) != 7)
      continue;
    if (s <= lo && lo < e) {
      found = true;
      break;
    }
  }
  if (!found || e < hi || perms[3] != 's' || ino == 0 || (write && perms[1] != 'w')) return std::nullopt;
  const dev_t dev = makedev(maj, min);
  Backing b;
  b.file_off = off + (lo - s);
  // One of the program's own descriptors of the file (a memfd is often
  // found only so), reopened for writing if it was opened read-only.
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* ent = ::readdir(d)) {
      char* end = nullptr;
      const long n = std::strtol(ent->d_name, &end, 10);
      if (end == ent->d_name || *end != '\0' || n == ::dirfd(d)) continue;
      const int fd = static_cast<int>(n);
      struct stat st {};
      if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != dev || st.st_ino != ino) continue;
      const int mode = ::fcntl(fd, F_GETFL);
      if (mode >= 0 && (!write || (mode & O_ACCMODE) == O_RDWR)) {
        b.fd = fd;
      } else {
        const std::string self = "/proc/self/fd/" + std::to_string(fd);
        b.fd = reopen_checked(self.c_str(), write, dev, ino);
        b.own = b.fd >= 0;
      }
      if (b.fd >= 0) break;
    }
    ::closedir(d);
  }
  // Else the mapping's path (a /dev/shm file), or the mapping itself where
  // /proc lets this process open it.
  if (b.fd < 0) {
    const auto slash = line.find('/');
    if (slash != std::string::npos && line.find(" (deleted)") == std::string::npos)
      b.fd = reopen_checked(line.c_str() + slash, write, dev, ino);
    if (b.fd < 0) {
      char path[96];
      std::snprintf(path, sizeof path, "/proc/self/map_files/%llx-%llx", s, e);
      b.fd = reopen_checked(path, write, dev, ino);
    }
    b.own = b.fd >= 0;
  }
  if (b.fd < 0) return std::nullopt;
  return b;
}

// The worker's BAR offset of [lo, hi) of a shared mapping, page-locked there;
// 0 where it stays in the guest only (staged), said once.
std::uint64_t share_with_worker(Runtime* rt, std::uintptr_t lo, std::uintptr_t hi, unsigned flags) {
  if (rt->vm_mode()) return 0;
  const bool write = (flags & CU_MEMHOSTREGISTER_READ_ONLY) == 0;
  const auto b = backing_of(lo, hi, write);
  if (!b) {
    log_once("hostreg-shared-nofile", "cuMemHostRegister: found no descriptor or path of the file behind a shared "
             "mapping; it is staged, with no device address (docs/design.md)");
    return 0;
  }
  static std::atomic<std::uint64_t> tokens{1};
  const std::uint64_t token = tokens.fetch_add(1);
  const bool sent = rt->send_fd(static_cast<std::int64_t>(token), b->fd);
  if (b->own) ::close(b->fd);
  if (!sent) return 0;
  proto::RepHostAlloc a{};
  const proto::ReqHostShared req{token, b->file_off, hi - lo, flags & CU_MEMHOSTREGISTER_READ_ONLY, 0};
  if (const CUresult st = rt->call<Op::kHostRegisterShared>(req, {}, &a); st != CUDA_SUCCESS) {
    log_once("hostreg-shared-refused", "cuMemHostRegister: the daemon did not page-lock a shared mapping (%s); it "
             "is staged, with no device address", std::to_string(static_cast<int>(st)).c_str());
    return 0;
  }
  return a.arena_off;
}

// --------------------------------------------------------------- registry

// A registration of shared-mapping memory (`shared`) stays where it is:
// moving its pages onto the arena would cut them off from the mapping's other
// users. Where the worker page-locked the same pages (`window`: their BAR
// offset, past the BAR) copies take them as arena memory and the device
// alias follows; else they have none and copies stage them like pageable memory.
struct Reg {
  std::size_t size;
  unsigned flags;
  std::uint64_t ctx;
  bool shared = false;
  std::uint64_t window = 0;  // BAR offset of the registration's first page in the worker
};
struct Page {
  std::uint64_t arena_off;
  std::uint64_t block;  // the HostAlloc block it came from
  std::uint32_t refs;   // registrations touching this page
  int prot;             // the page's protection before it was moved
};
struct Registry {
  std::mutex mu;  // held across whole register/unregister calls, moves included
  std::map<std::uintptr_t, Reg> regs;
  std::map<std::uintptr_t, Page> pages;
  std::map<std::uint64_t, std::uint64_t> blocks;  // block offset -> its pages still in use
};
Registry& registry() {
  static auto* r = new Registry;  // never destroyed: atexit handlers may still unregister
  return *r;
}

CUresult from_errno(int e, const char* what) {
  log_line("%s: %s", what, std::strerror(e));
  return e == ENOMEM ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_UNKNOWN;
}

}  // namespace

CUresult register_range(Runtime* rt, std::uint64_t ctx, void* p, std::size_t bytes, unsigned flags) {
  constexpr unsigned kKnown = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                              CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
  if (p == nullptr || bytes == 0 || (flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  // IOMEMORY is for PCI BAR memory of another device; the real driver
  // refuses it for ordinary memory with INVALID_VALUE.
  if ((flags & CU_MEMHOSTREGISTER_IOMEMORY) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (::sysconf(_SC_PAGESIZE) != static_cast<long>(kPage)) {
    return not_supported("cuMemHostRegister: needs 4 KiB pages (the arena's granule)");
  }
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  if (bytes > UINTPTR_MAX - kPage || base > UINTPTR_MAX - kPage - bytes) return CUDA_ERROR_INVALID_VALUE;
  const std::uintptr_t end = base + bytes;
  const std::uintptr_t lo = base / kPage * kPage;
  const std::uintptr_t hi = (end + kPage - 1) / kPage * kPage;
  const std::uintptr_t last = hi - kPage;

  // The BAR itself: cuMemHostAlloc memory is registered already, the rest
  // (rings, staging) is not the caller's to register.
  if (rt->in_bar(base, bytes)) {
    return CUDA_ERROR_INVALID_VALUE;  // what driver 580 answers for cuMemHostAlloc memory too
  }

  Registry& r = registry();
  std::lock_guard lk(r.mu);
  // The registration starting before our end must end before our start.
  if (auto next = r.regs.lower_bound(end); next != r.regs.begin()) {
    const auto prev = std::prev(next);
    if (prev->first + prev->second.size > base) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  // Byte ranges do not overlap, so only the first and last page can already
  // be shared (by registrations that end or start inside them).
  auto first_it = r.pages.find(lo);
  auto last_it = last != lo ? r.pages.find(last) : r.pages.end();
  const bool first_known = first_it != r.pages.end();
  const bool last_known = last_it != r.pages.end();
  const std::uintptr_t new_lo = first_known ? lo + kPage : lo;
  const std::uintptr_t new_hi = last_known ? last : hi;
  if (lo != last && (first_known || last_known)) {
    // The device alias of a registration must be contiguous, and an arena
    // page already in use elsewhere has its own neighbours.
    const bool contiguous = first_known && last_known && last == lo + kPage &&
                            first_it->second.arena_off + kPage == last_it->second.arena_off;
    if (!contiguous) {
      return not_supported("cuMemHostRegister: a range over several pages that shares its first or last page with "
               "another registration is not supported (docs/design.md)");
    }
  }

  if (new_lo < new_hi) {
    std::vector<int> prots;
    bool shared = false;
    if (const CUresult st = page_prots(new_lo, new_hi, &prots, &shared); st != CUDA_SUCCESS) return st;
    // A BAR on 2 MiB pages (ivcudad --huge-pages) cannot lend 4 KiB pages:
    // the range stays where it is and is staged, as shared memory is.
    if (!shared && rt->bar_on_huge_pages() && !first_known && !last_known) {
      log_once("hostreg-huge", "cuMemHostRegister: the daemon's memory is on huge pages here; registered memory "
               "is staged, with no device alias (ivcudad --huge-pages off gives zero-copy)");
      shared = true;
    }
    if (shared) {
      // An edge page moved for another registration is private memory of
      // ours now, so such a range is part shared, part not.
      if (first_known || last_known)
        return not_supported("cuMemHostRegister: a range of both shared and private memory is not supported");
      r.regs[base] = Reg{bytes, flags, ctx, true, share_with_worker(rt, lo, hi, flags)};
      return CUDA_SUCCESS;
    }
    proto::RepHostAlloc a{};
    const std::uint64_t len = new_hi - new_lo;
    if (const CUresult st = rt->call<Op::kHostAlloc>(proto::ReqHostAlloc{len, 0, 0}, {}, &a); st != CUDA_SUCCESS)
      return st;
    Move m{rt, new_lo, a.arena_off, len, nullptr, &prots};
    if (const int e = run_parked(move_in, &m); e != 0) {
      (void)rt->call<Op::kHostFree>(proto::ReqArenaOff{a.arena_off});
      return from_errno(e, "cuMemHostRegister: moving the pages onto the arena");
    }
    for (std::uintptr_t v = new_lo; v < new_hi; v += kPage)
      r.pages[v] = Page{a.arena_off + (v - new_lo), a.arena_off, 1, prots[(v - new_lo) / kPage]};
    r.blocks[a.arena_off] = len / kPage;
  }
  if (first_known) ++first_it->second.refs;
  if (last_known) ++last_it->second.refs;
  r.regs[base] = Reg{bytes, flags, ctx};
  return CUDA_SUCCESS;
}

CUresult unregister_range(Runtime* rt, void* p) {
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  const auto it = r.regs.find(base);
  if (it == r.regs.end()) {
    // Inside a registration but not at its start: INVALID_VALUE, as the real driver says.
    auto next = r.regs.upper_bound(base);
    if (next != r.regs.begin() && base - std::prev(next)->first < std::prev(next)->second.size)
      return CUDA_ERROR_INVALID_VALUE;
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  }
  if (it->second.shared) {  // nothing was moved; the worker lets its own mapping go
    if (it->second.window != 0 && !rt->dead())
      (void)rt->call<Op::kHostUnregisterShared>(proto::ReqArenaOff{it->second.window});
    r.regs.erase(it);
    return CUDA_SUCCESS;
  }
  const std::uintptr_t lo = base / kPage * kPage;
  const std::uintptr_t hi = (base + it->second.size + kPage - 1) / kPage * kPage;
  // The pages this registration alone holds: the whole range less any edge
  // page another registration still uses, so one contiguous run.
  std::uintptr_t free_lo = lo, free_hi = hi;
  if (r.pages.at(lo).refs > 1) free_lo += kPage;
  if (hi - kPage != lo && r.pages.at(hi - kPage).refs > 1) free_hi -= kPage;
  if (free_lo < free_hi && !still_moved(free_lo, free_hi)) {
    // The program unmapped (or mapped over) the registered memory first:
    // there is nothing of ours left to move back, only books to clear.
    // The program unmapped it first (as it may): nothing of ours is left
    // there, and the real driver says nothing either.
    free_lo = free_hi;
  }
  if (free_lo < free_hi) {
    const std::size_t len = free_hi - free_lo;
    std::vector<int> prots;
    for (std::uintptr_t v = free_lo; v < free_hi; v += kPage) prots.push_back(r.pages.at(v).prot);
    void* scratch = ::mmap(nullptr, len, kRw, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (scratch == MAP_FAILED) return from_errno(errno, "cuMemHostUnregister: private pages");
    Move m{rt, free_lo, 0, len, scratch, &prots};
    if (const int e = run_parked(move_out, &m); e != 0) {
      ::munmap(scratch, len);
      return from_errno(e, "cuMemHostUnregister: moving the pages off the arena");
    }
  }
  for (std::uintptr_t v = lo; v < hi; v += kPage) {
    auto pg = r.pages.find(v);
    if (--pg->second.refs != 0) continue;
    auto blk = r.blocks.find(pg->second.block);
    if (--blk->second == 0) {
      // The daemon may be gone; the pages are private again either way.
      if (!rt->dead()) (void)rt->call<Op::kHostFree>(proto::ReqArenaOff{blk->first});
      r.blocks.erase(blk);
    }
    r.pages.erase(pg);
  }
  r.regs.erase(it);
  return CUDA_SUCCESS;
}

std::optional<Found> find(Runtime* rt, const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  auto next = r.regs.upper_bound(a);
  if (next == r.regs.begin()) return std::nullopt;
  const auto it = std::prev(next);
  if (a - it->first >= it->second.size) return std::nullopt;
  if (it->second.shared) {
    const std::uint64_t dptr =
        it->second.window == 0 ? 0 : rt->hello().arena_device_base + it->second.window + (a - it->first / kPage * kPage);
    return Found{it->first, it->second.size, it->second.flags, it->second.ctx, dptr};
  }
  const auto pg = r.pages.find(a / kPage * kPage);
  if (pg == r.pages.end()) return std::nullopt;
  return Found{it->first, it->second.size, it->second.flags, it->second.ctx,
               rt->hello().arena_device_base + pg->second.arena_off + a % kPage};
}

}  // namespace ivcuda::guest::hostreg
