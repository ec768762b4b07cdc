// ivcuda-ring-bench: the SPSC ring between two processes, as in process mode.
//
// A requester (this process) and a responder (a forked child) share a memfd
// holding a request ring and a response ring, each process pinned to its own
// CPU. Measured:
//   (a) round trip of a 64-byte record with both sides spinning;
//   (b) round trip when the responder sleeps on an eventfd between requests
//       and the requester's publish() rings it awake;
//   (c) one-way throughput with batched publication, per record size.
// A "64-byte record" is one ring cell: 16 bytes of header and 48 of payload,
// so the record sizes below are the bytes each record occupies in the ring.
//
//   ivcuda-ring-bench            full run (a few seconds)
//   ivcuda-ring-bench --quick    short smoke run for CI (< 2 s)
//   ivcuda-ring-bench --runs N   throughput: median of N runs (default 3)
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "ring/spsc_ring.h"
#include "ring/sys.h"
#include "ring/wait.h"

using namespace ivcuda;
using ring::RingStatus;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint32_t kRingBytes = 256 * 1024;  // the layout's default ring size
constexpr std::uint32_t kCells = kRingBytes / abi::kCellBytes;
constexpr std::uint32_t kHdr = sizeof(abi::RecordHeader);
// Throughput run: the producer publishes (and the consumer releases) every
// kBatch records or every kBatchCells cells, whichever comes first, so that
// both sides work on different parts of the ring at once.
constexpr std::uint32_t kBatch = 64;
constexpr std::uint32_t kBatchCells = kCells / 8;

// Requests the responder understands.
constexpr std::uint16_t kOpPing = 1;    // echo the payload back
constexpr std::uint16_t kOpMode = 2;    // seq = 0: spin between requests, 1: sleep
constexpr std::uint16_t kOpStream = 3;  // seq records follow; answer once at the end
constexpr std::uint16_t kOpData = 4;    // one record of a stream
constexpr std::uint16_t kOpQuit = 5;

struct Channel {
  ring::RingView req;
  ring::RingView rsp;
};

Channel channel_at(std::byte* base) {
  std::byte* rsp = base + sizeof(abi::RingCtl) + kRingBytes;
  return {{reinterpret_cast<abi::RingCtl*>(base), base + sizeof(abi::RingCtl), kCells},
          {reinterpret_cast<abi::RingCtl*>(rsp), rsp + sizeof(abi::RingCtl), kCells}};
}

// With a single CPU the peer can only run when we stop: spinning would burn
// whole time slices, so every wait yields instead.
bool g_one_cpu = false;
void relax() noexcept {
  if (g_one_cpu)
    ::sched_yield();
  else
    ring::cpu_relax();
}

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "ivcuda-ring-bench: %s\n", what);
  std::exit(1);
}

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (::sched_setaffinity(0, sizeof set, &set) != 0) die("sched_setaffinity failed");
}

// Reserves a record, spinning while the ring is full. A full ring may be
// full of our own unpublished batch: publish it, or we would wait forever.
std::byte* reserve_spin(ring::Producer& p, const abi::RecordHeader& h) {
  for (;;) {
    RingStatus st;
    if (std::byte* d = p.reserve(h, &st)) return d;
    if (st != RingStatus::kFull) die("reserve failed: ring corrupt or record too big");
    p.publish();
    relax();
  }
}

// Polls until a record arrives, spinning.
const ring::Record& poll_spin(ring::Consumer& c, ring::Record& rec) {
  for (;;) {
    const RingStatus st = c.poll(&rec);
    if (st == RingStatus::kOk) return rec;
    if (st == RingStatus::kCorrupt) die("ring corrupt");
    relax();
  }
}

// ------------------------------------------------------------- responder

