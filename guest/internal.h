// Helpers every forwarded API family of the guest uses (guest/contexts.cc,
// modules.cc, streams.cc, memory.cc, ...): the runtime or the reason there is
// none, the current context, and the local books of streams and events.
#pragma once

#include <cuda.h>

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "guest/guard.h"
#include "guest/runtime.h"

namespace ivcuda::guest {

// The calling thread's whole staging area (guest/memory.cc), for a transfer
// that is not a pipelined copy's chunk (2D and 3D bands, module images, array
// map lists): *lk holds the area's lock (threads sharing the overflow channel
// share the area, one copy at a time), taken once the chunks still in flight
// on the channel are done. An error is the first error of posted work, which
// the wait may have had to collect.
[[nodiscard]] CUresult take_staging(Runtime* rt, std::uint64_t ctx, std::unique_lock<std::mutex>* lk);

// Runs use(arena_off) with `bytes` of the arena to itself for a one-off
// transfer (a module image, a linker input or output): the staging area when
// they fit, else a temporary block of page-locked arena memory, freed after.
template <class F>
CUresult with_arena_block(Runtime* rt, std::uint64_t ctx, std::size_t bytes, F&& use) {
  std::unique_lock<std::mutex> staging_lock;
  if (bytes <= rt->staging_size()) {
    if (CUresult st = take_staging(rt, ctx, &staging_lock); st != CUDA_SUCCESS) return st;
    return use(rt->staging_off());
  }
  proto::RepHostAlloc a{};
  if (CUresult st = rt->call<proto::Op::kHostAlloc>(proto::ReqHostAlloc{bytes, 0, 0}, {}, &a); st != CUDA_SUCCESS)
    return st;
  const CUresult st = use(a.arena_off);
  (void)rt->call<proto::Op::kHostFree>(proto::ReqArenaOff{a.arena_off});
  return st;
}

}  // namespace ivcuda::guest

