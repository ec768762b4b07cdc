// Lock-free single-producer single-consumer ring over shared memory.
//
// Memory-ordering contract (each edge is labelled; grep the label to find
// its partner):
//
//  [R1] producer: payload writes, then store-release of RingCtl::tail.
//       pairs with [A1] consumer: load-acquire of tail, then payload reads.
//  [R2] consumer: payload reads (copy-out), then store-release of head.
//       pairs with [A2] producer: load-acquire of head, then reuse of cells.
//  [F1] consumer going to sleep: store consumer_sleeping = 1, full fence,
//       re-load tail. pairs with [F2].
//  [F2] producer after publishing: store-release tail, full fence, load
//       consumer_sleeping; ring the doorbell only if it is 1. pairs with [F1].
//       Without both fences each side could read the other's old value
//       (store->load reordering) and the consumer would sleep on a record.
//
// Each side keeps a private shadow of the index it owns and never reads it
// back from shared memory: a hostile peer may scribble on it. The index it
// reads from the peer is validated (0 <= tail - head <= cells, and it never
// moves backwards) before use; a ring that fails validation is reported
// Corrupt and never touched again by the caller.
//
// Records are variable length in 64-byte cells (see abi::RecordHeader); a
// batch of records is written against the private tail and made visible with
// one release store by publish().
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "ivcuda/shm_abi.h"

namespace ivcuda::ring {

// --- the only shared-memory accessors; everything in ring/ goes through these
template <class T>
inline T load_acquire(const T& shared) noexcept {
  return std::atomic_ref<T>(const_cast<T&>(shared)).load(std::memory_order_acquire);
}
template <class T>
inline T load_relaxed(const T& shared) noexcept {
  return std::atomic_ref<T>(const_cast<T&>(shared)).load(std::memory_order_relaxed);
}
template <class T>
inline void store_release(T& shared, T v) noexcept {
  std::atomic_ref<T>(shared).store(v, std::memory_order_release);
}
template <class T>
inline void store_relaxed(T& shared, T v) noexcept {
  std::atomic_ref<T>(shared).store(v, std::memory_order_relaxed);
}
inline void full_fence() noexcept {
#if defined(__SANITIZE_THREAD__) && defined(__GNUC__) && !defined(__clang__)
  // g++ >= 12 rejects fences under TSan (-Wtsan, an error with -Werror):
  // TSan does not model them. The fence still orders the hardware; the
  // accesses it orders ([F1]/[F2]) are all atomic, so TSan needs nothing.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wtsan"
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#pragma GCC diagnostic pop
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Where one ring lives. `cells` is a power of two; data holds cells * 64 bytes.
struct RingView {
  abi::RingCtl* ctl = nullptr;
  std::byte* data = nullptr;
  std::uint32_t cells = 0;
};

// Cells a record with `len` payload bytes occupies.
constexpr std::uint32_t record_cells(std::uint32_t len) noexcept {
  return static_cast<std::uint32_t>(
      (std::uint64_t{sizeof(abi::RecordHeader)} + len + abi::kCellBytes - 1) / abi::kCellBytes);
}

enum class RingStatus { kOk, kEmpty, kFull, kCorrupt, kTooBig };

// Rings the peer. Implementations: eventfd (process mode), UIO doorbell
// register (VM mode), a counter (tests).
class Doorbell {
 public:
  virtual ~Doorbell() = default;
  virtual void ring() noexcept = 0;
};

class Producer {
 public:
  Producer() = default;
  // Starts from the current shared tail (a fresh ring has tail == head == 0).
  Producer(RingView view, Doorbell* bell) noexcept;

  // Largest payload one record may carry (half the ring, so a record plus a
  // pad always fits in an empty ring).
  std::uint32_t max_payload() const noexcept;

  // Writes a header for a record of `len` payload bytes and returns where the
  // payload goes, or nullptr with `*st` set (kFull, kTooBig, kCorrupt).
  // The record is not visible to the consumer before commit() + publish().
  std::byte* reserve(const abi::RecordHeader& hdr, RingStatus* st) noexcept;
  // Adds the reserved record to the pending batch.
  void commit() noexcept;
  // Publishes every committed record with one release store, and rings the
  // doorbell if the consumer announced that it sleeps. Returns true if rung.
  bool publish() noexcept;

  bool corrupt() const noexcept { return corrupt_; }
  // Cells not yet known to be consumed (private tail minus last seen head).
  std::uint32_t in_flight() const noexcept { return tail_ - head_cache_; }
  // Re-reads the consumer's head; true if the ring is now empty.
  bool drained() noexcept;

 private:
  bool refresh_head() noexcept;

  RingView v_{};
  Doorbell* bell_ = nullptr;
  std::uint32_t tail_ = 0;        // private: next cell to write
  std::uint32_t published_ = 0;   // private: last tail stored to shared memory
  std::uint32_t reserved_ = 0;    // private: cells of the reserved record
  std::uint32_t head_cache_ = 0;  // private: last validated consumer head
  bool corrupt_ = false;
};

// A record copied out of shared memory. Its header and payload are private.
struct Record {
  abi::RecordHeader hdr{};
  std::span<const std::byte> payload;
};

class Consumer {
 public:
  Consumer() = default;
  Consumer(RingView view) noexcept;

  // Copies the next record out of the ring into private memory and returns
  // kOk with `*out` pointing at the copy (valid until the next poll()), or
  // kEmpty, or kCorrupt. Pads are skipped. The record stays at the head of
  // the ring (poll() returns it again) until consume().
  RingStatus poll(Record* out) noexcept;
  void consume() noexcept;
  // Makes consumed cells reusable: one release store for the batch.
  void publish_head() noexcept;

  // The sleep handshake [F1]: announce, fence, re-check. Returns true when
  // the caller may block; false when a record arrived meanwhile (the flag is
  // cleared again).
  bool prepare_sleep() noexcept;
  void end_sleep() noexcept;
  // True if a record is visible (no copy-out).
  bool has_data() noexcept;

  bool corrupt() const noexcept { return corrupt_; }

 private:
  bool refresh_tail() noexcept;

  RingView v_{};
  std::uint32_t head_ = 0;        // private: next cell to read
  std::uint32_t published_ = 0;   // private: last head stored to shared memory
  std::uint32_t tail_cache_ = 0;  // private: last validated producer tail
  std::uint32_t held_cells_ = 0;  // cells (incl. skipped pads) of the held record
  bool holding_ = false;
  bool corrupt_ = false;
  std::vector<std::byte> buf_;    // private copy of the held record
};

}  // namespace ivcuda::ring
