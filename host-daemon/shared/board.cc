// See from_worker.h, "the status board".
#include "host-daemon/shared/from_worker.h"

#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>

namespace ivcuda::host {

namespace {
constexpr std::size_t kBoardBytes = 4096;
static_assert(sizeof(GuestStats) <= kBoardBytes);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);  // shared between processes
}  // namespace

const char* mode_name(GuestMode m) noexcept {
  switch (m) {
    case GuestMode::kStarting: return "starting";
    case GuestMode::kProcess: return "process";
    case GuestMode::kVm: return "vm";
    case GuestMode::kPlain: return "vm-plain";
  }
  return "unknown";
}

const char* step_name(CheckpointStep s) noexcept {
  switch (s) {
    case CheckpointStep::kDone: return "done";
    case CheckpointStep::kLock: return "lock";
    case CheckpointStep::kCheckpoint: return "checkpoint";
    case CheckpointStep::kRestore: return "restore";
    case CheckpointStep::kUnlock: return "unlock";
    case CheckpointStep::kState: return "state";
  }
  return "?";
}

void GuestStats::reset_for_next_guest() noexcept {
  evict.store(0, std::memory_order_relaxed);
  mode.store(0, std::memory_order_relaxed);
  processes.store(0, std::memory_order_relaxed);
  mem_used.store(0, std::memory_order_relaxed);
  calls.store(0, std::memory_order_relaxed);
  copy_bytes.store(0, std::memory_order_relaxed);
  errors.store(0, std::memory_order_relaxed);
  evicted.store(0, std::memory_order_relaxed);
  suspend.store(0, std::memory_order_relaxed);
  quiet.store(0, std::memory_order_relaxed);
  error_time_ns.store(0, std::memory_order_relaxed);
  for (char& c : last_error) std::atomic_ref<char>(c).store(0, std::memory_order_relaxed);
  // Even again (not being written), and past every sequence a reader saw.
  const std::uint32_t seq = error_seq.load(std::memory_order_relaxed);
  error_seq.store((seq | 1) + 1, std::memory_order_release);
}

void GuestStats::note_error(const char* op, const char* error) noexcept {
  errors.fetch_add(1, std::memory_order_relaxed);
  // A VM's workers share the board: the one that makes the sequence odd
  // writes; a writer that finds it odd leaves this error out.
  std::uint32_t s = error_seq.load(std::memory_order_relaxed);
  if ((s & 1) != 0 || !error_seq.compare_exchange_strong(s, s + 1, std::memory_order_acquire)) return;
  // Release stores: a reader that sees any of them sees the odd sequence
  // before it (no fences: ThreadSanitizer does not model them).
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  error_time_ns.store(static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec),
                      std::memory_order_release);
  char text[sizeof last_error];
  std::snprintf(text, sizeof text, "%s: %s", op, error);
  for (std::size_t i = 0; i < sizeof text; ++i)
    std::atomic_ref<char>(last_error[i]).store(text[i], std::memory_order_release);
  error_seq.store(s + 2, std::memory_order_release);
}

std::string GuestStats::read_last_error(std::uint64_t* time_ns) const {
  char text[sizeof last_error + 1];
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::uint32_t s1 = error_seq.load(std::memory_order_acquire);
    if ((s1 & 1) != 0) continue;
    if (s1 == 0) {
      *time_ns = 0;
      return {};
    }
    // Acquire loads: the sequence is read again only after them.
    for (std::size_t i = 0; i < sizeof last_error; ++i)
      text[i] = std::atomic_ref<char>(const_cast<char&>(last_error[i])).load(std::memory_order_acquire);
    *time_ns = error_time_ns.load(std::memory_order_acquire);
    if (error_seq.load(std::memory_order_relaxed) != s1) continue;
    text[sizeof last_error] = '\0';
    std::string out(text);
    // Whatever a subverted worker wrote: printable ASCII only.
    std::replace_if(out.begin(), out.end(), [](char c) { return c < 0x20 || c > 0x7e; }, '?');
    return out;
  }
  *time_ns = 0;
  return "(being written)";
}

std::unique_ptr<GuestBoard> GuestBoard::create() {
  void* p = ::mmap(nullptr, kBoardBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  // Fresh anonymous memory is zero: every counter starts at 0.
  return std::unique_ptr<GuestBoard>(new GuestBoard(new (p) GuestStats{}));
}

GuestBoard::~GuestBoard() {
  if (stats_ != nullptr) ::munmap(stats_, kBoardBytes);
}

void GuestBoard::unmap_in_child() noexcept {
  if (stats_ != nullptr) ::munmap(stats_, kBoardBytes);
  stats_ = nullptr;
}

}  // namespace ivcuda::host