namespace ivcuda::guest::internal {

// The runtime, or the reason there is none (before cuInit: NOT_INITIALIZED;
// after the daemon went away: DEVICE_UNAVAILABLE).
inline Runtime* rt_or(CUresult* st) {
  Runtime* rt = Runtime::current();
  if (rt == nullptr) {
    *st = CUDA_ERROR_NOT_INITIALIZED;
    return nullptr;
  }
  if (rt->dead()) {
    *st = CUDA_ERROR_DEVICE_UNAVAILABLE;
    return nullptr;
  }
  *st = CUDA_SUCCESS;
  return rt;
}

// The same, as an out-parameter and a status.
inline CUresult runtime(Runtime** rt) {
  CUresult st;
  *rt = rt_or(&st);
  return st;
}

inline std::uint64_t h(const void* p) { return reinterpret_cast<std::uint64_t>(p); }

// An enum argument as the int the caller passed: any value may come through
// the C ABI, and loading one outside the enum's range as the enum is
// undefined (UBSan's -fsanitize=enum says so). Compare the int instead.
template <class E>
int raw_enum(const E& e) noexcept {
  static_assert(std::is_enum_v<E> && sizeof(E) == sizeof(int));
  int v = 0;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

// The stream a _ptsz entry point means: its null stream is the per-thread one.
inline CUstream ptsz(CUstream s) { return s == nullptr ? CU_STREAM_PER_THREAD : s; }

inline bool known_stream(Runtime* rt, CUstream s) {
  const auto v = h(s);
  if (v == 0 || v == reinterpret_cast<std::uint64_t>(CU_STREAM_LEGACY) ||
      v == reinterpret_cast<std::uint64_t>(CU_STREAM_PER_THREAD))
    return true;
  std::lock_guard lk(rt->books_mu);
  return rt->streams.count(v) != 0;
}

// The green context whose converted context `ctx` is, or 0 (guest/green.cc).
inline std::uint64_t green_of_ctx(Runtime* rt, std::uint64_t ctx) {
  std::lock_guard lk(rt->books_mu);
  const auto it = rt->ctx_green.find(ctx);
  return it == rt->ctx_green.end() ? 0 : it->second;
}

inline bool known_event(Runtime* rt, CUevent e) {
  std::lock_guard lk(rt->books_mu);
  return rt->events.count(h(e)) != 0;
}

// Is p inside device memory this process allocated (for cuMemcpy's unified
// addressing)?
inline bool is_device(Runtime* rt, std::uint64_t p) {
  std::lock_guard lk(rt->books_mu);
  auto it = rt->dev_allocs.upper_bound(p);
  if (it == rt->dev_allocs.begin()) return false;
  --it;
  return p - it->first < it->second;
}

// Where [p, p + n) lies in this process's books of device memory:
// kInside one allocation that is backed for as long as it is booked;
// kOverruns one (it starts in it and runs past its end: the driver refuses
// that at once); kUnknown elsewhere, or in a reserved address range (whose
// pages come and go with cuMemMap).
enum class DevRange { kInside, kOverruns, kUnknown };
inline DevRange device_range(Runtime* rt, std::uint64_t p, std::uint64_t n) {
  std::lock_guard lk(rt->books_mu);
  auto it = rt->dev_allocs.upper_bound(p);
  if (it == rt->dev_allocs.begin()) return DevRange::kUnknown;
  --it;
  const std::uint64_t off = p - it->first;
  if (off >= it->second) return DevRange::kUnknown;
  if (n > it->second - off) return DevRange::kOverruns;
  return rt->va_reservations.count(it->first) == 0 ? DevRange::kInside : DevRange::kUnknown;
}
inline bool in_device_alloc(Runtime* rt, std::uint64_t p, std::uint64_t n) {
  return device_range(rt, p, n) == DevRange::kInside;
}

// The id the host tells this process's calls apart by, where that matters
// (IPC and pool sharing: one worker serves every process of a VM).
inline std::uint32_t proc_id() { return static_cast<std::uint32_t>(::getpid()); }

// Shareable handles (guest/vmm.cc). What the application holds for an
// object the host exported as a file descriptor (a physical allocation, a
// memory pool) is a sealed memfd holding the host's 128-bit token for it: it
// travels like any fd (SCM_RIGHTS, fork) and carries no authority of its own,
// since the host honours a token only for the tenant it issued it to.
inline constexpr std::size_t kShareTokenBytes = 16;
// A new sealed memfd holding `token`: CUDA_SUCCESS and *fd, or OPERATING_SYSTEM.
CUresult make_share_fd(const std::uint8_t (&token)[kShareTokenBytes], int* fd);
// The token an fd holds, or false for any fd that is not one of ours.
bool read_share_fd(int fd, std::uint8_t (&token)[kShareTokenBytes]);

// Synchronous copies between device memory and guest memory the library
// owns (guest/memory.cc), without managed memory's hand-over: managed.cc
// moves its blocks with them.
[[nodiscard]] CUresult copy_to_device(Runtime* rt, std::uint64_t ctx, CUdeviceptr dst, const void* src, std::size_t n);
[[nodiscard]] CUresult copy_to_host(Runtime* rt, std::uint64_t ctx, void* dst, CUdeviceptr src, std::size_t n);

// cuMemFree / cuMemFreeAsync (async: on `s`) of a pointer this process
// imported from another process's pool (guest/pools.cc): true when it was
// one, with the answer in *st; false for any other pointer.
bool free_pool_import(Runtime* rt, CUdeviceptr d, CUstream s, bool async, CUresult* st);

}  // namespace ivcuda::guest::internal

// In a function returning CUresult: `rt`, or return why there is none.
#define NEED_RT()                                     \
  CUresult st_rt_;                                    \
  Runtime* rt = ::ivcuda::guest::internal::rt_or(&st_rt_); \
  if (rt == nullptr) return st_rt_

// In a function returning CUresult: `ctx`, the current context's handle.
#define NEED_CTX()                                    \
  const std::uint64_t ctx = ::ivcuda::guest::current_ctx(); \
  if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT
