// A guest's device-memory quota (--mem-limit). Every path of the worker that
// makes device memory for the guest takes a Charge first (allocations, pitch
// and stream-ordered allocations, cuMemCreate, arrays, graph memory nodes); a
// charge past the limit is refused, and the call answers
// CUDA_ERROR_OUT_OF_MEMORY without reaching the driver. A Charge gives its
// bytes back when it is destroyed, so the memory returns to the quota with
// whatever record holds it (a freed allocation, a destroyed array, a worker
// that ends). In a VM the quota is the VM's: the books live in the memory
// the supervisor shares with the VM's workers (VmShared), one counter per
// worker slot, and the supervisor zeroes a slot whose worker it reaped.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <utility>

namespace ivcuda::host {

class VmShared;
class MemQuota;
struct GuestStats;

// Bytes charged to a quota while this object lives. Move-only.
class Charge {
 public:
  Charge() = default;
  Charge(Charge&& o) noexcept : q_(std::exchange(o.q_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  Charge& operator=(Charge&& o) noexcept {
    if (this != &o) {
      release();
      q_ = std::exchange(o.q_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  Charge(const Charge&) = delete;
  Charge& operator=(const Charge&) = delete;
  ~Charge() { release(); }

  // Whether the charge was granted (a default Charge holds nothing and is not).
  explicit operator bool() const noexcept { return q_ != nullptr; }
  std::uint64_t bytes() const noexcept { return bytes_; }
  // Charges `extra` bytes more; false (and nothing changed) past the limit.
  bool grow(std::uint64_t extra) noexcept;
  // Charges `extra` bytes more even past the limit: memory the driver holds
  // already (a pool's reserve it could not give back), which the books must
  // show so that the guest's next charges are refused. False only for an
  // empty Charge or a closed quota.
  bool hold(std::uint64_t extra) noexcept;
  // Gives `n` of its bytes back (all of them at most).
  void shrink(std::uint64_t n) noexcept;
  // Takes over o's bytes (charged to the same quota): nothing is given back
  // in between, o ends empty.
  void absorb(Charge&& o) noexcept;
  void release() noexcept;

 private:
  friend class MemQuota;
  Charge(MemQuota* q, std::uint64_t bytes) noexcept : q_(q), bytes_(bytes) {}
  MemQuota* q_ = nullptr;
  std::uint64_t bytes_ = 0;
};

class MemQuota {
 public:
  MemQuota() = default;
  MemQuota(const MemQuota&) = delete;
  MemQuota& operator=(const MemQuota&) = delete;

  // limit 0: no limit (charges are still counted). vm: the VM's books, where
  // this worker is slot `slot`; null: the books are this object's own.
  // board: the guest's status board (from_worker.h), where the guest's total is
  // mirrored and whose limit, when there is one, is the limit (the daemon
  // changes it on `ivcudactl reload`); null: `limit` stays.
  void configure(std::uint64_t limit, VmShared* vm, std::uint32_t slot, GuestStats* board = nullptr) noexcept;

  // `bytes` charged to the guest, or an empty Charge when that would pass the
  // limit even after the reclaim hook gave back what it could.
  [[nodiscard]] Charge take(std::uint64_t bytes) noexcept;
  // Called once by a take() that does not fit, before it is refused: gives
  // back memory the guest holds only as a reserve (its pools' freed memory,
  // pools.cc) and says whether anything came back. Must not call take().
  void set_reclaim(std::function<bool()> f) { reclaim_ = std::move(f); }
  // What the guest holds now (all of a VM's processes), and its limit (0: none).
  std::uint64_t used() const noexcept;
  std::uint64_t limit() const noexcept;
  // The guest was evicted: what this worker holds goes back at once, nothing
  // more is granted, and the charges its records still hold are forgotten
  // (releasing them changes nothing).
  void close() noexcept;
  // The tenant's view of a device whose memory is (total, free): the quota
  // as its total, and what is left of it, never more than the device has free.
  void view(std::uint64_t* total, std::uint64_t* free) const noexcept;

 private:
  friend class Charge;
  bool add(std::uint64_t bytes, bool enforce = true) noexcept;
  void sub(std::uint64_t bytes) noexcept;

  std::function<bool()> reclaim_;
  std::uint64_t limit_ = 0;
  GuestStats* board_ = nullptr;
  bool closed_ = false;
  VmShared* vm_ = nullptr;
  std::uint32_t slot_ = 0;
  std::atomic<std::uint64_t> own_{0};
};

}  // namespace ivcuda::host
