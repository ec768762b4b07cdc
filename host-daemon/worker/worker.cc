#include "host-daemon/worker/worker.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <x86intrin.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "host-daemon/shared/context_turns.h"
#include "host-daemon/shared/from_worker.h"
#include "host-daemon/shared/log.h"
#include "host-daemon/shared/rules.h"
#include "host-daemon/worker/worker_internal.h"
#include "ring/validate.h"

namespace ivcuda::host {

namespace {
constexpr std::size_t kReqSize[] = {
    0,
#define IVCUDA_REQ_SIZE(name, req, rep, sync) sizeof(proto::req),
    IVCUDA_OPS(IVCUDA_REQ_SIZE)
#undef IVCUDA_REQ_SIZE
};
static_assert(std::size(kReqSize) == static_cast<std::size_t>(proto::Op::kCount));

// Ops whose reply also reports the first error of earlier posted work, the
// way CUDA reports asynchronous errors at synchronising calls.
bool reports_async_errors(proto::Op op) {
  switch (op) {
    case proto::Op::kCtxSynchronize:
    case proto::Op::kStreamSynchronize:
    case proto::Op::kStreamQuery:
    case proto::Op::kEventSynchronize:
    case proto::Op::kEventQuery:
    case proto::Op::kFlush:
    case proto::Op::kMemcpyHtoDInline:
    case proto::Op::kMemcpyHtoDArena:
    case proto::Op::kMemcpyDtoHArena:
    case proto::Op::kMemcpyDtoHInline:
    case proto::Op::kMemcpyDtoD:
    case proto::Op::kMemcpy2D:
    case proto::Op::kMemset:
      return true;
    default:
      return false;
  }
}

// Wrap-safe "a comes before b" for 32-bit tickets.
bool ticket_before(std::uint32_t a, std::uint32_t b) { return static_cast<std::int32_t>(a - b) < 0; }
}  // namespace

const Worker::Handler Worker::kHandlers[] = {
    nullptr,
#define IVCUDA_HANDLER_ENTRY(name, req, rep, sync) &Worker::on_##name,
    IVCUDA_OPS(IVCUDA_HANDLER_ENTRY)
#undef IVCUDA_HANDLER_ENTRY
};
static_assert(std::size(Worker::kHandlers) == static_cast<std::size_t>(proto::Op::kCount),
              "every op needs a handler");

Worker::Worker(WorkerConfig cfg) : cfg_(std::move(cfg)), l_(cfg_.layout),
      pool_(ring::pool_off(cfg_.layout), ring::pool_size(cfg_.layout)) {
  if (cfg_.broker_fd >= 0) broker_ = BrokerClient(std::exchange(cfg_.broker_fd, -1));
}

Worker::~Worker() { cleanup(); }

Result<std::unique_ptr<Worker>> Worker::create(WorkerConfig cfg) {
  std::unique_ptr<Worker> w(new Worker(std::move(cfg)));
  IVCUDA_TRY(w->init());
  return w;
}

Result<std::unique_ptr<GuestWorker>> start_worker(WorkerConfig cfg) {
  IVCUDA_TRY_ASSIGN(auto w, Worker::create(std::move(cfg)));
  return std::unique_ptr<GuestWorker>(std::move(w));
}

const char* Worker::err_name(CUresult st) const {
  const char* s = nullptr;
  if (cu_.cuGetErrorName == nullptr || cu_.cuGetErrorName(st, &s) != CUDA_SUCCESS || s == nullptr)
    return "CUDA_ERROR_UNKNOWN";
  return s;
}

Result<void> Worker::init() {
  char prefix[48];
  std::snprintf(prefix, sizeof prefix, "ivcudad worker g%u", cfg_.guest_id);
  log::set_prefix(prefix);
  if (cfg_.host_fds.empty() || cfg_.guest_fds.empty())
    return make_error(EINVAL, "worker needs at least one doorbell vector each way");
  std::string env_note;
  for (const std::string& kv : cfg_.driver_env) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || ::setenv(kv.substr(0, eq).c_str(), kv.c_str() + eq + 1, 1) != 0)
      return make_error(EINVAL, "cannot set " + kv + " for the driver");
    env_note += (env_note.empty() ? "" : " ") + kv;
  }
  if (!env_note.empty()) IVLOG_INFO("guest %u: the driver loads with %s", cfg_.guest_id, env_note.c_str());
  reserve_null_region();  // before the driver places anything
  IVCUDA_TRY_ASSIGN(cu_, load_driver(cfg_.driver_path));
  const auto t_init = std::chrono::steady_clock::now();
  CUresult st = cu_.cuInit(0);
  if (st != CUDA_SUCCESS) return make_error(st, std::string("cuInit: ") + err_name(st));
  int count = 0;
  st = cu_.cuDeviceGetCount(&count);
  if (st != CUDA_SUCCESS) return make_error(st, std::string("cuDeviceGetCount: ") + err_name(st));
  std::vector<int> ordinals = cfg_.devices;
  if (ordinals.empty())
    for (int i = 0; i < count; ++i) ordinals.push_back(i);
  for (int o : ordinals) {
    if (o < 0 || o >= count)
      return make_error(EINVAL, "GPU " + std::to_string(o) + " does not exist on this host (" +
                                    std::to_string(count) + " found)");
    CUdevice d;
    st = cu_.cuDeviceGet(&d, o);
    if (st != CUDA_SUCCESS) return make_error(st, std::string("cuDeviceGet: ") + err_name(st));
    devices_.push_back(d);
  }
  if (devices_.empty()) return make_error(ENODEV, "no GPU for this guest");
  init_ms_ = static_cast<long long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t_init).count());
  return start_guest_side(true);
}

