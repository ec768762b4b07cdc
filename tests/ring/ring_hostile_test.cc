// The ring facing a hostile peer. The daemon consumes requests a guest wrote
// and produces completions into a ring whose head a guest writes, so every
// index and header it reads may be garbage. The ring sits between PROT_NONE
// guard pages: any access outside its control block or data crashes the test.
// What the ring must do with garbage is narrow: report kCorrupt, or return a
// record that lies wholly inside the ring and inside what was published.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

#include "ring/spsc_ring.h"

using namespace ivcuda;
using ring::RingStatus;

namespace {

// A ring whose control block and data each border a PROT_NONE page:
// [guard][ctl page][guard][data pages][guard]. The control block sits at the
// start or end of its page and the data at the start or end of its pages, so
// that a run with each placement guards both sides.
class GuardedRing {
 public:
  GuardedRing(std::uint32_t cells, bool ctl_at_end, bool data_at_end) : cells_(cells) {
    page_ = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t data_bytes = std::size_t{cells} * abi::kCellBytes;
    const std::size_t data_pages = (data_bytes + page_ - 1) / page_;
    total_ = (4 + data_pages) * page_;
    void* p = ::mmap(nullptr, total_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    base_ = static_cast<std::byte*>(p);
    std::byte* ctl_page = base_ + page_;
    std::byte* data_area = base_ + 3 * page_;
    REQUIRE(::mprotect(ctl_page, page_, PROT_READ | PROT_WRITE) == 0);
    REQUIRE(::mprotect(data_area, data_pages * page_, PROT_READ | PROT_WRITE) == 0);
    view_.ctl = reinterpret_cast<abi::RingCtl*>(ctl_page + (ctl_at_end ? page_ - sizeof(abi::RingCtl) : 0));
    view_.data = data_area + (data_at_end ? data_pages * page_ - data_bytes : 0);
    view_.cells = cells;
  }
  GuardedRing(const GuardedRing&) = delete;
  GuardedRing& operator=(const GuardedRing&) = delete;
  ~GuardedRing() { ::munmap(base_, total_); }

  const ring::RingView& view() const { return view_; }
  abi::RingCtl& ctl() { return *view_.ctl; }
  std::byte* cell(std::uint32_t idx) { return view_.data + std::size_t{idx & (cells_ - 1)} * abi::kCellBytes; }
  std::size_t data_bytes() const { return std::size_t{cells_} * abi::kCellBytes; }
  std::uint32_t cells() const { return cells_; }

  void put_header(std::uint32_t idx, std::uint32_t len, std::uint16_t op, std::uint32_t seq = 0) {
    abi::RecordHeader h{};
    h.len = len;
    h.op = op;
    h.seq = seq;
    std::memcpy(cell(idx), &h, sizeof h);
  }
  void reset(std::uint32_t head, std::uint32_t tail) {
    std::memset(view_.data, 0, data_bytes());
    std::memset(view_.ctl, 0, sizeof(abi::RingCtl));
    view_.ctl->head = head;
    view_.ctl->tail = tail;
  }

 private:
  std::uint32_t cells_;
  std::size_t page_ = 0;
  std::size_t total_ = 0;
  std::byte* base_ = nullptr;
  ring::RingView view_{};
};

constexpr std::uint32_t kHdr = sizeof(abi::RecordHeader);
// Payload bytes that make a record exactly n cells long.
constexpr std::uint32_t len_for_cells(std::uint32_t n) { return n * abi::kCellBytes - kHdr; }

std::uint32_t seed_from_env() {
  if (const char* s = std::getenv("IVCUDA_TEST_SEED")) return static_cast<std::uint32_t>(std::strtoul(s, nullptr, 0));
  return std::random_device{}();
}

// A Consumer over `r` whose first poll must be kCorrupt, and stay so.
void expect_corrupt(GuardedRing& r) {
  ring::Consumer c(r.view());
  ring::Record rec;
  CHECK(c.poll(&rec) == RingStatus::kCorrupt);
  CHECK(c.corrupt());
  CHECK(c.poll(&rec) == RingStatus::kCorrupt);
  CHECK_FALSE(c.has_data());
  CHECK_FALSE(c.prepare_sleep());  // a corrupt ring is never slept on
}

}  // namespace

TEST_CASE("consumer: a tail more than a ring ahead of head is corrupt", "[ring][hostile]") {
  GuardedRing r(64, true, true);
  for (std::uint32_t head : {0u, 5u, 0xffffffc0u, 0xfffffff0u}) {
    CAPTURE(head);
    r.reset(head, head + 65);
    expect_corrupt(r);
    r.reset(head, head - 1);  // "behind" head is 2^32 - 1 ahead
    expect_corrupt(r);
    r.reset(head, head + 0x80000000u);
    expect_corrupt(r);
  }
  // Exactly a ring ahead is a full ring: legal.
  r.reset(0xffffffc0u, 0xffffffc0u + 64);
  for (std::uint32_t i = 0; i < 64; ++i) r.put_header(0xffffffc0u + i, len_for_cells(1), 1, i);
  ring::Consumer c(r.view());
  ring::Record rec;
  for (std::uint32_t i = 0; i < 64; ++i) {
    REQUIRE(c.poll(&rec) == RingStatus::kOk);
    CHECK(rec.hdr.seq == i);
    c.consume();
  }
  CHECK(c.poll(&rec) == RingStatus::kEmpty);
}

TEST_CASE("consumer: a pad that does not end at the ring end is corrupt", "[ring][hostile]") {
  GuardedRing r(64, false, true);
  SECTION("pad too short") {
    r.reset(60, 64 + 4);
    r.put_header(60, len_for_cells(3), abi::kOpPad);
    expect_corrupt(r);
  }
  SECTION("pad too long") {
    r.reset(60, 64 + 4);
    r.put_header(60, len_for_cells(5), abi::kOpPad);
    expect_corrupt(r);
  }
  SECTION("pad in the middle of the ring") {
    r.reset(0, 10);
    r.put_header(0, len_for_cells(2), abi::kOpPad);
    expect_corrupt(r);
  }
  SECTION("pad of length 0xffffffff") {
    r.reset(60, 70);
    r.put_header(60, 0xffffffffu, abi::kOpPad);
    expect_corrupt(r);
  }
  SECTION("pad reaching the ring end but past the published tail") {
    r.reset(60, 62);
    r.put_header(60, len_for_cells(4), abi::kOpPad);
    expect_corrupt(r);
  }
  SECTION("a correct pad is skipped") {
    r.reset(60, 64 + 1);
    r.put_header(60, len_for_cells(4), abi::kOpPad);
    r.put_header(64, 3, 9, 77);
    ring::Consumer c(r.view());
    ring::Record rec;
    REQUIRE(c.poll(&rec) == RingStatus::kOk);
    CHECK(rec.hdr.seq == 77);
    CHECK(rec.hdr.op == 9);
  }
}

TEST_CASE("consumer: a record longer than what was published or than the ring is corrupt",
          "[ring][hostile]") {
  GuardedRing r(64, true, false);
  SECTION("past the published tail") {
    r.reset(0, 3);
    r.put_header(0, len_for_cells(3) + 1, 1);  // 4 cells, 3 published
    expect_corrupt(r);
  }
  SECTION("second record past the published tail") {
    r.reset(0, 3);
    r.put_header(0, len_for_cells(1), 1);
    r.put_header(1, len_for_cells(2) + 1, 1);
    ring::Consumer c(r.view());
    ring::Record rec;
    REQUIRE(c.poll(&rec) == RingStatus::kOk);
    c.consume();
    CHECK(c.poll(&rec) == RingStatus::kCorrupt);
  }
  SECTION("past the ring end (tail says the whole ring is published)") {
    r.reset(62, 62 + 64);
    r.put_header(62, len_for_cells(2) + 1, 1);
    expect_corrupt(r);
  }
  SECTION("larger than the ring") {
    r.reset(0, 64);
    r.put_header(0, len_for_cells(65), 1);
    expect_corrupt(r);
  }
  for (std::uint32_t huge : {0xffffffffu, 0xfffffff0u, 0xffffffc1u, 0x80000000u, 0x7fffffffu}) {
    CAPTURE(huge);
    r.reset(0, 64);
    r.put_header(0, huge, 1);
    expect_corrupt(r);
    r.reset(63, 63 + 64);
    r.put_header(63, huge, 1);
    expect_corrupt(r);
  }
  SECTION("a record filling the ring exactly up to its end is fine") {
    r.reset(32, 64);
    r.put_header(32, len_for_cells(32), 1, 5);
    std::memset(r.cell(32) + kHdr, 0xab, len_for_cells(32));
    ring::Consumer c(r.view());
    ring::Record rec;
    REQUIRE(c.poll(&rec) == RingStatus::kOk);
    CHECK(rec.payload.size() == len_for_cells(32));
    CHECK(rec.payload.back() == std::byte{0xab});
  }
}

TEST_CASE("consumer: a tail that moves backwards is corrupt", "[ring][hostile]") {
  GuardedRing r(64, true, true);
  r.reset(0, 4);
  for (std::uint32_t i = 0; i < 4; ++i) r.put_header(i, 0, 1, i);
  ring::Consumer c(r.view());
  ring::Record rec;
  REQUIRE(c.poll(&rec) == RingStatus::kOk);  // sees tail 4
  c.consume();
  REQUIRE(c.poll(&rec) == RingStatus::kOk);
  c.consume();
  REQUIRE(c.poll(&rec) == RingStatus::kOk);
  c.consume();
  REQUIRE(c.poll(&rec) == RingStatus::kOk);
  c.consume();
  r.ctl().tail = 2;  // retracts records we already consumed
  CHECK(c.poll(&rec) == RingStatus::kCorrupt);
}

// The same, racing: the peer flips tail between the ring end and a value
// behind it while the consumer polls. A consumer that reads tail once, skips
// the pad, then reads the retracted tail must not walk on past it.
TEST_CASE("consumer: a tail retracted while a pad is skipped is corrupt", "[ring][hostile]") {
  GuardedRing r(64, true, true);
  r.reset(60, 60);
  r.put_header(60, len_for_cells(4), abi::kOpPad);
  for (std::uint32_t i = 64; i < 124; ++i) r.put_header(i, 0, 1, i);  // never published
  std::atomic<bool> stop{false};
  std::thread peer([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      ring::store_release(r.ctl().tail, 64u);  // the pad, nothing after it
      ring::store_release(r.ctl().tail, 61u);  // behind the pad's end
    }
  });
  std::uint64_t leaked = 0, trials = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < until) {
    for (int i = 0; i < 1000; ++i, ++trials) {
      ring::Consumer c(r.view());
      ring::Record rec;
      if (c.poll(&rec) == RingStatus::kOk) ++leaked;
    }
  }
  stop = true;
  peer.join();
  CAPTURE(trials);
  CHECK(leaked == 0);
}