[[noreturn]] void responder(Channel ch, int req_efd, int rsp_efd) {
  ring::Consumer req(ch.req);
  ring::EventfdDoorbell bell(rsp_efd);
  ring::Producer rsp(ch.rsp, &bell);
  ring::EventfdWaiter waiter(req_efd);
  ring::SpinPolicy sleepy;
  sleepy.spin = std::chrono::nanoseconds(0);
  sleepy.block_timeout_ms = 1000;
  bool sleep_mode = false;
  ring::Record rec;

  auto answer = [&](const abi::RecordHeader& h, const void* payload) {
    std::byte* d = reserve_spin(rsp, h);
    if (h.len != 0) std::memcpy(d, payload, h.len);
    rsp.commit();
    rsp.publish();
  };

  for (;;) {
    RingStatus st = req.poll(&rec);
    if (st == RingStatus::kCorrupt) ::_exit(2);
    if (st == RingStatus::kEmpty) {
      req.publish_head();
      if (sleep_mode) {
        ring::spin_then_block([&] { return req.has_data(); },
                              [&](bool on) {
                                if (on)
                                  req.prepare_sleep();
                                else
                                  req.end_sleep();
                              },
                              waiter, sleepy);
      } else {
        while (!req.has_data()) relax();
      }
      continue;
    }
    const abi::RecordHeader h = rec.hdr;
    if (h.op == kOpPing) {
      answer(h, rec.payload.data());
      req.consume();
      continue;
    }
    if (h.op == kOpMode) {
      sleep_mode = h.seq != 0;
      req.consume();
      answer(h, nullptr);
      continue;
    }
    if (h.op == kOpQuit) {
      req.consume();
      req.publish_head();
      answer(h, nullptr);
      while (!rsp.drained()) relax();
      ::_exit(0);
    }
    if (h.op != kOpStream) ::_exit(3);
    req.consume();
    // The stream: take `count` records, releasing cells every kBatch records
    // (one head store per batch, as the producer publishes one tail per batch).
    const std::uint32_t count = h.seq;
    std::uint64_t sum = 0;
    std::uint32_t unreleased = 0, cells_unreleased = 0;
    for (std::uint32_t i = 0; i < count; ++i) {
      while ((st = req.poll(&rec)) == RingStatus::kEmpty) {
        req.publish_head();
        relax();
      }
      if (st != RingStatus::kOk || rec.hdr.op != kOpData || rec.hdr.seq != i) ::_exit(4);
      std::uint32_t first = 0;
      std::memcpy(&first, rec.payload.data(), sizeof first);
      sum += first;
      req.consume();
      cells_unreleased += ring::record_cells(rec.hdr.len);
      if (++unreleased == kBatch || cells_unreleased >= kBatchCells) {
        req.publish_head();
        unreleased = cells_unreleased = 0;
      }
    }
    req.publish_head();
    abi::RecordHeader done{};
    done.op = kOpStream;
    done.len = sizeof sum;
    answer(done, &sum);
  }
}

// ------------------------------------------------------------- requester

struct Requester {
  ring::Producer req;
  ring::Consumer rsp;
  ring::Record rec;
  std::uint64_t rings = 0;

  void send(std::uint16_t op, std::uint32_t seq, std::uint32_t len, const void* payload) {
    abi::RecordHeader h{};
    h.op = op;
    h.seq = seq;
    h.len = len;
    std::byte* d = reserve_spin(req, h);
    if (len != 0) std::memcpy(d, payload, len);
    req.commit();
    if (req.publish()) ++rings;
  }
  const ring::Record& receive() { return poll_spin(rsp, rec); }
  void done_with_response() {
    rsp.consume();
    rsp.publish_head();
  }
  void set_mode(bool sleep) {
    send(kOpMode, sleep ? 1 : 0, 0, nullptr);
    receive();
    done_with_response();
  }
};

struct Latency {
  double median_us = 0;
  double p99_us = 0;
};

Latency summarize(std::vector<double>& ns) {
  std::sort(ns.begin(), ns.end());
  const auto at = [&](double q) { return ns[std::min(ns.size() - 1, static_cast<std::size_t>(q * ns.size()))] / 1000.0; };
  return {at(0.5), at(0.99)};
}

double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

Latency ping_pong(Requester& r, std::uint32_t rounds, std::uint32_t warmup) {
  std::uint8_t payload[abi::kCellBytes - kHdr];
  std::memset(payload, 0x3c, sizeof payload);
  std::vector<double> ns;
  ns.reserve(rounds);
  for (std::uint32_t i = 0; i < warmup + rounds; ++i) {
    const auto t0 = Clock::now();
    r.send(kOpPing, i, sizeof payload, payload);
    const ring::Record& rec = r.receive();
    if (rec.hdr.seq != i) die("ping answered out of order");
    r.done_with_response();
    if (i >= warmup) ns.push_back(ns_since(t0));
  }
  return summarize(ns);
}