Result<void> Worker::start_guest_side(bool first) {
  // Start-up costs, for the log: what a guest waits for before its hello.
  using clock = std::chrono::steady_clock;
  const auto ms_since = [](clock::time_point t) {
    return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - t).count());
  };
  CUresult st = CUDA_SUCCESS;
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    CtxEntry e;
    e.primary = true;
    e.device = static_cast<int>(i);
    primary_.push_back(ctxs_.insert(std::move(e)));
  }
  quota_.configure(cfg_.mem_limit, cfg_.vm, cfg_.vm_slot, cfg_.stats);
  IVCUDA_TRY(map_bar());
  const long long init_ms = first ? init_ms_ : 0;
  // The host's NVML loads beside the context (each takes the driver 0.05-0.4 s
  // when many workers start at once); it is joined below, before the sandbox closes.
  std::thread nvml_loader;
  if (first && !nvml_) nvml_loader = std::thread([this] { (void)nvml_state(); });
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join_nvml{nvml_loader};
  quota_.set_reclaim([this] { return reclaim_pool_reserves(); });
  const auto t_ctx = clock::now();
  if (!charge_first_context()) {
    // A VM's spare has no process yet: it ends, and the supervisor starts
    // one later; the process that finds none gets a worker that refuses it.
    if (cfg_.vm != nullptr && cfg_.vm->slot(cfg_.vm_slot).guest_pid.load() == 0)
      return make_error(ENOMEM, "the VM's quota cannot cover another worker's context");
    if (!waiter_) {
      IVCUDA_TRY_ASSIGN(waiter_, UringWaiter::create(cfg_.host_fds[0], cfg_.defer_connection ? -1 : cfg_.conn_fd));
    }
    channels_.resize(l_.channels);
    return {};
  }
  // Register the arena with the GPU once, in the first device's primary
  // context, so that copies from page-locked guest memory and from staging
  // DMA straight from the shared pages.
  // The context is made in the GPU's turn (host-daemon/shared/context_turns.h).
  long long turn_ms = 0;
  if (!first && kept_.live) {
    // The last guest's context, kept and scrubbed (keep.cc): a retain of
    // a live context is no work for the driver's queue.
    st = cu_.cuDevicePrimaryCtxRetain(&arena_ctx_, devices_[0]);
  } else {
    // A recycled worker's context is for a guest yet to come: workers whose
    // guests wait go first.
    const context_turns::Turn turn(devices_[0], first ? context_turns::Work::kMake : context_turns::Work::kMakeAhead);
    turn_ms = turn.waited().count();
    st = cu_.cuDevicePrimaryCtxRetain(&arena_ctx_, devices_[0]);
  }
  if (st != CUDA_SUCCESS) return make_error(st, std::string("cuDevicePrimaryCtxRetain: ") + err_name(st));
  cu_.cuCtxSetCurrent(arena_ctx_);
  current_ = arena_ctx_;
  if (cfg_.keep_contexts && !kept_.live) record_keep_baseline();  // a context as the driver makes it
  const long long ctx_ms = ms_since(t_ctx);
  const auto t_reg = clock::now();
  // On use where the device sees registered memory at its host address:
  // the first channel's staging now (a guest's first copy goes there), and
  // that it is seen there is checked; else all of it now.
  int host_pointer = 0;
  if (!cfg_.pin_arena_at_start && l_.staging_bytes != 0 &&
      cu_.cuDeviceGetAttribute(&host_pointer, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
                               devices_[0]) == CUDA_SUCCESS &&
      host_pointer != 0) {
    arena_on_use_ = true;
    arena_dev_ = reinterpret_cast<std::uintptr_t>(arena_ptr(l_.arena_off));
    st = pin_arena(ring::staging_off(l_, 0), l_.staging_bytes);
    if (st != CUDA_SUCCESS)
      return make_error(st, std::string("registering the first staging slot with the GPU: ") + err_name(st));
    CUdeviceptr d = 0;
    st = cu_.cuMemHostGetDevicePointer(&d, arena_ptr(l_.arena_off), 0);
    if (st != CUDA_SUCCESS || d != arena_dev_) {
      unpin_arena(ring::staging_off(l_, 0));
      arena_on_use_ = false;
      IVLOG_WARN("guest %u: the GPU sees registered memory elsewhere than at its host address; the arena is "
                 "registered whole", cfg_.guest_id);
    }
  }
  if (!arena_on_use_) {
    st = cu_.cuMemHostRegister(arena_ptr(l_.arena_off), l_.arena_size,
                               CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    if (st != CUDA_SUCCESS)
      return make_error(st, std::string("registering the arena with the GPU: ") + err_name(st));
    arena_registered_ = true;
    CUdeviceptr d = 0;
    st = cu_.cuMemHostGetDevicePointer(&d, arena_ptr(l_.arena_off), 0);
    if (st != CUDA_SUCCESS) return make_error(st, std::string("arena device pointer: ") + err_name(st));
    arena_dev_ = d;
  }
  const long long reg_ms = ms_since(t_reg);
  // The ring last: it holds the guest's connection through its armed poll,
  // and a ring torn down with the process may keep that reference for a
  // while, so a worker that fails to start has none (the guest then sees the
  // hang-up at once).
  if (!waiter_) {
    IVCUDA_TRY_ASSIGN(waiter_, UringWaiter::create(cfg_.host_fds[0], cfg_.defer_connection ? -1 : cfg_.conn_fd));
  }
  channels_.resize(l_.channels);
  if (first && cfg_.forward_stdout) start_console();
  // The host's NVML by now, before the sandbox closes (nvml.cc): its nvmlInit
  // needs what a sandboxed worker may no longer do (inside the sandbox it
  // fails on the H200). The figure is what was left to wait for.
  const auto t_nvml = clock::now();
  if (nvml_loader.joinable()) nvml_loader.join();
  (void)nvml_state();
  const long long nvml_ms = ms_since(t_nvml);
  IVLOG_INFO("%s guest %u: %zu GPU(s), %u channels, arena %llu MiB at device 0x%llx "
             "(driver start %lld ms, context %lld ms of which %lld waiting its turn, arena registration %lld ms, "
             "NVML %lld ms)",
             !first ? "recycled for" : cfg_.defer_connection ? "started ahead for" : "serving", cfg_.guest_id,
             devices_.size(), l_.channels, static_cast<unsigned long long>(l_.arena_size >> 20),
             static_cast<unsigned long long>(arena_dev_), init_ms, ctx_ms, turn_ms, reg_ms, nvml_ms);
  return {};
}

// The context the worker is about to retain (the first GPU's primary, which
// the arena's registration needs) is the guest's: it is charged to the
// guest's quota before the driver makes it (issue 28: one connection could
// otherwise hold a context per worker outside every quota). When the quota
// cannot cover it the worker makes no context at all and refuses every call
// with CUDA_ERROR_OUT_OF_MEMORY, as a native cuInit would fail on a GPU with
// no memory left for a context.
bool Worker::charge_first_context() {
  if (!IVCUDA_RULE("context-charged")) return true;
  if ((context_charge_ = quota_.take(cfg_.context_reserve))) return true;
  refused_ = CUDA_ERROR_OUT_OF_MEMORY;
  IVLOG_WARN("guest %u: its quota (%llu MiB, %llu MiB of it in use) cannot cover a context (--context-reserve "
             "%llu MiB); this worker makes none and answers every call with CUDA_ERROR_OUT_OF_MEMORY",
             cfg_.guest_id, static_cast<unsigned long long>(quota_.limit() >> 20),
             static_cast<unsigned long long>(quota_.used() >> 20),
             static_cast<unsigned long long>(cfg_.context_reserve >> 20));
  return false;
}

// The guest learns where the BAR is mapped here (RepHello's arena device
// base: with unified addressing the arena's device alias is this host
// address). So the mapping is made after the driver reserved its address
// ranges (cuInit, devices), at a random address of its own: it reveals
// nothing about the rest of the worker's address space, and nothing on the
// host takes a guest-supplied address as a pointer (docs/security.md).
Result<void> Worker::map_bar() {
  // Memory smaller than the layout would fault on first touch: refuse it.
  IVCUDA_TRY_ASSIGN(const std::uint64_t size, sys::file_size(cfg_.shm_fd));
  if (IVCUDA_RULE("shared-memory-size") && size < l_.shm_size)
    return make_error(EINVAL, "the shared memory has " + std::to_string(size) + " bytes, the layout needs " +
                                  std::to_string(l_.shm_size));
  auto m = cfg_.random_bar_address && IVCUDA_RULE("bar-address-random")
               ? sys::Mapping::map_shared_random(cfg_.shm_fd, l_.shm_size)
                                   : sys::Mapping::map_shared(cfg_.shm_fd, l_.shm_size);
  if (!m) {
    IVLOG_WARN("guest %u: %s; mapping the BAR where the kernel puts it", cfg_.guest_id, m.error().what.c_str());
    m = sys::Mapping::map_shared(cfg_.shm_fd, l_.shm_size);
  }
  IVCUDA_TRY_ASSIGN(bar_, std::move(m));
  return {};
}


// Device printf: the driver writes a kernel's printf output to this
// process's stdout when the guest synchronises. The worker points fd 1 at a
// pipe and sends what arrives to the guest with its next replies; the guest
// writes it to its own stdout. Both ends are non-blocking: a reader that
// falls behind loses output instead of stalling the GPU work behind a full
// pipe. The worker's own log lines go to stderr.
void Worker::start_console() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    IVLOG_WARN("guest %u: no pipe for device printf (%s); it stays on the daemon's stdout", cfg_.guest_id,
               std::strerror(errno));
    return;
  }
  sys::UniqueFd rd(fds[0]), wr(fds[1]);
  (void)::fcntl(wr.get(), F_SETPIPE_SZ, 1 << 20);  // the driver's printf FIFO is 1 MiB by default
  std::fflush(stdout);
  if (::dup2(wr.get(), STDOUT_FILENO) < 0) {
    IVLOG_WARN("guest %u: cannot redirect stdout for device printf: %s", cfg_.guest_id, std::strerror(errno));
    return;
  }
  console_rd_ = std::move(rd);
}

