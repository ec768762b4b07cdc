// RAII wrappers for the system resources the transport uses. System calls
// are wrapped here once; callers get Results, never raw -1/errno.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "ivcuda/result.h"

namespace ivcuda::sys {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }
  void reset(int fd = -1) noexcept;

 private:
  int fd_ = -1;
};

// A shared mapping of a file descriptor (memfd, /dev/shm file, UIO map).
class Mapping {
 public:
  Mapping() = default;
  Mapping(Mapping&& o) noexcept
      : addr_(std::exchange(o.addr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      reset();
      addr_ = std::exchange(o.addr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { reset(); }

  static Result<Mapping> map_shared(int fd, std::size_t size, std::uint64_t offset = 0);
  // The same at a random, 2 MiB-aligned address of its own (for a mapping
  // whose address a peer learns).
  static Result<Mapping> map_shared_random(int fd, std::size_t size);
  std::byte* data() const noexcept { return static_cast<std::byte*>(addr_); }
  std::size_t size() const noexcept { return size_; }
  void reset() noexcept;

 private:
  void* addr_ = nullptr;
  std::size_t size_ = 0;
};

// A memfd of `size` bytes, sealed against shrinking, growing and new seals.
Result<UniqueFd> make_memfd(const char* name, std::uint64_t size);
// The same on 2 MiB huge pages (MFD_HUGETLB): `size` must be a multiple of
// 2 MiB, and the pages come from the host's reserved pool (vm.nr_hugepages),
// taken when a mapping is made (mmap fails with ENOMEM when too few are free).
Result<UniqueFd> make_huge_memfd(const char* name, std::uint64_t size);
Result<UniqueFd> make_eventfd(bool nonblocking);
// Size of the file behind fd (fstat).
Result<std::uint64_t> file_size(int fd);

// Writes the 8-byte value 1 to an eventfd. Never blocks the caller for long:
// an eventfd counter overflow (2^64-2 pending) is the only failure.
void eventfd_signal(int fd) noexcept;
// Reads and clears an eventfd counter; returns false if nothing was pending
// (non-blocking fd) or on error.
bool eventfd_drain(int fd) noexcept;
// Blocks until fd is readable or timeout_ms passes (-1 = forever). Returns
// true if readable. EINTR counts as a spurious wake-up (returns false).
bool wait_readable(int fd, int timeout_ms) noexcept;

std::string errno_string(int err);

}  // namespace ivcuda::sys
