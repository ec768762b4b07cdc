// The shared-memory ABI of the ivcuda BAR: the one header both the guest
// library and the host daemon compile against.
//
// Everything here lives in memory that the guest can write. The host copies
// what it needs out of it once and validates the copy; see ring/validate.h.
//
// Rules for this file (docs/shm-abi.md has the same as tables):
//  - fixed-width, standard-layout structs only: no pointers, bool or atomics;
//  - each field's comment names the side that writes it ("host", "guest");
//  - every field's offset and every struct's size is asserted below;
//  - growth goes into the reserved fields and raises kAbiMinor; an
//    incompatible change raises kAbiMajor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace ivcuda::abi {

// The cache-line size is part of the ABI: both sides lay out producer and
// consumer state on separate lines of this size, whatever the compiler thinks
// the machine's line is.
inline constexpr std::uint32_t kCacheLine = 64;

// "IVCUDA" followed by 0x00 0x01, read as a little-endian u64.
inline constexpr std::uint64_t kMagic = 0x0100414455435649ull;
inline constexpr std::uint16_t kAbiMajor = 1;
// Minor 1: ChannelDesc::staging_done (pipelined pageable copies).
// Minor 2: ChannelDesc::guest_claim and host_lost, Superblock exit notices
// (a worker per guest process in a VM).
// Minor 3: Superblock::next_ticket moved to a line of its own (line 6):
// every guest call increments it, and on line 2 it shared the line the
// worker reads on every pass (active_mask). Guests of minor 2 count at the
// old place (reserved_ticket), which nothing reads: tickets only order the
// calls of one guest library.
// Minor 4: ChannelDesc::guest_pidns and Superblock::exit_pidns: a VM's
// processes are told apart by (PID namespace, pid), so that two containers
// whose processes have the same pid get a worker each. 0 in either field
// (guests and guest kernel drivers of minor <= 3) means "namespace not said".
// Minor 5: RecordHeader flags kRecReportTaken and kRecHostPolled, and
// ChannelDesc::host_polls_done (posted work reaches the driver before the
// call returns while a kernel may be polling host memory); Superblock line 9,
// the memory view (cuMemGetInfo under a quota answered in the guest).
// Minor 6: RecordHeader flag kRecUnordered (a query the host may take ahead
// of earlier tickets).
// Minor 7: RecordHeader flag kRecTraceStages (the host times the record's
// stages; its request `status` carries the guest's time stamp).
inline constexpr std::uint16_t kAbiMinor = 7;

// Feature bits in Superblock::features (host-written).
inline constexpr std::uint64_t kFeatDoorbell = 1ull << 0;  // eventfd / MSI-X wake-ups
inline constexpr std::uint64_t kFeatArenaRegistered = 1ull << 1;  // arena is GPU-registered
// The BAR lies on 2 MiB pages (hugetlb): a process-mode guest cannot map
// 4 KiB pieces of it elsewhere (host_register.cc stages registrations).
inline constexpr std::uint64_t kFeatHugePages = 1ull << 2;

// Superblock::host_state values.
inline constexpr std::uint32_t kHostStarting = 0;
inline constexpr std::uint32_t kHostReady = 1;
inline constexpr std::uint32_t kHostStopped = 2;

inline constexpr std::uint32_t kMaxChannels = 256;
inline constexpr std::uint32_t kChannelMaskWords = kMaxChannels / 64;

// The ivshmem doorbell vector the guest rings to wake the host worker.
inline constexpr std::uint32_t kHostVector = 0;

// ---------------------------------------------------------------------------
// Superblock, at offset 0 of the BAR. One page.
// ---------------------------------------------------------------------------
struct Superblock {
  // Line 0: identity and layout, written by the host before host_state
  // becomes kHostReady and never again.
  std::uint64_t magic;               // host: kMagic
  std::uint16_t abi_major;           // host
  std::uint16_t abi_minor;           // host
  std::uint32_t cache_line;          // host: kCacheLine
  std::uint64_t features;            // host: kFeat* bits
  std::uint64_t shm_size;            // host: bytes of the whole BAR
  std::uint64_t generation;          // host: new value at every daemon start
  std::uint32_t host_peer_id;        // host: ivshmem peer id of the daemon
  std::uint32_t host_vectors;        // host: doorbell vectors the host listens on
  std::uint32_t host_state;          // host: kHost* (release-stored last)
  std::uint32_t reserved0;           // zero
  std::uint64_t reserved1;           // zero