namespace {
// Whether device printf output may be waiting in the console pipe. The
// driver writes it at its flush points (launches, synchronisations, blocking
// copies, module loads and unloads, a context's end, before a host node's
// callback), never at a stream or event query: a guest polling a query in a
// loop then costs no read() per answer (a system call, through the sandbox's
// filter, on the round trip's path).
std::atomic<bool> g_console_maybe{true};
bool is_query(proto::Op op) { return op == proto::Op::kEventQuery || op == proto::Op::kStreamQuery; }
}  // namespace

void note_console_output() noexcept {
  if (!g_console_maybe.load(std::memory_order_relaxed)) g_console_maybe.store(true, std::memory_order_release);
}

void Worker::drain_console() {
  if (!console_rd_.valid()) return;
  g_console_maybe.store(false, std::memory_order_release);
  std::fflush(stdout);  // output the driver left in stdio's buffer
  constexpr std::size_t kMaxPending = 4u << 20;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::read(console_rd_.get(), buf, sizeof buf);
    if (n <= 0) break;
    if (console_.size() < kMaxPending) console_.append(buf, std::min<std::size_t>(static_cast<std::size_t>(n),
                                                                                   kMaxPending - console_.size()));
  }
}

void Worker::cleanup() noexcept {
  if (cu_.handle == nullptr) return;
  abandon_copies();      // memory.cc: before the contexts their events belong to
  abandon_host_nodes();  // graph_build.cc: a host node waiting for the gone guest gives up
  destroy_created_pools();
  release_vmm();
  destroy_links();
  destroy_greens();  // green.cc: before the primary contexts they retain
  // Contexts the guest created die with everything in them; primaries are
  // released as often as the guest retained them. Process exit would free
  // all of it too - this keeps the driver's books straight while we live.
  ctxs_.for_each([&](std::uint64_t, CtxEntry& c) {
    if (c.primary) {
      if (c.real != nullptr && c.guest_refs > 0) cu_.cuDevicePrimaryCtxRelease(devices_[c.device]);
    } else if (c.real != nullptr) {
      cu_.cuCtxDestroy(c.real);
    }
  });
  if (arena_registered_) {
    cu_.cuCtxSetCurrent(arena_ctx_);
    cu_.cuMemHostUnregister(arena_ptr(l_.arena_off));
    arena_registered_ = false;
  }
  while (!arena_pinned_.empty()) unpin_arena(arena_pinned_.begin()->first);
  release_shared();  // host_register.cc
  if (arena_ctx_ != nullptr) {
    cu_.cuDevicePrimaryCtxRelease(devices_[0]);
    arena_ctx_ = nullptr;
  }
  cu_.handle = nullptr;  // the library stays loaded until exit
}

void Worker::log_limit(const char* what, std::uint32_t limit) noexcept {
  if (errors_logged_++ < 100)
    IVLOG_WARN("guest %u: %s limit reached (%u at once, --object-limits); refused", cfg_.guest_id, what, limit);
}

void Worker::post_error(CUresult st, const char* op) noexcept {
  if (st == CUDA_SUCCESS) return;
  if (pending_ == CUDA_SUCCESS) pending_ = st;
  if (errors_logged_++ < 100)
    IVLOG_WARN("guest %u: posted %s failed: %s (reported at the next synchronising call)",
               cfg_.guest_id, op, err_name(st));
}

// Runs `f` (a driver call of the worker's own, not a guest's) in the
// arena's context with the thread's capture mode relaxed: registering
// memory is a "potentially unsafe" call, which in the guest's mode would
// invalidate a capture some guest thread has under way (or be refused).
template <class F>
CUresult Worker::as_worker(F&& f) {
  CUcontext was = current_;  // the worker's own record of what is current
  if (was != arena_ctx_) (void)cu_.cuCtxSetCurrent(arena_ctx_);
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  const bool exchanged = driver_capture_mode_ != CU_STREAM_CAPTURE_MODE_RELAXED &&
                         cu_.cuThreadExchangeStreamCaptureMode != nullptr &&
                         cu_.cuThreadExchangeStreamCaptureMode(&m) == CUDA_SUCCESS;
  const CUresult st = f();
  if (exchanged) (void)cu_.cuThreadExchangeStreamCaptureMode(&m);  // back to what it was
  if (was != arena_ctx_) (void)cu_.cuCtxSetCurrent(was);
  return st;
}

// Page-locks [off, off + bytes) of the arena for the GPU, in the arena's
// context (WorkerConfig::pin_arena_at_start says why on use). Pieces never
// overlap: a staging slot, or one allocation of the arena's pool.
CUresult Worker::register_host(void* p, std::uint64_t bytes, unsigned flags) {
  return as_worker([&] { return cu_.cuMemHostRegister(p, bytes, flags); });
}

void Worker::unregister_host(void* p) noexcept {
  (void)as_worker([&] { return cu_.cuMemHostUnregister(p); });
}

std::uint64_t Worker::host_alias(void* p) {
  CUdeviceptr d = 0;
  return as_worker([&] { return cu_.cuMemHostGetDevicePointer(&d, p, 0); }) == CUDA_SUCCESS ? d : 0;
}

