// What a hostile guest must not get from its worker (issue 28, items 1, 3, 4
// and 12): a copy into the worker's own memory captured into a graph, device
// memory outside its quota (contexts, their limits, pools' reserves), and
// context flags that make the driver write files on the host. Each case fails
// with its rule removed (IVCUDA_MUTATE=id against the asan build; the ids are
// in docs/security.md's rule table).
#include <catch2/catch.hpp>

#include <cuda.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ivcuda/proto.h"
#include "ring/layout.h"
#include "tests/process/raw_guest.h"

using namespace ivcuda;
using namespace ivcuda::testing;
using proto::Op;

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

// An environment variable for the daemons started while it lives (they
// inherit it when they fork).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_.c_str(), old_->c_str(), 1);
    else ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

void hello(RawGuest& g, std::uint32_t c = 0) {
  proto::ReqHello h{proto::kProtoVersion, static_cast<std::uint32_t>(::getpid()), 0, 0, {}};
  REQUIRE(g.call(c, Op::kHello, h) == CUDA_SUCCESS);
}

std::uint64_t primary(RawGuest& g, int device = 0) {
  std::vector<std::byte> out;
  REQUIRE(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{device, 0}, &out) == CUDA_SUCCESS);
  return RawGuest::as<proto::RepHandle>(out).handle;
}

proto::RepMemInfo mem_info(RawGuest& g, std::uint64_t ctx) {
  std::vector<std::byte> out;
  REQUIRE(g.call(0, Op::kMemGetInfo, proto::ReqCtx{ctx}, &out) == CUDA_SUCCESS);
  return RawGuest::as<proto::RepMemInfo>(out);
}

// A call whose reply is read later (wait_reply), so that the guest can do
// something else on another channel meanwhile.
void submit(RawGuest& g, std::uint32_t c, Op op, const void* req, std::size_t n) {
  auto& ch = g.chans[c];
  abi::RecordHeader h{};
  h.op = static_cast<std::uint16_t>(op);
  h.flags = abi::kRecNeedsReply;
  h.len = static_cast<std::uint32_t>(n);
  h.seq = g.seq++;
  ring::RingStatus st;
  std::byte* p = ch.req.reserve(h, &st);
  REQUIRE(p != nullptr);
  std::memcpy(p, req, n);
  ch.req.commit();
  ch.req.publish();
  ch.bell->ring();
}