  // Line 1: the offsets block (host-written, immutable once ready).
  std::uint64_t channel_table_off;   // host: offset of ChannelDesc[channel_count]
  std::uint32_t channel_count;       // host: <= kMaxChannels
  std::uint32_t ring_bytes;          // host: data bytes of each ring, power of two
  std::uint64_t rings_off;           // host: offset of the first channel's rings
  std::uint64_t channel_stride;      // host: bytes between two channels' rings
  std::uint64_t arena_off;           // host: offset of the bulk arena
  std::uint64_t arena_size;          // host: bytes of the arena
  std::uint64_t staging_bytes;       // host: arena bytes reserved per channel for staging
  std::uint64_t reserved2;           // zero

  // Line 2: guest-written state shared by all guest threads.
  std::uint64_t reserved_ticket;     // zero (ABI 1.2 guests' ticket counter)
  std::uint64_t active_mask[kChannelMaskWords];  // guest: bit c = channel c claimed
  std::uint64_t reserved3[3];        // zero

  // Line 3: host-written wake-up state.
  std::uint32_t host_sleeping;       // host: 1 while the worker is (about to be) asleep
  std::uint32_t reserved4;           // zero
  std::uint64_t host_heartbeat;      // host: bumped by the worker loop (liveness)
  std::uint64_t reserved5[6];        // zero

  // Lines 4-5: process exits, written by the guest's kernel driver
  // (uio-driver/): when a process that had the device open exits, the
  // driver writes its pid (as the process saw it: getpid()) into
  // exit_pid[exit_count % kExitSlots] and its PID namespace into
  // exit_pidns[] (lines 7-8) at the same index, bumps exit_count (release)
  // and rings the host. The host reclaims what that process held. Read by
  // the host only as a hint about the guest's own processes.
  std::uint32_t exit_count;          // guest kernel: notices written, free-running
  std::uint32_t reserved6;           // zero
  std::uint32_t exit_pid[30];        // guest kernel: ring of exited pids

  // Line 6: the guest's ticket counter, alone on its line (no host reads it).
  std::uint64_t next_ticket;         // guest: global request order (fetch_add)
  std::uint64_t reserved7[7];        // zero

  // Lines 7-8 (minor 4): the exited process's PID namespace, as the inode
  // number of its /proc/PID/ns/pid (what stat() of that file gives in the
  // guest), beside exit_pid[] at the same index; 0: not said.
  std::uint32_t exit_pidns[30];      // guest kernel
  std::uint64_t reserved8;           // zero

  // Line 9 (minor 5): the worker's memory view, so that cuMemGetInfo under a
  // quota is answered in the guest (process mode; a VM's workers share one
  // quota and leave it zero). A seqlock: mem_view_seq is odd while the host
  // writes the line; a reader that sees it odd or changed asks the host.
  std::uint32_t mem_view_seq;        // host
  std::uint32_t reserved9;           // zero
  std::uint64_t mem_limit;           // host: the guest's quota in bytes; 0: none (the guest asks)
  std::uint64_t mem_used;            // host: what is charged to it
  std::uint64_t mem_device_total;    // host: the device's memory, when last asked
  std::uint64_t mem_device_free;     // host: its free memory then
  std::uint64_t mem_sampled_ns;      // host: CLOCK_MONOTONIC of that question
  std::uint64_t reserved9b[2];       // zero

  std::uint8_t reserved_page[4096 - 10 * kCacheLine];  // zero; room to grow
};
inline constexpr std::uint32_t kExitSlots = 30;

// ---------------------------------------------------------------------------
// Channel descriptors, at channel_table_off: one per channel.
// ---------------------------------------------------------------------------
inline constexpr std::uint32_t kChanFree = 0;
inline constexpr std::uint32_t kChanClaimed = 1;
// ChannelDesc::host_lost: the worker died (1), or none was given (2).
inline constexpr std::uint64_t kHostLostDied = 1;
inline constexpr std::uint64_t kHostLostRefused = 2;

