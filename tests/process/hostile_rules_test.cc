// Hostile guests against rules of docs/security.md that had no test failing
// without them (tests/mutations/run_mutations.py): a graph's DOT text, and
// what a VM's supervisor does with the exit notices the VM writes.
#include <catch2/catch.hpp>

#include <cuda.h>
#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ivcuda/proto.h"
#include "ivcuda/shm_abi.h"
#include "ring/layout.h"
#include "ring/spsc_ring.h"
#include "tests/process/double_strays.h"
#include "tests/process/raw_guest.h"

using namespace ivcuda;
using namespace ivcuda::testing;
using proto::Op;

namespace {

proto::ReqHello hello_of(pid_t pid) {
  return proto::ReqHello{proto::kProtoVersion, static_cast<std::uint32_t>(pid), 0, 0, {}};
}

std::uint64_t primary_ctx(RawGuest& g, std::uint32_t channel) {
  std::vector<std::byte> out;
  REQUIRE(g.call(channel, Op::kPrimaryRetain, proto::ReqDevice{0, 0}, &out) == CUDA_SUCCESS);
  return RawGuest::as<proto::RepHandle>(out).handle;
}

// The workers a VM's supervisor runs (the daemon's grandchildren), by supervisor.
std::vector<pid_t> vm_workers(const Daemon& d) {
  std::vector<pid_t> out;
  for (pid_t sup : d.workers())
    for (pid_t w : Daemon::children_of(sup)) out.push_back(w);
  return out;
}

std::size_t alive(const std::vector<pid_t>& pids) {
  std::size_t n = 0;
  for (pid_t p : pids) n += ::kill(p, 0) == 0 ? 1 : 0;
  return n;
}

// What the guest's kernel driver writes when a process with the device open
// exits (include/ivcuda/shm_abi.h): its pid in the ring of exit notices, the
// counter bumped with release, the host's doorbell rung.
void exit_notice(RawGuest& g, std::uint32_t count_step, std::vector<std::int32_t> pids) {
  auto* sb = ring::superblock(g.bar.data());
  const std::uint32_t count = ring::load_acquire(sb->exit_count);
  for (std::uint32_t i = 0; i < abi::kExitSlots && !pids.empty(); ++i)
    sb->exit_pid[(count + i) % abi::kExitSlots] = static_cast<std::uint32_t>(pids[i % pids.size()]);
  ring::store_release(sb->exit_count, count + count_step);
  ring::EventfdDoorbell(g.client.peers().at(0)[0].get()).ring();
}

}  // namespace

// The driver's DOT text names the driver's own addresses and the worker's
// (a host node's function is the worker's code): the guest gets it masked.
TEST_CASE("a graph's DOT text reaches the guest with every hexadecimal number masked", "[process][hostile]") {
  Strays strays;
  Daemon d;
  RawGuest g(d.sock);
  g.open(0);
  REQUIRE(g.call(0, Op::kHello, hello_of(::getpid())) == CUDA_SUCCESS);
  const std::uint64_t ctx = primary_ctx(g, 0);
  std::vector<std::byte> out;
  REQUIRE(g.call(0, Op::kGraphCreate, proto::ReqGraphCreate{ctx, 0, 0}, &out) == CUDA_SUCCESS);
  const auto graph = RawGuest::as<proto::RepHandle>(out).handle;
  const auto add = [&](const proto::GraphNodeParams& p) {
    std::vector<std::byte> tail(sizeof p);
    std::memcpy(tail.data(), &p, sizeof p);
    return g.call(0, Op::kGraphAddNode, proto::ReqGraphAddNode{ctx, graph, 0, 0}, nullptr, tail);
  };
  proto::GraphNodeParams empty{};
  empty.type = CU_GRAPH_NODE_TYPE_EMPTY;
  REQUIRE(add(empty) == CUDA_SUCCESS);
  proto::GraphNodeParams host{};
  host.type = CU_GRAPH_NODE_TYPE_HOST;
  host.dst = g.l.arena_off + 64;  // the host node's two words, in the arena
  REQUIRE(add(host) == CUDA_SUCCESS);

  REQUIRE(g.call(0, Op::kGraphQuery, proto::ReqGraphQuery{ctx, graph, 0, 0, proto::kQueryDot, 0}, &out) ==
          CUDA_SUCCESS);
  REQUIRE(out.size() >= sizeof(proto::RepValue));
  const auto len = static_cast<std::size_t>(RawGuest::as<proto::RepValue>(out).value);
  REQUIRE(out.size() == sizeof(proto::RepValue) + len);
  const std::string text(reinterpret_cast<const char*>(out.data()) + sizeof(proto::RepValue), len);
  INFO(text);
  CHECK(text.find("digraph") != std::string::npos);
  CHECK(text.find("0x?") != std::string::npos);  // the driver's addresses were there
  std::size_t unmasked = 0;
  for (std::size_t i = 0; i + 2 < text.size(); ++i)
    if (text[i] == '0' && (text[i + 1] == 'x' || text[i + 1] == 'X') &&
        std::isxdigit(static_cast<unsigned char>(text[i + 2])))
      ++unmasked;
  CHECK(unmasked == 0);
  CHECK(d.alive());
  CHECK(strays.seen() == "");
}