CUresult Worker::pin_arena(std::uint64_t off, std::uint64_t bytes) {
  if (!arena_on_use_ || bytes == 0 || arena_pinned_.count(off) != 0) return CUDA_SUCCESS;
  const CUresult st = register_host(arena_ptr(off), bytes, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  if (st == CUDA_SUCCESS) arena_pinned_[off] = bytes;
  else if (errors_logged_++ < 100)
    IVLOG_WARN("guest %u: page-locking %llu KiB of its arena failed: %s", cfg_.guest_id,
               static_cast<unsigned long long>(bytes >> 10), err_name(st));
  return st;
}

void Worker::unpin_arena(std::uint64_t off) {
  const auto it = arena_pinned_.find(off);
  if (it == arena_pinned_.end()) return;
  unregister_host(arena_ptr(off));
  arena_pinned_.erase(it);
}

// ------------------------------------------------------------------ channels

void Worker::attach_channels() {
  auto* sb = ring::superblock(bar_.data());
  // A VM's per-process worker serves the channels the supervisor gave it,
  // rescanned only when the owners change.
  VmShared* vm = cfg_.vm;
  if (vm != nullptr) {
    const std::uint32_t v = vm->version().load(std::memory_order_acquire);
    if (v == vm_version_) return;
    vm_version_ = v;
    for (std::uint32_t c = 0; c < l_.channels; ++c)
      if (channels_[c] && vm->owner(c).load() != cfg_.vm_slot + 1) {
        IVLOG_DEBUG("guest %u: channel %u is no longer ours", cfg_.guest_id, c);
        channels_[c].reset();
      }
  }
  for (std::uint32_t w = 0; w < abi::kChannelMaskWords; ++w) {
    // The guest sets a bit after making the channel usable; a bogus bit only
    // makes us look at a ring whose contents are validated anyway.
    std::uint64_t bits = ring::load_acquire(sb->active_mask[w]);
    while (bits != 0) {
      const std::uint32_t c = w * 64 + static_cast<std::uint32_t>(__builtin_ctzll(bits));
      bits &= bits - 1;
      if (c >= l_.channels || channels_[c]) continue;
      if (vm != nullptr && vm->owner(c).load() != cfg_.vm_slot + 1) continue;
      auto ch = std::make_unique<Channel>();
      ch->index = c;
      const auto desc = ring::copy_out<abi::ChannelDesc>(ring::channel_desc(bar_.data(), l_, c));
      const std::uint32_t vec = desc.guest_vector % static_cast<std::uint32_t>(cfg_.guest_fds.size());
      ch->bell = std::make_unique<ring::EventfdDoorbell>(cfg_.guest_fds[vec]);
      ch->req = ring::Consumer(ring::request_ring(bar_.data(), l_, c));
      ch->cpl = ring::Producer(ring::completion_ring(bar_.data(), l_, c), ch->bell.get());
      channels_[c] = std::move(ch);
      vm_had_channels_ = true;
      // Its staging slot, page-locked when the channel is first served. A
      // slot that cannot be still works: the driver copies it as pageable.
      (void)pin_arena(ring::staging_off(l_, c), l_.staging_bytes);
      IVLOG_DEBUG("guest %u attached channel %u (vector %u)", cfg_.guest_id, c, vec);
    }
  }
}

// A VM process said goodbye on `ch` (it exits, or lets the channel go): the
// answer is out, so the channel goes back to the supervisor, and the worker
// ends with its process's last channel.
void Worker::vm_detach(Channel& ch) {
  const std::uint32_t c = ch.index;
  wait_copies(ch, 0);  // its staged chunks are counted before the channel goes back
  ch.req.publish_head();
  std::uint32_t mine = cfg_.vm_slot + 1;
  cfg_.vm->owner(c).compare_exchange_strong(mine, 0);
  cfg_.vm->version().fetch_add(1, std::memory_order_acq_rel);
  channels_[c].reset();
  const std::uint64_t one = 1;
  if (cfg_.vm_notify_fd >= 0) (void)!::write(cfg_.vm_notify_fd, &one, sizeof one);
  const bool any = std::any_of(channels_.begin(), channels_.end(), [](const auto& p) { return p != nullptr; });
  if (!any && vm_had_channels_) {
    IVLOG_INFO("guest %u: the process said goodbye on its last channel", cfg_.guest_id);
    stop_ = true;
    process_done_ = true;
  }
}

void Worker::reply(Channel& ch, const ring::Record& rec, CUresult st, std::span<const std::byte> body) {
  abi::RecordHeader h{};
  h.op = rec.hdr.op;
  h.seq = rec.hdr.seq;
  h.status = static_cast<std::int32_t>(st);
  h.len = static_cast<std::uint32_t>(body.size());
  // Pending device printf output rides at the end of the payload, followed
  // by its length (proto::kReplyConsole).
  std::size_t console = 0;
  const std::size_t room = ch.cpl.max_payload();
  if (!console_.empty() && body.size() + sizeof(std::uint32_t) < room) {
    console = std::min<std::size_t>({console_.size(), room - body.size() - sizeof(std::uint32_t), 1u << 16});
    h.flags = proto::kReplyConsole;
    h.len = static_cast<std::uint32_t>(body.size() + console + sizeof(std::uint32_t));
  }
  ring::RingStatus rs;
  std::byte* p = nullptr;
  // The guest waits for this reply, so its ring has room unless it misbehaves;
  // give it a moment, then drop the channel rather than block other channels.
  for (int tries = 0; tries < 1000000; ++tries) {
    p = ch.cpl.reserve(h, &rs);
    if (p != nullptr || rs != ring::RingStatus::kFull) break;
    ring::cpu_relax();
  }
  if (p == nullptr) {
    IVLOG_ERROR("guest %u channel %u: cannot post the reply to %s; channel dropped", cfg_.guest_id,
                ch.index, proto::op_name(rec.hdr.op));
    ch.dead = true;
    return;
  }
  if (!body.empty()) std::memcpy(p, body.data(), body.size());
  if (console != 0) {
    const auto n = static_cast<std::uint32_t>(console);
    std::memcpy(p + body.size(), console_.data(), console);
    std::memcpy(p + body.size() + console, &n, sizeof n);
    console_.erase(0, console);
  }
  ch.cpl.commit();
  ch.cpl.publish();
}

void Worker::handle(Channel& ch, const ring::Record& rec) {
  static thread_local std::vector<std::byte> out;
  out.clear();
  const bool needs_reply = (rec.hdr.flags & abi::kRecNeedsReply) != 0;
  // IVCUDA_TRACE_STAGES in the guest: this record's stages (stage_trace.cc).
  const bool traced = needs_reply && (rec.hdr.flags & abi::kRecTraceStages) != 0;
  std::uint64_t stamps[4] = {};
  if (traced) stamps[0] = __rdtsc();
  const std::uint16_t op = rec.hdr.op;
  CUresult st;
  Call call{ch, rec, out};
  IVLOG_DEBUG("guest %u channel %u: %s seq %u (%u bytes)%s", cfg_.guest_id, ch.index, proto::op_name(op),
              rec.hdr.seq, rec.hdr.len, needs_reply ? "" : " posted");
  if (op == 0 || op >= static_cast<std::uint16_t>(proto::Op::kCount)) {
    st = CUDA_ERROR_INVALID_VALUE;
    if (errors_logged_++ < 100)
      IVLOG_WARN("guest %u channel %u: unknown op %u refused", cfg_.guest_id, ch.index, op);
  } else if ((evicted_ || refused_ != CUDA_SUCCESS) && op != static_cast<std::uint16_t>(proto::Op::kGoodbye) &&
             op != static_cast<std::uint16_t>(proto::Op::kFlush) &&
             op != static_cast<std::uint16_t>(proto::Op::kFlushWait)) {
    // Evicted, or refused at the start: nothing reaches the driver. A
    // staged chunk's counter still moves, or the guest would wait on it
    // forever.
    st = evicted_ ? CUDA_ERROR_DEVICE_UNAVAILABLE : refused_;
    const bool arena = op == static_cast<std::uint16_t>(proto::Op::kMemcpyHtoDArena) ||
                       op == static_cast<std::uint16_t>(proto::Op::kMemcpyDtoHArena);
    if (arena && rec.payload.size() >= sizeof(proto::ReqCopy)) {
      const auto r = call.req<proto::ReqCopy>();
      if (ring::in_staging(l_, ch.index, r.arena_off, r.bytes)) ring::bump_staging_done(bar_.data(), l_, ch.index);
    }
  } else if (rec.payload.size() < kReqSize[op]) {
    st = CUDA_ERROR_INVALID_VALUE;
    if (errors_logged_++ < 100)
      IVLOG_WARN("guest %u channel %u: %s request truncated (%zu < %zu bytes)", cfg_.guest_id,
                 ch.index, proto::op_name(op), rec.payload.size(), kReqSize[op]);
  } else {
    // All guest threads share the worker's one thread: it takes on the mode
    // that gives this guest thread's request the verdict CUDA would give it
    // (exchanged only on change; see effective_capture_mode).
    const CUstreamCaptureMode want = effective_capture_mode(ch);
    if (want != driver_capture_mode_ && cu_.cuThreadExchangeStreamCaptureMode != nullptr) {
      CUstreamCaptureMode m = want;
      if (cu_.cuThreadExchangeStreamCaptureMode(&m) == CUDA_SUCCESS) driver_capture_mode_ = want;
    }
    // Copies in flight in a context that is about to go are waited for
    // first; a Flush answers once the channel's copies are done (memory.cc).
    settle_copies_before(static_cast<proto::Op>(op), call);
    if (cfg_.keep_contexts) note_op(static_cast<proto::Op>(op));
    if (!is_query(static_cast<proto::Op>(op))) note_console_output();
    if (traced) stamps[1] = __rdtsc();
    st = (this->*kHandlers[op])(call);
    if (traced) stamps[2] = __rdtsc();
    if ((op == static_cast<std::uint16_t>(proto::Op::kFlush) || op == static_cast<std::uint16_t>(proto::Op::kFlushWait)) &&
        needs_reply && st == CUDA_SUCCESS)
      st = park_on_copies(call);
  }
  const auto pop = static_cast<proto::Op>(op);
  if (call.parked) {
    ch.parked.hdr = rec.hdr;
    if (pop != proto::Op::kStreamSynchronize && pop != proto::Op::kEventSynchronize) account(rec, st);
    return;
  }
  account(rec, st);
  if ((rec.hdr.flags & abi::kRecHostPolled) != 0) track_host_poll(ch, rec, st);  // host_polls.cc
  // The guest answers cuMemGetInfo from this view: it changes before the
  // reply of the call that changed it (memory.cc).
  if (quota_.used() != view_used_ || quota_.limit() != view_limit_ || mem_view_usable() != view_usable_)
    publish_mem_view(nullptr, nullptr);
  if (needs_reply && reports_async_errors(pop)) reap_all_copies();
  if (needs_reply && reports_async_errors(pop) && pending_ != CUDA_SUCCESS) {
    // One report per error: a call that fails on its own also answers for
    // the posted work before it (as a real driver reports once).
    if (st == CUDA_SUCCESS) st = pending_;
    pending_ = CUDA_SUCCESS;
  }
  if (!needs_reply) {
    post_error(st, proto::op_name(op));
    return;
  }
  if (reports_async_errors(pop) && (!is_query(pop) || g_console_maybe.load(std::memory_order_acquire)))
    drain_console();
  if (st != CUDA_SUCCESS && st != CUDA_ERROR_NOT_READY && errors_logged_++ < 100)
    IVLOG_INFO("guest %u: %s -> %s", cfg_.guest_id, proto::op_name(op), err_name(st));
  reply(ch, rec, st, out);
  if (traced && stamps[1] != 0) {
    stamps[3] = __rdtsc();
    note_stages(rec, stamps);
  }
}

void Worker::account(const ring::Record& rec, CUresult st) noexcept {
  GuestStats* b = cfg_.stats;
  if (b == nullptr) return;
  b->calls.fetch_add(1, std::memory_order_relaxed);
  const auto op = static_cast<proto::Op>(rec.hdr.op);
  if (st == CUDA_SUCCESS && (op == proto::Op::kMemcpyHtoDInline || op == proto::Op::kMemcpyHtoDArena ||
                             op == proto::Op::kMemcpyDtoHArena || op == proto::Op::kMemcpyDtoHInline) &&
      rec.payload.size() >= sizeof(proto::ReqCopy)) {
    proto::ReqCopy r;
    std::memcpy(&r, rec.payload.data(), sizeof r);
    b->copy_bytes.fetch_add(r.bytes, std::memory_order_relaxed);
  }
  if (st != CUDA_SUCCESS && st != CUDA_ERROR_NOT_READY && rec.hdr.op < static_cast<std::uint16_t>(proto::Op::kCount))
    b->note_error(proto::op_name(rec.hdr.op), err_name(st));
}

// ivcudactl evict: everything the guest holds goes now (contexts, and with
// them its memory, streams, modules; exports; its quota's charge), parked
// calls are answered, and from here on every call answers an error.
void Worker::evict() {
  IVLOG_WARN("guest %u: evicted by the operator; releasing %zu context(s), %zu allocation(s), %zu module(s)",
             cfg_.guest_id, ctxs_.size(), ranges_.size(), modules_.size());
  evicted_ = true;
  for (auto& chp : channels_) {
    if (!chp || chp->dead || !chp->parked.active) continue;
    chp->parked.active = false;
    ring::Record rec;
    rec.hdr = chp->parked.hdr;
    reply(*chp, rec, CUDA_ERROR_DEVICE_UNAVAILABLE, {});
  }
  parked_since_ = {};
  captures_.clear();
  cleanup();
  quota_.close();
  if (cfg_.stats != nullptr) cfg_.stats->evicted.store(1, std::memory_order_release);
}

void Worker::hold_for_suspend() {
  held_ = true;
  // The checkpointer reaches into this process through /proc (its pipes as
  // /proc/PID/fd/N), which the kernel allows a process of the same user only
  // while this one is dumpable; a worker that dropped to --user is not (a
  // change of user clears it). So it is while held, before the daemon is
  // told (quiet), and is as before once its calls go on.
  const int was_dumpable = ::prctl(PR_GET_DUMPABLE, 0, 0, 0, 0);
  if (was_dumpable == 0 && ::prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0)
    IVLOG_WARN("guest %u: this worker cannot be made dumpable for its checkpointer: %s", cfg_.guest_id,
               std::strerror(errno));
  cfg_.stats->quiet.fetch_add(1, std::memory_order_acq_rel);
  IVLOG_INFO("guest %u: suspending: its calls are held", cfg_.guest_id);
  const auto t0 = std::chrono::steady_clock::now();
  auto* sb = ring::superblock(bar_.data());
  while (!stop_ && cfg_.stats->suspend.load(std::memory_order_acquire) != 0) {
    // A guest in a VM takes a heartbeat that stops for 5 s as the daemon's death.
    ring::store_relaxed(sb->host_heartbeat, ring::load_relaxed(sb->host_heartbeat) + 1);
    if (waiter_->wait(0) & UringWaiter::kHangup) {
      // Gone while suspended: nothing of its may be recycled or released
      // through the driver (locked, it answers nothing); the process ends,
      // and its memory, on the device or checkpointed, goes with it.
      IVLOG_INFO("guest %u went away while suspended; its worker ends", cfg_.guest_id);
      ::_exit(0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  cfg_.stats->quiet.fetch_sub(1, std::memory_order_acq_rel);
  if (was_dumpable == 0 && IVCUDA_RULE("user-dumpable-while-held")) (void)::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  held_ = false;
  IVLOG_INFO("guest %u: its calls go on after %.0f ms held", cfg_.guest_id,
             std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
}

bool Worker::poll_parked(Channel& ch) {
  auto& p = ch.parked;
  if (p.op != proto::Op::kStreamSynchronize && p.op != proto::Op::kEventSynchronize) return poll_copy_park(ch);
  CUresult st;
  // Once the query says done, the synchronise returns at once and makes the
  // driver write out pending device printf output (a query does not).
  if (p.op == proto::Op::kStreamSynchronize) {
    auto* s = streams_.find(p.handle);
    st = s == nullptr ? CUDA_ERROR_INVALID_HANDLE : cu_.cuStreamQuery(s->real);
    if (st == CUDA_SUCCESS) st = cu_.cuStreamSynchronize(s->real);
  } else {
    auto* e = events_.find(p.handle);
    st = e == nullptr ? CUDA_ERROR_INVALID_HANDLE : cu_.cuEventQuery(e->real);
    if (st == CUDA_SUCCESS) st = cu_.cuEventSynchronize(e->real);
  }
  if (st == CUDA_ERROR_NOT_READY) return false;
  if (st == CUDA_SUCCESS && pending_ != CUDA_SUCCESS) {
    st = pending_;
    pending_ = CUDA_SUCCESS;
  }
  p.active = false;
  parked_since_ = {};
  drain_console();
  ring::Record rec;
  rec.hdr = p.hdr;
  reply(ch, rec, st, {});
  return true;
}

// CUDA prohibits a thread's potentially unsafe calls when that thread has a
// capture of its own begun in a non-relaxed mode, or, for a thread in global
// mode, when another thread has a global-mode capture (driver 580 on the
// H200 lets a thread-local thread allocate during another's global capture:
// drv_capture_modes). On the host every capture belongs to the worker's one
// thread, so one guest thread's capture would also prohibit the others'. The
// mode the worker's thread takes on for a request makes the driver decide as
// if the guest's threads were its own: the guest thread's mode where it
// captures itself, global where it is global and a global capture is under
// way, and relaxed otherwise.
CUstreamCaptureMode Worker::effective_capture_mode(const Channel& ch) const {
  bool global = false;
  for (const auto& [stream, cap] : captures_) {
    if (cap.channel == ch.index) return ch.capture_mode;
    global |= cap.mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
  }
  return global && ch.capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL ? CU_STREAM_CAPTURE_MODE_GLOBAL
                                                                     : CU_STREAM_CAPTURE_MODE_RELAXED;
}

// A query the guest marked kRecUnordered that depends on no posted work:
// taken ahead of earlier tickets (shm_abi.h). Any other op keeps its place.
bool Worker::order_free(const ring::Record& rec) noexcept {
  return (rec.hdr.flags & abi::kRecUnordered) != 0 && rec.hdr.op == static_cast<std::uint16_t>(proto::Op::kMemGetInfo);
}

int Worker::serve_once() {
  attach_channels();
  int handled = 0;
  for (;;) {
    // A pass ends after a bounded number of records: a guest that keeps its
    // ring busy (a pipelined copy posts chunk after chunk without a pause)
    // must not keep the loop from a stop, an eviction or a hang-up, nor its
    // heartbeat from moving.
    if (handled >= kRecordsPerPass) {
      auto* sb = ring::superblock(bar_.data());
      ring::store_relaxed(sb->host_heartbeat, ring::load_relaxed(sb->host_heartbeat) + 1);
      break;
    }
    // Take records across channels in ticket order: a call a guest thread
    // made after another thread's call returned has the larger ticket.
    Channel* best = nullptr;
    ring::Record best_rec;
    for (auto& chp : channels_) {
      if (!chp) continue;
      if (!chp->copies.empty()) handled += reap_copies(*chp);  // memory.cc: bumps staging_done
      if (!chp->polls.empty()) reap_host_polls(*chp);           // host_polls.cc: bumps host_polls_done
      if (chp->dead) continue;
      Channel& ch = *chp;
      if (ch.parked.active) {
        if (poll_parked(ch)) ++handled;
        continue;
      }
      ring::Record rec;
      const auto rs = ch.req.poll(&rec);
      if (rs == ring::RingStatus::kCorrupt) {
        IVLOG_ERROR("guest %u channel %u: request ring corrupt (indices or record out of bounds); "
                    "channel dropped", cfg_.guest_id, ch.index);
        ch.dead = true;
        continue;
      }
      if (rs != ring::RingStatus::kOk) continue;
      if (best == nullptr || (order_free(rec) && !order_free(best_rec)) ||
          (order_free(rec) == order_free(best_rec) && ticket_before(rec.hdr.seq, best_rec.hdr.seq))) {
        best = &ch;
        best_rec = rec;
      }
    }
    if (best == nullptr) break;
    // A second look, once `best` is seen: a record another guest thread
    // published before `best` was written (its call returned before this one
    // began) is visible now, even where the scan above polled its channel
    // before it landed - and it comes first. Channels claimed since the pass
    // began are attached for it (a new thread's first call).
    if (channels_.size() > 1 && !order_free(best_rec)) {
      attach_channels();
      for (auto& chp : channels_) {
        if (!chp || chp.get() == best || chp->dead || chp->parked.active) continue;
        ring::Record rec;
        if (chp->req.poll(&rec) == ring::RingStatus::kOk && ticket_before(rec.hdr.seq, best_rec.hdr.seq)) {
          best = chp.get();
          best_rec = rec;
        }
      }
    }
    quiet_->store(false, std::memory_order_relaxed);  // busy: a death now ends the process at once
    taken_->store(taken_->load(std::memory_order_relaxed) + 1, std::memory_order_release);  // this thread alone writes it
    handle(*best, best_rec);
    best->req.consume();
    ++handled;
    if (best->detach) {
      vm_detach(*best);
      continue;
    }
    // A guest waiting to know that its posted record reached the driver
    // (kRecReportTaken: a kernel may be polling host memory it is about to
    // store to) learns it from the head at once, not at the end of the pass.
    if ((handled & 31) == 0 || (best_rec.hdr.flags & abi::kRecReportTaken) != 0) best->req.publish_head();
  }
  for (auto& chp : channels_)
    if (chp) chp->req.publish_head();
  return handled;
}

bool Worker::note_quiet() {
  bool parked = false;
  for (auto& chp : channels_)
    if (chp && ((!chp->dead && chp->parked.active) || !chp->copies.empty() || !chp->polls.empty())) parked = true;
  quiet_->store(!parked, std::memory_order_release);  // watch_guest_death waits only for a quiet loop
  return !parked;
}

void Worker::sleep_until_work() {
  const bool parked = !note_quiet();
  if (parked) {
    // Waiting on the GPU for a parked synchronise or a posted copy (a guest
    // may be waiting on staging_done, not on a reply). As the native driver does
    // by default, poll without sleeping (yielding the core to anyone who
    // needs it) for a while, so that the reply leaves within a microsecond of
    // the GPU finishing; a long wait falls back to short sleeps.
    const auto now = std::chrono::steady_clock::now();
    if (parked_since_ == std::chrono::steady_clock::time_point{}) parked_since_ = now;
    if (waiter_->wait(0) & UringWaiter::kHangup) {
      stop_ = hung_up_ = true;
      return;
    }
    if (now - parked_since_ < kParkedSpin) ::sched_yield();
    else ::usleep(10);
    return;
  }
  parked_since_ = {};
  auto* sb = ring::superblock(bar_.data());
  ring::store_relaxed(sb->host_sleeping, std::uint32_t{1});
  bool work = false;
  for (auto& chp : channels_) {
    if (!chp || chp->dead) continue;
    if (!chp->req.prepare_sleep()) work = true;  // [F1] inside prepare_sleep
  }
  if (cfg_.vm != nullptr) {
    // The supervisor gave us a channel (it also kicks our eventfd).
    if (cfg_.vm->version().load(std::memory_order_acquire) != vm_version_) work = true;
  } else {
    std::uint64_t mask_now[abi::kChannelMaskWords];
    for (std::uint32_t w = 0; w < abi::kChannelMaskWords; ++w) mask_now[w] = ring::load_acquire(sb->active_mask[w]);
    for (std::uint32_t c = 0; c < l_.channels && !work; ++c)
      if ((mask_now[c / 64] >> (c % 64) & 1) && !channels_[c]) work = true;  // a new channel
  }
  if (!work) {
    if (cfg_.poll_only) {
      ::usleep(static_cast<useconds_t>(cfg_.poll_interval.count()));
    } else {
      const unsigned what = waiter_->wait(100);
      if (what & UringWaiter::kHangup) stop_ = hung_up_ = true;
    }
  }
  for (auto& chp : channels_)
    if (chp) chp->req.end_sleep();
  ring::store_relaxed(sb->host_sleeping, std::uint32_t{0});
}

void Worker::attach_connection(int conn_fd) noexcept {
  cfg_.conn_fd = conn_fd;
  cfg_.defer_connection = false;
  waiter_->watch_connection(conn_fd);
}

// A guest that dies stops its GPU work at once (issue 30): the request loop
// sees a hang-up only between records, and until then it would execute what
// the dead guest had posted (thousands of launches, a copy loop) and wait in
// the driver for what is queued there. A thread of its own waits for the
// connection's hang-up alone and ends the process: the driver then tears the
// worker's contexts down as it does for any process that ends, queued work
// and all, and frees their memory. Nothing a worker holds outlives it that
// the daemon does not reclaim when it reaps it (fd_broker.h, the books).
void Worker::watch_guest_death() {
  if (death_watched_ || cfg_.conn_fd < 0 || !IVCUDA_RULE("death-stops-work")) return;
  death_watched_ = true;
  const int fd = cfg_.conn_fd;
  const std::uint32_t guest = cfg_.guest_id;
  const bool recyclable = cfg_.recyclable;
  std::thread([fd, guest, recyclable, death = death_, quiet = quiet_, taken = taken_] {
    pollfd p{fd, POLLRDHUP, 0};
    for (;;) {
      const int r = ::poll(&p, 1, -1);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return;  // the request loop still sees the hang-up
      if ((p.revents & POLLNVAL) != 0) return;  // closed by the worker's own end
      if ((p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) break;
    }
    int live = kLive;
    if (!death->compare_exchange_strong(live, kGone)) return;  // the request loop took the end first
    // A recyclable worker whose request loop is idle, with nothing
    // outstanding, when the guest went: the loop wakes on the same hang-up
    // and takes the end as clean within microseconds (or ends the process
    // itself); give it up to 100 ms on a loaded machine. A loop still busy
    // with a call gets a few milliseconds to finish it: a guest's last call
    // returns before the loop has noted that it is idle again, and a program
    // that exits at once (most short ones) hangs up inside that moment.
    // Anything else - a call in the driver, a parked synchronise, a copy or
    // a poll under way - ends the process now, and so does a record taken
    // after the hang-up (the dead guest's posted work) while it waits.
    if (recyclable) {
      const std::uint64_t seen = taken->load(std::memory_order_acquire);
      const auto now = [] { return std::chrono::steady_clock::now(); };
      const auto busy_until = now() + std::chrono::milliseconds(5);
      while (!quiet->load(std::memory_order_acquire) && taken->load(std::memory_order_acquire) == seen &&
             death->load(std::memory_order_acquire) == kGone && now() < busy_until)
        ::usleep(100);
      if (quiet->load(std::memory_order_acquire)) {
        const auto until = now() + std::chrono::milliseconds(100);
        while (death->load(std::memory_order_acquire) == kGone && taken->load(std::memory_order_acquire) == seen &&
               now() < until)
          ::usleep(200);
      }
    }
    int gone = kGone;
    if (!death->compare_exchange_strong(gone, kEnding)) return;  // recycling
    IVLOG_INFO("guest %u went away; its worker ends now, with what the guest had queued", guest);
    ::_exit(0);
  }).detach();
}

// Recycling (docs/design.md, "Recycled workers"): only a guest that left
// nothing for the GPU to do. A record still in a ring, a parked call, a
// copy in flight or a stream with work on it means the guest died mid-run,
// and that work must not run (rule death-stops-work): the process ends.
bool Worker::nothing_under_way() {
  if (evicted_ || held_ || refused_ != CUDA_SUCCESS || cu_.handle == nullptr) return false;
  for (auto& chp : channels_) {
    if (!chp || chp->dead) continue;
    if (chp->parked.active || !chp->copies.empty() || !chp->polls.empty() || chp->req.has_data()) return false;
  }
  if (!captures_.empty()) return false;
  bool idle = true;
  streams_.for_each([&](std::uint64_t, StreamEntry& e) {
    if (idle && e.real != nullptr && cu_.cuStreamQuery(e.real) != CUDA_SUCCESS) idle = false;
  });
  ctxs_.for_each([&](std::uint64_t, CtxEntry& c) {
    if (!idle || c.real == nullptr) return;
    if (cu_.cuCtxSetCurrent(c.real) != CUDA_SUCCESS || cu_.cuStreamQuery(CU_STREAM_LEGACY) != CUDA_SUCCESS ||
        cu_.cuStreamQuery(CU_STREAM_PER_THREAD) != CUDA_SUCCESS)
      idle = false;
  });
  current_ = nullptr;  // whatever the guest had current no longer is
  return idle;
}

void Worker::release_for_recycle() noexcept {
  if (released_ || cu_.handle == nullptr) return;
  released_ = true;
  // Whether its contexts can stay for the next guest (keep.cc), decided
  // before anything goes.
  const char* unkept = cfg_.keep_contexts ? keep_reason() : "--recycle-workers on";
  IVLOG_INFO("guest %u: releasing %zu context(s), %zu allocation(s), %zu module(s) and %s for the tenant's next "
             "guest%s%s", cfg_.guest_id, ctxs_.size(), ranges_.size(), modules_.size(),
             unkept == nullptr ? "scrubbing the kept context" : "resetting the GPUs' contexts",
             unkept == nullptr || !cfg_.keep_contexts ? "" : "; not kept: ", unkept == nullptr || !cfg_.keep_contexts ? "" : unkept);
  const auto t_release = std::chrono::steady_clock::now();
  abandon_copies();
  abandon_host_nodes();
  destroy_created_pools();
  release_vmm();
  destroy_links();  // link.cc: the driver's linkers hold host memory, outside any context
  destroy_greens();  // green.cc: before the primary contexts they retain
  ctxs_.for_each([&](std::uint64_t, CtxEntry& c) {
    if (!c.primary && c.real != nullptr) cu_.cuCtxDestroy(c.real);
  });
  if (arena_registered_ && arena_ctx_ != nullptr) {
    cu_.cuCtxSetCurrent(arena_ctx_);
    cu_.cuMemHostUnregister(arena_ptr(l_.arena_off));
    arena_registered_ = false;
  }
  while (!arena_pinned_.empty()) unpin_arena(arena_pinned_.begin()->first);
  release_shared();
  kept_.live = unkept == nullptr && scrub_for_next_guest();
  if (kept_.live) {
    ++kept_.guests;
    IVLOG_INFO("guest %u: context kept for the next guest, scrubbed in %lld ms (%u guests since it was made)",
               cfg_.guest_id,
               static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::steady_clock::now() - t_release)
                                          .count()),
               kept_.guests);
  } else if (unkept == nullptr) {
    IVLOG_WARN("guest %u: scrubbing the kept context failed; resetting it", cfg_.guest_id);
  }
  if (!kept_.live) kept_ = KeptContext{};  // the module, the stream and the baseline go with the reset
  // Each GPU's primary context goes whatever its retain count: its
  // allocations, modules, streams, events, pools, graphs and registrations
  // with it. The driver gives a later context memory it has scrubbed
  // (measured on the H200: tests/programs/drv_ctx_reset; a guest of the
  // successor sees nothing of this one's).
  (void)cu_.cuCtxSetCurrent(nullptr);
  if (IVCUDA_RULE("recycle-reset-contexts") && !kept_.live)
    for (CUdevice d : devices_) {
      const auto t_reset = std::chrono::steady_clock::now();
      long long turn_ms = 0;
      {
        const context_turns::Turn turn(d, context_turns::Work::kReset);  // the driver's work on that GPU too
        turn_ms = turn.waited().count();
        (void)cu_.cuDevicePrimaryCtxReset(d);
      }
      IVLOG_INFO("guest %u: GPU %d's contexts reset %lld ms of which %lld waiting its turn", cfg_.guest_id,
                 static_cast<int>(d),
                 static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                            std::chrono::steady_clock::now() - t_reset)
                                            .count()),
                 turn_ms);
    }
  if (!kept_.live) arena_ctx_ = nullptr;
  current_ = nullptr;
  // A VM's page-locked pool is the VM's books: the process's pages go back
  // to them (unpinned above), for the VM's other processes.
  if (cfg_.vm != nullptr) {
    for (const auto& b : pool_.allocations()) (void)cfg_.vm->pool_free(b.off, b.size, cfg_.vm_slot);
    pool_.reset();
  }
  // Its quota's books: what it held goes back now (the successor starts
  // its own), and the records that die with this object change nothing.
  quota_.close();
  // The daemon zeroes the board when the guest ends ('C'), which may come
  // while the releases above still subtract from it: from nothing, they
  // would leave the next guest's count near 2^64. Nothing is charged now.
  // (A VM's board counts all its processes: close() took this one's off.)
  if (cfg_.stats != nullptr && cfg_.vm == nullptr) cfg_.stats->mem_used.store(0, std::memory_order_relaxed);
}

Result<std::unique_ptr<GuestWorker>> Worker::successor(const NextGuest& next) {
  if (next.host_fds.empty() || next.guest_fds.empty())
    return make_error(EINVAL, "a recycled worker needs at least one doorbell vector each way");
  if (cu_.handle == nullptr) return make_error(EINVAL, "this worker was recycled already");
  release_for_recycle();
  revive_host_nodes();
  WorkerConfig c = cfg_;
  c.shm_fd = next.shm_fd;
  c.host_fds = next.host_fds;
  c.guest_fds = next.guest_fds;
  c.conn_fd = -1;
  c.defer_connection = true;
  c.broker_fd = -1;
  std::unique_ptr<Worker> w(new Worker(std::move(c)));
  w->cu_ = cu_;
  w->devices_ = devices_;
  w->nvml_ = nvml_;
  w->console_rd_ = std::move(console_rd_);
  w->broker_ = std::move(broker_);
  w->driver_capture_mode_ = driver_capture_mode_;
  w->null_end_ = null_end_;  // the reservation stays in this process (reserve_null_region)
  w->init_ms_ = 0;
  w->waiter_ = std::move(waiter_);
  w->kept_ = kept_;
  if (kept_.live) w->arena_ctx_ = arena_ctx_;
  if (cfg_.vm != nullptr) {
    // The VM's next process: the same line to the supervisor, watched by the
    // same thread; and a line to the daemon of its own, so that what the last
    // process shared goes with the old line (the daemon withdraws a line's
    // shares when it ends: rule share-owner-end).
    w->death_ = death_;
    w->death_->store(kLive);
    w->death_watched_ = death_watched_;
    if (w->broker_.connected()) {
      auto line = w->broker_.new_line();
      if (!line) IVLOG_WARN("guest %u: no new fd broker line (%s): the VM's next process shares nothing",
                            cfg_.guest_id, line.error().what.c_str());
      w->broker_ = line ? BrokerClient(line->release()) : BrokerClient{};
    }
  }
  cu_.handle = nullptr;  // this object's destructor releases nothing more
  if (auto st = w->waiter_->rebind(next.host_fds[0]); !st) return st.error();
  IVCUDA_TRY(w->start_guest_side(false));
  return std::unique_ptr<GuestWorker>(std::move(w));
}

int Worker::run() {
  watch_guest_death();
  // The default 50 us timer slack would stretch every short sleep below
  // (and the uring wait's timeouts) far past what was asked.
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  auto* sb = ring::superblock(bar_.data());
  auto last_work = std::chrono::steady_clock::now();
  unsigned spins = 0;
  bool noted = false;  // quiet_ says this idle stretch's state
  while (!stop_) {
    if (!evicted_ && cfg_.stats != nullptr && cfg_.stats->evict.load(std::memory_order_acquire) != 0) evict();
    if (cfg_.stats != nullptr && cfg_.stats->suspend.load(std::memory_order_acquire) != 0 && !evicted_) {
      hold_for_suspend();
      if (hung_up_) break;
      last_work = std::chrono::steady_clock::now();
      continue;
    }
    // (After a suspension: a held worker makes no driver call, and letting
    // a process go makes several.)
    if (cfg_.vm != nullptr &&
        cfg_.vm->slot(cfg_.vm_slot).recycle.load(std::memory_order_acquire) == VmShared::kRecycleAsked) {
      recycle_asked_ = true;
      break;
    }
    const int n = serve_once();
    if (n > 0) {
      last_work = std::chrono::steady_clock::now();
      noted = false;
      continue;
    }
    // The first pass that found nothing: the loop is between calls, as quiet
    // as asleep. A guest that exits right after its last call (most short
    // programs) hangs up while the loop still spins; its death thread must
    // not take that for work under way (the worker would end instead of
    // being recycled, depending on which thread ran first).
    if (!noted) {
      note_quiet();
      noted = true;
    }
    // Spinning: the clock every 16 passes (it was a third of an idle pass),
    // the heartbeat and the connection every 1024.
    if ((++spins & 1023) == 0) {
      ring::store_relaxed(sb->host_heartbeat, ring::load_relaxed(sb->host_heartbeat) + 1);
      if (waiter_->wait(0) & UringWaiter::kHangup) {
        hung_up_ = true;
        break;
      }
    }
    if ((spins & 15) != 0 || std::chrono::steady_clock::now() - last_work < cfg_.spin) {
      ring::cpu_relax();
      continue;
    }
    sleep_until_work();
    // A guest in a VM cannot see the daemon's socket; this tells it we live.
    ring::store_relaxed(sb->host_heartbeat, ring::load_relaxed(sb->host_heartbeat) + 1);
    last_work = std::chrono::steady_clock::now() - cfg_.spin + std::chrono::microseconds(20);
  }
  // A VM's process ended (its supervisor asked after its exit notice, or it
  // said goodbye on its last channel): with nothing of it under way the
  // worker is offered as the VM's next spare; else what the dead process had
  // posted or queued must not run, and the process ends now.
  if (recycle_asked_ || (process_done_ && cfg_.vm_recycle)) {
    int expect = kLive;
    if (nothing_under_way() && death_->compare_exchange_strong(expect, kRecycling)) {
      IVLOG_INFO("guest %u: process %d ended with nothing under way; its worker becomes the VM's spare",
                 cfg_.guest_id, static_cast<int>(cfg_.vm->slot(cfg_.vm_slot).guest_pid.load()));
      cfg_.vm->slot(cfg_.vm_slot).recycle.store(VmShared::kRecycling, std::memory_order_release);
      const std::uint64_t one = 1;
      if (cfg_.vm_notify_fd >= 0) (void)!::write(cfg_.vm_notify_fd, &one, sizeof one);
      return kRecycled;
    }
    if (IVCUDA_RULE("death-stops-work")) {
      IVLOG_INFO("guest %u: process %d ended with work under way; its worker ends now", cfg_.guest_id,
                 static_cast<int>(cfg_.vm->slot(cfg_.vm_slot).guest_pid.load()));
      ::_exit(0);
    }
  }
  // The guest hung up: a recyclable worker with nothing under way takes the
  // end as clean, unless its death thread has decided already; else the
  // process ends now, as that thread would (without its moment's wait).
  if (hung_up_ && cfg_.recyclable && nothing_under_way()) {
    int expect = kLive;
    if (death_->compare_exchange_strong(expect, kRecycling) ||
        (expect == kGone && death_->compare_exchange_strong(expect, kRecycling))) {
      IVLOG_INFO("guest %u went away with nothing under way; its worker is offered for the tenant's next guest",
                 cfg_.guest_id);
      return kRecycled;  // successor() releases and resets
    }
  }
  if (hung_up_ && cfg_.conn_fd >= 0 && IVCUDA_RULE("death-stops-work")) {
    IVLOG_INFO("guest %u went away; its worker ends now, with what the guest had queued", cfg_.guest_id);
    ::_exit(0);
  }
  IVLOG_INFO("guest %u went away; releasing %zu context(s), %zu allocation(s), %zu module(s)",
             cfg_.guest_id, ctxs_.size(), ranges_.size(), modules_.size());
  cleanup();
  return 0;
}

}  // namespace ivcuda::host