struct ChannelDesc {
  // Line 0: guest-written. Guest threads coordinate channel ownership here;
  // the host reads nothing from this line that it acts on except as a hint.
  std::uint32_t guest_state;         // guest: kChanFree / kChanClaimed (CAS)
  std::uint32_t guest_vector;        // guest: doorbell vector the guest waits on
  std::uint64_t guest_owner;         // guest: owner id (pid << 32 | tid); the host
                                     // gives the channel to that process's worker
  std::uint64_t guest_claim;         // guest: bumped at every claim (a new owner)
  // guest (minor 4): the owner's PID namespace (inode number of its
  // /proc/self/ns/pid; 0: not said). A VM's process is (guest_pidns, pid).
  std::uint32_t guest_pidns;
  std::uint32_t reserved0;           // zero
  std::uint64_t reserved0b[4];       // zero

  // Line 1: host-written.
  std::uint64_t staging_off;         // host: arena offset of this channel's staging
  std::uint64_t staging_size;        // host: its size in bytes
  // host: staged copies finished, counting every MemcpyHtoDArena /
  // MemcpyDtoHArena request of this channel whose arena range lies in this
  // channel's staging area. Release-stored once the chunk may be reused (HtoD:
  // its DMA is done) or read (DtoH: the data is there), failed or not.
  // Free-running; the guest compares differences only.
  std::uint64_t staging_done;
  // host: nonzero once the worker serving this channel is gone (it died),
  // or kHostLostRefused when the host will not serve the channel's process
  // (its VM has all the workers it may have); the guest stops waiting for
  // replies here (CUDA_ERROR_DEVICE_UNAVAILABLE).
  std::uint64_t host_lost;
  // host (minor 5): this channel's records marked kRecHostPolled whose work
  // is over (or was refused): release-stored, free-running, counted in the
  // order the host learns of their end. The guest compares it with the
  // number it marked (guest/host_polls.cc).
  std::uint64_t host_polls_done;
  std::uint64_t reserved1[3];        // zero
};

// ---------------------------------------------------------------------------
// Ring control. Each channel has two rings laid out back to back:
//   [RingCtl req][req data ring_bytes][RingCtl cpl][cpl data ring_bytes]
// req: guest produces, host consumes. cpl: host produces, guest consumes.
// ---------------------------------------------------------------------------
struct RingCtl {
  // Line 0: producer-written.
  std::uint32_t tail;                // producer: free-running cell index (release)
  std::uint32_t reserved0;
  std::uint64_t reserved1[7];

  // Line 1: consumer-written.
  std::uint32_t head;                // consumer: free-running cell index (release)
  std::uint32_t consumer_sleeping;   // consumer: 1 = will block; producer must ring
  std::uint64_t reserved2[7];
};

// Ring data is an array of 64-byte cells. A record starts at a cell with a
// RecordHeader and occupies ceil((sizeof(RecordHeader) + len) / 64) cells. A
// record never wraps: when it would, the producer fills the rest of the ring
// with one kOpPad record and starts again at cell 0.
inline constexpr std::uint32_t kCellBytes = kCacheLine;
inline constexpr std::uint16_t kOpPad = 0xffff;

struct RecordHeader {
  std::uint32_t len;                 // producer: payload bytes after the header
  std::uint16_t op;                  // producer: opcode (proto.h), kOpPad = skip
  std::uint16_t flags;               // producer: kRec* bits
  std::uint32_t seq;                 // producer: request ticket (cpl: echoed)
  std::int32_t status;               // cpl: CUresult; req: zero
};

