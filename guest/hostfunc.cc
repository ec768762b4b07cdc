// cuLaunchHostFunc and cuStreamAddCallback. The function is guest code, so it
// runs here, in this process, on a dispatcher thread; the stream on the host
// only has to say when the earlier work is done and hold the later work until
// the function has returned. It does both with two stream memory operations
// on a pair of arena words (docs/design.md, "Host functions"):
//
//   GPU: reached := seq   (after all earlier work in the stream)
//   GPU: wait until done >= seq (wrap-aware)
//   dispatcher: sees reached == seq, calls fn(data), done := seq
//
// Memory ordering: the dispatcher's load_acquire of `reached` pairs with the
// GPU's write (a release in stream order: the earlier work is visible before
// it); its store_release of `done` pairs with the GPU's wait, so what fn wrote
// to page-locked memory is there for the work after it.
//
// Words are never reset: each use of a pair takes the pair's next seq, so a
// GPU wait still pending on the previous seq of a recycled pair stays
// satisfied, and a stale `reached` never equals the new seq.
//
// The dispatcher never makes CUDA calls (it only reads and writes arena
// words), so a stream can wait on it while other threads call the driver.
#include <cuda.h>
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "guest/graphs.h"
#include "guest/guard.h"
#include "guest/internal.h"
#include "guest/runtime.h"
#include "ring/spsc_ring.h"
#include "guest/family.h"

