// libFuzzer harness: what the guest library reads from the host. A broken
// or hostile host (or a daemon of another version) writes the completion
// rings, the ring indices the guest's producers read, and the superblock;
// none of it may drive the guest into undefined behaviour.
//
// Input: [mode u8] then, by mode % 3:
//   0 replies: [cells log2 u8][head u32][tail u32][seq u32][rep_size u16]
//     [with extra u8], then the ring's data bytes (cells * 64, zero-filled
//     where the input ends). guest::take_reply (what a waiting guest thread
//     runs, guest/reply.h) takes replies until the ring is empty or corrupt;
//     after each, the next request's seq is waited for.
//   1 superblock: [mapped u32][bytes of the BAR from offset 0]: ring::read_layout
//     (the guest's check of the daemon's layout). An accepted layout must lie
//     within the mapping: every channel's rings and the arena.
//   2 producer: [cells log2 u8] then steps [len u16][head u32]: the guest's
//     request ring producer reserves, commits and publishes records while
//     the host's head moves as the input says.
// Each ring lives in a buffer of exactly its size, so ASan sees any access
// past it.
#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "guest/reply.h"
#include "ring/layout.h"
#include "ring/spsc_ring.h"
#include "tests/fuzz/fuzz_input.h"

using namespace ivcuda;

namespace {

using fuzz::Input;

// One ring: its control block and exactly `cells` cells of data.
struct OwnRing {
  explicit OwnRing(std::uint32_t cells_)
      : ctl(std::make_unique<abi::RingCtl>()), data(new std::byte[std::size_t{cells_} * abi::kCellBytes]()),
        cells(cells_) {}
  ring::RingView view() { return {ctl.get(), data.get(), cells}; }
  std::unique_ptr<abi::RingCtl> ctl;
  std::unique_ptr<std::byte[]> data;
  std::uint32_t cells;
};

void replies(Input& in) {
  OwnRing r(1u << (2 + in.take<std::uint8_t>() % 7));  // 4..256 cells
  r.ctl->head = in.take<std::uint32_t>();
  const std::uint32_t tail = in.take<std::uint32_t>();
  std::uint32_t seq = in.take<std::uint32_t>();
  const std::size_t rep_size = in.take<std::uint16_t>() % 2048;
  const bool with_extra = (in.take<std::uint8_t>() & 1) != 0;
  in.copy(r.data.get(), std::size_t{r.cells} * abi::kCellBytes);
  ring::Consumer cpl(r.view());  // the guest's consumer starts from the head it finds
  r.ctl->tail = tail;
  std::vector<std::byte> rep(rep_size);
  std::vector<std::byte> extra;
  for (int i = 0; i < 1024; ++i) {
    CUresult result = CUDA_SUCCESS;
    std::span<const std::byte> console;
    const auto t = guest::take_reply(cpl, seq, rep_size != 0 ? rep.data() : nullptr, rep_size,
                                     with_extra ? &extra : nullptr, &result, &console);
    if (t != guest::ReplyTake::kGot) break;
    // The guest then writes the console text out: read all of it, as that would.
    std::vector<std::byte> text(console.begin(), console.end());
    ++seq;
  }
}

void superblock(Input& in) {
  // Enough for a small but complete layout; the mapping is what the input
  // claims, up to the buffer.
  constexpr std::size_t kBuf = 256 * 1024;
  const std::uint64_t mapped = in.take<std::uint32_t>() % (kBuf + 1);
  auto bar = std::make_unique<std::byte[]>(kBuf);
  std::memset(bar.get(), 0, kBuf);
  in.copy(bar.get(), kBuf);
  auto l = ring::read_layout(bar.get(), mapped);
  if (!l) return;
  // What the guest goes on to touch must be inside the mapping.
  const auto in_map = [&](const std::byte* p, std::uint64_t n) {
    const auto off = static_cast<std::uint64_t>(p - bar.get());
    return off <= mapped && n <= mapped - off;
  };
  for (std::uint32_t c = 0; c < l->channels; ++c) {
    const ring::RingView rq = ring::request_ring(bar.get(), *l, c);
    const ring::RingView cp = ring::completion_ring(bar.get(), *l, c);
    if (!in_map(reinterpret_cast<const std::byte*>(rq.ctl), sizeof(abi::RingCtl)) ||
        !in_map(rq.data, std::uint64_t{rq.cells} * abi::kCellBytes) ||
        !in_map(reinterpret_cast<const std::byte*>(cp.ctl), sizeof(abi::RingCtl)) ||
        !in_map(cp.data, std::uint64_t{cp.cells} * abi::kCellBytes) ||
        !in_map(reinterpret_cast<const std::byte*>(ring::channel_desc(bar.get(), *l, c)), sizeof(abi::ChannelDesc)))
      std::abort();
  }
  if (!in_map(bar.get() + l->arena_off, l->arena_size) || ring::pool_size(*l) > l->arena_size) std::abort();
}

void producer(Input& in) {
  OwnRing r(1u << (2 + in.take<std::uint8_t>() % 7));
  ring::Producer req(r.view(), nullptr);
  for (int i = 0; i < 256 && !in.done(); ++i) {
    abi::RecordHeader h{};
    h.op = 1;
    h.len = in.take<std::uint16_t>();
    r.ctl->head = in.take<std::uint32_t>();  // what the host says it consumed
    ring::RingStatus st;
    std::byte* p = req.reserve(h, &st);
    if (p == nullptr) {
      if (st == ring::RingStatus::kCorrupt) break;
      continue;
    }
    std::memset(p, 0xab, h.len);
    req.commit();
    req.publish();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  switch (in.take<std::uint8_t>() % 3) {
    case 0: replies(in); break;
    case 1: superblock(in); break;
    default: producer(in); break;
  }
  return 0;
}
