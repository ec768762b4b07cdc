// What crosses from a worker to the daemon's side: every structure a worker
// writes that trusted code (the daemon, a VM's supervisor: host-daemon/daemon/)
// reads. A worker parses what its guest sends and may be subverted by it, so
// each of these is read on the trusted side as a record of fixed size, copied
// before it is looked at, bounded, and never followed as a pointer, an index
// or a loop bound (docs/security.md, "Which folder holds which rules").
//
//   1. The status board (GuestStats): one page per guest connection, counters
//      and the last error, read by ivcudactl status and the metrics.
//   2. The VM's shared page (VmShared): which worker serves which channel,
//      the page-locked pool's owners and the VM's quota charges, between a
//      VM's supervisor and its workers.
//   4. The checkpointer's line (below): a fixed-size reply per request of the
//      daemon's, from the process that calls the driver's checkpointing
//      (host-daemon/daemon/suspend.h).
//   3. The broker line (broker_line): one SOCK_SEQPACKET message each way
//      between a worker and the daemon's fd broker, of the exact size its op
//      has (host-daemon/daemon/fd_broker.h keeps the daemon's side,
//      host-daemon/shared/broker_client.h the worker's).
//
// The other direction, what a worker is started with, is
// host-daemon/shared/to_worker.h.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "ivcuda/result.h"
#include "ivcuda/shm_abi.h"
#include "ring/layout.h"
#include "ring/sys.h"

namespace ivcuda::host {

// ------------------------------------------------------------ 1. the status board

// A guest's status board: what ivcudactl status and the metrics endpoint
// show about it. One page of host memory per guest connection, mapped
// MAP_SHARED|MAP_ANONYMOUS by the daemon before it forks that guest's
// process, so the connection's supervisor and workers write it and the
// daemon reads it, and nobody else has it (a guest never maps it; every
// forked process unmaps the boards of the guests served before it, as with
// tenant registries).
//
// Trust: the counters are written by the guest's own workers, which parse
// hostile input. A subverted worker can make its own numbers lie, never
// another guest's, and never the daemon's record of who the guest is (socket,
// uid, pid, GPUs: the daemon keeps those in its own memory). The daemon
// copies what it reads and bounds the one string.

// How a connection is served, as its supervisor found out.
enum class GuestMode : std::uint32_t {
  kStarting = 0,  // no CUDA process yet
  kProcess = 1,   // the CUDA program is the ivshmem peer itself
  kVm = 2,        // a QEMU VM (ivshmem-doorbell), a worker per guest process
  kPlain = 3,     // a QEMU VM over ivshmem-plain (polling)
};
const char* mode_name(GuestMode m) noexcept;

struct GuestStats {
  // Written by the daemon, read by workers.
  std::atomic<std::uint64_t> mem_limit;  // the guest's quota (0: none); `ivcudactl reload` changes it
  std::atomic<std::uint32_t> evict;      // 1: release everything, answer every call with an error
  // 1: hold every call, make none of the driver's, until it is 0 again
  // (ivcudactl suspend; host-daemon/daemon/suspend.h). The daemon sets it to
  // 0 only once the worker is running again (unlocked) or was never locked.
  std::atomic<std::uint32_t> suspend;
  // Written by the guest's supervisor and workers.
  std::atomic<std::uint32_t> mode;       // GuestMode
  std::atomic<std::uint32_t> processes;  // guest processes served now
  std::atomic<std::uint64_t> mem_used;   // device memory charged to the quota (quota.h)
  std::atomic<std::uint64_t> calls;      // requests handled
  std::atomic<std::uint64_t> copy_bytes; // bytes copied between host and device memory
  std::atomic<std::uint64_t> errors;     // calls that answered an error
  std::atomic<std::uint32_t> evicted;    // workers: the last one that released after `evict`
  std::atomic<std::uint32_t> quiet;      // workers holding their calls for `suspend` now
  // The last error a call answered: a seqlock (odd while written).
  std::atomic<std::uint32_t> error_seq;
  std::atomic<std::uint64_t> error_time_ns;  // CLOCK_REALTIME
  char last_error[96];

  // Worker side: records that `op` answered `error` (both short constant strings).
  void note_error(const char* op, const char* error) noexcept;
  // Daemon side: a recycled worker's board for its next guest (main.cc):
  // everything but the quota's limit starts from nothing.
  void reset_for_next_guest() noexcept;
  // Daemon side: the last error as text, "" when none; bounded, and
  // never torn (a writer that keeps it odd gets "(being written)").
  std::string read_last_error(std::uint64_t* time_ns) const;
};

// One guest's board: the mapping and its lifetime.
class GuestBoard {
 public:
  // A zeroed board; nullptr (logged by the caller) when mmap fails.
  static std::unique_ptr<GuestBoard> create();
  ~GuestBoard();
  GuestBoard(const GuestBoard&) = delete;
  GuestBoard& operator=(const GuestBoard&) = delete;

