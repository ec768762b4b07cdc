#include "ring/sys.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host-daemon/shared/rules.h"  // IVCUDA_RULE: host-side rules enforced here (docs/security.md)

namespace ivcuda::sys {

void UniqueFd::reset(int fd) noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void Mapping::reset() noexcept {
  if (addr_ != nullptr) ::munmap(addr_, size_);
  addr_ = nullptr;
  size_ = 0;
}

std::string errno_string(int err) { return std::strerror(err); }

Result<Mapping> Mapping::map_shared(int fd, std::size_t size, std::uint64_t offset) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) return make_error(errno, "mmap: " + errno_string(errno));
  Mapping m;
  m.addr_ = p;
  m.size_ = size;
  return m;
}

Result<Mapping> Mapping::map_shared_random(int fd, std::size_t size) {
  // Placed by a random hint, independently of the kernel's mmap base, so that
  // the address says nothing about where libraries, heap or stacks are. The
  // window [16 TiB, 64 TiB) stays clear of the low region GPU drivers use for
  // their own reservations and of the mmap area under the stack.
  constexpr std::uint64_t kLow = 1ull << 44, kHigh = 1ull << 46, kAlign = 2ull << 20;
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer keeps its shadow in that window and aborts on a fixed
  // mapping there: its builds (tests only) take the kernel's placement.
  constexpr bool kRandom = false;
#else
  constexpr bool kRandom = true;
#endif
  if (kRandom && size != 0 && size < kHigh - kLow) {
    for (int attempt = 0; attempt < 16; ++attempt) {
      std::uint64_t r = 0;
      if (::getrandom(&r, sizeof r, 0) != sizeof r) break;
      const std::uint64_t span = (kHigh - kLow - size) / kAlign;
      const std::uint64_t hint = kLow + (r % span) * kAlign;
      void* p = ::mmap(reinterpret_cast<void*>(hint), size, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
      if (p == MAP_FAILED) {
        if (errno == EEXIST) continue;  // something lives there: another draw
        return make_error(errno, "mmap: " + errno_string(errno));
      }
      if (p != reinterpret_cast<void*>(hint)) {  // kernels before 4.17 treat the flag as a hint
        ::munmap(p, size);
        continue;
      }
      Mapping m;
      m.addr_ = p;
      m.size_ = size;
      return m;
    }
  }
  return make_error(EADDRNOTAVAIL, "mmap: no free random address for " + std::to_string(size) + " bytes");
}

namespace {
Result<UniqueFd> sealed_memfd(const char* name, std::uint64_t size, unsigned extra_flags) {
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | extra_flags));
  if (!fd.valid()) return make_error(errno, "memfd_create: " + errno_string(errno));
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0)
    return make_error(errno, "ftruncate: " + errno_string(errno));
  // The size is part of the contract with the peer: it must not shrink under
  // a mapping (SIGBUS) or grow behind the layout. F_SEAL_SEAL closes the set:
  // otherwise a peer holding the fd could add F_SEAL_FUTURE_WRITE (or
  // F_SEAL_WRITE) before the worker maps it, and the worker's mapping fails.
  const int seals = IVCUDA_RULE("memfd-seals") ? F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL : 0;
  if (::fcntl(fd.get(), F_ADD_SEALS, seals) != 0)
    return make_error(errno, "F_ADD_SEALS: " + errno_string(errno));
  return fd;
}
}  // namespace

Result<UniqueFd> make_memfd(const char* name, std::uint64_t size) { return sealed_memfd(name, size, 0); }

Result<UniqueFd> make_huge_memfd(const char* name, std::uint64_t size) {
  constexpr std::uint64_t k2M = 2ull << 20;
  if (size % k2M != 0) return make_error(EINVAL, "huge pages need a size in whole 2 MiB pages");
  return sealed_memfd(name, size, MFD_HUGETLB | MFD_HUGE_2MB);
}

Result<UniqueFd> make_eventfd(bool nonblocking) {
  UniqueFd fd(::eventfd(0, EFD_CLOEXEC | (nonblocking ? EFD_NONBLOCK : 0)));
  if (!fd.valid()) return make_error(errno, "eventfd: " + errno_string(errno));
  return fd;
}

Result<std::uint64_t> file_size(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return make_error(errno, "fstat: " + errno_string(errno));
  return static_cast<std::uint64_t>(st.st_size);
}

void eventfd_signal(int fd) noexcept {
  const std::uint64_t one = 1;
  ssize_t r;
  do {
    r = ::write(fd, &one, sizeof one);
  } while (r < 0 && errno == EINTR);
}

bool eventfd_drain(int fd) noexcept {
  std::uint64_t v = 0;
  ssize_t r;
  do {
    r = ::read(fd, &v, sizeof v);
  } while (r < 0 && errno == EINTR);
  return r == sizeof v && v != 0;
}

bool wait_readable(int fd, int timeout_ms) noexcept {
  pollfd p{fd, POLLIN, 0};
  const int r = ::poll(&p, 1, timeout_ms);
  return r > 0 && (p.revents & (POLLIN | POLLERR | POLLHUP)) != 0;
}

}  // namespace ivcuda::sys