namespace {

constexpr std::uint64_t kChunkBytes = 4096;      // one arena block holds this many pairs
constexpr std::uint64_t kPairBytes = 2 * sizeof(std::uint32_t);
constexpr unsigned kSpinPolls = 2000;            // polls before sleeping (a few tens of us)
constexpr auto kShortSleep = std::chrono::microseconds(20);
constexpr auto kLongSleep = std::chrono::microseconds(50);
constexpr auto kWatchSleep = std::chrono::microseconds(500);
constexpr unsigned kShortSleeps = 50;            // ~1 ms of short sleeps, then long ones
// Graph host nodes that ran within this long are likely to run again soon
// (a graph replayed in a loop): until then the watch sleeps as long as a
// pending call's, not kWatchSleep, which would stall every replay.
constexpr auto kWatchHot = std::chrono::milliseconds(100);

// One pair of arena words: `reached` at off, `done` at off + 4.
struct Pair {
  std::uint64_t off = 0;  // BAR offset
  std::uint32_t seq = 0;  // the last seq used on this pair
};

struct Pending {
  Pair pair;
  CUhostFn fn = nullptr;             // cuLaunchHostFunc
  CUstreamCallback cb = nullptr;     // cuStreamAddCallback
  CUstream stream = nullptr;         // what cb is given
  void* data = nullptr;
};

// Process-wide. Allocated once and never destroyed: the detached dispatcher
// may still be sleeping on `cv` while static destructors run at exit.
// A graph host node's pair (graph_build.cc): the host's driver runs the node as a
// callback of the worker that adds one to `reached` and waits until `done`
// catches up, once per execution of the node, so the pair is watched for as
// long as the process lives: every step of `reached` runs the function once.
struct Watcher {
  std::uint64_t off = 0;      // the pair's BAR offset
  std::uint32_t handled = 0;  // the last `reached` value run
  CUhostFn fn = nullptr;
  void* data = nullptr;
  bool once = false;          // a user object's destructor: runs once, then unwatched
};

struct Dispatcher {
  std::mutex mu;                     // guards everything below
  std::condition_variable cv;        // pending or watchers became non-empty
  std::vector<Pending> pending;      // in submission order
  std::vector<Pair> free_pairs;
  std::vector<Watcher> watchers;
  bool started = false;
};

Dispatcher* g_disp = nullptr;
std::once_flag g_disp_once;

// After fork the child has no dispatcher thread, and the pairs belong to the
// parent (the arena is shared with it): the child starts from a fresh, empty
// dispatcher. The old one is leaked on purpose, its mutex and condition
// variable may hold state of threads the child does not have.
void before_fork() noexcept {
  if (g_disp != nullptr) g_disp->mu.lock();
}
void after_fork_parent() noexcept {
  if (g_disp != nullptr) g_disp->mu.unlock();
}
void after_fork_child() noexcept { g_disp = new (std::nothrow) Dispatcher; }

Dispatcher* dispatcher() {
  std::call_once(g_disp_once, [] {
    g_disp = new Dispatcher;
    if (::pthread_atfork(before_fork, after_fork_parent, after_fork_child) != 0) throw std::bad_alloc();
  });
  if (g_disp == nullptr) throw std::bad_alloc();  // a failed allocation in a fork child
  return g_disp;
}

std::uint32_t* word(Runtime* rt, std::uint64_t off) { return reinterpret_cast<std::uint32_t*>(rt->bar() + off); }

void run_one(const Pending& p) {
  if (p.fn != nullptr)
    p.fn(p.data);
  else
    p.cb(p.stream, CUDA_SUCCESS, p.data);
}

// The dispatcher thread. Idle, it sleeps on the condition variable; with work
// pending it polls the `reached` words, spinning first and then sleeping in
// short steps, and runs ready functions in submission order (within a stream
// the GPU makes them ready in stream order already).
[[noreturn]] void dispatch_loop(Dispatcher* d) {
  Runtime* rt = Runtime::current();
  unsigned idle = 0;
  auto watcher_ran = std::chrono::steady_clock::time_point{};
  std::unique_lock lk(d->mu);
  for (;;) {
    d->cv.wait(lk, [&] { return !d->pending.empty() || !d->watchers.empty(); });
    bool ran = false;
    for (std::size_t i = 0; i < d->watchers.size() && !ran; ++i) {
      Watcher& w = d->watchers[i];
      // Pairs with the worker's fetch_add on `reached` (host-daemon/worker/graph_build.cc,
      // host_node_call).
      const std::uint32_t v = ivcuda::ring::load_acquire(*word(rt, w.off));
      if (v == w.handled) continue;
      const Watcher run = w;
      w.handled = run.handled + 1;
      // Its pair is not reused: `reached` no longer follows the seq scheme.
      if (run.once) d->watchers.erase(d->watchers.begin() + static_cast<std::ptrdiff_t>(i));
      lk.unlock();
      run.fn(run.data);
      // Pairs with the worker's load_acquire of `done`: the node completes.
      ivcuda::ring::store_release(*word(rt, run.off + sizeof(std::uint32_t)), run.handled + 1);
      lk.lock();
      ran = true;
      watcher_ran = std::chrono::steady_clock::now();
    }
    if (ran) {
      idle = 0;
      continue;
    }
    for (std::size_t i = 0; i < d->pending.size(); ++i) {
      const Pending p = d->pending[i];
      std::uint32_t* reached = word(rt, p.pair.off);
      // Pairs with the GPU's write of `reached` (or the daemon's failure
      // mark, host-daemon/worker/hostfunc.cc on_HostFunc's store_release).
      const std::uint32_t v = ivcuda::ring::load_acquire(*reached);
      const bool ready = v == p.pair.seq;
      const bool failed = v == (p.pair.seq | proto::kHostFuncFailed) || rt->dead();
      if (!ready && !failed) continue;
      d->pending.erase(d->pending.begin() + static_cast<std::ptrdiff_t>(i));
      if (ready) {
        lk.unlock();
        run_one(p);
        // Pairs with the GPU's wait on `done`: the stream resumes, and sees
        // what the function wrote, only after this store.
        ivcuda::ring::store_release(*word(rt, p.pair.off + sizeof(std::uint32_t)), p.pair.seq);
        lk.lock();
      }
      // Reusable now: the next use takes seq + 1, which neither this pair's
      // `reached` nor `done` holds yet.
      if (p.pair.seq + 1 < proto::kHostFuncFailed) d->free_pairs.push_back(p.pair);
      ran = true;
      break;  // `pending` may have changed while unlocked: rescan from the start
    }
    if (ran) {
      idle = 0;
      continue;
    }
    lk.unlock();
    if (idle < kSpinPolls) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else {
      // Only graph host nodes watched: they may not run for a long time.
      const bool only_watchers =
          d->pending.empty() && std::chrono::steady_clock::now() - watcher_ran > kWatchHot;
      std::this_thread::sleep_for(idle < kSpinPolls + kShortSleeps ? kShortSleep
                                  : only_watchers                  ? kWatchSleep
                                                                   : kLongSleep);
    }
    if (idle < kSpinPolls + kShortSleeps) ++idle;
    lk.lock();
  }
}

// Starts the dispatcher on first use. It is detached and lives until the
// process ends: functions still pending at exit() run while exit handlers
// (cudart's synchronizing ones among them) wait for them. It takes no signals,
// which belong to the application's threads.
void ensure_started(Dispatcher* d) {
  std::lock_guard lk(d->mu);
  if (d->started) return;
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  try {
    std::thread t(dispatch_loop, d);
    ::pthread_setname_np(t.native_handle(), "ivcuda-hostfn");
    t.detach();
  } catch (...) {
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    throw;
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  d->started = true;
}

// A pair with its next seq, its words holding neither that seq nor anything
// the GPU waits for. New pairs come from a fresh arena block (the calling
// thread allocates it; the dispatcher never calls the daemon).
CUresult take_pair(Runtime* rt, Dispatcher* d, Pair* out) {
  {
    std::lock_guard lk(d->mu);
    if (!d->free_pairs.empty()) {
      *out = d->free_pairs.back();
      d->free_pairs.pop_back();
      ++out->seq;
      return CUDA_SUCCESS;
    }
  }
  proto::RepHostAlloc a{};
  if (const CUresult st = rt->call<proto::Op::kHostAlloc>(proto::ReqHostAlloc{kChunkBytes, 0, 0}, {}, &a);
      st != CUDA_SUCCESS)
    return st;
  // An arena block may hold an earlier owner's bytes: a stale `reached` must
  // not look like seq 1.
  std::memset(rt->bar() + a.arena_off, 0, kChunkBytes);
  std::lock_guard lk(d->mu);
  for (std::uint64_t o = kPairBytes; o + kPairBytes <= kChunkBytes; o += kPairBytes)
    d->free_pairs.push_back(Pair{a.arena_off + o, 0});
  *out = Pair{a.arena_off, 1};
  return CUDA_SUCCESS;
}

CUresult launch_host(CUstream s, Pending p) {
  return guard([&] {
    Runtime* rt = Runtime::current();
    if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    if (rt->dead()) return CUDA_ERROR_DEVICE_UNAVAILABLE;
    const std::uint64_t ctx = ivcuda::guest::current_ctx();
    if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (!known_stream(rt, s)) return CUDA_ERROR_INVALID_HANDLE;
    // Without the arena's device alias the GPU cannot reach the words.
    const std::uint64_t dev_base = rt->hello().arena_device_base;
    if (dev_base == 0) return CUDA_ERROR_NOT_SUPPORTED;
    Dispatcher* d = dispatcher();
    ensure_started(d);
    if (const CUresult st = take_pair(rt, d, &p.pair); st != CUDA_SUCCESS) return st;
    proto::ReqHostFunc r{};
    r.ctx = ctx;
    r.stream = reinterpret_cast<std::uint64_t>(s);
    r.reached = dev_base + p.pair.off;
    r.done = dev_base + p.pair.off + sizeof(std::uint32_t);
    r.seq = p.pair.seq;
    if (const CUresult st = rt->post<proto::Op::kHostFunc>(r); st != CUDA_SUCCESS) {
      // Not sent: the pair was never handed to the GPU; seq stays consumed.
      std::lock_guard lk(d->mu);
      d->free_pairs.push_back(p.pair);
      return st;
    }
    {
      std::lock_guard lk(d->mu);
      d->pending.push_back(p);
    }
    d->cv.notify_one();
    return CUDA_SUCCESS;
  });
}

}  // namespace

CUresult ivcuda::guest::host_node_pair(CUhostFn fn, void* data, std::uint64_t* off, bool once) noexcept {
  return guard([&] {
    Runtime* rt = Runtime::current();
    if (rt == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
    if (rt->hello().arena_device_base == 0) return CUDA_ERROR_NOT_SUPPORTED;
    Dispatcher* d = dispatcher();
    ensure_started(d);
    if (!once) {
      std::lock_guard lk(d->mu);
      for (const Watcher& w : d->watchers)
        if (!w.once && w.fn == fn && w.data == data) {
          *off = w.off;
          return CUDA_SUCCESS;
        }
    }
    Pair p;
    if (const CUresult st = take_pair(rt, d, &p); st != CUDA_SUCCESS) return st;
    // The words keep what an earlier use left; `done` trails `reached`.
    Watcher w{p.off, ivcuda::ring::load_acquire(*word(rt, p.off)), fn, data, once};
    ivcuda::ring::store_release(*word(rt, p.off + sizeof(std::uint32_t)), w.handled);
    {
      std::lock_guard lk(d->mu);
      d->watchers.push_back(w);
    }
    d->cv.notify_one();
    *off = p.off;
    return CUDA_SUCCESS;
  });
}

bool ivcuda::guest::host_node_of(std::uint64_t off, CUhostFn* fn, void** data) noexcept {
  Dispatcher* d = g_disp;
  if (d == nullptr) return false;
  std::lock_guard lk(d->mu);
  for (const Watcher& w : d->watchers)
    if (w.off == off) {
      *fn = w.fn;
      *data = w.data;
      return true;
    }
  return false;
}

CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void* data) {
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return launch_host(s, Pending{{}, fn, nullptr, nullptr, data});
}

CUresult cuStreamAddCallback(CUstream s, CUstreamCallback cb, void* data, unsigned int flags) {
  if (cb == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  // The callback is given the stream as the application named it.
  return launch_host(s, Pending{{}, nullptr, cb, s, data});
}

// cuda.h declares the _ptsz forms only for per-thread-default-stream builds:
// without extern "C" these would be C++ symbols and the weak stubs would stay.
extern "C" {

CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void* data) {
  return cuLaunchHostFunc(s == nullptr ? CU_STREAM_PER_THREAD : s, fn, data);
}

CUresult cuStreamAddCallback_ptsz(CUstream s, CUstreamCallback cb, void* data, unsigned int flags) {
  if (cb == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return launch_host(s == nullptr ? CU_STREAM_PER_THREAD : s, Pending{{}, nullptr, cb, s, data});
}

}  // extern "C"
