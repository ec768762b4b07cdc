// The guest side of the transport: one connection per process, one channel
// per thread, and typed calls over the ring.
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ivcuda/proto.h"
#include "ring/layout.h"
#include "ring/spsc_ring.h"
#include "ring/sys.h"
#include "ring/uio.h"
#include "ring/wait.h"

namespace ivcuda::guest {

// An IVCUDA_* switch that is on unless the environment says "off" (the
// answers the guest gives itself: IVCUDA_HOST_POLLS, IVCUDA_IDLE_ANSWERS,
// IVCUDA_FUNC_ATTR_ANSWERS). Each caller keeps the answer in a static.
inline bool switched_on(const char* name) {
  const char* e = std::getenv(name);
  return e == nullptr || std::string_view(e) != "off";
}

// What the guest knows of a kernel: how to pack its arguments, and the
// attributes that cannot change once it is loaded (guest/modules.cc,
// cuFuncGetAttribute), as the driver first answered them.
struct FuncInfo {
  std::vector<proto::ParamSlot> params;
  std::uint32_t param_bytes = 0;
  static constexpr int kFixedAttrs = CU_FUNC_ATTRIBUTE_CACHE_MODE_CA + 1;  // 0..7
  std::array<int, kFixedAttrs> fixed_attr{};
  std::uint32_t fixed_known = 0;  // bit a: fixed_attr[a] holds the driver's answer
};

struct PinnedBlock {
  std::uint64_t arena_off = 0;
  std::uint64_t size = 0;
  unsigned flags = 0;
};

class Channel;

class Runtime {
 public:
  // The process-wide runtime, connected on first use. nullptr (with `*st`
  // set) when the daemon cannot be reached.
  static Runtime* get(CUresult* st) noexcept;
  // Already connected (cuInit succeeded), else nullptr.
  static Runtime* current() noexcept;

  // Sends a request and waits for its reply. rep/extra may be null.
  template <proto::Op op>
  CUresult call(const typename proto::OpTraits<op>::Request& req, std::span<const std::byte> tail = {},
                typename proto::OpTraits<op>::Reply* rep = nullptr, std::vector<std::byte>* extra = nullptr) {
    return call_raw(op, &req, sizeof req, tail, rep, rep ? sizeof *rep : 0, extra, true);
  }
  // A query that depends on no work posted before it (abi::kRecUnordered):
  // sent on a channel of its own, so that the host may answer it ahead of
  // what this process posted, as the driver answers it (cuMemGetInfo).
  template <proto::Op op>
  CUresult query(const typename proto::OpTraits<op>::Request& req, typename proto::OpTraits<op>::Reply* rep) {
    return call_raw(op, &req, sizeof req, {}, rep, sizeof *rep, nullptr, true, 0, 0, true);
  }
  // Posts a request that gets no reply (asynchronous CUDA work).
  template <proto::Op op>
  CUresult post(const typename proto::OpTraits<op>::Request& req, std::span<const std::byte> tail = {}) {
    return call_raw(op, &req, sizeof req, tail, nullptr, 0, nullptr, false);
  }
  // Posts work that may poll page-locked memory (guest/host_polls.cc): the
  // host says when it is over; until then, and until it is known to be over
  // otherwise, posted calls wait to be taken.
  template <proto::Op op>
  CUresult post_host_polled(std::uint64_t ctx, std::uint64_t stream, const typename proto::OpTraits<op>::Request& req,
                            std::span<const std::byte> tail = {}) {
    return call_raw(op, &req, sizeof req, tail, nullptr, 0, nullptr, false, ctx, stream);
  }

  const proto::RepHello& hello() const noexcept { return hello_; }
  // Cached device info (fetched once per device).
  const proto::RepDeviceInfo* device(int ordinal, CUresult* st);
  // Devices as the application sees them: the ones the daemon granted,
  // filtered and ordered by CUDA_VISIBLE_DEVICES, numbered from 0.
  int device_count() const noexcept { return static_cast<int>(visible_.size()); }
  // The daemon's ordinal of an application ordinal, or -1.
  int to_worker(int app_ordinal) const noexcept {
    return app_ordinal >= 0 && app_ordinal < device_count() ? visible_[static_cast<std::size_t>(app_ordinal)] : -1;
  }