inline constexpr std::uint16_t kRecNeedsReply = 1u << 0;  // req: sender waits
// req (minor 5): the sender waits, without a reply, until the host has taken
// the record (done what a posted record asks of the driver): the host
// release-stores its ring head at once after such a record, rather than at
// the end of its pass. A host of minor <= 4 publishes it at the end of the
// pass, which is later but as correct.
inline constexpr std::uint16_t kRecReportTaken = 1u << 1;
// req (minor 5), on a launch or a batch of stream memory operations: the
// work may poll page-locked memory until the CPU stores to it. The host
// counts in ChannelDesc::host_polls_done when it is over.
inline constexpr std::uint16_t kRecHostPolled = 1u << 2;
// req (minor 6), on a query that depends on no work posted before it
// (cuMemGetInfo): the host may take it ahead of records with earlier tickets,
// as the driver answers such a query without waiting for queued work. The
// guest sends it on a channel of its own, so that it is not behind its own
// posted records in one ring. A host takes it so only for the ops it knows
// to be order-free (host-daemon/worker/worker.cc, order_free); for any other
// op the flag changes nothing.
inline constexpr std::uint16_t kRecUnordered = 1u << 3;
// req (minor 7), on a record that waits for its reply, only while the guest
// traces its calls' stages (IVCUDA_TRACE_STAGES): the host times how long the
// record took to reach it, to dispatch, in its handler and to reply, and
// keeps the figures per op for the guest to ask for (proto StageTrace). The
// request's `status` then holds the low 32 bits of the guest's time-stamp
// counter taken just before it wrote the record; the host only subtracts it
// from its own (meaningful where both read one counter: process mode).
inline constexpr std::uint16_t kRecTraceStages = 1u << 4;

