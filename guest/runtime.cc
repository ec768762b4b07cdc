#include "guest/runtime.h"

#include "guest/call_stats.h"
#include "guest/graphs.h"
#include "guest/managed.h"
#include "guest/reply.h"
#include "guest/stage_trace.h"
#include "guest/unsupported.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <type_traits>

#include "ring/ivshmem.h"

namespace ivcuda::guest {

namespace {
constexpr const char* kDefaultSocket = "/run/ivcuda/ivcudad.sock";

Runtime* g_runtime = nullptr;
std::once_flag g_once;
CUresult g_init_status = CUDA_ERROR_NOT_INITIALIZED;
}  // namespace

namespace {
// This process's PID namespace, as the guest kernel names it: the inode
// number of /proc/self/ns/pid, which the ivcuda driver reports with the
// process's exit (task_active_pid_ns()->ns.inum). In a VM, two containers'
// processes with the same pid are then two processes to the host, each with
// a worker of its own. 0 without /proc: the host then tells processes apart
// by pid alone. A process's own namespace never changes (unshare and setns
// move only its children).
std::uint32_t own_pidns() noexcept {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<std::uint32_t>(st.st_ino);
}

// printf-style, as its callers are: clang's -Wformat-nonliteral (of -Wformat=2) then checks their
// format strings instead of refusing this one's.
__attribute__((format(printf, 1, 0))) void vlog(const char* fmt, va_list ap) noexcept {
  char msg[512];
  std::vsnprintf(msg, sizeof msg, fmt, ap);
  std::fprintf(stderr, "ivcuda: %s\n", msg);  // one write per line
}
}  // namespace

void log_line(const char* fmt, ...) noexcept {
  va_list ap;
  va_start(ap, fmt);
  vlog(fmt, ap);
  va_end(ap);
}

void log_once(const char* key, const char* fmt, ...) noexcept {
  // Never destroyed: logging must work from atexit handlers too.
  static auto* mu = new std::mutex;
  static auto* seen = new std::set<std::string>;
  {
    std::lock_guard lk(*mu);
    if (!seen->insert(key).second) return;
  }
  va_list ap;
  va_start(ap, fmt);
  vlog(fmt, ap);
  va_end(ap);
}

CUstreamCaptureMode& thread_capture_mode() noexcept {
  thread_local CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  return mode;
}

CUresult not_supported(const char* fmt, ...) noexcept {
  char line[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  log_once(line, "%s", line);
  note_unsupported(line);
  return CUDA_ERROR_NOT_SUPPORTED;
}

CtxStack& ctx_stack() noexcept {
  static_assert(std::is_trivially_destructible_v<CtxStack>);
  thread_local CtxStack s{};
  return s;
}

// ------------------------------------------------------------------ channel

// One claimed channel: the thread's private end of a request ring and a
// completion ring. Shared only as an overflow channel, under its mutex.
class Channel {
 public:
  Channel(Runtime& rt, std::uint32_t index) : rt_(rt), index_(index) {
    std::byte* bar = rt.bar();
    const auto& l = rt.layout_;
    auto* d = ring::channel_desc(bar, l, index);
    vector_ = index % static_cast<std::uint32_t>(rt.vectors_);
    ring::store_relaxed(d->guest_vector, vector_);
    ring::store_relaxed(d->guest_owner, (std::uint64_t{static_cast<std::uint32_t>(::getpid())} << 32) |
                                            static_cast<std::uint32_t>(::syscall(SYS_gettid)));
    ring::store_relaxed(d->guest_pidns, own_pidns());
    // A new claim: in a VM the host gives the channel to this process's
    // worker (the release of the mask bit below publishes both).
    ring::store_relaxed(d->guest_claim, ring::load_relaxed(d->guest_claim) + 1);
    waiter_ = rt.make_waiter(vector_);
    req_ = ring::Producer(ring::request_ring(bar, l, index), rt.host_bell_.get());
    cpl_ = ring::Consumer(ring::completion_ring(bar, l, index));
    // Make the channel visible to the host; pairs with the host's acquire
    // load of the mask in attach_channels().
    auto* sb = ring::superblock(bar);
    std::atomic_ref<std::uint64_t>(sb->active_mask[index / 64])
        .fetch_or(1ull << (index % 64), std::memory_order_release);
  }

  std::uint32_t index() const noexcept { return index_; }
  std::mutex mu;
  // The capture mode the host holds for this channel (guarded by mu).
  CUstreamCaptureMode capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

  CUresult exchange(proto::Op op, const void* req, std::size_t req_size, std::span<const std::byte> tail,
                    void* rep, std::size_t rep_size, std::vector<std::byte>* extra, bool wait,
                    std::uint16_t post_flags) {
    // post_flags: kRecReportTaken, kRecHostPolled (posted requests only);
    // kRecUnordered (calls only: Runtime::query).
    const bool report_taken = !wait && (post_flags & abi::kRecReportTaken) != 0;
    abi::RecordHeader h{};
    h.op = static_cast<std::uint16_t>(op);
    const bool traced = wait && (post_flags & abi::kRecTraceStages) != 0;
    h.flags = wait ? static_cast<std::uint16_t>(abi::kRecNeedsReply |
                                                (post_flags & (abi::kRecUnordered | abi::kRecTraceStages)))
                   : post_flags;
    h.len = static_cast<std::uint32_t>(req_size + tail.size());
    auto* sb = ring::superblock(rt_.bar());
    // The ticket orders this call after every call that returned before it
    // in any thread of this guest (the host merges channels by ticket).
    h.seq = static_cast<std::uint32_t>(
        std::atomic_ref<std::uint64_t>(sb->next_ticket).fetch_add(1, std::memory_order_acq_rel));
    if (req_size + tail.size() > req_.max_payload()) return CUDA_ERROR_INVALID_VALUE;
    if (traced) h.status = static_cast<std::int32_t>(stage_trace::wrote());
    ring::RingStatus st;
    std::byte* p;
    for (unsigned spins = 0; (p = req_.reserve(h, &st)) == nullptr; ++spins) {
      if (st != ring::RingStatus::kFull) {
        rt_.mark_dead("request ring is corrupt");
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
      }
      // The host is behind on posted work: give it time, notice if it died.
      if (spins > 1000) {
        ::usleep(50);
        if ((spins & 1023) == 0 && host_gone()) return CUDA_ERROR_DEVICE_UNAVAILABLE;
      } else {
        ring::cpu_relax();
      }
    }
    std::memcpy(p, req, req_size);
    if (!tail.empty()) std::memcpy(p + req_size, tail.data(), tail.size());
    req_.commit();
    if (!req_.publish() && first_) {
      // A fresh channel: the host may be asleep without knowing of it yet.
      rt_.host_bell_->ring();
    }
    first_ = false;
    if (report_taken) return await_taken();
    if (!wait) return CUDA_SUCCESS;
    if (traced) stage_trace::posted();
    return await(h.seq, rep, rep_size, extra, waits_for_gpu(op), traced);
  }

 private:
  bool host_gone() {
    // In a VM each process has a worker of its own, which can die alone.
    const std::uint64_t lost = ring::load_acquire(ring::channel_desc(rt_.bar(), rt_.layout_, index_)->host_lost);
    if (lost != 0) {
      rt_.mark_dead(lost == abi::kHostLostRefused
                        ? "ivcudad serves no more processes of this VM (its --max-workers-per-guest or "
                          "--max-guests-per-uid)"
                        : "the worker serving this process is gone");
      return true;
    }
    return rt_.host_gone();
  }

  // Calls that wait for the GPU: like the native driver's default scheduling
  // (spin, yielding, while there are cores), a waiting thread keeps polling
  // for the reply rather than sleeping on the doorbell, so the end of a long
  // kernel is seen at once; past IVCUDA_SYNC_SPIN_US (20 ms) it sleeps.
  static bool waits_for_gpu(proto::Op op) {
    return op == proto::Op::kCtxSynchronize || op == proto::Op::kStreamSynchronize ||
           op == proto::Op::kEventSynchronize;
  }
  static std::chrono::microseconds sync_spin() {
    static const std::chrono::microseconds us = [] {
      const char* e = std::getenv("IVCUDA_SYNC_SPIN_US");
      return std::chrono::microseconds(e != nullptr && *e != '\0' ? std::strtoul(e, nullptr, 10) : 20000);
    }();
    return us;
  }

  // Until the host has taken everything this channel posted: its ring head
  // reaches our tail (the host publishes it at once after a record marked
  // kRecReportTaken). The host takes a record within microseconds while it
  // runs. One that is held up in the driver for longer than kTakenWait (a
  // launch queue that is full, behind the very kernel that waits for us) is
  // not waited for further: the call returns as a posted one does. A host
  // that is gone is noticed as in await().
  static constexpr std::chrono::milliseconds kTakenWait{50};
  CUresult await_taken() {
    const auto t0 = std::chrono::steady_clock::now();
    for (unsigned polls = 1;; ++polls) {
      if (req_.drained()) return CUDA_SUCCESS;
      if (req_.corrupt()) {
        rt_.mark_dead("request ring is corrupt");
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
      }
      if ((polls & 255) == 0) {
        if (host_gone()) return CUDA_ERROR_DEVICE_UNAVAILABLE;
        if (std::chrono::steady_clock::now() - t0 > kTakenWait) return CUDA_SUCCESS;
      }
      // The worker may share this core: yield after a short spin, and sleep
      // a little once it has been busy for long (a copy ahead of us).
      if (polls < 64) ring::cpu_relax();
      else if (polls < 4096) ::sched_yield();
      else ::usleep(20);
    }
  }

  CUresult await(std::uint32_t seq, void* rep, std::size_t rep_size, std::vector<std::byte>* extra,
                 bool long_wait, bool traced) {
    ring::SpinPolicy pol;
    pol.spin = long_wait ? std::max(sync_spin(), std::chrono::microseconds(100)) : std::chrono::microseconds(100);
    pol.yield = long_wait;
    // Yield from the start: the worker may share this core, and a thread
    // spinning without yielding would keep it from answering (measured on
    // the H200: +2 us per task yielding at once, +20 us spinning first).
    pol.yield_after = std::chrono::nanoseconds(0);
    pol.block_timeout_ms = 50;
    for (;;) {
      bool got = false;
      CUresult result = CUDA_SUCCESS;
      auto ready = [&]() -> bool {
        std::span<const std::byte> console;
        switch (take_reply(cpl_, seq, rep, rep_size, extra, &result, &console)) {
          case ReplyTake::kEmpty:
            return false;
          case ReplyTake::kCorrupt:
            rt_.mark_dead("completion ring is corrupt");
            result = CUDA_ERROR_DEVICE_UNAVAILABLE;
            return true;
          case ReplyTake::kGot:
            if (traced) stage_trace::replied();
            // Device printf output goes where the program's own printf goes
            // (stdio's stdout), so that the order matches a native run.
            if (!console.empty()) std::fwrite(console.data(), 1, console.size(), stdout);
            got = true;
            return true;
        }
        return false;
      };
      bool gone = false;
      // Whether the host is gone is asked every 1024 polls while spinning
      // (tens of microseconds) and before each sleep, not on every poll: in
      // process mode the question is a poll() system call, which took longer
      // than the answer it delayed.
      unsigned polls = 0;
      bool ask_now = false;
      ring::spin_then_block(
          [&] {
            if (ready()) return true;
            if (!ask_now && (++polls & 1023) != 0) return false;
            ask_now = false;
            return gone = host_gone();
          },
          [&](bool sleeping) {
            if (sleeping) {
              ask_now = true;
              if (!cpl_.prepare_sleep()) cpl_.end_sleep();
            } else {
              cpl_.end_sleep();
            }
          },
          *waiter_, pol);
      if (got || result != CUDA_SUCCESS) return result;
      if (gone) return CUDA_ERROR_DEVICE_UNAVAILABLE;
    }
  }

  Runtime& rt_;
  std::uint32_t index_;
  std::uint32_t vector_ = 0;
  bool first_ = true;
  std::unique_ptr<ring::Waiter> waiter_;
  ring::Producer req_;
  ring::Consumer cpl_;
};

namespace {
// The calling thread's channel. Trivially destructible: the main thread's
// channel must outlive its thread_local destructors, since atexit handlers
// still make CUDA calls. Other threads hand their channel back to the pool
// when they exit, through a pthread key (whose destructor does not run for
// a thread that calls exit()).
struct ThreadChannel {
  Channel* ch = nullptr;
  bool owned = false;  // from the pool or claimed, not the shared overflow channel
};
thread_local ThreadChannel t_channel;
pthread_key_t g_channel_key;
std::vector<std::unique_ptr<Channel>>* g_pool = nullptr;
std::mutex* g_pool_mu = nullptr;

void return_channel(void* p) {
  auto* ch = static_cast<Channel*>(p);
  if (ch == nullptr || g_pool == nullptr) return;
  std::lock_guard lk(*g_pool_mu);
  g_pool->emplace_back(ch);
}
}  // namespace

// Claims a free channel (chan_mu_ held): guest threads (and, in a VM,
// processes) coordinate through the descriptor's state word. The last channel
// is the shared overflow channel (claimed at connect).
std::unique_ptr<Channel> Runtime::claim_free_channel() {
  for (std::uint32_t c = 0; c + 1 < layout_.channels; ++c) {
    auto* d = ring::channel_desc(base_, layout_, c);
    std::uint32_t expect = abi::kChanFree;
    if (std::atomic_ref<std::uint32_t>(d->guest_state)
            .compare_exchange_strong(expect, abi::kChanClaimed, std::memory_order_acq_rel)) {
      auto ch = std::make_unique<Channel>(*this, c);
      all_channels_.push_back(ch.get());
      return ch;
    }
  }
  return nullptr;
}

Channel* Runtime::channel() {
  if (t_channel.ch != nullptr) return t_channel.ch;
  std::lock_guard lk(chan_mu_);
  std::unique_ptr<Channel> mine;
  if (!shared_.empty()) {
    mine = std::move(shared_.back());
    shared_.pop_back();
  } else {
    mine = claim_free_channel();
  }
  if (mine) {
    t_channel.ch = mine.release();
    t_channel.owned = true;
    ::pthread_setspecific(g_channel_key, t_channel.ch);
    return t_channel.ch;
  }
  if (!overflow_) return nullptr;
  log_once("overflow", "all %u channels are in use; further threads share one", layout_.channels);
  t_channel.ch = overflow_.get();
  return t_channel.ch;
}

Channel* Runtime::query_channel() {
  if (vm_mode_ || ring::load_relaxed(ring::superblock(base_)->abi_minor) < 6) return nullptr;
  std::lock_guard lk(chan_mu_);
  if (query_ch_ || query_ch_none_) return query_ch_.get();
  query_ch_ = claim_free_channel();
  query_ch_none_ = !query_ch_;  // every channel is a thread's: queries go in order
  return query_ch_.get();
}

CUresult Runtime::call_raw(proto::Op op, const void* req, std::size_t req_size, std::span<const std::byte> tail,
                           void* rep, std::size_t rep_size, std::vector<std::byte>* extra, bool wait,
                           std::uint64_t polled_ctx, std::uint64_t polled_stream, bool unordered) {
  if (dead()) return CUDA_ERROR_DEVICE_UNAVAILABLE;
  // A fork child of a VM process has none of its parent's BAR (MADV_DONTFORK):
  // CUDA does not carry over a fork either.
  if (vm_mode_ && ::getpid() != pid_) return CUDA_ERROR_NOT_INITIALIZED;
  // A stream or context the host found idle, with nothing sent since that
  // could add work, is answered here (guest/idle_streams.cc).
  const std::uint64_t epoch = work_epoch_.load(std::memory_order_acquire);
  if (wait && answer_idle(op, req, req_size, epoch)) {
    if (host_polled()) settle_host_polls(op, req, req_size);
    return CUDA_SUCCESS;
  }
  Channel* ch = unordered ? query_channel() : nullptr;
  unordered = ch != nullptr;
  if (ch == nullptr) ch = channel();
  if (ch == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard lk(ch->mu);
  // The calling thread's capture mode travels ahead of its call when the
  // channel's host side holds another (a new thread on a reused channel, a
  // thread that exchanged its mode, threads sharing the overflow channel).
  if (const CUstreamCaptureMode m = thread_capture_mode(); m != ch->capture_mode) {
    const proto::ReqCaptureMode cm{static_cast<std::uint32_t>(m), 0};
    if (const CUresult st = ch->exchange(proto::Op::kCaptureMode, &cm, sizeof cm, {}, nullptr, 0, nullptr, false, 0);
        st != CUDA_SUCCESS) {
      work_epoch_.fetch_add(1, std::memory_order_acq_rel);  // a failure: nothing is known idle any more
      return st;
    }
    ch->capture_mode = m;
  }
  // While a capture may be under way, posted work waits for its verdict:
  // CUDA answers a call that is illegal in capture (or one into an
  // invalidated capture) at once, and frameworks check right after the call.
  // Captures are set-up time, not the hot path.
  if (!wait && any_capture()) wait = true;
  // While work may be polling host memory, posted work is on the GPU before
  // the call returns (guest/host_polls.cc).
  // Work that polls host memory is marked for the host to say when it is
  // over (not in a capture: it does not run there).
  const bool polled = host_polled();
  const bool report_taken = !wait && polled;
  const bool mark = !wait && (polled_ctx != 0 || polled_stream != 0);
  std::uint16_t flags = report_taken ? abi::kRecReportTaken : 0;
  if (mark) flags |= abi::kRecHostPolled;
  if (unordered) flags |= abi::kRecUnordered;
  const bool traced = wait && stage_trace::enabled();
  if (traced) {
    flags |= abi::kRecTraceStages;
    stage_trace::begin();
  }
  CUresult st;
  if (call_stats::enabled()) {
    const auto t0 = std::chrono::steady_clock::now();
    st = ch->exchange(op, req, req_size, tail, rep, rep_size, extra, wait, flags);
    const auto dt = std::chrono::steady_clock::now() - t0;
    call_stats::record(op, wait, static_cast<std::uint64_t>(std::chrono::nanoseconds(dt).count()));
  } else {
    st = ch->exchange(op, req, req_size, tail, rep, rep_size, extra, wait, flags);
  }
  if (traced) stage_trace::end(op);
  note_after_call(op, req, req_size, epoch, st);
  if (polled && st == CUDA_SUCCESS) settle_host_polls(op, req, req_size);
  if (mark && st == CUDA_SUCCESS) note_host_polled(ch->index(), polled_ctx, polled_stream);
  if (st == CUDA_ERROR_NOT_SUPPORTED) note_unsupported(std::string("refused by the host: ") + proto::op_name(static_cast<std::uint16_t>(op)));
  return st;
}

void Runtime::mark_dead(const char* why) noexcept {
  if (!dead_.exchange(true)) log_line("lost the connection to ivcudad (%s); CUDA calls now fail", why);
}

// ------------------------------------------------------------------ connect

Runtime* Runtime::get(CUresult* st) noexcept {
  std::call_once(g_once, [] {
    auto* rt = new Runtime();
    g_pool = &rt->shared_;
    g_pool_mu = &rt->chan_mu_;
    ::pthread_key_create(&g_channel_key, return_channel);
    g_init_status = rt->connect();
    if (g_init_status == CUDA_SUCCESS) {
      g_runtime = rt;
    } else {
      // The calling thread may already hold a channel of this runtime: the
      // runtime and its channels are left alone (a few KiB), rather than
      // leaving dangling pointers behind.
      ::pthread_setspecific(g_channel_key, nullptr);
      t_channel = ThreadChannel{};
      g_pool = nullptr;
    }
  });
  *st = g_init_status;
  return g_runtime;
}

Runtime* Runtime::current() noexcept { return g_runtime; }

CUresult Runtime::connect() {
  // IVCUDA_SOCKET: process mode on that socket. Otherwise, inside a VM with
  // the ivcuda UIO device (IVCUDA_DEVICE picks one by PCI address), VM mode;
  // else process mode on the default socket.
  const char* sock = std::getenv("IVCUDA_SOCKET");
  const char* dev = std::getenv("IVCUDA_DEVICE");
  CUresult st;
  if (sock != nullptr && *sock != '\0') {
    st = connect_socket(sock);
  } else if ((dev != nullptr && *dev != '\0') || uio::find_vectors("")) {
    st = connect_uio(dev != nullptr ? dev : "");
  } else {
    st = connect_socket(kDefaultSocket);
  }
  if (st != CUDA_SUCCESS) return st;
  {
    // The last channel is shared by threads beyond the channel count.
    const std::uint32_t last = layout_.channels - 1;
    auto* d = ring::channel_desc(base_, layout_, last);
    std::uint32_t expect = abi::kChanFree;
    if (std::atomic_ref<std::uint32_t>(d->guest_state)
            .compare_exchange_strong(expect, abi::kChanClaimed, std::memory_order_acq_rel)) {
      overflow_ = std::make_unique<Channel>(*this, last);
      all_channels_.push_back(overflow_.get());
    }
  }
  proto::ReqHello h{};
  h.proto_version = proto::kProtoVersion;
  pid_ = ::getpid();
  h.pid = static_cast<std::uint32_t>(::getpid());
  h.ppid = static_cast<std::uint32_t>(::getppid());
  h.pidns = own_pidns();
  st = call<proto::Op::kHello>(h, {}, &hello_);
  if (st != CUDA_SUCCESS) {
    log_line("ivcudad refused this library (protocol %u): CUresult %d", proto::kProtoVersion, st);
    return st;
  }
  devs_.resize(hello_.device_count);
  map_identity_alias();
  st = apply_visible_devices();
  if (st != CUDA_SUCCESS) return st;
  // In a VM the channels stay this process's until it has exited: calls
  // made at exit (cudart's and the libraries' teardown) still need them. The
  // guest's kernel driver tells the host when the process is gone, and the
  // host frees the channels then (host-daemon/daemon/vm_supervisor.h).
  return CUDA_SUCCESS;
}

CUresult Runtime::connect_socket(const std::string& path) {
  // ivcudad formats the memory before it greets, and the superblock says how
  // many doorbell vectors it gives each peer (its --vectors).
  auto vectors_of = [](int shm_fd) -> Result<std::size_t> {
    IVCUDA_TRY_ASSIGN(auto m, sys::Mapping::map_shared(shm_fd, sizeof(abi::Superblock)));
    const auto* sb = ring::superblock(m.data());
    if (ring::load_acquire(sb->host_state) != abi::kHostReady || ring::load_relaxed(sb->magic) != abi::kMagic)
      return make_error(EPROTO, "the shared memory is not an ivcuda BAR");
    return static_cast<std::size_t>(ring::load_relaxed(sb->host_vectors));
  };
  auto client = ivshmem::ivshmem_connect(path, std::chrono::milliseconds(5000), 0, vectors_of);
  if (!client) {
    log_line("cannot reach ivcudad at %s: %s (set IVCUDA_SOCKET)", path.c_str(), client.error().what.c_str());
    return CUDA_ERROR_NO_DEVICE;
  }
  // The daemon is whichever peer the superblock names: ivcudad's own server
  // says 0; an ivcudad that joined somebody else's ivshmem-server has an id
  // of its own there.
  std::int64_t host_id = ivshmem::kHostPeerId;
  {
    auto m = sys::Mapping::map_shared(client->shm_fd(), sizeof(abi::Superblock));
    if (m) host_id = ring::load_relaxed(ring::superblock(m->data())->host_peer_id);
  }
  auto& peers = client->peers();
  auto host = peers.find(host_id);
  if (host == peers.end() || host->second.empty() || client->own_eventfds().empty()) {
    log_line("ivcudad at %s announced no host peer", path.c_str());
    return CUDA_ERROR_NO_DEVICE;
  }
  for (const auto& fd : host->second) host_fds_.emplace_back(::dup(fd.get()));
  for (const auto& fd : client->own_eventfds()) own_fds_.emplace_back(::dup(fd.get()));
  shm_fd_.reset(::dup(client->shm_fd()));
  sock_.reset(::dup(client->socket_fd()));
  auto m = sys::Mapping::map_shared(shm_fd_.get(), client->shm_size());
  if (!m) {
    log_line("cannot map the shared memory: %s", m.error().what.c_str());
    return CUDA_ERROR_NO_DEVICE;
  }
  bar_ = std::move(m).value();
  vectors_ = own_fds_.size();
  host_bell_ = std::make_unique<ring::EventfdDoorbell>(host_fds_[abi::kHostVector].get());
  return attach_bar(bar_.data(), bar_.size());
}

namespace {
// VM mode: the guest rings the daemon's vector through the BAR0 doorbell
// register; QEMU turns the write into an eventfd signal on the host.
class UioDoorbell final : public ring::Doorbell {
 public:
  UioDoorbell(const uio::Device& d, std::uint32_t peer) : d_(d), peer_(peer) {}
  void ring() noexcept override { d_.ring(peer_, abi::kHostVector); }

 private:
  const uio::Device& d_;
  std::uint32_t peer_;
};

// Each channel opens its vector's /dev/uioN itself: UIO keeps the event
// count per open file, so threads sharing a vector do not eat each other's
// wake-ups.
// The VM's device files this process holds open, so that a fork child can
// let go of them (uio_forget_in_child): the guest's kernel driver reports a
// process's exit to the host when its last device file closes, and a fork
// child must not keep its parent's open.
constexpr int kUioFdSlots = 512;
std::atomic<int> g_uio_fds[kUioFdSlots];
void uio_fd_track(int fd, bool add) {
  for (auto& slot : g_uio_fds) {
    int expect = add ? 0 : fd + 1;
    if (slot.compare_exchange_strong(expect, add ? fd + 1 : 0)) return;
  }
}
// pthread_atfork child handler (async-signal-safe calls only): the numbers
// stay taken (by /dev/null), so the owners' later close() closes nothing else.
void uio_forget_in_child() {
  const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null < 0) return;
  for (auto& slot : g_uio_fds)
    if (const int v = slot.load(); v > 0) ::dup3(null, v - 1, O_CLOEXEC);
  ::close(null);
}

class UioWaiter final : public ring::Waiter {
 public:
  explicit UioWaiter(sys::UniqueFd fd) : fd_(std::move(fd)) {
    if (fd_.valid()) uio_fd_track(fd_.get(), true);
  }
  ~UioWaiter() override {
    if (fd_.valid()) uio_fd_track(fd_.get(), false);
  }
  UioWaiter(const UioWaiter&) = delete;
  UioWaiter& operator=(const UioWaiter&) = delete;
  void wait(int timeout_ms) noexcept override {
    if (!sys::wait_readable(fd_.get(), timeout_ms)) return;
    std::uint32_t count;
    if (::read(fd_.get(), &count, sizeof count) < 0) count = 0;  // EINTR/EAGAIN: the caller re-checks the ring
  }

 private:
  sys::UniqueFd fd_;
};

// ivshmem-plain has no interrupts: the daemon polls the rings, and a waiting
// guest thread naps briefly between looks.
class NoDoorbell final : public ring::Doorbell {
 public:
  void ring() noexcept override {}
};
class PollWaiter final : public ring::Waiter {
 public:
  void wait(int timeout_ms) noexcept override {
    (void)timeout_ms;
    ::usleep(50);
  }
};
}  // namespace

CUresult Runtime::connect_uio(const std::string& pci) {
  auto d = uio::open_device(pci);
  if (!d) {
    log_line("no usable ivcuda device in this VM: %s", d.error().what.c_str());
    return CUDA_ERROR_NO_DEVICE;
  }
  uio_ = std::move(d).value();
  vm_mode_ = true;
  vectors_ = uio_.vectors.size();
  // A fork child gets neither the BAR's mappings nor our device files (see
  // uio_forget_in_child): its parent's exit is then the device's last close.
  (void)::madvise(uio_.shm.data(), uio_.shm.size(), MADV_DONTFORK);
  (void)::madvise(uio_.regs.data(), uio_.regs.size(), MADV_DONTFORK);
  static std::once_flag atfork;
  std::call_once(atfork, [] { ::pthread_atfork(nullptr, nullptr, uio_forget_in_child); });
  const CUresult st = attach_bar(uio_.shm.data(), uio_.shm.size());
  if (st != CUDA_SUCCESS) return st;
  const auto* sb = ring::superblock(base_);
  doorbells_ = (ring::load_relaxed(sb->features) & abi::kFeatDoorbell) != 0 && !uio_.vectors.empty();
  if (doorbells_)
    host_bell_ = std::make_unique<UioDoorbell>(uio_, ring::load_relaxed(sb->host_peer_id));
  else
    host_bell_ = std::make_unique<NoDoorbell>();
  return CUDA_SUCCESS;
}

CUresult Runtime::attach_bar(std::byte* base, std::size_t size) {
  auto l = ring::read_layout(base, size);
  if (!l) {
    log_line("the shared memory is not usable: %s", l.error().what.c_str());
    return CUDA_ERROR_NO_DEVICE;
  }
  base_ = base;
  layout_ = *l;
  if (vectors_ == 0) vectors_ = 1;
  // In a VM the host's page size is the hypervisor's business: the guest's
  // own page tables map the BAR in 4 KiB pages either way.
  huge_bar_ = !vm_mode_ && (ring::load_relaxed(ring::superblock(base)->features) & abi::kFeatHugePages) != 0;
  return CUDA_SUCCESS;
}

std::unique_ptr<ring::Waiter> Runtime::make_waiter(std::uint32_t vector) {
  if (vm_mode_ && !doorbells_) return std::make_unique<PollWaiter>();
  if (vm_mode_) {
    const std::string node = "/dev/uio" + std::to_string(uio_.vectors[vector].minor);
    sys::UniqueFd fd(::open(node.c_str(), O_RDWR | O_CLOEXEC));
    return std::make_unique<UioWaiter>(std::move(fd));
  }
  return std::make_unique<ring::EventfdWaiter>(own_fds_[vector].get());
}

bool Runtime::send_fd(std::int64_t value, int fd) noexcept {
  return sock_.valid() && !vm_mode_ && ivshmem::send_msg(sock_.get(), value, fd).ok();
}

bool Runtime::host_gone() noexcept {
  if (dead()) return true;
  if (sock_.valid()) {
    pollfd p{sock_.get(), POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
      mark_dead("the daemon closed the connection");
      return true;
    }
    return false;
  }
  // VM mode: nothing tells the guest that the daemon died, but a live worker
  // bumps its heartbeat at least every 100 ms.
  const auto hb = ring::load_relaxed(ring::superblock(base_)->host_heartbeat);
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lk(heartbeat_mu_);
  if (hb != last_heartbeat_ || heartbeat_seen_ == std::chrono::steady_clock::time_point{}) {
    last_heartbeat_ = hb;
    heartbeat_seen_ = now;
    return false;
  }
  if (now - heartbeat_seen_ > std::chrono::seconds(5)) {
    mark_dead("the daemon stopped answering");
    return true;
  }
  return false;
}

const proto::RepDeviceInfo* Runtime::worker_device(int w, CUresult* st) {
  if (w < 0 || w >= static_cast<int>(devs_.size())) {
    *st = CUDA_ERROR_INVALID_DEVICE;
    return nullptr;
  }
  std::lock_guard lk(dev_mu_);
  auto& slot = devs_[static_cast<std::size_t>(w)];
  if (!slot) {
    auto info = std::make_unique<proto::RepDeviceInfo>();
    *st = call<proto::Op::kDeviceInfo>(proto::ReqDevice{w, 0}, {}, info.get());
    if (*st != CUDA_SUCCESS) return nullptr;
    managed::device_attributes(info.get());  // managed memory is the guest's own (guest/managed.cc)
    slot = std::move(info);
  }
  *st = CUDA_SUCCESS;
  return slot.get();
}

const proto::RepDeviceInfo* Runtime::device(int ordinal, CUresult* st) {
  const proto::RepDeviceInfo* info = worker_device(to_worker(ordinal), st);
  if (info != nullptr) {
    std::lock_guard bk(books_mu);
    ctx_device[info->primary_ctx] = ordinal;
  }
  return info;
}

namespace {
std::string uuid_text(const std::uint8_t* u) {
  char s[64];
  std::snprintf(s, sizeof s,
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
                u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  return s;
}
}  // namespace

// CUDA_VISIBLE_DEVICES as on bare metal: indices or (prefixes of) UUIDs,
// separated by commas; the list ends at the first entry that names no
// device, names one twice, or is ambiguous. Set but empty: no devices.
CUresult Runtime::apply_visible_devices() {
  const int n = static_cast<int>(hello_.device_count);
  const char* env = std::getenv("CUDA_VISIBLE_DEVICES");
  visible_.clear();
  if (env == nullptr) {
    for (int i = 0; i < n; ++i) visible_.push_back(i);
    return CUDA_SUCCESS;
  }
  std::string list(env);
  std::size_t pos = 0;
  while (pos <= list.size()) {
    const std::size_t comma = std::min(list.find(',', pos), list.size());
    std::string tok = list.substr(pos, comma - pos);
    pos = comma + 1;
    while (!tok.empty() && tok.front() == ' ') tok.erase(tok.begin());
    while (!tok.empty() && tok.back() == ' ') tok.pop_back();
    if (tok.empty()) break;
    int found = -1;
    if (tok.find_first_not_of("0123456789") == std::string::npos) {
      const long v = tok.size() <= 4 ? std::strtol(tok.c_str(), nullptr, 10) : -1;
      if (v >= 0 && v < n) found = static_cast<int>(v);
    } else {
      std::string want = tok;
      for (auto& ch : want) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      if (want.rfind("gpu-", 0) != 0) want = "gpu-" + want;
      int matches = 0;
      for (int i = 0; i < n; ++i) {
        CUresult st;
        const auto* info = worker_device(i, &st);
        if (info == nullptr) return st;
        std::string have = uuid_text(info->uuid);
        for (auto& ch : have) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        if (have.rfind(want, 0) == 0) {
          found = i;
          ++matches;
        }
      }
      if (matches != 1) found = -1;
    }
    if (found < 0 || std::find(visible_.begin(), visible_.end(), found) != visible_.end()) break;
    visible_.push_back(found);
  }
  if (visible_.empty()) {
    log_line("CUDA_VISIBLE_DEVICES='%s' leaves no device", env);
    return CUDA_ERROR_NO_DEVICE;
  }
  return CUDA_SUCCESS;
}

// ------------------------------------------------------- device address space

namespace {
constexpr std::uint64_t kPage = 4096;
}  // namespace

// Interior pages of an allocation are its own; its first and last page may
// be shared with neighbours (allocations are not page-aligned), so those are
// reference-counted.
bool Runtime::reserve_device_range(std::uint64_t d, std::uint64_t size) {
  if (size == 0 || d + size < d) return false;
  const std::uint64_t lo = d / kPage * kPage;
  const std::uint64_t hi = (d + size + kPage - 1) / kPage * kPage;
  std::lock_guard lk(va_mu_);
  const std::uint64_t last = hi - kPage;
  std::uint64_t from = lo, to = hi;
  if (edge_pages_.count(lo) != 0) from += kPage;
  if (last != lo && edge_pages_.count(last) != 0) to -= kPage;
  if (from < to) {
    void* want = reinterpret_cast<void*>(from);
    void* got = ::mmap(want, to - from, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
                       -1, 0);
    if (got != want) {
      if (got != MAP_FAILED) ::munmap(got, to - from);  // an old kernel took it as a hint
      return false;
    }
  }
  ++edge_pages_[lo];
  if (last != lo) ++edge_pages_[last];
  return true;
}

void Runtime::release_device_range(std::uint64_t d, std::uint64_t size) {
  if (size == 0 || d + size < d) return;
  const std::uint64_t lo = d / kPage * kPage;
  const std::uint64_t hi = (d + size + kPage - 1) / kPage * kPage;
  const std::uint64_t last = hi - kPage;
  std::lock_guard lk(va_mu_);
  auto drop = [&](std::uint64_t page) {
    auto it = edge_pages_.find(page);
    if (it == edge_pages_.end()) return false;  // never reserved
    if (--it->second != 0) return false;
    edge_pages_.erase(it);
    return true;
  };
  const bool first_free = drop(lo);
  const bool last_free = last != lo && drop(last);
  if (last > lo + kPage) ::munmap(reinterpret_cast<void*>(lo + kPage), last - lo - kPage);
  if (first_free) ::munmap(reinterpret_cast<void*>(lo), kPage);
  if (last_free) ::munmap(reinterpret_cast<void*>(last), kPage);
}

// ------------------------------------------------------------------ arena

int Runtime::map_arena_at(void* va, std::uint64_t arena_off, std::size_t len) noexcept {
  const std::size_t bar_size = vm_mode_ ? uio_.shm.size() : bar_.size();
  if (len == 0 || len % kPage != 0 || arena_off % kPage != 0 || reinterpret_cast<std::uintptr_t>(va) % kPage != 0 ||
      len > bar_size || arena_off > bar_size - len)
    return EINVAL;
  if (!vm_mode_) {
    // Process mode: the BAR is the daemon's memfd, mappable at any offset.
    void* got = ::mmap(va, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, shm_fd_.get(),
                       static_cast<off_t>(arena_off));
    return got == MAP_FAILED ? errno : 0;
  }
  // VM mode: a UIO mmap offset selects a map (BAR2 is map 1), not a byte
  // offset, so map BAR2 from its start through the piece wanted, drop the
  // head and move the piece onto `va`. mremap may move a PFN mapping as long
  // as it does not grow it.
  if (uio_.vectors.empty()) return ENODEV;
  char node[32];
  std::snprintf(node, sizeof node, "/dev/uio%u", uio_.vectors[0].minor);
  const int fd = ::open(node, O_RDWR | O_CLOEXEC);
  if (fd < 0) return errno;
  const std::size_t whole = static_cast<std::size_t>(arena_off) + len;  // <= bar_size, checked above
  void* tmp = ::mmap(nullptr, whole, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(kPage));
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the device open
  if (tmp == MAP_FAILED) return map_err;
  auto* piece = static_cast<std::byte*>(tmp) + arena_off;
  if (arena_off != 0) ::munmap(tmp, static_cast<std::size_t>(arena_off));
  if (::mremap(piece, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, va) == MAP_FAILED) {
    const int err = errno;
    ::munmap(piece, len);
    return err;
  }
  return 0;
}

// The arena a second time, at the address the host's GPU sees it at. The
// place is the worker's and random; if this process has anything there, the
// alias is skipped and page-locked pointers stay BAR addresses (their device
// pointers then differ, which CUDA allows only without unified addressing).
void Runtime::map_identity_alias() noexcept {
  if (huge_bar_) return;  // no piece of a BAR on 2 MiB pages maps elsewhere
  const std::uint64_t dev = hello_.arena_device_base;
  if (dev == 0 || dev % kPage != 0 || layout_.arena_size == 0 || dev + layout_.arena_off < dev) return;
  void* want = reinterpret_cast<void*>(dev + layout_.arena_off);
  void* got = ::mmap(want, layout_.arena_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
                     -1, 0);
  if (got != want) {
    if (got != MAP_FAILED) ::munmap(got, layout_.arena_size);  // an old kernel took it as a hint
    return;
  }
  // The reservation is ours: map_arena_at replaces it in one step.
  if (map_arena_at(want, layout_.arena_off, layout_.arena_size) != 0) {
    ::munmap(want, layout_.arena_size);
    return;
  }
  alias_ = reinterpret_cast<std::byte*>(dev);
  if (vm_mode_) (void)::madvise(want, layout_.arena_size, MADV_DONTFORK);
}

bool Runtime::in_bar(std::uintptr_t p, std::uint64_t n) const noexcept {
  const auto touches = [&](const std::byte* b, std::uint64_t lo, std::uint64_t size) {
    const auto start = reinterpret_cast<std::uintptr_t>(b) + lo;
    return b != nullptr && p < start + size && p + n > start;
  };
  return touches(base_, 0, layout_.shm_size) || touches(alias_, layout_.arena_off, layout_.arena_size);
}

std::uint64_t Runtime::staging_off() {
  Channel* ch = channel();
  return ring::staging_off(layout_, ch == nullptr ? 0 : ch->index());
}

std::optional<std::uint64_t> Runtime::pinned_offset(const void* p, std::size_t n) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lk(pinned_mu_);
  auto it = pinned_.upper_bound(a);
  if (it == pinned_.begin()) return std::nullopt;
  --it;
  if (a - it->first > it->second.size || n > it->second.size - (a - it->first)) return std::nullopt;
  return it->second.arena_off + (a - it->first);
}

std::optional<PinnedBlock> Runtime::pinned_block(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lk(pinned_mu_);
  auto it = pinned_.upper_bound(a);
  if (it == pinned_.begin()) return std::nullopt;
  --it;
  if (a - it->first >= it->second.size) return std::nullopt;
  return it->second;
}

void Runtime::add_pinned(void* p, PinnedBlock b) {
  std::lock_guard lk(pinned_mu_);
  pinned_[reinterpret_cast<std::uintptr_t>(p)] = b;
}

std::optional<PinnedBlock> Runtime::take_pinned(void* p) {
  std::lock_guard lk(pinned_mu_);
  auto it = pinned_.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == pinned_.end()) return std::nullopt;
  PinnedBlock b = it->second;
  pinned_.erase(it);
  return b;
}

}  // namespace ivcuda::guest