  // Arena helpers.
  std::byte* arena_base() const noexcept { return base_ + layout_.arena_off; }
  std::byte* bar() const noexcept { return base_; }
  // Where page-locked memory is handed out: BAR offset `off` of the arena
  // is at pinned_base() + off. When the arena could be mapped a second time
  // at its device address (map_identity_alias), a page-locked pointer is its
  // own device pointer, as unified addressing promises (XLA memsets and
  // launches on cuMemHostAlloc pointers); otherwise it is the BAR mapping.
  std::byte* pinned_base() const noexcept { return alias_ != nullptr ? alias_ : base_; }
  // True when [p, p + n) touches the BAR mapping or its arena alias.
  bool in_bar(std::uintptr_t p, std::uint64_t n) const noexcept;
  const ring::Layout& layout() const noexcept { return layout_; }
  // If [p, p+n) lies in one page-locked block, its BAR offset.
  std::optional<std::uint64_t> pinned_offset(const void* p, std::size_t n);
  void add_pinned(void* p, PinnedBlock b);
  std::optional<PinnedBlock> take_pinned(void* p);
  std::optional<PinnedBlock> pinned_block(const void* p);

  // Maps the BAR's [arena_off, arena_off + len) at the page-aligned `va`,
  // replacing whatever is mapped there in one step (MAP_FIXED semantics).
  // Allocation-free and lock-free on purpose: guest/host_register.cc calls it
  // while the registering thread is parked. Returns 0 or an errno value.
  int map_arena_at(void* va, std::uint64_t arena_off, std::size_t len) noexcept;

  // Process mode: sends `value` with `fd` to the worker over the connection
  // (guest/host_register.cc); false without one (a VM's process) or when it fails.
  bool send_fd(std::int64_t value, int fd) noexcept;

  // The calling thread's staging area (BAR offset and size).
  std::uint64_t staging_off();
  std::uint64_t staging_size() const noexcept { return layout_.staging_bytes; }

  // Local books (the host keeps its own; these answer locally and catch
  // bad handles before an asynchronous post).
  std::mutex books_mu;
  std::unordered_map<std::uint64_t, FuncInfo> funcs;       // function -> layout
  std::unordered_map<std::uint64_t, int> ctx_device;       // context -> guest ordinal
  std::unordered_map<std::uint64_t, std::uint64_t> streams;  // stream -> context
  std::unordered_map<std::uint64_t, unsigned> stream_flags;  // stream -> creation flags
  std::unordered_map<std::uint64_t, std::uint64_t> events;   // event -> context
  // Green contexts (guest/green.cc): each one's converted context, and back.
  std::unordered_map<std::uint64_t, std::uint64_t> green_ctx;  // green context -> converted context
  std::unordered_map<std::uint64_t, std::uint64_t> ctx_green;  // converted context -> green context
  std::map<std::uint64_t, std::uint64_t> dev_allocs;       // device ptr -> size
  std::set<std::uint64_t> ipc_capable;                     // cuMemAlloc'ed bases (legacy IPC capable)
  // Bases in dev_allocs that are cuMemAddressReserve'd ranges: addresses the
  // process owns, mapped or not (guest/vmm.cc).
  std::set<std::uint64_t> va_reservations;
  // Pointers this process imported from another process's pool
  // (cuMemPoolImportPointer, guest/pools.cc): cuMemFree and cuMemFreeAsync
  // of one end its import. `booked`: its range was booked for it (not when
  // the address was this process's own memory already).
  struct PoolImport {
    std::uint64_t size = 0;
    unsigned count = 0;
    bool booked = false;
  };
  std::map<std::uint64_t, PoolImport> pool_imports;
  std::map<int, int> primary_refs;                         // device -> our retain count
  std::map<int, unsigned> primary_flags;                   // device -> its primary's flags, once known

  // Keeps this process from ever placing its own memory where the device
  // range [d, d + size) lies, so that unified addressing (cuMemcpy) can tell
  // device from host pointers: the device lives in another address space.
  // False if guest memory already occupies part of the range.
  bool reserve_device_range(std::uint64_t d, std::uint64_t size);
  void release_device_range(std::uint64_t d, std::uint64_t size);

  // Work that may be polling page-locked host memory (guest/host_polls.cc).
  // A kernel given a pointer into page-locked memory, or a stream wait on
  // such memory, may spin until the CPU stores to it - NVBench's blocking
  // kernel does - and a posted request the worker has not yet taken would
  // reach the GPU after that store. While such work may still run, every
  // posted request waits until the worker has taken it (submitted it to the
  // driver) before its call returns, as a native call returns with the work
  // queued on the GPU.
  static bool wants_host_polls() noexcept;  // false under IVCUDA_HOST_POLLS=off
  bool maps_page_locked(std::uint64_t v) const noexcept;
  bool any_page_locked_word(std::span<const std::byte> params) const noexcept;
  bool host_polled() noexcept {
    return polled_count_.load(std::memory_order_acquire) != 0 && !host_polls_over();
  }

