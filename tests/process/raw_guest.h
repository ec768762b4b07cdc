// The raw guest of the hostile tests: a daemon under test, and a guest that
// speaks the ring protocol by hand (claims channels, sends records, reads
// replies) so that it can send what no well-behaved libcuda would.
// Header-only; each hostile test file includes it.
#pragma once

#include <catch2/catch.hpp>

#include <cuda.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ivcuda/proto.h"
#include "ring/ivshmem.h"
#include "ring/layout.h"
#include "ring/spsc_ring.h"
#include "ring/sys.h"
#include "ring/wait.h"

namespace ivcuda::testing {

using proto::Op;

struct Daemon {
  pid_t pid = -1;
  std::string sock;
  explicit Daemon(std::vector<std::string> extra = {}, const std::string& tag = "") {
    sock = "/tmp/ivcuda-hostile-" + std::to_string(::getpid()) + tag + ".sock";
    ::unlink(sock.c_str());
    std::vector<std::string> args = {IVCUDAD_PATH, "--socket", sock, "--shm-size", "256M", "--channels", "4",
                                     "--staging-size", "4M", "--driver", GPU_DOUBLE_PATH, "--log-level", "error"};
    // The tests below count and inspect the daemon's children, one per guest:
    // no warm workers unless a test asks for them (then they are children of
    // the daemon's children, see children_of()).
    if (std::find(extra.begin(), extra.end(), "--warm-workers") == extra.end())
      args.insert(args.end(), {"--warm-workers", "0"});
    args.insert(args.end(), extra.begin(), extra.end());
    pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // a test killed mid-way leaves no daemon behind
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(IVCUDAD_PATH, argv.data());
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
  // The daemon's children: its workers (with --warm-workers, the guests'
  // connection processes).
  std::vector<pid_t> workers() const { return children_of(pid); }
  static std::vector<pid_t> children_of(pid_t p) {
    std::ifstream f("/proc/" + std::to_string(p) + "/task/" + std::to_string(p) + "/children");
    std::vector<pid_t> out;
    for (pid_t c; f >> c;) out.push_back(c);
    return out;
  }
};

// How many of process p's descriptors are guest memory (ivcudad's memfds).
inline int guest_memfds(pid_t p) {
  int n = 0;
  for (int fd = 0; fd < 4096; ++fd) {
    char target[256];
    const std::string link = "/proc/" + std::to_string(p) + "/fd/" + std::to_string(fd);
    const ssize_t len = ::readlink(link.c_str(), target, sizeof target - 1);
    if (len <= 0) continue;
    target[len] = '\0';
    if (std::strstr(target, "memfd:ivcuda-guest") != nullptr) ++n;
  }
  return n;
}

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
  // Claims channel c as the guest library does, for process `pid` (the
  // default, this process, is process mode: the peer is the CUDA program).
  Chan& open(std::uint32_t c, pid_t pid = ::getpid()) {
    auto& ch = chans[c];
    auto* d = ring::channel_desc(bar.data(), l, c);
    d->guest_owner = std::uint64_t{static_cast<std::uint32_t>(pid)} << 32;
    d->guest_claim = d->guest_claim + 1;
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
    return CUDA_ERROR_TIMEOUT;  // no reply in time (a CUresult: UBSan refuses others)
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


}  // namespace ivcuda::testing