// A VM's kernel driver reports each process that exits with the device open;
// the supervisor kills that process's worker at once (the GPU memory it held
// is the driver's to free when the worker ends), and nobody else's. (With
// --recycle-workers the worker lets the process go instead, or is killed
// when it does not: hostile_vm_test.cc.)
TEST_CASE("a VM process's exit notice ends its worker at once, and no other", "[process][hostile]") {
  Strays strays;
  Daemon d({"--vm-spare-workers", "0", "--recycle-workers", "off"}, "-vm");
  REQUIRE(d.alive());
  RawGuest g(d.sock);
  const pid_t a = ::getpid() + 100000, b = ::getpid() + 200000;  // the VM's own pids
  g.open(0, a);
  g.open(1, b);
  REQUIRE(g.call(0, Op::kHello, hello_of(a)) == CUDA_SUCCESS);
  REQUIRE(g.call(1, Op::kHello, hello_of(b)) == CUDA_SUCCESS);
  (void)primary_ctx(g, 0);
  const std::uint64_t ctx_b = primary_ctx(g, 1);
  const auto workers = vm_workers(d);
  REQUIRE(workers.size() == 2);

  const auto reported = std::chrono::steady_clock::now();
  exit_notice(g, 1, {a});
  std::size_t left = 2;
  while (left != 1 && std::chrono::steady_clock::now() - reported < std::chrono::seconds(1)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    left = alive(workers);
  }
  CHECK(left == 1);  // a's worker, within a second
  CHECK(g.call(1, Op::kMemAlloc, proto::ReqMemAlloc{ctx_b, 4096, 0, 0, 0, 0}) == CUDA_SUCCESS);  // b's serves on
  CHECK(d.alive());
  CHECK(strays.seen() == "");
}

// The notices are the VM's to write: it may lie about their number and their
// pids. A lie reaches only that VM's own processes, and does not stall its
// supervisor (which gives new processes their workers).
TEST_CASE("a VM's lies about its processes' exits reach only its own processes", "[process][hostile]") {
  Strays strays;
  Daemon d({"--vm-spare-workers", "0"}, "-vm");
  REQUIRE(d.alive());
  RawGuest g(d.sock), other(d.sock);  // two VMs
  const pid_t a = ::getpid() + 100000, b = ::getpid() + 200000, c = ::getpid() + 300000;
  g.open(0, a);
  other.open(0, c);
  REQUIRE(g.call(0, Op::kHello, hello_of(a)) == CUDA_SUCCESS);
  REQUIRE(other.call(0, Op::kHello, hello_of(c)) == CUDA_SUCCESS);
  const std::uint64_t ctx_a = primary_ctx(g, 0), ctx_c = primary_ctx(other, 0);
  const auto workers = vm_workers(d);
  REQUIRE(workers.size() == 2);

  // Two billion notices at once, naming the other VM's process, the daemon,
  // init and pids no process has: none of them is one of this VM's processes.
  exit_notice(g, 1u << 31, {c, d.pid, 1, 0, -1, 0x7fffffff});
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // Nothing was reclaimed, in either VM, and both keep serving.
  CHECK(alive(workers) == 2);
  CHECK(g.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx_a, 4096, 0, 0, 0, 0}) == CUDA_SUCCESS);
  CHECK(other.call(0, Op::kMemAlloc, proto::ReqMemAlloc{ctx_c, 4096, 0, 0, 0, 0}) == CUDA_SUCCESS);
  // The supervisor is not busy with the lie: a new process of the VM is
  // served at once (RawGuest::call waits 5 s for a reply).
  g.open(1, b);
  CHECK(g.call(1, Op::kHello, hello_of(b)) == CUDA_SUCCESS);
  CHECK(d.alive());
  CHECK(strays.seen() == "");
}