  bool dead() const noexcept { return dead_.load(std::memory_order_relaxed); }
  void mark_dead(const char* why) noexcept;
  // True when the library runs inside a VM on the ivcuda UIO device.
  bool vm_mode() const noexcept { return vm_mode_; }
  // Process mode on a BAR of 2 MiB pages (abi::kFeatHugePages): no 4 KiB
  // piece of it can be mapped elsewhere (the arena alias, registered memory).
  bool bar_on_huge_pages() const noexcept { return huge_bar_; }
  // Frees this process's channels for other processes (VM mode: the BAR is
  // shared by every process of the guest). Runs at exit.

 private:
  friend class Channel;
  Runtime() = default;
  CUresult connect();
  CUresult connect_socket(const std::string& path);
  CUresult connect_uio(const std::string& pci);
  CUresult attach_bar(std::byte* base, std::size_t size);
  void map_identity_alias() noexcept;
  std::unique_ptr<ring::Waiter> make_waiter(std::uint32_t vector);
  bool host_gone() noexcept;
  // polled_ctx / polled_stream: nonzero stream or ctx marks the request
  // abi::kRecHostPolled, work of that stream (post_host_polled).
  CUresult call_raw(proto::Op op, const void* req, std::size_t req_size, std::span<const std::byte> tail,
                    void* rep, std::size_t rep_size, std::vector<std::byte>* extra, bool wait,
                    std::uint64_t polled_ctx = 0, std::uint64_t polled_stream = 0, bool unordered = false);
  Channel* channel();
  std::unique_ptr<Channel> claim_free_channel();
  // The channel order-free queries take (query()); nullptr where there is
  // none: a VM's process, a host of minor < 6, no channel free.
  Channel* query_channel();

  // Process mode: the ivshmem-protocol connection to ivcudad.
  sys::UniqueFd sock_;
  std::vector<sys::UniqueFd> host_fds_;  // we ring the host on these
  std::vector<sys::UniqueFd> own_fds_;   // the host rings us on these
  sys::UniqueFd shm_fd_;
  sys::Mapping bar_;
  // VM mode: the ivcuda UIO device (BAR0 registers, BAR2 = the shared memory).
  bool vm_mode_ = false;
  bool doorbells_ = true;                 // false on ivshmem-plain: poll
  bool huge_bar_ = false;                 // see bar_on_huge_pages()
  uio::Device uio_;
  std::byte* base_ = nullptr;             // the BAR, either way
  std::byte* alias_ = nullptr;            // BAR offset 0 as the arena alias places it, or null
  std::size_t vectors_ = 0;
  std::unique_ptr<ring::Doorbell> host_bell_;
  std::uint64_t last_heartbeat_ = 0;
  std::chrono::steady_clock::time_point heartbeat_seen_{};
  std::mutex heartbeat_mu_;
  std::mutex va_mu_;
  std::map<std::uint64_t, unsigned> edge_pages_;  // reserved pages shared by allocations
  ring::Layout layout_;
  // Every channel this process claimed. Channels live as long as the process
  // (threads hand theirs back to the pool); this keeps them reachable when a
  // failed connect leaves the runtime behind.
  std::vector<Channel*> all_channels_;
  proto::RepHello hello_{};
  pid_t pid_ = 0;  // the process that connected
  CUresult apply_visible_devices();
  const proto::RepDeviceInfo* worker_device(int worker_ordinal, CUresult* st);
  std::mutex dev_mu_;
  std::vector<std::unique_ptr<proto::RepDeviceInfo>> devs_;  // by daemon ordinal
  std::vector<int> visible_;
  std::mutex pinned_mu_;
  std::map<std::uintptr_t, PinnedBlock> pinned_;  // guest address -> block
  std::mutex chan_mu_;
  std::vector<std::unique_ptr<Channel>> shared_;  // channels of exited threads, for reuse
  std::unique_ptr<Channel> overflow_;             // shared when all channels are taken
  std::unique_ptr<Channel> query_ch_;             // query_channel(), claimed on first use
  bool query_ch_none_ = false;                    // none could be claimed
  std::atomic<bool> dead_{false};
  // See host_polled(). Keys are (context, stream key); values the
  // generation of the stream's last host-polling work.
  void settle_host_polls(proto::Op op, const void* req, std::size_t req_size);
  void note_host_polled(std::uint32_t channel, std::uint64_t ctx, std::uint64_t stream);
  bool host_polls_over() noexcept;
  struct PolledChannel {
    std::uint64_t base = 0;    // its host_polls_done when this process first marked work on it
    std::uint64_t marked = 0;  // records marked kRecHostPolled since
  };
  std::map<std::uint32_t, PolledChannel> polled_channels_;
  std::mutex polls_mu_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint64_t> polled_;
  struct PolledEvent {
    std::pair<std::uint64_t, std::uint64_t> stream;
    std::uint64_t generation = 0;
  };
  std::unordered_map<std::uint64_t, PolledEvent> polled_events_;  // event -> what it follows
  std::uint64_t poll_generation_ = 0;
  std::atomic<std::size_t> polled_count_{0};  // polled_.size(), written under polls_mu_

