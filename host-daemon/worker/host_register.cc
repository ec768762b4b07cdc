// cuMemHostRegister of a shared mapping (a memfd, a /dev/shm file) in process
// mode. The guest side is guest/host_register.cc.
//
// The guest's own pages of such a mapping cannot move onto the arena (that
// would cut them off from the mapping's other users), so the guest sends the
// file behind them over its connection and the worker maps the same pages
// into its own address space, right after the BAR, and page-locks them there:
// the guest names them as BAR offsets past the BAR's end, so every copy that
// takes page-locked arena memory takes them too, and their device alias
// follows the arena's (BAR offset X is device address arena_device_base + X).
//
// What the worker accepts (rule `shared-register-file`): a regular file (a
// memfd is one) whose size covers the range, page-aligned, at most the
// arena's size of it in all. The pages are the guest's own: it could write
// them already, and the worker only hands them to the driver to pin; it never
// reads or writes them itself, so a file shrunk afterwards costs the worker
// nothing (the driver keeps the pinned pages until the unregistration).
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>

#include <cerrno>
#include <cstring>

#include "host-daemon/shared/log.h"
#include "host-daemon/worker/worker_internal.h"
#include "ring/ivshmem.h"
#include "ring/validate.h"

namespace ivcuda::host {

using namespace ivcuda::proto;

namespace {
constexpr std::uint64_t kPage = 4096;
// Messages on the connection read past while looking for a request's own
// (each closes any fd it carried): a guest that sent junk hurts only itself.
constexpr int kMaxSkipped = 16;

// [at, at + bytes) of the window back to its reservation (the file's pages unmapped).
void reserve_again(std::byte* at, std::uint64_t bytes) noexcept {
  (void)::mmap(at, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
}
}  // namespace

// The window after the BAR, reserved on the first registration: twice the
// arena, so that registrations that come and go find room.
bool Worker::reserve_shared_window() noexcept {
  if (shared_window_ != nullptr) return true;
  const std::uint64_t size = 2 * ((l_.arena_size + kPage - 1) / kPage * kPage);
  std::byte* at = bar_.data() + bar_.size();
  void* p = ::mmap(at, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
  if (p == MAP_FAILED || p != at) {
    if (p != MAP_FAILED) ::munmap(p, size);
    IVLOG_INFO("guest %u: no room after the BAR for registered shared mappings; they are staged", cfg_.guest_id);
    return false;
  }
  shared_window_ = at;
  shared_window_size_ = size;
  return true;
}


// A free run of `bytes` in the window (first fit), as a window offset.
std::optional<std::uint64_t> Worker::shared_slot(std::uint64_t bytes) const {
  std::uint64_t at = 0;
  for (const auto& [off, len] : shared_regs_) {
    if (off - at >= bytes) break;
    at = off + len;
  }
  if (at > shared_window_size_ || shared_window_size_ - at < bytes) return std::nullopt;
  return at;
}

// The fd the guest sent with `token`, or an invalid one.
sys::UniqueFd Worker::shared_fd(std::uint64_t token) {
  if (cfg_.conn_fd < 0) return {};
  for (int i = 0; i < kMaxSkipped; ++i) {
    auto m = conn_reader_.try_read(cfg_.conn_fd);
    if (!m || !m.value()) return {};  // a broken message, or nothing (more) sent
    if (static_cast<std::uint64_t>(m.value()->value) == token && m.value()->fd.valid())
      return std::move(m.value()->fd);
  }
  return {};
}

CUresult Worker::on_HostRegisterShared(Call& c) {
  const auto r = c.req<ReqHostShared>();
  // A VM's processes have no connection of their own (the guest library sends nothing there).
  if (cfg_.vm != nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  // The message first, whatever becomes of the request, so that none is left behind for the next.
  sys::UniqueFd fd = shared_fd(r.token);
  if (!arena_on_use_) return CUDA_ERROR_NOT_SUPPORTED;
  if (!fd.valid()) return CUDA_ERROR_INVALID_VALUE;
  if ((r.flags & ~static_cast<std::uint32_t>(CU_MEMHOSTREGISTER_READ_ONLY)) != 0 || r.reserved != 0 ||
      r.bytes == 0 || r.bytes % kPage != 0 || r.file_off % kPage != 0)
    return CUDA_ERROR_INVALID_VALUE;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (IVCUDA_RULE("shared-register-file")) {
    std::uint64_t end = 0;
    if (!S_ISREG(st.st_mode) || __builtin_add_overflow(r.file_off, r.bytes, &end) ||
        end > static_cast<std::uint64_t>(st.st_size))
      return CUDA_ERROR_INVALID_VALUE;
    if (r.bytes > l_.arena_size || shared_bytes_ > l_.arena_size - r.bytes) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const int mode = ::fcntl(fd.get(), F_GETFL);
  if (mode < 0) return CUDA_ERROR_INVALID_VALUE;
  const bool writable = (mode & O_ACCMODE) == O_RDWR;
  if (!writable && (r.flags & CU_MEMHOSTREGISTER_READ_ONLY) == 0) return CUDA_ERROR_INVALID_VALUE;
  if (!reserve_shared_window()) return CUDA_ERROR_NOT_SUPPORTED;
  const auto slot = shared_slot(r.bytes);
  if (!slot) return CUDA_ERROR_OUT_OF_MEMORY;
  std::byte* at = shared_window_ + *slot;
  void* p = ::mmap(at, r.bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED | MAP_FIXED, fd.get(),
                   static_cast<off_t>(r.file_off));
  if (p == MAP_FAILED) return CUDA_ERROR_INVALID_VALUE;
  const unsigned flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | r.flags;
  if (const CUresult e = register_host(at, r.bytes, flags); e != CUDA_SUCCESS) {
    reserve_again(at, r.bytes);
    return e;
  }
  // Its device alias must be where the arena's puts it (worker.cc: the arena
  // is page-locked on use only where the device sees registered memory at its
  // host address); else the guest stages it, as before.
  const std::uint64_t off = bar_.size() + *slot;
  if (host_alias(at) != arena_dev_ - l_.arena_off + off) {
    unregister_host(at);
    reserve_again(at, r.bytes);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  shared_regs_[*slot] = r.bytes;
  shared_bytes_ += r.bytes;
  c.set_reply(RepHostAlloc{off, arena_dev_ - l_.arena_off + off});
  return CUDA_SUCCESS;
}

CUresult Worker::on_HostUnregisterShared(Call& c) {
  const auto r = c.req<ReqArenaOff>();
  if (r.arena_off < bar_.size()) return CUDA_ERROR_INVALID_VALUE;
  const auto it = shared_regs_.find(r.arena_off - bar_.size());
  if (it == shared_regs_.end()) return CUDA_ERROR_INVALID_VALUE;
  drop_shared(it->first);
  return CUDA_SUCCESS;
}

void Worker::drop_shared(std::uint64_t slot) noexcept {
  const auto it = shared_regs_.find(slot);
  if (it == shared_regs_.end()) return;
  std::byte* at = shared_window_ + slot;
  unregister_host(at);
  reserve_again(at, it->second);
  shared_bytes_ -= it->second;
  shared_regs_.erase(it);
}

// Every registration, and the window: a recycled worker's next guest maps a
// new BAR elsewhere and finds none of these.
void Worker::release_shared() noexcept {
  while (!shared_regs_.empty()) drop_shared(shared_regs_.begin()->first);
  if (shared_window_ != nullptr) ::munmap(shared_window_, shared_window_size_);
  shared_window_ = nullptr;
  shared_window_size_ = 0;
}

bool Worker::shared_range(std::uint64_t off, std::uint64_t len) const {
  if (shared_regs_.empty() || off < bar_.size()) return false;
  const std::uint64_t w = off - bar_.size();
  auto it = shared_regs_.upper_bound(w);
  if (it == shared_regs_.begin()) return false;
  --it;
  return ring::span_within(w, len, it->first, it->second);
}

bool Worker::shared_device(std::uint64_t addr, std::uint64_t len) const {
  if (shared_regs_.empty()) return false;
  const std::uint64_t base = arena_dev_ - l_.arena_off + bar_.size();
  return addr >= base && shared_range(addr - base + bar_.size(), len);
}

}  // namespace ivcuda::host