// ---------------------------------------------------------------------------
// Compile-time layout checks: the ABI must not move by accident.
// ---------------------------------------------------------------------------
#define IVCUDA_ABI_FIELD(T, f, off, sz)                      \
  static_assert(offsetof(T, f) == (off), #T "." #f " offset"); \
  static_assert(sizeof(T::f) == (sz), #T "." #f " size")

static_assert(std::is_standard_layout_v<Superblock>);
static_assert(std::is_trivially_copyable_v<Superblock>);
IVCUDA_ABI_FIELD(Superblock, magic, 0, 8);
IVCUDA_ABI_FIELD(Superblock, abi_major, 8, 2);
IVCUDA_ABI_FIELD(Superblock, abi_minor, 10, 2);
IVCUDA_ABI_FIELD(Superblock, cache_line, 12, 4);
IVCUDA_ABI_FIELD(Superblock, features, 16, 8);
IVCUDA_ABI_FIELD(Superblock, shm_size, 24, 8);
IVCUDA_ABI_FIELD(Superblock, generation, 32, 8);
IVCUDA_ABI_FIELD(Superblock, host_peer_id, 40, 4);
IVCUDA_ABI_FIELD(Superblock, host_vectors, 44, 4);
IVCUDA_ABI_FIELD(Superblock, host_state, 48, 4);
IVCUDA_ABI_FIELD(Superblock, reserved0, 52, 4);
IVCUDA_ABI_FIELD(Superblock, reserved1, 56, 8);
IVCUDA_ABI_FIELD(Superblock, channel_table_off, 64, 8);
IVCUDA_ABI_FIELD(Superblock, channel_count, 72, 4);
IVCUDA_ABI_FIELD(Superblock, ring_bytes, 76, 4);
IVCUDA_ABI_FIELD(Superblock, rings_off, 80, 8);
IVCUDA_ABI_FIELD(Superblock, channel_stride, 88, 8);
IVCUDA_ABI_FIELD(Superblock, arena_off, 96, 8);
IVCUDA_ABI_FIELD(Superblock, arena_size, 104, 8);
IVCUDA_ABI_FIELD(Superblock, staging_bytes, 112, 8);
IVCUDA_ABI_FIELD(Superblock, reserved2, 120, 8);
IVCUDA_ABI_FIELD(Superblock, reserved_ticket, 128, 8);
IVCUDA_ABI_FIELD(Superblock, active_mask, 136, 32);
IVCUDA_ABI_FIELD(Superblock, reserved3, 168, 24);
IVCUDA_ABI_FIELD(Superblock, host_sleeping, 192, 4);
IVCUDA_ABI_FIELD(Superblock, reserved4, 196, 4);
IVCUDA_ABI_FIELD(Superblock, host_heartbeat, 200, 8);
IVCUDA_ABI_FIELD(Superblock, reserved5, 208, 48);
IVCUDA_ABI_FIELD(Superblock, exit_count, 256, 4);
IVCUDA_ABI_FIELD(Superblock, reserved6, 260, 4);
IVCUDA_ABI_FIELD(Superblock, exit_pid, 264, 120);
IVCUDA_ABI_FIELD(Superblock, next_ticket, 384, 8);
IVCUDA_ABI_FIELD(Superblock, reserved7, 392, 56);
IVCUDA_ABI_FIELD(Superblock, exit_pidns, 448, 120);
IVCUDA_ABI_FIELD(Superblock, reserved8, 568, 8);
IVCUDA_ABI_FIELD(Superblock, mem_view_seq, 576, 4);
IVCUDA_ABI_FIELD(Superblock, mem_limit, 584, 8);
IVCUDA_ABI_FIELD(Superblock, mem_used, 592, 8);
IVCUDA_ABI_FIELD(Superblock, mem_device_total, 600, 8);
IVCUDA_ABI_FIELD(Superblock, mem_device_free, 608, 8);
IVCUDA_ABI_FIELD(Superblock, mem_sampled_ns, 616, 8);
IVCUDA_ABI_FIELD(Superblock, reserved_page, 640, 3456);
static_assert(sizeof(Superblock) == 4096);

static_assert(std::is_standard_layout_v<ChannelDesc>);
IVCUDA_ABI_FIELD(ChannelDesc, guest_state, 0, 4);
IVCUDA_ABI_FIELD(ChannelDesc, guest_vector, 4, 4);
IVCUDA_ABI_FIELD(ChannelDesc, guest_owner, 8, 8);
IVCUDA_ABI_FIELD(ChannelDesc, guest_claim, 16, 8);
IVCUDA_ABI_FIELD(ChannelDesc, guest_pidns, 24, 4);
IVCUDA_ABI_FIELD(ChannelDesc, reserved0, 28, 4);
IVCUDA_ABI_FIELD(ChannelDesc, reserved0b, 32, 32);
IVCUDA_ABI_FIELD(ChannelDesc, staging_off, 64, 8);
IVCUDA_ABI_FIELD(ChannelDesc, staging_size, 72, 8);
IVCUDA_ABI_FIELD(ChannelDesc, staging_done, 80, 8);
IVCUDA_ABI_FIELD(ChannelDesc, host_lost, 88, 8);
IVCUDA_ABI_FIELD(ChannelDesc, host_polls_done, 96, 8);
IVCUDA_ABI_FIELD(ChannelDesc, reserved1, 104, 24);
static_assert(sizeof(ChannelDesc) == 2 * kCacheLine);

static_assert(std::is_standard_layout_v<RingCtl>);
IVCUDA_ABI_FIELD(RingCtl, tail, 0, 4);
IVCUDA_ABI_FIELD(RingCtl, reserved0, 4, 4);
IVCUDA_ABI_FIELD(RingCtl, reserved1, 8, 56);
IVCUDA_ABI_FIELD(RingCtl, head, 64, 4);
IVCUDA_ABI_FIELD(RingCtl, consumer_sleeping, 68, 4);
IVCUDA_ABI_FIELD(RingCtl, reserved2, 72, 56);
static_assert(sizeof(RingCtl) == 2 * kCacheLine);

static_assert(std::is_standard_layout_v<RecordHeader>);
IVCUDA_ABI_FIELD(RecordHeader, len, 0, 4);
IVCUDA_ABI_FIELD(RecordHeader, op, 4, 2);
IVCUDA_ABI_FIELD(RecordHeader, flags, 6, 2);
IVCUDA_ABI_FIELD(RecordHeader, seq, 8, 4);
IVCUDA_ABI_FIELD(RecordHeader, status, 12, 4);
static_assert(sizeof(RecordHeader) == 16);

#undef IVCUDA_ABI_FIELD

// Bytes one channel's two rings take, given the ring data size.
constexpr std::uint64_t channel_rings_bytes(std::uint32_t ring_bytes) {
  return 2 * (sizeof(RingCtl) + std::uint64_t{ring_bytes});
}

}  // namespace ivcuda::abi
