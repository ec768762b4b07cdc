#include "ring/sys.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

Result<UniqueFd> make_memfd(const char* name, std::uint64_t size) {
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return make_error(errno, "memfd_create: " + errno_string(errno));
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0)
    return make_error(errno, "ftruncate: " + errno_string(errno));
  // The size is part of the contract with the peer: it must not shrink under
  // a mapping (SIGBUS) or grow behind the layout.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)
    return make_error(errno, "F_ADD_SEALS: " + errno_string(errno));
  return fd;
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