// The fuzz loop. Each iteration writes garbage - sometimes pure noise,
// sometimes a chain of nearly-plausible headers - into the ring, points head
// and tail somewhere, and drains it with a fresh Consumer, mutating the ring
// between polls. Every record returned must be a byte-exact copy of a record
// lying inside the ring data, and inside [head, tail) while tail holds still.
TEST_CASE("consumer: fuzzed ctl and data never lead outside the ring", "[ring][hostile][fuzz]") {
  const std::uint32_t seed = seed_from_env();
  CAPTURE(seed);
  std::mt19937 rng(seed);
  auto pick = [&](std::uint32_t n) { return static_cast<std::uint32_t>(rng() % n); };

  std::vector<std::unique_ptr<GuardedRing>> rings;
  for (std::uint32_t cells : {8u, 32u, 128u})
    for (int place = 0; place < 4; ++place)
      rings.push_back(std::make_unique<GuardedRing>(cells, place & 1, (place & 2) != 0));

  std::vector<std::byte> before;
  std::uint64_t records = 0, corrupt = 0, empty = 0;
  for (int iter = 0; iter < 30'000; ++iter) {
    CAPTURE(iter);
    GuardedRing& r = *rings[pick(static_cast<std::uint32_t>(rings.size()))];
    const std::uint32_t cells = r.cells();
    auto* d8 = reinterpret_cast<std::uint8_t*>(r.view().data);
    // splitmix64: much cheaper than the Mersenne twister under TSan.
    for (std::uint64_t i = 0, x = rng(); i < r.data_bytes(); i += 8) {
      std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      z ^= z >> 31;
      std::memcpy(d8 + i, &z, 8);
    }

    std::uint32_t h0 = pick(4) == 0 ? 0xffffffffu - pick(2 * cells) : static_cast<std::uint32_t>(rng());
    std::uint32_t tail;
    if (pick(3) != 0) {
      // A chain of headers from h0, each one valid or subtly broken.
      std::uint32_t at = h0;
      while (at - h0 < cells) {
        const std::uint32_t pos = at & (cells - 1);
        const std::uint32_t to_end = cells - pos;
        const std::uint32_t kind = pick(16);
        if (kind == 0) {
          r.put_header(at, len_for_cells(to_end), abi::kOpPad);
          at += to_end;
        } else if (kind == 1) {  // broken pad
          const std::uint32_t lens[] = {len_for_cells(to_end) + 1, len_for_cells(to_end) - 64, 0u, 0xffffffffu};
          r.put_header(at, lens[pick(4)], abi::kOpPad);
          at += 1;
        } else if (kind == 2) {  // broken length
          const std::uint32_t lens[] = {0xffffffffu, len_for_cells(to_end) + 1,
                                        len_for_cells(cells) + 1, 0x80000000u, len_for_cells(cells / 2 + 1)};
          r.put_header(at, lens[pick(5)], static_cast<std::uint16_t>(rng()));
          at += 1;
        } else {
          const std::uint32_t n = 1 + pick(std::min<std::uint32_t>(to_end, 4));
          const std::uint32_t len = len_for_cells(n) - pick(abi::kCellBytes);
          r.put_header(at, len, static_cast<std::uint16_t>(pick(0xfffe)), at - h0);
          at += n;
        }
      }
      tail = h0 + pick(at - h0 + 1);
      if (pick(8) == 0) tail = h0 + cells + 1 + pick(4);  // just too far
    } else {
      tail = pick(2) == 0 ? h0 + pick(cells + 1) : static_cast<std::uint32_t>(rng());
    }
    r.ctl().head = h0;
    r.ctl().tail = tail;
    r.ctl().consumer_sleeping = static_cast<std::uint32_t>(rng());
    r.ctl().reserved0 = static_cast<std::uint32_t>(rng());

    // The consumer may write head and consumer_sleeping, nothing else.
    before.assign(r.view().data, r.view().data + r.data_bytes());
    const std::uint32_t ctl_res0 = r.ctl().reserved0;
    bool ctl_intact = true;

    ring::Consumer c(r.view());
    ring::Record rec;
    bool tail_moved = false;
    for (std::uint32_t step = 0; step < 2 * cells + 2; ++step) {
      const std::uint32_t action = pick(16);
      if (action == 0) {  // the peer scribbles on data we have not reached
        const std::uint32_t at = pick(static_cast<std::uint32_t>(r.data_bytes()));
        d8[at] = static_cast<std::uint8_t>(rng());
        before[at] = static_cast<std::byte>(d8[at]);
      } else if (action == 1) {
        r.ctl().tail = pick(2) ? static_cast<std::uint32_t>(rng()) : r.ctl().tail + pick(3) - 1;
        tail_moved = true;
      } else if (action == 2) {
        if (c.prepare_sleep()) c.end_sleep();
      } else if (action == 3) {
        (void)c.has_data();
      }
      const std::uint32_t ctl_tail = r.ctl().tail;
      const RingStatus st = c.poll(&rec);
      ctl_intact = ctl_intact && r.ctl().tail == ctl_tail;
      if (st == RingStatus::kCorrupt) {
        ++corrupt;
        if (c.poll(&rec) != RingStatus::kCorrupt) FAIL_CHECK("a corrupt ring came back to life");
        break;
      }
      if (st == RingStatus::kEmpty) {
        ++empty;
        if (pick(2)) break;
        continue;
      }
      ++records;
      c.consume();
      c.publish_head();
      const std::uint32_t end = r.ctl().head;  // where the consumer now stands
      const std::uint32_t need = ring::record_cells(rec.hdr.len);
      const std::uint32_t start = end - need;
      // Not a pad, wholly inside the ring data without wrapping, a byte-exact
      // copy of what is there, and inside what was published. (Checked
      // without Catch macros on the success path: this loop runs ~10^5
      // times and must stay fast under TSan.)
      const char* bad = nullptr;
      if (rec.hdr.op == abi::kOpPad)
        bad = "a pad was returned as a record";
      else if (rec.payload.size() != rec.hdr.len)
        bad = "payload size differs from the header";
      else if (need > cells || (start & (cells - 1)) + need > cells)
        bad = "record does not lie inside the ring";
      else if (std::memcmp(r.cell(start), &rec.hdr, kHdr) != 0 ||
               std::memcmp(r.cell(start) + kHdr, rec.payload.data(), rec.hdr.len) != 0)
        bad = "record is not a copy of the ring bytes";
      else if (!tail_moved && (tail - h0 > cells || end - h0 > tail - h0))
        bad = "record lies beyond the published tail";
      if (bad != nullptr) {
        FAIL_CHECK(bad << ": h0 " << h0 << " tail " << tail << " end " << end << " len " << rec.hdr.len);
        break;
      }
    }
    if (!ctl_intact || r.ctl().reserved0 != ctl_res0 ||
        std::memcmp(before.data(), r.view().data, r.data_bytes()) != 0)
      FAIL_CHECK("the consumer wrote to ring memory other than head and consumer_sleeping");
  }
  CAPTURE(records, corrupt, empty);
  CHECK(records > 10'000);  // the fuzzer reaches the success path ...
  CHECK(corrupt > 5'000);   // ... and the rejection path, both often
}

// --------------------------------------------------------------- producer

namespace {
bool put(ring::Producer& p, std::uint32_t len, RingStatus* st, std::uint8_t fill = 0x5a) {
  abi::RecordHeader h{};
  h.len = len;
  h.op = 3;
  std::byte* d = p.reserve(h, st);
  if (d == nullptr) return false;
  std::memset(d, fill, len);
  p.commit();
  return true;
}
}  // namespace

TEST_CASE("producer: a head ahead of what was published, or behind what it was, is corrupt", "[ring][hostile]") {
  GuardedRing r(16, true, true);
  for (std::uint32_t start : {0u, 0xfffffff8u}) {
    CAPTURE(start);
    // Published up to start + 4; the last head seen is start.
    for (std::uint32_t bad_head : {start + 5, start + 16, start + 17, start + 0x80000000u, start - 1}) {
      CAPTURE(bad_head);
      r.reset(start, start);
      ring::Producer p(r.view(), nullptr);
      RingStatus st;
      // Fill the ring, publishing 4 cells; the consumer claims to have
      // consumed more than that.
      for (int i = 0; i < 4; ++i) REQUIRE(put(p, len_for_cells(1), &st));
      p.publish();
      for (int i = 0; i < 12; ++i) REQUIRE(put(p, len_for_cells(1), &st));
      r.ctl().head = bad_head;
      CHECK_FALSE(put(p, 1, &st));
      CHECK(st == RingStatus::kCorrupt);
      CHECK(p.corrupt());
      CHECK_FALSE(put(p, 1, &st));  // and stays so
      CHECK(st == RingStatus::kCorrupt);
      CHECK_FALSE(p.drained());
    }
  }
}

TEST_CASE("producer: a head that moves backwards is corrupt", "[ring][hostile]") {
  GuardedRing r(16, false, false);
  r.reset(0, 0);
  ring::Producer p(r.view(), nullptr);
  RingStatus st;
  for (int i = 0; i < 16; ++i) REQUIRE(put(p, len_for_cells(1), &st));
  p.publish();                  // tail 16: the ring is full
  r.ctl().head = 8;             // the consumer frees 8 cells ...
  for (int i = 0; i < 8; ++i) REQUIRE(put(p, len_for_cells(1), &st, 0x11));
  REQUIRE(p.in_flight() == 16);  // full again, 8 of them not yet published
  r.ctl().head = 2;             // ... then claims it had only consumed 2
  // Believing it would put 16 + 8 - 2 = 22 cells in flight in a 16-cell
  // ring: the next record would overwrite cell 8, published and not yet
  // released by the last head the producer accepted.
  CHECK_FALSE(put(p, 1, &st, 0x22));
  CHECK(st == RingStatus::kCorrupt);
  for (std::uint32_t i = 8; i < 16; ++i) CHECK(static_cast<std::uint8_t>(r.cell(i)[kHdr]) == 0x5a);
  for (std::uint32_t i = 16; i < 24; ++i) CHECK(static_cast<std::uint8_t>(r.cell(i)[kHdr]) == 0x11);
}

// The producer against a consumer that writes random heads between records.
// Whatever the head says, each record lands inside the ring, in the cells
// between the old and new tail; while the head stays plausible no published,
// unconsumed cell is overwritten.
TEST_CASE("producer: fuzzed head never leads outside the ring", "[ring][hostile][fuzz]") {
  const std::uint32_t seed = seed_from_env();
  CAPTURE(seed);
  std::mt19937 rng(seed);
  auto pick = [&](std::uint32_t n) { return static_cast<std::uint32_t>(rng() % n); };
  std::uint64_t ok = 0, full = 0, corrupt = 0;
  std::vector<std::byte> before;
  for (int run = 0; run < 400; ++run) {
    CAPTURE(run);
    GuardedRing r(pick(2) ? 16 : 64, pick(2), pick(2));
    const std::uint32_t cells = r.cells();
    const std::uint32_t t0 = pick(2) ? 0 : 0xffffffffu - pick(3 * cells);
    r.reset(t0, t0);
    ring::Producer p(r.view(), nullptr);
    std::uint32_t honest_head = t0;  // the last head we set within the rules
    bool dishonest = false;
    for (int step = 0; step < 300; ++step) {
      const std::uint32_t tail = r.ctl().tail;
      const std::uint32_t a = pick(128);
      if (a < 64) {  // an honest consumer catching up
        honest_head += pick(tail - honest_head + 1);
        r.ctl().head = honest_head;
      } else if (a == 64) {
        r.ctl().head = static_cast<std::uint32_t>(rng());
        dishonest = true;
      } else if (a == 65) {
        r.ctl().head = tail + 1 + pick(cells);
        dishonest = true;
      } else if (a == 66) {
        r.ctl().head = honest_head - 1 - pick(4);
        dishonest = true;
      }
      before.assign(r.view().data, r.view().data + r.data_bytes());
      const std::uint32_t head_seen = r.ctl().head;
      RingStatus st;
      const std::uint32_t len = pick(len_for_cells(cells / 2) + 1);
      const bool put_ok = put(p, len, &st, static_cast<std::uint8_t>(step));
      p.publish();
      CHECK(r.ctl().head == head_seen);  // the producer never writes head
      const std::uint32_t new_tail = r.ctl().tail;
      if (!put_ok) {
        CHECK((st == RingStatus::kFull || st == RingStatus::kCorrupt));
        if (st == RingStatus::kFull) ++full;
        if (st == RingStatus::kCorrupt) {
          ++corrupt;
          CHECK(dishonest);
          CHECK(p.corrupt());
          CHECK(std::memcmp(before.data(), r.view().data, r.data_bytes()) == 0);
          break;
        }
        CHECK(new_tail == tail);
        continue;
      }
      ++ok;
      const std::uint32_t wrote = new_tail - tail;
      CHECK(wrote >= ring::record_cells(len));
      CHECK(wrote <= cells);
      // Only cells in [tail, new_tail) changed.
      std::uint32_t stray = 0;
      for (std::uint32_t i = 0; i < cells; ++i) {
        const bool inside = ((i - tail) & (cells - 1)) < wrote || wrote == cells;
        if (!inside && std::memcmp(before.data() + std::size_t{i} * abi::kCellBytes,
                                   r.view().data + std::size_t{i} * abi::kCellBytes, abi::kCellBytes) != 0)
          ++stray;
      }
      CHECK(stray == 0);
      if (!dishonest) CHECK(new_tail - honest_head <= cells);
    }
  }
  CAPTURE(ok, full, corrupt);
  CHECK(ok > 10'000);
  CHECK(full > 1'000);
  CHECK(corrupt > 100);
}