// Each request goes to a responder that is blocked in poll() on its eventfd.
Latency ping_pong_sleeping(Requester& r, const ring::RingView& req_view, std::uint32_t rounds,
                           std::uint64_t* rings) {
  std::uint8_t payload[abi::kCellBytes - kHdr];
  std::memset(payload, 0x5a, sizeof payload);
  std::vector<double> ns;
  ns.reserve(rounds);
  const std::uint64_t rings_before = r.rings;
  for (std::uint32_t i = 0; i < rounds; ++i) {
    // Wait for the responder's sleep announcement, then a little more so it
    // is inside the kernel rather than between the flag and poll().
    while (ring::load_acquire(req_view.ctl->consumer_sleeping) == 0) relax();
    const auto settle = Clock::now() + std::chrono::microseconds(20);
    while (Clock::now() < settle) ring::cpu_relax();
    const auto t0 = Clock::now();
    r.send(kOpPing, i, sizeof payload, payload);
    const ring::Record& rec = r.receive();
    if (rec.hdr.seq != i) die("ping answered out of order");
    r.done_with_response();
    ns.push_back(ns_since(t0));
  }
  *rings = r.rings - rings_before;
  return summarize(ns);
}

struct Throughput {
  double seconds = 0;
  double mrec_per_s = 0;
  double gb_per_s = 0;  // record bytes (header + payload) per second
};