  // Work known to be over (guest/idle_streams.cc; IVCUDA_IDLE_ANSWERS=off
  // turns it off): a stream or context the host last found idle, with
  // nothing sent since that could add work, is idle still, and its query or
  // synchronise is answered here. work_epoch_ moves after every request that may
  // leave work behind on the GPU (and after every failure); a stream or
  // context found idle is booked with the epoch read before its request was
  // sent, and stays idle while the epoch has not moved.
  bool answer_idle(proto::Op op, const void* req, std::size_t req_size, std::uint64_t epoch);
  void note_idle(proto::Op op, const void* req, std::size_t req_size, std::uint64_t epoch);
  void note_after_call(proto::Op op, const void* req, std::size_t req_size, std::uint64_t epoch, CUresult st);
  std::atomic<std::uint64_t> work_epoch_{0};
  std::mutex idle_mu_;
  std::uint64_t idle_epoch_ = 0;                                  // the epoch the books below hold for
  std::set<std::pair<std::uint64_t, std::uint64_t>> idle_streams_;  // (context, stream key)
  std::set<std::uint64_t> idle_ctxs_;
};

// A request's fixed part, read back from the bytes call_raw was given
// (false when they are too few).
template <class T>
bool read_request(const void* req, std::size_t size, T* out) noexcept {
  if (size < sizeof(T)) return false;
  std::memcpy(out, req, sizeof(T));
  return true;
}

// The key a stream handle is booked under: the legacy stream has two names
// (0 and CU_STREAM_LEGACY), and each thread's per-thread stream is its own.
inline std::uint64_t stream_key(std::uint64_t s) noexcept {
  if (s == reinterpret_cast<std::uint64_t>(CU_STREAM_LEGACY)) return 0;
  if (s == reinterpret_cast<std::uint64_t>(CU_STREAM_PER_THREAD)) {
    thread_local const int tag = 0;  // one address per thread, never a stream handle
    return reinterpret_cast<std::uint64_t>(&tag) | 1;
  }
  return s;
}

// Per-thread current-context stack (CUDA keeps one per thread). Trivially
// destructible on purpose: atexit handlers (cudart's among them) make CUDA
// calls after the exiting thread's thread_local destructors have run.
class CtxStack {
 public:
  static constexpr std::uint32_t kDepth = 64;
  bool empty() const noexcept { return n_ == 0; }
  std::uint64_t top() const noexcept { return n_ == 0 ? 0 : v_[n_ - 1]; }
  // False when the stack is full.
  [[nodiscard]] bool push(std::uint64_t c) noexcept {
    if (n_ == kDepth) return false;
    v_[n_++] = c;
    return true;
  }
  std::uint64_t pop() noexcept { return n_ == 0 ? 0 : v_[--n_]; }
  void set_top(std::uint64_t c) noexcept {
    if (n_ == 0) n_ = 1;
    v_[n_ - 1] = c;
  }
  void remove_all(std::uint64_t c) noexcept {
    std::uint32_t k = 0;
    for (std::uint32_t i = 0; i < n_; ++i)
      if (v_[i] != c) v_[k++] = v_[i];
    n_ = k;
  }

 private:
  std::uint64_t v_[kDepth];
  std::uint32_t n_;
};
CtxStack& ctx_stack() noexcept;
inline std::uint64_t current_ctx() noexcept { return ctx_stack().top(); }

// The bytes cuModuleLoadData reads from `image` (PTX, ELF cubin, fatbin, or
// the fatbin behind a wrapper as nvcc embeds it); empty for a null image.
// The caller vouches for the image: its headers are trusted, as the real
// driver trusts them.
std::span<const std::byte> module_image(const void* image) noexcept;

// The function a CUkernel passed as a CUfunction stands for in the current
// context (cudart passes kernels so); any other handle is returned as it is
// (library.cc).
CUfunction kernel_function(CUfunction f) noexcept;

// Log a line once per key to stderr with the "ivcuda:" prefix.
void log_once(const char* key, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));
void log_line(const char* fmt, ...) noexcept __attribute__((format(printf, 1, 2)));
// What a function answers when it refuses what it was asked: logs the line
// once, counts it for IVCUDA_LOG_UNSUPPORTED (guest/unsupported.h), returns
// CUDA_ERROR_NOT_SUPPORTED.
CUresult not_supported(const char* fmt, ...) noexcept __attribute__((format(printf, 1, 2)));
// This thread's stream-capture mode (cuThreadExchangeStreamCaptureMode); the
// runtime passes it to the host ahead of the thread's next call.
CUstreamCaptureMode& thread_capture_mode() noexcept;

}  // namespace ivcuda::guest