  GuestStats& stats() noexcept { return *stats_; }
  const GuestStats& stats() const noexcept { return *stats_; }
  // In a forked process that serves another guest: drop this mapping
  // without touching it (the object stays, owning nothing).
  void unmap_in_child() noexcept;

 private:
  explicit GuestBoard(GuestStats* s) : stats_(s) {}
  GuestStats* stats_;
};

// ------------------------------------------------------------ 2. the VM's shared page

// Host-private memory shared by a VM's supervisor and its workers: a
// MAP_SHARED mapping (a memfd named "ivcuda-vm") made before any worker
// forks. The guest never sees it. Which worker serves which channel, which
// guest process each worker serves, and who holds which pages of the
// page-locked pool (one arena shared by the VM's processes: any process of
// the VM maps the whole BAR anyway, so partitioning it would protect
// nothing).
//
// Every worker can write all of it, and a worker parses what its guest
// process sends: the supervisor, which is not sandboxed, takes no bound,
// index or lock from it (docs/security.md, "Workers per VM"). The pool's
// geometry lives in this object, which is each process's own memory (the
// workers inherit a copy when they fork); the channel owners the
// supervisor acts on are its own copies, the shared ones only compared
// against them; and nothing here is locked. Page owners are claimed by
// compare-and-swap, page by page, and tagged with the slot's epoch: a
// worker that ends leaves its pages tagged with an epoch that is no longer
// its slot's, which makes them free, so the supervisor never walks or
// writes the page table.
class VmShared {
 public:
  static constexpr std::uint32_t kMaxSlots = abi::kMaxChannels + 8;
  static constexpr std::uint64_t kPage = 4096;

  struct Slot {
    std::atomic<std::int32_t> guest_pid;     // supervisor: the guest process served (0: a spare)
    std::atomic<std::int32_t> worker_pid;    // supervisor: the worker process (0: slot free)
    std::atomic<std::uint32_t> ready;        // worker: 1 once it serves (driver and arena ready)
    std::atomic<std::uint32_t> guest_pidns;  // supervisor: that process's PID namespace (0: not said)
    std::atomic<std::uint64_t> mem;          // worker: device memory charged to the VM's quota (quota.h)
    std::atomic<std::uint32_t> epoch;        // supervisor: bumped each time the slot's worker is gone
    std::atomic<std::uint32_t> recycle;      // both: a process's end, handed between them (kRecycle*)
  };
  // Slot::recycle. The supervisor asks (its process exited); the worker that
  // finds nothing of the process's under way answers kRecycling, stops
  // serving its channels and lets go of the process's objects; the supervisor
  // then frees those channels, makes the worker a spare and writes kRecycleNone,
  // before which the worker serves nothing. A worker that does not answer in
  // time is killed (vm_supervisor.cc, Supervisor::check_recycles).
  static constexpr std::uint32_t kRecycleNone = 0, kRecycleAsked = 1, kRecycling = 2;

  // Maps and initialises the memory for layout l; nullptr on failure (errno).
  static VmShared* create(const ring::Layout& l);

  // Channel c's worker slot + 1, or 0 when no worker serves it.
  std::atomic<std::uint32_t>& owner(std::uint32_t c) noexcept { return hdr_->owner[c]; }
  // Bumped by the supervisor after every change of owners; workers rescan on change.
  std::atomic<std::uint32_t>& version() noexcept { return hdr_->version; }
  Slot& slot(std::uint32_t s) noexcept { return hdr_->slots[s]; }

  // The page-locked pool: first fit in whole pages, for worker slot s.
  std::optional<std::uint64_t> pool_allocate(std::uint64_t bytes, std::uint32_t s);
  // Frees [off, off + bytes) if slot s holds all of it.
  bool pool_free(std::uint64_t off, std::uint64_t bytes, std::uint32_t s);
  // Bytes of the pool slot s holds (for logs: never acted on).
  std::uint64_t pool_held(std::uint32_t s) const noexcept;
  // Supervisor, once slot s's worker is reaped: what it held of the pool is
  // free, and the slot's next worker tags its pages anew.
  void retire_slot(std::uint32_t s) noexcept;

  // The VM's device-memory quota (quota.h): slot s's charge grows by `bytes`
  // unless the VM's total would pass `limit` (0: no limit).
  bool mem_charge(std::uint32_t s, std::uint64_t bytes, std::uint64_t limit) noexcept;
  // Returns the bytes taken off (never more than slot s holds).
  std::uint64_t mem_uncharge(std::uint32_t s, std::uint64_t bytes) noexcept;
  std::uint64_t mem_used() noexcept;
  // A reaped worker's charge returns to the VM; returns the bytes.
  std::uint64_t mem_release_all(std::uint32_t s) noexcept;

