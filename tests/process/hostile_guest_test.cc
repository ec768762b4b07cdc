// A hostile guest: speaks the ring protocol by hand and sends what no
// well-behaved libcuda would. The worker must answer each with the right
// CUresult, never touch memory outside what the guest owns, and keep serving.
#include <catch2/catch.hpp>

#include <cuda.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ivcuda/proto.h"
#include "ring/ivshmem.h"
#include "ring/layout.h"
#include "ring/spsc_ring.h"
#include "ring/sys.h"
#include "ring/wait.h"

using namespace ivcuda;
using proto::Op;

namespace {

struct Daemon {
  pid_t pid = -1;
  std::string sock;
  Daemon() {
    sock = "/tmp/ivcuda-hostile-" + std::to_string(::getpid()) + ".sock";
    ::unlink(sock.c_str());
    pid = ::fork();
    if (pid == 0) {
      ::execl(IVCUDAD_PATH, IVCUDAD_PATH, "--socket", sock.c_str(), "--shm-size", "256M", "--channels", "4",
              "--staging-size", "4M", "--driver", GPU_DOUBLE_PATH, "--log-level", "error", nullptr);
      ::_exit(127);
    }
    for (int i = 0; i < 200 && ::access(sock.c_str(), F_OK) != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ~Daemon() {
    ::kill(pid, SIGTERM);
    ::waitpid(pid, nullptr, 0);
  }
  bool alive() const { return ::kill(pid, 0) == 0 && ::waitpid(pid, nullptr, WNOHANG) == 0; }
};

// One guest connection with hand-driven channels.
struct RawGuest {
  ivshmem::IvshmemClient client;
  sys::Mapping bar;
  ring::Layout l;
  struct Chan {
    std::unique_ptr<ring::EventfdDoorbell> bell;
    ring::Producer req;
    ring::Consumer cpl;
  };
  std::vector<Chan> chans;
  std::uint32_t seq = 1;

  explicit RawGuest(const std::string& sock) : client(connect(sock)) {
    bar = std::move(sys::Mapping::map_shared(client.shm_fd(), client.shm_size()).value());
    l = ring::read_layout(bar.data(), bar.size()).value();
    chans.resize(l.channels);
  }
  static ivshmem::IvshmemClient connect(const std::string& sock) {
    auto c = ivshmem::ivshmem_connect(sock, std::chrono::milliseconds(3000), 8);
    REQUIRE(c);
    return std::move(c).value();
  }
  Chan& open(std::uint32_t c) {
    auto& ch = chans[c];
    ch.bell = std::make_unique<ring::EventfdDoorbell>(client.peers().at(0)[0].get());
    ch.req = ring::Producer(ring::request_ring(bar.data(), l, c), ch.bell.get());
    ch.cpl = ring::Consumer(ring::completion_ring(bar.data(), l, c));
    auto* sb = ring::superblock(bar.data());
    std::atomic_ref<std::uint64_t>(sb->active_mask[0]).fetch_or(1ull << c);
    return ch;
  }
  // Sends raw payload bytes with an op, waits for the reply (if wanted).
  CUresult send(std::uint32_t c, std::uint16_t op, const void* payload, std::size_t n, bool reply,
                std::vector<std::byte>* out = nullptr) {
    auto& ch = chans[c];
    abi::RecordHeader h{};
    h.op = op;
    h.flags = reply ? abi::kRecNeedsReply : 0;
    h.len = static_cast<std::uint32_t>(n);
    h.seq = seq++;
    ring::RingStatus st;
    std::byte* p = ch.req.reserve(h, &st);
    REQUIRE(p != nullptr);
    if (n != 0) std::memcpy(p, payload, n);
    ch.req.commit();
    ch.req.publish();
    ch.bell->ring();
    if (!reply) return CUDA_SUCCESS;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    ring::Record rec;
    while (std::chrono::steady_clock::now() < until) {
      if (ch.cpl.poll(&rec) == ring::RingStatus::kOk) {
        const auto r = static_cast<CUresult>(rec.hdr.status);
        if (out != nullptr) out->assign(rec.payload.begin(), rec.payload.end());
        CHECK(rec.hdr.seq == h.seq);
        ch.cpl.consume();
        ch.cpl.publish_head();
        return r;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return static_cast<CUresult>(-1);  // no reply in time
  }
  template <class T>
  CUresult call(std::uint32_t c, Op op, const T& req, std::vector<std::byte>* out = nullptr,
                std::span<const std::byte> tail = {}) {
    std::vector<std::byte> buf(sizeof req + tail.size());
    std::memcpy(buf.data(), &req, sizeof req);
    if (!tail.empty()) std::memcpy(buf.data() + sizeof req, tail.data(), tail.size());
    return send(c, static_cast<std::uint16_t>(op), buf.data(), buf.size(), true, out);
  }
  template <class T>
  void post(std::uint32_t c, Op op, const T& req) {
    send(c, static_cast<std::uint16_t>(op), &req, sizeof req, false);
  }
  template <class T>
  static T as(const std::vector<std::byte>& v) {
    T t{};
    std::memcpy(&t, v.data(), std::min(sizeof t, v.size()));
    return t;
  }
};

}  // namespace

TEST_CASE("a hostile guest gets clear errors and the worker keeps serving", "[process][hostile]") {
  Daemon d;
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  g.open(0);
  std::vector<std::byte> out;

  proto::ReqHello hello{proto::kProtoVersion, 1, {}};
  REQUIRE(g.call(0, Op::kHello, hello, &out) == CUDA_SUCCESS);

  SECTION("unknown ops and truncated requests") {
    CHECK(g.send(0, 999, nullptr, 0, true) == CUDA_ERROR_INVALID_VALUE);
    CHECK(g.send(0, 0, nullptr, 0, true) == CUDA_ERROR_INVALID_VALUE);
    const std::uint32_t four = 4;
    CHECK(g.send(0, static_cast<std::uint16_t>(Op::kMemAlloc), &four, 4, true) == CUDA_ERROR_INVALID_VALUE);
    proto::ReqHello old{proto::kProtoVersion + 7, 1, {}};
    CHECK(g.call(0, Op::kHello, old) == CUDA_ERROR_NOT_SUPPORTED);
  }

  SECTION("devices, contexts and handles it does not own") {
    CHECK(g.call(0, Op::kDeviceInfo, proto::ReqDevice{-1, 0}) == CUDA_ERROR_INVALID_DEVICE);
    CHECK(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{64, 0}) == CUDA_ERROR_INVALID_DEVICE);
    CHECK(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{0x0100000100000007ull, 64, 0, 0, 0, 0}) ==
          CUDA_ERROR_INVALID_CONTEXT);
    REQUIRE(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
    const auto ctx = RawGuest::as<proto::RepHandle>(out).handle;
    // a stream handle of the right kind but a slot that was never handed out
    CHECK(g.call(0, Op::kStreamDestroy, proto::ReqHandle{ctx, 0x0400000100000009ull}) == CUDA_ERROR_INVALID_HANDLE);
    // a context handle passed where a stream handle belongs
    CHECK(g.call(0, Op::kStreamSynchronize, proto::ReqHandle{ctx, ctx}) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(g.call(0, Op::kCtxDestroy, proto::ReqHandle{0, ctx}) == CUDA_ERROR_INVALID_CONTEXT);  // primary
    proto::ReqModuleName mn{ctx, 0x0200000100000000ull, 3, 0};
    const char name[] = "abc";
    CHECK(g.call(0, Op::kModuleGetFunction, mn, nullptr, {reinterpret_cast<const std::byte*>(name), 3}) ==
          CUDA_ERROR_INVALID_HANDLE);
    mn.name_len = 100;  // says 100 bytes, sends 3
    CHECK(g.call(0, Op::kModuleGetFunction, mn, nullptr, {reinterpret_cast<const std::byte*>(name), 3}) ==
          CUDA_ERROR_INVALID_VALUE);
  }

  SECTION("addresses, offsets and lengths outside what it owns") {
    REQUIRE(g.call(0, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
    const auto ctx = RawGuest::as<proto::RepHandle>(out).handle;
    REQUIRE(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx, 4096, 0, 0, 0, 0}, &out) == CUDA_SUCCESS);
    const auto dptr = RawGuest::as<proto::RepMemAlloc>(out).dptr;
    proto::ReqCopy c{};
    c.ctx = ctx;
    c.dst = dptr;
    c.bytes = 64;
    c.arena_off = ~0ull - 8;  // would wrap when added to the length
    CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_ERROR_INVALID_VALUE);
    c.arena_off = 0;  // the superblock: not the arena
    CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_ERROR_INVALID_VALUE);
    c.arena_off = g.l.arena_off + g.l.arena_size - 32;  // runs off the end of the arena
    CHECK(g.call(0, Op::kMemcpyDtoHArena, c) == CUDA_ERROR_INVALID_VALUE);
    c.arena_off = g.l.arena_off;
    c.src = dptr + 4090;  // runs off the end of the allocation
    CHECK(g.call(0, Op::kMemcpyDtoHArena, c) == CUDA_ERROR_INVALID_VALUE);
    c.src = dptr;
    c.dst = dptr ^ 0x100000000ull;  // someone else's memory
    CHECK(g.call(0, Op::kMemcpyDtoD, c) == CUDA_ERROR_INVALID_VALUE);
    CHECK(g.call(0, Op::kMemFree, proto::ReqPtr{ctx, dptr + 8}) == CUDA_ERROR_INVALID_VALUE);
    CHECK(g.call(0, Op::kHostFree, proto::ReqArenaOff{g.l.arena_off + 4096}) == CUDA_ERROR_INVALID_VALUE);
    proto::ReqMemset ms{};
    ms.ctx = ctx;
    ms.dptr = dptr;
    ms.elem_size = 4;
    ms.width = ~0ull / 2;  // width * 4 overflows
    ms.height = 1;
    CHECK(g.call(0, Op::kMemset, ms) == CUDA_ERROR_INVALID_VALUE);
    ms.width = 100;
    ms.pitch = 1ull << 62;  // 2D footprint overflows
    ms.height = 8;
    CHECK(g.call(0, Op::kMemset, ms) == CUDA_ERROR_INVALID_VALUE);
    proto::ReqCopy2D c2{};
    c2.ctx = ctx;
    c2.src_type = CU_MEMORYTYPE_DEVICE;
    c2.src_device = dptr;
    c2.src_pitch = 64;
    c2.dst_type = CU_MEMORYTYPE_HOST;
    c2.dst_arena_off = g.l.arena_off;
    c2.dst_pitch = 64;
    c2.width_bytes = 64;
    c2.height = 65;  // 65 rows of 64 bytes: one row past the allocation
    CHECK(g.call(0, Op::kMemcpy2D, c2) == CUDA_ERROR_INVALID_VALUE);
    c2.height = 64;
    CHECK(g.call(0, Op::kMemcpy2D, c2) == CUDA_SUCCESS);
    // A posted copy that is refused surfaces at the next synchronising call.
    c.dst = dptr + 4095;
    c.bytes = 2;
    c.arena_off = g.l.arena_off;
    g.post(0, Op::kMemcpyHtoDArena, c);
    CHECK(g.call(0, Op::kFlush, proto::ReqCtx{ctx}) == CUDA_ERROR_INVALID_VALUE);
    CHECK(g.call(0, Op::kFlush, proto::ReqCtx{ctx}) == CUDA_SUCCESS);
    // The allocation survived all of it.
    c.dst = dptr;
    c.bytes = 4096;
    CHECK(g.call(0, Op::kMemcpyHtoDArena, c) == CUDA_SUCCESS);
    CHECK(g.call(0, Op::kMemFree, proto::ReqPtr{ctx, dptr}) == CUDA_SUCCESS);
  }

  SECTION("a corrupt ring loses that channel only") {
    auto& bad = g.open(1);
    (void)bad;
    // Claim the producer published far more than the ring holds.
    auto v = ring::request_ring(g.bar.data(), g.l, 1);
    ring::store_release(v.ctl->tail, v.cells * 4 + 3);
    ring::EventfdDoorbell(g.client.peers().at(0)[0].get()).ring();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK(g.call(0, Op::kHello, hello) == CUDA_SUCCESS);  // channel 0 still served
    // and a second guest is served as if nothing happened
    RawGuest other(d.sock);
    other.open(0);
    CHECK(other.call(0, Op::kHello, hello) == CUDA_SUCCESS);
  }
  CHECK(d.alive());
}