Throughput stream(Requester& r, std::uint32_t record_bytes, std::uint32_t count) {
  const std::uint32_t len = record_bytes - kHdr;
  std::vector<std::byte> src(len, std::byte{0x11});
  std::uint64_t expect = 0;
  const auto t0 = Clock::now();
  r.send(kOpStream, count, 0, nullptr);
  std::uint32_t i = 0;
  while (i < count) {
    // Fill up to a batch against the private tail; one release store for all.
    const std::uint32_t n =
        std::min({kBatch, std::max(1u, kBatchCells / ring::record_cells(len)), count - i});
    for (std::uint32_t k = 0; k < n; ++k, ++i) {
      abi::RecordHeader h{};
      h.op = kOpData;
      h.seq = i;
      h.len = len;
      std::byte* d = reserve_spin(r.req, h);
      std::memcpy(d, src.data(), len);
      std::memcpy(d, &i, sizeof i);  // the payload starts with seq: touched on both sides
      r.req.commit();
      expect += i;
    }
    if (r.req.publish()) ++r.rings;
  }
  const ring::Record& rec = r.receive();
  const double secs = ns_since(t0) / 1e9;
  std::uint64_t sum = 0;
  if (rec.hdr.op != kOpStream || rec.payload.size() != sizeof sum) die("bad stream answer");
  std::memcpy(&sum, rec.payload.data(), sizeof sum);
  r.done_with_response();
  if (sum != expect) die("stream checksum mismatch: records lost or damaged");
  return {secs, count / secs / 1e6, double(count) * record_bytes / secs / 1e9};
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int runs = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--quick") {
      quick = true;
      runs = 1;
    } else if (a == "--runs" && i + 1 < argc && std::atoi(argv[i + 1]) > 0) {
      runs = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--runs N]\n", argv[0]);
      return 2;
    }
  }

  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) die("sched_getaffinity failed");
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);

  // A responder that died leaves the requester spinning: end the run instead.
  ::alarm(quick ? 30 : 120);

  g_one_cpu = cpus.size() < 2;

  const std::size_t size = abi::channel_rings_bytes(kRingBytes);
  auto memfd = sys::make_memfd("ivcuda-ring-bench", size);
  auto req_efd = sys::make_eventfd(true);
  auto rsp_efd = sys::make_eventfd(true);
  if (!memfd || !req_efd || !rsp_efd) die("cannot create memfd/eventfds");
  auto map = sys::Mapping::map_shared(memfd->get(), size);
  if (!map) die("cannot map the memfd");
  const Channel ch = channel_at(map->data());

  const pid_t pid = ::fork();
  if (pid < 0) die("fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a requester that died
    if (cpus.size() >= 2) pin_to(cpus[1]);
    responder(ch, req_efd->get(), rsp_efd->get());
  }
  if (cpus.size() >= 2) pin_to(cpus[0]);

  std::printf("ivcuda ring benchmark%s: ring %u KiB (%u cells of %u B), batch <= %u records or %u cells\n",
              quick ? " (--quick)" : "", kRingBytes / 1024, kCells, abi::kCellBytes, kBatch, kBatchCells);
  if (cpus.size() >= 2)
    std::printf("requester on CPU %d, responder on CPU %d (%zu CPUs usable)\n", cpus[0], cpus[1],
                cpus.size());
  else
    std::printf("ONLY ONE CPU usable: both processes share CPU %d and every wait yields; round "
                "trips measure the scheduler, not the ring\n",
                cpus.empty() ? -1 : cpus[0]);

  // Spinning peers lose their time slices to anything else runnable on these
  // CPUs: a load average well above 0 means the numbers below are low.
  double load[1] = {0};
  if (::getloadavg(load, 1) == 1) std::printf("1-minute load average before the run: %.2f\n", load[0]);

  ring::EventfdDoorbell bell(req_efd->get());
  Requester r{ring::Producer(ch.req, &bell), ring::Consumer(ch.rsp), {}, 0};

  const std::uint32_t spin_rounds = quick ? 20'000 : 200'000;
  const std::uint32_t sleep_rounds = quick ? 1'000 : 20'000;

  r.set_mode(false);
  const Latency spin = ping_pong(r, spin_rounds, spin_rounds / 10);
  r.set_mode(true);
  std::uint64_t rings = 0;
  const Latency sleep = ping_pong_sleeping(r, ch.req, sleep_rounds, &rings);
  r.set_mode(false);

  std::printf("\n%-44s %9s %10s %10s\n", "round trip (64 B request, 64 B response)", "count", "median", "p99");
  std::printf("%-44s %9u %7.2f us %7.2f us\n", "(a) both sides spinning", spin_rounds, spin.median_us,
              spin.p99_us);
  std::printf("%-44s %9u %7.2f us %7.2f us\n", "(b) responder asleep on eventfd doorbell", sleep_rounds,
              sleep.median_us, sleep.p99_us);
  std::printf("    doorbells rung in (b): %" PRIu64 " of %u requests\n", rings, sleep_rounds);

  std::printf("\n(c) one way, median of %d run%s (min .. max Mrecords/s)\n", runs, runs == 1 ? "" : "s");
  std::printf("%-11s %9s %10s %9s %11s %8s   %s\n", "record", "payload", "records", "seconds", "Mrecords/s", "GB/s",
              "range");
  double mrec64 = 0;
  for (std::uint32_t bytes : {64u, 256u, 1024u, 4096u}) {
    // About 1 GiB of records per size (1/8 of it with --quick), at most 16 M records.
    std::uint32_t count = std::min<std::uint32_t>(16u << 20, (1u << 30) / bytes);
    if (quick) count /= 8;
    // Other load on the machine only ever slows a run down: the spread says
    // how much to trust the median.
    std::vector<Throughput> ts;
    for (int k = 0; k < runs; ++k) ts.push_back(stream(r, bytes, count));
    std::sort(ts.begin(), ts.end(), [](const Throughput& x, const Throughput& y) { return x.mrec_per_s < y.mrec_per_s; });
    const Throughput& t = ts[ts.size() / 2];
    if (bytes == 64) mrec64 = t.mrec_per_s;
    std::printf("%6u B    %7u B %10u %9.3f %11.2f %8.2f   %.2f .. %.2f\n", bytes, bytes - kHdr, count,
                t.seconds, t.mrec_per_s, t.gb_per_s, ts.front().mrec_per_s, ts.back().mrec_per_s);
  }

  std::printf("\naims: median spin round trip <= 1 us: %s (%.2f us); 64 B records one way >= 20 M/s: %s (%.1f M/s)\n",
              spin.median_us <= 1.0 ? "met" : "MISSED", spin.median_us,
              mrec64 >= 20.0 ? "met" : "MISSED", mrec64);

  r.send(kOpQuit, 0, 0, nullptr);
  r.receive();
  r.done_with_response();
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "ivcuda-ring-bench: responder failed (wait status %d)\n", status);
    return 1;
  }
  return 0;
}