CUresult wait_reply(RawGuest& g, std::uint32_t c, std::vector<std::byte>* out, int seconds) {
  auto& ch = g.chans[c];
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  ring::Record rec;
  while (std::chrono::steady_clock::now() < until) {
    if (ch.cpl.poll(&rec) == ring::RingStatus::kOk) {
      out->assign(rec.payload.begin(), rec.payload.end());
      ch.cpl.consume();
      ch.cpl.publish_head();
      return static_cast<CUresult>(rec.hdr.status);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return static_cast<CUresult>(-1);
}

proto::ReqMemPool pool_req(std::uint64_t ctx, std::uint64_t pool, std::uint32_t kind, std::int32_t attr = 0,
                           std::uint64_t value = 0) {
  proto::ReqMemPool r{};
  r.ctx = ctx;
  r.pool = pool;
  r.kind = kind;
  r.attr = attr;
  r.value = value;
  return r;
}

std::uint64_t pool_reserved(RawGuest& g, std::uint64_t ctx, std::uint64_t pool) {
  std::vector<std::byte> out;
  REQUIRE(g.call(0, Op::kMemPool, pool_req(ctx, pool, proto::kPoolGetAttr, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
                 &out) == CUDA_SUCCESS);
  return static_cast<std::uint64_t>(RawGuest::as<proto::RepValue>(out).value);
}

}  // namespace

// Issue 28 item 1 (rule parked-copy-capture): channel 0's small DtoH waits for
// a staged chunk still in flight (the double holds events NOT_READY for a
// second, as a busy GPU does); channel 1 begins capturing the copy's stream
// meanwhile. Issued into the capture, the copy would become a graph node that
// writes into a worker buffer freed after the reply, at every launch.
TEST_CASE("a parked DtoHInline whose stream began capturing while it waited is refused and not captured",
          "[process][hostile]") {
  std::optional<Daemon> dp;
  {
    ScopedEnv delay("IVCUDA_GPU_DOUBLE_EVENT_DELAY_US", "1000000");
    dp.emplace(std::vector<std::string>{}, "-capture");
  }
  Daemon& d = *dp;
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  g.open(0);
  g.open(1);  // a second thread of the same guest process
  hello(g);
  const std::uint64_t ctx = primary(g);
  std::vector<std::byte> out;
  constexpr std::uint64_t kN = proto::kInlineCopyMax;
  REQUIRE(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx, 2 * kN, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
  const std::uint64_t dptr = RawGuest::as<proto::RepMemAlloc>(out).dptr;
  REQUIRE(g.call(0, Op::kStreamCreate, proto::ReqStreamCreate{ctx, CU_STREAM_NON_BLOCKING, 0}, &out) ==
          CUDA_SUCCESS);
  const std::uint64_t s = RawGuest::as<proto::RepHandle>(out).handle;

  proto::ReqCopy chunk{};  // a staged chunk whose event stays in flight
  chunk.ctx = ctx;
  chunk.dst = dptr + kN;
  chunk.bytes = 4096;
  chunk.arena_off = ring::staging_off(g.l, 0);
  g.post(0, Op::kMemcpyHtoDArena, chunk);
  proto::ReqCopy in{};
  in.ctx = ctx;
  in.stream = s;
  in.src = dptr;
  in.bytes = kN;
  in.flags = proto::kAsync;
  submit(g, 0, Op::kMemcpyDtoHInline, &in, sizeof in);  // parks behind the chunk
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  REQUIRE(g.call(1, Op::kStreamBeginCapture, proto::ReqCapture{ctx, s, CU_STREAM_CAPTURE_MODE_RELAXED, 0}) ==
          CUDA_SUCCESS);

  // Served now, the copy finds the capture and is refused; the capture is
  // invalidated as the driver invalidates one for an illegal call.
  CHECK(wait_reply(g, 0, &out, 10) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  const CUresult end = g.call(1, Op::kStreamEndCapture, proto::ReqHandle{ctx, s}, &out);
  CHECK(end == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  if (end == CUDA_SUCCESS) {
    // What the rule prevents: the graph holds the copy into freed worker memory.
    const std::uint64_t graph = RawGuest::as<proto::RepHandle>(out).handle;
    REQUIRE(g.call(1, Op::kGraphNodeCount, proto::ReqHandle{ctx, graph}, &out) == CUDA_SUCCESS);
    CHECK(RawGuest::as<proto::RepValue>(out).value == 0);
  }
  // Outside a capture the same copy is served, from the device.
  in.stream = s;
  REQUIRE(g.call(0, Op::kMemcpyDtoHInline, in, &out) == CUDA_SUCCESS);
  CHECK(out.size() == sizeof(proto::RepCopyInline) + kN);
  CHECK(g.call(0, Op::kCtxSynchronize, proto::ReqCtx{ctx}) == CUDA_SUCCESS);
  CHECK(d.alive());
}

// Issue 28 items 3 and 4 (rule context-charged): every context a worker holds
// for its guest costs device memory (440-500 MiB on an H200) and is charged to
// the guest's quota, or refused.
TEST_CASE("every context a worker holds for its guest is charged to the guest's quota", "[process][hostile]") {
  std::optional<Daemon> dp;
  {
    ScopedEnv two("IVCUDA_GPU_DOUBLE_DEVICES", "2");
    dp.emplace(std::vector<std::string>{"--mem-limit", "1G", "--context-reserve", "256M"}, "-contexts");
  }
  Daemon& d = *dp;
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  g.open(0);
  hello(g);
  const std::uint64_t ctx = primary(g);
  // The context the worker started with is the guest's first.
  proto::RepMemInfo m = mem_info(g, ctx);
  CHECK(m.total == 1024 * kMiB);
  CHECK(m.free == 768 * kMiB);
  std::vector<std::byte> out;
  // Another GPU's primary context is made for the guest: charged while retained.
  const std::uint64_t other = primary(g, 1);
  CHECK(mem_info(g, ctx).free == 512 * kMiB);
  REQUIRE(g.call(0, Op::kPrimaryRelease, proto::ReqDevice{1, 0}) == CUDA_SUCCESS);
  CHECK(mem_info(g, ctx).free == 768 * kMiB);
  (void)other;
  // Created contexts, up to the quota; then refused, and nothing else changes.
  std::vector<std::uint64_t> made;
  for (int i = 0; i < 3; ++i) {
    REQUIRE(g.call(0, Op::kCtxCreate, proto::ReqDeviceFlags{0, 0}, &out) == CUDA_SUCCESS);
    made.push_back(RawGuest::as<proto::RepHandle>(out).handle);
  }
  CHECK(mem_info(g, ctx).free == 0);
  CHECK(g.call(0, Op::kCtxCreate, proto::ReqDeviceFlags{0, 0}, &out) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{1, 0}, &out) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx, kMiB, 0, 0, 0, 0}, &out) == CUDA_ERROR_OUT_OF_MEMORY);
  // A destroyed context gives its share back.
  REQUIRE(g.call(0, Op::kCtxDestroy, proto::ReqHandle{0, made.back()}) == CUDA_SUCCESS);
  CHECK(mem_info(g, ctx).free == 256 * kMiB);
  CHECK(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx, kMiB, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
  CHECK(d.alive());
}

TEST_CASE("a guest whose quota cannot cover its worker's context is refused with OUT_OF_MEMORY",
          "[process][hostile]") {
  Daemon d({"--mem-limit", "128M", "--context-reserve", "256M"}, "-refused");
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  g.open(0);
  proto::ReqHello h{proto::kProtoVersion, static_cast<std::uint32_t>(::getpid()), 0, 0, {}};
  CHECK(g.call(0, Op::kHello, h) == CUDA_ERROR_OUT_OF_MEMORY);
  // Nothing reaches the driver: the worker made no context to serve it in.
  CHECK(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(g.call(0, Op::kDeviceInfo, proto::ReqDevice{0, 0}) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(d.alive());
  // A quota that covers it serves the same guest.
  Daemon big({"--mem-limit", "512M", "--context-reserve", "256M"}, "-covered");
  RawGuest g2(big.sock);
  g2.open(0);
  CHECK(g2.call(0, Op::kHello, h) == CUDA_SUCCESS);
}

// In a VM every process's worker holds a context, charged to the VM's quota
// that its processes share (issue 28 item 3: one connection could hold up to
// 264 uncharged workers).
TEST_CASE("a VM's processes' workers charge their contexts to the VM's quota and one that does not fit is refused",
          "[process][hostile]") {
  Daemon d({"--vm-spare-workers", "0", "--mem-limit", "1G", "--context-reserve", "400M"}, "-vmctx");
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  const pid_t a = ::getpid() + 100000, b = ::getpid() + 200000, c = ::getpid() + 300000;
  const auto hello_of = [](pid_t pid) {
    return proto::ReqHello{proto::kProtoVersion, static_cast<std::uint32_t>(pid), 0, 0, {}};
  };
  g.open(0, a);
  g.open(1, b);
  REQUIRE(g.call(0, Op::kHello, hello_of(a)) == CUDA_SUCCESS);
  REQUIRE(g.call(1, Op::kHello, hello_of(b)) == CUDA_SUCCESS);
  const std::uint64_t ctx = primary(g);
  CHECK(mem_info(g, ctx).free == 224 * kMiB);  // two contexts of 400 MiB in the VM's 1 GiB
  g.open(2, c);
  CHECK(g.call(2, Op::kHello, hello_of(c)) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(g.call(2, Op::kPrimaryRetain, proto::ReqDevice{0, 0}) == CUDA_ERROR_OUT_OF_MEMORY);
  // b's process ends: its worker's context goes back to the VM.
  REQUIRE(g.call(1, Op::kGoodbye, proto::ReqCtx{0}) == CUDA_SUCCESS);
  std::uint64_t free = 0;
  for (int i = 0; i < 300 && (free = mem_info(g, ctx).free) != 624 * kMiB; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(free == 624 * kMiB);
  CHECK(d.alive());
}

// Issue 28 item 4 (rule context-limits-charged): a stack is reserved for every
// thread the device can hold, the malloc heap and the printf FIFO are device
// memory, so a limit is charged for what it reserves beyond the context's own.
TEST_CASE("what a context's limits reserve on the device is charged to the guest's quota", "[process][hostile]") {
  Daemon d({"--mem-limit", "1G", "--context-reserve", "0"}, "-limits");
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  g.open(0);
  hello(g);
  const std::uint64_t ctx = primary(g);
  std::vector<std::byte> out;
  auto get = [&](CUlimit l) {
    REQUIRE(g.call(0, Op::kCtxGetLimit, proto::ReqLimit{ctx, 0, l, 0}, &out) == CUDA_SUCCESS);
    return static_cast<std::uint64_t>(RawGuest::as<proto::RepValue>(out).value);
  };
  auto set = [&](CUlimit l, std::uint64_t v) { return g.call(0, Op::kCtxSetLimit, proto::ReqLimit{ctx, v, l, 0}); };
  const std::uint64_t heap = get(CU_LIMIT_MALLOC_HEAP_SIZE);
  const std::uint64_t fifo = get(CU_LIMIT_PRINTF_FIFO_SIZE);
  const std::uint64_t stack = get(CU_LIMIT_STACK_SIZE);
  REQUIRE(set(CU_LIMIT_MALLOC_HEAP_SIZE, heap + 600 * kMiB) == CUDA_SUCCESS);
  CHECK(mem_info(g, ctx).free == 424 * kMiB);
  CHECK(set(CU_LIMIT_PRINTF_FIFO_SIZE, fifo + 600 * kMiB) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(get(CU_LIMIT_PRINTF_FIFO_SIZE) == fifo);  // refused before the driver saw it
  // Lowered, the heap gives its memory back.
  REQUIRE(set(CU_LIMIT_MALLOC_HEAP_SIZE, heap) == CUDA_SUCCESS);
  CHECK(mem_info(g, ctx).free == 1024 * kMiB);
  // The double's device holds 132 x 2048 threads, as an H100/H200 does: 2 KiB
  // more stack each is 528 MiB; 64 KiB more would be 16.5 GiB.
  CHECK(set(CU_LIMIT_STACK_SIZE, stack + 64 * 1024) == CUDA_ERROR_OUT_OF_MEMORY);
  REQUIRE(set(CU_LIMIT_STACK_SIZE, stack + 2048) == CUDA_SUCCESS);
  CHECK(mem_info(g, ctx).free == (1024 - 528) * kMiB);
  CHECK(set(CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, 1u << 20) == CUDA_ERROR_OUT_OF_MEMORY);
  REQUIRE(set(CU_LIMIT_STACK_SIZE, stack) == CUDA_SUCCESS);
  CHECK(mem_info(g, ctx).free == 1024 * kMiB);
  CHECK(d.alive());
}

// Issue 28 item 4 (rule pool-reserve-charged): a pool with a high release
// threshold keeps what is freed into it; with a pool per allocation, each
// keeping up to the quota, a guest would hold pools x quota. What a pool keeps
// stays charged, and before a charge is refused the pools give it back.
TEST_CASE("what a memory pool keeps after frees is charged to the guest's quota", "[process][hostile]") {
  Daemon d({"--mem-limit", "64M", "--context-reserve", "0"}, "-pools");
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  g.open(0);
  hello(g);
  const std::uint64_t ctx = primary(g);
  std::vector<std::byte> out;
  REQUIRE(g.call(0, Op::kStreamCreate, proto::ReqStreamCreate{ctx, CU_STREAM_NON_BLOCKING, 0}, &out) ==
          CUDA_SUCCESS);
  const std::uint64_t s = RawGuest::as<proto::RepHandle>(out).handle;
  auto make_pool = [&] {
    proto::ReqMemPoolCreate pc{};
    pc.alloc_type = CU_MEM_ALLOCATION_TYPE_PINNED;
    pc.loc_type = CU_MEM_LOCATION_TYPE_DEVICE;
    REQUIRE(g.call(0, Op::kMemPoolCreate, pc, &out) == CUDA_SUCCESS);
    const std::uint64_t p = RawGuest::as<proto::RepHandle>(out).handle;
    REQUIRE(g.call(0, Op::kMemPool, pool_req(ctx, p, proto::kPoolSetAttr, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, ~0ull)) ==
            CUDA_SUCCESS);
    return p;
  };
  auto alloc_free = [&](std::uint64_t pool, std::uint64_t bytes) {
    REQUIRE(g.call(0, Op::kMemAllocAsync, proto::ReqMemAllocAsync{ctx, s, pool, bytes}, &out) == CUDA_SUCCESS);
    const std::uint64_t p = RawGuest::as<proto::RepMemAlloc>(out).dptr;
    REQUIRE(g.call(0, Op::kMemFreeAsync, proto::ReqFreeAsync{ctx, s, p}) == CUDA_SUCCESS);
  };
  const std::uint64_t a = make_pool(), b = make_pool();
  alloc_free(a, 48 * kMiB);
  REQUIRE(pool_reserved(g, ctx, a) == 48 * kMiB);  // the pool keeps it
  CHECK(mem_info(g, ctx).free == 16 * kMiB);      // and it is the guest's
  // Another pool's allocation does not fit beside it: the first pool gives
  // its memory back first, so that the device holds no more than the quota.
  REQUIRE(g.call(0, Op::kMemAllocAsync, proto::ReqMemAllocAsync{ctx, s, b, 48 * kMiB}, &out) == CUDA_SUCCESS);
  const std::uint64_t in_b = RawGuest::as<proto::RepMemAlloc>(out).dptr;
  CHECK(pool_reserved(g, ctx, a) == 0);
  CHECK(pool_reserved(g, ctx, a) + pool_reserved(g, ctx, b) <= 64 * kMiB);
  REQUIRE(g.call(0, Op::kMemFreeAsync, proto::ReqFreeAsync{ctx, s, in_b}) == CUDA_SUCCESS);
  // A plain allocation makes room the same way.
  REQUIRE(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx, 40 * kMiB, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
  CHECK(pool_reserved(g, ctx, b) <= 24 * kMiB);
  // A trim gives the rest back to the quota.
  REQUIRE(g.call(0, Op::kMemPool, pool_req(ctx, b, proto::kPoolTrim, 0, 0)) == CUDA_SUCCESS);
  CHECK(mem_info(g, ctx).free == 24 * kMiB);
  CHECK(d.alive());
}

// Issue 28 item 12 (rule context-flags): the core-dump flags make the driver
// write a GPU core dump (and open a pipe) from the worker, on the host.
TEST_CASE("context flags that make the driver write core dumps on the host are refused", "[process][hostile]") {
  Daemon d({}, "-flags");
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  g.open(0);
  hello(g);
  const std::uint64_t ctx = primary(g);
  std::vector<std::byte> out;
  for (unsigned f : {unsigned{CU_CTX_COREDUMP_ENABLE}, unsigned{CU_CTX_USER_COREDUMP_ENABLE},
                     unsigned{CU_CTX_SCHED_SPIN | CU_CTX_COREDUMP_ENABLE}}) {
    CHECK(g.call(0, Op::kCtxCreate, proto::ReqDeviceFlags{0, f}, &out) == CUDA_ERROR_INVALID_VALUE);
    CHECK(g.call(0, Op::kCtxMisc, proto::ReqCtxMisc{ctx, 0, proto::kCtxSetFlags, f}) == CUDA_ERROR_INVALID_VALUE);
    CHECK(g.call(0, Op::kPrimarySetFlags, proto::ReqDeviceFlags{0, f}) == CUDA_ERROR_INVALID_VALUE);
  }
  // What a guest may ask for still reaches the driver.
  REQUIRE(g.call(0, Op::kCtxCreate, proto::ReqDeviceFlags{0, CU_CTX_SCHED_BLOCKING_SYNC | CU_CTX_SYNC_MEMOPS}, &out) ==
          CUDA_SUCCESS);
  const std::uint64_t made = RawGuest::as<proto::RepHandle>(out).handle;
  CHECK(g.call(0, Op::kCtxMisc, proto::ReqCtxMisc{made, 0, proto::kCtxSetFlags, CU_CTX_SCHED_SPIN}) == CUDA_SUCCESS);
  REQUIRE(g.call(0, Op::kCtxMisc, proto::ReqCtxMisc{made, 0, proto::kCtxGetFlags, 0}, &out) == CUDA_SUCCESS);
  CHECK((RawGuest::as<proto::RepValue>(out).value & CU_CTX_SCHED_MASK) == CU_CTX_SCHED_SPIN);
  CHECK(g.call(0, Op::kCtxDestroy, proto::ReqHandle{0, made}) == CUDA_SUCCESS);
  CHECK(d.alive());
}

// Rule green-issued-resources: a CUdevResource carries the driver's own
// internals, which the driver does not check when they come back. A guest
// hands the worker another guest's images (made by another worker's driver):
// refused, though a driver would take them; its own images still work.
TEST_CASE("a green context's resources reach the driver only as this worker handed them out", "[process][hostile]") {
  Daemon d({}, "-green");
  REQUIRE(d.alive());
  const auto ask = [](RawGuest& g, const proto::ReqGreen& r, std::span<const std::byte> tail = {}) {
    std::vector<std::byte> out;
    const CUresult st = g.call(0, Op::kGreen, r, &out, tail);
    return std::make_pair(st, out);
  };
  proto::ReqGreen whole{};
  whole.kind = proto::kGreenDeviceResource;
  whole.type = CU_DEV_RESOURCE_TYPE_SM;
  // Guest A splits its GPU into two groups of 16 SMs.
  RawGuest a(d.sock);
  a.open(0);
  hello(a);
  primary(a);
  auto [st, dev_a] = ask(a, whole);
  REQUIRE(st == CUDA_SUCCESS);
  REQUIRE(dev_a.size() == sizeof(proto::RepGreen) + proto::kResourceBytes);
  proto::ReqGreen split{};
  split.kind = proto::kGreenSplit;
  split.count = 2;
  split.min_count = 16;
  const auto image_a = std::span(dev_a).subspan(sizeof(proto::RepGreen));
  auto [st2, groups_a] = ask(a, split, image_a);
  REQUIRE(st2 == CUDA_SUCCESS);
  REQUIRE(groups_a.size() == sizeof(proto::RepGreen) + 2 * proto::kResourceBytes);
  const auto group_a = std::span(groups_a).subspan(sizeof(proto::RepGreen), proto::kResourceBytes);
  // Guest B, another worker, offers A's images.
  RawGuest b(d.sock);
  b.open(0);
  hello(b);
  primary(b);
  proto::ReqGreen desc{};
  desc.kind = proto::kGreenDesc;
  desc.count = 1;
  CHECK(ask(b, desc, group_a).first == CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  CHECK(ask(b, split, group_a).first == CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  // B's own images: a split (into groups of 24 SMs: no image of it is A's) and a
  // descriptor of its group.
  auto [st3, dev_b] = ask(b, whole);
  REQUIRE(st3 == CUDA_SUCCESS);
  proto::ReqGreen split_b = split;
  split_b.min_count = 24;
  auto [st4, groups_b] = ask(b, split_b, std::span(dev_b).subspan(sizeof(proto::RepGreen)));
  REQUIRE(st4 == CUDA_SUCCESS);
  const auto group_b = std::span(groups_b).subspan(sizeof(proto::RepGreen), proto::kResourceBytes);
  CHECK(ask(b, desc, group_b).first == CUDA_SUCCESS);
  // Still not A's group, which no split of B's made.
  CHECK(ask(b, desc, group_a).first == CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  CHECK(d.alive());
}