 private:
  struct Header {
    std::atomic<std::uint32_t> version;
    std::atomic<std::uint32_t> owner[abi::kMaxChannels];
    std::atomic<std::uint64_t> mem_total;  // the VM's charge, the sum of the slots' mem
    Slot slots[kMaxSlots];
  };
  // A page's owner: (epoch << kSlotBits) | (slot + 1); 0 or any stale tag: free.
  static constexpr unsigned kSlotBits = 9;
  static_assert(kMaxSlots < (1u << kSlotBits));
  std::uint32_t tag(std::uint32_t s, std::uint32_t epoch) const noexcept {
    return (epoch << kSlotBits) | (s + 1);
  }
  bool is_free(std::uint32_t owner) const noexcept;

  VmShared() = default;
  // This process's own: where the mapping is and what it holds.
  Header* hdr_ = nullptr;
  std::atomic<std::uint32_t>* page_owner_ = nullptr;  // [pages_], after the header
  std::uint64_t pool_off_ = 0;
  std::uint64_t pages_ = 0;
  // The slots' epochs as the supervisor set them (a worker's copy is the
  // one it forked with: its own slot's is the tag of its pages).
  std::uint32_t epoch_[kMaxSlots] = {};
};

// ------------------------------------------------------------ 3. the broker line

using BrokerToken = std::array<std::uint8_t, 16>;

// A fresh random token (getrandom).
Result<BrokerToken> new_broker_token();


namespace broker_line {

// How long a worker waits for an answer on its line (the daemon sets it as
// the worker's end's socket timeouts): then its line is gone.
inline constexpr std::chrono::seconds kAnswerTimeout{5};

enum : std::uint32_t { kDeposit = 1, kFetch = 2, kNewLine = 3, kPublish = 4, kLookup = 5, kWithdraw = 6 };

// One message each way, of the exact size its op has. A deposit request and
// a successful fetch or new-line answer carry one fd; nothing else does.
struct Msg {  // kDeposit, kFetch, kNewLine
  std::uint32_t op = 0;
  std::uint32_t status = 0;  // answers: 0 or an errno value
  BrokerToken token{};
  std::uint64_t value = 0;
};
static_assert(sizeof(Msg) == 32);

struct ShareMsg {  // kPublish, kLookup, kWithdraw (tenant_share.h)
  std::uint32_t op = 0;
  std::uint32_t status = 0;
  std::uint32_t kind = 0;
  std::uint32_t slot = 0;  // the ticket; kWithdraw's answer: 1 if there was an entry
  std::uint64_t token[2] = {0, 0};
  std::uint32_t owner_proc = 0;
  std::uint32_t mine = 0;  // kLookup's answer
  std::uint64_t key = 0, base = 0, size = 0, aux = 0;
  std::byte payload[64] = {};
};
static_assert(sizeof(ShareMsg) == 136);
constexpr std::size_t kMaxMsg = sizeof(ShareMsg);

// Sends one message (and an fd, when fd >= 0); its size is the message's.
Result<void> send_packet(int sock, const void* p, std::size_t n, int fd, int flags);
// Receives one message of at most `cap` bytes and the fd it carries, if any.
// A longer message, more than one fd, or cut control data is EPROTO (any fds
// that came with it are closed).
Result<std::pair<std::size_t, sys::UniqueFd>> recv_packet(int sock, void* buf, std::size_t cap);
// A ShareKind a message may name (ShareKind::kFree is none).
bool valid_kind(std::uint32_t k);

}  // namespace broker_line

// ------------------------------------------------------------ 4. the checkpointer's line

enum class CheckpointOp : std::uint32_t {
  kSuspend = 1,  // lock (timeout_ms), checkpoint; a failed checkpoint is unlocked again
  kResume = 2,   // restore, unlock; a failed restore leaves it checkpointed
  // Running again from whatever state an earlier checkpointer left it in
  // (restore if checkpointed, unlock if locked): after one ended mid-request.
  kRecover = 3,
};

// Which step answered `result` (kDone: every step succeeded).
enum class CheckpointStep : std::uint32_t {
  kDone = 0,
  kLock = 1,
  kCheckpoint = 2,
  kRestore = 3,
  kUnlock = 4,
  kState = 5,  // cuCheckpointProcessGetState (kRecover)
};
const char* step_name(CheckpointStep s) noexcept;

struct CheckpointRequest {
  CheckpointOp op;
  std::int32_t pid;
  std::uint32_t timeout_ms;  // the lock's: calls under way that do not end by then fail it
  std::uint32_t pad = 0;
};

// Read by the daemon as a record of this size; result_name is bounded by
// the daemon before it is used.
struct CheckpointReply {
  std::int32_t pid;
  CheckpointOp op;
  CheckpointStep step;
  std::int32_t result;  // CUresult
  std::int32_t state;   // CUprocessState after it, or -1 when unknown
  std::int32_t found;   // kRecover: the CUprocessState it found, or -1 when unknown
  double first_ms;   // lock, or restore
  double second_ms;  // checkpoint, or unlock
  char result_name[48];
};

// The checkpointer's driver side (host-daemon/worker/checkpointer.cc).
const char* step_name(CheckpointStep s) noexcept;

}  // namespace ivcuda::host
